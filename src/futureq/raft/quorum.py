"""Pure quorum arithmetic and membership bookkeeping.

* :func:`committed_index` — the largest index replicated on a majority of voters
  (paper §5.3; the leader still checks the entry's term, §5.4.2).
* :func:`vote_result` — election outcome from the votes received so far (paper §5.2).
* :func:`has_quorum` — whether a set of nodes contains a majority (CheckQuorum,
  thesis §6.2).
* :func:`apply_conf_change` / :func:`validate_conf_change` — single-server membership
  changes (thesis §4.1).
* :class:`MembershipHistory` — the membership in effect at every log index: the latest
  CONFIG_CHANGE entry at or before it, else the snapshot's (thesis §4.1: a server uses
  the latest configuration in its log, whether or not it is committed).
* :class:`ReadIndexQueue` — reads waiting for a heartbeat quorum (thesis §6.4).
"""

from __future__ import annotations

import bisect
import enum
from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import attrs

from futureq.raft.basics import majority as majority
from futureq.raft.messages import LogIndex, NodeId
from futureq.raft.payload_codec import decode_config_change
from futureq.raft.values import ConfChange, ConfChangeOp, Entry, EntryKind, Membership

if TYPE_CHECKING:
    from futureq.raft.storage import Storage


class VoteResult(enum.Enum):
    """Outcome of an election so far."""

    PENDING = "pending"
    WON = "won"
    LOST = "lost"


def committed_index(voters: Iterable[NodeId], match: Mapping[NodeId, int]) -> int:
    """Largest value that a majority of ``voters`` have reached in ``match``.

    Args:
        voters: The voting members.
        match: Per node, its match index (or any monotone acknowledgement counter);
            a voter missing from ``match`` counts as 0.

    Returns:
        The majority-replicated value; 0 when there are no voters.
    """
    values = sorted((match.get(v, 0) for v in voters), reverse=True)
    if not values:
        return 0
    return values[majority(len(values)) - 1]


def vote_result(voters: Iterable[NodeId], votes: Mapping[NodeId, bool]) -> VoteResult:
    """Election outcome: WON on a majority of grants, LOST once a majority is impossible.

    Votes from non-voters are ignored.
    """
    voter_list = list(voters)
    needed = majority(len(voter_list))
    granted = sum(1 for v in voter_list if votes.get(v) is True)
    rejected = sum(1 for v in voter_list if votes.get(v) is False)
    if granted >= needed:
        return VoteResult.WON
    if len(voter_list) - rejected < needed:
        return VoteResult.LOST
    return VoteResult.PENDING


def has_quorum(voters: Iterable[NodeId], active: Iterable[NodeId]) -> bool:
    """Whether ``active`` contains a majority of ``voters``."""
    voter_set = frozenset(voters)
    return len(voter_set & frozenset(active)) >= majority(len(voter_set))


def validate_conf_change(membership: Membership, change: ConfChange) -> str | None:
    """Check a single-server change against ``membership`` (thesis §4.1, §4.2.1).

    Returns:
        None if the change is allowed, else a sentence saying why not.
    """
    node = change.node_id
    if change.op is ConfChangeOp.ADD_LEARNER:
        if node in membership.voters or node in membership.learners:
            return f"node {node} is already a member"
    elif change.op is ConfChangeOp.PROMOTE_VOTER:
        if node not in membership.learners:
            return f"node {node} is not a learner; add it as a learner first"
    elif change.op is ConfChangeOp.REMOVE_NODE:
        if node not in membership.voters and node not in membership.learners:
            return f"node {node} is not a member"
        if membership.voters == frozenset({node}):
            return f"node {node} is the last voter and cannot be removed"
    return None


def apply_conf_change(membership: Membership, change: ConfChange) -> Membership:
    """The membership after ``change``; an inapplicable change leaves it unchanged."""
    voters = set(membership.voters)
    learners = set(membership.learners)
    node = change.node_id
    if change.op is ConfChangeOp.ADD_LEARNER and node not in voters:
        learners.add(node)
    elif change.op is ConfChangeOp.PROMOTE_VOTER and node in learners:
        learners.discard(node)
        voters.add(node)
    elif change.op is ConfChangeOp.REMOVE_NODE and voters - {node}:
        voters.discard(node)
        learners.discard(node)
    return Membership(frozenset(voters), frozenset(learners))


class MembershipHistory:
    """Membership at each log index: a base (from the snapshot) plus config entries.

    Args:
        base_index: Index of the snapshot the base membership comes from.
        base: The snapshot's membership.
    """

    def __init__(self, base_index: LogIndex, base: Membership) -> None:
        self._base_index = base_index
        self._base = base
        self._indexes: list[LogIndex] = []
        self._memberships: list[Membership] = []

    def reset(self, base_index: LogIndex, base: Membership) -> None:
        """Forget everything and start again from a snapshot's membership."""
        self._base_index = base_index
        self._base = base
        self._indexes.clear()
        self._memberships.clear()

    def truncate_from(self, index: LogIndex) -> None:
        """Forget config entries at ``index`` and later (they were overwritten)."""
        cut = bisect.bisect_left(self._indexes, index)
        del self._indexes[cut:]
        del self._memberships[cut:]

    def record_entries(self, entries: Iterable[Entry]) -> None:
        """Record the CONFIG_CHANGE entries among ``entries`` (in index order)."""
        for entry in entries:
            if entry.kind is EntryKind.CONFIG_CHANGE:
                _change, membership = decode_config_change(entry.data)
                self.record(entry.index, membership)

    def scan(self, storage: Storage) -> None:
        """Record the config entries of the whole stored log (at start-up)."""
        index = storage.first_index()
        last = storage.last_index()
        while index <= last:
            batch = storage.entries(index, LogIndex(last + 1), 1 << 20)
            self.record_entries(batch)
            index = LogIndex(batch[-1].index + 1)

    def record(self, index: LogIndex, membership: Membership) -> None:
        """Record that the config entry at ``index`` sets ``membership``."""
        assert not self._indexes or index > self._indexes[-1], "config entries in order"
        self._indexes.append(index)
        self._memberships.append(membership)

    def current(self) -> Membership:
        """The latest membership in the log."""
        return self._memberships[-1] if self._memberships else self._base

    def last_change_index(self) -> LogIndex:
        """Index of the latest config entry, or of the base snapshot if none follows it."""
        return self._indexes[-1] if self._indexes else self._base_index

    def at(self, index: LogIndex) -> Membership:
        """Membership in effect at ``index`` (the latest change at or before it)."""
        position = bisect.bisect_right(self._indexes, index)
        return self._memberships[position - 1] if position else self._base


@attrs.frozen
class PendingRead:
    """A read waiting for confirmation: who asked, and the commit index when it did."""

    request_ctx: bytes
    origin: NodeId
    index: LogIndex
    seq: int


class ReadIndexQueue:
    """Leader-side ReadIndex bookkeeping (thesis §6.4; etcd's ``read_only.go``).

    Every heartbeat broadcast starts a new round (:meth:`next_round`); heartbeats carry
    the round and followers echo it. A read gets the next round number (``seq``) and is
    confirmed once a majority of voters answered a round ``>= seq``: the leader was still
    leader after the read arrived. The rounds also time the leader lease (thesis §6.4.1).
    """

    def __init__(self) -> None:
        self.seq = 0
        self._pending: deque[PendingRead] = deque()

    def clear(self) -> None:
        """Drop every pending read (leadership lost; callers retry)."""
        self.seq = 0
        self._pending.clear()

    def add(self, request_ctx: bytes, origin: NodeId, commit_index: LogIndex) -> None:
        """Queue a read at ``commit_index``; it needs the next heartbeat round."""
        self._pending.append(PendingRead(request_ctx, origin, commit_index, self.seq + 1))

    def next_round(self) -> int:
        """Start a heartbeat round; returns its number (what the heartbeats carry)."""
        self.seq += 1
        return self.seq

    def confirmed(self, voters: Iterable[NodeId], acked: Mapping[NodeId, int]) -> list[PendingRead]:
        """Pop the reads whose round a majority of ``voters`` acknowledged."""
        quorum_seq = committed_index(voters, acked)
        out: list[PendingRead] = []
        while self._pending and self._pending[0].seq <= quorum_seq:
            out.append(self._pending.popleft())
        return out
