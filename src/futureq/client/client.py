"""The asynchronous FutureQ client: batching, pipelining, reconnect, leader follow.

It runs unchanged under asyncio (``asyncio.run``) and trio (``trio.run``): it is written
against AnyIO, which runs on either event loop.

Usage::

    async with open_client("127.0.0.1:7450") as client:
        message_id = await client.publish("emails", b'{"to": "a@b.c"}', delay_ms=5_000)
        async with client.subscribe("emails", "senders") as sub:
            async for delivery in sub:
                handle(delivery.payload)
                await delivery.ack()

Delivery is **at-least-once** end to end: a publish whose connection broke after it
was sent is sent again on the next connection (it may then be stored twice), and a
delivery that is not acked (or whose ack was lost with its connection) is delivered
again. Make consumers idempotent. See ``docs/client.md``.

Lifetimes: :func:`open_client` owns one task group holding the connection manager (and
through it the current connection's reader and writer tasks), the publish batcher and
the lease keeper (extends the visibility of deliveries buffered and not yet handed
out, and releases what a pull-mode subscription did not ask for); nothing the client
starts outlives the ``async with`` block.

Cancellation is clean at every await: cancel any call (``anyio.move_on_after``) and
the connection, the other calls and every delivery held stay as they were; a late
answer is dropped (a late SUBSCRIBE_OK is undone with UNSUBSCRIBE).
"""

from __future__ import annotations

import functools
import logging
import os
import random
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, Literal, TypeVar

import anyio
import anyio.abc

from futureq.client import _checks
from futureq.client._backoff import Backoff
from futureq.client._batching import (
    PUBLISH_FRAME_OVERHEAD_BYTES,
    PublishItem,
    chunked,
    ids_from_publish_ok,
    refused_item,
    split_by_size,
    without_item,
)
from futureq.client._browse import BrowsePage, DueCounts, counts_from_frame, page_from_frame
from futureq.client._connection import (
    Connection,
    NotSentError,
    PushFrame,
    RequestTooLargeError,
    UnencodableError,
    UnknownHostError,
    connect,
)
from futureq.client.subscription import (
    LEADER_LOST_REASON,
    LOST_REASON,
    Delivery,
    DeliveryState,
    Subscription,
    void_error,
)
from futureq.errors import (
    ClientClosedError,
    ConnectionLostError,
    ErrorCode,
    FutureQError,
    NotLeaderError,
    RemoteProtocolError,
    RequestError,
    SubscriptionEndedError,
)
from futureq.wire import codec, frames

DEFAULT_SERVER: Final = "127.0.0.1:7450"
MAX_BATCHES_IN_FLIGHT: Final = 4
"""PUBLISH frames the batcher keeps outstanding at once."""
UNSUBSCRIBE_GRACE_S: Final = 2.0
"""Longest leaving a ``subscribe`` block waits for RELEASE and UNSUBSCRIBE (seconds)."""
DEFAULT_MAX_LEASE_S: Final = 3600.0
"""How long the lease keeper keeps a buffered delivery (seconds): 1 h, as the Pub/Sub
client libraries' ``max_lease_duration``."""
LEASE_RETRY_S: Final = 1.0
"""Wait before the lease keeper tries again after a failed EXTEND or RELEASE (s)."""

log = logging.getLogger(__name__)

AckLevelName = Literal["leader", "quorum"]
_ACK_LEVELS: Final[dict[str, frames.AckLevel]] = {
    "leader": frames.AckLevel.LEADER,
    "quorum": frames.AckLevel.QUORUM,
}

F = TypeVar("F", bound=frames.Frame)

MAX_RETRIES_AT_ONCE: Final = 3
"""Attempts in a row a request makes without a backoff pause after a NOT_LEADER that
names another node or a lost connection; then it backs off like after any refusal."""
_EPOCH_MS: Final = "ms since the Unix epoch"
_NODE_ID: Final = "a node id"


class _PendingPublish:
    """One ``publish()`` call waiting in the batcher: item, deadline, outcome."""

    __slots__ = ("item", "deadline", "event", "message_id", "error")

    def __init__(self, item: PublishItem, deadline: float) -> None:
        self.item = item
        self.deadline = deadline
        self.event = anyio.Event()
        self.message_id: int | None = None
        self.error: FutureQError | None = None

    def resolve(self, message_id: int) -> None:
        if not self.event.is_set():
            self.message_id = message_id
            self.event.set()

    def fail(self, error: FutureQError) -> None:
        if not self.event.is_set():
            self.error = error
            self.event.set()


class _Gathering:
    """A PUBLISH batch being gathered: at most ``max_items`` calls and ``budget``
    bytes of encoded items (always at least its first call)."""

    __slots__ = ("pending", "size", "budget", "max_items", "full")

    def __init__(self, first: _PendingPublish, budget: int, max_items: int) -> None:
        self.pending = [first]
        self.size = first.item.wire_bytes
        self.budget = budget
        self.max_items = max_items
        self.full = max_items <= 1

    def add(self, pending: _PendingPublish, carry: list[_PendingPublish]) -> None:
        """Add ``pending``, or, when it does not fit, put it in ``carry`` (it starts
        the next batch, so order is kept) and mark this one full."""
        if self.size + pending.item.wire_bytes > self.budget:
            carry.append(pending)
            self.full = True
            return
        self.pending.append(pending)
        self.size += pending.item.wire_bytes
        self.full = len(self.pending) >= self.max_items


def parse_servers(servers: str | Sequence[str]) -> list[str]:
    """Normalise a server list: ``"a:1,b:2"`` or ``["a:1", "b:2"]`` to ``["a:1", "b:2"]``,
    each address checked (:func:`~futureq.client._checks.check_server_address`).

    Raises:
        TypeError: an address is not a str.
        ValueError: the list is empty, or an address is not a ``HOST:PORT`` a client
            can connect to (no port, port 0, a scheme, ...); the message names it.
    """
    if isinstance(servers, str):
        parts = servers.split(",")
    else:
        parts = list(servers)
        for part in parts:
            if type(part) is not str:
                _checks.check_server_address(part)  # raises its TypeError
    result = [part.strip() for part in parts if part.strip()]
    if not result:
        raise ValueError("give at least one server address HOST:PORT")
    for address in result:
        try:
            _checks.check_server_address(address)
        except ValueError as exc:
            raise ValueError(f"{exc}; give HOST:PORT, e.g. {DEFAULT_SERVER}") from None
    return result


def _expect(frame: frames.Frame, kind: type[F]) -> F:
    if not isinstance(frame, kind):
        raise RemoteProtocolError(
            ErrorCode.INVALID_FRAME,
            f"expected {kind.__name__} but the server answered {type(frame).__name__}",
        )
    return frame


class Client:
    """A connection to a FutureQ cluster. Create it with :func:`open_client`.

    Every method may be called from many tasks at once: requests pipeline on the one
    connection, and concurrent :meth:`publish` calls are coalesced into PUBLISH
    batches.

    It belongs to the process that opened it: in a child forked after that, every
    call raises :class:`ClientClosedError` at once (open a new client in the child).

    Attributes:
        servers: The addresses tried, in order, when (re)connecting.
        request_timeout_s: Deadline of each call, retries included (seconds).
    """

    def __init__(
        self,
        servers: list[str],
        *,
        ssl_context: ssl.SSLContext | None,
        server_hostname: str | None,
        token: str | None,
        connect_timeout_s: float,
        request_timeout_s: float,
        max_batch_items: int,
        linger_ms: float,
        ack_level: AckLevelName,
        retry_unknown_outcome: bool,
        rng: random.Random,
        max_lease_s: float = DEFAULT_MAX_LEASE_S,
    ) -> None:
        _checks.check_client_options(
            connect_timeout_s=connect_timeout_s,
            request_timeout_s=request_timeout_s,
            max_batch_items=max_batch_items,
            linger_ms=linger_ms,
            max_lease_s=max_lease_s,
        )
        if ack_level not in _ACK_LEVELS:
            raise ValueError(f"ack_level must be 'leader' or 'quorum', got {ack_level!r}")
        self.servers = servers
        self.request_timeout_s = request_timeout_s
        self._ssl_context = ssl_context
        self._server_hostname = server_hostname
        self._token = token
        self._connect_timeout_s = connect_timeout_s
        self._max_batch_items = max_batch_items
        self._linger_s = linger_ms / 1000
        self._ack_level = _ACK_LEVELS[ack_level]
        self._retry_unknown_outcome = retry_unknown_outcome
        self._rng = rng
        self._pid = os.getpid()  # the process whose tasks serve this client
        self._conn: Connection | None = None
        self._epoch = 0
        self._conn_changed = anyio.Event()
        self._closed = False
        self._fatal: FutureQError | None = None
        self._last_connect_error: ConnectionLostError | None = None
        self._leader_hint: str | None = None
        self._next_server = 0
        self.shard: int | None = None
        """The shard this client serves inside a ``ShardedClient``, named in its
        connection errors; None for a plain client."""
        self._subscriptions: dict[int, Subscription] = {}  # by id(), for reconnects
        self.max_lease_s = max_lease_s
        self._lease_event = anyio.Event()
        self._publish_send, self._publish_receive = anyio.create_memory_object_stream[
            _PendingPublish
        ](max_batch_items * MAX_BATCHES_IN_FLIGHT)

    # -- connection state ------------------------------------------------------------

    @property
    def connected_address(self) -> str | None:
        """``host:port`` of the live connection, or None while reconnecting."""
        conn = self._conn
        return conn.address if conn is not None and not conn.is_lost else None

    @property
    def max_batch_items(self) -> int:
        """Most items put in one PUBLISH, ACK or NACK frame."""
        return self._max_batch_items

    @property
    def max_frame_bytes(self) -> int:
        """The largest frame body the server takes (bytes): ``max_frame_bytes`` from the
        live connection's HELLO_OK, or the documented default (4 MiB) while there is
        none (``docs/protocol.md``, "Limits")."""
        conn = self._live_connection()
        return conn.max_frame_bytes if conn is not None else codec.DEFAULT_MAX_FRAME_BYTES

    def _item_bytes_budget(self) -> int:
        """Most bytes of items one PUBLISH frame may hold: :attr:`max_frame_bytes` less
        the frame's own fields."""
        return self.max_frame_bytes - PUBLISH_FRAME_OVERHEAD_BYTES

    def _check_fits_a_frame(self, item: PublishItem, index: int | None = None) -> None:
        """Refuse an item that alone is over the frame budget: no split can send it."""
        budget = self._item_bytes_budget()
        if item.wire_bytes > budget:
            raise RequestError(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"this message encodes to {item.wire_bytes} bytes (payload "
                f"{len(item.payload)}), more than one frame can carry "
                f"({budget + PUBLISH_FRAME_OVERHEAD_BYTES} bytes, the server's "
                "max_frame_bytes); make it smaller",
                index,
            )

    def _live_epoch(self) -> int:
        conn = self._conn
        return conn.epoch if conn is not None and not conn.is_lost else -1

    def _live_connection(self) -> Connection | None:
        conn = self._conn
        return conn if conn is not None and not conn.is_lost else None

    def _lease_changed(self) -> None:
        """Wake the lease keeper (new deliveries, new settings, something to release)."""
        self._lease_event.set()

    def _signal_change(self) -> None:
        self._conn_changed.set()
        self._conn_changed = anyio.Event()

    def _check_process(self) -> None:
        """Refuse use in a process forked from the one that opened the client: the
        child has a copy of the connection's socket but none of the tasks serving it,
        so a call would wait for ever, or write into the parent's connection.

        Raises:
            ClientClosedError: this is a forked child (the message says what to do).
        """
        if self._pid != os.getpid():
            raise ClientClosedError(
                f"this Client was opened in process {self._pid} and cannot be used in "
                f"process {os.getpid()}, forked from it: its tasks and connection stay in "
                "the parent; open a new client with open_client() in the child"
            )

    def _check_open(self) -> None:
        self._check_process()
        if self._closed:
            raise ClientClosedError("the client was closed; open a new one with open_client()")
        if self._fatal is not None:
            raise self._fatal

    async def _wait_connection(self, deadline: float) -> Connection:
        while True:
            self._check_open()
            conn = self._conn
            if conn is not None and not conn.is_lost:
                return conn
            changed = self._conn_changed
            with anyio.CancelScope(deadline=deadline):
                await changed.wait()
                continue
            detail = f": {self._last_connect_error}" if self._last_connect_error else ""
            whose = "" if self.shard is None else f"shard {self.shard}: "
            raise ConnectionLostError(
                f"{whose}no connection to any of {', '.join(self.servers)} before the "
                f"deadline{detail}"
            )

    def _on_push(self, conn: Connection, frame: PushFrame) -> None:
        """A server push (reader task): route it to its subscription."""
        for sub in self._subscriptions.values():
            if sub.epoch == conn.epoch and sub.subscription_id == frame.subscription_id:
                if isinstance(frame, frames.Deliver):
                    try:
                        sub._receive(conn.epoch, frame)
                    except RemoteProtocolError as exc:
                        conn.close(f"server {conn.address} broke flow control: {exc.message}")
                elif isinstance(frame, frames.Revoke):
                    sub._revoke(conn.epoch, frame.tags, frame.reason)
                elif isinstance(frame, frames.SubscriptionInfo):
                    sub._info(conn.epoch, frame.visibility_timeout_ms, frame.max_deliveries)
                else:
                    try:
                        code = ErrorCode(frame.code)
                    except ValueError:
                        code = ErrorCode.INTERNAL_ERROR
                    sub._ended(conn.epoch, SubscriptionEndedError(code, frame.message))
                return
        # For a subscription we just left (or never bound): the server takes its
        # deliveries back when the UNSUBSCRIBE lands or their visibility passes.
        log.debug(
            "push %s for unknown subscription %d dropped", frame.TYPE.name, frame.subscription_id
        )

    def _connect_order(self) -> list[str]:
        count = len(self.servers)
        order = [self.servers[(self._next_server + i) % count] for i in range(count)]
        if self._leader_hint is not None:
            hint = self._leader_hint
            order = [hint] + [address for address in order if address != hint]
        return order

    async def _connect_any(self) -> Connection:
        """Try each server once, in :meth:`_connect_order`.

        Raises:
            ConnectionLostError: every one failed; the message names each and why.
                :class:`UnknownHostError` when no server's host name resolves.
        """
        errors: list[str] = []
        every_name_unknown = True
        for address in self._connect_order():
            try:
                conn = await connect(
                    address,
                    epoch=self._epoch + 1,
                    on_push=self._on_push,
                    ssl_context=self._ssl_context,
                    server_hostname=self._server_hostname,
                    token=self._token,
                    timeout_s=self._connect_timeout_s,
                )
            except ConnectionLostError as exc:
                errors.append(str(exc))
                every_name_unknown &= isinstance(exc, UnknownHostError)
                if address == self._leader_hint:
                    self._leader_hint = None
                continue
            if address in self.servers:
                self._next_server = self.servers.index(address)
            self._leader_hint = None
            self._epoch += 1
            return conn
        raise (UnknownHostError if every_name_unknown else ConnectionLostError)("; ".join(errors))

    async def _maintain_connection(
        self,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
        *,
        keep_trying: bool = False,
    ) -> None:
        """Keep one connection open: connect, run it, reconnect with backoff.

        Before ``task_status.started()`` (the first connection) errors are raised to
        :func:`open_client` once ``connect_timeout_s`` has passed (at once when no
        server's host name resolves: :class:`UnknownHostError`); afterwards the loop
        retries for ever, except after a refused HELLO (AUTH_FAILED, ...), which is
        stored and raised by every later call. With ``keep_trying`` (a shard's client
        of a :class:`ShardedClient`, started without waiting) the first connection is
        retried for ever too: calls wait for it until their own deadline.
        """
        backoff = Backoff(self._rng)
        started = keep_trying
        first_deadline = anyio.current_time() + self._connect_timeout_s
        while True:
            try:
                conn = await self._connect_any()
            except RemoteProtocolError as exc:
                if not started:
                    raise
                self._fatal = exc
                self._signal_change()
                return
            except ConnectionLostError as exc:
                self._last_connect_error = exc
                delay = backoff.next_delay_s()
                if not started and (
                    # No name resolves: a typo or a wrong network, not a server starting.
                    isinstance(exc, UnknownHostError)
                    or anyio.current_time() + delay > first_deadline
                ):
                    raise
                await anyio.sleep(delay)
                continue
            backoff.reset()
            self._conn = conn
            self._signal_change()
            if not started:
                started = True
                task_status.started()
            await conn.run()
            self._conn = None
            for sub in self._subscriptions.values():
                sub._connection_lost(conn.epoch)
            self._signal_change()

    def _close(self) -> None:
        self._closed = True
        conn = self._conn
        if conn is not None:
            conn.close("the client was closed")
        for sub in self._subscriptions.values():
            sub._close()
        self._publish_send.close()
        self._signal_change()

    # -- requests ----------------------------------------------------------------------

    async def _call(
        self,
        make_frame: Callable[[int], frames.Frame],
        *,
        retry_unknown: bool,
        deadline: float | None = None,
        on_answer: Callable[[Connection, frames.Frame], None] | None = None,
    ) -> frames.Frame:
        """Send a request, following NOT_LEADER and retrying 3xx errors with backoff.

        Args:
            make_frame: Builds the request from a request id.
            retry_unknown: Resend after a connection broke with the request in flight
                (only for idempotent requests or at-least-once publishing).
            deadline: ``anyio.current_time()`` value ending all attempts; default now
                plus ``request_timeout_s``.
            on_answer: Called by the reader with the connection and the answer.

        Raises:
            RequestError: a 2xx refusal, or the last 3xx / TIMEOUT error at the deadline.
            ConnectionLostError: no connection before the deadline, or lost with the
                request in flight and ``retry_unknown`` False.
            ClientClosedError: the client was closed.
        """
        if deadline is None:
            deadline = anyio.current_time() + self.request_timeout_s
        backoff = Backoff(self._rng)
        at_once = 0
        while True:
            conn = await self._wait_connection(deadline)
            answer_hook = None if on_answer is None else functools.partial(on_answer, conn)
            # A redirect to a named leader, or a connection to replace, is no failure
            # to back off from: the next attempt goes out as soon as there is a
            # connection (issue 11: the client adds at most one round trip to an
            # election). A few in a row at most, so two nodes that name each other (a
            # stale view) cannot make it spin.
            immediate = False
            try:
                return await conn.request(make_frame, deadline=deadline, on_answer=answer_hook)
            except NotLeaderError as exc:
                last_error: FutureQError = exc
                self._follow_leader(conn, exc.leader_address)
                immediate = exc.leader_address not in (None, conn.address)
            except NotSentError as exc:
                last_error = exc
                immediate = True
            except ConnectionLostError as exc:
                if not retry_unknown:
                    raise
                last_error = exc
                immediate = True
            except RequestError as exc:
                if not exc.code.retryable or anyio.current_time() >= deadline:
                    raise
                last_error = exc
            self._check_open()
            if immediate and at_once < MAX_RETRIES_AT_ONCE:
                at_once += 1
                continue
            at_once = 0
            delay = backoff.next_delay_s()
            if anyio.current_time() + delay >= deadline:
                raise last_error
            await anyio.sleep(delay)

    def _follow_leader(self, conn: Connection, leader_address: str | None) -> None:
        """Reconnect to ``leader_address`` (NOT_LEADER redirect).

        With no leader named (the node is cut off, or an election is running), move on
        to the next server of the list: a node on the minority side of a partition
        cannot learn the new leader, and waiting on it would stall until the partition
        heals.
        """
        if leader_address is None:
            if len(self.servers) > 1:
                if conn.address in self.servers:
                    self._next_server = (self.servers.index(conn.address) + 1) % len(self.servers)
                conn.close(f"{conn.address} knows no leader; trying the next server")
            return
        if leader_address == conn.address:
            return
        self._leader_hint = leader_address
        conn.close(f"{conn.address} is not the leader; reconnecting to {leader_address}")

    # -- publishing --------------------------------------------------------------------

    async def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
        ttl_ms: int | None = None,
        headers: dict[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> int:
        """Publish one message; concurrent calls share PUBLISH frames.

        Args:
            topic: Topic name (1..255 UTF-8 bytes, not ending in ``.dlq``).
            payload: Message body (bytes).
            delay_ms: Deliver this many ms after it is stored (>= 0).
            deliver_at_ms: Deliver at this time (ms since the Unix epoch); not with
                ``delay_ms``. Neither: due at once.
            ttl_ms: How long after falling due it may still be delivered (ms, > 0).
            headers: A small str -> str map kept with the message (see
                :class:`PublishItem`).
            idempotency_key: With it, a retry after a lost answer stores nothing and
                returns the first message's id (see :class:`PublishItem`).

        Returns:
            The message id (with ``idempotency_key``: the earlier message's, if the key
            still names one).

        Raises:
            RequestError: the server refused this message (its code says why), or
                a 3xx error / TIMEOUT persisted until ``request_timeout_s``.
            ConnectionLostError: no server reachable before the deadline, or (with
                ``retry_unknown_outcome=False``) the connection broke with the
                message in flight: it may or may not be stored.
            ClientClosedError: the client was closed.
            TypeError: payload is not bytes.

        A message that cannot be sent at all (an int beyond 64 bits, text with a lone
        surrogate, more bytes than one frame carries) raises its ``RequestError``
        here, before it joins a PUBLISH shared with other callers.
        """
        self._check_open()
        item = PublishItem(
            topic, payload, delay_ms, deliver_at_ms, ttl_ms, headers, idempotency_key
        )
        self._check_fits_a_frame(item)
        deadline = anyio.current_time() + self.request_timeout_s
        pending = _PendingPublish(item, deadline)
        with anyio.CancelScope(deadline=deadline) as scope:
            try:
                await self._publish_send.send(pending)
            except anyio.ClosedResourceError:
                raise ClientClosedError("the client was closed") from None
            # The batcher resolves every item by its deadline; the extra second only
            # guards against a bug leaving a caller waiting for ever.
            scope.deadline = deadline + 1.0
            await pending.event.wait()
        if pending.error is not None:
            raise pending.error
        if pending.message_id is None:
            raise RequestError(
                ErrorCode.TIMEOUT,
                f"publish to {topic!r} got no answer within {self.request_timeout_s:g} s; "
                "its outcome is unknown",
            )
        return pending.message_id

    async def publish_batch(
        self,
        items: Sequence[PublishItem],
        *,
        duplicates: list[int] | None = None,
        stored: dict[int, int] | None = None,
    ) -> list[int]:
        """Publish many messages, in as few PUBLISH frames as the limits allow.

        A frame holds at most ``max_batch_items`` items and at most the server's
        ``max_frame_bytes`` (HELLO_OK) of encoded bytes, so a long list, or one of large
        payloads, is sent as several frames, in order. Each frame is atomic: the server
        stores all of its items or none. If one is refused, the frames before it are
        stored and the ones after it are not sent. An item too large for any frame
        is refused before anything is sent.

        Args:
            items: The messages, in order.
            duplicates: If given, the positions (in ``items``) of items that stored
                nothing because their ``idempotency_key`` named an earlier message
                are appended to it, in order.
            stored: If given, gets ``{position in items: message id}`` for every item
                stored, frame by frame, so that after an error it says which items
                were stored (those of the frames before the refused one) and a caller
                can resend only the others. A sharded client fills it for every shard
                that stored its part (``ShardedClient.publish_batch``).

        Returns:
            Their message ids, in the same order (a duplicate's: the earlier message's).

        Raises:
            RequestError: a frame was refused; ``item_index`` is the index **in
                ``items``** of the first bad item when the server named one.
                PAYLOAD_TOO_LARGE (nothing sent) for an item that alone encodes to
                more than one frame carries.
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
        """
        for position, item in enumerate(items):
            self._check_fits_a_frame(item, position)
        ids: list[int] = []
        offset = 0
        max_items = self._max_batch_items
        while offset < len(items):
            end = split_by_size(items, offset, max_items, self._item_bytes_budget())
            chunk = items[offset:end]
            wire_items = [item.to_wire() for item in chunk]
            level = self._ack_level
            try:
                answer = await self._call(
                    _publish_frame(level, wire_items),
                    retry_unknown=self._retry_unknown_outcome,
                )
            except RequestTooLargeError:
                if len(chunk) == 1:
                    self._check_fits_a_frame(chunk[0], offset)  # a smaller server's limit
                    raise
                max_items = max(1, len(chunk) // 2)  # and so for the rest of the list
                continue
            except RequestError as exc:
                if exc.code is ErrorCode.BATCH_TOO_LARGE and len(chunk) > 1:
                    max_items = max(1, len(chunk) // 2)  # the server's limit is lower
                    continue
                index = refused_item(exc, len(chunk))
                if index is None or isinstance(exc, NotLeaderError):
                    raise
                raise RequestError(exc.code, exc.message, offset + index) from None
            ok = _expect(answer, frames.PublishOk)
            got = ids_from_publish_ok(ok.first_id, ok.count, len(chunk), ok.duplicates)
            ids.extend(got)
            if stored is not None:
                stored.update(zip(range(offset, end), got, strict=True))
            if duplicates is not None:
                duplicates.extend(offset + position for position, _ in ok.duplicates or ())
            offset = end
        return ids

    async def _run_batcher(self) -> None:
        """Coalesce :meth:`publish` calls into PUBLISH frames until the client closes.

        Takes everything already queued (up to ``max_batch_items`` items and a frame's
        worth of encoded bytes), waits up to ``linger_ms`` for more, and keeps up to
        ``MAX_BATCHES_IN_FLIGHT`` frames outstanding; while they are in flight new calls
        pile up into the next batch, so batches grow with load by themselves. A call
        that would overfill a batch starts the next one (order is kept).
        """
        in_flight = anyio.Semaphore(MAX_BATCHES_IN_FLIGHT)
        carry: list[_PendingPublish] = []  # the call that did not fit the last batch
        async with anyio.create_task_group() as nursery:
            while True:
                if carry:
                    first = carry.pop()
                else:
                    try:
                        first = await self._publish_receive.receive()
                    except anyio.EndOfStream:
                        break
                batch = _Gathering(first, self._item_bytes_budget(), self._max_batch_items)
                while not batch.full:
                    try:
                        batch.add(self._publish_receive.receive_nowait(), carry)
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                if self._linger_s > 0 and not batch.full:
                    with anyio.move_on_after(self._linger_s):
                        while not batch.full:
                            try:
                                batch.add(await self._publish_receive.receive(), carry)
                            except anyio.EndOfStream:
                                break
                await in_flight.acquire()
                nursery.start_soon(self._send_batch, batch.pending, in_flight)

    async def _send_batch(self, batch: list[_PendingPublish], in_flight: anyio.Semaphore) -> None:
        try:
            await self._publish_pending(batch)
        finally:
            in_flight.release()

    async def _publish_pending(self, batch: list[_PendingPublish]) -> None:
        """Send ``batch``; on a refusal naming an item, fail it and resend the rest.

        Other callers' messages never fail because one item of a shared batch is bad:
        the server stores nothing of a refused batch, so the rest is simply resent.
        A batch the client cannot send whole (over a smaller server's frame limit, or
        a value it cannot encode) is sent in halves, down to the one item at fault.
        """
        while batch:
            now = anyio.current_time()
            for pending in batch:
                if pending.deadline <= now:
                    pending.fail(
                        RequestError(ErrorCode.TIMEOUT, "publish was not answered in time")
                    )
            batch = [pending for pending in batch if not pending.event.is_set()]
            if not batch:
                return
            wire_items = [pending.item.to_wire() for pending in batch]
            level = self._ack_level
            try:
                answer = await self._call(
                    _publish_frame(level, wire_items),
                    retry_unknown=self._retry_unknown_outcome,
                    deadline=min(pending.deadline for pending in batch),
                )
                ok = _expect(answer, frames.PublishOk)
                for pending, message_id in zip(
                    batch,
                    ids_from_publish_ok(ok.first_id, ok.count, len(batch), ok.duplicates),
                    strict=True,
                ):
                    pending.resolve(message_id)
                return
            except (RequestTooLargeError, UnencodableError) as exc:
                if len(batch) > 1:
                    await self._publish_halves(batch)
                    return
                error: FutureQError = (
                    RequestError(ErrorCode.PAYLOAD_TOO_LARGE, exc.message)
                    if isinstance(exc, RequestTooLargeError)
                    else RequestError(exc.code, exc.message)
                )
            except RequestError as exc:
                index = refused_item(exc, len(batch))
                if index is not None and not isinstance(exc, NotLeaderError):
                    batch[index].fail(without_item(exc))
                    batch = batch[:index] + batch[index + 1 :]
                    continue
                if exc.code is ErrorCode.BATCH_TOO_LARGE and len(batch) > 1:
                    await self._publish_halves(batch)
                    return
                error = exc
            except FutureQError as exc:
                error = exc
            for pending in batch:
                pending.fail(error)
            return

    async def _publish_halves(self, batch: list[_PendingPublish]) -> None:
        middle = len(batch) // 2
        await self._publish_pending(batch[:middle])
        await self._publish_pending(batch[middle:])

    # -- consuming ---------------------------------------------------------------------

    @asynccontextmanager
    async def subscribe(
        self, topic: str, group: str, prefetch: int = 100, *, pull: bool = False
    ) -> AsyncIterator[Subscription]:
        """Join consumer group ``group`` of ``topic`` (created if new) and receive.

        Args:
            topic: Topic name.
            group: Consumer group name. Every group gets its own copy of each message;
                within a group each message goes to one consumer.
            prefetch: Most unsettled deliveries the server may push to this
                subscription (items, >= 1).
            pull: Pull mode: no credit is granted back on settling; take deliveries
                with :meth:`Subscription.fetch`, which asks for exactly what it still
                wants (``prefetch`` is then the first fetch's credit).

        Yields:
            The :class:`Subscription`; iterate it for :class:`Delivery` objects.

        Raises:
            RequestError: SUBSCRIBE refused (INVALID_TOPIC, INVALID_GROUP, ...).
            ConnectionLostError: no server reachable within ``request_timeout_s``.
            ClientClosedError: the client was closed.

        Leaving the block releases the deliveries still buffered (never handed to
        you: they are due again at once and their attempt does not count), then
        unsubscribes; deliveries handed to you and not settled go back to the group
        and are delivered again (their attempt counted).
        """
        self._check_open()
        sub = Subscription(self, topic, group, prefetch, pull=pull)
        self._subscriptions[id(sub)] = sub
        try:
            await self._subscribe_on_live(sub, anyio.current_time() + self.request_timeout_s)
            yield sub
        finally:
            del self._subscriptions[id(sub)]
            subscription_id, epoch = sub.subscription_id, sub.epoch
            unread = [d for d in (*sub._buffer, *sub.to_release) if d._state is DeliveryState.HELD]
            sub._close()
            conn = self._conn
            if self._pid != os.getpid():
                conn = None  # a forked child: the connection is the parent's to use
            if subscription_id is not None and conn is not None and conn.epoch == epoch:
                with anyio.move_on_after(UNSUBSCRIBE_GRACE_S, shield=True):
                    try:
                        if unread:
                            await self._settle_on(
                                conn, sub, unread, "release", 0, UNSUBSCRIBE_GRACE_S
                            )
                    except FutureQError:
                        pass  # they come back when the UNSUBSCRIBE lands, counted
                    try:
                        await conn.request(
                            lambda rid: frames.Unsubscribe(rid, subscription_id),
                            deadline=anyio.current_time() + UNSUBSCRIBE_GRACE_S,
                        )
                    except FutureQError:
                        pass  # the connection is going away; the server requeues anyway

    async def _subscribe_on_live(
        self, sub: Subscription, deadline: float | None, prefetch: int | None = None
    ) -> None:
        async with sub._lock:
            if sub.epoch == self._live_epoch() and sub.subscription_id is not None:
                return
            credit = prefetch if prefetch is not None else sub.prefetch

            def bind(conn: Connection, frame: frames.Frame) -> None:
                # Runs in the reader, even when the caller gave up: a subscription
                # nobody will use is ended at once, so it holds nothing on the server.
                if not isinstance(frame, frames.SubscribeOk):
                    return
                live = sub.epoch == conn.epoch and sub.subscription_id is not None
                if sub.closed or live or conn.is_lost:
                    orphan = frame.subscription_id
                    log.debug(
                        "SUBSCRIBE_OK %d for a subscription given up; unsubscribing it", orphan
                    )
                    conn.request_nowait(lambda rid: frames.Unsubscribe(rid, orphan))
                    return
                sub._bind(conn.epoch, frame.subscription_id, credit)

            answer = await self._call(
                lambda rid: frames.Subscribe(rid, sub.topic, sub.group, credit, headers=True),
                retry_unknown=True,
                deadline=deadline,
                on_answer=bind,
            )
            _expect(answer, frames.SubscribeOk)

    async def _resubscribe(self, sub: Subscription, prefetch: int | None = None) -> None:
        """Subscribe ``sub`` on the live connection, waiting as long as reconnecting takes.

        Raises:
            RequestError: a 2xx refusal (retrying would not help).
            ClientClosedError: the client was closed.
        """
        while True:
            try:
                await self._subscribe_on_live(sub, None, prefetch)
                return
            except ConnectionLostError:
                continue  # _call already backed off; keep waiting for a server
            except RequestError as exc:
                if not exc.code.retryable:
                    raise

    async def _settle(
        self,
        sub: Subscription,
        deliveries: list[Delivery],
        how: str,
        requeue_delay_ms: int = 0,
        reason: str | None = None,
        dead_letter: bool = False,
    ) -> None:
        """ACK, NACK or RELEASE deliveries; credit goes back once the server confirmed.

        Void deliveries (taken back, lost connection, ended subscription) are not sent;
        a tag the server refuses is left out and the rest sent again; then an error
        names the ones left out. Deliveries already settled are skipped.
        """
        self._check_open()
        conn = self._live_connection()
        to_send, left_out = _sort_out(deliveries, conn)
        if to_send and conn is not None:
            left_out += await self._settle_on(
                conn,
                sub,
                to_send,
                how,
                requeue_delay_ms,
                self.request_timeout_s,
                reason=reason,
                dead_letter=dead_letter,
            )
        error = void_error(left_out, {id(d): i for i, d in enumerate(deliveries)})
        if error is not None:
            raise error

    async def _settle_on(
        self,
        conn: Connection,
        sub: Subscription,
        deliveries: list[Delivery],
        how: str,
        requeue_delay_ms: int,
        timeout_s: float,
        *,
        reason: str | None = None,
        dead_letter: bool = False,
    ) -> list[Delivery]:
        """Settle on ``conn`` in frames of ``max_batch_items``; return the ones refused."""
        refused: list[Delivery] = []
        for _, chunk_view in chunked(deliveries, self._max_batch_items):
            chunk = [d for d in chunk_view if d._state is DeliveryState.HELD]
            while chunk:
                tags = [delivery.tag for delivery in chunk]
                if how == "ack":
                    request = _ack_frame(tags)
                elif how == "nack":
                    request = _nack_frame(tags, requeue_delay_ms, reason, dead_letter)
                else:
                    request = _release_frame(tags)
                confirmed = list(chunk)

                def on_ok(frame: frames.Frame, confirmed: list[Delivery] = confirmed) -> None:
                    if isinstance(frame, frames.Ok):
                        by_sub: dict[int, list[Delivery]] = {}
                        for delivery in confirmed:
                            by_sub.setdefault(id(delivery._subscription), []).append(delivery)
                        for group in by_sub.values():
                            group[0]._subscription._settled(conn, group)

                try:
                    await self._settle_request(conn, request, timeout_s, on_ok)
                except NotLeaderError as exc:
                    return refused + self._lost_with_leadership(conn, deliveries, exc)
                except RequestError as exc:
                    bad = _pop_refused_tag(exc, chunk)
                    if bad is None:
                        raise
                    refused.append(bad)
                    continue
                break
        return refused

    async def _settle_request(
        self,
        conn: Connection,
        make_frame: Callable[[int], frames.Frame],
        timeout_s: float,
        on_answer: Callable[[frames.Frame], None] | None = None,
    ) -> frames.Frame:
        """One ACK / NACK / RELEASE / EXTEND on ``conn`` (its tags mean nothing
        elsewhere), sent again with backoff while the server answers UNAVAILABLE
        (nothing applied: a leadership transfer under way, say) until ``timeout_s``, as
        every 3xx refusal is (``docs/client.md``, "Reconnects and leader following").

        Raises:
            As :meth:`Connection.request`; UNAVAILABLE once retrying would pass the
            deadline.
        """
        deadline = anyio.current_time() + timeout_s
        backoff = Backoff(self._rng)
        while True:
            try:
                return await conn.request(make_frame, deadline=deadline, on_answer=on_answer)
            except RequestError as exc:
                if exc.code is not ErrorCode.UNAVAILABLE:
                    raise
                delay = backoff.next_delay_s()
                if anyio.current_time() + delay >= deadline:
                    raise
                await anyio.sleep(delay)

    def _lost_with_leadership(
        self, conn: Connection, deliveries: list[Delivery], exc: NotLeaderError
    ) -> list[Delivery]:
        """A settlement answered NOT_LEADER: the node that delivered them lost its
        leadership (a SIGTERM, a transfer, an election), and with it every tag it
        handed out; no other node knows them, so following the leader cannot settle
        them. Void the ones still held (settling raises ConnectionLostError, as for a
        lost connection: ``docs/client.md``, "At-least-once"), and move this client to
        the leader, where its subscriptions subscribe again.

        Returns:
            The deliveries voided, in order.
        """
        lost = [d for d in deliveries if d._state is DeliveryState.HELD]
        for delivery in lost:
            delivery._void(LEADER_LOST_REASON, "lost")
        self._follow_leader(conn, exc.leader_address)
        return lost

    async def _extend(
        self, sub: Subscription, deliveries: list[Delivery], visibility_ms: int
    ) -> None:
        """EXTEND deliveries (leader-local, immediate); a refused tag is left out."""
        self._check_open()
        conn = self._live_connection()
        to_send, left_out = _sort_out(deliveries, conn)
        if to_send and conn is not None:
            left_out += await self._extend_on(conn, to_send, visibility_ms, self.request_timeout_s)
        error = void_error(left_out, {id(d): i for i, d in enumerate(deliveries)})
        if error is not None:
            raise error

    async def _extend_on(
        self, conn: Connection, deliveries: list[Delivery], visibility_ms: int, timeout_s: float
    ) -> list[Delivery]:
        refused: list[Delivery] = []
        for _, chunk_view in chunked(deliveries, self._max_batch_items):
            chunk = list(chunk_view)
            while chunk:
                tags = [delivery.tag for delivery in chunk]
                try:
                    await self._settle_request(conn, _extend_frame(tags, visibility_ms), timeout_s)
                except NotLeaderError as exc:
                    return refused + self._lost_with_leadership(conn, deliveries, exc)
                except RequestError as exc:
                    bad = _pop_refused_tag(exc, chunk)
                    if bad is None:
                        raise
                    refused.append(bad)
                    continue
                break
        return refused

    async def _keep_leases(self) -> None:
        """The lease keeper: extend buffered deliveries, release unwanted ones.

        A delivery received and not yet handed to the application is extended to the
        group's visibility timeout from now once half of it has passed, for up to
        ``max_lease_s`` after it arrived (then the server takes it back and says so
        with a REVOKE). A pull-mode subscription's deliveries that nobody fetched are
        released (not counted towards ``max_deliveries``).
        """
        while True:
            self._lease_event = anyio.Event()
            now = anyio.current_time()
            next_s = float("inf")
            work: list[tuple[Subscription, Connection, list[Delivery], list[Delivery]]] = []
            conn = self._live_connection()
            for sub in list(self._subscriptions.values()):
                if conn is None or sub.epoch != conn.epoch or sub.subscription_id is None:
                    continue
                unwanted = [d for d in sub.to_release if d._state is DeliveryState.HELD]
                sub.to_release = []
                due: list[Delivery] = []
                if sub.visibility_timeout_ms is not None:
                    for delivery in sub._buffer:
                        if delivery._state is not DeliveryState.HELD:
                            continue
                        if now - delivery._received_s >= self.max_lease_s:
                            continue  # held long enough: the server takes it back
                        if delivery._refresh_s <= now:
                            due.append(delivery)
                        else:
                            next_s = min(next_s, delivery._refresh_s)
                if unwanted or due:
                    work.append((sub, conn, unwanted, due))
            failed = False
            for sub, live_conn, unwanted, due in work:
                try:
                    if unwanted:
                        await self._settle_on(
                            live_conn, sub, unwanted, "release", 0, self.request_timeout_s
                        )
                    if due and sub.visibility_timeout_ms is not None:
                        await self._extend_on(
                            live_conn, due, sub.visibility_timeout_ms, self.request_timeout_s
                        )
                        renewed = anyio.current_time() + sub._refresh_after_s()
                        for delivery in due:
                            delivery._refresh_s = renewed
                except FutureQError as exc:
                    log.debug("lease keeper: %s; trying again shortly", exc)
                    sub.to_release.extend(d for d in unwanted if d._state is DeliveryState.HELD)
                    next_s = min(next_s, anyio.current_time() + LEASE_RETRY_S)
                    failed = True
            if work and not failed:
                continue  # look again at once: time passed while we worked
            with anyio.CancelScope(deadline=next_s):
                await self._lease_event.wait()

    # -- administration ------------------------------------------------------------------

    async def status(self, *, local: bool = False) -> dict[str, Any]:
        """The cluster's status, asked of the leader (``docs/protocol.md``, "STATUS").

        A follower knows some numbers only as its own local view (due, in flight,
        consumers): when the node answering says ``"view": "local"`` and names a leader,
        the client reconnects there and asks again (once). If the leader cannot be
        reached in time, the follower's answer is returned; it says it is local.

        Args:
            local: Return the connected node's own view without following the leader.

        Returns:
            ``{"node_id", "role", "view", "leader_only", "leader_id", "leader_address",
            "server_version", "applied_index", "uptime_s", "topics": [{"topic",
            "groups": [{"group", "pending", "due", "in_flight", "consumers",
            "visibility_timeout_ms", "max_deliveries"}]}]}``; ``view`` is ``"cluster"``
            from the leader, ``"local"`` from another node (``leader_only`` lists the
            fields that are then only that node's).

        Raises:
            RequestError, ConnectionLostError, ClientClosedError: as :meth:`publish`.
        """
        return await self._ask_leader(
            lambda rid: frames.Status(rid),
            frames.StatusOk,
            lambda status: status.get("view", "cluster") == "local",
            local=local,
        )

    async def _ask_leader(
        self,
        make_frame: Callable[[int], frames.Frame],
        kind: type[frames.StatusOk] | type[frames.ClusterStatusOk],
        is_local: Callable[[dict[str, Any]], bool],
        *,
        local: bool,
    ) -> dict[str, Any]:
        """Ask the connected node; if its answer is a follower's local view and it names
        the leader, ask the leader once more (an answer from a follower is kept if the
        leader cannot be asked before the deadline)."""
        deadline = anyio.current_time() + self.request_timeout_s
        answered: list[Connection] = []

        def note(conn: Connection, frame: frames.Frame) -> None:
            answered.append(conn)

        answer = await self._call(make_frame, retry_unknown=True, deadline=deadline, on_answer=note)
        status = _expect(answer, kind).status
        leader = status.get("leader_address")
        if local or not is_local(status) or leader is None or not answered:
            return status
        if answered[-1].address == leader:
            return status
        self._follow_leader(answered[-1], leader)
        try:
            again = await self._call(make_frame, retry_unknown=True, deadline=deadline)
        except (ConnectionLostError, RequestError):
            return status  # it says it is a local view
        return _expect(again, kind).status

    async def create_group(
        self,
        topic: str,
        group: str,
        *,
        visibility_timeout_ms: int | None = None,
        max_deliveries: int | None = None,
        from_backlog: bool = False,
        dead_letter_expired: bool | None = None,
    ) -> None:
        """Create a consumer group (idempotent). None takes the server's default.

        Args:
            topic: Topic name.
            group: Group name.
            visibility_timeout_ms: How long a delivery may stay unacked before it is
                delivered again (ms, >= 1).
            max_deliveries: Attempts before a message goes to ``<topic>.dlq`` (>= 1).
            from_backlog: A group this creates also gets every message of the topic
                still pending in its other groups (copied in the background), not only
                those published after it exists. No effect on an existing group.
            dead_letter_expired: True: a message whose TTL runs out goes to
                ``<topic>.dlq`` (``futureq-reason: expired``) instead of being dropped.
                None keeps the group's setting (a new group: False).

        Raises:
            RequestError, ConnectionLostError, ClientClosedError: as :meth:`publish`.
            TypeError: an argument of the wrong type (a str ``max_deliveries``, say);
                nothing was sent.
            ValueError: ``visibility_timeout_ms`` or ``max_deliveries`` beyond 64 bits
                (:func:`~futureq.client._checks.check_wire_int`); nothing was sent.
        """
        _checks.check_str("topic", topic)
        _checks.check_str("group", group)
        _checks.check_wire_int(
            "visibility_timeout_ms", visibility_timeout_ms, unit="ms", optional=True
        )
        _checks.check_wire_int("max_deliveries", max_deliveries, unit="attempts", optional=True)
        _checks.check_bool("from_backlog", from_backlog)
        if dead_letter_expired is not None:
            _checks.check_bool("dead_letter_expired", dead_letter_expired)
        answer = await self._call(
            lambda rid: frames.GroupCreate(
                rid,
                topic,
                group,
                visibility_timeout_ms,
                max_deliveries,
                from_backlog,
                dead_letter_expired,
            ),
            retry_unknown=True,
        )
        _expect(answer, frames.Ok)

    async def delete_group(self, topic: str, group: str) -> None:
        """Delete a consumer group and every delivery it still holds.

        Raises:
            RequestError: UNKNOWN_GROUP if there is no such group (also possible when
                a retry after a lost connection finds it already deleted).
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
        """
        answer = await self._call(
            lambda rid: frames.GroupDelete(rid, topic, group), retry_unknown=True
        )
        _expect(answer, frames.Ok)

    async def cancel(
        self, topic: str, ids: Sequence[int], *, group: str | None = None
    ) -> list[frames.ItemStatus]:
        """Cancel scheduled messages by id (``docs/protocol.md``, "CANCEL").

        Args:
            topic: The topic they were published to.
            ids: Message ids as :meth:`publish` returned them; at most the server's
                ``limits.max_batch_items`` (10,000 by default) per call.
            group: Cancel only that group's copy; None (default): every group's.

        Returns:
            One status per id, in order: ``DONE`` (cancelled, never delivered),
            ``DELIVERED`` (cancelled, but delivered at least once already, possibly
            out to a consumer right now) or
            ``UNKNOWN`` (not pending there: acked, expired, cancelled, or never
            published). A retry after a lost connection may report ``UNKNOWN`` for
            what the first attempt cancelled.

        Raises:
            RequestError: UNKNOWN_TOPIC, UNKNOWN_GROUP, EMPTY_BATCH, BATCH_TOO_LARGE,
                INVALID_MESSAGE_ID (``.item_index`` names it), PERMISSION_DENIED.
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
            TypeError: an argument of the wrong type (an id that is not an int, say);
                nothing was sent.
        """
        _checks.check_str("topic", topic)
        _checks.check_str("group", group, optional=True)
        id_list = _checks.message_ids(ids)
        answer = await self._call(
            lambda rid: frames.Cancel(rid, topic, group, id_list), retry_unknown=True
        )
        return [frames.ItemStatus(code) for code in _expect(answer, frames.ItemResults).results]

    async def redrive(
        self,
        topic: str,
        ids: Sequence[int],
        *,
        delay_ms: int = 0,
        group: str | None = None,
    ) -> list[frames.ItemStatus]:
        """Move dead letters of ``topic`` back to the topic and group they died in
        (``docs/protocol.md``, "REDRIVE").

        Args:
            topic: The original topic (its dead letters are in ``topic.dlq``).
            ids: Dead-letter message ids (as :meth:`browse` of ``topic.dlq`` shows
                them); at most ``max_batch_items`` per call.
            delay_ms: Due this long after the leader's stamp (ms, >= 0).
            group: The dead-letter topic's group holding them; None: its only group.

        Returns:
            One status per id: ``DONE`` (a new message of ``topic`` for the group it
            died in, with its provenance headers plus ``futureq-redriven-from``),
            ``UNKNOWN`` (not a pending dead letter there) or ``NO_TARGET`` (its group
            no longer exists; it stays a dead letter).

        Raises:
            RequestError: RESERVED_TOPIC (``topic`` ends in ``.dlq``), UNKNOWN_TOPIC,
                UNKNOWN_GROUP, GROUP_REQUIRED, INVALID_DELAY, EMPTY_BATCH,
                BATCH_TOO_LARGE, INVALID_MESSAGE_ID, PERMISSION_DENIED.
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
            TypeError: as :meth:`cancel`.
        """
        _checks.check_str("topic", topic)
        _checks.check_str("group", group, optional=True)
        _checks.check_wire_int("delay_ms", delay_ms, unit="ms")
        id_list = _checks.message_ids(ids)
        answer = await self._call(
            lambda rid: frames.Redrive(rid, topic, group, id_list, delay_ms), retry_unknown=True
        )
        return [frames.ItemStatus(code) for code in _expect(answer, frames.ItemResults).results]

    async def reschedule(
        self,
        topic: str,
        ids: Sequence[int],
        *,
        due_ms: int | None = None,
        delay_ms: int | None = None,
        group: str | None = None,
    ) -> list[frames.ItemStatus]:
        """Give pending messages a new due time by id (``docs/protocol.md``, "RESCHEDULE").

        Args:
            topic: Their topic.
            ids: Message ids; at most ``max_batch_items`` per call.
            due_ms: The new due time, ms since the Unix epoch (a past time: at once).
            delay_ms: Or: due this long after the leader's stamp (ms). Give exactly one.
            group: Only this group's copy; None: every group's.

        Returns:
            One status per id: ``DONE`` (moved; attempts kept, a TTL now counts from
            the new due time) or ``UNKNOWN`` (not pending there).

        Raises:
            RequestError: INVALID_DELAY, DELAY_TOO_LARGE, IMPLAUSIBLE_TIME, and as
                :meth:`cancel`.
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
            TypeError: as :meth:`cancel` (``delay_ms=1.5``, say).
        """
        _checks.check_str("topic", topic)
        _checks.check_str("group", group, optional=True)
        _checks.check_wire_int("due_ms", due_ms, unit=_EPOCH_MS, optional=True)
        _checks.check_wire_int("delay_ms", delay_ms, unit="ms", optional=True)
        id_list = _checks.message_ids(ids)
        answer = await self._call(
            lambda rid: frames.Reschedule(rid, topic, group, id_list, due_ms, delay_ms),
            retry_unknown=True,
        )
        return [frames.ItemStatus(code) for code in _expect(answer, frames.ItemResults).results]

    async def purge(self, topic: str, *, group: str | None = None) -> int:
        """Remove every message pending now in one group of ``topic``, or in all of
        them (``docs/protocol.md``, "PURGE").

        Returns once the purge has started; the server removes the entries in bounded
        chunks in the background (``status()`` pending counts fall). Messages published
        afterwards stay.

        Returns:
            How many entries the groups held when it started.

        Raises:
            RequestError: UNKNOWN_TOPIC, UNKNOWN_GROUP, PERMISSION_DENIED.
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
            TypeError: ``topic`` or ``group`` is not a str; nothing was sent.
        """
        _checks.check_str("topic", topic)
        _checks.check_str("group", group, optional=True)
        answer = await self._call(lambda rid: frames.Purge(rid, topic, group), retry_unknown=True)
        return int(_expect(answer, frames.Ok).result or 0)

    async def browse(
        self,
        topic: str,
        group: str | None = None,
        *,
        from_due_ms: int | None = None,
        to_due_ms: int | None = None,
        cursor: bytes | None = None,
        limit: int = 100,
        preview_bytes: int = 0,
    ) -> BrowsePage:
        """One page of a group's pending messages in due order, claiming none
        (``docs/protocol.md``, "BROWSE").

        Args:
            topic: The topic.
            group: The group; None: the topic's only group (a dead-letter topic has
                one, ``default``).
            from_due_ms: Only messages due at or after this (ms since the epoch).
            to_due_ms: Only messages due before this (ms); None: no bound (parked dead
                letters come last).
            cursor: The previous page's ``next_cursor``; None: the first page.
            limit: Most messages in the page, 1 to 1000 (a page of large headers
                holds fewer, with a ``next_cursor``: follow it until None).
            preview_bytes: Payload bytes to include per message, 0 to 1024.

        Raises:
            RequestError: UNKNOWN_TOPIC, UNKNOWN_GROUP, GROUP_REQUIRED,
                INVALID_ARGUMENT, INVALID_CURSOR, PERMISSION_DENIED.
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
            TypeError: an argument of the wrong type (a str ``cursor``, a float
                ``limit``); nothing was sent.
        """
        _checks.check_str("topic", topic)
        _checks.check_str("group", group, optional=True)
        _checks.check_wire_int("from_due_ms", from_due_ms, unit=_EPOCH_MS, optional=True)
        _checks.check_wire_int("to_due_ms", to_due_ms, unit=_EPOCH_MS, optional=True)
        _checks.check_cursor(cursor)
        _checks.check_wire_int("limit", limit, unit="messages")
        _checks.check_wire_int("preview_bytes", preview_bytes, unit="bytes")
        answer = await self._call(
            lambda rid: frames.Browse(
                rid, topic, group, from_due_ms, to_due_ms, cursor, limit, preview_bytes
            ),
            retry_unknown=True,
        )
        return page_from_frame(_expect(answer, frames.BrowseOk))

    async def browse_counts(
        self,
        topic: str,
        group: str | None = None,
        *,
        bounds_ms: Sequence[int],
        relative: bool = False,
    ) -> DueCounts:
        """How many of a group's pending messages fall due in each bucket, claiming
        none (``docs/protocol.md``, "BROWSE_COUNTS").

        Args:
            topic: The topic.
            group: The group; None: the topic's only group.
            bounds_ms: 1 to 32 strictly increasing bucket bounds: ms since the Unix
                epoch, or with ``relative`` ms from the leader's cluster time (e.g.
                ``[60_000, 3_600_000, 86_400_000]``: next minute / hour / day).
            relative: Whether ``bounds_ms`` count from now.

        Raises:
            RequestError: UNKNOWN_TOPIC, UNKNOWN_GROUP, GROUP_REQUIRED,
                INVALID_ARGUMENT (bounds), PERMISSION_DENIED.
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
            TypeError: as :meth:`browse`.
        """
        _checks.check_str("topic", topic)
        _checks.check_str("group", group, optional=True)
        bounds = _checks.bounds_list(bounds_ms)
        _checks.check_bool("relative", relative)
        answer = await self._call(
            lambda rid: frames.BrowseCounts(rid, topic, group, bounds, relative),
            retry_unknown=True,
        )
        return counts_from_frame(_expect(answer, frames.BrowseCountsOk))

    async def cluster_status(self, *, local: bool = False) -> dict[str, Any]:
        """The cluster's membership and progress, asked of the leader
        (``docs/protocol.md``, "CLUSTER_STATUS_OK").

        Only the leader knows each member's match index and lag: an answer from another
        node that names a leader is asked again of the leader (once), as :meth:`status`.

        Args:
            local: Return the connected node's own view without following the leader.

        Returns:
            ``{"node_id", "role", "term", "leader_id", "leader_address", "commit_index",
            "applied_index", "voters", "learners", "nodes": [...]}``.

        Raises:
            RequestError, ConnectionLostError, ClientClosedError: as :meth:`publish`.
        """
        return await self._ask_leader(
            lambda rid: frames.ClusterStatus(rid),
            frames.ClusterStatusOk,
            lambda view: view.get("role") != "leader",
            local=local,
        )

    async def add_node(self, node_id: int, raft_address: str, client_address: str) -> None:
        """Add a node: a learner first, promoted to voter by the leader once caught up.

        Args:
            node_id: The new node's id (>= 1, not in use).
            raft_address: ``HOST:PORT`` where it listens for Raft traffic.
            client_address: ``HOST:PORT`` of its client listener.

        Raises:
            RequestError: INVALID_ARGUMENT (id in use, single-node server, bad address).
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
            TypeError, ValueError: ``node_id`` is not an int, or one beyond 64 bits
                (:func:`~futureq.client._checks.check_wire_int`); nothing was sent.
        """
        _checks.check_wire_int("node_id", node_id, unit=_NODE_ID)
        answer = await self._call(
            lambda rid: frames.ClusterAddNode(rid, node_id, raft_address, client_address),
            retry_unknown=True,
        )
        _expect(answer, frames.Ok)

    async def remove_node(self, node_id: int) -> None:
        """Remove a node from the cluster (the leader hands over first).

        Raises:
            RequestError: INVALID_ARGUMENT (not a member, single-node server).
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
            TypeError, ValueError: as :meth:`add_node`.
        """
        _checks.check_wire_int("node_id", node_id, unit=_NODE_ID)
        answer = await self._call(
            lambda rid: frames.ClusterRemoveNode(rid, node_id), retry_unknown=True
        )
        _expect(answer, frames.Ok)

    async def transfer_leader(self, node_id: int | None = None) -> None:
        """Hand leadership to ``node_id`` (None: the most up-to-date voter).

        Raises:
            RequestError: INVALID_ARGUMENT, TIMEOUT.
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
            TypeError, ValueError: as :meth:`add_node` (None is allowed).
        """
        _checks.check_wire_int("node_id", node_id, unit=_NODE_ID, optional=True)
        answer = await self._call(
            lambda rid: frames.ClusterTransferLeader(rid, node_id), retry_unknown=False
        )
        _expect(answer, frames.Ok)

    async def ping(self) -> float:
        """Round trip a PING.

        Returns:
            The round-trip time in seconds (one attempt's, not counting retries).

        Raises:
            RequestError, ConnectionLostError, ClientClosedError: as :meth:`publish`.
        """
        started = anyio.current_time()
        answer = await self._call(lambda rid: frames.Ping(rid), retry_unknown=True)
        _expect(answer, frames.Pong)
        return anyio.current_time() - started


def _publish_frame(level: frames.AckLevel, wire_items: list[Any]) -> Callable[[int], frames.Frame]:
    return lambda rid: frames.Publish(rid, level, wire_items)


def _ack_frame(tags: list[bytes]) -> Callable[[int], frames.Frame]:
    return lambda rid: frames.Ack(rid, tags)


def _nack_frame(
    tags: list[bytes], requeue_delay_ms: int, reason: str | None, dead_letter: bool
) -> Callable[[int], frames.Frame]:
    return lambda rid: frames.Nack(rid, tags, requeue_delay_ms, reason, dead_letter)


def _release_frame(tags: list[bytes]) -> Callable[[int], frames.Frame]:
    return lambda rid: frames.Release(rid, tags)


def _extend_frame(tags: list[bytes], visibility_ms: int) -> Callable[[int], frames.Frame]:
    return lambda rid: frames.Extend(rid, tags, visibility_ms)


def _sort_out(
    deliveries: list[Delivery], conn: Connection | None
) -> tuple[list[Delivery], list[Delivery]]:
    """``(to send, void)``: held deliveries of the live connection, and the void ones.

    Settled ones are in neither; held ones from a lost connection become void.
    """
    to_send: list[Delivery] = []
    void: list[Delivery] = []
    for delivery in deliveries:
        state = delivery._state
        if state is DeliveryState.SETTLED:
            continue
        if state is DeliveryState.HELD and (conn is None or delivery._epoch != conn.epoch):
            delivery._void(LOST_REASON, "lost")
        if delivery._state is DeliveryState.VOID:
            void.append(delivery)
        else:
            to_send.append(delivery)
    return to_send, void


def _single_exception(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one leaf of a group nested only one-deep at each level, else None."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        if len(error.exceptions) != 1:
            return None
        error = error.exceptions[0]
    return error


@asynccontextmanager
async def open_client(
    servers: str | Sequence[str] = DEFAULT_SERVER,
    *,
    ssl_context: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
    token: str | None = None,
    connect_timeout_s: float = 5.0,
    request_timeout_s: float = 30.0,
    max_batch_items: int = 1000,
    linger_ms: float = 1.0,
    ack_level: AckLevelName = "quorum",
    retry_unknown_outcome: bool = True,
    rng: random.Random | None = None,
    max_lease_s: float = DEFAULT_MAX_LEASE_S,
) -> AsyncIterator[Client]:
    """Connect to a FutureQ cluster and yield a :class:`Client`.

    Args:
        servers: ``"host:port"``, ``"h1:p1,h2:p2"`` or a sequence of addresses; tried
            in order, and NOT_LEADER redirects are followed beyond this list.
        ssl_context: Use TLS with this context (e.g. ``ssl.create_default_context(
            cafile="ca.pem")``).
        server_hostname: Name the server certificate must carry (default: the host).
        token: Auth token sent in HELLO.
        connect_timeout_s: Deadline of one connection attempt, and of the first
            connection overall (seconds).
        request_timeout_s: Deadline of every call, retries included (seconds).
        max_batch_items: Most items per PUBLISH / ACK / NACK frame.
        linger_ms: How long the publish batcher waits for more calls before sending
            a batch (ms); 0 sends at once (batches still form under load).
        ack_level: ``"quorum"`` (committed by a majority) or ``"leader"`` (durable on
            the leader) before a publish returns.
        retry_unknown_outcome: Resend a publish whose connection broke after it was
            sent (default; at-least-once, may store it twice). False raises
            :class:`ConnectionLostError` instead and leaves the choice to you.
        rng: Source of backoff jitter (seed it in tests).
        max_lease_s: How long the client keeps extending the visibility of a
            delivery it received and has not handed to you yet (seconds; default
            1 h). See ``docs/client.md``, "Leases".

    Yields:
        The connected client. Leaving the block closes it and cancels its tasks. When
        the server's node runs several shards (HELLO_OK says so), a
        :class:`~futureq.client._routing.ShardedClient` with the same methods, which
        sends each request to the shard owning its topic (``docs/sharding.md``).

    Raises:
        ConnectionLostError: no server could be reached within ``connect_timeout_s``
            (at once when the resolver says no server's host name exists); the
            message names every address tried and why it failed.
        RemoteProtocolError: a server refused HELLO (AUTH_FAILED, UNSUPPORTED_VERSION).
        ValueError: a bad argument, a server address that is not ``HOST:PORT`` (no
            port, port 0, a scheme, a space in the host), or a number option out of its
            range (``docs/client.md``, "Argument ranges": timeouts at most one day,
            ``linger_ms`` at most 10 s); raised before anything connects.
    """

    def new_client(addresses: list[str]) -> Client:
        return Client(
            addresses,
            ssl_context=ssl_context,
            server_hostname=server_hostname,
            token=token,
            connect_timeout_s=connect_timeout_s,
            request_timeout_s=request_timeout_s,
            max_batch_items=max_batch_items,
            linger_ms=linger_ms,
            ack_level=ack_level,
            retry_unknown_outcome=retry_unknown_outcome,
            rng=rng if rng is not None else random.Random(),
            max_lease_s=max_lease_s,
        )

    client = new_client(parse_servers(servers))
    opened: list[Client] = [client]
    try:
        async with anyio.create_task_group() as nursery:

            async def run(one: Client, *, wait: bool = True) -> None:
                if not wait:
                    # A shard's client: a shard that does not answer (stopped, hung,
                    # restarting) must not keep the client from opening, nor the other
                    # shards from serving (docs/sharding.md); its own calls fail alone.
                    nursery.start_soon(
                        functools.partial(one._maintain_connection, keep_trying=True)
                    )
                else:
                    try:
                        await nursery.start(one._maintain_connection)
                    except BaseException:
                        one._close()
                        raise
                nursery.start_soon(one._run_batcher)
                nursery.start_soon(one._keep_leases)

            await run(client)
            handed: Client = client
            try:
                conn = client._live_connection()
                if conn is not None and conn.shards > 1:
                    from futureq.client._routing import (
                        ShardedClient,
                        ask_slot_map,
                        shard_servers,
                    )

                    slot_map, answering, stride = await ask_slot_map(client)
                    seeds = client.servers

                    async def open_shard(shard: int, address: str) -> Client:
                        others = shard_servers(slot_map, shard, seeds, stride)[1:]
                        one = new_client([address, *(a for a in others if a != address)])
                        one.shard = shard
                        opened.append(one)
                        await run(one, wait=False)
                        return one

                    if answering >= 0:  # it fails over to the same shard elsewhere too
                        client.servers = shard_servers(slot_map, answering, seeds, stride)
                        client.shard = answering
                    shard_clients = [
                        client if shard == answering else await open_shard(shard, address)
                        for shard, address in enumerate(slot_map.addresses)
                    ]
                    handed = ShardedClient(
                        client, slot_map, shard_clients, open_shard, port_stride=stride
                    )
                yield handed
            finally:
                for one in opened:
                    one._close()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # Callers should see `except RequestError`, not a one-element group.
        single = _single_exception(group)
        if single is None:
            raise
        raise single from None
    finally:
        for one in opened:
            one._publish_receive.close()  # the batcher, its only reader, has ended


def _pop_refused_tag(exc: RequestError, chunk: list[Delivery]) -> Delivery | None:
    """The delivery of ``chunk`` whose tag the server refused in ``exc`` (removed from
    ``chunk`` and voided with the server's sentence), or None when ``exc`` is another
    error (UNKNOWN_DELIVERY_TAG / FOREIGN_DELIVERY_TAG / DELIVERY_CANCELLED with an item
    index in range)."""
    index = exc.item_index
    if (
        exc.code
        not in (
            ErrorCode.UNKNOWN_DELIVERY_TAG,
            ErrorCode.FOREIGN_DELIVERY_TAG,
            ErrorCode.DELIVERY_CANCELLED,
        )
        or index is None
        or not 0 <= index < len(chunk)
    ):
        return None
    bad = chunk.pop(index)
    bad._void(exc.message, code=exc.code)
    return bad
