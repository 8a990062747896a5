"""A sharded node's data directory misused: each way is refused, not served empty.

Found by a tester (``/tmp/shardbreak``): a ``shard-K`` directory replaced by a new
volume (only ``lost+found``) started that shard empty without a word; ``--data-dir
DATA_DIR/shard-1`` started as a node of its own acknowledged publishes that were
stranded once the node ran again; a deleted ``SHARDS`` file made ``auto`` create a new,
empty store beside the shards. A second tester (``/tmp/brk2/shards1.sh``): ``SHARDS``
edited to 1 did the same, and edited to 3 advised ``shard-2.start-empty``, which was
then refused as another node's copy. Real ``futureq start``
processes, real RocksDB in tmp dirs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from broker_process import BrokerProcess
from test_shard_dirs import filled_and_stopped, refused
from test_shards import TOPICS
from test_shards_data import COUNTS, pending

from futureq.shards.slots import even_map


def test_a_shard_directory_holding_no_rocksdb_is_refused_as_a_missing_one(
    tmp_path: Path,
) -> None:
    node = filled_and_stopped(tmp_path)
    data = tmp_path / "data"
    (data / "shard-1").rename(tmp_path / "moved-away")
    (data / "shard-1" / "lost+found").mkdir(parents=True)  # a new volume mounted there
    log = refused(node)
    shard1 = data / "shard-1"
    assert f"{shard1} is there but holds no RocksDB (only 'lost+found')" in log, log[-3000:]
    assert "shard 1's acknowledged messages are gone unless that directory is restored" in log
    marker = data / "shard-1.start-empty"
    assert f"create the file {marker} and start again" in log
    assert sorted(os.listdir(shard1)) == ["lost+found"]  # the refusal created nothing
    # Stray files other than a RocksDB's prove nothing either.
    (shard1 / "notes.txt").write_text("x")
    assert "holds no RocksDB (only 'lost+found', 'notes.txt')" in refused(node)
    # The override works as for a missing directory: once.
    marker.touch()
    node.start()
    try:
        slot_map = even_map(node.shard_addresses)
        kept = {t: n for t, n in COUNTS.items() if slot_map.shard_of(t) == 0}
        assert pending(node) == kept
        assert len(kept) < len(TOPICS)
        assert not marker.exists()
        assert "shard 1 starts empty, as asked" in node.stderr_text()
    finally:
        assert node.terminate() == 0
    assert node.process is not None
    node.start()  # stamped now: a RocksDB of its own, started without the marker
    node.terminate()


def _alone(directory: Path, client: str, http: str, shards: str | None) -> BrokerProcess:
    alone = BrokerProcess(directory, shards=shards)
    alone._port_args = ["--listen", client, "--http", http]
    return alone


@pytest.mark.parametrize("shards", [None, "1", "2"])
def test_a_shard_directory_started_as_a_node_is_refused(tmp_path: Path, shards: str | None) -> None:
    node = filled_and_stopped(tmp_path)
    data = tmp_path / "data"
    before = {name: os.listdir(data / name) for name in ("shard-0", "shard-1")}
    alone = _alone(data / "shard-1", node.client_address, node.http_address, shards)
    log = refused(alone)  # type: ignore[arg-type]
    assert f"{data / 'shard-1'} is shard 1's directory of a node of 2 shards" in log, log[-3000:]
    assert f"start the node's data directory instead: futureq start --data-dir {data}" in log
    assert "READY" not in log
    assert not (data / "shard-1" / "SHARDS").exists()
    assert sorted(os.listdir(data / "shard-0")) == sorted(before["shard-0"])
    # A copy elsewhere is refused too, by its stamp.
    copy = tmp_path / "copy"
    shutil.copytree(data / "shard-1", copy)
    log = refused(_alone(copy, node.client_address, node.http_address, shards))  # type: ignore[arg-type]
    assert f"{copy} is shard 1's directory of a node of 2 shards" in log, log[-3000:]
    node.start()
    try:
        assert pending(node) == COUNTS
    finally:
        node.terminate()


def test_shard_directories_without_the_shards_file_are_refused(tmp_path: Path) -> None:
    node = filled_and_stopped(tmp_path)
    data = tmp_path / "data"
    (data / "SHARDS").unlink()
    entries = sorted(os.listdir(data))
    for shards in (None, "1", "2", "3"):
        log = refused(_alone(data, node.client_address, node.http_address, shards))  # type: ignore[arg-type]
        assert f"{data / 'SHARDS'} is missing, but {data} holds shard directories" in log, log
        assert "their stamps say the node has 2 shards" in log
        assert f"echo 2 > {data / 'SHARDS'}" in log
        assert "holds the data of a node with 1 shard" not in log
        assert sorted(os.listdir(data)) == entries  # no store created beside the shards
    (data / "SHARDS").write_text("2\n")
    node.start()
    try:
        assert pending(node) == COUNTS
    finally:
        node.terminate()


@pytest.mark.parametrize("shards", [None, "1", "2"])
def test_a_shards_file_edited_to_one_is_refused_and_creates_no_store(
    tmp_path: Path, shards: str | None
) -> None:
    node = filled_and_stopped(tmp_path)
    data = tmp_path / "data"
    (data / "SHARDS").write_text("1\n")
    entries = sorted(os.listdir(data))
    log = refused(_alone(data, node.client_address, node.http_address, shards))  # type: ignore[arg-type]
    assert f"{data / 'SHARDS'} says the node has 1 shard, but the stamps of its shard " in log, log[
        -3000:
    ]
    assert "directories (shard-0, shard-1) say it has 2 shards" in log
    assert f"restore it to that count (echo 2 > {data / 'SHARDS'})" in log
    assert "READY" not in log
    assert "was created with" not in log  # not "start it with --shards 1"
    assert sorted(os.listdir(data)) == entries  # no RocksDB created beside the shards
    assert not (data / "CURRENT").exists()
    (data / "SHARDS").write_text("2\n")
    node.start()
    try:
        assert pending(node) == COUNTS
    finally:
        node.terminate()


def test_a_shards_file_edited_to_more_is_refused_before_any_start_empty_advice(
    tmp_path: Path,
) -> None:
    node = filled_and_stopped(tmp_path)
    data = tmp_path / "data"
    (data / "SHARDS").write_text("3\n")
    entries = sorted(os.listdir(data))
    for shards in (None, "3", "2"):
        log = refused(_alone(data, node.client_address, node.http_address, shards))  # type: ignore[arg-type]
        assert f"{data / 'SHARDS'} says the node has 3 shards, but the stamps of its " in log, log[
            -3000:
        ]
        assert "(shard-0, shard-1) say it has 2 shards" in log
        assert f"echo 2 > {data / 'SHARDS'}" in log
        assert "start-empty" not in log
        assert "copied or moved here" not in log
        assert sorted(os.listdir(data)) == entries  # no shard-2 created
    # Even with the advice the old code gave followed, nothing is created.
    (data / "shard-2.start-empty").touch()
    log = refused(_alone(data, node.client_address, node.http_address, None))  # type: ignore[arg-type]
    assert "say it has 2 shards" in log, log[-3000:]
    assert not (data / "shard-2").exists()
    (data / "shard-2.start-empty").unlink()
    (data / "SHARDS").write_text("2\n")
    node.start()
    try:
        assert pending(node) == COUNTS
    finally:
        node.terminate()
