"""Each shard directory knows which shard it is; a lost one is not started empty silently.

Found by an operator's tests (issue 15): a node of 2 shards whose ``shard-0`` and
``shard-1`` were swapped started without a word and never delivered its acknowledged
messages (each shard held the other's topics); with ``shard-1`` missing it started
that shard empty and lost its messages; in a cluster the swapped replicas of node 3
were sometimes taken and stayed diverged, else refused as "another cluster's data
directory". Real ``futureq start --shards 2`` processes, real RocksDB in tmp dirs.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from test_shards import TOPICS, ShardedNode, _sharded_cluster
from test_shards_data import COUNTS, fill, pending

from futureq.shards.slots import even_map


def refused(node: ShardedNode) -> str:
    """Start ``node``, which must stop with exit 2 before READY; its log."""
    try:
        node.start()
    except RuntimeError:
        pass
    else:  # never leave a node that started behind (the code before this fix did)
        node.terminate()
        pytest.fail(f"the node started:\n{node.stderr_text()[-3000:]}")
    assert node.process is not None
    assert node.process.wait(30) == 2, node.stderr_text()[-3000:]
    return node.stderr_text()


def filled_and_stopped(tmp_path: Path) -> ShardedNode:
    """A 2-shard single node in ``tmp_path / "data"`` that stored :func:`fill`'s
    messages, stopped gracefully."""
    node = ShardedNode(tmp_path / "data")
    node.start()
    try:
        fill(node)
    finally:
        assert node.terminate() == 0
    return node


def test_swapped_shard_directories_are_refused_and_work_once_put_back(tmp_path: Path) -> None:
    node = filled_and_stopped(tmp_path)
    data = tmp_path / "data"
    (data / "shard-0").rename(data / "swap")
    (data / "shard-1").rename(data / "shard-0")
    (data / "swap").rename(data / "shard-1")
    log = refused(node)
    assert f"{data / 'shard-0'} holds the data of shard 1, not shard 0" in log, log[-3000:]
    assert "were moved or swapped; stop the node and put each back where it was" in log
    assert f"(this one is {data / 'shard-1'})" in log
    assert "READY" not in log
    (data / "shard-0").rename(data / "swap")
    (data / "shard-1").rename(data / "shard-0")
    (data / "swap").rename(data / "shard-1")
    node.start()
    try:
        assert pending(node) == COUNTS  # every acknowledged message, once
    finally:
        node.terminate()


def test_a_missing_shard_directory_of_a_single_node_is_refused(tmp_path: Path) -> None:
    node = filled_and_stopped(tmp_path)
    data = tmp_path / "data"
    (data / "shard-1").rename(tmp_path / "moved-away")
    log = refused(node)
    assert f"{data / 'shard-1'} is missing, but this node's shards held data" in log, log[-3000:]
    assert "shard 1's acknowledged messages are gone unless that directory is restored" in log
    marker = data / "shard-1.start-empty"
    assert f"create the file {marker} and start again" in log
    assert not (data / "shard-1").exists()  # the refusal created nothing
    (data / "shard-1").mkdir()  # an empty directory is no better
    log = refused(node)
    assert f"{data / 'shard-1'} is empty, but this node's shards held data" in log
    # Put back, it serves everything; asked to, it starts empty (once).
    (data / "shard-1").rmdir()
    (tmp_path / "moved-away").rename(data / "shard-1")
    node.start()
    try:
        assert pending(node) == COUNTS
    finally:
        node.terminate()
    shutil.rmtree(data / "shard-1")
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
        node.terminate()


@pytest.mark.slow
def test_swapped_shard_directories_of_a_cluster_node_are_refused(tmp_path: Path) -> None:
    """Before, node 3 restarted on swapped directories was taken 1 time in 6 (its
    replicas stayed diverged) and else refused as another cluster's directory."""
    nodes, _ = _sharded_cluster(tmp_path)
    try:
        for node in nodes.values():
            node.start()
        fill(nodes[1])
        assert nodes[3].terminate() == 0
        data = tmp_path / "node3"
        (data / "shard-0").rename(data / "swap")
        (data / "shard-1").rename(data / "shard-0")
        (data / "swap").rename(data / "shard-1")
        log = refused(nodes[3])
        assert f"{data / 'shard-0'} holds the data of shard 1, not shard 0" in log or (
            f"{data / 'shard-1'} holds the data of shard 0, not shard 1" in log
        ), log[-3000:]
        assert "another cluster" not in log
        (data / "shard-0").rename(data / "swap")
        (data / "shard-1").rename(data / "shard-0")
        (data / "swap").rename(data / "shard-1")
        nodes[3].start()
        deadline = time.monotonic() + 60
        while pending(nodes[3]) != COUNTS:  # node 3's own replicas, once caught up
            assert time.monotonic() < deadline, pending(nodes[3])
            time.sleep(0.5)
        # A cluster node's lost shard directory is a wiped disk: recovered from its group.
        assert nodes[3].terminate() == 0
        shutil.rmtree(data / "shard-1")
        nodes[3].start()
        log = nodes[3].stderr_text()
        assert f"{data / 'shard-1'} is missing, though this node's shards held data" in log
        assert "recovers its data from the other members of its Raft group" in log
        deadline = time.monotonic() + 60
        while pending(nodes[3]) != COUNTS:
            assert time.monotonic() < deadline, pending(nodes[3])
            time.sleep(0.5)
    finally:
        for node in nodes.values():
            if node.alive():
                node.terminate()
