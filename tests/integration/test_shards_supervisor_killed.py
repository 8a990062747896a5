"""A sharded node's supervisor SIGKILLed while its shards start leaves no shard behind.

Issue 15: "a shard that dies is restarted or takes the node down with a clear message,
never left half-up". The shards checked for their supervisor only once they served,
against the parent they had then: a supervisor killed while they started had made init
their parent already, so they never noticed. They ran on, holding their ports and
RocksDB, until printing READY to the dead supervisor's pipe ended them with ``ERROR
Broken pipe`` (or for good when they waited before READY). Real ``futureq start``
processes on 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from proc_table import alive, children, shard_index
from test_shards import ShardedNode

EXIT_DEADLINE_S = 20.0


def _exec_shards(supervisor: int, count: int, within_s: float = 20.0) -> list[int]:
    """PIDs of the supervisor's ``count`` shard processes once each runs ``futureq start
    --shard-index K`` (exec'd, not only forked), polled closely."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        shards = [pid for pid in children(supervisor) if shard_index(pid) is not None]
        if len(shards) == count:
            return shards
        time.sleep(0.005)
    raise AssertionError(f"the supervisor did not start {count} shards within {within_s} s")


def test_a_supervisor_killed_while_its_shards_start_leaves_none_running(
    tmp_path: Path,
) -> None:
    """Before: every shard ran on to its READY line and died of ``Broken pipe`` there
    (not a graceful stop, and never while it waited before READY); now each notices its
    supervisor is gone, stops without serving, and the node starts again at once."""
    node = ShardedNode(tmp_path / "data")
    args = [
        sys.executable,
        "-m",
        "futureq.cli.server_main",
        "start",
        "--data-dir",
        str(node.data_dir),
        "--shards",
        "2",
        *node._port_args,
    ]
    env = {**os.environ, **(node.env or {})}
    with open(node.stderr_path, "a") as stderr:
        supervisor = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=stderr, env=env, text=True
        )
    shards: list[int] = []
    try:
        shards = _exec_shards(supervisor.pid, 2)
        supervisor.kill()  # while the shards are still importing and opening RocksDB
        supervisor.wait(10)
        assert supervisor.stdout is not None
        assert supervisor.stdout.read() == ""  # it never said READY
        deadline = time.monotonic() + EXIT_DEADLINE_S
        while any(alive(pid) for pid in shards) and time.monotonic() < deadline:
            time.sleep(0.05)
        still = [pid for pid in shards if alive(pid)]
        assert not still, f"shards {still} outlived their killed supervisor"
        log = node.stderr_text()
        assert log.count("of this shard is gone: shutting down") == 2, log[-4000:]
        assert "Broken pipe" not in log, log[-4000:]
        # The same data directory and ports start at once: nothing is held.
        node.start()
        assert node.terminate() == 0
    finally:
        for pid in shards:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait(10)
        if supervisor.stdout is not None:
            supervisor.stdout.close()
        node.kill()


def test_a_stopped_shard_whose_supervisor_is_killed_stops_gracefully(tmp_path: Path) -> None:
    """A serving shard an operator stopped (SIGSTOP) when its supervisor is SIGKILLed:
    the kernel continues it (its process group is orphaned, with SIGHUP, a credentials
    reload to it) and it stops gracefully; the node then starts again."""
    node = ShardedNode(tmp_path / "data")
    pids: list[int] = []
    try:
        node.start()
        shards = [node.pid_of_shard(k) for k in range(2)]
        pids = [pid for pid in shards if pid is not None]
        assert len(pids) == 2
        os.kill(pids[1], signal.SIGSTOP)
        # Stopped for good before its supervisor dies: the kernel continues a stopped
        # process of a group its parent's death orphans only if it is stopped by then.
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pids[1]}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        node.kill()
        deadline = time.monotonic() + EXIT_DEADLINE_S
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(pid) for pid in pids)
        log = node.stderr_text()
        assert log.count("of this shard is gone: shutting down") == 2, log[-4000:]
        assert log.count("stopped; RocksDB closed") == 2
        node.start()
        assert node.terminate() == 0
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        node.kill()


def _processes_on(data_dir: Path) -> list[int]:
    """PIDs of live processes whose command line names ``data_dir``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(data_dir).encode() in cmdline and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def test_a_shard_process_that_cannot_be_started_stops_the_node_with_a_sentence(
    tmp_path: Path,
) -> None:
    """The supervisor runs out of descriptors starting its shards (a low ``ulimit -n``).
    Before: a traceback (an exception group from ``subprocess``), exit 1, and the shard
    it had started SIGKILLed as having "outlived its supervisor". Now: one sentence, the
    started shard stopped with SIGTERM, nothing left running. The limit at which the
    spawn (not RocksDB, not a socket) is what fails depends on the platform: a few are
    tried."""
    for limit in (18, 19, 17, 20, 16):
        data = tmp_path / f"data-{limit}"
        node = ShardedNode(data)
        node.open_files = limit
        try:
            try:
                node.start()
            except RuntimeError:
                pass
            else:
                raise AssertionError(f"the node started with an open-file limit of {limit}")
            assert node.process is not None
            log = node.stderr_text()
            if "cannot start a process for shard" not in log and "os.pipe()" not in log:
                continue  # something else ran out first at this limit
            assert node.process.returncode == 1, log[-3000:]
            assert "Traceback" not in log, log[-3000:]
            assert "outlived its supervisor" not in log
            assert "check the open-file and process limits); stopping the node" in log
            deadline = time.monotonic() + EXIT_DEADLINE_S
            while _processes_on(data) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not _processes_on(data)
            return
        finally:
            for pid in _processes_on(data):
                os.kill(pid, signal.SIGKILL)
            node.kill()
    raise AssertionError("no open-file limit tried made the start of a shard process fail")
