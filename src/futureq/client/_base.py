"""The base of the async client: its options, the one live connection and the request loop.

:class:`ClientBase` holds what every call goes through: the connection manager
(connect to the first server that answers, reconnect with backoff, follow NOT_LEADER
redirects) and :meth:`ClientBase._call`, which sends one request and retries it until
its deadline (``docs/client.md``, "Reconnects and leader following"). Server pushes
are routed here to their :class:`~futureq.client.subscription.Subscription`.

The calls are built on it in :mod:`futureq.client._publishing`,
:mod:`futureq.client._consuming` and :mod:`futureq.client._admin`;
:class:`futureq.client.client.Client` puts them together.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import ssl
from collections.abc import Callable, Iterable, Sequence
from typing import Final, Literal, TypeVar

import anyio
import anyio.abc

from futureq.client import _checks
from futureq.client._attempts import Attempts, took_no_effect
from futureq.client._backoff import Backoff
from futureq.client._batching import PUBLISH_FRAME_OVERHEAD_BYTES, PublishItem
from futureq.client._connection import (
    DRAIN_GRACE_S,
    Connection,
    HopelessConnectError,
    PushFrame,
    UnknownHostError,
    connect,
)
from futureq.client._pending import _PendingPublish
from futureq.client.subscription import Subscription
from futureq.errors import (
    ClientClosedError,
    ConnectionLostError,
    ErrorCode,
    FutureQError,
    NotLeaderError,
    NotSentError,
    RemoteProtocolError,
    RequestError,
    SubscriptionEndedError,
)
from futureq.wire import codec, frames

DEFAULT_SERVER: Final = "127.0.0.1:7450"
MAX_BATCHES_IN_FLIGHT: Final = 4
"""PUBLISH frames the batcher keeps outstanding at once."""
DEFAULT_MAX_LEASE_S: Final = 3600.0
"""How long the lease keeper keeps a buffered delivery (seconds): 1 h, as the Pub/Sub
client libraries' ``max_lease_duration``."""

log = logging.getLogger(__name__)

AckLevelName = Literal["leader", "quorum"]
_ACK_LEVELS: Final[dict[str, frames.AckLevel]] = {
    "leader": frames.AckLevel.LEADER,
    "quorum": frames.AckLevel.QUORUM,
}

F = TypeVar("F", bound=frames.Frame)

CONNECT_STAGGER_S: Final = 1.0
"""How long a connection attempt runs alone before the next server is tried too (s),
unless it fails sooner (:meth:`ClientBase._connect_any`): long enough that a server
answering HELLO in the usual milliseconds is the one connected to, in the given order."""
SILENT_AVOID_S: Final = 10.0
"""How long a server whose connection was closed for silence (it answered nothing, not
even a PING: stopped or hung) is tried last when connecting (seconds): its port still
accepts connections, so trying it first would cost :data:`CONNECT_STAGGER_S` per
reconnect, and a follower that has not noticed yet may still name it leader."""
MAX_RETRIES_AT_ONCE: Final = 3
"""Attempts in a row a request makes without a backoff pause after a NOT_LEADER that
names another node or a lost connection; then it backs off like after any refusal."""


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
    elif isinstance(servers, (bytes, bytearray, memoryview)) or not isinstance(servers, Iterable):
        # Not a list of addresses: bytes would iterate as ints ("got int").
        _checks.check_server_address(servers)  # raises its TypeError, naming the type
        raise AssertionError("unreachable")
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


class ClientBase:
    """The connection and request machinery of :class:`~futureq.client.client.Client`
    (see there for the attributes); the calls are in its other base classes."""

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
        hostname_servers: Iterable[str] | None = None,
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
        self._hostname_servers = frozenset(
            servers if hostname_servers is None else hostname_servers
        )
        """The addresses ``server_hostname`` names (the servers the user gave, and on a
        sharded node their shards' ports): every other address, one a server named
        (HELLO_OK members, a NOT_LEADER leader, the slot map), is another machine,
        checked against its own host (:meth:`_server_hostname_for`)."""
        self._token = token
        self._connect_timeout_s = connect_timeout_s
        self._max_batch_items = max_batch_items
        self._linger_s = linger_ms / 1000
        self._ack_level = _ACK_LEVELS[ack_level]
        self._retry_unknown_outcome = retry_unknown_outcome
        self._rng = rng
        self._pid = os.getpid()  # the process whose tasks serve this client
        self._conn: Connection | None = None
        self._running: set[Connection] = set()
        """Connections whose :meth:`Connection.run` is running: the live one and those
        draining after a NOT_LEADER redirect."""
        self._epoch = 0
        self._conn_changed = anyio.Event()
        self._closed = False
        self._fatal: FutureQError | None = None
        self._last_connect_error: ConnectionLostError | None = None
        self._no_leader_at: str | None = None
        """The server whose connection was last left because it knew no leader (a node
        of a cluster with no quorum answers HELLO), unless a connection attempt failed
        since: what a request that found no connection is told (:meth:`_wait_connection`)."""
        self._leader_hint: str | None = None
        self._learned: list[str] = []
        self._next_server = 0
        self._silent: dict[str, float] = {}
        """Servers left for silence, with the ``anyio.current_time()`` until which
        they are tried last (:data:`SILENT_AVOID_S`)."""
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
        return conn.address if conn is not None and not conn.is_leaving else None

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
        return conn.epoch if conn is not None and not conn.is_leaving else -1

    def _live_connection(self) -> Connection | None:
        conn = self._conn
        return conn if conn is not None and not conn.is_leaving else None

    def _answer_handover(self, conn: Connection, sub: Subscription) -> None:
        """HANDOVER for ``sub`` on ``conn`` (reader task): the consuming client answers
        it (:meth:`ConsumingClient._answer_handover`); a client that does not consume
        has no subscription to be asked about."""

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
        """The live connection, once there is one.

        Raises:
            NotSentError: none before ``deadline`` (``anyio.current_time()`` value):
                the request waiting for it was not sent; the message names the
                servers tried and the last connection error.
            ClientClosedError, RemoteProtocolError: as :meth:`_check_open`.
        """
        while True:
            self._check_open()
            conn = self._conn
            if conn is not None and not conn.is_leaving:
                return conn
            changed = self._conn_changed
            with anyio.CancelScope(deadline=deadline):
                await changed.wait()
                continue
            detail = f": {self._last_connect_error}" if self._last_connect_error else ""
            whose = "" if self.shard is None else f"shard {self.shard}: "
            if self._no_leader_at is not None:
                # The servers answer, so "no connection" would send the user looking
                # for a stopped server (the CLI asked "is a FutureQ server running?").
                raise NotSentError(
                    f"{whose}no leader to send it to before the deadline: "
                    f"{self._no_leader_at} answered but knows no leader (an election is "
                    "under way, or fewer than a majority of the cluster's nodes are up "
                    "and reach each other; `futureq-cli --server NODE cluster status "
                    "--local` shows a node's view), servers tried: "
                    f"{', '.join(self._known_servers())}; the request was not sent"
                )
            raise NotSentError(
                f"{whose}no connection to any of {', '.join(self._known_servers())} before the "
                f"deadline{detail}; the request was not sent"
            )

    def _on_push(self, conn: Connection, frame: PushFrame) -> None:
        """A server push (reader task): route it to its subscription; on GOAWAY leave
        the connection (for the leader it names, if any)."""
        if isinstance(frame, frames.GoAway):
            leader = frame.leader_address if frame.code == ErrorCode.NOT_LEADER else None
            self._follow_leader(conn, leader)
            conn.drain(
                f"{conn.address} serves no more requests on this connection: {frame.message}",
                self._drain_grace_s(),
            )
            return
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
                elif isinstance(frame, frames.Handover):
                    self._answer_handover(conn, sub)
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

    def _subscribed_on(self, conn: Connection) -> bool:
        """Whether a subscription is bound on ``conn`` (its silence probe then watches
        it when idle too: :data:`~futureq.client._connection.IDLE_PING_S`)."""
        return any(
            sub.epoch == conn.epoch and sub.subscription_id is not None
            for sub in self._subscriptions.values()
        )

    def _known_servers(self) -> list[str]:
        """The servers given, then the members the last HELLO_OK named that were not
        given (protocol version 2): a client given one node of a cluster still reaches
        the others when that node stops."""
        return [*self.servers, *(a for a in self._learned if a not in self.servers)]

    def _learn_members(self, conn: Connection) -> None:
        """Keep the members ``conn``'s HELLO_OK named (those a client can connect to);
        a server that named none (version 1, or no member address known yet) leaves
        the list as it was."""
        learned = []
        for address in conn.members:
            try:
                _checks.check_server_address(address)
            except (TypeError, ValueError) as exc:
                log.debug("member address %r from %s ignored: %s", address, conn.address, exc)
                continue
            if address not in learned:
                learned.append(address)
        if learned and learned != self._learned:
            log.debug("%s names the members %s", conn.address, ", ".join(learned))
            self._learned = learned

    def _server_hostname_for(self, address: str) -> str | None:
        """The name ``address``'s TLS certificate must carry: ``server_hostname`` for
        the servers given (:attr:`_hostname_servers`), None (its own host) for one a
        server named. Before, a learned member was checked against the name given for
        the seed: a cluster with a certificate per node was refused as soon as the
        client left the seed (``docs/client.md``, "Servers it learns")."""
        return self._server_hostname if address in self._hostname_servers else None

    def _connect_order(self) -> list[str]:
        known = self._known_servers()
        count = len(known)
        order = [known[(self._next_server + i) % count] for i in range(count)]
        if self._leader_hint is not None:
            hint = self._leader_hint
            order = [hint] + [address for address in order if address != hint]
        now = anyio.current_time()
        self._silent = {a: until for a, until in self._silent.items() if until > now}
        if self._silent:
            # A stopped server's port still accepts connections: try it last, unless
            # a server named it leader since (it was only slow, or it is back).
            first = order[:1] if self._leader_hint is not None else []
            rest = order[len(first) :]
            order = [
                *first,
                *(a for a in rest if a not in self._silent),
                *(a for a in rest if a in self._silent),
            ]
        return order

    async def _connect_any(self) -> Connection:
        """Connect to the first server of :meth:`_connect_order` that answers HELLO.

        The attempts are staggered, not one after another (as RFC 8305's "Happy
        Eyeballs" staggers addresses): the next server is tried once the one before
        failed, or :data:`CONNECT_STAGGER_S` after it was tried, whichever comes first,
        so a server that accepts but never answers (stopped, hung, cut off by a
        partition) costs that much, not the whole ``connect_timeout_s``. The first to
        answer wins; the others are cancelled or closed.

        Raises:
            ConnectionLostError: every one failed; the message names each and why.
                :class:`UnknownHostError` when no server's host name resolves,
                :class:`HopelessConnectError` when every server failed in a way a
                retry will not mend (an unknown host, a TLS mismatch, not FutureQ).
            RemoteProtocolError: a server given (:attr:`servers`) refused the HELLO
                (AUTH_FAILED, ...); a learned member's refusal is only its attempt's
                failure.
        """
        order = self._connect_order()
        errors: dict[int, str] = {}
        unknown_hosts = 0
        hopeless = 0
        won: list[tuple[str, Connection]] = []
        refused: list[RemoteProtocolError] = []

        async def attempt(index: int, address: str, failed: anyio.Event) -> None:
            nonlocal unknown_hosts, hopeless
            try:
                conn = await connect(
                    address,
                    epoch=self._epoch + 1,
                    on_push=self._on_push,
                    ssl_context=self._ssl_context,
                    server_hostname=self._server_hostname_for(address),
                    token=self._token,
                    timeout_s=self._connect_timeout_s,
                )
            except ConnectionLostError as exc:
                errors[index] = str(exc)
                unknown_hosts += isinstance(exc, UnknownHostError)
                hopeless += isinstance(exc, HopelessConnectError)
                if address == self._leader_hint:
                    self._leader_hint = None
                failed.set()
                return
            except RemoteProtocolError as exc:
                if address not in self.servers:
                    # A member a server named, not one given: its refusal (another
                    # token, a node configured apart) is that address's failure, not
                    # the client's; fatal, it would end the client for ever though
                    # the servers given accept it.
                    errors[index] = f"{address} refused the connection: {exc}"
                    if address == self._leader_hint:
                        self._leader_hint = None
                    failed.set()
                    return
                refused.append(exc)
                group.cancel_scope.cancel()
                return
            if won or refused:
                await conn.discard()  # another server answered first
                return
            won.append((address, conn))
            group.cancel_scope.cancel()

        try:
            async with anyio.create_task_group() as group:
                for index, address in enumerate(order):
                    failed = anyio.Event()
                    group.start_soon(attempt, index, address, failed)
                    with anyio.move_on_after(CONNECT_STAGGER_S):
                        await failed.wait()
        except BaseException:
            # Cancelled from outside (the client closing) after a server answered: that
            # connection will never run; close it rather than leave its socket open.
            for _, conn in won:
                await conn.discard("the client stopped connecting")
            raise
        if refused:
            for _, conn in won:
                await conn.discard()
            raise refused[0]
        if won:
            address, conn = won[0]
            known = self._known_servers()
            if address in known:
                self._next_server = known.index(address)
            self._leader_hint = None
            self._learn_members(conn)
            self._epoch += 1
            conn.watched = functools.partial(self._subscribed_on, conn)
            return conn
        kind: type[ConnectionLostError] = ConnectionLostError
        if unknown_hosts == len(order):
            kind = UnknownHostError
        elif hopeless == len(order):
            kind = HopelessConnectError
        raise kind("; ".join(errors[index] for index in sorted(errors)))

    async def _maintain_connection(
        self,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
        *,
        keep_trying: bool = False,
    ) -> None:
        """Keep one connection open: connect, run it, reconnect with backoff.

        Before ``task_status.started()`` (the first connection) errors are raised to
        :func:`open_client` once ``connect_timeout_s`` has passed (at once when no
        server failed in a way no retry mends: :class:`HopelessConnectError`, such as an
        unknown host name or a TLS mismatch); afterwards the loop
        retries for ever, except after a server given refused the HELLO (AUTH_FAILED,
        ...), which is stored and raised by every later call. With ``keep_trying`` (a shard's client
        of a :class:`ShardedClient`, started without waiting) the first connection is
        retried for ever too: calls wait for it until their own deadline.
        """
        # A connection the client leaves on a NOT_LEADER redirect runs on in this
        # group while it drains (:meth:`_follow_leader`), next to its successor.
        async with anyio.create_task_group() as conns:
            await self._maintain_loop(conns, task_status, keep_trying=keep_trying)

    async def _maintain_loop(
        self,
        conns: anyio.abc.TaskGroup,
        task_status: anyio.abc.TaskStatus[None],
        *,
        keep_trying: bool,
    ) -> None:
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
                self._no_leader_at = None
                delay = backoff.next_delay_s()
                if not started and (
                    # No name resolves, TLS on one side only, not a FutureQ port: a
                    # typo or a wrong setting, not a server starting.
                    isinstance(exc, HopelessConnectError)
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
            self._running.add(conn)
            conns.start_soon(self._run_connection, conn)
            await conn.wait_leaving()  # lost, or draining: connect anew at once
            if conn.silent:
                self._silent[conn.address] = anyio.current_time() + SILENT_AVOID_S
                if self._leader_hint == conn.address:
                    self._leader_hint = None
            self._conn = None
            for sub in self._subscriptions.values():
                sub._connection_lost(conn.epoch)
            self._signal_change()

    async def _run_connection(self, conn: Connection) -> None:
        try:
            await conn.run()
        finally:
            self._running.discard(conn)

    def _close(self) -> None:
        self._closed = True
        for conn in [*self._running, *([self._conn] if self._conn is not None else [])]:
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
        retry_refusals: bool = False,
        deadline: float | None = None,
        on_answer: Callable[[Connection, frames.Frame], None] | None = None,
        attempts: Attempts | None = None,
    ) -> frames.Frame:
        """Send a request, following NOT_LEADER and retrying 3xx errors with backoff.

        Args:
            make_frame: Builds the request from a request id.
            retry_unknown: Resend after a connection broke with the request in flight,
                or after a 3xx refusal that does not say nothing was applied
                (``TIMEOUT``, ``UNAVAILABLE`` "outcome unknown": :func:`~futureq.
                client._attempts.took_no_effect`); only for idempotent requests or
                at-least-once publishing.
            retry_refusals: With ``retry_unknown`` False, still resend after such a
                3xx refusal (not after a broken connection): for a request whose
                repetition asks for the same end state (TRANSFER_LEADER to a named
                node: the next attempt, at the new leader, finds where it went).
            deadline: ``anyio.current_time()`` value ending all attempts; default now
                plus ``request_timeout_s``.
            on_answer: Called by the reader with the connection and the answer.
            attempts: The record of earlier attempts at the same items, when the
                caller sends them again in a new call (a publish batch resent without
                a refused item); it is updated. Default: a new one.

        Raises:
            RequestError: a 2xx refusal, or the last 3xx / TIMEOUT error at the
                deadline; with ``retry_unknown`` False, at once a 3xx refusal that may
                have been applied.
            NotSentError: the request took no effect and may be sent again: no
                connection before the deadline, or the last attempt was not sent,
                and every attempt before it took no effect either
                (:func:`~futureq.client._attempts.took_no_effect`).
            ConnectionLostError: the outcome is unknown: lost with the request in
                flight and ``retry_unknown`` False, or an attempt may have taken
                effect before the last one was not sent.
            ClientClosedError: the client was closed.
        """
        if deadline is None:
            deadline = anyio.current_time() + self.request_timeout_s
        if attempts is None:
            attempts = Attempts()
        backoff = Backoff(self._rng)
        at_once = 0
        while True:
            try:
                conn = await self._wait_connection(deadline)
            except NotSentError as exc:
                raise attempts.final(exc) from None
            answer_hook = None if on_answer is None else functools.partial(on_answer, conn)
            # A redirect to a named leader, or a connection to replace, is no failure
            # to back off from: the next attempt goes out as soon as there is a
            # connection (issue 11: the client adds at most one round trip to an
            # election). A few in a row at most, so two nodes that name each other (a
            # stale view) cannot make it spin.
            immediate = False
            try:
                answer = await conn.request(make_frame, deadline=deadline, on_answer=answer_hook)
                self._no_leader_at = None  # answered: what a node lacked then is no news now
                return answer
            except NotLeaderError as exc:
                attempts.note(exc)
                last_error: FutureQError = exc
                self._follow_leader(conn, exc.leader_address)
                immediate = exc.leader_address not in (None, conn.address)
            except NotSentError as exc:
                attempts.note(exc)
                last_error = exc
                immediate = True
            except ConnectionLostError as exc:
                attempts.note(exc)  # sent, and its answer lost: the outcome is unknown
                if not retry_unknown:
                    raise
                last_error = exc
                immediate = True
            except RequestError as exc:
                attempts.note(exc)
                if not exc.code.retryable or anyio.current_time() >= deadline:
                    raise
                if not (retry_unknown or retry_refusals) and not took_no_effect(exc):
                    # TIMEOUT, UNAVAILABLE "outcome unknown", ...: it may be applied;
                    # sent again, an at-most-once publish could be stored twice.
                    raise
                last_error = exc
            self._check_open()
            if immediate and at_once < MAX_RETRIES_AT_ONCE:
                at_once += 1
                continue
            at_once = 0
            delay = backoff.next_delay_s()
            if anyio.current_time() + delay >= deadline:
                raise attempts.final(last_error)
            await anyio.sleep(delay)

    def _follow_leader(self, conn: Connection, leader_address: str | None) -> None:
        """Reconnect to ``leader_address`` (NOT_LEADER redirect).

        With no leader named (the node is cut off, or an election is running), move on
        to the next server of the list: a node on the minority side of a partition
        cannot learn the new leader, and waiting on it would stall until the partition
        heals.

        The connection left is drained, not closed (:meth:`Connection.drain`): new
        requests go to the next connection, while the answers owed to requests
        already sent on it (publishes, settlements, a TRANSFER_LEADER) still arrive
        for up to :meth:`_drain_grace_s`; only those still unanswered then fail as on a
        lost connection (retried or reported as before).
        """
        if leader_address is None:
            known = self._known_servers()
            if len(known) > 1:
                if conn.address in known:
                    self._next_server = (known.index(conn.address) + 1) % len(known)
                self._no_leader_at = conn.address
                conn.drain(
                    f"{conn.address} knows no leader; trying the next server",
                    self._drain_grace_s(),
                )
            return
        if leader_address == conn.address:
            return
        self._leader_hint = leader_address
        conn.drain(
            f"{conn.address} is not the leader; reconnecting to {leader_address}",
            self._drain_grace_s(),
        )

    def _drain_grace_s(self) -> float:
        """How long a connection left on a redirect waits for the answers owed on it
        (seconds): :data:`~futureq.client._connection.DRAIN_GRACE_S`, at most
        ``request_timeout_s``."""
        return min(self.request_timeout_s, DRAIN_GRACE_S)
