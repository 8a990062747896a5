"""``futureq health`` with the default shard count (auto), run away from the node's data
directory (another working directory: a cron job, a monitoring agent, a probe).

It used to resolve ``auto`` as ``futureq start`` does, so a missing ``./data`` meant
"one shard per core": on a machine of 2 cores it asked ``--http``'s port plus 100 too,
which a single-process node never opened, and reported a healthy node unhealthy (exit
1). It now asks the count stamped in ``--data-dir``, else the node's own port (which a
sharded node's shard 0 answers for every shard).

Real ``futureq start`` processes on 127.0.0.1.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from broker_process import BrokerProcess, clean_env


def health(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "futureq.cli.server_main", "health", "--timeout", "5", *args],
        cwd=cwd, capture_output=True, text=True, timeout=60, check=False, env=clean_env(),
    )  # fmt: skip


@pytest.mark.parametrize("shards", ["1", "2"])
def test_health_without_the_data_directory_asks_the_nodes_own_port(
    tmp_path: Path, shards: str
) -> None:
    node = BrokerProcess(tmp_path / "node-data", shards=shards)
    node.start()
    elsewhere = tmp_path / "elsewhere"  # no ./data here
    elsewhere.mkdir()
    try:
        for ready in ([], ["--ready"]):
            done = health(elsewhere, "--http", node.http_address, *ready)
            assert done.returncode == 0, done.stdout + done.stderr
            assert f"http://{node.http_address}/" in done.stdout
            assert "no answer" not in done.stderr, done.stderr
        # Given the node's data directory, a sharded node's shards are asked one by one.
        done = health(elsewhere, "--http", node.http_address, "--data-dir", str(node.data_dir))
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.count("/healthz: 200") == int(shards), done.stdout
    finally:
        node.terminate()


def test_health_pointed_at_the_client_port_says_so_without_a_traceback(
    tmp_path: Path, broker: BrokerProcess
) -> None:
    """Found by running ``futureq health --http <client port>``: the binary client port
    does not answer HTTP, and the check printed an ``http.client.BadStatusLine``
    traceback. It now says the address did not answer in HTTP, and exits 1."""
    done = health(tmp_path, "--http", broker.client_address)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "not in HTTP" in done.stderr, done.stderr
    assert "client port" in done.stderr, done.stderr
