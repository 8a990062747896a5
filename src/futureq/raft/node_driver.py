"""The driver of a :class:`~futureq.raft.node.RaftNode`: the one task that owns the core,
and the tasks that feed it.

Plain functions over the node. At start the data directory's stamp is checked (or
written) and the core is loaded (:func:`load`). Then the ticker asks for a tick every
``tick_ms``, the receiver moves peer messages into the inbox (clock messages are
answered at once, :func:`take_in`), and the readiness prober asks a follower's leader
for its commit index. Each round :func:`drive` feeds the core what has queued up
(ticks, inbox, a finished compaction, the callers' operations: :func:`feed`,
:func:`start_op`), then handles each Ready (:mod:`futureq.raft.node_ready`) and starts
a compaction when enough was applied (:func:`maybe_start_compaction`, written by the
compactor task).
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import attrs
import trio

from futureq.errors import ConfigError, NoSpaceError, RequestError, StorageError
from futureq.raft import node_ready
from futureq.raft.core import ProposalDroppedError, RaftCore, RaftNotLeaderError
from futureq.raft.messages import (
    CLOCK_MESSAGES,
    AppendEntries,
    Heartbeat,
    LogIndex,
    Message,
    NodeId,
)
from futureq.raft.node_ops import PROBE_PREFIX, Op, Waiter, outcome_unknown
from futureq.raft.rocks_storage import StoreIdentity
from futureq.raft.roles import Role
from futureq.raft.storage import SnapshotOutOfDateError
from futureq.raft.values import Membership

if TYPE_CHECKING:
    from futureq.raft.node import RaftNode

log = logging.getLogger(__name__)

INBOX_LIMIT = 4096
"""Peer messages taken in before the driver has stepped them (then the receiver waits)."""
_LOG_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def check_identity(node: RaftNode) -> tuple[int, bool]:
    """Check (or write) the data directory's stamp.

    Returns:
        ``(incarnation, new)``: ``new`` when the directory was never used before.

    Raises:
        ConfigError: the directory belongs to another cluster or another node.
    """
    storage = node._storage
    config = node.config
    found = storage.identity()
    if found is None:
        pristine = storage.is_pristine()
        incarnation = node._rng.getrandbits(63) or 1
        storage.stamp_identity(StoreIdentity(config.cluster_id, config.node_id, incarnation))
        if pristine:
            log.info(
                "new data directory: node %d of cluster %r, incarnation %x; it votes once "
                "every other voter has answered (a wiped directory looks the same)",
                config.node_id,
                config.cluster_id,
                incarnation,
            )
        else:
            log.info("stamped the existing raft data of node %d: incarnation %x",
                     config.node_id, incarnation)  # fmt: skip
        return incarnation, pristine
    if found.cluster_id != config.cluster_id:
        raise ConfigError(
            f"the data directory belongs to cluster {found.cluster_id!r}, not "
            f"{config.cluster_id!r}; pass --cluster-id {found.cluster_id} or use another "
            "--data-dir"
        )
    if found.node_id != config.node_id:
        raise ConfigError(
            f"the data directory belongs to node {found.node_id}, not node "
            f"{config.node_id}; pass --node-id {found.node_id} or use another --data-dir"
        )
    if config.new_cluster:
        log.warning(
            "--initial-cluster-state new ignored: node %d's data directory was used "
            "before; it recovers as a member of an existing cluster",
            config.node_id,
        )
    return found.incarnation, False


def load(node: RaftNode) -> None:
    storage = node._storage
    node.incarnation, new_directory = check_identity(node)
    # Announced in every peer handshake: a second process running as this node id
    # (another data directory, so another incarnation) is then refused by peers.
    node._transport.set_incarnation(node.incarnation)
    if node.config.bootstrap_voters:
        storage.bootstrap(Membership(frozenset(NodeId(v) for v in node.config.bootstrap_voters)))
    metadata = storage.snapshot_metadata()
    if node._sm.applied_index < metadata.index:
        node._sm.restore(storage.snapshot().data, metadata.index)
    applied = node._sm.applied_index
    if applied > storage.last_index():
        raise StorageError(
            f"the state machine applied index {applied} is past the raft log's last index "
            f"{storage.last_index()}; the data directory is damaged"
        )
    hard_state = storage.hard_state()
    if applied > hard_state.commit:
        # Entries are applied only once committed; the commit index (unsynced) was lost.
        storage.set_hard_state(attrs.evolve(hard_state, commit=LogIndex(applied)))
    boot_id = node._rng.getrandbits(63) or 1
    node._core = RaftCore(
        node.config.raft_config(node.incarnation, boot_id, new_directory=new_directory),
        storage,
        node._rng,
        applied=LogIndex(applied),
    )
    node._note_recovery()


async def ticker(node: RaftNode) -> None:
    tick_s = node.config.tick_ms / 1000
    deadline = trio.current_time()
    while True:
        deadline += tick_s
        now = trio.current_time()
        if deadline < now:
            # After a stall, never fire a burst of ticks to catch up: a follower's
            # election timer must not run faster than real time, or the leader
            # lease (timekeeper.TimeConfig.lease_us) would not hold.
            deadline = now
        await trio.sleep_until(deadline)
        node._ticks_due += 1
        node._wake.set()


async def readiness_prober(node: RaftNode) -> None:
    """On a follower, ask the leader for its commit index every half election
    timeout (``ready_for_clients``: applied up to the leader's commit)."""
    interval_s = node.config.election_timeout_ticks * node.config.tick_ms / 2000
    sequence = 0
    while True:
        core = node._core
        if core is not None and core.role is not Role.LEADER and core.leader_id is not None:
            sequence += 1
            with contextlib.suppress(RequestError):  # queue full: probe next time
                node._enqueue(
                    Op("probe", Waiter(), data=PROBE_PREFIX + sequence.to_bytes(8, "big"))
                )
        await trio.sleep(interval_s)


async def receiver(node: RaftNode) -> None:
    """Move peer messages into the inbox, everything that has arrived at once.

    Every ``receive`` is a scheduling point, so taking one message per wakeup would
    let this node take in only one message per pass of the event loop over all its
    tasks: on a busy machine (a slow pass) a leader, which hears from every
    follower, then falls behind, and its answers wait seconds in the channel and
    the socket buffers behind it (lease lost, clock samples too old, commits late).
    """
    limit = INBOX_LIMIT
    channel = node._transport.receive_channel
    inbox = node._inbox
    last_heard = node._last_heard_s
    async for message in channel:
        now = trio.current_time()
        last_heard[int(message.from_id)] = now
        take_in(node, message)
        while len(inbox) < limit:
            try:
                message = channel.receive_nowait()
            except trio.WouldBlock:
                break
            last_heard[int(message.from_id)] = now
            take_in(node, message)
        if inbox:
            node._wake.set()
        if len(inbox) >= limit:
            node._inbox_drained = trio.Event()
            await node._inbox_drained.wait()


def take_in(node: RaftNode, message: Message) -> None:
    """Queue a Raft message for the driver; answer or learn a clock message now.

    A clock sample measures the round trip, and anything that delays the answer
    (the driver waiting for an fsync, a long apply or snapshot) widens it: on a busy
    host every sample came back over the quarter-bound limit and the restarted
    nodes stayed unsynchronized, so no node could campaign, for over a minute
    (issue 15, seed 21). Answered here, a sample costs only the transport and
    the event loop. Neither reading moves outside the round trip: the ping is
    answered after it arrived, the pong is timed when it is taken in.
    """
    if not isinstance(message, CLOCK_MESSAGES):
        node._inbox.append(message)
        return
    answer = node.timekeeper.on_message(
        node.core, message, node._clock.monotonic_us(), node._clock.wall_us()
    )
    if answer is not None:
        node._transport.send(answer)


async def compactor(node: RaftNode, sources: trio.MemoryReceiveChannel[Any]) -> None:
    async for source in sources:
        try:
            data = await trio.to_thread.run_sync(source.serialize)
            await trio.to_thread.run_sync(node._storage.write_snapshot_file, source.index, data)
        except NoSpaceError as exc:
            if node._alarm is None:
                raise
            node._alarm.trip(exc)
            log.warning("raft snapshot at %d not written (disk full); later", source.index)
            node._compacting = False
            continue
        finally:
            source.close()
        node._compaction_done = (int(source.index), data)
        node._wake.set()


async def drive(node: RaftNode, compact_send: trio.MemorySendChannel[Any]) -> None:
    core = node.core
    while True:
        await node._wake.wait()
        node._wake = trio.Event()
        feed(node, core)
        while core.has_ready():
            ready = core.ready()
            node.timekeeper.on_ready(ready, node._clock.monotonic_us())
            await node_ready.handle_ready(node, ready)
            core.advance(ready)
        node._note_role()
        if core.recovering or node._was_recovering or core.removed_at is not None:
            node._note_recovery()
        maybe_start_compaction(node, compact_send)


def feed(node: RaftNode, core: RaftCore) -> None:
    ticks, node._ticks_due = node._ticks_due, 0
    mono_us = node._clock.monotonic_us() if ticks else 0
    wall_us = node._clock.wall_us() if ticks else 0
    for _ in range(ticks):
        core.tick()
        tick_time(node, core, mono_us, wall_us)
        if core.role is Role.LEADER:
            node._ticks_since_leading = 0
        else:
            node._ticks_since_leading += 1
    if (
        node._apply_waiters
        and core.role is not Role.LEADER
        and node._ticks_since_leading >= outcome_unknown_ticks(node)
    ):
        waiters, node._apply_waiters = node._apply_waiters, {}
        for index, waiter in waiters.items():
            waiter.fail(outcome_unknown(index, "leadership was lost"))
    inbox = node._inbox
    while inbox:
        message = inbox.popleft()
        if isinstance(message, AppendEntries):
            node._leader_commit_seen = max(node._leader_commit_seen, message.leader_commit)
        elif isinstance(message, Heartbeat):
            node._leader_commit_seen = max(node._leader_commit_seen, message.commit)
        core.step(message)
    node._inbox_drained.set()
    if node._compaction_done is not None:
        index, data = node._compaction_done
        node._compaction_done = None
        node._compacting = False
        try:
            snapshot = core.compact(LogIndex(index), data)
            node._storage.compact(snapshot, keep_entries=node.config.keep_entries_after_compaction)
            log.info("raft snapshot taken at index %d (%d bytes); log compacted", index, len(data))
        except (ValueError, SnapshotOutOfDateError) as exc:
            log.info("raft snapshot at %d discarded: %s", index, exc)
            node._storage.remove_snapshot_file(index)
        except NoSpaceError as exc:
            if node._alarm is None:
                raise
            node._alarm.trip(exc)
            log.warning("raft log not compacted at %d (disk full); later", index)
            node._storage.remove_snapshot_file(index)
    ops, node._ops = node._ops, []
    for op in ops:
        start_op(node, core, op)


def tick_time(node: RaftNode, core: RaftCore, mono_us: int, wall_us: int) -> None:
    """The timekeeper's duties of one tick: clock pings, who may lead (notices logged)."""
    messages, notices = node.timekeeper.on_tick(core, mono_us, wall_us)
    for message in messages:
        node._transport.send(message)
    for notice in notices:
        log.log(_LOG_LEVELS.get(notice.level, logging.INFO), "node %d: %s", node.id, notice.text)


def outcome_unknown_ticks(node: RaftNode) -> int:
    configured = node.config.outcome_unknown_ticks
    return 2 * node.config.election_timeout_ticks if configured is None else configured


def start_op(node: RaftNode, core: RaftCore, op: Op) -> None:
    waiter = op.waiter
    try:
        if op.kind in ("propose", "durable"):
            index = core.propose(op.data)
            waiter.index, waiter.term = index, core.term
            waiters = node._durable_waiters if op.kind == "durable" else node._apply_waiters
            waiters[index] = waiter
        elif op.kind == "conf":
            assert op.change is not None
            index = core.propose_conf_change(op.change)
            waiter.index, waiter.term = index, core.term
            node._apply_waiters[index] = waiter
        elif op.kind == "read":
            if core.role is not Role.LEADER:
                raise RaftNotLeaderError(core.leader_id)
            node._read_waiters[op.data] = waiter
            core.read_index(op.data)
        elif op.kind == "probe":
            # A follower asks the leader for its commit index (a forwarded ReadIndex,
            # thesis §6.4): /readyz waits until we applied that far.
            if core.role is not Role.LEADER and core.leader_id is not None:
                core.read_index(op.data)
            waiter.resolve(None)
        else:
            core.transfer_leadership(NodeId(op.target))
            waiter.resolve(None)
    except RaftNotLeaderError:
        waiter.fail(node._not_leader())
    except (ProposalDroppedError, RequestError) as exc:
        waiter.fail(exc)


def maybe_start_compaction(node: RaftNode, compact_send: trio.MemorySendChannel[Any]) -> None:
    if node._compacting or node._compaction_done is not None:
        return
    if node._alarm is not None and node._alarm.raised:
        return  # no snapshot view while the database may need reopening
    applied = node._sm.applied_index
    last_snapshot = int(node._storage.snapshot_metadata().index)
    if applied - last_snapshot < node.config.compact_every_entries:
        return
    source = node._sm.snapshot_source()
    try:
        compact_send.send_nowait(source)
    except trio.WouldBlock:  # pragma: no cover - _compacting guards the single slot
        source.close()
        return
    node._compacting = True


def fail_all(node: RaftNode, error: RequestError) -> None:
    for op in node._ops:
        op.waiter.fail(error)
    node._ops.clear()
    for waiters in (node._apply_waiters, node._durable_waiters, node._read_waiters):
        for waiter in waiters.values():
            waiter.fail(error)
        waiters.clear()
    for _index, waiter in node._reads_after_apply:
        waiter.fail(error)
    node._reads_after_apply.clear()
