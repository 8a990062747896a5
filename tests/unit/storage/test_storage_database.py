"""The RocksDB Database: families, schema version, atomic batches, ranges, lock, reopen.

Real RocksDB in ``tmp_path``. Source: ``DESIGN.md``, "Storage layout".
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from futureq.errors import StorageError
from futureq.storage.db import FAMILIES, SCHEMA_VERSION, Database


def test_new_directory_gets_every_family_and_the_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "fresh" / "nested"
    db = Database(str(path))
    try:
        assert path.is_dir()
        assert set(FAMILIES) == {
            "raft_log",
            "raft_state",
            "messages",
            "schedule",
            "groups",
            "meta",
            "index",
        }
        db.write({family: {b"k": family.encode()} for family in FAMILIES})
        assert [db.get(family, b"k") for family in FAMILIES] == [f.encode() for f in FAMILIES]
        assert db.get("meta", b"schema_version") == SCHEMA_VERSION.to_bytes(4, "big")
    finally:
        db.close()
    db = Database(str(path))
    try:
        assert [db.get(family, b"k") for family in FAMILIES] == [f.encode() for f in FAMILIES]
    finally:
        db.close()


def test_other_schema_version_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    db = Database(path)
    db.write({"meta": {b"schema_version": (SCHEMA_VERSION + 1).to_bytes(4, "big")}}, sync=True)
    db.close()
    with pytest.raises(StorageError) as first:
        Database(path)
    message = str(first.value)
    assert path in message
    assert f"schema version {SCHEMA_VERSION + 1}" in message
    assert f"reads version {SCHEMA_VERSION}" in message
    # The refused database is closed: while the first error is still alive, a second
    # attempt reports the schema again, not "lock hold by current process".
    with pytest.raises(StorageError, match="schema version"):
        Database(path)


def test_write_is_all_or_nothing_when_a_family_is_unknown(db: Database) -> None:
    db.write({"messages": {b"keep": b"1"}})
    with pytest.raises(KeyError):
        db.write({"messages": {b"keep": None, b"new": b"2"}, "no_such_family": {b"k": b"v"}})
    assert db.get("messages", b"keep") == b"1"
    assert db.get("messages", b"new") is None


def test_synced_and_unsynced_writes_both_land(db: Database) -> None:
    db.write({"raft_log": {b"\x00" * 7 + b"\x01": b"entry"}}, sync=True)
    db.write({"messages": {b"m": b"x"}}, sync=False)
    batch = db.new_batch()
    batch.put(b"k", b"v", db.handle("raft_state"))
    batch.delete(b"m", db.handle("messages"))
    db.write_batch(batch, True)
    assert db.get("raft_log", b"\x00" * 7 + b"\x01") == b"entry"
    assert db.get("raft_state", b"k") == b"v"
    assert db.get("messages", b"m") is None


def test_a_synced_write_in_a_worker_thread_lets_the_event_loop_thread_run_during_the_fsync(
    db: Database,
) -> None:
    """The single-node log and Raft write synced batches in a worker thread while the
    event loop applies and answers; ``Rdict.write`` holds the GIL throughout, fsync
    included, so the loop stood still for every fsync. With a switch interval far too
    long to ever force a GIL hand-over, the main thread runs before the worker's writes
    are done only if a write releases the GIL by itself."""
    writes = 20
    done: list[int] = []
    started = threading.Event()

    def worker() -> None:
        started.set()  # the main thread wakes, then waits for the GIL
        for number in range(writes):
            batch = db.new_batch()
            batch.put(number.to_bytes(8, "big"), b"entry" * 100, db.handle("raft_log"))
            db.write_batch(batch, True)
            done.append(number)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        thread = threading.Thread(target=worker)
        thread.start()
        assert started.wait(30)
        seen = len(done)
    finally:
        sys.setswitchinterval(interval)
    thread.join(30)
    assert not thread.is_alive()
    assert seen < writes, "the event loop thread waited for every synced write to finish"
    assert [db.get("raft_log", n.to_bytes(8, "big")) for n in range(writes)] == [
        b"entry" * 100
    ] * writes


def test_last_key(db: Database) -> None:
    assert db.last_key("raft_log") is None
    keys = [i.to_bytes(8, "big") for i in (1, 2, 300, 7)]
    db.write({"raft_log": dict.fromkeys(keys, b"e")})
    db.write({"messages": {b"\xff" * 9: b"other family"}})
    assert db.last_key("raft_log") == (300).to_bytes(8, "big")
    db.write({"raft_log": {(300).to_bytes(8, "big"): None}})
    assert db.last_key("raft_log") == (7).to_bytes(8, "big")


def test_delete_range_is_start_inclusive_stop_exclusive_and_one_family(db: Database) -> None:
    keys = [i.to_bytes(8, "big") for i in range(1, 11)]
    db.write({"raft_log": dict.fromkeys(keys, b"e"), "messages": dict.fromkeys(keys, b"m")})
    db.delete_range("raft_log", (0).to_bytes(8, "big"), (4).to_bytes(8, "big"))
    db.delete_range("raft_log", (8).to_bytes(8, "big"), (9).to_bytes(8, "big"))
    remaining = [int.from_bytes(k, "big") for k in db.scan_keys("raft_log", b"")]
    assert remaining == [4, 5, 6, 7, 9, 10]
    assert len(list(db.scan_keys("messages", b""))) == 10


def test_scan_stops_early_without_reading_past_stop(db: Database) -> None:
    db.write({"schedule": {bytes([i]): bytes([i]) for i in range(10)}})
    scan = db.scan("schedule", b"\x02", b"\x05")
    assert next(scan) == (b"\x02", b"\x02")
    assert list(scan) == [(b"\x03", b"\x03"), (b"\x04", b"\x04")]


def test_close_releases_the_lock_so_the_same_process_can_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    db = Database(path)
    db.write({"messages": {b"k": b"v"}})
    scan = db.scan("messages", b"")
    assert next(scan) == (b"k", b"v")
    del scan  # an abandoned scan must not keep the database open
    db.close()
    db.close()  # twice is fine
    again = Database(path)
    try:
        assert again.get("messages", b"k") == b"v"
    finally:
        again.close()


def test_second_open_of_a_locked_directory_raises_storage_error(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    db = Database(path)
    try:
        with pytest.raises(StorageError, match="cannot open RocksDB") as info:
            Database(path)
        assert path in str(info.value)
        db.write({"messages": {b"still": b"works"}})
        assert db.get("messages", b"still") == b"works"
    finally:
        db.close()


def test_data_directory_that_cannot_be_created_raises_storage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"not a directory")
    with pytest.raises(StorageError, match="cannot create the data directory"):
        Database(str(blocker / "db"))


# ---------------------------------------------------------------- full disk (issue 10)


def test_full_disk_errors_are_told_apart_from_other_storage_errors() -> None:
    import errno

    from futureq.errors import NoSpaceError, StorageError
    from futureq.storage.db import storage_error

    for text in (
        "IO error: While appending to file: 000004.log: No space left on device",
        "IO error: While appending to file: 000004.log: File too large",
        "IO error: Disk quota exceeded",
    ):
        assert isinstance(storage_error("write failed", Exception(text)), NoSpaceError)
    assert isinstance(
        storage_error("snapshot", OSError(errno.ENOSPC, "No space left on device")), NoSpaceError
    )
    other = storage_error("write failed", Exception("Corruption: bad block"))
    assert type(other) is StorageError


def test_reopen_keeps_what_was_written(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "db"))
    try:
        db.write({"messages": {b"k": b"v"}}, sync=True)
        db.write({"messages": {b"k2": b"v2"}})  # unsynced, in the WAL
        db.reopen()
        assert db.get("messages", b"k") == b"v" and db.get("messages", b"k2") == b"v2"
        db.write({"messages": {b"k3": b"v3"}}, sync=True)
        assert [key for key, _ in db.scan("messages", b"")] == [b"k", b"k2", b"k3"]
        view = db.snapshot_view(["messages"])
        with pytest.raises(StorageError):
            db.reopen()  # not while a view pins the database
        view.close()
        db.reopen()
    finally:
        db.close()


def _schedule_keys(count: int) -> list[bytes]:
    return [b"\x00\x00\x00\x01" + i.to_bytes(16, "big") for i in range(count)]


def _tombstones_left(db: Database) -> int:
    """Deletes RocksDB still holds for ``schedule`` (memtable plus table files)."""
    family = db._families["schedule"]
    in_memory = family.property_int_value("rocksdb.num-deletes-active-mem-table") or 0
    tables = family.property_value("rocksdb.aggregated-table-properties") or ""
    on_disk = int(tables.split("# deletions=")[1].split(";")[0]) if "# deletions=" in tables else 0
    return in_memory + on_disk


def test_deletes_are_counted_with_their_range_until_taken(db: Database) -> None:
    keys = _schedule_keys(300)
    db.write({"schedule": {k: b"v" for k in keys}, "messages": {b"m": b"v"}})
    db.write({"schedule": {k: None for k in keys[10:110]}, "messages": {b"m": None}})
    assert db.take_tombstones("schedule", 150) is None  # 100 so far: kept counting
    db.write({"schedule": {k: None for k in keys[200:260]}})
    assert db.take_tombstones("schedule", 150) == (keys[10], keys[259])
    assert db.take_tombstones("schedule", 1) is None  # taken: counted afresh
    assert db.take_tombstones("messages", 1) is None  # not a counted family


def test_compacting_a_deleted_range_drops_its_tombstones_and_keeps_the_rest(
    db: Database,
) -> None:
    keys = _schedule_keys(2000)
    db.write({"schedule": {k: b"v" for k in keys}})
    db.write({"schedule": {k: None for k in keys[:1500]}})
    assert _tombstones_left(db) == 1500
    taken = db.take_tombstones("schedule", 1000)
    assert taken is not None
    db.compact_range("schedule", *taken)
    assert _tombstones_left(db) == 0
    assert list(db.scan_keys("schedule", b"\x00\x00\x00\x01", b"\x00\x00\x00\x02")) == keys[1500:]
    assert db.get("schedule", keys[0]) is None and db.get("schedule", keys[1500]) == b"v"


def test_the_compaction_task_compacts_once_enough_was_deleted(db: Database) -> None:
    import trio

    from futureq.broker.tombstones import compact_tombstones

    keys = _schedule_keys(500)
    db.write({"schedule": {k: b"v" for k in keys}})

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: compact_tombstones(db, every_s=0.01, after_deletes=300))
            db.write({"schedule": {k: None for k in keys[:200]}})
            await trio.sleep(0.2)
            assert _tombstones_left(db) == 200  # below the threshold: left alone
            db.write({"schedule": {k: None for k in keys[200:400]}})
            with trio.fail_after(20):
                while _tombstones_left(db):  # noqa: ASYNC110 - polls RocksDB, no event to wait on
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    trio.run(run)
    assert list(db.scan_keys("schedule", b"\x00\x00\x00\x01", b"\x00\x00\x00\x02")) == keys[400:]


def test_a_scan_with_a_stop_ends_inside_a_run_of_deleted_keys(db: Database) -> None:
    keys = _schedule_keys(50)
    db.write({"schedule": {k: b"v" for k in keys}})
    db.write({"schedule": {k: None for k in keys[5:45]}})
    assert list(db.scan_keys("schedule", keys[0], keys[20])) == keys[:5]
    assert [k for k, _ in db.scan("schedule", keys[3], keys[46])] == [*keys[3:5], *keys[45:46]]
