"""Per-group histograms of due times, so BROWSE_COUNTS costs O(buckets) whatever the
backlog (issue 14, "counts by due-time bucket ... for the dashboard").

Node-local and derived, like the dispatcher's due index: nothing here is replicated
and apply never reads it (``DESIGN.md``, "Apply reads nothing node-local"). A group's
:class:`DueHistogram` counts its schedule entries per whole minute of due time (and,
to sum long ranges quickly, per hour and per day); it is built lazily, the first time
the group's counts are asked for, by a key-only scan of the group's ``schedule`` range
in chunks that yield to the event loop, and kept up to date from then on by the state
machine's observer callbacks (:meth:`DueCounts.on_scheduled`,
:meth:`DueCounts.on_unscheduled`, forwarded by the dispatcher on every node).

While a histogram is being built it has a *cursor* (a schedule key): everything below
it has been counted by the scan, and a callback for an entry below it updates the
histogram; a callback for an entry at or above it is ignored, since the scan counts
that entry (or not, if it is gone) when it gets there. The scan reads the store only
while the state machine is not in the middle of telling its observer about a command
(:attr:`~futureq.state.queue_state.QueueState.notifying`), so the store and the
callbacks agree whenever it reads.

Every path that adds or removes a schedule entry reports it to the observer as an
``s`` or ``u`` effect (PUBLISH, RESCHEDULE, NACK, RELEASE, ACK, CANCEL, PURGE_GROUP,
EXPIRE, DEAD_LETTER and parking, REDRIVE, BACKFILL_GROUP); a deleted group's
histogram is dropped (:meth:`DueCounts.on_group_changed`), and a snapshot install
drops them all (:meth:`DueCounts.on_groups_changed`). Parked dead letters (due at
:data:`~futureq.state.records.PARKED_DUE_MS`) are never counted.

Memory: three ``SortedDict`` rows per distinct minute (and hour, day) that holds an
entry of an asked-about group, about 105 bytes per distinct minute (tracemalloc); a group not asked
about for :data:`IDLE_DROP_S` loses its histogram (:meth:`DueCounts.sweep`), and all of
them together hold at most :data:`MAX_MINUTES_HELD` minutes (the largest goes first).

Source: ``docs/protocol.md``, "BROWSE_COUNTS"; ``docs/architecture.md``, "Counts by
due time".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import trio
from sortedcontainers import SortedDict

from futureq.state import commands
from futureq.state.commands import CommandKind
from futureq.state.records import PARKED_DUE_MS

if TYPE_CHECKING:
    from futureq.state.queue_state import QueueState

MINUTE_MS: Final = 60_000
"""Width of the finest bucket of a histogram (ms)."""
_MINUTES_PER_HOUR: Final = 60
_MINUTES_PER_DAY: Final = 1440
BUILD_CHUNK_KEYS: Final = 2048
"""Schedule keys a histogram build reads between two yields to the event loop (about
2 ms of a small machine's loop; the build runs at about 1M keys/s whatever the chunk)."""
EDGE_CHUNK_KEYS: Final = 8192
"""Schedule keys an edge-minute count reads between two yields."""
EDGE_SCAN_KEYS: Final = 100_000
"""Most keys one side of an edge minute is scanned for (a bound that falls inside a
minute holding more than this on both sides of it gives an incomplete answer)."""
IDLE_DROP_S: Final = 600.0
"""A histogram not asked about for this long is dropped, freeing its memory (s)."""
MAX_MINUTES_HELD: Final = 500_000
"""Most distinct minutes the histograms of a node hold together (about 52 MB). Past it
the largest histogram is dropped, and its group is counted by a bounded key scan
instead (``complete`` false past 200,000 keys) for :data:`IDLE_DROP_S`: a producer
spreading messages over millions of minutes (ten years hold 5.3 million) cannot make
the leader hold hundreds of megabytes for a dashboard's counts."""
SWEEP_INTERVAL_S: Final = 60.0
"""How often :meth:`DueCounts.run` looks for idle histograms (s)."""
_FIRST: Final = (0, 0)


class _Held:
    """Distinct minutes held by the histograms of one :class:`DueCounts` together."""

    __slots__ = ("minutes",)

    def __init__(self) -> None:
        self.minutes = 0


class DueHistogram:
    """One group's pending entries counted per minute, hour and day of due time.

    Attributes:
        minutes: Minute (``due_ms // 60000``) -> entries due in it (never 0).
        hours: Hour -> entries; days: day -> entries (sums of ``minutes``).
        cursor: While building, ``(due_ms, message id)`` of the first schedule key
            not counted yet; None once built.
        last_used_s: Monotonic time of the last request that used it (s).
        lock: Held by the one task driving the build.
        held: The node's count of distinct minutes held, which :meth:`bump` keeps.
    """

    __slots__ = ("cursor", "days", "held", "hours", "last_used_s", "lock", "minutes")

    def __init__(self, now_s: float, held: _Held | None = None) -> None:
        self.held = _Held() if held is None else held
        self.minutes: SortedDict = SortedDict()
        self.hours: SortedDict = SortedDict()
        self.days: SortedDict = SortedDict()
        self.cursor: tuple[int, int] | None = _FIRST
        self.last_used_s = now_s
        self.lock = trio.Lock()

    def add(self, due_ms: int, mid: int, delta: int) -> None:
        """Count one entry in (``delta`` 1) or out (-1), unless the build's scan has not
        reached it yet (it counts it then) or it is a parked dead letter."""
        cursor = self.cursor
        if due_ms == PARKED_DUE_MS or (cursor is not None and (due_ms, mid) >= cursor):
            return
        self.bump(due_ms // MINUTE_MS, delta)

    def bump(self, minute: int, delta: int) -> None:
        """Add ``delta`` entries to ``minute`` (and its hour and day)."""
        minutes = self.minutes
        before = minutes.get(minute, 0)
        count = before + delta
        if count:
            minutes[minute] = count
            if not before:
                self.held.minutes += 1
        else:
            del minutes[minute]
            self.held.minutes -= 1
        for row, key in (
            (self.hours, minute // _MINUTES_PER_HOUR),
            (self.days, minute // _MINUTES_PER_DAY),
        ):
            count = row.get(key, 0) + delta
            if count:
                row[key] = count
            else:
                del row[key]

    def before_minute(self, minute: int) -> int:
        """Entries due before the start of ``minute``: whole days, then whole hours of
        its day, then whole minutes of its hour. O(days before it + 24 + 60) at most."""
        day_start_hour = minute // _MINUTES_PER_DAY * 24
        hour_start_minute = minute // _MINUTES_PER_HOUR * _MINUTES_PER_HOUR
        days, hours, minutes = self.days, self.hours, self.minutes
        total: int = sum(
            days[d]
            for d in days.irange(maximum=minute // _MINUTES_PER_DAY, inclusive=(True, False))
        )
        total += sum(
            hours[h]
            for h in hours.irange(
                day_start_hour, minute // _MINUTES_PER_HOUR, inclusive=(True, False)
            )
        )
        total += sum(
            minutes[m] for m in minutes.irange(hour_start_minute, minute, inclusive=(True, False))
        )
        return total

    def total(self) -> int:
        """Every entry counted (parked dead letters excluded)."""
        total: int = sum(self.days.values())
        return total


class DueCounts:
    """The node's due-time histograms, one per group asked about (see the module).

    Args:
        state: The replicated state (read only: the ``schedule`` family and
            :attr:`~futureq.state.queue_state.QueueState.notifying`).
        monotonic_s: Monotonic clock (s), for dropping idle histograms.
    """

    def __init__(
        self,
        state: QueueState,
        monotonic_s: Callable[[], float],
        max_minutes: int = MAX_MINUTES_HELD,
    ) -> None:
        self.state = state
        self.monotonic_s = monotonic_s
        self.histograms: dict[int, DueHistogram] = {}
        self.max_minutes = max_minutes
        """Most distinct minutes held over every histogram (:data:`MAX_MINUTES_HELD`)."""
        self.held = _Held()
        self.refused: dict[int, float] = {}
        """Group id -> when its histogram was dropped for holding the most minutes past
        :attr:`max_minutes` (monotonic s): none is built for it for :data:`IDLE_DROP_S`."""

    def _drop(self, group_id: int) -> None:
        histogram = self.histograms.pop(group_id, None)
        if histogram is not None:
            self.held.minutes -= len(histogram.minutes)

    def _keep_within_budget(self) -> None:
        """Past :attr:`max_minutes`, drop the largest histograms (and refuse their
        groups one for a while) until the rest fit. Rare: once per overflow."""
        while self.held.minutes > self.max_minutes and self.histograms:
            largest = max(self.histograms, key=lambda gid: len(self.histograms[gid].minutes))
            self._drop(largest)
            self.refused[largest] = self.monotonic_s()

    # ------------------------------------------------------------ observer

    def on_scheduled(
        self,
        group_id: int,
        due_ms: int,
        mid: int,
        expire_ms: int | None = None,
        attempt: int = 0,
        released: int = 0,
    ) -> None:
        """A schedule entry was added: count it in the group's histogram, if any."""
        histogram = self.histograms.get(group_id)
        if histogram is not None:
            histogram.add(due_ms, mid, 1)
            if self.held.minutes > self.max_minutes:
                self._keep_within_budget()

    def on_scheduled_batch(self, entries: Sequence[tuple[Any, ...]]) -> None:
        """Schedule entries were added (``ScheduleObserver.on_scheduled_batch``)."""
        histograms = self.histograms
        if not histograms:
            return
        for entry in entries:
            histogram = histograms.get(entry[1])
            if histogram is not None:
                histogram.add(entry[2], entry[3], 1)
        if self.held.minutes > self.max_minutes:
            self._keep_within_budget()

    def on_unscheduled(self, group_id: int, due_ms: int, mid: int, reason: CommandKind) -> None:
        """A schedule entry was removed: count it out."""
        histogram = self.histograms.get(group_id)
        if histogram is not None:
            histogram.add(due_ms, mid, -1)

    def on_group_changed(self, group_id: int) -> None:
        """A deleted group's histogram goes (its id is never reused)."""
        if group_id not in self.state.groups:
            self._drop(group_id)
            self.refused.pop(group_id, None)

    def on_groups_changed(self) -> None:
        """A snapshot replaced the state: every histogram goes (rebuilt when asked)."""
        self.histograms.clear()
        self.held.minutes = 0
        self.refused.clear()

    # ------------------------------------------------------------ building

    async def quiet(self) -> None:
        """Return once the store and the callbacks agree (no command half-notified)."""
        while self.state.notifying:
            await trio.lowlevel.checkpoint()

    async def histogram(self, group_id: int) -> DueHistogram | None:
        """The group's histogram, built first if needed (in chunks that yield).

        Call it under a deadline: the build is resumable, so a request cancelled
        mid-way leaves the part counted so far for the next one. Returns None if the
        group was deleted (or a snapshot installed) meanwhile, or if its histogram would
        hold too many minutes (:attr:`max_minutes`; then none is built for the group for
        :data:`IDLE_DROP_S`: count it by a scan). On return the store and the callbacks
        agree (the caller may read both without yielding).
        """
        now_s = self.monotonic_s()
        refused_s = self.refused.get(group_id)
        if refused_s is not None:
            if now_s - refused_s < IDLE_DROP_S:
                return None
            del self.refused[group_id]
        histogram = self.histograms.get(group_id)
        if histogram is None:
            histogram = self.histograms[group_id] = DueHistogram(now_s, self.held)
        histogram.last_used_s = now_s
        if histogram.cursor is not None:
            async with histogram.lock:
                while histogram.cursor is not None:
                    await self.quiet()
                    if self.histograms.get(group_id) is not histogram:
                        return None
                    self._build_chunk(group_id, histogram)
                    if self.held.minutes > self.max_minutes:
                        self._keep_within_budget()
                        if self.histograms.get(group_id) is not histogram:
                            return None
                    if histogram.cursor is not None:
                        await trio.lowlevel.checkpoint()
        await self.quiet()
        return histogram if self.histograms.get(group_id) is histogram else None

    def _build_chunk(self, group_id: int, histogram: DueHistogram) -> None:
        """Count the next :data:`BUILD_CHUNK_KEYS` keys after the cursor (no yield)."""
        assert histogram.cursor is not None
        start = commands.schedule_key(group_id, *histogram.cursor)
        stop = commands.schedule_key(group_id, PARKED_DUE_MS, 0)
        keys = []
        for key in self.state.store.scan_keys("schedule", start, stop):
            keys.append(key)
            if len(keys) > BUILD_CHUNK_KEYS:
                break
        if len(keys) > BUILD_CHUNK_KEYS:
            _, due_ms, mid = commands.parse_schedule_key(keys.pop())
            histogram.cursor = (due_ms, mid)
        else:
            histogram.cursor = None
        from_bytes = int.from_bytes
        for minute, count in Counter(
            from_bytes(key[4:12], "big") // MINUTE_MS for key in keys
        ).items():
            histogram.bump(minute, count)

    # ------------------------------------------------------------ counting

    async def count_below(
        self, group_id: int, histogram: DueHistogram, bound_ms: int
    ) -> tuple[int, bool]:
        """Entries of the group due before ``bound_ms`` (parked ones never).

        Whole minutes come from the histogram; the minute the bound falls in is
        counted exactly by a key scan of its part below the bound, or, if that holds
        more than :data:`EDGE_SCAN_KEYS`, of its part above the bound (subtracted from
        the minute's count), in chunks that yield. Call right after :meth:`histogram`
        (no yield between). A scan that yields sees the store as it is when it reads.

        Returns:
            ``(count, exact)``: not exact when both parts of the minute hold more
            than :data:`EDGE_SCAN_KEYS`; the count is then a lower bound.
        """
        minute = bound_ms // MINUTE_MS
        minute_start = minute * MINUTE_MS
        below = histogram.before_minute(minute)
        if bound_ms == minute_start or not histogram.minutes.get(minute, 0):
            return below, True
        lower, exact = await self._count_keys(group_id, minute_start, bound_ms)
        if exact:
            return below + lower, True
        upper, exact = await self._count_keys(group_id, bound_ms, minute_start + MINUTE_MS)
        if exact:
            return below + max(0, histogram.minutes.get(minute, 0) - upper), True
        return below + lower, False

    async def _count_keys(self, group_id: int, from_ms: int, to_ms: int) -> tuple[int, bool]:
        """``(keys of the group due in [from_ms, to_ms), True)``, or ``(what was read,
        False)`` past :data:`EDGE_SCAN_KEYS` (read :data:`EDGE_CHUNK_KEYS` at a time)."""
        stop = commands.schedule_key(group_id, to_ms, 0)
        start = commands.schedule_key(group_id, from_ms, 0)
        count = 0
        while True:
            read = 0
            resume = None
            for key in self.state.store.scan_keys("schedule", start, stop):
                if read >= EDGE_CHUNK_KEYS:
                    resume = key
                    break
                read += 1
            count += read
            if resume is None:
                return count, True
            if count >= EDGE_SCAN_KEYS:
                return count, False
            start = resume
            await trio.lowlevel.checkpoint()
            await self.quiet()

    # ------------------------------------------------------------ memory

    def sweep(self) -> int:
        """Drop histograms not asked about for :data:`IDLE_DROP_S`; returns how many."""
        now_s = self.monotonic_s()
        idle = [
            gid
            for gid, histogram in self.histograms.items()
            if now_s - histogram.last_used_s >= IDLE_DROP_S and not histogram.lock.locked()
        ]
        for gid in idle:
            self._drop(gid)
        for gid, refused_s in list(self.refused.items()):
            if now_s - refused_s >= IDLE_DROP_S:
                del self.refused[gid]
        return len(idle)

    async def run(self) -> None:
        """Sweep idle histograms every :data:`SWEEP_INTERVAL_S` until cancelled."""
        while True:
            await trio.sleep(SWEEP_INTERVAL_S)
            self.sweep()

    def minutes_held(self) -> int:
        """Distinct minutes held over every histogram (the memory they cost)."""
        return sum(len(h.minutes) for h in self.histograms.values())


__all__ = ["DueCounts", "DueHistogram"]
