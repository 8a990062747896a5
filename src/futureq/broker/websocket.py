"""The ``/ws`` endpoint: FutureQ frames over WebSocket, one frame per binary message.

A WebSocket connection on the HTTP port's ``/ws`` path carries exactly the frames of a
TCP connection (``docs/protocol.md``, "WebSocket"): each binary WebSocket message holds
one whole frame, its 4-byte length header included, in both directions. The same HELLO,
authentication, permissions and limits apply, because :class:`WebSocketStream` turns the
WebSocket into a :class:`trio.abc.Stream` and the gateway serves it with the very
:class:`~futureq.broker.connection.Connection` code that serves TCP and TLS connections.

Why hypercorn's ASGI WebSocket and not a trio-websocket server: the dashboard, the JSON
API and ``/ws`` must share one port, and only an HTTP server can tell a plain ``GET``
from an upgrade request on it. trio-websocket's server refuses every request that is
not an upgrade, so sharing the port with it would mean parsing HTTP ourselves in front
of both servers, or handing half-read sockets to hypercorn's internal classes. Hypercorn
already owns the port, speaks WebSocket through wsproto (the sans-IO library
trio-websocket is built on), applies the port's TLS and the HTTP checks to the upgrade
request like to any other, and gives back-pressure both ways (a bounded receive queue;
sends that wait for the socket). trio-websocket stays what the tests use as an
independent client.

Checks at the WebSocket level, before any frame is read:

* the ``Origin`` of a browser must be the page's own origin (scheme, host and port of
  the request) when the page was loaded by IP address or ``localhost``, or one listed
  in ``server.websocket_origins``: a page on another site must not drive a broker on
  the visitor's machine (cross-site WebSocket hijacking, DNS rebinding); clients that
  send no ``Origin`` (programs, not browsers) are not affected;
* before HELLO is answered, a message may hold at most a HELLO's frame (64 KiB + 4
  bytes, as the first frame over TCP): the bytes of a longer one are dropped as they
  arrive, never assembled, and the client gets an ERROR frame with ``FRAME_TOO_LARGE``
  (100), then close code 1009 (:class:`MessageBuffer`);
* after HELLO, a message larger than a frame can be (``limits.max_frame_bytes`` + 4) is
  dropped as it arrives just the same; once it ends, the client gets an ERROR frame
  with ``FRAME_TOO_LARGE``, then close code 1009;
* WebSockets may hold at most :func:`max_websockets` of the HTTP port's connections (a
  quarter is kept for short requests: ``/healthz``, ``/metrics``, the API, the
  dashboard); an upgrade past it is answered ``503`` with a sentence (:data:`SLOTS`);
* over HTTP/1.1 only (RFC 6455): the HTTP port never switches to HTTP/2
  (``http_protocol``: an ``h2c`` upgrade is ignored, the HTTP/2 preface gets a GOAWAY;
  TLS offers only ``http/1.1`` by ALPN), since hypercorn would buffer what the node
  sends on a WebSocket over HTTP/2 (RFC 8441) without limit; should one still arrive
  here, it is refused (HTTP 403);
* a text message, or a binary message that is not exactly one frame, gets an ERROR
  frame with ``WEBSOCKET_MESSAGE`` (120), then close code 1003 or 1008;
* after HELLO, a message not complete ``limits.frame_deadline_ms`` after its first byte
  gets an ERROR frame with ``FRAME_TIMEOUT`` (110), then close code 1008, as a frame
  over TCP (hypercorn hands over only finished messages, so a client trickling one
  that never ends was otherwise closed only by the keepalive, told it sent nothing).

Source: RFC 6455 (close codes, §7.4.1; Origin, §10.2); ASGI WebSocket spec;
``docs/protocol.md``, "WebSocket".
"""

from __future__ import annotations

import contextvars
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import trio
from hypercorn.protocol.ws_stream import WebsocketBuffer, WSStream

from futureq.config import join_host_port
from futureq.errors import ErrorCode
from futureq.rate_limited_log import RateLimitedLog
from futureq.wire import codec, frames, session

if TYPE_CHECKING:
    from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, WebsocketScope
    from wsproto.events import Message

log = logging.getLogger(__name__)
refused_log = RateLimitedLog(log, about="refused WebSockets")
"""Lines about refused WebSockets and messages (a client chooses their count and, through
its ``Origin`` header, their length)."""

_LATE = object()
"""What :meth:`WebSocketStream._receive_next` returns for a message past its deadline."""

PATH = "/ws"
"""Where the endpoint listens on the HTTP port."""
SUBPROTOCOL = "futureq.v1"
"""Accepted when a client offers it (``Sec-WebSocket-Protocol``); optional."""

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
"""RFC 6455 §7.4.1: the server is going away (a node shutting down): reconnect, here
later or to another node (:meth:`WebSocketStream.going_away`)."""
MAX_CLOSE_REASON_BYTES = 123
"""RFC 6455 §5.5: a close frame's body is at most 125 bytes, 2 of them the code."""
CLOSE_UNSUPPORTED_DATA = 1003
"""RFC 6455 §7.4.1: the endpoint cannot accept this type of data (a text message)."""
CLOSE_POLICY_VIOLATION = 1008
"""RFC 6455 §7.4.1: a message that is not exactly one frame."""
CLOSE_MESSAGE_TOO_BIG = 1009
"""RFC 6455 §7.4.1: a message too big to process."""

MAX_HELLO_MESSAGE_BYTES = session.MAX_HELLO_BYTES + codec.HEADER_BYTES
"""Largest message read before HELLO is answered: one HELLO-sized frame with its header,
the TCP port's first-frame limit (``docs/protocol.md``, "Limits")."""

TRANSPORT: contextvars.ContextVar[trio.SocketStream | None] = contextvars.ContextVar(
    "futureq_http_transport", default=None
)
"""The TCP stream of the HTTP connection being served, set by the HTTP server's
connection handler (``http._serve_capped``) for hypercorn and the application tasks it
starts. Hypercorn writes a WebSocket's messages in a shielded cancel scope, so a client
that stops reading held the sending task, and with it the node's shutdown, for ever:
:class:`WebSocketStream` closes this socket when a send it waits on is cancelled."""

HTTP_RESERVED_SHARE = 4
"""1/HTTP_RESERVED_SHARE of the HTTP port's connections (at least one) is kept for plain
requests: WebSockets live as long as their clients like, plain requests are cut at
``limits.http_idle_timeout_ms``, so health probes always find a slot free soon."""

SLOTS: contextvars.ContextVar[trio.CapacityLimiter | None] = contextvars.ContextVar(
    "futureq_http_websocket_slots", default=None
)
"""The HTTP port's WebSocket slots (:func:`max_websockets` tokens), set by its connection
handler (``http._serve_capped``) like :data:`TRANSPORT`; None: no cap (an ASGI server
of a test)."""


def max_websockets(max_http_connections: int) -> int:
    """How many of ``max_http_connections`` WebSockets may hold at once: all but a
    :data:`HTTP_RESERVED_SHARE`-th (at least one kept, at least one WebSocket)."""
    reserved = max(1, max_http_connections // HTTP_RESERVED_SHARE)
    return max(1, max_http_connections - reserved)


WebSocketHandler = Callable[[trio.abc.Stream, str, str | None], Awaitable[None]]
"""Serves one accepted WebSocket as a stream of frames: ``handler(stream, peer, token)``,
``token`` a valid token the upgrade request carried (or None)."""


def origin_allowed(
    origin: str | None, host: str | None, scheme: str, allowed: Iterable[str]
) -> bool:
    """Whether a WebSocket upgrade with this ``Origin`` header may be accepted.

    Args:
        origin: The ``Origin`` header, or None when the client sent none (not a browser).
        host: The ``Host`` header of the request.
        scheme: ``ws`` or ``wss``, how the request came in.
        allowed: ``server.websocket_origins`` entries: ``"*"`` or origins like
            ``https://app.example.com``.

    Returns:
        True for no ``Origin``, a listed one, or the request's own origin when its
        ``Host`` is an IP address or ``localhost``. A page served under another name
        must be listed: a name can be made to point at this node by the page's own
        site (DNS rebinding), and then ``Origin`` and ``Host`` agree by construction.

    Source: RFC 6455 §10.2 (servers that are not meant for every site check Origin).
    """
    if origin is None:
        return True
    origin = origin.strip().lower()
    allowed = [entry.strip().lower().rstrip("/") for entry in allowed]
    if "*" in allowed or origin in allowed:
        return True
    if host is None or not _rebinding_proof(host.strip().lower()):
        return False
    parts = urlsplit(origin)
    own_scheme = "https" if scheme == "wss" else "http"
    if parts.scheme != own_scheme or not parts.netloc:
        return False
    default_port = 443 if own_scheme == "https" else 80
    return _with_port(parts.netloc, default_port) == _with_port(host.strip().lower(), default_port)


def _rebinding_proof(host: str) -> bool:
    """True for a ``Host`` no other site can send a browser to under its own name."""
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host[1 : host.find("]")]
    if name == "localhost":
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _with_port(netloc: str, default_port: int) -> str:
    if netloc.startswith("["):  # [v6] or [v6]:port
        end = netloc.find("]")
        return netloc if netloc[end + 1 :].startswith(":") else f"{netloc}:{default_port}"
    return netloc if ":" in netloc else f"{netloc}:{default_port}"


def _header(scope: WebsocketScope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def peer_of(scope: WebsocketScope) -> str:
    """The client's ``host:port`` for log lines (``?`` when unknown)."""
    client = scope.get("client")
    if not client:
        return "?"
    host, port = client[0], client[1]
    return join_host_port(str(host), port)


class MessageBuffer(WebsocketBuffer):
    """Hypercorn's buffer of the WebSocket message being received, held to a HELLO's size
    (:data:`MAX_HELLO_MESSAGE_BYTES`) until HELLO is answered.

    Hypercorn assembles each message whole before the application sees any of it, so a
    cap on what an unauthenticated client makes the node hold must sit here. Before
    :meth:`hello_answered`, the bytes of a longer message are dropped as they arrive
    (never assembled) and :attr:`overflowed` is set: :class:`WebSocketStream` then tells
    the client ``FRAME_TOO_LARGE`` and closes. Afterwards the cap is the one hypercorn was
    configured with (``limits.max_frame_bytes`` + 4); a longer message is dropped as it
    arrives too, and handed over empty once it ends, :attr:`overflowed` set, so the
    stream answers ``FRAME_TOO_LARGE`` before it closes (hypercorn's own refusal was a
    bare close 1009, no reason the client could read).

    Args:
        max_message_bytes: The cap after HELLO (bytes).
    """

    def __init__(self, max_message_bytes: int) -> None:
        super().__init__(min(max_message_bytes, MAX_HELLO_MESSAGE_BYTES))
        self._max_after_hello = max_message_bytes
        self._greeted = False
        self.overflowed = trio.Event()
        """Set when a message before HELLO passed the cap (the connection is to close)."""
        self.overflow_bytes = 0
        """How much of that message had arrived when it passed the cap (bytes)."""
        self.overflow_cap = 0
        """The cap it passed (bytes): a HELLO's, or after HELLO a frame's."""
        self.overflow_after_hello = False
        """Whether it passed the cap after HELLO was answered (a frame's cap)."""
        self.message_started: float | None = None
        """``trio.current_time()`` when the first piece of the message being received
        arrived; None between messages."""
        self.message_bytes = 0
        """Bytes of that message arrived so far, those dropped after an overflow too."""
        self.message_began = trio.Event()
        """Set when a message's first piece arrives (a fresh one for each message)."""

    def hello_answered(self) -> None:
        """Raise the cap to the one after HELLO."""
        self._greeted = True
        self.max_length = self._max_after_hello

    def extend(self, event: Message[Any]) -> None:
        """Add a piece of the message (hypercorn calls it for each one)."""
        if self.message_started is None:
            self.message_started = trio.current_time()
            self.message_bytes = 0
            self.message_began.set()
        self.message_bytes += len(event.data)
        if self.overflowed.is_set():
            return  # the connection is closing; drop the rest
        arrived = self.length + len(event.data)
        if arrived > self.max_length:
            self.overflow_bytes = arrived
            self.overflow_cap = self.max_length
            self.overflow_after_hello = self._greeted
            super().clear()  # the message goes on arriving (dropped): its start stays
            self.overflowed.set()
            return
        super().extend(event)

    def clear(self) -> None:
        """Forget the message hypercorn handed over (it calls this after each one)."""
        super().clear()
        self.message_started = None
        self.message_bytes = 0
        self.message_began = trio.Event()

    def to_message(self) -> dict[str, Any]:
        """The ASGI event of a finished message (an empty one after an overflow)."""
        if self.overflowed.is_set():
            return {"type": "websocket.receive", "bytes": b"", "text": None}
        return super().to_message()


def install_message_buffer(send: ASGISendCallable) -> MessageBuffer | None:
    """Put a :class:`MessageBuffer` in place of hypercorn's in the connection whose ASGI
    ``send`` this is; call before accepting. None when ``send`` is not hypercorn's
    WebSocket stream's (a test's channel): messages are then checked once assembled."""
    owner = getattr(send, "__self__", None)
    if not isinstance(owner, WSStream) or type(owner.buffer) is not WebsocketBuffer:
        return None
    buffer = MessageBuffer(owner.buffer.max_length)
    owner.buffer = buffer
    return buffer


class WebSocketStream(trio.abc.Stream):
    """A FutureQ frame stream over one accepted ASGI WebSocket.

    ``receive_some`` returns the bytes of whole frames, one message at a time (split
    when the caller asks for fewer bytes); ``send_all`` takes bytes made of whole frames
    (the gateway's writer joins several) and sends each frame as its own binary message.
    The peer closing the WebSocket is end-of-stream (``b""``).

    Args:
        receive: The ASGI ``receive`` callable of the connection.
        send: The ASGI ``send`` callable.
        on_refused: Called with the error code when a message is refused (for metrics).
        transport: The connection's socket (:data:`TRANSPORT`), closed by :meth:`abort`.
        buffer: The connection's :class:`MessageBuffer` (:func:`install_message_buffer`):
            its cap is raised when this stream sends HELLO_OK, and an overflow before
            that ends the stream with ``FRAME_TOO_LARGE``. None: a message longer than
            :data:`MAX_HELLO_MESSAGE_BYTES` before HELLO_OK is refused once assembled.
        frame_deadline_ms: ``limits.frame_deadline_ms``: after HELLO, a message not
            complete this long after its first piece arrived ends the stream with
            ``FRAME_TIMEOUT``, as a frame over TCP does (needs ``buffer``). None: no
            deadline but the connection's keepalive.
    """

    def __init__(
        self,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
        on_refused: Callable[[ErrorCode], None] | None = None,
        transport: trio.SocketStream | None = None,
        buffer: MessageBuffer | None = None,
        frame_deadline_ms: int | None = None,
    ) -> None:
        self._receive = receive
        self._send = send
        self._on_refused = on_refused
        self._transport = transport
        self._buffer = buffer
        self._frame_deadline_ms = frame_deadline_ms
        self._greeted = False
        self._pending = b""
        self._eof = False
        self._closed = False
        self._close_code = CLOSE_NORMAL
        self._close_reason = ""

    def going_away(self, reason: str) -> None:
        """Close with code 1001 (going away, RFC 6455 §7.4.1) and ``reason`` (cut to
        :data:`MAX_CLOSE_REASON_BYTES` of UTF-8) rather than 1000 when :meth:`aclose`
        comes: the node is shutting down. What is sent before is not affected, so the
        client still gets the answers and the GOAWAY it is owed first. Before, a
        stopping node closed with 1000 (normal), which a browser client cannot tell
        from "done"."""
        encoded = reason.encode()[:MAX_CLOSE_REASON_BYTES]
        self._close_code = CLOSE_GOING_AWAY
        self._close_reason = encoded.decode(errors="ignore")

    def abort(self) -> None:
        """Close the connection's socket now, whatever is being sent on it (hypercorn's
        shielded write then fails, and the connection ends); nothing without one (an
        ASGI channel of a test)."""
        if self._transport is not None:
            self._transport.socket.close()

    async def _send_messages(self, messages: list[dict[str, Any]]) -> None:
        """ASGI-send ``messages`` in order; cancellable although hypercorn shields its
        socket write: cancelled while a send waits (a client that does not read), the
        socket is closed (:meth:`abort`), which ends the write.

        Raises:
            trio.BrokenResourceError: the WebSocket is gone.
        """
        done = False

        async def abort_if_cancelled() -> None:
            try:
                await trio.sleep_forever()
            finally:
                if not done:
                    self.abort()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(abort_if_cancelled)
            try:
                for message in messages:
                    await self._send_one(message)
            finally:
                done = True
                nursery.cancel_scope.cancel()

    async def _send_one(self, message: dict[str, Any]) -> None:
        try:
            await self._send(message)  # type: ignore[arg-type]
        except Exception as exc:  # hypercorn raises its own errors on a dead socket
            raise trio.BrokenResourceError("the WebSocket is gone") from exc

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Bytes of the next message (whole frames), or ``b""`` once the peer closed.

        Raises:
            trio.ClosedResourceError: after :meth:`aclose`.
        """
        if self._closed:
            raise trio.ClosedResourceError("the WebSocket was closed")
        while not self._pending:
            if self._eof:
                await trio.lowlevel.checkpoint()
                return b""
            message = await self._receive_next()
            if message is _LATE:
                await self._refuse_late()
                continue
            if message is None or (self._buffer is not None and self._buffer.overflowed.is_set()):
                # Too long: for the cap it passed, a HELLO's (before HELLO_OK left) or a
                # frame's (after, also when HELLO_OK left while this waited).
                assert self._buffer is not None
                if self._buffer.overflow_after_hello:
                    await self._refuse_too_large(self._buffer.overflow_bytes)
                else:
                    await self._refuse_before_hello(self._buffer.overflow_bytes)
                continue
            kind = message["type"]
            if kind == "websocket.disconnect":
                self._eof = True
                continue
            if kind != "websocket.receive":
                continue
            data: Any = message.get("bytes")
            if data is None:
                await self._refuse(
                    CLOSE_UNSUPPORTED_DATA,
                    "a text WebSocket message was received; FutureQ reads binary messages, "
                    "each holding one frame (4-byte big-endian length, then the msgpack body)",
                )
                continue
            if not self._greeted and len(data) > MAX_HELLO_MESSAGE_BYTES:
                await self._refuse_before_hello(len(data))
                continue
            problem = _not_one_frame(bytes(data))
            if problem is not None:
                await self._refuse(CLOSE_POLICY_VIOLATION, problem)
                continue
            self._pending = bytes(data)
        if max_bytes is None or max_bytes >= len(self._pending):
            chunk, self._pending = self._pending, b""
        else:
            chunk, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return chunk

    async def _receive_next(self) -> Any:
        """The next ASGI event; None once a message before HELLO passed the cap
        (:class:`MessageBuffer`); :data:`_LATE` once the message being received is still
        not complete ``frame_deadline_ms`` after its first piece. Hypercorn hands over
        only finished messages, so both are watched alongside: a message that never
        finishes (a client trickling a huge one) was otherwise waited for until the
        keepalive said, wrongly, that the client sent nothing. A call made before HELLO
        was answered keeps watching for the overflow (HELLO_OK may leave meanwhile)."""
        buffer = self._buffer
        if buffer is None:
            return await self._receive()
        deadline_ms = self._frame_deadline_ms
        watch_overflow = not self._greeted
        received: list[Any] = []
        async with trio.open_nursery() as nursery:

            async def receive() -> None:
                received.append(await self._receive())
                nursery.cancel_scope.cancel()

            async def overflow() -> None:
                await buffer.overflowed.wait()
                nursery.cancel_scope.cancel()

            async def deadline(deadline_s: float) -> None:
                while True:
                    began = buffer.message_began
                    started = buffer.message_started
                    if started is None:
                        await began.wait()
                        continue
                    await trio.sleep_until(started + deadline_s)
                    if buffer.message_started == started:
                        nursery.cancel_scope.cancel()
                        return
                    # That message was handed over meanwhile; watch the next one.

            nursery.start_soon(receive)
            if watch_overflow:
                nursery.start_soon(overflow)
            if deadline_ms is not None:
                nursery.start_soon(deadline, deadline_ms / 1000)
        if received:
            return received[0]
        if watch_overflow and buffer.overflowed.is_set():
            return None
        return _LATE

    async def _refuse_late(self) -> None:
        """Refuse a message not complete in time (as TCP does a frame: ``FRAME_TIMEOUT``),
        and close with 1008."""
        assert self._buffer is not None and self._buffer.message_started is not None
        elapsed_ms = round((trio.current_time() - self._buffer.message_started) * 1000)
        await self._refuse(
            CLOSE_POLICY_VIOLATION,
            f"a WebSocket message was not complete {self._frame_deadline_ms} ms after its "
            f"first byte (limits.frame_deadline_ms): {self._buffer.message_bytes} bytes "
            f"arrived in the {elapsed_ms} ms since, as this server read them (a sender, "
            "the network or this server's load can each slow a message)",
            ErrorCode.FRAME_TIMEOUT,
        )

    async def _refuse_before_hello(self, arrived_bytes: int) -> None:
        """Refuse a message longer than a HELLO before HELLO is answered (as TCP does its
        first frame: ``FRAME_TOO_LARGE``), and close with 1009."""
        await self._refuse(
            CLOSE_MESSAGE_TOO_BIG,
            f"a WebSocket message of more than {MAX_HELLO_MESSAGE_BYTES} bytes "
            f"({arrived_bytes} had arrived) before HELLO: the first message must hold one "
            f"HELLO frame of at most {session.MAX_HELLO_BYTES} bytes",
            ErrorCode.FRAME_TOO_LARGE,
        )

    async def _refuse_too_large(self, arrived_bytes: int) -> None:
        """Refuse a message longer than a frame can be after HELLO (as TCP refuses such a
        frame: ``FRAME_TOO_LARGE``), and close with 1009."""
        assert self._buffer is not None
        cap = self._buffer.overflow_cap
        max_frame_bytes = cap - codec.HEADER_BYTES
        await self._refuse(
            CLOSE_MESSAGE_TOO_BIG,
            f"a WebSocket message of more than {cap} bytes "
            f"({arrived_bytes} had arrived): a message holds one frame, its 4-byte length "
            f"then a body of at most {max_frame_bytes} bytes (limits.max_frame_bytes)",
            ErrorCode.FRAME_TOO_LARGE,
        )

    async def _refuse(
        self, close_code: int, sentence: str, code: ErrorCode = ErrorCode.WEBSOCKET_MESSAGE
    ) -> None:
        """Tell the client why in an ERROR frame, close, and report end-of-stream."""
        if self._on_refused is not None:
            self._on_refused(code)
        refused_log.log(logging.INFO, "WebSocket message refused: %s", sentence)
        error = frames.Error(0, int(code), sentence)
        try:
            await self._send_messages(
                [
                    {"type": "websocket.send", "bytes": codec.encode_frame(error), "text": None},
                    {"type": "websocket.close", "code": close_code, "reason": ""},
                ]
            )
        except trio.BrokenResourceError:  # the socket is already gone; end-of-stream either way
            log.debug("could not send the refusal", exc_info=True)
        self._eof = True

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send whole frames, one binary message each.

        Raises:
            trio.ClosedResourceError: after :meth:`aclose`.
            trio.BrokenResourceError: the WebSocket is gone.
        """
        if self._closed:
            raise trio.ClosedResourceError("the WebSocket was closed")
        view = memoryview(data)
        messages: list[dict[str, Any]] = []
        offset = 0
        while offset < len(view):
            length = int.from_bytes(view[offset : offset + codec.HEADER_BYTES], "big")
            end = offset + codec.HEADER_BYTES + length
            # Our own writer only ever hands over whole frames.
            assert length > 0 and end <= len(view), "send_all got a partial frame"
            frame = bytes(view[offset:end])
            if not self._greeted and _is_hello_ok(frame):
                # From now on the client may send max_frame_bytes; raised before the
                # HELLO_OK leaves, so its next message already has the room.
                self._greeted = True
                if self._buffer is not None:
                    self._buffer.hello_answered()
            messages.append({"type": "websocket.send", "bytes": frame, "text": None})
            offset = end
        await self._send_messages(messages)

    async def wait_send_all_might_not_block(self) -> None:
        """Part of the stream interface; sends wait for the socket themselves."""
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        """Close the WebSocket, normally (code 1000) or as :meth:`going_away` said,
        unless it is closed already."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        try:
            await self._send_messages(
                [
                    {
                        "type": "websocket.close",
                        "code": self._close_code,
                        "reason": self._close_reason,
                    }
                ]
            )
        except trio.BrokenResourceError:
            log.debug("WebSocket close after the socket went away", exc_info=True)
        await trio.lowlevel.checkpoint()


def _is_hello_ok(frame: bytes) -> bool:
    """Whether one whole frame of ours is HELLO_OK (only frames sent before it are
    decoded: an ERROR or HELLO_OK, a few hundred bytes)."""
    decoder = codec.FrameDecoder(len(frame))
    decoder.receive_data(frame)
    return isinstance(decoder.next_frame(), frames.HelloOk)


def _not_one_frame(data: bytes) -> str | None:
    """None when ``data`` is exactly one frame; else a sentence saying what is wrong."""
    if len(data) < codec.HEADER_BYTES:
        return (
            f"a WebSocket message of {len(data)} bytes is shorter than a frame header; each "
            "message must hold one whole frame (4-byte big-endian length, then the body)"
        )
    announced = int.from_bytes(data[: codec.HEADER_BYTES], "big")
    body = len(data) - codec.HEADER_BYTES
    if announced != body:
        return (
            f"a WebSocket message's frame header announces {announced} body bytes but the "
            f"message carries {body}; send exactly one whole frame per binary message"
        )
    return None


async def serve_websocket(
    scope: WebsocketScope,
    receive: ASGIReceiveCallable,
    send: ASGISendCallable,
    handler: WebSocketHandler,
    *,
    allowed_origins: Iterable[str] = (),
    on_refused: Callable[[ErrorCode], None] | None = None,
    token: str | None = None,
    frame_deadline_ms: int | None = None,
) -> None:
    """Accept (or refuse) one ``/ws`` upgrade and serve it with ``handler``.

    Args:
        scope: The ASGI ``websocket`` scope.
        receive: ASGI receive callable.
        send: ASGI send callable.
        handler: Serves the accepted connection as a frame stream (the gateway).
        allowed_origins: ``server.websocket_origins`` (besides the page's own origin).
        on_refused: Called with an error code for each refused message.
        token: A valid token of the upgrade's ``Authorization`` header, handed to the
            gateway for a HELLO that carries none (the Origin check comes first, so
            only the node's own pages and listed origins get this).
        frame_deadline_ms: ``limits.frame_deadline_ms`` (:class:`WebSocketStream`).
    """
    connect = await receive()
    if connect["type"] != "websocket.connect":
        return
    if scope.get("http_version") == "2":
        # RFC 8441 (a WebSocket as one stream of an HTTP/2 connection, h2c prior
        # knowledge here: TLS offers only HTTP/1.1): hypercorn buffers what it sends on
        # such a stream without bound while the peer's window is shut, so no send
        # waits, and neither the connection's buffer limit nor its send timeout holds.
        refused_log.log(
            logging.INFO, "WebSocket over HTTP/2 from %s refused: use HTTP/1.1", peer_of(scope)
        )
        await refuse_upgrade(
            send, 403, "a WebSocket on /ws is opened over HTTP/1.1 only; retry with HTTP/1.1\n"
        )
        return
    origin = _header(scope, b"origin")
    if not origin_allowed(
        origin, _header(scope, b"host"), scope.get("scheme", "ws"), allowed_origins
    ):
        refused_log.log(
            logging.INFO,
            "WebSocket from %s refused: Origin %r is neither this server's nor in "
            "server.websocket_origins",
            peer_of(scope),
            origin,
        )
        await refuse_upgrade(
            send,
            403,
            f"a page from {printable(str(origin))} may not open a WebSocket on this node: "
            "only pages of the node's own address may, and the origins listed in "
            "server.websocket_origins; add that origin there to allow it\n",
        )
        return
    slots = SLOTS.get()
    if slots is not None:
        try:
            slots.acquire_nowait()
        except trio.WouldBlock:
            await _refuse_upgrade(send, scope, int(slots.total_tokens))
            return
    try:
        offered = SUBPROTOCOL in scope.get("subprotocols", [])
        buffer = install_message_buffer(send)  # before accepting: no message is read yet
        await send(
            {
                "type": "websocket.accept",
                "subprotocol": SUBPROTOCOL if offered else None,
                "headers": [],
            }
        )
        stream = WebSocketStream(
            receive, send, on_refused, TRANSPORT.get(), buffer, frame_deadline_ms
        )
        try:
            await handler(stream, peer_of(scope), token)
        finally:
            with trio.move_on_after(1, shield=True):
                await stream.aclose()
    finally:
        if slots is not None:
            slots.release()


REFUSED_HEADER = b"futureq-refused"
"""Header of a ``503`` that refuses a connection for lack of room on the HTTP port (its
value says which limit: ``http-connections``, ``http-address``, ``websockets``), so it
is not taken for ``/healthz`` saying the node is unhealthy."""


MAX_QUOTED_CHARS = 200
"""A client-given text (an ``Origin``, a path) quoted in a refusal is cut to this many
characters."""


def printable(text: str) -> str:
    """``text`` quoted for a sentence: non-printable characters escaped, cut to
    :data:`MAX_QUOTED_CHARS`."""
    quoted = repr(text)
    if len(quoted) > MAX_QUOTED_CHARS:
        quoted = quoted[: MAX_QUOTED_CHARS - 3] + "..."
    return quoted


async def refuse_upgrade(
    send: ASGISendCallable,
    status: int,
    sentence: str,
    extra: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    """Answer a WebSocket upgrade with an HTTP error whose body says what to fix.

    A bare ASGI ``websocket.close`` during the handshake became hypercorn's ``403``
    with an empty body: a browser or a program was told "forbidden" and nothing more.

    Args:
        send: The ASGI send callable of the ``websocket`` scope (before accepting).
        status: The HTTP status (403, 404, 503, ...).
        sentence: The body (plain text, UTF-8), ending in a newline.
        extra: More response headers.
    """
    body = sentence.encode()
    await send(
        {
            "type": "websocket.http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode("ascii")),
                (b"cache-control", b"no-store"),
                *extra,
            ],
        }
    )
    await send({"type": "websocket.http.response.body", "body": body, "more_body": False})


async def _refuse_upgrade(send: ASGISendCallable, scope: WebsocketScope, limit: int) -> None:
    """Answer an upgrade with no WebSocket slot left: ``503`` with a sentence."""
    refused_log.log(
        logging.INFO, "WebSocket from %s refused: %d WebSockets are open", peer_of(scope), limit
    )
    await refuse_upgrade(
        send,
        503,
        f"this node serves {limit} WebSockets at once, the most its HTTP port gives them "
        "(limits.max_http_connections less a quarter kept for /healthz, /metrics and the "
        "API); retry later, or use the client port\n",
        [(b"retry-after", b"1"), (REFUSED_HEADER, b"websockets")],
    )


__all__ = [
    "MAX_HELLO_MESSAGE_BYTES",
    "PATH",
    "REFUSED_HEADER",
    "SLOTS",
    "SUBPROTOCOL",
    "MessageBuffer",
    "WebSocketHandler",
    "WebSocketStream",
    "install_message_buffer",
    "max_websockets",
    "origin_allowed",
    "printable",
    "refuse_upgrade",
    "serve_websocket",
]
