"""Hypercorn's HTTP/1.1 protocol, with the requests that carry a body kept from its own
handling: each reaches the application as a plain HTTP request, which answers it 405 and
closes the connection with the body unread (docs/security.md, "The HTTP port").

Two of hypercorn's ways went wrong with such a request:

- A WebSocket upgrade (``GET /ws`` with ``Upgrade: websocket``) with a body became a
  WebSocket stream: its body bytes, taken for WebSocket data before the handshake,
  got hypercorn's 400 while the application accepted the upgrade, h11 refused the 101
  ("Received server _SWITCH_UPGRADE event without a pending proposal", the request's
  body still pending) and the error stopped the whole node; announced and not sent,
  the body was ignored and the WebSocket opened (101). It is now served as an HTTP
  request (its ``Upgrade`` header dropped), so it gets the 405 every request with a
  body gets.
- ``Expect: 100-continue`` with a body got ``100 Continue`` (sent by hypercorn as soon
  as the head was read, before the application could answer) and then the 405: the
  client was invited to send a body that would not be read. No 100 is sent now.

The HTTP server (``http._serve_capped``) serves each connection with
:class:`ScreeningTCPServer`. HTTP/2 (only reachable by ``h2c`` or prior knowledge: ALPN
offers HTTP/1.1 alone) is hypercorn's own.
"""

from __future__ import annotations

from collections.abc import Iterable

import h11
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import TCPServer


def has_body(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """True if a request with these (lower-case) headers has a body: a Content-Length
    other than 0, or any Transfer-Encoding (RFC 9112 §6.3)."""
    for name, value in headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


class ScreenedH11Protocol(H11Protocol):
    """:class:`H11Protocol` that hands a request with a body to the application as a
    plain HTTP request (never a WebSocket) and sends no ``100 Continue`` for it."""

    async def _create_stream(self, request: h11.Request) -> None:
        if has_body(request.headers):
            if isinstance(self.connection, h11.Connection):
                # Cleared before hypercorn's loop looks at it again (right after this).
                self.connection.client_is_waiting_for_100_continue = False
            request = h11.Request(
                method=request.method,
                target=request.target,
                headers=[(name, value) for name, value in request.headers if name != b"upgrade"],
                http_version=request.http_version,
            )
        await super()._create_stream(request)


class ScreeningTCPServer(TCPServer):
    """Hypercorn's trio TCP server, speaking HTTP/1.1 with :class:`ScreenedH11Protocol`.

    Hypercorn builds the connection's :class:`ProtocolWrapper` (and the HTTP/1.1
    protocol in it) inside ``run``; it is swapped for a screened one as it is stored,
    before it has read anything.
    """

    @property
    def protocol(self) -> ProtocolWrapper:
        """The connection's protocol (hypercorn's attribute)."""
        return self._screened

    @protocol.setter
    def protocol(self, wrapper: ProtocolWrapper) -> None:
        if type(wrapper.protocol) is H11Protocol:
            wrapper.protocol = ScreenedH11Protocol(
                wrapper.app,
                wrapper.config,
                wrapper.context,
                wrapper.task_group,
                wrapper.state,
                wrapper.ssl,
                wrapper.client,
                wrapper.server,
                wrapper.send,
            )
        self._screened = wrapper
