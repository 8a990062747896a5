"""RocksStorage: crash consistency of ``persist`` and the parts beyond the contract.

The Storage contract itself runs in ``test_raft_storage_contract.py`` through
:func:`rocks_storage_factory`. Here: what one ``persist(ready)`` writes is exactly what
a reopened database shows (one atomic batch), entries overwritten by a conflicting
suffix stay gone, snapshots survive in their files, and ``compact(keep_entries=...)``
keeps a catch-up tail behind the snapshot.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from futureq.errors import StorageError
from futureq.raft.messages import LogIndex, NodeId, Ready, Term
from futureq.raft.rocks_storage import RocksStorage, StoreIdentity
from futureq.raft.storage import CompactedError, MemoryStorage
from futureq.raft.values import (
    Entry,
    EntryKind,
    HardState,
    MemberRecord,
    Membership,
    Registry,
    Snapshot,
    SnapshotMetadata,
)
from futureq.storage.db import Database

MEMBERSHIP = Membership(frozenset({NodeId(1), NodeId(2), NodeId(3)}))


def _cleanup(db: Database, directory: str) -> None:
    db.close()
    shutil.rmtree(directory, ignore_errors=True)


def rocks_storage_factory(membership: Membership) -> RocksStorage:
    """A RocksStorage in a fresh temp directory, closed and removed when collected."""
    directory = tempfile.mkdtemp(prefix="futureq-raft-")
    db = Database(str(Path(directory) / "db"))
    storage = RocksStorage(db, str(Path(directory) / "snapshots"), membership)
    weakref.finalize(storage, _cleanup, db, directory)
    return storage


class _Reopenable:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.db = Database(str(path / "db"))
        self.storage = RocksStorage(self.db, str(path / "snapshots"), MEMBERSHIP)

    def reopen(self) -> RocksStorage:
        del self.storage
        self.db.close()
        self.db = Database(str(self.path / "db"))
        self.storage = RocksStorage(self.db, str(self.path / "snapshots"))
        return self.storage

    def close(self) -> None:
        self.db.close()


def _state(storage: RocksStorage | MemoryStorage) -> tuple[object, ...]:
    first, last = storage.first_index(), storage.last_index()
    entries = storage.entries(first, LogIndex(last + 1), 1 << 40) if last >= first else []
    return (
        storage.initial_state(),
        storage.snapshot(),
        first,
        last,
        tuple(entries),
        storage.term(LogIndex(first - 1)),
    )


def _entries(first: int, terms: list[int]) -> tuple[Entry, ...]:
    return tuple(
        Entry(Term(t), LogIndex(first + i), EntryKind.NORMAL, b"e%d" % (first + i))
        for i, t in enumerate(terms)
    )


@pytest.fixture
def reopenable(tmp_path: Path) -> Iterator[_Reopenable]:
    made = _Reopenable(tmp_path)
    yield made
    made.close()


def test_persist_is_exactly_what_a_reopen_shows(reopenable: _Reopenable) -> None:
    """Random Ready sequences (append, overwrite, hard state, leader snapshots,
    compaction) against MemoryStorage as the model; reopen after every other step."""
    rng = random.Random(7)
    model = MemoryStorage(MEMBERSHIP)
    storage = reopenable.storage
    term = 1
    for step in range(40):
        action = rng.random()
        last = model.last_index()
        if action < 0.55:
            first = rng.randint(max(model.first_index(), last - 3), last + 1)
            if rng.random() < 0.3:
                term += 1
            ready = Ready(
                entries=_entries(first, [term] * rng.randint(1, 5)),
                hard_state=HardState(Term(term), NodeId(rng.randint(1, 3)), LogIndex(0)),
                must_sync=True,
            )
            storage.persist(ready)
            model.append(ready.entries)
            assert ready.hard_state is not None
            model.set_hard_state(ready.hard_state)
        elif action < 0.75 and last >= model.first_index():
            index = LogIndex(rng.randint(model.first_index(), last))
            snapshot = Snapshot(
                SnapshotMetadata(index, model.term(index), MEMBERSHIP), b"state%d" % step
            )
            storage.compact(snapshot)
            model.compact(snapshot)
        elif action < 0.85:
            index = LogIndex(last + rng.randint(1, 5))
            term += 1
            snapshot = Snapshot(SnapshotMetadata(index, Term(term), MEMBERSHIP), b"leader%d" % step)
            storage.persist(Ready(snapshot=snapshot, must_sync=True))
            model.apply_snapshot(snapshot)
        else:
            hard_state = HardState(Term(term), None, LogIndex(0))
            storage.persist(Ready(hard_state=hard_state))
            model.set_hard_state(hard_state)
        assert _state(storage) == _state(model), step
        if step % 2:  # a reopen costs ~0.1 s (flush, close, open)
            storage = reopenable.reopen()
            assert _state(storage) == _state(model), step


def test_overwritten_suffix_stays_gone_after_reopen(reopenable: _Reopenable) -> None:
    storage = reopenable.storage
    storage.persist(Ready(entries=_entries(1, [1, 1, 1, 1, 1]), must_sync=True))
    storage.persist(Ready(entries=_entries(3, [2]), must_sync=True))
    storage = reopenable.reopen()
    assert storage.last_index() == 3
    assert [storage.term(LogIndex(i)) for i in (1, 2, 3)] == [1, 1, 2]


def test_compact_keeps_a_catch_up_tail(reopenable: _Reopenable) -> None:
    storage = reopenable.storage
    storage.append(_entries(1, [1] * 20))
    snapshot = Snapshot(SnapshotMetadata(LogIndex(15), Term(1), MEMBERSHIP), b"s15")
    storage.compact(snapshot, keep_entries=5)
    for reopened in (storage, reopenable.reopen()):
        assert reopened.first_index() == 11 and reopened.last_index() == 20
        assert reopened.snapshot() == snapshot
        assert reopened.term(LogIndex(10)) == 1
        with pytest.raises(CompactedError):
            reopened.term(LogIndex(9))
        assert [e.index for e in reopened.entries(LogIndex(11), LogIndex(21), 1 << 20)] == list(
            range(11, 21)
        )


def test_old_snapshot_files_are_removed(reopenable: _Reopenable) -> None:
    storage = reopenable.storage
    storage.append(_entries(1, [1] * 10))
    storage.compact(Snapshot(SnapshotMetadata(LogIndex(3), Term(1), MEMBERSHIP), b"a"))
    storage.compact(Snapshot(SnapshotMetadata(LogIndex(6), Term(1), MEMBERSHIP), b"b"))
    files = sorted(p.name for p in (reopenable.path / "snapshots").iterdir())
    assert files == ["snapshot-00000000000000000006.bin"]


def test_the_snapshot_registry_and_the_identity_stamp_survive_a_reopen(
    reopenable: _Reopenable,
) -> None:
    """docs/raft.md, "Disk faults": the member registry rides in snapshot metadata; the
    data directory's stamp is written once and read back."""
    storage = reopenable.storage
    assert storage.identity() is None and storage.is_pristine() is False  # has a membership
    storage.stamp_identity(StoreIdentity("prod", 2, 0xABC))
    registry = Registry(
        (MemberRecord(NodeId(1), 7, Term(1), LogIndex(3)),), ((NodeId(4), LogIndex(2)),)
    )
    storage.append(_entries(1, [1] * 5))
    storage.compact(Snapshot(SnapshotMetadata(LogIndex(3), Term(1), MEMBERSHIP, registry), b"a"))
    again = reopenable.reopen()
    assert again.snapshot().metadata.registry == registry
    assert again.identity() == StoreIdentity("prod", 2, 0xABC)


def test_a_fresh_store_is_pristine(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "db"))
    try:
        assert RocksStorage(db, str(tmp_path / "snapshots")).is_pristine()
    finally:
        db.close()


def test_missing_snapshot_file_is_a_storage_error(reopenable: _Reopenable) -> None:
    storage = reopenable.storage
    storage.append(_entries(1, [1] * 4))
    storage.compact(Snapshot(SnapshotMetadata(LogIndex(3), Term(1), MEMBERSHIP), b"a"))
    for file in (reopenable.path / "snapshots").iterdir():
        file.unlink()
    with pytest.raises(StorageError):
        reopenable.reopen()  # reopenable.db is the reopened database, closed by the fixture


def test_recent_entries_cache_agrees_with_disk(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "db"))
    try:
        storage = RocksStorage(db, str(tmp_path / "snap"), MEMBERSHIP, cache_bytes=100)
        storage.append(_entries(1, [1] * 30))
        storage.append(_entries(25, [2] * 3))
        got = storage.entries(LogIndex(1), LogIndex(28), 1 << 20)
        assert got == list(_entries(1, [1] * 24) + _entries(25, [2] * 3))
    finally:
        del storage
        db.close()
