"""The client listener: admission of every transport's connections, refusals, serving.

:class:`ClientGateway` serves TCP and TLS connections (:meth:`ClientGateway.serve_tcp`)
and the HTTP port's WebSocket connections (:meth:`ClientGateway.serve_stream`) through
one code path: at most ``max_connections`` served at once and
:data:`MAX_UNGREETED_PER_ADDRESS` from one address before their HELLO; one more is told
``TOO_MANY_CONNECTIONS`` (or ``UNAVAILABLE`` while the node stops) and closed at once.
Each admitted connection is served by a :class:`~futureq.broker.connection.Connection`.
On a graceful shutdown every connection stops reading and gets at most
:data:`SHUTDOWN_DRAIN_S` to take its queued answers.

Source: ``docs/protocol.md``; ``docs/operations.md``, "Limits".
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from futureq.errors import (
    ErrorCode,
    StorageError,
)
from futureq.tls_handshake import NOT_TLS_REASONS
from futureq.wire import codec, frames

from .access import AccessControl
from .buffers import NodeBuffers
from .connection import HANDSHAKE_TIMEOUT_S, Connection, closed_log, peer_name

if TYPE_CHECKING:
    from .broker import Broker

STOPPING = "the node is shutting down; connect to another node or retry later"
"""The UNAVAILABLE refusal of a connection that arrives during a graceful shutdown."""
SHUTDOWN_DRAIN_S = 2.0
"""Graceful shutdown: how long, at most, answers already queued may take to reach the
clients (s); a client that does not read for this long is cut off (within
``server.shutdown_grace_ms``)."""
REFUSE_GRACE_S = 1.0
"""How long a refused connection may take to receive its TOO_MANY_CONNECTIONS (s)."""
MAX_REFUSING = 64
"""Refused connections being told why at once; beyond, they are closed without a word."""
MAX_UNGREETED_PER_ADDRESS = 64
"""Connections from one address that may be open without having sent HELLO (and so
without having authenticated); one more is refused at once. A host that opens
connections and says nothing cannot take every slot of ``limits.max_connections``."""


async def _refuse_connection(
    stream: trio.abc.Stream,
    peer: str,
    code: ErrorCode,
    message: str,
    metrics_closed: Callable[[], None],
    ssl_context: ssl.SSLContext | None,
) -> None:
    """Tell a connection the node does not serve it now, and why; then close it (it
    never holds a slot).

    The ERROR frame (``code``: TOO_MANY_CONNECTIONS, or UNAVAILABLE from a node shutting
    down) is written at once (after the TLS handshake, under TLS), without waiting for
    the HELLO: the client library reads it as the answer to its HELLO and retries later
    or elsewhere (a 3xx code). The whole refusal takes at most 2 x REFUSE_GRACE_S.
    """
    metrics_closed()
    closed_log.log(logging.WARNING, "connection from %s refused: %s: %s", peer, code.name, message)
    data = codec.encode_frame(frames.Error(0, code, message))
    with trio.move_on_after(REFUSE_GRACE_S):
        try:
            if ssl_context is not None:
                stream = trio.SSLStream(stream, ssl_context, server_side=True)
            await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
            pass
    with trio.move_on_after(REFUSE_GRACE_S, shield=True):
        await trio.aclose_forcefully(stream)


class ClientGateway:
    """Serves client connections of every transport through one code path.

    TCP and TLS connections (:meth:`serve_tcp`) and WebSocket connections of the HTTP
    port's ``/ws`` (:meth:`serve_stream`, called by :mod:`futureq.broker.websocket`)
    all go through :meth:`serve_stream`: the same admission (at most ``max_connections``
    served at once and :data:`MAX_UNGREETED_PER_ADDRESS` from one address before their
    HELLO; one more is told ``TOO_MANY_CONNECTIONS`` and closed at once, never left
    waiting with a file descriptor), then one :class:`Connection` over a
    :class:`trio.abc.Stream` with the same access control and node buffers, counted in
    the same metrics. So HELLO, authentication, permissions and every limit apply to
    each transport alike.

    Args:
        broker: The node's request API.
        access: Authentication and permissions (default: ``server.auth_token`` only).
        node_buffers: The node-wide buffer account (default: a new one).
        ssl_context: TLS for the TCP listener, or None for plain TCP.
        max_connections: Connections served at once (default ``limits.max_connections``;
            the server passes what the open-file limit leaves room for,
            :mod:`futureq.fd_budget`).
    """

    def __init__(
        self,
        broker: Broker,
        *,
        access: AccessControl | None = None,
        node_buffers: NodeBuffers | None = None,
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int | None = None,
    ) -> None:
        self.broker = broker
        self.access = access or AccessControl(broker.config.server.auth_token, None)
        self.node_buffers = node_buffers or NodeBuffers(broker.config.limits.max_node_buffer_bytes)
        self.ssl_context = ssl_context
        self.max_connections = (
            broker.config.limits.max_connections if max_connections is None else max_connections
        )
        self._limit = trio.CapacityLimiter(self.max_connections)
        self._refusing = trio.CapacityLimiter(MAX_REFUSING)
        self._closed_total = broker.metrics.connections_closed_total
        self._ungreeted: dict[str, int] = {}
        """Connections per client address that have not had their HELLO answered."""
        self._live: set[Connection] = set()
        """Connections being served (past admission), of every transport."""
        self._drained = trio.Event()
        self._drained.set()
        self.stopping = False
        """True once :meth:`stop_serving` ran: new connections are refused (UNAVAILABLE)."""

    def stop_serving(self) -> None:
        """Graceful shutdown: each connection reads no more requests, answers those it
        read, drains its answers and closes (:meth:`Connection.finish`); a connection
        arriving from now on (a WebSocket upgrade; a TLS connection whose handshake ends
        now) is refused with UNAVAILABLE. :meth:`wait_drained` waits for the end (not for
        handshakes under way: they are cut with what is left)."""
        self.stopping = True
        for connection in list(self._live):
            connection.finish()

    @property
    def connections_served(self) -> int:
        """Connections being served now (past admission)."""
        return len(self._live)

    async def wait_drained(self) -> None:
        """Block until no connection is being served (cancel to bound it)."""
        await self._drained.wait()

    async def _opened(self, connection: Connection) -> bool:
        """Count a connection in; once the node is stopping (it began during the TLS
        handshake), refuse it instead, over that TLS, and return False."""
        if self.stopping:
            stream, peer = connection.stream, connection.peer
            await self._refuse(stream, peer, STOPPING, None, ErrorCode.UNAVAILABLE)
            return False
        self._live.add(connection)
        if self._drained.is_set():
            self._drained = trio.Event()
        return True

    def _ended(self, connection: Connection) -> None:
        self._live.discard(connection)
        if not self._live:
            self._drained.set()

    async def serve_tcp(
        self, listeners: list[trio.SocketListener], *, handler_nursery: trio.Nursery | None = None
    ) -> None:
        """Accept connections on ``listeners`` until cancelled; one task per connection."""
        await trio.serve_listeners(
            self._serve_tcp_stream, listeners, handler_nursery=handler_nursery
        )

    async def _serve_tcp_stream(self, stream: trio.abc.Stream) -> None:
        await self.serve_stream(stream, peer_name(stream), ssl_context=self.ssl_context)

    async def _refuse(
        self,
        stream: trio.abc.Stream,
        peer: str,
        message: str,
        ssl_context: ssl.SSLContext | None,
        code: ErrorCode = ErrorCode.TOO_MANY_CONNECTIONS,
    ) -> None:
        counted = self._closed_total.labels(code.name.lower()).inc
        try:
            self._refusing.acquire_nowait()
        except trio.WouldBlock:
            counted()
            await trio.aclose_forcefully(stream)
            return
        try:
            await _refuse_connection(stream, peer, code, message, counted, ssl_context)
        finally:
            self._refusing.release()

    async def serve_stream(
        self,
        stream: trio.abc.Stream,
        peer: str,
        transport_token: str | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """Admit and serve one client connection until it ends; every transport comes here.

        Args:
            stream: Whole frames in and out (TCP, or a WebSocket adapter).
            peer: The client's ``host:port`` for limits and log lines.
            transport_token: A token the transport carried (see :class:`Connection`).
            ssl_context: Wrap ``stream`` in server-side TLS first (the TCP listener's).
        """
        if self.stopping:
            await self._refuse(stream, peer, STOPPING, ssl_context, ErrorCode.UNAVAILABLE)
            return
        host = peer.rsplit(":", 1)[0]
        ungreeted = self._ungreeted
        if ungreeted.get(host, 0) >= MAX_UNGREETED_PER_ADDRESS:
            await self._refuse(
                stream,
                peer,
                f"{MAX_UNGREETED_PER_ADDRESS} connections from this address have not sent "
                "HELLO yet; send HELLO on each connection at once, then retry",
                ssl_context,
            )
            return
        try:
            self._limit.acquire_nowait()
        except trio.WouldBlock:
            await self._refuse(
                stream,
                peer,
                f"this node serves {self.max_connections} client connections at once, its "
                "limit (limits.max_connections, or what the open-file limit leaves room "
                "for); retry later or on another node",
                ssl_context,
            )
            return
        ungreeted[host] = ungreeted.get(host, 0) + 1
        greeted = False

        def hello_answered() -> None:
            nonlocal greeted
            if greeted:
                return
            greeted = True
            left = ungreeted[host] - 1
            if left:
                ungreeted[host] = left
            else:
                del ungreeted[host]

        try:
            await _serve_connection(
                self.broker,
                stream,
                peer,
                self.access,
                self.node_buffers,
                ssl_context,
                hello_answered,
                transport_token,
                self._opened,
                self._ended,
            )
        finally:
            hello_answered()
            self._limit.release()


async def serve_clients(
    broker: Broker,
    listeners: list[trio.SocketListener],
    *,
    access: AccessControl | None = None,
    node_buffers: NodeBuffers | None = None,
    ssl_context: ssl.SSLContext | None = None,
    max_connections: int | None = None,
    handler_nursery: trio.Nursery | None = None,
) -> None:
    """Accept connections on ``listeners`` until cancelled (a :class:`ClientGateway` of
    its own; see it for the limits)."""
    gateway = ClientGateway(
        broker,
        access=access,
        node_buffers=node_buffers,
        ssl_context=ssl_context,
        max_connections=max_connections,
    )
    await gateway.serve_tcp(listeners, handler_nursery=handler_nursery)


def _handshake_failure(exc: BaseException) -> str:
    """Why a client's TLS handshake failed, never empty: trio's ``BrokenResourceError``
    and ``TooSlowError`` carry no text (the log line ended in a bare colon), the
    ``ssl.SSLError`` that says why is their cause."""
    if isinstance(exc, trio.TooSlowError):
        return f"no handshake within {HANDSHAKE_TIMEOUT_S:g} s"
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError) and seen.reason in NOT_TLS_REASONS:
            return f"the client did not start TLS ({seen.reason}): a plaintext client?"
        if str(seen):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    return "the client closed the connection during the handshake"


async def _serve_connection(
    broker: Broker,
    stream: trio.abc.Stream,
    peer: str,
    access: AccessControl,
    node_buffers: NodeBuffers,
    ssl_context: ssl.SSLContext | None,
    on_hello: Callable[[], None] | None = None,
    transport_token: str | None = None,
    on_open: Callable[[Connection], Awaitable[bool]] | None = None,
    on_end: Callable[[Connection], None] | None = None,
) -> None:
    if ssl_context is not None:
        stream = trio.SSLStream(stream, ssl_context, server_side=True)
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT_S):
                await stream.do_handshake()
        except (trio.TooSlowError, trio.BrokenResourceError, ssl.SSLError, OSError) as exc:
            closed_log.log(
                logging.INFO, "TLS handshake with %s failed: %s", peer, _handshake_failure(exc)
            )
            with trio.move_on_after(1, shield=True):
                await stream.aclose()
            return
    connection = Connection(broker, stream, access, node_buffers, peer, on_hello, transport_token)
    if on_open is not None and not await on_open(connection):
        return  # refused: the node began to stop during the TLS handshake
    broker.metrics.connections_accepted_total.inc()
    broker.metrics.client_connections.inc()
    try:
        await connection.serve()
    except* StorageError:
        raise  # the node cannot go on without its disk
    except* Exception as group:
        # A bug of ours in one connection's handling must not take the server
        # down; it is the one case that deserves a traceback.
        closed_log.log(
            logging.ERROR,
            "connection from %s: handler failed (a bug); connection closed",
            peer,
            exc_info=group,
        )
    finally:
        broker.metrics.client_connections.dec()
        if on_end is not None:
            on_end(connection)
