"""A small synchronous FutureQ client for scripts, running trio in a background thread.

Usage::

    from futureq.client.sync import SyncClient

    with SyncClient("127.0.0.1:7450") as client:
        message_id = client.publish("emails", b"hello", delay_ms=5_000)
        for delivery in client.consume("emails", "senders", count=10, timeout_s=2.0):
            print(delivery.payload)
            delivery.ack()

Every call blocks the calling thread until the async :class:`~futureq.client.Client`
in the background thread has finished it (handed over with ``TrioToken.run_sync_soon``
and a ``concurrent.futures.Future``, which, unlike ``trio.from_thread.run``, also works
from a thread running trio), so the errors, units and at-least-once notes of
``docs/client.md`` apply unchanged. One :class:`SyncClient` may be used from several
threads of one process (not from a child after ``os.fork()``). Leaving the ``with``
block unsubscribes, closes the connection and joins the thread, and makes calls still
in progress raise ``ClientClosedError``; without ``with``, the first call connects and
:meth:`SyncClient.close` ends it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import inspect
import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar

import attrs
import trio

from futureq.client import _checks
from futureq.client._base import CONNECT_STAGGER_S, DEFAULT_SERVER, parse_servers
from futureq.client._batching import PublishItem
from futureq.client._browse import BrowsePage, DueCounts
from futureq.client.client import Client, open_client
from futureq.client.subscription import Delivery, Subscription
from futureq.errors import ClientClosedError, ConnectionLostError, FutureQError, NotSentError
from futureq.wire import frames

T = TypeVar("T")

STARTUP_EXTRA_S: Final = 5.0
"""Slack on top of the time opening may take when waiting for the thread to connect (s)."""
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


class _Call:
    """One blocking call: the coroutine function the background loop runs for it, and
    the future its calling thread waits on."""

    def __init__(self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        # Set by the calling thread when it stops waiting (KeyboardInterrupt): the loop
        # then cancels the call (``scope``, set when it starts) or never starts it.
        self.abandoned = False
        self.scope: trio.CancelScope | None = None

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        if self.future.done():
            return
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(result)


CLOSED_MESSAGE: Final = "the SyncClient was closed; make a new one"
CLOSED_DURING_CALL_MESSAGE: Final = (
    "the SyncClient was closed while this call was in progress (by close() in another "
    "thread); a publish or settlement it was making may or may not have been applied"
)
ABANDONED_MESSAGE: Final = "the calling thread stopped waiting for this call; it was cancelled"
CLOSED_DURING_CONNECT_MESSAGE: Final = (
    "the SyncClient was closed (by close() in another thread) while this call was "
    "connecting; nothing was sent; make a new one"
)


def _default_options() -> dict[str, Any]:
    """``open_client``'s keyword options and their defaults."""
    parameters = inspect.signature(open_client).parameters.values()
    return {p.name: p.default for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}


class SyncClient:
    """Blocking FutureQ client: usable as soon as it is made; ``close()`` ends it.

    It connects on first use (or on :meth:`open`, or entering a ``with`` block, to
    connect up front and see connection errors there), and runs until :meth:`close`
    (or leaving the ``with`` block). It may be called from any thread, including the
    thread of a running asyncio or trio loop (the call then blocks that loop until it
    returns). It belongs to the process that opened it: after ``os.fork()`` the child
    must make its own.

    Args:
        servers: As :func:`~futureq.client.open_client`.
        **options: Any keyword argument of :func:`~futureq.client.open_client`
            (``token``, ``ssl_context``, ``request_timeout_s``, ...).

    Raises:
        TypeError: an option ``open_client`` does not take, or a number option that
            is not a number.
        ValueError: a number option out of its range (``docs/client.md``, "Argument
            ranges"), or a server address that is not ``HOST:PORT`` (``"nonsense"``,
            port 0, ``http://...``), at once, before anything connects.
        ConnectionLostError, RemoteProtocolError: from the call that connects (the
            first call, :meth:`open` or ``__enter__``) when no server can be reached
            within ``connect_timeout_s`` (at once when no server's host name resolves)
            or HELLO is refused; the next call tries again.
    """

    def __init__(self, servers: str | Sequence[str] = DEFAULT_SERVER, **options: Any) -> None:
        defaults = _default_options()
        unknown = sorted(set(options) - set(defaults))
        if unknown:
            raise TypeError(
                f"SyncClient() got unknown option(s) {', '.join(unknown)}; it takes the "
                f"keyword arguments of open_client: {', '.join(defaults)}"
            )
        merged = defaults | options
        _checks.check_client_options(
            connect_timeout_s=merged["connect_timeout_s"],
            request_timeout_s=merged["request_timeout_s"],
            max_batch_items=merged["max_batch_items"],
            linger_ms=merged["linger_ms"],
            max_lease_s=merged["max_lease_s"],
        )
        self._servers = parse_servers(servers)  # a bad address fails here, not in 5 s
        self._options = options
        self._connect_timeout_s = float(merged["connect_timeout_s"])
        # How long opening may take before open_client has given up by itself: rounds
        # of staggered attempts until connect_timeout_s has passed (the last round
        # started just before, lasting connect_timeout_s more, its servers tried
        # CONNECT_STAGGER_S apart), then a sharded node's slot map (one request).
        # A fixed connect_timeout_s + 5 s was shorter than that with many servers
        # that accept and never answer: open() raised TimeoutError, and the thread,
        # still running, left the client answering every later call with an
        # AssertionError (found by a tester).
        self._startup_bound_s = (
            2 * self._connect_timeout_s
            + CONNECT_STAGGER_S * len(self._servers)
            + float(merged["request_timeout_s"])
            + STARTUP_EXTRA_S
        )
        self._thread: threading.Thread | None = None
        self._pid: int | None = None  # the process whose thread serves this client
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._client: Client | None = None
        self._open_send: trio.MemorySendChannel[_OpenRequest] | None = None
        self._subscriptions: dict[tuple[str, str], Subscription] = {}
        self._closed = False
        self._open_lock = threading.Lock()
        # Calls crossing into the background loop; guarded by _calls_lock. Each calling
        # thread blocks on its own call, so _incoming holds at most one call per thread.
        self._calls_lock = threading.Lock()
        self._incoming: collections.deque[_Call] = collections.deque()
        self._unfinished: set[_Call] = set()
        self._loop_done = False
        self._wakeup: trio.Event | None = None
        # While the background loop connects: cancelled by close() from another thread,
        # so a close during a slow connect does not wait connect_timeout_s for it.
        self._startup_scope: trio.CancelScope | None = None
        # Set by open() when its caller stopped waiting (Ctrl-C) while it connected.
        self._startup_cancelled = False

    def __enter__(self) -> SyncClient:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_process(self) -> None:
        """Refuse use in a process forked from the one that opened the client: the
        child has no copy of the background thread, so a call would wait for ever."""
        if self._pid is not None and self._pid != os.getpid():
            raise ClientClosedError(
                f"this SyncClient was opened in process {self._pid} and cannot be used "
                f"in process {os.getpid()}, forked from it: its background thread and "
                "connection stay in the parent; make a new SyncClient in the child"
            )

    def open(self) -> None:
        """Start the background thread and connect, if that has not happened yet.

        Optional: the first call does it too. Calling it again does nothing.

        Raises:
            ClientClosedError: :meth:`close` was called, or the client was opened
                in the parent of this forked process.
            ConnectionLostError, RemoteProtocolError: as the class; the client stays
                unopened, and the next call tries again.
        """
        # close() from another thread does not take _open_lock: it cancels a connect in
        # progress instead (it used to wait here for up to connect_timeout_s, and the
        # call then raised ConnectionLostError, not ClientClosedError).
        self._check_process()
        with self._open_lock:
            if self._closed:
                raise ClientClosedError(CLOSED_MESSAGE)
            if self._thread is not None:
                return
            self._ready = threading.Event()
            self._startup_error = None
            with self._calls_lock:
                self._loop_done = False
            thread = threading.Thread(target=self._thread_main, name="futureq-sync", daemon=True)
            wait_s = self._startup_bound_s
            try:
                self._thread = thread
                self._pid = os.getpid()
                # Inside the try: a Ctrl-C can land while start() waits for the thread
                # to run, by which time it may be connecting already.
                thread.start()
                ready = self._ready.wait(wait_s)
            except BaseException:
                # Ctrl-C while connecting: stop the connect, so the next call starts
                # afresh. Before, the thread was left connecting and every later call
                # raised AssertionError (found by a tester).
                self._abandon_startup(thread)
                raise
            if not ready:
                raise TimeoutError(f"the client thread did not start within {wait_s:g} s")
            if self._client is None and self._closed:  # close() cancelled the connect
                thread.join(JOIN_TIMEOUT_S)
                self._startup_error = None
                raise ClientClosedError(CLOSED_DURING_CONNECT_MESSAGE)
            if self._startup_error is not None:
                thread.join(JOIN_TIMEOUT_S)
                self._thread = None  # not opened: a later call may try again
                self._pid = None
                error, self._startup_error = self._startup_error, None
                raise error

    def _abandon_startup(self, thread: threading.Thread) -> None:
        """Cancel a connect whose caller stopped waiting (KeyboardInterrupt in open()).

        If it had connected meanwhile, the client stays open; otherwise it is left
        unopened, so the next call connects again. Called with ``_open_lock`` held.
        """
        if thread.ident is None:  # interrupted before it started: nothing runs
            self._thread = None
            self._pid = None
            return
        self._startup_cancelled = True  # before reading the token, as close() does
        token = self._token
        if token is not None:
            try:
                token.run_sync_soon(self._on_wake)
            except trio.RunFinishedError:
                pass
        self._ready.wait(JOIN_TIMEOUT_S)
        self._startup_cancelled = False
        if self._client is not None:
            return  # connected before the cancel arrived: serving, keep it
        thread.join(JOIN_TIMEOUT_S)
        self._thread = None
        self._pid = None
        self._token = None
        self._startup_error = None

    def close(self) -> None:
        """Unsubscribe, disconnect and join the background thread (idempotent).

        Calls in progress in other threads raise :class:`ClientClosedError` at once;
        later calls raise it too. In a child forked after the client was opened it
        only marks this copy closed: the parent's connection is left alone.
        """
        if self._pid is not None and self._pid != os.getpid():
            self._closed = True  # no lock: one may have been held across the fork
            return
        # Not _open_lock: open() holds it while connecting, for up to connect_timeout_s.
        with self._calls_lock:
            if self._closed:
                return
            self._closed = True
        self._wake_loop()  # also cancels a connect in progress
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_TIMEOUT_S)

    def _wake_loop(self) -> None:
        """Have the background loop look at new calls and at ``_closed``."""
        token = self._token
        if token is None:
            return
        try:
            token.run_sync_soon(self._on_wake)
        except trio.RunFinishedError:
            pass  # _thread_main has failed whatever was unfinished

    def _on_wake(self) -> None:
        # In the loop thread, outside any task (TrioToken.run_sync_soon).
        if (self._closed or self._startup_cancelled) and self._startup_scope is not None:
            self._startup_scope.cancel()
        if self._wakeup is not None:
            self._wakeup.set()

    def _thread_main(self) -> None:
        try:
            trio.run(self._trio_main)
        except BaseException as exc:
            if self._ready.is_set():
                raise  # a crash after start-up: let the thread report it
            self._startup_error = exc  # re-raised by open() in the caller's thread
        finally:
            with self._calls_lock:
                self._loop_done = True
                unfinished = list(self._unfinished)
                self._unfinished.clear()
                self._incoming.clear()
            for call in unfinished:
                call.finish(error=ClientClosedError(CLOSED_DURING_CALL_MESSAGE))
            self._ready.set()

    async def _trio_main(self) -> None:
        # The token first, then _closed: close() sets _closed, then reads the token,
        # so either it wakes this loop (cancelling the connect) or the loop sees it.
        self._token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as startup:
            self._startup_scope = startup
            if self._closed or self._startup_cancelled:
                return  # open() raises ClientClosedError, or was interrupted
            async with open_client(self._servers, **self._options) as client:
                self._startup_scope = None  # from here close() ends _serve_calls
                await self._serve(client)

    async def _serve(self, client: Client) -> None:
        """Serve calls until :meth:`close`, then end the subscriptions."""
        async with trio.open_nursery() as holders:
            open_send, open_receive = trio.open_memory_channel[_OpenRequest](16)
            holders.start_soon(self._hold_subscriptions, client, open_receive)
            self._client = client
            self._open_send = open_send
            self._wakeup = trio.Event()
            self._ready.set()
            # Calls end before the subscriptions they read from: a consume() in
            # progress at close() raises ClientClosedError, it does not see its
            # subscription end and return [] as if nothing had come.
            await self._serve_calls()
            holders.cancel_scope.cancel()

    async def _serve_calls(self) -> None:
        """Run each call handed over by a calling thread, until :meth:`close`; then
        cancel those still running (their threads get ClientClosedError)."""
        async with trio.open_nursery() as calls:
            while True:
                assert self._wakeup is not None
                wakeup = self._wakeup
                with self._calls_lock:
                    incoming = list(self._incoming)
                    self._incoming.clear()
                    closed = self._closed
                if closed:
                    for call in incoming:
                        self._finish(call, error=ClientClosedError(CLOSED_MESSAGE))
                    calls.cancel_scope.cancel()
                    return
                for call in incoming:
                    calls.start_soon(self._serve_call, call)
                await wakeup.wait()
                self._wakeup = trio.Event()

    async def _serve_call(self, call: _Call) -> None:
        with self._calls_lock:
            if call.abandoned:
                return  # its thread stopped waiting before it started: nothing sent
            call.scope = trio.CancelScope()
        try:
            with call.scope:
                result = await call.fn(*call.args)
            if call.scope.cancelled_caught:  # abandoned by its thread (_abandon)
                self._finish(call, error=ClientClosedError(ABANDONED_MESSAGE))
                return
            with self._calls_lock:  # atomic with _abandon's look at the future
                abandoned = call.abandoned
                if not abandoned:
                    self._unfinished.discard(call)
                    call.finish(result)
            if abandoned:
                # Finished as its thread stopped waiting: nobody will see the result.
                await self._give_back(result)
                self._finish(call, result)
        except trio.Cancelled:
            # Only close() (or the loop ending) cancels a call.
            self._finish(call, error=ClientClosedError(CLOSED_DURING_CALL_MESSAGE))
            raise
        except Exception as exc:
            self._finish(call, error=exc)
        except BaseException as exc:  # KeyboardInterrupt and friends: end the loop too
            self._finish(call, error=exc)
            raise

    def _abandon(self, call: _Call) -> None:
        """The calling thread stopped waiting for ``call`` (KeyboardInterrupt, or any
        exception raised in it while it waited): cancel the call, or give back what
        it returned, so nothing goes on in the background that the application no
        longer expects. Deliveries a consume() had taken are released (due again, not
        counted as an attempt), never left held until their visibility timeout.

        Before, the call ran on: a consume() interrupted by Ctrl-C went on taking
        deliveries nobody would see, so the next consume() found none and they came
        back only after the visibility timeout, counted as an attempt; a
        publish_batch() interrupted went on publishing (found by a tester).
        """
        with self._calls_lock:
            call.abandoned = True
            if call in self._incoming:  # not started: drop it, nothing was sent
                self._incoming.remove(call)
                self._unfinished.discard(call)
                return
            if call.future.done():
                if call.future.exception() is not None:
                    return
                result = call.future.result()
                give_back = _Call(self._give_back, (result,))
                self._unfinished.add(give_back)
                self._incoming.append(give_back)
        token = self._token
        if token is None:
            return
        try:
            token.run_sync_soon(self._cancel_call, call)
        except trio.RunFinishedError:
            pass  # the loop has ended: nothing runs on

    def _cancel_call(self, call: _Call) -> None:
        # In the loop thread, outside any task (TrioToken.run_sync_soon).
        if call.scope is not None:
            call.scope.cancel()
        if self._wakeup is not None:
            self._wakeup.set()  # starts a give-back _abandon queued

    @staticmethod
    async def _give_back(result: Any) -> None:
        """Release the deliveries in ``result`` (a consume()'s list) nobody will see."""
        if not isinstance(result, list):
            return
        for delivery in result:
            if isinstance(delivery, Delivery) and not delivery.settled:
                try:
                    await delivery.release()
                except FutureQError:
                    pass  # void or connection lost: it comes again after its deadline

    def _finish(self, call: _Call, result: Any = None, error: BaseException | None = None) -> None:
        with self._calls_lock:
            self._unfinished.discard(call)
        call.finish(result, error)

    async def _hold_subscriptions(
        self, client: Client, open_receive: trio.MemoryReceiveChannel[_OpenRequest]
    ) -> None:
        """Start a holder for each subscription consume() asks for (until cancelled)."""
        async with trio.open_nursery() as nursery, open_receive:
            async for request in open_receive:
                nursery.start_soon(self._hold_subscription, client, request)

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
        """Run ``await fn(*args)`` in the background loop; block until it is done.

        Works from any thread of the opening process, a thread running an asyncio or
        trio loop included (``trio.from_thread.run`` refuses a trio thread, so the
        call crosses with ``TrioToken.run_sync_soon`` and a ``concurrent.futures``
        future instead).
        """
        self._require_client()
        call = _Call(fn, args)
        with self._calls_lock:
            if self._closed:
                raise ClientClosedError(CLOSED_MESSAGE)
            if self._loop_done:
                raise ClientClosedError("the SyncClient's background thread has stopped")
            self._unfinished.add(call)
            self._incoming.append(call)
        self._wake_loop()
        try:
            result: T = call.future.result()
        except BaseException:
            self._abandon(call)
            raise
        return result

    def _require_client(self) -> Client:
        """The async client, opening the SyncClient first if nothing has yet
        (never called from the background thread before it is open).

        Raises:
            NotSentError: it was not open and no server could be reached (the
                :meth:`open` error, its ``__cause__``): the call that wanted it was
                not sent. Before, a publish of a client whose server was down from
                the start raised a plain ConnectionLostError ("outcome unknown").
            ClientClosedError, RemoteProtocolError: as :meth:`open`.
        """
        self._check_process()
        if self._closed:
            raise ClientClosedError(CLOSED_MESSAGE)
        if self._client is None:
            try:
                self.open()
            except NotSentError:
                raise
            except ConnectionLostError as exc:
                raise NotSentError(f"{exc}; the call was not sent") from exc
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

    def publish_batch(
        self,
        items: Sequence[PublishItem],
        *,
        duplicates: list[int] | None = None,
        stored: dict[int, int] | None = None,
    ) -> list[int]:
        """Publish many messages; ids in order (see ``Client.publish_batch``).

        Args:
            items: The messages, in order.
            duplicates: If given, gets the positions (in ``items``) of items whose
                ``idempotency_key`` named an earlier message, in order.
            stored: If given, gets ``{position in items: message id}`` for every item
                stored, **also when this raises**: a batch of several frames, or one
                spanning the shards of a sharded node, may be stored in part (one
                shard stores its part while another refuses or cannot be reached),
                and the caller resends only the items missing from it. Before, a
                ``SyncClient`` could not pass it, so after such an error it could not
                tell which items were stored.

        Raises:
            As ``Client.publish_batch``.
        """
        client = self._require_client()

        async def call() -> list[int]:
            return await client.publish_batch(items, duplicates=duplicates, stored=stored)

        return self._run(call)

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
            count: Most deliveries to return (an int >= 1).
            timeout_s: Stop early once no delivery arrived for this long (finite
                seconds, 0 .. 86,400; 0 returns what has already arrived).
            prefetch: Ignored (kept for compatibility): the credit is what the call
                still wants. If given, an int >= 1.

        Returns:
            0 to ``count`` deliveries, and no more than the server's
            ``limits.max_prefetch`` less those of the subscription still unsettled
            (the server has no more out to one subscription: reaching that, the call
            returns at once; settle some and call again for more). Unsettled ones
            come back after the group's visibility timeout (settle or ``extend()``
            them before), or when the client closes.

        Raises:
            ValueError: ``count``, ``timeout_s`` or ``prefetch`` out of range.
            RequestError, ConnectionLostError: as ``Client.subscribe``.
            ClientClosedError: the client was closed, before or during the call.
        """
        _checks.check_count("count", count, max_count=_checks.MAX_CREDIT)
        _checks.check_seconds("timeout_s", timeout_s, allow_zero=True)
        if prefetch is not None:
            _checks.check_count("prefetch", prefetch, max_count=_checks.MAX_CREDIT)
        deliveries = self._run(self._consume, topic, group, count, timeout_s)
        return [SyncDelivery(delivery, self) for delivery in deliveries]

    async def _consume(
        self, topic: str, group: str, count: int, timeout_s: float
    ) -> list[Delivery]:
        client = self._require_client()
        sub = self._subscriptions.get((topic, group))
        if sub is None or sub.closed:
            if self._open_send is None:
                raise ClientClosedError(CLOSED_MESSAGE)
            # The SUBSCRIBE's window is the count, cut to the server's limits.max_prefetch
            # where the server names it (protocol version 5); an older server that
            # refuses it gets a window of 1, which every server takes
            # (ConsumingClient._subscribe_on_live). Found by a tester: a first
            # consume(count=500) on a server with max_prefetch 100 was refused with
            # "prefetch must be between 1 and 100, got 500", a prefetch never given.
            request = _OpenRequest(topic, group, count)
            try:
                await self._open_send.send(request)
            except trio.ClosedResourceError:
                raise ClientClosedError(CLOSED_MESSAGE) from None
            with trio.fail_after(client.request_timeout_s + STARTUP_EXTRA_S):
                await request.done.wait()
            if request.error is not None:
                raise request.error
            if request.subscription is None:
                raise ClientClosedError(CLOSED_MESSAGE)
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
    ) -> frames.GroupCreated | None:
        """Create a consumer group; what the server did (see ``Client.create_group``)."""
        client = self._require_client()

        async def call() -> frames.GroupCreated | None:
            return await client.create_group(
                topic,
                group,
                visibility_timeout_ms=visibility_timeout_ms,
                max_deliveries=max_deliveries,
                from_backlog=from_backlog,
                dead_letter_expired=dead_letter_expired,
            )

        return self._run(call)

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
