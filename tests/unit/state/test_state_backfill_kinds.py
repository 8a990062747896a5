"""QueueState: a group created ``from_backlog`` keeps the rules of the kind that made it.

Kind 37 (CREATE_GROUP_FROM_BACKLOG) was written by an earlier build (main up to
53ca863): its backfill walks the stored messages by id and copies each at its published
due time, and that build stored the job with a message-id cursor. Builds since write
kind 38 (CREATE_GROUP_FROM_BACKLOG_AS_HELD), whose backfill walks the source groups'
schedules and copies each message due as they held it. A kind 37 entry in a log, its
BACKFILL_GROUP chunks (without ``now_ms``, or with one a later leader stamped) and a job
that build stored mid-way must give the state that build gave (``docs/architecture.md``:
"A command kind's meaning never changes once a build has written it"). Each command is
applied to a real RocksDB store and to a MemoryStore (``kit``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from msgpack import packb
from state_helpers import StoreKit

from futureq.errors import StorageError
from futureq.state import commands
from futureq.state.commands import CommandKind, schedule_key
from futureq.state.manage_ops import BACKFILL_PREFIX
from futureq.state.queue_state import QueueState
from futureq.state.records import unpack
from futureq.wire.frames import ItemStatus

SETTINGS = commands.BUILTIN_GROUP_SETTINGS.to_wire()
G0, G1, LATE = 1, 2, 4  # group ids: g0 and g1 of t, h0 of u (3), late


class Runner:
    """Applies encoded commands at consecutive log indexes."""

    def __init__(self, state: QueueState) -> None:
        self.state = state

    def __call__(self, data: bytes) -> Any:
        return self.state.apply(self.state.applied_index + 1, data)


def _kind_37(topic: str, group: str) -> bytes:
    """CREATE_GROUP_FROM_BACKLOG (kind 37) as the earlier build wrote it."""
    return commands.encode(
        [CommandKind.CREATE_GROUP_FROM_BACKLOG, topic, group, None, None, SETTINGS, None]
    )


def _chunk(gid: int, max_entries: int, now_ms: int | None = None) -> bytes:
    """BACKFILL_GROUP as the earlier build wrote it (no ``now_ms``), or as a later leader
    stamps it for the job that build left (``now_ms``)."""
    command = [CommandKind.BACKFILL_GROUP, gid, max_entries]
    return commands.encode(command if now_ms is None else [*command, now_ms])


MID_POINT = "mid-point"


def _kind_37_log(run: Runner) -> Iterator[bytes | str]:
    """The commands of a log the earlier build wrote (the keys of source entries are
    read from ``run.state`` as that build's leader read them), with :data:`MID_POINT`
    where the job is stored mid-way. It exercises where kind 37 and 38 differ: a
    RESCHEDULE and a NACK before creation (kind 37 copies at the published due time),
    TTLs a later publish stamp shows passed (kind 37 copies them), messages of
    another topic between them (kind 37 walks them), a NACK and a RESCHEDULE of
    entries ahead of the cursor (kind 37 copies nothing ahead for a move), ACKs
    and a CANCEL (copies ahead), a PURGE and an EXPIRE of source entries."""
    state = run.state
    yield commands.create_group("t", "g0", None, None)
    yield commands.create_group("t", "g1", None, None)
    yield commands.create_group("u", "h0", None, None)
    ttls = (None, 100, 10_000)
    yield commands.publish(1000, [("t", bytes([i]), 1500 + i, ttls[i % 3]) for i in range(4)])
    yield commands.publish(1000, [("u", b"u", 1500, None) for _ in range(5)])
    yield commands.publish(1000, [("t", bytes([i]), 1504 + i, ttls[i % 3]) for i in range(4, 9)])
    ids = [(4 << 16) + i for i in range(4)] + [(6 << 16) + i for i in range(5)]
    yield commands.reschedule(1200, "t", None, [ids[2]], 3000)
    yield commands.nack(1300, 400, [(_key(state, ids[3], G0), 1)])
    yield commands.publish(1650, [("u", b"v", 1700, None)])
    yield _kind_37("t", "late")
    yield _chunk(LATE, 3)
    yield commands.ack([_key(state, ids[7], G0)])
    yield commands.ack([_key(state, ids[7], G1)])
    yield commands.nack(1660, 50, [(_key(state, ids[5], G1), 1)])
    yield commands.cancel("t", LATE, [ids[8]])
    yield commands.reschedule(1670, "t", None, [ids[6]], 5000)
    yield MID_POINT
    state = run.state  # reopened
    yield _chunk(LATE, 2)
    yield commands.purge([G1])
    yield commands.purge_group(G1, 3)
    yield commands.expire([_key(state, ids[4], G0)])
    for _ in range(4):
        yield _chunk(LATE, 2, 99_999)
    yield commands.purge_group(G1, 50)
    while LATE in state.backfilling:
        yield _chunk(LATE, 2)


def _key(state: QueueState, mid: int, gid: int) -> bytes:
    key = state.entry_key(mid, gid)
    assert key is not None
    return key


# Derived by applying this very log with the earlier build's code (``git archive`` of
# main at 53ca863, run in a subprocess): its applied digest after each command (the
# digest chains a CRC-32 of every write of every apply, so equal digests mean each
# command wrote the same bytes), the job it stored at the mid-point, and what ``late``
# held at the end. The build before kind 38 existed (kind 37 walking the schedules)
# gave other digests from the kind 37 command on (it stored its job otherwise), and
# ``late`` got only messages 0, 3, 5 and 6 (of 8); resuming the job the
# earlier build stored (an 8-byte message id taken for a schedule key) it lacked
# messages 4 and 5.
MAIN_DIGESTS = [
    3722164833, 3105551213, 2103916540, 1085268656, 1120697473, 565990998, 442527013,
    354883820, 2645428930, 253408984, 3226035687, 1701546431, 78302722, 2265484165,
    3289177439, 3199718501, 153365955, 3822093368, 13095298, 2425176693, 1264842059,
    2147227852, 292817553, 2214255371, 3317391960,
]  # fmt: skip
MAIN_MID_JOB = bytes.fromhex("96ce000a000092010200c408000000000004000290c3")
"""``[bound_id 10 << 16, sources [1, 2], 0, cursor: message id 4 << 16 | 2, purged [],
true]``: no kind, a message-id cursor."""
MAIN_LATE = [  # (due_ms, message id, attempt, expire_ms)
    (1500, 4 << 16, 0, None),
    (1501, 4 << 16 | 1, 0, 1601),
    (1502, 4 << 16 | 2, 0, 11502),
    (1503, 4 << 16 | 3, 0, None),
    (1508, 6 << 16, 0, 1608),
    (1509, 6 << 16 | 1, 0, 11509),
    (1511, 6 << 16 | 3, 0, 1611),
    (5000, 6 << 16 | 2, 0, None),
]


def test_a_kind_37_log_and_its_stored_job_replay_as_the_earlier_build_applied_them(
    kit: StoreKit,
) -> None:
    """Each command of the log writes what the earlier build wrote; the job stored
    mid-way is that build's (message-id cursor, no kind), and after a restart it
    resumes with that build's rules, chunks stamped by a later leader included. So
    ``late`` gets message 2 at its published 1502 (a RESCHEDULE of every group had
    moved it to 3000 before), messages whose TTL had passed, and message 4 that g0's
    EXPIRE removed ahead of the cursor: as that build gave them."""
    run = Runner(QueueState(kit.store))
    digests = []
    for command in _kind_37_log(run):
        if command == MID_POINT:
            stored = kit.store.get("meta", BACKFILL_PREFIX + LATE.to_bytes(4, "big"))
            assert stored == MAIN_MID_JOB
            run.state = QueueState(kit.reopen())  # a restart: the job loads as stored
            job = run.state.backfilling[LATE]
            assert job.exact and job.legacy_by_id
            continue
        assert isinstance(command, bytes)
        run(command)
        digests.append(run.state.applied_digest)
    state = run.state
    assert LATE not in state.backfilling
    assert digests == MAIN_DIGESTS
    assert list(state.scan_schedule(LATE, 0, 0, 100)) == MAIN_LATE
    assert state.groups[LATE].pending == len(MAIN_LATE)


def _rescheduled_before_creation(kit: StoreKit) -> tuple[QueueState, Runner, list[int]]:
    """g0 of t holds 3 messages (due 1500..1502, no TTL); a RESCHEDULE of every group
    moved message 1 to 3000."""
    state = QueueState(kit.store)
    run = Runner(state)
    run(commands.create_group("t", "g0", None, None))
    first = run(commands.publish(1000, [("t", bytes([i]), 1500 + i, None) for i in range(3)]))
    ids = [first + i for i in range(3)]
    assert run(commands.reschedule(1200, "t", None, [ids[1]], 3000)) == [ItemStatus.DONE]
    return state, run, ids


def test_a_new_group_from_the_backlog_is_written_as_kind_38_and_its_job_stores_its_kind(
    kit: StoreKit,
) -> None:
    """A group created ``from_backlog`` now is kind 38: its stored job ends with its
    kind, so after a restart it still copies each message as the source held it
    (message 1 at 3000), where a kind 37 job copies it at its published 1501."""
    created = commands.create_group("t", "x", None, None, from_backlog=True)
    assert commands.decode(created)[0] == CommandKind.CREATE_GROUP_FROM_BACKLOG_AS_HELD
    assert int(CommandKind.CREATE_GROUP_FROM_BACKLOG_AS_HELD) == 38  # stored in logs
    state, run, ids = _rescheduled_before_creation(kit)
    late = run(commands.create_group("t", "late", None, None, from_backlog=True))
    stored = kit.store.get("meta", BACKFILL_PREFIX + late.to_bytes(4, "big"))
    assert stored is not None and unpack(stored)[5:] == [True, 38]
    state = QueueState(kit.reopen())
    assert state.backfilling[late].exact and not state.backfilling[late].legacy_by_id
    run = Runner(state)
    while late in state.backfilling:
        run(commands.backfill_group(late, 1, 1300))
    assert [(due, mid) for due, mid, _a, _e in state.scan_schedule(late, 0, 0, 10)] == [
        (1500, ids[0]),
        (1502, ids[2]),
        (3000, ids[1]),
    ]

    old = run(_kind_37("t", "old"))
    state = QueueState(kit.reopen())
    assert state.backfilling[old].legacy_by_id
    run = Runner(state)
    while old in state.backfilling:
        run(_chunk(old, 1, 1300))
    assert [(due, mid) for due, mid, _a, _e in state.scan_schedule(old, 0, 0, 10)] == [
        (1500, ids[0]),
        (1501, ids[1]),
        (1502, ids[2]),
    ]


def test_a_kind_37_job_and_a_kind_38_job_run_side_by_side_each_by_its_rules(
    kit: StoreKit,
) -> None:
    """A kind 38 backfill runs while a kind 37 entry of the same topic (a log of the
    earlier build replayed, or one its leader proposed before stepping down) starts
    another: a NACK moves g0's entry of message 2 (ahead of both cursors) to 4000. The
    kind 38 group copies it first, due as at its creation (1502); the kind 37 group
    copies nothing for a move, and its chunks later copy it at its published time
    (1502 too), and message 1 at its published 1501 where kind 38 keeps 3000."""
    state, run, ids = _rescheduled_before_creation(kit)
    new = run(commands.create_group("t", "new", None, None, from_backlog=True))
    old = run(_kind_37("t", "old"))
    assert state.backfilling[old].legacy_by_id and not state.backfilling[new].legacy_by_id
    assert run(commands.nack(1300, 2700, [(schedule_key(1, 1502, ids[2]), 1)])) == 1
    assert state.entry_key(ids[2], new) == schedule_key(new, 1502, ids[2])
    assert state.entry_key(ids[2], old) is None
    while old in state.backfilling or new in state.backfilling:
        for gid in sorted(state.backfilling):
            run(commands.backfill_group(gid, 1, 1300))

    def held(gid: int) -> list[tuple[int, int]]:
        return [(due, mid) for due, mid, _a, _e in state.scan_schedule(gid, 0, 0, 10)]

    assert held(old) == [(1500, ids[0]), (1501, ids[1]), (1502, ids[2])]
    assert held(new) == [(1500, ids[0]), (1502, ids[2]), (3000, ids[1])]
    assert [key for key, _ in state.store.scan("index", b"b", b"c")] == []  # no mark left


def test_a_backfill_job_stored_with_a_kind_this_build_does_not_know_stops_the_load(
    kit: StoreKit,
) -> None:
    """A job a later build stored (its kind unknown here) is not resumed by guesswork:
    loading the state fails with a StorageError naming the group and the kind."""
    state, run, _ids = _rescheduled_before_creation(kit)
    late = run(commands.create_group("t", "late", None, None, from_backlog=True))
    key = BACKFILL_PREFIX + late.to_bytes(4, "big")
    stored = kit.store.get("meta", key)
    assert stored is not None
    kit.store.write({"meta": {key: packb([*unpack(stored)[:6], 99])}})
    with pytest.raises(StorageError, match=f"backfill job of group {late} .* kind 99"):
        QueueState(kit.reopen())
