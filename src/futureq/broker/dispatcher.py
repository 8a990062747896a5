"""The dispatcher: sleeps until the next due time, then hands due messages to consumers.

Leader only. It keeps each group's :class:`~futureq.state.due_index.DueIndex` filled
with a horizon of the group's earliest schedule entries (a range scan of the
``schedule`` family as time moves on), pops what is due when a consumer has credit,
drops what expired, dead-letters what ran out of attempts, and releases deliveries
whose visibility timeout ran out. It never polls: it waits on an event that is set
when something earlier than its next wake-up arrives, or until that wake-up.

Attempt counts are replicated state. A *redelivery* (attempt 2 and up: after a
visibility timeout, a consumer that left, a nack or a leader change) is handed to the
recorder task, which commits one DELIVERED command for everything handed to it
meanwhile and only then pushes the DELIVER frames; a new leader reads every such
attempt, so counts survive leader changes and restarts and never go backwards. A
*first* delivery goes out at once, unrecorded: its attempt (1) follows from the entry,
and the next delivery of it records 2. A first delivery that comes back without being
settled (its consumer left, its visibility timeout passed) is recorded then, by a
RETURN_COUNTED, and so is every first delivery out when the leader shuts down or hands
leadership over (:meth:`Dispatcher.hold_and_record`). The one thing lost that way:
if leadership is lost (a crash, a partition) while a message's first delivery is out
and before any of that, the new leader delivers attempt 1 again (one delivery
uncounted, at most once per leader change). Why: recording every delivery before
pushing it doubles the log entries of a consumer that acks one message at a time and
halved its throughput on this machine (``docs/architecture.md``), while redeliveries
are the rare case and the one that needs counting (dead-lettering a poison message).
A reaper task removes the schedule entries of deleted groups in bounded PURGE_GROUP
chunks.

This module holds the :class:`Dispatcher`'s state, its control (activate, deactivate,
the run loop and its wake-ups) and the status reads; the rest are plain functions over
it, one concern per module:

* :mod:`~futureq.broker.schedule_observer`: the schedule observer callbacks;
* :mod:`~futureq.broker.dispatch_pass`: one dispatch pass;
* :mod:`~futureq.broker.delivery_records`: redelivery recording and staging;
* :mod:`~futureq.broker.dispatch_tasks`: the proposer and reaper tasks;
* :mod:`~futureq.broker.dispatch_counters`: per-group metrics.

Source: ``DESIGN.md``, "Message semantics" (nothing early, nothing expired, fan-out
across groups, round-robin within a group, credit-based flow control).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import trio

from futureq.state import commands
from futureq.state.commands import CommandKind
from futureq.state.due_index import unpack
from futureq.wire.validation import DELIVERY_ROOM_BYTES

from . import delivery_records, dispatch_pass, dispatch_tasks, schedule_observer
from .delivery_records import Staged
from .due_counts import DueCounts
from .hub import Consumer, HeldEntry, Hub

if TYPE_CHECKING:
    from futureq.clock import Clock
    from futureq.config import QueueSection
    from futureq.metrics import Metrics
    from futureq.state.queue_state import QueueState

    from .command_log import CommandLog

DELIVER_BATCH_BYTES = 64 * 1024
"""Bytes of deliveries a DELIVER frame may always hold, however small half a frame is."""


def deliver_bytes(max_frame_bytes: int) -> int:
    """The dispatcher's ``max_deliver_bytes`` for a frame limit (bytes): half a frame
    (at least :data:`DELIVER_BATCH_BYTES`), and never past the frame less
    :data:`~futureq.wire.validation.DELIVERY_ROOM_BYTES`, so a DELIVER frame stays
    within ``limits.max_frame_bytes`` (``docs/protocol.md``, "Limits")."""
    half = max(DELIVER_BATCH_BYTES, max_frame_bytes // 2)
    return max(1, min(half, max_frame_bytes - DELIVERY_ROOM_BYTES))


DUE_COUNT_SCAN_ITEMS = 10_000
"""Most schedule entries read from disk to count one group's due backlog (a status or a
scrape stays short); a count that reaches it means "at least"."""


class Dispatcher:
    """Leader-local dispatch of due messages; the state machine's schedule observer.

    Args:
        state: The replicated state (read only here; changes go through ``log``).
        log: Where expiry and dead-letter commands are proposed.
        hub: Consumers and in-flight deliveries.
        clock: Wall clock for due times; the only clock this module reads.
        queue: Horizon size, batch sizes.
        metrics: Counters and the lateness histogram, or None.
        max_deliver_bytes: Most bytes of deliveries (payloads, headers, about 64 bytes
            of fields each) one DELIVER frame holds: the next delivery that would pass
            it goes in the next frame (a frame's first is always sent), so frames stay
            under the client's limit (:func:`deliver_bytes`).
        active: Dispatch from the start (a single node); a Raft node starts inactive
            and is activated when it becomes leader.
        dispatch_allowed: Asked before every pass; while it says no, nothing is handed
            out, released or expired (a Raft leader without its lease or with a clock
            out of bound: ``RaftNode.can_dispatch``). None: always allowed.
        max_deliveries_out: Most deliveries out on the node at once
            (``limits.max_deliveries_out``); at it a pass hands out nothing more
            until settlements or timeouts free room. None: no bound.
        max_out_per_connection: Most deliveries out on one connection
            (``limits.max_prefetch_per_connection``); its consumers get nothing more
            until one of them is settled or taken back. None: no bound.
    """

    def __init__(
        self,
        state: QueueState,
        log: CommandLog,
        hub: Hub,
        clock: Clock,
        queue: QueueSection,
        metrics: Metrics | None = None,
        max_deliver_bytes: int = 1024 * 1024,
        active: bool = True,
        dispatch_allowed: Callable[[], bool] | None = None,
        max_deliveries_out: int | None = None,
        max_out_per_connection: int | None = None,
    ) -> None:
        self.state = state
        hub.max_deliveries_out = math.inf if max_deliveries_out is None else max_deliveries_out
        hub.max_out_per_connection = (
            math.inf if max_out_per_connection is None else max_out_per_connection
        )
        self.held_back_passes = 0
        """Passes held back since the last warning logged about it."""
        self.held_back_logged_s = -math.inf
        """When that warning was last logged (monotonic s)."""
        self.dispatch_allowed = dispatch_allowed
        self.max_deliver_bytes = max_deliver_bytes
        self.log = log
        self.hub = hub
        self.clock = clock
        self.horizon_ms = queue.horizon_ms
        self.horizon_max_items = queue.horizon_max_items
        self.horizon_max_node_items = queue.horizon_max_node_items
        self.batch_items = queue.dispatch_batch_items
        self.group_settings = queue.group_settings()
        self.metrics = metrics
        self._wake = trio.Event()
        self._next_wake_ms: float = math.inf
        """When the run loop sleeps until (ms), as the last pass planned."""
        self._in_pass = False
        """A pass is under way: it plans its own next wake-up from everything it sees."""
        hub.look_again_by = self._look_again_by
        self._parked: list[Any] = []
        self._retry_after_ms = 0
        self._proposals_idle = trio.Event()
        """Set when the proposer has committed (or given up on) everything queued."""
        self._proposals_idle.set()
        self._proposals_send, self._proposals_receive = trio.open_memory_channel[
            tuple[bytes, list[Any]]
        ](64)
        self._timers: list[tuple[float, int]] = []
        """Heap of ``(wake_ms, group_id)``; an entry is live while ``_wake_at`` agrees."""
        self._wake_at: dict[int, float] = {}
        self._held_back_scan: list[int] = []
        """Groups still to look at for expiry in this round while the node is held
        back (``dispatch_pass.expire_held_back``)."""
        self._held_back_scan_min = math.inf
        """The earliest expiry seen in that round so far (ms)."""
        self._seek_hints: dict[int, int] = {}
        """Group id -> a packed ``(due_ms, id)`` no live entry of the group lies below
        (node-local; see :meth:`next_due_ms`)."""
        self._pass_now_ms = 0
        """Wall time of the dispatch pass in progress, or of the last one (ms)."""
        self._staged: deque[Staged] = deque()  # taken from the front: popleft, not pop(0)
        self._staged_changed = trio.Event()
        self._deleting_changed = trio.Event()
        self._carried: dict[tuple[int, int], int] = {}
        """(group id, message id) -> attempt of a delivery out (or timed out) when a
        RESCHEDULE moved its entry, until the entry's new place is notified (:func:`~futureq.broker.schedule_observer.carry`)."""
        self.due_counts = DueCounts(state, clock.monotonic_s)
        """Due-time histograms for BROWSE_COUNTS, fed by this observer on every node."""
        self._histograms = self.due_counts.histograms
        self.active = False
        self.held = False
        """Set while a leader hands over (shutdown, leadership transfer): nothing is
        handed out, so the first deliveries :meth:`hold_and_record` recorded are all
        there are (until :meth:`resume`)."""
        if active:
            self.activate()

    # ------------------------------------------------------------ observer

    def on_scheduled(
        self,
        group_id: int,
        due_ms: int,
        mid: int,
        expire_ms: int | None,
        attempt: int,
        released: int = 0,
    ) -> None:
        """A schedule entry was committed: index it if it falls inside the horizon.

        See :func:`~futureq.broker.schedule_observer.on_scheduled`.
        """
        schedule_observer.on_scheduled(self, group_id, due_ms, mid, expire_ms, attempt, released)

    def on_scheduled_batch(self, entries: Sequence[tuple[Any, ...]]) -> None:
        """Schedule entries were committed (``ScheduleObserver.on_scheduled_batch``).

        See :func:`~futureq.broker.schedule_observer.on_scheduled_batch`.
        """
        schedule_observer.on_scheduled_batch(self, entries)

    def group_horizon_items(self) -> int:
        """Most schedule entries one group may keep in memory now (items, >= 1).

        ``queue.horizon_max_items``, or the node's ``queue.horizon_max_node_items``
        shared by the groups this leader holds in memory (each published to or
        consumed since it leads), whichever is smaller; never below
        ``queue.dispatch_batch_items`` (one full DELIVER frame a pass, however many
        idle groups there are). So the due-index stays about the node's limit however
        many groups hold entries due soon.
        """
        share = self.horizon_max_node_items // max(1, len(self.hub.groups))
        return max(1, min(self.horizon_max_items, max(self.batch_items, share)))

    def next_due_ms(self, group_id: int) -> int | None:
        """When the group's earliest deliverable entry falls due (ms), or None (parked
        dead letters do not count); any node, from disk.

        See :func:`~futureq.broker.schedule_observer.next_due_ms`.
        """
        return schedule_observer.next_due_ms(self, group_id)

    def out_deliveries(
        self, group_ids: Sequence[int], ids: Sequence[int]
    ) -> list[tuple[bytes, int]]:
        """Deliveries of messages ``ids`` in groups ``group_ids`` that this leader knows
        went out and the log may not have recorded: ``(schedule key, attempt)`` each.

        See :func:`~futureq.broker.schedule_observer.out_deliveries`.
        """
        return schedule_observer.out_deliveries(self, group_ids, ids)

    def on_unscheduled(
        self,
        group_id: int,
        due_ms: int,
        mid: int,
        reason: CommandKind,
        held: tuple[int, int] | None = None,
    ) -> None:
        """A schedule entry was removed: forget it in the index and in flight.

        See :func:`~futureq.broker.schedule_observer.on_unscheduled`.
        """
        schedule_observer.on_unscheduled(self, group_id, due_ms, mid, reason, held)

    def on_group_changed(self, group_id: int) -> None:
        """One group was created, adopted, updated or deleted: O(1) whatever the count.

        See :func:`~futureq.broker.schedule_observer.on_group_changed`.
        """
        schedule_observer.on_group_changed(self, group_id)

    def on_groups_changed(self) -> None:
        """Every group may have changed (a snapshot was installed): start afresh.

        See :func:`~futureq.broker.schedule_observer.on_groups_changed`.
        """
        schedule_observer.on_groups_changed(self)

    def activate(self) -> None:
        """Start dispatching (this node became leader and applied everything committed).

        Every group's horizon is loaded afresh from disk: what the previous leader had
        in flight and did not see acked is due again (the at-least-once window). Groups
        are loaded a bounded number per pass (:data:`~futureq.broker.dispatch_pass.GROUPS_PER_PASS`), never all at once.
        """
        self.active = True
        self.hub.clear()
        self._carried.clear()
        self.hub.group_info = self.state.groups.get
        self.hub.held_entry = self._held_entry
        self._parked.clear()
        self._staged.clear()
        self._wake_at.clear()
        self._timers.clear()
        self._held_back_scan.clear()
        self._deleting_changed.set()
        # Only groups holding entries have anything to load; the others wait for a
        # consumer or an entry (either touches them).
        self.hub.touched.update(gid for gid, info in self.state.groups.items() if info.pending)
        self.kick()

    def _held_entry(self, key: bytes) -> HeldEntry | None:
        """The entry ``key`` names while it is held for a delivery an earlier leader
        left out and that delivery's deadline has not passed (:attr:`Hub.held_entry`)."""
        if not self.active:
            return None
        entry = self.state.get_entry(key)
        held = None if entry is None else entry.held()
        if entry is None or held is None or held[1] <= self.clock.wall_ms():
            return None
        gid, due_ms, mid = commands.parse_schedule_key(key)
        if mid < self.state.purged_below(gid):
            # A PURGE removes it (its chunks have not reached it yet): the delivery
            # was out when the purge applied, so it was cancelled, as one loaded in
            # the hub is (schedule_observer.cancel_purged_out).
            self.hub.note_cancelled(key, held[0])
            return None
        return due_ms, mid, entry.expire_ms, entry.attempt, entry.released, held

    def deactivate(self) -> None:
        """Stop dispatching (leadership lost): forget in-flight state and consumers."""
        self.active = False
        self.hub.clear()
        self._carried.clear()
        self._parked.clear()
        self._staged.clear()
        self._wake_at.clear()
        self._timers.clear()
        self._held_back_scan.clear()
        self.kick()

    # ------------------------------------------------------------ control

    def kick(self) -> None:
        """Wake the dispatch loop now (new credit, new consumer, earlier due time)."""
        self._wake.set()

    def note_expiry(self, expire_ms: int | None) -> None:
        """An entry expiring at ``expire_ms`` (ms; None: never) entered a group's index
        outside a pass (a publish, an EXPIRE retried). While a held-back round of expiry
        looks is under way (``dispatch_pass.expire_held_back``) its end plans the next
        pass no later than that: found by a tester, a message with a TTL published to a
        group the round had already looked at, to a group with consumers (so no timer
        of its own), stayed pending past its expiry until something else woke the
        dispatcher (30 s later: the visibility timeout of what was out)."""
        if expire_ms is not None and self._held_back_scan:
            self._held_back_scan_min = min(self._held_back_scan_min, expire_ms)

    def _look_again_by(self, at_ms: float) -> None:
        """The hub has work for a pass no later than ``at_ms`` (ms; ``-inf``: now): credit
        came back, or a delivery's visibility deadline or expiry came closer
        (:attr:`Hub.look_again_by`). Wake the loop if it sleeps past that.

        Within a pass nothing is needed: the pass looks at every group touched meanwhile
        and plans its wake-up from the hub's earliest deadline when it ends (a wake-up
        here would only cost an empty pass after it).
        """
        if not self._in_pass and at_ms < self._next_wake_ms:
            self.kick()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Dispatch until cancelled.

        Helper tasks: a proposer commits expiries and dead letters, the recorder
        commits DELIVERED records and pushes what they cover, the reaper purges
        deleted groups.
        """
        async with trio.open_nursery() as nursery:
            nursery.start_soon(dispatch_tasks.proposer, self)
            nursery.start_soon(delivery_records.recorder, self)
            nursery.start_soon(dispatch_tasks.reaper, self)
            nursery.start_soon(self.due_counts.run)
            task_status.started()
            while True:
                self._wake = trio.Event()
                next_ms = self.dispatch_once()
                self._next_wake_ms = next_ms
                if next_ms == math.inf:
                    await self._wake.wait()
                else:
                    delay_s = max(0.0, (next_ms - self.clock.wall_ms()) / 1000)
                    with trio.move_on_after(delay_s):
                        await self._wake.wait()

    # ------------------------------------------------------------ recording

    def take_staged(self) -> tuple[bytes | None, list[Staged]]:
        """Everything staged since the last call, and the DELIVERED that records it.

        Returns:
            ``(command, batches)``; the command is None when nothing is left to record
            (every staged delivery was settled elsewhere meanwhile). Pass the batches
            to :meth:`push_staged` once the command is committed, or to
            :meth:`drop_staged` if it could not be.

        See :func:`~futureq.broker.delivery_records.take_staged`.
        """
        return delivery_records.take_staged(self)

    def push_staged(self, batches: list[Staged], *, pass_now_ms: int | None = None) -> int:
        """Push deliveries whose DELIVERED committed, or first deliveries straight from a
        pass (``pass_now_ms``: the pass's time, so what the pass found unexpired is not
        expired here, and the pass computes its own next wake-up); return how many went
        out.

        See :func:`~futureq.broker.delivery_records.push_staged`.
        """
        return delivery_records.push_staged(self, batches, pass_now_ms=pass_now_ms)

    def drop_staged(self, batches: list[Staged]) -> None:
        """Their DELIVERED could not be committed (or they may not be pushed now): give
        the deliveries back unpushed. One removed meanwhile returns its credit, as in
        :meth:`push_staged` (it never went out).

        See :func:`~futureq.broker.delivery_records.drop_staged`.
        """
        delivery_records.drop_staged(self, batches)

    # ------------------------------------------------------------ proposals

    async def hold_and_record(self) -> int:
        """Stop handing out deliveries (until :meth:`resume`), then commit the attempts
        of every first delivery that went out and is not in the log (given back, or
        still out): before a leader shuts down or hands leadership over, so the node
        that delivers next continues their count (``docs/protocol.md``, UNSUBSCRIBE).
        Returns how many were recorded; 0 when not dispatching.

        Raises:
            FutureQError: the log refused (not leader any more, shutting down).

        See :func:`~futureq.broker.delivery_records.hold_and_record`.
        """
        return await delivery_records.hold_and_record(self)

    def resume(self) -> None:
        """Hand out deliveries again after :meth:`hold_and_record` (a transfer failed)."""
        self.held = False
        self.kick()

    # ------------------------------------------------------------ one pass

    def dispatch_once(self) -> float:
        """Do what is due now; return the next wake-up time (ms, or inf).

        See :func:`~futureq.broker.dispatch_pass.dispatch_once`.
        """
        return dispatch_pass.dispatch_once(self)

    # ------------------------------------------------------------ status

    def due_count(self, group_id: int, now_ms: int, limit: int = DUE_COUNT_SCAN_ITEMS) -> int:
        """Entries of a group due now and not in flight (memory, plus disk past the horizon).

        A group with no runtime (idle, or not loaded yet) is counted from disk. At most
        ``limit`` entries are read from disk, so one call stays short however large
        the backlog: a count of ``limit`` or more means "at least".
        """
        runtime = self.hub.groups.get(group_id)
        if runtime is None:
            if group_id not in self.hub.touched and self._wake_at.get(group_id, math.inf) > now_ms:
                # Idle and not due for a look: every entry is beyond its horizon.
                return 0
            start = commands.schedule_key(group_id, 0, 0)
            count = 0
        else:
            count = runtime.index.count_due(now_ms)
            due_bound, _ = unpack(runtime.loaded_until)
            if not runtime.loaded_until or due_bound > now_ms:
                return count
            start = commands.schedule_key(group_id, *unpack(runtime.loaded_until))
        stop = commands.schedule_key(group_id, now_ms + 1, 0)
        # A running PURGE's entries are gone, though its chunks have not removed them.
        purged = self.state.purged_below(group_id)
        for read, key in enumerate(self.state.store.scan_keys("schedule", start, stop), 1):
            if not purged or commands.parse_schedule_key(key)[2] >= purged:
                count += 1
            if read >= limit:
                break
        return count

    def oldest_due_ms(self, group_id: int, now_ms: int) -> int | None:
        """Due time of the group's earliest copy that is due and not in flight, or None
        when nothing is due (the in-memory horizon, else at most one key read from disk,
        under the same rule as :meth:`due_count`). Leader only: None elsewhere."""
        if not self.active:
            return None
        runtime = self.hub.groups.get(group_id)
        if runtime is None:
            if group_id not in self.hub.touched and self._wake_at.get(group_id, math.inf) > now_ms:
                return None
            start = commands.schedule_key(group_id, 0, 0)
        else:
            next_due = runtime.index.next_due_ms()
            if next_due is not None:
                return next_due if next_due <= now_ms else None
            due_bound, _ = unpack(runtime.loaded_until)
            if not runtime.loaded_until or due_bound > now_ms:
                return None
            start = commands.schedule_key(group_id, *unpack(runtime.loaded_until))
        stop = commands.schedule_key(group_id, now_ms + 1, 0)
        purged = self.state.purged_below(group_id)  # gone (see due_count)
        for read, key in enumerate(self.state.store.scan_keys("schedule", start, stop), 1):
            _, due_ms, mid = commands.parse_schedule_key(key)
            if mid >= purged:
                return due_ms
            if read >= DUE_COUNT_SCAN_ITEMS:
                break
        return None


__all__ = ["Consumer", "Dispatcher"]
