"""QueueState snapshots: serialize a point-in-time view, restore it into another store.

Raft compacts behind a snapshot and installs it on lagging followers (Raft paper §7),
so a restored replica must be indistinguishable from the one that took the snapshot:
identical families, identical reads, identical behaviour for the commands that
follow. Every test runs on a MemoryStore and on a real RocksDB (the ``kit`` fixture);
restores also cross over between the two. Format and crash-safety rules:
``futureq.state.snapshot``.
"""

from __future__ import annotations

import io
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from state_helpers import Recorder, SpyStore, StoreKit, dump, group_snapshot

from futureq.errors import StorageError
from futureq.state import commands, snapshot
from futureq.state.commands import schedule_key
from futureq.state.queue_state import QueueState
from futureq.state.snapshot import CorruptSnapshotError
from futureq.state.store import Changes, MemoryStore, SnapshotStore, StoreView
from futureq.storage.db import Database

StoreFactory = Callable[[], SnapshotStore]


@pytest.fixture(params=["memory", "rocksdb"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Makes empty stores to restore into (memory, or RocksDB in fresh directories)."""
    opened: list[Database] = []

    def make() -> SnapshotStore:
        if request.param == "memory":
            return MemoryStore()
        db = Database(str(tmp_path / f"target{len(opened)}"))
        opened.append(db)
        return db

    yield make
    for db in opened:
        db.close()


def _next(state: QueueState, data: bytes) -> Any:
    return state.apply(state.applied_index + 1, data)


def _gid(state: QueueState, topic: str, name: str) -> int:
    info = state.find_group(topic, name)
    assert info is not None
    return info.group_id


def _entries(state: QueueState, gid: int) -> list[tuple[int, int, int, int | None]]:
    return list(state.scan_schedule(gid, 0, 0, 10**6))


def _populate(state: QueueState) -> None:
    """Several topics and groups; pending, nacked, TTL'd, dead-lettered entries; nodes."""
    _next(state, commands.node_address(1, "10.0.0.1:7451", "10.0.0.1:7450"))
    _next(state, commands.node_address(2, "10.0.0.2:7451", "10.0.0.2:7450"))
    _next(state, commands.publish(1000, [("orders", b"early", 1500, None)]))  # implicit group
    _next(state, commands.create_group("orders", "billing", 5000, 3))  # adopts it
    _next(state, commands.create_group("orders", "audit", None, None))
    _next(state, commands.create_group("mail", "sender", None, 2))
    state.apply_other(state.applied_index + 1)  # a raft NOOP / CONFIG_CHANGE entry
    items: list[tuple[str, bytes, int, int | None]] = [
        ("orders", b"o%d" % i, 2000 + 10 * i, 500 if i % 3 == 0 else None) for i in range(12)
    ]
    items += [("mail", b"m%d" % i, 1800 + i, None) for i in range(6)]
    items.append(("logs", b"nobody listens", 1900, 100))  # another implicit group
    _next(state, commands.publish(1100, items))
    billing = _gid(state, "orders", "billing")
    audit = _gid(state, "orders", "audit")
    sender = _gid(state, "mail", "sender")
    billing_keys = [schedule_key(billing, d, m) for d, m, _, _ in _entries(state, billing)]
    audit_keys = [schedule_key(audit, d, m) for d, m, _, _ in _entries(state, audit)]
    sender_keys = [schedule_key(sender, d, m) for d, m, _, _ in _entries(state, sender)]
    _next(state, commands.ack(billing_keys[:3] + audit_keys[:1]))
    _next(state, commands.nack(2100, 700, [(billing_keys[4], 1), (billing_keys[5], 2)]))
    _next(state, commands.expire(audit_keys[2:4]))
    _next(state, commands.dead_letter(2200, [(sender_keys[0], 2), (sender_keys[1], 2)]))
    _next(state, commands.node_address(2, None, None))
    _next(state, commands.node_address(3, "10.0.0.3:7451", "10.0.0.3:7450"))
    state.apply_other(state.applied_index + 1)


def _reads(state: QueueState) -> dict[str, Any]:
    """Everything QueueState answers, to compare two states."""
    return {
        "applied": state.applied_index,
        "groups": group_snapshot(state),
        "topics": state.topics(),
        "per_topic": {t: [g.group_id for g in state.topic_groups(t)] for t in state.topics()},
        "nodes": sorted(state.node_addresses.items()),
        "last_publish_ms": state.last_publish_ms,
        "schedule": {gid: _entries(state, gid) for gid in sorted(state.groups)},
        "messages": [
            state.get_message(int.from_bytes(key, "big"))
            for key, _ in state.store.scan("messages", b"")
        ],
    }


def _follow_up(state: QueueState) -> list[Any]:
    """The same further commands for an original and its restored copy; their results."""
    results = []
    billing = _gid(state, "orders", "billing")
    keys = [schedule_key(billing, d, m) for d, m, _, _ in _entries(state, billing)]
    results.append(_next(state, commands.ack(keys[:2])))
    results.append(_next(state, commands.create_group("orders", "extra", None, None)))
    results.append(_next(state, commands.publish(3000, [("orders", b"late", 3500, 10)])))
    results.append(_next(state, commands.create_group("new", "g", None, None)))
    results.append(_next(state, commands.delete_group("mail", "sender")))
    results.append(_next(state, commands.publish(2999, [("logs", b"again", 3100, None)])))
    state.apply_other(state.applied_index + 1)
    return results


def _snapshot_of(state: QueueState) -> bytes:
    with state.snapshot_source() as source:
        assert source.index == state.applied_index
        return source.serialize()


# ---------------------------------------------------------------- round trip


def test_restore_into_an_empty_store_gives_identical_families_and_reads(
    kit: StoreKit, target: StoreFactory
) -> None:
    original = QueueState(kit.store)
    _populate(original)
    data = _snapshot_of(original)
    restored = QueueState(target())
    restored.restore(data, original.applied_index)
    assert dump(restored.store) == dump(original.store)
    assert _reads(restored) == _reads(original)
    # A state rebuilt from the restored store (a restart) reads the same too.
    assert _reads(QueueState(restored.store)) == _reads(original)


def test_original_and_restored_stay_identical_under_the_same_commands(
    kit: StoreKit, target: StoreFactory
) -> None:
    original = QueueState(kit.store)
    _populate(original)
    restored = QueueState(target())
    restored.restore(_snapshot_of(original), original.applied_index)
    assert _follow_up(restored) == _follow_up(original)
    assert dump(restored.store) == dump(original.store)
    assert _reads(restored) == _reads(original)


def test_restore_replaces_a_state_that_already_holds_other_data(
    kit: StoreKit, target: StoreFactory
) -> None:
    original = QueueState(kit.store)
    _populate(original)
    data = _snapshot_of(original)
    behind = QueueState(target())
    _next(behind, commands.node_address(9, "x:1", "x:2"))
    _next(behind, commands.create_group("gone", "g", None, None))
    _next(behind, commands.publish(50, [("gone", b"stale", 60, None), ("t", b"x", 70, 5)]))
    recorder = Recorder(behind)
    nodes_changed: list[int] = []
    behind.on_nodes_changed = lambda: nodes_changed.append(behind.applied_index)
    behind.restore(data, original.applied_index)
    assert dump(behind.store) == dump(original.store)
    assert _reads(behind) == _reads(original)
    assert recorder.take() == [("g",)]
    assert recorder.violations == []
    assert nodes_changed == [original.applied_index]


def test_restore_of_a_snapshot_taken_ahead_then_behind(kit: StoreKit) -> None:
    """A replica may install an older-looking state over a newer one only through Raft;
    here a state restores its own earlier snapshot and is back exactly where it was."""
    state = QueueState(kit.store)
    _populate(state)
    before = dump(state.store)
    reads = _reads(state)
    data = _snapshot_of(state)
    _follow_up(state)
    state.restore(data, reads["applied"])
    assert dump(state.store) == before
    assert _reads(state) == reads


def test_empty_state_round_trips(kit: StoreKit, target: StoreFactory) -> None:
    original = QueueState(kit.store)
    data = _snapshot_of(original)
    assert snapshot.snapshot_index(data) == 0
    restored = QueueState(target())
    _next(restored, commands.publish(1, [("t", b"x", 1, None)]))
    restored.restore(data, 0)
    # A fresh store has no applied index key yet; a restored one always has it.
    assert dump(restored.store) == {
        "messages": [],
        "schedule": [],
        "groups": [],
        "meta": [(b"applied_index", bytes(8))],
        "index": [],
    }
    assert _reads(restored) == _reads(original)


def test_equal_states_serialize_to_identical_bytes(tmp_path: Path) -> None:
    memory = QueueState(MemoryStore())
    db = Database(str(tmp_path / "db"))
    try:
        rocks = QueueState(db)
        _populate(memory)
        _populate(rocks)
        assert _snapshot_of(memory) == _snapshot_of(rocks)
    finally:
        db.close()


def test_snapshot_layout_is_header_chunks_trailer(kit: StoreKit) -> None:
    state = QueueState(kit.store)
    _populate(state)
    values = list(msgpack.Unpacker(io.BytesIO(_snapshot_of(state)), raw=False))
    assert values[0] == ["futureq-state", snapshot.FORMAT_VERSION, state.applied_index]
    assert snapshot.FORMAT_VERSION == 2
    assert values[-1][0] == "end"
    families = [family for family, _ in values[1:-1]]
    assert families == sorted(families, key=snapshot.FAMILIES.index)
    records = sum(len(flat) // 2 for _, flat in values[1:-1])
    assert values[-1][1] == records == sum(len(items) for items in dump(state.store).values())
    meta_keys = [k for family, flat in values[1:-1] if family == "meta" for k in flat[::2]]
    assert b"schema_version" not in meta_keys
    assert b"applied_index" in meta_keys


def test_chunks_split_large_families(monkeypatch: pytest.MonkeyPatch, kit: StoreKit) -> None:
    monkeypatch.setattr(snapshot, "CHUNK_RECORDS", 3)
    monkeypatch.setattr(snapshot, "WRITE_BATCH_RECORDS", 5)
    state = QueueState(kit.store)
    _populate(state)
    data = _snapshot_of(state)
    chunks = list(msgpack.Unpacker(io.BytesIO(data), raw=False))[1:-1]
    assert max(len(flat) for _, flat in chunks) == 6 and len(chunks) > 10
    restored = QueueState(MemoryStore())
    restored.restore(data, state.applied_index)
    assert dump(restored.store) == dump(state.store)


# ---------------------------------------------------------------- point in time


def test_serialize_does_not_see_writes_applied_after_the_source_was_taken(
    kit: StoreKit, target: StoreFactory
) -> None:
    state = QueueState(kit.store)
    _populate(state)
    at_snapshot = dump(state.store)
    reads = _reads(state)
    source = state.snapshot_source()
    _follow_up(state)  # acks, deletes, publishes, group changes after the view
    assert dump(state.store) != at_snapshot
    data = source.serialize()
    source.close()
    restored = QueueState(target())
    restored.restore(data, source.index)
    assert source.index == reads["applied"]
    assert dump(restored.store) == at_snapshot
    assert _reads(restored) == reads


def test_serialize_in_a_thread_while_the_loop_keeps_applying(kit: StoreKit) -> None:
    """``serialize`` runs in a worker thread in production; applies go on meanwhile.

    Whatever the interleaving, the bytes describe the state at the source's index.
    """
    state = QueueState(kit.store)
    _populate(state)
    for batch in range(20):
        items: list[tuple[str, bytes, int, int | None]] = [
            ("bulk", b"p" * 100, 5000 + i, None) for i in range(200)
        ]
        _next(state, commands.publish(4000 + batch, items))
    at_snapshot = dump(state.store)
    source = state.snapshot_source()
    result: list[bytes] = []
    worker = threading.Thread(target=lambda: result.append(source.serialize()))
    worker.start()
    gid = _gid(state, "bulk", "default")
    while worker.is_alive():
        keys = [schedule_key(gid, d, m) for d, m, _, _ in state.scan_schedule(gid, 0, 0, 50)]
        if not keys:
            break
        _next(state, commands.ack(keys))
    worker.join()
    source.close()
    restored = QueueState(MemoryStore())
    restored.restore(result[0], source.index)
    assert dump(restored.store) == at_snapshot


def test_closed_source_refuses_to_serialize(kit: StoreKit) -> None:
    state = QueueState(kit.store)
    _populate(state)
    source = state.snapshot_source()
    source.close()
    source.close()  # idempotent
    with pytest.raises((StorageError, ValueError)):
        source.serialize()


def test_closing_the_database_closes_open_views(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "db"))
    state = QueueState(db)
    _populate(state)
    view: StoreView = db.snapshot_view(snapshot.FAMILIES)
    assert next(iter(view.scan("groups", b""))) is not None
    db.close()
    with pytest.raises(StorageError):
        next(iter(view.scan("groups", b"")))
    again = Database(str(tmp_path / "db"))  # the LOCK was released
    again.close()


def test_store_without_snapshot_support_is_refused() -> None:
    state = QueueState(SpyStore(MemoryStore()))
    with pytest.raises(TypeError):
        state.snapshot_source()


# ---------------------------------------------------------------- apply_other


def test_apply_other_advances_and_persists_the_applied_index(kit: StoreKit) -> None:
    state = QueueState(kit.store)
    _next(state, commands.publish(10, [("t", b"x", 20, None)]))
    before = dump(state.store)
    state.apply_other(2)
    state.apply_other(3)
    assert state.applied_index == 3
    after = dump(state.store)
    changed = {
        b"applied_index": (3).to_bytes(8, "big"),
        b"applied_digest": state.applied_digest.to_bytes(4, "big"),
    }
    assert after["meta"] == [(k, changed.get(k, v)) for k, v in before["meta"]]
    assert {f: after[f] for f in ("messages", "schedule", "groups")} == {
        f: before[f] for f in ("messages", "schedule", "groups")
    }
    assert QueueState(kit.reopen()).applied_index == 3
    with pytest.raises(AssertionError):
        state.apply_other(5)
    # ids keep coming from the log index: the next publish is at index 4
    assert QueueState(kit.store).apply(4, commands.publish(11, [("t", b"y", 30, None)])) == 4 << 16


# ---------------------------------------------------------------- bad snapshots


def _corruptions(data: bytes) -> dict[str, bytes]:
    middle = len(data) // 2
    flipped = data[:middle] + bytes([data[middle] ^ 0x40]) + data[middle + 1 :]
    header_len = len(msgpack.packb(["futureq-state", snapshot.FORMAT_VERSION, 0]))
    packb = msgpack.Packer(use_bin_type=True).pack
    return {
        "empty": b"",
        "truncated": data[: len(data) - 3],
        "no trailer": data[: data.rfind(b"\x93\xa3end")],
        "flipped byte": flipped,
        "trailing bytes": data + b"\x00",
        "not msgpack": b"\xc1" * 40,
        "other value": packb({"hello": 1}),
        "future format": packb(["futureq-state", 3, 0]) + data[header_len:],
        "unknown family": packb(["futureq-state", 1, 0])
        + packb(["raft_log", [b"k", b"v"]])
        + packb(["end", 1, 0]),
    }


def test_a_format_1_snapshot_without_the_index_family_is_still_read(kit: StoreKit) -> None:
    # Format 1 (before issue 14) had no "index" family; restoring one must still work,
    # with the index family left empty.
    state = QueueState(kit.store)
    _populate(state)
    values = list(msgpack.Unpacker(io.BytesIO(_snapshot_of(state)), raw=False))
    packb = msgpack.Packer(use_bin_type=True).pack
    kept = [chunk for chunk in values[1:-1] if chunk[0] != "index"]
    body = packb(["futureq-state", 1, state.applied_index]) + b"".join(map(packb, kept))
    old = body + packb(["end", sum(len(flat) // 2 for _, flat in kept), zlib.crc32(body)])
    restored = QueueState(MemoryStore())
    restored.restore(old, state.applied_index)
    expected = dump(state.store)
    expected.pop("index", None)
    got = dump(restored.store)
    assert not got.get("index")
    got.pop("index", None)
    assert got == expected


def test_corrupt_snapshot_raises_and_leaves_the_state_untouched(
    kit: StoreKit, target: StoreFactory
) -> None:
    source_state = QueueState(kit.store)
    _populate(source_state)
    data = _snapshot_of(source_state)
    victim = QueueState(target())
    _next(victim, commands.publish(5, [("t", b"keep me", 9, None)]))
    before, reads = dump(victim.store), _reads(victim)
    for name, bad in _corruptions(data).items():
        with pytest.raises(CorruptSnapshotError):
            victim.restore(bad, source_state.applied_index)
        assert dump(victim.store) == before, name
        assert _reads(victim) == reads, name
    with pytest.raises(CorruptSnapshotError):
        victim.restore("not bytes", 1)  # type: ignore[arg-type]
    assert issubclass(CorruptSnapshotError, StorageError)
    victim.restore(data, source_state.applied_index)  # and the good one still installs
    assert dump(victim.store) == dump(source_state.store)


def test_snapshot_installed_at_another_index_is_a_caller_bug(kit: StoreKit) -> None:
    state = QueueState(kit.store)
    _populate(state)
    data = _snapshot_of(state)
    before = dump(state.store)
    with pytest.raises(AssertionError):
        state.restore(data, state.applied_index + 1)
    assert dump(state.store) == before


# ---------------------------------------------------------------- interrupted restore


class CrashingStore:
    """Forwards to a store, then fails every write after ``writes_left`` of them."""

    def __init__(self, inner: SnapshotStore, writes_left: int) -> None:
        self.inner = inner
        self.writes_left = writes_left

    def get(self, family: str, key: bytes) -> bytes | None:
        return self.inner.get(family, key)

    def scan(self, family: str, start: bytes, stop: bytes | None = None) -> Any:
        return self.inner.scan(family, start, stop)

    def scan_keys(self, family: str, start: bytes, stop: bytes | None = None) -> Any:
        return self.inner.scan_keys(family, start, stop)

    def _spend(self) -> None:
        if self.writes_left <= 0:
            raise StorageError("simulated crash")
        self.writes_left -= 1

    def write(self, changes: Changes, *, sync: bool = False) -> None:
        self._spend()
        self.inner.write(changes, sync=sync)

    def clear(self, family: str) -> None:
        self._spend()
        self.inner.clear(family)

    def snapshot_view(self, families: Any) -> StoreView:
        return self.inner.snapshot_view(families)


def test_interrupted_restore_leaves_a_marker_the_state_refuses_to_start_on(
    monkeypatch: pytest.MonkeyPatch, kit: StoreKit
) -> None:
    monkeypatch.setattr(snapshot, "WRITE_BATCH_RECORDS", 4)
    source_state = QueueState(MemoryStore())
    _populate(source_state)
    data = _snapshot_of(source_state)
    writes = 0
    counter = CrashingStore(MemoryStore(), 10**6)
    QueueState(counter).restore(data, source_state.applied_index)
    writes = 10**6 - counter.writes_left
    assert writes > 6  # marker, 3 clears, meta deletes, several batches, final
    store = kit.store
    assert isinstance(store, (MemoryStore, Database))
    for crash_after in range(1, writes):
        victim = QueueState(store)
        _next(victim, commands.publish(5, [("t", b"old", 9, None)]))
        crashing = CrashingStore(store, crash_after)
        with pytest.raises(StorageError, match="simulated crash"):
            QueueState(crashing).restore(data, source_state.applied_index)
        store = kit.reopen()  # RocksDB: close and open again, as after a crash
        assert isinstance(store, (MemoryStore, Database))
        with pytest.raises(StorageError, match="installing the snapshot at log index"):
            QueueState(store)
        # Finishing the restore with the store-level function lets the node start.
        snapshot.restore_into(store, data, source_state.applied_index)
        assert _reads(QueueState(store)) == _reads(source_state)
        assert dump(store) == dump(source_state.store)
        # Next round starts from another state on the same store.
        snapshot.restore_into(store, _snapshot_of(QueueState(MemoryStore())), 0)


def test_marker_is_gone_and_schema_kept_after_a_restore_on_rocksdb(tmp_path: Path) -> None:
    source_state = QueueState(MemoryStore())
    _populate(source_state)
    path = str(tmp_path / "db")
    db = Database(path)
    QueueState(db).restore(_snapshot_of(source_state), source_state.applied_index)
    db.close()
    db = Database(path)  # the schema check passes: schema_version survived
    try:
        assert db.get("meta", snapshot.RESTORING_KEY) is None
        assert _reads(QueueState(db)) == _reads(source_state)
    finally:
        db.close()


def test_applied_index_key_matches_queue_state() -> None:
    state = QueueState(MemoryStore())
    state.apply_other(1)
    assert state.store.get("meta", snapshot.APPLIED_INDEX_KEY) == (1).to_bytes(8, "big")


def test_a_node_address_whose_id_does_not_fit_is_ignored_on_every_replica() -> None:
    """A committed NODE_ADDRESS with an id past MAX_NODE_ID (stored under a 4-byte key)
    used to raise OverflowError in apply, on every replica and on every replay."""
    state = QueueState(MemoryStore())
    for node_id in (commands.MAX_NODE_ID + 1, 2**63, 2**64 - 1):
        _next(state, commands.node_address(node_id, "x:1", "x:2"))
    _next(state, commands.node_address(commands.MAX_NODE_ID, "y:1", "y:2"))
    assert state.node_addresses == {commands.MAX_NODE_ID: ("y:1", "y:2")}
    assert state.applied_index == 4
