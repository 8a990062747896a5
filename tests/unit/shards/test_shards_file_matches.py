"""``DATA_DIR/SHARDS`` must agree with the data beside it (``check_shard_count``).

Found by a tester (``/tmp/brk2/shards1.sh``): ``SHARDS`` edited to 1 on a node of 2
shards started a new, empty single node whose RocksDB was created beside the shards;
edited to 3, the node advised starting a third shard empty. Real RocksDB in tmp dirs;
the processes are in ``tests/integration/test_shards_dir_misuse.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgpack
import pytest

from futureq.config import Config
from futureq.config_loader import load_config
from futureq.errors import ConfigError
from futureq.shards.layout import check_shard_count
from futureq.shards.stamp import SHARD_KEY
from futureq.storage.db import STATE_FAMILY, Database


def _config(data_dir: Path, shards: int) -> Config:
    return load_config(
        None,
        env={},
        overrides={
            "server": {"data_dir": str(data_dir), "listen": "127.0.0.1:17450"},
            "node": {"shards": shards},
        },
    )


def _rocksdb(path: Path, stamp: tuple[int, int] | None) -> None:
    """A real RocksDB at ``path``, stamped ``[index, count]`` unless None."""
    db = Database(str(path), write_buffer_mb=1, block_cache_mb=1)
    try:
        changes = {b"other": b"x"}
        if stamp is not None:
            changes[SHARD_KEY] = msgpack.packb(list(stamp))
        db.write({STATE_FAMILY: dict(changes)}, sync=True)
    finally:
        db.close()


def _node(data: Path, count: int, shards: int) -> None:
    data.mkdir()
    for k in range(count):
        _rocksdb(data / f"shard-{k}", (k, count))
    (data / "SHARDS").write_text(f"{shards}\n")


def _refused(data: Path, wanted: int, match: str) -> str:
    entries = sorted(os.listdir(data))
    with pytest.raises(ConfigError, match=match) as refused:
        check_shard_count(_config(data, wanted))
    assert sorted(os.listdir(data)) == entries
    return str(refused.value)


@pytest.mark.parametrize("wanted", [1, 2])
def test_shards_edited_to_one_names_both_counts_and_the_fix(tmp_path: Path, wanted: int) -> None:
    data = tmp_path / "data"
    _node(data, 2, 1)
    said = _refused(data, wanted, "says the node has 1 shard, but the stamps")
    assert "(shard-0, shard-1) say it has 2 shards" in said
    assert f"echo 2 > {data / 'SHARDS'}" in said


@pytest.mark.parametrize("wanted", [2, 3])
def test_shards_edited_to_more_names_both_counts(tmp_path: Path, wanted: int) -> None:
    data = tmp_path / "data"
    _node(data, 2, 3)
    said = _refused(data, wanted, "says the node has 3 shards, but the stamps")
    assert f"echo 2 > {data / 'SHARDS'}" in said
    assert not (data / "shard-2").exists()


def test_stamps_that_disagree_among_themselves_are_listed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _node(data, 2, 4)
    _rocksdb(data / "shard-2", (2, 3))
    said = _refused(data, 4, "disagree on the count")
    assert "shard-0, shard-1: 2 shards; shard-2: 3 shards" in said


def test_shards_edited_on_a_single_nodes_data_says_to_write_one(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _rocksdb(data, None)
    (data / "SHARDS").write_text("2\n")
    said = _refused(data, 2, "holds a RocksDB of its own and no shard-K directory")
    assert f"echo 1 > {data / 'SHARDS'}" in said


def test_a_store_beside_the_shards_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _node(data, 2, 2)
    _rocksdb(data, None)  # what the old code created while SHARDS said 1
    _refused(data, 2, "and so do its shard directories, but .* also holds a RocksDB")


def test_an_unstamped_shard_directory_beyond_the_count_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _node(data, 2, 2)
    _rocksdb(data / "shard-2", None)
    _refused(data, 2, r"beyond that count \(shard-2; a node of 2 shards has shard-0 to shard-1\)")
    (data / "SHARDS").write_text("1\n")
    (data / "shard-2").rename(data / "old")
    _rocksdb(data / "shard-0-not-a-shard", None)
    (data / "one").mkdir()
    # SHARDS of 1 with stamped shard directories: the stamps' count is named.
    _refused(data, 1, "say it has 2 shards")


def test_the_legitimate_layouts_pass(tmp_path: Path) -> None:
    # Every shard's data, as the node left it.
    data = tmp_path / "a"
    _node(data, 2, 2)
    check_shard_count(_config(data, 2))
    # Empty shard directories made ahead (mount points), some holding only lost+found.
    data = tmp_path / "b"
    data.mkdir()
    (data / "SHARDS").write_text("3\n")
    for k in range(4):
        (data / f"shard-{k}").mkdir()
    (data / "shard-1" / "lost+found").mkdir()
    check_shard_count(_config(data, 3))
    # A lost or wiped shard (start-empty override, or a cluster node recovering it).
    data = tmp_path / "c"
    _node(data, 3, 3)
    for k in (1, 2):
        os.rename(data / f"shard-{k}", tmp_path / f"gone-{k}")
    (data / "shard-2").mkdir()
    (data / "shard-1.start-empty").touch()
    check_shard_count(_config(data, 3))
    # A single node's data, with or without a SHARDS of 1.
    data = tmp_path / "d"
    _rocksdb(data, None)
    check_shard_count(_config(data, 1))
    (data / "SHARDS").write_text("1\n")
    check_shard_count(_config(data, 1))
    # Shards made by a build from before the stamp.
    data = tmp_path / "e"
    data.mkdir()
    (data / "SHARDS").write_text("2\n")
    _rocksdb(data / "shard-0", None)
    _rocksdb(data / "shard-1", None)
    check_shard_count(_config(data, 2))
