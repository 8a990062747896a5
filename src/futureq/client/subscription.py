"""Subscriptions and deliveries: what a consumer iterates, acks, nacks, extends, releases.

A :class:`Subscription` is an async iterator of :class:`Delivery` objects. Flow control
(``docs/protocol.md``, "Flow control") is counted the same way at both ends:

* the server pushes a delivery only against credit; SUBSCRIBE grants ``prefetch``;
* a delivery the application settles (ack, nack, release) gets its credit back from
  the client, in a CREDIT frame sent once the server confirmed the settlement (never
  before: a refused ack settles nothing, so it frees no credit);
* a delivery the server takes back (its visibility timeout passed: a REVOKE frame)
  gets its credit back from the server, and the client drops it: if it was still
  buffered it is never handed out, if it was handed out its ack would be refused.

So the server never has more than ``prefetch`` deliveries outstanding to a
subscription, and a consumer whose deliveries time out does not stall.

Deliveries the application holds when the leader hands over (HANDOVER) are out by
their tags on no subscription, so the client counts them: the next SUBSCRIBE's window
leaves room for those still live, and each gives one credit back once settled, void or
past the deadline the client keeps for it (:meth:`Subscription._orphans_changed`). The
application never holds more than ``prefetch`` unsettled deliveries of a subscription.

Leases: deliveries buffered here and not yet handed to the application have their
visibility extended (EXTEND) by the client's lease keeper, at half the group's
visibility timeout, for up to ``max_lease_s`` after they arrived, then released (not
counted towards ``max_deliveries``). Deliveries handed
out are the application's: settle them within the visibility timeout, or call
:meth:`Delivery.extend`.

A subscription in *pull* mode (the synchronous client's ``consume``) gets no credit
back automatically: :meth:`Subscription.fetch` asks for exactly what it still
wants, and what arrives when nobody fetches is released at once (not counted towards
``max_deliveries``). Source: ``docs/client.md``, "Consuming".
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Iterable
from typing import TYPE_CHECKING

import anyio
import attrs

from futureq.client import _checks
from futureq.errors import (
    ConnectionLostError,
    ErrorCode,
    FutureQError,
    NotSentError,
    RemoteProtocolError,
    RequestError,
    SubscriptionEndedError,
)
from futureq.wire import frames

if TYPE_CHECKING:
    from futureq.client._connection import Connection
    from futureq.client._consuming import ConsumingClient

LOST_REASON = "the connection it came on was lost; the broker delivers it again"
LEADER_LOST_REASON = (
    "the node it came from is no longer the leader (its tags died with its leadership); "
    "the new leader delivers it again"
)
LEASE_REFRESH_FRACTION = 0.5
"""A buffered delivery's lease is extended once this fraction of the visibility
timeout has passed since it arrived (or was last extended)."""


class DeliveryState(enum.Enum):
    """Where a delivery stands, as far as this client knows."""

    HELD = "held"
    """Delivered, not settled: ack, nack, extend or release it."""
    SETTLED = "settled"
    """Acked, nacked or released, and the server confirmed it."""
    VOID = "void"
    """Its tag is dead: the server took it back (visibility timeout), its connection
    was lost, or its subscription ended. The broker delivers it again."""


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
        attempt: 1 for the first delivery to this group, then one more for every
            delivery after it (a nack, a visibility timeout, a consumer that left, a
            leader change, a release); it never goes backwards. ``max_deliveries``
            counts only the attempts not ended by a release (``docs/client.md``).
        delivered_ms: The leader's cluster time when it pushed this delivery (ms since
            the Unix epoch), the clock of ``due_ms`` and ``publish_ms``.
        tag: Opaque delivery tag the server knows this delivery by.
        headers: The message's headers (str -> str; empty when it has none). A dead
            letter's provenance is here (``futureq-original-id``, ``futureq-reason``, ...).
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
    _received_s: float = 0.0
    _refresh_s: float = 0.0
    _state: DeliveryState = DeliveryState.HELD
    _void_reason: str = ""
    _void_kind: str = ""
    _void_code: ErrorCode = ErrorCode.UNKNOWN_DELIVERY_TAG
    _settled_as: str = ""
    """How it was settled once SETTLED: ``ack``, ``nack`` or ``release``."""
    _handed_over: bool = attrs.field(default=False, init=False)
    """Held by the application when its leader handed over (HANDOVER): the leader
    named it handed, and every later leader keeps it out and settles it by its tag
    until its visibility deadline. So it outlives its connection: a settlement goes to
    whichever node leads (``docs/protocol.md``, "Delivery tags across leaders")."""
    _settle_unknown: bool = attrs.field(default=False, init=False)
    """A settle or extend call of it was sent and may have taken effect without its
    answer coming (a lost connection, TIMEOUT): settling it once it is void then
    raises a plain ConnectionLostError (outcome unknown), not NotSentError."""
    _deadline_s: float | None = attrs.field(default=None, init=False)
    """When the server's visibility deadline has passed for sure (anyio time, s), as
    the client tracks it for a handed-over delivery: set by an EXTEND the server
    confirmed (its answer's arrival plus the ``visibility_ms`` asked), else at the
    HANDOVER to its arrival plus the group's visibility timeout. Never earlier than
    the server's: the server stamps its deadline before the client sees either."""
    _follow_leader: bool = attrs.field(default=False, init=False)
    """A settle or extend call of it was answered NOT_LEADER: the call sends it again
    to the node that leads now."""
    headers: dict[str, str] = attrs.Factory(dict)
    _under_way: anyio.Event | None = attrs.field(default=None, init=False)
    """Set while a settle or extend call has it on the wire; another call waits for
    it (``futureq.client._consuming``), else the server refuses the tag the second
    time and the refusal voided a delivery the first call settled."""

    def __repr__(self) -> str:
        return (
            f"Delivery(id={self.id}, topic={self.topic!r}, group={self.group!r}, "
            f"attempt={self.attempt}, payload_bytes={len(self.payload)}, "
            f"state={self._state.value})"
        )

    @property
    def settled(self) -> bool:
        """True once an ack, nack or release of it was confirmed by the server."""
        return self._state is DeliveryState.SETTLED

    @property
    def state(self) -> DeliveryState:
        """Held, settled, or void (see :class:`DeliveryState`)."""
        return self._state

    def _void(
        self,
        reason: str,
        kind: str = "revoked",
        code: ErrorCode = ErrorCode.UNKNOWN_DELIVERY_TAG,
    ) -> None:
        """Mark it void; ``kind``: ``revoked``, ``lost`` (connection), ``ended``, or
        ``refused`` (the server refused its tag in a settle or extend call of ours);
        ``code``: what settling it raises (DELIVERY_CANCELLED for a cancelled one)."""
        if self._state is DeliveryState.HELD:
            self._state = DeliveryState.VOID
            self._void_reason = reason
            self._void_kind = kind
            self._void_code = code
            if self._handed_over:
                # No longer held by the application: its room in the window is free.
                self._subscription._orphans_changed()

    async def ack(self) -> None:
        """Acknowledge: the message is done for this group (durable when this returns).

        Acking a delivery again once the server confirmed its ack does nothing (so an
        ack may be retried); every other settle call on a settled delivery raises.

        Raises:
            ConnectionLostError: the delivery came on a connection that has since been
                lost (the broker will deliver it again), or the connection broke before
                the server answered (the ack may or may not have been applied).
            RequestError: UNKNOWN_DELIVERY_TAG: the server took it back (its visibility
                timeout passed; see :meth:`extend`) and delivers it again;
                DELIVERY_CANCELLED: its message was cancelled (CANCEL or PURGE) while
                it was out: do not process it, it is not delivered again;
                UNKNOWN_DELIVERY_TAG also, before anything is sent, when it is already
                SETTLED: an ack of a nacked or released delivery, and (for the other
                calls) a nack, release or extend of any settled one; the sentence
                names the delivery and how it was settled.
            SubscriptionEndedError: its subscription was ended by the server.
        """
        await self._subscription.ack([self])

    async def nack(
        self, requeue_delay_ms: int = 0, *, reason: str | None = None, dead_letter: bool = False
    ) -> None:
        """Refuse: deliver this message again after ``requeue_delay_ms`` (ms, >= 0).

        It counts as an attempt (``max_deliveries``). ``reason``: a short text kept with
        it (at most 256 bytes), shown in its dead letter's ``futureq-reason-text``.
        ``dead_letter``: send it to the dead-letter topic now (reason ``rejected``)
        instead of delivering it again.

        Raises:
            Same as :meth:`ack`; TypeError for a ``requeue_delay_ms`` that is not an
            int, ValueError for a negative one.
        """
        await self._subscription.nack(
            [self], requeue_delay_ms=requeue_delay_ms, reason=reason, dead_letter=dead_letter
        )

    async def release(self) -> None:
        """Give it back unprocessed: due again at once, not counted towards
        ``max_deliveries`` (the next delivery's ``attempt`` is still one higher).

        Raises:
            Same as :meth:`ack`.
        """
        await self._subscription.release([self])

    async def extend(self, visibility_ms: int | None = None) -> None:
        """Keep working on it: it is visible again ``visibility_ms`` after now.

        Like SQS ChangeMessageVisibility or Pub/Sub modifyAckDeadline. Call it again
        before that passes if the work takes longer still.

        Args:
            visibility_ms: New visibility from now (ms, 1 .. 12 h; the server refuses
                1 .. 99 as seconds taken for milliseconds, IMPLAUSIBLE_TIME); None: the
                group's visibility timeout.

        Raises:
            Same as :meth:`ack`; TypeError for a ``visibility_ms`` that is not an int,
            ValueError for one outside 1 .. 12 h.
        """
        await self._subscription.extend([self], visibility_ms)


class Subscription:
    """Deliveries of one (topic, consumer group) to this client.

    Obtain one with ``async with client.subscribe(topic, group) as sub``; iterate it
    with ``async for delivery in sub``. Iteration waits as long as it takes for the
    next delivery (wrap it in ``anyio.move_on_after`` to bound the wait) and survives
    reconnects: after the client reconnects, the subscription subscribes again on the
    new connection the next time it is iterated. If the server ends the subscription
    (its group was deleted), iteration raises :class:`SubscriptionEndedError`.

    Attributes:
        topic: Topic name.
        group: Consumer group name.
        prefetch: Most deliveries the server may have outstanding to this
            subscription without a settlement (items), as asked; :attr:`window` is
            what the server took (less where its ``limits.max_prefetch`` is lower).
        visibility_timeout_ms: The group's visibility timeout (ms), once the server
            told it (SUBSCRIPTION_INFO); None before.
        max_deliveries: The group's counted attempts before dead-lettering, or None.
        end: Why the server ended the subscription, or None while it runs.
    """

    def __init__(
        self, client: ConsumingClient, topic: str, group: str, prefetch: int, *, pull: bool = False
    ) -> None:
        _checks.check_count("prefetch", prefetch, max_count=_checks.MAX_CREDIT)
        self.topic = topic
        self.group = group
        self.prefetch = prefetch
        self.visibility_timeout_ms: int | None = None
        self.max_deliveries: int | None = None
        self.end: SubscriptionEndedError | None = None
        self._client = client
        self._pull = pull
        self._buffer: collections.deque[Delivery] = collections.deque()
        self._handed: dict[bytes, Delivery] = {}
        self._fetched: list[Delivery] = []
        """Pull mode: taken by the fetch in progress and not yet returned to the
        application, so not handed: a HANDOVER, a lost connection or a revoke voids
        them and the fetch leaves them out."""
        self._wakeup = anyio.Event()
        self._lock = anyio.Lock()
        # Epoch of the connection the server-side subscription lives on; 0 = none.
        self.epoch = 0
        self.subscription_id: int | None = None
        self._credit = 0  # the server's credit for us, as far as we can tell
        self._window = 0
        """The window (SUBSCRIBE ``prefetch``) the server took for the bound
        subscription: credit within it is never cut, even by a server older than
        protocol version 5 (which cut credit held past its ``limits.max_prefetch``)."""
        self._outstanding = 0  # pushed to us and not settled, revoked or voided
        self._closed = False
        self._paused = False
        self._fetching = 0  # pull mode: deliveries a fetch() still wants
        self.to_release: list[Delivery] = []
        """Pull mode: arrived while nobody fetched; the lease keeper releases them."""
        self._orphaned: set[bytes] = set()
        """Tags handed to the application under a subscription a HANDOVER ended and
        still counted against the window: held (settleable by their tags on whichever
        node leads) and not past their deadline (:attr:`Delivery._deadline_s`). The
        application holds them, so the next subscription's window leaves room for them
        and each one that stops being live gives its room back (:meth:`_orphans_changed`;
        ``docs/client.md``, "Leader handover")."""
        self._withheld = 0
        """Of the live handed-over deliveries, how many the bound subscription's window
        left room for and has not had back as CREDIT yet."""
        self._leaving: tuple[int, anyio.Event] | None = None
        """(connection epoch, set once answered) of the UNSUBSCRIBE that answered a
        HANDOVER: subscribing again on that connection waits for it."""

    def __repr__(self) -> str:
        return (
            f"Subscription(topic={self.topic!r}, group={self.group!r}, "
            f"prefetch={self.prefetch}, buffered={len(self._buffer)})"
        )

    # -- called by the client (synchronously, from the reader task) ----------------

    def _bind(
        self,
        epoch: int,
        subscription_id: int,
        credit: int,
        withheld: int = 0,
        conn: Connection | None = None,
    ) -> None:
        """The server accepted SUBSCRIBE on connection ``epoch`` (``conn``) with
        ``credit``, a window that left room for ``withheld`` handed-over deliveries
        (those no longer live since it was asked for give their room back now, as
        CREDIT)."""
        self.epoch = epoch
        self.subscription_id = subscription_id
        self._credit = credit
        self._window = credit
        self._outstanding = 0
        self._withheld = withheld
        self._orphans_changed(conn)
        if self._pull:
            # The SUBSCRIBE's credit is what the (first) fetch wants: what it brings
            # before that fetch starts waiting is kept for it, not released.
            self._fetching = max(self._fetching, credit)
        self._wake()

    def _receive(self, epoch: int, frame: frames.Deliver) -> None:
        """Buffer a DELIVER frame's deliveries.

        Raises:
            RemoteProtocolError: the server pushed more than the credit granted; the
                caller closes the connection.
        """
        if epoch != self.epoch or self._closed:
            return
        count = len(frame.deliveries)
        self._credit -= count
        self._outstanding += count
        if self._credit < 0:
            raise RemoteProtocolError(
                ErrorCode.INVALID_FRAME,
                f"server pushed {-self._credit} deliveries beyond the credit granted "
                f"to subscription {self.subscription_id}",
            )
        now = anyio.current_time()
        refresh = self._refresh_after_s()
        for item in frame.deliveries:
            tag, message_id, payload, due_ms, publish_ms, attempt = item[:6]
            delivery = Delivery(
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
                now,
                now + refresh,
                headers=dict(item[6] or {}) if len(item) > 6 else {},
            )
            if self._pull and self._fetching <= len(self._buffer):
                self.to_release.append(delivery)  # nobody wants it: give it back
            else:
                self._buffer.append(delivery)
        if self.to_release:
            self._client._lease_changed()
        self._wake()
        self._client._lease_changed()

    def _revoke(
        self, epoch: int, tags: list[bytes], reason: int = frames.RevokeReason.VISIBILITY_TIMEOUT
    ) -> None:
        """The server took deliveries back (REVOKE) and returned their credit itself.

        ``reason``: a :class:`~futureq.wire.frames.RevokeReason` number (one this
        client does not know counts as REMOVED)."""
        if epoch != self.epoch:
            return
        taken = set(tags)
        self._credit += len(taken)
        code = ErrorCode.UNKNOWN_DELIVERY_TAG
        if reason == frames.RevokeReason.VISIBILITY_TIMEOUT:
            why = (
                "its visibility timeout passed before it was settled; the server "
                "delivers it again (extend() keeps it longer)"
            )
        elif reason == frames.RevokeReason.CANCELLED:
            code = ErrorCode.DELIVERY_CANCELLED
            why = (
                "its message was cancelled (CANCEL or PURGE) while it was out; do not "
                "process it: it is not delivered again"
            )
        else:
            why = "a command removed its message from the group (it expired or moved)"
        kept: collections.deque[Delivery] = collections.deque()
        for delivery in self._buffer:
            if delivery.tag in taken:
                delivery._void(f"the server took it back: {why}", code=code)
            else:
                kept.append(delivery)
        self._buffer = kept
        for tag in taken:
            handed = self._handed.pop(tag, None)
            if handed is not None:
                handed._void(why, code=code)
        for delivery in self._fetched:
            if delivery.tag in taken:
                delivery._void(f"the server took it back: {why}", code=code)
        self.to_release = [d for d in self.to_release if d.tag not in taken]
        self._outstanding -= len(taken)

    def _info(self, epoch: int, visibility_timeout_ms: int, max_deliveries: int) -> None:
        """The group's settings (SUBSCRIPTION_INFO)."""
        if epoch != self.epoch:
            return
        self.visibility_timeout_ms = visibility_timeout_ms
        self.max_deliveries = max_deliveries
        refresh = self._refresh_after_s()
        now = anyio.current_time()
        for delivery in self._buffer:
            delivery._refresh_s = min(delivery._refresh_s, now + refresh)
        self._client._lease_changed()

    def _ended(self, epoch: int, error: SubscriptionEndedError) -> None:
        """The server ended the subscription (SUBSCRIPTION_END)."""
        if epoch != self.epoch:
            return
        self.end = error
        self._void_all(f"its subscription ended: {error.reason}", "ended")
        self.subscription_id = None
        self._wake()

    def _handed_over(self, epoch: int) -> None:
        """The leader handing over ended the subscription (HANDOVER, answered by the
        client with UNSUBSCRIBE): the deliveries not handed to the application are
        void (they come again, uncounted); the handed ones stay the application's; the
        next iteration subscribes again."""
        if epoch != self.epoch:
            return
        reason = (
            "the leader handed leadership over before it was handed to you; it is "
            "delivered again, its attempt not counted"
        )
        # A fetch in progress has not returned what it took: not handed either (found
        # by a tester: SyncClient.consume waiting for more during a rolling restart
        # returned deliveries it had named as handed, whose acks then failed, and with
        # max_deliveries 1 all went to the dead-letter topic).
        for delivery in (*self._buffer, *self.to_release, *self._fetched):
            delivery._void(reason, "ended")
        self._buffer.clear()
        self.to_release = []
        # The application still holds the handed ones (and those of an earlier
        # handover it has not settled): the next subscription's window leaves room for
        # each until it is settled, void or past its deadline. Before, it subscribed
        # with the whole window, and the application held up to twice ``prefetch``
        # unsettled (found by a tester).
        now = anyio.current_time()
        for handed in self._handed.values():
            if handed._state is not DeliveryState.HELD:
                continue
            if handed._deadline_s is None:
                # Not told the group's timeout (SUBSCRIPTION_INFO comes right after
                # SUBSCRIBE_OK, so hardly ever): the longest any group or EXTEND has.
                visibility_ms = self.visibility_timeout_ms or _checks.MAX_VISIBILITY_MS
                handed._deadline_s = handed._received_s + visibility_ms / 1000
            if not handed._handed_over and handed._deadline_s > now:
                self._orphaned.add(handed.tag)
            handed._handed_over = True
        self.subscription_id = None
        self._credit = 0
        self._outstanding = 0
        self._withheld = 0
        self._orphans_changed()
        self._client._lease_changed()
        self._wake()

    def _connection_lost(self, epoch: int) -> None:
        """Connection ``epoch`` died: its deliveries are void, but those the
        application held when the leader handed over (still settleable by their tags on
        the next leader)."""
        if epoch == self.epoch:
            self._void_all(LOST_REASON, "lost", keep_handed_over=True)
            self.subscription_id = None
            self._credit = 0
        self._wake()

    def _void_all(self, reason: str, kind: str, *, keep_handed_over: bool = False) -> None:
        kept = (
            {tag: d for tag, d in self._handed.items() if d._handed_over}
            if keep_handed_over
            else {}
        )
        for delivery in (
            *self._buffer,
            *self._handed.values(),
            *self.to_release,
            *self._fetched,
        ):
            if delivery.tag not in kept:
                delivery._void(reason, kind)
        self._buffer.clear()
        self._handed = kept
        self._orphaned.intersection_update(kept)
        self.to_release = []
        self._outstanding = 0

    def _wake(self) -> None:
        self._wakeup.set()
        self._wakeup = anyio.Event()

    def _refresh_after_s(self) -> float:
        if self.visibility_timeout_ms is None:
            return float("inf")
        return self.visibility_timeout_ms * LEASE_REFRESH_FRACTION / 1000

    def _settled(self, conn: Connection, deliveries: list[Delivery], how: str) -> None:
        """The server confirmed a settlement (``how``: ``ack``, ``nack`` or
        ``release``): give the credit back (window mode).

        Runs from the reader (``on_answer``), so it happens even when the caller of
        ack/nack/release was cancelled meanwhile.
        """
        # A delivery voided because the server refused its tag in a call of ours counts
        # too: the refusal came while an earlier call of ours was settling it (one that
        # timed out, whose ACK was then sent again), and this is that call's late
        # confirmation. The server settled it and returned no credit for it (nothing
        # being settled is revoked), so it is ours to give back: before, the window
        # shrank by one for good (found by a tester).
        fresh = [
            d
            for d in deliveries
            if d._state is DeliveryState.HELD
            or (d._state is DeliveryState.VOID and d._void_kind == "refused")
        ]
        for delivery in fresh:
            delivery._state = DeliveryState.SETTLED
            delivery._settled_as = how
            self._handed.pop(delivery.tag, None)
        if any(d._handed_over for d in fresh):
            # Settled deliveries of a subscription a HANDOVER ended are not the bound
            # subscription's outstanding ones: the room its window left for them comes
            # back (once per delivery, there).
            fresh = [d for d in fresh if not d._handed_over]
            self._orphans_changed()
        if not fresh or conn.epoch != self.epoch or self.subscription_id is None:
            return
        self._outstanding -= len(fresh)
        if self._pull or self._paused or self._closed:
            return
        from futureq.wire import frames  # noqa: PLC0415 - wire is light; avoids a cycle

        self._credit += len(fresh)
        conn.send_control(frames.Credit(0, self.subscription_id, len(fresh)))

    def _most_credit(self, conn: Connection | None) -> int:
        """The most credit a pull fetch may hold on ``conn`` (items; may be <= 0).

        A server naming its ``limits.max_prefetch`` (protocol version 5) has at most
        that many deliveries out to the subscription, so credit past the limit less
        those unsettled would only bring deliveries after the fetch returned. One that
        does not name it cut credit held past it without a word (found by a tester:
        a fetch of 500 on a node with ``max_prefetch`` 100 believed 400 credits out
        that the server had dropped, and every later fetch received nothing): only the
        window it took for the subscription is sure to be kept.
        """
        if conn is not None and conn.max_prefetch is not None:
            # Handed-over deliveries the application still holds count too: the server
            # counts them no more against this subscription.
            return conn.max_prefetch - self._outstanding - len(self._live_orphans())
        return self._window

    def _live_orphans(self) -> list[Delivery]:
        """The handed-over deliveries still counted against the window: held, and not
        past the deadline the client tracks for them (:attr:`_orphaned`)."""
        now = anyio.current_time()
        live: list[Delivery] = []
        for tag in self._orphaned:
            delivery = self._handed.get(tag)
            if (
                delivery is not None
                and delivery._state is DeliveryState.HELD
                and (delivery._deadline_s is None or delivery._deadline_s > now)
            ):
                live.append(delivery)
        return live

    def _next_orphan_deadline_s(self) -> float:
        """The earliest deadline of a live handed-over delivery (anyio time, s), or
        infinity when there is none."""
        return min(
            (d._deadline_s for d in self._live_orphans() if d._deadline_s is not None),
            default=float("inf"),
        )

    def _orphans_changed(self, conn: Connection | None = None) -> None:
        """Forget the handed-over deliveries no longer live (settled, void, past their
        deadline) and give their room back to the bound subscription: one credit each
        (CREDIT on ``conn``, else the live connection), exactly once, since a tag
        leaves :attr:`_orphaned` for good. Wakes whoever waits for room to subscribe.

        Called when one is settled or voided, by the lease keeper at a deadline, and
        when a subscription is bound (those that went while it was being asked for).
        """
        now = anyio.current_time()
        for tag in list(self._orphaned):
            delivery = self._handed.get(tag)
            if (
                delivery is not None
                and delivery._state is DeliveryState.HELD
                and delivery._deadline_s is not None
                and delivery._deadline_s <= now
            ):
                # Its deadline passed on the server too (it was stamped no later):
                # taken back there and due again, as a REVOKE says for any other.
                self._orphaned.discard(tag)
                delivery._void(
                    "its visibility timeout passed before it was settled (it was held "
                    "across a leader handover); the broker delivers it again",
                )
        live = {d.tag for d in self._live_orphans()}
        if live != self._orphaned:
            self._orphaned = live
            self._wake()
        back = self._withheld - len(live)
        if back <= 0:
            return
        if conn is None:
            conn = self._client._live_connection()
        if conn is None or conn.epoch != self.epoch or self.subscription_id is None:
            return  # not bound: the next SUBSCRIBE's window counts what is live then
        self._withheld = len(live)
        if self._pull or self._paused or self._closed:
            return  # pull: a fetch asks for what it wants (:meth:`_most_credit`)
        from futureq.wire import frames  # noqa: PLC0415

        self._credit += back
        conn.send_control(frames.Credit(0, self.subscription_id, back))

    def _room(self, limit: int | None) -> int:
        """How many deliveries a new SUBSCRIBE may ask for (items; <= 0: none yet):
        window mode, :attr:`prefetch` less the handed-over deliveries still live; pull
        mode, the server's ``limits.max_prefetch`` (``limit``, None when not named)
        less them."""
        if self._pull:
            return 1 if limit is None else limit - len(self._live_orphans())
        return self.prefetch - len(self._live_orphans())

    async def _wait_for_room(self, limit: int | None) -> None:
        """Wait until :meth:`_room` is >= 1, the subscription is closed or ended: a
        handed-over delivery settled, voided or past its deadline makes room."""
        self._orphans_changed()
        while self._room(limit) <= 0 and not self._closed and self.end is None:
            wakeup = self._wakeup
            with anyio.move_on_at(self._next_orphan_deadline_s()):
                await wakeup.wait()
            self._orphans_changed()

    def _hand_out(self, delivery: Delivery) -> Delivery:
        self._handed[delivery.tag] = delivery
        return delivery

    # -- public API ----------------------------------------------------------------

    def pause(self) -> None:
        """Stop asking for more deliveries: later settlements grant no credit.

        Call it before settling the last deliveries when you are about to leave the
        ``subscribe`` block, so the server does not push messages you will not read.
        Deliveries already pushed still arrive (and are released unprocessed when you
        leave, not counted towards ``max_deliveries``). A reconnect subscribes again with a
        full window.
        """
        self._paused = True

    @property
    def closed(self) -> bool:
        """True once the ``subscribe`` block was left."""
        return self._closed

    @property
    def window(self) -> int:
        """The window (items) the server took for the subscription when it last
        subscribed: :attr:`prefetch`, or less where the server's ``limits.max_prefetch``
        is lower (a server of protocol version 5 names it, and has no more than it out
        to one subscription); 0 before the first SUBSCRIBE was answered. After a leader
        handover it is less by the handed-over deliveries the application still held
        then; each of them gives its room back as CREDIT once settled, void or past its
        deadline, so the credit comes back to the whole window."""
        return self._window

    @property
    def buffered(self) -> int:
        """Deliveries received and not handed out yet (items)."""
        return len(self._buffer)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Delivery:
        """Wait for the next delivery.

        Raises:
            StopAsyncIteration: the subscription was closed.
            SubscriptionEndedError: the server ended it (its group was deleted).
            ClientClosedError: the client was closed.
            RequestError: re-subscribing after a reconnect was refused.
            ClientClosedError: also in a process forked from the one that opened the
                client (its deliveries are the parent's).
        """
        self._client._check_process()
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self.end is not None:
                raise self.end
            wakeup = self._wakeup
            live_epoch = self._client._live_epoch()
            while self._buffer:
                delivery = self._buffer.popleft()
                if delivery._epoch == live_epoch and delivery._state is DeliveryState.HELD:
                    return self._hand_out(delivery)
            if self.epoch != live_epoch or self.subscription_id is None:
                await self._client._resubscribe(self)
                continue
            await wakeup.wait()

    async def receive(self, timeout_s: float) -> Delivery | None:
        """Wait up to ``timeout_s`` seconds for the next delivery; None if none came.

        Raises:
            ValueError: ``timeout_s`` is not a finite number >= 0.
            Same as iteration, and StopAsyncIteration is returned as None.
        """
        _checks.check_seconds("timeout_s", timeout_s, allow_zero=True)
        with anyio.move_on_after(timeout_s):
            try:
                return await self.__anext__()
            except StopAsyncIteration:
                return None
        return None

    async def fetch(self, count: int, timeout_s: float) -> list[Delivery]:
        """Pull mode: receive up to ``count`` deliveries, holding nothing beyond them.

        Grants the server the credit still wanted and returns once ``count`` arrived,
        once the subscription holds the server's ``limits.max_prefetch`` deliveries
        unsettled (none comes until some are settled: a ``count`` above the limit
        returns at most the limit, without waiting for ``timeout_s``), or once none
        arrived for ``timeout_s`` seconds; deliveries that arrive after that are
        released at once (due again, not counted as an attempt).

        Credit out never passes what the server keeps: the server's
        ``limits.max_prefetch`` less the deliveries unsettled (protocol version 5
        names it in HELLO_OK). A server older than that does not name it and cut
        credit held past it without a word, so against one a fetch keeps at most the
        window the server took for the subscription out (``SyncClient.consume``'s
        first count, or 1 where that server refused it): slower, one round trip per
        window, but never waiting for credit the server dropped. What one connection has out is bounded too, by the server's
        ``limits.max_prefetch_per_connection``.

        Raises:
            ValueError: ``count`` < 1, ``timeout_s`` not a finite number >= 0, or
                the subscription is not in pull mode.
            Same as iteration otherwise.
        """
        if not self._pull:
            raise ValueError("fetch() needs a pull-mode subscription (the sync client's)")
        _checks.check_count("count", count, max_count=_checks.MAX_CREDIT)
        _checks.check_seconds("timeout_s", timeout_s, allow_zero=True)
        self._client._check_process()
        # Taken, not handed until returned (:attr:`_fetched`): what a HANDOVER, a lost
        # connection or a revoke voided meanwhile is left out; it comes again.
        out = self._fetched = []
        try:
            while True:
                out[:] = [d for d in out if d._state is DeliveryState.HELD]
                if len(out) >= count:
                    break
                if self._closed:
                    break
                if self.end is not None:
                    raise self.end
                live_epoch = self._client._live_epoch()
                if self.epoch != live_epoch or self.subscription_id is None:
                    conn = self._client._live_connection()
                    limit = None if conn is None else conn.max_prefetch
                    self._orphans_changed()
                    if self._room(limit) <= 0:
                        # The application holds the server's limit in handed-over
                        # deliveries: nothing may come until one of them is settled,
                        # void or past its deadline (as when it holds it unsettled).
                        if out:
                            break
                        end_s = anyio.current_time() + timeout_s
                        while (
                            self._room(limit) <= 0
                            and anyio.current_time() < end_s
                            and not self._closed
                            and self.end is None
                        ):
                            wakeup = self._wakeup
                            with anyio.move_on_at(min(end_s, self._next_orphan_deadline_s())):
                                await wakeup.wait()
                            self._orphans_changed()
                        if self._room(limit) <= 0:
                            break
                        continue
                    self._fetching = count - len(out)
                    # No larger window than the one the server took: the rest comes
                    # as CREDIT (a server refuses a SUBSCRIBE past its max_prefetch).
                    await self._client._resubscribe(self, min(count - len(out), self.prefetch))
                    continue
                while self._buffer and len(out) < count:
                    delivery = self._buffer.popleft()
                    if delivery._epoch == live_epoch and delivery._state is DeliveryState.HELD:
                        out.append(delivery)
                want = count - len(out)
                if want == 0:
                    break
                self._fetching = want
                conn = self._client._live_connection()
                most = self._most_credit(conn)
                if out and most <= 0 and conn is not None and conn.max_prefetch is not None:
                    break  # the server's limit is out: nothing comes until some settle
                need = min(want, most) - self._credit
                if need > 0 and conn is not None and self.subscription_id is not None:
                    from futureq.wire import frames  # noqa: PLC0415

                    self._credit += need
                    conn.send_control(frames.Credit(0, self.subscription_id, need))
                wakeup = self._wakeup
                with anyio.move_on_after(timeout_s) as idle:
                    await wakeup.wait()
                if idle.cancelled_caught and not self._buffer:
                    break
        except BaseException:
            # Cancelled (or failed) after taking some: the application never gets
            # them, so they are given back uncounted with what is buffered. Found by a
            # tester: a fetch cancelled while waiting for more left those it had taken
            # as handed, and leaving the block counted them (max_deliveries 1: to the
            # dead-letter topic unread).
            for delivery in reversed(out):
                if delivery._state is DeliveryState.HELD:
                    self._buffer.appendleft(delivery)
            raise
        finally:
            self._fetched = []
            self._fetching = 0
            if self._buffer:
                self.to_release.extend(self._buffer)
                self._buffer.clear()
                self._client._lease_changed()
        return [self._hand_out(d) for d in out if d._state is DeliveryState.HELD]

    async def ack(self, deliveries: Iterable[Delivery]) -> None:
        """Acknowledge many deliveries in as few ACK frames as possible.

        Deliveries that are void (taken back by the server, or from a lost connection)
        are not sent; the others are acked, then an error names the void ones. A
        delivery the server refuses is left out and the rest sent again. One already
        SETTLED is not sent either: done if it was acked, else named by the error
        (the same for :meth:`nack`, :meth:`release` and :meth:`extend`, where any
        settled one is named).

        Raises:
            ConnectionLostError: a delivery came on a lost connection, or the
                connection broke before the answer (outcome unknown).
            RequestError: UNKNOWN_DELIVERY_TAG naming the first delivery the server
                took back, or the first one already settled (nacked or released; the
                sentence says which), its ``item_index`` its position in
                ``deliveries``.
            SubscriptionEndedError: the subscription was ended by the server.
            ClientClosedError: the client was closed.
        """
        await self._client._settle(self, list(deliveries), "ack")

    async def nack(
        self,
        deliveries: Iterable[Delivery],
        requeue_delay_ms: int = 0,
        *,
        reason: str | None = None,
        dead_letter: bool = False,
    ) -> None:
        """Refuse many deliveries; each comes back after ``requeue_delay_ms`` (ms, >= 0),
        or goes to the dead-letter topic now with ``dead_letter`` (see
        :meth:`Delivery.nack` for ``reason``).

        Raises:
            TypeError: ``requeue_delay_ms`` is not an int (a bool, a float, a str),
                ``reason`` not a str or None, or ``dead_letter`` not a bool.
            ValueError: ``requeue_delay_ms`` < 0 or beyond 2**63-1.
            ConnectionLostError, RequestError, ClientClosedError: as :meth:`ack`.
        """
        # Checked here, not left to the server: a bool or float went out as a request
        # the server refused with a misleading RequestError, a str failed on ``<``.
        # The server's own limit (``limits.max_delay_ms``) is its to enforce; what
        # cannot be encoded at all (beyond int64) is refused here.
        _checks.check_int_ms("requeue_delay_ms", requeue_delay_ms, 0, _checks.INT64_MAX)
        _checks.check_str("reason", reason, optional=True)
        _checks.check_bool("dead_letter", dead_letter)
        await self._client._settle(
            self, list(deliveries), "nack", requeue_delay_ms, reason, dead_letter
        )

    async def release(self, deliveries: Iterable[Delivery]) -> None:
        """Give deliveries back unprocessed: due again at once, attempts not counted.

        Raises:
            ConnectionLostError, RequestError, ClientClosedError: as :meth:`ack`.
        """
        await self._client._settle(self, list(deliveries), "release")

    async def extend(
        self, deliveries: Iterable[Delivery], visibility_ms: int | None = None
    ) -> None:
        """Keep deliveries: each is visible again ``visibility_ms`` after now.

        Args:
            deliveries: Held deliveries of this subscription.
            visibility_ms: ms from now, 1 .. 12 h; None: the group's visibility timeout.

        Raises:
            TypeError: ``visibility_ms`` is not an int or None (a bool, a float, a str).
            ValueError: ``visibility_ms`` outside 1 .. 12 h, or None before the group's
                settings are known.
            ConnectionLostError, RequestError, ClientClosedError: as :meth:`ack`.
        """
        if visibility_ms is None:
            if self.visibility_timeout_ms is None:
                raise ValueError("give visibility_ms: the group's timeout is not known yet")
            visibility_ms = self.visibility_timeout_ms
        # The protocol fixes the range (12 h at most), so the whole of it is checked
        # here, before anything is sent.
        _checks.check_int_ms("visibility_ms", visibility_ms, 1, _checks.MAX_VISIBILITY_MS)
        await self._client._extend(self, list(deliveries), visibility_ms)

    def _close(self) -> None:
        self._closed = True
        self._buffer.clear()
        self._wake()


_SETTLED_AS: dict[str, str] = {"ack": "acked", "nack": "nacked", "release": "released"}


def settled_error(
    deliveries: list[Delivery], how: str, positions: dict[int, int] | None = None
) -> RequestError | None:
    """The error naming deliveries a settle call (``how``: ``ack``, ``nack``,
    ``release`` or ``extend``) left out because they were settled already, or None.

    Found by a tester: a nack after an ack returned None, as if it had worked. The
    server would refuse the tag the same way (UNKNOWN_DELIVERY_TAG: "already settled"),
    so nothing is sent; ``item_index`` is the first one's position.
    """
    if not deliveries:
        return None
    first = deliveries[0]
    named = (
        f"delivery of message {first.id} (topic {first.topic!r}, group {first.group!r}, "
        f"attempt {first.attempt})"
    )
    more = "" if len(deliveries) == 1 else f" and {len(deliveries) - 1} more"
    done = _SETTLED_AS.get(first._settled_as, "settled")
    index = None if positions is None else positions.get(id(first))
    return RequestError(
        ErrorCode.UNKNOWN_DELIVERY_TAG,
        f"cannot {how} {named}{more}: it is already SETTLED ({done}, confirmed by the "
        f"server), so nothing was sent for it; a delivery is settled once: {how} only "
        "deliveries whose state is HELD",
        index,
    )


def void_error(
    deliveries: list[Delivery], positions: dict[int, int] | None = None
) -> FutureQError | None:
    """The error naming void deliveries a call left out, or None when there are none.

    Args:
        deliveries: The void deliveries, in the caller's order.
        positions: ``id(delivery)`` -> index in the caller's list, for ``item_index``.

    Returns:
        :class:`SubscriptionEndedError` if their subscription ended;
        :class:`ConnectionLostError` if they came on a lost connection: a
        :class:`NotSentError` (nothing was sent, and no earlier settle call of them may
        have taken effect either) unless one of them was in a settle call whose
        answer never came (``_settle_unknown``); else a
        :class:`RequestError` UNKNOWN_DELIVERY_TAG (taken back or refused by the
        server) whose ``item_index`` is the first one's position.
    """
    if not deliveries:
        return None
    first = deliveries[0]
    end = first._subscription.end
    if first._void_kind == "ended" and end is not None:
        return end
    ids = ", ".join(str(delivery.id) for delivery in deliveries[:10])
    more = "" if len(deliveries) <= 10 else f" and {len(deliveries) - 10} more"
    reason = first._void_reason or "it is no longer held"
    if first._void_kind == "lost":
        # Not sent by this call; and unless an earlier one was sent and its answer
        # lost, nothing of it took effect: "not sent", as for any request.
        unknown = any(delivery._settle_unknown for delivery in deliveries)
        kind = ConnectionLostError if unknown else NotSentError
        tail = (
            "; an earlier call settling them got no answer: its outcome is unknown"
            if unknown
            else "; the call was not sent"
        )
        if first._void_reason and first._void_reason != LOST_REASON:
            return kind(f"deliveries {ids}{more}: {first._void_reason}{tail}")
        return kind(
            f"deliveries {ids}{more} came on a connection that has since been lost; "
            f"the broker will deliver them again{tail}"
        )
    index = None if positions is None else positions.get(id(first))
    return RequestError(first._void_code, f"deliveries {ids}{more}: {reason}", index)


__all__ = ["Delivery", "DeliveryState", "Subscription"]
