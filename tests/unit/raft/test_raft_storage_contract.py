"""The Storage contract, run against every implementation (STYLE.md §8).

Add a RocksDB-backed storage by appending a factory to ``STORAGE_FACTORIES``: a
callable taking the initial membership and returning an object with the Storage
protocol plus ``append``, ``set_hard_state``, ``hard_state``, ``apply_snapshot`` and
``compact``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from test_raft_rocks_storage import rocks_storage_factory

from futureq.raft.messages import LogIndex, NodeId, Term
from futureq.raft.storage import (
    CompactedError,
    MemoryStorage,
    SnapshotOutOfDateError,
    UnavailableError,
)
from futureq.raft.values import Entry, EntryKind, HardState, Membership, Snapshot, SnapshotMetadata

MEMBERSHIP = Membership(frozenset({NodeId(1), NodeId(2), NodeId(3)}))

STORAGE_FACTORIES: dict[str, Callable[[Membership], Any]] = {
    "memory": MemoryStorage,
    "rocksdb": rocks_storage_factory,
}


@pytest.fixture(params=sorted(STORAGE_FACTORIES))
def make_storage(request: pytest.FixtureRequest) -> Callable[[Membership], Any]:
    return STORAGE_FACTORIES[request.param]


def _entries(first: int, terms: list[int]) -> list[Entry]:
    return [Entry(Term(t), LogIndex(first + i), EntryKind.NORMAL, b"e%d" % (first + i))
            for i, t in enumerate(terms)]  # fmt: skip


def test_fresh_storage_is_empty_with_bootstrap_snapshot(make_storage: Any) -> None:
    storage = make_storage(MEMBERSHIP)
    assert storage.initial_state() == (HardState(), MEMBERSHIP)
    assert storage.first_index() == 1 and storage.last_index() == 0
    assert storage.term(LogIndex(0)) == 0
    assert storage.snapshot().metadata == SnapshotMetadata(LogIndex(0), Term(0), MEMBERSHIP)
    assert storage.entries(LogIndex(1), LogIndex(1), 100) == []


def test_append_and_read_back(make_storage: Any) -> None:
    storage = make_storage(MEMBERSHIP)
    storage.append(_entries(1, [1, 1, 2]))
    assert storage.last_index() == 3
    assert [storage.term(LogIndex(i)) for i in (1, 2, 3)] == [1, 1, 2]
    assert storage.entries(LogIndex(2), LogIndex(4), 1 << 20) == _entries(2, [1, 2])


def test_append_overwrites_suffix(make_storage: Any) -> None:
    storage = make_storage(MEMBERSHIP)
    storage.append(_entries(1, [1, 1, 1, 1]))
    storage.append(_entries(3, [2]))
    assert storage.last_index() == 3
    assert storage.term(LogIndex(3)) == 2


def test_append_with_gap_is_refused(make_storage: Any) -> None:
    storage = make_storage(MEMBERSHIP)
    storage.append(_entries(1, [1]))
    with pytest.raises(ValueError):
        storage.append(_entries(3, [1]))


def test_entries_respect_max_bytes_but_return_at_least_one(make_storage: Any) -> None:
    storage = make_storage(MEMBERSHIP)
    storage.append(_entries(1, [1] * 10))
    assert len(storage.entries(LogIndex(1), LogIndex(11), 1)) == 1
    two = sum(e.size_bytes() for e in _entries(1, [1, 1]))
    assert len(storage.entries(LogIndex(1), LogIndex(11), two)) == 2


def test_out_of_range_reads_raise(make_storage: Any) -> None:
    storage = make_storage(MEMBERSHIP)
    storage.append(_entries(1, [1, 1, 1]))
    with pytest.raises(UnavailableError):
        storage.term(LogIndex(4))
    with pytest.raises(UnavailableError):
        storage.entries(LogIndex(1), LogIndex(5), 100)


def test_hard_state_round_trips(make_storage: Any) -> None:
    storage = make_storage(MEMBERSHIP)
    hard_state = HardState(Term(4), NodeId(2), LogIndex(0))
    storage.set_hard_state(hard_state)
    assert storage.initial_state()[0] == hard_state
    assert storage.hard_state() == hard_state


def test_compact_keeps_later_entries_and_snapshot_term(make_storage: Any) -> None:
    storage = make_storage(MEMBERSHIP)
    storage.append(_entries(1, [1, 1, 2, 2, 3]))
    membership = Membership(MEMBERSHIP.voters, frozenset({NodeId(4)}))
    snapshot = Snapshot(SnapshotMetadata(LogIndex(3), Term(2), membership), b"state")
    storage.compact(snapshot)
    assert storage.first_index() == 4 and storage.last_index() == 5
    assert storage.term(LogIndex(3)) == 2
    assert storage.snapshot() == snapshot
    assert storage.initial_state()[1] == membership
    with pytest.raises(CompactedError):
        storage.term(LogIndex(2))
    with pytest.raises(CompactedError):
        storage.entries(LogIndex(3), LogIndex(5), 100)
    assert storage.entries(LogIndex(4), LogIndex(6), 100) == _entries(4, [2, 3])
    storage.append(_entries(6, [3]))
    assert storage.last_index() == 6


def test_compact_refuses_stale_or_mismatched_snapshots(make_storage: Any) -> None:
    storage = make_storage(MEMBERSHIP)
    storage.append(_entries(1, [1, 1, 2]))
    storage.compact(Snapshot(SnapshotMetadata(LogIndex(2), Term(1), MEMBERSHIP)))
    with pytest.raises(SnapshotOutOfDateError):
        storage.compact(Snapshot(SnapshotMetadata(LogIndex(2), Term(1), MEMBERSHIP)))
    with pytest.raises(ValueError):
        storage.compact(Snapshot(SnapshotMetadata(LogIndex(3), Term(9), MEMBERSHIP)))
    with pytest.raises(UnavailableError):
        storage.compact(Snapshot(SnapshotMetadata(LogIndex(9), Term(2), MEMBERSHIP)))


def test_apply_snapshot_replaces_the_log(make_storage: Any) -> None:
    storage = make_storage(MEMBERSHIP)
    storage.append(_entries(1, [1, 1, 1]))
    snapshot = Snapshot(SnapshotMetadata(LogIndex(10), Term(4), MEMBERSHIP), b"s")
    storage.apply_snapshot(snapshot)
    assert storage.first_index() == 11 and storage.last_index() == 10
    assert storage.term(LogIndex(10)) == 4
    storage.append(_entries(11, [4]))
    assert storage.last_index() == 11
    with pytest.raises(SnapshotOutOfDateError):
        storage.apply_snapshot(snapshot)


def test_append_ignores_entries_covered_by_snapshot(make_storage: Any) -> None:
    storage = make_storage(MEMBERSHIP)
    storage.append(_entries(1, [1, 1, 1]))
    storage.compact(Snapshot(SnapshotMetadata(LogIndex(2), Term(1), MEMBERSHIP)))
    storage.append(_entries(1, [1, 1, 1, 1]))
    assert storage.first_index() == 3 and storage.last_index() == 4
