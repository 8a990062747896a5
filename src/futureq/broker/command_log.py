"""The CommandLog seam, and the single-node durable log that implements it.

Every state change is proposed as a command (``futureq.state.commands``); the log
makes it durable, then applies it to :class:`~futureq.state.queue_state.QueueState`
in log order and hands the result back to the proposer. Raft implements the same seam
(``DESIGN.md``, "Data flow"); this module is the one-node version: append plus fsync
with group commit (one synced RocksDB batch for many proposals), then apply.

Two tasks form a pipeline: the writer syncs batch N+1 while the applier applies
batch N, so the disk and the CPU work at the same time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

import msgpack
import trio

from futureq import request_order
from futureq.errors import ErrorCode, NoSpaceError, RequestError, StorageError
from futureq.quick_thread import run_sync_quick

if TYPE_CHECKING:
    from futureq.metrics import Metrics
    from futureq.state.queue_state import QueueState
    from futureq.storage.db import Database
    from futureq.storage.space import SpaceAlarm

log = logging.getLogger(__name__)

ENTRY_NORMAL = 0
APPLY_SLICE_ENTRIES = 8
"""Entries applied between two yields to the event loop."""
TRUNCATE_EVERY_ENTRIES = 10_000
"""Delete applied log entries once this many have accumulated."""


class CommandLog(Protocol):
    """What the broker needs from a replicated (or single-node) log."""

    def is_leader(self) -> bool:
        """True when this node may accept proposals and dispatch."""
        ...

    def leader_address(self) -> str | None:
        """Client address of the current leader, or None while unknown."""
        ...

    @property
    def applied_index(self) -> int:
        """Index of the last entry applied to the state machine."""
        ...

    async def propose(self, command: bytes, decoded: list[Any] | None = None) -> Any:
        """Make ``command`` durable, apply it, and return the apply result.

        ``decoded``: ``commands.decode(command)`` as the caller already holds it, which
        the node's own apply then uses instead of decoding the bytes (None: decode).

        Raises:
            NotLeaderError: this node is not the leader.
            RequestError: UNAVAILABLE while the log is shutting down.
            StorageError: the disk failed; the node stops.
        """
        ...

    async def propose_durable(self, command: bytes) -> int:
        """Make ``command`` durable on the leader; return its log index (ack level LEADER).

        Raises:
            as :meth:`propose`.
        """
        ...

    async def read_barrier(self) -> None:
        """Return once this node's state reflects every write acknowledged before the call
        (linearizable reads: Raft thesis §6.4, ReadIndex).

        Raises:
            NotLeaderError: this node is not the leader.
        """
        ...

    def ready_for_clients(self) -> bool:
        """A leader is known and this node has applied what it knows to be committed."""
        ...

    async def wait_for_leader(self) -> None:
        """Return once a leader that takes requests is known (this node, ready to
        lead, or another node), or once an election should have ended."""
        ...


async def apply_in_steps(
    state: QueueState, index: int, data: bytes, command: list[Any] | None = None
) -> Any:
    """Apply one command with :meth:`QueueState.apply_steps`, yielding between steps.

    A 10,000-item batch is applied in slices of ``APPLY_STEP_ITEMS`` items, so requests
    on other connections (a PING, a heartbeat) are served meanwhile.

    Returns:
        :meth:`QueueState.apply`'s result.
    """
    steps = state.apply_steps(index, data, command)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        await trio.lowlevel.checkpoint()


def no_space_error() -> RequestError:
    """The answer to a write refused because the disk is full."""
    return RequestError(
        ErrorCode.NO_SPACE,
        "the node's disk is full (NO_SPACE alarm): nothing was written; retry later or on "
        "another node (the node resumes by itself when space returns)",
    )


_NOT_APPLIED: Final = object()
"""What :meth:`SingleNodeLog._apply_one` returns when told not to wait for space."""


class _Proposal:
    __slots__ = ("command", "data", "done", "error", "index", "result")

    def __init__(self, data: bytes, command: list[Any] | None = None) -> None:
        self.data = data
        self.command = command
        self.index = 0
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = request_order.Done()


def log_key(index: int) -> bytes:
    """``raft_log`` key of an index: 8 bytes, big-endian."""
    return index.to_bytes(8, "big")


class SingleNodeLog:
    """A durable command log for a cluster of one node.

    Args:
        db: The node's database (``raft_log`` family holds the entries).
        state: The state machine entries are applied to.
        address: This node's client address (it is always the leader).
        fsync: Sync every group commit (off only for tests of non-durable setups).
        max_batch_items: Most proposals written in one synced batch.
        metrics: Where fsync latency and batch sizes are observed, or None.
        on_applied: Called after each group of entries is applied (wakes the dispatcher).
        space_alarm: The NO_SPACE alarm: a write that finds the disk full fails its
            proposals with NO_SPACE instead of stopping the node. None: it stops it.
    """

    def __init__(
        self,
        db: Database,
        state: QueueState,
        *,
        address: str | None,
        fsync: bool = True,
        max_batch_items: int = 4096,
        metrics: Metrics | None = None,
        on_applied: Callable[[], None] | None = None,
        space_alarm: SpaceAlarm | None = None,
    ) -> None:
        self._db = db
        self._alarm = space_alarm
        self._state = state
        self._address = address
        self._fsync = fsync
        self._max_batch_items = max_batch_items
        self._metrics = metrics
        self._on_applied = on_applied
        self._send, self._receive = trio.open_memory_channel[_Proposal](max_batch_items)
        self._closing = False
        self._in_progress = 0
        self._idle = trio.Event()
        self._idle.set()
        last = db.last_key("raft_log")
        self.last_index = max(
            state.applied_index, 0 if last is None else int.from_bytes(last, "big")
        )
        self._truncated_below = state.applied_index
        self._apply_backlog = 0
        """Batches handed to the applier and not yet applied (queued or being applied)."""
        self._pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack

    def is_leader(self) -> bool:
        """Always true: a single node leads itself (proposals fail with UNAVAILABLE while it stops)."""
        return True

    def leader_address(self) -> str | None:
        """This node's own client address."""
        return self._address

    @property
    def applied_index(self) -> int:
        """Index of the last entry applied."""
        return self._state.applied_index

    def recover(self) -> int:
        """Apply log entries written but not yet applied before a crash.

        Returns:
            How many entries were replayed.

        Raises:
            StorageError: a gap in the log (an entry missing after the applied index).
        """
        replayed = 0
        index = self._state.applied_index + 1
        while index <= self.last_index:
            raw = self._db.get("raft_log", log_key(index))
            if raw is None:
                raise StorageError(
                    f"log entry {index} is missing (applied index {self._state.applied_index}, "
                    f"last index {self.last_index}); the data directory is damaged"
                )
            _term, _kind, data = msgpack.unpackb(raw, raw=False)
            self._state.apply(index, data)
            replayed += 1
            index += 1
        return replayed

    async def propose(self, command: bytes, decoded: list[Any] | None = None) -> Any:
        """Make ``command`` durable (synced), apply it, return the apply result.

        ``decoded``: the command list ``command`` was encoded from, if the caller kept
        it: apply takes it instead of decoding the bytes again.

        Raises:
            RequestError: UNAVAILABLE once shutdown has begun.
            StorageError: the write failed; the node is stopping.
        """
        return (await self._propose(command, decoded)).result

    async def propose_durable(self, command: bytes, decoded: list[Any] | None = None) -> int:
        """Like :meth:`propose` (one node: durable on the leader is committed); the index."""
        return (await self._propose(command, decoded)).index

    async def read_barrier(self) -> None:
        """Nothing to wait for: one node applies every write before acknowledging it."""
        await trio.lowlevel.checkpoint()

    def ready_for_clients(self) -> bool:
        """Always: a single node is its own leader once it serves."""
        return True

    async def wait_for_leader(self) -> None:
        """Nothing to wait for: a single node always leads."""
        await trio.lowlevel.checkpoint()

    def cluster_status(self) -> dict[str, Any]:
        """The CLUSTER_STATUS_OK map of a node that runs alone."""
        return {
            "role": "leader",
            "mode": "single",
            "term": 0,
            "leader_id": None,
            "leader_address": self._address,
            "commit_index": self._state.applied_index,
            "applied_index": self._state.applied_index,
            "voters": [],
            "learners": [],
            "nodes": [],
        }

    async def _propose(self, command: bytes, decoded: list[Any] | None = None) -> _Proposal:
        if self._closing:
            raise RequestError(
                ErrorCode.UNAVAILABLE, "the server is shutting down; retry on another node or later"
            )
        proposal = _Proposal(command, decoded)
        self._in_progress += 1
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        try:
            await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled caller writes nothing
            # No extra yield while the queue has room; in the turn of its request (the
            # writer takes them in order).
            await request_order.in_turn(
                lambda: self._send.send_nowait(proposal),
                lambda: self._send.send(proposal),
                done=proposal.done,
            )
            if not proposal.done.is_set():  # set: in_turn waited for it (one wake-up)
                await proposal.done.wait()
        finally:
            self._in_progress -= 1
            if self._in_progress == 0:
                self._idle.set()
        if proposal.error is not None:
            raise proposal.error
        return proposal

    def has_room(self) -> bool:
        """Whether :meth:`propose_nowait` would find room in the writer's queue now."""
        stats = self._send.statistics()
        return stats.current_buffer_used < stats.max_buffer_size

    def propose_nowait(self, command: bytes, decoded: list[Any] | None = None) -> _Proposal:
        """Queue ``command`` for the writer at once, as :meth:`propose` does but without
        waiting for it: the caller waits on the proposal's ``done`` (set once it is
        applied, or failed: then ``error`` holds why; else ``index`` and ``result`` are
        known), then calls :meth:`answered` (also when it gives up waiting).

        Raises:
            RequestError: UNAVAILABLE once shutdown has begun (nothing queued).
            trio.WouldBlock: the writer's queue is full (:meth:`has_room`; nothing queued).
        """
        if self._closing:
            raise RequestError(
                ErrorCode.UNAVAILABLE, "the server is shutting down; retry on another node or later"
            )
        proposal = _Proposal(command, decoded)
        self._send.send_nowait(proposal)
        self._in_progress += 1
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        return proposal

    def answered(self) -> None:
        """A proposal of :meth:`propose_nowait` was answered or given up on
        (:meth:`wait_idle` counts it until then)."""
        self._in_progress -= 1
        if self._in_progress == 0:
            self._idle.set()

    def begin_shutdown(self) -> None:
        """Refuse new proposals; those already queued are still written and applied."""
        self._closing = True

    async def wait_idle(self) -> None:
        """Block until every proposal made so far has been answered."""
        await self._idle.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the writer and the applier until cancelled."""
        to_apply_send, to_apply_receive = trio.open_memory_channel[list[_Proposal]](2)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._writer, to_apply_send)
            nursery.start_soon(self._applier, to_apply_receive)
            task_status.started()

    async def _writer(self, to_apply: trio.MemorySendChannel[list[_Proposal]]) -> None:
        async with to_apply:
            while True:
                batch = [await self._receive.receive()]
                while len(batch) < self._max_batch_items:
                    try:
                        batch.append(self._receive.receive_nowait())
                    except trio.WouldBlock:
                        break
                if self._alarm is not None and self._alarm.raised:
                    self._refuse(batch)
                    continue
                for proposal in batch:
                    self.last_index += 1
                    proposal.index = self.last_index
                started = trio.current_time()
                try:
                    # Not cancellable: a half-done synced write must finish before we go on.
                    await self._write(batch)
                except NoSpaceError as exc:
                    if self._alarm is None:
                        raise
                    self._alarm.trip(exc)
                    self.last_index -= len(batch)  # nothing of the batch was written
                    self._refuse(batch)
                    continue
                except StorageError as exc:
                    for proposal in batch:
                        proposal.error = exc
                        proposal.done.set()
                    raise
                if self._metrics is not None:
                    self._metrics.fsync_seconds.observe(trio.current_time() - started)
                    self._metrics.group_commit_items.observe(len(batch))
                if self._apply_backlog == 0 and self._receive.statistics().current_buffer_used == 0:
                    # Nothing to write next and nothing being applied: apply here. Handing
                    # the batch to the applier cost one pass of the event loop on the way
                    # to every answer of a quiet node; under load (proposals waiting) the
                    # applier takes it, so the next write overlaps this apply. What a full
                    # disk leaves unapplied goes to the applier, which waits for space:
                    # the writer goes on refusing proposals with NO_SPACE meanwhile.
                    batch = await self._apply_batch(batch, inline=True)
                if batch:
                    self._apply_backlog += 1
                    await to_apply.send(batch)

    async def _write(self, batch: list[_Proposal]) -> None:
        """Write the entries of ``batch`` (indexes assigned) in one synced write."""
        # In a worker thread; a loop with nothing else to run waits for it briefly
        # without the hop back through the loop (quick_thread).
        if self._alarm is None:
            await run_sync_quick(self._write_entries, batch)
            return
        async with self._alarm.writing():  # no reopen while the write runs
            await run_sync_quick(self._write_entries, batch)

    def _write_entries(self, batch: list[_Proposal]) -> None:
        # The write batch (which holds column family handles, so RocksDB) lives only
        # here: nothing keeps the database open once the write is done.
        write_batch = self._db.new_batch()
        handle = self._db.handle("raft_log")  # per write: a reopen replaces it
        pack = self._pack
        for proposal in batch:
            write_batch.put(log_key(proposal.index), pack([0, ENTRY_NORMAL, proposal.data]), handle)
        self._db.write_batch(write_batch, self._fsync)

    @staticmethod
    def _refuse(batch: list[_Proposal]) -> None:
        for proposal in batch:
            proposal.error = no_space_error()
            proposal.done.set()

    async def _apply_one(self, proposal: _Proposal, *, wait: bool = True) -> Any:
        """Apply one written entry; after a full disk, wait for room and write again (the
        entry is in the log, so it must be applied before the next one), or without
        ``wait`` return :data:`_NOT_APPLIED`."""
        while True:
            try:
                return await apply_in_steps(
                    self._state, proposal.index, proposal.data, proposal.command
                )
            except NoSpaceError as exc:
                if self._alarm is None:
                    raise
                self._alarm.trip(exc)
            if not wait:
                return _NOT_APPLIED
            # Waited for outside the except block: the exception's traceback holds the
            # write batch, which holds RocksDB open and would make the reopen fail.
            await self._alarm.wait_cleared()

    async def _applier(self, to_apply: trio.MemoryReceiveChannel[list[_Proposal]]) -> None:
        async with to_apply:
            async for batch in to_apply:
                try:
                    await self._apply_batch(batch)
                finally:
                    self._apply_backlog -= 1
                await trio.lowlevel.checkpoint()

    async def _apply_batch(
        self, batch: list[_Proposal], *, inline: bool = False
    ) -> list[_Proposal]:
        """Apply one written group commit in order, answer its proposals, and truncate
        the log once enough of it is applied; by the applier, or by the writer
        (``inline``) when no batch handed to the applier is left to apply (so batches
        apply in log order).

        Returns:
            The proposals left unapplied: none, unless ``inline`` and the disk is full
            (the writer must not wait for space: it refuses proposals meanwhile).
        """
        started = trio.current_time()
        for position, proposal in enumerate(batch):
            try:
                result = await self._apply_one(proposal, wait=not inline)
            except RequestError as exc:  # pragma: no cover - apply never refuses
                proposal.error = exc
            else:
                if result is _NOT_APPLIED:
                    return batch[position:]
                proposal.result = result
            proposal.done.set()
            if position % APPLY_SLICE_ENTRIES == APPLY_SLICE_ENTRIES - 1:
                # A big group commit must not hold the loop: let the dispatcher
                # deliver what fell due meanwhile (lateness, DESIGN.md).
                await trio.lowlevel.checkpoint()
        if self._metrics is not None:
            self._metrics.apply_seconds.observe(trio.current_time() - started)
        if self._on_applied is not None:
            self._on_applied()
        applied = self._state.applied_index
        if applied - self._truncated_below >= TRUNCATE_EVERY_ENTRIES:
            # The state writes before this point reach disk with the next synced
            # log write (one WAL), so entries up to ``applied`` are not needed.
            try:
                self._db.delete_range("raft_log", log_key(0), log_key(applied + 1))
            except NoSpaceError as exc:
                if self._alarm is None:
                    raise
                self._alarm.trip(exc)  # truncate later
            else:
                self._truncated_below = applied
        return []


__all__ = ["CommandLog", "SingleNodeLog", "apply_in_steps", "log_key"]
