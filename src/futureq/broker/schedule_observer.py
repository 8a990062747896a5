"""The dispatcher as the state machine's schedule observer.

Plain functions over a :class:`~futureq.broker.dispatcher.Dispatcher`, called as apply
commits schedule changes (``ScheduleObserver``): a committed entry is indexed if it
falls inside its group's loaded horizon, or only moves the group's next look; a removed
entry is forgotten in the index and in flight; a changed or deleted group updates its
runtime; a snapshot starts afresh. Here too: the per-group seek hints of
:func:`next_due_ms`, the attempts a RESCHEDULE carries (:func:`out_deliveries`,
:func:`carry`) and the per-group wake-up timers (:func:`wake_group_at`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Final

from futureq.errors import ErrorCode
from futureq.state import commands
from futureq.state.commands import CommandKind
from futureq.state.due_index import pack, unpack
from futureq.state.records import PARKED_DUE_MS

from . import dispatch_counters, dispatch_tasks
from .hub import DEAD_LETTERED, RESCHEDULED, TTL_RAN_OUT

_GROUP: Final = itemgetter(1)
_DUE: Final = itemgetter(2)
_MID: Final = itemgetter(3)
"""Fields of a schedule effect ``("s", group_id, due_ms, mid, expire_ms, attempt[, released])``."""

if TYPE_CHECKING:
    from .dispatcher import Dispatcher
    from .hub import GroupRuntime

_REASON_COUNTERS: dict[CommandKind, str] = {
    CommandKind.ACK: "acked_messages_total",
    CommandKind.NACK: "nacked_messages_total",
    CommandKind.EXPIRE: "expired_messages_total",
    CommandKind.DEAD_LETTER: "dead_lettered_messages_total",
}
_CANCELLING: Final = frozenset({CommandKind.CANCEL, CommandKind.PURGE_GROUP})
"""Removals a consumer holding the delivery is told are cancellations (REVOKE reason
CANCELLED, then DELIVERY_CANCELLED for its ACK)."""

_REMOVED_BECAUSE: Final[dict[CommandKind, str]] = {
    CommandKind.EXPIRE: TTL_RAN_OUT,
    CommandKind.DEAD_LETTER: DEAD_LETTERED,
    CommandKind.RESCHEDULE: RESCHEDULED,
}
"""Why a delivery out was taken back, by the kind of the command that removed or moved
its entry (told to a later ACK/NACK/RELEASE/EXTEND of its tag, :meth:`Hub.forget`)."""


def on_scheduled(
    dispatcher: Dispatcher,
    group_id: int,
    due_ms: int,
    mid: int,
    expire_ms: int | None,
    attempt: int,
    released: int = 0,
) -> None:
    """The work of :meth:`Dispatcher.on_scheduled` (its docstring: arguments, result, errors)."""
    if dispatcher._histograms:  # BROWSE_COUNTS histograms (none: no cost but this test)
        dispatcher.due_counts.on_scheduled(group_id, due_ms, mid)
    hint = dispatcher._seek_hints.get(group_id)
    if hint is not None:
        packed = pack(due_ms, mid)
        if packed < hint:
            dispatcher._seek_hints[group_id] = packed
    if not dispatcher.active:
        return
    if dispatcher._carried:
        attempt = carry(dispatcher, group_id, due_ms, mid, attempt)
    runtime = dispatcher.hub.groups.get(group_id)
    if runtime is None:
        # No runtime: the group is idle or not loaded yet; the load finds the entry.
        wake_group_at(dispatcher, group_id, due_ms - dispatcher.horizon_ms)
        return
    at = index_loaded(dispatcher, runtime, group_id, due_ms, mid, expire_ms, attempt, released)
    wake_group_at(dispatcher, group_id, at)


def on_scheduled_batch(dispatcher: Dispatcher, entries: Sequence[tuple[Any, ...]]) -> None:
    """The work of :meth:`Dispatcher.on_scheduled_batch` (its docstring: arguments, result, errors)."""
    if dispatcher._histograms:
        dispatcher.due_counts.on_scheduled_batch(entries)
    if len(entries) > 1 and _one_group_past_horizon(dispatcher, entries):
        return
    hints = dispatcher._seek_hints
    if hints:
        for entry in entries:
            group_id = entry[1]
            hint = hints.get(group_id)
            if hint is not None:
                packed = pack(entry[2], entry[3])
                if packed < hint:
                    hints[group_id] = packed
    if not dispatcher.active:
        return
    groups = dispatcher.hub.groups
    horizon_ms = dispatcher.horizon_ms
    pass_now_ms = dispatcher._pass_now_ms
    wake: dict[int, float] = {}
    """Group -> the earliest wake-up asked for after the pass under way."""
    now: dict[int, float] = {}
    """Group -> a wake-up asked for within the pass under way (look again now)."""
    carried = dispatcher._carried
    for entry in entries:
        group_id = entry[1]
        runtime = groups.get(group_id)
        attempt = entry[5]
        if carried:
            attempt = carry(dispatcher, group_id, entry[2], entry[3], attempt)
        if runtime is None:
            at: float = entry[2] - horizon_ms
        else:
            at = index_loaded(
                dispatcher,
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
        wake_group_at(dispatcher, group_id, at)
    for group_id, at in wake.items():
        wake_group_at(dispatcher, group_id, at)


def _one_group_past_horizon(dispatcher: Dispatcher, entries: Sequence[tuple[Any, ...]]) -> bool:
    """:func:`on_scheduled_batch` for the common batch, a PUBLISH to one topic whose
    entries all fall past the group's loaded horizon (or the group has no runtime) and
    after the pass under way: the same seek hint and the same one wake-up, from a few
    C-level passes over the entries instead of a Python statement per entry (the loop
    was ~4 % of a single node's event loop at batch 100). False, with nothing done,
    for any other batch: the loop serves it.
    """
    first = entries[0][1]
    if any(map(first.__ne__, map(_GROUP, entries))):
        return False
    if dispatcher.active and dispatcher._carried:
        return False  # attempts to carry per entry
    earliest_due = min(map(_DUE, entries))
    if dispatcher.active:
        runtime = dispatcher.hub.groups.get(first)
        if runtime is None:
            at = earliest_due - dispatcher.horizon_ms
        elif pack(earliest_due, 0) >= runtime.loaded_until:  # so is every entry
            at = earliest_due - dispatcher.horizon_ms // 2
        else:
            return False  # some may be indexed
        if at <= dispatcher._pass_now_ms:
            return False
    hints = dispatcher._seek_hints
    hint = hints.get(first)
    if hint is not None:
        earliest = pack(*min(zip(map(_DUE, entries), map(_MID, entries), strict=True)))
        if earliest < hint:
            hints[first] = earliest
    if dispatcher.active:
        wake_group_at(dispatcher, first, at)
    return True


def carry(dispatcher: Dispatcher, group_id: int, due_ms: int, mid: int, attempt: int) -> int:
    """The attempt to index for an entry just scheduled: at least that of a delivery
    of it this leader knew was out when a RESCHEDULE moved it.

    The RESCHEDULE command normally carries that attempt already
    (:func:`out_deliveries`); this covers a first delivery pushed while the command
    was being committed. The attempt is then unknown to the log, so a DELIVERED
    recording it is proposed as well (best effort: until it commits, this leader's
    index keeps the count, as for a first delivery out).
    """
    carried = dispatcher._carried.pop((group_id, mid), 0)
    if carried <= attempt:
        return attempt
    key = commands.schedule_key(group_id, due_ms, mid)
    dispatch_tasks.submit(
        dispatcher, commands.delivered([(key, carried)], dispatcher.clock.wall_ms()), []
    )
    return carried


def index_loaded(
    dispatcher: Dispatcher,
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
        return due_ms - dispatcher.horizon_ms // 2
    if packed in runtime.index or commands.schedule_key(group_id, due_ms, mid) in (
        dispatcher.hub.in_flight
    ):
        return math.inf  # a refill read it from disk before this notification came
    if released:
        runtime.released[mid] = released
    runtime.index.add(due_ms, mid, expire_ms, attempt)
    dispatcher.note_expiry(expire_ms)
    if len(runtime.index) > dispatcher.group_horizon_items():
        last_due, last_mid = runtime.index.pop_last()
        runtime.loaded_until = pack(last_due, last_mid)
    wake = due_ms if runtime.consumers else math.inf
    if expire_ms is not None:
        wake = min(wake, expire_ms)
    return wake


def next_due_ms(dispatcher: Dispatcher, group_id: int) -> int | None:
    """The work of :meth:`Dispatcher.next_due_ms` (its docstring: arguments, result, errors)."""
    hint = dispatcher._seek_hints.get(group_id)
    start = (
        group_id.to_bytes(4, "big")
        if hint is None
        else commands.schedule_key(group_id, *unpack(hint))
    )
    stop = commands.schedule_key(group_id, PARKED_DUE_MS, 0)
    # A running PURGE's entries are gone, though its chunks have not removed them yet:
    # looked past (at most MAX_PURGED_LOOKED_PAST), and the hint goes past them too.
    purged = dispatcher.state.purged_below(group_id)
    for read, key in enumerate(dispatcher.state.store.scan_keys("schedule", start, stop), 1):
        _, due_ms, mid = commands.parse_schedule_key(key)
        if mid < purged:
            if read >= MAX_PURGED_LOOKED_PAST:
                return None  # many: the purge's chunks will have cleared them soon
            continue
        dispatcher._seek_hints[group_id] = pack(due_ms, mid)
        return due_ms
    dispatcher._seek_hints[group_id] = pack(PARKED_DUE_MS, 0)
    return None


def out_deliveries(
    dispatcher: Dispatcher, group_ids: Sequence[int], ids: Sequence[int]
) -> list[tuple[bytes, int]]:
    """The work of :meth:`Dispatcher.out_deliveries` (its docstring: arguments, result, errors)."""
    found: list[tuple[bytes, int]] = []
    if not dispatcher.active:
        return found
    in_flight = dispatcher.hub.in_flight
    for gid in group_ids:
        runtime = dispatcher.hub.groups.get(gid)
        if runtime is None:
            continue
        for mid in ids:
            indexed = runtime.index.attempted(mid)
            if indexed is not None:
                found.append((commands.schedule_key(gid, indexed[0], mid), indexed[1]))
                continue
            if not runtime.in_flight_count:
                continue
            key = dispatcher.state.entry_key(mid, gid)
            flight = None if key is None else in_flight.get(key)
            if flight is not None:
                attempt = flight.counted_attempt
                if attempt:
                    found.append((flight.key, attempt))
    return found


def on_unscheduled(
    dispatcher: Dispatcher,
    group_id: int,
    due_ms: int,
    mid: int,
    reason: CommandKind,
    held: tuple[int, int] | None = None,
) -> None:
    """The work of :meth:`Dispatcher.on_unscheduled` (its docstring: arguments, result, errors).

    A CANCEL or PURGE that removes an entry held for a delivery an earlier leader
    left out (``held``, its deadline not passed) cancels that delivery whether or not
    a pass loaded it into the hub: its tag then answers DELIVERY_CANCELLED, as for a
    delivery this leader handed out (``docs/protocol.md``, "A delivery whose message
    was cancelled"). Found by a tester: a CANCEL on the leader after a transfer, then
    an ACK of the held tag got UNKNOWN_DELIVERY_TAG ("delivered again"), though the
    message never is. A deleted group's chunks (also PURGE_GROUP) cancel nothing: its
    deliveries are void, their tags unknown, as for one out on this leader.

    Likewise a RESCHEDULE, EXPIRE or DEAD_LETTER that moves or removes such an entry
    ends that delivery for its reason: its tag's UNKNOWN_DELIVERY_TAG says why (found
    by a tester: after a transfer, the ACK of a held tag whose message a RESCHEDULE
    moved was told the earlier leader "did not hand it over").
    """
    if dispatcher._histograms:
        dispatcher.due_counts.on_unscheduled(group_id, due_ms, mid, reason)
    why = _REMOVED_BECAUSE.get(reason)
    if (
        held is not None
        and (reason in _CANCELLING or why is not None)
        and dispatcher.active
        and group_id in dispatcher.state.groups
        and held[1] > dispatcher.clock.wall_ms()
    ):
        key = commands.schedule_key(group_id, due_ms, mid)
        if key not in dispatcher.hub.in_flight:  # loaded: forget() below notes it
            if why is None:
                dispatcher.hub.note_cancelled(key, held[0])
            else:
                dispatcher.hub.note_ended(key, held[0], why)
    runtime = dispatcher.hub.groups.get(group_id)
    if runtime is None:
        if dispatcher.metrics is not None and dispatcher.active:
            name = _REASON_COUNTERS.get(reason)
            info = dispatcher.state.groups.get(group_id)
            if name is not None and info is not None:
                dispatch_counters.count(dispatcher, name, info.topic, info.name)
        return
    indexed = runtime.index.attempted(mid) if reason == CommandKind.RESCHEDULE else None
    runtime.index.discard(due_ms, mid)
    runtime.released.pop(mid, None)
    key = commands.schedule_key(group_id, due_ms, mid)
    flight = dispatcher.hub.forget(key, cancelled=reason in _CANCELLING, why=why)
    if reason == CommandKind.RESCHEDULE:
        attempt = 0 if indexed is None else indexed[1]
        if flight is not None:
            attempt = max(attempt, flight.counted_attempt)
        if attempt:
            dispatcher._carried[(group_id, mid)] = attempt
    if dispatcher.metrics is not None:
        name = _REASON_COUNTERS.get(reason)
        if name is not None:
            dispatch_counters.counter(dispatcher, runtime, name).inc()


TIMER_HEAP_SLACK: Final = 4096
"""Stale entries the dispatcher's wake-up heap may hold beyond twice the groups waiting
for a wake-up before it is rebuilt (:func:`wake_group_at`)."""

MAX_PURGED_LOOKED_PAST: Final = 10_000
"""Most entries of a running PURGE :func:`next_due_ms` looks past (keys only) before it
answers None."""


def on_group_changed(dispatcher: Dispatcher, group_id: int) -> None:
    """The work of :meth:`Dispatcher.on_group_changed` (its docstring: arguments, result, errors)."""
    state = dispatcher.state
    if group_id not in state.groups:
        dispatcher._seek_hints.pop(group_id, None)
    dispatcher.due_counts.on_group_changed(group_id)
    if group_id in state.deleting or group_id in state.purging or group_id in state.backfilling:
        dispatcher._deleting_changed.set()  # the reaper has entries to purge or copy
    if not dispatcher.active:
        return
    info = dispatcher.state.groups.get(group_id)
    runtime = dispatcher.hub.groups.get(group_id)
    if info is None:
        if runtime is not None and dispatcher.metrics is not None:
            dispatcher.metrics.forget_group(runtime.info.topic, runtime.info.name)
            if not state.topic_groups_count(runtime.info.topic):
                dispatcher.metrics.forget_topic(runtime.info.topic)
        reason = None
        if runtime is not None:
            reason = (
                ErrorCode.GROUP_DELETED,
                f"consumer group {runtime.info.name!r} of topic {runtime.info.topic!r} was "
                "deleted; its deliveries are void (subscribe again to create a new one)",
            )
        dispatcher.hub.drop_group(group_id, reason)
        dispatcher._wake_at.pop(group_id, None)
        return
    if runtime is not None:
        runtime.info = info
        purged = dispatcher.state.purged_below(group_id)
        if purged:
            # A PURGE started: its entries loaded before it are gone at once (not
            # delivered, not counted due in STATUS), though its chunks remove them
            # from disk bit by bit.
            for mid in runtime.index.discard_ids_below(purged):
                runtime.released.pop(mid, None)
            cancel_purged_out(dispatcher, runtime, purged)
        for consumer in runtime.consumers:
            dispatcher.hub.send_settings(consumer, info)  # SUBSCRIPTION_INFO, if they changed
        dispatcher.hub.touched.add(group_id)  # settings changed: look again
        dispatcher.kick()


def cancel_purged_out(dispatcher: Dispatcher, runtime: GroupRuntime, purged: int) -> None:
    """Take back, as cancelled, the group's deliveries out whose message a PURGE that
    just applied removes (ids below ``purged``): REVOKE reason CANCELLED, their credit
    returned, and a later ACK, NACK, RELEASE or EXTEND of one answered
    DELIVERY_CANCELLED (``docs/protocol.md``, "PURGE").

    Found by a tester: until the purge's chunks reached their entries (after every
    chunk of the groups purged before this one), such deliveries stayed out as if
    nothing had happened: an ACK settled one, a NACK with ``dead_letter`` sent the
    purged message to the dead-letter topic, and a visibility timeout's REVOKE said it
    would be delivered again. A delivery whose settlement is being committed is left
    to that command (taken back here, a settlement that then failed could give its
    credit back to nobody).
    """
    hub = dispatcher.hub
    if not runtime.in_flight_count:
        return
    # Those an earlier leader handed over and a pass loaded are out to no consumer of
    # the group (Hub.orphans); found by a tester, an ACK of one was honoured after the
    # purge. Those not loaded are found by Dispatcher._held_entry.
    group_id = runtime.info.group_id
    holders = [*runtime.consumers, hub.orphans]
    for consumer in holders:
        for key in list(consumer.in_flight):
            flight = hub.in_flight.get(key)
            if (
                flight is not None
                and flight.group_id == group_id
                and flight.mid < purged
                and not flight.acking
            ):
                hub.forget(key, cancelled=True)


def on_groups_changed(dispatcher: Dispatcher) -> None:
    """Every group may have changed (a snapshot was installed): start afresh."""
    dispatcher._seek_hints.clear()
    dispatcher.due_counts.on_groups_changed()
    if dispatcher.active:
        dispatcher.activate()
    if dispatcher.state.deleting:
        dispatcher._deleting_changed.set()


def wake_group_at(dispatcher: Dispatcher, group_id: int, at_ms: float) -> None:
    """Make sure the group is looked at no later than ``at_ms`` (O(log n))."""
    if at_ms == math.inf:
        return
    if at_ms <= dispatcher._pass_now_ms:
        dispatcher.hub.touched.add(group_id)
        dispatcher.kick()
        return
    current = dispatcher._wake_at.get(group_id, math.inf)
    if at_ms < current:
        wake_at = dispatcher._wake_at
        wake_at[group_id] = at_ms
        timers = dispatcher._timers
        heapq.heappush(timers, (at_ms, group_id))
        if len(timers) > 2 * len(wake_at) + TIMER_HEAP_SLACK:
            # The wake-ups an earlier one replaced stay in the heap until their time
            # comes: found by a tester, publishes one at a time, each due before the
            # last (a backfill newest first), left one entry per message for as long as
            # the messages waited. Rebuilt from the live ones (amortized O(1)).
            timers[:] = [(at, gid) for gid, at in wake_at.items()]
            heapq.heapify(timers)
        if at_ms < dispatcher._next_wake_ms:
            dispatcher.kick()
