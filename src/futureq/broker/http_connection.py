"""How one HTTP connection ends: whatever ends it ends it at once, slot and socket.

Hypercorn ends a connection's tasks only when each of them returns, and some of them
wait on things that never come: after a client closed its socket, the keep-alive timer
still ran for ``http_idle_timeout_ms`` (the slot stayed taken, the socket in
CLOSE-WAIT); after an answer to a request whose body was not read, hypercorn's task
waited for ever to hand the body to an application that had returned, so the slot was
never given back (and 32 such requests took an address's share of the port for good).

So the HTTP server (``http._serve_capped``) runs each admitted connection inside the
cancel scope of a :class:`ConnectionEnd`, and gives hypercorn the connection's TCP
stream wrapped in an :class:`EndingStream`: the peer's EOF or reset and hypercorn
closing the stream (an answer with ``Connection: close``, the idle timeout, a
WebSocket's end, a protocol error) each cancel that scope, which stops every task of the
connection; the handler then closes the socket and gives the slot back. The application
ends a connection after an answer with :meth:`ConnectionEnd.end_after_next_send` (a
request with a body: answered 405 and closed with its body unread).

A client that half-closes its side (``shutdown(SHUT_WR)``, ``nc -N``) after sending a
whole request gets its answer, then the connection ends (found by a tester: the EOF
ended it at once, cutting the answer short or leaving it unsent, as hypercorn too
dropped it). The request's reading (``http_protocol.ScreenedH11Protocol``) tells the
:class:`ConnectionEnd` when an answer is due and when it was written; an EOF with no
answer due (an idle keep-alive, a half-sent request) still ends the connection at once,
and one with an answer due ends it as soon as that answer is written, or
``limits.http_idle_timeout_ms`` after the EOF at the latest (a client that half-closed
and does not read cannot keep its slot). A WebSocket's EOF ends it at once.

Over TLS the peer's EOF is its ``close_notify``, which the TCP stream never sees (the TLS
layer stops reading there), so the TLS stream hypercorn reads is an
:class:`EndingTLSStream` that takes it for the same EOF (found by a tester: ``curl``, which
sends ``close_notify`` after reading its answer, held its connection slot for
``limits.http_idle_timeout_ms``, so 32 quick ``curl https://.../healthz`` from one host
had the next ones refused for 5 s).

Source: docs/operations.md, "Limits" (``limits.max_http_connections``,
``limits.http_idle_timeout_ms``); docs/security.md, "The HTTP port".
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import socket
from collections.abc import AsyncIterator, Iterator

import trio

CURRENT: contextvars.ContextVar[ConnectionEnd | None] = contextvars.ContextVar(
    "futureq_http_connection_end", default=None
)
"""The :class:`ConnectionEnd` of the HTTP connection being served, set by the server's
connection handler for hypercorn and the application tasks it starts (as
``websocket.TRANSPORT``); None outside one (an ASGI server of a test)."""


CLOSE_GRACE_S = 1.0
"""How long a connection whose socket our own code closed may take to wind down (s)."""


class ConnectionEnd:
    """The end of one HTTP connection: the cancel scope its tasks run in.

    The connection handler enters :attr:`cancel_scope` around everything that serves the
    connection; :meth:`end` cancels it, so nothing of the connection outlives its end.

    Args:
        answer_after_eof_s: How long an answer due when the peer half-closed may take
            to be written (``limits.http_idle_timeout_ms``).
        server_stopping: Set once the HTTP server stops (graceful shutdown): from then
            on the connection's end half-closes its socket instead of closing it
            (:attr:`lingers`), and the server's handler drains and closes it.
    """

    def __init__(
        self, answer_after_eof_s: float = math.inf, server_stopping: trio.Event | None = None
    ) -> None:
        self.cancel_scope = trio.CancelScope()
        self._server_stopping = server_stopping
        self._after_next_send = False
        self._answer_after_eof_s = answer_after_eof_s
        self._answer_due = False
        self._peer_finished = False
        self.upgraded = False
        """The connection became a WebSocket (101): its writes are bounded by the
        client protocol's own ``limits.send_timeout_ms`` (``Connection``), which says
        SLOW_CLIENT, not by :class:`EndingStream`'s."""

    @property
    def lingers(self) -> bool:
        """True once the server stops: the socket is half-closed at the connection's
        end, not closed; whoever holds it drains it and closes it (a socket closed with
        the client's bytes unread sends a reset, which may throw away the last answer)."""
        return self._server_stopping is not None and self._server_stopping.is_set()

    @property
    def ended(self) -> bool:
        """True once :meth:`end` was called."""
        return self.cancel_scope.cancel_called

    def end(self) -> None:
        """End the connection now: every task serving it is cancelled (idempotent)."""
        self.cancel_scope.cancel()

    def end_soon(self) -> None:
        """End the connection :data:`CLOSE_GRACE_S` from now at the latest: for a socket
        the application closed itself (a WebSocket that does not read is aborted), which
        then winds down, recording why, before the scope cuts it."""
        self.cancel_scope.deadline = min(
            self.cancel_scope.deadline, trio.current_time() + CLOSE_GRACE_S
        )

    def end_after_next_send(self) -> None:
        """End the connection once the next write to its socket is done (or failed).

        Call it after an answer's head was sent and before its body (or its end, for a
        HEAD) is: the connection then ends as soon as the whole answer is written,
        whatever hypercorn would wait for after it.
        """
        self._after_next_send = True

    def request_received(self) -> None:
        """A whole request head was read: its answer is due, and the peer's EOF waits
        for it (:meth:`peer_finished`)."""
        self._answer_due = True

    def answered(self) -> None:
        """The answer due was written (or none is due any more: a WebSocket accepted,
        a request whose handling stopped); the connection ends now if its peer
        finished sending."""
        self._answer_due = False
        if self._peer_finished:
            self.end()

    async def peer_finished(self) -> None:
        """The peer's EOF: end the connection now if no answer is due; else wait (for
        :meth:`answered`, which ends it, or ``answer_after_eof_s``) and never return:
        the connection's scope is cancelled either way."""
        self._peer_finished = True
        if not self._answer_due:
            self.end()
            return
        self.cancel_scope.deadline = min(
            self.cancel_scope.deadline, trio.current_time() + self._answer_after_eof_s
        )
        await trio.sleep_forever()

    def _sent(self) -> None:
        if self._after_next_send:
            self.end()


@contextlib.asynccontextmanager
async def writes_end_with_the_connection(
    transport: trio.SocketStream, connection_end: ConnectionEnd | None = None
) -> AsyncIterator[None]:
    """Close ``transport``'s socket as soon as the block inside is cancelled (the
    connection's end, the server stopping), and when it is done; half-close it instead
    once the server stops (``connection_end.lingers``: the caller drains and closes it).

    Hypercorn shields every write from cancellation (``TCPServer.protocol_send``), so a
    write blocked on a client that does not read held its task, and with it the
    connection's slot and the stop of the whole HTTP server (a node's graceful shutdown
    waited for it until forced; found by a tester). Closing the socket under it makes
    that write fail at once (``trio.ClosedResourceError``); half-closing it makes it
    fail too (``trio.BrokenResourceError``, EPIPE), the bytes already queued still
    reaching the client before the end of the connection."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_close_when_cancelled, transport, connection_end)
        yield
        nursery.cancel_scope.cancel()


async def _close_when_cancelled(
    transport: trio.SocketStream, connection_end: ConnectionEnd | None
) -> None:
    try:
        await trio.sleep_forever()
    finally:
        if connection_end is not None and connection_end.lingers:
            half_close_now(transport)
        else:
            transport.socket.close()  # wakes a task blocked on it (trio's notify_closing)


def half_close_now(transport: trio.SocketStream) -> None:
    """Half-close ``transport``'s socket at once (``shutdown(SHUT_WR)``: the client gets
    what is queued, then EOF), without waiting; a write blocked on it fails (EPIPE)."""
    with contextlib.suppress(OSError):
        if transport.socket.fileno() != -1:
            transport.socket.shutdown(socket.SHUT_WR)


class EndingStream(trio.abc.HalfCloseableStream):
    """A connection's TCP stream, as hypercorn (or the TLS layer under it) uses it, that
    ends the connection (:meth:`ConnectionEnd.end`) when the stream is finished with.

    The peer's reset, and :meth:`aclose`, end it at once; its EOF too, unless an answer
    is due, which is written first (:meth:`ConnectionEnd.peer_finished`); a socket our
    own code closed under it (``websocket.WebSocketStream.abort``) ends it within
    :data:`CLOSE_GRACE_S`.
    ``socket`` is the TCP stream's (hypercorn reads the addresses from it). It has no
    ``do_handshake``: hypercorn tells a plain stream from a TLS one by that.

    A write that blocks longer than ``send_timeout_s`` (the client does not read what it
    asked for: a large ``/metrics`` to a peer whose window stays shut) ends the connection
    too: before, it held its connection slot for as long (found by a tester).

    Args:
        transport: The accepted TCP stream.
        connection_end: The connection's end.
        send_timeout_s: ``limits.send_timeout_ms``: longest one write may block (s).
    """

    def __init__(
        self,
        transport: trio.SocketStream,
        connection_end: ConnectionEnd,
        send_timeout_s: float = math.inf,
    ) -> None:
        self._transport = transport
        self._end = connection_end
        self._send_timeout_s = send_timeout_s

    @property
    def socket(self) -> trio.socket.SocketType:
        """The TCP socket."""
        return self._transport.socket

    @contextlib.contextmanager
    def _ending_on_failure(self) -> Iterator[None]:
        """A stream the peer broke ends the connection; one our side closed ends it soon
        (our side is winding it down)."""
        try:
            yield
        except trio.BrokenResourceError:
            self._end.end()
            raise
        except trio.ClosedResourceError:
            self._end.end_soon()
            raise

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Read from the TCP stream; a reset ends the connection, and so does EOF
        (``b""``), once the answer due if any is written: till then this waits, so
        hypercorn does not take the EOF for the end of the connection before it."""
        with self._ending_on_failure():
            data = await self._transport.receive_some(max_bytes)
        if not data:
            await self._end.peer_finished()
        return bytes(data)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Write to the TCP stream; a write the peer broke ends the connection, and so
        do the write :meth:`ConnectionEnd.end_after_next_send` waits for and one that
        blocked for ``send_timeout_s``.

        Raises:
            trio.BrokenResourceError: the peer broke the connection, or did not read
                for ``send_timeout_s``.
        """
        timeout_s = math.inf if self._end.upgraded else self._send_timeout_s
        try:
            with trio.move_on_after(timeout_s) as sending:
                with self._ending_on_failure():
                    await self._transport.send_all(data)
            if sending.cancelled_caught:
                self._end.end()
                raise trio.BrokenResourceError(
                    f"a write to the client blocked for {self._send_timeout_s:g} s "
                    "(limits.send_timeout_ms); it does not read"
                )
        finally:
            self._end._sent()

    async def wait_send_all_might_not_block(self) -> None:
        """As the TCP stream's."""
        await self._transport.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        """Half-close the TCP stream (hypercorn's last word before :meth:`aclose`)."""
        await self._transport.send_eof()

    async def aclose(self) -> None:
        """Close the TCP stream and end the connection; once the server stops
        (:attr:`ConnectionEnd.lingers`), half-close it instead: the server's handler
        drains and closes it."""
        try:
            if self._end.lingers:
                half_close_now(self._transport)
                await trio.lowlevel.checkpoint()
            else:
                await self._transport.aclose()
        finally:
            self._end.end()


class EndingTLSStream(trio.abc.Stream):
    """A connection's TLS stream, as hypercorn uses it, whose peer's ``close_notify`` ends
    the connection as :class:`EndingStream` does the TCP stream's EOF: at once, or once
    the answer due is written (:meth:`ConnectionEnd.peer_finished`).

    It has what hypercorn's trio server asks of a TLS stream (``do_handshake``,
    ``selected_alpn_protocol``, ``transport_stream``) and no ``send_eof``, as
    ``trio.SSLStream``, which is final, so it wraps one.

    Args:
        tls: The server side TLS stream over the connection's :class:`EndingStream`.
        connection_end: The connection's end.
    """

    def __init__(self, tls: trio.SSLStream[EndingStream], connection_end: ConnectionEnd) -> None:
        self._tls = tls
        self._end = connection_end

    @property
    def transport_stream(self) -> EndingStream:
        """The TCP stream under the TLS layer."""
        return self._tls.transport_stream

    async def do_handshake(self) -> None:
        """As ``trio.SSLStream.do_handshake``."""
        await self._tls.do_handshake()

    def selected_alpn_protocol(self) -> str | None:
        """As ``trio.SSLStream.selected_alpn_protocol``."""
        alpn: str | None = self._tls.selected_alpn_protocol()
        return alpn

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Read decrypted bytes; the peer's ``close_notify`` (``b""``) is its EOF."""
        data = await self._tls.receive_some(max_bytes)
        if not data:
            await self._end.peer_finished()
        return bytes(data)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """As ``trio.SSLStream.send_all``."""
        await self._tls.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        """As ``trio.SSLStream.wait_send_all_might_not_block``."""
        await self._tls.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        """As ``trio.SSLStream.aclose``."""
        await self._tls.aclose()
