"""Applying what happens to a delivery: DELIVERED, ACK, NACK, RELEASE, EXPIRE, DEAD_LETTER.

Plain functions over a :class:`~futureq.state.queue_state.QueueState`, called by its
``apply_steps``: recording a delivery attempt, removing acked entries and releasing
their messages, rescheduling NACKed and released entries, expiring entries past their
TTL or their deliveries, and moving entries to the dead-letter topic (with provenance,
and as builds before provenance applied it, so old logs replay alike).

Source: ``DESIGN.md``, "Message semantics"; ``docs/protocol.md`` (ACK, NACK, RELEASE).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from futureq.state import commands, publish, records
from futureq.state.commands import CommandKind
from futureq.state.layout import (
    _arg,
    _pack,
    _u64,
    _unpack,
)
from futureq.state.manage_ops import (
    moved_key,
    out_attempts,
)
from futureq.state.model import (
    APPLY_STEP_ITEMS,
    Txn,
)
from futureq.state.records import EntryValue

if TYPE_CHECKING:
    from futureq.state.queue_state import QueueState


def release_message(
    state: QueueState, txn: Txn, mid: int, gid: int, due_ms: int, data: bytes | None = None
) -> None:
    """One entry of ``mid`` (in group ``gid``, due at ``due_ms``) is gone: count it
    out, forget where it moved, and delete the message with its last entry.
    ``data``: the message's stored bytes if the caller just read them."""
    mkey = _u64(mid)
    if data is None or mkey in txn.changes["messages"]:
        data = txn.get("messages", mkey)
    assert data is not None, f"schedule entry without message {mid}"
    record = _unpack(data)
    record[4] -= 1
    if due_ms != record[3]:
        txn.put("index", moved_key(mid, gid), None)
    txn.put("messages", mkey, None if record[4] <= 0 else _pack(record))


def remove(
    state: QueueState,
    txn: Txn,
    keys: list[bytes],
    reason: CommandKind,
    effects: list[tuple[Any, ...]],
    touched: set[int],
    *,
    following: bool = False,
) -> Generator[None, None, int]:
    """Remove schedule entries by key (ACK, ACK_FOLLOWING); return how many were there.

    With ``following`` (ACK_FOLLOWING), a key with no entry whose message's entry in
    the key's group now sits at another due time (a RESCHEDULE moved it after the
    leader took the ACK) removes that entry instead: the delivery the consumer acked
    was of that message, and it must not be delivered again.
    """
    done = 0
    for position, key in enumerate(keys):
        if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
            yield
        if state._drop_entry(txn, key, reason, effects, touched) is not None:
            done += 1
        elif following:
            moved = _moved_entry(state, txn, key)
            if moved is not None and state._drop_entry(txn, moved, reason, effects, touched):
                done += 1
    return done


def _entry(state: QueueState, txn: Txn, key: bytes, following: bool) -> tuple[bytes, bytes | None]:
    """``(key, stored value)`` of the entry ``key`` names (value None: none); with
    ``following``, one not there is looked up where a RESCHEDULE moved it."""
    value = txn.get("schedule", key)
    if value is None and following:
        moved = _moved_entry(state, txn, key)
        if moved is not None:
            return moved, txn.get("schedule", moved)
    return key, value


def _moved_entry(state: QueueState, txn: Txn, key: bytes) -> bytes | None:
    """The schedule key where the entry ``key`` named is now, if it moved (else None)."""
    if not isinstance(key, bytes) or len(key) != commands.SCHEDULE_KEY_BYTES:
        return None
    gid, _, mid = commands.parse_schedule_key(key)
    record = state._record(txn, mid)
    if record is None:
        return None
    found = state._find_entry(txn, mid, gid, record.due_ms)
    return None if found is None or found[0] == key else found[0]


def expire(
    state: QueueState,
    txn: Txn,
    index: int,
    keys: list[bytes],
    publish_ms: int | None,
    settings: commands.GroupSettings,
    effects: list[tuple[Any, ...]],
    touched: set[int],
    out_deliveries: Any = None,
) -> Generator[None, None, int]:
    """Remove expired entries; those of a ``dead_letter_expired`` group go to its
    dead-letter topic (reason ``expired``), or are parked on a dead-letter topic,
    their attempt raised to what ``out_deliveries`` (EXPIRE_COUNTED) says went out."""
    done = 0
    dead: list[list[Any]] = []
    known = out_attempts(out_deliveries)
    for position, key in enumerate(keys):
        if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
            yield
        info = state.groups.get(commands.parse_schedule_key(key)[0])
        if publish_ms is not None and info is not None and info.dead_letter_expired:
            value = txn.get("schedule", key)
            if value is None:
                continue
            entry = EntryValue.decode(value)
            entry.attempt = max(entry.attempt, known.get(key, 0))
            if state._dead_letter_entry(
                txn,
                key,
                info,
                entry,
                records.REASON_EXPIRED,
                None,
                publish_ms,
                dead,
                effects,
                touched,
            ):
                done += 1
        elif state._drop_entry(txn, key, CommandKind.EXPIRE, effects, touched) is not None:
            done += 1
    if dead:
        assert publish_ms is not None
        yield from publish.publish(state, txn, index, publish_ms, dead, effects, touched, settings)
    return done


def delivered(
    state: QueueState, txn: Txn, entries: list[list[Any]], now_ms: int | None
) -> Generator[None, None, int]:
    """Record the attempt number (and time) of redeliveries about to be pushed; an
    attempt is never lowered."""
    done = 0
    for position, item in enumerate(entries):
        if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
            yield
        key, attempt = item[0], item[1]
        value = txn.get("schedule", key)
        if value is None:
            continue  # acked, expired or deleted meanwhile
        entry = EntryValue.decode(value)
        if attempt > entry.attempt:
            entry.attempt = attempt
            if now_ms is not None:
                entry.record_delivery(item[2] if len(item) > 2 else None, now_ms)
            txn.put("schedule", key, entry.encode())
            done += 1
    return done


def return_counted(
    state: QueueState, txn: Txn, entries: list[list[Any]]
) -> Generator[None, None, int]:
    """Record deliveries that went out unrecorded and count (RETURN_COUNTED): the
    attempt is raised, never lowered, and ``pushed_ms`` becomes a delivery time; the
    entry stays where it is (the leader's index already has it due again)."""
    done = 0
    for position, item in enumerate(entries):
        if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
            yield
        key, attempt, pushed_ms = item[0], item[1], item[2]
        value = txn.get("schedule", key)
        if value is None:
            continue  # acked, expired, moved or deleted meanwhile
        entry = EntryValue.decode(value)
        if attempt > entry.attempt:
            entry.attempt = attempt
            entry.record_delivery(pushed_ms, pushed_ms)
            txn.put("schedule", key, entry.encode())
            done += 1
    return done


def handed_out(state: QueueState, txn: Txn, entries: list[list[Any]]) -> Generator[None, None, int]:
    """Deliveries out when the leader hands over (HANDED_OUT): each counts (its attempt
    raised as by RETURN_COUNTED, never lowered) and its entry is *held* for it: the
    next leader keeps the delivery out until ``deadline_ms`` and honours its tag
    (``docs/protocol.md``, "Delivery tags across leaders"). An item naming an attempt
    older than the one recorded, or one released, holds nothing (that delivery is no
    longer out); the entry stays where it is."""
    done = 0
    for position, item in enumerate(entries):
        if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
            yield
        key, attempt, stamp, pushed_ms, deadline_ms = item[0], item[1], item[2], item[3], item[4]
        value = txn.get("schedule", key)
        if value is None:
            continue  # acked, expired, moved or deleted meanwhile
        entry = EntryValue.decode(value)
        if attempt < entry.attempt or entry.released_attempt == attempt:
            continue
        entry.attempt = attempt
        if pushed_ms:
            entry.record_delivery(pushed_ms, pushed_ms)
        entry.held_attempt = attempt
        entry.held_stamp = stamp
        entry.held_until_ms = deadline_ms
        txn.put("schedule", key, entry.encode())
        done += 1
    return done


def release(
    state: QueueState,
    txn: Txn,
    entries: list[list[Any]],
    effects: list[tuple[Any, ...]],
    *,
    following: bool = False,
) -> Generator[None, None, int]:
    """Give deliveries back unprocessed: due again at once, the attempt not counted.

    The release records the attempt (a first delivery is not recorded before it
    goes out); an attempt older than the one recorded, or released already, names
    a delivery that is no longer out and changes nothing. ``following``
    (RELEASE_FOLLOWING): a key with no entry is looked up where a RESCHEDULE moved it.
    """
    done = 0
    for position, (named, attempt) in enumerate(entries):
        if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
            yield
        key, value = _entry(state, txn, named, following)
        if value is None:
            continue
        entry = EntryValue.decode(value)
        if attempt < max(entry.attempt, 1) or entry.released_attempt == attempt:
            continue
        gid, due_ms, mid = commands.parse_schedule_key(key)
        entry.attempt = attempt
        entry.released += 1
        entry.released_attempt = attempt
        entry.unhold()
        txn.put("schedule", key, entry.encode())
        effects.append(("u", gid, due_ms, mid, CommandKind.RELEASE))
        effects.append(("s", gid, due_ms, mid, entry.expire_ms, attempt, entry.released))
        done += 1
    return done


def nack(
    state: QueueState,
    txn: Txn,
    index: int,
    command: list[Any],
    effects: list[tuple[Any, ...]],
    touched: set[int],
) -> Generator[None, None, int]:
    """Refused deliveries: due again after the delay, or dead-lettered at once
    (``dead_letter``: reason ``rejected``), the consumer's reason text kept."""
    now_ms, requeue_delay_ms, entries = command[1], command[2], command[3]
    reason: str | None = _arg(command, 4)
    to_dead_letter = bool(_arg(command, 5, False))
    settings = commands.GroupSettings.from_wire(_arg(command, 6))
    following = command[0] == CommandKind.NACK_FOLLOWING
    done = 0
    dead: list[list[Any]] = []
    for position, item in enumerate(entries):
        if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
            yield
        attempt = item[1]
        pushed_ms = item[2] if len(item) > 2 else None
        key, value = _entry(state, txn, item[0], following)
        if value is None:
            continue
        gid, due_ms, mid = commands.parse_schedule_key(key)
        entry = EntryValue.decode(value)
        entry.attempt = max(attempt, entry.attempt)
        if pushed_ms is not None:
            entry.record_delivery(pushed_ms, pushed_ms)
        entry.unhold()  # settled: the delivery a leader left out is no longer out
        if reason is not None:
            entry.reason = reason
        info = state.groups.get(gid)
        if to_dead_letter and info is not None:
            if state._dead_letter_entry(
                txn,
                key,
                info,
                entry,
                records.REASON_REJECTED,
                reason,
                now_ms,
                dead,
                effects,
                touched,
            ):
                done += 1
            continue
        # An entry a RESCHEDULE moved meanwhile keeps the due time it gave (the NACK
        # came first, then the RESCHEDULE, as far as anyone could tell).
        new_due = due_ms if key != item[0] else max(now_ms + requeue_delay_ms, due_ms)
        state._move_entry(
            txn, key, gid, due_ms, mid, new_due, entry, CommandKind.NACK, effects, touched
        )
        done += 1
    if dead:
        yield from publish.publish(state, txn, index, now_ms, dead, effects, touched, settings)
    return done


def dead_letter(
    state: QueueState,
    txn: Txn,
    index: int,
    publish_ms: int,
    entries: list[list[Any]],
    effects: list[tuple[Any, ...]],
    touched: set[int],
    settings: commands.GroupSettings,
) -> Generator[None, None, int]:
    """Entries out of attempts go to their dead-letter topic with their provenance
    in headers (reason ``max-deliveries``); those of a dead-letter topic are parked."""
    items: list[list[Any]] = []
    for position, item in enumerate(entries):
        if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
            yield
        key, attempt = item[0], item[1]
        first_ms = item[2] if len(item) > 2 else None
        info = state.groups.get(commands.parse_schedule_key(key)[0])
        value = txn.get("schedule", key)
        if info is None or value is None:
            continue
        entry = EntryValue.decode(value)
        entry.attempt = max(attempt, entry.attempt)
        entry.record_delivery(first_ms, first_ms if entry.last_delivery_ms is None else None)
        state._dead_letter_entry(
            txn,
            key,
            info,
            entry,
            records.REASON_MAX_DELIVERIES,
            None,
            publish_ms,
            items,
            effects,
            touched,
        )
    if not items:
        return commands.message_id(index, 0)
    return (
        yield from publish.publish(state, txn, index, publish_ms, items, effects, touched, settings)
    )


def dead_letter_before_provenance(
    state: QueueState,
    txn: Txn,
    index: int,
    publish_ms: int,
    entries: list[list[Any]],
    effects: list[tuple[Any, ...]],
    touched: set[int],
    settings: commands.GroupSettings,
) -> Generator[None, None, int]:
    """DEAD_LETTER (kind 5) exactly as builds before issue 14 applied it, so their
    logs replay to the same state: each entry goes to its dead-letter topic as a
    plain message (no headers, attempts not recorded); an entry of a group without
    a dead-letter topic (one of a dead-letter topic) is left as it is."""
    items: list[list[Any]] = []
    for position, item in enumerate(entries):
        if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
            yield
        key = item[0]
        gid, _, mid = commands.parse_schedule_key(key)
        record = state._record(txn, mid)
        info = state.groups.get(gid)
        if record is None or info is None or info.dead_letter_topic is None:
            continue
        if state._drop_entry(txn, key, CommandKind.DEAD_LETTER, effects, touched) is None:
            continue
        items.append([info.dead_letter_topic, record.payload, publish_ms, None])
    if not items:
        return commands.message_id(index, 0)
    return (
        yield from publish.publish(state, txn, index, publish_ms, items, effects, touched, settings)
    )
