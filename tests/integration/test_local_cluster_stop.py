"""``make cluster`` (futureq.cli.local_cluster) as a user runs it, with its default shard
count (auto: one shard per usable core): the nodes serve ``futureq-cli`` with that many
shards, Ctrl-C in the terminal reaches the launcher's whole process group, and every
shard of every node stops gracefully once (no "received SIGTERM again: stopping now"),
then the launcher exits 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster_process import free_runs

from futureq.cli.local_cluster import ports
from futureq.shards.layout import usable_cores
from futureq.shards.slots import MAX_SHARDS

NODES = 3
SHARDS = min(usable_cores(), MAX_SHARDS)
"""What ``auto`` gives each node's new data directory on this machine."""
STRIDE = 100
"""``node.shard_port_stride``'s default: shard K listens on the node's ports + 100 K."""


def free_base_port() -> int:
    """A base port whose ports of a 3-node local cluster of SHARDS shards per node
    (``ports(1..NODES, base)`` plus ``STRIDE * K``) are free right now: the start of a
    free run reaching the last of them."""
    return free_runs(1, max(ports(NODES, 0)) + (SHARDS - 1) * STRIDE + 1)[0]


def start_launcher(
    tmp_path: Path, base: int, *args: str, preexec_fn: Callable[[], Any] | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start ``futureq.cli.local_cluster`` on ``base`` in its own process group, as a
    shell job is; its output in the returned log file."""
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
                *args,
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, like a shell job
            preexec_fn=preexec_fn,
        )
    return launcher, log


def wait_ready(launcher: subprocess.Popen[bytes], log: Path) -> None:
    """Wait (60 s at most) until every node has logged READY."""
    deadline = time.monotonic() + 60
    while log.read_text().count("READY ") < NODES:
        assert launcher.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


def kill_left(launcher: subprocess.Popen[bytes]) -> None:
    """SIGKILL the launcher's process group if a failed test left it running."""
    if launcher.poll() is None:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(10)


def test_ctrl_c_stops_every_node_gracefully_once(tmp_path: Path) -> None:
    base = free_base_port()
    launcher, log = start_launcher(tmp_path, base)
    try:
        wait_ready(launcher, log)
        ready = [line for line in log.read_text().splitlines() if line.startswith("READY ")]
        if SHARDS > 1:
            assert all(line.endswith(f"shards={SHARDS}") for line in ready), ready
        else:
            assert not any("shards=" in line for line in ready), ready
        servers = ",".join(f"127.0.0.1:{ports(n, base)[0]}" for n in range(1, NODES + 1))
        cli = [sys.executable, "-m", "futureq.cli.client_main", "--server", servers]
        for args in (["publish", "orders", "one"], ["status", "--json"]):
            done = subprocess.run(
                [*cli, *args], capture_output=True, text=True, timeout=60, check=False
            )
            assert done.returncode == 0, done.stderr
        if SHARDS > 1:
            assert len(json.loads(done.stdout)["shards"]) == SHARDS, done.stdout
        # What the terminal does on Ctrl-C: SIGINT to the foreground process group.
        os.killpg(launcher.pid, signal.SIGINT)
        assert launcher.wait(60) == 0, log.read_text()
    finally:
        kill_left(launcher)
    text = log.read_text()
    assert "again: stopping now" not in text, text
    assert text.count("shutting down gracefully") == NODES * SHARDS, text
    assert text.count("stopped; RocksDB closed") == NODES * SHARDS, text


def test_signals_begun_ignored_stay_ignored_and_sigterm_stops(tmp_path: Path) -> None:
    """``make cluster &`` in a script starts the launcher with SIGINT ignored, ``nohup``
    with SIGHUP ignored: neither stops it; SIGTERM stops every node gracefully."""
    base = free_runs(1, max(ports(NODES, 0)) + 1)[0]
    launcher, log = start_launcher(
        tmp_path,
        base,
        "--shards",
        "1",
        # What the shell does for a background job of a script, and nohup.
        preexec_fn=lambda: [
            signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGHUP)
        ],
    )
    try:
        wait_ready(launcher, log)
        launcher.send_signal(signal.SIGINT)
        launcher.send_signal(signal.SIGHUP)
        try:
            launcher.wait(2)
        except subprocess.TimeoutExpired:
            pass  # still running, as it should
        assert launcher.poll() is None, log.read_text()
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(60) == 0, log.read_text()
    finally:
        kill_left(launcher)
    text = log.read_text()
    assert "again: stopping now" not in text, text
    assert text.count("stopped; RocksDB closed") == NODES, text
