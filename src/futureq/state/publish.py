"""Applying PUBLISH: storing a batch's messages and scheduling them for each group.

Plain functions over a :class:`~futureq.state.queue_state.QueueState`, called by its
``apply_steps``: the item loop (:func:`publish`), the faster path for batches without
TTL, headers or idempotency keys (:func:`publish_plain`, which must leave the same
bytes, digest and observer calls as the loop), and finding, or creating implicitly, the
groups of a topic (:func:`group_targets`). Like all of apply it reads nothing
node-local: ``publish_ms`` comes stamped in the command.

Source: ``DESIGN.md``, "Message semantics"; ``docs/protocol.md`` (PUBLISH).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator, Iterable
from itertools import repeat
from operator import add
from typing import TYPE_CHECKING, Any, Final

from futureq.state import commands, group_changes, records
from futureq.state.layout import (
    _DUE,
    _ID_KEY,
    _NEW_ENTRY,
    _PAYLOAD,
    _SCHEDULE_KEY,
    _TOPIC,
    _TTL,
    _encode,
)
from futureq.state.model import (
    APPLY_STEP_ITEMS,
    DEFAULT_GROUP,
    GroupInfo,
    Txn,
)

NEW_TOPIC_WORK: Final = 7
"""A topic first seen in a batch counts as this many items of work (its group lookup)."""


if TYPE_CHECKING:
    from futureq.state.queue_state import QueueState


def publish(
    state: QueueState,
    txn: Txn,
    index: int,
    publish_ms: int,
    items: list[list[Any]],
    effects: list[tuple[Any, ...]],
    touched: set[int],
    settings: commands.GroupSettings,
    window_ms: int = 0,
    duplicates: dict[int, int] | None = None,
) -> Generator[None, None, int]:
    """Store a batch of items (``[topic, payload, due_ms, ttl_ms, headers?, key?]``)
    as messages ``message_id(index, position)``, each for every group of its topic.

    An item whose idempotency key still names a message is not stored; its
    position maps to that message's id in ``duplicates``.
    """
    assert len(items) <= commands.MAX_BATCH_POSITIONS
    state._note_publish_ms(txn, publish_ms)
    first_id = commands.message_id(index, 0)
    if max(map(len, items), default=0) == 4:
        plain = plain_targets(state, items)
        if plain is not None:
            yield from publish_plain(
                state, txn, first_id, publish_ms, items, plain, effects, touched
            )
            if window_ms:
                yield from state._prune_idempotency_keys(txn, publish_ms, window_ms)
            return first_id
    targets: dict[str, list[GroupInfo]] = {}
    # Every other batch (new topics, fan-out, headers, keys, dead letters): one pass,
    # every per-message cost inlined (the record, the entry keys, the effects),
    # group counters added once per batch.
    messages = txn.changes["messages"]
    schedule = txn.changes["schedule"]
    schedule_key = commands.pack_schedule_key
    encode_message = records.encode_message
    append = effects.append
    stored: dict[int, int] = {}
    work = 0
    for position, item in enumerate(items):
        work += 1
        if work >= APPLY_STEP_ITEMS:
            work = 0
            yield
        topic = item[0]
        mid = first_id + position
        extra = len(item) > 4
        if extra and len(item) > 5 and item[5] is not None:
            original = state._claim_idempotency_key(txn, topic, item[5], mid, publish_ms, window_ms)
            if original is not None:
                if duplicates is not None:
                    duplicates[position] = original
                continue
        groups = targets.get(topic)
        if groups is None:
            groups = targets[topic] = group_targets(state, txn, topic, settings, effects)
            for info in groups:
                stored.setdefault(info.group_id, 0)
            work += NEW_TOPIC_WORK
        due_ms = item[2]
        ttl_ms = item[3]
        if ttl_ms is None:
            expire_ms = None
            value = _NEW_ENTRY
        else:
            expire_ms = due_ms + ttl_ms
            value = _encode([0, expire_ms])
        headers = item[4] if extra else None
        if headers or ttl_ms is not None:
            record = encode_message(
                topic, item[1], publish_ms, due_ms, len(groups), headers or None, ttl_ms
            )
        else:  # records.encode_message's short form, without the call
            record = _encode([topic, item[1], publish_ms, due_ms, len(groups)])
        messages[mid.to_bytes(8, "big")] = record
        for info in groups:
            gid = info.group_id
            schedule[schedule_key(gid, due_ms, mid)] = value
            stored[gid] += 1
            append(("s", gid, due_ms, mid, expire_ms, 0))
    for groups in targets.values():
        for info in groups:
            count = stored[info.group_id]
            if count:
                info.pending += count
                state.total_pending += count
                touched.add(info.group_id)
    if window_ms:
        yield from state._prune_idempotency_keys(txn, publish_ms, window_ms)
    return first_id


def plain_targets(state: QueueState, items: list[list[Any]]) -> dict[str, GroupInfo] | None:
    """The one group of each topic of ``items``, or None when a topic has no group
    (it is created mid-batch) or several (fan-out), or the batch has so many topics
    that looking them all up would be more than a step's work: :func:`publish_plain`
    serves only batches whose items each make one schedule entry in a known group.
    """
    topics = set(map(_TOPIC, items))
    if len(topics) * NEW_TOPIC_WORK >= APPLY_STEP_ITEMS - 1:
        return None
    by_topic = state._by_topic
    groups = state.groups
    plain: dict[str, GroupInfo] = {}
    for topic in topics:
        names = by_topic.get(topic)
        if names is None or len(names) != 1:
            return None
        for gid in names.values():
            plain[topic] = groups[gid]
    return plain


def publish_plain(
    state: QueueState,
    txn: Txn,
    first_id: int,
    publish_ms: int,
    items: list[list[Any]],
    plain: dict[str, GroupInfo],
    effects: list[tuple[Any, ...]],
    touched: set[int],
) -> Generator[None, None, None]:
    """:func:`publish` of the common batch: items ``[topic, payload, due_ms,
    ttl_ms]`` (no headers, no idempotency key) whose topics each have one group.

    The same changes, in the same order, and the same effects as the item loop of
    :func:`publish` (so the same stored bytes and digest), but built a step's worth
    of items at a time by ``map`` and ``zip`` over C functions, without a Python
    statement per message (the loop was most of the apply's own time: bench.apply_cost).
    msgspec encodes the tuples ``zip`` makes as the lists the loop encodes. Steps
    end where the loop's would when every topic shows up in its first step (the
    loop counts :data:`NEW_TOPIC_WORK` for each topic's lookup, done here first).
    """
    messages = txn.changes["messages"]
    schedule = txn.changes["schedule"]
    gid_of = {topic: info.group_id for topic, info in plain.items()}
    only = next(iter(plain)) if len(plain) == 1 else None
    count = len(items)
    start = 0
    stop = max(1, APPLY_STEP_ITEMS - 1 - NEW_TOPIC_WORK * len(plain))
    while True:
        chunk = items[start:stop]
        topics: Iterable[str]
        gids: Iterable[int]
        if only is None:
            topics = list(map(_TOPIC, chunk))
            gids = list(map(gid_of.__getitem__, topics))
        else:  # one topic: no column of it to build (zip and map stop at the others')
            topics = repeat(only)
            gids = repeat(gid_of[only])
        dues = list(map(_DUE, chunk))
        ttls = list(map(_TTL, chunk))
        ids = range(first_id + start, first_id + start + len(chunk))
        payloads = map(_PAYLOAD, chunk)
        records: Iterable[tuple[Any, ...]]
        values: Iterable[bytes]
        expires: Iterable[int | None]
        without_ttl = ttls.count(None)
        if without_ttl == len(chunk):
            records = zip(topics, payloads, repeat(publish_ms), dues, repeat(1), strict=False)
            values = repeat(_NEW_ENTRY)
            expires = repeat(None)
        elif without_ttl == 0:  # records.encode_message's layout with a TTL
            records = zip(
                topics,
                payloads,
                repeat(publish_ms),
                dues,
                repeat(1),
                repeat(None),
                ttls,
                strict=False,
            )
            expires = list(map(add, dues, ttls))
            values = map(_encode, zip(repeat(0), expires, strict=False))
        else:  # some items with a TTL: per item, as the loop does
            expires = [
                None if ttl is None else due + ttl for due, ttl in zip(dues, ttls, strict=True)
            ]
            records = [
                (topic, payload, publish_ms, due, 1)
                if ttl is None
                else (topic, payload, publish_ms, due, 1, None, ttl)
                for topic, payload, due, ttl in zip(topics, payloads, dues, ttls, strict=False)
            ]
            values = [_NEW_ENTRY if at is None else _encode([0, at]) for at in expires]
        messages.update(zip(map(_ID_KEY, ids, repeat(8)), map(_encode, records), strict=False))
        schedule.update(zip(map(_SCHEDULE_KEY, gids, dues, ids), values, strict=False))
        effects.extend(zip(repeat("s"), gids, dues, ids, expires, repeat(0), strict=False))
        if stop >= count:
            break
        yield
        start = stop
        stop += APPLY_STEP_ITEMS
    counts = dict.fromkeys(plain, count) if len(plain) == 1 else Counter(map(_TOPIC, items))
    for topic, stored in counts.items():
        info = plain[topic]
        info.pending += stored
        state.total_pending += stored
        touched.add(info.group_id)


def group_targets(
    state: QueueState,
    txn: Txn,
    topic: str,
    settings: commands.GroupSettings,
    effects: list[tuple[Any, ...]],
) -> list[GroupInfo]:
    groups = state.topic_groups(topic)
    if not groups:
        groups = [
            group_changes.new_group(
                state,
                txn,
                topic,
                DEFAULT_GROUP,
                settings.visibility_timeout_ms,
                settings.max_deliveries,
                True,
                effects,
                settings.dead_letter_expired,
            )
        ]
    return groups
