"""Every way an HTTP connection ends gives its slot back and closes its socket at once.

Found by trying the port as a hostile client would: 32 POSTs of ``/healthz`` with a
5-byte body, each closed by its client after reading the 405, held the 32 slots of
their address for good (hypercorn's task for each waited to hand the unread body to
an application that had returned), so ``/healthz`` from that address got 503 from
then on, and four addresses filled the whole port. Connections their client had
closed also kept their slot until the idle timeout (CLOSE-WAIT). These tests open
real sockets on 127.0.0.1 against :func:`serve_http` with a small cap and an idle
timeout far longer than any wait here, so only the end of a connection can free a slot.
"""

from __future__ import annotations

import socket
import struct

import trio
from test_http_endpoints import FakeProvider, Response

from futureq.broker.http import HTTP_ADDRESS_SHARE, serve_http
from futureq.metrics import Metrics

MAX_CONNECTIONS = 8
PER_ADDRESS = MAX_CONNECTIONS // HTTP_ADDRESS_SHARE
IDLE_TIMEOUT_MS = 60_000
"""Longer than every test: a slot that comes back did so because its connection ended."""
CLOSED_WITHIN_S = 5.0
"""How long the server may take to close a connection it is done with (far less in practice)."""

GET_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


async def _start(nursery: trio.Nursery, idle_timeout_ms: int = IDLE_TIMEOUT_MS) -> str:
    address: str = await nursery.start(
        lambda task_status: serve_http(
            "127.0.0.1:0",
            Metrics(),
            FakeProvider(),
            max_connections=MAX_CONNECTIONS,
            idle_timeout_ms=idle_timeout_ms,
            task_status=task_status,
        )
    )
    return address


async def _connect(address: str) -> trio.SocketStream:
    host, _, port = address.rpartition(":")
    return await trio.open_tcp_stream(host, int(port))


async def _read_to_close(stream: trio.SocketStream) -> bytes | None:
    """What the server sent until it closed the connection, or None if it had not
    closed it within :data:`CLOSED_WITHIN_S`."""
    chunks = []
    with trio.move_on_after(CLOSED_WITHIN_S):
        try:
            while chunk := await stream.receive_some():
                chunks.append(chunk)
        except trio.BrokenResourceError:  # reset after its answer: closed too
            pass
        return b"".join(chunks)
    return None


async def _exchange(address: str, request: bytes) -> bytes | None:
    stream = await _connect(address)
    async with stream:
        await stream.send_all(request)
        return await _read_to_close(stream)


async def _served_soon(address: str) -> Response:
    """GET /healthz, retried while refused for lack of room for up to CLOSED_WITHIN_S
    (the server learns of a closed connection an instant after its client closed it)."""
    with trio.move_on_after(CLOSED_WITHIN_S):
        while True:
            raw = await _exchange(address, GET_HEALTHZ)
            assert raw is not None, "the server kept a Connection: close socket open"
            response = Response(raw)
            if "futureq-refused" not in response.headers:
                return response
            await trio.sleep(0.05)
    raise AssertionError(f"{address} still refuses this address after {CLOSED_WITHIN_S} s")


async def test_posts_with_a_body_are_answered_405_closed_and_give_their_slot_back() -> None:
    async with trio.open_nursery() as nursery:
        address = await _start(nursery)
        for _ in range(PER_ADDRESS * 3):
            # As the tester did: a 5-byte body, the client reads the answer and closes.
            stream = await _connect(address)
            await stream.send_all(
                b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
            )
            head = await stream.receive_some()
            await stream.aclose()
            assert head.startswith(b"HTTP/1.1 405"), head
        # The body is refused unread, and the connection is closed by the server.
        raw = await _exchange(
            address, b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n"
        )
        assert raw is not None, "the server kept a connection open waiting for its body"
        response = Response(raw)
        assert response.status == 405
        assert response.headers["connection"] == "close"
        assert response.headers["allow"] == "GET, HEAD"
        raw = await _exchange(
            address, b"PUT /api/status HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        assert raw is not None and Response(raw).status == 405
        # Every slot came back: a plain GET from the same address is served.
        response = await _served_soon(address)
        assert (response.status, response.body) == (200, b"ok\n")
        nursery.cancel_scope.cancel()


async def test_a_get_with_a_body_is_answered_405_and_closed() -> None:
    async with trio.open_nursery() as nursery:
        address = await _start(nursery)
        for _ in range(PER_ADDRESS + 1):
            raw = await _exchange(
                address,
                b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                b"Connection: close\r\n\r\nhello",
            )
            assert raw is not None, "the server kept the socket open after its answer"
            response = Response(raw)
            assert response.status == 405, raw
            assert b"body" in response.body
        # A GET with an empty body (Content-Length: 0) is an ordinary GET.
        raw = await _exchange(
            address,
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        assert raw is not None and Response(raw).status == 200
        assert (await _served_soon(address)).status == 200
        nursery.cancel_scope.cancel()


async def _keep_alive_get(address: str, *, reset: bool) -> None:
    """A keep-alive GET whose client closes (or resets) the connection after the answer."""
    stream = await _connect(address)
    await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    raw = b""
    while b"ok\n" not in raw:
        chunk = await stream.receive_some()
        assert chunk, raw
        raw += chunk
    assert Response(raw).status == 200, raw
    if reset:  # close with RST, not FIN
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await stream.aclose()


async def test_connections_their_client_closed_give_their_slot_back_at_once() -> None:
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            address = await _start(nursery)
            for number in range(PER_ADDRESS * 4):
                await _served_soon(address)  # before the fix: refused after PER_ADDRESS
                await _keep_alive_get(address, reset=number % 2 == 1)
            nursery.cancel_scope.cancel()


async def test_an_idle_connection_closed_by_the_server_gives_its_slot_back() -> None:
    async with trio.open_nursery() as nursery:
        address = await _start(nursery, idle_timeout_ms=200)
        idle = [await _connect(address) for _ in range(PER_ADDRESS)]
        for stream in idle:  # closed by the server after 0.2 s; the client never closes
            assert await _read_to_close(stream) == b""
        assert (await _served_soon(address)).status == 200
        for stream in idle:
            await stream.aclose()
        nursery.cancel_scope.cancel()
