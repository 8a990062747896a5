"""One client connection: a task driving a sans-IO ``ServerSession``, and its answers.

Each connection has a reader (decodes frames, starts request handlers) and a writer
(drains an outbox bounded in bytes). Requests pipeline: each PUBLISH, SUBSCRIBE, ACK,
NACK, STATUS or group request runs in its own task of the connection's nursery, bounded
by ``MAX_REQUESTS_IN_PROGRESS`` per connection, and its answer echoes the request id;
a small PUBLISH to a single node is served up to its proposal by the reader itself
and answered by one answer task per connection (:data:`INLINE_PUBLISH_ITEMS`).
Requests that change something take effect in the order they were read, each after
the one before has its place (:mod:`futureq.request_order`); reads (:data:`READS`)
are served beside them.
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
  wait (:class:`~futureq.broker.buffers.NodeBuffers`);
* a frame must be complete ``limits.frame_deadline_ms`` after its first byte, and no
  byte of it may be ``limits.frame_stall_ms`` late while the server reads
  (``FRAME_TIMEOUT``; a half-sent frame is dropped soon, not held); a frame that has
  waited :data:`~futureq.broker.buffers.EVICT_AFTER_S` for inbound room drops the oldest incomplete frame begun
  before it (trickled half-frames cannot hold the budget until their deadline); a read
  takes at most what the node's inbound budget has room for (at least
  ``MIN_RECEIVE_BYTES``); a client silent for ``limits.keepalive_interval_ms`` gets a PING
  and must send something within ``limits.keepalive_timeout_ms`` (``KEEPALIVE_TIMEOUT``);
  one write may block for at most ``limits.send_timeout_ms`` (``SLOW_CLIENT``);
* requests being served count against both buffer limits with their decoded size
  (:func:`~futureq.broker.buffers.held_bytes`), not their wire bytes alone.

A connection the server closes logs one line (peer, error code, sentence), at most
:data:`~futureq.rate_limited_log.LOG_LINES_PER_MINUTE` a minute, each part cut to
1,000 characters; tracebacks are only for bugs of ours.

Source: ``docs/protocol.md``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import ssl
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import trio

from futureq import __version__, request_order
from futureq.config import join_host_port
from futureq.errors import (
    ErrorCode,
    LocalProtocolError,
    NoSpaceError,
    NotLeaderError,
    RemoteProtocolError,
    RequestError,
)
from futureq.rate_limited_log import RateLimitedLog
from futureq.state import commands
from futureq.state.queue_state import PublishResult
from futureq.wire import codec, frames, validation
from futureq.wire.session import (
    CLOSED,
    NEED_DATA,
    RefusedRequest,
    ServerSession,
    SessionState,
)

from . import consumer_requests, group_reservations, manage, publishing
from .access import ANONYMOUS, AccessControl, Principal
from .buffers import EVICT_AFTER_S, NodeBuffers, Outbox, held_bytes
from .command_log import SingleNodeLog, no_space_error
from .membership import member_client_addresses
from .shard_requests import check_shard, slot_map_answer

if TYPE_CHECKING:
    from .broker import Broker
    from .hub import Consumer

log = logging.getLogger(__name__)

MAX_REQUESTS_IN_PROGRESS = 256
"""Requests of one connection being served at once; the reader waits beyond that, and
beyond ``limits.max_connection_buffer_bytes`` of their frames (one request is always
served, whatever its size): a client pipelining 256 frames of 4 MiB made its node hold
1 GiB for it."""
READS: frozenset[type[frames.Frame]] = frozenset(
    {
        frames.Status,
        frames.Ping,
        frames.SlotMap,
        frames.Browse,
        frames.BrowseCounts,
        frames.ClusterStatus,
    }
)
"""Requests that change nothing: served as they come, beside the others. Every other
request takes effect after those its client sent before it (``futureq.request_order``;
``docs/protocol.md``, "Requests")."""
ROOMY_READS: frozenset[type[frames.Frame]] = READS - {frames.Ping}
"""Reads whose answer may be large (a BROWSE page is up to ~1 MiB): a connection serves
them one at a time, each once its outbox has room, so pipelined reads keep the outbox
within its limit plus one answer. Served 256 at once, 17 pipelined BROWSEs of 1,000
messages overflowed twice the limit at once and closed a client that read as fast as it
could (SLOW_CLIENT), and their answers were all held in memory together. PING's answer
is tiny and is the client's liveness probe: it never waits."""
INLINE_PUBLISH_ITEMS = validation.VALIDATE_STEP_ITEMS
"""A PUBLISH of at most this many items, at ack level leader or quorum, to a single node
whose log has room, that nothing read before it on its connection still waits to take
effect ahead of, is served by the reader itself up to its proposal (checks, stamp,
validation, group reservation, queued in the log), not in a task of its own; its answer
is queued by the connection's answer task (:meth:`Connection._answer_inline`) once the
proposal is applied. The reader yields after about this many such items in a row, as a
large batch's validation does (``validate_publish_items_in_steps``)."""
HANDSHAKE_TIMEOUT_S = 10.0
LEADERSHIP_CLOSE_GRACE_S = 2.0
"""After this node lost the leadership, how long (s) a connection is still read and
answered (NOT_LEADER naming the new leader, for what only a leader does) before it is
closed; then at most :data:`LEADERSHIP_CLOSE_DRAIN_S` for the answers owed."""
LEADER_KNOWN_WAIT_S = 1.0
"""After this node lost the leadership, how long (s) a version 6 connection waits for
the next leader to be known, to name it in its GOAWAY (read and answered meanwhile)."""
GOAWAY_VERSION = 6
"""The protocol version that adds GOAWAY (``docs/protocol.md``, "Versions")."""
STOPPING = "the node is shutting down; connect to another node or retry later"
"""Why a node shutting down serves no more (UNAVAILABLE): a connection that arrives
then is refused with it, one being served is told so in its GOAWAY."""
LEADERSHIP_CLOSE_DRAIN_S = 1.0
"""After the grace, how long (s) requests in progress may finish and their answers be
written before the connection is closed regardless."""
RECEIVE_BYTES = 256 * 1024
LINGER_S = 0.5
"""A connection ended by a graceful shutdown: how long, at most, what the client still
sends is read and dropped after the server's half-close, until the client closes (s)."""
LINGER_BYTES = 16 * 1024 * 1024
"""... and how many bytes at most (the client's unread requests in the socket buffers)."""
TLS_IDLE_S = 0.02
"""Closing a TLS connection cleanly: its client's application data is read until none
came for this long (s), before the ``close_notify`` (:func:`close_tls_cleanly`)."""
MIN_RECEIVE_BYTES = 4 * 1024
"""A read when the node's inbound budget is (nearly) spent takes at most this much."""
_connection_ids = itertools.count(1)


def _subscriptions(held: int, coming: int) -> str:
    """``"3 subscriptions"``, or ``"3 subscriptions and 2 being made"``."""
    return f"{held} subscriptions" + (f" and {coming} being made" if coming else "")


closed_log = RateLimitedLog(log)


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


@runtime_checkable
class StopAnnouncing(Protocol):
    """A transport that can tell its peer, in its own close, that the server is going
    away (a WebSocket: close code 1001, :class:`~futureq.broker.websocket.WebSocketStream`)."""

    def going_away(self, reason: str) -> None:
        """Make the coming close say the server is going away, with ``reason``."""


def announce_stop(stream: trio.abc.Stream, reason: str) -> None:
    """Make the close of ``stream`` say the node is shutting down, where the transport
    can say it (:class:`StopAnnouncing`); nothing for TCP and TLS (their clients learn
    it from GOAWAY or the UNAVAILABLE ERROR frame)."""
    if isinstance(stream, StopAnnouncing):
        stream.going_away(reason)


def peer_name(stream: trio.abc.Stream) -> str:
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
        self.peer = peer or peer_name(stream)
        self.transport_token = transport_token
        config = broker.config
        limits = config.limits
        self.limits = limits
        self.access = access or AccessControl(config.server.auth_token, None)
        self.principal: Principal = ANONYMOUS
        # The token is checked here (access), not by the session.
        self.session = ServerSession(
            limits.max_frame_bytes,
            frames.SUPPORTED_VERSIONS,
            None,
            max_containers=codec.request_containers(limits.max_batch_items),
        )
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
        self._left_holding: list[Consumer] = []
        """Subscriptions that left answering a HANDOVER and kept what the application
        holds out (:func:`~futureq.broker.consumer_requests.unsubscribe`): given back
        when the connection ends, as its subscriptions' are."""
        self._subscribing = 0
        self._subscribing_prefetch = 0
        """Prefetch of the SUBSCRIBEs of this connection under way (counted as held)."""
        """SUBSCRIBEs of this connection past their limit check, not yet registered."""
        self._limit = trio.Semaphore(MAX_REQUESTS_IN_PROGRESS)
        self._request_bytes = 0
        """Bytes of the frames of the requests being served (read, not yet answered)."""
        self._request_bytes_limit = self.limits.max_connection_buffer_bytes
        self._request_room: trio.Event | None = None
        """Set when a request ends, while the reader waits for room for the next."""
        self._read_room = trio.Lock()
        """Held by the :data:`ROOMY_READS` request being served (waiting for outbox
        room, then answering)."""
        self._reading = trio.CancelScope()
        self._last_served_id = 0
        """The largest request id served (answered, or handed to a task): a GOAWAY's."""
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
        self._last_turn: request_order.Turn | None = None
        """The place of the last state-changing request read (``futureq.request_order``)."""
        self._inline: deque[_InlinePublish] = deque()
        """PUBLISHes the reader proposed itself (:data:`INLINE_PUBLISH_ITEMS`), in the
        order proposed (which is their log order), not answered yet."""
        self._answering = False
        """The answer task of :attr:`_inline` was started (it runs until the reader ends)."""
        self._answer_idle = trio.lowlevel.ParkingLot()
        """Where the answer task sleeps while nothing is pending: the reader moves it to
        sleep on the next proposal's end instead of waking it (a task made runnable
        while the log's writer starts its synced write costs that write its quick path,
        ``quick_thread``: one pass of the loop more per request with one in flight)."""
        self._reader_ended = False

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
                                try:
                                    with self._reading:
                                        await self._reader(requests)
                                finally:
                                    self._reader_ended = True
                                    self._answer_idle.unpark_all()  # its last answers
                        except* _Closing as group:
                            self._close(_first_closing(group))
                        finally:
                            self.outbox.close()
                    connection.cancel_scope.cancel()
        except* (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
            pass
        finally:
            for consumer in list(self.subscriptions.values()):
                self.broker.subscription_lost(consumer)
            self.subscriptions.clear()
            for consumer in self._left_holding:
                if consumer.in_flight:
                    self.broker.hub.remove_consumer(consumer, self.broker.clock.wall_ms())
            self._left_holding.clear()
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
                if self._reading.cancel_called and not self._scope.cancel_called:
                    await _linger(self.stream)
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
        hence deliveries, exist only on a leader). Closing it made the client reconnect
        to the very same node (issue 11, failover as a client sees it).
        """
        while True:
            was_leading = self.broker.leading
            await self.broker.wait_leadership_change(self.broker.leader_epoch)
            if was_leading or not self.broker.leading or self.subscriptions:
                break
            log.debug("connection %d: this node became the leader; kept", self.id)
        log.info("connection %d: leadership changed; closing it", self.id)
        # Still read meanwhile: what arrives is answered (NOT_LEADER naming the new
        # leader), so the client follows at once. Stopping reading at once left those
        # requests unanswered until the close, and the client had to report an
        # at-most-once publish's outcome as unknown.
        if self._version() >= GOAWAY_VERSION:
            # A GOAWAY names the new leader: wait a moment for it to be known.
            with trio.move_on_after(LEADER_KNOWN_WAIT_S):
                await self.broker.log.wait_for_leader()
            leader = self.broker.log.leader_address()
            self.go_away(
                ErrorCode.NOT_LEADER,
                "the leadership moved"
                + ("" if leader is None else f" to {leader}")
                + "; send requests to the leader",
                leader,
            )
        else:
            # A client that got its NOT_LEADER closes the connection itself; for one
            # that does not, stop reading, let the requests in progress answer and the
            # outbox drain as at EOF, then close.
            await trio.sleep(LEADERSHIP_CLOSE_GRACE_S)
            self._reading.cancel()
        await trio.sleep(LEADERSHIP_CLOSE_DRAIN_S)
        scope.cancel()

    def go_away(self, code: ErrorCode, message: str, leader_address: str | None) -> None:
        """Serve no more requests: read no more, answer those read, end once the
        answers are out (the outbox drains as at EOF).

        A connection of protocol version 6 or later is first sent GOAWAY naming the
        largest request id served: the client knows every later request took no effect
        and sends it elsewhere at once (``docs/protocol.md``, GOAWAY). An older client
        learns only from the end of the connection that an unanswered request was
        never read (it reports an at-most-once publish's outcome as unknown).
        Idempotent: the first call names the reason.
        """
        if self._reading.cancel_called:
            return
        if self._version() >= GOAWAY_VERSION:
            goaway = frames.GoAway(0, self._last_served_id, code, message, leader_address)
            self._queue(self.session.send(goaway))
        self._reading.cancel()

    def finish(self) -> None:
        """Graceful shutdown: read no more requests and end once the answers are out
        (:meth:`go_away`: NOT_LEADER naming the next leader once this one handed over;
        else UNAVAILABLE, :data:`STOPPING`).

        Requests already read are answered (an ACK among them settles its deliveries:
        the subscriptions stay until then); the outbox then takes nothing more, no
        delivery included, drains, and the connection closes: the client sees EOF at a
        frame boundary, and the subscriptions end as when a client leaves (unacked
        deliveries go back to the group). The server bounds the drain
        (:data:`SHUTDOWN_DRAIN_S`).
        """
        log_ = self.broker.log
        leader = None if log_.is_leader() else log_.leader_address()
        if leader is None:
            self.go_away(ErrorCode.UNAVAILABLE, STOPPING, None)
            announce_stop(self.stream, STOPPING)
        else:
            message = f"this node is shutting down and handed the leadership to {leader}"
            self.go_away(ErrorCode.NOT_LEADER, message, leader)
            announce_stop(self.stream, message)

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
                data = self._watch_update(request_id, self.broker.overview())
            except LocalProtocolError as exc:  # larger than a frame: say so and stop
                self._set_watch(None)
                data = self.session.error_bytes(
                    RequestError(ErrorCode.INVALID_ARGUMENT, exc.message), request_id
                )
            self._queue(data)
            changed = self._watch_changed
            with trio.move_on_after(interval_s):
                await changed.wait()

    def _watch_update(self, request_id: int, overview: dict[str, Any]) -> bytes:
        """The WATCH_UPDATE frame of ``overview``, with fewer of its groups if it does not
        fit in ``max_frame_bytes``.

        With ``limits.max_frame_bytes`` near its 64 KiB minimum, 100 groups of long
        names made the overview larger than a frame, and the watch ended (found by a
        tester: the dashboard stopped updating). The groups are listed largest pending
        first and ``groups_total`` counts them all, so the list is cut from its end,
        halving it until the frame fits.

        Raises:
            LocalProtocolError: FRAME_TOO_LARGE if even no group leaves it too large.
        """
        groups = overview.get("groups") or []
        shown = len(groups)
        while True:
            view = overview if shown == len(groups) else {**overview, "groups": groups[:shown]}
            try:
                return self.session.send(frames.WatchUpdate(request_id, view))
            except LocalProtocolError as exc:
                if exc.code is not ErrorCode.FRAME_TOO_LARGE or shown == 0:
                    raise
                shown //= 2

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
            # Said to the client too: closed without a word, it could not tell this
            # from a crash or a network fault.
            raise _Closing(
                ErrorCode.HELLO_REQUIRED,
                f"no HELLO within {HANDSHAKE_TIMEOUT_S:g} s of connecting: send HELLO as "
                "the first frame as soon as the connection is open",
            )
        while await self._pump_one(nursery):
            pass

    async def _pump_one(self, nursery: trio.Nursery, *, handshake: bool = False) -> bool:
        """Handle every complete frame, then read more; False when the connection ends.

        With ``handshake``, return right after answering HELLO (without reading), so
        the handshake deadline does not cover the rest of the connection.
        """
        session = self.session
        outbox = self.outbox
        inline_items = 0
        while True:
            if outbox.buffered_bytes >= outbox.limit_bytes:
                # Answers first, request by request: one read holds up to RECEIVE_BYTES
                # of requests, and small ones with large answers (SLOT_MAP, STATUS,
                # errors to bad frames) overflowed twice the limit from a single read,
                # closing a client that only pipelined (SLOW_CLIENT).
                await outbox.wait_room()
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
                members = member_client_addresses(self.broker)
                self._queue(
                    session.accept_hello(
                        self.broker.node_id,
                        leader,
                        __version__,
                        shards,
                        members,
                        self.limits.max_prefetch,
                    )
                )
                if self._on_hello is not None:
                    self._on_hello()
                if handshake:
                    return True
                continue
            assert not isinstance(event, type(NEED_DATA))
            if isinstance(event, RefusedRequest):
                # Wrong fields in one request: it fails alone, the connection stays.
                await trio.lowlevel.checkpoint_if_cancelled()  # not after a GOAWAY
                if event.request_id > self._last_served_id:
                    self._last_served_id = event.request_id
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
            # What the request holds while served: its wire bytes (header included) and
            # its decoded objects, many times those for a batch of small items.
            size = held_bytes(event, before - session.buffered_bytes)
            if self._request_bytes and self._request_bytes + size > self._request_bytes_limit:
                await self._wait_request_room(size)
            node = self.node_buffers
            if node.requests and node.requests + size > node.limit_bytes:
                await node.wait_request_room(size)
            if self._reading.cancel_called:
                # Reading stopped (a GOAWAY, naming the requests served until then, may
                # have gone out) while this request waited for its slot or for room: a
                # wait that had already ended is not interrupted, so without this the
                # request was served after the GOAWAY told the client it took no effect
                # (and the client sends it again elsewhere).
                self._limit.release()
                await trio.lowlevel.checkpoint_if_cancelled()
            self._request_bytes += size
            node.request_started(size)
            if event.request_id > self._last_served_id:
                self._last_served_id = event.request_id  # what a GOAWAY names
            if type(event) is frames.Publish and self._may_publish_inline(event):
                self._publish_inline(event, size, nursery)
                inline_items += len(event.items)
                if inline_items >= INLINE_PUBLISH_ITEMS:
                    inline_items = 0
                    await trio.lowlevel.checkpoint()  # a long pipeline must not hold the loop
                continue
            turn = None
            if type(event) not in READS:
                turn = self._last_turn = request_order.Turn(self._last_turn)
            nursery.start_soon(self._handle, event, size, turn)
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
            now = trio.current_time()
            if self._frame_started is None:
                self._frame_started = self._last_receive
            # The frame's clock runs while this server reads, not while it serves the
            # requests read before it or waits for room for them (answers the client
            # has not read yet, its 256 requests in progress): a client that pipelined
            # a long run of requests and read its answers steadily was closed
            # FRAME_TIMEOUT for a frame whose rest had waited in the socket all along.
            self._frame_started += now - self._last_receive
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

    def _may_settle(self, topic: str, group: str) -> None:
        """Refuse (PERMISSION_DENIED) unless this client may consume from ``topic``: asked
        before it settles a delivery an earlier leader handed over, which any connection
        may settle by its tag (``docs/protocol.md``, "Delivery tags across leaders")."""
        self.access.check(self.principal, frames.Subscribe(0, topic, group, 1))

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

    async def _handle(
        self, frame: frames.Frame, size: int = 0, turn: request_order.Turn | None = None
    ) -> None:
        """Serve one request; ``turn``: its place in the connection's order (None: a
        read, which may overlap others)."""
        try:
            if turn is not None and not isinstance(frame, frames.Publish):
                # A PUBLISH waits for its turn only to queue its proposal (nothing of
                # it takes effect before): the request ahead queues it for it, so a
                # pipeline of them costs no pass of the event loop each.
                await turn.wait()
                if isinstance(frame, frames.ClusterTransferLeader):
                    # It waits for this node's subscriptions to say what they were
                    # handed (UNSUBSCRIBE), maybe this connection's own: later
                    # requests are not held for it.
                    turn.pass_on()
            roomy = type(frame) in ROOMY_READS
            async with self._read_room if roomy else contextlib.nullcontext():
                if roomy:
                    await self.outbox.wait_room()  # answers first, one large one at a time
                self.access.check(self.principal, frame)
                if self.broker.shard is not None:
                    check_shard(self.broker.shard, frame)
                with request_order.serving(turn):
                    try:
                        answer = await self._answer(frame)
                    except NotLeaderError:
                        if not isinstance(frame, frames.Publish):
                            raise
                        answer = await self._publish_after_election(frame)
                if answer is not None:
                    self._reply(answer, frame.request_id)
        except (RequestError, RemoteProtocolError, NoSpaceError) as exc:
            self._refused(exc, frame.request_id)
        finally:
            if turn is not None:
                turn.pass_on()  # its answer is queued (or it failed): effects are done
            self._request_ended(size)

    def _request_ended(self, size: int) -> None:
        """A request of ``size`` held bytes was answered (or given up): its slot and bytes
        are free for the next."""
        self._limit.release()
        self._request_bytes -= size
        self.node_buffers.request_ended(size)
        if self._request_room is not None:
            self._request_room.set()
            self._request_room = None

    def _refused(self, exc: BaseException, request_id: int) -> None:
        """Answer a request that failed with ``exc`` as :meth:`_handle` does: a request
        error (or NO_SPACE) is its answer; one whose code closes the connection closes it.

        Raises:
            _Closing: the code closes the connection.
            BaseException: ``exc`` itself when it is none of those (StorageError: the
                node cannot go on without its disk).
        """
        if isinstance(exc, NoSpaceError):  # a StorageError the node goes on after
            self.broker.metrics.count_request_error(ErrorCode.NO_SPACE)
            self._queue(self.session.error_bytes(no_space_error(), request_id))
            return
        if not isinstance(exc, (RequestError, RemoteProtocolError)):
            raise exc
        code = exc.code
        self.broker.metrics.count_request_error(code)
        if code.closes_connection:
            raise _Closing(code, exc.message, request_id=request_id) from None
        self._queue(self.session.error_bytes(exc, request_id))

    # ------------------------------------------------------------ PUBLISH in the reader

    def _may_publish_inline(self, frame: frames.Publish) -> bool:
        """Whether the reader serves ``frame`` itself (:data:`INLINE_PUBLISH_ITEMS`)."""
        if frame.ack_level == frames.AckLevel.NONE or len(frame.items) > INLINE_PUBLISH_ITEMS:
            return False
        log_ = self.broker.log
        if type(log_) is not SingleNodeLog:
            return False  # a Raft leader's NOT_LEADER answers wait for an election
        last = self._last_turn
        if last is not None:
            # Its effect would go before the earlier request's (or before an earlier
            # ack-level-NONE publish the background publisher has not queued yet).
            if not last.passed:
                return False
            background = last.background
            if background is not None and not background.passed:
                return False
        return log_.has_room()

    def _publish_inline(self, frame: frames.Publish, size: int, nursery: trio.Nursery) -> None:
        """Serve a PUBLISH up to its proposal, without a wait (:data:`INLINE_PUBLISH_ITEMS`):
        the same steps as :meth:`_handle` and :func:`~futureq.broker.publishing.publish`,
        in the same order. A refusal is answered at once; a queued proposal is answered
        by :meth:`_answer_inline`.

        Raises:
            _Closing: the refusal's code closes the connection.
        """
        broker = self.broker
        log_ = broker.log
        assert type(log_) is SingleNodeLog
        started = trio.current_time()
        reserved: list[group_reservations.GroupKey] = []
        try:
            self.access.check(self.principal, frame)
            if broker.shard is not None:
                check_shard(broker.shard, frame)
            broker._require_space()
            publish_ms = publishing.stamp(broker)
            validated: list[validation.ValidItem] = []
            for _ in validation.validate_publish_items_in_steps(
                frame.items, broker.limits, publish_ms, validated
            ):
                pass  # at most INLINE_PUBLISH_ITEMS: no step to yield between
            only = publishing.only_topic(validated)
            reserved = group_reservations.reserve_new_groups(broker, validated, only)
            command_list, command, keyed = publishing.publish_command(broker, validated, publish_ms)
            proposal = log_.propose_nowait(command, command_list)
        except BaseException as exc:
            if reserved:
                group_reservations.release_groups(broker, reserved)
            self._request_ended(size)
            if not isinstance(exc, (RequestError, RemoteProtocolError, NoSpaceError)):
                raise
            self._refused(exc, frame.request_id)
            return
        wants_result = keyed or frame.ack_level == frames.AckLevel.QUORUM
        self._inline.append(
            _InlinePublish(
                proposal,
                log_,
                frame.request_id,
                size,
                started,
                validated,
                only,
                reserved,
                wants_result,
            )
        )
        if not self._answering:
            self._answering = True
            nursery.start_soon(self._answer_inline)
        elif len(self._inline) == 1:
            proposal.done.wake_on_set(self._answer_idle)  # if it sleeps there, not woken now

    async def _answer_inline(self) -> None:
        """Answer the PUBLISHes the reader proposed (:attr:`_inline`) as their proposals
        end, in their order: one wake-up per group commit, not one per request. Runs from
        the connection's first such PUBLISH until the reader has ended and every one is
        answered. Cancelled (the connection closes), it gives up on those left: their
        proposals go on, unanswered, as a request task's would."""
        pending = self._inline
        try:
            while True:
                while pending and pending[0].proposal.done.is_set():
                    self._answer_one_inline(pending.popleft())
                if pending:
                    await pending[0].proposal.done.wait()
                elif self._reader_ended:
                    return
                else:
                    await self._answer_idle.park()  # moved to the next proposal's end
        finally:
            while pending:
                self._inline_ended(pending.popleft())

    def _answer_one_inline(self, publish: _InlinePublish) -> None:
        try:
            proposal = publish.proposal
            request_id = publish.request_id
            error = proposal.error
            if error is not None:
                self._refused(error, request_id)
                return
            broker = self.broker
            broker.metrics.publish_commit_seconds.observe(trio.current_time() - publish.started)
            publishing.count_published(broker, publish.validated, publish.only)
            duplicates = None
            if publish.wants_result:
                result = proposal.result
                if isinstance(result, PublishResult):
                    first_id, duplicates = result.first_id, result.duplicates
                else:
                    first_id = int(result)
            else:
                first_id = commands.message_id(proposal.index, 0)
            pairs = None if not duplicates else [[p, d] for p, d in sorted(duplicates.items())]
            self._reply(
                frames.PublishOk(request_id, first_id, len(publish.validated), pairs), request_id
            )
        finally:
            self._inline_ended(publish)

    def _inline_ended(self, publish: _InlinePublish) -> None:
        if publish.reserved:
            group_reservations.release_groups(self.broker, publish.reserved)
        publish.log.answered()
        self._request_ended(publish.size)

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

    def _version(self) -> int:
        """The protocol version this connection negotiated (1 before HELLO_OK)."""
        return self.session.version or 1

    def _check_prefetch_total(self, prefetch: int) -> None:
        """Refuse a SUBSCRIBE whose ``prefetch`` would take this connection's
        subscriptions past ``limits.max_prefetch_per_connection`` together (those being
        made count: SUBSCRIBEs pipelined behind one must see it), so one connection
        cannot claim the node's whole ``limits.max_deliveries_out``.

        Raises:
            RequestError: INVALID_ARGUMENT, naming the limit, the total and what to do.
        """
        if not 1 <= prefetch <= consumer_requests.most_window(self.limits, self._version()):
            return  # its range check (broker.subscribe) answers that
        # What the subscription may have out (an older client's window past
        # limits.max_prefetch is taken, but no more than that goes out).
        counted = consumer_requests.counted_prefetch(self.limits, prefetch)
        shown = f"{prefetch}" if counted == prefetch else f"{prefetch} (counted as {counted})"
        limit = self.limits.max_prefetch_per_connection
        held = self._subscribing_prefetch + sum(
            consumer.prefetch for consumer in self.subscriptions.values() if not consumer.closed
        )
        if held + counted > limit:
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT,
                f"prefetch {shown} would take this connection's subscriptions to "
                f"{held + counted} prefetch together (they hold {held}), past the limit "
                f"(limits.max_prefetch_per_connection = {limit}); subscribe with a prefetch "
                f"of at most {max(0, limit - held)}, unsubscribe others, or open another "
                "connection",
            )

    def _forget_ended_subscriptions(self) -> None:
        """Drop the subscriptions the server ended (their group was deleted: the client
        got SUBSCRIPTION_END, and their ids are unknown from then on).

        Found by a tester: they stayed in :attr:`subscriptions`, so each counted
        against ``limits.max_subscriptions_per_connection`` for the connection's life: a
        consumer that subscribed again after each deletion of its group was refused
        TOO_MANY_SUBSCRIPTIONS for good while holding none. A subscription closed only
        because its connection stopped taking frames is still the hub's (it ends with
        the connection) and is kept.
        """
        consumers = self.broker.hub.consumers
        ended = [
            subscription_id
            for subscription_id, consumer in self.subscriptions.items()
            if consumer.closed and consumers.get(subscription_id) is not consumer
        ]
        for subscription_id in ended:
            del self.subscriptions[subscription_id]

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
                return frames.Ok(
                    frame.request_id, await broker.ack(self.id, frame.tags, self._may_settle)
                )
            case frames.Nack():
                done = await broker.nack(
                    self.id,
                    frame.tags,
                    frame.requeue_delay_ms,
                    frame.reason,
                    frame.dead_letter,
                    self._may_settle,
                )
                return frames.Ok(frame.request_id, done)
            case frames.Credit():
                broker.grant_credit(self.id, frame.subscription_id, frame.credit)
                return None
            case frames.Subscribe():
                # Counted from the check until the consumer is registered: the group's
                # creation is awaited in between, and SUBSCRIBEs pipelined behind this
                # one must see it (else each passes the same check).
                self._forget_ended_subscriptions()
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
                self._check_prefetch_total(frame.prefetch)
                counted = consumer_requests.counted_prefetch(self.limits, frame.prefetch)
                self._subscribing += 1
                self._subscribing_prefetch += counted
                broker.subscribes_in_flight += 1
                try:
                    consumer = await broker.subscribe(
                        self.id,
                        self.outbox,
                        frame.topic,
                        frame.group,
                        frame.prefetch,
                        frame.headers,
                        protocol_version=self._version(),
                    )
                finally:
                    self._subscribing -= 1
                    self._subscribing_prefetch -= counted
                    broker.subscribes_in_flight -= 1
                # Version 4 answers HANDOVER (docs/protocol.md, "Versions").
                consumer.asks_handed = self._version() >= 4
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
                    frame.request_id,
                    broker.extend(self.id, frame.tags, frame.visibility_ms, self._may_settle),
                )
            case frames.Release():
                return frames.Ok(
                    frame.request_id, await broker.release(self.id, frame.tags, self._may_settle)
                )
            case frames.Unsubscribe():
                version = self._version()
                if frame.handed is not None and version < 3:
                    # A connection of version 1 or 2 is answered exactly as before
                    # (docs/protocol.md, "Versions"): a client that sent handed here
                    # would lose its connection on an older server, so it must learn
                    # it on this one too.
                    raise RemoteProtocolError(
                        ErrorCode.INVALID_FRAME,
                        "UNSUBSCRIBE frame: expected 1 fields after the request id, got 2 "
                        f"(handed is a field of protocol version 3; this connection speaks "
                        f"version {version}: offer 3 in HELLO, or send no handed)",
                    )
                self._forget_ended_subscriptions()
                found = self.subscriptions.pop(frame.subscription_id, None)
                if found is None:
                    raise RequestError(
                        ErrorCode.UNKNOWN_SUBSCRIPTION,
                        f"no subscription {frame.subscription_id} on this connection",
                    )
                await broker.unsubscribe_handed(found, frame.handed)
                if found.in_flight:
                    self._left_holding.append(found)
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
                _, created = await broker.create_group(
                    frame.topic,
                    frame.group,
                    frame.visibility_timeout_ms,
                    frame.max_deliveries,
                    frame.from_backlog,
                    frame.dead_letter_expired,
                )
                return frames.Ok(frame.request_id, int(created))
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


class _InlinePublish:
    """A PUBLISH the reader proposed (:meth:`Connection._publish_inline`), until answered."""

    __slots__ = (
        "log",
        "only",
        "proposal",
        "request_id",
        "reserved",
        "size",
        "started",
        "validated",
        "wants_result",
    )

    def __init__(
        self,
        proposal: Any,
        log: SingleNodeLog,
        request_id: int,
        size: int,
        started: float,
        validated: list[validation.ValidItem],
        only: str | None,
        reserved: list[group_reservations.GroupKey],
        wants_result: bool,
    ) -> None:
        self.proposal = proposal
        self.log = log
        self.request_id = request_id
        self.size = size
        self.started = started
        self.validated = validated
        self.only = only
        self.reserved = reserved
        self.wants_result = wants_result
        """Keyed or ack level QUORUM: answered from the apply result, not the index."""


class LingeringTransport(trio.abc.HalfCloseableStream):
    """The TCP stream under a server-side TLS stream, whose close can linger.

    ``trio.SSLStream.aclose`` sends the TLS ``close_notify`` and then closes its
    transport at once: with bytes of the client unread in the socket (requests sent
    after the server stopped reading, a HELLO not read yet) that close is a TCP reset,
    which may also throw away the ``close_notify`` and the last answers still unsent.
    With :attr:`linger` set, closing this transport first half-closes it and reads and
    drops what the client still sends until it closes (at most :data:`LINGER_S`,
    :data:`LINGER_BYTES`): the client reads its answers, the ``close_notify``, then a
    clean end of the connection.

    ``socket`` is the TCP stream's (:func:`peer_name` reads the address from it).

    Args:
        transport: The accepted TCP stream.
    """

    def __init__(self, transport: trio.SocketStream) -> None:
        self.transport = transport
        self.linger = False
        """Whether :meth:`aclose` half-closes and drains first (the server ends the
        connection on purpose: a graceful shutdown, a refusal)."""

    @property
    def socket(self) -> trio.socket.SocketType:
        """The TCP socket."""
        return self.transport.socket

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """As ``trio.SocketStream.send_all``."""
        await self.transport.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        """As ``trio.SocketStream.wait_send_all_might_not_block``."""
        await self.transport.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        """As ``trio.SocketStream.send_eof``."""
        await self.transport.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """As ``trio.SocketStream.receive_some``."""
        return await self.transport.receive_some(max_bytes)

    async def aclose(self) -> None:
        """Close the TCP stream; with :attr:`linger`, half-close and drain it first
        (bounded: :data:`LINGER_S`; not at all when cancelled, as by
        ``trio.aclose_forcefully``)."""
        try:
            if self.linger:
                with trio.move_on_after(LINGER_S):
                    try:
                        await half_close_and_drain(self.transport, LINGER_BYTES, RECEIVE_BYTES)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        pass
        finally:
            await self.transport.aclose()


async def close_tls_cleanly(stream: trio.abc.Stream) -> bool:
    """Close a server-side TLS stream over a :class:`LingeringTransport` cleanly: read
    and drop the client's application data already there (OpenSSL refuses to send
    ``close_notify`` with some unread: the TLS layer's close then failed, and the client
    saw a bare TCP close, ``SSLEOFError``), send ``close_notify``, half-close and
    drain the TCP stream, close it (at most about 2 x :data:`LINGER_S`). False, with
    nothing done, for any other stream.

    Raises:
        trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError: as
            the stream's ``receive_some`` (it is closed all the same).
    """
    if not (
        isinstance(stream, trio.SSLStream)
        and isinstance(stream.transport_stream, LingeringTransport)
    ):
        return False
    stream.transport_stream.linger = True
    try:
        dropped = 0
        with trio.move_on_after(LINGER_S):
            while dropped < LINGER_BYTES:
                # What has come is read at once; the first read that waits ends it.
                with trio.move_on_after(TLS_IDLE_S) as idle:
                    chunk = await stream.receive_some(RECEIVE_BYTES)
                if idle.cancelled_caught or not chunk:
                    break
                dropped += len(chunk)
    finally:
        await stream.aclose()
    return True


async def _linger(stream: trio.abc.Stream) -> None:
    """End a connection the server finished (graceful shutdown) with a clean close:
    half-close it, then read and drop what the client still sends until it closes
    (at most :data:`LINGER_S`, :data:`LINGER_BYTES`). A socket closed with unread
    bytes (requests sent after the server stopped reading, or a HELLO not read yet)
    sends a reset instead of a close: the client saw ECONNRESET after its last answer
    (or instead of any), an error, where the end of the connection was meant. Over TLS
    the close that follows sends ``close_notify`` first, then lingers the same way
    (:class:`LingeringTransport`); nothing for a WebSocket (its HTTP connection ends
    as the HTTP server ends it)."""
    if not isinstance(stream, trio.abc.HalfCloseableStream):
        with trio.move_on_after(2 * LINGER_S):
            try:
                await close_tls_cleanly(stream)
            except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
                return
        return
    with trio.move_on_after(LINGER_S):
        try:
            await half_close_and_drain(stream, LINGER_BYTES, RECEIVE_BYTES)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return


async def half_close_and_drain(
    stream: trio.abc.HalfCloseableStream, max_bytes: int, chunk_bytes: int
) -> None:
    """Half-close ``stream``, then read and drop what the peer still sends until it
    closes or ``max_bytes`` (bytes) were dropped, reading at most ``chunk_bytes`` at a
    time: so that closing the socket afterwards sends a close, not a reset (a socket
    closed with unread bytes resets). No deadline of its own: the caller sets one.

    Raises:
        trio.BrokenResourceError, trio.ClosedResourceError, OSError: as the stream's
            ``send_eof`` and ``receive_some``.
    """
    await stream.send_eof()
    dropped = 0
    while dropped < max_bytes:
        chunk = await stream.receive_some(chunk_bytes)
        if not chunk:
            return
        dropped += len(chunk)
