"""A small synchronous FutureQ client for scripts, running trio in a background thread.

Usage::

    from futureq.client.sync import SyncClient

    with SyncClient("127.0.0.1:7450") as client:
        message_id = client.publish("emails", b"hello", delay_ms=5_000)
        for delivery in client.consume("emails", "senders", count=10, timeout_s=2.0):
            print(delivery.payload)
            delivery.ack()

Every call blocks the calling thread until the async :class:`~futureq.client.Client`
in the background thread has finished it (``trio.from_thread.run``), so the errors,
units and at-least-once notes of ``docs/client.md`` apply unchanged. One
:class:`SyncClient` may be used from several threads. Leaving the ``with`` block
unsubscribes, closes the connection and joins the thread; without ``with``, the
first call connects and :meth:`SyncClient.close` ends it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar

import attrs
import trio

from futureq.client._batching import PublishItem
from futureq.client._browse import BrowsePage, DueCounts
from futureq.client.client import DEFAULT_SERVER, Client, open_client
from futureq.client.subscription import Delivery, Subscription
from futureq.errors import ClientClosedError, FutureQError
from futureq.wire import frames

T = TypeVar("T")

STARTUP_EXTRA_S: Final = 5.0
"""Slack on top of ``connect_timeout_s`` when waiting for the thread to connect (s)."""
JOIN_TIMEOUT_S: Final = 10.0
"""Longest :meth:`SyncClient.close` waits for the background thread to end (s)."""


@attrs.frozen(repr=False)
class SyncDelivery:
    """A :class:`~futureq.client.Delivery` whose ``ack``/``nack`` block.

    Attributes are those of :class:`~futureq.client.Delivery`: ``id``, ``topic``,
    ``group``, ``payload`` (bytes), ``due_ms``, ``publish_ms``, ``attempt``,
    ``delivered_ms`` (ms since the Unix epoch), ``tag``.
    """

    delivery: Delivery
    _client: SyncClient

    def __repr__(self) -> str:
        return f"Sync{self.delivery!r}"

    @property
    def id(self) -> int:
        return self.delivery.id

    @property
    def topic(self) -> str:
        return self.delivery.topic

    @property
    def group(self) -> str:
        return self.delivery.group

    @property
    def payload(self) -> bytes:
        return self.delivery.payload

    @property
    def due_ms(self) -> int:
        return self.delivery.due_ms

    @property
    def publish_ms(self) -> int:
        return self.delivery.publish_ms

    @property
    def attempt(self) -> int:
        return self.delivery.attempt

    @property
    def delivered_ms(self) -> int:
        return self.delivery.delivered_ms

    @property
    def headers(self) -> dict[str, str]:
        return self.delivery.headers

    @property
    def tag(self) -> bytes:
        return self.delivery.tag

    def ack(self) -> None:
        """Acknowledge (blocks until durable). Raises as ``Delivery.ack``."""
        self._client._run(self.delivery.ack)

    def nack(
        self, requeue_delay_ms: int = 0, *, reason: str | None = None, dead_letter: bool = False
    ) -> None:
        """Refuse; delivered again after ``requeue_delay_ms`` (ms), or dead-lettered now
        with ``dead_letter``; ``reason`` is kept. Raises as ``Delivery.nack``."""
        delivery = self.delivery

        async def call() -> None:
            await delivery.nack(requeue_delay_ms, reason=reason, dead_letter=dead_letter)

        self._client._run(call)

    def release(self) -> None:
        """Give it back unprocessed: not counted towards ``max_deliveries`` (the next
        delivery's ``attempt`` is still one higher). Raises as ``Delivery.release``."""
        self._client._run(self.delivery.release)

    def extend(self, visibility_ms: int | None = None) -> None:
        """Keep it ``visibility_ms`` more from now (None: the group's visibility timeout).

        Raises as ``Delivery.extend``.
        """
        self._client._run(self.delivery.extend, visibility_ms)

    @property
    def settled(self) -> bool:
        """True once an ack, nack or release of it was confirmed."""
        return self.delivery.settled


class _OpenRequest:
    """A consume() call asking the background thread to hold a subscription open."""

    def __init__(self, topic: str, group: str, prefetch: int) -> None:
        self.topic = topic
        self.group = group
        self.prefetch = prefetch
        self.done = trio.Event()
        self.subscription: Subscription | None = None
        self.error: BaseException | None = None


class SyncClient:
    """Blocking FutureQ client: usable as soon as it is made; ``close()`` ends it.

    It connects on first use (or on :meth:`open`, or entering a ``with`` block, to
    connect up front and see connection errors there), and runs until :meth:`close`
    (or leaving the ``with`` block).

    Args:
        servers: As :func:`~futureq.client.open_client`.
        **options: Any keyword argument of :func:`~futureq.client.open_client`
            (``token``, ``ssl_context``, ``request_timeout_s``, ...).

    Raises:
        ConnectionLostError, RemoteProtocolError: from the call that connects (the
            first call, :meth:`open` or ``__enter__``) when no server can be reached
            or HELLO is refused; the next call tries again.
    """

    def __init__(self, servers: str | Sequence[str] = DEFAULT_SERVER, **options: Any) -> None:
        self._servers = servers
        self._options = options
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._client: Client | None = None
        self._open_send: trio.MemorySendChannel[_OpenRequest] | None = None
        self._subscriptions: dict[tuple[str, str], Subscription] = {}
        self._closed = False
        self._open_lock = threading.Lock()

    def __enter__(self) -> SyncClient:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def open(self) -> None:
        """Start the background thread and connect, if that has not happened yet.

        Optional: the first call does it too. Calling it again does nothing.

        Raises:
            ClientClosedError: :meth:`close` was called.
            ConnectionLostError, RemoteProtocolError: as the class; the client stays
                unopened, and the next call tries again.
        """
        with self._open_lock:
            if self._closed:
                raise ClientClosedError("the SyncClient was closed; make a new one")
            if self._thread is not None:
                return
            self._ready = threading.Event()
            self._startup_error = None
            thread = threading.Thread(target=self._thread_main, name="futureq-sync", daemon=True)
            self._thread = thread
            thread.start()
            wait_s = float(self._options.get("connect_timeout_s", 5.0)) + STARTUP_EXTRA_S
            if not self._ready.wait(wait_s):
                raise TimeoutError(f"the client thread did not start within {wait_s:g} s")
            if self._startup_error is not None:
                thread.join(JOIN_TIMEOUT_S)
                self._thread = None  # not opened: a later call may try again
                error, self._startup_error = self._startup_error, None
                raise error

    def close(self) -> None:
        """Unsubscribe, disconnect and join the background thread (idempotent).

        Later calls raise :class:`ClientClosedError`.
        """
        with self._open_lock:
            if self._closed:
                return
            self._closed = True
        if self._token is not None and self._open_send is not None:
            try:
                trio.from_thread.run_sync(self._open_send.close, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT_S)

    def _thread_main(self) -> None:
        try:
            trio.run(self._trio_main)
        except BaseException as exc:
            if self._ready.is_set():
                raise  # a crash after start-up: let the thread report it
            self._startup_error = exc  # re-raised by open() in the caller's thread
        finally:
            self._ready.set()

    async def _trio_main(self) -> None:
        open_send, open_receive = trio.open_memory_channel[_OpenRequest](16)
        async with open_client(self._servers, **self._options) as client:
            self._client = client
            self._open_send = open_send
            self._token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                self._ready.set()
                async with open_receive:
                    async for request in open_receive:
                        nursery.start_soon(self._hold_subscription, client, request)
                # close() closed the channel: end the held subscriptions.
                nursery.cancel_scope.cancel()

    async def _hold_subscription(self, client: Client, request: _OpenRequest) -> None:
        """Keep one subscription open until the client closes (so acks stay valid)."""
        try:
            async with client.subscribe(
                request.topic, request.group, request.prefetch, pull=True
            ) as sub:
                request.subscription = sub
                request.done.set()
                await trio.sleep_forever()
        except FutureQError as exc:
            request.error = exc
        finally:
            request.done.set()

    def _run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        self._require_client()
        if self._closed or self._token is None:
            raise ClientClosedError("the SyncClient was closed; make a new one")
        try:
            return trio.from_thread.run(fn, *args, trio_token=self._token)
        except trio.RunFinishedError:
            raise ClientClosedError("the SyncClient's background thread has stopped") from None

    def _require_client(self) -> Client:
        """The async client, opening the SyncClient first if nothing has yet
        (never called from the background thread before it is open)."""
        if self._closed:
            raise ClientClosedError("the SyncClient was closed; make a new one")
        if self._client is None:
            self.open()
        assert self._client is not None
        return self._client

    # -- API ---------------------------------------------------------------------------

    def publish(
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
        """Publish one message and return its id (see ``Client.publish``)."""
        client = self._require_client()

        async def call() -> int:
            return await client.publish(
                topic,
                payload,
                delay_ms=delay_ms,
                deliver_at_ms=deliver_at_ms,
                ttl_ms=ttl_ms,
                headers=headers,
                idempotency_key=idempotency_key,
            )

        return self._run(call)

    def publish_batch(self, items: Sequence[PublishItem]) -> list[int]:
        """Publish many messages; ids in order (see ``Client.publish_batch``)."""
        return self._run(self._require_client().publish_batch, items)

    def consume(
        self,
        topic: str,
        group: str,
        count: int = 1,
        timeout_s: float = 5.0,
        *,
        prefetch: int | None = None,
    ) -> list[SyncDelivery]:
        """Receive up to ``count`` deliveries of ``topic`` for consumer group ``group``.

        The first call for a (topic, group) subscribes and keeps the subscription open
        until the client closes, so the returned deliveries can be acked later. The
        subscription is in pull mode: each call asks the server for exactly the
        deliveries it still wants, and never holds one it does not return — a
        delivery that arrives after the call returned is released at once (due again,
        its attempt not counted towards ``max_deliveries``).

        Args:
            topic: Topic name.
            group: Consumer group name (created if new).
            count: Most deliveries to return (>= 1).
            timeout_s: Stop early once no delivery arrived for this long (seconds).
            prefetch: Ignored (kept for compatibility): the credit is what the call
                still wants.

        Returns:
            0 to ``count`` deliveries; unsettled ones come back after the group's
            visibility timeout (settle or ``extend()`` them before), or when the
            client closes.

        Raises:
            ValueError: ``count`` < 1.
            RequestError, ConnectionLostError, ClientClosedError: as ``Client.subscribe``.
        """
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        deliveries = self._run(self._consume, topic, group, count, timeout_s, count)
        return [SyncDelivery(delivery, self) for delivery in deliveries]

    async def _consume(
        self, topic: str, group: str, count: int, timeout_s: float, prefetch: int
    ) -> list[Delivery]:
        client = self._require_client()
        sub = self._subscriptions.get((topic, group))
        if sub is None or sub.closed:
            if self._open_send is None:
                raise ClientClosedError("the SyncClient is closed")
            request = _OpenRequest(topic, group, prefetch)
            try:
                await self._open_send.send(request)
            except trio.ClosedResourceError:
                raise ClientClosedError("the SyncClient is closed") from None
            with trio.fail_after(client.request_timeout_s + STARTUP_EXTRA_S):
                await request.done.wait()
            if request.error is not None:
                raise request.error
            if request.subscription is None:
                raise ClientClosedError("the SyncClient is closed")
            sub = self._subscriptions[(topic, group)] = request.subscription
        return await sub.fetch(count, timeout_s)

    def status(self, *, local: bool = False) -> dict[str, Any]:
        """The cluster's status map, asked of the leader unless ``local`` (see
        ``Client.status``)."""
        return self._run(functools.partial(self._require_client().status, local=local))

    def create_group(
        self,
        topic: str,
        group: str,
        *,
        visibility_timeout_ms: int | None = None,
        max_deliveries: int | None = None,
        from_backlog: bool = False,
        dead_letter_expired: bool | None = None,
    ) -> None:
        """Create a consumer group (see ``Client.create_group``)."""
        client = self._require_client()

        async def call() -> None:
            await client.create_group(
                topic,
                group,
                visibility_timeout_ms=visibility_timeout_ms,
                max_deliveries=max_deliveries,
                from_backlog=from_backlog,
                dead_letter_expired=dead_letter_expired,
            )

        self._run(call)

    def delete_group(self, topic: str, group: str) -> None:
        """Delete a consumer group (see ``Client.delete_group``)."""
        self._run(self._require_client().delete_group, topic, group)

    def cancel(
        self, topic: str, ids: Sequence[int], *, group: str | None = None
    ) -> list[frames.ItemStatus]:
        """Cancel scheduled messages by id; one status per id (see ``Client.cancel``)."""
        client = self._require_client()

        async def call() -> list[frames.ItemStatus]:
            return await client.cancel(topic, ids, group=group)

        return self._run(call)

    def redrive(
        self,
        topic: str,
        ids: Sequence[int],
        *,
        delay_ms: int = 0,
        group: str | None = None,
    ) -> list[frames.ItemStatus]:
        """Move dead letters back where they died; one status per id (see
        ``Client.redrive``)."""
        client = self._require_client()

        async def call() -> list[frames.ItemStatus]:
            return await client.redrive(topic, ids, delay_ms=delay_ms, group=group)

        return self._run(call)

    def reschedule(
        self,
        topic: str,
        ids: Sequence[int],
        *,
        due_ms: int | None = None,
        delay_ms: int | None = None,
        group: str | None = None,
    ) -> list[frames.ItemStatus]:
        """New due time for pending messages; one status per id (see
        ``Client.reschedule``)."""
        client = self._require_client()

        async def call() -> list[frames.ItemStatus]:
            return await client.reschedule(
                topic, ids, due_ms=due_ms, delay_ms=delay_ms, group=group
            )

        return self._run(call)

    def purge(self, topic: str, *, group: str | None = None) -> int:
        """Start removing what is pending; entries it will remove (see ``Client.purge``)."""
        client = self._require_client()

        async def call() -> int:
            return await client.purge(topic, group=group)

        return self._run(call)

    def browse(
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
        """One page of pending messages, claiming none (see ``Client.browse``)."""
        client = self._require_client()

        async def call() -> BrowsePage:
            return await client.browse(
                topic,
                group,
                from_due_ms=from_due_ms,
                to_due_ms=to_due_ms,
                cursor=cursor,
                limit=limit,
                preview_bytes=preview_bytes,
            )

        return self._run(call)

    def browse_counts(
        self,
        topic: str,
        group: str | None = None,
        *,
        bounds_ms: Sequence[int],
        relative: bool = False,
    ) -> DueCounts:
        """Pending messages counted by due-time bucket (see ``Client.browse_counts``)."""
        client = self._require_client()

        async def call() -> DueCounts:
            return await client.browse_counts(topic, group, bounds_ms=bounds_ms, relative=relative)

        return self._run(call)

    def ping(self) -> float:
        """Round-trip a PING; seconds (see ``Client.ping``)."""
        return self._run(self._require_client().ping)


__all__ = ["SyncClient", "SyncDelivery"]
