"""Consuming: :meth:`~ConsumingClient.subscribe`, settling deliveries (ACK, NACK,
RELEASE, EXTEND) and the lease keeper.

A delivery tag means something only on the connection (and to the leader) that
handed it out: settlements go to that connection or not at all, and a NOT_LEADER
answer voids what is still held (``docs/client.md``, "At-least-once"). The
:class:`~futureq.client.subscription.Subscription` objects call in here.
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Final

import anyio

from futureq.client import _checks
from futureq.client._attempts import Attempts, took_no_effect
from futureq.client._backoff import Backoff
from futureq.client._base import ClientBase, _expect
from futureq.client._batching import chunked
from futureq.client._connection import Connection
from futureq.client.subscription import (
    LEADER_LOST_REASON,
    LOST_REASON,
    Delivery,
    DeliveryState,
    Subscription,
    settled_error,
    void_error,
)
from futureq.errors import (
    ConnectionLostError,
    ErrorCode,
    FutureQError,
    NotLeaderError,
    NotSentError,
    RequestError,
)
from futureq.wire import frames, validation

UNSUBSCRIBE_GRACE_S: Final = 2.0
"""Longest leaving a ``subscribe`` block waits for RELEASE and UNSUBSCRIBE (seconds)."""
MAX_HANDED_TAGS: Final = 1024
"""Most tags an UNSUBSCRIBE's ``handed`` names (items). Every server accepts an array of
this many in a frame (4 x ``limits.max_batch_items`` + 1,024 at least, and
``max_batch_items`` may be 1); a longer one may close the connection (MALFORMED_FRAME).
Holding more than this many unsettled deliveries when leaving, the client releases the
unread ones first and sends no ``handed``, as with a server older than version 3."""
LEASE_RETRY_S: Final = 1.0
"""Wait before the lease keeper tries again after a failed EXTEND or RELEASE (s)."""

log = logging.getLogger(__name__)


class ConsumingClient(ClientBase):
    """The consuming calls of :class:`~futureq.client.client.Client` (and the ones its
    subscriptions and deliveries make)."""

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
            TypeError: ``topic`` or ``group`` is not a str (nothing sent).
            RequestError: SUBSCRIBE refused (INVALID_TOPIC, INVALID_GROUP, ...);
                INVALID_TOPIC for ``T.dlq.dlq``, which never receives anything, is
                raised before sending (with the server's sentence).
            ConnectionLostError: no server reachable within ``request_timeout_s``.
            ClientClosedError: the client was closed.

        Leaving the block unsubscribes: deliveries handed to you and not settled go
        back to the group and are delivered again (their attempt counted); the others
        (buffered, never handed to you, or still on their way) go back uncounted
        (``docs/client.md``).
        """
        self._check_open()
        # Checked before sending, as every other call does (a sharded client's already
        # raised TypeError for a topic, this one sent it to be refused).
        _checks.check_str("topic", topic)
        _checks.check_str("group", group)
        validation.check_not_dead_letters_of_dead_letters(topic)
        sub = Subscription(self, topic, group, prefetch, pull=pull)
        self._subscriptions[id(sub)] = sub
        try:
            await self._subscribe_on_live(sub, anyio.current_time() + self.request_timeout_s)
            yield sub
        finally:
            del self._subscriptions[id(sub)]
            subscription_id, epoch = sub.subscription_id, sub.epoch
            unread = [d for d in (*sub._buffer, *sub.to_release) if d._state is DeliveryState.HELD]
            # Handed to the application and not settled (a settle under way included:
            # if the UNSUBSCRIBE lands first, the application did see it).
            handed = list(sub._handed)
            sub._close()
            conn = self._conn
            if self._pid != os.getpid():
                conn = None  # a forked child: the connection is the parent's to use
            if subscription_id is not None and conn is not None and conn.epoch == epoch:
                with anyio.move_on_after(UNSUBSCRIBE_GRACE_S, shield=True):
                    await self._unsubscribe_on(conn, sub, subscription_id, handed, unread)

    async def _unsubscribe_on(
        self,
        conn: Connection,
        sub: Subscription,
        subscription_id: int,
        handed: list[bytes],
        unread: list[Delivery],
    ) -> None:
        """End a subscription on the server: only the deliveries in ``handed`` count
        as an attempt (``docs/client.md``, "Consuming"); errors are
        swallowed (the server ends it when the connection goes, counting them all).

        Protocol version 3 says so in the UNSUBSCRIBE itself. Before it, the unread
        deliveries are released first, which races: the server may push a released
        message straight back with credit it still holds, and the UNSUBSCRIBE counts
        that one (found by a tester: with ``max_deliveries`` 1, to the dead-letter
        topic unread).
        """
        # A tag is at most 255 bytes: msgpack adds 2 to each, and the frame's head fits
        # in 64 (a frame too large for the server would be refused whole). Its number
        # is bounded too: found by a tester, a subscription leaving with 1,500 handed
        # on a server of max_batch_items 100 had its connection closed (MALFORMED_FRAME:
        # an array longer than the server decodes), every other subscription with it,
        # and every delivery of the connection went back counted.
        size = 64 + sum(len(tag) + 2 for tag in handed)
        says_handed = (
            conn.protocol_version >= 3
            and len(handed) <= MAX_HANDED_TAGS
            and size <= conn.max_frame_bytes
        )
        if not says_handed and unread:
            try:
                await self._settle_on(conn, sub, unread, "release", 0, UNSUBSCRIBE_GRACE_S)
            except FutureQError:
                pass  # they come back when the UNSUBSCRIBE lands, counted
        try:
            await conn.request(
                lambda rid: frames.Unsubscribe(
                    rid, subscription_id, handed if says_handed else None
                ),
                deadline=anyio.current_time() + UNSUBSCRIBE_GRACE_S,
            )
        except FutureQError:
            pass  # the connection is going away; the server requeues anyway

    def _answer_handover(self, conn: Connection, sub: Subscription) -> None:
        """Answer HANDOVER (protocol version 4; the reader task, so at once): the
        leader hands over gracefully and ``sub`` ends on it. Send UNSUBSCRIBE naming in
        ``handed`` the deliveries the application holds unsettled (only those count as
        an attempt); void the buffered ones, which the application will never be handed
        (they go back uncounted and come again from the next leader); then the next
        iteration subscribes again, following the leader as after any lost
        subscription (``docs/protocol.md``, HANDOVER).

        Handed deliveries stay the application's to settle; once the leadership moved,
        settling them raises as for any delivery of a lost leader. Too many handed tags
        for one frame (:data:`MAX_HANDED_TAGS`, the server's ``max_frame_bytes``): the
        UNSUBSCRIBE names none, and every delivery out counts, as before version 4.
        """
        subscription_id = sub.subscription_id
        if subscription_id is None or sub.epoch != conn.epoch:
            return
        handed = list(sub._handed)
        size = 64 + sum(len(tag) + 2 for tag in handed)
        says_handed = len(handed) <= MAX_HANDED_TAGS and size <= conn.max_frame_bytes
        sub._handed_over(conn.epoch)
        log.debug(
            "HANDOVER: subscription %d leaves %s (%d handed)",
            subscription_id,
            conn.address,
            len(handed),
        )
        # Subscribing again on this connection waits for the answer: sent at once, the
        # SUBSCRIBE could be served first and find the old subscription still counted
        # against the connection's limits (max_prefetch_per_connection).
        answered = anyio.Event()
        sub._leaving = (conn.epoch, answered)
        conn.request_nowait(
            lambda rid: frames.Unsubscribe(rid, subscription_id, handed if says_handed else None),
            on_answer=lambda _frame: answered.set(),
        )

    async def _subscribe_on_live(
        self, sub: Subscription, deadline: float | None, prefetch: int | None = None
    ) -> None:
        async with sub._lock:
            if sub.epoch == self._live_epoch() and sub.subscription_id is not None:
                return
            wanted = prefetch if prefetch is not None else sub.prefetch
            windows: dict[int, int] = {}
            withheld: dict[int, int] = {}
            unnamed: list[bool] = []  # per attempt: the server did not name its limit

            def make_frame(rid: int) -> frames.Subscribe:
                # A server that names its limit (version 5) takes no window past it,
                # and has no more than it out to one subscription anyway: ask for what
                # it gives (before, subscribe(prefetch=500) on a node with
                # limits.max_prefetch 100 was refused). One that does not name it
                # refuses a window past it, as it always did.
                conn = self._live_connection()
                limit = None if conn is None else conn.max_prefetch
                unnamed.append(limit is None)
                # Handed-over deliveries the application still holds take room: in
                # window mode out of ``prefetch``, in pull mode out of the server's
                # limit (the next subscription is not charged for them there).
                live = withheld[rid] = len(sub._live_orphans())
                window = wanted if sub._pull else wanted - live
                if limit is not None:
                    window = min(window, limit - live if sub._pull else limit)
                # >= 1 (the protocol's least): the caller waited for room
                # (:meth:`_resubscribe`), and room only grows while unsubscribed.
                window = windows[rid] = max(1, window)
                return frames.Subscribe(rid, sub.topic, sub.group, window, headers=True)

            leaving = sub._leaving
            if leaving is not None and leaving[0] == self._live_epoch():
                with anyio.move_on_after(UNSUBSCRIBE_GRACE_S):
                    await leaving[1].wait()  # an error answer is waited out: bounded
            sub._leaving = None

            def bind(conn: Connection, frame: frames.Frame) -> None:
                # Runs in the reader, even when the caller gave up: a subscription
                # nobody will use is ended at once, so it holds nothing on the server.
                if not isinstance(frame, frames.SubscribeOk):
                    return
                live = sub.epoch == conn.epoch and sub.subscription_id is not None
                if sub.closed or live or conn.is_leaving:
                    orphan = frame.subscription_id
                    log.debug(
                        "SUBSCRIBE_OK %d for a subscription given up; unsubscribing it", orphan
                    )
                    # Nothing of it reached the application: none of it counts.
                    handed: list[bytes] | None = [] if conn.protocol_version >= 3 else None
                    conn.request_nowait(lambda rid: frames.Unsubscribe(rid, orphan, handed))
                    return
                rid = frame.request_id
                sub._bind(conn.epoch, frame.subscription_id, windows[rid], withheld[rid], conn)

            try:
                answer = await self._call(
                    make_frame, retry_unknown=True, deadline=deadline, on_answer=bind
                )
            except RequestError as exc:
                if not (
                    sub._pull
                    and exc.code is ErrorCode.INVALID_ARGUMENT
                    and wanted > 1
                    and unnamed
                    and unnamed[-1]
                ):
                    raise
                # A server older than protocol version 5 refuses a window past its
                # limits.max_prefetch and does not say the limit: a pull subscription
                # then takes the window every server takes (1), and its fetches keep
                # no more than that out (Subscription.fetch), receiving in rounds.
                wanted = 1
                answer = await self._call(
                    make_frame, retry_unknown=True, deadline=deadline, on_answer=bind
                )
            _expect(answer, frames.SubscribeOk)

    async def _resubscribe(self, sub: Subscription, prefetch: int | None = None) -> None:
        """Subscribe ``sub`` on the live connection, waiting as long as reconnecting takes.

        Raises:
            RequestError: a 2xx refusal (retrying would not help).
            ClientClosedError: the client was closed.
        """
        while True:
            conn = self._live_connection()
            # Every delivery it may hold is held already (handed over and unsettled):
            # subscribe once one is settled, void or past its deadline (SUBSCRIBE
            # takes no window below 1).
            await sub._wait_for_room(None if conn is None else conn.max_prefetch)
            if sub.closed or sub.end is not None:
                return
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
        names the ones left out. Deliveries already settled are not sent either: an
        ack of one acked is done already, any other settles nothing and is named by
        the error (:func:`~futureq.client.subscription.settled_error`).
        """
        await self._send_settling(
            deliveries,
            how,
            lambda conn, to_send: self._settle_on(
                conn,
                sub,
                to_send,
                how,
                requeue_delay_ms,
                self.request_timeout_s,
                reason=reason,
                dead_letter=dead_letter,
            ),
        )

    async def _send_settling(
        self,
        deliveries: list[Delivery],
        how: str,
        send: Callable[[Connection, list[Delivery]], Awaitable[list[Delivery]]],
    ) -> None:
        """The part :meth:`_settle` and :meth:`_extend` share: wait for calls already
        sending any of ``deliveries`` (:func:`_after_calls_under_way`), sort them out
        (:func:`_sort_out`), ``send`` those to send on the live connection (it returns
        the ones the server refused), then raise what was left out
        (:func:`_raise_left_out`)."""
        self._check_open()
        await _after_calls_under_way(deliveries)
        deadline = anyio.current_time() + self.request_timeout_s
        conn = self._live_connection()
        if conn is None and any(_follows_leader(d) for d in deliveries):
            conn = await self._wait_connection(deadline)
        to_send, left_out, settled = _sort_out(deliveries, conn, how)
        if to_send and conn is not None:
            with _under_way(to_send):
                left_out += await self._send_following(conn, to_send, send, deadline)
        _raise_left_out(deliveries, left_out, settled, how)

    async def _send_following(
        self,
        conn: Connection,
        to_send: list[Delivery],
        send: Callable[[Connection, list[Delivery]], Awaitable[list[Delivery]]],
        deadline: float,
    ) -> list[Delivery]:
        """``send`` ``to_send`` on ``conn``; return what it left out.

        Deliveries the application held when their leader handed over follow the
        leadership (``docs/protocol.md``, "Delivery tags across leaders"): when a node
        that leads no more answered NOT_LEADER, or the connection broke under the
        request, they are sent again on the connection to the node that leads now,
        until ``deadline`` (then they are void, as for a lost leadership). The others
        are void as before (lost connection, lost leadership).

        Raises:
            NotSentError: the settlement took no effect (not sent, above a GOAWAY's
                last request served, no connection before ``deadline``), nor did any
                attempt before it (:class:`~futureq.client._attempts.Attempts`).
            ConnectionLostError: the connection broke with it sent and none of them
                follows the leader, or an earlier attempt was so lost before the
                last one was not sent: the outcome is unknown.
        """
        left_out: list[Delivery] = []
        backoff = Backoff(self._rng)
        attempts = Attempts()
        sending = to_send
        while True:
            try:
                left_out += await send(conn, sending)
            except FutureQError as exc:
                attempts.note(exc)
                if not took_no_effect(exc):
                    for delivery in sending:
                        delivery._settle_unknown = True  # sent; its answer never came
                if not isinstance(exc, ConnectionLostError):
                    raise
                if not any(_follows_leader(d) for d in sending):
                    raise attempts.final(exc) from None
                for delivery in sending:
                    if _follows_leader(delivery):
                        delivery._follow_leader = True
                    elif delivery._state is DeliveryState.HELD:
                        delivery._void(LOST_REASON, "lost")
                        left_out.append(delivery)
            sending = [d for d in to_send if d._follow_leader]
            for delivery in sending:
                delivery._follow_leader = False
            sending = [d for d in sending if _follows_leader(d)]
            if not sending:
                return left_out
            if anyio.current_time() >= deadline:
                for delivery in sending:
                    delivery._void(LEADER_LOST_REASON, "lost")
                return left_out + sending
            try:
                moved_to = await self._wait_connection(deadline)
            except NotSentError as exc:
                raise attempts.final(exc) from None
            if moved_to is conn:
                # Not moved yet (the node named itself, or no leader is known).
                delay = backoff.next_delay_s()
                await anyio.sleep(min(delay, max(0.0, deadline - anyio.current_time())))
            conn = moved_to

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
                            group[0]._subscription._settled(conn, group, how)

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
        lost = [d for d in deliveries if d._state is DeliveryState.HELD and not d._handed_over]
        for delivery in lost:
            delivery._void(LEADER_LOST_REASON, "lost")
        for delivery in deliveries:
            # Held when their leader handed over: sent again to the node that leads
            # (:meth:`_send_following`), which keeps them out until their deadline.
            if _follows_leader(delivery):
                delivery._follow_leader = True
        self._follow_leader(conn, exc.leader_address)
        return lost

    async def _extend(
        self, sub: Subscription, deliveries: list[Delivery], visibility_ms: int
    ) -> None:
        """EXTEND deliveries (leader-local, immediate); a refused tag is left out."""
        await self._send_settling(
            deliveries,
            "extend",
            lambda conn, to_send: self._extend_on(
                conn, to_send, visibility_ms, self.request_timeout_s
            ),
        )

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
                # The server's new deadline is its now (before this answer came) plus
                # visibility_ms: counted from here, the client's is never earlier.
                deadline_s = anyio.current_time() + visibility_ms / 1000
                for delivery in chunk:
                    delivery._deadline_s = deadline_s
                if any(delivery._handed_over for delivery in chunk):
                    self._lease_changed()  # a handed-over one's deadline moved
                break
        return refused

    async def _keep_leases(self) -> None:
        """The lease keeper: extend buffered deliveries, release unwanted ones.

        A delivery received and not yet handed to the application is extended to the
        group's visibility timeout from now once half of it has passed, for up to
        ``max_lease_s`` after it arrived; then it is released (due again at once, its
        attempt not counted: it was never handed out). A pull-mode subscription's
        deliveries that nobody fetched are released too.

        Found by a tester: past ``max_lease_s`` a buffered delivery was left to time
        out, which counts as an attempt; with ``max_deliveries`` 1 it went to the
        dead-letter topic unread. With ``max_lease_s`` 0 (never extended) it is still
        left to time out: releasing at once would hand it straight back.
        """
        while True:
            self._lease_event = anyio.Event()
            now = anyio.current_time()
            next_s = float("inf")
            work: list[tuple[Subscription, Connection, list[Delivery], list[Delivery]]] = []
            conn = self._live_connection()
            for sub in list(self._subscriptions.values()):
                if sub._orphaned:
                    # Handed-over deliveries past their deadline give their room back.
                    sub._orphans_changed()
                    next_s = min(next_s, sub._next_orphan_deadline_s())
                if conn is None or sub.epoch != conn.epoch or sub.subscription_id is None:
                    continue
                unwanted = [d for d in sub.to_release if d._state is DeliveryState.HELD]
                sub.to_release = []
                due: list[Delivery] = []
                if sub.visibility_timeout_ms is not None:
                    leased_out: list[Delivery] = []
                    for delivery in sub._buffer:
                        if delivery._state is not DeliveryState.HELD:
                            continue
                        if now - delivery._received_s >= self.max_lease_s:
                            if self.max_lease_s > 0 and delivery._under_way is None:
                                leased_out.append(delivery)  # held long enough: give it back
                            continue
                        lease_ends = delivery._received_s + self.max_lease_s
                        if delivery._refresh_s <= now:
                            due.append(delivery)
                            next_s = min(next_s, lease_ends)
                        else:
                            next_s = min(next_s, delivery._refresh_s, lease_ends)
                    if leased_out:
                        # Out of the buffer now (no await since it was read), so the
                        # application cannot take one while its RELEASE is on the wire.
                        gone = {id(delivery) for delivery in leased_out}
                        sub._buffer = collections.deque(d for d in sub._buffer if id(d) not in gone)
                        unwanted.extend(leased_out)
                if unwanted or due:
                    work.append((sub, conn, unwanted, due))
            failed = False
            for sub, live_conn, unwanted, due in work:
                try:
                    if unwanted:
                        await self._settle_on(
                            live_conn, sub, unwanted, "release", 0, self.request_timeout_s
                        )
                    due = _still_buffered(sub, due)
                    if due and sub.visibility_timeout_ms is not None:
                        with _under_way(due):
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


def _still_buffered(sub: Subscription, deliveries: list[Delivery]) -> list[Delivery]:
    """Those of ``deliveries`` still in ``sub``'s buffer, held and not on the wire: what
    the lease keeper may extend now.

    Found by a tester: the lease keeper chose what to extend before it awaited earlier
    work (another subscription's EXTEND, a RELEASE), so the application could meanwhile
    take one of them and ack it; the EXTEND then reached the server while that ACK was
    being committed, was refused (UNKNOWN_DELIVERY_TAG), and the refusal voided the
    delivery, so the ACK's confirmation gave no credit back: each such race shrank the
    subscription's window for good. Chosen here, right before sending (no await in
    between), and marked under way while sent, so a settle call waits for the EXTEND
    (:func:`_after_calls_under_way`).
    """
    buffered = {id(delivery) for delivery in sub._buffer}
    return [
        delivery
        for delivery in deliveries
        if id(delivery) in buffered
        and delivery._state is DeliveryState.HELD
        and delivery._under_way is None
    ]


def _follows_leader(delivery: Delivery) -> bool:
    """Held, and held by the application when its leader handed over: a settlement of
    it goes to whichever node leads (:attr:`Delivery._handed_over`)."""
    return delivery._state is DeliveryState.HELD and delivery._handed_over


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


async def _after_calls_under_way(deliveries: list[Delivery]) -> None:
    """Wait until no other settle or extend call has any of ``deliveries`` on the
    wire. Two tasks settling one delivery at once sent its tag twice: the server
    refused the second (already settled), the refusal voided the delivery before the
    first call's confirmation came, and that confirmation then gave no credit back,
    so each such race shrank the subscription's window for good. Now the second call
    sees the first one's outcome (an ack of an acked delivery does nothing; anything
    else raises, naming how it was settled).

    All are looked at again after each wait: while this call waited for one, another
    call may have put one already looked at on the wire, and sending it then raced
    that call as above (found by a tester)."""
    while True:
        busy = next((d._under_way for d in deliveries if d._under_way is not None), None)
        if busy is None:
            return
        await busy.wait()


@contextmanager
def _under_way(deliveries: list[Delivery]) -> Iterator[None]:
    """Mark ``deliveries`` as on the wire for the block (:func:`_after_calls_under_way`)."""
    done = anyio.Event()
    for delivery in deliveries:
        delivery._under_way = done
    try:
        yield
    finally:
        for delivery in deliveries:
            if delivery._under_way is done:
                delivery._under_way = None
        done.set()


def _sort_out(
    deliveries: list[Delivery], conn: Connection | None, how: str
) -> tuple[list[Delivery], list[Delivery], list[Delivery]]:
    """``(to send, void, settled)`` for a settle call ``how`` (``ack``, ``nack``,
    ``release``, ``extend``): held deliveries of the live connection, the void ones, and
    the settled ones it cannot apply to.

    An ack of a delivery acked already is in none (done: an ack may be retried); held
    ones from a lost connection become void. A delivery named twice is sent once (the
    server refuses a tag repeated in one request, and the client then voided a
    delivery it went on to settle).
    """
    to_send: list[Delivery] = []
    void: list[Delivery] = []
    settled: list[Delivery] = []
    seen: set[int] = set()
    for delivery in deliveries:
        if id(delivery) in seen:
            continue
        seen.add(id(delivery))
        state = delivery._state
        if state is DeliveryState.SETTLED:
            if not (how == "ack" and delivery._settled_as == "ack"):
                settled.append(delivery)
            continue
        if (
            state is DeliveryState.HELD
            and (conn is None or delivery._epoch != conn.epoch)
            and not delivery._handed_over
        ):
            delivery._void(LOST_REASON, "lost")
        if delivery._state is DeliveryState.VOID:
            void.append(delivery)
        else:
            to_send.append(delivery)
    return to_send, void, settled


def _raise_left_out(
    deliveries: list[Delivery], void: list[Delivery], settled: list[Delivery], how: str
) -> None:
    """Raise the error naming what a settle call left out (the others were sent): the
    void ones' (:func:`void_error`) or the settled ones' (:func:`settled_error`),
    whichever names the earlier position in ``deliveries``."""
    positions = {id(d): i for i, d in enumerate(deliveries)}
    errors = [
        (positions.get(id(group[0]), 0), error)
        for group, error in (
            (void, void_error(void, positions)),
            (settled, settled_error(settled, how, positions)),
        )
        if error is not None
    ]
    if errors:
        raise min(errors, key=lambda pair: pair[0])[1]


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
    bad._void(exc.message, "refused", exc.code)
    return bad
