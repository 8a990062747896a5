"""QueueState: publish, groups, ack/nack/expire/dead-letter, persistence and the observer.

Every test runs on a MemoryStore and on a real RocksDB ``Database`` (the ``kit`` fixture),
so the two stores are held to the same behaviour. Source: ``DESIGN.md``, "Message
semantics" and "Storage layout".
"""

from __future__ import annotations

from typing import Any

import pytest
from state_helpers import Recorder, SpyStore, StoreKit, dump, group_snapshot

from futureq.state import commands
from futureq.state.commands import CommandKind, GroupSettings, schedule_key
from futureq.state.queue_state import QueueState
from futureq.state.records import PARKED_DUE_MS
from futureq.state.store import MemoryStore


class Runner:
    """Applies encoded commands at consecutive log indexes."""

    def __init__(self, state: QueueState) -> None:
        self.state = state

    def __call__(self, data: bytes) -> Any:
        return self.state.apply(self.state.applied_index + 1, data)


def _make(kit: StoreKit) -> tuple[QueueState, Runner]:
    state = QueueState(kit.store)
    return state, Runner(state)


def _gid(state: QueueState, topic: str, name: str) -> int:
    info = state.find_group(topic, name)
    assert info is not None, (topic, name)
    return info.group_id


def _keys(state: QueueState, gid: int) -> list[bytes]:
    return [schedule_key(gid, due, mid) for due, mid, _, _ in state.scan_schedule(gid, 0, 0, 10**6)]


# ---------------------------------------------------------------- publish


def test_publish_assigns_ids_from_index_and_position(kit: StoreKit) -> None:
    state, run = _make(kit)
    run(commands.NOOP)
    run(commands.NOOP)
    first = run(commands.publish(1000, [("t", b"a", 1500, None), ("t", b"b", 1200, 50)]))
    assert first == (3 << 16) | 0
    assert state.get_message(3 << 16) == ("t", b"a", 1000, 1500, 1)
    assert state.get_message((3 << 16) | 1) == ("t", b"b", 1000, 1200, 1)
    second = run(commands.publish(1001, [("t", b"c", 1001, None)]))
    assert second == 4 << 16


def test_publish_stores_one_schedule_entry_per_group(kit: StoreKit) -> None:
    state, run = _make(kit)
    g1 = run(commands.create_group("t", "g1", None, None))
    g2 = run(commands.create_group("t", "g2", None, None))
    assert g1 != g2
    mid = run(commands.publish(1000, [("t", b"a", 1500, 200)]))
    assert isinstance(mid, int)
    assert state.get_message(mid) == ("t", b"a", 1000, 1500, 2)
    for gid in (g1, g2):
        assert state.get_schedule(schedule_key(gid, 1500, mid)) == (0, 1700)
        assert list(state.scan_schedule(gid, 0, 0, 10)) == [(1500, mid, 0, 1700)]
    assert [g.pending for g in state.topic_groups("t")] == [1, 1]
    assert state.last_publish_ms == 1000


def test_scan_schedule_is_in_due_then_id_order_and_bounded(kit: StoreKit) -> None:
    state, run = _make(kit)
    gid = run(commands.create_group("t", "g", None, None))
    other = run(commands.create_group("u", "g", None, None))
    run(
        commands.publish(10, [("t", b"x", 300, None), ("t", b"y", 100, None), ("u", b"z", 5, None)])
    )
    run(commands.publish(11, [("t", b"w", 100, None)]))
    base3, base4 = 3 << 16, 4 << 16
    entries = list(state.scan_schedule(gid, 0, 0, 10))
    assert [(d, m) for d, m, _, _ in entries] == [(100, base3 + 1), (100, base4), (300, base3)]
    assert [(d, m) for d, m, _, _ in state.scan_schedule(gid, 100, base3 + 2, 10)] == [
        (100, base4),
        (300, base3),
    ]
    assert len(list(state.scan_schedule(gid, 0, 0, 2))) == 2
    assert [(d, m) for d, m, _, _ in state.scan_schedule(other, 0, 0, 10)] == [(5, base3 + 2)]


def test_topic_without_group_gets_implicit_default_group(kit: StoreKit) -> None:
    state, run = _make(kit)
    recorder = Recorder(state)
    mid = run(commands.publish(1000, [("t", b"a", 1000, None)], GroupSettings(1234, 7)))
    groups = state.topic_groups("t")
    assert [(g.name, g.implicit, g.pending) for g in groups] == [("default", True, 1)]
    assert (groups[0].visibility_timeout_ms, groups[0].max_deliveries) == (1234, 7)
    gid = groups[0].group_id
    assert recorder.take() == [("g", gid), ("s", gid, 1000, mid, None, 0)]
    assert recorder.violations == []
    assert state.topics() == ["t"]


def test_first_create_group_adopts_implicit_group_and_keeps_its_backlog(kit: StoreKit) -> None:
    state, run = _make(kit)
    run(commands.publish(1000, [("t", b"a", 1000, None), ("t", b"b", 2000, None)]))
    implicit = _gid(state, "t", "default")
    backlog = _keys(state, implicit)
    assert len(backlog) == 2
    recorder = Recorder(state)
    gid = run(commands.create_group("t", "workers", 5000, 3))
    assert gid == implicit
    assert state.find_group("t", "default") is None
    info = state.find_group("t", "workers")
    assert info is not None
    assert (info.implicit, info.pending, info.visibility_timeout_ms, info.max_deliveries) == (
        False,
        2,
        5000,
        3,
    )
    assert _keys(state, gid) == backlog
    assert recorder.take() == [("g", gid)]
    # The group record moved to its new name: exactly one record in the family.
    assert [k for k, _ in kit.store.scan("groups", b"")] == [b"t\x00workers"]


def test_second_group_is_new_and_only_receives_later_messages(kit: StoreKit) -> None:
    state, run = _make(kit)
    early = run(commands.publish(1000, [("t", b"early", 1000, None)]))
    workers = run(commands.create_group("t", "workers", None, None))
    audit = run(commands.create_group("t", "audit", None, None))
    assert audit != workers
    late = run(commands.publish(1001, [("t", b"late", 1001, None)]))
    assert [g.name for g in state.topic_groups("t")] == ["workers", "audit"]
    assert assert_int(early) in [m for _, m, _, _ in state.scan_schedule(workers, 0, 0, 9)]
    assert [m for _, m, _, _ in state.scan_schedule(audit, 0, 0, 9)] == [late]
    assert [m for _, m, _, _ in state.scan_schedule(workers, 0, 0, 9)] == [early, late]
    assert state.get_message(assert_int(early)) == ("t", b"early", 1000, 1000, 1)
    assert state.get_message(assert_int(late)) == ("t", b"late", 1001, 1001, 2)
    assert [g.pending for g in state.topic_groups("t")] == [2, 1]


def assert_int(value: object) -> int:
    assert isinstance(value, int)
    return value


def test_create_group_named_default_takes_the_implicit_group_as_is(kit: StoreKit) -> None:
    state, run = _make(kit)
    run(commands.publish(1000, [("t", b"a", 1000, None)]))
    implicit = _gid(state, "t", "default")
    assert run(commands.create_group("t", "default", None, 9)) == implicit
    info = state.find_group("t", "default")
    assert info is not None and not info.implicit and info.max_deliveries == 9
    # Not implicit any more: the next group is a new one.
    assert run(commands.create_group("t", "other", None, None)) != implicit


def test_create_group_is_idempotent_and_updates_config(kit: StoreKit) -> None:
    state, run = _make(kit)
    leader = GroupSettings(visibility_timeout_ms=111, max_deliveries=5)
    gid = run(commands.create_group("t", "g", None, None, leader))
    info = state.find_group("t", "g")
    assert info is not None and (info.visibility_timeout_ms, info.max_deliveries) == (111, 5)
    # None keeps an existing group's value, whatever defaults the command carries.
    other_leader = GroupSettings(visibility_timeout_ms=9000, max_deliveries=3)
    assert run(commands.create_group("t", "g", None, None, other_leader)) == gid
    assert (info.visibility_timeout_ms, info.max_deliveries) == (111, 5)
    assert run(commands.create_group("t", "g", 999, None, other_leader)) == gid
    assert (info.visibility_timeout_ms, info.max_deliveries) == (999, 5)
    assert run(commands.create_group("t", "g", None, 2)) == gid
    assert (info.visibility_timeout_ms, info.max_deliveries) == (999, 2)
    assert len(state.topic_groups("t")) == 1
    reopened = QueueState(kit.reopen())
    assert group_snapshot(reopened) == group_snapshot(state)


# ---------------------------------------------------------------- ack / nack / expire


def _two_groups_one_message(kit: StoreKit) -> tuple[QueueState, Runner, int, int, int]:
    state, run = _make(kit)
    g1 = run(commands.create_group("t", "g1", None, None))
    g2 = run(commands.create_group("t", "g2", None, None))
    mid = assert_int(run(commands.publish(1000, [("t", b"a", 1500, 100)])))
    return state, run, assert_int(g1), assert_int(g2), mid


def test_ack_removes_entry_and_deletes_message_after_every_group_acked(kit: StoreKit) -> None:
    state, run, g1, g2, mid = _two_groups_one_message(kit)
    recorder = Recorder(state)
    k1, k2 = schedule_key(g1, 1500, mid), schedule_key(g2, 1500, mid)
    assert run(commands.ack([k1])) == 1
    assert state.get_schedule(k1) is None
    assert state.get_schedule(k2) == (0, 1600)
    assert state.get_message(mid) == ("t", b"a", 1000, 1500, 1)
    assert [g.pending for g in state.topic_groups("t")] == [0, 1]
    assert recorder.take() == [("u", g1, 1500, mid, CommandKind.ACK)]
    assert run(commands.ack([k2])) == 1
    assert state.get_message(mid) is None
    assert dump(kit.store)["messages"] == []
    assert dump(kit.store)["schedule"] == []
    assert [g.pending for g in state.topic_groups("t")] == [0, 0]
    assert recorder.violations == []


def test_ack_of_unknown_or_already_acked_key_is_ignored(kit: StoreKit) -> None:
    state, run, g1, g2, mid = _two_groups_one_message(kit)
    k1 = schedule_key(g1, 1500, mid)
    assert run(commands.ack([k1, k1])) == 1  # the same key twice in one batch counts once
    before = dump(kit.store)
    recorder = Recorder(state)
    assert run(commands.ack([k1])) == 0
    assert run(commands.ack([schedule_key(g1, 1500, mid + 1), schedule_key(99, 1, 1)])) == 0
    assert recorder.take() == []
    after = dump(kit.store)
    assert {k: v for k, v in after.items() if k != "meta"} == {
        k: v for k, v in before.items() if k != "meta"
    }
    assert [g.pending for g in state.topic_groups("t")] == [0, 1]


def test_nack_moves_entry_to_now_plus_delay_and_keeps_expiry(kit: StoreKit) -> None:
    state, run, g1, g2, mid = _two_groups_one_message(kit)
    recorder = Recorder(state)
    old = schedule_key(g1, 1500, mid)
    assert run(commands.nack(2000, 250, [(old, 3)])) == 1
    new = schedule_key(g1, 2250, mid)
    assert state.get_schedule(old) is None
    assert state.get_schedule(new) == (3, 1600)  # expire_ms stays absolute (due + ttl)
    assert state.get_schedule(schedule_key(g2, 1500, mid)) == (0, 1600)
    assert [g.pending for g in state.topic_groups("t")] == [1, 1]
    assert state.get_message(mid) == ("t", b"a", 1000, 1500, 2)
    assert recorder.take() == [
        ("u", g1, 1500, mid, CommandKind.NACK),
        ("s", g1, 2250, mid, 1600, 3),
    ]
    assert run(commands.nack(3000, 0, [(old, 4)])) == 0  # the old key is gone
    assert recorder.take() == []
    assert recorder.violations == []


def test_nack_never_moves_an_entry_earlier(kit: StoreKit) -> None:
    state, run, g1, _g2, mid = _two_groups_one_message(kit)
    key = schedule_key(g1, 1500, mid)
    assert run(commands.nack(1000, 100, [(key, 1)])) == 1
    assert state.get_schedule(key) == (1, 1600)


def test_expire_removes_entries_and_releases_message(kit: StoreKit) -> None:
    state, run, g1, g2, mid = _two_groups_one_message(kit)
    recorder = Recorder(state)
    keys = [schedule_key(g1, 1500, mid), schedule_key(g2, 1500, mid)]
    assert run(commands.expire(keys)) == 2
    assert state.get_message(mid) is None
    assert [state.get_schedule(k) for k in keys] == [None, None]
    assert recorder.take() == [
        ("u", g1, 1500, mid, CommandKind.EXPIRE),
        ("u", g2, 1500, mid, CommandKind.EXPIRE),
    ]
    assert run(commands.expire(keys)) == 0


# ---------------------------------------------------------------- dead letters


def test_dead_letter_moves_message_to_dlq_topic_with_fresh_id(kit: StoreKit) -> None:
    state, run = _make(kit)
    gid = assert_int(run(commands.create_group("t", "g", None, None)))
    mid = assert_int(run(commands.publish(1000, [("t", b"payload", 1500, 60)])))
    recorder = Recorder(state)
    index = state.applied_index + 1
    first = run(commands.dead_letter(5000, [(schedule_key(gid, 1500, mid), 16)]))
    assert first == index << 16
    assert state.get_message(mid) is None  # its only group is done with it
    assert state.get_schedule(schedule_key(gid, 1500, mid)) is None
    dlq = state.find_group("t.dlq", "default")
    assert dlq is not None and dlq.implicit and dlq.pending == 1
    assert dlq.dead_letter_topic is None
    assert state.get_message(index << 16) == ("t.dlq", b"payload", 5000, 5000, 1)
    assert list(state.scan_schedule(dlq.group_id, 0, 0, 9)) == [(5000, index << 16, 0, None)]
    assert state.last_publish_ms == 5000
    assert recorder.take() == [
        ("u", gid, 1500, mid, CommandKind.DEAD_LETTER),
        ("g", dlq.group_id),
        ("s", dlq.group_id, 5000, index << 16, None, 0),
    ]


def test_dead_letter_keeps_message_until_other_groups_are_done(kit: StoreKit) -> None:
    state, run, g1, g2, mid = _two_groups_one_message(kit)
    run(commands.dead_letter(3000, [(schedule_key(g1, 1500, mid), 16)]))
    assert state.get_message(mid) == ("t", b"a", 1000, 1500, 1)
    assert run(commands.ack([schedule_key(g2, 1500, mid)])) == 1
    assert state.get_message(mid) is None
    assert state.find_group("t.dlq", "default") is not None


def test_dead_letter_topic_never_dead_letters_further(kit: StoreKit) -> None:
    # A message out of attempts on a dead-letter topic is parked (kept, never delivered
    # again until redriven), not sent to a dead-letter topic of its own (issue 14).
    state, run = _make(kit)
    mid = assert_int(run(commands.publish(1000, [("t.dlq", b"x", 1000, None)])))
    gid = _gid(state, "t.dlq", "default")
    before = dump(kit.store)
    run(commands.dead_letter(2000, [(schedule_key(gid, 1000, mid), 99)]))
    assert state.get_schedule(schedule_key(gid, 1000, mid)) is None
    assert state.get_schedule(schedule_key(gid, PARKED_DUE_MS, mid)) == (99, None)
    assert state.entry_key(mid, gid) == schedule_key(gid, PARKED_DUE_MS, mid)
    assert state.topics() == ["t.dlq"]
    after = dump(kit.store)
    assert after["messages"] == before["messages"]
    assert state.groups[gid].pending == 1


def test_dead_letter_of_unknown_key_is_ignored(kit: StoreKit) -> None:
    state, run, g1, _g2, mid = _two_groups_one_message(kit)
    key = schedule_key(g1, 1500, mid)
    run(commands.ack([key]))
    before = dump(kit.store)
    run(commands.dead_letter(3000, [(key, 5), (schedule_key(77, 1, 1), 5)]))
    after = dump(kit.store)
    assert {f: after[f] for f in ("messages", "schedule", "groups")} == {
        f: before[f] for f in ("messages", "schedule", "groups")
    }


# ---------------------------------------------------------------- delete group


def test_delete_group_removes_it_at_once_and_purges_its_entries_in_chunks(
    kit: StoreKit,
) -> None:
    state, run = _make(kit)
    g1 = assert_int(run(commands.create_group("t", "g1", None, None)))
    only = assert_int(run(commands.publish(1000, [("t", b"only-g1", 1000, None)])))
    g2 = assert_int(run(commands.create_group("t", "g2", None, None)))
    shared = assert_int(run(commands.publish(1001, [("t", b"both", 1001, None)])))
    more = assert_int(run(commands.publish(1002, [("t", b"x", 1002, None)] * 3)))
    recorder = Recorder(state)
    assert run(commands.delete_group("t", "g1")) is True
    # The group is gone at once; its 5 entries wait for PURGE_GROUP.
    assert recorder.take() == [("g", g1)]
    assert state.find_group("t", "g1") is None and g1 not in state.groups
    assert [(d.group_id, d.topic, d.name, d.pending) for d in state.deleting.values()] == [
        (g1, "t", "g1", 5)
    ]
    assert [g.group_id for g in state.topic_groups("t")] == [g2]
    assert run(commands.purge_group(g1, 2)) == 2
    assert recorder.take() == [
        ("u", g1, 1000, only, CommandKind.PURGE_GROUP),
        ("u", g1, 1001, shared, CommandKind.PURGE_GROUP),
    ]
    assert state.get_message(only) is None
    assert state.get_message(shared) == ("t", b"both", 1001, 1001, 1)
    assert state.deleting[g1].pending == 3
    reopened = QueueState(kit.reopen())
    assert reopened.deleting[g1].pending == 3
    # The next chunk starts after the last key purged (a replicated cursor).
    assert reopened.deleting[g1].cursor == schedule_key(g1, 1001, shared)
    state, run, recorder = reopened, Runner(reopened), Recorder(reopened)
    assert run(commands.purge_group(g1, 3)) == 3  # the last ones: the group is forgotten
    assert state.deleting == {}
    assert recorder.take()[-1] == ("g", g1)
    assert state.get_message(more) == ("t", b"x", 1002, 1002, 1)  # g2 still holds it
    assert (
        list(kit.store.scan_keys("schedule", g1.to_bytes(4, "big"), (g1 + 1).to_bytes(4, "big")))
        == []
    )
    assert kit.store.get("meta", b"pending:" + g1.to_bytes(4, "big")) is None
    assert kit.store.get("meta", b"deleting:" + g1.to_bytes(4, "big")) is None
    assert run(commands.purge_group(g1, 3)) == 0
    assert run(commands.delete_group("t", "g1")) is False
    assert run(commands.delete_group("nope", "g")) is False


def test_purge_group_chunks_are_capped(kit: StoreKit) -> None:
    state, run = _make(kit)
    gid = assert_int(run(commands.create_group("t", "g", None, None)))
    run(commands.publish(1000, [("t", b"m", 1000, None)] * 3))
    run(commands.delete_group("t", "g"))
    assert run(commands.purge_group(gid, 0)) == 1  # at least one per command
    assert run(commands.purge_group(gid, 10**9)) == 2
    assert state.deleting == {}


def test_a_group_of_the_same_name_may_exist_while_the_old_one_is_purged(kit: StoreKit) -> None:
    state, run = _make(kit)
    old = assert_int(run(commands.create_group("t", "g", None, None)))
    run(commands.publish(1000, [("t", b"old", 1000, None)]))
    run(commands.delete_group("t", "g"))
    new = assert_int(run(commands.create_group("t", "g", None, None)))
    assert new != old
    mid = assert_int(run(commands.publish(1001, [("t", b"new", 1001, None)])))
    assert list(state.scan_schedule(new, 0, 0, 9)) == [(1001, mid, 0, None)]
    assert state.deleting[old].pending == 1
    assert run(commands.purge_group(old, 10)) == 1
    assert state.find_group("t", "g") is not None and state.deleting == {}


def test_deleting_last_group_forgets_topic_and_next_publish_recreates_default(
    kit: StoreKit,
) -> None:
    state, run = _make(kit)
    gid = run(commands.create_group("t", "g", None, None))
    assert run(commands.delete_group("t", "g")) is True
    assert state.topics() == []
    run(commands.publish(1000, [("t", b"a", 1000, None)]))
    info = state.find_group("t", "default")
    assert info is not None and info.implicit and info.group_id != gid  # ids never reused


# ---------------------------------------------------------------- persistence


def test_applied_index_is_written_in_the_same_write_as_the_changes(kit: StoreKit) -> None:
    spy = SpyStore(kit.store)
    state = QueueState(spy)
    state.apply(1, commands.publish(1000, [("t", b"a", 1000, None)]))
    state.apply(2, commands.NOOP)
    assert len(spy.writes) == 2
    first, second = spy.writes
    assert first["meta"][b"applied_index"] == (1).to_bytes(8, "big")
    assert len(first["messages"]) == 1 and len(first["schedule"]) == 1
    assert second["meta"] == {
        b"applied_index": (2).to_bytes(8, "big"),
        b"applied_digest": state.applied_digest.to_bytes(4, "big"),
    }
    assert kit.store.get("meta", b"applied_index") == (2).to_bytes(8, "big")


def test_applied_digest_is_equal_for_equal_histories_and_survives_a_reopen(kit: StoreKit) -> None:
    state = QueueState(kit.store)
    twin = QueueState(MemoryStore())
    other = QueueState(MemoryStore())
    for index, command in enumerate(
        [commands.publish(1000, [("t", b"a", 1000, None)]), commands.NOOP], start=1
    ):
        state.apply(index, command)
        twin.apply(index, command)
    other.apply(1, commands.publish(1000, [("t", b"b", 1000, None)]))
    other.apply(2, commands.NOOP)
    state.apply_other(3)
    twin.apply_other(3)
    assert state.applied_digest == twin.applied_digest != 0
    assert other.applied_digest != state.applied_digest
    assert QueueState(kit.reopen()).applied_digest == twin.applied_digest


def test_apply_requires_the_next_index(kit: StoreKit) -> None:
    state, run = _make(kit)
    run(commands.NOOP)
    with pytest.raises(AssertionError):
        state.apply(3, commands.NOOP)
    with pytest.raises(AssertionError):
        state.apply(1, commands.NOOP)
    assert state.applied_index == 1


def test_reopen_rebuilds_groups_pending_counts_and_stamps(kit: StoreKit) -> None:
    state, run = _make(kit)
    run(commands.publish(1000, [("a", b"1", 1000, None), ("a", b"2", 1100, 10)]))
    run(commands.create_group("a", "w", 700, 4))
    run(commands.create_group("a", "x", None, None))
    run(commands.create_group("b", "y", None, None))
    run(commands.publish(2000, [("a", b"3", 2500, None), ("b", b"4", 2000, None)]))
    run(commands.publish(1500, [("c", b"5", 1500, None)]))  # an older stamp
    w = _gid(state, "a", "w")
    run(commands.ack([schedule_key(w, 1000, 1 << 16)]))
    run(commands.nack(3000, 10, [(schedule_key(w, 1100, (1 << 16) | 1), 2)]))
    run(commands.delete_group("b", "y"))
    before = (group_snapshot(state), state.last_publish_ms, state.applied_index, dump(kit.store))
    assert state.last_publish_ms == 2000

    reopened = QueueState(kit.reopen())
    after = (
        group_snapshot(reopened),
        reopened.last_publish_ms,
        reopened.applied_index,
        dump(kit.store),
    )
    assert after == before
    assert reopened.topics() == state.topics() == ["a", "c"]


def test_reopen_then_continue_gives_same_ids(kit: StoreKit) -> None:
    state, run = _make(kit)
    run(commands.create_group("t", "g", None, None))
    run(commands.publish(1000, [("u", b"a", 1000, None)]))
    reopened = QueueState(kit.reopen())
    gid = reopened.apply(reopened.applied_index + 1, commands.create_group("t", "h", None, None))
    assert gid == max(state.groups) + 1
    assert reopened.applied_index == 3


# ---------------------------------------------------------------- attempts


def test_delivered_records_attempts_and_never_lowers_them(kit: StoreKit) -> None:
    state, run, g1, g2, mid = _two_groups_one_message(kit)
    recorder = Recorder(state)
    key = schedule_key(g1, 1500, mid)
    assert run(commands.delivered([(key, 1), (schedule_key(g1, 1, 1), 1)])) == 1
    assert state.get_schedule(key) == (1, 1600)
    assert run(commands.delivered([(key, 3)])) == 1
    assert run(commands.delivered([(key, 2)])) == 0  # a late, lower record changes nothing
    assert state.get_schedule_entry(key) == (3, 1600, 0)
    assert state.get_schedule(schedule_key(g2, 1500, mid)) == (0, 1600)
    assert recorder.take() == []  # in flight: nothing moves in the due order
    reopened = QueueState(kit.reopen())
    assert reopened.get_schedule(key) == (3, 1600)


def test_nack_keeps_the_highest_attempt(kit: StoreKit) -> None:
    state, run, g1, _g2, mid = _two_groups_one_message(kit)
    key = schedule_key(g1, 1500, mid)
    run(commands.delivered([(key, 4)]))
    assert run(commands.nack(2000, 0, [(key, 2)])) == 1
    assert state.get_schedule(schedule_key(g1, 2000, mid)) == (4, 1600)


def test_release_gives_the_latest_attempt_back_uncounted(kit: StoreKit) -> None:
    state, run, g1, _g2, mid = _two_groups_one_message(kit)
    key = schedule_key(g1, 1500, mid)
    run(commands.delivered([(key, 2)]))
    recorder = Recorder(state)
    assert run(commands.release([(key, 1)])) == 0  # older than the latest delivery
    assert run(commands.release([(key, 2)])) == 1
    assert state.get_schedule_entry(key) == (2, 1600, 1)  # same place: due again at once
    assert recorder.take() == [
        ("u", g1, 1500, mid, CommandKind.RELEASE),
        ("s", g1, 1500, mid, 1600, 2, 1),
    ]
    assert run(commands.release([(key, 2)])) == 0  # released already
    assert list(state.scan_schedule_entries(g1, 0, 0, 9)) == [(1500, mid, 2, 1600, 1, None)]
    run(commands.delivered([(key, 3)]))
    assert state.get_schedule_entry(key) == (3, 1600, 1)
    assert run(commands.nack(2000, 0, [(key, 3)])) == 1
    assert state.get_schedule_entry(schedule_key(g1, 2000, mid)) == (3, 1600, 1)
    assert recorder.take()[-1] == ("s", g1, 2000, mid, 1600, 3, 1)


def test_release_of_an_unrecorded_first_delivery_records_it(kit: StoreKit) -> None:
    state, run, g1, _g2, mid = _two_groups_one_message(kit)
    key = schedule_key(g1, 1500, mid)
    assert state.get_schedule(key) == (0, 1600)  # a first delivery is not recorded
    assert run(commands.release([(key, 1)])) == 1
    assert state.get_schedule_entry(key) == (1, 1600, 1)
    assert run(commands.release([(key, 1)])) == 0


# ---------------------------------------------------------------- nothing node-local


def test_group_settings_come_from_the_command_never_from_the_replica(kit: StoreKit) -> None:
    """Every group a command creates gets the settings the leader put in it."""
    state, run = _make(kit)
    leader = GroupSettings(visibility_timeout_ms=3000, max_deliveries=4)
    run(commands.publish(1000, [("implicit", b"a", 1000, None)], leader))
    run(commands.create_group("explicit", "g", None, None, leader))
    gid = _gid(state, "implicit", "default")
    mid = 1 << 16
    run(commands.dead_letter(2000, [(schedule_key(gid, 1000, mid), 4)], leader))
    for topic, name in (("explicit", "g"), ("implicit.dlq", "default")):
        info = state.find_group(topic, name)
        assert info is not None
        assert (info.visibility_timeout_ms, info.max_deliveries) == (3000, 4)


def test_entries_written_before_settings_existed_take_the_builtin_defaults(
    kit: StoreKit,
) -> None:
    state, run = _make(kit)
    run(commands.encode([CommandKind.PUBLISH, 1000, [("t", b"a", 1000, None)]]))
    run(commands.encode([CommandKind.CREATE_GROUP, "u", "g", None, None]))
    for topic, name in (("t", "default"), ("u", "g")):
        info = state.find_group(topic, name)
        assert info is not None
        assert (info.visibility_timeout_ms, info.max_deliveries) == (30_000, 16)


def test_applied_digest_covers_the_resulting_state(kit: StoreKit) -> None:
    """Two replicas whose states differ show different digests after the same command,
    where a digest of the command bytes alone would be equal."""
    state = QueueState(kit.store)
    twin_store = MemoryStore()
    twin = QueueState(twin_store)
    for replica in (state, twin):
        replica.apply(1, commands.create_group("t", "g", None, None))
    assert state.applied_digest == twin.applied_digest
    # The twin diverged without its log saying so (a bug, a node-local setting): its
    # store holds a second group of the topic.
    twin_store.write({"groups": {b"t\x00extra": commands.encode([99, 1000, 3, False])}})
    twin = QueueState(twin_store)
    assert twin.applied_digest == state.applied_digest  # nothing shows yet
    command = commands.publish(1000, [("t", b"a", 1000, None)])
    state.apply(2, command)
    twin.apply(2, command)
    assert state.applied_digest != twin.applied_digest
