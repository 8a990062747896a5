"""A port of shard K > 0 already taken: the node stops with a sentence that explains the
port (the user never typed it: it is their port plus K x ``node.shard_port_stride``),
and nothing is left running or listening.

Real ``futureq start --shards 2`` processes on 127.0.0.1; another socket holds shard 1's
port.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from broker_process import clean_env
from cluster_process import free_runs, port_free

STRIDE = 100


@pytest.mark.parametrize(
    ("what", "flag", "offset"), [("clients", "--listen", 0), ("HTTP", "--http", 2)]
)
def test_a_taken_port_of_shard_1_is_explained_and_nothing_stays_up(
    tmp_path: Path, what: str, flag: str, offset: int
) -> None:
    [base] = free_runs(1, STRIDE + 3)
    taken = base + offset + STRIDE  # shard 1's client (base + 100) or HTTP (base + 102) port

    def start(*shards: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable, "-m", "futureq.cli.server_main", "start", *shards,
                "--data-dir", str(tmp_path / "data"),
                "--listen", f"127.0.0.1:{base}", "--http", f"127.0.0.1:{base + 2}",
            ],
            capture_output=True, text=True, timeout=120, check=False, env=clean_env(),
        )  # fmt: skip

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        result = start("--shards", "2")
    assert result.returncode == 4, result.stderr[-4000:]
    assert "READY" not in result.stdout
    sentence = (
        f"futureq: cannot listen for {what} on 127.0.0.1:{taken}: Address already in use "
        f"(shard 1's port: the port of {flag} plus 1 x node.shard_port_stride {STRIDE}; "
        f"change {flag} or node.shard_port_stride, or free that port)"
    )
    assert sentence in result.stderr, result.stderr[-4000:]
    # Nothing half-up: every port of both shards is free again once the command returned.
    for port in (base, base + 2, base + STRIDE, base + STRIDE + 2):
        assert port_free(port), port
    # The failed first start stamped the count: a start with another one is told that
    # start never got ready, and what to do (not only that the count is fixed).
    other = start("--shards", "1")
    assert other.returncode == 2, other.stderr[-4000:]
    assert "created with 2 shards by a start that never got ready" in other.stderr
    assert f"remove {tmp_path / 'data'} and start again with --shards 1" in other.stderr
