"""A WebSocket upgrade with a body is answered 405, and nothing a connection does stops
the HTTP server.

Found by a tester: ``GET /ws`` with the usual Upgrade headers plus ``Content-Length: 5``
and ``hello`` got hypercorn's 400 while the application accepted the upgrade; h11
refused the 101 ("Received server _SWITCH_UPGRADE event without a pending proposal"),
the error left the connection's task and cancelled the server's nursery, and the whole
node stopped. The same upgrade announcing a body it never sent was accepted (101), and
``Expect: 100-continue`` with a body got ``100 Continue`` before its 405. These tests
open real sockets on 127.0.0.1 against :func:`serve_http` with a ``/ws`` handler.
"""

from __future__ import annotations

import logging

import pytest
import trio
from test_http_connection_end import _connect, _exchange, _read_to_close, _start
from test_http_endpoints import FakeProvider, Response

from futureq.broker.http import serve_http
from futureq.metrics import Metrics

UPGRADE = (
    b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)
GET_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"

WITH_A_BODY = {
    "content-length and its body": UPGRADE + b"Content-Length: 5\r\n\r\nhello",
    "content-length, body not sent": UPGRADE + b"Content-Length: 5\r\n\r\n",
    "chunked, empty": UPGRADE + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "chunked with a chunk": UPGRADE + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "after a keep-alive GET": b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    + UPGRADE
    + b"Content-Length: 5\r\n\r\nhello",
}


async def _never_served(stream: trio.abc.Stream, peer: str, token: str | None) -> None:
    raise AssertionError("an upgrade with a body must not reach the WebSocket handler")


async def _start_with_ws(nursery: trio.Nursery) -> str:
    address: str = await nursery.start(
        lambda task_status: serve_http(
            "127.0.0.1:0",
            Metrics(),
            FakeProvider(),
            websocket_handler=_never_served,
            max_connections=8,
            idle_timeout_ms=60_000,
            task_status=task_status,
        )
    )
    return address


def _last_response(raw: bytes) -> Response:
    """The last answer on a connection (after a keep-alive 200, the one that matters)."""
    at = raw.rfind(b"HTTP/1.1 ")
    return Response(raw[at:])


@pytest.mark.parametrize("request_bytes", WITH_A_BODY.values(), ids=WITH_A_BODY.keys())
async def test_an_upgrade_with_a_body_is_answered_405_and_the_node_keeps_serving(
    request_bytes: bytes,
) -> None:
    async with trio.open_nursery() as nursery:
        address = await _start_with_ws(nursery)
        for _ in range(3):
            stream = await _connect(address)
            async with stream:
                await stream.send_all(request_bytes)
                raw = await _read_to_close(stream)
            assert raw is not None, "the server kept the connection open after refusing it"
            assert b" 101 " not in raw, raw
            response = _last_response(raw)
            assert response.status == 405, raw
            assert response.headers["connection"] == "close"
            assert response.headers["allow"] == "GET, HEAD"
            # The server is still there: the next connection is served.
            raw = await _exchange(address, GET_HEALTHZ)
            assert raw is not None and Response(raw).status == 200, raw
        nursery.cancel_scope.cancel()


async def test_a_body_expecting_100_continue_gets_405_without_100() -> None:
    async with trio.open_nursery() as nursery:
        address = await _start(nursery)
        for request_bytes in (
            b"POST /healthz HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            b"Content-Length: 5\r\n\r\n",
            UPGRADE + b"Expect: 100-continue\r\nContent-Length: 5\r\n\r\n",
        ):
            raw = await _exchange(address, request_bytes)
            assert raw is not None, "the server waited for the body instead of refusing it"
            assert raw.startswith(b"HTTP/1.1 405"), raw
            assert Response(raw).headers["connection"] == "close"
        nursery.cancel_scope.cancel()


async def test_an_error_serving_one_connection_stays_with_that_connection(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Whatever hypercorn or the application raises while serving one connection ends
    # that connection, is logged, and leaves the server serving the next.
    class Boom(Exception):
        pass

    async def boom(*args: object, **kwargs: object) -> None:
        raise Boom("a bug in one connection's handling")

    caplog.set_level(logging.DEBUG, logger="futureq.broker.http")
    async with trio.open_nursery() as nursery:
        address = await _start(nursery)
        with monkeypatch.context() as patched:
            # The TCP server of hypercorn itself failing, as h11 did on the upgrade.
            patched.setattr("hypercorn.trio.tcp_server.TCPServer.run", boom)
            for _ in range(3):
                raw = await _exchange(address, GET_HEALTHZ)
                assert raw is not None
        raw = await _exchange(address, GET_HEALTHZ)
        assert raw is not None and Response(raw).status == 200, raw
        nursery.cancel_scope.cancel()
    failures = [r for r in caplog.records if "failed and was closed" in r.getMessage()]
    assert failures and all(r.levelno == logging.WARNING for r in failures)
    assert "Boom" in failures[0].getMessage()
