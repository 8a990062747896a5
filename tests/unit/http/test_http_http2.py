"""The HTTP port speaks HTTP/1.1 only: an ``h2c`` upgrade is ignored and the HTTP/2
preface is refused, so no connection leaves the port's screening.

Found by a tester: ``GET / HTTP/1.1`` with ``Connection: Upgrade, HTTP2-Settings``,
``Upgrade: h2c`` and ``HTTP2-Settings`` got ``101`` and the connection became
hypercorn's own HTTP/2 (``/ws`` too), out of the screening of requests and with up to
100 requests at once on one connection; a client opening with the HTTP/2 preface (prior
knowledge) was served HTTP/2 the same way. These tests open real sockets on 127.0.0.1
against :func:`serve_http`.
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.errors
import h2.events
import trio
from test_http_connection_end import (
    PER_ADDRESS,
    _connect,
    _exchange,
    _read_to_close,
    _served_soon,
    _start,
)
from test_http_endpoints import Response
from test_http_upgrade_body import _start_with_ws

H2C = (
    b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
    b"HTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n"
)


async def test_an_h2c_upgrade_is_answered_over_http_1_1_and_the_connection_stays_1_1() -> None:
    async with trio.open_nursery() as nursery:
        address = await _start(nursery)
        stream = await _connect(address)
        async with stream:
            await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + H2C + b"\r\n")
            raw = b""
            with trio.fail_after(5):
                while b"ok\n" not in raw:
                    chunk = await stream.receive_some()
                    assert chunk, raw
                    raw += chunk
            assert raw.startswith(b"HTTP/1.1 200 "), raw  # before the fix: 101, then HTTP/2
            assert "upgrade" not in Response(raw).headers
            # Still HTTP/1.1: the next request on the connection is answered in it.
            await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            raw = await _read_to_close(stream)
            assert raw is not None and raw.startswith(b"HTTP/1.1 200 "), raw
        # A body sent with the upgrade is refused as every body is.
        raw = await _exchange(
            address,
            b"POST /healthz HTTP/1.1\r\nHost: x\r\n" + H2C + b"Content-Length: 5\r\n\r\nhello",
        )
        assert raw is not None and raw.startswith(b"HTTP/1.1 405 "), raw
        nursery.cancel_scope.cancel()


async def test_ws_with_an_h2c_upgrade_is_a_plain_get_answered_426() -> None:
    async with trio.open_nursery() as nursery:
        address = await _start_with_ws(nursery)
        raw = await _exchange(
            address, b"GET /ws HTTP/1.1\r\nHost: x\r\n" + H2C + b"Connection: close\r\n\r\n"
        )
        assert raw is not None and raw.startswith(b"HTTP/1.1 426 "), raw
        assert Response(raw).headers["upgrade"] == "websocket"
        nursery.cancel_scope.cancel()


async def _open_with_http2_preface(address: str) -> list[h2.events.Event]:
    """An HTTP/2 client with prior knowledge: its preface and two requests (one with a
    body); what the server answered until it closed the connection."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    request = [(":method", "GET"), (":path", "/healthz"), (":scheme", "http"), (":authority", "x")]
    client.send_headers(1, request, end_stream=True)
    client.send_headers(3, [*request, ("content-length", "5")])
    client.send_data(3, b"hello", end_stream=True)
    stream = await _connect(address)
    async with stream:
        await stream.send_all(client.data_to_send())
        raw = await _read_to_close(stream)
    assert raw is not None, "the server kept an HTTP/2 connection open"
    return client.receive_data(raw)


async def test_the_http2_preface_is_refused_with_http_1_1_required_and_frees_its_slot() -> None:
    async with trio.open_nursery() as nursery:
        address = await _start(nursery)
        for _ in range(PER_ADDRESS * 2):
            events = await _open_with_http2_preface(address)
            # Before the fix: both streams answered over HTTP/2 and the connection kept.
            assert not [e for e in events if isinstance(e, h2.events.ResponseReceived)]
            (goaway,) = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
            assert goaway.error_code == h2.errors.ErrorCodes.HTTP_1_1_REQUIRED
            assert goaway.last_stream_id == 0
            assert goaway.additional_data is not None
            assert b"HTTP/1.1 only" in goaway.additional_data
        # Every refused connection gave its slot back, and the port serves on.
        assert (await _served_soon(address)).status == 200
        nursery.cancel_scope.cancel()
