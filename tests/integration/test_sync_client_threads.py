"""SyncClient across threads, processes and event loops, against a real broker.

``docs/client.md``, "The synchronous client": one SyncClient serves any thread of the
process that opened it, a thread running trio or asyncio included (the call blocks
that loop); ``close()`` from another thread makes calls in progress raise
``ClientClosedError``; a child forked after it was opened gets a clear error at once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from typing import Protocol

import pytest
import trio

from futureq.client.subscription import Delivery
from futureq.client.sync import SyncClient
from futureq.errors import ClientClosedError

CHILD_WAIT_S = 20.0
"""How long the parent waits for the forked child (s); the child hung for ever before."""
JOIN_S = 20.0
"""How long a test waits for a blocked call's thread to end (s), far below the call's
own timeout, so a call that ignored close() shows as a failure, not a slow pass."""


class BrokerProcess(Protocol):
    """What these tests use of the ``broker`` fixture (tests/integration/conftest.py)."""

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


def test_a_forked_child_gets_a_clear_error_and_the_parent_keeps_working(
    broker: BrokerProcess,
) -> None:
    read_end, write_end = os.pipe()
    with SyncClient(broker.client_address, request_timeout_s=3.0) as client:
        client.publish("fork", b"before")
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            try:
                os.close(read_end)
                try:
                    client.publish("fork", b"child")
                    report = "returned"
                except ClientClosedError as exc:
                    report = f"ClientClosedError: {exc}"
                except BaseException as exc:
                    report = f"{type(exc).__name__}: {exc}"
                client.close()  # harmless in the child
                os.write(write_end, report.encode())
            finally:
                os._exit(0)
        os.close(write_end)
        exit_code = _wait_child(pid)
        with os.fdopen(read_end, "rb") as pipe:
            report = pipe.read().decode()
        assert exit_code == 0, f"the child hung (killed after {CHILD_WAIT_S} s)"
        assert report.startswith("ClientClosedError: "), report
        assert "fork" in report and "new SyncClient in the child" in report
        assert client.publish("fork", b"parent") > 0  # the parent is unaffected
        got = client.consume("fork", "g", count=2, timeout_s=5.0)
        assert sorted(d.payload for d in got) == [b"before", b"parent"]


def test_a_sync_client_made_before_fork_but_never_opened_works_in_the_child(
    broker: BrokerProcess,
) -> None:
    client = SyncClient(broker.client_address, request_timeout_s=5.0)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - reported through the exit code
        code = 1
        try:
            client.publish("fork-late", b"child")
            client.close()
            code = 0
        finally:
            os._exit(code)
    assert _wait_child(pid) == 0
    try:
        assert [d.payload for d in client.consume("fork-late", "g", timeout_s=5.0)] == [b"child"]
    finally:
        client.close()


def test_sync_calls_from_a_trio_task_block_it_and_work(broker: BrokerProcess) -> None:
    async def inside_trio(client: SyncClient) -> tuple[int, int]:
        first = client.publish("in-trio", b"shared client")
        with SyncClient(broker.client_address, request_timeout_s=20.0) as made_inside:
            second = made_inside.publish("in-trio", b"made inside trio")
        return first, second

    async def inside_asyncio(client: SyncClient) -> int:
        return client.publish("in-trio", b"from asyncio")

    with SyncClient(broker.client_address, request_timeout_s=20.0) as client:
        first, second = trio.run(inside_trio, client)
        third = asyncio.run(inside_asyncio(client))
        assert first < second < third
        got = client.consume("in-trio", "g", count=3, timeout_s=5.0)
        assert [d.id for d in got] == [first, second, third]


def test_a_bad_sync_nack_or_extend_argument_raises_at_the_call(broker: BrokerProcess) -> None:
    # docs/client.md, "Argument ranges": it went out to the server (RequestError) or
    # failed on ``<`` (a str); now TypeError at the call, and the delivery is kept.
    with SyncClient(broker.client_address, request_timeout_s=20.0) as client:
        client.publish("bad-args", b"x")
        (held,) = client.consume("bad-args", "g", count=1, timeout_s=5.0)
        for value in (True, 1.5, "5", float("nan")):
            with pytest.raises(TypeError, match="requeue_delay_ms"):
                held.nack(value)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="visibility_ms"):
                held.extend(value)  # type: ignore[arg-type]
        held.ack()
        assert held.settled


def test_close_from_another_thread_makes_a_blocked_consume_raise(
    broker: BrokerProcess,
) -> None:
    client = SyncClient(broker.client_address, request_timeout_s=20.0)
    client.publish("close-race", b"warm up")  # connected
    outcome: list[object] = []
    started = threading.Event()

    def consume_nothing() -> None:
        started.set()
        try:
            outcome.append(client.consume("close-race-empty", "g", count=5, timeout_s=300.0))
        except BaseException as exc:
            outcome.append(exc)

    consumer = threading.Thread(target=consume_nothing)
    consumer.start()
    started.wait()
    # Wait until the consume holds its subscription, so close() meets it mid-call.
    while "close-race-empty" not in str(client.status(local=True)):
        time.sleep(0.05)  # polling the server; not a timing assertion
    client.close()
    consumer.join(JOIN_S)
    assert not consumer.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], ClientClosedError), outcome
    assert "closed while this call was in progress" in str(outcome[0])


def test_close_from_another_thread_ends_a_publishing_loop_with_client_closed(
    broker: BrokerProcess,
) -> None:
    client = SyncClient(broker.client_address, request_timeout_s=20.0)
    published: list[int] = []
    errors: list[BaseException] = []

    def publish_for_ever() -> None:
        try:
            while True:
                published.append(client.publish("close-loop", b"x"))
        except BaseException as exc:
            errors.append(exc)

    publisher = threading.Thread(target=publish_for_ever)
    publisher.start()
    while len(published) < 20:
        time.sleep(0.01)  # waiting for the loop to run; not a timing assertion
    client.close()
    publisher.join(JOIN_S)
    assert not publisher.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ClientClosedError), errors


def test_an_ack_after_close_from_another_thread_raises_client_closed(
    broker: BrokerProcess,
) -> None:
    client = SyncClient(broker.client_address, request_timeout_s=20.0)
    client.publish("close-ack", b"x")
    (delivery,) = client.consume("close-ack", "g", count=1, timeout_s=5.0)
    assert isinstance(delivery.delivery, Delivery)
    closer = threading.Thread(target=client.close)
    closer.start()
    closer.join(JOIN_S)
    with pytest.raises(ClientClosedError):
        delivery.ack()


@pytest.mark.parametrize("first_call", ["open", "publish"])
def test_close_from_another_thread_cuts_a_slow_connect_short(first_call: str) -> None:
    """Found by a tester: a SyncClient whose first call was still connecting (a server
    that accepts and never answers) ignored close() from another thread: close()
    waited the whole connect_timeout_s (29 s of 30), and the call then raised
    ConnectionLostError, not ClientClosedError."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        client = SyncClient(address, connect_timeout_s=60.0, request_timeout_s=60.0)
        outcome: list[BaseException] = []

        def call() -> None:
            try:
                client.open() if first_call == "open" else client.publish("t", b"x")
            except BaseException as exc:  # noqa: BLE001 - what the call raised, asserted below
                outcome.append(exc)

        worker = threading.Thread(target=call)
        worker.start()
        silent.settimeout(JOIN_S)
        accepted, _ = silent.accept()  # the client connected and waits for HELLO_OK
        started = time.monotonic()
        client.close()
        worker.join(JOIN_S)
        assert not worker.is_alive(), "the call ignored close()"
        assert time.monotonic() - started < 5.0
        assert len(outcome) == 1 and isinstance(outcome[0], ClientClosedError), outcome
        assert "while this call was connecting" in str(outcome[0])
        with pytest.raises(ClientClosedError):
            client.ping()
        accepted.close()
    assert not [t for t in threading.enumerate() if t.name == "futureq-sync"]
