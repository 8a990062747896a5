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

Source: ``DESIGN.md``, "Message semantics" (nothing early, nothing expired, fan-out
across groups, round-robin within a group, credit-based flow control).
"""

from __future__ import annotations

import heapq
import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from futureq.errors import ErrorCode, FutureQError
from futureq.state import commands
from futureq.state.commands import CommandKind
from futureq.state.due_index import pack, unpack
from futureq.state.records import PARKED_DUE_MS
from futureq.wire import frames

from .due_counts import DueCounts
from .hub import Consumer, GroupRuntime, Hub, InFlight

if TYPE_CHECKING:
    from futureq.clock import Clock
    from futureq.config import QueueSection
    from futureq.metrics import Metrics
    from futureq.state.queue_state import QueueState

    from .command_log import CommandLog

log = logging.getLogger(__name__)

_MAX_MID = (1 << 64) - 1
REFILL_CHUNK_ITEMS = 10_000
"""Most schedule entries read from disk in one refill step (keeps the loop responsive)."""
EXPIRE_BATCH_ITEMS = 1000
GROUPS_PER_PASS = 64
PASS_BUDGET_S = 0.005
"""A pass stops looking at more groups once it has taken this long (s)."""
DUE_COUNT_SCAN_ITEMS = 10_000
"""Most schedule entries read from disk to count one group's due backlog (a status or a
scrape stays short); a count that reaches it means "at least"."""
"""Most groups looked at in one dispatch pass; the rest wait for the next (a yield)."""
DELIVERIES_PER_PASS = 8192
"""Most deliveries pushed in one dispatch pass, so one pass holds the loop briefly."""
_REASON_COUNTERS: dict[CommandKind, str] = {
    CommandKind.ACK: "acked_messages_total",
    CommandKind.NACK: "nacked_messages_total",
    CommandKind.EXPIRE: "expired_messages_total",
    CommandKind.DEAD_LETTER: "dead_lettered_messages_total",
}
_CANCELLING: Final = frozenset({CommandKind.CANCEL, CommandKind.PURGE_GROUP})
"""Removals a consumer holding the delivery is told are cancellations (REVOKE reason
CANCELLED, then DELIVERY_CANCELLED for its ACK)."""

PROPOSE_RETRY_MS = 200
"""Wait before retrying an EXPIRE or DEAD_LETTER the log refused (ms)."""
NOT_ALLOWED_RETRY_MS = 50
"""While dispatching is not allowed (no lease yet, clock out of bound), look again after
this long (ms)."""
MAX_DELIVERED_ENTRIES = 8192
"""Most deliveries one DELIVERED command records (the rest go in the next one)."""
MAX_RECORDS_IN_FLIGHT = 4
"""DELIVERED commands being committed at once."""
PURGE_CHUNK_ENTRIES = 250
"""Schedule entries of a deleted group one PURGE_GROUP removes: about 2 ms of apply on
this kind of machine (RocksDB, 100-byte payloads), so a follower applying a slice of
several still answers heartbeats in time."""


@attrs.define(eq=False)
class Staged:
    """Deliveries of one pass for one consumer, waiting for their DELIVERED to commit.

    Attributes:
        consumer: Who gets them.
        flights: The deliveries (tracked in the hub, not pushed yet).
        deliveries: Their DELIVER items ``[tag, id, payload, due_ms, publish_ms, attempt]``.
    """

    consumer: Consumer
    flights: list[InFlight]
    deliveries: list[list[Any]]


class Dispatcher:
    """Leader-local dispatch of due messages; the state machine's schedule observer.

    Args:
        state: The replicated state (read only here; changes go through ``log``).
        log: Where expiry and dead-letter commands are proposed.
        hub: Consumers and in-flight deliveries.
        clock: Wall clock for due times; the only clock this module reads.
        queue: Horizon size, batch sizes.
        metrics: Counters and the lateness histogram, or None.
        max_deliver_bytes: Payload bytes after which a DELIVER frame is closed (the
            rest goes in the next frame), so frames stay under the client's limit.
        active: Dispatch from the start (a single node); a Raft node starts inactive
            and is activated when it becomes leader.
        dispatch_allowed: Asked before every pass; while it says no, nothing is handed
            out, released or expired (a Raft leader without its lease or with a clock
            out of bound: ``RaftNode.can_dispatch``). None: always allowed.
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
    ) -> None:
        self.state = state
        self.dispatch_allowed = dispatch_allowed
        self.max_deliver_bytes = max_deliver_bytes
        self.log = log
        self.hub = hub
        self.clock = clock
        self.horizon_ms = queue.horizon_ms
        self.horizon_max_items = queue.horizon_max_items
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
        RESCHEDULE moved its entry, until the entry's new place is notified (:meth:`_carry`)."""
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

        O(log n): an entry beyond the group's loaded horizon stays on disk and only
        moves the group's next look (so it is loaded before it falls due). On every
        node it lowers the group's seek hint (:meth:`next_due_ms`) if it lies below.
        """
        if self._histograms:  # BROWSE_COUNTS histograms (none: no cost but this test)
            self.due_counts.on_scheduled(group_id, due_ms, mid)
        hint = self._seek_hints.get(group_id)
        if hint is not None:
            packed = pack(due_ms, mid)
            if packed < hint:
                self._seek_hints[group_id] = packed
        if not self.active:
            return
        if self._carried:
            attempt = self._carry(group_id, due_ms, mid, attempt)
        runtime = self.hub.groups.get(group_id)
        if runtime is None:
            # No runtime: the group is idle or not loaded yet; the load finds the entry.
            self._wake_group_at(group_id, due_ms - self.horizon_ms)
            return
        at = self._index_loaded(runtime, group_id, due_ms, mid, expire_ms, attempt, released)
        self._wake_group_at(group_id, at)

    def on_scheduled_batch(self, entries: Sequence[tuple[Any, ...]]) -> None:
        """Schedule entries were committed (``ScheduleObserver.on_scheduled_batch``).

        Leaves the dispatcher as :meth:`on_scheduled` for each entry in turn would, with
        at most two wake-ups per group: waking a group at several later times in a row
        is waking it at the earliest of them, and a group due in the pass under way is
        looked at again however often it is asked for.
        """
        if self._histograms:
            self.due_counts.on_scheduled_batch(entries)
        hints = self._seek_hints
        if hints:
            for entry in entries:
                group_id = entry[1]
                hint = hints.get(group_id)
                if hint is not None:
                    packed = pack(entry[2], entry[3])
                    if packed < hint:
                        hints[group_id] = packed
        if not self.active:
            return
        groups = self.hub.groups
        horizon_ms = self.horizon_ms
        pass_now_ms = self._pass_now_ms
        wake: dict[int, float] = {}
        """Group -> the earliest wake-up asked for after the pass under way."""
        now: dict[int, float] = {}
        """Group -> a wake-up asked for within the pass under way (look again now)."""
        carried = self._carried
        for entry in entries:
            group_id = entry[1]
            runtime = groups.get(group_id)
            attempt = entry[5]
            if carried:
                attempt = self._carry(group_id, entry[2], entry[3], attempt)
            if runtime is None:
                at: float = entry[2] - horizon_ms
            else:
                at = self._index_loaded(
                    runtime,
                    group_id,
                    entry[2],
                    entry[3],
                    entry[4],
                    attempt,
                    entry[6] if len(entry) > 6 else 0,
                )
            if at <= pass_now_ms:
                now[group_id] = at
            elif at < wake.get(group_id, math.inf):
                wake[group_id] = at
        for group_id, at in now.items():
            self._wake_group_at(group_id, at)
        for group_id, at in wake.items():
            self._wake_group_at(group_id, at)

    def _carry(self, group_id: int, due_ms: int, mid: int, attempt: int) -> int:
        """The attempt to index for an entry just scheduled: at least that of a delivery
        of it this leader knew was out when a RESCHEDULE moved it.

        The RESCHEDULE command normally carries that attempt already
        (:meth:`out_deliveries`); this covers a first delivery pushed while the command
        was being committed. The attempt is then unknown to the log, so a DELIVERED
        recording it is proposed as well (best effort: until it commits, this leader's
        index keeps the count, as for a first delivery out).
        """
        carried = self._carried.pop((group_id, mid), 0)
        if carried <= attempt:
            return attempt
        key = commands.schedule_key(group_id, due_ms, mid)
        self._submit(commands.delivered([(key, carried)], self.clock.wall_ms()), [])
        return carried

    def _index_loaded(
        self,
        runtime: GroupRuntime,
        group_id: int,
        due_ms: int,
        mid: int,
        expire_ms: int | None,
        attempt: int,
        released: int,
    ) -> float:
        """Index a committed entry of a group with a runtime, if inside its horizon;
        return when the group must be looked at for it (ms; inf: no need)."""
        packed = pack(due_ms, mid)
        if packed >= runtime.loaded_until:
            return due_ms - self.horizon_ms // 2
        if packed in runtime.index or commands.schedule_key(group_id, due_ms, mid) in (
            self.hub.in_flight
        ):
            return math.inf  # a refill read it from disk before this notification came
        if released:
            runtime.released[mid] = released
        runtime.index.add(due_ms, mid, expire_ms, attempt)
        if len(runtime.index) > self.horizon_max_items:
            last_due, last_mid = runtime.index.pop_last()
            runtime.loaded_until = pack(last_due, last_mid)
        wake = due_ms if runtime.consumers else math.inf
        if expire_ms is not None:
            wake = min(wake, expire_ms)
        return wake

    def next_due_ms(self, group_id: int) -> int | None:
        """When the group's earliest deliverable entry falls due (ms), or None (parked
        dead letters do not count); any node, from disk.

        The seek starts at the group's seek hint: a packed ``(due_ms, id)`` no live
        entry of the group lies below (the first entry the previous call found; every
        entry scheduled since lowers it, :meth:`on_scheduled`; a snapshot clears it).
        So a status polled while a PURGE or many CANCELs delete from the start of the
        group's due order does not step over their tombstones again each time (it did:
        a quarter of the event loop during a purge of 100,000, py-spy). O(log n) plus
        what was deleted since the previous call.
        """
        hint = self._seek_hints.get(group_id)
        start = (
            group_id.to_bytes(4, "big")
            if hint is None
            else commands.schedule_key(group_id, *unpack(hint))
        )
        stop = commands.schedule_key(group_id, PARKED_DUE_MS, 0)
        for key in self.state.store.scan_keys("schedule", start, stop):
            _, due_ms, mid = commands.parse_schedule_key(key)
            self._seek_hints[group_id] = pack(due_ms, mid)
            return due_ms
        self._seek_hints[group_id] = pack(PARKED_DUE_MS, 0)
        return None

    def out_deliveries(
        self, group_ids: Sequence[int], ids: Sequence[int]
    ) -> list[tuple[bytes, int]]:
        """Deliveries of messages ``ids`` in groups ``group_ids`` that this leader knows
        went out and the log may not have recorded: ``(schedule key, attempt)`` each.

        A first delivery is pushed unrecorded (module docstring), and one whose
        visibility timeout ran out goes back to the index with its attempt, still
        unrecorded. A CANCEL or RESCHEDULE carries these in its command (``out``), so
        apply neither forgets such a delivery nor calls its message never delivered.
        Leader-local reads only: a group with no runtime here has nothing out or
        indexed (no read at all); one with deliveries out costs an O(log n) lookup of
        each id's entry.
        """
        found: list[tuple[bytes, int]] = []
        if not self.active:
            return found
        in_flight = self.hub.in_flight
        for gid in group_ids:
            runtime = self.hub.groups.get(gid)
            if runtime is None:
                continue
            for mid in ids:
                indexed = runtime.index.attempted(mid)
                if indexed is not None:
                    found.append((commands.schedule_key(gid, indexed[0], mid), indexed[1]))
                    continue
                if not runtime.in_flight_count:
                    continue
                key = self.state.entry_key(mid, gid)
                flight = None if key is None else in_flight.get(key)
                if flight is not None:
                    attempt = flight.counted_attempt
                    if attempt:
                        found.append((flight.key, attempt))
        return found

    def on_unscheduled(self, group_id: int, due_ms: int, mid: int, reason: CommandKind) -> None:
        """A schedule entry was removed: forget it in the index and in flight.

        An entry a RESCHEDULE moved keeps, in this leader's index, the attempt of a
        delivery of it that was out or timed out (:meth:`_carry`)."""
        if self._histograms:
            self.due_counts.on_unscheduled(group_id, due_ms, mid, reason)
        runtime = self.hub.groups.get(group_id)
        if runtime is None:
            if self.metrics is not None and self.active:
                name = _REASON_COUNTERS.get(reason)
                info = self.state.groups.get(group_id)
                if name is not None and info is not None:
                    self._count(name, info.topic, info.name)
            return
        indexed = runtime.index.attempted(mid) if reason == CommandKind.RESCHEDULE else None
        runtime.index.discard(due_ms, mid)
        runtime.released.pop(mid, None)
        key = commands.schedule_key(group_id, due_ms, mid)
        flight = self.hub.forget(key, cancelled=reason in _CANCELLING)
        if reason == CommandKind.RESCHEDULE:
            attempt = 0 if indexed is None else indexed[1]
            if flight is not None:
                attempt = max(attempt, flight.counted_attempt)
            if attempt:
                self._carried[(group_id, mid)] = attempt
        if self.metrics is not None:
            name = _REASON_COUNTERS.get(reason)
            if name is not None:
                self._counter(runtime, name).inc()

    def _count(self, name: str, topic: str, group: str, amount: int = 1) -> None:
        metrics = self.metrics
        assert metrics is not None
        getattr(metrics, name).labels(*metrics.group_labels(topic, group)).inc(amount)

    def _counter(self, runtime: GroupRuntime, name: str) -> Any:
        """The (topic, group) child of a per-group counter, cached: labels() is slow.

        Groups past the series budget share the ``_other`` child.
        """
        key = (name, runtime.info.name)
        child = runtime.counters.get(key)
        if child is None:
            metrics = self.metrics
            assert metrics is not None
            labels = metrics.group_labels(runtime.info.topic, runtime.info.name)
            child = getattr(metrics, name).labels(*labels)
            runtime.counters[key] = child
        return child

    def _topic_lateness(self, runtime: GroupRuntime) -> Any:
        """The topic's child of ``futureq_topic_lateness_seconds``, cached like counters."""
        key = ("topic_lateness_seconds", "")
        child = runtime.counters.get(key)
        if child is None:
            assert self.metrics is not None
            # Bounded series: past metrics.max_topic_series topics, "_other".
            label = self.metrics.topic_label(runtime.info.topic)
            child = self.metrics.topic_lateness_seconds.labels(label)
            runtime.counters[key] = child
        return child

    def on_group_changed(self, group_id: int) -> None:
        """One group was created, adopted, updated or deleted: O(1) whatever the count.

        A new group needs no look of its own: it has no consumer yet, and every entry
        it holds was scheduled by the same command (:meth:`on_scheduled` takes care of
        those). A changed group's runtime, if it has one, takes the new settings.
        """
        state = self.state
        if group_id not in state.groups:
            self._seek_hints.pop(group_id, None)
        self.due_counts.on_group_changed(group_id)
        if group_id in state.deleting or group_id in state.purging or group_id in state.backfilling:
            self._deleting_changed.set()  # the reaper has entries to purge or copy
        if not self.active:
            return
        info = self.state.groups.get(group_id)
        runtime = self.hub.groups.get(group_id)
        if info is None:
            if runtime is not None and self.metrics is not None:
                self.metrics.forget_group(runtime.info.topic, runtime.info.name)
            reason = None
            if runtime is not None:
                reason = (
                    ErrorCode.GROUP_DELETED,
                    f"consumer group {runtime.info.name!r} of topic {runtime.info.topic!r} was "
                    "deleted; its deliveries are void (subscribe again to create a new one)",
                )
            self.hub.drop_group(group_id, reason)
            self._wake_at.pop(group_id, None)
            return
        if runtime is not None:
            runtime.info = info
            for consumer in runtime.consumers:
                self.hub.send_settings(consumer, info)  # SUBSCRIPTION_INFO, if they changed
            self.hub.touched.add(group_id)  # settings changed: look again
            self.kick()

    def on_groups_changed(self) -> None:
        """Every group may have changed (a snapshot was installed): start afresh."""
        self._seek_hints.clear()
        self.due_counts.on_groups_changed()
        if self.active:
            self.activate()
        if self.state.deleting:
            self._deleting_changed.set()

    def activate(self) -> None:
        """Start dispatching (this node became leader and applied everything committed).

        Every group's horizon is loaded afresh from disk: what the previous leader had
        in flight and did not see acked is due again (the at-least-once window). Groups
        are loaded a bounded number per pass (:data:`GROUPS_PER_PASS`), never all at once.
        """
        self.active = True
        self.hub.clear()
        self._carried.clear()
        self.hub.group_info = self.state.groups.get
        self._parked.clear()
        self._staged.clear()
        self._wake_at.clear()
        self._timers.clear()
        self._deleting_changed.set()
        # Only groups holding entries have anything to load; the others wait for a
        # consumer or an entry (either touches them).
        self.hub.touched.update(gid for gid, info in self.state.groups.items() if info.pending)
        self.kick()

    def deactivate(self) -> None:
        """Stop dispatching (leadership lost): forget in-flight state and consumers."""
        self.active = False
        self.hub.clear()
        self._carried.clear()
        self._parked.clear()
        self._staged.clear()
        self._wake_at.clear()
        self._timers.clear()
        self.kick()

    def _wake_group_at(self, group_id: int, at_ms: float) -> None:
        """Make sure the group is looked at no later than ``at_ms`` (O(log n))."""
        if at_ms == math.inf:
            return
        if at_ms <= self._pass_now_ms:
            self.hub.touched.add(group_id)
            self.kick()
            return
        current = self._wake_at.get(group_id, math.inf)
        if at_ms < current:
            self._wake_at[group_id] = at_ms
            heapq.heappush(self._timers, (at_ms, group_id))
            if at_ms < self._next_wake_ms:
                self.kick()

    # ------------------------------------------------------------ control

    def kick(self) -> None:
        """Wake the dispatch loop now (new credit, new consumer, earlier due time)."""
        self._wake.set()

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
            nursery.start_soon(self._proposer)
            nursery.start_soon(self._recorder)
            nursery.start_soon(self._reaper)
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
        """
        batches: list[Staged] = []
        entries: list[tuple[bytes, int]] = []
        while self._staged and len(entries) < MAX_DELIVERED_ENTRIES:
            batch = self._staged.popleft()
            batches.append(batch)
            entries.extend(
                (flight.key, flight.attempt)
                for flight in batch.flights
                if self.hub.is_current(flight)
            )
        if self._staged:
            self._staged_changed.set()
        # The stamp becomes the entries' last delivery time (a dead letter's provenance).
        command = commands.delivered(entries, self.clock.wall_ms()) if entries else None
        return command, batches

    def push_staged(self, batches: list[Staged], *, pass_now_ms: int | None = None) -> int:
        """Push deliveries whose DELIVERED committed, or first deliveries straight from a
        pass (``pass_now_ms``: the pass's time, so what the pass found unexpired is not
        expired here, and the pass computes its own next wake-up); return how many went
        out.

        A delivery removed meanwhile (acked elsewhere, expired, its group deleted) is
        left out and its credit returned; one whose TTL ran out while its record
        committed goes back to the index, where the next pass expires it (nothing is
        ever delivered after its expiry); a consumer that left gets nothing and its
        deliveries go back to the group with their previous attempt count.

        Recorded deliveries are pushed only while dispatching is allowed *now*
        (``dispatch_allowed``: the leader lease): their record may have committed
        long after they were staged, for instance when a leader paused with SIGSTOP
        resumes and the answers queued for it commit the record, after another leader
        took over and delivered the same entries with a higher attempt. Refused, they
        go back unpushed with their old attempt. The time stamped on the frame is read
        before the question, so every push carries a time at which this node held the
        lease (a pause after the question only delays the frame, like the network).
        A pass's first deliveries need no question here: :meth:`dispatch_once` asks
        after reading the pass's time and pushes without yielding.
        """
        if pass_now_ms is None:
            now_ms = self.clock.wall_ms()
            allowed = self.dispatch_allowed
            if not self.active or (allowed is not None and not allowed()):
                self.drop_staged(batches)
                return 0
        else:
            now_ms = pass_now_ms
        pushed = 0
        for batch in batches:
            consumer = batch.consumer
            flights: list[InFlight] = []
            deliveries: list[list[Any]] = []
            for flight, delivery in zip(batch.flights, batch.deliveries, strict=True):
                if not self.hub.is_current(flight):
                    if not consumer.closed:
                        consumer.credit += 1  # never went out: its credit is the consumer's
                        self.hub.wake(consumer)
                    continue
                if flight.expire_ms is not None and flight.expire_ms <= now_ms:
                    self.hub.give_back(flight)  # unpushed: credit back, expired next pass
                    self.kick()
                    continue
                flights.append(flight)
                deliveries.append(delivery)
            if not flights:
                continue
            runtime = self.hub.groups.get(flights[0].group_id)
            sent = runtime is not None and consumer.send(
                frames.Deliver(0, consumer.subscription_id, now_ms, deliveries)
            )
            if not sent:
                for flight in flights:
                    self.hub.give_back(flight)
                continue
            assert runtime is not None
            visibility_ms = runtime.info.visibility_timeout_ms
            for flight in flights:
                self.hub.mark_pushed(flight, now_ms + visibility_ms, now_ms)
            pushed += len(flights)
            self._count_pushed(runtime, flights, now_ms)
        # mark_pushed told the loop of each new deadline earlier than its wake-up.
        return pushed

    def drop_staged(self, batches: list[Staged]) -> None:
        """Their DELIVERED could not be committed (or they may not be pushed now): give
        the deliveries back unpushed. One removed meanwhile returns its credit, as in
        :meth:`push_staged` (it never went out)."""
        for batch in batches:
            consumer = batch.consumer
            for flight in batch.flights:
                if self.hub.is_current(flight):
                    self.hub.give_back(flight)
                elif not consumer.closed:
                    consumer.credit += 1
                    self.hub.wake(consumer)
        self.kick()

    def _count_pushed(self, runtime: GroupRuntime, flights: list[InFlight], now_ms: int) -> None:
        metrics = self.metrics
        if metrics is None:
            return
        self._counter(runtime, "delivered_messages_total").inc(len(flights))
        redelivered = sum(1 for f in flights if f.attempt > 1)
        if redelivered:
            self._counter(runtime, "redelivered_messages_total").inc(redelivered)
        topic_lateness = self._topic_lateness(runtime)
        for flight in flights:
            lateness_s = max(0, now_ms - flight.due_ms) / 1000
            metrics.due_to_delivery_seconds.observe(lateness_s)
            topic_lateness.observe(lateness_s)

    async def _recorder(self) -> None:
        """Commit DELIVERED records, then push what they cover.

        Up to :data:`MAX_RECORDS_IN_FLIGHT` commits at a time; what is staged while
        they are all busy goes into the next one (group commit), so a busy dispatcher
        makes few, large records and an idle one waits about one commit.
        """
        slots = trio.Semaphore(MAX_RECORDS_IN_FLIGHT)
        async with trio.open_nursery() as nursery:
            while True:
                if not self._staged:
                    self._staged_changed = trio.Event()
                    await self._staged_changed.wait()
                    continue
                await slots.acquire()
                command, batches = self.take_staged()
                if command is None:
                    self.push_staged(batches)
                    slots.release()
                    continue
                nursery.start_soon(self._record, command, batches, slots)

    async def _record(self, command: bytes, batches: list[Staged], slots: trio.Semaphore) -> None:
        try:
            try:
                await self.log.propose(command)
            except FutureQError as exc:
                log.warning("could not record deliveries (they go back to their groups): %s", exc)
                self.drop_staged(batches)
                await trio.sleep(PROPOSE_RETRY_MS / 1000)
                return
            self.push_staged(batches)
        finally:
            slots.release()

    async def _reaper(self) -> None:
        """Remove the schedule entries of deleted and purged groups, and fill groups
        created from the backlog, one bounded chunk per command.

        Each PURGE_GROUP applies in a few milliseconds, so the loop, heartbeats and
        other commands go on between chunks (``DESIGN.md``, "no request holds the
        event loop").
        """
        while True:
            command = self._background_chunk() if self.active else None
            if command is None:
                self._deleting_changed = trio.Event()
                await self._deleting_changed.wait()
                continue
            try:
                await self.log.propose(command)
            except FutureQError as exc:
                log.warning("could not run a purge or backfill chunk (retrying): %s", exc)
                await trio.sleep(PROPOSE_RETRY_MS / 1000)

    def _background_chunk(self) -> bytes | None:
        """The next bounded chunk of background work, or None: purge a deleted group,
        then a purged group (PURGE), then fill a group created from the backlog."""
        state = self.state
        if state.deleting:
            return commands.purge_group(min(state.deleting), PURGE_CHUNK_ENTRIES)
        if state.purging:
            return commands.purge_group(min(state.purging), PURGE_CHUNK_ENTRIES)
        if state.backfilling:
            return commands.backfill_group(min(state.backfilling), PURGE_CHUNK_ENTRIES)
        return None

    # ------------------------------------------------------------ proposals

    async def _proposer(self) -> None:
        async with self._proposals_receive:
            async for command, restore in self._proposals_receive:
                try:
                    await self.log.propose(command)
                except FutureQError as exc:
                    log.warning("could not commit a dispatcher command (retrying): %s", exc)
                    self._park(restore)
                finally:
                    if self._proposals_receive.statistics().current_buffer_used == 0:
                        self._proposals_idle.set()

    def _submit(self, command: bytes, restore: list[Any]) -> None:
        if self.clock.wall_ms() < self._retry_after_ms:
            self._park(restore)
            return
        try:
            self._proposals_send.send_nowait((command, restore))
        except trio.WouldBlock:
            self._park(restore)  # the log is backed up
            return
        self._note_queued()

    def _park(self, restore: list[Any]) -> None:
        """Hold entries whose EXPIRE/DEAD_LETTER could not be committed, and retry later.

        They stay out of the index meanwhile, so they are never delivered (they are
        expired or out of attempts) and the loop does not spin on them.
        """
        self._parked.extend(restore)
        self._retry_after_ms = self.clock.wall_ms() + PROPOSE_RETRY_MS
        self.kick()

    def _unpark(self, now_ms: int) -> float:
        """Put parked entries back once the retry delay passed; return when to look again."""
        if not self._parked:
            return math.inf
        if now_ms < self._retry_after_ms:
            return float(self._retry_after_ms)
        parked, self._parked = self._parked, []
        for owner, due_ms, mid, expire_ms, attempt in parked:
            current = self.hub.groups.get(owner.info.group_id)
            if current is not None and current is owner:
                current.index.add(due_ms, mid, expire_ms, attempt)
                self.hub.touched.add(owner.info.group_id)
        return math.inf

    def _record_returned(self, now_ms: int) -> None:
        """Propose a RETURN_COUNTED of first deliveries given back (their consumer left,
        their visibility timeout passed): they count, and until this commits only this
        leader's index knows it. Left for the next pass while the log is backed up."""
        if now_ms < self._retry_after_ms:
            return
        entries = self.hub.take_returned(MAX_DELIVERED_ENTRIES)
        try:
            self._proposals_send.send_nowait((commands.return_counted(entries), []))
        except trio.WouldBlock:
            for key, attempt, pushed_ms in entries:
                self.hub.returned.setdefault(key, (attempt, pushed_ms))
            return
        self._note_queued()
        if self.hub.returned:
            self.kick()  # more than one command's worth: the rest on the next pass

    async def hold_and_record(self) -> int:
        """Stop handing out deliveries (until :meth:`resume`), then commit the attempts
        of every first delivery that went out and is not in the log (given back, or
        still out): before a leader shuts down or hands leadership over, so the node
        that delivers next continues their count (``docs/protocol.md``, UNSUBSCRIBE).
        Returns how many were recorded; 0 when not dispatching.

        Raises:
            FutureQError: the log refused (not leader any more, shutting down).
        """
        self.held = True
        # A RETURN_COUNTED a pass queued must commit before the log stops taking
        # proposals (a connection closed just before the shutdown: its attempt was lost).
        await self._proposals_idle.wait()
        recorded = 0
        while self.active:
            entries = self.hub.take_unrecorded(MAX_DELIVERED_ENTRIES)
            if not entries:
                break
            await self.log.propose(commands.return_counted(entries))
            recorded += len(entries)
        return recorded

    def _note_queued(self) -> None:
        """A command went to the proposer: it is busy until the queue is empty again."""
        if self._proposals_idle.is_set():
            self._proposals_idle = trio.Event()

    def resume(self) -> None:
        """Hand out deliveries again after :meth:`hold_and_record` (a transfer failed)."""
        self.held = False
        self.kick()

    # ------------------------------------------------------------ one pass

    def dispatch_once(self) -> float:
        """Do what is due now; return the next wake-up time (ms, or inf).

        Only groups with something to do are looked at: those touched since the last
        pass (new consumer, credit, a release) and those whose own wake-up time came.
        At most :data:`GROUPS_PER_PASS` groups and about :data:`DELIVERIES_PER_PASS`
        deliveries per pass; when more is left the answer is "now" (after a yield).
        Idle groups cost nothing here, however many exist.
        """
        if not self.active:
            return math.inf
        # The pass's time first, then the lease: a pause between the two fails the
        # question, and everything the pass pushes (without yielding) carries a time
        # at which the lease held (see push_staged).
        now_ms = self.clock.wall_ms()
        if self.held or (self.dispatch_allowed is not None and not self.dispatch_allowed()):
            return float(now_ms + NOT_ALLOWED_RETRY_MS)
        self._in_pass = True
        try:
            return self._pass(now_ms)
        finally:
            self._in_pass = False

    def _pass(self, now_ms: int) -> float:
        """The body of :meth:`dispatch_once`, at ``now_ms``, dispatching allowed."""
        self._pass_now_ms = now_ms
        hub = self.hub
        hub.expire_visibility(now_ms)
        if hub.returned:
            self._record_returned(now_ms)
        next_ms: float = self._unpark(now_ms)
        timers = self._timers
        wake_at = self._wake_at
        touched = hub.touched
        while timers and timers[0][0] <= now_ms:
            at_ms, gid = heapq.heappop(timers)
            if wake_at.get(gid) == at_ms:
                del wake_at[gid]
                touched.add(gid)
        expired: list[bytes] = []
        expired_restore: list[Any] = []
        dead: list[tuple[bytes, int]] = []
        dead_restore: list[Any] = []
        budget = [DELIVERIES_PER_PASS]
        stop_s = self.clock.monotonic_s() + PASS_BUDGET_S
        for looked in range(min(len(touched), GROUPS_PER_PASS)):
            if looked and self.clock.monotonic_s() >= stop_s:
                break  # a slow disk read or a full batch: the rest after a yield
            gid = touched.pop()
            runtime = hub.runtime(gid)
            if runtime is None:
                wake_at.pop(gid, None)
                continue
            group_next = self._dispatch_group(
                runtime, now_ms, expired, expired_restore, dead, dead_restore, budget
            )
            if group_next <= now_ms:
                touched.add(gid)  # more right away (a full batch, a refill step)
            else:
                if gid in wake_at and wake_at[gid] <= group_next:
                    pass  # an earlier wake-up is already set
                elif group_next < math.inf:
                    wake_at[gid] = group_next
                    heapq.heappush(timers, (group_next, gid))
                if runtime.is_idle() and gid not in touched and not self._parked:
                    del hub.groups[gid]  # rebuilt from disk when it has work again
            if budget[0] <= 0:
                break
        if expired:
            groups = self.state.groups
            if any(
                (info := groups.get(commands.parse_schedule_key(key)[0])) is not None
                and info.dead_letter_expired
                for key in expired
            ):
                # The stamp and settings serve groups that dead-letter what expires;
                # ``out``: attempts of deliveries that went out unrecorded (a first
                # delivery that timed out), which only this leader's index knows.
                out = [
                    (key, restore[4])
                    for key, restore in zip(expired, expired_restore, strict=True)
                    if restore[4]
                ]
                command = commands.expire(expired, now_ms, self.group_settings, out)
            else:
                command = commands.expire(expired)
            self._submit(command, expired_restore)
        if dead:
            self._submit(commands.dead_letter(now_ms, dead, self.group_settings), dead_restore)
        if touched:
            return now_ms
        while timers and wake_at.get(timers[0][1]) != timers[0][0]:
            heapq.heappop(timers)  # stale
        if timers:
            next_ms = min(next_ms, timers[0][0])
        deadline = hub.next_deadline_ms()
        if deadline is not None:
            next_ms = min(next_ms, deadline)
        if next_ms <= now_ms:
            next_ms = now_ms
        return next_ms

    def _dispatch_group(
        self,
        runtime: GroupRuntime,
        now_ms: int,
        expired: list[bytes],
        expired_restore: list[Any],
        dead: list[tuple[bytes, int]],
        dead_restore: list[Any],
        budget: list[int],
    ) -> float:
        """One group's share of a pass; returns when the group next needs a look (ms)."""
        next_ms = self._refill(runtime, now_ms)
        gid = runtime.info.group_id
        for due_ms, mid, expire_ms, attempt in runtime.index.pop_expired(
            now_ms, EXPIRE_BATCH_ITEMS
        ):
            expired.append(commands.schedule_key(gid, due_ms, mid))
            expired_restore.append((runtime, due_ms, mid, expire_ms, attempt))
        taken = self._deliver(
            runtime, now_ms, expired, expired_restore, dead, dead_restore, budget[0]
        )
        budget[0] -= taken
        if taken or expired_restore:
            # The index shrank: it may need more from disk (cheap when it does not).
            next_ms = min(next_ms, self._refill(runtime, now_ms))
        next_expire = runtime.index.next_expire_ms()
        if next_expire is not None:
            next_ms = min(next_ms, next_expire)
        if runtime.has_credit():
            next_due = runtime.index.next_due_ms()
            if next_due is not None:
                next_ms = min(next_ms, next_due)
        return next_ms

    def _refill(self, runtime: GroupRuntime, now_ms: int) -> float:
        """Load the group's next schedule entries from disk; return when to look again.

        The horizon is extended to ``now + horizon_ms`` once less than half a window
        of it is left. When the first entry left on disk is due later than that, the
        group is next read shortly before that entry enters the horizon; a group with
        nothing on disk beyond its horizon is not read again until a new entry is
        scheduled for it (:meth:`on_scheduled`). So an idle group is not read per pass,
        nor every half window.
        """
        half_window = self.horizon_ms // 2
        index = runtime.index
        half_full = max(1, (self.horizon_max_items + 1) // 2)
        if len(index) >= half_full:
            return math.inf  # deliveries shrink the index; a later pass refills
        due_bound, _ = unpack(runtime.loaded_until)
        if due_bound - half_window > now_ms:
            return float(due_bound - half_window)
        horizon_end = pack(now_ms + self.horizon_ms, 0)
        gid = runtime.info.group_id
        start_due, start_mid = unpack(runtime.loaded_until)
        limit = min(REFILL_CHUNK_ITEMS, self.horizon_max_items - len(index))
        count = 0
        last = runtime.loaded_until
        in_flight = self.hub.in_flight
        for due_ms, mid, attempt, expire_ms, released in self.state.scan_schedule_entries(
            gid, start_due, start_mid, limit
        ):
            packed = pack(due_ms, mid)
            if packed >= horizon_end:
                # The rest is beyond the horizon: look again before this one is due.
                runtime.loaded_until = horizon_end
                return float(max(now_ms + half_window, due_ms - half_window))
            count += 1
            last = packed
            if commands.schedule_key(gid, due_ms, mid) not in in_flight and packed not in index:
                if released:
                    runtime.released[mid] = released
                index.add(due_ms, mid, expire_ms, attempt)
        if count >= limit:
            runtime.loaded_until = last + 1
            return float(now_ms)  # a full chunk: read the next one on the next pass
        runtime.loaded_until = horizon_end
        return math.inf

    def _deliver(
        self,
        runtime: GroupRuntime,
        now_ms: int,
        expired: list[bytes],
        expired_restore: list[Any],
        dead: list[tuple[bytes, int]],
        dead_restore: list[Any],
        budget: int = DELIVERIES_PER_PASS,
    ) -> int:
        """Hand what is due to the group's consumers; returns how many were handed.

        First deliveries go out at once; redeliveries go to the recorder, which
        pushes them once their attempt is committed. Stops after about ``budget``
        deliveries (the rest waits for the next pass).
        """
        info = runtime.info
        gid = info.group_id
        index = runtime.index
        next_due = index.next_due_ms()
        delivered = 0
        if not runtime.consumers or next_due is None or next_due > now_ms:
            return delivered
        max_deliveries = info.max_deliveries
        released_counts = runtime.released
        salt = self.hub.tag_salt
        staged_any = False
        # Round-robin: each round gives every consumer with credit an equal share of
        # what is due (one DELIVER frame each), so a group's consumers split the work.
        # No more consumers than entries due: each gets at least one.
        consumers = runtime.consumers_with_credit(index.count_due(now_ms))
        while consumers and delivered < budget:
            due_now = index.count_due(now_ms)
            if due_now == 0:
                break
            share = max(1, min(self.batch_items, -(-due_now // len(consumers))))
            for consumer in consumers:
                entries = index.pop_due(now_ms, min(consumer.credit, share))
                if not entries:
                    break
                deliveries: list[list[Any]] = []
                flights: list[InFlight] = []
                frame_bytes = 0
                for position, (due_ms, mid, expire_ms, previous) in enumerate(entries):
                    if frame_bytes >= self.max_deliver_bytes:
                        # Keep DELIVER frames under the frame limit: the rest waits.
                        for due_later, mid_later, expire_later, attempt_later in entries[position:]:
                            index.add(due_later, mid_later, expire_later, attempt_later)
                        break
                    key = commands.schedule_key(gid, due_ms, mid)
                    if expire_ms is not None and expire_ms <= now_ms:
                        expired.append(key)
                        expired_restore.append((runtime, due_ms, mid, expire_ms, previous))
                        continue
                    attempt = previous + 1
                    released = released_counts.get(mid, 0)
                    if attempt - released > max_deliveries:
                        # Out of attempts: to the dead-letter topic, or parked when this
                        # is one (DEAD_LETTER applies both, replicated and deterministic).
                        dead.append((key, previous))
                        dead_restore.append((runtime, due_ms, mid, expire_ms, previous))
                        continue
                    message = self.state.get_message(mid)
                    if message is None:  # removed by a command applied meanwhile
                        continue
                    _topic, payload, publish_ms, _due, _open = message
                    frame_bytes += len(payload) + 64
                    item = [
                        commands.delivery_tag(key, attempt, salt),
                        mid,
                        payload,
                        due_ms,
                        publish_ms,
                        attempt,
                    ]
                    if consumer.headers:  # asked for in SUBSCRIBE (issue 14)
                        record = self.state.get_record(mid)
                        item.append(None if record is None else record.headers)
                        frame_bytes += 0 if record is None or not record.headers else 4096
                    deliveries.append(item)
                    flights.append(
                        InFlight(
                            key,
                            gid,
                            due_ms,
                            mid,
                            expire_ms,
                            attempt,
                            previous,
                            released,
                            consumer,
                            salt=salt,
                        )
                    )
                if not deliveries:
                    continue
                consumer.credit -= len(deliveries)
                delivered += len(deliveries)
                for flight in flights:
                    self.hub.track(flight)
                # First deliveries go out now; redeliveries once their attempt is
                # committed (see the module docstring for why, and what it costs).
                first = [i for i, flight in enumerate(flights) if flight.attempt == 1]
                if first:
                    now_batch = Staged(
                        consumer, [flights[i] for i in first], [deliveries[i] for i in first]
                    )
                    self.push_staged([now_batch], pass_now_ms=now_ms)
                if len(first) < len(flights):
                    later = [i for i, flight in enumerate(flights) if flight.attempt > 1]
                    self._staged.append(
                        Staged(
                            consumer, [flights[i] for i in later], [deliveries[i] for i in later]
                        )
                    )
                    staged_any = True
            consumers = [
                c for c in consumers if c.credit > 0 and not c.closed and c.outbox.has_room()
            ]
        if staged_any:
            self._staged_changed.set()
        return delivered

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
        for read, _ in enumerate(self.state.store.scan_keys("schedule", start, stop), 1):
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
        for key in self.state.store.scan_keys("schedule", start, stop):
            return commands.parse_schedule_key(key)[1]
        return None


__all__ = ["Consumer", "Dispatcher"]
