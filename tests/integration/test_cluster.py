"""Real 3- and 5-node clusters of ``futureq start`` processes on 127.0.0.1: redirects,
leader failure under a publish stream, snapshot catch-up, membership changes while
publishing, graceful leadership hand-over."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from cluster_process import Cluster, ClusterNode, free_ports
from wire_client import WireClient

from futureq.errors import ErrorCode
from futureq.wire import codec, frames


class Producer(threading.Thread):
    """Publishes batches to whichever node leads, recording every acknowledged id."""

    def __init__(self, cluster: Cluster, topic: str, batch: int = 20) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.topic = topic
        self.batch = batch
        self.acked: list[int] = []
        self.stop_event = threading.Event()
        self.errors = 0

    def run(self) -> None:
        client: WireClient | None = None
        number = 0
        while not self.stop_event.is_set():
            try:
                if client is None:
                    client = WireClient(self.cluster.leader(timeout_s=10).client_address)
                number += 1
                answer = client.publish(
                    [
                        [self.topic, f"{number}:{i}".encode(), 0, None, None]
                        for i in range(self.batch)
                    ]
                )
                if isinstance(answer, frames.PublishOk):
                    self.acked.extend(answer.first_id + i for i in range(answer.count))
                    continue
                self.errors += 1
                if answer is codec.CLOSED or (
                    isinstance(answer, frames.Error) and answer.code == ErrorCode.NOT_LEADER
                ):
                    client.close()
                    client = None
                    continue
                if isinstance(answer, frames.Error) and ErrorCode(answer.code).retryable:
                    continue
                raise AssertionError(f"unexpected answer {answer}")
            except (OSError, TimeoutError, ConnectionError):
                self.errors += 1
                if client is not None:
                    client.close()
                client = None
        if client is not None:
            client.close()

    def wait_for(self, count: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.acked) < count:
            assert time.monotonic() < deadline, (
                f"only {len(self.acked)} of {count} publishes acknowledged"
            )
            assert self.is_alive(), "producer died"
            time.sleep(0.01)

    def finish(self) -> None:
        self.stop_event.set()
        self.join(30)


def consume_all(
    node: ClusterNode, topic: str, group: str, want: set[int], timeout_s: float = 30.0
) -> set[int]:
    """Consume (and ack) from ``node`` until every id in ``want`` was seen."""
    client = WireClient(node.client_address)
    client.subscribe(topic, group, prefetch=1000)
    seen: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while not want <= seen and time.monotonic() < deadline:
        try:
            batch = client.deliveries(1, timeout_s=1.0)
        except TimeoutError:
            continue
        for delivery in batch:
            assert delivery[6] >= delivery[3], "delivered before due"
            seen.add(delivery[1])
        answer = client.request(frames.Ack(client.next_id(), [d[0] for d in batch]))
        assert isinstance(answer, frames.Ok), answer
        client.send(frames.Credit(0, 1, len(batch)))
    client.close()
    return seen


def test_followers_redirect_and_the_leader_serves(cluster3: Cluster) -> None:
    leader = cluster3.leader()
    follower = next(n for n in cluster3.nodes.values() if n is not leader)
    client = WireClient(follower.client_address)
    answer = client.publish([["redirect", b"x", 0, None, None]])
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.NOT_LEADER
    assert answer.leader_address == leader.client_address
    status = client.status()
    assert status["role"] == "follower" and status["leader_address"] == leader.client_address
    view = client.request(frames.ClusterStatus(client.next_id())).status
    members = {member["node_id"]: member for member in view["nodes"]}
    assert members[leader.node_id]["client_address"] == leader.client_address
    assert members[follower.node_id]["raft_address"] == follower.raft_address
    answer = WireClient(leader.client_address).publish([["redirect", b"x", 0, None, None]])
    assert isinstance(answer, frames.PublishOk)
    assert consume_all(leader, "redirect", "g", {answer.first_id}) == {answer.first_id}
    # Raft figures are exported.
    deadline = time.monotonic() + 10
    while True:
        with urllib.request.urlopen(f"http://{leader.http_address}/metrics", timeout=5) as response:
            body = response.read().decode()
        if (
            'futureq_raft_role{role="leader"} 1.0' in body
            and "futureq_raft_replication_lag_entries{" in body
        ):
            break
        assert time.monotonic() < deadline, body[-2000:]
        time.sleep(0.1)
    assert "futureq_raft_term 1.0" in body or "futureq_raft_term " in body
    # Every node applied the same publish.
    deadline = time.monotonic() + 10
    while {n.http_json("/api/status")["applied_index"] for n in cluster3.nodes.values()} != {
        leader.http_json("/api/status")["applied_index"]
    }:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_kill_leader_during_publish_stream_loses_nothing_acknowledged(cluster3: Cluster) -> None:
    producer = Producer(cluster3, "failover")
    producer.start()
    producer.wait_for(400)
    old_leader = cluster3.leader()
    old_leader.kill()
    acked_before = len(producer.acked)
    new_leader = cluster3.leader(exclude={old_leader.node_id})
    producer.wait_for(acked_before + 400)
    producer.finish()
    old_leader.start()  # back as a follower; its log catches up
    acked = set(producer.acked)
    seen = consume_all(cluster3.leader(), "failover", "g", acked, timeout_s=60)
    missing = acked - seen
    assert not missing, f"{len(missing)} acknowledged messages lost after the leader was killed"
    assert new_leader.node_id != old_leader.node_id


def test_follower_far_behind_catches_up_from_a_snapshot(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 3, env={"FUTUREQ_CLUSTER_COMPACT_EVERY_ENTRIES": "20"})
    try:
        cluster.start()
        leader = cluster.leader()
        lagging = next(n for n in cluster.nodes.values() if n is not leader)
        lagging.kill()
        producer = Producer(cluster, "snap", batch=1)
        producer.start()
        producer.wait_for(120)
        producer.finish()
        ids = set(producer.acked)
        leader = cluster.leader()
        client = WireClient(leader.client_address)
        target = leader.http_json("/api/status")["applied_index"]
        lagging.start()
        # /readyz turns OK only once the node applied up to the leader's commit index.
        deadline = time.monotonic() + 30
        while True:
            try:
                lagging.http_json("/readyz")
                break
            except OSError:
                assert time.monotonic() < deadline, "the restarted follower never became ready"
                time.sleep(0.02)
        assert lagging.http_json("/api/status")["applied_index"] >= target, "ready before caught up"
        while lagging.http_json("/api/status")["applied_index"] < target:
            assert time.monotonic() < deadline, "the restarted follower did not catch up"
            time.sleep(0.05)
        assert (
            "snapshot" in lagging.stderr_text().lower()
            or "snapshot" in leader.stderr_text().lower()
        )
        # Make the caught-up node the leader and read everything from it.
        answer = client.request(frames.ClusterTransferLeader(client.next_id(), lagging.node_id))
        assert isinstance(answer, frames.Ok), answer
        assert cluster.leader().node_id == lagging.node_id
        assert consume_all(lagging, "snap", "g", ids) == ids
    finally:
        cluster.stop()


def test_add_and_remove_nodes_while_publishing(cluster3: Cluster, tmp_path: Path) -> None:
    producer = Producer(cluster3, "membership")
    producer.start()
    producer.wait_for(200)
    client_port, raft_port, http_port = free_ports(3)
    joiner = ClusterNode(
        4,
        tmp_path / "node4",
        (client_port, raft_port, http_port),
        ["--join", cluster3.nodes[1].client_address, *cluster3.auth_args],
    )
    cluster3.nodes[4] = joiner
    joiner.start()
    deadline = time.monotonic() + 30
    while (
        4 not in cluster3.leader().http_json("/api/status").get("voters", [])
        and time.monotonic() < deadline
    ):
        leader = cluster3.leader()
        view = WireClient(leader.client_address).request(frames.ClusterStatus(1))
        if 4 in view.status["voters"]:
            break
        time.sleep(0.1)
    leader = cluster3.leader()
    view = WireClient(leader.client_address).request(frames.ClusterStatus(1)).status
    assert 4 in view["voters"], view
    producer.wait_for(len(producer.acked) + 200)
    # Remove the current leader itself; the cluster keeps going with 1 of {2, 3, 4} leading.
    admin = WireClient(leader.client_address)
    answer = admin.request(frames.ClusterRemoveNode(admin.next_id(), leader.node_id))
    assert isinstance(answer, frames.Ok), answer
    new_leader = cluster3.leader(exclude={leader.node_id})
    producer.wait_for(len(producer.acked) + 200)
    producer.finish()
    view = WireClient(new_leader.client_address).request(frames.ClusterStatus(1)).status
    assert leader.node_id not in view["voters"] and 4 in view["voters"]
    # The removed node learns it was removed and shuts itself down.
    assert leader.process is not None
    assert leader.process.wait(20) == 0
    assert "was removed from the cluster" in leader.stderr_text()
    acked = set(producer.acked)
    assert consume_all(new_leader, "membership", "g", acked, timeout_s=60) >= acked


def test_graceful_shutdown_hands_leadership_over(cluster3: Cluster) -> None:
    leader = cluster3.leader()
    assert leader.terminate() == 0
    assert "leadership handed to node" in leader.stderr_text()
    successor = cluster3.leader(timeout_s=5, exclude={leader.node_id})
    answer = WireClient(successor.client_address).publish([["handover", b"x", 0, None, None]])
    assert isinstance(answer, frames.PublishOk)


def test_five_nodes_survive_losing_two_including_the_leader(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 5)
    try:
        cluster.start()
        leader = cluster.leader()
        client = WireClient(leader.client_address)
        first = client.publish([["five", b"before", 0, None, None]])
        assert isinstance(first, frames.PublishOk)
        follower = next(n for n in cluster.nodes.values() if n is not leader)
        leader.kill()
        follower.kill()
        survivor_leader = cluster.leader(exclude={leader.node_id, follower.node_id})
        answer = WireClient(survivor_leader.client_address).publish(
            [["five", b"after", 0, None, None]]
        )
        assert isinstance(answer, frames.PublishOk)
        ids = {first.first_id, answer.first_id}
        assert consume_all(survivor_leader, "five", "g", ids) == ids
    finally:
        cluster.stop()


def test_peers_speak_mutual_tls_when_tls_has_a_ca(tmp_path: Path) -> None:
    import socket as socket_module
    import ssl

    import trustme

    ca = trustme.CA()
    ca_path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    node_args: dict[int, list[str]] = {}
    for node_id in (1, 2, 3):
        # Each node's certificate names its host and its node id (docs/security.md).
        cert = ca.issue_cert("127.0.0.1", "localhost", f"node-{node_id}.futureq.futureq")
        cert_path, key_path = tmp_path / f"node{node_id}.pem", tmp_path / f"node{node_id}.key"
        for number, pem in enumerate(cert.cert_chain_pems):
            pem.write_to_path(str(cert_path), append=number > 0)
        cert.private_key_pem.write_to_path(str(key_path))
        node_args[node_id] = ["--tls-cert", str(cert_path), "--tls-key", str(key_path)]
    tls_args = ["--tls-ca", str(ca_path)]
    cluster = Cluster(tmp_path, 3, extra_args=tls_args, node_args=node_args, secret=False)
    try:
        cluster.start()
        leader = cluster.leader()  # an election happened over TLS links
        # A plain-TCP peer cannot join the raft conversation.
        plain = socket_module.create_connection(("127.0.0.1", cluster.ports[1][1]), timeout=5)
        plain.sendall(b"\x00\x00\x00\x05hello")
        plain.close()
        context = ssl.create_default_context(cafile=str(ca_path))
        host, port = leader.client_address.rsplit(":", 1)
        raw = socket_module.create_connection((host, int(port)), timeout=10)
        client = WireClient.__new__(WireClient)
        client.sock = context.wrap_socket(raw, server_hostname=host)
        client.decoder = codec.FrameDecoder(64 * 1024 * 1024)
        client.pushed = []
        client._next_id = 100
        client.send(frames.Hello(1, (1,), "tls", None))
        assert isinstance(client.receive(), frames.HelloOk)
        answer = client.publish([["secure.cluster", b"x", 0, None, None]])
        assert isinstance(answer, frames.PublishOk), answer
        client.sock.close()
        assert cluster.leader().node_id == leader.node_id
    finally:
        cluster.stop()


def test_joining_with_another_cluster_id_or_a_member_id_is_refused(
    cluster3: Cluster, tmp_path: Path
) -> None:
    import subprocess
    import sys

    leader = cluster3.leader()
    for node_id, extra in ((5, ["--cluster-id", "other"]), (2, [])):
        client_port, raft_port, http_port = free_ports(3)
        done = subprocess.run(
            [sys.executable, "-m", "futureq.cli.server_main", "start", "--shards", "1",
             "--node-id", str(node_id),
             "--data-dir", str(tmp_path / f"join{node_id}"), "--listen", f"127.0.0.1:{client_port}",
             "--http", f"127.0.0.1:{http_port}", "--raft-listen", f"127.0.0.1:{raft_port}",
             "--join", leader.client_address, *cluster3.auth_args, *extra],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr[-2000:]
        assert (
            ("cluster 'futureq'" in done.stderr) if extra else ("already a member" in done.stderr)
        )
    view = WireClient(leader.client_address).request(frames.ClusterStatus(1)).status
    assert view["learners"] == [] and sorted(view["voters"]) == [1, 2, 3]


def test_a_node_id_that_does_not_fit_is_refused_before_it_reaches_the_log(tmp_path: Path) -> None:
    """Found by sending CLUSTER_ADD_NODE with node id 2**63: the leader committed its
    NODE_ADDRESS, whose apply raised OverflowError (the id is stored in 4 bytes) on every
    replica, and every node then failed again on each restart replaying it: one request
    stopped the whole cluster for good. The id is now checked where it enters, and apply
    ignores one that does not fit."""
    cluster = Cluster(tmp_path, 1)
    cluster.start()
    try:
        node = cluster.leader()
        client = WireClient(node.client_address)
        for node_id in (2**31, 2**63, 2**64 - 1):
            answer = client.request(
                frames.ClusterAddNode(client.next_id(), node_id, "127.0.0.1:1", "127.0.0.1:2")
            )
            assert isinstance(answer, frames.Error), answer
            assert answer.code == ErrorCode.INVALID_ARGUMENT, answer
            assert "node_id must be between 1 and 2147483647" in answer.message
        published = client.publish([["after.add", b"x", 0, None, None]])
        assert isinstance(published, frames.PublishOk), published
        node.restart()  # the log replays cleanly
        cluster.leader()
        client = WireClient(node.client_address)
        assert client.group_pending("after.add", "default") == 1
        assert "Traceback" not in node.stderr_text()
    finally:
        cluster.stop()


def test_a_follower_names_the_new_leader_instead_of_none_during_an_election(
    cluster3: Cluster,
) -> None:
    """A PUBLISH on a follower while an election runs (the leader was killed) waits
    until the follower knows the winner: it is published there if the follower won,
    else refused with NOT_LEADER naming the winner. Never NOT_LEADER naming no one
    (the client polled every node until the election ended) nor the dead leader the
    follower no longer hears from (0.2 s: more than 3 heartbeats, less than the
    election timeout, so the follower still counts it as its leader)."""
    old = cluster3.leader()
    follower = next(n for n in cluster3.nodes.values() if n is not old)
    client = WireClient(follower.client_address, timeout_s=20)
    old.kill()
    time.sleep(0.2)
    answer = client.publish([["election", b"x", 0, None, None]])
    if isinstance(answer, frames.Error):
        # The winner; on a loaded machine it may have handed leadership on since
        # (a clock out of the bound), so it is checked as a live node, not as the
        # leader of now.
        assert answer.code == ErrorCode.NOT_LEADER, answer
        live = {n.client_address for n in cluster3.nodes.values() if n is not old}
        assert answer.leader_address in live - {follower.client_address}, answer
    else:
        assert isinstance(answer, frames.PublishOk), answer


def test_a_connection_to_the_node_that_becomes_leader_keeps_serving(cluster3: Cluster) -> None:
    """A client connected to a follower that becomes the leader is already where it
    must go: its connection keeps serving (the node used to stop reading it and close
    it 2 s later, so the next request waited unread and then failed with the
    connection). A connection to the node that lost leadership is still closed."""
    old = cluster3.leader()
    follower = next(n for n in cluster3.nodes.values() if n is not old)
    on_follower = WireClient(follower.client_address, timeout_s=20)
    on_old = WireClient(old.client_address, timeout_s=20)
    assert on_follower.status()["role"] == "follower"
    answer = on_old.request(frames.ClusterTransferLeader(on_old.next_id(), follower.node_id))
    assert isinstance(answer, frames.Ok), answer
    deadline = time.monotonic() + 10
    while on_follower.status()["role"] != "leader":
        assert time.monotonic() < deadline, "the transfer did not make the follower the leader"
        time.sleep(0.05)
    # Past the old close's grace period: the connection must still be open and read.
    time.sleep(2.5)
    answer = on_follower.publish([["kept", b"x", 0, None, None]])
    assert isinstance(answer, frames.PublishOk), answer
    assert on_follower.status()["role"] == "leader"
    # The node that stopped leading closes its connections, so clients follow.
    assert on_old.receive(timeout_s=10) is codec.CLOSED
    on_follower.close()
    on_old.close()


def test_followers_stay_ready_under_a_steady_load(cluster3: Cluster) -> None:
    """Found by a breaker (2 of 2): at about 300 publishes/s, 7 % of the followers'
    ``/readyz`` probes answered 503 ("not serving yet"): a follower is always a few
    entries behind the commit index between two applies, and a probe that fell there
    took a healthy follower out of a load balancer. Once ready, a follower that caught
    up within the last two election timeouts stays ready."""
    producer = Producer(cluster3, "ready", batch=1)
    producer.start()
    try:
        producer.wait_for(50)
        leader = cluster3.leader()
        followers = [node for node in cluster3.nodes.values() if node is not leader]
        deadline = time.monotonic() + 30
        for follower in followers:  # ready once (it applied what the leader committed)
            while True:
                try:
                    follower.http_json("/readyz")
                    break
                except urllib.error.HTTPError:
                    assert time.monotonic() < deadline, f"node {follower.node_id} never ready"
                    time.sleep(0.05)
        refused = []
        for _ in range(150):
            for follower in followers:
                url = f"http://{follower.http_address}/readyz"
                try:
                    with urllib.request.urlopen(url, timeout=5):
                        pass
                except urllib.error.HTTPError as answer:
                    refused.append((follower.node_id, answer.code, answer.read()[:300]))
                    answer.close()
            time.sleep(0.01)
        assert len(producer.acked) > 200, "the load did not run"
        assert refused == []
    finally:
        producer.finish()
