"""The hub: consumer subscriptions, credit, in-flight deliveries and visibility timeouts.

Leader-local memory (``DESIGN.md``, "Only the leader dispatches"): which consumer holds
which delivery, until when. Attempt numbers are not kept here: the dispatcher commits
each redelivery's attempt (a DELIVERED command) before pushing it, so a new leader,
which starts with an empty hub, continues the count where the old one stopped.

Credit is conserved exactly, per subscription (``docs/protocol.md``, "Flow control"):
a push uses one credit; a delivery the *consumer* settles (ACK, NACK, RELEASE) is
given back by the consumer's CREDIT frames; a delivery taken back for any other
reason (its visibility timeout passed, a command removed it) is given back by the
server itself, and the consumer is told with a REVOKE frame, so both ends count the
same. A subscription the server ends (its group deleted) gets a SUBSCRIPTION_END.

The hub owns one :class:`GroupRuntime` per consumer group that has something to do
(consumers, deliveries in flight, entries within the horizon): the group's
:class:`~futureq.state.due_index.DueIndex` horizon, its consumers in round-robin order,
and the released counts of the entries in the horizon. Idle groups have no runtime and
cost nothing per dispatch pass; every change that may give a group work to do puts its
id in :attr:`Hub.touched`, which the dispatcher drains (``DESIGN.md``, "Every buffer is
bounded in bytes; no request holds the event loop").
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import math
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

import attrs

from futureq.errors import ErrorCode, RequestError
from futureq.state import commands
from futureq.state.due_index import DueIndex, pack
from futureq.wire import frames
from futureq.wire.codec import encode_frame
from futureq.wire.validation import MAX_VISIBILITY_TIMEOUT_MS

if TYPE_CHECKING:
    from futureq.state.queue_state import GroupInfo

log = logging.getLogger(__name__)

MAX_VISIBILITY_MS = MAX_VISIBILITY_TIMEOUT_MS
"""Longest visibility timeout or extension (ms): 12 h, as a group's own."""


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
        outbox: Where DELIVER, REVOKE and SUBSCRIPTION_* frames go.
        credit: Deliveries the server may still push (items).
        in_flight: Schedule keys delivered to it (or being recorded for it) and not
            yet settled, timed out or removed.
        prefetch: The window asked for in SUBSCRIBE (items), for status.
        settings: ``(visibility_timeout_ms, max_deliveries)`` last sent to it in
            SUBSCRIPTION_INFO.
        headers: Its DELIVER items carry each message's headers (SUBSCRIBE asked).
        asks_handed: Its connection speaks protocol version 4: a leader handing over
            gracefully asks it which deliveries were handed (HANDOVER).
        max_out: Most of its deliveries out at once (``limits.max_prefetch``), whatever
            credit it holds: credit past it waits until settlements free room.
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
    prefetch: int = 0
    settings: tuple[int, int] | None = None
    headers: bool = False
    asks_handed: bool = False
    max_out: float = math.inf

    def may_receive(self) -> bool:
        """True when it may be pushed a delivery now: credit, room under
        :attr:`max_out`, and room in its connection's buffer."""
        return (
            self.credit > 0
            and len(self.in_flight) < self.max_out
            and not self.closed
            and self.outbox.has_room()
        )

    def room(self) -> float:
        """How many deliveries it may be pushed now, as far as its credit and
        :attr:`max_out` go (>= 0; the connection's and node's bounds come on top)."""
        return max(0, min(self.credit, self.max_out - len(self.in_flight)))

    def send(self, frame: frames.Frame) -> bool:
        """Queue a frame for the consumer; a connection that cannot take it is closed.

        Returns:
            False when the consumer is (now) closed and the frame was not queued.
        """
        if self.closed:
            return False
        if not self.outbox.send_nowait(encode_frame(frame, 2**31)):
            log.info(
                "subscription %d: the connection takes no more frames; ending it",
                self.subscription_id,
            )
            self.closed = True
            return False
        return True


SettleCheck = Callable[[str, str], None]
"""Raises RequestError (PERMISSION_DENIED) unless a connection may consume from
``(topic, group)``: asked before it settles a delivery an earlier leader handed over."""
HeldEntry = tuple[int, int, "int | None", int, int, tuple[int, int]]
"""``(due_ms, message_id, expire_ms, attempt, released, (stamp, until_ms))`` of an
entry held for a delivery an earlier leader left out (:attr:`Hub.held_entry`)."""


class _NoOutbox:
    """The outbox of :attr:`Hub.orphans`: nobody to send to."""

    def send_nowait(self, data: bytes) -> bool:
        return False

    def has_room(self) -> bool:
        return False


ORPHAN_CONNECTION_ID: Final = -1
"""The connection id of :attr:`Hub.orphans` (no real connection has it)."""


def _orphans() -> Consumer:
    return Consumer(0, -1, "", "", ORPHAN_CONNECTION_ID, _NoOutbox(), 0, closed=True)


@attrs.define(eq=False)
class InFlight:
    """A delivery handed to a consumer and not yet settled.

    Attributes:
        attempt: The attempt number of this delivery (1 for the first).
        previous_attempt: The entry's attempt count before this delivery (what the
            entry goes back with if it is never pushed).
        released: Deliveries of the entry given back unprocessed (not counted).
        deadline_ms: When the visibility timeout runs out (ms since the Unix epoch);
            meaningless until ``pushed``.
        expire_ms: When the message's TTL runs out (ms since the Unix epoch), or None.
        acking: The consumer's ACK, NACK or RELEASE for it is being committed; do not
            time it out, and do not revoke it.
        pushed: Its DELIVERED record committed and the DELIVER frame queued. Before
            that the consumer cannot know its tag.
        pushed_ms: When it was pushed (ms since the Unix epoch); 0 until ``pushed``.
        recorded: Its attempt is in the log. A redelivery is recorded (DELIVERED)
            before it is pushed; a first delivery only once it is given back, or when
            the leader hands over with it out (RETURN_COUNTED).
    """

    key: bytes
    group_id: int
    due_ms: int
    mid: int
    expire_ms: int | None
    attempt: int
    previous_attempt: int
    released: int
    consumer: Consumer
    deadline_ms: int = 0
    acking: bool = False
    pushed: bool = False
    salt: int = 0
    pushed_ms: int = 0
    recorded: bool = False

    @property
    def still_out(self) -> bool:
        """It went out and is not being settled: pushed, and no ACK, NACK or RELEASE
        of it is being committed (one the visibility timeout may take back, a leader
        handing over must record)."""
        return self.pushed and not self.acking

    @property
    def unrecorded_out(self) -> bool:
        """It went out and the log does not know its attempt (a first delivery)."""
        return self.pushed and not self.recorded and self.attempt == 1

    @property
    def tag(self) -> bytes:
        """The delivery tag the consumer knows it by."""
        return commands.delivery_tag(self.key, self.attempt, self.salt)

    @property
    def stamp(self) -> int:
        """The last four bytes of :attr:`tag`, as a number."""
        return commands.tag_stamp(self.attempt, self.salt)

    @property
    def wake_ms(self) -> float:
        """When the delivery is taken back unless settled first (ms): its visibility
        deadline, or its message's expiry when that comes sooner."""
        if self.expire_ms is None or self.deadline_ms <= self.expire_ms:
            return self.deadline_ms
        return self.expire_ms

    @property
    def counted_attempt(self) -> int:
        """The attempt this delivery counts for so far: its own once pushed (it went
        out), else the one before it."""
        return self.attempt if self.pushed else self.previous_attempt


@attrs.define(eq=False)
class GroupRuntime:
    """Leader-local state of one consumer group.

    Attributes:
        info: The replicated group record (name, visibility timeout, max deliveries).
        index: The in-memory horizon of the group's schedule.
        loaded_until: Packed ``(due_ms, id)`` bound: every schedule entry below it is
            in ``index``, in flight, or being removed; entries at or above it are on
            disk only.
        released: Released counts (RELEASE) of entries in ``index``, by message id;
            only entries with a count above zero are listed.
    """

    info: GroupInfo
    index: DueIndex = attrs.Factory(DueIndex)
    loaded_until: int = 0
    consumers: dict[Consumer, None] = attrs.Factory(dict)
    """The group's subscriptions on this node, in the order they joined (an ordered set:
    one leaving is removed in O(1), not by a search of the group's list)."""
    released: dict[int, int] = attrs.Factory(dict)
    in_flight_count: int = 0
    counters: dict[tuple[str, str], Any] = attrs.Factory(dict)
    """Cached prometheus children of this group's counters, by (metric, group name)."""

    wake_ms: float = float("inf")
    """When the dispatcher is next due to look at this group (ms), as scheduled."""

    ready: dict[Consumer, None] = attrs.Factory(dict)
    """Consumers that may receive, next in turn first (an ordered set). One given
    credit or room, or new, is put at the end (:meth:`Hub.wake`); a look drops those it
    finds unable to receive and moves those it picks to the end. So a look reads the
    consumers it picks and those that stopped being able to receive since (each once),
    not every consumer of the group: publishing to a group whose 3,000 consumers were
    all or mostly busy read each of them per pass."""

    def has_credit(self) -> bool:
        """True when some consumer of the group may receive now (credit, buffer room)."""
        ready = self.ready
        while ready:
            c = next(iter(ready))
            if c.may_receive():
                return True
            del ready[c]
        return False

    def consumers_with_credit(self, limit: int) -> list[Consumer]:
        """Up to ``limit`` consumers that may receive now, in round-robin order.

        A consumer whose connection buffer is full is skipped: what is due stays with
        the group's other consumers (issue 10, "bound every per-connection buffer").
        The look stops at ``limit`` (the dispatcher passes how many entries are due):
        one message due costs a look at one consumer, not at every consumer of the
        group (3,000 consumers with credit: 0.34 ms a pass). Those returned go to the
        back of the turn.
        """
        if limit < 1:
            return []
        ready = self.ready
        found: list[Consumer] = []
        unable: list[Consumer] = []
        for c in ready:
            if c.may_receive():
                found.append(c)
                if len(found) >= limit:
                    break
            else:
                unable.append(c)
        for c in unable:
            del ready[c]
        for c in found:
            del ready[c]
            ready[c] = None
        return found

    def is_idle(self) -> bool:
        """Nothing in memory worth keeping: no consumer, nothing in flight or indexed."""
        return (
            not self.consumers
            and self.in_flight_count == 0
            and len(self.index) == 0
            and not self.released
        )


DEADLINE_HEAP_SLACK: Final = 4096
"""Stale entries the deadline heap may hold beyond twice the deliveries out before it
is rebuilt (:meth:`Hub._watch`)."""

REVOKE_TAGS_PER_FRAME: Final = 2048
"""Most tags one REVOKE carries (26 bytes each in msgpack: 53 KiB, within the smallest
``limits.max_frame_bytes``); more go in several REVOKE frames, in order."""
CANCELLED_TAGS_KEPT: Final = 65_536
"""Deliveries out when a CANCEL or PURGE removed their message that the leader remembers,
so a later ACK/NACK/RELEASE/EXTEND of one gets DELIVERY_CANCELLED rather than the
generic UNKNOWN_DELIVERY_TAG (oldest forgotten first; ~100 bytes each)."""
ENDED_TAGS_KEPT: Final = 65_536
"""Deliveries taken back from their consumer (visibility timeout, TTL, subscription
ended, message removed, group deleted) that the leader remembers with the reason, so a
later ACK/NACK/RELEASE/EXTEND of one is told why its tag is dead (oldest forgotten
first; ~230 bytes each, 15 MB at most). Settled ones are not kept (no cost on the
hot path), except those of deliveries an earlier leader handed over."""
STALE_SALT_ATTEMPTS: Final = 1 << 24
"""A tag whose stamp, less this leadership's salt, names an attempt at or past this was
not handed out by this leadership (an earlier leader's salt: 1 chance in 256 of a tag
of an earlier leader landing below it, which then gets the generic sentence)."""

TIMED_OUT: Final = (
    "this delivery was taken back after its visibility timeout (REVOKE), counted as an "
    "attempt: it comes again with a new tag (or goes to the dead-letter topic once out "
    "of attempts); EXTEND before the deadline keeps a delivery you are still working on"
)
TTL_RAN_OUT: Final = (
    "this delivery's message expired (its ttl_ms ran out) while it was out: it is "
    "never delivered again (removed, or sent to the dead-letter topic by a group with "
    "dead_letter_expired); there is nothing to settle"
)
DEAD_LETTERED: Final = (
    "this delivery's message was dead-lettered while it was out (out of attempts "
    "after its group's max_deliveries changed, or a NACK to the dead-letter topic): "
    "there is nothing to settle here; it is in the dead-letter topic"
)
RESCHEDULED: Final = (
    "this delivery's message was rescheduled (RESCHEDULE) while it was out: it is "
    "due again at its new time and comes with a new tag; there is nothing to settle"
)
SUBSCRIPTION_ENDED: Final = (
    "this delivery was taken back when its subscription ended (UNSUBSCRIBE, or its "
    "connection closed): it counted as an attempt and is due again for the group with "
    "a new tag; settle deliveries before leaving a subscription"
)
GROUP_DELETED: Final = (
    "this delivery's consumer group was deleted while it was out; its deliveries are "
    "void: there is nothing to settle (a group created again with the same name is a "
    "new group, with new tags)"
)
EARLIER_LEADERSHIP: Final = (
    "this delivery tag was not handed out by this leader: an earlier leader (or this "
    "node before a restart) handed it out, and did not hand it over (a crash, or "
    "leadership lost), or it was settled, taken back or removed since; there is nothing "
    "to settle with it: a delivery not settled comes again with a new tag"
)
SETTLED_HELD: Final = (
    "this delivery (handed out by an earlier leader that handed it over) was already "
    "settled by its tag: there is nothing more to settle"
)


class Hub:
    """Consumers, credit and in-flight deliveries of the groups this leader dispatches."""

    def __init__(self, salts: Callable[[], int] = lambda: secrets.randbits(32)) -> None:
        self._salts = salts
        self.tag_salt = salts()
        """What this leader adds to each delivery's attempt in its tag (0 to 2**32 - 1),
        drawn again whenever the hub is cleared (leadership gained or lost), so no tag
        of an earlier leadership, or of this node before a restart, names a delivery of
        this one (:func:`futureq.state.commands.delivery_tag`). ``salts``: where it is
        drawn from (tests pass their own)."""
        self.groups: dict[int, GroupRuntime] = {}
        self.in_flight: dict[bytes, InFlight] = {}
        self.orphans: Consumer = _orphans()
        """Holder of the deliveries an earlier leader handed out and left out when it
        handed over (HANDED_OUT, :meth:`hold`): no subscription of this node has them;
        any connection may settle one by its tag until its deadline
        (``docs/protocol.md``, "Delivery tags across leaders")."""
        self.cancelled: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        """Schedule key -> tag stamp of deliveries that were out when a CANCEL or PURGE
        removed their message (at most :data:`CANCELLED_TAGS_KEPT`; leader-local)."""
        self.ended: collections.OrderedDict[bytes, tuple[int, str]] = collections.OrderedDict()
        """Schedule key -> ``(tag stamp, sentence)`` of deliveries taken back from their
        consumer for another reason than a settlement or a cancellation, the sentence
        saying why (at most :data:`ENDED_TAGS_KEPT`; leader-local): what a later
        ACK/NACK/RELEASE/EXTEND of the tag is told (UNKNOWN_DELIVERY_TAG)."""
        self._deadlines: list[tuple[float, bytes]] = []
        """Heap of ``(wake_ms, key)`` of pushed deliveries (:attr:`InFlight.wake_ms`); an
        entry is live while the delivery in flight for ``key`` has that ``wake_ms`` and
        is not being settled."""
        self._subscription_ids = itertools.count(1)
        self.consumers: dict[int, Consumer] = {}
        self.touched: set[int] = set()
        """Ids of groups that may have work now (new consumer, credit, a release)."""
        self.group_info: Callable[[int], GroupInfo | None] = lambda group_id: None
        """Looks up a group's replicated record; set by the dispatcher."""
        self.held_entry: Callable[[bytes], HeldEntry | None] = lambda key: None
        """Looks up a schedule entry an earlier leader handed over with its delivery
        out, while that delivery's deadline has not passed (from the replicated state,
        the dispatcher's clock); set by the dispatcher. So a settlement that comes
        before a dispatch pass loaded the entry's group finds the delivery too."""
        self.returned: dict[bytes, tuple[int, int]] = {}
        """Schedule key -> ``(attempt, pushed_ms)`` of deliveries given back that went out
        unrecorded (a first delivery): they count, and the dispatcher records them
        (RETURN_COUNTED) so a restart or a new leader does not deliver attempt 1 again."""
        self.max_deliveries_out: float = math.inf
        """Most deliveries :attr:`in_flight` may hold (``limits.max_deliveries_out``; set
        by the dispatcher): at it a dispatch pass hands out nothing more."""
        self.max_out_per_connection: float = math.inf
        """Most deliveries one connection may have out (``limits.max_prefetch_per_connection``;
        set by the dispatcher), whatever CREDIT its subscriptions were granted: CREDIT
        adds credit whether or not deliveries were settled (a pull-mode client that
        fetches without settling does so too), so prefetch alone does not bound it."""
        self.out_by_connection: dict[int, int] = {}
        """Connection id -> its deliveries in :attr:`in_flight` (only those with some)."""
        self.capped: dict[int, dict[Consumer, None]] = {}
        """Connection id -> its consumers a pass skipped because the connection had
        :attr:`max_out_per_connection` out (an ordered set: a CREDIT meanwhile makes a
        pass skip the same consumer again); woken when one of its deliveries drops."""
        self.held_back = False
        """A pass found :attr:`in_flight` at :attr:`max_deliveries_out` and handed out
        nothing: the first delivery dropped below it wakes the dispatcher (else a
        consumer that settles without granting credit would leave the others waiting
        for an unrelated wake-up)."""
        self.look_again_by: Callable[[float], None] = lambda at_ms: None
        """Tells the dispatcher it must look again no later than ``at_ms`` (ms since the
        Unix epoch; ``-inf``: now); set by the dispatcher. Called by every change that
        gives it work sooner than it may have planned: a consumer able to receive again
        (credit given back, :meth:`wake`) or a delivery's deadline set or moved earlier
        (:meth:`mark_pushed`, :meth:`extend`, :meth:`unclaim`). A dispatcher asleep until
        a later deadline would otherwise sleep on past it."""

    def wake(self, consumer: Consumer) -> None:
        """The consumer may receive again (credit, buffer room, new): it joins its
        group's turn (:attr:`GroupRuntime.ready`) and the dispatcher looks at the group
        on its next pass, which it is told to make now. Every change that can let a
        consumer receive must call this: credit given back by the server too (a REVOKE
        of any reason), or the consumer may wait for some unrelated wake-up."""
        self.touched.add(consumer.group_id)
        runtime = self.groups.get(consumer.group_id)
        if runtime is not None and not consumer.closed:
            runtime.ready.setdefault(consumer)
        self.look_again_by(-math.inf)

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
        runtime.consumers[consumer] = None
        self.wake(consumer)

    def send_settings(self, consumer: Consumer, info: GroupInfo) -> None:
        """Tell a consumer its group's settings (SUBSCRIPTION_INFO), if it does not know them."""
        settings = (info.visibility_timeout_ms, info.max_deliveries)
        if consumer.settings == settings or consumer.closed:
            return
        consumer.settings = settings
        consumer.send(frames.SubscriptionInfo(0, consumer.subscription_id, *settings))

    def remove_consumer(
        self,
        consumer: Consumer,
        now_ms: int,
        end: tuple[ErrorCode, str] | None = None,
        *,
        keep: frozenset[bytes] = frozenset(),
    ) -> None:
        """Detach a subscription; its unsettled deliveries go back to the group.

        Each pushed one counts as an attempt (the consumer may have crashed processing
        it). With ``end`` (a code and a sentence) the consumer is first told, in a
        SUBSCRIPTION_END frame, that the server ended the subscription. Deliveries
        whose tag is in ``keep`` stay out instead, settleable on the consumer's
        connection until settled, timed out, or the leadership ends (a leader handing
        over: the application holds them, ``docs/protocol.md``, HANDOVER).
        """
        if end is not None:
            consumer.send(frames.SubscriptionEnd(0, consumer.subscription_id, int(end[0]), end[1]))
        consumer.closed = True
        self.consumers.pop(consumer.subscription_id, None)
        runtime = self.groups.get(consumer.group_id)
        if runtime is not None:
            runtime.consumers.pop(consumer, None)
            runtime.ready.pop(consumer, None)
        self.touched.add(consumer.group_id)
        for key in list(consumer.in_flight):
            flight = self.in_flight.get(key)
            if flight is not None and not flight.acking and flight.tag not in keep:
                self.give_back(flight)
                if flight.pushed:
                    self.note_ended(key, flight.stamp, SUBSCRIPTION_ENDED)

    def grant_credit(
        self, subscription_id: int, connection_id: int, credit: int, max_credit: int
    ) -> Consumer:
        """Add ``credit`` deliveries to a subscription, all of it or none.

        The credit is never cut: found by a tester, a server with ``limits.max_prefetch``
        100 cut a pull fetch's CREDIT of 500 to 100 without a word, the client went on
        counting 400 credits out, asked for no more, and received nothing again. What
        a subscription may have out is bounded elsewhere (per connection and per node).

        Args:
            credit: Deliveries to add (items, >= 1).
            max_credit: Most credit the subscription may hold with it (items).

        Raises:
            RequestError: UNKNOWN_SUBSCRIPTION; INVALID_ARGUMENT for credit < 1, or
                when the subscription would hold more than ``max_credit`` (nothing is
                added then).
        """
        consumer = self.consumers.get(subscription_id)
        if consumer is None or consumer.connection_id != connection_id:
            raise RequestError(
                ErrorCode.UNKNOWN_SUBSCRIPTION,
                f"no subscription {subscription_id} on this connection",
            )
        if credit < 1:
            raise RequestError(ErrorCode.INVALID_ARGUMENT, f"credit must be >= 1, got {credit}")
        if consumer.credit + credit > max_credit:
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT,
                f"credit {credit} would give subscription {subscription_id} "
                f"{consumer.credit + credit} credit, past the most one may hold "
                f"({max_credit}); grant credit as deliveries are settled",
            )
        consumer.credit += credit
        self.wake(consumer)
        return consumer

    # ----------------------------------------------------------- deliveries

    def track(self, flight: InFlight) -> None:
        """Record a delivery handed to its consumer (its DELIVERED not yet committed)."""
        self.in_flight[flight.key] = flight
        flight.consumer.in_flight.add(flight.key)
        out = self.out_by_connection
        connection_id = flight.consumer.connection_id
        out[connection_id] = out.get(connection_id, 0) + 1
        self.groups[flight.group_id].in_flight_count += 1

    def hold(
        self,
        key: bytes,
        due_ms: int,
        mid: int,
        expire_ms: int | None,
        attempt: int,
        released: int,
        held: tuple[int, int],
    ) -> InFlight:
        """Keep out a delivery an earlier leader left out when it handed over
        (HANDED_OUT): it stays invisible to the group until its deadline, then comes
        back counted like any timed out delivery; until then an ACK, NACK, RELEASE or
        EXTEND naming its tag is honoured from any connection (:attr:`orphans`).

        Args:
            key: Its schedule key (the group must have a runtime).
            due_ms, mid, expire_ms, attempt, released: The entry as stored.
            held: ``(stamp, until_ms)`` from :meth:`EntryValue.held`: the tag's stamp
                and the visibility deadline (ms since the Unix epoch).
        """
        stamp, until_ms = held
        gid = commands.parse_schedule_key(key)[0]
        flight = InFlight(
            key,
            gid,
            due_ms,
            mid,
            expire_ms,
            attempt,
            attempt,
            released,
            self.orphans,
            salt=(stamp - attempt) & 0xFFFFFFFF,  # so that its stamp is the tag's
        )
        self.track(flight)
        flight.pushed = True
        flight.recorded = True  # HANDED_OUT recorded its attempt
        flight.deadline_ms = until_ms
        self._watch(flight)
        self.look_again_by(flight.wake_ms)
        return flight

    def adopt(self, flight: InFlight) -> None:
        """Make a delivery whose subscription ended (its application holds it, named in
        the answer to HANDOVER) settleable from any connection, as :meth:`hold` does on
        the next leader: the handover recorded it (HANDED_OUT), and if this node goes on
        leading (the transfer failed) the client settles it on whatever connection it
        has now, not only on the one it came on."""
        if flight.consumer is self.orphans or not flight.consumer.closed:
            return
        flight.consumer.in_flight.discard(flight.key)
        out = self.out_by_connection
        connection_id = flight.consumer.connection_id
        left = out.pop(connection_id, 1) - 1
        if left:
            out[connection_id] = left
        flight.consumer = self.orphans
        self.orphans.in_flight.add(flight.key)
        out[ORPHAN_CONNECTION_ID] = out.get(ORPHAN_CONNECTION_ID, 0) + 1

    def _hold_found(self, key: bytes) -> InFlight | None:
        """:meth:`hold` the delivery an earlier leader left out under ``key`` if
        :attr:`held_entry` finds one and no pass has loaded the entry yet."""
        found = self.held_entry(key)
        if found is None:
            return None
        due_ms, mid, expire_ms, attempt, released, held = found
        runtime = self.runtime(commands.parse_schedule_key(key)[0])
        if runtime is None or pack(due_ms, mid) in runtime.index:
            return None
        return self.hold(key, due_ms, mid, expire_ms, attempt, released, held)

    def mark_pushed(self, flight: InFlight, deadline_ms: int, pushed_ms: int = 0) -> None:
        """The delivery went out (at ``pushed_ms``): its visibility timeout runs until
        ``deadline_ms`` (and it is taken back sooner if its message expires first)."""
        flight.pushed = True
        flight.pushed_ms = pushed_ms
        flight.recorded = flight.attempt > 1  # a redelivery's DELIVERED committed first
        flight.deadline_ms = deadline_ms
        self._watch(flight)
        self.look_again_by(flight.wake_ms)

    def _watch(self, flight: InFlight) -> None:
        """Put a pushed delivery's :attr:`InFlight.wake_ms` in the deadline heap.

        Entries a later deadline made stale are dropped only once they reach the top,
        so every EXTEND left one behind: found by a tester, a client sending EXTENDs of
        the deliveries it held (10,000 tags a frame, each shorter than the last, so none
        ever reached the top) grew the leader's heap without bound. Past
        :data:`DEADLINE_HEAP_SLACK` more entries than twice the deliveries out, the heap
        is rebuilt from the live ones (amortized O(1) per push).
        """
        deadlines = self._deadlines
        heapq.heappush(deadlines, (flight.wake_ms, flight.key))
        if len(deadlines) > 2 * len(self.in_flight) + DEADLINE_HEAP_SLACK:
            deadlines[:] = [
                (live.wake_ms, key) for key, live in self.in_flight.items() if live.still_out
            ]
            heapq.heapify(deadlines)

    def is_current(self, flight: InFlight) -> bool:
        """True while ``flight`` is still the delivery in flight for its key."""
        return self.in_flight.get(flight.key) is flight

    def forget(
        self, key: bytes, cancelled: bool = False, why: str | None = None
    ) -> InFlight | None:
        """Drop an in-flight delivery a command removed or rescheduled.

        A pushed delivery its consumer was not settling is taken back from the
        consumer: its credit is returned and the consumer gets a REVOKE (reason
        CANCELLED when ``cancelled``: a CANCEL or PURGE removed it; else REMOVED).
        A cancelled delivery that was out is remembered, so settling it later is
        answered DELIVERY_CANCELLED; one taken back for a reason ``why`` (a sentence)
        is remembered with it, so settling it later is told why (:meth:`find_tags`).
        """
        flight = self._drop(key)
        if flight is not None and flight.pushed:
            if cancelled:
                self.note_cancelled(key, flight.stamp)
            elif flight.acking:
                if why is None and flight.consumer is self.orphans:
                    # Settled by its tag after a handover (rare: no hot-path cost).
                    self.note_ended(key, flight.stamp, SETTLED_HELD)
            elif why is not None:
                self.note_ended(key, flight.stamp, why)
            if not flight.acking:
                reason = frames.RevokeReason.CANCELLED if cancelled else frames.RevokeReason.REMOVED
                self._revoke([flight], reason)
        return flight

    def note_cancelled(self, key: bytes, stamp: int) -> None:
        """Remember that the delivery ``key`` with tag stamp ``stamp`` was out when a
        CANCEL or PURGE removed its message: an ACK, NACK, RELEASE or EXTEND of its tag
        is answered DELIVERY_CANCELLED (the last :data:`CANCELLED_TAGS_KEPT`)."""
        self.cancelled[key] = stamp
        self.cancelled.move_to_end(key)
        while len(self.cancelled) > CANCELLED_TAGS_KEPT:
            self.cancelled.popitem(last=False)

    def note_ended(self, key: bytes, stamp: int, why: str) -> None:
        """Remember that the delivery ``key`` with tag stamp ``stamp`` was taken back
        from its consumer, and ``why`` (a sentence): an ACK, NACK, RELEASE or EXTEND of
        its tag is told so (the last :data:`ENDED_TAGS_KEPT`)."""
        self.ended[key] = (stamp, why)
        self.ended.move_to_end(key)
        while len(self.ended) > ENDED_TAGS_KEPT:
            self.ended.popitem(last=False)

    def _drop(self, key: bytes) -> InFlight | None:
        flight = self.in_flight.pop(key, None)
        if flight is not None:
            consumer = flight.consumer
            consumer.in_flight.discard(key)
            if len(consumer.in_flight) + 1 == consumer.max_out and consumer.credit > 0:
                # It was at limits.max_prefetch out, so it left its group's turn with
                # credit in hand: room again (a pull fetch's credit past the limit).
                self.wake(consumer)
            runtime = self.groups.get(flight.group_id)
            if runtime is not None:
                runtime.in_flight_count -= 1
            connection_id = flight.consumer.connection_id
            out = self.out_by_connection
            left = out.pop(connection_id, 1) - 1
            if left:
                out[connection_id] = left
            if self.capped:
                skipped = self.capped.pop(connection_id, None)
                for consumer in skipped or ():
                    self.wake(consumer)
            if self.held_back:
                self.held_back = False
                self.look_again_by(-math.inf)
        return flight

    def room_for(self, consumer: Consumer) -> float:
        """How many more deliveries ``consumer``'s connection may have out (>= 0)."""
        return max(
            0, self.max_out_per_connection - self.out_by_connection.get(consumer.connection_id, 0)
        )

    def skip_capped(self, consumer: Consumer, runtime: GroupRuntime) -> None:
        """``consumer``'s connection has :attr:`max_out_per_connection` out: it leaves
        its group's turn (so the group does not look able to receive, and no pass spins
        on it) until one of the connection's deliveries drops (:meth:`_drop` wakes it)."""
        runtime.ready.pop(consumer, None)
        self.capped.setdefault(consumer.connection_id, {})[consumer] = None

    def room_out(self) -> float:
        """How many more deliveries may go out before :attr:`max_deliveries_out` (>= 0)."""
        return max(0, self.max_deliveries_out - len(self.in_flight))

    def give_back(self, flight: InFlight) -> None:
        """Put a delivery back in its group's index.

        A pushed delivery keeps its attempt: it counted. If the log does not know that
        attempt (a first delivery) it is noted in :attr:`returned` for the dispatcher to
        record. One that never went out goes back with the attempt count it had.
        """
        self._drop(flight.key)
        if flight.unrecorded_out:
            self.returned[flight.key] = (flight.attempt, flight.pushed_ms)
        if not flight.pushed:
            flight.consumer.credit += 1
        runtime = self.groups.get(flight.group_id)
        if runtime is None:
            return
        attempt = flight.counted_attempt
        if flight.released:
            runtime.released[flight.mid] = flight.released
        runtime.index.add(flight.due_ms, flight.mid, flight.expire_ms, attempt)
        if flight.consumer is self.orphans:
            self.touched.add(flight.group_id)
            self.look_again_by(-math.inf)
        else:
            self.wake(flight.consumer)

    def take_returned(self, limit: int) -> list[tuple[bytes, int, int]]:
        """Up to ``limit`` entries of :attr:`returned`, taken out of it."""
        found: list[tuple[bytes, int, int]] = []
        returned = self.returned
        while returned and len(found) < limit:
            key, (attempt, pushed_ms) = returned.popitem()
            found.append((key, attempt, pushed_ms))
        return found

    def _revoke(self, flights: list[InFlight], reason: frames.RevokeReason) -> None:
        """Return the credit of pushed deliveries taken back, and tell their consumers."""
        by_consumer: dict[int, tuple[Consumer, list[bytes]]] = {}
        for flight in flights:
            consumer = flight.consumer
            if consumer.closed:
                continue
            consumer.credit += 1
            self.wake(consumer)
            by_consumer.setdefault(id(consumer), (consumer, []))[1].append(flight.tag)
        for consumer, tags in by_consumer.values():
            # One frame for all of them once went past max_frame_bytes (a visibility
            # timeout of 10,000 deliveries out is 260 KB of tags).
            for start in range(0, len(tags), REVOKE_TAGS_PER_FRAME):
                chunk = tags[start : start + REVOKE_TAGS_PER_FRAME]
                consumer.send(frames.Revoke(0, consumer.subscription_id, chunk, int(reason)))

    def expire_visibility(self, now_ms: int) -> int:
        """Take back deliveries whose visibility timeout or TTL ran out; return how many.

        Each goes back to its group's index (its attempt counted), its credit goes
        back to its consumer, and the consumer gets a REVOKE naming it: reason
        VISIBILITY_TIMEOUT, or REMOVED when its message expired (TTL) — the index then
        holds it only until the dispatcher's pass proposes its EXPIRE, and it is never
        delivered again (``docs/protocol.md``, "Due time, TTL and expiry").
        """
        released: list[InFlight] = []
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now_ms:
            wake_ms, key = heapq.heappop(deadlines)
            flight = self.in_flight.get(key)
            if flight is None or flight.wake_ms != wake_ms or flight.acking:
                continue
            self.give_back(flight)
            released.append(flight)
        self._revoke_taken_back(released, now_ms)
        return len(released)

    def _revoke_taken_back(self, flights: list[InFlight], now_ms: int) -> None:
        """REVOKE deliveries taken back at ``now_ms``: as REMOVED those whose message's
        TTL ran out, the others as VISIBILITY_TIMEOUT."""
        expired: list[InFlight] = []
        timed_out: list[InFlight] = []
        for flight in flights:
            ran_out = flight.expire_ms is not None and flight.expire_ms <= now_ms
            (expired if ran_out else timed_out).append(flight)
            self.note_ended(flight.key, flight.stamp, TTL_RAN_OUT if ran_out else TIMED_OUT)
        if expired:
            self._revoke(expired, frames.RevokeReason.REMOVED)
        if timed_out:
            self._revoke(timed_out, frames.RevokeReason.VISIBILITY_TIMEOUT)

    def next_deadline_ms(self) -> float | None:
        """Earliest time a pushed delivery is due to be taken back (its visibility
        deadline or its message's expiry, ms), or None."""
        while self._deadlines:
            wake_ms, key = self._deadlines[0]
            flight = self.in_flight.get(key)
            if flight is None or flight.wake_ms != wake_ms or flight.acking:
                heapq.heappop(self._deadlines)
                continue
            return wake_ms
        return None

    def find_tags(
        self, tags: list[bytes], connection_id: int, may_settle: SettleCheck | None = None
    ) -> list[InFlight]:
        """The in-flight deliveries ``tags`` name, all held by this connection (or kept
        out for their tags after an earlier leader handed over, :meth:`hold`).

        Args:
            tags: Delivery tags from an ACK, NACK, RELEASE or EXTEND.
            connection_id: The connection that sent them.
            may_settle: For a delivery an earlier leader handed over (any connection
                may settle it by its tag): raises PERMISSION_DENIED unless the
                connection may consume from ``(topic, group)``; None: no check.

        Returns:
            The deliveries, in tag order.

        Raises:
            RequestError: UNKNOWN_DELIVERY_TAG (malformed, never delivered, already
                settled, taken back, from an earlier attempt, or repeated) or
                FOREIGN_DELIVERY_TAG (delivered to another connection), with the index
                of the first bad tag.
        """
        flights: list[InFlight] = []
        seen: dict[bytes, int] = {}
        for i, tag in enumerate(tags):
            parsed = commands.parse_delivery_tag(tag)
            if parsed is None:
                raise RequestError(
                    ErrorCode.UNKNOWN_DELIVERY_TAG,
                    f"delivery tag must be {commands.DELIVERY_TAG_BYTES} bytes as received in DELIVER",
                    i,
                )
            key, stamp = parsed
            if key in seen:
                raise RequestError(
                    ErrorCode.UNKNOWN_DELIVERY_TAG,
                    f"delivery tag {i} of this request names the same delivery as tag "
                    f"{seen[key]}; send each tag once",
                    i,
                )
            flight = self.in_flight.get(key)
            if flight is None:
                flight = self._hold_found(key)
            if flight is None and self.cancelled.get(key) == stamp:
                raise RequestError(
                    ErrorCode.DELIVERY_CANCELLED,
                    "this delivery's message was cancelled (CANCEL or PURGE) while it was "
                    "out; there is nothing to settle: do not process it",
                    i,
                )
            if flight is None or flight.stamp != stamp or flight.acking or not flight.pushed:
                raise RequestError(ErrorCode.UNKNOWN_DELIVERY_TAG, self._why_unknown(key, stamp), i)
            if flight.consumer is self.orphans and may_settle is not None:
                runtime = self.groups.get(flight.group_id)
                if runtime is not None:
                    try:
                        may_settle(runtime.info.topic, runtime.info.name)
                    except RequestError as exc:
                        raise RequestError(exc.code, exc.message, i) from None
            if (
                flight.consumer.connection_id != connection_id
                and flight.consumer is not self.orphans
            ):
                raise RequestError(
                    ErrorCode.FOREIGN_DELIVERY_TAG,
                    "this delivery tag was delivered on another connection; settle it there",
                    i,
                )
            seen[key] = i
            flights.append(flight)
        return flights

    def _why_unknown(self, key: bytes, stamp: int) -> str:
        """The sentence an ACK, NACK, RELEASE or EXTEND of an unknown tag (schedule key
        ``key``, stamp ``stamp``) is answered with: why it is dead, as far as this
        leader knows."""
        ended = self.ended.get(key)
        if ended is not None and ended[0] == stamp:
            return ended[1]
        if (stamp - self.tag_salt) & 0xFFFFFFFF >= STALE_SALT_ATTEMPTS:
            return EARLIER_LEADERSHIP
        return (
            "unknown delivery tag: already settled, taken back after its visibility "
            "timeout (see REVOKE), or never delivered"
        )

    def claim_tags(
        self, tags: list[bytes], connection_id: int, may_settle: SettleCheck | None = None
    ) -> list[InFlight]:
        """:meth:`find_tags`, then mark the deliveries ``acking`` (all or none).

        Raises:
            RequestError: as :meth:`find_tags`; nothing is claimed then.
        """
        flights = self.find_tags(tags, connection_id, may_settle)
        for flight in flights:
            flight.acking = True
        return flights

    def unclaim(self, flights: list[InFlight], now_ms: int) -> None:
        """Undo :meth:`claim_tags` after the ACK/NACK/RELEASE could not be committed.

        A delivery whose deadline passed meanwhile is taken back now; the others' are
        watched again (a pass drops the heap entry of a delivery being settled, so
        without this it would never time out). One a command removed meanwhile (CANCEL,
        PURGE, RESCHEDULE, expiry) is revoked now, its credit returned.
        """
        taken_back: list[InFlight] = []
        cancelled: list[InFlight] = []
        removed: list[InFlight] = []
        earliest = math.inf
        for flight in flights:
            if self.in_flight.get(flight.key) is flight:
                flight.acking = False
                gone = flight.consumer.closed and flight.consumer is not self.orphans
                if gone or flight.wake_ms <= now_ms:
                    self.give_back(flight)
                    taken_back.append(flight)
                else:
                    self._watch(flight)
                    earliest = min(earliest, flight.wake_ms)
            elif flight.pushed:
                # A command removed it while it was being settled (:meth:`forget`
                # revokes nothing being settled: the settlement's OK was to give the
                # credit back). The settlement failed, so the REVOKE is due now; before,
                # the subscription's window shrank by one for good.
                was_cancelled = self.cancelled.get(flight.key) == flight.stamp
                (cancelled if was_cancelled else removed).append(flight)
        self._revoke_taken_back(taken_back, now_ms)
        if cancelled:
            self._revoke(cancelled, frames.RevokeReason.CANCELLED)
        if removed:
            self._revoke(removed, frames.RevokeReason.REMOVED)
        self.look_again_by(earliest)

    def extend(
        self,
        tags: list[bytes],
        connection_id: int,
        visibility_ms: int,
        now_ms: int,
        may_settle: SettleCheck | None = None,
    ) -> int:
        """Push the visibility deadline of held deliveries to ``now_ms + visibility_ms``.

        Like SQS ChangeMessageVisibility, the new deadline counts from now and may be
        earlier than the old one. All or nothing.

        Returns:
            How many deliveries were extended.

        Raises:
            RequestError: as :meth:`find_tags`; INVALID_ARGUMENT for ``visibility_ms``
                outside 1 .. 12 h.
        """
        if not 1 <= visibility_ms <= MAX_VISIBILITY_MS:
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT,
                f"visibility_ms must be between 1 and {MAX_VISIBILITY_MS} (12 h), got {visibility_ms}",
            )
        flights = self.find_tags(tags, connection_id, may_settle)
        deadline_ms = now_ms + visibility_ms
        for flight in flights:
            flight.deadline_ms = deadline_ms
            self._watch(flight)
        if flights:
            # A shorter visibility moves the deadline before the dispatcher's planned
            # wake-up (docs/protocol.md, EXTEND: "it may be shorter than what was left").
            self.look_again_by(min(flight.wake_ms for flight in flights))
        return len(flights)

    def horizon_contains(self, runtime: GroupRuntime, due_ms: int, mid: int) -> bool:
        """True when ``(due_ms, mid)`` is below the group's loaded bound."""
        return pack(due_ms, mid) < runtime.loaded_until

    def drop_group(self, group_id: int, end: tuple[ErrorCode, str] | None = None) -> None:
        """Forget a deleted group: its consumers leave, its deliveries are dropped.

        With ``end`` each consumer is first told why (SUBSCRIPTION_END); its
        deliveries are void, so no REVOKE follows.
        """
        runtime = self.groups.pop(group_id, None)
        self.touched.discard(group_id)
        if runtime is None:
            return
        for consumer in list(runtime.consumers):
            if end is not None:
                consumer.send(
                    frames.SubscriptionEnd(0, consumer.subscription_id, int(end[0]), end[1])
                )
            consumer.closed = True
            self.consumers.pop(consumer.subscription_id, None)
            for key in list(consumer.in_flight):
                flight = self._drop(key)
                if flight is not None:
                    runtime.in_flight_count -= 1  # _drop no longer finds the runtime
                    if flight.pushed and not flight.acking:
                        self.note_ended(key, flight.stamp, GROUP_DELETED)
        runtime.consumers.clear()
        if runtime.in_flight_count:
            # Deliveries of consumers that left while their ACK was being committed:
            # rare, so the sweep of every delivery in flight on the node runs only then.
            for key in [k for k, f in self.in_flight.items() if f.group_id == group_id]:
                flight = self._drop(key)
                if flight is not None and flight.pushed and not flight.acking:
                    self.note_ended(key, flight.stamp, GROUP_DELETED)

    def clear(self) -> None:
        """Forget everything (leadership lost, or gained), and draw a new tag salt."""
        self.tag_salt = self._salts()
        self.orphans = _orphans()
        self.groups.clear()
        self.returned.clear()
        self.touched.clear()
        self.in_flight.clear()
        self.out_by_connection.clear()
        self.capped.clear()
        self.held_back = False
        self._deadlines.clear()
        for consumer in self.consumers.values():
            consumer.closed = True
        self.consumers.clear()
