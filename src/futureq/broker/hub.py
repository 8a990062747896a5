"""The hub: consumer subscriptions, credit, in-flight deliveries and visibility timeouts.

Leader-local memory (``DESIGN.md``, "Only the leader dispatches"): which consumer holds
which delivery, until when. Nothing here is replicated; a new leader starts empty and
redelivers what was not acked, which is the at-least-once window.

The hub owns one :class:`GroupRuntime` per consumer group that has something to do
(consumers, deliveries in flight, entries within the horizon): the group's
:class:`~futureq.state.due_index.DueIndex` horizon, its consumers in round-robin order,
and the in-memory attempt counts of deliveries whose visibility timeout ran out. Idle
groups have no runtime and cost nothing per dispatch pass; every change that may give
a group work to do puts its id in :attr:`Hub.touched`, which the dispatcher drains
(``DESIGN.md``, "Every buffer is bounded in bytes; no request holds the event loop").
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from futureq.errors import ErrorCode, RequestError
from futureq.state import commands
from futureq.state.due_index import DueIndex, pack

if TYPE_CHECKING:
    from futureq.state.queue_state import GroupInfo


class Outbox(Protocol):
    """A connection's outgoing frame queue (bounded in bytes, never blocks the dispatcher)."""

    def send_nowait(self, data: bytes) -> bool:
        """Queue encoded frame bytes; False if the connection is closed or broken."""
        ...

    def has_room(self) -> bool:
        """True while the connection's buffer (and the node's) may take more deliveries."""
        ...


@attrs.define(eq=False)
class Consumer:
    """One subscription of one connection to one (topic, group).

    Attributes:
        subscription_id: Id the client names in CREDIT and UNSUBSCRIBE.
        group_id: The group's id.
        connection_id: Identifies the connection (ack of a foreign tag is refused).
        outbox: Where DELIVER frames go.
        credit: Deliveries the server may still push (items).
        in_flight: Schedule keys delivered to it and not yet acked, nacked or timed out.
    """

    subscription_id: int
    group_id: int
    topic: str
    group: str
    connection_id: int
    outbox: Outbox
    credit: int
    in_flight: set[bytes] = attrs.Factory(set)
    closed: bool = False


@attrs.define(eq=False)
class InFlight:
    """A delivery pushed to a consumer and not yet acked.

    Attributes:
        attempt: The attempt number sent with this delivery (1 for the first).
        stored_attempt: Attempt count in the schedule entry (raised by NACK).
        deadline_ms: When the visibility timeout runs out (ms since the Unix epoch).
        acking: An ACK or NACK for it is being committed; do not time it out.
    """

    key: bytes
    group_id: int
    due_ms: int
    mid: int
    expire_ms: int | None
    attempt: int
    stored_attempt: int
    consumer: Consumer
    deadline_ms: int
    acking: bool = False


@attrs.define(eq=False)
class GroupRuntime:
    """Leader-local state of one consumer group.

    Attributes:
        info: The replicated group record (name, visibility timeout, max deliveries).
        index: The in-memory horizon of the group's schedule.
        loaded_until: Packed ``(due_ms, id)`` bound: every schedule entry below it is
            in ``index``, in flight, or being removed; entries at or above it are on
            disk only.
        extra_attempts: Deliveries that timed out or whose consumer left, per message
            id, since the entry's stored attempt count.
    """

    info: GroupInfo
    index: DueIndex = attrs.Factory(DueIndex)
    loaded_until: int = 0
    consumers: list[Consumer] = attrs.Factory(list)
    next_consumer: int = 0
    extra_attempts: dict[int, int] = attrs.Factory(dict)
    in_flight_count: int = 0
    counters: dict[tuple[str, str], Any] = attrs.Factory(dict)
    """Cached prometheus children of this group's counters, by (metric, group name)."""

    wake_ms: float = float("inf")
    """When the dispatcher is next due to look at this group (ms), as scheduled."""

    def has_credit(self) -> bool:
        """True when some consumer of the group may receive now (credit, buffer room)."""
        return any(c.credit > 0 and not c.closed and c.outbox.has_room() for c in self.consumers)

    def consumers_with_credit(self) -> list[Consumer]:
        """Consumers that may receive now, in round-robin order from the next one.

        A consumer whose connection buffer is full is skipped: what is due stays with
        the group's other consumers (issue 10, "bound every per-connection buffer").
        """
        consumers = self.consumers
        if not consumers:
            return []
        start = self.next_consumer % len(consumers)
        self.next_consumer = start + 1
        ordered = consumers[start:] + consumers[:start]
        return [c for c in ordered if c.credit > 0 and not c.closed and c.outbox.has_room()]

    def is_idle(self) -> bool:
        """Nothing in memory worth keeping: no consumer, nothing in flight or indexed."""
        return (
            not self.consumers
            and self.in_flight_count == 0
            and len(self.index) == 0
            and not self.extra_attempts
        )


class Hub:
    """Consumers, credit and in-flight deliveries of the groups this leader dispatches."""

    def __init__(self) -> None:
        self.groups: dict[int, GroupRuntime] = {}
        self.in_flight: dict[bytes, InFlight] = {}
        self._deadlines: list[tuple[int, bytes]] = []
        self._subscription_ids = itertools.count(1)
        self.consumers: dict[int, Consumer] = {}
        self.touched: set[int] = set()
        """Ids of groups that may have work now (new consumer, credit, a release)."""
        self.group_info: Callable[[int], GroupInfo | None] = lambda group_id: None
        """Looks up a group's replicated record; set by the dispatcher."""

    def new_subscription_id(self) -> int:
        """A subscription id unique within this process."""
        return next(self._subscription_ids)

    def runtime(self, group_id: int) -> GroupRuntime | None:
        """The group's runtime, made on first use; None when the group does not exist."""
        runtime = self.groups.get(group_id)
        if runtime is None:
            info = self.group_info(group_id)
            if info is None:
                return None
            runtime = self.groups[group_id] = GroupRuntime(info)
        return runtime

    # ----------------------------------------------------------- consumers

    def add_consumer(self, consumer: Consumer) -> None:
        """Attach a subscription to its group's runtime.

        Raises:
            KeyError: the group does not exist.
        """
        runtime = self.runtime(consumer.group_id)
        if runtime is None:
            raise KeyError(consumer.group_id)
        self.consumers[consumer.subscription_id] = consumer
        runtime.consumers.append(consumer)
        self.touched.add(consumer.group_id)

    def remove_consumer(self, consumer: Consumer, now_ms: int) -> None:
        """Detach a subscription; its unacked deliveries go back to the group.

        Each counts as an attempt (the consumer may have crashed processing it).
        """
        consumer.closed = True
        self.consumers.pop(consumer.subscription_id, None)
        runtime = self.groups.get(consumer.group_id)
        if runtime is not None and consumer in runtime.consumers:
            runtime.consumers.remove(consumer)
        self.touched.add(consumer.group_id)
        for key in list(consumer.in_flight):
            flight = self.in_flight.get(key)
            if flight is not None and not flight.acking:
                self._release(flight, now_ms)

    def grant_credit(
        self, subscription_id: int, connection_id: int, credit: int, max_credit: int
    ) -> Consumer:
        """Add ``credit`` deliveries to a subscription (capped at ``max_credit``).

        Raises:
            RequestError: UNKNOWN_SUBSCRIPTION, or INVALID_ARGUMENT for credit < 1.
        """
        consumer = self.consumers.get(subscription_id)
        if consumer is None or consumer.connection_id != connection_id:
            raise RequestError(
                ErrorCode.UNKNOWN_SUBSCRIPTION,
                f"no subscription {subscription_id} on this connection",
            )
        if credit < 1:
            raise RequestError(ErrorCode.INVALID_ARGUMENT, f"credit must be >= 1, got {credit}")
        consumer.credit = min(consumer.credit + credit, max_credit)
        self.touched.add(consumer.group_id)
        return consumer

    # ----------------------------------------------------------- deliveries

    def track(self, flight: InFlight) -> None:
        """Record a delivery just pushed."""
        self.in_flight[flight.key] = flight
        flight.consumer.in_flight.add(flight.key)
        self.groups[flight.group_id].in_flight_count += 1
        heapq.heappush(self._deadlines, (flight.deadline_ms, flight.key))

    def forget(self, key: bytes) -> InFlight | None:
        """Drop an in-flight delivery (acked, nacked, expired or its group deleted)."""
        flight = self.in_flight.pop(key, None)
        if flight is not None:
            flight.consumer.in_flight.discard(key)
            runtime = self.groups.get(flight.group_id)
            if runtime is not None:
                runtime.in_flight_count -= 1
        return flight

    def _release(self, flight: InFlight, now_ms: int) -> None:
        """Put a delivery back in its group's index; it counts as one attempt."""
        self.forget(flight.key)
        runtime = self.groups.get(flight.group_id)
        if runtime is None:
            return
        runtime.extra_attempts[flight.mid] = flight.attempt - flight.stored_attempt
        runtime.index.add(flight.due_ms, flight.mid, flight.expire_ms, flight.stored_attempt)
        self.touched.add(flight.group_id)

    def expire_visibility(self, now_ms: int) -> int:
        """Release deliveries whose visibility timeout ran out; return how many."""
        released = 0
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now_ms:
            deadline, key = heapq.heappop(deadlines)
            flight = self.in_flight.get(key)
            if flight is None or flight.deadline_ms != deadline or flight.acking:
                continue
            self._release(flight, now_ms)
            released += 1
        return released

    def next_deadline_ms(self) -> int | None:
        """Earliest visibility deadline still pending (may be stale), or None."""
        while self._deadlines:
            deadline, key = self._deadlines[0]
            flight = self.in_flight.get(key)
            if flight is None or flight.deadline_ms != deadline or flight.acking:
                heapq.heappop(self._deadlines)
                continue
            return deadline
        return None

    def claim_tags(self, tags: list[bytes], connection_id: int) -> list[InFlight]:
        """Check that every tag names a delivery held by this connection; mark them acking.

        Args:
            tags: Delivery tags from an ACK or NACK.
            connection_id: The connection that sent them.

        Returns:
            The in-flight deliveries, in tag order, now marked ``acking``.

        Raises:
            RequestError: UNKNOWN_DELIVERY_TAG (malformed, never delivered, already
                acked, or from an earlier attempt) or FOREIGN_DELIVERY_TAG (delivered
                to another connection), with the index of the first bad tag. Nothing is
                claimed when one tag is bad.
        """
        flights: list[InFlight] = []
        seen: set[bytes] = set()
        for i, tag in enumerate(tags):
            parsed = commands.parse_delivery_tag(tag)
            if parsed is None:
                raise RequestError(
                    ErrorCode.UNKNOWN_DELIVERY_TAG,
                    f"delivery tag must be {commands.DELIVERY_TAG_BYTES} bytes as received in DELIVER",
                    i,
                )
            key, attempt = parsed
            flight = self.in_flight.get(key)
            if flight is None or flight.attempt != attempt or flight.acking or key in seen:
                raise RequestError(
                    ErrorCode.UNKNOWN_DELIVERY_TAG,
                    "unknown delivery tag: already acked or nacked, redelivered after its "
                    "visibility timeout, or never delivered",
                    i,
                )
            if flight.consumer.connection_id != connection_id:
                raise RequestError(
                    ErrorCode.FOREIGN_DELIVERY_TAG,
                    "this delivery tag was delivered on another connection; ack it there",
                    i,
                )
            seen.add(key)
            flights.append(flight)
        for flight in flights:
            flight.acking = True
        return flights

    def unclaim(self, flights: list[InFlight], now_ms: int) -> None:
        """Undo :meth:`claim_tags` after the ACK/NACK could not be committed."""
        for flight in flights:
            if self.in_flight.get(flight.key) is flight:
                flight.acking = False
                if flight.consumer.closed or flight.deadline_ms <= now_ms:
                    self._release(flight, now_ms)

    def horizon_contains(self, runtime: GroupRuntime, due_ms: int, mid: int) -> bool:
        """True when ``(due_ms, mid)`` is below the group's loaded bound."""
        return pack(due_ms, mid) < runtime.loaded_until

    def drop_group(self, group_id: int, now_ms: int) -> None:
        """Forget a deleted group: its consumers leave, its deliveries are dropped."""
        runtime = self.groups.pop(group_id, None)
        self.touched.discard(group_id)
        if runtime is None:
            return
        for consumer in list(runtime.consumers):
            consumer.closed = True
            self.consumers.pop(consumer.subscription_id, None)
            for key in list(consumer.in_flight):
                self.forget(key)
        runtime.consumers.clear()

    def clear(self) -> None:
        """Forget everything (leadership lost)."""
        self.groups.clear()
        self.touched.clear()
        self.in_flight.clear()
        self._deadlines.clear()
        for consumer in self.consumers.values():
            consumer.closed = True
        self.consumers.clear()
