"""Spread the leaders of a sharded cluster's Raft groups over its nodes.

Every shard's group elects its leader on its own, so after a cluster start (or after a
node returned) several groups may be led by one node, whose cores then do all the work.
:func:`balance_leadership` runs in every shard process of a clustered sharded node;
in the one leading shard ``K``'s group it hands leadership to the group's *preferred*
voter — the ``K mod n``-th of the ``n`` voters sorted by id — once that voter has been
healthy for :data:`SETTLE_S` (within :data:`MAX_LAG_ENTRIES` of the commit index, heard from within
:data:`HEARD_WITHIN_MS`, its clock in bound, not recovering). With 3 nodes and 2
shards: shard 0 led by node 1, shard 1 by node 2; with 3 shards, one per node.

A failed transfer (the target stopped, its clock left the bound) is retried after
:data:`RETRY_S`. A manual ``cluster transfer-leader`` of a sharded node is undone
after :data:`SETTLE_S` when it moved a group off its preferred voter.

Source: ``docs/sharding.md``, "Leader balancing".
"""

from __future__ import annotations

import logging

import trio

from futureq.errors import FutureQError
from futureq.raft.node import RaftNode

log = logging.getLogger(__name__)

CHECK_S = 0.5
"""How often the leader checks whether its group's preferred voter could lead (s)."""
SETTLE_S = 5.0
"""How long the preferred voter must look healthy before leadership moves to it (s)."""
HEARD_WITHIN_MS = 1000
MAX_LAG_ENTRIES = 1000
"""A preferred voter further behind the commit index than this is not handed leadership
yet (the transfer itself lets it catch up the rest)."""
RETRY_S = 10.0
"""Pause after a failed transfer before the next attempt (s)."""


def preferred_leader(voters: frozenset[int], shard: int) -> int | None:
    """The voter that should lead shard ``shard``'s group: the ``shard mod n``-th of the
    voters sorted by id (None without voters)."""
    ordered = sorted(voters)
    return ordered[shard % len(ordered)] if ordered else None


def _healthy(node: RaftNode, target: int) -> bool:
    progress = node.progress().get(target)
    if progress is None or progress["recovering"] or not progress["answered"]:
        return False
    heard = progress["last_heard_ms"]
    if heard is None or heard > HEARD_WITHIN_MS:
        return False
    if node.commit_index - progress["match"] > MAX_LAG_ENTRIES:
        return False
    return node.timekeeper.clock.peer_in_bound(target) is True


async def balance_leadership(node: RaftNode, shard: int) -> None:
    """Run for ever: move shard ``shard``'s leadership to its preferred voter (see the
    module doc). Does nothing on a node that does not lead the group."""
    healthy_since: float | None = None
    while True:
        await trio.sleep(CHECK_S)
        voters, _ = node.membership()
        target = preferred_leader(voters, shard)
        if not node.is_leader() or target is None or target == node.id or len(voters) < 2:
            healthy_since = None
            continue
        if not _healthy(node, target):
            healthy_since = None
            continue
        now = trio.current_time()
        if healthy_since is None:
            healthy_since = now
        if now - healthy_since < SETTLE_S:
            continue
        log.info(
            "shard %d: handing leadership to node %d, its preferred leader (balancing "
            "the shards' leaders over the nodes)",
            shard,
            target,
        )
        try:
            await node.transfer_leadership(target)
        except FutureQError as exc:
            log.warning(
                "shard %d: could not hand leadership to node %d (%s); trying again in %g s",
                shard,
                target,
                exc,
                RETRY_S,
            )
            await trio.sleep(RETRY_S)
        healthy_since = None
