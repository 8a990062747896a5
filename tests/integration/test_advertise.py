"""What a node announces is its advertised address, never the address it binds (issue 12).

Three real ``futureq start`` processes bind 127.0.0.1 but advertise ``localhost:PORT``
(the same host, spelled differently, so every announced address can be told apart from
a bound one): NOT_LEADER redirects, HELLO answers, cluster status and the NODE_ADDRESS a
joining node sends must all carry the ``localhost`` form. A clustered node that would
announce a wildcard refuses to start.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_process import Cluster, ClusterNode, free_ports
from wire_client import WireClient

from futureq.errors import ErrorCode
from futureq.wire import frames


def _advertised(ports: tuple[int, int, int]) -> list[str]:
    client, raft, _ = ports
    return ["--advertise-client", f"localhost:{client}", "--advertise-raft", f"localhost:{raft}"]


@pytest.fixture
def advertised_cluster(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, 3)
    for node_id, node in cluster.nodes.items():
        node.extra_args += _advertised(cluster.ports[node_id])
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _wait_ready(node: ClusterNode, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            node.http_json("/readyz")
            return
        except OSError:
            assert time.monotonic() < deadline, f"node {node.node_id} never became ready"
            time.sleep(0.05)


def _members(client: WireClient) -> dict[int, dict[str, object]]:
    view = client.request(frames.ClusterStatus(client.next_id())).status
    return {member["node_id"]: member for member in view["nodes"]}


def test_redirects_hello_and_cluster_status_carry_the_advertised_addresses(
    advertised_cluster: Cluster, tmp_path: Path
) -> None:
    cluster = advertised_cluster
    leader = cluster.leader()
    assert leader.client_address.startswith("localhost:")  # READY prints the announced one
    expected = {
        n: {"client_address": f"localhost:{p[0]}", "raft_address": f"localhost:{p[1]}"}
        for n, p in cluster.ports.items()
    }
    for node in cluster.nodes.values():
        _wait_ready(node)
        client = WireClient(f"127.0.0.1:{cluster.ports[node.node_id][0]}")
        status = client.status()
        assert status["leader_address"] == expected[leader.node_id]["client_address"]
        members = _members(client)
        for node_id, addresses in expected.items():
            assert members[node_id]["client_address"] == addresses["client_address"]
            # Its own raft address as it announces it; a static peer's as --peers names it.
            raft = addresses["raft_address"] if node_id == node.node_id else None
            raft = raft or f"127.0.0.1:{cluster.ports[node_id][1]}"
            assert members[node_id]["raft_address"] == raft, (node.node_id, members)
        if node is not leader:
            answer = client.publish([["advertise", b"x", 0, None, None]])
            assert isinstance(answer, frames.Error) and answer.code == ErrorCode.NOT_LEADER
            assert answer.leader_address == expected[leader.node_id]["client_address"]

    # A joining node sends its advertised addresses in NODE_ADDRESS.
    ports = (client_port, raft_port, _) = tuple(free_ports(3))
    # (Cluster.auth_args: the peer credentials, where issue 7's authentication is in.)
    auth = getattr(cluster, "auth_args", [])
    joiner = ClusterNode(
        4, tmp_path / "node4", ports, ["--join", leader.client_address, *_advertised(ports), *auth]
    )
    cluster.nodes[4] = joiner
    joiner.start()
    admin = WireClient(cluster.leader().client_address)
    deadline = time.monotonic() + 30
    while 4 not in admin.request(frames.ClusterStatus(admin.next_id())).status["voters"]:
        assert time.monotonic() < deadline, "the joining node was not promoted"
        time.sleep(0.1)
    for node in cluster.nodes.values():
        members = _members(WireClient(f"127.0.0.1:{cluster.ports.get(node.node_id, ports)[0]}"))
        assert members[4]["raft_address"] == f"localhost:{raft_port}", members
        assert members[4]["client_address"] == f"localhost:{client_port}", members


def test_add_node_refuses_wildcard_addresses(advertised_cluster: Cluster) -> None:
    admin = WireClient(advertised_cluster.leader().client_address)
    for raft, client in (("0.0.0.0:7999", "localhost:7998"), ("localhost:7999", "[::]:7998")):
        answer = admin.request(frames.ClusterAddNode(admin.next_id(), 9, raft, client))
        assert isinstance(answer, frames.Error), answer
        assert answer.code == ErrorCode.INVALID_ARGUMENT
        assert "wildcard" in answer.message
    view = admin.request(frames.ClusterStatus(admin.next_id())).status
    assert 9 not in view["voters"] and 9 not in view["learners"]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--listen", "0.0.0.0:{c}", "--advertise-raft", "127.0.0.1:{r}"], "--advertise-client"),
        (
            ["--raft-listen", "0.0.0.0:{r}", "--advertise-client", "127.0.0.1:{c}"],
            "--advertise-raft",
        ),
        (["--advertise-client", "0.0.0.0:{c}"], "--advertise-client"),
    ],
)
def test_a_clustered_node_that_would_announce_a_wildcard_refuses_to_start(
    tmp_path: Path, flags: list[str], named: str
) -> None:
    client_port, raft_port, http_port = free_ports(3)
    base = {
        "--listen": f"127.0.0.1:{client_port}",
        "--raft-listen": f"127.0.0.1:{raft_port}",
        "--http": f"127.0.0.1:{http_port}",
    }
    args = [flag.format(c=client_port, r=raft_port) for flag in flags]
    for flag, value in base.items():
        if flag not in args:
            args += [flag, value]
    done = subprocess.run(
        [sys.executable, "-m", "futureq.cli.server_main", "start", "--node-id", "1",
         "--data-dir", str(tmp_path / "data"), "--peers", f"1=127.0.0.1:{raft_port},2=127.0.0.1:1",
         *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "wildcard" in done.stderr and named in done.stderr, done.stderr
    assert not (tmp_path / "data").exists(), "refused before touching the data directory"
