"""``make cluster`` (futureq.cli.local_cluster) as a user runs it: Ctrl-C in the terminal
reaches the launcher's whole process group, and every node stops gracefully once (no
"received SIGTERM again: stopping now"), then the launcher exits 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cluster_process import free_runs

from futureq.cli.local_cluster import ports

NODES = 3


def free_base_port() -> int:
    """A base port whose ports of a 3-node local cluster (``ports(1..NODES, base)``) are
    free right now: the start of a free run reaching the last of them."""
    return free_runs(1, max(ports(NODES, 0)) + 1)[0]


def test_ctrl_c_stops_every_node_gracefully_once(tmp_path: Path) -> None:
    base = free_base_port()
    log = tmp_path / "cluster.log"
    with open(log, "w") as output:
        launcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "futureq.cli.local_cluster",
                "--data-dir",
                str(tmp_path / "data-cluster"),
                "--base-port",
                str(base),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, like a shell job
        )
    try:
        deadline = time.monotonic() + 60
        while log.read_text().count("READY ") < NODES:
            assert launcher.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        # What the terminal does on Ctrl-C: SIGINT to the foreground process group.
        os.killpg(launcher.pid, signal.SIGINT)
        assert launcher.wait(60) == 0, log.read_text()
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(10)
    text = log.read_text()
    assert "again: stopping now" not in text, text
    assert text.count("shutting down gracefully") == NODES, text
    assert text.count("stopped; RocksDB closed") == NODES, text
