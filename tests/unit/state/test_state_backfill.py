"""QueueState: a group created ``from_backlog`` gets exactly the backlog (kind 38).

The backfill of a group created from the backlog is the set of messages pending in
the topic's other groups when it was created: each reaches the new group once, due as
the source groups held it then, whatever they do while the BACKFILL_GROUP chunks run
(ACK, CANCEL, EXPIRE, dead-lettering, PURGE, deletion, NACK). Found by a tester: a
message a source group let go of before the chunks reached it never reached the new
group, and one the new group had acknowledged was copied again from a second source
group (or from the same one after a NACK moved it ahead of the cursor) and delivered
again. Each command is applied to a real RocksDB store and to a MemoryStore (``kit``).
Source: ``docs/protocol.md``, "CREATE_GROUP" (``from_backlog``).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from state_helpers import StoreKit

from futureq.state import commands
from futureq.state.commands import CommandKind, schedule_key
from futureq.state.queue_state import QueueState
from futureq.state.records import PARKED_DUE_MS
from futureq.wire.frames import ItemStatus

DONE, UNKNOWN = ItemStatus.DONE, ItemStatus.UNKNOWN


class Runner:
    """Applies encoded commands at consecutive log indexes."""

    def __init__(self, state: QueueState) -> None:
        self.state = state

    def __call__(self, data: bytes) -> Any:
        return self.state.apply(self.state.applied_index + 1, data)


def _under_way(
    kit: StoreKit, sources: int = 1, chunk: int = 3
) -> tuple[QueueState, Runner, list[int], int, list[int]]:
    """``sources`` groups of t hold 6 messages (due 1500..1505, TTL 100); group
    ``late`` is created from the backlog and a first chunk of ``chunk`` entries ran
    (0: none)."""
    state = QueueState(kit.store)
    run = Runner(state)
    gids = [run(commands.create_group("t", f"g{n}", None, None)) for n in range(sources)]
    first = run(commands.publish(1000, [("t", bytes([i]), 1500 + i, 100) for i in range(6)]))
    late = run(commands.create_group("t", "late", None, None, from_backlog=True))
    if chunk:
        run(commands.backfill_group(late, chunk))
    return state, run, gids, late, [first + i for i in range(6)]


def _finish(state: QueueState, run: Runner, late: int) -> None:
    for _ in range(100):
        if late not in state.backfilling:
            return
        run(commands.backfill_group(late, 3))
    raise AssertionError("the backfill never ended")


def _held_by(state: QueueState, gid: int) -> list[tuple[int, int]]:
    return sorted((mid, due) for due, mid, _a, _e in state.scan_schedule(gid, 0, 0, 100))


def _marks(state: QueueState) -> list[bytes]:
    """``index`` keys other than moved entries and idempotency keys (the backfill's)."""
    return [key for key, _ in state.store.scan("index", b"") if key[:1] not in (b"d", b"k", b"t")]


def _let_go(how: str, state: QueueState, run: Runner, g0: int, mid: int) -> None:
    """Group ``g0`` (named "g0") lets go of its entry of ``mid`` the way ``how`` says."""
    key = state.entry_key(mid, g0)
    assert key is not None
    if how == "ack":
        assert run(commands.ack([key])) == 1
    elif how == "cancel":
        assert run(commands.cancel("t", g0, [mid])) == [DONE]
    elif how == "expire":
        assert run(commands.expire([key])) == 1
    elif how == "dead_letter":
        run(commands.dead_letter(1600, [(key, 1)]))
        assert state.entry_key(mid, g0) is None
    elif how == "nack_dead_letter":
        assert run(commands.nack(1600, 0, [(key, 1)], "bad", dead_letter=True)) == 1
    elif how == "purge":
        assert run(commands.purge([g0])) == 6
        while g0 in state.purging:
            run(commands.purge_group(g0, 2))  # PURGE's chunks are BACKFILL's sibling
    elif how == "delete":
        assert run(commands.delete_group("t", "g0")) is True
        while g0 in state.deleting:
            run(commands.purge_group(g0, 2))
    else:
        raise AssertionError(how)


@pytest.mark.parametrize(
    "how", ["ack", "cancel", "dead_letter", "nack_dead_letter", "purge", "delete"]
)
def test_a_message_its_source_group_lets_go_of_before_the_backfill_reaches_it_still_arrives(
    kit: StoreKit, how: str
) -> None:
    """Before, the chunks only found what the source groups still held when they got
    there: g1's ACK (or CANCEL, dead-lettering, ...) of message 4 before the chunks reached it
    deleted the message, and ``late`` never got it. Now g1 letting go of it copies it
    ahead to ``late``, due at its published time with its published expiry."""
    state, run, (g1,), late, ids = _under_way(kit)
    _let_go(how, state, run, g1, ids[4])
    _finish(state, run, late)
    assert _held_by(state, late) == [(mid, 1500 + i) for i, mid in enumerate(ids)]
    assert state.get_schedule(schedule_key(late, 1504, ids[4])) == (0, 1604)
    assert state.groups[late].pending == 6
    assert _marks(state) == []  # the chunks passed it and dropped its mark
    if how in ("purge", "delete"):
        assert state.get_message(ids[4]) == ("t", b"\x04", 1000, 1504, 1)


def test_what_a_purge_started_before_the_group_removes_is_not_its_backlog(
    kit: StoreKit,
) -> None:
    """A PURGE of g0 started before ``late`` was created: what its chunks have yet to
    remove was removed already (the dispatcher and BROWSE treat it so), not pending.
    Before, the backfill copied what the purge had not reached yet, and ``late`` got
    purged messages; now it gets only what g1 still holds."""
    state = QueueState(kit.store)
    run = Runner(state)
    g0 = run(commands.create_group("t", "g0", None, None))
    g1 = run(commands.create_group("t", "g1", None, None))
    first = run(commands.publish(1000, [("t", bytes([i]), 1500 + i, None) for i in range(4)]))
    ids = [first + i for i in range(4)]
    assert run(commands.cancel("t", g1, ids[2:])) == [DONE, DONE]
    assert run(commands.purge([g0])) == 4
    late = run(commands.create_group("t", "late", None, None, from_backlog=True))
    run(commands.backfill_group(late, 3))
    while g0 in state.purging:
        run(commands.purge_group(g0, 1))
    _finish(state, run, late)
    assert [mid for mid, _due in _held_by(state, late)] == ids[:2]
    assert state.get_message(ids[3]) is None
    assert _marks(state) == []


@pytest.mark.parametrize("then", ["purge", "delete"])
def test_what_a_purge_started_before_the_group_removes_stays_out_after_the_source_changes(
    kit: StoreKit, then: str
) -> None:
    """A PURGE of g0 was under way when ``late`` was created; then g0 is purged again
    (or deleted) before the backfill ends, and the node restarts. Before, the new
    purge (or the deletion) took the first one's place and the backfill copied what it
    had been removing: ``late`` got messages purged before it existed. Now the
    creation keeps the first purge's bound, and ``late`` gets only what g1 holds."""
    state = QueueState(kit.store)
    run = Runner(state)
    g0 = run(commands.create_group("t", "g0", None, None))
    g1 = run(commands.create_group("t", "g1", None, None))
    first = run(commands.publish(1000, [("t", bytes([i]), 1500 + i, None) for i in range(4)]))
    ids = [first + i for i in range(4)]
    assert run(commands.cancel("t", g1, ids[2:])) == [DONE, DONE]
    assert run(commands.purge([g0])) == 4
    late = run(commands.create_group("t", "late", None, None, from_backlog=True))
    state = QueueState(kit.reopen())
    run = Runner(state)
    if then == "purge":
        assert run(commands.purge([g0])) == 4
    else:
        assert run(commands.delete_group("t", "g0")) is True
    for _ in range(20):
        for gid in [*state.purging, *state.deleting]:
            run(commands.purge_group(gid, 1))
    assert not state.purging and not state.deleting
    _finish(state, run, late)
    assert [mid for mid, _due in _held_by(state, late)] == ids[:2]
    assert [mid for mid, _due in _held_by(state, g1)] == ids[:2]
    assert _marks(state) == []


def test_a_message_the_new_group_acked_is_not_copied_again_from_another_source_group(
    kit: StoreKit,
) -> None:
    """Before, the chunks walked g0, then g1: message 5 was copied from g0, acked in
    ``late``, then copied again from g1 and delivered again after its ACK."""
    state, run, (g0, g1), late, ids = _under_way(kit, sources=2, chunk=12)
    assert (ids[5], 1505) in _held_by(state, late)
    assert run(commands.ack([schedule_key(late, 1505, ids[5])])) == 1
    _finish(state, run, late)
    assert _held_by(state, late) == [(mid, 1500 + i) for i, mid in enumerate(ids[:5])]
    assert state.groups[late].pending == 5
    assert state.get_message(ids[5]) == ("t", b"\x05", 1000, 1505, 2)  # g0's and g1's


def test_a_message_a_nack_moves_ahead_of_the_backfill_is_not_copied_again(
    kit: StoreKit,
) -> None:
    """Before, a NACK in g0 moved message 1 (already copied and acked in ``late``) to
    due 1600, ahead of the chunks' cursor in g0's due order; they copied it again."""
    state, run, (g0,), late, ids = _under_way(kit)
    assert run(commands.ack([schedule_key(late, 1501, ids[1])])) == 1
    assert run(commands.nack(1550, 50, [(schedule_key(g0, 1501, ids[1]), 1)])) == 1
    assert state.entry_key(ids[1], g0) == schedule_key(g0, 1600, ids[1])
    _finish(state, run, late)
    assert [mid for mid, _due in _held_by(state, late)] == [ids[0], *ids[2:]]


def test_a_cancel_during_a_backfill_treats_the_new_groups_copy_as_the_others(
    kit: StoreKit,
) -> None:
    """A CANCEL of every group, or of ``late`` only, names a message the chunks have
    not reached: ``late`` never gets it (before, a CANCEL of ``late`` only answered
    UNKNOWN and the chunks then copied it: a cancelled message was delivered)."""
    state, run, (g0,), late, ids = _under_way(kit)
    assert run(commands.cancel("t", None, [ids[4]])) == [DONE]
    assert state.get_message(ids[4]) is None
    assert run(commands.cancel("t", late, [ids[5]])) == [DONE]
    assert run(commands.cancel("t", late, [ids[5]])) == [UNKNOWN]  # a retry
    assert state.entry_key(ids[5], g0) == schedule_key(g0, 1505, ids[5])
    _finish(state, run, late)
    assert [mid for mid, _due in _held_by(state, late)] == ids[:4]
    assert state.groups[late].pending == 4
    assert _marks(state) == []


def test_an_exact_backfill_survives_a_restart_and_its_group_deleted_leaves_no_marks(
    kit: StoreKit,
) -> None:
    """The job (cursor, messages handled ahead of it) is stored: a restart continues
    it; a delete of the group being filled ends it and removes what it marked. (A
    CANCEL of ``late`` alone handles message 5 ahead of the chunks, which g0 still
    holds ahead of the cursor: that is marked.)"""
    state, run, (g0,), late, ids = _under_way(kit)
    assert run(commands.cancel("t", late, [ids[5]])) == [DONE]
    assert len(_marks(state)) == 1
    state = QueueState(kit.reopen())
    run = Runner(state)
    assert state.backfilling[late].exact and not state.backfilling[late].legacy_by_id
    _finish(state, run, late)
    assert [mid for mid, _due in _held_by(state, late)] == ids[:5]
    assert _marks(state) == []

    again = run(commands.create_group("t", "again", None, None, from_backlog=True))
    run(commands.backfill_group(again, 1))
    assert run(commands.cancel("t", again, [ids[4]])) == [DONE]
    assert len(_marks(state)) == 1
    assert run(commands.delete_group("t", "again")) is True
    assert again not in state.backfilling
    assert _marks(state) == []


def test_a_create_group_from_backlog_of_an_earlier_build_replays_as_it_applied(
    kit: StoreKit,
) -> None:
    """Kind 6 with ``from_backlog`` in a log keeps the rules it was applied with: the
    chunks walk the source groups' schedules and a message acked there first is not
    copied (the new rules come only with kinds 37 and 38; kind 37's own replay is
    in ``test_state_backfill_kinds.py``)."""
    assert commands.decode(commands.create_group("t", "x", None, None, from_backlog=True))[0] == (
        CommandKind.CREATE_GROUP_FROM_BACKLOG_AS_HELD
    )
    state = QueueState(kit.store)
    run = Runner(state)
    g0 = run(commands.create_group("t", "g0", None, None))
    first = run(commands.publish(1000, [("t", bytes([i]), 1500 + i, None) for i in range(6)]))
    settings = commands.BUILTIN_GROUP_SETTINGS.to_wire()
    legacy = [CommandKind.CREATE_GROUP, "t", "late", None, None, settings, None, True]
    late = run(commands.encode(legacy))
    run(commands.backfill_group(late, 3))
    assert not state.backfilling[late].exact
    assert run(commands.ack([schedule_key(g0, 1504, first + 4)])) == 1
    _finish(state, run, late)
    assert [mid for mid, _due in _held_by(state, late)] == [first + i for i in (0, 1, 2, 3, 5)]
    assert _marks(state) == []


@pytest.mark.parametrize("seed", range(40))
def test_the_new_group_gets_the_backlog_once_whatever_the_sources_do(
    kit: StoreKit, seed: int
) -> None:
    """Random ACKs, EXPIREs, dead-letterings, NACKs, CANCELs, RESCHEDULEs and PURGE
    chunks in two source groups and in the new group between chunks of random size: at the end the new group holds exactly the
    messages pending at its creation that no CANCEL naming it or ACK of its own removed."""
    rng = random.Random(seed)
    state, run, sources, late, ids = _under_way(kit, sources=2, chunk=rng.randint(1, 4))
    gone_for_late: set[int] = set()
    now_ms = 1510
    while late in state.backfilling:
        for _ in range(rng.randint(0, 3)):
            mid = rng.choice(ids)
            gid = rng.choice([*sources, late])
            key = state.entry_key(mid, gid)
            op = rng.choice(["ack", "expire", "dead_letter", "nack", "cancel", "cancel_all"])
            op = rng.choice([op, "reschedule", "purge"]) if gid != late else op
            now_ms += 10
            if op in ("ack", "expire", "dead_letter") and key is not None:
                if op == "ack":
                    run(commands.ack([key]))
                elif op == "expire":
                    run(commands.expire([key]))
                else:
                    run(commands.dead_letter(now_ms, [(key, 1)]))
                if gid == late:
                    gone_for_late.add(mid)
            elif op == "purge" and gid not in state.purging:
                run(commands.purge([gid]))
                run(commands.purge_group(gid, rng.randint(1, 3)))
            elif op == "nack" and key is not None:
                run(commands.nack(now_ms, rng.randint(0, 200), [(key, 1)]))
            elif op == "cancel":
                if run(commands.cancel("t", gid, [mid])) != [UNKNOWN] and gid == late:
                    gone_for_late.add(mid)
            elif op == "cancel_all":
                if run(commands.cancel("t", None, [mid])) != [UNKNOWN]:
                    gone_for_late.add(mid)
            elif op == "reschedule":
                run(commands.reschedule(now_ms, "t", gid, [mid], now_ms + 300, []))
        run(commands.backfill_group(late, rng.randint(1, 3)))
    held = [mid for mid, _due in _held_by(state, late)]
    assert held == [mid for mid in ids if mid not in gone_for_late]
    assert state.groups[late].pending == len(held)
    assert _marks(state) == []


def test_an_exact_backfill_reads_only_its_topic(kit: StoreKit) -> None:
    """Before, the chunks walked every stored message below the group's first id, at
    most 10,000 per chunk: 4 messages of t behind 20,000 of topic u took 3 chunks
    (and the time to read 20,000 messages). Now they walk the source groups'
    schedules: one chunk copies the 4 and ends."""
    state = QueueState(kit.store)
    run = Runner(state)
    run(commands.create_group("t", "g0", None, None))
    run(commands.create_group("u", "g0", None, None))
    first = run(commands.publish(1000, [("t", bytes([i]), 1500 + i, None) for i in range(2)]))
    for _ in range(2):
        run(commands.publish(1000, [("u", b"", 1500, None) for _ in range(10_000)]))
    last = run(commands.publish(1000, [("t", bytes([i]), 1600 + i, None) for i in range(2)]))
    late = run(commands.create_group("t", "late", None, None, from_backlog=True))
    assert run(commands.backfill_group(late, 10)) == 4
    assert late not in state.backfilling
    assert [mid for mid, _due in _held_by(state, late)] == [first, first + 1, last, last + 1]


def test_an_exact_backfill_chunk_bounds_the_message_bytes_it_reads(kit: StoreKit) -> None:
    """A chunk stops once it has read 4 MiB of messages (the one record that passes it
    read whole), whatever ``max_entries`` allows; the next chunk goes on."""
    state = QueueState(kit.store)
    run = Runner(state)
    run(commands.create_group("t", "g0", None, None))
    big = b"x" * (1024 * 1024 - 100)
    first = run(commands.publish(1000, [("t", big, 1500 + i, None) for i in range(7)]))
    late = run(commands.create_group("t", "late", None, None, from_backlog=True))
    assert run(commands.backfill_group(late, 10)) == 5
    assert late in state.backfilling
    assert run(commands.backfill_group(late, 10)) == 2
    assert late not in state.backfilling
    assert [mid for mid, _due in _held_by(state, late)] == [first + i for i in range(7)]


def test_an_exact_backfill_chunk_costs_one_unit_per_source_group_a_message_has(
    kit: StoreKit,
) -> None:
    """Each message older than the group is looked up in every source group (for its
    due time): with five sources a chunk of 10 units copies two messages, so a topic
    of many groups never makes a chunk long; a chunk smaller than one message's cost
    still copies one."""
    state = QueueState(kit.store)
    run = Runner(state)
    for n in range(5):
        run(commands.create_group("t", f"g{n}", None, None))
    first = run(commands.publish(1000, [("t", bytes([i]), 1500 + i, None) for i in range(4)]))
    late = run(commands.create_group("t", "late", None, None, from_backlog=True))
    assert run(commands.backfill_group(late, 10)) == 2
    assert run(commands.backfill_group(late, 1)) == 1
    _finish(state, run, late)
    assert [mid for mid, _due in _held_by(state, late)] == [first + i for i in range(4)]


def _two_sources(kit: StoreKit) -> tuple[QueueState, Runner, int, int, list[int]]:
    """Groups g0 and g1 of t hold 6 messages (due 1500..1505, TTL 100)."""
    state = QueueState(kit.store)
    run = Runner(state)
    g0 = run(commands.create_group("t", "g0", None, None))
    g1 = run(commands.create_group("t", "g1", None, None))
    first = run(commands.publish(1000, [("t", bytes([i]), 1500 + i, 100) for i in range(6)]))
    return state, run, g0, g1, [first + i for i in range(6)]


def test_a_reschedule_of_every_group_before_the_group_existed_carries_over(
    kit: StoreKit,
) -> None:
    """A RESCHEDULE of every group moved message 2 to 3000 before ``late`` existed.
    Before, the backfill copied it at its published due time (1502, expiring 1602):
    delivered 1.5 s earlier than the operator set. Now ``late`` gets it due 3000,
    expiring 3100 as the source entries do, found by id like any moved entry."""
    state, run, g0, g1, ids = _two_sources(kit)
    assert run(commands.reschedule(1200, "t", None, [ids[2]], 3000)) == [DONE]
    late = run(commands.create_group("t", "late", None, None, from_backlog=True))
    _finish(state, run, late)
    assert state.get_schedule(schedule_key(late, 3000, ids[2])) == (0, 3100)
    assert state.entry_key(ids[2], late) == schedule_key(late, 3000, ids[2])
    assert (ids[0], 1500) in _held_by(state, late)
    assert run(commands.cancel("t", late, [ids[2]])) == [DONE]  # found where it is due
    assert state.entry_key(ids[2], g0) == schedule_key(g0, 3000, ids[2])
    assert _marks(state) == []


def test_with_several_sources_the_earliest_live_source_entry_sets_the_time(
    kit: StoreKit,
) -> None:
    """Before ``late`` existed, g0's entry of message 2 was rescheduled to 3000 and
    g1's NACKed to 1560 (its expiry stays 1602); message 3 was rescheduled in g0 to
    2000 and NACKed in g1 past its expiry (due 1700, expiring 1603: it can only
    expire there). ``late`` gets message 2 at 1560 expiring 1602 (g1's, the earliest)
    and message 3 at 2000 expiring 2100 (g0's; g1's is not live). Before, both came
    at their published due times."""
    state, run, g0, g1, ids = _two_sources(kit)
    assert run(commands.reschedule(1200, "t", g0, [ids[2]], 3000)) == [DONE]
    assert run(commands.reschedule(1200, "t", g0, [ids[3]], 2000)) == [DONE]
    assert run(commands.nack(1510, 50, [(schedule_key(g1, 1502, ids[2]), 1)])) == 1
    assert run(commands.nack(1510, 190, [(schedule_key(g1, 1503, ids[3]), 1)])) == 1
    late = run(commands.create_group("t", "late", None, None, from_backlog=True))
    _finish(state, run, late)
    assert state.get_schedule(schedule_key(late, 1560, ids[2])) == (0, 1602)
    assert state.get_schedule(schedule_key(late, 2000, ids[3])) == (0, 2100)
    assert state.groups[late].pending == 6


def test_a_source_entry_that_moves_after_creation_leaves_the_time_due_at_creation(
    kit: StoreKit,
) -> None:
    """Message 4 was rescheduled in g0 to 2000 before ``late`` existed; after, before
    the chunks reach it, a NACK moves g0's entry to 2500 and a RESCHEDULE of g0 only
    moves message 5 to 4000. ``late`` gets each as it was due when it was created
    (2000, expiring 12000; 1505): the move copies it ahead first. Before, message 4
    came at its published due time (1504)."""
    state = QueueState(kit.store)
    run = Runner(state)
    g0 = run(commands.create_group("t", "g0", None, None))
    first = run(commands.publish(1000, [("t", bytes([i]), 1500 + i, 10_000) for i in range(6)]))
    ids = [first + i for i in range(6)]
    assert run(commands.reschedule(1200, "t", g0, [ids[4]], 2000)) == [DONE]
    late = run(commands.create_group("t", "late", None, None, from_backlog=True))
    run(commands.backfill_group(late, 3))
    assert run(commands.nack(2000, 500, [(schedule_key(g0, 2000, ids[4]), 1)])) == 1
    assert run(commands.reschedule(2000, "t", g0, [ids[5]], 4000)) == [DONE]
    _finish(state, run, late)
    assert state.get_schedule(schedule_key(late, 2000, ids[4])) == (0, 12000)
    assert state.get_schedule(schedule_key(late, 1505, ids[5])) == (0, 11505)
    assert state.entry_key(ids[4], g0) == schedule_key(g0, 2500, ids[4])
    assert state.groups[late].pending == 6
    assert _marks(state) == []


def test_a_message_whose_expiry_passed_is_not_copied(kit: StoreKit) -> None:
    """The chunk carries the leader's time (1602.5 s: messages 0..2 expired, their
    source entries not removed yet); an EXPIRE of g0's entry of message 4 before the
    chunks reach it copies nothing. Before, ``late`` got all six: three expired
    messages it could only expire (or dead-letter), and message 4 its EXPIRE had
    just removed from g0."""
    state, run, (g0,), late, ids = _under_way(kit, chunk=0)
    assert run(commands.expire([schedule_key(g0, 1504, ids[4])], 1604)) == 1
    assert run(commands.backfill_group(late, 10, 1602)) == 2
    _finish(state, run, late)
    assert _held_by(state, late) == [(ids[3], 1503), (ids[5], 1505)]
    assert state.groups[late].pending == 2
    assert _marks(state) == []


def test_what_a_later_publish_stamp_shows_expired_is_not_copied(kit: StoreKit) -> None:
    """A chunk without the leader's time (an earlier build's) still knows what the
    latest publish stamp shows: a PUBLISH stamped 1601 means messages 0 and 1 expired."""
    state, run, _gids, late, ids = _under_way(kit, chunk=0)
    run(commands.publish(1601, [("u", b"", 1601, None)]))
    _finish(state, run, late)
    assert [mid for mid, _due in _held_by(state, late)] == ids[2:]


def test_a_dead_letter_parked_in_every_source_comes_at_its_published_time(
    kit: StoreKit,
) -> None:
    """On a dead-letter topic, g0 parked message 0 (out of attempts) and message 1 was
    rescheduled: ``late`` gets message 0 at its published due time (it never tried
    it; a parked entry's time is not a schedule) and message 1 at its new time."""
    state = QueueState(kit.store)
    run = Runner(state)
    g0 = run(commands.create_group("t.dlq", "g0", None, None))
    first = run(commands.publish(1000, [("t.dlq", bytes([i]), 1500 + i, None) for i in range(2)]))
    run(commands.dead_letter(1600, [(schedule_key(g0, 1500, first), 1)]))
    assert state.entry_key(first, g0) == schedule_key(g0, PARKED_DUE_MS, first)
    assert run(commands.reschedule(1600, "t.dlq", None, [first + 1], 5000)) == [DONE]
    late = run(commands.create_group("t.dlq", "late", None, None, from_backlog=True))
    _finish(state, run, late)
    assert _held_by(state, late) == [(first, 1500), (first + 1, 5000)]


@pytest.mark.parametrize("seed", range(30))
def test_the_new_group_gets_each_message_due_as_at_creation_whatever_the_sources_do(
    kit: StoreKit, seed: int
) -> None:
    """One to three source groups; RESCHEDULEs before creation (of one group or all)
    move entries anywhere; after creation ACKs, dead-lettering, NACKs, CANCELs,
    RESCHEDULEs (moving entries behind and ahead of the chunks' cursor in their source
    schedules) and PURGEs run between chunks of random size, among messages of
    another topic. At the end the new group holds each message pending at creation
    that no CANCEL naming it or ACK of its own removed, due at the earliest time a
    source held it at creation, found by id; no mark is left."""
    rng = random.Random(seed)
    state = QueueState(kit.store)
    run = Runner(state)
    sources = [run(commands.create_group("t", f"g{i}", None, None)) for i in range(1 + seed % 3)]
    run(commands.create_group("u", "x", None, None))
    ids = []
    for i in range(10):
        if rng.random() < 0.5:
            run(commands.publish(1000, [("u", b"", 1500, None)]))
        due = 1500 + rng.randint(0, 50)
        ids.append(run(commands.publish(1000, [("t", bytes([i]), due, None)])))
    for _ in range(rng.randint(0, 6)):
        group = rng.choice([rng.choice(sources), None])
        run(commands.reschedule(1100, "t", group, [rng.choice(ids)], rng.randint(1000, 3000)))
    due_at_creation = {}
    for mid in ids:
        keys = [state.entry_key(mid, gid) for gid in sources]
        dues = [commands.parse_schedule_key(key)[1] for key in keys if key is not None]
        if dues:
            due_at_creation[mid] = min(dues)
    late = run(commands.create_group("t", "late", None, None, from_backlog=True))
    gone_for_late: set[int] = set()
    now_ms = 1510
    while late in state.backfilling:
        for _ in range(rng.randint(0, 4)):
            mid = rng.choice(ids)
            gid = rng.choice([*sources, late])
            key = state.entry_key(mid, gid)
            op = rng.choice(["ack", "dead_letter", "nack", "cancel", "cancel_all"])
            op = rng.choice([op, "reschedule", "purge"]) if gid != late else op
            now_ms += 10
            if op in ("ack", "dead_letter") and key is not None:
                if op == "ack":
                    run(commands.ack([key]))
                else:
                    run(commands.dead_letter(now_ms, [(key, 1)]))
                if gid == late:
                    gone_for_late.add(mid)
            elif op == "nack" and key is not None and gid != late:
                run(commands.nack(now_ms, rng.randint(0, 2000), [(key, 1)]))
            elif op == "cancel":
                if run(commands.cancel("t", gid, [mid])) != [UNKNOWN] and gid == late:
                    gone_for_late.add(mid)
            elif op == "cancel_all":
                if run(commands.cancel("t", None, [mid])) != [UNKNOWN]:
                    gone_for_late.add(mid)
            elif op == "reschedule":
                run(commands.reschedule(now_ms, "t", gid, [mid], rng.randint(1000, 4000)))
            elif op == "purge" and gid not in state.purging:
                run(commands.purge([gid]))
        for gid in list(state.purging):
            run(commands.purge_group(gid, rng.randint(1, 3)))
        run(commands.backfill_group(late, rng.randint(1, 4)))
    held = {mid: due for due, mid, _a, _e in state.scan_schedule(late, 0, 0, 100)}
    assert held == {mid: due for mid, due in due_at_creation.items() if mid not in gone_for_late}
    for mid, due in held.items():
        assert state.entry_key(mid, late) == schedule_key(late, due, mid)
    assert state.groups[late].pending == len(held)
    assert _marks(state) == []


def test_a_publish_stamp_left_ahead_by_a_wrong_clock_does_not_expire_the_backlog(
    kit: StoreKit,
) -> None:
    """A single node ran a day fast, stamped a publish, and was restarted on its
    corrected clock: its leader leaves that stamp behind (``broker.publishing.stamp``)
    and stamps on cluster time again. Messages due at 1500..1505 with a TTL of 100
    are live at the chunk's stamp (1450). Before, the backfill took the day-ahead
    stamp as "now", found every one of them expired, and ``late`` got none of them
    (a lost backlog); the source groups still delivered them, live, by cluster time."""
    day_ms = 86_400_000
    state = QueueState(kit.store)
    run = Runner(state)
    (g0,) = [run(commands.create_group("t", "g0", None, None))]
    run(commands.publish(1000 + day_ms, [("u", b"", 1000 + day_ms, None)]))
    first = run(commands.publish(1400, [("t", bytes([i]), 1500 + i, 100) for i in range(6)]))
    late = run(commands.create_group("t", "late", None, None, from_backlog=True))
    assert run(commands.backfill_group(late, 10, 1450)) == 6
    _finish(state, run, late)
    assert _held_by(state, late) == [(first + i, 1500 + i) for i in range(6)]
    assert _held_by(state, g0) == _held_by(state, late)
