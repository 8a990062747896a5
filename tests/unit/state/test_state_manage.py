"""QueueState: the commands that manage scheduled messages (issue 14).

CANCEL, RESCHEDULE, PURGE, REDRIVE, idempotency keys, CREATE_GROUP ``from_backlog``
and dead letters with provenance, each on a MemoryStore and on a real RocksDB
``Database`` (the ``kit`` fixture). Source: ``docs/protocol.md`` ("CANCEL",
"Dead letters").
"""

from __future__ import annotations

from typing import Any

import pytest
from state_helpers import Recorder, StoreKit, dump, group_snapshot

from futureq.state import commands, records
from futureq.state.commands import CommandKind, schedule_key
from futureq.state.manage_ops import KEY_TIME, backfilled_key
from futureq.state.queue_state import PublishResult, QueueState
from futureq.state.records import PARKED_DUE_MS
from futureq.state.store import MemoryStore
from futureq.wire.frames import ItemStatus

DONE, DELIVERED, UNKNOWN, NO_TARGET = (
    ItemStatus.DONE,
    ItemStatus.DELIVERED,
    ItemStatus.UNKNOWN,
    ItemStatus.NO_TARGET,
)


class Runner:
    """Applies encoded commands at consecutive log indexes."""

    def __init__(self, state: QueueState) -> None:
        self.state = state

    def __call__(self, data: bytes) -> Any:
        return self.state.apply(self.state.applied_index + 1, data)


def _two_groups(kit: StoreKit, count: int = 3) -> tuple[QueueState, Runner, int, int, list[int]]:
    state = QueueState(kit.store)
    run = Runner(state)
    g1 = run(commands.create_group("t", "g1", None, None))
    g2 = run(commands.create_group("t", "g2", None, None))
    first = run(commands.publish(1000, [("t", bytes([i]), 1500 + i, 100) for i in range(count)]))
    return state, run, g1, g2, [first + i for i in range(count)]


# ---------------------------------------------------------------- CANCEL


def test_cancel_in_one_group_leaves_the_other_groups_copy(kit: StoreKit) -> None:
    state, run, g1, g2, ids = _two_groups(kit)
    recorder = Recorder(state)
    assert run(commands.cancel("t", g1, [ids[0], ids[1]])) == [DONE, DONE]
    assert state.get_schedule(schedule_key(g1, 1500, ids[0])) is None
    assert state.get_schedule(schedule_key(g2, 1500, ids[0])) == (0, 1600)
    assert [g.pending for g in state.topic_groups("t")] == [1, 3]
    assert state.get_message(ids[0]) == ("t", b"\x00", 1000, 1500, 1)
    assert recorder.take() == [
        ("u", g1, 1500, ids[0], CommandKind.CANCEL),
        ("u", g1, 1501, ids[1], CommandKind.CANCEL),
    ]
    assert recorder.violations == []


def test_cancel_in_every_group_deletes_the_message(kit: StoreKit) -> None:
    state, run, _g1, _g2, ids = _two_groups(kit)
    assert run(commands.cancel("t", None, [ids[2]])) == [DONE]
    assert state.get_message(ids[2]) is None
    assert [g.pending for g in state.topic_groups("t")] == [2, 2]
    # A second cancel finds nothing: a retried request reports UNKNOWN.
    assert run(commands.cancel("t", None, [ids[2]])) == [UNKNOWN]


def test_cancel_reports_unknown_for_what_is_not_pending_there(kit: StoreKit) -> None:
    state, run, g1, g2, ids = _two_groups(kit)
    run(commands.publish(1000, [("u", b"other", 1500, None)]))
    other = state.applied_index << 16
    run(commands.ack([schedule_key(g1, 1500, ids[0])]))
    before = dump(kit.store)
    results = run(
        commands.cancel("t", g1, [ids[0], other, ids[2] + 99, 2**64 - 1, -1, "x", 1.5])  # type: ignore[list-item]
    )
    assert results == [UNKNOWN] * 7
    after = dump(kit.store)
    assert {k: v for k, v in after.items() if k != "meta"} == {
        k: v for k, v in before.items() if k != "meta"
    }
    # A group of another topic, or a group id that does not exist, holds nothing.
    other_gid = state.find_group("u", "default")
    assert other_gid is not None
    assert run(commands.cancel("t", other_gid.group_id, [ids[1]])) == [UNKNOWN]
    assert run(commands.cancel("t", 999, [ids[1]])) == [UNKNOWN]
    assert state.get_schedule(schedule_key(g2, 1501, ids[1])) == (0, 1601)


def test_cancel_says_when_a_message_had_been_delivered(kit: StoreKit) -> None:
    state, run, g1, g2, ids = _two_groups(kit)
    run(commands.delivered([(schedule_key(g1, 1500, ids[0]), 2)]))
    assert run(commands.cancel("t", None, [ids[0], ids[1]])) == [DELIVERED, DONE]
    assert state.get_message(ids[0]) is None


def test_cancel_finds_an_entry_a_nack_moved_and_forgets_where_it_moved(kit: StoreKit) -> None:
    state, run, g1, _g2, ids = _two_groups(kit)
    run(commands.nack(2000, 5000, [(schedule_key(g1, 1500, ids[0]), 1)]))
    assert state.entry_key(ids[0], g1) == schedule_key(g1, 7000, ids[0])
    assert dump(kit.store)["index"] != []
    assert run(commands.cancel("t", g1, [ids[0]])) == [DELIVERED]
    assert state.get_schedule(schedule_key(g1, 7000, ids[0])) is None
    assert state.entry_key(ids[0], g1) is None
    assert dump(kit.store)["index"] == []  # no stale "moved" row left behind


def test_cancel_survives_a_reopen_and_a_snapshot_restore(kit: StoreKit) -> None:
    state, run, g1, _g2, ids = _two_groups(kit)
    run(commands.nack(2000, 5000, [(schedule_key(g1, 1501, ids[1]), 1)]))
    with state.snapshot_source() as source:
        data = source.serialize()
    restored = QueueState(MemoryStore())
    restored.restore(data, state.applied_index)
    if kit.durable:
        reopened = QueueState(kit.reopen())
        assert group_snapshot(reopened) == group_snapshot(state)
        state = reopened
    for replica in (state, restored):
        again = Runner(replica)
        assert again(commands.cancel("t", g1, [ids[1], ids[0]])) == [DELIVERED, DONE]
        assert [g.pending for g in replica.topic_groups("t")] == [1, 3]
    assert group_snapshot(state) == group_snapshot(restored)
    assert state.applied_digest == restored.applied_digest


# ---------------------------------------------------------------- RESCHEDULE


def test_reschedule_moves_entries_keeps_attempts_and_counts_ttl_from_the_new_due(
    kit: StoreKit,
) -> None:
    state, run, g1, g2, ids = _two_groups(kit)
    run(commands.delivered([(schedule_key(g1, 1500, ids[0]), 2)]))
    assert run(commands.reschedule(3000, "t", g1, [ids[0], ids[2] + 50], 90_000)) == [
        DONE,
        UNKNOWN,
    ]
    assert state.get_schedule(schedule_key(g1, 1500, ids[0])) is None
    assert state.get_schedule(schedule_key(g1, 90_000, ids[0])) == (2, 90_100)
    assert state.get_schedule(schedule_key(g2, 1500, ids[0])) == (0, 1600)
    assert state.entry_key(ids[0], g1) == schedule_key(g1, 90_000, ids[0])
    # Moved back to the published due time: the index row goes.
    assert run(commands.reschedule(3000, "t", None, [ids[0]], 1500)) == [DONE]
    assert dump(kit.store)["index"] == []
    assert state.get_schedule(schedule_key(g1, 1500, ids[0])) == (2, 1600)


def test_reschedule_refuses_a_due_time_no_clock_reaches(kit: StoreKit) -> None:
    _state, run, _g1, _g2, ids = _two_groups(kit)
    assert run(commands.reschedule(3000, "t", None, [ids[0]], PARKED_DUE_MS)) == [UNKNOWN]
    assert run(commands.reschedule(3000, "t", None, [ids[0]], -5)) == [UNKNOWN]


# ---------------------------------------------------------------- PURGE


def test_purge_removes_what_was_pending_in_chunks_and_keeps_newer_messages(
    kit: StoreKit,
) -> None:
    state, run, g1, g2, ids = _two_groups(kit, count=5)
    assert run(commands.purge([g1])) == 5
    assert g1 in state.purging
    newer = run(commands.publish(1100, [("t", b"new", 1200, None)]))
    # Chunks walk the group in due order: the newer message (due first) is looked at
    # and kept; a chunk that finds fewer entries than it may look at ends the purge.
    assert run(commands.purge_group(g1, 2)) == 1
    assert run(commands.purge_group(g1, 2)) == 2
    assert g1 in state.purging
    assert run(commands.purge_group(g1, 2)) == 2
    assert run(commands.purge_group(g1, 2)) == 0
    assert g1 not in state.purging
    assert state.get_schedule(schedule_key(g1, 1200, newer)) == (0, None)
    assert state.groups[g1].pending == 1
    assert state.groups[g2].pending == 6
    assert all(state.get_message(mid) is not None for mid in ids)  # g2 still holds them
    if kit.durable:
        assert QueueState(kit.reopen()).purging == {}


def test_a_purge_in_progress_survives_a_reopen(kit: StoreKit) -> None:
    state, run, g1, _g2, _ids = _two_groups(kit, count=5)
    run(commands.purge([g1]))
    run(commands.purge_group(g1, 2))
    if not kit.durable:
        return
    reopened = QueueState(kit.reopen())
    assert reopened.purging.keys() == {g1}
    assert reopened.purging[g1].cursor == state.purging[g1].cursor
    again = Runner(reopened)
    assert again(commands.purge_group(g1, 10)) == 3  # 2 of the 5 went in the first chunk
    assert reopened.groups[g1].pending == 0


# ---------------------------------------------------------------- dead letters, REDRIVE


def _dead_letter_one(kit: StoreKit) -> tuple[QueueState, Runner, int, int, int]:
    state = QueueState(kit.store)
    run = Runner(state)
    gid = run(commands.create_group("t", "g", None, 3))
    mid = run(commands.publish(1000, [("t", b"body", 1500, None)]))
    key = schedule_key(gid, 1500, mid)
    run(commands.delivered([(key, 2)], 1600))
    run(commands.nack(1700, 0, [(key, 3, 1690)], reason="bad input"))
    moved = state.entry_key(mid, gid)
    assert moved is not None
    dead = run(commands.dead_letter(2000, [(moved, 3)]))
    return state, run, gid, mid, dead


def test_a_dead_letter_carries_its_provenance_as_headers(kit: StoreKit) -> None:
    state, _run, _gid, mid, dead = _dead_letter_one(kit)
    record = state.get_record(dead)
    assert record is not None and record.topic == "t.dlq" and record.payload == b"body"
    assert record.headers == {
        records.HEADER_ORIGINAL_ID: str(mid),
        records.HEADER_ORIGINAL_TOPIC: "t",
        records.HEADER_ORIGINAL_GROUP: "g",
        records.HEADER_ATTEMPTS: "3",
        records.HEADER_FIRST_DELIVERY_MS: "1600",
        records.HEADER_LAST_DELIVERY_MS: "1690",
        records.HEADER_REASON: records.REASON_MAX_DELIVERIES,
        records.HEADER_REASON_TEXT: "bad input",
        records.HEADER_DEAD_LETTERED_MS: "2000",
    }
    assert state.get_message(mid) is None


def test_a_nack_may_dead_letter_at_once_with_reason_rejected(kit: StoreKit) -> None:
    state = QueueState(kit.store)
    run = Runner(state)
    gid = run(commands.create_group("t", "g", None, None))
    mid = run(commands.publish(1000, [("t", b"x", 1000, None)]))
    index = state.applied_index + 1
    run(commands.nack(1200, 0, [(schedule_key(gid, 1000, mid), 1)], "poison", dead_letter=True))
    record = state.get_record(index << 16)
    assert record is not None and record.headers is not None
    assert record.headers[records.HEADER_REASON] == records.REASON_REJECTED
    assert record.headers[records.HEADER_REASON_TEXT] == "poison"


def test_redrive_sends_a_dead_letter_back_to_its_group_only(kit: StoreKit) -> None:
    state, run, gid, mid, dead = _dead_letter_one(kit)
    other = run(commands.create_group("t", "other", None, None))
    dlq = state.find_group("t.dlq", "default")
    assert dlq is not None
    key = schedule_key(dlq.group_id, 2000, dead)
    index = state.applied_index + 1
    assert run(commands.redrive(3000, dlq.group_id, [key, key], 4000)) == [DONE, UNKNOWN]
    assert state.get_message(dead) is None
    again = index << 16
    record = state.get_record(again)
    assert record is not None and record.topic == "t" and record.payload == b"body"
    assert record.headers is not None
    assert record.headers[records.HEADER_REDRIVEN_FROM] == str(dead)
    assert record.headers[records.HEADER_ORIGINAL_ID] == str(mid)
    assert state.get_schedule(schedule_key(gid, 4000, again)) == (0, None)
    assert state.groups[other].pending == 0  # only the group it died in gets it back


def test_redrive_keeps_a_dead_letter_whose_group_is_gone(kit: StoreKit) -> None:
    state, run, _gid, _mid, dead = _dead_letter_one(kit)
    run(commands.delete_group("t", "g"))
    dlq = state.find_group("t.dlq", "default")
    assert dlq is not None
    key = schedule_key(dlq.group_id, 2000, dead)
    assert run(commands.redrive(3000, dlq.group_id, [key, b"short"], 3000)) == [
        NO_TARGET,
        UNKNOWN,
    ]
    assert state.get_schedule(key) == (0, None)


def test_a_dead_letter_out_of_attempts_is_parked_and_can_be_rescheduled(kit: StoreKit) -> None:
    state, run, _gid, _mid, dead = _dead_letter_one(kit)
    dlq = state.find_group("t.dlq", "default")
    assert dlq is not None
    key = schedule_key(dlq.group_id, 2000, dead)
    run(commands.dead_letter(5000, [(key, 16)]))
    parked = schedule_key(dlq.group_id, PARKED_DUE_MS, dead)
    assert state.entry_key(dead, dlq.group_id) == parked
    assert state.find_group("t.dlq.dlq", "default") is None
    assert run(commands.reschedule(6000, "t.dlq", None, [dead], 7000)) == [DONE]
    assert state.get_schedule(schedule_key(dlq.group_id, 7000, dead)) == (16, None)
    # Its 16 deliveries stop counting: a fresh allowance, so it is delivered again.
    entry = state.get_entry(schedule_key(dlq.group_id, 7000, dead))
    assert entry is not None and (entry.attempt, entry.released) == (16, 16)
    # Rescheduled again while not parked, nothing more is forgiven.
    run(commands.delivered([(schedule_key(dlq.group_id, 7000, dead), 17)]))
    assert run(commands.reschedule(6000, "t.dlq", None, [dead], 8000)) == [DONE]
    entry = state.get_entry(schedule_key(dlq.group_id, 8000, dead))
    assert entry is not None and (entry.attempt, entry.released) == (17, 16)


def _old_reschedule(
    now_ms: int, topic: str, group_id: int | None, ids: list[int], due: int
) -> bytes:
    """A RESCHEDULE (kind 26) as builds before RESCHEDULE_COUNTED wrote it."""
    return commands.encode([CommandKind.RESCHEDULE, now_ms, topic, group_id, ids, due])


def test_an_old_reschedule_replays_as_the_old_build_applied_it(kit: StoreKit) -> None:
    """Upgrade safety: kind 26 keeps a parked dead letter's attempts counting."""
    state, run, _gid, _mid, dead = _dead_letter_one(kit)
    dlq = state.find_group("t.dlq", "default")
    assert dlq is not None
    run(commands.dead_letter(5000, [(schedule_key(dlq.group_id, 2000, dead), 16)]))
    assert run(_old_reschedule(6000, "t.dlq", None, [dead], 7000)) == [DONE]
    entry = state.get_entry(schedule_key(dlq.group_id, 7000, dead))
    assert entry is not None and (entry.attempt, entry.released) == (16, 0)
    assert commands.decode(commands.reschedule(1, "t", None, [1], 2))[0] == 31


def test_reschedule_records_deliveries_the_leader_knows_went_out(kit: StoreKit) -> None:
    """A first delivery is pushed unrecorded; the leader names it in ``out`` and the
    moved entry keeps its attempt (``docs/protocol.md``, RESCHEDULE: attempts are kept)."""
    state, run, g1, g2, ids = _two_groups(kit)
    k0, k1 = schedule_key(g1, 1500, ids[0]), schedule_key(g1, 1501, ids[1])
    run(commands.delivered([(k1, 3)]))
    out = [(k0, 1), (k1, 2), (b"short", 9), (schedule_key(g2, 1500, ids[0]) + b"x", 4)]
    assert run(commands.reschedule(3000, "t", g1, [ids[0], ids[1]], 9000, out)) == [DONE, DONE]
    assert state.get_schedule(schedule_key(g1, 9000, ids[0])) == (1, 9100)
    assert state.get_schedule(schedule_key(g1, 9000, ids[1])) == (3, 9100)  # never lowered
    assert state.get_schedule(schedule_key(g2, 1500, ids[0])) == (0, 1600)


def test_cancel_reports_delivered_for_a_delivery_the_leader_knows_went_out(
    kit: StoreKit,
) -> None:
    """``out`` changes CANCEL's answer only: the state and digest are those of a CANCEL
    without it (so a node of an earlier build, which ignores it, stays equal)."""
    state, run, g1, _g2, ids = _two_groups(kit)
    twin = QueueState(MemoryStore())
    twin_run = Runner(twin)
    twin_run(commands.create_group("t", "g1", None, None))
    twin_run(commands.create_group("t", "g2", None, None))
    twin_run(commands.publish(1000, [("t", bytes([i]), 1500 + i, 100) for i in range(3)]))
    out = [(schedule_key(g1, 1500, ids[0]), 1)]
    assert run(commands.cancel("t", None, [ids[0], ids[1]], out)) == [DELIVERED, DONE]
    assert twin_run(commands.cancel("t", None, [ids[0], ids[1]])) == [DONE, DONE]
    assert state.applied_digest == twin.applied_digest


def test_return_counted_records_a_first_delivery_that_went_out(kit: StoreKit) -> None:
    """A first delivery given back without a settlement (UNSUBSCRIBE, a closed
    connection) counts (``docs/protocol.md``, UNSUBSCRIBE): RETURN_COUNTED records its
    attempt and time, leaves the entry where it is and does not call it released; it
    never lowers an attempt and passes over an entry that is gone."""
    state, run, g1, g2, ids = _two_groups(kit)
    recorder = Recorder(state)
    k0, k1 = schedule_key(g1, 1500, ids[0]), schedule_key(g1, 1501, ids[1])
    run(commands.delivered([(k1, 3)], 1700))
    gone = schedule_key(g2, 1500, ids[0] + 100)
    assert run(commands.return_counted([(k0, 1, 1600), (k1, 1, 1650), (gone, 1, 1600)])) == 1
    entry = state.get_entry(k0)
    assert entry is not None
    assert (entry.attempt, entry.released, entry.released_attempt) == (1, 0, 0)
    assert (entry.first_delivery_ms, entry.last_delivery_ms) == (1600, 1600)
    later = state.get_entry(k1)
    assert later is not None and (later.attempt, later.last_delivery_ms) == (3, 1700)
    assert state.get_schedule(schedule_key(g2, 1500, ids[0])) == (0, 1600)  # other group
    assert recorder.calls == [] and recorder.violations == []  # nothing moved
    state = QueueState(kit.reopen())
    assert state.get_schedule(k0) == (1, 1600)  # durable
    assert commands.decode(commands.return_counted([(k0, 1, 1600)]))[0] == 40


def test_handed_out_holds_an_entry_for_the_delivery_out_and_no_other(kit: StoreKit) -> None:
    """HANDED_OUT (a leader handing over with deliveries out): each counts as
    RETURN_COUNTED would, and its entry is held for that delivery's tag until its
    deadline (``docs/protocol.md``, "Delivery tags across leaders"). An item of an
    attempt older than the one recorded holds nothing; a NACK, a RELEASE or a later
    delivery ends the hold; the hold survives a reopen (it is replicated state)."""
    state, run, g1, g2, ids = _two_groups(kit)
    recorder = Recorder(state)
    k0, k1, k2 = (schedule_key(g1, 1500 + i, ids[i]) for i in range(3))
    run(commands.delivered([(k1, 3)], 1700))
    assert run(commands.handed_out([(k0, 1, 77, 1600, 31_600), (k1, 2, 5, 1650, 31_650)])) == 1
    entry = state.get_entry(k0)
    assert entry is not None and entry.held() == (77, 31_600)
    assert (entry.attempt, entry.first_delivery_ms, entry.last_delivery_ms) == (1, 1600, 1600)
    stale = state.get_entry(k1)
    assert stale is not None and stale.held() is None and stale.attempt == 3
    assert recorder.calls == [] and recorder.violations == []  # nothing moved
    state = QueueState(kit.reopen())
    run = Runner(state)
    held = state.get_entry(k0)
    assert held is not None and held.held() == (77, 31_600)  # durable
    # A later delivery supersedes it; a RELEASE or a NACK ends it.
    run(commands.handed_out([(k2, 1, 9, 1600, 31_600)]))
    run(commands.delivered([(k0, 2)], 1800))
    later = state.get_entry(k0)
    assert later is not None and later.held() is None
    run(commands.handed_out([(k0, 2, 8, 1800, 31_800)]))
    run(commands.release([(k0, 2)]))
    released = state.get_entry(k0)
    assert released is not None and released.held() is None
    run(commands.nack(1900, 0, [(k2, 1)]))
    moved = state.get_entry(schedule_key(g1, 1900, ids[2]))
    assert moved is not None and moved.held() is None and moved.attempt == 1
    assert commands.decode(commands.handed_out([(k0, 1, 0, 0, 0)]))[0] == 41


def _old_dead_letter(publish_ms: int, entries: list[list[Any]]) -> bytes:
    """A DEAD_LETTER (kind 5) as builds before issue 14 wrote it."""
    settings = commands.BUILTIN_GROUP_SETTINGS.to_wire()
    return commands.encode([CommandKind.DEAD_LETTER, publish_ms, entries, settings])


def test_an_old_dead_letter_entry_replays_as_the_old_build_applied_it(kit: StoreKit) -> None:
    """Upgrade safety: a log an earlier build wrote gives the state it gave then."""
    state = QueueState(kit.store)
    run = Runner(state)
    gid = run(commands.create_group("t", "g", None, 3))
    mid = run(commands.publish(1000, [("t", b"body", 1500, None)]))
    key = schedule_key(gid, 1500, mid)
    index = state.applied_index + 1
    dead = run(_old_dead_letter(2000, [[key, 3]]))
    assert dead == index << 16
    # A plain message on t.dlq: no provenance headers, as the old build stored it.
    assert state.get_message(dead) == ("t.dlq", b"body", 2000, 2000, 1)
    record = state.get_record(dead)
    assert record is not None and record.headers is None
    assert state.get_message(mid) is None
    dlq = state.find_group("t.dlq", "default")
    assert dlq is not None
    dlq_key = schedule_key(dlq.group_id, 2000, dead)
    # An entry of a dead-letter topic is left exactly where it is, not parked.
    before = dump(kit.store)
    assert run(_old_dead_letter(5000, [[dlq_key, 16]])) == (state.applied_index << 16)
    after = dump(kit.store)
    assert state.get_schedule(dlq_key) == (0, None)
    assert state.entry_key(dead, dlq.group_id) == dlq_key
    changed = {family for family in after if after[family] != before[family]}
    assert changed <= {"meta"}, changed  # only the applied index moved
    # The same entry under the new kind is parked (what a new build writes).
    run(commands.dead_letter(6000, [(dlq_key, 16)]))
    assert state.entry_key(dead, dlq.group_id) == schedule_key(dlq.group_id, PARKED_DUE_MS, dead)


def test_a_new_dead_letter_is_written_with_its_own_kind() -> None:
    command = commands.decode(commands.dead_letter(2000, [(b"k" * 20, 3)]))
    assert command[0] == CommandKind.DEAD_LETTER_PROVENANCE == 30


# ---------------------------------------------------------------- idempotency keys


def _keyed(topic: str, payload: bytes, key: str | None) -> commands.PublishItem:
    return (topic, payload, 1500, None, None, key)


def test_a_second_publish_with_the_same_key_returns_the_original_id(kit: StoreKit) -> None:
    state = QueueState(kit.store)
    run = Runner(state)
    first = run(
        commands.publish(1000, [_keyed("t", b"a", "order-17")], idempotency_window_ms=60_000)
    )
    assert isinstance(first, int)
    pending = state.total_pending
    again = run(
        commands.publish(
            1100,
            [
                _keyed("t", b"a", "order-17"),
                _keyed("t", b"b", "order-18"),
                _keyed("u", b"c", "order-17"),
            ],
            idempotency_window_ms=60_000,
        )
    )
    assert isinstance(again, PublishResult)
    assert again.duplicates == {0: first}
    assert state.get_message(again.first_id) is None  # nothing stored at position 0
    assert state.get_message(again.first_id + 1) is not None
    assert state.get_message(again.first_id + 2) is not None  # keys are per topic
    assert state.total_pending == pending + 2


def test_a_key_names_its_message_for_the_window_after_it_is_gone(kit: StoreKit) -> None:
    state = QueueState(kit.store)
    run = Runner(state)
    first = run(commands.publish(1000, [_keyed("t", b"a", "k")], idempotency_window_ms=10_000))
    gid = state.topic_groups("t")[0].group_id
    run(commands.ack([schedule_key(gid, 1500, first)]))
    inside = run(commands.publish(10_999, [_keyed("t", b"a", "k")], idempotency_window_ms=10_000))
    assert isinstance(inside, PublishResult) and inside.duplicates == {0: first}
    after = run(commands.publish(11_000, [_keyed("t", b"a", "k")], idempotency_window_ms=10_000))
    assert isinstance(after, int) and after != first


def test_old_keys_are_forgotten_a_few_per_publish(kit: StoreKit) -> None:
    state = QueueState(kit.store)
    run = Runner(state)
    for n in range(40):
        run(commands.publish(1000 + n, [_keyed("t", b"a", f"k{n}")], idempotency_window_ms=100))
    gid = state.topic_groups("t")[0].group_id
    run(commands.purge([gid]))
    while gid in state.purging:
        run(commands.purge_group(gid, 1000))
    for _ in range(4):
        run(commands.publish(100_000, [("t", b"z", 100_000, None)], idempotency_window_ms=100))
    keys = [k for k, _ in kit.store.scan("index", b"") if k[:1] == b"k"]
    assert keys == []


class TombstoneCounter(MemoryStore):
    """A MemoryStore that counts, for each scan of the ``t`` keys, the keys deleted
    earlier that lie before the first key the scan finds: what a RocksDB iterator
    steps over (tombstones) until compaction removes them."""

    def __init__(self) -> None:
        super().__init__()
        self.deleted: set[bytes] = set()
        self.stepped_over: list[int] = []

    def write(self, changes: Any, *, sync: bool = False) -> None:
        self.deleted.update(k for k, v in changes.get("index", {}).items() if v is None)
        super().write(changes, sync=sync)

    def scan(self, family: str, start: bytes, stop: bytes | None = None) -> Any:
        items = list(super().scan(family, start, stop))
        if family == "index" and start[:1] == KEY_TIME:
            end = items[0][0] if items else stop
            self.stepped_over.append(
                sum(1 for k in self.deleted if start <= k and (end is None or k < end))
            )
        return iter(items)


def test_pruning_keys_does_not_step_over_the_keys_it_deleted_before() -> None:
    # Keys of messages still pending are looked at again one window later (deleted and
    # put at the new stamp): each keyed PUBLISH deletes up to PRUNE_MIN_KEYS of them. A
    # scan from the first possible key stepped over all of those tombstones on every
    # keyed PUBLISH (1,800 keyed publishes: one publish 2.1 ms instead of 0.9).
    store = TombstoneCounter()
    state = QueueState(store)
    run = Runner(state)
    for n in range(300):
        item = ("t", b"a", 10**9, None, None, f"k{n}")
        run(commands.publish(1000 + 10 * n, [item], idempotency_window_ms=100))
    assert len(store.deleted) > 1000  # the scenario makes many tombstones
    assert max(store.stepped_over) == 0


def test_key_pruning_from_the_floor_writes_what_a_scan_from_the_start_writes() -> None:
    # Stamps out of log order (a publish stamped before another proposed first), gone
    # and pending messages, a window shorter than the disorder: the floor only skips
    # deleted keys, so both replicas write the same.
    stores = MemoryStore(), MemoryStore()
    states = [QueueState(store) for store in stores]
    stamps = [1000, 1003, 1001, 1200, 1150, 1400, 1399, 2000, 1700, 2600, 2601, 3000]
    for n, stamp in enumerate(stamps * 3):
        stamp += 3000 * (n // len(stamps))
        items = [("t", b"a", 1500 + stamp if n % 3 else stamp, None, None, f"k{n % 7}-{i}")
                 for i in range(1 + n % 4)]  # fmt: skip
        for position, state in enumerate(states):
            if position == 1:
                state.key_time_floor = KEY_TIME  # as if every scan started at the start
            Runner(state)(commands.publish(stamp, items, idempotency_window_ms=150))
            due = [
                k
                for k, _ in state.store.scan("schedule", b"")
                if int.from_bytes(k[4:12], "big") <= stamp
            ]
            if due and n % 2:
                Runner(state)(commands.ack(due[:2]))
    assert dump(stores[0]) == dump(stores[1])
    assert states[0].key_time_floor > KEY_TIME


# ---------------------------------------------------------------- from the backlog


def test_a_group_created_from_the_backlog_gets_every_pending_message(kit: StoreKit) -> None:
    state, run, g1, g2, ids = _two_groups(kit, count=4)
    run(commands.ack([schedule_key(g1, 1500, ids[0]), schedule_key(g2, 1500, ids[0])]))
    run(commands.cancel("t", g1, [ids[1]]))  # still pending in g2: the new group gets it
    new = run(commands.create_group("t", "late", None, None, from_backlog=True))
    assert new in state.backfilling
    later = run(commands.publish(1200, [("t", b"later", 1600, None)]))
    copied = 0
    while new in state.backfilling:
        copied += run(commands.backfill_group(new, 2))
    assert copied == 3
    due = sorted(mid for _due, mid, _a, _e in state.scan_schedule(new, 0, 0, 100))
    assert due == [ids[1], ids[2], ids[3], later]
    assert state.groups[new].pending == 4
    assert state.get_message(ids[2]) == ("t", bytes([2]), 1000, 1502, 3)


# ---------------------------------------------------------------- browse (a read)


def test_browse_pages_in_due_order_between_two_times_and_claims_nothing(kit: StoreKit) -> None:
    state, run, g1, _g2, ids = _two_groups(kit, count=7)
    before = dump(kit.store)
    page, cursor = state.browse(g1, 1501, 1506, None, 2)
    assert [commands.parse_schedule_key(key)[2] for key, _, _ in page] == ids[1:3]
    seen = [key for key, _, _ in page]
    while cursor is not None:
        page, cursor = state.browse(g1, 1501, 1506, cursor, 2)
        seen += [key for key, _, _ in page]
    assert [commands.parse_schedule_key(key)[2] for key in seen] == ids[1:6]
    entry, record = state.browse(g1, 0, None, None, 1)[0][0][1:]
    assert (entry.attempt, entry.expire_ms) == (0, 1600)
    assert (record.payload, record.due_ms) == (b"\x00", 1500)
    assert dump(kit.store) == before  # a read writes nothing
    # A cursor before the range start is ignored; an empty range has no next page.
    assert state.browse(g1, 1506, None, seen[0], 10)[0][0][0] == schedule_key(g1, 1506, ids[6])
    assert state.browse(g1, 9_000, None, None, 10) == ([], None)
    run(commands.cancel("t", g1, [ids[3]]))
    assert ids[3] not in [
        commands.parse_schedule_key(key)[2] for key, _, _ in state.browse(g1, 0, None, None, 9)[0]
    ]


def test_browse_shows_parked_dead_letters_last(kit: StoreKit) -> None:
    state, run, _gid, _mid, dead = _dead_letter_one(kit)
    dlq = state.find_group("t.dlq", "default")
    assert dlq is not None
    run(commands.dead_letter(5000, [(schedule_key(dlq.group_id, 2000, dead), 16)]))  # parked
    gid = state.find_group("t", "g")
    assert gid is not None
    later = run(commands.publish(2100, [("t", b"again", 2100, None)]))
    run(commands.dead_letter(5000, [(schedule_key(gid.group_id, 2100, later), 3)]))
    page, cursor = state.browse(dlq.group_id, 0, None, None, 10)
    assert cursor is None and len(page) == 2
    assert commands.parse_schedule_key(page[-1][0])[1:] == (PARKED_DUE_MS, dead)
    assert page[-1][2].headers is not None
    assert page[-1][2].headers[records.HEADER_ORIGINAL_TOPIC] == "t"
    bounded, _ = state.browse(dlq.group_id, 0, 10**12, None, 10)
    assert all(commands.parse_schedule_key(key)[1] != PARKED_DUE_MS for key, _, _ in bounded)


def _legacy_create_from_backlog(topic: str, group: str) -> bytes:
    """A CREATE_GROUP ``from_backlog`` as builds before kind 37 wrote it (kind 6)."""
    settings = commands.BUILTIN_GROUP_SETTINGS.to_wire()
    return commands.encode(
        [CommandKind.CREATE_GROUP, topic, group, None, None, settings, None, True]
    )


def _backfill_under_way(
    kit: StoreKit, *, legacy: bool = False
) -> tuple[QueueState, Runner, int, int, list[int]]:
    """Group g1 of t holds 6 messages (due 1500..1505); group ``late`` is created from
    the backlog and its first chunk copied the first 3 (the cursor is at 1502).
    ``legacy``: created by a kind 6 CREATE_GROUP from an earlier build's log."""
    state = QueueState(kit.store)
    run = Runner(state)
    g1 = run(commands.create_group("t", "g1", None, None))
    first = run(commands.publish(1000, [("t", bytes([i]), 1500 + i, None) for i in range(6)]))
    if legacy:
        late = run(_legacy_create_from_backlog("t", "late"))
    else:
        late = run(commands.create_group("t", "late", None, None, from_backlog=True))
    assert run(commands.backfill_group(late, 3)) == 3
    return state, run, g1, late, [first + i for i in range(6)]


def _held_by(state: QueueState, gid: int) -> list[tuple[int, int]]:
    return sorted((mid, due) for due, mid, _a, _e in state.scan_schedule(gid, 0, 0, 100))


def test_a_message_rescheduled_behind_the_backfill_cursor_still_reaches_the_new_group(
    kit: StoreKit,
) -> None:
    """Found by a tester: a RESCHEDULE in a source group moved a message the backfill
    had not reached to before its cursor; the backfill never saw it, and the group
    created from the backlog never got it. RESCHEDULE_BACKFILLING copies it first."""
    state, run, g1, late, ids = _backfill_under_way(kit)
    command = commands.reschedule(1000, "t", g1, [ids[5]], 1400, [], backfilling=True)
    assert commands.decode(command)[0] == CommandKind.RESCHEDULE_BACKFILLING
    assert run(command) == [DONE]
    while late in state.backfilling:
        run(commands.backfill_group(late, 3))
    # The new group has it at its published due time (only g1's copy moved).
    assert _held_by(state, late) == [(mid, 1500 + i) for i, mid in enumerate(ids)]
    assert (ids[5], 1400) in _held_by(state, g1)
    assert state.groups[late].pending == 6
    assert state.get_message(ids[5]) == ("t", bytes([5]), 1000, 1505, 2)


def test_a_reschedule_of_every_group_during_a_backfill_moves_the_new_groups_copy_too(
    kit: StoreKit,
) -> None:
    """Before, a RESCHEDULE of every group left the group being filled out (it had no
    entry yet); the backfill then copied the message at its published due time, and it
    was delivered there long before the time the RESCHEDULE gave."""
    state, run, _g1, late, ids = _backfill_under_way(kit)
    assert run(commands.reschedule(1000, "t", None, [ids[5]], 90_000, [], True)) == [DONE]
    # Only the new group: a message the backfill has not reached yet is found there too.
    assert run(commands.reschedule(1000, "t", late, [ids[4]], 80_000, [], True)) == [DONE]
    while late in state.backfilling:
        run(commands.backfill_group(late, 3))
    assert _held_by(state, late)[4:] == [(ids[4], 80_000), (ids[5], 90_000)]
    assert state.groups[late].pending == 6


def test_a_reschedule_counted_during_a_backfill_replays_as_earlier_builds_applied_it(
    kit: StoreKit,
) -> None:
    """Kind 31 in a log copies nothing first (as earlier builds applied it), so an old
    log replays to the state it gave; only kind 36 does."""
    state, run, g1, late, ids = _backfill_under_way(kit, legacy=True)
    assert run(commands.reschedule(1000, "t", g1, [ids[5]], 1400, [])) == [DONE]
    while late in state.backfilling:
        run(commands.backfill_group(late, 3))
    assert [mid for mid, _due in _held_by(state, late)] == ids[:5]


@pytest.mark.parametrize("legacy", [False, True], ids=["exact", "legacy"])
def test_a_message_copied_ahead_of_the_backfill_and_acked_is_not_copied_again(
    kit: StoreKit, legacy: bool
) -> None:
    """A message a RESCHEDULE_BACKFILLING copied ahead of the chunks, then delivered and
    acknowledged in the new group, is not copied again when the chunks reach its entry
    in the source group (an acknowledged message is never delivered again to a group),
    across a restart too (the job is stored with what it copied)."""
    state, run, g1, late, ids = _backfill_under_way(kit, legacy=legacy)
    assert run(commands.reschedule(1000, "t", late, [ids[4]], 1600, [], True)) == [DONE]
    assert run(commands.ack([schedule_key(late, 1600, ids[4])])) == 1
    state = QueueState(kit.store)  # a restart: the job is loaded from the store
    run = Runner(state)
    if legacy:
        assert state.backfilling[late].copied == {ids[4]}
    else:  # marked in the index family until the chunks pass it
        assert state.backfilling[late].exact
        assert kit.store.get("index", backfilled_key(late, ids[4])) is not None
    while late in state.backfilling:
        run(commands.backfill_group(late, 3))
    assert [mid for mid, _due in _held_by(state, late)] == [*ids[:4], ids[5]]
    assert state.get_message(ids[4]) == ("t", bytes([4]), 1000, 1504, 1)  # g1's copy
    assert (ids[4], 1504) in _held_by(state, g1)
