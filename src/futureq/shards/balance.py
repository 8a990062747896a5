"""Spread the leaders of a sharded cluster's Raft groups over its nodes.

Every shard's group elects its leader on its own, so after a cluster start (or after a
node returned) several groups may be led by one node, whose cores then do all the work.
:func:`balance_leadership` runs in every shard process of a clustered sharded node;
in the one leading shard ``K``'s group it hands leadership to the group's *preferred*
voter — the ``K mod n``-th of the ``n`` voters sorted by id — once this leadership
and the group have been stable for :data:`SETTLE_S`: this node has led that long, the
preferred voter looked healthy that long (within :data:`MAX_LAG_ENTRIES` of the commit
index, heard from within :data:`HEARD_WITHIN_MS`, its clock in bound, not recovering,
and every clock round trip to it among the last few under a quarter of the election
timeout), and every voter was heard from within :data:`HEARD_WITHIN_MS`. With 3 nodes
and 2 shards: shard 0 led by node 1, shard 1 by node 2; with 3 shards, one per node.

A transfer ends the leader's lease, and one that does not complete within an election
timeout makes the leader step down (the group then elects again), so moving a leader
over slow links costs the group its leader. Hence the stability rules above, and a
back-off: after a failed transfer the next attempt waits :data:`RETRY_S`, doubled after
each further failure up to :data:`MAX_RETRY_S`; a transfer that completes resets it. A
manual ``cluster transfer-leader`` of a sharded node is undone after :data:`SETTLE_S`
when it moved a group off its preferred voter.

The decisions are :class:`Balancer`'s (pure: every reading is passed in);
:func:`balance_leadership` feeds it from the node. Source: ``docs/sharding.md``,
"Leader balancing".
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import attrs
import trio

from futureq.errors import FutureQError
from futureq.raft.node import RaftNode

log = logging.getLogger(__name__)

CHECK_S = 0.5
"""How often the leader checks whether its group's preferred voter could lead (s)."""
SETTLE_S = 5.0
"""How long the leadership, the group and the preferred voter must look stable before
leadership moves (s)."""
HEARD_WITHIN_MS = 1000
MAX_LAG_ENTRIES = 1000
"""A preferred voter further behind the commit index than this is not handed leadership
yet (the transfer itself lets it catch up the rest)."""
RETRY_S = 10.0
"""Pause after a failed transfer before the next attempt (s); doubled after each
further failure."""
MAX_RETRY_S = 160.0
"""Longest pause between attempts after repeated failures (s)."""


def preferred_leader(voters: frozenset[int], shard: int) -> int | None:
    """The voter that should lead shard ``shard``'s group: the ``shard mod n``-th of the
    voters sorted by id (None without voters)."""
    ordered = sorted(voters)
    return ordered[shard % len(ordered)] if ordered else None


@attrs.frozen
class GroupView:
    """What the balancer reads of its node at one check.

    Attributes:
        leading_term: The term this node leads (None when it does not lead).
        target: The preferred voter (None without voters); may be this node.
        target_healthy: The preferred voter could lead now (see the module doc).
        group_stable: Every voter was heard from within :data:`HEARD_WITHIN_MS` and this
            leader may dispatch (clock in bound, lease held).
    """

    leading_term: int | None
    target: int | None
    target_healthy: bool
    group_stable: bool


@attrs.define
class Balancer:
    """When shard ``shard``'s leader hands its group to the preferred voter.

    Call :meth:`check` every :data:`CHECK_S` with the node's :class:`GroupView` and the
    time (s, any monotonic origin); it answers the voter to transfer to, or None. Report
    the outcome of a transfer with :meth:`transfer_failed` or :meth:`transfer_done`.
    """

    shard: int
    node_id: int
    failures: int = 0
    """Transfers that failed since the last one that completed."""
    not_before: float = 0.0
    """No transfer before this time (s; the back-off after a failure)."""
    _term: int | None = None
    _leading_since: float | None = None
    _stable_since: float | None = None

    def check(self, view: GroupView, now: float) -> int | None:
        """The voter to hand leadership to now, or None (not leading, already led by
        the preferred voter, not stable for :data:`SETTLE_S`, or backing off)."""
        if view.leading_term is None or view.target is None or view.target == self.node_id:
            self._term = self._leading_since = self._stable_since = None
            return None
        if view.leading_term != self._term:
            self._term, self._leading_since, self._stable_since = view.leading_term, now, None
        if not (view.target_healthy and view.group_stable):
            self._stable_since = None
            return None
        if self._stable_since is None:
            self._stable_since = now
        assert self._leading_since is not None
        if (
            now - self._leading_since < SETTLE_S
            or now - self._stable_since < SETTLE_S
            or now < self.not_before
        ):
            return None
        return view.target

    def retry_after_s(self) -> float:
        """The pause before the next attempt after the failures so far (s)."""
        if self.failures == 0:
            return 0.0
        return min(MAX_RETRY_S, RETRY_S * float(1 << (self.failures - 1)))

    def transfer_failed(self, now: float) -> float:
        """A transfer did not complete: back off. Returns the pause (s)."""
        self.failures += 1
        pause = self.retry_after_s()
        self.not_before = now + pause
        self._term = self._leading_since = self._stable_since = None
        return pause

    def transfer_done(self) -> None:
        """A transfer completed: the next failure starts from :data:`RETRY_S` again."""
        self.failures = 0
        self.not_before = 0.0
        self._term = self._leading_since = self._stable_since = None


def _target_healthy(node: RaftNode, target: int) -> bool:
    progress = node.progress().get(target)
    if progress is None or progress["recovering"] or not progress["answered"]:
        return False
    heard = progress["last_heard_ms"]
    if heard is None or heard > HEARD_WITHIN_MS:
        return False
    if node.commit_index - progress["match"] > MAX_LAG_ENTRIES:
        return False
    clock = node.timekeeper.clock
    if clock.peer_in_bound(target) is not True:
        return False
    # TimeoutNow, the target's vote requests and their answers must all arrive within
    # one election timeout, or the transfer fails and the group loses its leader.
    round_trip_us = clock.peer_round_trip_us(target)
    election_us = node.config.election_timeout_ticks * node.config.tick_ms * 1000
    return round_trip_us is not None and round_trip_us <= election_us // 4


def _group_stable(node: RaftNode, voters: frozenset[int]) -> bool:
    if not node.can_dispatch():
        return False
    progress = node.progress()
    for voter in voters:
        heard = progress.get(voter, {}).get("last_heard_ms")
        if heard is None or heard > HEARD_WITHIN_MS:
            return False
    return True


def read_view(node: RaftNode, shard: int) -> GroupView:
    """The :class:`GroupView` of ``node`` for shard ``shard``'s group now."""
    voters, _ = node.membership()
    target = preferred_leader(voters, shard)
    if not node.is_leader() or target is None or target == node.id or len(voters) < 2:
        return GroupView(None, target, False, False)
    return GroupView(
        node.core.term, target, _target_healthy(node, target), _group_stable(node, voters)
    )


async def balance_leadership(
    node: RaftNode, shard: int, transfer: Callable[[int], Awaitable[None]]
) -> None:
    """Run for ever: move shard ``shard``'s leadership to its preferred voter (see the
    module doc). Does nothing on a node that does not lead the group.

    ``transfer(target)`` hands the leadership over: ``Broker.transfer_leadership``, which
    first records the attempts of the first deliveries out (``docs/protocol.md``,
    UNSUBSCRIBE), as an operator's transfer does; it raises FutureQError on failure."""
    balancer = Balancer(shard, node.id)
    while True:
        await trio.sleep(CHECK_S)
        target = balancer.check(read_view(node, shard), trio.current_time())
        if target is None:
            continue
        log.info(
            "shard %d: handing leadership to node %d, its preferred leader (balancing "
            "the shards' leaders over the nodes)",
            shard,
            target,
        )
        try:
            await transfer(target)
        except FutureQError as exc:
            pause = balancer.transfer_failed(trio.current_time())
            log.warning(
                "shard %d: could not hand leadership to node %d (%s); not trying again "
                "for %g s (failure %d in a row)",
                shard,
                target,
                exc,
                pause,
                balancer.failures,
            )
        else:
            balancer.transfer_done()
