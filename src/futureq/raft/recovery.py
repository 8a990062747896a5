"""The recovery exchange after a start (``docs/raft.md``, "Disk faults").

A node's disk may have forgotten what the node told its peers: it was wiped, or an
older copy of it was put back. Nothing on the disk itself tells. So after every start a
node takes part in nothing that needs its durable state (no vote, no campaign, not
counted in a quorum) until every other voter answered a :class:`RecoveryRequest`
(Viewstamped Replication Revisited §4.3, where a restarted replica waits for answers
before it takes part again). From the answers it learns:

* the highest term in use: it moves to it and abstains in it, because it may have
  voted in it before its disk forgot;
* a *vote floor*: the k-th most up-to-date log among the other voters' answers, where k
  is a majority of the voters less this node. Every committed entry is held by a
  majority and at most one disk forgets at a time, so at least k of the others hold it,
  and a log at least as up to date as one that holds a committed entry holds it too
  (paper §5.4). Until its own log gets there, the node votes only for candidates at
  least that up to date, and does not campaign. Taking the k-th log, not the best one,
  keeps one node's uncommitted tail from setting the floor.

"The voters" are those of every configuration that may be in effect: the newest one
known to be committed (here or by an answer) and any newer, uncommitted one (thesis
§4.1: a configuration is used as soon as it is appended, so a change in flight may win
or be discarded). The node waits for all of them and takes the smallest k.

The floor may still name entries that were never committed and are later lost; while a
floor is set, the node asks again every election timeout and takes the new answers'
floor (:meth:`Recovery.begin_round`), so a floor cannot block elections for ever.

This module keeps the bookkeeping; :class:`~futureq.raft.core.RaftCore` sends and
receives the messages and changes its term and vote.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from futureq.raft.messages import LogIndex, NodeId, RecoveryResponse, Term
from futureq.raft.quorum import majority

_NONCE_MASK = (1 << 63) - 1

Position = tuple[Term, LogIndex]
"""A log position ``(last term, last index)``, compared as in the §5.4.1 up-to-date check."""


@attrs.frozen
class Configurations:
    """The voters a round must hear from (see the module docstring).

    Attributes:
        required: Every voter of the configurations that may be in effect, but this
            node; None when no voter is known yet (a joining node learns the membership
            from its leader first).
        k: How many of them at least hold any committed entry, with at most one disk
            forgetting at a time: the smallest majority among those configurations, less
            one when this node votes in it.
    """

    required: frozenset[NodeId] | None
    k: int


@attrs.frozen
class RoundResult:
    """What a complete round of answers says.

    Attributes:
        highest_term: The highest term among the answers.
        floor: The k-th most up-to-date log position among the answers (k: a majority
            of the voters, less this node if it votes).
    """

    highest_term: Term
    floor: Position


class Recovery:
    """One node's recovery exchange: rounds of requests, answers, findings, floor.

    Args:
        incarnation: This node's data-directory incarnation (0: not stamped).
        boot_id: This start's random id; round nonces derive from it.
        start_position: ``(durable term, last log index)`` when the node started, to
            compare with what the cluster recorded of it.
    """

    def __init__(self, incarnation: int, boot_id: int, start_position: Position) -> None:
        self.incarnation = incarnation
        self.boot_id = boot_id
        self.start_position = start_position
        self.recovering = False
        self.round_open = False
        self.nonce = 0
        self._round = 0
        self.answers: dict[NodeId, RecoveryResponse] = {}
        self.findings: list[str] = []
        self.vote_floor: Position | None = None
        self.foreign: str | None = None
        """Set by :meth:`note_foreign` when this directory's log holds a term no voter
        of the cluster has reached: it cannot be this cluster's log (another cluster's
        directory with the same cluster id and node id), and it would outrank every log
        here. The node never ends recovery, and the broker stops it (exit 2)."""

    def note_foreign(self, own: Position, highest_term: Term) -> bool:
        """After a complete round: whether this is another cluster's data directory: the
        cluster knows this node under another incarnation (a finding), and this
        directory's log (last position ``own``) holds a term above ``highest_term``, the
        highest term any voter answered with.

        Every term in a log of this cluster was reached by the majority that elected its
        leader, and every voter answered, so no log of it holds a term above them all,
        short of more than one disk forgetting at once (the simulation's rollbacks and
        wipes together: a node holding the only copy of its entries answered by two that
        forgot their terms, hence the incarnation too). Such a log is another
        cluster's: taking part, it won an election and overwrote every node (breaker
        runs). A directory of another cluster whose terms are not that high is not caught
        here (``docs/raft.md``, "Disk faults")."""
        replaced = next((f for f in self.findings if "wiped or replaced" in f), None)
        if own[0] <= highest_term or replaced is None:
            return False
        self.foreign = (
            f"{replaced}; and its log holds term {own[0]} (index {own[1]}), while no voter of "
            f"this cluster has reached a term above {highest_term}: it is another Raft "
            "group's data directory with the same cluster id and node id (another "
            "cluster's, or, on a node of several shards, another shard's of this node: "
            "shard K of every node is its own group). Taking part would let its log "
            "overwrite the group's; put a moved shard directory back where it was, else "
            "start this node with an empty data directory to rejoin and catch up, and give "
            "each cluster its own cluster id"
        )
        return True

    def begin_round(self) -> int:
        """Start a new round of requests; answers to earlier rounds are ignored.

        Returns:
            The nonce the requests carry.
        """
        self._round += 1
        self.nonce = ((self.boot_id + self._round) & _NONCE_MASK) or 1
        self.answers = {}
        self.round_open = True
        return self.nonce

    def configurations(
        self, own: tuple[LogIndex, frozenset[NodeId], LogIndex], self_id: NodeId
    ) -> Configurations:
        """The configurations that may be in effect, from this node's and the answers'.

        Args:
            own: ``(index of the latest configuration entry here, its voters, commit
                index here)``.
            self_id: This node.
        """
        seen = [own] + [(a.config_index, a.voters, a.commit_index) for a in self.answers.values()]
        committed = [index for index, _voters, commit in seen if index <= commit]
        base = max(committed, default=LogIndex(0))
        configs = sorted({(index, voters) for index, voters, _ in seen if index >= base})
        union: frozenset[NodeId] = frozenset().union(*(voters for _, voters in configs))
        if not union:
            return Configurations(None, 0)
        k = min(
            majority(len(voters)) - (1 if self_id in voters else 0)
            for _, voters in configs
            if voters
        )
        return Configurations(frozenset(union - {self_id}), k)

    def missing(self, required: Iterable[NodeId]) -> list[NodeId]:
        """The required voters that have not answered this round, by id."""
        return sorted(set(required) - self.answers.keys())

    def take(self, answer: RecoveryResponse) -> bool:
        """Take an answer; False if it belongs to another round (ignored)."""
        if not self.round_open or answer.nonce != self.nonce:
            return False
        self.answers[answer.from_id] = answer
        self._note_findings(answer)
        return True

    def complete(self, configs: Configurations, *, new_cluster: bool = False) -> RoundResult | None:
        """Close the round if every required voter answered.

        Args:
            configs: What :meth:`configurations` says now.
            new_cluster: The operator declared a brand-new cluster and this node's data
                directory is new (``--initial-cluster-state new``): a majority of the
                voters (this node included) is enough, as long as every answer shows an
                empty log — nothing can have been committed then. One answer with a log
                and the normal rule applies.

        Returns:
            The round's result, or None while answers are missing.
        """
        required = configs.required
        if not self.round_open or required is None:
            return None
        if not required <= self.answers.keys():
            empty = all(a.log_index == 0 for a in self.answers.values())
            enough = len(required & self.answers.keys()) + 1 >= majority(len(required) + 1)
            if not (new_cluster and empty and enough):
                return None
        answers = [self.answers[voter] for voter in sorted(required & self.answers.keys())]
        self.round_open = False
        self.answers = {}
        highest = max((a.term for a in answers), default=Term(0))
        k = configs.k
        positions = sorted(((a.log_term, a.log_index) for a in answers), reverse=True)
        floor = positions[k - 1] if 0 < k <= len(positions) else (Term(0), LogIndex(0))
        return RoundResult(highest, floor)

    def set_floor(self, floor: Position, own: Position) -> None:
        """Keep ``floor`` as the vote floor unless this node's own log already reaches it."""
        self.vote_floor = floor if floor > own else None

    def below_floor(self, position: Position, own: Position) -> bool:
        """Whether a candidate's log at ``position`` is behind the vote floor.

        The floor is dropped once this node's own log (``own``) reaches it: the §5.4.1
        check against its own log is then at least as strict.
        """
        floor = self.vote_floor
        if floor is None:
            return False
        if own >= floor:
            self.vote_floor = None
            return False
        return position < floor

    def _note_findings(self, answer: RecoveryResponse) -> None:
        """Sentences about this node's data directory, from what the cluster recorded."""
        found = ""
        known = answer.known_incarnation
        if known and self.incarnation and known != self.incarnation:
            found = (
                f"node {answer.from_id} knows this node's data directory as incarnation "
                f"{known:x}, but it is {self.incarnation:x}: it was wiped or replaced"
            )
        elif answer.acked_term:
            # Within one term a follower's log only grows, and a node stores a term before
            # it acknowledges anything in it: holding less than it acknowledged means the
            # data directory is an older copy of itself.
            start_term, start_last = self.start_position
            if start_term < answer.acked_term or (
                start_term == answer.acked_term and start_last < answer.acked_index
            ):
                found = (
                    f"this node acknowledged log index {answer.acked_index} in term "
                    f"{answer.acked_term} (recorded by the cluster, node {answer.from_id}), "
                    f"but its data directory started at term {start_term} with log index "
                    f"{start_last}: it is an older copy of itself"
                )
        if found and found not in self.findings:
            self.findings.append(found)


__all__ = ["Configurations", "Position", "Recovery", "RoundResult"]
