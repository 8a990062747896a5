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

HTTP/1.1 is the only protocol served (docs/security.md, "The HTTP port"). Hypercorn
switched a connection to its own HTTP/2 on an ``h2c`` upgrade (answered ``101``) or on
the HTTP/2 preface sent with prior knowledge (found by a tester): none of the screening
above applied there, and one connection carried up to 100 requests at once (its
SETTINGS), past the limits the port sets per connection. ALPN offers HTTP/1.1 alone; now:

- an ``Upgrade: h2c`` is ignored, as a server may (RFC 9110 §7.8; RFC 9113 §3.1
  deprecates ``h2c``): the request is answered over HTTP/1.1 like any other (a ``GET /ws`` too: a
  plain GET of ``/ws`` is answered ``426``);
- the HTTP/2 preface (``PRI * HTTP/2.0``) is answered in HTTP/2, which the client reads:
  an empty SETTINGS frame (the server's preface) and a GOAWAY with ``HTTP_1_1_REQUIRED``
  (RFC 9113 §7) whose debug data says why; then the connection is closed.

A WebSocket upgrade with a broken handshake (no ``Sec-WebSocket-Key``, a
``Sec-WebSocket-Version`` other than 13, HTTP/1.0) got hypercorn's ``400`` with an empty
body, and the connection then stayed open until its idle deadline though the answer
said ``connection: close``; it is now answered here with a sentence saying what to fix
(:func:`bad_upgrade_answer`), and closed.

The HTTP server (``http._serve_capped``) serves each connection with
:class:`ScreeningTCPServer`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import h11
import trio
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.events import Response, StreamClosed
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import TCPServer

from . import http_connection

HTTP_1_1_REQUIRED = 0xD
"""The HTTP/2 error code telling a client to use HTTP/1.1 instead (RFC 9113 §7)."""


def _http2_frame(frame_type: int, payload: bytes) -> bytes:
    """One HTTP/2 frame on stream 0 with no flags (RFC 9113 §4.1)."""
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", frame_type, 0, 0) + payload


HTTP2_REFUSAL = _http2_frame(0x4, b"") + _http2_frame(
    0x7,
    struct.pack(">II", 0, HTTP_1_1_REQUIRED)
    + b"this port serves HTTP/1.1 only (health, metrics, the dashboard, /ws)",
)
"""What a client that opened with the HTTP/2 preface gets: the server's preface (an
empty SETTINGS frame, RFC 9113 §3.4) and a GOAWAY refusing every stream (last stream
0) with ``HTTP_1_1_REQUIRED`` and a sentence as its debug data."""


ERROR_SENTENCES = {
    400: "this request is not valid HTTP/1.1 (its request line or a header is malformed); "
    "this port serves GET and HEAD of /healthz, /readyz, /metrics, /api/..., / and /ws\n",
    431: "the request line and headers are too large; send a shorter URL and fewer or "
    "smaller headers\n",
}
"""The body of the answer to bytes that are not an HTTP/1.1 request, by status."""


WEBSOCKET_VERSION = b"13"
"""The only ``Sec-WebSocket-Version`` served (RFC 6455 §4.1)."""
MAX_QUOTED_HEADER_BYTES = 100
"""A client's header value quoted in a refusal is cut to this many bytes."""


class _Refused(Exception):
    """The connection was refused and answered: nothing more to read (the HTTP/2
    preface; a WebSocket upgrade that is not one)."""


def _is_websocket_upgrade(request: h11.Request) -> bool:
    """True if hypercorn would open a WebSocket stream for this request (its rule:
    ``GET``, ``Connection`` listing ``upgrade``, ``Upgrade: websocket``)."""
    connection = upgrade = b""
    for name, value in request.headers:
        if name == b"connection":
            connection = value
        elif name == b"upgrade":
            upgrade = value
    tokens = [token.strip() for token in connection.lower().split(b",")]
    return (
        request.method.upper() == b"GET"
        and b"upgrade" in tokens
        and upgrade.strip().lower() == b"websocket"
    )


def bad_upgrade_answer(request: h11.Request) -> tuple[int, str, list[tuple[bytes, bytes]]] | None:
    """Why a WebSocket upgrade request cannot be accepted, or None if it can (or is no
    upgrade).

    Hypercorn answered these with a ``400`` of an empty body and then kept the
    connection open, though it said ``connection: close``, until its idle deadline: a
    client (trio-websocket, a browser) reported a bare "400" and nothing about what to
    fix.

    Returns:
        (HTTP status, a sentence saying what to fix, extra response headers): ``400``
        for an HTTP/1.0 request or one without ``Sec-WebSocket-Key``; ``426`` with
        ``Sec-WebSocket-Version: 13`` for another WebSocket version (RFC 6455 §4.4).
    """
    if not _is_websocket_upgrade(request):
        return None
    if request.http_version != b"1.1":
        return (
            400,
            f"a WebSocket upgrade is an HTTP/1.1 request; this one is HTTP/"
            f"{request.http_version.decode('ascii', 'replace')}: send it as HTTP/1.1\n",
            [],
        )
    key = version = None
    for name, value in request.headers:
        if name == b"sec-websocket-key":
            key = value
        elif name == b"sec-websocket-version":
            version = value
    if key is None:
        return (
            400,
            "the WebSocket upgrade has no Sec-WebSocket-Key header; a WebSocket client "
            "sends one (RFC 6455 §4.1): use a WebSocket client library, or add the header\n",
            [],
        )
    if version != WEBSOCKET_VERSION:
        offered = (
            "none" if version is None else repr(version[:MAX_QUOTED_HEADER_BYTES].decode("latin-1"))
        )
        return (
            426,
            f"this node speaks WebSocket version 13 (RFC 6455) only; the upgrade offered "
            f"Sec-WebSocket-Version {offered}: send Sec-WebSocket-Version: 13\n",
            [(b"sec-websocket-version", WEBSOCKET_VERSION)],
        )
    return None


def has_body(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """True if a request with these (lower-case) headers has a body: a Content-Length
    other than 0, or any Transfer-Encoding (RFC 9112 §6.3)."""
    for name, value in headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


class ScreenedH11Protocol(H11Protocol):
    """:class:`H11Protocol` that hands a request with a body to the application as a
    plain HTTP request (never a WebSocket) and sends no ``100 Continue`` for it, never
    switches to HTTP/2 (see the module docstring), and tells the connection's
    :class:`http_connection.ConnectionEnd` when an answer is due and when it was
    written, so a client's EOF after a whole request ends the connection only after its
    answer."""

    async def handle(self, event: Event) -> None:
        try:
            await super().handle(event)
        except _Refused:
            pass  # refused and closed: the rest of what the client sent is not read

    async def _send_error_response(self, status_code: int) -> None:
        # Hypercorn's answer to bytes h11 refuses has an empty body: a client saw a bare
        # "400" or "431" and nothing saying what to fix.
        body = ERROR_SENTENCES.get(status_code, ERROR_SENTENCES[400])
        await self._send_closing_answer(status_code, body)

    async def _send_closing_answer(
        self, status_code: int, sentence: str, extra: Iterable[tuple[bytes, bytes]] = ()
    ) -> None:
        """Send a plain-text answer that ends the connection (``connection: close``)."""
        body = sentence.encode()
        await self._send_h11_event(
            h11.Response(
                status_code=status_code,
                headers=[
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                    *extra,
                    *self.config.response_headers("h11"),
                ],
            )
        )
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())

    async def _check_protocol(self, event: h11.Request) -> None:
        # Hypercorn's would switch to HTTP/2 (h2c upgrade, prior knowledge); an
        # ``Upgrade: h2c`` is ignored by not calling it (the request is served as is).
        if event.method == b"PRI" and event.target == b"*" and event.http_version == b"2.0":
            await self.send(RawData(data=HTTP2_REFUSAL))
            await self.send(Closed())
            raise _Refused

    async def _create_stream(self, request: h11.Request) -> None:
        refusal = None if has_body(request.headers) else bad_upgrade_answer(request)
        if refusal is not None:
            # Answered here: hypercorn's own answer had no body and left the connection
            # open (its WebSocket stream never ended).
            status_code, sentence, extra = refusal
            await self._send_closing_answer(status_code, sentence, extra)
            await self.send(Closed())
            raise _Refused
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
        connection_end = http_connection.CURRENT.get()
        if connection_end is not None:
            # Before the application starts (it may answer before this returns).
            connection_end.request_received()
        await super()._create_stream(request)

    async def stream_send(self, event: StreamEvent) -> None:
        connection_end = http_connection.CURRENT.get()
        if isinstance(event, StreamClosed) and connection_end is not None:
            # The answer is written (hypercorn sends its end before this); marked before
            # hypercorn, which may let a pipelined request's stream start now.
            connection_end.answered()
        await super().stream_send(event)
        if isinstance(event, Response) and event.status_code < 200 and connection_end is not None:
            # 101: the request was answered by a switch to a WebSocket, whose EOF ends it.
            connection_end.upgraded = True
            connection_end.answered()


class ScreeningTCPServer(TCPServer):
    """Hypercorn's trio TCP server, speaking HTTP/1.1 with :class:`ScreenedH11Protocol`.

    Hypercorn builds the connection's :class:`ProtocolWrapper` (and the HTTP/1.1
    protocol in it) inside ``run``; it is swapped for a screened one as it is stored,
    before it has read anything.

    When the server stops (its shutdown trigger), hypercorn closes every connection
    with no request under way at once, a connection accepted a moment before whose
    first request is still on its way included: that client got no answer at all
    (``RemoteDisconnected``; a sharded node's supervisor stops answering on shard 0's
    port the moment shard 0 is back, found by a CI run). Such a connection keeps its
    chance: its first request is read and answered (``connection: close``) within the
    server's grace period (``http.GRACEFUL_TIMEOUT_S``) and its idle deadline. A
    connection already answered and idle is closed at once, as before; a client
    expects that of a kept-alive connection (RFC 9112 §9.8).
    """

    _request_begun = False
    """True once a request has come on this connection."""
    _busy = False
    """True while a request is being served (hypercorn's last ``Updated`` said not idle)."""

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, Updated):
            self._busy = not event.idle
            if not event.idle:
                self._request_begun = True
        await super().protocol_send(event)

    async def _idle_timeout(self) -> None:
        # Hypercorn's, but for a connection that has not sent its first request yet.
        with trio.move_on_after(self.config.keep_alive_timeout):
            await self.context.terminated.wait()
            if not self._request_begun:
                # Bounded by the grace period's cancel; a request stops this task.
                await trio.sleep_forever()
        if self._busy:
            # A request began as the stop woke this task: hypercorn's stop of this
            # task came too late to cancel it, and the close below is shielded, so the
            # request was cut with its answer unsent (the client saw an end, no answer).
            # Its answer ends the connection (hypercorn recycles none once stopping).
            return
        with trio.CancelScope(shield=True):
            await self._initiate_server_close()

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
