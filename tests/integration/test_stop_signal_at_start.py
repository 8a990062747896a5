"""A stop signal in the first moments of ``futureq start`` is never lost: the process
exits 0 promptly, says why, and its data directory opens again cleanly.

Before, ``futureq start`` remembered stop signals only once it had read its
configuration (some 0.2 s after exec: the imports of the command take 0.1 s): a SIGTERM
sooner ended the process with -15 and no word, a SIGINT raised KeyboardInterrupt with a
traceback (or was swallowed and the node went on to serve), and a sharded node's
supervisor forwarded its SIGTERM to shards it had just started, which died of it (-15).

The signal is sent at points the test observes, not after a sleep: as soon as the
process catches SIGTERM or SIGHUP (``/proc/PID/status``: the moment the
program's own code runs, before its first log line); at its first log line; once
RocksDB's LOCK file exists (while it opens); and, for a sharded node, as soon as its
supervisor logs that it started a shard. Real processes on 127.0.0.1.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from broker_process import clean_env
from cluster_process import free_ports

from futureq.peer_credentials import generate_secret_file

EXIT_WITHIN_S = 20.0
"""How long the process may take to stop once signalled (it is prompt; the machine may
be loaded)."""
START_S = 60.0
CAUGHT = {signal.SIGTERM, signal.SIGHUP}
"""Handlers the program's own code installs (Python catches SIGINT from its start)."""


def _command(data_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "futureq.cli.server_main", "start",
        "--data-dir", str(data_dir), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
        *extra,
    ]  # fmt: skip


def _caught(pid: int) -> set[int]:
    """The signals process ``pid`` has a handler for (``SigCgt``)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return set()
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask & (1 << (n - 1))}
    return set()


class _Started:
    """A ``futureq start`` process whose stderr is read as it comes."""

    def __init__(self, args: list[str]) -> None:
        self.process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env()
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self.lines.append("")  # EOF
            self._changed.notify_all()

    def wait_line(self, text: str) -> None:
        deadline = time.monotonic() + START_S
        with self._changed:
            while not any(text in line for line in self.lines):
                assert "" not in self.lines, "".join(self.lines)
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"no line with {text!r}: {''.join(self.lines)}"
                self._changed.wait(remaining)

    def wait_caught(self) -> None:
        """Until the process catches SIGTERM or SIGHUP (its own code runs)."""
        deadline = time.monotonic() + START_S
        while not _caught(self.process.pid) & CAUGHT:
            assert self.process.poll() is None, self.process.returncode
            assert time.monotonic() < deadline
            time.sleep(0.0002)

    def stop_and_wait(self, stop_signal: signal.Signals) -> tuple[int, str, str]:
        """Send ``stop_signal``; the exit code, stdout and stderr once it exited (within
        EXIT_WITHIN_S, else the test fails and the process is killed)."""
        self.process.send_signal(stop_signal)
        try:
            self.process.wait(EXIT_WITHIN_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"still running {EXIT_WITHIN_S} s after {stop_signal.name}")
        finally:
            assert self.process.stdout is not None
            out = self.process.stdout.read()
            self.process.stdout.close()
            self._reader.join(10)
            assert self.process.stderr is not None
            self.process.stderr.close()
        return self.process.returncode, out, "".join(self.lines)


def _wait_lock(data_dir: Path) -> None:
    deadline = time.monotonic() + START_S
    while not any(data_dir.rglob("LOCK")):
        assert time.monotonic() < deadline, "RocksDB never opened"
        time.sleep(0.0005)


def _starts_cleanly_again(args: list[str]) -> None:
    """The data directory opens again (no LOCK left held, nothing to repair): READY,
    then a SIGTERM stops it with 0."""
    process = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env()
    )
    assert process.stdout is not None
    try:
        first = process.stdout.readline()
        assert first.startswith("READY "), (first, process.stderr.read() if process.stderr else "")
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=EXIT_WITHIN_S * 2)
        assert process.returncode == 0, err
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _check_stopped(code: int, out: str, err: str, stop_signal: signal.Signals) -> None:
    assert code == 0, err
    assert "Traceback" not in err, err
    assert f"received {stop_signal.name}" in err, err


POINTS = ["own code runs", "first log line", "RocksDB opens"]


def _signal_at(started: _Started, point: str, data_dir: Path) -> None:
    if point == "own code runs":
        started.wait_caught()
    elif point == "first log line":
        started.wait_line(" INFO ")
    else:
        _wait_lock(data_dir)


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_a_single_node_stopped_early_exits_0_and_starts_again(
    tmp_path: Path, point: str, stop_signal: signal.Signals
) -> None:
    data_dir = tmp_path / "data"
    args = _command(data_dir, "--shards", "1")
    started = _Started(args)
    _signal_at(started, point, data_dir)
    code, out, err = started.stop_and_wait(stop_signal)
    _check_stopped(code, out, err, stop_signal)
    _starts_cleanly_again(args)


@pytest.mark.parametrize("point", ["own code runs", "RocksDB opens"])
def test_a_cluster_node_stopped_before_its_peers_answer_exits_0(tmp_path: Path, point: str) -> None:
    secret = tmp_path / "cluster.secret"
    generate_secret_file(str(secret))
    raft, absent_2, absent_3 = free_ports(3)
    data_dir = tmp_path / "node1"
    args = _command(
        data_dir,
        "--shards", "1", "--node-id", "1", "--raft-listen", f"127.0.0.1:{raft}",
        "--peers", f"1=127.0.0.1:{raft},2=127.0.0.1:{absent_2},3=127.0.0.1:{absent_3}",
        "--cluster-secret-file", str(secret),
    )  # fmt: skip
    started = _Started(args)
    _signal_at(started, point, data_dir)
    code, out, err = started.stop_and_wait(signal.SIGTERM)
    _check_stopped(code, out, err, signal.SIGTERM)
    _starts_cleanly_again(args)


def test_a_sharded_node_stopped_as_its_shards_start_stops_them_with_0(tmp_path: Path) -> None:
    """The supervisor forwards the SIGTERM to shards it has just started, before their
    Python has loaded anything: they take it once their own code runs."""
    data_dir = tmp_path / "data"
    args = _command(data_dir, "--shards", "2")
    started = _Started(args)
    started.wait_line("shard 1 started (pid")
    code, out, err = started.stop_and_wait(signal.SIGTERM)
    _check_stopped(code, out, err, signal.SIGTERM)
    last = [line for line in err.splitlines() if "its shards exited with" in line]
    assert last, err
    assert "-15" not in last[-1] and "-2" not in last[-1], last[-1]
    _starts_cleanly_again(args)
