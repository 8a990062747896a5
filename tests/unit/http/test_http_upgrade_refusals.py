"""A WebSocket upgrade the node refuses is answered with a sentence saying what to fix,
and a broken handshake ends its connection at once.

Found by a tester: an upgrade without ``Sec-WebSocket-Key``, or with
``Sec-WebSocket-Version: 8``, got hypercorn's ``400`` with an empty body, and the
connection then stayed open (though the answer said ``connection: close``) until the
idle deadline; an upgrade from a foreign ``Origin``, on a path other than ``/ws`` or over
HTTP/2 got a ``403`` with an empty body. These tests open real sockets on 127.0.0.1
against :func:`serve_http` with a ``/ws`` handler.
"""

from __future__ import annotations

import pytest
import trio
from test_http_connection_end import _exchange
from test_http_endpoints import Response
from test_http_upgrade_body import GET_HEALTHZ, _start_with_ws

KEY = b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
UPGRADE_HEAD = b"Host: x\r\nUpgrade: websocket\r\n"

BROKEN_HANDSHAKES = {
    "no key": (
        b"GET /ws HTTP/1.1\r\n" + UPGRADE_HEAD + b"Connection: Upgrade\r\n"
        b"Sec-WebSocket-Version: 13\r\n\r\n",
        400,
        "Sec-WebSocket-Key",
    ),
    "version 8": (
        b"GET /ws HTTP/1.1\r\n"
        + UPGRADE_HEAD
        + b"Connection: Upgrade\r\n"
        + KEY
        + b"Sec-WebSocket-Version: 8\r\n\r\n",
        426,
        "Sec-WebSocket-Version: 13",
    ),
    "no version": (
        b"GET /ws HTTP/1.1\r\n"
        + UPGRADE_HEAD
        + b"Connection: keep-alive, Upgrade\r\n"
        + KEY
        + b"\r\n",
        426,
        "Sec-WebSocket-Version: 13",
    ),
    "HTTP/1.0": (
        b"GET /ws HTTP/1.0\r\n"
        + UPGRADE_HEAD
        + b"Connection: Upgrade\r\n"
        + KEY
        + b"Sec-WebSocket-Version: 13\r\n\r\n",
        400,
        "HTTP/1.1",
    ),
}

REFUSED_UPGRADES = {
    # Well-formed upgrades the application refuses; "close" in Connection lets the test
    # read to EOF (these answers keep the connection otherwise).
    "foreign origin": (
        b"GET /ws HTTP/1.1\r\n"
        + UPGRADE_HEAD
        + b"Connection: Upgrade, close\r\n"
        + KEY
        + b"Sec-WebSocket-Version: 13\r\nOrigin: https://evil.example\r\n\r\n",
        403,
        "server.websocket_origins",
    ),
    "another path": (
        b"GET /nowhere HTTP/1.1\r\n"
        + UPGRADE_HEAD
        + b"Connection: Upgrade, close\r\n"
        + KEY
        + b"Sec-WebSocket-Version: 13\r\n\r\n",
        403,
        "open one on /ws",
    ),
}


@pytest.mark.parametrize(
    ("request_bytes", "status", "says"),
    [*BROKEN_HANDSHAKES.values(), *REFUSED_UPGRADES.values()],
    ids=[*BROKEN_HANDSHAKES, *REFUSED_UPGRADES],
)
async def test_a_refused_upgrade_says_why_and_the_node_keeps_serving(
    request_bytes: bytes, status: int, says: str
) -> None:
    async with trio.open_nursery() as nursery:
        address = await _start_with_ws(nursery)
        raw = await _exchange(address, request_bytes)
        assert raw is not None, "the server kept the connection open after refusing it"
        response = Response(raw)
        assert response.status == status, raw
        assert response.headers["content-type"].startswith("text/plain"), raw
        sentence = response.body.decode()
        assert says in sentence, sentence
        assert int(response.headers["content-length"]) == len(response.body)
        if status == 426:
            assert response.headers["sec-websocket-version"] == "13"
        raw = await _exchange(address, GET_HEALTHZ)
        assert raw is not None and Response(raw).status == 200, raw
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "request_bytes", [value[0] for value in BROKEN_HANDSHAKES.values()], ids=list(BROKEN_HANDSHAKES)
)
async def test_a_broken_handshake_ends_its_connection(request_bytes: bytes) -> None:
    # The answer says "connection: close" and the server closes: a pipelined request
    # after it is not read.
    async with trio.open_nursery() as nursery:
        address = await _start_with_ws(nursery)
        raw = await _exchange(address, request_bytes + GET_HEALTHZ)
        assert raw is not None, "the server kept the connection open after refusing it"
        assert b"HTTP/1.1 200" not in raw, raw
        assert Response(raw).headers["connection"].lower() == "close"
        nursery.cancel_scope.cancel()
