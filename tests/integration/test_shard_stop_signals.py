"""Stopping a sharded node with one SIGTERM delivered twice stops it gracefully.

systemd's default ``KillMode=control-group`` sends SIGTERM to every process of the
unit (the supervisor and each shard process), and the supervisor then forwards its own
SIGTERM to each shard; ``timeout`` sends SIGTERM to its command and then to its process
group, so the supervisor gets it twice. Before, each shard took the second SIGTERM as
"send it again to force" (``received SIGTERM again: stopping now``: no leadership
hand-over, proposals in progress cut) and the supervisor took it as a second signal and
SIGKILLed its shards. A repeat within ``early_signals.REPEAT_SIGNAL_WINDOW_S`` of the
first is now the same request.

Real ``futureq start --shards 2`` processes on 127.0.0.1 (OS-chosen ports, a node
without peers).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_process import clean_env
from proc_table import children, shard_index

START_TIMEOUT_S = 60.0


def start_node(
    tmp_path: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], Path]:
    """``futureq start --shards 2`` on OS-chosen ports, once it printed READY."""
    stderr_path = tmp_path / "node.stderr.log"
    command = [
        sys.executable, "-m", "futureq.cli.server_main", "start", "--shards", "2",
        "--data-dir", str(tmp_path / "data"),
        "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
    ]  # fmt: skip
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**clean_env(), **(env or {})},
        )
    line: list[str] = []
    reader = threading.Thread(
        target=lambda: line.append(process.stdout.readline()),  # type: ignore[union-attr]
        daemon=True,
    )
    reader.start()
    reader.join(START_TIMEOUT_S)
    if not line or not line[0].startswith("READY "):
        process.kill()
        process.wait(30)
        raise RuntimeError(f"did not start; stderr:\n{stderr_path.read_text()[-4000:]}")
    return process, stderr_path


@contextlib.contextmanager
def kept_stopped(pid: int) -> Iterator[None]:
    """Keep ``pid`` stopped: SIGSTOP now and again every millisecond, so the SIGCONT
    the supervisor sends with its SIGTERM gives it no time to stop gracefully (a hung
    shard)."""
    done = threading.Event()

    def again() -> None:
        while not done.is_set():
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                return
            time.sleep(0.001)

    os.kill(pid, signal.SIGSTOP)
    thread = threading.Thread(target=again, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(10)


def stop(process: subprocess.Popen[str]) -> int:
    try:
        return process.wait(60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        if process.stdout is not None:
            process.stdout.close()


def assert_every_shard_stopped_gracefully(log: str) -> None:
    assert "stopping now" not in log, log[-4000:]
    assert "killing it" not in log, log[-4000:]
    # The supervisor says how the node ended, last; answering on the HTTP port meanwhile
    # is said once, not as if the node started listening anew.
    last = log.rstrip("\n").rsplit("\n", 1)[-1]
    assert "node 1 stopped with exit code 0; its shards exited with 0 (shard 0), 0 (shard 1)" in (
        last
    ), log[-4000:]
    stopping = log[log.index("received SIGTERM") :]
    assert "HTTP listening" not in stopping, stopping[-4000:]
    for shard in (0, 1):
        assert f"shard={shard} futureq.broker.server: stopped; RocksDB closed" in log, log[-4000:]


def wait_for_lines(path: Path, text: str, count: int, within_s: float = 10.0) -> None:
    """Until ``path`` holds ``count`` lines containing ``text``."""
    deadline = time.monotonic() + within_s
    while path.read_text().count(text) < count:
        assert time.monotonic() < deadline, path.read_text()[-4000:]
        time.sleep(0.002)


def test_sigterm_to_the_supervisor_and_every_shard_stops_gracefully(tmp_path: Path) -> None:
    """As systemd stops a unit: one SIGTERM to each process of the node, so each shard
    gets its own and the supervisor's. Sent all at once, a shard may take the two as one
    (signals of one kind pending together are delivered once), so the shards' own are
    sent once each shard has taken the supervisor's: the order in which they are two."""
    process, stderr_path = start_node(tmp_path)
    try:
        shards = children(process.pid)
        assert len(shards) == 2, shards
        os.kill(process.pid, signal.SIGTERM)
        wait_for_lines(stderr_path, "received SIGTERM: shutting down gracefully", 2)
        for pid in shards:
            os.kill(pid, signal.SIGTERM)
    finally:
        code = stop(process)
    log = stderr_path.read_text()
    assert code == 0, log[-4000:]
    assert_every_shard_stopped_gracefully(log)
    assert "again within 1 s of the first: the same request" in log, log[-4000:]


def test_sigterm_twice_at_once_to_the_supervisor_stops_gracefully(tmp_path: Path) -> None:
    """As ``timeout`` stops its command: SIGTERM to it, then to its process group."""
    process, stderr_path = start_node(tmp_path)
    try:
        os.kill(process.pid, signal.SIGTERM)
        os.kill(process.pid, signal.SIGTERM)
    finally:
        code = stop(process)
    log = stderr_path.read_text()
    assert code == 0, log[-4000:]
    assert_every_shard_stopped_gracefully(log)


def test_a_second_sigterm_after_the_window_forces_the_stop_with_exit_code_5(
    tmp_path: Path,
) -> None:
    """One shard is kept stopped (hung), so the node's graceful stop waits for it; a second
    SIGTERM 1.3 s after the first kills it, and the node says so in its exit code (it
    said 0, the code of a graceful stop)."""
    process, stderr_path = start_node(tmp_path)
    stopped = children(process.pid)[0]
    with kept_stopped(stopped):
        try:
            os.kill(process.pid, signal.SIGTERM)
            time.sleep(1.3)
            os.kill(process.pid, signal.SIGTERM)
        finally:
            code = stop(process)
    log = stderr_path.read_text()
    assert code == 5, log[-4000:]
    assert "is still running after a second SIGTERM: killing it" in log, log[-4000:]


@pytest.mark.slow
def test_a_shard_killed_after_the_grace_period_makes_exit_code_5(tmp_path: Path) -> None:
    """One shard is kept stopped (hung), so it cannot stop gracefully; after
    ``server.shutdown_grace_ms`` + 5 s the supervisor kills it, and the node's exit code
    says the stop was not graceful. Before, it exited 0, the code of a graceful stop."""
    process, stderr_path = start_node(tmp_path, {"FUTUREQ_SERVER_SHUTDOWN_GRACE_MS": "200"})
    stopped = children(process.pid)[0]
    with kept_stopped(stopped):
        try:
            os.kill(process.pid, signal.SIGTERM)
        finally:
            code = stop(process)
    log = stderr_path.read_text()
    assert code == 5, log[-4000:]
    assert f"(pid {stopped}) did not stop within the shutdown grace period: killing it" in log
    assert "node 1 stopped with exit code 5" in log, log[-4000:]


def test_sigterm_with_a_shard_stopped_stops_it_gracefully(tmp_path: Path) -> None:
    """A shard stopped with SIGSTOP (an operator's pause) when the node gets SIGTERM is
    continued with it and stops gracefully, as systemd continues the processes it stops.
    Before, the stopped shard never saw the SIGTERM and was SIGKILLed after
    ``server.shutdown_grace_ms`` + 5 s."""
    process, stderr_path = start_node(tmp_path)
    stopped = children(process.pid)[1]
    try:
        os.kill(stopped, signal.SIGSTOP)
        time.sleep(0.2)  # the stop has landed
        os.kill(process.pid, signal.SIGTERM)
    finally:
        code = stop(process)
    log = stderr_path.read_text()
    assert code == 0, log[-4000:]
    assert_every_shard_stopped_gracefully(log)


def test_sigterm_with_shard_0_stopped_keeps_the_supervisor_answering(tmp_path: Path) -> None:
    """Shard 0 stopped (SIGSTOP) is silent, so the supervisor answers on the node's HTTP
    port; SIGTERM continues it to stop gracefully, and its heartbeats come again while
    it shuts down: the supervisor keeps answering (shard 0 "is stopping"), rather than
    handing the port back to a shard that is closing it and taking it again once that
    shard exited."""
    process, stderr_path = start_node(tmp_path)
    stopped = next(pid for pid in children(process.pid) if shard_index(pid) == 0)
    try:
        os.kill(stopped, signal.SIGSTOP)
        wait_for_lines(stderr_path, f"shard 0 (pid {stopped}) has given no sign of life", 1)
        os.kill(process.pid, signal.SIGTERM)
    finally:
        code = stop(process)
    log = stderr_path.read_text()
    assert code == 0, log[-4000:]
    assert_every_shard_stopped_gracefully(log)
    stopping = log[log.index("received SIGTERM") :]
    assert "the supervisor answers on the node's HTTP port" not in stopping, stopping
