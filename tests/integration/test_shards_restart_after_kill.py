"""A start right after its supervisor was SIGKILLed waits for the old shards to stop.

Found by a tester (``/tmp/shardbreak/cl_sup_restart_rc.sh``): SIGKILL of the supervisor
then an immediate restart (a process manager with a short restart delay) failed 2
times in 10 with ``cannot listen for HTTP on ...: Address already in use``: the old
shard 0 still held the node's HTTP socket while it stopped itself. A port held by any
other process must still fail at once. Real ``futureq start`` processes.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from proc_table import alive
from test_shards import ShardedNode


def test_a_start_right_after_a_killed_supervisor_waits_for_its_stopping_shards(
    tmp_path: Path,
) -> None:
    """Before, the new start failed 2 times in 10 (``Address already in use``): the old
    shard 0 held the node's HTTP socket while it stopped itself. Its shards are paused
    here until the new start is under way, so it always meets them."""
    node = ShardedNode(tmp_path / "data")
    node.start()
    old = [node.pid_of_shard(k) for k in range(2)]
    assert None not in old
    pids = [pid for pid in old if pid is not None]
    again = ShardedNode(tmp_path / "data")
    again._port_args = list(node._port_args)
    failed: list[BaseException] = []

    def start_again() -> None:
        try:
            again.start()
        except BaseException as exc:  # reported by the test's thread
            failed.append(exc)

    try:
        # Paused once their supervisor is dead (paused before, the kernel would resume
        # them: their process groups became orphaned), still holding every port and
        # RocksDB, whether or not they noticed already.
        node.kill()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        starter = threading.Thread(target=start_again)
        starter.start()
        time.sleep(2.0)
        for pid in pids:
            os.kill(pid, signal.SIGCONT)  # they notice their supervisor is gone, and stop
        starter.join(60)
        assert not failed, failed
        log = again.stderr_text()
        assert "the previous run's shard processes of" in log, log[-3000:]
        assert "waiting up to" in log
        assert "Address already in use" not in log
        assert not any(alive(pid) for pid in pids)
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        if again.process is not None:
            again.terminate()
            again.kill()
        node.kill()


def test_a_port_held_by_another_process_still_fails_at_once(tmp_path: Path) -> None:
    node = ShardedNode(tmp_path / "data")
    http = int(node._port_args[3].rsplit(":", 1)[1])
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", http))
    holder.listen()
    try:
        began = time.monotonic()
        with pytest.raises(RuntimeError):
            node.start()
        assert node.process is not None
        assert node.process.wait(30) == 4
        assert time.monotonic() - began < 10
        log = node.stderr_text()
        assert f"cannot listen for HTTP on 127.0.0.1:{http}: Address already in use" in log
        assert "previous run's shard processes" not in log
    finally:
        holder.close()
        node.kill()


def test_a_second_node_on_a_running_nodes_data_fails_at_once(tmp_path: Path) -> None:
    """The shards holding the data still have their supervisor: another node, not a
    previous run stopping, so no wait (the first version of the wait above waited its
    whole bound, ~13 s, before saying so)."""
    node = ShardedNode(tmp_path / "data")
    node.start()
    second = ShardedNode(tmp_path / "data")  # its own free ports
    try:
        began = time.monotonic()
        with pytest.raises(RuntimeError):
            second.start()
        assert second.process is not None
        assert second.process.wait(30) == 1
        assert time.monotonic() - began < 8
        log = second.stderr_text()
        assert f"another node is running on {tmp_path / 'data'}" in log, log[-2000:]
        assert "waiting up to" not in log
        assert node.process is not None and node.process.poll() is None  # untouched
    finally:
        second.kill()
        node.terminate()
        node.kill()
