"""Disk faults against real ``futureq start`` processes (``docs/raft.md``, "Disk faults").

A node whose data directory was wiped, or replaced by an older copy of itself, comes
back with its old node id. It must not help elect a leader that lacks what it once
acknowledged: nothing acknowledged is lost, and the nodes converge. Also: a second
process for a node id that runs already is refused, and a node that missed its own
removal learns it from a member and shuts down.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from cluster_process import Cluster, ClusterNode, free_ports
from test_cluster import consume_all
from wire_client import WireClient

from futureq.wire import frames

# Small record interval: the leader records how far each member acknowledged often, so
# the restored node is told what its copy lacks (docs/raft.md, "Disk faults").
ENV = {"FUTUREQ_CLUSTER_MEMBER_RECORD_MS": "200"}


def publish(node: ClusterNode, topic: str, count: int, batch: int = 10) -> set[int]:
    """Publish ``count`` messages to the leader ``node``; return the acknowledged ids."""
    client = WireClient(node.client_address)
    ids: set[int] = set()
    number = 0
    while number < count:
        size = min(batch, count - number)
        answer = client.publish(
            [[topic, f"{number + i}".encode(), 0, None, None] for i in range(size)]
        )
        assert isinstance(answer, frames.PublishOk), answer
        ids.update(answer.first_id + i for i in range(answer.count))
        number += size
    client.close()
    return ids


def leader_among(cluster: Cluster, ids: set[int], timeout_s: float) -> ClusterNode | None:
    """The node among ``ids`` that says it leads within ``timeout_s``, or None."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for node_id in sorted(ids):
            node = cluster.nodes[node_id]
            if not node.alive():
                continue
            try:
                if node.http_json("/api/status").get("role") == "leader":
                    return node
            except OSError:
                pass
        time.sleep(0.1)
    return None


def wait_recovered(node: ClusterNode, timeout_s: float = 20.0) -> None:
    """Wait until ``node`` heard from every other voter after its start (it counts again)."""
    deadline = time.monotonic() + timeout_s
    while True:
        client = WireClient(node.client_address)
        view = client.request(frames.ClusterStatus(client.next_id())).status
        client.close()
        if view.get("recovering") is False:
            return
        assert time.monotonic() < deadline, f"node {node.node_id} is still recovering: {view}"
        time.sleep(0.05)


def wait_converged(cluster: Cluster, timeout_s: float = 30.0) -> tuple[int, int]:
    """Wait until every node reports the same applied index and state digest."""
    deadline = time.monotonic() + timeout_s
    seen: set[tuple[int, int]] = set()
    while time.monotonic() < deadline:
        seen = set()
        for node in cluster.nodes.values():
            try:
                status = node.http_json("/api/status")
            except OSError:
                seen.add((-1, -1))
                continue
            seen.add((status["applied_index"], status["applied_digest"]))
        if len(seen) == 1:
            return next(iter(seen))
        time.sleep(0.1)
    raise AssertionError(f"the nodes did not converge: (applied index, digest) {seen}")


def test_a_wiped_node_rejoining_with_its_old_id_loses_nothing(tmp_path: Path) -> None:
    """The issue's reproduction: a quorum L+F acknowledges; F is wiped and restarted,
    L dies and B (which missed everything) comes back. B and the blank F must not elect
    a leader between them; once L is back, everything acknowledged is delivered."""
    cluster = Cluster(tmp_path, 3, env=ENV)
    try:
        cluster.start()
        leader = cluster.leader()
        follower, behind = (n for n in cluster.nodes.values() if n is not leader)
        acked = publish(leader, "wipe", 50)
        behind.kill()
        acked |= publish(leader, "wipe", 200)
        follower.kill()
        shutil.rmtree(follower.data_dir)
        follower.start()  # same --node-id and --peers, empty data directory
        leader.kill()
        behind.start()
        # Standard Raft would elect B or the blank F here and lose the 200.
        assert leader_among(cluster, {follower.node_id, behind.node_id}, 4.0) is None
        leader.start()
        new_leader = cluster.leader(timeout_s=30)
        assert consume_all(new_leader, "wipe", "g", acked, timeout_s=60) >= acked
        wait_converged(cluster)
        log = follower.stderr_text()
        assert "new data directory" in log
        assert "it was wiped or replaced" in log, log[-3000:]
    finally:
        cluster.stop()


def test_a_node_restored_from_an_older_copy_loses_nothing(tmp_path: Path) -> None:
    """A follower's data directory is copied, the follower acknowledges more (in the
    quorum that commits it), then the old copy is put back and the node restarted. It is
    told what it acknowledged and must not help a node that lacks it become leader."""
    cluster = Cluster(tmp_path, 3, env=ENV)
    try:
        cluster.start()
        leader = cluster.leader()
        follower, behind = (n for n in cluster.nodes.values() if n is not leader)
        acked = publish(leader, "copy", 50)
        follower.kill()
        copy = tmp_path / "old-copy"
        shutil.copytree(follower.data_dir, copy)
        follower.start()
        wait_recovered(follower)
        behind.kill()  # from here on the quorum is the leader and the follower
        acked |= publish(leader, "copy", 300)
        time.sleep(1.0)  # the leader records the follower's acknowledgement (200 ms)
        follower.kill()
        shutil.rmtree(follower.data_dir)
        shutil.copytree(copy, follower.data_dir)
        follower.start()
        leader.kill()
        behind.start()
        assert leader_among(cluster, {follower.node_id, behind.node_id}, 4.0) is None
        leader.start()
        new_leader = cluster.leader(timeout_s=30)
        assert consume_all(new_leader, "copy", "g", acked, timeout_s=60) >= acked
        wait_converged(cluster)
        log = follower.stderr_text()
        assert "it is an older copy of itself" in log, log[-3000:]
    finally:
        cluster.stop()


def test_a_directory_of_another_cluster_with_the_same_id_is_refused(tmp_path: Path) -> None:
    """Two clusters with the default cluster id and the same secret: node N of the second
    is restarted on node N's directory of the first, whose log has higher terms. It only
    warned "it was wiped or replaced", finished recovery, won an election, and every node
    of the second cluster then held the first one's data: its acknowledged messages were
    gone (breaker runs, 2 of 2). It now stops (exit 2) before it takes part, saying why,
    and the cluster loses nothing."""
    cluster = Cluster(tmp_path, 3, env=ENV)
    theirs = tmp_path / "first-cluster"
    try:
        cluster.start()
        publish(cluster.leader(), "theirs", 20)
        for _ in range(2):  # raise the first cluster's terms above the second one's
            leader = cluster.leader()
            leader.terminate()
            cluster.leader(timeout_s=30, exclude={leader.node_id})
            leader.start()
        cluster.stop()
        for node in cluster.nodes.values():
            shutil.move(node.data_dir, theirs / node.data_dir.name)
        cluster.start()  # a second cluster: fresh directories, same ids, ports and secret
        leader = cluster.leader(timeout_s=30)
        acked = publish(leader, "ours", 30)
        victim = next(n for n in cluster.nodes.values() if n is not leader)
        time.sleep(1.0)  # the leader records every member's incarnation (200 ms)
        victim.terminate()
        shutil.rmtree(victim.data_dir)
        shutil.copytree(theirs / victim.data_dir.name, victim.data_dir)
        victim.start()
        assert victim.process is not None
        assert victim.process.wait(30) == 2, victim.stderr_text()[-3000:]
        log = victim.stderr_text()
        assert "data directory is refused" in log, log[-3000:]
        assert "another Raft group's data directory" in log, log[-3000:]
        leader = cluster.leader(timeout_s=30)
        assert consume_all(leader, "ours", "g", acked, timeout_s=60) >= acked
    finally:
        cluster.stop()


def _start_process(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "futureq.cli.server_main", "start", "--shards", "1", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_second_process_for_a_running_node_id_is_refused(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 3)
    try:
        cluster.start()
        cluster.leader()
        peers = ",".join(f"{n}=127.0.0.1:{cluster.ports[n][1]}" for n in cluster.ports)
        client_port, raft_port, http_port = free_ports(3)
        ports = [
            "--listen", f"127.0.0.1:{client_port}", "--http", f"127.0.0.1:{http_port}",
            "--raft-listen", f"127.0.0.1:{raft_port}",
        ]  # fmt: skip
        # Another data directory (another machine, a copied command line).
        other = _start_process(
            ["--node-id", "2", "--data-dir", str(tmp_path / "other"), "--peers", peers, *ports,
             *cluster.auth_args]
        )  # fmt: skip
        assert other.returncode == 2, other.stderr[-2000:]
        assert "another process runs node 2" in other.stderr
        # The same data directory.
        same = _start_process(
            ["--node-id", "2", "--data-dir", str(cluster.nodes[2].data_dir), "--peers", peers,
             *ports, *cluster.auth_args]
        )  # fmt: skip
        assert same.returncode == 2, same.stderr[-2000:]
        assert "another process is using this data directory" in same.stderr
        assert cluster.nodes[2].alive()
    finally:
        cluster.stop()


def test_a_second_process_with_its_own_peers_list_does_not_move_the_nodes_address(
    tmp_path: Path,
) -> None:
    """A second process started as node 2 with a ``--peers`` of its own (naming itself
    elsewhere, so the check at start dials nobody) announced its client address in its
    handshakes, and every node then named it for node 2, for good: after it stopped,
    clients sent to node 2 were sent to a dead address (breaker runs, 2 of 2)."""
    cluster = Cluster(tmp_path, 3)
    twin: subprocess.Popen[str] | None = None
    try:
        cluster.start()
        leader = cluster.leader()
        real = cluster.nodes[2].client_address
        client_port, raft_port, http_port = free_ports(3)
        peers = ",".join(
            f"{n}=127.0.0.1:{raft_port if n == 2 else cluster.ports[n][1]}" for n in cluster.ports
        )
        twin = subprocess.Popen(
            [sys.executable, "-m", "futureq.cli.server_main", "start", "--shards", "1",
             "--node-id", "2", "--data-dir", str(tmp_path / "twin"), "--peers", peers,
             "--listen", f"127.0.0.1:{client_port}", "--http", f"127.0.0.1:{http_port}",
             "--raft-listen", f"127.0.0.1:{raft_port}", *cluster.auth_args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        time.sleep(6)  # it connects to nodes 1 and 3 and announces itself

        def node_2_address() -> str | None:
            client = WireClient(leader.client_address)
            view = client.request(frames.ClusterStatus(client.next_id())).status
            client.close()
            return next(n for n in view["nodes"] if n["node_id"] == 2).get("client_address")

        assert node_2_address() == real
        twin.terminate()
        twin.wait(30)
        twin = None
        assert node_2_address() == real
        for node in cluster.nodes.values():
            log = node.stderr_text()
            # Its handshakes are refused outright now (another incarnation of node 2 is
            # connected: test_twin_node.py), before their addresses could be used.
            if node.node_id != 2 and "two processes run as node 2" in log:
                break
        else:
            raise AssertionError("no node logged the twin's refused handshake")
    finally:
        if twin is not None:
            twin.kill()
            twin.wait(30)
        cluster.stop()


def test_a_node_that_missed_its_removal_learns_it_and_shuts_down(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 3)
    try:
        cluster.start()
        leader = cluster.leader()
        victim = next(n for n in cluster.nodes.values() if n is not leader)
        victim.kill()
        admin = WireClient(leader.client_address)
        answer = admin.request(frames.ClusterRemoveNode(admin.next_id(), victim.node_id))
        assert isinstance(answer, frames.Ok), answer
        publish(leader, "after-removal", 5)
        victim.start()  # its log still says it is a voter
        assert victim.process is not None
        assert victim.process.wait(20) == 0
        log = victim.stderr_text()
        assert f"node {victim.node_id} was removed from the cluster at log index" in log
        view = WireClient(leader.client_address).request(frames.ClusterStatus(1)).status
        assert victim.node_id not in view["voters"] and len(view["voters"]) == 2
    finally:
        cluster.stop()


def _futureq(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "futureq.cli.server_main", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_a_backup_restored_into_a_members_directory_is_refused(tmp_path: Path) -> None:
    """The operator replaced node N's disk, restored last night's backup into the new one
    (``futureq restore --node-id N``) and started node N as before, with the cluster's
    ``--peers`` (or ``--join``). A restored directory is the one voter of a new cluster:
    the node followed the leader (its snapshot matched the leader's log) but still
    counted itself the only voter, and when the leader was killed it elected itself
    alone and acknowledged a publish no other node had, while the other two could no
    longer elect anyone (breaker run). It now refuses to start (exit 2), naming the fix,
    and started blank instead it catches up and loses nothing."""
    cluster = Cluster(tmp_path, 3, env=ENV)
    backup = tmp_path / "nightly.backup"
    try:
        cluster.start()
        leader = cluster.leader()
        acked = publish(leader, "restored", 20)
        victim = next(n for n in cluster.nodes.values() if n is not leader)
        wait_converged(cluster)
        made = _futureq("backup", "--data-dir", str(victim.data_dir), "--out", str(backup))
        assert made.returncode == 0, made.stderr
        acked |= publish(leader, "restored", 20)
        victim.kill()
        shutil.rmtree(victim.data_dir)
        done = _futureq(
            "restore", "--from", str(backup), "--data-dir", str(victim.data_dir),
            "--node-id", str(victim.node_id),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        start = ["start", "--shards", "1", "--data-dir", str(victim.data_dir)]
        as_before = [*start, *victim._port_args, *victim.extra_args]
        joining = [
            *start, *victim._port_args, "--node-id", str(victim.node_id),
            "--join", leader.client_address, *cluster.auth_args,
        ]  # fmt: skip
        for args in (as_before, joining):
            try:
                refused = _futureq(*args, timeout_s=30)
            except subprocess.TimeoutExpired as ran:
                raise AssertionError(f"the restored node started: {args}") from ran
            assert refused.returncode == 2, refused.stderr[-3000:]
            assert "restored or converted" in refused.stderr, refused.stderr[-3000:]
            assert "start it with an empty data directory" in refused.stderr
        shutil.rmtree(victim.data_dir)  # what the sentence says
        victim.start()
        wait_recovered(victim)
        wait_converged(cluster)
        leader.kill()
        leader = cluster.leader(timeout_s=30, exclude={leader.node_id})
        assert consume_all(leader, "restored", "g", acked, timeout_s=60) >= acked
    finally:
        cluster.stop()
