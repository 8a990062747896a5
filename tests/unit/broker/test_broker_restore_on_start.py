"""A clustered node that died while installing a snapshot finishes the install on start
(the raft store keeps the snapshot; the state carries a "restoring" marker)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from futureq.broker.cluster import finish_interrupted_restore
from futureq.config import ClusterSection, Config, ServerSection
from futureq.errors import StorageError
from futureq.raft.messages import LogIndex, NodeId, Term
from futureq.raft.rocks_storage import RocksStorage
from futureq.raft.values import Membership, Snapshot, SnapshotMetadata
from futureq.state import commands, snapshot
from futureq.state.queue_state import QueueState
from futureq.state.store import MemoryStore
from futureq.storage.db import Database


def test_interrupted_snapshot_install_is_finished_on_start(tmp_path: Path) -> None:
    source = QueueState(MemoryStore())
    source.apply(1, commands.create_group("orders", "billing", None, None))
    source.apply(2, commands.publish(1_000, [("orders", b"kept", 5_000, None)]))
    data = source.snapshot_source().serialize()

    config = Config(
        server=ServerSection(data_dir=str(tmp_path / "node")),
        cluster=ClusterSection(peers="1=127.0.0.1:1"),
    )
    db = Database(config.server.data_dir)
    storage = RocksStorage(db, os.path.join(config.server.data_dir, "snapshots"))
    meta = SnapshotMetadata(LogIndex(2), Term(1), Membership(voters=frozenset({NodeId(1)})))
    storage.apply_snapshot(Snapshot(meta, data))
    # The crash: the marker is written, the families half replaced.
    db.write(
        {"meta": {snapshot.RESTORING_KEY: (2).to_bytes(8, "big")}, "messages": {b"junk": b"x"}}
    )
    with pytest.raises(StorageError, match="snapshot"):
        QueueState(db)

    assert finish_interrupted_restore(config, db) is True
    state = QueueState(db)
    assert state.applied_index == 2
    assert state.find_group("orders", "billing") is not None
    assert state.find_group("orders", "billing").pending == 1  # type: ignore[union-attr]
    assert db.get("messages", b"junk") is None
    assert finish_interrupted_restore(config, db) is False
    db.close()
