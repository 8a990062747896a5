"""One client connection: TCP (optionally TLS), HELLO, a reader task and a writer task.

Requests pipeline: each gets a fresh request id (:class:`RequestTable`) and a waiter;
the reader matches answers by id and hands pushes (DELIVER, REVOKE, SUBSCRIPTION_INFO,
SUBSCRIPTION_END; request id 0) to a callback. The connection never reconnects by
itself — :class:`futureq.client.Client` owns the lifetime and opens a new
:class:`Connection` (a new *epoch*) when this one is lost.

Cancellation is clean at every await: a request whose caller gave up (cancelled, or
its deadline passed) after it was sent stays registered as *abandoned*; its answer,
when it comes, still runs the request's ``on_answer`` hook (so a late SUBSCRIBE_OK is
undone, a late ACK's credit is granted) and is otherwise logged at debug level and
dropped. Only a protocol error (1xx) ends the connection; a refused request nobody
waits for (a CREDIT refused with request id 0, a late error) is logged, never fatal.
Source: ``docs/protocol.md``, "Connection lifecycle" and "Requests".
"""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import anyio
import anyio.abc
from anyio.streams.tls import TLSStream

from futureq import __version__
from futureq.client._batching import RequestTable
from futureq.config import split_host_port
from futureq.errors import (
    ConnectionLostError,
    ErrorCode,
    FutureQError,
    LocalProtocolError,
    NotSentError,
    RemoteProtocolError,
    RequestError,
    error_from_code,
)
from futureq.tls_handshake import NOT_TLS_REASONS
from futureq.wire import codec, frames

if TYPE_CHECKING:
    from collections.abc import Sequence

RECEIVE_BYTES: Final = 65_536
"""Most bytes read from the socket at once."""
WRITE_QUEUE_FRAMES: Final = 256
"""Encoded frames waiting for the writer task; senders block when it is full."""
WRITE_COALESCE_BYTES: Final = 256 * 1024
"""The writer joins queued frames into one ``send_all`` up to this size (bytes)."""
CLOSE_GRACE_S: Final = 1.0
"""Longest a closing connection waits for its socket to close (seconds)."""
SILENT_SERVER_S: Final = 0.5
"""How long a connection may stay silent (seconds) while an answer is owed on it
before the client PINGs the server: no byte since the first request still owed was
sent, the last write ended, or the last byte was heard, whichever is latest. No byte
within :data:`PING_PROBE_S` of the PING leaving closes the connection: the server is
stopped or hung (its TCP connection stays open), so the requests in flight fail as on
any lost connection (and are resent, within their deadline, on the next, perhaps to a
new leader). A server that is only slow answers the PING (requests run in their own
tasks there; PING is answered by the connection's reader) and keeps the connection;
one that sends anything at all meanwhile is not silent. Its followers depose a leader
silent to them for a node's election timeout (500 ms by default), so a leader silent
to its client for :data:`SILENT_SERVER_S` + :data:`PING_PROBE_S` is being replaced
already; a healthy one answers a PING in a round trip."""
PING_PROBE_S: Final = 1.5
"""How long the PING of a silent connection may go unanswered (seconds), counted from
when the writer had sent everything queued before it; see above. A healthy node's
PING round trip under a load that saturates it was seen up to 0.72 s (2 cores, 18
batch publishers): the whole silence allowed, 2 s, leaves nearly three times that
(a false verdict costs a reconnect, and an at-most-once publish's outcome)."""
IDLE_PING_S: Final = 2.0
"""A connection that owes nothing but carries a subscription (a consumer waiting for
deliveries) PINGs the server after this long with nothing heard (seconds); from then
on it is a connection owed an answer, see :data:`SILENT_SERVER_S`. A stopped leader
sends no delivery and no keepalive, so without this its consumers waited on it for
as long as it stayed stopped."""
WRITE_STALL_S: Final = 10.0
"""A write still under way (a large frame on a slow link) keeps the connection from
being called silent for up to this long (seconds); a write blocked longer with not a
byte heard (a stopped server whose socket buffers filled) is silence too."""
DRAIN_GRACE_S: Final = 2.0
"""Longest a connection the client leaves (its server answered NOT_LEADER) stays open
for the answers still owed on it (seconds), capped by the client's
``request_timeout_s`` (:meth:`Connection.drain`)."""

CLIENT_NAME: Final = f"futureq-client/{__version__}"

log = logging.getLogger(__name__)


class HopelessConnectError(ConnectionLostError):
    """A connection attempt failed in a way trying again within the same second will
    not mend (a configuration mismatch, not a server starting or stopping): the first
    connection of :func:`~futureq.client.open_client` gives up at once when every
    server failed so, instead of retrying for ``connect_timeout_s``."""


class UnknownHostError(HopelessConnectError):
    """The resolver answered that the server's host name does not exist (not a
    timeout, not a temporary failure)."""


class TLSMismatchError(HopelessConnectError):
    """TLS could not be set up: the server's certificate is not trusted or names
    another host, the server does not speak TLS on that port, or the address is an
    HTTP port."""


def _tls_failure(exc: BaseException, address: str) -> ConnectionLostError | None:
    """A sentence for a TLS handshake that failed, when ``exc`` (or one of its causes)
    is an :class:`ssl.SSLError` saying why; None otherwise (a reset or a timeout is
    not a mismatch). A :class:`TLSMismatchError` when no retry can mend it."""
    seen: BaseException | None = exc
    while seen is not None and not isinstance(seen, ssl.SSLError):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return None
    if isinstance(seen, ssl.SSLCertVerificationError):
        why = (seen.verify_message or seen.reason or "certificate verify failed").rstrip(".")
        return TLSMismatchError(
            f"could not connect to {address}: its TLS certificate was refused: {why}; "
            "trust the CA that signed it (--tls-ca FILE, or an ssl_context loading it) "
            "and connect by a name the certificate holds"
        )
    if seen.reason in NOT_TLS_REASONS:
        return TLSMismatchError(
            f"could not connect to {address}: it does not speak TLS on that port (its "
            f"answer to the TLS handshake was not TLS: {seen.reason}); connect without "
            "TLS (drop --tls / --tls-ca, or ssl_context), or use the port where the "
            "server serves TLS clients"
        )
    if seen.reason is not None and "CERTIFICATE" in seen.reason and "ALERT" in seen.reason:
        # The server's alert about this client's certificate (none, or one it does not
        # trust): a server checking client certificates (tls.ca_file).
        return TLSMismatchError(
            f"could not connect to {address}: the server refused this client's TLS "
            f"certificate, or its lack of one ({seen.reason}); give the ssl_context a "
            "client certificate the server trusts (load_cert_chain)"
        )
    # Anything else (the connection cut during the handshake, ...) may pass: retried.
    return ConnectionLostError(
        f"could not connect to {address}: the TLS handshake failed: "
        f"{seen.reason or seen.strerror or seen}"
    )


_NO_SUCH_NAME: Final = frozenset(
    getattr(socket, name)
    for name in ("EAI_NONAME", "EAI_NODATA", "EAI_SERVICE", "EAI_ADDRFAMILY")
    if hasattr(socket, name)
)
"""``getaddrinfo`` errors that are the resolver's answer "no such name", as opposed to
EAI_AGAIN (temporary) or EAI_FAIL (the resolver failed)."""


class UnencodableError(RequestError):
    """The request holds a value msgpack cannot encode; nothing was sent.

    A :class:`RequestError` with code INVALID_FIELD, the code the server gives for a
    field it cannot take, so callers see one documented exception; the connection and
    every other request on it are unaffected.
    """


class RequestTooLargeError(RequestError):
    """The request encodes to more than the server's ``max_frame_bytes``; nothing was
    sent. Code INVALID_ARGUMENT (the publisher splits such batches instead)."""


def encode_request(frame: frames.Frame, max_frame_bytes: int) -> bytes:
    """``codec.encode_frame`` with its local failures as the documented
    :class:`RequestError` subclasses above (``docs/client.md``, "Errors").

    Raises:
        UnencodableError: a field cannot be encoded.
        RequestTooLargeError: the frame is over ``max_frame_bytes``.
    """
    try:
        return codec.encode_frame(frame, max_frame_bytes)
    except LocalProtocolError as exc:
        name = frame.TYPE.name
        if exc.code is ErrorCode.FRAME_TOO_LARGE:
            raise RequestTooLargeError(
                ErrorCode.INVALID_ARGUMENT,
                f"{name} request not sent: {exc.message} (the server's max_frame_bytes); "
                "send less per call",
            ) from None
        raise UnencodableError(
            ErrorCode.INVALID_FIELD, f"{name} request not sent: {exc.message}"
        ) from None


class _Waiter:
    """The answer slot of one request: a frame or an error, and an event.

    ``abandoned``: the caller stopped waiting after the request was sent; the answer
    still runs ``on_answer`` (a success) and is then dropped.
    """

    __slots__ = ("event", "frame", "error", "on_answer", "abandoned", "name", "written")

    def __init__(self, on_answer: Callable[[frames.Frame], None] | None, name: str) -> None:
        self.event = anyio.Event()
        self.frame: frames.Frame | None = None
        self.error: FutureQError | None = None
        self.on_answer = on_answer
        self.abandoned = False
        self.name = name
        self.written = False
        """The writer took the request to write it to the socket: from then on, a
        lost connection leaves its outcome unknown (before, it was never sent)."""

    def set_frame(self, frame: frames.Frame) -> None:
        self.frame = frame
        self.event.set()

    def set_error(self, error: FutureQError) -> None:
        self.error = error
        self.event.set()


PushFrame = (
    frames.Deliver
    | frames.Revoke
    | frames.SubscriptionInfo
    | frames.SubscriptionEnd
    | frames.Handover
    | frames.GoAway
)
PushCallback = Callable[["Connection", PushFrame], None]
_PUSHES: Final = (
    frames.Deliver,
    frames.Revoke,
    frames.SubscriptionInfo,
    frames.SubscriptionEnd,
    frames.Handover,
    frames.GoAway,
)


class Connection:
    """An open, greeted connection to one server.

    Build it with :func:`connect`; run it with :meth:`run` inside a nursery-owning
    task; it is *lost* once :meth:`run` returns, and every request still waiting
    fails with :class:`ConnectionLostError`.

    Attributes:
        address: ``host:port`` this connection reached.
        epoch: Sequence number of this connection within its client (1, 2, ...).
            Deliveries remember the epoch they came on; acking them is only possible
            on the same epoch.
        node_id: The server's node id from HELLO_OK.
        leader_address: The leader's client address as HELLO_OK reported it.
        max_frame_bytes: Largest frame body the server accepts (bytes).
        server_version: The server's software version.
        shards: How many shards the server's node runs (HELLO_OK; 1 when unsharded).
        members: Client addresses of the voters of the server's Raft group (HELLO_OK,
            protocol version 2); empty from a server speaking version 1.
        protocol_version: The protocol version the server chose (HELLO_OK).
        max_prefetch: The server's ``limits.max_prefetch`` (HELLO_OK, protocol version
            5; items): the most deliveries one subscription has out and the largest
            SUBSCRIBE window it takes. None from an older server, which does not say.
    """

    def __init__(
        self,
        stream: anyio.abc.ByteStream,
        decoder: codec.FrameDecoder,
        address: str,
        epoch: int,
        hello: frames.HelloOk,
        on_push: PushCallback,
    ) -> None:
        self._stream = stream
        self._decoder = decoder
        self.address = address
        self.epoch = epoch
        self.node_id = hello.node_id
        self.shards = hello.shards
        self.leader_address = hello.leader_address
        self.max_frame_bytes = hello.max_frame_bytes
        self.server_version = hello.server_version
        self.protocol_version = hello.version
        # Members are a version 2 field: a version 1 answer carrying them is ignored.
        self.members: tuple[str, ...] = (hello.members or ()) if hello.version >= 2 else ()
        self.max_prefetch: int | None = hello.max_prefetch if hello.version >= 5 else None
        self._on_push = on_push
        self._requests: RequestTable[_Waiter] = RequestTable()
        # Each item: a frame's bytes and, for a request, its waiter (marked written
        # when the writer takes it: a request lost before that took no effect).
        self._write_send, self._write_receive = anyio.create_memory_object_stream[
            tuple[bytes, _Waiter | None]
        ](WRITE_QUEUE_FRAMES)
        self._control_backlog: list[bytes] = []
        self._credit_backlog: dict[int, int] = {}
        self._cancel_scope = anyio.CancelScope()
        self._lost = anyio.Event()
        self.lost_reason: ConnectionLostError | None = None
        self._last_heard = anyio.current_time()
        """When bytes last came from the server (``anyio.current_time()``)."""
        self._owed_since = self._last_heard
        """When the oldest answer still owed was asked for (the request table went from
        empty to not empty): silence is counted from it or :attr:`_last_heard`."""
        self._owing = anyio.Event()
        """Set when a request is added to an empty table: wakes :meth:`_probe_loop`."""
        self._write_started: float | None = None
        """When the write under way began (None: the writer is idle)."""
        self._last_written = self._last_heard
        """When the last write ended."""
        self.watched: Callable[[], bool] = lambda: False
        """Whether the connection carries a subscription (set by the client): it is
        then PINGed when idle and silent for :data:`IDLE_PING_S`."""
        self.silent = False
        """True once the connection was closed because the server answered nothing,
        not even a PING (:data:`SILENT_SERVER_S`): the client tries it last for a
        while."""
        self.draining: str | None = None
        """Why the client leaves this connection (:meth:`drain`): it takes no new
        request, and closes once the requests in flight are answered."""
        self._drain_grace_s = 0.0
        self._leaving = anyio.Event()
        """Set once the connection drains or is lost: the client connects anew."""
        self._idle = anyio.Event()
        """Set when the last request in flight was answered while draining."""

    @property
    def is_lost(self) -> bool:
        """True once the connection failed or was closed; it never comes back."""
        return self.lost_reason is not None

    @property
    def is_leaving(self) -> bool:
        """True once the connection drains (:meth:`drain`) or is lost: no new request
        goes on it."""
        return self._leaving.is_set()

    async def wait_lost(self) -> None:
        """Block until the connection is lost."""
        await self._lost.wait()

    def close(self, reason: str) -> None:
        """Close the connection (idempotent); waiting requests fail with ``reason``."""
        self._fail(ConnectionLostError(reason))

    def drain(self, reason: str, grace_s: float) -> None:
        """Leave the connection gracefully (idempotent): take no new request (
        :meth:`request` raises :class:`NotSentError`, so the caller sends it on the
        next connection), let the answers owed to the requests already sent arrive,
        then close once none is owed or ``grace_s`` seconds have passed; requests
        still unanswered then fail with :class:`ConnectionLostError` (``reason``), as
        on any lost connection. Pushes keep being read meanwhile.

        Args:
            reason: Why the client leaves (the NOT_LEADER redirect), for errors and logs.
            grace_s: Longest wait for the answers owed (seconds).
        """
        if self.lost_reason is not None or self.draining is not None:
            return
        self.draining = reason
        self._drain_grace_s = grace_s
        self._leaving.set()
        self._check_idle()

    async def wait_leaving(self) -> None:
        """Block until the connection drains (:meth:`drain`) or is lost."""
        await self._leaving.wait()

    def _check_idle(self) -> None:
        if self.draining is not None and not len(self._requests):
            self._idle.set()

    async def discard(self, reason: str = "another server answered first") -> None:
        """Close a connection that was never run (another server answered first, or
        the client stopped connecting): its socket and its write queue."""
        self._fail(ConnectionLostError(reason))
        self._write_send.close()
        self._write_receive.close()
        self._lost.set()
        await _abort(self._stream)

    def _fail(self, reason: ConnectionLostError) -> None:
        if self.lost_reason is None:
            self.lost_reason = reason
        self._leaving.set()
        self._cancel_scope.cancel()

    async def _drain_loop(self) -> None:
        """Once draining: close when no answer is owed or the grace time passed."""
        await self._leaving.wait()
        if self.draining is None:
            return  # lost, not drained: run() is cancelled already
        with anyio.move_on_after(self._drain_grace_s):
            await self._idle.wait()
        owed = len(self._requests)
        log.debug(
            "%s drained (%s); %d answer(s) still owed dropped", self.address, self.draining, owed
        )
        self._fail(ConnectionLostError(f"{self.draining or 'connection closed'}"))

    async def run(self) -> None:
        """Read and write until the connection breaks or :meth:`close` is called.

        Never raises for network or protocol trouble: the reason lands in
        :attr:`lost_reason`, waiting requests fail with it, and the socket is closed.
        """
        try:
            with self._cancel_scope:
                async with anyio.create_task_group() as nursery:
                    nursery.start_soon(self._read_loop)
                    nursery.start_soon(self._write_loop)
                    nursery.start_soon(self._probe_loop)
                    nursery.start_soon(self._drain_loop)
        finally:
            if self.lost_reason is None:
                self.lost_reason = ConnectionLostError(f"connection to {self.address} closed")
            for waiter in self._requests.drain():
                waiter.set_error(
                    self.lost_reason
                    if waiter.written
                    else NotSentError(
                        f"{self.lost_reason}; the request was still queued in the client, "
                        "never written to the connection: it was not sent"
                    )
                )
            self._write_send.close()
            self._write_receive.close()
            self._leaving.set()
            self._lost.set()
            with anyio.move_on_after(CLOSE_GRACE_S, shield=True):
                await self._stream.aclose()

    async def _read_loop(self) -> None:
        decoder = self._decoder
        try:
            while True:
                frame = decoder.next_frame()
                if frame is codec.NEED_DATA:
                    decoder.receive_data(await _receive(self._stream))
                    self._last_heard = anyio.current_time()
                    continue
                if frame is codec.CLOSED:
                    self._fail(ConnectionLostError(f"server {self.address} closed the connection"))
                    return
                self._dispatch(frame)  # type: ignore[arg-type]
                self._check_idle()
        except RemoteProtocolError as exc:
            self._fail(
                ConnectionLostError(f"server {self.address} sent a bad frame: {exc.message}")
            )
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self._fail(
                ConnectionLostError(f"connection to {self.address} broke: {_broken_reason(exc)}")
            )

    def _writing(self, now: float) -> bool:
        """Whether a write is under way and not stalled past :data:`WRITE_STALL_S`:
        what it carries (a request, the PING) has not left yet, so the server's
        silence says nothing."""
        started = self._write_started
        return started is not None and now - started < WRITE_STALL_S

    async def _probe_loop(self) -> None:
        """PING a server that stays silent for :data:`SILENT_SERVER_S` while an answer
        is owed; close the connection if nothing comes within :data:`PING_PROBE_S`.
        An idle connection (nothing owed) is PINGed only when it carries a
        subscription (:attr:`watched`), after :data:`IDLE_PING_S` of silence; another
        is left to the server's keepalive."""
        tick = min(0.05, PING_PROBE_S / 4)
        while True:
            if not len(self._requests):
                self._owing = anyio.Event()
                now = anyio.current_time()
                quiet_since = max(self._last_heard, self._last_written)
                if not self.watched():
                    with anyio.move_on_after(IDLE_PING_S):  # a subscription may come
                        await self._owing.wait()
                elif now - quiet_since < IDLE_PING_S:
                    with anyio.move_on_after(quiet_since + IDLE_PING_S - now):
                        await self._owing.wait()
                else:
                    # A consumer's idle connection: is the server still there?
                    self.request_nowait(lambda request_id: frames.Ping(request_id))
                continue
            now = anyio.current_time()
            quiet_since = max(self._last_heard, self._owed_since, self._last_written)
            if self._writing(now) or now - quiet_since < SILENT_SERVER_S:
                await anyio.sleep(
                    tick if self._writing(now) else quiet_since + SILENT_SERVER_S - now
                )
                continue
            asked = now
            self.request_nowait(lambda request_id: frames.Ping(request_id))
            woke_late = False
            while self._last_heard < asked:
                now = anyio.current_time()
                if (
                    not woke_late
                    and not self._writing(now)
                    and now - max(asked, self._last_written) >= PING_PROBE_S
                ):
                    self.silent = True
                    self._fail(
                        ConnectionLostError(
                            f"{self.address} answered nothing, not even a PING, for "
                            f"{now - quiet_since:.1f} s with an answer owed (stopped or "
                            "hung); reconnecting"
                        )
                    )
                    return
                # This task woke late: this process's own loop was busy, and the reader
                # may not have run yet for bytes already there; decide a tick later.
                await anyio.sleep(tick)
                woke_late = anyio.current_time() - now > 2 * tick

    def _dispatch(self, frame: frames.Frame) -> None:
        if isinstance(frame, _PUSHES):
            if isinstance(frame, frames.GoAway):
                self._went_away(frame)
            self._on_push(self, frame)
            return
        if isinstance(frame, frames.Ping):
            # The server's keepalive: answer, or it closes an idle connection.
            try:
                self._write_send.send_nowait(
                    (codec.encode_frame(frames.Pong(frame.request_id)), None)
                )
            except anyio.WouldBlock:
                pass  # the writer is busy, so the connection is not idle anyway
            return
        if isinstance(frame, frames.Error):
            error = error_from_code(
                frame.code, frame.message, frame.item_index, frame.leader_address
            )
            if isinstance(error, RemoteProtocolError):
                # 1xx: the server closes after this frame; so do we.
                waiter = self._requests.pop(frame.request_id) if frame.request_id else None
                if waiter is not None:
                    waiter.set_error(error)
                self._fail(
                    ConnectionLostError(
                        f"server {self.address} closed the connection: "
                        f"[{_code_name(frame.code)}] {frame.message}"
                    )
                )
                return
            waiter = self._requests.pop(frame.request_id) if frame.request_id else None
            if waiter is None or waiter.abandoned:
                # Nobody waits for it: a CREDIT refused (request id 0; e.g. the
                # subscription just ended), or a late answer to a request given up.
                level = logging.INFO if frame.request_id == 0 else logging.DEBUG
                log.log(
                    level,
                    "%s refused %s nobody waits for: [%s] %s",
                    self.address,
                    "a request" if waiter is None else waiter.name,
                    _code_name(frame.code),
                    frame.message,
                )
                return
            waiter.set_error(error)
            return
        waiter = self._requests.pop(frame.request_id)
        if waiter is None:
            log.debug("%s: answer to unknown request %d dropped", self.address, frame.request_id)
            return
        if waiter.on_answer is not None:
            # Runs before any other frame is read, so DELIVER frames that follow a
            # SUBSCRIBE_OK always find their subscription registered, and even when
            # the caller gave up (a late SUBSCRIBE_OK is undone, a late OK's credit
            # is granted).
            waiter.on_answer(frame)
        if waiter.abandoned:
            log.debug("%s: late answer to an abandoned %s dropped", self.address, waiter.name)
            return
        waiter.set_frame(frame)

    def _went_away(self, frame: frames.GoAway) -> None:
        """GOAWAY (protocol version 6): the server served no request with a larger id
        than ``last_request_id`` and never will on this connection. Each of those fails
        with :class:`NotSentError` (it took no effect: the caller sends it again on the
        next connection, whatever it was, an at-most-once publish included); the
        answers to the others still come. The client's push callback then leaves the
        connection (:meth:`drain`)."""
        for waiter in self._requests.take_above(frame.last_request_id):
            waiter.set_error(
                NotSentError(
                    f"{self.address} serves no more requests on this connection "
                    f"([{_code_name(frame.code)}] {frame.message}); this one took no effect"
                )
            )

    async def _write_loop(self) -> None:
        try:
            async for data, waiter in self._write_receive:
                if waiter is not None:
                    waiter.written = True
                chunks = [data]
                size = len(data)
                while size < WRITE_COALESCE_BYTES:
                    try:
                        more, more_waiter = self._write_receive.receive_nowait()
                    except anyio.WouldBlock:
                        break
                    if more_waiter is not None:
                        more_waiter.written = True
                    chunks.append(more)
                    size += len(more)
                self._write_started = anyio.current_time()
                await self._stream.send(b"".join(chunks) if len(chunks) > 1 else data)
                self._last_written = anyio.current_time()
                self._write_started = None
                if self._control_backlog or self._credit_backlog:
                    backlog, self._control_backlog = self._control_backlog, []
                    credits, self._credit_backlog = self._credit_backlog, {}
                    backlog += [
                        codec.encode_frame(frames.Credit(0, sid, n), self.max_frame_bytes)
                        for sid, n in credits.items()
                    ]
                    self._write_started = anyio.current_time()
                    await self._stream.send(b"".join(backlog))
                    self._last_written = anyio.current_time()
                    self._write_started = None
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self._fail(
                ConnectionLostError(f"connection to {self.address} broke: {_broken_reason(exc)}")
            )

    def send_control(self, frame: frames.Frame) -> None:
        """Queue a frame that needs no answer (CREDIT) without blocking; for callbacks.

        With the write queue full it waits in a backlog the writer sends after its
        current write (CREDITs of one subscription merged into one, so the backlog
        stays as small as the number of subscriptions). On a lost connection it is
        dropped (the server forgets the subscription with it).
        """
        if self.lost_reason is not None:
            return
        data = codec.encode_frame(frame, self.max_frame_bytes)
        try:
            self._write_send.send_nowait((data, None))
        except anyio.WouldBlock:
            if isinstance(frame, frames.Credit):
                owed = self._credit_backlog.get(frame.subscription_id, 0)
                self._credit_backlog[frame.subscription_id] = owed + frame.credit
            else:
                self._control_backlog.append(data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    def request_nowait(
        self,
        make_frame: Callable[[int], frames.Frame],
        *,
        on_answer: Callable[[frames.Frame], None] | None = None,
    ) -> None:
        """Send a request nobody will wait for (from a callback): its answer runs
        ``on_answer`` if it succeeds and is otherwise logged and dropped."""
        if self.lost_reason is not None:
            return
        waiter = _Waiter(on_answer, "request")
        waiter.abandoned = True
        request_id = self._add_request(waiter)
        frame = make_frame(request_id)
        waiter.name = frame.TYPE.name
        self.send_control(frame)

    def _add_request(self, waiter: _Waiter) -> int:
        """Register ``waiter``; the first answer owed starts the silence count."""
        if not len(self._requests):
            self._owed_since = anyio.current_time()
            self._owing.set()
        return self._requests.add(waiter)

    async def send(self, *frames_to_send: frames.Frame) -> None:
        """Queue frames that have no answer (CREDIT).

        Raises:
            NotSentError: the connection is lost.
            UnencodableError, RequestTooLargeError: as :meth:`request`.
        """
        data = b"".join(encode_request(f, self.max_frame_bytes) for f in frames_to_send)
        await self._queue(data)

    async def _queue(self, data: bytes, waiter: _Waiter | None = None) -> None:
        if self.lost_reason is not None:
            raise NotSentError(str(self.lost_reason))
        try:
            await self._write_send.send((data, waiter))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise NotSentError(str(self.lost_reason or "connection closed")) from None

    async def request(
        self,
        make_frame: Callable[[int], frames.Frame],
        *,
        deadline: float,
        on_answer: Callable[[frames.Frame], None] | None = None,
        then_send: Sequence[frames.Frame] = (),
    ) -> frames.Frame:
        """Send one request and wait for its answer.

        Args:
            make_frame: Builds the request from its request id.
            deadline: ``anyio.current_time()`` value after which to give up.
            on_answer: Called synchronously by the reader with the answer before any
                later frame is processed (used to register subscriptions).
            then_send: Frames without an answer written right after the request
                (CREDIT after ACK), in the same write.

        Returns:
            The answer frame (never an ERROR frame).

        Raises:
            NotSentError: lost or draining (:meth:`drain`) before the request was
                queued, or lost while it was queued, before the writer took it
                (nothing reached the server), or above a GOAWAY's last request served.
            ConnectionLostError: lost after the writer took it to write it: the
                outcome is unknown.
            RequestError: the server refused it (an ERROR frame), or TIMEOUT when no
                answer came before ``deadline`` (outcome unknown).
            RemoteProtocolError: the server refused it with a 1xx code.
            UnencodableError: a field cannot be encoded (a RequestError INVALID_FIELD).
            RequestTooLargeError: the frame exceeds the server's ``max_frame_bytes``
                (a RequestError INVALID_ARGUMENT); nothing was sent.
        """
        if self.lost_reason is not None:
            raise NotSentError(str(self.lost_reason))
        if self.draining is not None:
            raise NotSentError(f"{self.draining}; nothing was sent on {self.address}")
        waiter = _Waiter(on_answer, "request")
        request_id = self._add_request(waiter)
        queued = False
        try:
            frame = make_frame(request_id)
            waiter.name = frame.TYPE.name
            data = encode_request(frame, self.max_frame_bytes)
            if then_send:
                data += b"".join(encode_request(f, self.max_frame_bytes) for f in then_send)
            with anyio.CancelScope(deadline=deadline):
                await self._queue(data, waiter)
                queued = True
            if not queued:
                raise NotSentError(
                    f"no room to send to {self.address} before the deadline; nothing was sent"
                )
            with anyio.CancelScope(deadline=deadline):
                await waiter.event.wait()
        finally:
            if queued and not waiter.event.is_set() and self.lost_reason is None:
                # Sent, and the caller stops waiting (cancelled, or its deadline
                # passed): the answer will come; let the reader handle it then.
                waiter.abandoned = True
            else:
                self._requests.pop(request_id)
                self._check_idle()
        if waiter.error is not None:
            raise waiter.error
        if waiter.frame is None:
            raise RequestError(
                ErrorCode.TIMEOUT,
                f"no answer from {self.address} to {type(frame).__name__.upper()} "
                "before the deadline; its outcome is unknown",
            )
        return waiter.frame


def _os_reason(exc: BaseException) -> str:
    """The most specific reason inside AnyIO's "all connection attempts failed" OSError:
    its cause is the one attempt's error (AnyIO 4.16), or a group of one."""
    cause = exc.__cause__
    if isinstance(cause, BaseExceptionGroup) and len(cause.exceptions) == 1:
        exc = cause.exceptions[0]
    elif isinstance(cause, OSError):
        exc = cause
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower() if exc.strerror[:1].isupper() else exc.strerror
    return _broken_reason(exc)


def _broken_reason(exc: BaseException) -> str:
    """Why a stream broke, never empty.

    AnyIO's ``BrokenResourceError`` usually carries no message of its own (the OS
    error is its cause, or nothing at all): use the first of the exception and its
    causes that says something, else a sentence for its kind.
    """
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            text = seen.strerror
            return text[:1].lower() + text[1:]
        if str(seen):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    if isinstance(exc, anyio.BrokenResourceError):
        return "the server closed the connection (reset or broken pipe)"
    if isinstance(exc, anyio.ClosedResourceError):
        return "the connection was closed on this side"
    return type(exc).__name__


def _code_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


async def connect(
    address: str,
    *,
    epoch: int,
    on_push: PushCallback,
    ssl_context: ssl.SSLContext | None,
    server_hostname: str | None,
    token: str | None,
    timeout_s: float,
) -> Connection:
    """Open a connection to ``address`` and exchange HELLO / HELLO_OK.

    Args:
        address: ``host:port`` of a server's client listener.
        epoch: Number given to this connection (see :attr:`Connection.epoch`).
        on_push: Called by the reader for every push (DELIVER, REVOKE, SUBSCRIPTION_*).
        ssl_context: Wrap the TCP stream in TLS with this context when given.
        server_hostname: Name to verify the certificate against (default: the host).
        token: Auth token sent in HELLO.
        timeout_s: Deadline for connect, TLS handshake and HELLO together (seconds).

    Returns:
        A greeted connection; call :meth:`Connection.run` next.

    Raises:
        ConnectionLostError: the address is unreachable, refused, timed out or
            closed during the handshake (the message names the address);
            :class:`UnknownHostError` when its host name does not resolve,
            :class:`TLSMismatchError` when TLS cannot be set up (an untrusted
            certificate, a plaintext or HTTP port), :class:`HopelessConnectError`
            when the answer is not FutureQ's.
        RemoteProtocolError: the server refused HELLO (AUTH_FAILED,
            UNSUPPORTED_VERSION, ...), or its HELLO_OK named a version not offered
            (UNSUPPORTED_VERSION): retrying will not help.
    """
    try:
        host, port = split_host_port(address)
    except ValueError as exc:
        raise ConnectionLostError(f"bad server address: {exc}") from None
    stream: anyio.abc.ByteStream | None = None
    try:
        with anyio.fail_after(timeout_s):
            stream = await anyio.connect_tcp(host, port)
            if ssl_context is not None:
                stream = await TLSStream.wrap(
                    stream,
                    hostname=server_hostname or host,
                    ssl_context=ssl_context,
                    standard_compatible=False,
                )
            hello = frames.Hello(1, tuple(sorted(frames.SUPPORTED_VERSIONS)), CLIENT_NAME, token)
            await stream.send(codec.encode_frame(hello))
            decoder = codec.FrameDecoder()
            answer = await _read_one(stream, decoder, address)
    except TimeoutError:
        await _abort(stream)
        raise ConnectionLostError(
            f"could not connect to {address}: no answer within {timeout_s:g} s"
        ) from None
    except socket.gaierror as exc:
        await _abort(stream)
        kind = UnknownHostError if exc.errno in _NO_SUCH_NAME else ConnectionLostError
        raise kind(f"could not connect to {address}: {_os_reason(exc)}") from None
    except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
        await _abort(stream)
        tls_failure = _tls_failure(exc, address) if ssl_context is not None else None
        if tls_failure is not None:
            raise tls_failure from None
        raise ConnectionLostError(f"could not connect to {address}: {_os_reason(exc)}") from None
    except ConnectionLostError as exc:
        await _abort(stream)
        if "closed the connection during HELLO" not in str(exc):
            raise
        # A TLS server reads a plaintext HELLO as a broken ClientHello and hangs up
        # without a word, and under TLS 1.3 one that requires client certificates
        # hangs up after the handshake; say so rather than leave the user guessing.
        if ssl_context is None:
            hint = (
                "a server that wants TLS on this port does that to a plaintext client: "
                "connect with TLS (--tls-ca FILE or --tls, or an ssl_context)"
            )
        else:
            hint = (
                "a server that requires client certificates (tls.require_client_cert) "
                "does that to a client without one it trusts: give one (--tls-cert FILE "
                "[--tls-key FILE], or the ssl_context's load_cert_chain)"
            )
        raise ConnectionLostError(f"{exc} without answering; {hint}") from None
    except BaseException:
        await _abort(stream)
        raise
    if isinstance(answer, frames.Error):
        await _abort(stream)
        error = error_from_code(answer.code, answer.message)
        if isinstance(error, RemoteProtocolError):
            raise error
        raise ConnectionLostError(f"{address} refused the connection: {answer.message}")
    if not isinstance(answer, frames.HelloOk):
        await _abort(stream)
        raise ConnectionLostError(
            f"{address} answered HELLO with {type(answer).__name__}; is it a FutureQ server?"
        )
    if answer.version not in hello.versions:
        # docs/protocol.md, "Connection setup": the frames of a version this client
        # did not offer may mean something else; reading on would guess.
        await _abort(stream)
        raise RemoteProtocolError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"{address} answered HELLO with protocol version {answer.version}, which this "
            f"client did not offer (it speaks {', '.join(map(str, hello.versions))})",
        )
    decoder.max_frame_bytes = max(decoder.max_frame_bytes, answer.max_frame_bytes)
    return Connection(stream, decoder, address, epoch, answer, on_push)


async def _read_one(
    stream: anyio.abc.ByteStream, decoder: codec.FrameDecoder, address: str
) -> frames.Frame:
    first = b""
    while True:
        try:
            frame = decoder.next_frame()
        except RemoteProtocolError as exc:
            if first.startswith(b"HTTP/"):
                raise TLSMismatchError(
                    f"could not connect to {address}: it answered in HTTP, so it is an "
                    "HTTP port (a FutureQ node's serves /metrics, the dashboard and /ws), "
                    "not a client port; give the client port (7450 by default)"
                ) from None
            raise HopelessConnectError(
                f"could not connect to {address}: it answered HELLO with a bad frame "
                f"({exc.message}); is it a FutureQ server's client port?"
            ) from None
        if frame is codec.CLOSED:
            raise ConnectionLostError(f"{address} closed the connection during HELLO")
        if frame is not codec.NEED_DATA:
            return frame  # type: ignore[return-value]
        data = await _receive(stream)
        if len(first) < 5:
            first += data[:5]
        decoder.receive_data(data)


async def _receive(stream: anyio.abc.ByteStream) -> bytes:
    """The next bytes from ``stream``; ``b""`` once the server closed it (what
    :meth:`codec.FrameDecoder.receive_data` takes for the end of the stream)."""
    try:
        return bytes(await stream.receive(RECEIVE_BYTES))
    except anyio.EndOfStream:
        return b""


async def _abort(stream: anyio.abc.ByteStream | None) -> None:
    if stream is not None:
        with anyio.move_on_after(CLOSE_GRACE_S, shield=True):
            await anyio.aclose_forcefully(stream)


__all__ = [
    "Connection",
    "HopelessConnectError",
    "NotSentError",
    "TLSMismatchError",
    "UnknownHostError",
    "connect",
]
