"""Ctrl-C (KeyboardInterrupt) in the middle of a SyncClient call, against a real broker.

``docs/client.md``, "The synchronous client": a call whose thread stops waiting is
cancelled in the background thread, and deliveries a ``consume()`` had taken are
released (due again at once, not counted towards ``max_deliveries``). Before, the
interrupted consume ran on in the background and kept them handed to nobody: the next
consume found none, and with ``max_deliveries=1`` they went to the dead-letter topic
unread once their visibility timeout passed.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from typing import Protocol

import pytest

from futureq.client import PublishItem
from futureq.client.sync import SyncClient
from futureq.errors import NotSentError

WAIT_S = 15.0
"""Longest the helper thread waits for the consume to hold the messages (s)."""


class BrokerProcess(Protocol):
    """What these tests use of the ``broker`` fixture (tests/integration/conftest.py)."""

    client_address: str


def _interrupt_once_taken(client: SyncClient, key: tuple[str, str], count: int) -> None:
    """Raise KeyboardInterrupt in the main thread once the consume() of ``key`` has
    taken ``count`` deliveries and waits for more (as Ctrl-C would there)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        sub = client._subscriptions.get(key)
        if sub is not None and len(sub._fetched) >= count:
            break
        time.sleep(0.01)  # polling the client's state; not a timing assertion
    # A real SIGINT to the main thread, as Ctrl-C: _thread.interrupt_main() only sets
    # a flag, which does not wake a thread blocked waiting for the call.
    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)


def test_ctrl_c_in_consume_releases_what_it_had_taken(broker: BrokerProcess) -> None:
    topic, group = "interrupted", "workers"
    with SyncClient(broker.client_address, request_timeout_s=10.0) as client:
        client.create_group(topic, group, max_deliveries=1, visibility_timeout_ms=60_000)
        ids = client.publish_batch([PublishItem(topic, b"m%d" % i) for i in range(3)])
        helper = threading.Thread(
            target=_interrupt_once_taken, args=(client, (topic, group), 3), daemon=True
        )
        helper.start()
        with pytest.raises(KeyboardInterrupt):
            client.consume(topic, group, count=10, timeout_s=60.0)  # waits for more
        helper.join(WAIT_S)
        again = client.consume(topic, group, count=3, timeout_s=5.0)
        assert sorted(d.id for d in again) == sorted(ids), (
            "the messages the interrupted consume() had taken did not come back"
        )
        for delivery in again:
            delivery.ack()
        assert client.publish(topic, b"still serving") > 0


def test_ctrl_c_while_connecting_leaves_the_client_usable() -> None:
    """Before, Ctrl-C during the first call's connect left the background thread
    connecting, and every later call raised a bare AssertionError."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        host, port = listener.getsockname()
        address = f"{host}:{port}"
        accepted: list[socket.socket] = []

        def accept_then_interrupt() -> None:
            # The client's connection is accepted and never answered (no HELLO_OK):
            # interrupting now lands while open() waits for the connect.
            accepted.append(listener.accept()[0])
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

        helper = threading.Thread(target=accept_then_interrupt, daemon=True)
        helper.start()
        client = SyncClient(address, connect_timeout_s=1.0, request_timeout_s=2.0)
        try:
            with pytest.raises(KeyboardInterrupt):
                client.publish("t", b"x")
            helper.join(WAIT_S)
            with pytest.raises(NotSentError) as caught:
                client.publish("t", b"x")  # connects afresh, to the same silent server
            assert "could not connect" in str(caught.value)
        finally:
            client.close()
            for connection in accepted:
                connection.close()
