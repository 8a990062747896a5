"""Publish and consume frames: PUBLISH and its answer, SUBSCRIBE, the server's pushes
(DELIVER, REVOKE, SUBSCRIPTION_END, SUBSCRIPTION_INFO), settling (ACK, NACK, RELEASE,
EXTEND), CREDIT and UNSUBSCRIBE.

Source: ``docs/protocol.md``, "PUBLISH", "Consuming" and "Flow control".
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from futureq.wire.frames.constants import AckLevel, FrameType
from futureq.wire.frames.fields import (
    _arity,
    _bad,
    _bytes_list,
    _int,
    _list,
    _opt_int,
    _opt_str,
    _str,
)
from futureq.wire.msgpack_names import describe


def _items_as_tuples(items: list[Any]) -> list[Any]:
    """``items`` with each list in it as a tuple (see :class:`Publish`)."""
    return [tuple(item) if type(item) is list else item for item in items]


@attrs.frozen
class Publish:
    """A batch of messages to publish.

    ``items`` holds raw wire items, each ``[topic: str, payload: bytes, delay_ms: int |
    None, deliver_at_ms: int | None, ttl_ms: int | None]``; they are validated by
    :func:`futureq.wire.validation.validate_publish_items`. Each item given as a list
    is kept as a tuple (the same array on the wire): a tuple of strings, bytes, integers
    and None is one CPython's garbage collector stops tracking the first time it sees
    it, while a list is walked by every collection for as long as the request is in
    flight (at full publish rate the in-flight items were most of what a collection
    walked: ``bench.gc_cost``).
    """

    TYPE: ClassVar[FrameType] = FrameType.PUBLISH
    request_id: int
    ack_level: AckLevel
    items: list[Any] = attrs.field(converter=_items_as_tuples)

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, int(self.ack_level), self.items]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Publish:
        _arity("PUBLISH", f, 2)
        level = _int("PUBLISH", "ack_level", f[0])
        try:
            ack_level = AckLevel(level)
        except ValueError:
            raise _bad(
                "PUBLISH", f"ack_level must be 0 (none), 1 (leader) or 2 (quorum), got {level}"
            ) from None
        return cls(rid, ack_level, _list("PUBLISH", "items", f[1]))


@attrs.frozen
class PublishOk:
    """Answer to PUBLISH: the ids of the batch are ``first_id + i`` for item ``i``.

    ``first_id`` is None when the publish used ack level NONE. ``duplicates`` (sent
    only when some item's idempotency key still named a message): ``[[position, id],
    ...]``, the items for which nothing was stored and the id of the message their key
    names (map keys must be strings on this protocol, so pairs, not a map).
    """

    TYPE: ClassVar[FrameType] = FrameType.PUBLISH_OK
    request_id: int
    first_id: int | None
    count: int
    duplicates: list[list[int]] | None = None

    def to_wire(self) -> list[Any]:
        if self.duplicates:
            return [self.TYPE, self.request_id, self.first_id, self.count, self.duplicates]
        return [self.TYPE, self.request_id, self.first_id, self.count]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> PublishOk:
        if len(f) != 3:
            _arity("PUBLISH_OK", f, 2)
        duplicates = None
        if len(f) == 3:
            pairs = _list("PUBLISH_OK", "duplicates", f[2])
            for pair in pairs:
                if (
                    type(pair) is not list
                    or len(pair) != 2
                    or not all(type(x) is int and x >= 0 for x in pair)
                ):
                    raise _bad("PUBLISH_OK", "duplicates must be [[position, id], ...]")
            duplicates = pairs
        return cls(
            rid,
            _opt_int("PUBLISH_OK", "first_id", f[0], minimum=0),
            _int("PUBLISH_OK", "count", f[1], minimum=0),
            duplicates,
        )


@attrs.frozen
class Subscribe:
    """Start receiving a topic's messages as a member of a consumer group.

    ``prefetch`` is the initial credit: the most unacked deliveries the server may
    push to this subscription (items, >= 1). ``headers``: DELIVER items of this
    subscription carry each message's headers as a seventh element (an optional
    trailing field, sent only when true).
    """

    TYPE: ClassVar[FrameType] = FrameType.SUBSCRIBE
    request_id: int
    topic: str
    group: str
    prefetch: int
    headers: bool = False

    def to_wire(self) -> list[Any]:
        if self.headers:
            return [self.TYPE, self.request_id, self.topic, self.group, self.prefetch, True]
        return [self.TYPE, self.request_id, self.topic, self.group, self.prefetch]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Subscribe:
        if len(f) != 4:
            _arity("SUBSCRIBE", f, 3)
        headers = False
        if len(f) == 4:
            if type(f[3]) is not bool:
                raise _bad(
                    "SUBSCRIBE", f"field 'headers' must be true or false, got {describe(f[3])}"
                )
            headers = f[3]
        return cls(
            rid,
            _str("SUBSCRIBE", "topic", f[0]),
            _str("SUBSCRIBE", "group", f[1]),
            _int("SUBSCRIBE", "prefetch", f[2]),
            headers,
        )


@attrs.frozen
class SubscribeOk:
    """Answer to SUBSCRIBE: the id that DELIVER, CREDIT and UNSUBSCRIBE frames name."""

    TYPE: ClassVar[FrameType] = FrameType.SUBSCRIBE_OK
    request_id: int
    subscription_id: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.subscription_id]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> SubscribeOk:
        _arity("SUBSCRIBE_OK", f, 1)
        return cls(rid, _int("SUBSCRIBE_OK", "subscription_id", f[0], minimum=0))


@attrs.frozen
class Deliver:
    """Server push of due messages to one subscription (request id 0).

    ``deliveries`` holds ``[tag: bytes, id: int, payload: bytes, due_ms: int,
    publish_ms: int, attempt: int]`` lists, with ``headers`` (map or nil) as a seventh
    element for a subscription that asked for them; ``delivered_ms`` is the leader's
    cluster time when it sent the frame (ms since the Unix epoch), as are the stamps.
    """

    TYPE: ClassVar[FrameType] = FrameType.DELIVER
    request_id: int
    subscription_id: int
    delivered_ms: int
    deliveries: list[list[Any]]

    def to_wire(self) -> list[Any]:
        return [
            self.TYPE,
            self.request_id,
            self.subscription_id,
            self.delivered_ms,
            self.deliveries,
        ]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Deliver:
        _arity("DELIVER", f, 3)
        deliveries = _list("DELIVER", "deliveries", f[2])
        for d in deliveries:
            if (
                type(d) is not list
                or len(d) not in (6, 7)
                or type(d[0]) is not bytes
                or type(d[2]) is not bytes
                or not all(type(x) is int for x in (d[1], d[3], d[4], d[5]))
                or (len(d) == 7 and d[6] is not None and type(d[6]) is not dict)
            ):
                raise _bad(
                    "DELIVER",
                    "each delivery must be [tag, id, payload, due_ms, publish_ms, attempt]",
                )
        return cls(
            rid,
            _int("DELIVER", "subscription_id", f[0]),
            _int("DELIVER", "delivered_ms", f[1]),
            deliveries,
        )


@attrs.frozen
class Ack:
    """Acknowledge deliveries by their tags; answered with OK once durable."""

    TYPE: ClassVar[FrameType] = FrameType.ACK
    request_id: int
    tags: list[bytes]

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.tags]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Ack:
        _arity("ACK", f, 1)
        return cls(rid, _bytes_list("ACK", "tags", f[0]))


@attrs.frozen
class Nack:
    """Refuse deliveries; each is delivered again after ``requeue_delay_ms`` (>= 0).

    Optional trailing fields (sent only when set): ``reason``, a short text kept with
    each entry and shown in its dead letter's headers; ``dead_letter``, send them to
    the dead-letter topic now (reason ``rejected``) instead.
    """

    TYPE: ClassVar[FrameType] = FrameType.NACK
    request_id: int
    tags: list[bytes]
    requeue_delay_ms: int
    reason: str | None = None
    dead_letter: bool = False

    def to_wire(self) -> list[Any]:
        if self.reason is None and not self.dead_letter:
            return [self.TYPE, self.request_id, self.tags, self.requeue_delay_ms]
        return [
            self.TYPE,
            self.request_id,
            self.tags,
            self.requeue_delay_ms,
            self.reason,
            self.dead_letter,
        ]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Nack:
        if len(f) != 4:
            _arity("NACK", f, 2)
        reason, dead_letter = None, False
        if len(f) == 4:
            reason = _opt_str("NACK", "reason", f[2])
            if type(f[3]) is not bool:
                raise _bad(
                    "NACK", f"field 'dead_letter' must be true or false, got {describe(f[3])}"
                )
            dead_letter = f[3]
        return cls(
            rid,
            _bytes_list("NACK", "tags", f[0]),
            _int("NACK", "requeue_delay_ms", f[1]),
            reason,
            dead_letter,
        )


@attrs.frozen
class Credit:
    """Grant a subscription ``credit`` more deliveries (items, >= 1); no answer."""

    TYPE: ClassVar[FrameType] = FrameType.CREDIT
    request_id: int
    subscription_id: int
    credit: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.subscription_id, self.credit]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Credit:
        _arity("CREDIT", f, 2)
        return cls(rid, _int("CREDIT", "subscription_id", f[0]), _int("CREDIT", "credit", f[1]))


@attrs.frozen
class Unsubscribe:
    """End a subscription; its unsettled deliveries go back to the group.

    ``handed`` (protocol version 3, an optional trailing field): the delivery tags the
    application received and has not settled; only those count as an attempt, every
    other unsettled delivery of the subscription (buffered in the client, in flight,
    never seen) goes back uncounted, as a RELEASE would. None (versions 1 and 2): all
    count (``docs/protocol.md``, UNSUBSCRIBE).
    """

    TYPE: ClassVar[FrameType] = FrameType.UNSUBSCRIBE
    request_id: int
    subscription_id: int
    handed: list[bytes] | None = None

    def to_wire(self) -> list[Any]:
        if self.handed is None:
            return [self.TYPE, self.request_id, self.subscription_id]
        return [self.TYPE, self.request_id, self.subscription_id, self.handed]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Unsubscribe:
        if len(f) != 2:
            _arity("UNSUBSCRIBE", f, 1)
        handed = _bytes_list("UNSUBSCRIBE", "handed", f[1]) if len(f) == 2 else None
        return cls(rid, _int("UNSUBSCRIBE", "subscription_id", f[0]), handed)


@attrs.frozen
class Revoke:
    """Server push (request id 0): these deliveries are no longer the subscription's.

    Their tags are void; the credit they held is given back to the subscription by
    the server itself (``docs/protocol.md``, "Flow control"). ``reason`` is a
    :class:`RevokeReason` number.
    """

    TYPE: ClassVar[FrameType] = FrameType.REVOKE
    request_id: int
    subscription_id: int
    tags: list[bytes]
    reason: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.subscription_id, self.tags, self.reason]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Revoke:
        _arity("REVOKE", f, 3)
        return cls(
            rid,
            _int("REVOKE", "subscription_id", f[0]),
            _bytes_list("REVOKE", "tags", f[1]),
            _int("REVOKE", "reason", f[2]),
        )


@attrs.frozen
class SubscriptionEnd:
    """Server push (request id 0): the server ended a subscription.

    ``code`` is an error code saying why (e.g. ``GROUP_DELETED``), ``message`` a
    sentence. Every delivery of the subscription still unsettled is void.
    """

    TYPE: ClassVar[FrameType] = FrameType.SUBSCRIPTION_END
    request_id: int
    subscription_id: int
    code: int
    message: str

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.subscription_id, self.code, self.message]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> SubscriptionEnd:
        _arity("SUBSCRIPTION_END", f, 3)
        return cls(
            rid,
            _int("SUBSCRIPTION_END", "subscription_id", f[0]),
            _int("SUBSCRIPTION_END", "code", f[1]),
            _str("SUBSCRIPTION_END", "message", f[2]),
        )


@attrs.frozen
class Handover:
    """Server push (request id 0, protocol version 4): the leader is about to hand
    leadership over gracefully (a SIGTERM, a TRANSFER_LEADER) and this subscription
    ends here.

    The client answers with an UNSUBSCRIBE of the subscription whose ``handed`` names
    the delivery tags its application received and has not settled: only those count
    as an attempt; the others pushed before this frame (buffered, never handed) go
    back uncounted, as for any UNSUBSCRIBE with ``handed``, while the named ones stay
    out, settleable on the connection until the leadership moves. It then subscribes
    again (on the new leader once this connection closes). The leader waits for the answers
    at most ``HANDED_WAIT_S`` (0.5 s); a subscription not answered in time keeps the
    count of every delivery out, as before version 4 (``docs/protocol.md``, HANDOVER).
    """

    TYPE: ClassVar[FrameType] = FrameType.HANDOVER
    request_id: int
    subscription_id: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.subscription_id]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Handover:
        _arity("HANDOVER", f, 1)
        return cls(rid, _int("HANDOVER", "subscription_id", f[0]))


@attrs.frozen
class Extend:
    """Keep deliveries: each becomes visible again ``visibility_ms`` after now (ms, >= 1).

    Answered with OK (``result`` = deliveries extended). Like SQS
    ChangeMessageVisibility; leader-local, nothing is written to the log.
    """

    TYPE: ClassVar[FrameType] = FrameType.EXTEND
    request_id: int
    tags: list[bytes]
    visibility_ms: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.tags, self.visibility_ms]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Extend:
        _arity("EXTEND", f, 2)
        return cls(rid, _bytes_list("EXTEND", "tags", f[0]), _int("EXTEND", "visibility_ms", f[1]))


@attrs.frozen
class Release:
    """Give deliveries back unprocessed: due again at once, the attempt not counted.

    Answered with OK (``result`` = deliveries released) once durable.
    """

    TYPE: ClassVar[FrameType] = FrameType.RELEASE
    request_id: int
    tags: list[bytes]

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.tags]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Release:
        _arity("RELEASE", f, 1)
        return cls(rid, _bytes_list("RELEASE", "tags", f[0]))


@attrs.frozen
class SubscriptionInfo:
    """Server push (request id 0): the settings of a subscription's group.

    Sent after SUBSCRIBE_OK, before the first DELIVER, and again when the group's
    settings change. ``visibility_timeout_ms``: how long a delivery may stay unsettled
    (ms); ``max_deliveries``: counted attempts before dead-lettering.
    """

    TYPE: ClassVar[FrameType] = FrameType.SUBSCRIPTION_INFO
    request_id: int
    subscription_id: int
    visibility_timeout_ms: int
    max_deliveries: int

    def to_wire(self) -> list[Any]:
        return [
            self.TYPE,
            self.request_id,
            self.subscription_id,
            self.visibility_timeout_ms,
            self.max_deliveries,
        ]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> SubscriptionInfo:
        _arity("SUBSCRIPTION_INFO", f, 3)
        return cls(
            rid,
            _int("SUBSCRIPTION_INFO", "subscription_id", f[0]),
            _int("SUBSCRIPTION_INFO", "visibility_timeout_ms", f[1], minimum=1),
            _int("SUBSCRIPTION_INFO", "max_deliveries", f[2], minimum=1),
        )
