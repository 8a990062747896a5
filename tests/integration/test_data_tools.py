"""Growing a single node into a cluster, and backup and restore, on real processes
(issue 12): nothing acknowledged is lost on the way, and the wrong kind of data
directory is refused with the command that fixes it."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_process import BrokerProcess
from cluster_process import Cluster, ClusterNode, free_ports, ready_leader
from wire_client import WireClient

from futureq.wire import frames


def peer_auth_args(root: Path) -> list[str]:
    """The flags a node with peers needs to authenticate them: a cluster secret, where
    issue 7's peer authentication is in (``futureq.peer_credentials``), else none."""
    if importlib.util.find_spec("futureq.peer_credentials") is None:
        return []
    from futureq.peer_credentials import generate_secret_file  # type: ignore[import-not-found,unused-ignore]

    path = root / "cluster.secret"
    if not path.exists():
        generate_secret_file(str(path))
    return ["--cluster-secret-file", str(path)]


def futureq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "futureq.cli.server_main", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def publish(address: str, topic: str, count: int, batch: int = 50) -> set[int]:
    """Publish ``count`` messages due now; return their ids (all acknowledged)."""
    client = WireClient(address)
    ids: set[int] = set()
    for start in range(0, count, batch):
        items = [
            [topic, f"m{n}".encode(), 0, None, None]
            for n in range(start, min(count, start + batch))
        ]
        answer = client.publish(items)
        assert isinstance(answer, frames.PublishOk), answer
        ids.update(answer.first_id + i for i in range(answer.count))
    client.close()
    return ids


def consume(address: str, topic: str, want: int, timeout_s: float = 30.0) -> set[int]:
    """Consume (and ack) until ``want`` distinct ids were seen, or nothing more comes."""
    client = WireClient(address)
    client.subscribe(topic, "g", prefetch=1000)
    seen: set[int] = set()
    deadline = time.monotonic() + timeout_s
    quiet_until = None
    while time.monotonic() < deadline:
        try:
            batch = client.deliveries(1, timeout_s=0.5)
        except TimeoutError:
            if len(seen) >= want:
                break
            if quiet_until is not None and time.monotonic() > quiet_until:
                break
            continue
        quiet_until = time.monotonic() + 2.0
        seen.update(delivery[1] for delivery in batch)
        answer = client.request(frames.Ack(client.next_id(), [d[0] for d in batch]))
        assert isinstance(answer, frames.Ok), answer
        client.send(frames.Credit(0, 1, len(batch)))
    client.close()
    return seen


def wait_voters(address: str, voters: list[int], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        client = WireClient(address)
        view = client.request(frames.ClusterStatus(client.next_id())).status
        client.close()
        if sorted(view["voters"]) == voters and not view["learners"]:
            return
        assert time.monotonic() < deadline, view
        time.sleep(0.1)


@pytest.fixture
def nodes() -> Iterator[list[BrokerProcess]]:
    made: list[BrokerProcess] = []
    yield made
    for node in made:
        if node.process is not None and node.process.poll() is None:
            node.kill()


def test_a_single_node_grows_into_a_three_node_cluster_losing_nothing(
    tmp_path: Path, nodes: list[BrokerProcess]
) -> None:
    single = BrokerProcess(tmp_path / "node1")
    nodes.append(single)
    single.start()
    ids = publish(single.client_address, "grow", 300)
    assert single.terminate() == 0

    # Started as a cluster member as it is: refused with the command that fixes it.
    client_port, raft_port, http_port = free_ports(3)
    ports = ["--listen", f"127.0.0.1:{client_port}", "--http", f"127.0.0.1:{http_port}"]
    auth = peer_auth_args(tmp_path)
    peers = ["--peers", f"1=127.0.0.1:{raft_port}", "--raft-listen", f"127.0.0.1:{raft_port}"]
    peers += auth
    refused = futureq("start", "--data-dir", str(single.data_dir), *ports, *peers)
    assert refused.returncode == 2, refused.stderr
    assert "convert-to-cluster" in refused.stderr

    converted = futureq("convert-to-cluster", "--data-dir", str(single.data_dir), "--node-id", "1")
    assert converted.returncode == 0, converted.stderr
    assert "node 1 of a new cluster" in converted.stdout
    again = futureq("convert-to-cluster", "--data-dir", str(single.data_dir), "--node-id", "1")
    assert again.returncode == 2 and "already holds a cluster node's data" in again.stderr
    # Started alone again it would fork from the cluster it now seeds: refused.
    alone = futureq("start", "--data-dir", str(single.data_dir), *ports)
    assert alone.returncode == 2 and "fork" in alone.stderr

    first = ClusterNode(
        1, single.data_dir, (client_port, raft_port, http_port), [*peers[:2], *auth]
    )
    nodes.append(first)
    first.start()
    for node_id in (2, 3):
        joiner = ClusterNode(
            node_id, tmp_path / f"node{node_id}", tuple(free_ports(3)),  # type: ignore[arg-type]
            ["--join", first.client_address, *auth],
        )  # fmt: skip
        nodes.append(joiner)
        joiner.start()
    wait_voters(first.client_address, [1, 2, 3])
    later = publish(first.client_address, "grow", 50)

    # The joiners hold everything: with the original node gone, one of them serves it all.
    first.kill()
    survivors = [node for node in nodes[2:] if isinstance(node, ClusterNode)]
    leader = ready_leader(survivors)
    seen = consume(leader.client_address, "grow", len(ids) + len(later))
    assert ids | later <= seen, f"{len((ids | later) - seen)} acknowledged messages lost"


def test_backup_of_a_running_cluster_restores_as_a_new_cluster_or_a_single_node(
    tmp_path: Path, nodes: list[BrokerProcess]
) -> None:
    (tmp_path / "cluster").mkdir()
    cluster = Cluster(tmp_path / "cluster", 3)
    try:
        cluster.start()
        leader = cluster.leader()
        before = publish(leader.client_address, "backup", 200)
        follower = next(node for node in cluster.nodes.values() if node is not leader)
        # Wait until the follower applied what the leader did, then back it up live.
        target = leader.http_json("/api/status")["applied_index"]
        deadline = time.monotonic() + 10
        while follower.http_json("/api/status")["applied_index"] < target:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        backup = tmp_path / "cluster.fqbackup"
        # The cluster may still append its own bookkeeping (the member records, once
        # every node has answered), so the backup's index lies between what the
        # follower had applied before and after it.
        applied_before = follower.http_json("/api/status")["applied_index"]
        done = futureq("backup", "--data-dir", str(follower.data_dir), "--out", str(backup))
        assert done.returncode == 0, done.stderr
        applied_after = follower.http_json("/api/status")["applied_index"]
        found = re.search(r"at index (\d+)", done.stderr)
        assert found is not None, done.stderr
        assert target <= applied_before <= int(found.group(1)) <= applied_after, done.stderr
        after = publish(cluster.leader().client_address, "backup", 100)  # not in the backup
        assert follower.alive(), "the node kept running while backed up"
    finally:
        cluster.stop()

    # Restored as the first node of a new cluster.
    restored = tmp_path / "restored"
    done = futureq("restore", "--from", str(backup), "--data-dir", str(restored), "--node-id", "1")
    assert done.returncode == 0, done.stderr
    assert f"start it with --data-dir {restored} --node-id 1 --peers 1=<its raft" in done.stdout
    again = futureq("restore", "--from", str(backup), "--data-dir", str(restored), "--node-id", "1")
    assert again.returncode == 2 and "empty data directory" in again.stderr
    client_port, raft_port, http_port = free_ports(3)
    node = ClusterNode(
        1,
        restored,
        (client_port, raft_port, http_port),
        ["--peers", f"1=127.0.0.1:{raft_port}", *peer_auth_args(tmp_path)],
    )
    nodes.append(node)
    node.start()
    ready_leader([node])
    seen = consume(node.client_address, "backup", len(before))
    assert seen == before, "exactly the messages acknowledged before the backup"
    assert not seen & after
    node.terminate()

    # Restored as a single node.
    single_dir = tmp_path / "single"
    done = futureq("restore", "--from", str(backup), "--data-dir", str(single_dir), "--single-node")
    assert done.returncode == 0, done.stderr
    single = BrokerProcess(single_dir)
    nodes.append(single)
    single.start()
    assert consume(single.client_address, "backup", len(before)) == before

    # A damaged backup is refused before anything is written.
    damaged = bytearray(backup.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    (tmp_path / "damaged").write_bytes(bytes(damaged))
    done = futureq("restore", "--from", str(tmp_path / "damaged"), "--data-dir",
                   str(tmp_path / "never"), "--node-id", "1")  # fmt: skip
    assert done.returncode == 2 and "damaged" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"", "no header"),
        (b"\x93\xa3abc\x01\x80", "wrong header"),
        (b"\x93\xaefutureq-backup\x09\x80", "version 9"),
        (b"\x93\xaefutureq-backup\x01\x81\xa5index\x01garbage", "damaged"),
    ],
)
def test_a_file_that_is_not_a_good_backup_is_refused(raw: bytes, says: str) -> None:
    from futureq.data_tools import read_backup
    from futureq.errors import ConfigError

    with pytest.raises(ConfigError, match=says):
        read_backup(raw)


def test_restore_refuses_a_directory_holding_anything(
    tmp_path: Path, broker: BrokerProcess
) -> None:
    """Found by restoring into a directory holding only a junk file: the single-directory
    restore looked only for RocksDB data, so it exited 0 and laid the backup next to the
    file, though docs/operations.md says a non-empty directory is refused (exit 2) before
    anything is written."""
    publish(broker.client_address, "restore.junk", 5)
    broker.terminate()
    backup = tmp_path / "node.fqbackup"
    done = futureq("backup", "--data-dir", str(broker.data_dir), "--out", str(backup))
    assert done.returncode == 0, done.stderr
    target = tmp_path / "target"
    target.mkdir()
    (target / "notes.txt").write_text("not FutureQ's\n")
    done = futureq("restore", "--from", str(backup), "--data-dir", str(target), "--single-node")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is not empty" in done.stderr and "notes.txt" in done.stderr, done.stderr
    assert sorted(path.name for path in target.iterdir()) == ["notes.txt"], "nothing written"
