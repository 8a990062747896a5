"""SingleNodeLog: group commit, ordered results, recovery, shutdown, idleness.

Real RocksDB in ``tmp_path`` and trio. Source: ``DESIGN.md``, "Storage layout" (group
commit; the applied index travels with the state, a restart replays what follows it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
import trio.testing

from futureq.broker import command_log
from futureq.broker.command_log import SingleNodeLog, log_key
from futureq.errors import ErrorCode, RequestError, StorageError
from futureq.state import commands
from futureq.state.queue_state import QueueState
from futureq.storage.db import Database


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "db")


@pytest.fixture
def db(db_path: str) -> Iterator[Database]:
    database = Database(db_path)
    yield database
    database.close()


class CountingWrites:
    """Wraps ``Database.write_batch`` to record the size of every synced batch.

    State-machine writes go through the same method unsynced and are not counted.
    """

    def __init__(self, db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[int, bool]] = []  # (operations in the batch, synced)
        original = db.write_batch

        def write_batch(batch: Any, sync: bool) -> None:
            if sync:
                self.calls.append((batch.len(), sync))
            original(batch, sync)

        monkeypatch.setattr(db, "write_batch", write_batch)


def _entries(db: Database) -> dict[int, bytes]:
    """index -> command bytes of every entry in ``raft_log``."""
    out: dict[int, bytes] = {}
    for key, raw in db.scan("raft_log", b""):
        term, kind, data = msgpack.unpackb(raw, raw=False)
        assert (term, kind) == (0, command_log.ENTRY_NORMAL)
        out[int.from_bytes(key, "big")] = data
    return out


def _publish(i: int) -> bytes:
    return commands.publish(1000 + i, [("t", f"m{i}".encode(), 1000 + i, None)])


async def _propose_all(log: SingleNodeLog, proposals: list[bytes]) -> list[Any]:
    """Propose concurrently, all queued before the log runs; return results by proposal."""
    results: list[Any] = [None] * len(proposals)

    async def one(i: int) -> None:
        results[i] = await log.propose(proposals[i])

    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as proposers:
            for i in range(len(proposals)):
                proposers.start_soon(one, i)
            await trio.testing.wait_all_tasks_blocked()
            await outer.start(log.run)
        outer.cancel_scope.cancel()
    return results


async def test_concurrent_proposals_share_one_synced_write(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = CountingWrites(db, monkeypatch)
    state = QueueState(db)
    log = SingleNodeLog(db, state, address="127.0.0.1:7450")
    proposals = [_publish(i) for i in range(50)]
    results = await _propose_all(log, proposals)
    assert writes.calls == [(50, True)]  # one fsync for fifty proposals
    entries = _entries(db)
    assert sorted(entries) == list(range(1, 51))
    # Each proposer got the result of its own entry: the id its message got there.
    for i, result in enumerate(results):
        index = result >> 16
        assert entries[index] == proposals[i]
        message = state.get_message(result)
        assert message is not None and message[1] == f"m{i}".encode()
    assert state.applied_index == log.applied_index == log.last_index == 50


async def test_batches_are_capped_at_max_batch_items(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = CountingWrites(db, monkeypatch)
    state = QueueState(db)
    log = SingleNodeLog(db, state, address=None, max_batch_items=8)
    results = await _propose_all(log, [_publish(i) for i in range(30)])
    assert sum(n for n, _ in writes.calls) == 30
    assert all(n <= 8 and sync for n, sync in writes.calls)
    assert len(writes.calls) < 30  # grouped, not one write per proposal
    assert sorted(r >> 16 for r in results) == list(range(1, 31))


async def test_sequential_results_follow_log_order(db: Database) -> None:
    state = QueueState(db)
    log = SingleNodeLog(db, state, address=None, fsync=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(log.run)
        gid = await log.propose(commands.create_group("t", "g", None, None))
        first = await log.propose(_publish(1))
        second = await log.propose(_publish(2))
        acked = await log.propose(commands.ack([commands.schedule_key(gid, 1001, first)]))
        again = await log.propose(commands.ack([commands.schedule_key(gid, 1001, first)]))
        nursery.cancel_scope.cancel()
    assert (gid, first, second, acked, again) == (1, 2 << 16, 3 << 16, 1, 0)
    assert list(_entries(db)) == [1, 2, 3, 4, 5]


def _write_entries(db: Database, first_index: int, datas: list[bytes]) -> None:
    packer = msgpack.Packer(use_bin_type=True)
    db.write(
        {
            "raft_log": {
                log_key(first_index + i): packer.pack([0, command_log.ENTRY_NORMAL, data])
                for i, data in enumerate(datas)
            }
        },
        sync=True,
    )


def test_recover_replays_entries_written_but_not_applied(db_path: str) -> None:
    db = Database(db_path)
    state = QueueState(db)
    datas = [commands.create_group("t", "g", None, None), _publish(1), _publish(2), _publish(3)]
    _write_entries(db, 1, datas)
    state.apply(1, datas[0])
    state.apply(2, datas[1])  # a crash after entry 2 was applied, 3 and 4 were not
    db.close()

    db = Database(db_path)
    try:
        fresh = QueueState(db)
        log = SingleNodeLog(db, fresh, address=None)
        assert (fresh.applied_index, log.last_index) == (2, 4)
        assert log.recover() == 2
        assert fresh.applied_index == log.applied_index == 4
        assert [g.pending for g in fresh.topic_groups("t")] == [3]
        assert fresh.get_message(4 << 16) is not None
        assert log.recover() == 0
    finally:
        db.close()


def test_recover_reports_a_gap_in_the_log(db: Database) -> None:
    _write_entries(db, 1, [commands.NOOP])
    _write_entries(db, 3, [commands.NOOP])
    log = SingleNodeLog(db, QueueState(db), address=None)
    with pytest.raises(StorageError, match="log entry 2 is missing"):
        log.recover()


async def test_restart_after_clean_run_replays_nothing_and_continues_indexes(
    db_path: str,
) -> None:
    db = Database(db_path)
    try:
        log = SingleNodeLog(db, QueueState(db), address=None)
        await _propose_all(log, [_publish(i) for i in range(5)])
    finally:
        db.close()
    db = Database(db_path)
    try:
        state = QueueState(db)
        log = SingleNodeLog(db, state, address=None)
        assert log.recover() == 0
        results = await _propose_all(log, [_publish(9)])
        assert results == [6 << 16]
    finally:
        db.close()


async def test_applied_entries_are_truncated_and_restart_still_continues(
    db_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(command_log, "TRUNCATE_EVERY_ENTRIES", 4)
    db = Database(db_path)
    try:
        state = QueueState(db)
        log = SingleNodeLog(db, state, address=None, fsync=False)
        async with trio.open_nursery() as nursery:
            await nursery.start(log.run)
            for i in range(10):
                await log.propose(_publish(i))
            nursery.cancel_scope.cancel()
        assert state.applied_index == 10
        remaining = sorted(_entries(db))
        assert remaining and remaining[0] > 1 and remaining[-1] <= 10
    finally:
        db.close()
    db = Database(db_path)
    try:
        state = QueueState(db)
        log = SingleNodeLog(db, state, address=None)
        assert log.recover() == 0
        assert await _propose_all(log, [_publish(99)]) == [11 << 16]
    finally:
        db.close()


async def test_propose_after_begin_shutdown_is_unavailable(db: Database) -> None:
    log = SingleNodeLog(db, QueueState(db), address="127.0.0.1:1")
    assert log.is_leader() and log.leader_address() == "127.0.0.1:1"
    log.begin_shutdown()
    with pytest.raises(RequestError) as info:
        await log.propose(commands.NOOP)
    assert info.value.code is ErrorCode.UNAVAILABLE
    assert info.value.code.retryable
    assert _entries(db) == {}


async def test_queued_proposals_still_complete_after_begin_shutdown(db: Database) -> None:
    state = QueueState(db)
    log = SingleNodeLog(db, state, address=None, fsync=False)
    results: list[Any] = []
    async with trio.open_nursery() as outer:

        async def propose() -> None:
            results.append(await log.propose(_publish(1)))

        outer.start_soon(propose)
        await trio.testing.wait_all_tasks_blocked()
        log.begin_shutdown()
        await outer.start(log.run)
        await log.wait_idle()
        outer.cancel_scope.cancel()
    assert results == [1 << 16]


async def test_wait_idle_blocks_until_every_proposal_is_answered(db: Database) -> None:
    state = QueueState(db)
    applied: list[int] = []
    log = SingleNodeLog(
        db, state, address=None, on_applied=lambda: applied.append(state.applied_index)
    )
    await log.wait_idle()  # nothing in flight: returns at once
    idle_at: list[int] = []
    async with trio.open_nursery() as outer:
        for i in range(3):
            outer.start_soon(log.propose, _publish(i))
        await trio.testing.wait_all_tasks_blocked()

        async def waiter() -> None:
            await log.wait_idle()
            idle_at.append(state.applied_index)

        outer.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert idle_at == []  # three proposals are queued, nothing written yet
        await outer.start(log.run)
        await log.wait_idle()
        await trio.testing.wait_all_tasks_blocked()
        outer.cancel_scope.cancel()
    assert idle_at == [3]
    assert applied and applied[-1] == 3


async def test_writer_and_applier_take_turns_and_apply_in_log_order(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone proposal is applied by the writer itself (one loop pass fewer before its
    answer); a burst's batches go to the applier so the next write overlaps the apply.
    Whichever task applies, entries apply once each, in log order, and every proposer
    gets its own entry's result (issue 11)."""
    state = QueueState(db)
    log = SingleNodeLog(db, state, address=None, fsync=False, max_batch_items=4)
    applied: list[int] = []
    appliers: set[str] = set()
    original_steps = state.apply_steps
    original_batch = log._apply_batch

    def apply_steps(index: int, data: bytes, command: Any = None) -> Any:
        applied.append(index)
        return original_steps(index, data, command)

    async def apply_batch(batch: Any, **options: Any) -> Any:
        task = trio.lowlevel.current_task().name.rsplit(".", 1)[-1]
        appliers.add(task)
        if task == "_applier":
            # A slow apply: the writer finishes the burst's last write while batches
            # wait here, and must not apply that one ahead of them.
            await trio.sleep(0.005)
        return await original_batch(batch, **options)

    monkeypatch.setattr(state, "apply_steps", apply_steps)
    monkeypatch.setattr(log, "_apply_batch", apply_batch)
    proposals = [_publish(i) for i in range(60)]
    results: list[Any] = [None] * len(proposals)

    async def one(i: int) -> None:
        results[i] = await log.propose(proposals[i])

    async with trio.open_nursery() as nursery:
        await nursery.start(log.run)
        for wave in range(0, 60, 20):
            await one(wave)  # alone: the writer applies it
            async with trio.open_nursery() as burst:
                for i in range(wave + 1, wave + 20):
                    burst.start_soon(one, i)
        nursery.cancel_scope.cancel()
    assert appliers == {"_writer", "_applier"}
    assert applied == list(range(1, 61))
    entries = _entries(db)
    for i, result in enumerate(results):
        assert entries[result >> 16] == proposals[i]
        message = state.get_message(result)
        assert message is not None and message[1] == f"m{i}".encode()


async def test_a_disk_full_during_the_writers_own_apply_refuses_later_proposals_at_once(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer applies a lone batch itself; when that apply finds the disk full it
    waits for space (the entry is in the log). Proposals made meanwhile must still be
    refused with NO_SPACE at once, as when the applier task waits, not hang until the
    disk has room again."""
    from futureq.errors import NoSpaceError
    from futureq.storage.space import SpaceAlarm

    state = QueueState(db)
    alarm = SpaceAlarm(db)
    log = SingleNodeLog(db, state, address=None, fsync=True, space_alarm=alarm)
    original = db.write_batch
    full = trio.Event()
    disk_full = [True]

    def write_batch(batch: Any, sync: bool) -> None:
        if not sync and disk_full[0]:  # the state's write (the log's is synced)
            full.set()
            raise NoSpaceError("No space left on device")
        original(batch, sync)

    monkeypatch.setattr(db, "write_batch", write_batch)
    first: list[Any] = []
    answered = trio.Event()

    async def propose_first() -> None:
        first.append(await log.propose(_publish(0)))
        answered.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(log.run)
        nursery.start_soon(propose_first)
        with trio.fail_after(5):
            await full.wait()
        assert alarm.raised
        with trio.fail_after(1), pytest.raises(RequestError) as refused:
            await log.propose(_publish(1))
        assert refused.value.code == ErrorCode.NO_SPACE
        assert not answered.is_set()  # its entry waits for space
        disk_full[0] = False
        alarm.raised = False  # space is back (what SpaceAlarm.run does, without a reopen)
        alarm._cleared.set()
        with trio.fail_after(5):
            await answered.wait()
        nursery.cancel_scope.cancel()
    assert state.get_message(first[0]) is not None
    assert sorted(_entries(db)) == [1]
