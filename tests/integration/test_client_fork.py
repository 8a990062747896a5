"""The async Client in a process forked from the one that opened it fails at once with
``ClientClosedError`` saying what to do, as ``SyncClient`` does
(``test_sync_client_threads.py``), and the parent's connection is left alone.

Found by a tester: a Client handed to a forked child (``multiprocessing`` with the
fork start method, a pre-forking server) has a copy of the connection's socket and
none of the tasks serving it: a call waited until its deadline, or wrote into the
parent's connection. A real broker; every test runs under asyncio and trio.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from typing import Protocol

import anyio
import pytest
from tests.backends import on_both_backends

from futureq.client import open_client
from futureq.errors import ClientClosedError

pytestmark = pytest.mark.skipif(
    sys.platform == "win32" or not hasattr(os, "fork"), reason="needs os.fork (POSIX)"
)

CHILD_WAIT_S = 20.0
"""How long the parent waits for the forked child (s); a call that waited for its
deadline (30 s) shows as a failure."""


class BrokerProcess(Protocol):
    client_address: str


def _wait_child(pid: int) -> int:
    """The child's exit code; a child still running after CHILD_WAIT_S is killed (-1)."""
    deadline = time.monotonic() + CHILD_WAIT_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)  # polling a child process; not a timing assertion
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -1


@on_both_backends
async def test_a_forked_child_gets_a_clear_error_and_the_parent_keeps_working(
    broker: BrokerProcess,
) -> None:
    async with open_client(broker.client_address, request_timeout_s=30.0) as client:
        await client.publish("fork", b"before")
        async with client.subscribe("fork", "g", prefetch=1) as sub:
            delivery = await sub.receive(timeout_s=10.0)
            assert delivery is not None and delivery.payload == b"before"
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child reports through the pipe
                try:
                    os.close(read_end)
                    reports: list[str] = []

                    async def attempt() -> None:
                        # The child's own event loop, in a thread of its own: what a
                        # multiprocessing worker or a pre-forked server does.
                        calls = {
                            "publish": lambda: client.publish("fork", b"child"),
                            "status": client.status,
                            "ack": delivery.ack,
                            "receive": lambda: sub.receive(timeout_s=1.0),
                        }
                        for name, call in calls.items():
                            started = time.monotonic()
                            try:
                                await call()
                                reports.append(f"{name}: returned")
                            except ClientClosedError as exc:
                                took = time.monotonic() - started
                                reports.append(f"{name}: ClientClosedError {took:.1f} s: {exc}")
                            except BaseException as exc:
                                reports.append(f"{name}: {type(exc).__name__}: {exc}")

                    thread = threading.Thread(target=lambda: asyncio.run(attempt()))
                    thread.start()
                    thread.join(CHILD_WAIT_S)
                    os.write(write_end, "\n".join(reports).encode())
                finally:
                    os._exit(0)
            os.close(write_end)
            exit_code = await anyio.to_thread.run_sync(_wait_child, pid)
            with os.fdopen(read_end, "rb") as pipe:
                lines = pipe.read().decode().splitlines()
            assert exit_code == 0, f"the child hung (killed after {CHILD_WAIT_S} s)"
            assert len(lines) == 4, lines
            for line in lines:
                assert ": ClientClosedError 0.0 s: this Client was opened in process" in line, line
                assert "open a new client with open_client() in the child" in line, line
            # The parent is unaffected: its delivery, its connection, its subscription.
            await delivery.ack()
            await client.publish("fork", b"parent")
            again = await sub.receive(timeout_s=10.0)
            assert again is not None and again.payload == b"parent"
            await again.ack()
        status = await client.status()
        [group] = [g for t in status["topics"] if t["topic"] == "fork" for g in t["groups"]]
        assert group["pending"] == 0  # nothing of the child's was published
