"""A second process running as a node id that runs already (``docs/raft.md``, "Same node id
twice"), against real ``futureq start`` processes.

A twin of node 2 with a data directory of its own (another incarnation), the cluster's
id and secret, and a ``--peers`` naming itself elsewhere passes the check at start. Its
messages were taken as node 2's: its votes could elect a second leader in a term, its
acknowledgements commit what no majority holds. The members now refuse it, all of them
saying which processes run as node 2, and keep committing; a node 2 whose disk was
replaced (the old process gone) is taken again.
"""

from __future__ import annotations

import re
import shutil
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from cluster_process import Cluster, ClusterNode, free_ports
from test_cluster import consume_all
from test_disk_faults import ENV, publish, wait_converged, wait_recovered
from wire_client import WireClient

from futureq.wire import frames

REFUSAL = "two processes run as node 2"


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.1)


def twin_refusals(node: ClusterNode) -> float:
    """``futureq_raft_peer_refusals_total{reason="twin"}`` of ``node`` (0 if absent)."""
    with urllib.request.urlopen(f"http://{node.http_address}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    found = re.search(r'^futureq_raft_peer_refusals_total\{reason="twin"\} (\S+)$', text, re.M)
    return 0.0 if found is None else float(found.group(1))


def test_a_twin_of_a_running_node_is_refused_and_a_replaced_node_rejoins(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path, 3, env=ENV)
    twin: ClusterNode | None = None
    try:
        cluster.start()
        leader = cluster.leader()
        acked = publish(leader, "twin", 20)
        ports = free_ports(3)
        peers = ",".join(
            f"{n}=127.0.0.1:{ports[1] if n == 2 else cluster.ports[n][1]}" for n in cluster.ports
        )
        twin = ClusterNode(
            2, tmp_path / "twin", (ports[0], ports[1], ports[2]),
            ["--peers", peers, *cluster.auth_args], ENV,
        )  # fmt: skip
        twin.start()
        members = [cluster.nodes[1], cluster.nodes[3]]
        wait_until(
            lambda: all(twin_refusals(node) > 0 for node in members),
            "nodes 1 and 3 to refuse the twin",
        )
        twin_log = twin.stderr_text()
        assert f"node 1 refused the connection: {REFUSAL}" in twin_log, twin_log[-3000:]
        assert f"node 3 refused the connection: {REFUSAL}" in twin_log, twin_log[-3000:]
        for node in members:
            log = node.stderr_text()
            assert REFUSAL in log and "Stop the process that should not run" in log, log[-3000:]
        # The cluster keeps committing, with the real node 2 (the twin never counts).
        acked |= publish(cluster.leader(), "twin", 50)
        client = WireClient(twin.client_address)  # it never heard from a voter
        assert client.request(frames.ClusterStatus(client.next_id())).status["recovering"] is True
        client.close()
        twin.terminate()
        twin = None

        # Node 2's disk is replaced: old process stopped, empty directory, same ports.
        real = cluster.nodes[2]
        real.terminate()
        shutil.rmtree(real.data_dir)
        real.start()
        wait_recovered(real, timeout_s=30)  # it heard from nodes 1 and 3: taken again
        leader = cluster.leader(timeout_s=30)
        acked |= publish(leader, "twin", 20)
        wait_converged(cluster)
        # Started within the quiet period of the old process's last connection it may
        # have been told to wait (REPLACED), never that it is a twin.
        assert REFUSAL not in real.stderr_text()
        assert consume_all(leader, "twin", "g", acked, timeout_s=60) >= acked
    finally:
        if twin is not None:
            twin.kill()
        cluster.stop()
