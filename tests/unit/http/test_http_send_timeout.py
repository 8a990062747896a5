"""A client that does not read the answer it asked for loses its connection after
``limits.send_timeout_ms``, its slot comes back, and it does not hold up the server's stop.

Found by a tester: a write to a client whose receive window stayed shut (a large
``/metrics`` or ``/api/status``: 214 KB of metrics at 400 topics) blocked for good, so
the connection held one of its address's slots for as long; a few such requests shut
the address out of the port (health probes included). Hypercorn shields its writes from
cancellation, so the HTTP server could not stop either (a node's graceful shutdown
waited for it until forced). Real sockets on 127.0.0.1 against :func:`serve_http`; the
non-reading client shrinks its receive buffer before connecting. The pytest timeouts
turn the old hang (which trio's own deadlines cannot break) into a failure.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
import trio
from test_http_connection_end import CLOSED_WITHIN_S, GET_HEALTHZ, MAX_CONNECTIONS, PER_ADDRESS
from test_http_endpoints import FakeProvider, Response

from futureq.broker.http import serve_http
from futureq.metrics import Metrics

SEND_TIMEOUT_MS = 500
BIG_STATUS = {"topics": [{"name": f"topic.{i}", "pending": i} for i in range(200_000)]}
"""An /api/status answer of several MB: more than the socket buffers hold."""


class BigProvider(FakeProvider):
    def status(self) -> dict[str, Any]:
        return BIG_STATUS


async def _start(nursery: trio.Nursery, send_timeout_ms: int = SEND_TIMEOUT_MS) -> str:
    address: str = await nursery.start(
        lambda task_status: serve_http(
            "127.0.0.1:0",
            Metrics(),
            BigProvider(),
            max_connections=MAX_CONNECTIONS,
            idle_timeout_ms=60_000,
            send_timeout_ms=send_timeout_ms,
            task_status=task_status,
        )
    )
    return address


async def _not_reading(address: str) -> trio.socket.SocketType:
    """A connection that asked for the big status and reads nothing."""
    host, _, port = address.rpartition(":")
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect((host, int(port)))
    await sock.send(b"GET /api/status HTTP/1.1\r\nHost: x\r\n\r\n")
    return sock


async def _healthz(address: str) -> Response:
    host, _, port = address.rpartition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(GET_HEALTHZ)
        chunks = []
        while chunk := await stream.receive_some():
            chunks.append(chunk)
    return Response(b"".join(chunks))


async def _closed_by_server(sock: trio.socket.SocketType) -> bool:
    """Read what was sent until the server's EOF or reset."""
    with trio.move_on_after(CLOSED_WITHIN_S):
        try:
            while await sock.recv(1 << 20):
                pass
        except ConnectionResetError:
            pass
        return True
    return False


@pytest.mark.timeout(60)
async def test_a_client_that_does_not_read_its_answer_gives_its_slot_back() -> None:
    with trio.fail_after(30):
        await _check_slots_come_back()


async def _check_slots_come_back() -> None:
    async with trio.open_nursery() as nursery:
        address = await _start(nursery)
        stuck = [await _not_reading(address) for _ in range(PER_ADDRESS)]
        await trio.sleep(0.2)
        # Every slot of this address is held by a write that cannot go on.
        assert (await _healthz(address)).status == 503
        await trio.sleep(SEND_TIMEOUT_MS / 1000 + 0.5)
        assert (await _healthz(address)).status == 200  # before: 503 for good
        for sock in stuck:
            assert await _closed_by_server(sock)
            sock.close()
        nursery.cancel_scope.cancel()


@pytest.mark.timeout(60)
async def test_a_write_to_a_client_that_does_not_read_does_not_hold_up_the_stop() -> None:
    with trio.fail_after(30):
        with trio.CancelScope() as server:
            async with trio.open_nursery() as nursery:
                address = await _start(nursery, send_timeout_ms=3_600_000)
                stuck = await _not_reading(address)
                await trio.sleep(0.3)  # the answer's write is blocked now
                server.cancel()  # the server stops (a node's shutdown)
        assert server.cancelled_caught  # before: never got here
        assert await _closed_by_server(stuck)
        stuck.close()
