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

A client that half-closes its side (``shutdown(SHUT_WR)``) after sending a request gets
no answer: its EOF ends the connection, as the RFC allows (RFC 9112 §9.6) and as
hypercorn itself treated it, now without the wait.

Source: docs/operations.md, "Limits" (``limits.max_http_connections``,
``limits.http_idle_timeout_ms``); docs/security.md, "The HTTP port".
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

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
    """

    def __init__(self) -> None:
        self.cancel_scope = trio.CancelScope()
        self._after_next_send = False

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

    def _sent(self) -> None:
        if self._after_next_send:
            self.end()


class EndingStream(trio.abc.HalfCloseableStream):
    """A connection's TCP stream, as hypercorn (or the TLS layer under it) uses it, that
    ends the connection (:meth:`ConnectionEnd.end`) when the stream is finished with.

    The peer's EOF or reset, and :meth:`aclose`, end it at once; a socket our own code
    closed under it (``websocket.WebSocketStream.abort``) ends it within
    :data:`CLOSE_GRACE_S`.
    ``socket`` is the TCP stream's (hypercorn reads the addresses from it). It has no
    ``do_handshake``: hypercorn tells a plain stream from a TLS one by that.

    Args:
        transport: The accepted TCP stream.
        connection_end: The connection's end.
    """

    def __init__(self, transport: trio.SocketStream, connection_end: ConnectionEnd) -> None:
        self._transport = transport
        self._end = connection_end

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
        """Read from the TCP stream; EOF (``b""``) or a reset ends the connection."""
        with self._ending_on_failure():
            data = await self._transport.receive_some(max_bytes)
        if not data:
            self._end.end()
        return bytes(data)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Write to the TCP stream; a write the peer broke ends the connection, and so
        does the write :meth:`ConnectionEnd.end_after_next_send` waits for."""
        try:
            with self._ending_on_failure():
                await self._transport.send_all(data)
        finally:
            self._end._sent()

    async def wait_send_all_might_not_block(self) -> None:
        """As the TCP stream's."""
        await self._transport.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        """Half-close the TCP stream (hypercorn's last word before :meth:`aclose`)."""
        await self._transport.send_eof()

    async def aclose(self) -> None:
        """Close the TCP stream and end the connection."""
        try:
            await self._transport.aclose()
        finally:
            self._end.end()
