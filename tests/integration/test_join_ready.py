"""A node started with ``--join`` prints READY only once the cluster took it.

Found by an operator's tests: a join the cluster refused (a wrong secret, another
``--cluster-id``, a node id in use) printed ``READY client=... node_id=4`` and then
exited 2, so tools that wait for READY took a node that never joined for a started
one. Real ``futureq start`` processes on 127.0.0.1.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cluster_process import Cluster, free_ports
from wire_client import WireClient

from futureq.peer_credentials import generate_secret_file
from futureq.wire import frames


def join(cluster: Cluster, tmp_path: Path, node_id: int, name: str, *extra: str) -> list[str]:
    client_port, raft_port, http_port = free_ports(3)
    return [
        sys.executable, "-m", "futureq.cli.server_main", "start", "--shards", "1",
        "--node-id", str(node_id), "--data-dir", str(tmp_path / name),
        "--listen", f"127.0.0.1:{client_port}", "--http", f"127.0.0.1:{http_port}",
        "--raft-listen", f"127.0.0.1:{raft_port}",
        "--join", cluster.leader().client_address, *extra,
    ]  # fmt: skip


def test_a_refused_join_exits_2_without_ready_and_an_accepted_one_says_ready(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path / "cluster", 1)
    cluster.start()
    try:
        wrong = tmp_path / "wrong.secret"
        generate_secret_file(str(wrong))
        cases = [
            (4, ["--cluster-secret-file", str(wrong)], "could not prove it holds"),
            (5, [*cluster.auth_args, "--cluster-id", "other"], "belongs to cluster"),
            (1, cluster.auth_args, "already a member"),
        ]
        for node_id, extra, sentence in cases:
            done = subprocess.run(
                join(cluster, tmp_path, node_id, f"refused{node_id}", *extra),
                capture_output=True,
                text=True,
                timeout=90,
                check=False,
            )
            assert done.returncode == 2, done.stderr[-2000:]
            assert sentence in done.stderr, done.stderr[-2000:]
            assert "READY" not in done.stdout, (node_id, done.stdout)
        joining = subprocess.Popen(
            join(cluster, tmp_path, 6, "accepted", *cluster.auth_args),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert joining.stdout is not None
            line = joining.stdout.readline()
            assert line.startswith("READY ") and "node_id=6" in line, line
            voters, learners = _members(cluster)
            assert 6 in voters or 6 in learners
        finally:
            joining.terminate()
            joining.wait(30)
            assert joining.stdout is not None
            joining.stdout.close()
    finally:
        cluster.stop()


def _members(cluster: Cluster) -> tuple[list[int], list[int]]:
    view = WireClient(cluster.leader().client_address).request(frames.ClusterStatus(1)).status
    return list(view.get("voters", [])), list(view.get("learners", []))
