"""A stop signal while a node starts stops it gracefully: exit 0, a log line, never READY.

A node may take a while to start (RocksDB's recovery, loading its state, replaying its
log), and the stop-signal watcher starts only once it serves: before, a SIGTERM then
ended the process with -15 and no word (a SIGINT with a KeyboardInterrupt traceback),
and a sharded node's supervisor, which forwards its SIGTERM to its shards, saw them
exit with -15. Now ``futureq start`` remembers a stop signal from the moment it knows it
starts a node and stops at its next check, before serving.

The signal is sent when the node logs its ``node.shards = auto`` line, which ``futureq
start`` writes after it began remembering stop signals and before it opens anything, so
it always lands in the start. Real ``futureq start`` processes on 127.0.0.1 (OS-chosen
ports, no peers).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from broker_process import clean_env

WAIT_S = 60.0
AUTO_LINE = "node.shards = auto"


def _command(data_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "futureq.cli.server_main", "start",
        "--data-dir", str(data_dir), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
        *extra,
    ]  # fmt: skip


def _stop_when_auto_line(data_dir: Path, stop_signal: signal.Signals) -> tuple[int, str, str]:
    """Start a node with ``node.shards = auto``; send ``stop_signal`` as soon as it logs
    its shard count; return its exit code, stdout and stderr."""
    process = subprocess.Popen(
        _command(data_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    assert process.stderr is not None and process.stdout is not None
    seen: list[str] = []
    try:
        for line in process.stderr:
            seen.append(line)
            if AUTO_LINE in line:
                process.send_signal(stop_signal)
                break
        rest_out, rest_err = process.communicate(timeout=WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
    return process.returncode, rest_out, "".join(seen) + rest_err


def _stamp_one_shard(data_dir: Path) -> None:
    """A data directory a single node (one shard) created and left: ``auto`` then means
    one shard, one process, no supervisor."""
    process = subprocess.Popen(
        _command(data_dir, "--shards", "1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=clean_env(),
    )
    assert process.stdout is not None
    try:
        assert process.stdout.readline().startswith("READY ")
        process.send_signal(signal.SIGTERM)
        assert process.wait(WAIT_S) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        process.stdout.close()


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_while_a_single_node_starts_stops_it_gracefully(
    tmp_path: Path, stop_signal: signal.Signals
) -> None:
    data_dir = tmp_path / "data"
    _stamp_one_shard(data_dir)
    code, out, err = _stop_when_auto_line(data_dir, stop_signal)
    assert code == 0, err
    assert "READY" not in out, out
    assert f"received {stop_signal.name} while" in err, err
    assert "Traceback" not in err, err
    assert "stopped" in err.splitlines()[-1], err


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="auto is one shard on one core")
@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_while_a_sharded_node_starts_stops_it_gracefully(
    tmp_path: Path, stop_signal: signal.Signals
) -> None:
    """On a machine of two cores or more, ``auto`` on a new data directory is a sharded
    node: the supervisor takes the signal before any shard runs."""
    code, out, err = _stop_when_auto_line(tmp_path / "data", stop_signal)
    assert code == 0, err
    assert "READY" not in out, out
    assert f"received {stop_signal.name} while starting" in err, err
    assert "shard 0 started" not in err, err
    assert "Traceback" not in err, err
