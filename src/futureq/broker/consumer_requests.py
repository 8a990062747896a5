"""Consumer requests: SUBSCRIBE, and ACK, NACK, RELEASE and EXTEND of delivery tags.

Plain functions over a :class:`~futureq.broker.broker.Broker`. Settling a delivery
claims its tag in the hub, proposes the command and answers once it is durable; a
proposal that fails gives the claimed deliveries back.

Source: ``DESIGN.md``, "Message semantics"; ``docs/protocol.md``, "SUBSCRIBE", "ACK",
"NACK", "RELEASE", "EXTEND".
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from futureq import request_order
from futureq.errors import ErrorCode, RequestError
from futureq.state import commands
from futureq.wire import frames, validation

from . import publishing
from .hub import Consumer, InFlight, Outbox, SettleCheck

if TYPE_CHECKING:
    from futureq.config import LimitsSection

    from .broker import Broker

log = logging.getLogger(__name__)

MAX_NACK_REASON_BYTES = 256
"""Longest NACK reason text (UTF-8 bytes): it is stored with the entry and in headers."""


FIRST_VERSION_TOLD_MAX_PREFETCH = 5
"""The protocol version whose HELLO_OK carries ``max_prefetch``: its clients know the
limit, so a SUBSCRIBE window past it is refused. An older client cannot know it (and
the reference client of version 3 subscribed a pull fetch with its whole count as the
window): its window past the limit is taken as credit, and no more than the limit goes
out (``docs/protocol.md``, SUBSCRIBE)."""


def most_window(limits: LimitsSection, protocol_version: int) -> int:
    """The largest SUBSCRIBE ``prefetch`` a connection of ``protocol_version`` may ask
    for (items): ``limits.max_prefetch`` from version 5 on, else the protocol's
    :data:`~futureq.wire.validation.MAX_CREDIT` (the window is then credit, and what
    goes out stays within ``limits.max_prefetch``)."""
    if protocol_version >= FIRST_VERSION_TOLD_MAX_PREFETCH:
        return limits.max_prefetch
    return validation.MAX_CREDIT


def counted_prefetch(limits: LimitsSection, prefetch: int) -> int:
    """How many deliveries a subscription of SUBSCRIBE window ``prefetch`` may have out
    at once (items): the window, at most ``limits.max_prefetch`` (an older client's
    window past it is taken as credit, but no more than that goes out:
    :data:`FIRST_VERSION_TOLD_MAX_PREFETCH`)."""
    return min(prefetch, limits.max_prefetch)


async def subscribe(
    broker: Broker,
    connection_id: int,
    outbox: Outbox,
    topic: str,
    group: str,
    prefetch: int,
    headers: bool = False,
    protocol_version: int = frames.PROTOCOL_VERSION,
) -> Consumer:
    """The work of :meth:`Broker.subscribe` (its docstring: arguments, result, errors)."""
    max_prefetch = broker.config.limits.max_prefetch
    most = most_window(broker.config.limits, protocol_version)
    if not 1 <= prefetch <= most:
        if most == max_prefetch:
            why = (
                f"(this server's limits.max_prefetch is {max_prefetch}); subscribe with a "
                "smaller window and grant more with CREDIT as deliveries are settled"
            )
        else:
            why = f"(the most credit one subscription may hold is {most})"
        raise RequestError(
            ErrorCode.INVALID_ARGUMENT,
            f"prefetch must be between 1 and {most}, got {prefetch} {why}",
        )
    info = await broker.ensure_group(topic, group)
    broker._require_leader()
    if broker.state.groups.get(info.group_id) is not info:
        # Deleted while we waited for the group's creation to commit.
        raise RequestError(
            ErrorCode.UNAVAILABLE, f"group {group!r} of topic {topic!r} is changing; retry"
        )
    consumer = Consumer(
        broker.hub.new_subscription_id(),
        info.group_id,
        topic,
        group,
        connection_id,
        outbox,
        prefetch,
        prefetch=counted_prefetch(broker.config.limits, prefetch),
        headers=headers,
        max_out=max_prefetch,
    )
    broker.hub.add_consumer(consumer)
    broker.dispatcher.kick()
    return consumer


async def unsubscribe(broker: Broker, consumer: Consumer, handed: list[bytes] | None) -> None:
    """The work of :meth:`Broker.unsubscribe_handed` (its docstring: arguments, errors).

    The deliveries to release are claimed before the subscription closes and released
    after it closed, so none of them can be pushed to it again in between (the race a
    client's RELEASE before its UNSUBSCRIBE could not avoid: the server pushed a
    released message straight back with credit it still held, and the UNSUBSCRIBE
    counted it).
    """
    try:
        await _unsubscribe(broker, consumer, handed)
    finally:
        ask = broker.handed_ask
        if ask is not None:
            ask.left(consumer)  # a leader handing over waits for this (HANDOVER)


async def _unsubscribe(broker: Broker, consumer: Consumer, handed: list[bytes] | None) -> None:
    hub = broker.hub
    unread: list[InFlight] = []
    keep: frozenset[bytes] = frozenset()
    if handed is not None and broker.log.is_leader():
        seen = set(handed)
        ask = broker.handed_ask
        if ask is not None and consumer.subscription_id in ask.waiting:
            # The answer to a HANDOVER: the application holds these, and may still
            # settle them on this node until the leadership moves (before version 4
            # it could too; they are recorded as counted attempts all the same).
            keep = frozenset(seen)
        for key in consumer.in_flight:
            flight = hub.in_flight.get(key)
            # One never pushed goes back uncounted anyway (remove_consumer).
            if (
                flight is not None
                and flight.pushed
                and not flight.acking
                and flight.tag not in seen
            ):
                flight.acking = True
                unread.append(flight)
    broker.unsubscribe(consumer, keep)
    if not unread:
        return
    # As in release(): a RESCHEDULE being committed may move one of these entries first
    # (before, the release applied to nothing and the unread delivery counted).
    following, mark = broker.settlements_follow()
    try:
        await broker.log.propose(commands.release([(f.key, f.attempt) for f in unread], following))
        broker.settlement_applied(mark)
    except BaseException as exc:
        # The subscription has ended either way: they go back counted, as before.
        hub.unclaim(unread, broker.clock.wall_ms())
        if not isinstance(exc, Exception):
            raise
        log.info(
            "UNSUBSCRIBE: %d unread deliveries went back counted: their release failed (%s)",
            len(unread),
            exc,
        )


async def release(
    broker: Broker, connection_id: int, tags: list[bytes], may_settle: SettleCheck | None = None
) -> int:
    """The work of :meth:`Broker.release` (its docstring: arguments, result, errors)."""
    broker._require_leader()
    validation.check_tags(tags, broker.limits)
    await _after_redrives(broker, tags, connection_id, may_settle)
    flights = broker.hub.claim_tags(tags, connection_id, may_settle)
    entries = [(flight.key, flight.attempt) for flight in flights]
    # As in ack(): a RESCHEDULE being committed may move one of these entries first.
    following, mark = broker.settlements_follow()
    try:
        with request_order.effect():
            done = await broker.log.propose(commands.release(entries, following))
    except BaseException:
        broker.hub.unclaim(flights, broker.clock.wall_ms())
        raise
    broker.settlement_applied(mark)
    return int(done)


def extend(
    broker: Broker,
    connection_id: int,
    tags: list[bytes],
    visibility_ms: int,
    may_settle: SettleCheck | None = None,
) -> int:
    """The work of :meth:`Broker.extend` (its docstring: arguments, result, errors)."""
    broker._require_leader()
    validation.check_tags(tags, broker.limits)
    # `extend(30)` meant as 30 s took the deliveries back 30 ms later: the unit mistake
    # GROUP_CREATE and the configuration already refuse (docs/protocol.md, "Units").
    validation.check_visibility_timeout_ms(visibility_ms, field="visibility_ms")
    return broker.hub.extend(tags, connection_id, visibility_ms, broker.clock.wall_ms(), may_settle)


async def _after_redrives(
    broker: Broker, tags: list[bytes], connection_id: int, may_settle: SettleCheck | None
) -> None:
    """Return once no REDRIVE that may still commit names an entry ``tags`` deliver
    (before an ACK, NACK or RELEASE claims them).

    Found by a tester: an ACK of a dead letter taken while a REDRIVE of it was being
    committed was answered OK, though the REDRIVE committed first: the dead letter was
    replayed to its topic, and the ACK acknowledged nothing. Now the settlement waits
    for the REDRIVE; a dead letter it took is then revoked (REVOKE reason 2), so the
    settlement is refused with UNKNOWN_DELIVERY_TAG like any after a REVOKE. A REDRIVE
    that ended unanswered may still be in the log: a NOOP proposed after it is
    waited for.

    Raises:
        RequestError: as :meth:`Hub.find_tags`.
    """
    while broker.redriving or broker.redrives_unanswered:
        keys = [flight.key for flight in broker.hub.find_tags(tags, connection_id, may_settle)]
        pending = [broker.redriving[key] for key in keys if key in broker.redriving]
        if pending:
            for answered in pending:
                await answered.wait()
            continue
        unanswered = broker.redrives_unanswered.intersection(keys)
        if not unanswered:
            return
        passed = set(broker.redrives_unanswered)
        await broker.log.propose(commands.NOOP)  # applied: every entry before it too
        broker.redrives_unanswered.difference_update(passed)


async def ack(
    broker: Broker, connection_id: int, tags: list[bytes], may_settle: SettleCheck | None = None
) -> int:
    """The work of :meth:`Broker.ack` (its docstring: arguments, result, errors)."""
    broker._require_leader()
    validation.check_tags(tags, broker.limits)
    await _after_redrives(broker, tags, connection_id, may_settle)
    flights = broker.hub.claim_tags(tags, connection_id, may_settle)
    # A RESCHEDULE being committed may move one of these entries before this ACK commits:
    # the ACK then acknowledges the entry where it went (else the consumer is told OK and
    # the message comes again at its new time).
    following, mark = broker.settlements_follow()
    try:
        with request_order.effect():
            done = await broker.log.propose(
                commands.ack([flight.key for flight in flights], following)
            )
    except BaseException:
        broker.hub.unclaim(flights, broker.clock.wall_ms())
        raise
    broker.settlement_applied(mark)
    return int(done)


async def nack(
    broker: Broker,
    connection_id: int,
    tags: list[bytes],
    requeue_delay_ms: int,
    reason: str | None = None,
    dead_letter: bool = False,
    may_settle: SettleCheck | None = None,
) -> int:
    """The work of :meth:`Broker.nack` (its docstring: arguments, result, errors)."""
    broker._require_leader()
    validation.check_tags(tags, broker.limits)
    if requeue_delay_ms < 0:
        raise RequestError(
            ErrorCode.INVALID_DELAY, f"requeue_delay_ms is {requeue_delay_ms}; it must be >= 0"
        )
    if requeue_delay_ms > broker.limits.max_delay_ms:
        raise RequestError(
            ErrorCode.INVALID_DELAY,
            validation.over_limit(
                "requeue_delay_ms",
                requeue_delay_ms,
                broker.limits.max_delay_ms,
                validation.MAX_DELAY_SETTING,
                "requeue sooner",
            ),
        )
    if reason is not None and len(reason.encode("utf-8")) > MAX_NACK_REASON_BYTES:
        raise RequestError(
            ErrorCode.INVALID_ARGUMENT,
            f"a NACK reason holds {len(reason.encode('utf-8'))} bytes; the limit is "
            f"{MAX_NACK_REASON_BYTES}: keep it short (it travels in the dead letter's headers)",
        )
    await _after_redrives(broker, tags, connection_id, may_settle)
    flights = broker.hub.claim_tags(tags, connection_id, may_settle)
    # When each went out: a first delivery's time is known only here (a dead letter's
    # futureq-first-delivery-ms), a redelivery's was recorded already (kept).
    entries = [(flight.key, flight.attempt, flight.pushed_ms or None) for flight in flights]
    following, mark = broker.settlements_follow()  # as in ack()
    try:
        with request_order.effect():
            done = await broker.log.propose(
                commands.nack(
                    publishing.stamp(broker),
                    requeue_delay_ms,
                    entries,
                    reason,
                    dead_letter,
                    broker.group_settings,
                    following,
                )
            )
    except BaseException:
        broker.hub.unclaim(flights, broker.clock.wall_ms())
        raise
    broker.settlement_applied(mark)
    return int(done)
