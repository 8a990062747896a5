"""Managing scheduled messages on the leader (issue 14): the requests that cancel,
reschedule, browse, purge and redrive what is waiting.

Each function validates a request against the leader's state, resolves names to the
ids the log uses (a group name to its group id) and proposes one replicated command
(:mod:`futureq.state.commands`), so every replica applies the same change
(``DESIGN.md``, "Data flow"). Bad input fails the request alone with a stable error
code and a sentence (``docs/protocol.md``, "Error codes").

Source: ``docs/protocol.md``, "CANCEL", "BROWSE", "REDRIVE", "RESCHEDULE", "PURGE".
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any, Final

import trio.lowlevel

from futureq import request_order
from futureq.errors import ErrorCode, NotLeaderError, RequestError, WrongShardError
from futureq.state import commands
from futureq.state.model import DLQ_SUFFIX
from futureq.state.records import PARKED_DUE_MS
from futureq.wire import frames, validation

if TYPE_CHECKING:
    from futureq.broker.broker import Broker
    from futureq.state.model import GroupInfo

MAX_BROWSE_LIMIT: Final = 1000
"""Most messages one BROWSE page holds."""
MAX_PREVIEW_BYTES: Final = 1024
"""Most payload bytes a BROWSE shows per message (``limit`` x this stays under the
smallest frame limit a server may run with)."""
MAX_COUNT_BOUNDS: Final = 32
"""Most bucket bounds one BROWSE_COUNTS names."""
MAX_COUNTED_ENTRIES: Final = 200_000
"""Most schedule keys one BROWSE_COUNTS reads; beyond it the answer is incomplete
(a lower bound where it stopped)."""
COUNT_CHUNK_ENTRIES: Final = 8192
"""Keys BROWSE_COUNTS reads between two yields to the event loop (the scan fallback)."""
COUNT_BUILD_WAIT_S: Final = 10.0
"""Longest a BROWSE_COUNTS waits for its group's due-time histogram to be built (s);
past it, it answers from a bounded scan instead (the build goes on with the next)."""


MAX_BROWSE_SKIPPED: Final = 20_000
"""Most entries of a running PURGE one BROWSE page looks past (keys only); past it the
page ends early, with a ``next_cursor``."""


def check_ids(broker: Broker, request: str, ids: list[int]) -> None:
    """Refuse an empty or oversized batch of message ids, or one that is not an id.

    Raises:
        RequestError: EMPTY_BATCH, BATCH_TOO_LARGE, INVALID_MESSAGE_ID (with the item).
    """
    if not ids:
        raise RequestError(
            ErrorCode.EMPTY_BATCH, f"{request} names no message ids; send at least one"
        )
    limit = broker.limits.max_batch_items
    if len(ids) > limit:
        raise RequestError(
            ErrorCode.BATCH_TOO_LARGE,
            f"{request} names {len(ids)} message ids; the limit is {limit} per request "
            "(limits.max_batch_items): split it",
        )
    for position, mid in enumerate(ids):
        if not 0 <= mid <= frames.MAX_MESSAGE_ID:
            raise RequestError(
                ErrorCode.INVALID_MESSAGE_ID,
                f"ids[{position}] = {mid} is not a message id (an integer in [0, 2**64-1], "
                "as PUBLISH_OK gives them)",
                item_index=position,
            )


def _unknown_topic(request: str, topic: str, group: str | None) -> RequestError:
    """UNKNOWN_TOPIC for a topic this node holds no group of.

    Raises:
        RequestError: INVALID_TOPIC or INVALID_GROUP first, for names none can have.
    """
    validation.check_names_can_exist(topic, group)
    return RequestError(
        ErrorCode.UNKNOWN_TOPIC,
        f"{request}: topic {topic!r} has no consumer group, so no message of it is pending",
    )


def target_groups(broker: Broker, request: str, topic: str, group: str | None) -> GroupInfo | None:
    """The group a by-id request names (None: every group of ``topic``).

    Raises:
        RequestError: UNKNOWN_TOPIC (the topic has no group), UNKNOWN_GROUP.
    """
    state = broker.state
    if not state.topic_groups_count(topic):
        raise _unknown_topic(request, topic, group)
    if group is None:
        return None
    info = state.find_group(topic, group)
    if info is None:
        validation.check_name("group", group)
        raise RequestError(
            ErrorCode.UNKNOWN_GROUP,
            f"{request}: topic {topic!r} has no group {group!r} (leave the group out to "
            "act on every group of the topic)",
        )
    return info


def _out_deliveries(
    broker: Broker, topic: str, info: GroupInfo | None, ids: list[int]
) -> list[tuple[bytes, int]]:
    """Deliveries of ``ids`` (in ``info``'s group, or every group of ``topic``) that the
    leader knows went out and the log may not have recorded, for a CANCEL or RESCHEDULE
    command to carry (:meth:`~futureq.broker.dispatcher.Dispatcher.out_deliveries`)."""
    groups = broker.state.topic_groups(topic) if info is None else [info]
    return broker.dispatcher.out_deliveries([group.group_id for group in groups], ids)


async def cancel(broker: Broker, topic: str, group: str | None, ids: list[int]) -> list[int]:
    """Cancel scheduled messages by id, in one group of ``topic`` or in all of them.

    O(log n) per id (the message record, then its entry, found through the ``index``
    family where it moved). A message in flight is cancelled too: its delivery's ACK
    then finds nothing.

    Returns:
        One :class:`~futureq.wire.frames.ItemStatus` number per id, in order: DONE,
        DELIVERED (removed, but delivered at least once) or UNKNOWN.

    Raises:
        RequestError: as :func:`check_ids` and :func:`target_groups`.
        NotLeaderError: this node is not the leader.
    """
    broker.require_leader()
    check_ids(broker, "CANCEL", ids)
    info = target_groups(broker, "CANCEL", topic, group)
    groups = broker.state.topic_groups(topic) if info is None else [info]
    bounds = {group.group_id: broker.state.purged_below(group.group_id) for group in groups}
    if not any(bounds.values()):
        out = _out_deliveries(broker, topic, info, ids)
        result = await broker.log.propose(
            commands.cancel(topic, None if info is None else info.group_id, ids, out)
        )
        return [int(status) for status in result]
    # A PURGE answered before removes some of these groups' entries by chunks: what
    # its chunks have not reached yet is gone all the same (UNKNOWN, as a REDRIVE
    # answers), not cancelled (found by a tester: CANCEL answered DONE for messages
    # already purged). So each group gets a command naming only the ids it still
    # holds, and the answers merge as one command's would: DELIVERED from any group,
    # else DONE from any, else UNKNOWN.
    merged = [int(frames.ItemStatus.UNKNOWN)] * len(ids)
    for group_info in groups:
        bound = bounds[group_info.group_id]
        positions = [position for position, mid in enumerate(ids) if mid >= bound]
        if not positions:
            continue
        kept = [ids[position] for position in positions]
        out = _out_deliveries(broker, topic, group_info, kept)
        result = await broker.log.propose(commands.cancel(topic, group_info.group_id, kept, out))
        for position, status in zip(positions, result, strict=True):
            merged[position] = _merge_status(merged[position], int(status))
    return merged


def _merge_status(first: int, second: int) -> int:
    """One id's CANCEL answer from two groups: DELIVERED, else DONE, else UNKNOWN."""
    for status in (frames.ItemStatus.DELIVERED, frames.ItemStatus.DONE):
        if status in (first, second):
            return int(status)
    return int(frames.ItemStatus.UNKNOWN)


def browse_group(
    broker: Broker, topic: str, group: str | None, request: str = "BROWSE"
) -> GroupInfo:
    """The group a BROWSE reads: the named one, or the topic's only group.

    Raises:
        RequestError: UNKNOWN_TOPIC, UNKNOWN_GROUP, GROUP_REQUIRED (the topic has
            several groups and none was named).
    """
    state = broker.state
    groups = state.topic_groups(topic)
    if not groups:
        raise _unknown_topic(request, topic, group)
    if group is None:
        if len(groups) > 1:
            names = ", ".join(repr(info.name) for info in groups[:10])
            raise RequestError(
                ErrorCode.GROUP_REQUIRED,
                f"{request}: topic {topic!r} has {len(groups)} groups ({names}); name one",
            )
        return groups[0]
    info = state.find_group(topic, group)
    if info is None:
        validation.check_name("group", group)
        raise RequestError(
            ErrorCode.UNKNOWN_GROUP, f"{request}: topic {topic!r} has no group {group!r}"
        )
    return info


BROWSE_ITEM_OVERHEAD_BYTES: Final = 64
"""Bytes a BROWSE_OK message costs beyond its headers and preview (ids, times, array)."""


def browse_item_bytes(headers: dict[str, str] | None, preview: bytes | None) -> int:
    """An upper bound on one BROWSE_OK message's encoded size (bytes): its preview, its
    headers' UTF-8 names and values (plus 10 bytes each for their msgpack prefixes) and
    :data:`BROWSE_ITEM_OVERHEAD_BYTES`."""
    size = BROWSE_ITEM_OVERHEAD_BYTES + (0 if preview is None else len(preview))
    for name, value in (headers or {}).items():
        size += len(name.encode()) + len(value.encode()) + 10
    return size


async def browse(broker: Broker, frame: frames.Browse) -> frames.BrowseOk:
    """Serve a BROWSE: one page of a group's pending messages, claiming none.

    Linearizable (a read barrier first: everything acknowledged before is seen) and
    O(page) whatever the backlog (:meth:`~futureq.state.queue_state.QueueState.browse`).
    A page also ends once its messages fill half of ``limits.max_frame_bytes`` (fewer
    than ``limit``, with a ``next_cursor``), so it always fits in a frame.
    Nothing is written and no delivery is made: a group browsed is not created,
    adopted or claimed.

    Raises:
        RequestError: as :func:`browse_group`; INVALID_ARGUMENT (``limit``,
            ``preview_bytes``, a time range: negative, reversed or past 2**63-2),
            IMPLAUSIBLE_TIME (``from_due_ms``/``to_due_ms`` after 0 and before 2000, so
            seconds, or past the year 5138, so micro- or nanoseconds: the same rule as
            PUBLISH's ``deliver_at_ms``), INVALID_CURSOR.
        NotLeaderError: this node is not the leader.
    """
    broker.require_leader()
    if not 1 <= frame.limit <= MAX_BROWSE_LIMIT:
        raise RequestError(
            ErrorCode.INVALID_ARGUMENT,
            f"BROWSE limit must be between 1 and {MAX_BROWSE_LIMIT} messages, got {frame.limit}",
        )
    if not 0 <= frame.preview_bytes <= MAX_PREVIEW_BYTES:
        raise RequestError(
            ErrorCode.INVALID_ARGUMENT,
            f"BROWSE preview_bytes must be between 0 and {MAX_PREVIEW_BYTES}, got "
            f"{frame.preview_bytes}",
        )
    for name, bound in (("from_due_ms", frame.from_due_ms), ("to_due_ms", frame.to_due_ms)):
        if bound is not None and 0 <= bound < PARKED_DUE_MS:
            mistake = validation.implausible_epoch_ms(name, bound)
            if mistake is not None:  # seconds (or micro-, nanoseconds) taken for ms
                raise RequestError(ErrorCode.IMPLAUSIBLE_TIME, f"BROWSE {mistake}")
    from_due_ms = 0 if frame.from_due_ms is None else frame.from_due_ms
    if not 0 <= from_due_ms < PARKED_DUE_MS or (
        frame.to_due_ms is not None and not from_due_ms <= frame.to_due_ms < PARKED_DUE_MS
    ):
        raise RequestError(
            ErrorCode.INVALID_ARGUMENT,
            f"BROWSE wants 0 <= from_due_ms <= to_due_ms < 2**63-1 (ms since the Unix "
            f"epoch; either may be left out), got from "
            f"{'(none)' if frame.from_due_ms is None else frame.from_due_ms} to "
            f"{'(none)' if frame.to_due_ms is None else frame.to_due_ms}",
        )
    await broker.log.read_barrier()
    broker.require_leader()
    info = browse_group(broker, frame.topic, frame.group)
    cursor = frame.cursor
    if cursor is not None and (
        len(cursor) != commands.SCHEDULE_KEY_BYTES
        or commands.parse_schedule_key(cursor)[0] != info.group_id
    ):
        raise RequestError(
            ErrorCode.INVALID_CURSOR,
            f"BROWSE cursor is not one this group's BROWSE_OK gave ({len(cursor)} bytes); "
            "send the next_cursor of the previous page unchanged, or nil to start over",
        )
    # A PURGE answered before: what its chunks have not removed yet is gone all the
    # same (found by a tester: BROWSE still listed purged messages).
    page, next_key = broker.state.browse(
        info.group_id,
        from_due_ms,
        frame.to_due_ms,
        cursor,
        frame.limit,
        broker.state.purged_below(info.group_id),
        MAX_BROWSE_SKIPPED,
    )
    # A first delivery goes out unrecorded (and one given back is recorded a moment
    # later): the leader's own knowledge counts too, so "0" means never delivered.
    out = dict(
        broker.dispatcher.out_deliveries(
            [info.group_id], [commands.parse_schedule_key(key)[2] for key, _, _ in page]
        )
    )
    messages: list[list[Any]] = []
    # A page ends by bytes too, well below the frame limit (as DELIVER frames do): a
    # full page of messages with large headers would not fit in one frame.
    room = broker.config.limits.max_frame_bytes // 2
    for key, entry, record in page:
        _, due_ms, mid = commands.parse_schedule_key(key)
        preview = record.payload[: frame.preview_bytes] if frame.preview_bytes else None
        size = browse_item_bytes(record.headers, preview)
        if messages and size > room:
            next_key = page[len(messages) - 1][0]  # the next page starts after it
            break
        room -= size
        messages.append(
            [
                mid,
                None if due_ms == PARKED_DUE_MS else due_ms,
                max(entry.attempt, out.get(key, 0)),
                len(record.payload),
                record.headers,
                preview,
                entry.expire_ms,
            ]
        )
    return frames.BrowseOk(frame.request_id, info.name, messages, next_key)


async def browse_counts(broker: Broker, frame: frames.BrowseCounts) -> frames.BrowseCountsOk:
    """Serve a BROWSE_COUNTS: how many of a group's pending entries fall due in each
    bucket, claiming none.

    A read barrier first (everything acknowledged before is counted), then the
    group's due-time histogram (:mod:`futureq.broker.due_counts`, node-local, built on
    the first request in chunks that yield, then kept up to date by the state
    machine's callbacks): whole minutes inside each bucket are summed from it, and the
    minute each bound falls in is counted exactly by a short key scan. Cost
    O(bounds x (days + 84)) plus the edge minutes' keys, whatever the backlog; exact
    unless a bound falls inside a minute holding more than
    :data:`~futureq.broker.due_counts.EDGE_SCAN_KEYS` entries on each side of it.
    What is due after the last bound (parked dead letters included) is the group's
    pending count minus the buckets. Entries in flight count where they are due (they
    are pending until acked). If the histogram is not built within
    :data:`COUNT_BUILD_WAIT_S`, the answer comes from a scan of at most
    :data:`MAX_COUNTED_ENTRIES` keys, as :func:`scan_counts`.

    Raises:
        RequestError: INVALID_ARGUMENT (no bounds, too many, not strictly increasing,
            out of range), IMPLAUSIBLE_TIME (an absolute bound in seconds or
            microseconds), as :func:`browse_group`, CLOCK_NOT_SYNCHRONIZED (relative).
        NotLeaderError: this node is not the leader.
    """
    broker.require_leader()
    bounds = list(frame.bounds_ms)
    if not 1 <= len(bounds) <= MAX_COUNT_BOUNDS:
        raise RequestError(
            ErrorCode.INVALID_ARGUMENT,
            f"BROWSE_COUNTS wants 1 to {MAX_COUNT_BOUNDS} bucket bounds, got {len(bounds)}",
        )
    for position in range(1, len(bounds)):
        if bounds[position] <= bounds[position - 1]:
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT,
                f"BROWSE_COUNTS bounds_ms must be strictly increasing: bounds_ms[{position}] = "
                f"{bounds[position]} is not after {bounds[position - 1]}",
            )
    if not frame.relative:
        for position, bound in enumerate(bounds):
            if not 0 <= bound < PARKED_DUE_MS:
                break  # out of range: INVALID_ARGUMENT below
            mistake = validation.implausible_epoch_ms(f"bounds_ms[{position}]", bound)
            if mistake is not None:  # seconds (or microseconds) taken for ms
                raise RequestError(ErrorCode.IMPLAUSIBLE_TIME, f"BROWSE_COUNTS {mistake}")
    await broker.log.read_barrier()
    broker.require_leader()
    info = browse_group(broker, frame.topic, frame.group, "BROWSE_COUNTS")
    # Each sentence quotes a bound as it was sent (found by a tester: a relative bound
    # was reported with "now" already added to it).
    last = len(bounds) - 1
    if frame.relative:
        now_ms = broker.stamp()
        if bounds[0] < 0:
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT,
                f"BROWSE_COUNTS bounds_ms[0] = {bounds[0]}: relative bounds are ms from now, "
                "so >= 0; send 0 or more",
            )
        latest = PARKED_DUE_MS - 1 - now_ms
        if bounds[last] > latest:
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT,
                f"BROWSE_COUNTS bounds_ms[{last}] = {bounds[last]} ms from now "
                f"({validation.readable_ms(bounds[last])}) ends after the last time a "
                f"message can be due (2**63-2 ms since the Unix epoch); send at most "
                f"{latest} ms (a bound past every due time counts what `later` counts)",
            )
        bounds = [now_ms + b for b in bounds]
    else:
        for position in (0, last):
            if not 0 <= bounds[position] < PARKED_DUE_MS:
                raise RequestError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"BROWSE_COUNTS bounds_ms[{position}] = {bounds[position]} is not a time "
                    "in [0, 2**63-1) ms since the Unix epoch; send one, or ms from now "
                    "with relative",
                )
    due_counts = broker.due_counts
    group_id = info.group_id
    if broker.state.purged_below(group_id):
        # The histogram counts what a running PURGE's chunks have not removed yet;
        # the scan leaves those out (found by a tester: counts included them).
        return await scan_counts(broker, frame.request_id, info, bounds)
    histogram = None
    with trio.move_on_after(COUNT_BUILD_WAIT_S):
        histogram = await due_counts.histogram(group_id)
    broker.require_leader()
    info = browse_group(broker, frame.topic, frame.group)
    if histogram is None or info.group_id != group_id or broker.state.purged_below(group_id):
        return await scan_counts(broker, frame.request_id, info, bounds)
    counts: list[int | None] = []
    previous = 0
    exact = True
    # Edge minutes of many bounds may each hold up to 2 x EDGE_SCAN_KEYS keys: bounded.
    with trio.move_on_after(COUNT_BUILD_WAIT_S) as scope:
        for bound in bounds:
            below, exact = await due_counts.count_below(group_id, histogram, bound)
            # A scan that yielded sees its bucket as it was then: never below zero.
            counts.append(max(0, below - previous))
            previous = max(previous, below)
            if not exact:
                break
    broker.require_leader()
    if scope.cancelled_caught or not exact:
        counts += [None] * (len(bounds) - len(counts))
        return frames.BrowseCountsOk(frame.request_id, info.name, bounds, counts, None, False)
    later = max(0, info.pending - previous)
    return frames.BrowseCountsOk(frame.request_id, info.name, bounds, counts, later, True)


async def scan_counts(
    broker: Broker, request_id: int, info: GroupInfo, bounds: list[int]
) -> frames.BrowseCountsOk:
    """BROWSE_COUNTS by key-only range scans of the ``schedule`` family (no histogram).

    In chunks of :data:`COUNT_CHUNK_ENTRIES` that yield to the event loop in between,
    at most :data:`MAX_COUNTED_ENTRIES` keys in all: cost O(entries counted), bounded;
    past the limit the answer is incomplete (the last count a lower bound). While a
    PURGE of the group runs, the entries its chunks have not removed yet are read but
    not counted, and ``later`` is counted by scanning on to the group's end (the
    group's pending count still holds them).
    """
    group_id = info.group_id
    below_id = broker.state.purged_below(group_id)
    counts: list[int | None] = []
    budget = MAX_COUNTED_ENTRIES
    start: bytes | None = commands.schedule_key(group_id, 0, 0)
    buckets: list[int | None] = list(bounds)
    if below_id:
        buckets.append(None)  # ``later`` too: the pending count holds the purge's
    for bound in buckets:
        count = 0
        while start is not None and budget > 0:
            chunk, read, resume = broker.state.count_entries(
                group_id, start, bound, min(COUNT_CHUNK_ENTRIES, budget), below_id
            )
            count += chunk
            budget -= read
            if resume is None:
                # This bucket is done; the next one starts at this bound.
                start = None if bound is None else commands.schedule_key(group_id, bound, 0)
                break
            start = resume
            await trio.lowlevel.checkpoint()
            broker.require_leader()
        else:
            counts.append(count)
            counts = counts[: len(bounds)]
            counts += [None] * (len(bounds) - len(counts))
            return frames.BrowseCountsOk(request_id, info.name, bounds, counts, None, False)
        counts.append(count)
    if below_id:
        later = counts.pop()
    else:
        # Within a chunk nothing is applied; a count that took several chunks sees each
        # bucket as it was when read (a command applied in between may move an entry).
        counted = sum(c for c in counts if c is not None)
        later = max(0, info.pending - counted)
    return frames.BrowseCountsOk(request_id, info.name, bounds, counts, later, True)


def check_redrive_topic(topic: str) -> None:
    """Refuse a REDRIVE naming a dead-letter topic (it names the original topic).

    Raises:
        RequestError: RESERVED_TOPIC.
    """
    if topic.endswith(DLQ_SUFFIX):
        raise RequestError(
            ErrorCode.RESERVED_TOPIC,
            f"REDRIVE names the original topic, not its dead-letter topic: send "
            f"{topic.removesuffix(DLQ_SUFFIX)!r}, not {topic!r}",
        )


async def redrive(broker: Broker, frame: frames.Redrive) -> list[int]:
    """Move dead letters back to the topic and group they died in (by dead-letter id).

    Each becomes a new message of its original topic for its original group only,
    due ``delay_ms`` after the leader's stamp, keeping its headers (its provenance
    included) plus ``futureq-redriven-from``; its dead letter goes. One REDRIVE command
    for the batch (O(log n) per id to find its entry).

    Returns:
        One :class:`~futureq.wire.frames.ItemStatus` number per id: DONE, UNKNOWN (not
        a dead letter pending in that group), NO_TARGET (its group is gone; it stays).

    Raises:
        RequestError: RESERVED_TOPIC (``topic`` is itself a dead-letter topic: name
            the original topic), INVALID_DELAY, as :func:`check_ids` and
            :func:`browse_group` (of ``topic.dlq``).
        NotLeaderError: this node is not the leader.
    """
    broker.require_leader()
    check_redrive_topic(frame.topic)
    check_ids(broker, "REDRIVE", frame.ids)
    max_delay_ms = broker.limits.max_delay_ms
    if frame.delay_ms < 0:
        raise RequestError(
            ErrorCode.INVALID_DELAY, f"REDRIVE delay_ms is {frame.delay_ms}; it must be >= 0"
        )
    if frame.delay_ms > max_delay_ms:
        raise RequestError(
            ErrorCode.INVALID_DELAY,
            validation.over_limit(
                "REDRIVE delay_ms",
                frame.delay_ms,
                max_delay_ms,
                validation.MAX_DELAY_SETTING,
                "redrive sooner",
            ),
        )
    info = browse_group(broker, frame.topic + DLQ_SUFFIX, frame.group, "REDRIVE")
    state = broker.state
    # A PURGE answered before removes its dead letters in chunks: those its chunks have
    # not reached yet are gone all the same (UNKNOWN), never redriven (found by a tester:
    # they came back as new messages of the topic).
    bound = broker.state.purged_below(info.group_id)
    keys: list[bytes] = []
    positions: list[int] = []
    for position, mid in enumerate(frame.ids):
        key = None if mid < bound else state.entry_key(mid, info.group_id)
        if key is not None:
            keys.append(key)
            positions.append(position)
    results = [int(frames.ItemStatus.UNKNOWN)] * len(frame.ids)
    if keys:
        publish_ms = broker.stamp()
        # An ACK of one of these taken before the REDRIVE commits waits for it (it is
        # proposed after it); one proposed before applies first (UNKNOWN here).
        answered = trio.Event()
        for key in keys:
            broker.redriving[key] = answered
        try:
            applied = await broker.log.propose(
                commands.redrive(publish_ms, info.group_id, keys, publish_ms + frame.delay_ms)
            )
        except BaseException:
            # Cancelled with its connection, or failed with its outcome unknown: it may
            # still commit, so an ACK of these waits for a NOOP behind it.
            broker.redrives_unanswered.update(keys)
            raise
        finally:
            for key in keys:
                if broker.redriving.get(key) is answered:
                    del broker.redriving[key]
            answered.set()
        for position, status in zip(positions, applied, strict=True):
            results[position] = int(status)
    return results


async def reschedule(broker: Broker, frame: frames.Reschedule) -> list[int]:
    """Give pending messages a new due time by id, in one group of a topic or all.

    The leader resolves ``delay_ms`` against its stamp, so every replica moves them to
    the same time. Attempts are kept; a TTL counts from the new due time (as from a
    published due time: ``docs/protocol.md``, "Due time, TTL and expiry"). O(log n)
    per id. A parked dead letter rescheduled is delivered again at the new time.

    Returns:
        One :class:`~futureq.wire.frames.ItemStatus` number per id: DONE or UNKNOWN.

    Raises:
        RequestError: INVALID_DELAY (neither or both of ``due_ms`` and ``delay_ms``,
            or a negative one), DELAY_TOO_LARGE, IMPLAUSIBLE_TIME, as
            :func:`check_ids` and :func:`target_groups`.
        NotLeaderError: this node is not the leader.
    """
    broker.require_leader()
    check_ids(broker, "RESCHEDULE", frame.ids)
    if (frame.due_ms is None) == (frame.delay_ms is None):
        raise RequestError(
            ErrorCode.INVALID_DELAY,
            "RESCHEDULE takes exactly one of due_ms (ms since the Unix epoch) and delay_ms "
            "(ms from now)",
        )
    if (frame.due_ms is not None and frame.due_ms < 0) or (
        frame.delay_ms is not None and frame.delay_ms < 0
    ):
        raise RequestError(
            ErrorCode.INVALID_DELAY,
            f"RESCHEDULE due_ms and delay_ms must be >= 0, got due_ms={frame.due_ms}, "
            f"delay_ms={frame.delay_ms}",
        )
    if frame.due_ms is not None:
        mistake = validation.implausible_epoch_ms("due_ms", frame.due_ms)
        if mistake is not None:
            raise RequestError(ErrorCode.IMPLAUSIBLE_TIME, mistake)
    info = target_groups(broker, "RESCHEDULE", frame.topic, frame.group)
    now_ms = broker.stamp()
    if frame.due_ms is not None:
        due_ms = max(now_ms, frame.due_ms)  # a time passed means at once
    else:
        assert frame.delay_ms is not None
        due_ms = now_ms + frame.delay_ms
    max_delay_ms = broker.limits.max_delay_ms
    if due_ms - now_ms > max_delay_ms:
        raise RequestError(
            ErrorCode.DELAY_TOO_LARGE,
            validation.over_limit(
                "the due time RESCHEDULE gives",
                due_ms - now_ms,
                max_delay_ms,
                validation.MAX_DELAY_SETTING,
                "reschedule to an earlier time",
                from_now=True,
            ),
        )
    out = _out_deliveries(broker, frame.topic, info, frame.ids)
    state = broker.state
    backfilling = any(
        (group := state.groups.get(gid)) is not None and group.topic == frame.topic
        for gid in state.backfilling
    )
    command = commands.reschedule(
        now_ms,
        frame.topic,
        None if info is None else info.group_id,
        frame.ids,
        due_ms,
        out,
        backfilling,
    )
    # An ACK taken meanwhile may name an entry this moves: it follows the move (ACK_FOLLOWING).
    broker.reschedules_in_flight += 1
    try:
        # Its one proposal is its effect: a settlement sent behind it on the connection
        # is taken once it is queued, and follows the move like any other.
        with request_order.effect():
            result = await broker.log.propose(command)
    except BaseException:
        # Cancelled with its connection, or failed with its outcome unknown: it may
        # still commit, so the settlements taken next follow it too.
        broker.reschedule_unanswered()
        raise
    finally:
        broker.reschedules_in_flight -= 1
    return [int(status) for status in result]


async def purge(broker: Broker, frame: frames.Purge) -> int:
    """Start removing every message pending now in one group of a topic, or all.

    One PURGE command marks the groups; the dispatcher's reaper then removes their
    entries in chunks of a few hundred (PURGE_GROUP), so dispatch and heartbeats go on
    (``DESIGN.md``, "no request holds the event loop"). Messages published after the
    PURGE stay; a consumer's unacked deliveries of purged messages are void.

    Returns:
        How many entries the groups held when the purge started.

    Raises:
        RequestError: as :func:`target_groups`.
        NotLeaderError: this node is not the leader.
    """
    broker.require_leader()
    info = target_groups(broker, "PURGE", frame.topic, frame.group)
    groups = broker.state.topic_groups(frame.topic) if info is None else [info]
    result = await broker.log.propose(commands.purge([group.group_id for group in groups]))
    return int(result)


_BROWSE_PARAMETERS: Final = frozenset(
    {"topic", "group", "from_due_ms", "to_due_ms", "cursor", "limit", "preview_bytes"}
)


async def browse_json(broker: Broker, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """``/api/browse``: one BROWSE page as JSON, for the HTTP API (read-only).

    Query parameters as BROWSE's fields (``cursor`` in hex, ``limit`` default 100,
    ``preview_bytes`` default 0). A bad parameter or refused request is a 400 with
    ``{"code", "message"}``; a follower answers 503 with ``leader_address``.

    Returns:
        ``(HTTP status, body)``; on success ``{"group", "messages": [{"id", "due_ms",
        "attempt", "payload_bytes", "headers", "preview_base64", "expire_ms"}],
        "next_cursor"}``.
    """

    def bad(message: str) -> tuple[int, dict[str, Any]]:
        return 400, {"code": ErrorCode.INVALID_ARGUMENT.name, "message": message}

    unknown = sorted(set(query) - _BROWSE_PARAMETERS)
    if unknown:
        return bad(f"unknown parameters {unknown}; known: {sorted(_BROWSE_PARAMETERS)}")
    if not query.get("topic"):
        sent = "is empty" if "topic" in query else "is required"
        return bad(f"the topic parameter {sent}: /api/browse?topic=NAME")
    numbers: dict[str, int | None] = {}
    for name, default in (
        ("from_due_ms", None),
        ("to_due_ms", None),
        ("limit", 100),
        ("preview_bytes", 0),
    ):
        text = query.get(name)
        if text is None:
            numbers[name] = default
            continue
        try:
            numbers[name] = int(text)
        except ValueError:
            fix = "" if default is None else f" (or leave it out for {default})"
            return bad(f"{name} must be an integer, got {name}={text[:80]!r}{fix}")
    cursor = None
    if query.get("cursor"):
        try:
            cursor = bytes.fromhex(query["cursor"])
        except ValueError:
            return 400, {
                "code": ErrorCode.INVALID_CURSOR.name,
                "message": f"cursor={query['cursor'][:80]!r} is not hex: send the next_cursor "
                "of the previous page unchanged, or leave cursor out to start over",
            }
    frame = frames.Browse(
        0,
        query["topic"],
        query.get("group"),
        numbers["from_due_ms"],
        numbers["to_due_ms"],
        cursor,
        numbers["limit"] or 0,
        numbers["preview_bytes"] or 0,
    )
    misdirected = _other_shards_topic(broker, frame)
    if misdirected is not None:
        return misdirected
    try:
        page = await browse(broker, frame)
    except RequestError as error:
        return _refusal_json(error)
    return 200, {
        "group": page.group,
        "messages": [
            {
                "id": m[0],
                "due_ms": m[1],
                "attempt": m[2],
                "payload_bytes": m[3],
                "headers": m[4] or {},
                "preview_base64": None if m[5] is None else base64.b64encode(m[5]).decode(),
                "expire_ms": m[6],
            }
            for m in page.messages
        ],
        "next_cursor": None if page.next_cursor is None else page.next_cursor.hex(),
    }


def _other_shards_topic(
    broker: Broker, frame: frames.Browse | frames.BrowseCounts
) -> tuple[int, dict[str, Any]] | None:
    """On a shard's own HTTP port, a topic another shard of the node owns: 421
    (Misdirected Request) with ``{"code": "WRONG_SHARD", "message", "shard"}``, the
    message naming the owner and where to ask (the node's HTTP port routes
    ``/api/browse`` to the topic's shard). A name no shard takes: 400, as its owner
    would answer. None: this shard's topic, or a node of one shard.

    Before, shard 1's port answered a topic of shard 0 as its own: ``400
    UNKNOWN_TOPIC ... has no consumer group, so no message of it is pending`` about a
    topic whose messages were pending on shard 0 (over the wire, BROWSE is refused
    with WRONG_SHARD).
    """
    shard = broker.shard
    if shard is None:
        return None
    from futureq.shards.layout import shift_address

    from .shard_requests import check_shard

    try:
        check_shard(shard, frame)
    except WrongShardError:
        owner = shard.slot_map.shard_of(frame.topic)
        here = broker.config.server.http
        there = shift_address(here, (owner - shard.index) * shard.port_stride)
        node = shift_address(here, -shard.index * shard.port_stride)
        also = "" if owner == 0 else f", or shard {owner}'s ({there})"
        return 421, {
            "code": ErrorCode.WRONG_SHARD.name,
            "message": f"topic {frame.topic!r} belongs to shard {owner} of this node, and "
            f"this port ({here}) is shard {shard.index}'s own: ask the node's HTTP port "
            f"({node}), which answers for every shard{also}",
            "shard": owner,
        }
    except RequestError as error:
        return _refusal_json(error)
    return None


def _refusal_json(error: RequestError) -> tuple[int, dict[str, Any]]:
    """A refused read-only request as HTTP: 503 with the leader's address on a
    follower (NOT_LEADER), else 400 with ``{"code", "message"}``."""
    if isinstance(error, NotLeaderError):
        return 503, {
            "code": error.code.name,
            "message": error.message,
            "leader_address": error.leader_address,
        }
    return 400, {"code": error.code.name, "message": error.message}


_COUNTS_PARAMETERS: Final = frozenset({"topic", "group", "bounds_ms", "relative"})


async def browse_counts_json(broker: Broker, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """``/api/browse/counts``: one BROWSE_COUNTS as JSON, for the HTTP API (read-only).

    Query parameters: ``topic`` (required), ``group``, ``bounds_ms`` (comma-separated
    integers, required) and ``relative`` (``true``: bounds are ms from now; default
    ``false``). A bad parameter or refused request is a 400 with ``{"code",
    "message"}``; a follower answers 503 with ``leader_address``.

    Returns:
        ``(HTTP status, body)``; on success ``{"group", "bounds_ms", "counts", "later",
        "complete"}`` as BROWSE_COUNTS_OK.
    """

    def bad(message: str) -> tuple[int, dict[str, Any]]:
        return 400, {"code": ErrorCode.INVALID_ARGUMENT.name, "message": message}

    unknown = sorted(set(query) - _COUNTS_PARAMETERS)
    if unknown:
        return bad(f"unknown parameters {unknown}; known: {sorted(_COUNTS_PARAMETERS)}")
    if not query.get("topic"):
        sent = "is empty" if "topic" in query else "is required"
        return bad(f"the topic parameter {sent}: /api/browse/counts?topic=NAME&bounds_ms=...")
    # Each sentence quotes what was sent (found by a tester: an empty bounds_ms= was
    # "got None").
    bounds_text = query.get("bounds_ms")
    example = "e.g. bounds_ms=60000,3600000&relative=true for the next minute and hour"
    if bounds_text is None:
        return bad(
            f"the bounds_ms parameter is required: 1 to {MAX_COUNT_BOUNDS} "
            f"comma-separated integers (ms), {example}"
        )
    if not bounds_text.strip():
        return bad(
            f"bounds_ms is empty (bounds_ms={bounds_text}); give 1 to "
            f"{MAX_COUNT_BOUNDS} comma-separated integers (ms), {example}"
        )
    bounds: list[int] = []
    for position, text in enumerate(bounds_text.split(",")):
        try:
            bounds.append(int(text))
        except ValueError:
            return bad(
                f"bounds_ms={bounds_text!r}: item {position} ({text.strip()!r}) is not an "
                f"integer; give comma-separated integers (ms), {example}"
            )
    relative_text = query.get("relative", "false").lower()
    if relative_text not in ("true", "false", "1", "0"):
        return bad(f"relative must be true or false, got {query['relative']!r}")
    frame = frames.BrowseCounts(
        0, query["topic"], query.get("group"), bounds, relative_text in ("true", "1")
    )
    misdirected = _other_shards_topic(broker, frame)
    if misdirected is not None:
        return misdirected
    try:
        answer = await browse_counts(broker, frame)
    except RequestError as error:
        return _refusal_json(error)
    return 200, {
        "group": answer.group,
        "bounds_ms": answer.bounds_ms,
        "counts": answer.counts,
        "later": answer.later,
        "complete": answer.complete,
    }
