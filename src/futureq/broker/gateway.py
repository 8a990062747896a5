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

import contextlib
import ctypes
import errno
import logging
import os
import socket
import ssl
import struct
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
from .connection import (
    HANDSHAKE_TIMEOUT_S,
    STOPPING,
    Connection,
    LingeringTransport,
    announce_stop,
    close_tls_cleanly,
    closed_log,
    half_close_and_drain,
    peer_name,
)

if TYPE_CHECKING:
    from .broker import Broker

log = logging.getLogger(__name__)

SHUTDOWN_DRAIN_S = 2.0
"""Graceful shutdown: how long, at most, answers already queued may take to reach the
clients (s); a client that does not read for this long is cut off (within
``server.shutdown_grace_ms``)."""
REFUSE_GRACE_S = 1.0
"""How long a refused connection may take to receive its TOO_MANY_CONNECTIONS (s)."""
MAX_REFUSING = 64
"""Refused connections being told why at once, each by a task that waits for the client's
close; beyond, a plain TCP one is told at once without waiting
(:func:`refuse_without_waiting`), a TLS one closed without a word."""
BACKLOG_POLL_S = 0.02
"""Closing a listener gracefully: the backlog is taken as empty once no connection has
come from it for this long (s)."""
MAX_BACKLOG_DRAIN_S = 0.5
"""Closing a listener gracefully: longest the queued connections are taken and refused
before it closes (s); a client that connects without end cannot hold a stop. With the
refusals' own :data:`REFUSE_GRACE_S` it bounds what a connection storm adds to a stop
(:meth:`ClientGateway.close_listeners`): before, 1 s of taking and 2 s of waiting for
refusals came on top of the grace period, near a sharded node's kill deadline."""
MAX_DISCARD_BYTES = 64 * 1024
"""A refused connection: what the client sent (its HELLO) is read and dropped, up to
this many bytes, until it closes (see :func:`_refuse_connection`)."""
ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
"""``accept`` errors of a node out of descriptors or memory: waited out, never fatal
(as ``trio.serve_listeners`` does)."""
ACCEPT_RETRY_S = 0.1
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
    or elsewhere (a 3xx code). The connection is then half-closed (under TLS after its
    ``close_notify``) and what the client sent is read and dropped until it closes (at
    most :data:`MAX_DISCARD_BYTES` over TCP, ``connection.LINGER_BYTES`` under TLS): a
    socket closed with unread bytes sends a reset, not a close, which may reach the
    client before it read the ERROR. The whole refusal takes at most 2 x REFUSE_GRACE_S.
    """
    metrics_closed()
    closed_log.log(logging.WARNING, "connection from %s refused: %s: %s", peer, code.name, message)
    if code == ErrorCode.UNAVAILABLE:
        announce_stop(stream, message)  # a WebSocket's close says 1001, going away
    data = codec.encode_frame(frames.Error(0, code, message))
    with trio.move_on_after(REFUSE_GRACE_S):
        try:
            if ssl_context is not None:
                stream = trio.SSLStream(_lingering(stream), ssl_context, server_side=True)
            await stream.send_all(data)
            if isinstance(stream, trio.abc.HalfCloseableStream):
                await half_close_and_drain(stream, MAX_DISCARD_BYTES, MAX_DISCARD_BYTES)
            else:
                # TLS: the HELLO is read, close_notify sent, the transport drained.
                # A WebSocket: its own close (1001 at a stop); a forced close below
                # would close its socket at once instead.
                if not await close_tls_cleanly(stream):
                    await stream.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
            pass
    with trio.move_on_after(REFUSE_GRACE_S, shield=True):
        await trio.aclose_forcefully(stream)


def refuse_without_waiting(stream: trio.SocketStream, data: bytes) -> None:
    """Refuse a plain TCP connection beyond :data:`MAX_REFUSING` (the HTTP port's:
    ``http.MAX_HTTP_REFUSING``) with no task and no wait: write ``data`` (the ERROR
    frame, or a 503: a fresh socket's send buffer takes it whole),
    read and drop what the client already sent (its HELLO, at most
    :data:`MAX_DISCARD_BYTES`), half-close, close. The close is then clean unless the
    client sends more after it (a client waits for the answer to its HELLO, so it does
    not). Before, these were closed with their HELLO unread: a reset, which could throw
    the refusal away, for every connection past 64 refused at once (a connection storm
    during a stop)."""
    sock = stream.socket
    with contextlib.suppress(OSError):
        fd = sock.fileno()
        if fd == -1:
            return
        os.write(fd, data)
        dropped = 0
        with contextlib.suppress(BlockingIOError):  # the socket is non-blocking
            while dropped < MAX_DISCARD_BYTES:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                dropped += len(chunk)
        sock.shutdown(socket.SHUT_WR)


def _lingering(stream: trio.abc.Stream) -> trio.abc.Stream:
    """``stream`` to wrap in server-side TLS: a TCP stream as a
    :class:`~futureq.broker.connection.LingeringTransport` (its close after the TLS
    ``close_notify`` can be clean), anything else as it is."""
    return LingeringTransport(stream) if isinstance(stream, trio.SocketStream) else stream


async def refuse_stopping(stream: trio.SocketStream, ssl_context: ssl.SSLContext | None) -> None:
    """Tell a client connection the node is shutting down (UNAVAILABLE, :data:`STOPPING`)
    and close it cleanly: for a process that holds a node's client socket without
    serving it (a sharded node's supervisor, once its shards stopped)."""
    await _refuse_connection(
        stream, peer_name(stream), ErrorCode.UNAVAILABLE, STOPPING, lambda: None, ssl_context
    )


_SO_ATTACH_FILTER = 26
"""Linux ``SO_ATTACH_FILTER`` (``asm-generic/socket.h``)."""
_DROP_EVERY_PACKET = struct.pack("HBBI", 0x06, 0, 0, 0)
"""One classic BPF instruction, ``BPF_RET | BPF_K`` with 0: keep no byte (drop)."""


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def stop_handshakes(sock: trio.socket.SocketType) -> bool:
    """Make a listening socket that is about to close drop every packet it receives from
    now on (Linux: a socket filter): no new connection is queued on it, so its backlog
    can be emptied (:func:`take_backlog`) before it closes, even while clients keep
    connecting (a client's SYN is dropped, sent again and then refused once the socket
    is closed, a clean ``connection refused``). Call only on a socket no other process
    listens on. Returns False where it cannot be done (another OS): the backlog is then
    taken as it comes."""
    program = ctypes.create_string_buffer(_DROP_EVERY_PACKET, len(_DROP_EVERY_PACKET))
    fprog = _SockFprog(1, ctypes.addressof(program))
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, bytes(fprog))
    except OSError:
        return False
    return True


async def accept_retrying(
    listener: trio.SocketListener, logger: logging.Logger, failed: str
) -> trio.SocketStream:
    """The next connection on ``listener``. An accept that fails for lack of descriptors
    or memory (:data:`ACCEPT_CAPACITY_ERRNOS`) is logged on ``logger`` as ``failed``
    ("accept failed") and tried again after :data:`ACCEPT_RETRY_S`: a node out of file
    descriptors keeps serving the connections it has and takes new ones once some close.

    Raises:
        OSError: any other accept failure.
    """
    while True:
        try:
            return await listener.accept()
        except OSError as exc:
            if exc.errno not in ACCEPT_CAPACITY_ERRNOS:
                raise
            logger.error("%s: %s; retrying in %g s", failed, exc, ACCEPT_RETRY_S)
            await trio.sleep(ACCEPT_RETRY_S)


async def take_backlog(
    listener: trio.SocketListener, handle: Callable[[trio.SocketStream], Awaitable[None]]
) -> int:
    """Accept the connections queued on ``listener`` and start ``handle`` on each
    (detached: the caller's nursery runs them), until none came for
    :data:`BACKLOG_POLL_S` or for at most :data:`MAX_BACKLOG_DRAIN_S`. Call just before
    closing a listener: a connection still queued when it closes gets a reset, which a
    client reports as an error, instead of the answer ``handle`` gives. Returns how many
    were taken."""
    taken = 0
    with trio.move_on_after(MAX_BACKLOG_DRAIN_S):
        while True:
            stream: trio.SocketStream | None = None
            with trio.move_on_after(BACKLOG_POLL_S):
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in ACCEPT_CAPACITY_ERRNOS:
                        raise
                    return taken  # out of descriptors: what is left cannot be answered
            if stream is None:
                return taken
            taken += 1
            await handle(stream)
    return taken


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
        """True once :meth:`refuse_new` or :meth:`stop_serving` ran: new connections are
        refused (UNAVAILABLE)."""
        self._accepting: set[trio.CancelScope] = set()
        self._closing = False
        self._listeners_closed = trio.Event()
        self._no_refusals = trio.Event()
        """Set while no refusal is being written (:meth:`close_listeners` waits)."""
        self._no_refusals.set()

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
        self,
        listeners: list[trio.SocketListener],
        *,
        handler_nursery: trio.Nursery | None = None,
        shared: bool = False,
    ) -> None:
        """Accept connections on ``listeners`` until :meth:`close_listeners` (then return
        once they are closed) or cancelled (they close at once); one task per connection,
        in ``handler_nursery`` (default: one of its own, waited for). Takes ownership of
        the listeners. ``shared``: another process listens on the same sockets (a shard's
        supervisor, which holds them for the next incarnation): closing them, this one
        does not stop their handshakes (:func:`stop_handshakes`)."""
        try:
            async with trio.open_nursery() as own:
                handlers = handler_nursery or own
                for listener in listeners:
                    own.start_soon(self._accept, listener, handlers, shared)
        finally:
            self._listeners_closed.set()

    def refuse_new(self) -> None:
        """Graceful shutdown, first step: connections accepted from now on are refused
        with UNAVAILABLE (the client library retries elsewhere or later); the listeners
        stay open until :meth:`close_listeners`, so a client connecting meanwhile reads
        why rather than meeting a reset."""
        self.stopping = True

    async def close_listeners(self) -> None:
        """Graceful shutdown, last step: refuse what the listeners' backlogs hold
        (:func:`take_backlog`), close them, and wait (bounded) for the refusals to be
        written. Before, the listeners were closed at the start of the stop and the
        connections queued on them got a reset, which clients reported as an error.
        Takes at most :data:`MAX_BACKLOG_DRAIN_S` + :data:`BACKLOG_POLL_S` +
        :data:`REFUSE_GRACE_S`, however many clients connect meanwhile."""
        self.stopping = True
        self._closing = True
        for scope in list(self._accepting):
            scope.cancel()
        with trio.move_on_after(MAX_BACKLOG_DRAIN_S + BACKLOG_POLL_S):
            await self._listeners_closed.wait()
        # A refusal's answer is written within REFUSE_GRACE_S; the rest of its time is
        # the client's own close, which a storm of clients that never close would hold.
        with trio.move_on_after(REFUSE_GRACE_S):
            await self._no_refusals.wait()

    async def _accept(
        self, listener: trio.SocketListener, handlers: trio.Nursery, shared: bool
    ) -> None:
        async def hand_over(stream: trio.SocketStream) -> None:
            handlers.start_soon(self._serve_tcp_stream, stream)

        async with listener:
            with trio.CancelScope() as accepting:
                self._accepting.add(accepting)
                try:
                    while True:
                        await hand_over(await accept_retrying(listener, log, "accept failed"))
                finally:
                    self._accepting.discard(accepting)
            if self._closing:
                if not shared:
                    stop_handshakes(listener.socket)
                await take_backlog(listener, hand_over)

    async def _serve_tcp_stream(self, stream: trio.abc.Stream) -> None:
        try:
            await self.serve_stream(stream, peer_name(stream), ssl_context=self.ssl_context)
        finally:
            await trio.aclose_forcefully(stream)

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
            if ssl_context is None and isinstance(stream, trio.SocketStream):
                refuse_without_waiting(stream, codec.encode_frame(frames.Error(0, code, message)))
            await trio.aclose_forcefully(stream)
            return
        if self._no_refusals.is_set():
            self._no_refusals = trio.Event()
        try:
            await _refuse_connection(stream, peer, code, message, counted, ssl_context)
        finally:
            self._refusing.release()
            if not self._refusing.borrowed_tokens:
                self._no_refusals.set()

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
        stream = trio.SSLStream(_lingering(stream), ssl_context, server_side=True)
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
