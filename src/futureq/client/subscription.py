"""Subscriptions and deliveries: what a consumer iterates, acks and nacks.

A :class:`Subscription` is an async iterator of :class:`Delivery` objects. It keeps
the server's push window at ``prefetch``: the server never has more unsettled
deliveries outstanding than the credit granted, and the subscription grants one
credit back (a CREDIT frame) for each delivery acked or nacked. A delivery the
application keeps without settling it therefore holds one slot of the window until
its visibility timeout passes. Source: ``docs/protocol.md``, "SUBSCRIBE", "DELIVER",
"CREDIT", and ``DESIGN.md``, "Message semantics" (credit-based flow control).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import TYPE_CHECKING

import attrs
import trio

from futureq.errors import ErrorCode, RemoteProtocolError

if TYPE_CHECKING:
    from futureq.client.client import Client
    from futureq.wire import frames


@attrs.define(eq=False, repr=False)
class Delivery:
    """One push of one message to this consumer.

    Attributes:
        id: Message id (unique, increasing, assigned by the cluster).
        topic: The topic it was published to.
        group: The consumer group it is delivered to.
        payload: The message body, exactly as published (bytes).
        due_ms: When it fell due (ms since the Unix epoch).
        publish_ms: When the leader stored it (ms since the Unix epoch).
        attempt: 1 for the first delivery to this group, 2 after a nack or an
            expired visibility timeout, and so on.
        delivered_ms: The server's wall clock when it pushed this delivery (ms).
        tag: Opaque delivery tag the server knows this delivery by.
    """

    id: int
    topic: str
    group: str
    payload: bytes
    due_ms: int
    publish_ms: int
    attempt: int
    delivered_ms: int
    tag: bytes
    _subscription: Subscription
    _epoch: int
    _settled: bool = False

    def __repr__(self) -> str:
        return (
            f"Delivery(id={self.id}, topic={self.topic!r}, group={self.group!r}, "
            f"attempt={self.attempt}, payload_bytes={len(self.payload)})"
        )

    @property
    def settled(self) -> bool:
        """True once :meth:`ack` or :meth:`nack` was called for this delivery."""
        return self._settled

    async def ack(self) -> None:
        """Acknowledge: the message is done for this group (durable when this returns).

        Raises:
            ConnectionLostError: the delivery came on a connection that has since been
                lost (the broker will deliver it again), or the connection broke before
                the server answered (the ack may or may not have been applied).
            RequestError: the server refused the tag (e.g. UNKNOWN_DELIVERY_TAG after
                the visibility timeout passed and the message went to another consumer).
        """
        await self._subscription.ack([self])

    async def nack(self, requeue_delay_ms: int = 0) -> None:
        """Refuse: deliver this message again after ``requeue_delay_ms`` (ms, >= 0).

        Raises:
            Same as :meth:`ack`.
        """
        await self._subscription.nack([self], requeue_delay_ms=requeue_delay_ms)


class Subscription:
    """Deliveries of one (topic, consumer group) to this client.

    Obtain one with ``async with client.subscribe(topic, group) as sub``; iterate it
    with ``async for delivery in sub``. Iteration waits as long as it takes for the
    next delivery (wrap it in ``trio.move_on_after`` to bound the wait) and survives
    reconnects: after the client reconnects, the subscription subscribes again on the
    new connection the next time it is iterated.

    Attributes:
        topic: Topic name.
        group: Consumer group name.
        prefetch: Most deliveries the server may have outstanding to this
            subscription without an ack or nack (items).
    """

    def __init__(self, client: Client, topic: str, group: str, prefetch: int) -> None:
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        self.topic = topic
        self.group = group
        self.prefetch = prefetch
        self._client = client
        self._buffer: collections.deque[Delivery] = collections.deque()
        self._wakeup = trio.Event()
        self._lock = trio.Lock()
        # Epoch of the connection the server-side subscription lives on; 0 = none.
        self.epoch = 0
        self.subscription_id: int | None = None
        self._credit = 0
        self._closed = False
        self._paused = False

    def __repr__(self) -> str:
        return (
            f"Subscription(topic={self.topic!r}, group={self.group!r}, "
            f"prefetch={self.prefetch}, buffered={len(self._buffer)})"
        )

    # -- called by the client (synchronously, from the reader task) ----------------

    def _bind(self, epoch: int, subscription_id: int) -> None:
        """The server accepted SUBSCRIBE on connection ``epoch``."""
        self.epoch = epoch
        self.subscription_id = subscription_id
        self._credit = self.prefetch
        self._wake()

    def _receive(self, epoch: int, frame: frames.Deliver) -> None:
        """Buffer a DELIVER frame's deliveries.

        Raises:
            RemoteProtocolError: the server pushed more than the credit granted; the
                caller closes the connection.
        """
        if epoch != self.epoch or self._closed:
            return
        self._credit -= len(frame.deliveries)
        if self._credit < 0:
            raise RemoteProtocolError(
                ErrorCode.INVALID_FRAME,
                f"server pushed {-self._credit} deliveries beyond the credit granted "
                f"to subscription {self.subscription_id}",
            )
        for tag, message_id, payload, due_ms, publish_ms, attempt in frame.deliveries:
            self._buffer.append(
                Delivery(
                    message_id,
                    self.topic,
                    self.group,
                    payload,
                    due_ms,
                    publish_ms,
                    attempt,
                    frame.delivered_ms,
                    tag,
                    self,
                    epoch,
                )
            )
        self._wake()

    def _connection_lost(self, epoch: int) -> None:
        """Connection ``epoch`` died: its buffered deliveries are void."""
        if epoch == self.epoch:
            self._buffer.clear()
            self.subscription_id = None
            self._credit = 0
        self._wake()

    def _wake(self) -> None:
        self._wakeup.set()
        self._wakeup = trio.Event()

    def _grant(self, settled: int) -> int:
        """Count ``settled`` deliveries of the live epoch; return the credit to send."""
        if self._paused:
            return 0
        self._credit += settled
        return settled

    # -- public API ----------------------------------------------------------------

    def pause(self) -> None:
        """Stop asking for more deliveries: later acks and nacks grant no credit.

        Call it before settling the last deliveries when you are about to leave the
        ``subscribe`` block, so the server does not push messages you will not read
        (they would go back to the group, counted as an attempt). Deliveries already
        pushed still arrive. A reconnect subscribes again with a full window.
        """
        self._paused = True

    @property
    def closed(self) -> bool:
        """True once the ``subscribe`` block was left."""
        return self._closed

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Delivery:
        """Wait for the next delivery.

        Raises:
            StopAsyncIteration: the subscription was closed.
            ClientClosedError: the client was closed.
            RequestError: re-subscribing after a reconnect was refused (e.g. the
                group was deleted and the topic name is invalid).
        """
        while True:
            if self._closed:
                raise StopAsyncIteration
            wakeup = self._wakeup
            live_epoch = self._client._live_epoch()
            while self._buffer:
                delivery = self._buffer.popleft()
                if delivery._epoch == live_epoch:
                    return delivery
            if self.epoch != live_epoch or self.subscription_id is None:
                await self._client._resubscribe(self)
                continue
            await wakeup.wait()

    async def receive(self, timeout_s: float) -> Delivery | None:
        """Wait up to ``timeout_s`` seconds for the next delivery; None if none came.

        Raises:
            Same as iteration, and StopAsyncIteration is returned as None.
        """
        with trio.move_on_after(timeout_s):
            try:
                return await self.__anext__()
            except StopAsyncIteration:
                return None
        return None

    async def ack(self, deliveries: Iterable[Delivery]) -> None:
        """Acknowledge many deliveries in as few ACK frames as possible.

        Deliveries that came on a lost connection are not sent (their tags mean
        nothing to the new connection); the others are acked first, then
        :class:`ConnectionLostError` names the void ones.

        Raises:
            ConnectionLostError, RequestError: as :meth:`Delivery.ack`.
            ClientClosedError: the client was closed.
        """
        await self._client._settle(self, list(deliveries), None)

    async def nack(self, deliveries: Iterable[Delivery], requeue_delay_ms: int = 0) -> None:
        """Refuse many deliveries; each comes back after ``requeue_delay_ms`` (ms, >= 0).

        Raises:
            ValueError: ``requeue_delay_ms`` < 0.
            ConnectionLostError, RequestError, ClientClosedError: as :meth:`ack`.
        """
        if requeue_delay_ms < 0:
            raise ValueError(f"requeue_delay_ms must be >= 0, got {requeue_delay_ms}")
        await self._client._settle(self, list(deliveries), requeue_delay_ms)

    def _close(self) -> None:
        self._closed = True
        self._buffer.clear()
        self._wake()


__all__ = ["Delivery", "Subscription"]
