"""The client listener: one task per connection driving a sans-IO ``ServerSession``.

Each connection has a reader (decodes frames, starts request handlers) and a writer
(drains an outbox bounded in bytes). Requests pipeline: each PUBLISH, SUBSCRIBE, ACK,
NACK, STATUS or group request runs in its own task of the connection's nursery, bounded
by ``MAX_REQUESTS_IN_PROGRESS`` per connection, and its answer echoes the request id.
A refused request (2xx, 3xx) fails alone; a protocol error (1xx) gets an ERROR frame,
then the connection closes. Nothing a client sends can stop the server.

Every transport (TCP, TLS, WebSocket) serves its connections through :class:`Connection`,
so the HELLO token is authenticated and every request frame is checked against the
client's permissions in one place (:mod:`futureq.broker.access`).

Limits (``docs/operations.md``, "Limits"; issue 10):

* the outbox holds at most ``limits.max_connection_buffer_bytes`` before deliveries stop
  going to that connection (they stay with the group's other consumers) and its
  requests stop being read; twice that closes it (``SLOW_CLIENT``);
* all connections together hold at most ``limits.max_node_buffer_bytes`` (outgoing
  bytes plus incomplete incoming frames) before deliveries stop and incomplete frames
  wait (:class:`NodeBuffers`);
* a frame must be complete ``limits.frame_deadline_ms`` after its first byte, and no
  byte of it may be ``limits.frame_stall_ms`` late while the server reads
  (``FRAME_TIMEOUT``; a half-sent frame is dropped soon, not held); a frame that has
  waited :data:`EVICT_AFTER_S` for inbound room drops the oldest incomplete frame begun
  before it (trickled half-frames cannot hold the budget until their deadline); a read
  takes at most what the node's inbound budget has room for (at least
  ``MIN_RECEIVE_BYTES``); a client silent for ``limits.keepalive_interval_ms`` gets a PING
  and must send something within ``limits.keepalive_timeout_ms`` (``KEEPALIVE_TIMEOUT``);
  one write may block for at most ``limits.send_timeout_ms`` (``SLOW_CLIENT``).

A connection the server closes logs one line (peer, error code, sentence), at most
:data:`~futureq.rate_limited_log.LOG_LINES_PER_MINUTE` a minute, each part cut to
1,000 characters; tracebacks are only for bugs of ours.

Source: ``docs/protocol.md``.
"""

from __future__ import annotations

import itertools
import logging
import os
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from futureq import __version__
from futureq.config import join_host_port
from futureq.errors import (
    ErrorCode,
    LocalProtocolError,
    NoSpaceError,
    NotLeaderError,
    RemoteProtocolError,
    RequestError,
    StorageError,
    WrongShardError,
)
from futureq.quick_thread import tasks_runnable
from futureq.rate_limited_log import RateLimitedLog
from futureq.shards.slots import even_map, topic_slot
from futureq.wire import codec, frames, validation
from futureq.wire.session import (
    CLOSED,
    NEED_DATA,
    RefusedRequest,
    ServerSession,
    SessionState,
)

from . import manage
from .access import ANONYMOUS, AccessControl, Principal
from .command_log import no_space_error

if TYPE_CHECKING:
    from futureq.shards.layout import ShardRole

    from .broker import Broker
    from .hub import Consumer

log = logging.getLogger(__name__)

MAX_REQUESTS_IN_PROGRESS = 256
"""Requests of one connection being served at once; the reader waits beyond that, and
beyond ``limits.max_connection_buffer_bytes`` of their frames (one request is always
served, whatever its size): a client pipelining 256 frames of 4 MiB made its node hold
1 GiB for it."""
HANDSHAKE_TIMEOUT_S = 10.0
LEADERSHIP_CLOSE_GRACE_S = 2.0
"""After a leadership change, how long in-progress requests may finish before closing."""
STOPPING = "the node is shutting down; connect to another node or retry later"
"""The UNAVAILABLE refusal of a connection that arrives during a graceful shutdown."""
SHUTDOWN_DRAIN_S = 2.0
"""Graceful shutdown: how long, at most, answers already queued may take to reach the
clients (s); a client that does not read for this long is cut off (within
``server.shutdown_grace_ms``)."""
RECEIVE_BYTES = 256 * 1024
MIN_RECEIVE_BYTES = 4 * 1024
EVICT_AFTER_S = 1.0
"""A frame waiting this long for inbound room drops the oldest incomplete frame whose
client is slow (``NodeBuffers.wait_room``)."""
"""A read when the node's inbound budget is (nearly) spent takes at most this much."""
WRITE_COALESCE_BYTES = 256 * 1024
"""The writer joins queued frames into one ``send_all`` up to this size (bytes)."""
ROOM_AGAIN_FRACTION = 0.5
"""A full buffer counts as having room again once below this fraction of its limit."""
_connection_ids = itertools.count(1)


def _subscriptions(held: int, coming: int) -> str:
    """``"3 subscriptions"``, or ``"3 subscriptions and 2 being made"``."""
    return f"{held} subscriptions" + (f" and {coming} being made" if coming else "")


closed_log = RateLimitedLog(log)


class NodeBuffers:
    """Bytes held in every client connection's buffers on this node, both directions.

    Each direction is bounded by ``limit_bytes`` on its own: past it no more deliveries
    are queued (outgoing), or incomplete frames wait for the rest of theirs to be read
    (incoming; the frame deadline still runs). Separately, so that clients who do not
    read can never stop the others' requests from being read.

    Args:
        limit_bytes: ``limits.max_node_buffer_bytes``.
        on_room: Called once the buffers are below half the limit again after it was
            reached (the dispatcher then looks at every group with consumers).
        on_full: Called each time the limit is reached and deliveries are held back.

    Each connection refused room because the node was full is also told, by its
    :meth:`Outbox.room_again`, as soon as the node is below the limit again: a
    consumer the dispatcher set aside then (``GroupRuntime.ready``) must not wait for
    half the limit, which a few slow readers can keep from coming for as long as
    they read.
    """

    def __init__(
        self,
        limit_bytes: int,
        on_room: Callable[[], None] | None = None,
        on_full: Callable[[], None] | None = None,
    ) -> None:
        self.limit_bytes = limit_bytes
        self.on_room = on_room
        self.on_full = on_full
        self.outbound = 0
        self.inbound = 0
        self.requests = 0
        """Bytes of the frames of requests read and being served, on every connection:
        at most ``limit_bytes`` (:meth:`wait_request_room`), and each connection's own at
        most ``limits.max_connection_buffer_bytes``."""
        self._request_room = trio.Event()
        self._request_waiting = False
        self._was_full = False
        self._refused: dict[Outbox, None] = {}
        """Outboxes refused room because the node was full, told when it is not."""
        self._room = trio.Event()
        self.full_count = 0
        """Times the node's buffers were found full (deliveries held back)."""
        self._incomplete: dict[int, tuple[float, Callable[[], None]]] = {}
        self.evicted_count = 0
        """Incomplete frames dropped to make room for others (:meth:`wait_room`)."""

    @property
    def total(self) -> int:
        """Bytes held now."""
        return self.outbound + self.inbound

    def has_room(self, asking: Outbox | None = None) -> bool:
        """True while the node may buffer more deliveries; a refused ``asking`` outbox
        is told when it may again (:meth:`Outbox.room_again`)."""
        if self.outbound < self.limit_bytes:
            return True
        if asking is not None:
            self._refused[asking] = None
        if not self._was_full:
            self._was_full = True
            self.full_count += 1
            if self.on_full is not None:
                self.on_full()
        return False

    def change(self, outbound: int = 0, inbound: int = 0) -> None:
        """Account for bytes added (positive) or released (negative)."""
        self.outbound += outbound
        self.inbound += inbound
        if inbound < 0 and self.inbound < self.limit_bytes:
            self._room.set()
            self._room = trio.Event()
        if outbound < 0 and self._refused and self.outbound < self.limit_bytes:
            refused, self._refused = self._refused, {}
            for outbox in refused:
                outbox.room_again()
        if (
            outbound < 0
            and self._was_full
            and self.outbound < self.limit_bytes * ROOM_AGAIN_FRACTION
        ):
            self._was_full = False
            if self.on_room is not None:
                self.on_room()

    async def wait_room(self, key: int | None = None, frame_started: float = 0.0) -> None:
        """Block until incomplete incoming frames hold less than the limit.

        Each :data:`EVICT_AFTER_S` spent waiting, the oldest incomplete frame begun
        before the waiter's own (``frame_started``, trio time) is dropped
        (:meth:`incomplete`), so clients holding or trickling half-sent frames cannot
        keep the budget from everyone else until their frame deadline. Only frames
        older than the waiter's are candidates: the one dropped has had the longest to
        arrive (frames of well-behaved clients complete in moments, so it is rarely
        theirs).
        """
        while self.inbound >= self.limit_bytes:
            room = self._room
            with trio.move_on_after(EVICT_AFTER_S) as waited:
                await room.wait()
            if not waited.cancelled_caught:
                continue
            older = [
                (started, other)
                for other, (started, _) in self._incomplete.items()
                if other != key and started < frame_started
            ]
            if older:
                _, victim = min(older)
                _, evict = self._incomplete.pop(victim)
                self.evicted_count += 1
                evict()

    async def wait_request_room(self, size: int) -> None:
        """Block until the requests in progress on every connection hold few enough
        bytes to take one of ``size`` more (one is always taken when none is in
        progress on the node, whatever its size).

        The waiting frame is still counted in ``inbound`` (its connection counts what
        it read only once it has served every whole frame read), so frames waiting here
        stay within that budget, and their connections read nothing more meanwhile.
        """
        while self.requests and self.requests + size > self.limit_bytes:
            self._request_waiting = True
            await self._request_room.wait()

    def request_started(self, size: int) -> None:
        """A request of ``size`` bytes is being served (after :meth:`wait_request_room`)."""
        self.requests += size

    def request_ended(self, size: int) -> None:
        """A request of ``size`` bytes was answered (or failed)."""
        self.requests -= size
        if self._request_waiting:
            self._request_waiting = False
            self._request_room.set()
            self._request_room = trio.Event()

    def incomplete(self, key: int, frame_started: float, evict: Callable[[], None]) -> None:
        """Connection ``key`` waits for more of a frame begun at ``frame_started`` (trio
        time); ``evict`` drops it if the budget is needed (:meth:`wait_room`)."""
        self._incomplete[key] = (frame_started, evict)

    def forget(self, outbox: Outbox) -> None:
        """A closed outbox is not told about room any more."""
        self._refused.pop(outbox, None)

    def done_waiting(self, key: int) -> None:
        """Connection ``key`` got bytes (or ended): no longer a candidate for eviction."""
        self._incomplete.pop(key, None)


class Outbox:
    """One connection's outgoing frames, bounded in bytes (never blocks a sender).

    Args:
        limit_bytes: ``limits.max_connection_buffer_bytes``: no more deliveries at this
            size; :attr:`overflowed` at twice this.
        node: The node-wide account.
        on_room: Called when the outbox drained after deliveries were held back.
        on_full: Called each time the outbox is found full and deliveries are held back.

    With :attr:`direct_fd` set (a plain TCP connection), bytes sent while nothing is
    queued, the writer is not writing and no other task is ready to run go to the
    socket at once (non-blocking); only what the socket does not take is queued for the
    writer task. Waking the writer cost a pass of the event loop on the way to every
    answer of a quiet connection (as the Raft transport found for AppendEntries:
    ``Transport._write_now``). With other tasks ready (a group commit answering many
    requests) the writer joins what they queue into one send: writing each answer at
    once cost 5-10 % of the throughput at batch 100 (``bench.ab``).
    """

    def __init__(
        self,
        limit_bytes: int,
        node: NodeBuffers,
        on_room: Callable[[], None] | None = None,
        on_full: Callable[[], None] | None = None,
    ) -> None:
        self.limit_bytes = limit_bytes
        self.node = node
        self.on_room = on_room
        self.on_full = on_full
        self.buffered_bytes = 0
        self.closed = False
        self._frames: deque[bytes] = deque()
        self._ready = trio.Event()
        self._room = trio.Event()
        self._held = False
        self.full_count = 0
        """Times this outbox was found full (deliveries held back)."""
        self.direct_fd = -1
        """The connection's socket, non-blocking, for writes at once; -1: never."""
        self._writing = False
        """The writer holds bytes taken by :meth:`take` not yet :meth:`written`."""

    def send_nowait(self, data: bytes) -> bool:
        """Queue encoded frame bytes (or write them at once, see the class docstring);
        False once the connection is closing."""
        if self.closed:
            return False
        if self.direct_fd >= 0 and not self._writing and not self._frames and not tasks_runnable():
            try:
                sent = os.write(self.direct_fd, data)
            except OSError:  # full (BlockingIOError) or broken: the writer meets it
                sent = 0
            if sent == len(data):
                return True
            data = data[sent:]
        self._frames.append(data)
        self.buffered_bytes += len(data)
        self.node.change(outbound=len(data))
        self._ready.set()
        return True

    def has_room(self) -> bool:
        """True while deliveries may be pushed (this buffer and the node's have room)."""
        if self.closed:
            return False
        if self.buffered_bytes >= self.limit_bytes:
            if not self._held:
                self._held = True
                self.full_count += 1
                if self.on_full is not None:
                    self.on_full()
            return False
        if not self.node.has_room(self):
            self._held = True
            return False
        return True

    def room_again(self) -> None:
        """The node, which refused this outbox room, has room again (NodeBuffers)."""
        if not self.closed and self.on_room is not None:
            self.on_room()

    @property
    def overflowed(self) -> bool:
        """True past twice the limit: the client does not read its answers."""
        return self.buffered_bytes > 2 * self.limit_bytes

    async def take(self) -> bytes | None:
        """The next bytes to write (frames joined up to a size), or None once closed
        and drained."""
        while not self._frames:
            if self.closed:
                return None
            await self._ready.wait()
            self._ready = trio.Event()
        chunks = [self._frames.popleft()]
        size = len(chunks[0])
        while self._frames and size + len(self._frames[0]) <= WRITE_COALESCE_BYTES:
            chunks.append(self._frames.popleft())
            size += len(chunks[-1])
        self._writing = True
        return b"".join(chunks) if len(chunks) > 1 else chunks[0]

    def written(self, size: int) -> None:
        """``size`` bytes handed out by :meth:`take` reached the socket."""
        self._writing = False
        self.buffered_bytes -= size
        self.node.change(outbound=-size)
        if self.buffered_bytes < self.limit_bytes:
            self._room.set()
            self._room = trio.Event()
        if self._held and self.buffered_bytes < self.limit_bytes * ROOM_AGAIN_FRACTION:
            self._held = False
            if self.on_room is not None:
                self.on_room()

    async def wait_room(self) -> None:
        """Block until the outbox holds less than its limit (the reader's back-pressure)."""
        while self.buffered_bytes >= self.limit_bytes and not self.closed:
            await self._room.wait()

    def close(self) -> None:
        """No more frames; :meth:`take` drains what is queued, then returns None."""
        self.closed = True
        self.node.forget(self)
        self._ready.set()
        self._room.set()

    def discard(self) -> None:
        """Drop whatever was not written (the connection is gone)."""
        self.close()
        dropped = self.buffered_bytes
        self._frames.clear()
        self.buffered_bytes = 0
        if dropped:
            self.node.change(outbound=-dropped)


class _Closing(Exception):
    """The server closes this connection: ``code`` and ``message`` say why."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        tell_client: bool = True,
        request_id: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.tell_client = tell_client
        self.request_id = request_id


def _first_closing(group: BaseException) -> _Closing:
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    assert isinstance(group, _Closing)
    return group


def _peer_name(stream: trio.abc.Stream) -> str:
    inner = stream
    while isinstance(inner, trio.SSLStream):
        inner = inner.transport_stream
    sock = getattr(inner, "socket", None)
    try:
        host, port = sock.getpeername()[:2] if sock is not None else ("?", 0)
    except OSError:
        return "?"
    return join_host_port(str(host), port)


class Connection:
    """One client connection: its session, outbox, principal and subscriptions.

    Args:
        broker: The node's request API.
        stream: The transport (TCP, TLS, or a WebSocket adapter).
        access: Authentication and the per-frame permission check.
        node_buffers: The node-wide buffer account.
        peer: The client's address for log lines (found from the stream if None).
        on_hello: Called once the client's HELLO is answered (it authenticated).
        transport_token: A token the transport already proved (the HTTP ``Authorization``
            of a ``/ws`` upgrade, which a browser sends for the dashboard's own origin);
            a HELLO without a token is authenticated with it.
    """

    def __init__(
        self,
        broker: Broker,
        stream: trio.abc.Stream,
        access: AccessControl | None = None,
        node_buffers: NodeBuffers | None = None,
        peer: str | None = None,
        on_hello: Callable[[], None] | None = None,
        transport_token: str | None = None,
    ) -> None:
        self.id = next(_connection_ids)
        self._on_hello = on_hello
        self.broker = broker
        self.stream = stream
        self.peer = peer or _peer_name(stream)
        self.transport_token = transport_token
        config = broker.config
        limits = config.limits
        self.limits = limits
        self.access = access or AccessControl(config.server.auth_token, None)
        self.principal: Principal = ANONYMOUS
        # The token is checked here (access), not by the session.
        self.session = ServerSession(limits.max_frame_bytes, frames.SUPPORTED_VERSIONS, None)
        self.node_buffers = node_buffers or NodeBuffers(limits.max_node_buffer_bytes)
        full = broker.metrics.buffer_full_total.labels("connection")
        self.outbox = Outbox(
            limits.max_connection_buffer_bytes,
            self.node_buffers,
            self._deliveries_may_resume,
            full.inc,
        )
        if type(stream) is trio.SocketStream:
            # The socket is closed only after the outbox (serve's finally), so a
            # write at once never reaches a descriptor number reused by another.
            self.outbox.direct_fd = stream.socket.fileno()
        self.subscriptions: dict[int, Consumer] = {}
        self._subscribing = 0
        """SUBSCRIBEs of this connection past their limit check, not yet registered."""
        self._limit = trio.Semaphore(MAX_REQUESTS_IN_PROGRESS)
        self._request_bytes = 0
        """Bytes of the frames of the requests being served (read, not yet answered)."""
        self._request_bytes_limit = self.limits.max_connection_buffer_bytes
        self._request_room: trio.Event | None = None
        """Set when a request ends, while the reader waits for room for the next."""
        self._reading = trio.CancelScope()
        self._scope = trio.CancelScope()
        self._closing: _Closing | None = None
        self._frame_started: float | None = None
        self._waiting_scope = trio.CancelScope()
        self._evicted = False
        self._last_receive = 0.0
        self._inbound_counted = 0
        self._watch: tuple[int, float] | None = None
        """(request id, interval s) of the connection's WATCH, or None."""
        self._watch_changed = trio.Event()

    # ------------------------------------------------------------ lifetime

    async def serve(self) -> None:
        """Serve until the client closes, breaks the protocol, or the server stops."""
        try:
            with self._scope:
                async with trio.open_nursery() as connection:
                    connection.start_soon(self._close_on_leadership_change, connection.cancel_scope)
                    connection.start_soon(self._watch_access)
                    connection.start_soon(self._watcher)
                    async with trio.open_nursery() as io:
                        io.start_soon(self._writer)
                        try:
                            # Requests run in their own nursery: at EOF (a client may
                            # half-close) every answer is queued before the outbox closes.
                            async with trio.open_nursery() as requests:
                                with self._reading:
                                    await self._reader(requests)
                        except* _Closing as group:
                            self._close(_first_closing(group))
                        finally:
                            self.outbox.close()
                    connection.cancel_scope.cancel()
        except* (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
            pass
        finally:
            for consumer in list(self.subscriptions.values()):
                self.broker.unsubscribe(consumer)
            self.subscriptions.clear()
            self.outbox.discard()
            self._count_inbound(0)
            closing = self._closing
            if closing is not None:
                self.broker.metrics.connections_closed_total.labels(closing.code.name.lower()).inc()
                closed_log.log(
                    logging.INFO,
                    "connection %d from %s closed: %s: %s",
                    self.id,
                    self.peer,
                    closing.code.name,
                    closing.message,
                )
            with trio.move_on_after(1, shield=True):
                await self.stream.aclose()

    def _close(self, closing: _Closing) -> None:
        """Record why the server closes the connection (the first reason wins); queue the
        ERROR frame for the client."""
        if self._closing is not None:
            return
        self._closing = closing
        if closing.tell_client and not self.outbox.closed:
            error = RemoteProtocolError(closing.code, closing.message)
            self.outbox.send_nowait(self.session.error_bytes(error, closing.request_id))
        self.outbox.close()

    def _abort(self, closing: _Closing) -> None:
        """Close at once, without draining (a client that does not read)."""
        self._close(closing)
        self._scope.cancel()

    async def _close_on_leadership_change(self, scope: trio.CancelScope) -> None:
        """Leadership moved: close, so the client reconnects and follows the new leader.

        A connection to a node that *became* the leader is kept: it already is where
        the client must go, and it holds nothing of an earlier leadership (subscriptions,
        hence deliveries, exist only on a leader). Closing it made the client's next
        request wait out :data:`LEADERSHIP_CLOSE_GRACE_S` unread and then reconnect to
        the very same node (issue 11, failover as a client sees it).
        """
        while True:
            was_leading = self.broker.leading
            await self.broker.wait_leadership_change(self.broker.leader_epoch)
            if was_leading or not self.broker.leading or self.subscriptions:
                break
            log.debug("connection %d: this node became the leader; kept", self.id)
        log.info("connection %d: leadership changed; closing it", self.id)
        # Stop reading; requests in progress (a TRANSFER_LEADER's own OK, NOT_LEADER
        # errors) are answered and the outbox drains as at EOF. Past the grace period,
        # close regardless.
        self._reading.cancel()
        await trio.sleep(LEADERSHIP_CLOSE_GRACE_S)
        scope.cancel()

    def finish(self) -> None:
        """Graceful shutdown: read no more requests and end once the answers are out.

        Requests already read are answered (an ACK among them settles its deliveries:
        the subscriptions stay until then); the outbox then takes nothing more, no
        delivery included, drains, and the connection closes: the client sees EOF at a
        frame boundary, and the subscriptions end as when a client leaves (unacked
        deliveries go back to the group). The server bounds the drain
        (:data:`SHUTDOWN_DRAIN_S`).
        """
        self._reading.cancel()

    def _set_watch(self, watch: tuple[int, float] | None) -> None:
        self._watch = watch
        self._watch_changed.set()
        self._watch_changed = trio.Event()

    async def _watcher(self) -> None:
        """Send WATCH_UPDATE frames while the client watches (``docs/protocol.md``, "WATCH")."""
        while True:
            watch = self._watch
            if watch is None:
                await self._watch_changed.wait()
                continue
            request_id, interval_s = watch
            try:
                data = self.session.send(frames.WatchUpdate(request_id, self.broker.overview()))
            except LocalProtocolError as exc:  # larger than a frame: say so and stop
                self._set_watch(None)
                data = self.session.error_bytes(
                    RequestError(ErrorCode.INVALID_ARGUMENT, exc.message), request_id
                )
            self._queue(data)
            changed = self._watch_changed
            with trio.move_on_after(interval_s):
                await changed.wait()

    def _deliveries_may_resume(self) -> None:
        for consumer in self.subscriptions.values():
            self.broker.hub.wake(consumer)
        self.broker.dispatcher.kick()

    # ------------------------------------------------------------ writing

    def _queue(self, data: bytes) -> None:
        if not self.outbox.send_nowait(data):
            return  # closing: the answer is dropped with the connection
        if self.outbox.overflowed:
            self._abort(
                _Closing(
                    ErrorCode.SLOW_CLIENT,
                    f"{self.outbox.buffered_bytes} bytes of answers are waiting for the client "
                    f"to read them (twice limits.max_connection_buffer_bytes = "
                    f"{self.limits.max_connection_buffer_bytes})",
                    tell_client=False,
                )
            )

    async def _writer(self) -> None:
        timeout_s = self.limits.send_timeout_ms / 1000
        outbox = self.outbox
        while True:
            data = await outbox.take()
            if data is None:
                return
            with trio.move_on_after(timeout_s) as write:
                await self.stream.send_all(data)
            if write.cancelled_caught:
                self._abort(
                    _Closing(
                        ErrorCode.SLOW_CLIENT,
                        f"a write to the client blocked for {timeout_s:g} s "
                        "(limits.send_timeout_ms); it does not read",
                        tell_client=False,
                    )
                )
                return
            outbox.written(len(data))

    # ------------------------------------------------------------ reading

    async def _reader(self, nursery: trio.Nursery) -> None:
        session = self.session
        with trio.move_on_after(HANDSHAKE_TIMEOUT_S) as handshake:
            while session.state is not SessionState.READY:
                if not await self._pump_one(nursery, handshake=True):
                    return
        if handshake.cancelled_caught:
            raise _Closing(
                ErrorCode.HELLO_REQUIRED,
                f"no HELLO within {HANDSHAKE_TIMEOUT_S:g} s of connecting",
                tell_client=False,
            )
        while await self._pump_one(nursery):
            pass

    async def _pump_one(self, nursery: trio.Nursery, *, handshake: bool = False) -> bool:
        """Handle every complete frame, then read more; False when the connection ends.

        With ``handshake``, return right after answering HELLO (without reading), so
        the handshake deadline does not cover the rest of the connection.
        """
        session = self.session
        while True:
            before = session.buffered_bytes
            try:
                event = session.next_event()
            except RemoteProtocolError as exc:
                self.broker.metrics.count_request_error(exc.code)
                self._close(_Closing(exc.code, exc.message))
                return False
            if event is NEED_DATA:
                break
            if event is CLOSED:
                return False
            if isinstance(event, frames.Hello):
                try:
                    token = event.token if event.token is not None else self.transport_token
                    self.principal = await self.access.authenticate(
                        token, self.peer.rsplit(":", 1)[0]
                    )
                except RemoteProtocolError as exc:
                    self.broker.metrics.count_request_error(exc.code)
                    self._close(_Closing(exc.code, exc.message))
                    return False
                leader = self.broker.log.leader_address()
                shard = self.broker.shard
                shards = 1 if shard is None else shard.slot_map.shard_count
                self._queue(session.accept_hello(self.broker.node_id, leader, __version__, shards))
                if self._on_hello is not None:
                    self._on_hello()
                if handshake:
                    return True
                continue
            assert not isinstance(event, type(NEED_DATA))
            if isinstance(event, RefusedRequest):
                # Wrong fields in one request: it fails alone, the connection stays.
                self.broker.metrics.count_request_error(event.error.code)
                self._queue(session.error_bytes(event.error, event.request_id))
                continue
            if isinstance(event, frames.Pong):
                continue  # an answer to our keepalive PING: receiving it was the point
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                # No yield when a slot is free: a checkpoint here cost every request a
                # pass of the event loop before its handler even started.
                self._limit.acquire_nowait()
            except trio.WouldBlock:
                await self._limit.acquire()
            size = before - session.buffered_bytes  # the frame's, header included
            if self._request_bytes and self._request_bytes + size > self._request_bytes_limit:
                await self._wait_request_room(size)
            node = self.node_buffers
            if node.requests and node.requests + size > node.limit_bytes:
                await node.wait_request_room(size)
            self._request_bytes += size
            node.request_started(size)
            nursery.start_soon(self._handle, event, size)
        self._count_inbound(session.buffered_bytes)
        await self._receive()
        return True

    def _count_inbound(self, buffered: int) -> None:
        delta = buffered - self._inbound_counted
        if delta:
            self._inbound_counted = buffered
            self.node_buffers.change(inbound=delta)

    def _evict(self) -> None:
        """Drop this connection's incomplete frame (NodeBuffers.wait_room needs room)."""
        self._evicted = True
        self._waiting_scope.cancel()

    def _frame_progress(self) -> str:
        """What arrived of the incomplete frame, in how long: the facts of a FRAME_TIMEOUT.

        The sentence says what was measured and no more: a sender, the network between,
        or this node's load (reads held back while its buffers are full, a busy event
        loop) can each keep a frame from completing, and the server cannot tell which.
        """
        received, size = self.session.incomplete_frame()
        assert self._frame_started is not None
        elapsed_ms = round((trio.current_time() - self._frame_started) * 1000)
        of = "bytes of its 4-byte length" if size is None else f"of its {size} bytes"
        return (
            f"{received} {of} arrived in the {elapsed_ms} ms since its first byte, as "
            "this server read them (a sender, the network or this server's load can each "
            "slow a frame)"
        )

    def _read_size(self) -> int:
        """Bytes to read at most now: what the node's inbound budget has room for, at
        least MIN_RECEIVE_BYTES (so the budget is overshot by at most that per
        connection), at most RECEIVE_BYTES."""
        room = self.node_buffers.limit_bytes - self.node_buffers.inbound
        return max(MIN_RECEIVE_BYTES, min(RECEIVE_BYTES, room))

    async def _receive(self) -> None:
        """Read more bytes, under the frame deadline or the keepalive rules."""
        session = self.session
        limits = self.limits
        if session.buffered_bytes:
            if self._frame_started is None:
                self._frame_started = self._last_receive
            deadline = self._frame_started + limits.frame_deadline_ms / 1000
            stall: trio.CancelScope | None = None
            self._evicted = False
            with trio.move_on_at(deadline) as frame, trio.CancelScope() as waiting:
                self._waiting_scope = waiting
                self.node_buffers.incomplete(self.id, self._frame_started, self._evict)
                try:
                    # Incomplete frames wait while the node's buffers are full (that wait
                    # is the server's doing: only the frame deadline runs during it).
                    await self.node_buffers.wait_room(self.id, self._frame_started)
                    with trio.move_on_after(limits.frame_stall_ms / 1000) as stall:
                        data = await self.stream.receive_some(self._read_size())
                finally:
                    self.node_buffers.done_waiting(self.id)
            if self._evicted:
                raise _Closing(
                    ErrorCode.FRAME_TIMEOUT,
                    "the node's buffers for incoming frames were full "
                    f"(limits.max_node_buffer_bytes = {self.node_buffers.limit_bytes}, shared "
                    f"by every connection) and this connection's frame was the oldest "
                    f"incomplete one: {self._frame_progress()}; it was dropped to make room "
                    f"for a frame that had waited {EVICT_AFTER_S:g} s (the node is loaded; "
                    "send it again)",
                )
            if frame.cancelled_caught:
                raise _Closing(
                    ErrorCode.FRAME_TIMEOUT,
                    f"a frame was not complete {limits.frame_deadline_ms} ms after its first "
                    f"byte (limits.frame_deadline_ms): {self._frame_progress()}",
                )
            if stall is not None and stall.cancelled_caught:
                raise _Closing(
                    ErrorCode.FRAME_TIMEOUT,
                    f"no byte of a frame arrived for {limits.frame_stall_ms} ms while the "
                    f"server was reading (limits.frame_stall_ms): {self._frame_progress()}",
                )
        else:
            self._frame_started = None
            await self.outbox.wait_room()  # answers first: back-pressure on requests
            with trio.move_on_after(limits.keepalive_interval_ms / 1000) as idle:
                data = await self.stream.receive_some(self._read_size())
            if idle.cancelled_caught:
                self._queue(session.send(frames.Ping(0)))
                with trio.move_on_after(limits.keepalive_timeout_ms / 1000) as waited:
                    data = await self.stream.receive_some(self._read_size())
                if waited.cancelled_caught:
                    raise _Closing(
                        ErrorCode.KEEPALIVE_TIMEOUT,
                        f"the client sent nothing for {limits.keepalive_interval_ms} ms and did "
                        f"not answer a PING within {limits.keepalive_timeout_ms} ms "
                        "(limits.keepalive_*_ms)",
                    )
        self._last_receive = trio.current_time()
        session.receive_data(data if type(data) is bytes else bytes(data))
        self._count_inbound(session.buffered_bytes)

    async def _watch_access(self) -> None:
        """Credentials reloaded (SIGHUP): close if this client lost what it uses."""
        access = self.access
        generation = access.generation
        while True:
            await access.wait_changed(generation)
            generation = access.generation
            current = access.current(self.principal)
            if current is None:
                self._revoke(
                    f"client {self.principal.name!r} was removed from the credentials or got "
                    "a new secret; reconnect with a valid token"
                )
                return
            self.principal = current
            for consumer in list(self.subscriptions.values()):
                try:
                    access.check(current, frames.Subscribe(0, consumer.topic, consumer.group, 1))
                except RequestError as exc:
                    self._revoke(f"{exc.message} (credentials reloaded)")
                    return

    def _revoke(self, message: str) -> None:
        """Close after telling the client why: stop reading, drain, end."""
        self._close(_Closing(ErrorCode.AUTH_FAILED, message))
        self._reading.cancel()

    # ------------------------------------------------------------ requests

    async def _wait_request_room(self, size: int) -> None:
        """Wait until requests in progress hold few enough bytes to take one of ``size``
        (one is always taken when none is in progress, whatever its size)."""
        while self._request_bytes and self._request_bytes + size > self._request_bytes_limit:
            room = self._request_room = trio.Event()
            await room.wait()

    async def _handle(self, frame: frames.Frame, size: int = 0) -> None:
        try:
            self.access.check(self.principal, frame)
            if self.broker.shard is not None:
                check_shard(self.broker.shard, frame)
            try:
                answer = await self._answer(frame)
            except NotLeaderError:
                if not isinstance(frame, frames.Publish):
                    raise
                answer = await self._publish_after_election(frame)
            if answer is not None:
                self._reply(answer, frame.request_id)
        except (RequestError, RemoteProtocolError) as exc:
            code = exc.code
            self.broker.metrics.count_request_error(code)
            if code.closes_connection:
                raise _Closing(code, exc.message, request_id=frame.request_id) from None
            self._queue(self.session.error_bytes(exc, frame.request_id))
        except NoSpaceError:
            self.broker.metrics.count_request_error(ErrorCode.NO_SPACE)
            self._queue(self.session.error_bytes(no_space_error(), frame.request_id))
        except StorageError:
            raise  # the node cannot go on without its disk
        finally:
            self._limit.release()
            self._request_bytes -= size
            self.node_buffers.request_ended(size)
            if self._request_room is not None:
                self._request_room.set()
                self._request_room = None

    async def _publish_after_election(self, frame: frames.Publish) -> frames.Frame | None:
        """A PUBLISH got NOT_LEADER (nothing of it was applied): wait until a leader is
        known, then publish here if that is this node, else answer NOT_LEADER naming it.

        During an election a follower knows no leader to name, and a new leader refuses
        until the no-op of its term is applied: without the wait the client would
        learn nothing and poll every node until the election ends; with it, the
        answer comes as soon as this node hears of the winner (or wins).

        Raises:
            NotLeaderError: another node leads (named), or none is known after two
                election timeouts (the client tries the next node).
        """
        log_ = self.broker.log
        await log_.wait_for_leader()
        if log_.is_leader():
            return await self._answer(frame)
        raise NotLeaderError(log_.leader_address())

    def _reply(self, answer: frames.Frame, request_id: int) -> None:
        if self.session.state is SessionState.ERROR or self.outbox.closed:
            return  # the connection is closing after a protocol error
        try:
            data = self.session.send(answer)
        except LocalProtocolError as exc:
            data = self.session.error_bytes(
                RequestError(ErrorCode.INVALID_ARGUMENT, exc.message), request_id
            )
        self._queue(data)

    async def _answer(self, frame: frames.Frame) -> frames.Frame | None:
        broker = self.broker
        match frame:
            case frames.Publish():
                first_id, count, duplicates = await broker.publish(frame.items, frame.ack_level)
                pairs = None if not duplicates else [[p, d] for p, d in sorted(duplicates.items())]
                return frames.PublishOk(frame.request_id, first_id, count, pairs)
            case frames.Ack():
                return frames.Ok(frame.request_id, await broker.ack(self.id, frame.tags))
            case frames.Nack():
                done = await broker.nack(
                    self.id, frame.tags, frame.requeue_delay_ms, frame.reason, frame.dead_letter
                )
                return frames.Ok(frame.request_id, done)
            case frames.Credit():
                broker.grant_credit(self.id, frame.subscription_id, frame.credit)
                return None
            case frames.Subscribe():
                # Counted from the check until the consumer is registered: the group's
                # creation is awaited in between, and SUBSCRIBEs pipelined behind this
                # one must see it (else each passes the same check).
                limit = self.limits.max_subscriptions_per_connection
                held = len(self.subscriptions) + self._subscribing
                if held >= limit:
                    raise RequestError(
                        ErrorCode.TOO_MANY_SUBSCRIPTIONS,
                        f"this connection holds {_subscriptions(len(self.subscriptions), self._subscribing)}, "
                        f"the limit (limits.max_subscriptions_per_connection = {limit}); "
                        "unsubscribe or open another connection",
                    )
                node_limit = self.limits.max_subscriptions
                node_held = len(broker.hub.consumers) + broker.subscribes_in_flight
                if node_held >= node_limit:
                    raise RequestError(
                        ErrorCode.TOO_MANY_SUBSCRIPTIONS,
                        f"this node holds {_subscriptions(len(broker.hub.consumers), broker.subscribes_in_flight)}, "
                        f"its limit (limits.max_subscriptions = {node_limit}); unsubscribe unused "
                        "ones or ask the operator to raise the limit",
                    )
                self._subscribing += 1
                broker.subscribes_in_flight += 1
                try:
                    consumer = await broker.subscribe(
                        self.id,
                        self.outbox,
                        frame.topic,
                        frame.group,
                        frame.prefetch,
                        frame.headers,
                    )
                finally:
                    self._subscribing -= 1
                    broker.subscribes_in_flight -= 1
                self.subscriptions[consumer.subscription_id] = consumer
                # The answer must precede the first DELIVER, so queue it here, in order.
                self._reply(
                    frames.SubscribeOk(frame.request_id, consumer.subscription_id),
                    frame.request_id,
                )
                broker.announce_settings(consumer)
                return None
            case frames.Extend():
                return frames.Ok(
                    frame.request_id, broker.extend(self.id, frame.tags, frame.visibility_ms)
                )
            case frames.Release():
                return frames.Ok(frame.request_id, await broker.release(self.id, frame.tags))
            case frames.Unsubscribe():
                found = self.subscriptions.pop(frame.subscription_id, None)
                if found is None:
                    raise RequestError(
                        ErrorCode.UNKNOWN_SUBSCRIPTION,
                        f"no subscription {frame.subscription_id} on this connection",
                    )
                broker.unsubscribe(found)
                return frames.Ok(frame.request_id, None)
            case frames.Status():
                permissions = self.principal.permissions
                visible = None if permissions.monitor else permissions.may_see
                return frames.StatusOk(frame.request_id, await broker.status_async(visible))
            case frames.Ping():
                return frames.Pong(frame.request_id)
            case frames.SlotMap():
                return frames.SlotMapOk(frame.request_id, slot_map_answer(broker))
            case frames.Watch():
                interval_ms = frame.interval_ms
                if not frames.MIN_WATCH_INTERVAL_MS <= interval_ms <= frames.MAX_WATCH_INTERVAL_MS:
                    raise RequestError(
                        ErrorCode.INVALID_ARGUMENT,
                        f"WATCH interval_ms must be {frames.MIN_WATCH_INTERVAL_MS} to "
                        f"{frames.MAX_WATCH_INTERVAL_MS} ms, got {interval_ms}",
                    )
                self._set_watch((frame.request_id, interval_ms / 1000))
                return None  # the first WATCH_UPDATE is the answer
            case frames.Unwatch():
                self._set_watch(None)
                return frames.Ok(frame.request_id, None)
            case frames.GroupCreate():
                await broker.ensure_group(
                    frame.topic,
                    frame.group,
                    frame.visibility_timeout_ms,
                    frame.max_deliveries,
                    frame.from_backlog,
                    frame.dead_letter_expired,
                )
                return frames.Ok(frame.request_id, None)
            case frames.GroupDelete():
                await broker.delete_group(frame.topic, frame.group)
                return frames.Ok(frame.request_id, None)
            case frames.Browse():
                return await manage.browse(broker, frame)
            case frames.BrowseCounts():
                return await manage.browse_counts(broker, frame)
            case frames.Redrive():
                results = await manage.redrive(broker, frame)
                return frames.ItemResults(frame.request_id, results)
            case frames.Reschedule():
                results = await manage.reschedule(broker, frame)
                return frames.ItemResults(frame.request_id, results)
            case frames.Purge():
                return frames.Ok(frame.request_id, await manage.purge(broker, frame))
            case frames.Cancel():
                results = await manage.cancel(broker, frame.topic, frame.group, frame.ids)
                return frames.ItemResults(frame.request_id, results)
            case frames.ClusterStatus():
                return frames.ClusterStatusOk(frame.request_id, broker.cluster_status())
            case frames.ClusterAddNode():
                await broker.add_node(frame.node_id, frame.raft_address, frame.client_address)
                return frames.Ok(frame.request_id, None)
            case frames.ClusterRemoveNode():
                await broker.remove_node(frame.node_id)
                return frames.Ok(frame.request_id, None)
            case frames.ClusterTransferLeader():
                await broker.transfer_leadership(frame.node_id)
                return frames.Ok(frame.request_id, None)
        raise RemoteProtocolError(ErrorCode.INVALID_FRAME, f"{frame.TYPE.name} is not a request")


def slot_map_answer(broker: Broker) -> dict[str, Any]:
    """SLOT_MAP_OK's map: the node's slot map, plus ``"shard"``, the answering shard, and
    (sharded nodes) ``"port_stride"``, ``node.shard_port_stride``.

    A node of one shard answers a map with one shard, itself, at its client address.
    """
    shard = broker.shard
    if shard is None:
        return {**even_map([broker.client_address]).to_wire(), "shard": 0}
    return {**shard.slot_map.to_wire(), "shard": shard.index, "port_stride": shard.port_stride}


def check_shard(shard: ShardRole, frame: frames.Frame) -> None:
    """Refuse ``frame`` with WRONG_SHARD when a topic it names belongs to another shard.

    PUBLISH: every item's topic must be this shard's (the first foreign item is named);
    requests naming one topic (SUBSCRIBE, GROUP_CREATE/DELETE, CANCEL, BROWSE,
    BROWSE_COUNTS, REDRIVE, RESCHEDULE, PURGE) must name one of ours. Delivery tags (ACK, NACK, ...)
    belong to the connection, so they are this shard's by construction.

    Raises:
        WrongShardError: with the owning shard's client address.
    """
    topic: str | None = None
    item_index: int | None = None
    match frame:
        case frames.Publish():
            # A batch mostly repeats one topic: hash each run of one topic once (the
            # per-item check cost ~0.3 us a message on the shard's one core).
            owned: str | None = None
            for index, item in enumerate(frame.items):
                if type(item) in (tuple, list) and item and type(item[0]) is str:
                    if item[0] == owned:
                        continue
                    if not shard.owns(item[0]):
                        topic, item_index = item[0], index
                        break
                    owned = item[0]
        case (
            frames.Subscribe()
            | frames.GroupCreate()
            | frames.GroupDelete()
            | frames.Cancel()
            | frames.Browse()
            | frames.BrowseCounts()
            | frames.Redrive()
            | frames.Reschedule()
            | frames.Purge()
        ):
            if not shard.owns(frame.topic):
                topic = frame.topic
    if topic is None:
        return
    # A name no shard would take is refused here, as its owner would refuse it, so the
    # answer does not depend on the shard asked. Names from before the grammar cannot
    # exist on a sharded node (shards came after it), so the grammar is the whole rule:
    # a PUBLISH takes names of it, the other requests those and their dead-letter topics.
    if item_index is not None:
        validation.check_publish_topic(topic, item_index)
    else:
        if isinstance(frame, frames.Redrive):
            manage.check_redrive_topic(topic)  # the owner's first check of a REDRIVE
        validation.check_names_can_exist(topic, getattr(frame, "group", None))
    owner = shard.slot_map.shard_of(topic)
    address = shard.slot_map.addresses[owner]
    raise WrongShardError(
        address,
        f"topic {topic!r} (slot {topic_slot(topic)}) belongs to shard {owner} of this node, "
        f"at {address}; this is shard {shard.index}. Send it there (ask SLOT_MAP for the map)",
        item_index,
    )


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
        await self.serve_stream(stream, _peer_name(stream), ssl_context=self.ssl_context)

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
            closed_log.log(logging.INFO, "TLS handshake with %s failed: %s", peer, exc)
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
