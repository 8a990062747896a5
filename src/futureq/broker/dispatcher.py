"""The dispatcher: sleeps until the next due time, then hands due messages to consumers.

Leader only. It keeps each group's :class:`~futureq.state.due_index.DueIndex` filled
with a horizon of the group's earliest schedule entries (a range scan of the
``schedule`` family as time moves on), pops what is due when a consumer has credit,
drops what expired, dead-letters what ran out of attempts, and takes back deliveries
whose visibility timeout ran out. It never polls: it waits on an event that is set
when something earlier than its next wake-up arrives, or until that wake-up.

Attempt counts are replicated state. A *redelivery* (attempt 2 and up: after a
visibility timeout, a consumer that left, a nack or a leader change) is handed to the
recorder task, which commits one DELIVERED command for everything handed to it
meanwhile and only then pushes the DELIVER frames; a new leader reads every such
attempt, so counts survive leader changes and restarts and never go backwards. A
*first* delivery goes out at once, unrecorded: its attempt (1) follows from the entry,
and the next delivery of it records 2. The one thing lost that way: if leadership
changes while a message's first delivery is out and before any redelivery of it, the
new leader delivers attempt 1 again (one delivery uncounted, at most once per leader
change). Why: recording every delivery before pushing it doubles the log entries of a
consumer that acks one message at a time and halved its throughput on this machine
(``docs/architecture.md``), while redeliveries are the rare case and the one that
needs counting (dead-lettering a poison message). A reaper task removes the schedule
entries of deleted groups in bounded PURGE_GROUP chunks.

Source: ``DESIGN.md``, "Message semantics" (nothing early, nothing expired, fan-out
across groups, round-robin within a group, credit-based flow control).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import attrs
import trio

from futureq.errors import ErrorCode, FutureQError
from futureq.state import commands
from futureq.state.commands import CommandKind
from futureq.state.due_index import pack, unpack
from futureq.wire import frames

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
_REASON_COUNTERS: dict[CommandKind, str] = {
    CommandKind.ACK: "acked_messages_total",
    CommandKind.NACK: "nacked_messages_total",
    CommandKind.EXPIRE: "expired_messages_total",
    CommandKind.DEAD_LETTER: "dead_lettered_messages_total",
}
PROPOSE_RETRY_MS = 200
"""Wait before retrying an EXPIRE or DEAD_LETTER the log refused (ms)."""
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
    ) -> None:
        self.state = state
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
        self._parked: list[Any] = []
        self._retry_after_ms = 0
        self._proposals_send, self._proposals_receive = trio.open_memory_channel[
            tuple[bytes, list[Any]]
        ](64)
        self._staged: list[Staged] = []
        self._staged_changed = trio.Event()
        self._deleting_changed = trio.Event()
        self.active = active
        if active:
            self._sync_groups()

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
        """A schedule entry was committed: index it if it falls inside the horizon."""
        runtime = self.hub.groups.get(group_id)
        if runtime is None or pack(due_ms, mid) >= runtime.loaded_until:
            return
        if released:
            runtime.released[mid] = released
        runtime.index.add(due_ms, mid, expire_ms, attempt)
        if len(runtime.index) > self.horizon_max_items:
            last_due, last_mid = runtime.index.pop_last()
            runtime.loaded_until = pack(last_due, last_mid)
        if due_ms < self._next_wake_ms or (
            expire_ms is not None and expire_ms < self._next_wake_ms
        ):
            self.kick()

    def on_unscheduled(self, group_id: int, due_ms: int, mid: int, reason: CommandKind) -> None:
        """A schedule entry was removed: forget it in the index and in flight."""
        runtime = self.hub.groups.get(group_id)
        if runtime is None:
            return
        runtime.index.discard(due_ms, mid)
        runtime.released.pop(mid, None)
        key = commands.schedule_key(group_id, due_ms, mid)
        self.hub.forget(key)
        if self.metrics is not None:
            name = _REASON_COUNTERS.get(reason)
            if name is not None:
                self._counter(runtime, name).inc()

    def _counter(self, runtime: GroupRuntime, name: str) -> Any:
        """The (topic, group) child of a per-group counter, cached: labels() is slow."""
        key = (name, runtime.info.name)
        child = runtime.counters.get(key)
        if child is None:
            child = getattr(self.metrics, name).labels(runtime.info.topic, runtime.info.name)
            runtime.counters[key] = child
        return child

    def on_groups_changed(self) -> None:
        """Groups were created, adopted, changed or deleted: match runtimes to them."""
        if self.active:
            self._sync_groups()
            self.kick()
        if self.state.deleting:
            self._deleting_changed.set()

    def activate(self) -> None:
        """Start dispatching (this node became leader and applied everything committed).

        Every group's horizon is loaded afresh from disk: what the previous leader had
        in flight and did not see acked is due again (the at-least-once window).
        """
        self.active = True
        self.hub.clear()
        self._parked.clear()
        self._staged.clear()
        self._sync_groups()
        self.kick()
        self._deleting_changed.set()

    def deactivate(self) -> None:
        """Stop dispatching (leadership lost): forget in-flight state and consumers."""
        self.active = False
        self.hub.clear()
        self._parked.clear()
        self._staged.clear()
        self.kick()

    def _sync_groups(self) -> None:
        groups = self.state.groups
        now_ms = self.clock.wall_ms()
        for gid in list(self.hub.groups):
            if gid not in groups:
                runtime = self.hub.groups[gid]
                info = runtime.info
                reason = (
                    ErrorCode.GROUP_DELETED,
                    f"consumer group {info.name!r} of topic {info.topic!r} was deleted; "
                    "its deliveries are void (subscribe again to recreate it)",
                )
                self.hub.forget_group(gid)
                for consumer in list(runtime.consumers):
                    self.hub.remove_consumer(consumer, now_ms, end=reason)
                del self.hub.groups[gid]
        for gid, info in groups.items():
            existing = self.hub.groups.get(gid)
            if existing is None:
                self.hub.groups[gid] = GroupRuntime(info)
            else:
                existing.info = info
                for consumer in existing.consumers:
                    self.hub.send_settings(consumer, info)

    # ------------------------------------------------------------ control

    def kick(self) -> None:
        """Wake the dispatch loop now (new credit, new consumer, earlier due time)."""
        self._wake.set()

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

    async def _proposer(self) -> None:
        async with self._proposals_receive:
            async for command, restore in self._proposals_receive:
                try:
                    await self.log.propose(command)
                except FutureQError as exc:
                    log.warning("could not commit a dispatcher command (retrying): %s", exc)
                    self._park(restore)

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
            batch = self._staged.pop(0)
            batches.append(batch)
            entries.extend(
                (flight.key, flight.attempt)
                for flight in batch.flights
                if self.hub.is_current(flight)
            )
        if self._staged:
            self._staged_changed.set()
        return (commands.delivered(entries) if entries else None), batches

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
        """
        now_ms = self.clock.wall_ms() if pass_now_ms is None else pass_now_ms
        pushed = 0
        for batch in batches:
            consumer = batch.consumer
            flights: list[InFlight] = []
            deliveries: list[list[Any]] = []
            for flight, delivery in zip(batch.flights, batch.deliveries, strict=True):
                if not self.hub.is_current(flight):
                    if not consumer.closed:
                        consumer.credit += 1  # never went out: its credit is the consumer's
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
                self.hub.mark_pushed(flight, now_ms + visibility_ms)
            pushed += len(flights)
            self._count_pushed(runtime, flights, now_ms)
        if pushed and pass_now_ms is None:
            self.kick()  # the next visibility deadline may be earlier than the wake-up
        return pushed

    def drop_staged(self, batches: list[Staged]) -> None:
        """Their DELIVERED could not be committed: give the deliveries back unpushed."""
        for batch in batches:
            for flight in batch.flights:
                if self.hub.is_current(flight):
                    self.hub.give_back(flight)
        self.kick()

    def _count_pushed(self, runtime: GroupRuntime, flights: list[InFlight], now_ms: int) -> None:
        metrics = self.metrics
        if metrics is None:
            return
        self._counter(runtime, "delivered_messages_total").inc(len(flights))
        redelivered = sum(1 for f in flights if f.attempt > 1)
        if redelivered:
            self._counter(runtime, "redelivered_messages_total").inc(redelivered)
        for flight in flights:
            metrics.due_to_delivery_seconds.observe(max(0, now_ms - flight.due_ms) / 1000)

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
        """Remove the schedule entries of deleted groups, one bounded chunk per command.

        Each PURGE_GROUP applies in a few milliseconds, so the loop, heartbeats and
        other commands go on between chunks (``DESIGN.md``, "no request holds the
        event loop").
        """
        while True:
            if not self.active or not self.state.deleting:
                self._deleting_changed = trio.Event()
                await self._deleting_changed.wait()
                continue
            gid = min(self.state.deleting)
            try:
                await self.log.propose(commands.purge_group(gid, PURGE_CHUNK_ENTRIES))
            except FutureQError as exc:
                log.warning("could not purge deleted group %d (retrying): %s", gid, exc)
                await trio.sleep(PROPOSE_RETRY_MS / 1000)

    # ------------------------------------------------------------ proposals

    def _submit(self, command: bytes, restore: list[Any]) -> None:
        if self.clock.wall_ms() < self._retry_after_ms:
            self._park(restore)
            return
        try:
            self._proposals_send.send_nowait((command, restore))
        except trio.WouldBlock:
            self._park(restore)  # the log is backed up

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
        return math.inf

    # ------------------------------------------------------------ one pass

    def dispatch_once(self) -> float:
        """Do everything that is due now; return the next wake-up time (ms, or inf)."""
        if not self.active:
            return math.inf
        now_ms = self.clock.wall_ms()
        self.hub.expire_visibility(now_ms)
        next_ms: float = self._unpark(now_ms)
        expired: list[bytes] = []
        expired_restore: list[Any] = []
        dead: list[tuple[bytes, int]] = []
        dead_restore: list[Any] = []
        for runtime in list(self.hub.groups.values()):
            refill_at = self._refill(runtime, now_ms)
            next_ms = min(next_ms, refill_at)
            gid = runtime.info.group_id
            for due_ms, mid, expire_ms, attempt in runtime.index.pop_expired(
                now_ms, EXPIRE_BATCH_ITEMS
            ):
                expired.append(commands.schedule_key(gid, due_ms, mid))
                expired_restore.append((runtime, due_ms, mid, expire_ms, attempt))
            self._deliver(runtime, now_ms, expired, expired_restore, dead, dead_restore)
            next_expire = runtime.index.next_expire_ms()
            if next_expire is not None:
                next_ms = min(next_ms, next_expire)
            if runtime.has_credit():
                next_due = runtime.index.next_due_ms()
                if next_due is not None:
                    next_ms = min(next_ms, next_due)
        if expired:
            self._submit(commands.expire(expired), expired_restore)
        if dead:
            self._submit(commands.dead_letter(now_ms, dead, self.group_settings), dead_restore)
        deadline = self.hub.next_deadline_ms()
        if deadline is not None:
            next_ms = min(next_ms, deadline)
        if next_ms <= now_ms:
            next_ms = now_ms  # more work right away (a full batch, a refill step)
        return next_ms

    def _refill(self, runtime: GroupRuntime, now_ms: int) -> float:
        """Load the group's next schedule entries from disk; return when to look again.

        The horizon is extended to ``now + horizon_ms`` once less than half a window
        of it is left, so a quiet group is read from disk about every half window,
        never on every pass.
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
                break  # the rest is beyond the horizon
            count += 1
            last = packed
            if commands.schedule_key(gid, due_ms, mid) not in in_flight and packed not in index:
                if released:
                    runtime.released[mid] = released
                index.add(due_ms, mid, expire_ms, attempt)
        else:
            if count >= limit:
                runtime.loaded_until = last + 1
                return float(now_ms)  # a full chunk: read the next one on the next pass
        runtime.loaded_until = horizon_end
        return float(now_ms + half_window)

    def _deliver(
        self,
        runtime: GroupRuntime,
        now_ms: int,
        expired: list[bytes],
        expired_restore: list[Any],
        dead: list[tuple[bytes, int]],
        dead_restore: list[Any],
    ) -> None:
        """Hand what is due to consumers with credit; the recorder pushes it."""
        info = runtime.info
        gid = info.group_id
        index = runtime.index
        next_due = index.next_due_ms()
        if not runtime.consumers or next_due is None or next_due > now_ms:
            return
        dead_letter_topic = info.dead_letter_topic
        max_deliveries = info.max_deliveries
        released_counts = runtime.released
        staged_any = False
        # Round-robin: each round gives every consumer with credit an equal share of
        # what is due (one DELIVER frame each), so a group's consumers split the work.
        consumers = runtime.consumers_with_credit()
        while consumers:
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
                    if dead_letter_topic is not None and attempt - released > max_deliveries:
                        dead.append((key, previous))
                        dead_restore.append((runtime, due_ms, mid, expire_ms, previous))
                        continue
                    message = self.state.get_message(mid)
                    if message is None:  # removed by a command applied meanwhile
                        continue
                    _topic, payload, publish_ms, _due, _open = message
                    frame_bytes += len(payload) + 64
                    deliveries.append(
                        [
                            commands.delivery_tag(key, attempt),
                            mid,
                            payload,
                            due_ms,
                            publish_ms,
                            attempt,
                        ]
                    )
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
                        )
                    )
                if not deliveries:
                    continue
                consumer.credit -= len(deliveries)
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
                        Staged(consumer, [flights[i] for i in later], [deliveries[i] for i in later])
                    )
                    staged_any = True
            consumers = [c for c in consumers if c.credit > 0 and not c.closed]
        if staged_any:
            self._staged_changed.set()

    # ------------------------------------------------------------ status

    def due_count(self, runtime: GroupRuntime, now_ms: int) -> int:
        """Entries of a group due now and not in flight (memory, plus disk past the horizon)."""
        count = runtime.index.count_due(now_ms)
        due_bound, _ = unpack(runtime.loaded_until)
        if runtime.loaded_until and due_bound <= now_ms:
            start = commands.schedule_key(runtime.info.group_id, *unpack(runtime.loaded_until))
            stop = commands.schedule_key(runtime.info.group_id, now_ms + 1, 0)
            for _ in self.state.store.scan_keys("schedule", start, stop):
                count += 1
        return count


__all__ = ["Consumer", "Dispatcher"]
