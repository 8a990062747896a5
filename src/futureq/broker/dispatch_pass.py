"""One dispatch pass: refill horizons, expire, dead-letter and hand out what is due.

Plain functions over a :class:`~futureq.broker.dispatcher.Dispatcher`. A pass looks
only at groups touched since the last one or whose wake-up came, a bounded number of
them (:data:`GROUPS_PER_PASS`, :data:`PASS_BUDGET_S`, :data:`DELIVERIES_PER_PASS`); per
group it loads the next schedule entries from disk into the horizon (:func:`refill`),
collects what expired or ran out of attempts, and hands what is due round-robin to the
consumers with credit (:func:`deliver`): first deliveries are pushed at once,
redeliveries staged for :mod:`futureq.broker.delivery_records`.

Source: ``DESIGN.md``, "Message semantics" (nothing early, nothing expired, round-robin
within a group, credit-based flow control).
"""

from __future__ import annotations

import heapq
import logging
import math
from typing import TYPE_CHECKING, Any

from futureq.state import commands
from futureq.state.due_index import pack, unpack
from futureq.wire.validation import MAX_HEADER_BYTES, MAX_HEADERS

from . import delivery_records, dispatch_tasks
from .delivery_records import Staged
from .hub import InFlight

if TYPE_CHECKING:
    from .dispatcher import Dispatcher
    from .hub import GroupRuntime

log = logging.getLogger(__name__)

REFILL_CHUNK_ITEMS = 10_000
"""Most schedule entries read from disk in one refill step (keeps the loop responsive)."""
EXPIRE_BATCH_ITEMS = 1000
GROUPS_PER_PASS = 64
"""Most groups looked at in one dispatch pass; the rest wait for the next (a yield)."""
EXPIRY_LOOKS_HELD_BACK = 256
"""Most groups looked at for expiry alone in one held-back pass (:func:`expire_held_back`)."""
HELD_BACK_SCAN_MS = 10
"""While the node is held back and a round of expiry looks is under way, the next pass
comes this soon (ms): with 100,000 groups with work, a round takes ~4 s."""
PASS_BUDGET_S = 0.005
"""A pass stops looking at more groups once it has taken this long (s)."""
DELIVERIES_PER_PASS = 8192
"""Most deliveries pushed in one dispatch pass, so one pass holds the loop briefly."""
HELD_BACK_LOG_INTERVAL_S = 60.0
"""Least time between two warnings that the node's deliveries out are at their limit (s)."""
DELIVERY_FIELD_BYTES = 72
"""The most msgpack bytes of one DELIVER item beside its payload's and headers' own
bytes: tag (26), id, due and publish times and attempt (9 each), the payload's prefix
(5), the item's array and a nil headers field."""
DELIVERY_HEADER_BYTES = MAX_HEADER_BYTES + 6 * MAX_HEADERS + 3
"""The most msgpack bytes of one message's headers (names and values with their
prefixes, and the map's)."""
NOT_ALLOWED_RETRY_MS = 50
"""While dispatching is not allowed (no lease yet, clock out of bound), look again after
this long (ms)."""


def dispatch_once(dispatcher: Dispatcher) -> float:
    """The work of :meth:`Dispatcher.dispatch_once` (its docstring: arguments, result, errors)."""
    if not dispatcher.active:
        return math.inf
    # The pass's time first, then the lease: a pause between the two fails the
    # question, and everything the pass pushes (without yielding) carries a time
    # at which the lease held (see push_staged).
    now_ms = dispatcher.clock.wall_ms()
    if dispatcher.held or (
        dispatcher.dispatch_allowed is not None and not dispatcher.dispatch_allowed()
    ):
        return float(now_ms + NOT_ALLOWED_RETRY_MS)
    dispatcher._in_pass = True
    try:
        return run_pass(dispatcher, now_ms)
    finally:
        dispatcher._in_pass = False


def run_pass(dispatcher: Dispatcher, now_ms: int) -> float:
    """The body of :func:`dispatch_once`, at ``now_ms``, dispatching allowed."""
    dispatcher._pass_now_ms = now_ms
    hub = dispatcher.hub
    hub.expire_visibility(now_ms)
    if hub.returned:
        delivery_records.record_returned(dispatcher, now_ms)
    next_ms: float = dispatch_tasks.unpark(dispatcher, now_ms)
    timers = dispatcher._timers
    wake_at = dispatcher._wake_at
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
    # The node's bound on deliveries out (limits.max_deliveries_out): one length check
    # a pass. At it, no group is looked at (the touched ones stay touched) and the pass
    # plans no early wake-up: the first delivery settled or taken back wakes it
    # (Hub.held_back), and its visibility deadlines are still watched below.
    budget = [int(min(DELIVERIES_PER_PASS, hub.room_out()))]
    stop_s = dispatcher.clock.monotonic_s() + PASS_BUDGET_S
    looks = min(len(touched), GROUPS_PER_PASS)
    expiry_wake = math.inf
    if looks and budget[0] < 1:
        hold_back(dispatcher)
        looks = 0
        expiry_wake = expire_held_back(dispatcher, now_ms, expired, expired_restore, stop_s)
    for looked in range(looks):
        if looked and dispatcher.clock.monotonic_s() >= stop_s:
            break  # a slow disk read or a full batch: the rest after a yield
        gid = touched.pop()
        runtime = hub.runtime(gid)
        if runtime is None:
            wake_at.pop(gid, None)
            continue
        group_next = dispatch_group(
            dispatcher, runtime, now_ms, expired, expired_restore, dead, dead_restore, budget
        )
        if group_next <= now_ms:
            touched.add(gid)  # more right away (a full batch, a refill step)
        else:
            if gid in wake_at and wake_at[gid] <= group_next:
                pass  # an earlier wake-up is already set
            elif group_next < math.inf:
                wake_at[gid] = group_next
                heapq.heappush(timers, (group_next, gid))
            if runtime.is_idle() and gid not in touched and not dispatcher._parked:
                del hub.groups[gid]  # rebuilt from disk when it has work again
        if budget[0] <= 0:
            break
    if expired:
        groups = dispatcher.state.groups
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
            command = commands.expire(expired, now_ms, dispatcher.group_settings, out)
        else:
            command = commands.expire(expired)
        dispatch_tasks.submit(dispatcher, command, expired_restore)
    if dead:
        dispatch_tasks.submit(
            dispatcher, commands.dead_letter(now_ms, dead, dispatcher.group_settings), dead_restore
        )
    if touched and not hub.held_back:
        return now_ms
    while timers and wake_at.get(timers[0][1]) != timers[0][0]:
        heapq.heappop(timers)  # stale
    if timers:
        next_ms = min(next_ms, timers[0][0])
    deadline = hub.next_deadline_ms()
    if deadline is not None:
        next_ms = min(next_ms, deadline)
    next_ms = min(next_ms, expiry_wake)
    if next_ms <= now_ms:
        next_ms = now_ms
    return next_ms


def collect_expired(
    dispatcher: Dispatcher,
    runtime: GroupRuntime,
    now_ms: int,
    expired: list[bytes],
    expired_restore: list[Any],
) -> None:
    """Take up to :data:`EXPIRE_BATCH_ITEMS` entries of ``runtime``'s index whose TTL
    ran out by ``now_ms`` into ``expired`` (schedule keys, for the EXPIRE) and
    ``expired_restore`` (what to put back if it cannot be committed). A running
    PURGE's entries are left out: its chunks remove them (a ``dead_letter_expired``
    group must not keep them)."""
    gid = runtime.info.group_id
    purged = dispatcher.state.purged_below(gid)
    for due_ms, mid, expire_ms, attempt in runtime.index.pop_expired(now_ms, EXPIRE_BATCH_ITEMS):
        if mid < purged:
            continue
        expired.append(commands.schedule_key(gid, due_ms, mid))
        expired_restore.append((runtime, due_ms, mid, expire_ms, attempt))


def expire_held_back(
    dispatcher: Dispatcher,
    now_ms: int,
    expired: list[bytes],
    expired_restore: list[Any],
    stop_s: float = math.inf,
) -> float:
    """While the node is held back (:func:`hold_back`), remove what expired all the
    same (``docs/protocol.md``, "Due time, TTL and expiry"). Before, expiry waited for
    room: an expired message still counted as pending, and a ``dead_letter_expired``
    group dead-lettered it late.

    The touched groups (the ones with work, which a held-back pass does not look at)
    are looked at for expiry alone (their horizon loaded, as a pass would), round
    after round, at most :data:`EXPIRY_LOOKS_HELD_BACK` a pass (each an O(1) check
    once loaded, unless something expired) and none more once the pass's time is
    spent (``stop_s``, monotonic s): found by a tester, a node held back just after
    it took leadership loaded 256 groups of 2,000 entries in one pass and held its
    event loop 1.4 s, past a cluster's election timeout. They stay touched for when
    room returns.

    Returns:
        When the next pass should run for expiry (ms, or inf): soon while a round is
        under way, else the earliest expiry the round saw.
    """
    hub = dispatcher.hub
    scan = dispatcher._held_back_scan
    if not scan:
        scan.extend(hub.touched)
        dispatcher._held_back_scan_min = math.inf
    earliest = dispatcher._held_back_scan_min
    for looked in range(min(len(scan), EXPIRY_LOOKS_HELD_BACK)):
        if looked and dispatcher.clock.monotonic_s() >= stop_s:
            break  # a slow disk read: the rest after a yield
        gid = scan.pop()
        runtime = hub.runtime(gid)
        if runtime is None:
            continue
        refill(dispatcher, runtime, now_ms)  # cheap once loaded to its horizon
        index = runtime.index
        next_expire = index.next_expire_ms()
        if next_expire is None:
            continue
        if next_expire <= now_ms:
            collect_expired(dispatcher, runtime, now_ms, expired, expired_restore)
            next_expire = index.next_expire_ms()
            if next_expire is None:
                continue
        earliest = min(earliest, next_expire)
    dispatcher._held_back_scan_min = earliest
    if scan:
        return now_ms + HELD_BACK_SCAN_MS
    return earliest


def hold_back(dispatcher: Dispatcher) -> None:
    """The node has ``limits.max_deliveries_out`` deliveries out: this pass hands out
    nothing. Counted (``futureq_deliveries_held_back_total``) and said in a warning at
    most once per :data:`HELD_BACK_LOG_INTERVAL_S`; back-pressure, not an error."""
    hub = dispatcher.hub
    hub.held_back = True
    dispatcher.held_back_passes += 1
    if dispatcher.metrics is not None:
        dispatcher.metrics.deliveries_held_back_total.inc()
    now_s = dispatcher.clock.monotonic_s()
    if now_s - dispatcher.held_back_logged_s >= HELD_BACK_LOG_INTERVAL_S:
        log.warning(
            "%d deliveries are out (handed to consumers, not settled), the node's limit "
            "(limits.max_deliveries_out = %d): nothing more is handed out until consumers "
            "settle some or their visibility timeouts pass; raise the limit if memory allows "
            "(~500 bytes each). Dispatch passes held back since the previous such line: %d",
            len(hub.in_flight),
            hub.max_deliveries_out,
            dispatcher.held_back_passes,
        )
        dispatcher.held_back_logged_s = now_s
        dispatcher.held_back_passes = 0


def dispatch_group(
    dispatcher: Dispatcher,
    runtime: GroupRuntime,
    now_ms: int,
    expired: list[bytes],
    expired_restore: list[Any],
    dead: list[tuple[bytes, int]],
    dead_restore: list[Any],
    budget: list[int],
) -> float:
    """One group's share of a pass; returns when the group next needs a look (ms)."""
    next_ms = refill(dispatcher, runtime, now_ms)
    collect_expired(dispatcher, runtime, now_ms, expired, expired_restore)
    taken = deliver(
        dispatcher, runtime, now_ms, expired, expired_restore, dead, dead_restore, budget[0]
    )
    budget[0] -= taken
    if taken or expired_restore:
        # The index shrank: it may need more from disk (cheap when it does not).
        next_ms = min(next_ms, refill(dispatcher, runtime, now_ms))
    next_expire = runtime.index.next_expire_ms()
    if next_expire is not None:
        next_ms = min(next_ms, next_expire)
    if runtime.has_credit():
        next_due = runtime.index.next_due_ms()
        if next_due is not None:
            next_ms = min(next_ms, next_due)
    return next_ms


def refill(dispatcher: Dispatcher, runtime: GroupRuntime, now_ms: int) -> float:
    """Load the group's next schedule entries from disk; return when to look again.

    The horizon is extended to ``now + horizon_ms`` once less than half a window
    of it is left. When the first entry left on disk is due later than that, the
    group is next read shortly before that entry enters the horizon; a group with
    nothing on disk beyond its horizon is not read again until a new entry is
    scheduled for it (:func:`~futureq.broker.schedule_observer.on_scheduled`). So an idle group is not read per pass,
    nor every half window.
    """
    half_window = dispatcher.horizon_ms // 2
    index = runtime.index
    max_items = dispatcher.group_horizon_items()
    # A group loaded while fewer groups shared the node's horizon gives back what is
    # past its share now (in chunks: the entries stay on disk, a refill reads them).
    for _ in range(min(REFILL_CHUNK_ITEMS, len(index) - max_items)):
        last_due, last_mid = index.pop_last()
        runtime.loaded_until = pack(last_due, last_mid)
    half_full = max(1, (max_items + 1) // 2)
    if len(index) >= half_full:
        return math.inf  # deliveries shrink the index; a later pass refills
    due_bound, _ = unpack(runtime.loaded_until)
    if due_bound - half_window > now_ms:
        return float(due_bound - half_window)
    horizon_end = pack(now_ms + dispatcher.horizon_ms, 0)
    gid = runtime.info.group_id
    start_due, start_mid = unpack(runtime.loaded_until)
    limit = min(REFILL_CHUNK_ITEMS, max_items - len(index))
    count = 0
    last = runtime.loaded_until
    in_flight = dispatcher.hub.in_flight
    purged = dispatcher.state.purged_below(gid)
    hub = dispatcher.hub
    for due_ms, mid, attempt, expire_ms, released, held in dispatcher.state.scan_schedule_entries(
        gid, start_due, start_mid, limit
    ):
        packed = pack(due_ms, mid)
        if packed >= horizon_end:
            # The rest is beyond the horizon: look again before this one is due.
            runtime.loaded_until = horizon_end
            return float(max(now_ms + half_window, due_ms - half_window))
        count += 1
        last = packed
        if mid < purged:
            continue  # a PURGE's: its chunks remove it
        key = commands.schedule_key(gid, due_ms, mid)
        if key not in in_flight and packed not in index:
            if held is not None and held[1] > now_ms:
                # Out when the leader before handed over: still out until its deadline,
                # and its tag still settles it (docs/protocol.md, "Delivery tags across
                # leaders").
                hub.hold(key, due_ms, mid, expire_ms, attempt, released, held)
                continue
            if released:
                runtime.released[mid] = released
            index.add(due_ms, mid, expire_ms, attempt)
    if count >= limit:
        runtime.loaded_until = last + 1
        return float(now_ms)  # a full chunk: read the next one on the next pass
    runtime.loaded_until = horizon_end
    return math.inf


def deliver(
    dispatcher: Dispatcher,
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
    purged = dispatcher.state.purged_below(gid)
    released_counts = runtime.released
    hub = dispatcher.hub
    salt = hub.tag_salt
    staged_any = False
    # Round-robin: each round gives every consumer with credit an equal share of
    # what is due (one DELIVER frame each), so a group's consumers split the work.
    # No more consumers than entries due: each gets at least one.
    consumers = runtime.consumers_with_credit(index.count_due(now_ms))
    skipped = 0  # entries of a purge dropped: they cost the pass's budget too
    while consumers and delivered + skipped < budget:
        due_now = index.count_due(now_ms)
        if due_now == 0:
            break
        share = max(1, min(dispatcher.batch_items, -(-due_now // len(consumers))))
        for consumer in consumers:
            # Never past the budget: it carries the node's room for deliveries out.
            left = budget - delivered - skipped
            if left < 1:
                break
            # Nor past its own room (credit, and limits.max_prefetch out at once), nor
            # past the connection's (limits.max_prefetch_per_connection).
            own = consumer.room()
            if own < 1:
                runtime.ready.pop(consumer, None)  # back once one of its own drops
                continue
            wanted = int(min(own, share, left, hub.room_for(consumer)))
            if wanted < 1:
                hub.skip_capped(consumer, runtime)
                continue
            entries = index.pop_due(now_ms, wanted)
            if not entries:
                break
            deliveries: list[list[Any]] = []
            flights: list[InFlight] = []
            frame_bytes = 0
            for position, (due_ms, mid, expire_ms, previous) in enumerate(entries):
                if frame_bytes >= dispatcher.max_deliver_bytes:
                    # Keep DELIVER frames under the frame limit: the rest waits.
                    for due_later, mid_later, expire_later, attempt_later in entries[position:]:
                        index.add(due_later, mid_later, expire_later, attempt_later)
                    break
                if mid < purged:
                    # Loaded before the PURGE applied: the purge's, not a consumer's
                    # (else the credit its REVOKE gave back went to the next of them).
                    skipped += 1
                    continue
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
                message = dispatcher.state.get_message(mid)
                if message is None:  # removed by a command applied meanwhile
                    continue
                _topic, payload, publish_ms, _due, _open = message
                record = dispatcher.state.get_record(mid) if consumer.headers else None
                item_bytes = len(payload) + DELIVERY_FIELD_BYTES
                if record is not None and record.headers:
                    item_bytes += DELIVERY_HEADER_BYTES
                if deliveries and frame_bytes + item_bytes > dispatcher.max_deliver_bytes:
                    # Checked before adding it: the frame's last delivery once took a
                    # DELIVER past max_frame_bytes (its payload near the limit).
                    for due_later, mid_later, expire_later, attempt_later in entries[position:]:
                        index.add(due_later, mid_later, expire_later, attempt_later)
                    break
                frame_bytes += item_bytes
                item = [
                    commands.delivery_tag(key, attempt, salt),
                    mid,
                    payload,
                    due_ms,
                    publish_ms,
                    attempt,
                ]
                if consumer.headers:  # asked for in SUBSCRIBE (issue 14)
                    item.append(None if record is None else record.headers)
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
                dispatcher.hub.track(flight)
            # First deliveries go out now; redeliveries once their attempt is
            # committed (see the module docstring for why, and what it costs).
            first = [i for i, flight in enumerate(flights) if flight.attempt == 1]
            if first:
                now_batch = Staged(
                    consumer, [flights[i] for i in first], [deliveries[i] for i in first]
                )
                dispatcher.push_staged([now_batch], pass_now_ms=now_ms)
            if len(first) < len(flights):
                later = [i for i, flight in enumerate(flights) if flight.attempt > 1]
                dispatcher._staged.append(
                    Staged(consumer, [flights[i] for i in later], [deliveries[i] for i in later])
                )
                staged_any = True
        consumers = [c for c in consumers if c.may_receive() and hub.room_for(c) > 0]
    if staged_any:
        dispatcher._staged_changed.set()
    return delivered
