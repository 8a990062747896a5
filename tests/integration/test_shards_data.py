"""``backup``, ``restore`` and ``convert-to-cluster`` on a sharded node's data directory
as a whole (issue 15): real ``futureq`` processes, real RocksDB in tmp dirs.

A node of 2 shards keeps ``DATA_DIR/SHARDS`` and ``DATA_DIR/shard-K``; the commands find
the layout from the stamp, work on every shard, and refuse a backup whose shard count
is not the node's with a sentence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from cluster_process import free_runs
from test_data_tools import futureq
from test_shards import STRIDE, TOPICS, ShardedNode

from futureq.client import open_client
from futureq.shards.slots import even_map

COUNTS = {topic: 1 + index % 3 for index, topic in enumerate(TOPICS)}
"""Messages published to each topic (1 to 3), so a shard's part cannot stand in for another's."""


def fill(node: ShardedNode) -> None:
    async def main() -> None:
        async with open_client(node.client_address) as client:
            for topic, count in COUNTS.items():
                await client.create_group(topic, "g")
                for n in range(count):
                    await client.publish(topic, f"{topic}/{n}".encode())

    trio.run(main)


def pending(node: ShardedNode) -> dict[str, int]:
    """Pending messages of group ``g`` of every topic, from the node's merged status."""

    async def main() -> dict[str, Any]:
        async with open_client(node.client_address, request_timeout_s=60) as client:
            return await client.status()

    status = trio.run(main)
    return {
        entry["topic"]: sum(g["pending"] for g in entry["groups"] if g["group"] == "g")
        for entry in status["topics"]
    }


def test_backup_of_a_running_sharded_node_restores_every_shard(tmp_path: Path) -> None:
    node = ShardedNode(tmp_path / "data")
    node.start()
    try:
        fill(node)
        backup = tmp_path / "node.backup"
        done = futureq("backup", "--data-dir", str(node.data_dir), "--out", str(backup))
        assert done.returncode == 0, done.stderr
        assert "2 shards: shard 0 at index" in done.stderr and "shard 1 at index" in done.stderr
        # One shard's directory alone is still backed up as before (one part).
        one = tmp_path / "shard-1.backup"
        done = futureq("backup", "--data-dir", str(node.data_dir / "shard-1"), "--out", str(one))
        assert done.returncode == 0, done.stderr
    finally:
        node.terminate()

    restored = tmp_path / "restored"
    # Mismatched shard counts are refused with a sentence, and nothing is written.
    for flags, says in (
        (["--shards", "1"], "is the backup of a node of 2 shards; restore it with --shards 2"),
        (["--shards", "3"], "restore it with --shards 2 (node.shards), not 3"),
    ):
        done = futureq(
            "restore", "--data-dir", str(restored), "--from", str(backup), "--single-node", *flags
        )
        assert done.returncode == 2, done.stdout
        assert says in done.stderr, done.stderr
        assert not restored.exists()
    done = futureq(
        "restore", "--data-dir", str(restored), "--from", str(one), "--single-node",
        "--shards", "2",
    )  # fmt: skip
    assert done.returncode == 2 and "restore it without --shards" in done.stderr, done.stderr

    cut = tmp_path / "cut.backup"
    cut.write_bytes(backup.read_bytes()[:-10])
    done = futureq(
        "restore", "--data-dir", str(restored), "--from", str(cut), "--single-node",
        "--shards", "2",
    )  # fmt: skip
    assert done.returncode == 2 and "shard 1's part is cut short" in done.stderr, done.stderr
    assert not restored.exists()

    done = futureq(  # no --shards: the default (auto) takes the backup's count
        "restore", "--data-dir", str(restored), "--from", str(backup), "--single-node"
    )
    assert done.returncode == 0, done.stderr
    assert "restored the backup of 2 shards" in done.stdout
    assert f"as a single node; start it with --data-dir {restored} --shards 2" in done.stdout
    assert (restored / "SHARDS").read_text().strip() == "2"
    assert not (restored / "SHARDS.first-start").exists(), "restored data is no failed start"
    # Restoring again over it is refused (not empty).
    again = futureq(
        "restore", "--data-dir", str(restored), "--from", str(backup), "--single-node",
        "--shards", "2",
    )  # fmt: skip
    assert again.returncode == 2 and "restore into an empty data directory" in again.stderr

    back = ShardedNode(restored)
    back.start()
    try:
        assert pending(back) == COUNTS
        slot_map = even_map(back.shard_addresses)
        assert {slot_map.shard_of(t) for t in TOPICS} == {0, 1}
    finally:
        back.terminate()


def test_convert_to_cluster_converts_every_shard(tmp_path: Path) -> None:
    from futureq.peer_credentials import generate_secret_file

    node = ShardedNode(tmp_path / "data")
    node.start()
    try:
        fill(node)
    finally:
        node.terminate()
    done = futureq("convert-to-cluster", "--data-dir", str(node.data_dir), "--node-id", "1")
    assert done.returncode == 0, done.stderr
    assert "shard 0 up to index" in done.stdout and "shard 1 up to index" in done.stdout
    assert "--shards 2" in done.stdout
    again = futureq("convert-to-cluster", "--data-dir", str(node.data_dir), "--node-id", "1")
    assert again.returncode == 2 and "nothing to convert" in again.stderr, again.stderr

    secret = tmp_path / "cluster.secret"
    generate_secret_file(str(secret))
    raft = f"127.0.0.1:{free_runs(1, 2)[0]}"
    assert STRIDE == 1
    cluster = ShardedNode(
        node.data_dir,
        extra=[
            "--node-id", "1", "--peers", f"1={raft}", "--raft-listen", raft,
            "--cluster-secret-file", str(secret),
        ],
    )  # fmt: skip
    cluster.start()
    try:
        assert pending(cluster) == COUNTS
    finally:
        cluster.terminate()


def test_shards_auto_takes_the_cores_once_and_keeps_the_recorded_count(tmp_path: Path) -> None:
    """``--shards auto`` on a new directory runs one shard per usable core and records
    it; later starts with ``auto`` keep the recorded count; an explicit other count is
    refused with a sentence; restore with ``auto`` takes the backup's count."""
    from futureq.shards.layout import usable_cores

    cores = usable_cores()
    if cores < 2:
        pytest.skip("one usable core: auto is the node without shards")
    cores = min(cores, 4)  # ports: ShardedNode reserves runs of `shards` ports
    data = tmp_path / "data"
    node = ShardedNode(data, shards=cores)
    node.extra_args[node.extra_args.index("--shards") + 1] = "auto"
    if cores != usable_cores():
        pytest.skip("more cores than this test reserves ports for")
    node.start()
    try:
        assert (data / "SHARDS").read_text().strip() == str(cores)
        assert sorted(p.name for p in data.glob("shard-*")) == [f"shard-{k}" for k in range(cores)]
        assert f"node.shards = auto: {cores} shard(s)" in node.stderr_text()
        fill(node)
    finally:
        node.terminate()
    node.start()  # auto again: the recorded count
    try:
        assert pending(node) == COUNTS
    finally:
        node.terminate()
    done = futureq("start", "--data-dir", str(data), "--shards", str(cores + 1))
    assert done.returncode == 2
    assert f"was created with {cores} shards; start it with --shards {cores}" in done.stderr
