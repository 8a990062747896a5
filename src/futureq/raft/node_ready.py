"""Handling one Ready of a :class:`~futureq.raft.node.RaftNode`: persist, send, apply.

Plain functions over the node, in the order the Ready/Advance contract asks
(``docs/raft.md``): a leader's own messages go out at once (thesis §10.2.1); the
snapshot, entries and hard state are persisted, synced when ``must_sync``
(:func:`persist`, which on a full disk stops leading and retries once there is room);
then the other messages are sent; then a received snapshot is installed and the
committed entries are handed to the applier task (:func:`applier`, :func:`apply`),
which applies them in order in bounded slices and resolves their proposers. Reads
whose read index is applied are answered here too (:func:`resolve_reads`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import trio

from futureq.errors import NoSpaceError, RequestError
from futureq.quick_thread import run_sync_quick
from futureq.raft.messages import Ready
from futureq.raft.node_ops import PROBE_PREFIX, outcome_unknown
from futureq.raft.roles import Role
from futureq.raft.values import Entry, EntryKind

if TYPE_CHECKING:
    from futureq.raft.node import RaftNode

log = logging.getLogger(__name__)

APPLY_SLICE_ENTRIES = 8
"""Entries applied between two yields to the event loop."""


async def handle_ready(node: RaftNode, ready: Ready) -> None:
    send = node._transport.send
    for message in ready.leader_messages:
        # Replicate while our own fsync runs (thesis §10.2.1): the followers' writes
        # overlap ours, and the core counts us toward a quorum only after it.
        send(message)
    if ready.snapshot is not None or ready.entries or ready.hard_state is not None:
        started = trio.current_time()
        await persist(node, ready)
        if node._metrics is not None and ready.must_sync:
            node._metrics.fsync_seconds.observe(trio.current_time() - started)
            node._metrics.group_commit_items.observe(len(ready.entries))
    for entry in ready.entries:
        durable = node._durable_waiters.pop(entry.index, None)
        if durable is not None:
            if durable.term == entry.term:
                durable.resolve(int(entry.index))
            else:
                durable.fail(node._not_leader())
    for message in ready.messages:
        send(message)
    if ready.snapshot is not None:
        index = int(ready.snapshot.metadata.index)
        await wait_applied(node)  # the snapshot replaces everything applied so far
        started = time.monotonic()
        node._sm.restore(ready.snapshot.data, index)
        log.info(
            "installed a snapshot from the leader at index %d (%d bytes) in %.2f s",
            index,
            len(ready.snapshot.data),
            time.monotonic() - started,
        )
        for waiter_index in [i for i in node._apply_waiters if i <= index]:
            node._apply_waiters.pop(waiter_index).fail(
                outcome_unknown(waiter_index, "a snapshot from the new leader replaced it")
            )
    if ready.committed_entries:
        # Applied by the applier task, so the next persist (an fsync in a worker
        # thread) overlaps with applying this batch on the loop.
        node._apply_backlog += 1
        node._applied_all = trio.Event() if node._applied_all.is_set() else node._applied_all
        assert node._apply_send is not None
        await node._apply_send.send(ready.committed_entries)
    for read in ready.read_states:
        if read.request_ctx.startswith(PROBE_PREFIX):
            node._leader_commit_seen = max(node._leader_commit_seen, int(read.index))
            node._probe_answered = True
            continue
        waiter = node._read_waiters.pop(read.request_ctx, None)
        if waiter is not None:
            node._reads_after_apply.append((int(read.index), waiter))
    resolve_reads(node)


async def persist(node: RaftNode, ready: Ready) -> None:
    """Store a Ready; on a full disk stop leading and retry once there is room.

    Nothing of the Ready that vouches for this node's disk (a vote, an
    AppendEntries answer, a client's answer) is sent until it is stored; followers
    elect another leader meanwhile (issue 10, "A full disk"). A leader's
    ``leader_messages`` have left already (thesis §10.2.1): a majority of followers
    may commit those entries without it, which is what the quorum rule allows.
    """
    while True:
        try:
            if ready.must_sync:
                # Not cancellable: a synced write must finish. A quiet loop waits
                # for it without the hop back through the loop (quick_thread).
                if node._alarm is None:
                    await run_sync_quick(node._storage.persist, ready)
                else:
                    async with node._alarm.writing():
                        await run_sync_quick(node._storage.persist, ready)
            else:
                # Commit-index-only writes are unsynced and take microseconds: a
                # thread hop would cost more than the write.
                node._storage.persist(ready)
            break
        except NoSpaceError as exc:
            note_no_space(node, exc)
        await wait_for_space(node)
    if node._disk_full:
        node._disk_full = False
        node._note_role()


def note_no_space(node: RaftNode, exc: NoSpaceError) -> None:
    """A write found the disk full: raise the alarm and stop leading.

    Callers then wait with :func:`wait_for_space` *outside* their except block: the
    exception's traceback holds the write batch, which holds RocksDB open, and the
    alarm must be able to reopen it.
    """
    if node._alarm is None:
        raise exc
    node._alarm.trip(exc)
    if not node._disk_full:
        node._disk_full = True
        node._note_role()  # the broker stops leading; clients go elsewhere
        log.error("raft: the disk is full; not leading until there is room again")


async def wait_for_space(node: RaftNode) -> None:
    assert node._alarm is not None
    await node._alarm.wait_cleared()


def resolve_reads(node: RaftNode) -> None:
    """Answer the reads whose read index is applied now."""
    if node._reads_after_apply:
        applied = node._sm.applied_index
        remaining = []
        for index, waiter in node._reads_after_apply:
            if applied >= index:
                waiter.resolve(None)
            else:
                remaining.append((index, waiter))
        node._reads_after_apply = remaining


async def wait_applied(node: RaftNode) -> None:
    """Block until the applier has applied every batch handed to it."""
    while node._apply_backlog:
        await node._applied_all.wait()


async def applier(node: RaftNode, batches: trio.MemoryReceiveChannel[tuple[Entry, ...]]) -> None:
    async with batches:
        async for entries in batches:
            await apply(node, entries)
            node._apply_backlog -= 1
            if node._apply_backlog == 0:
                node._applied_all.set()
            resolve_reads(node)
            node._note_role()  # the no-op of our term may just have been applied
            node._note_caught_up()  # /readyz of a follower under load


async def apply(node: RaftNode, entries: tuple[Entry, ...]) -> None:
    core = node.core
    sm = node._sm
    started = trio.current_time()
    waiters = node._apply_waiters
    for position, entry in enumerate(entries):
        if position % APPLY_SLICE_ENTRIES == APPLY_SLICE_ENTRIES - 1:
            # Let the dispatcher deliver what fell due while a big batch applies.
            await trio.lowlevel.checkpoint()
        index = int(entry.index)
        if entry.kind is EntryKind.NORMAL:
            error: RequestError | None = None
            result: Any = None
            mine = waiters.get(index) if waiters else None
            decoded = mine.decoded if mine is not None and mine.term == entry.term else None
            try:
                result = await apply_one(node, index, entry.data, decoded)
            except RequestError as exc:  # pragma: no cover - apply should not refuse
                error = exc
        else:
            while True:
                try:
                    sm.apply_other(index)
                    break
                except NoSpaceError as exc:
                    note_no_space(node, exc)
                await wait_for_space(node)
            result, error = None, None
            if (
                entry.kind is EntryKind.NOOP
                and entry.term == core.term
                and core.role is Role.LEADER
            ):
                node._leader_ready_term = int(entry.term)
                node.elections_won += 1
        waiter = waiters.pop(index, None) if waiters else None
        if waiter is not None:
            if waiter.term != entry.term:
                # Another leader's entry won this index: ours was never applied.
                waiter.fail(node._not_leader())
            elif error is not None:
                waiter.fail(error)
            else:
                waiter.resolve(result)
    if node._metrics is not None:
        node._metrics.apply_seconds.observe(trio.current_time() - started)


async def apply_one(node: RaftNode, index: int, data: bytes, decoded: Any = None) -> Any:
    """Apply one entry; in bounded steps when the state machine offers
    ``apply_steps`` (a generator), yielding to the loop between them; ``decoded``
    (the proposer's reading of ``data``, see :meth:`RaftNode.propose`) goes with them."""
    while True:
        try:
            apply_steps = getattr(node._sm, "apply_steps", None)
            if apply_steps is None:
                return node._sm.apply(index, data)
            if decoded is None:
                steps = apply_steps(index, data)
            else:
                steps = apply_steps(index, data, decoded)
            while True:
                try:
                    next(steps)
                except StopIteration as done:
                    return done.value
                await trio.lowlevel.checkpoint()
        except NoSpaceError as exc:
            # The state machine keeps the entry's changes; applying the same entry
            # again only writes them.
            note_no_space(node, exc)
        await wait_for_space(node)
