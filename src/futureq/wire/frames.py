"""One frozen class per frame type of the FutureQ wire protocol.

A frame travels as one msgpack array, ``[frame_type, request_id, field, ...]`` (list
form, not maps: it packs about three times faster). Every class has ``to_wire()``,
the list it is sent as, and ``from_wire(fields)``, which checks the shape and types
of a received frame and raises :class:`~futureq.errors.RemoteProtocolError` with
``INVALID_FRAME`` when they are wrong. Items inside a PUBLISH batch are checked
later, by :func:`futureq.wire.validation.validate_publish_items`, so that a bad item
fails its request alone instead of closing the connection.

Source: ``docs/protocol.md``, "Frames".
"""

from __future__ import annotations

import enum
import re
from typing import Any, ClassVar

import attrs

from futureq.errors import ErrorCode, FrameFieldsError, RemoteProtocolError
from futureq.wire.msgpack_names import describe

PROTOCOL_VERSION = 1
"""The protocol version this code speaks (``docs/protocol.md``, "Versions")."""

SUPPORTED_VERSIONS: frozenset[int] = frozenset({1})


class FrameType(enum.IntEnum):
    """The first element of every frame. Numbers are stable protocol constants."""

    HELLO = 1
    HELLO_OK = 2
    PUBLISH = 3
    PUBLISH_OK = 4
    SUBSCRIBE = 5
    SUBSCRIBE_OK = 6
    DELIVER = 7
    ACK = 8
    NACK = 9
    CREDIT = 10
    STATUS = 11
    STATUS_OK = 12
    ERROR = 13
    OK = 14
    UNSUBSCRIBE = 15
    PING = 16
    PONG = 17
    GROUP_CREATE = 18
    GROUP_DELETE = 19
    CLUSTER_STATUS = 20
    CLUSTER_STATUS_OK = 21
    CLUSTER_ADD_NODE = 22
    CLUSTER_REMOVE_NODE = 23
    CLUSTER_TRANSFER_LEADER = 24
    REVOKE = 25
    SUBSCRIPTION_END = 26
    EXTEND = 27
    RELEASE = 28
    SUBSCRIPTION_INFO = 29
    # 35-39: issue 13 (live overview for dashboards)
    WATCH = 35
    WATCH_UPDATE = 36
    UNWATCH = 37
    # 40-59: managing scheduled messages (issue 14).
    CANCEL = 40
    ITEM_RESULTS = 41
    BROWSE = 42
    BROWSE_OK = 43
    REDRIVE = 44
    RESCHEDULE = 45
    PURGE = 46
    BROWSE_COUNTS = 47
    BROWSE_COUNTS_OK = 48
    # 60-69: issue 15, shards
    SLOT_MAP = 60
    SLOT_MAP_OK = 61


class ItemStatus(enum.IntEnum):
    """Per-item outcome of CANCEL (and the other by-id management requests) in
    ITEM_RESULTS (``docs/protocol.md``, "ITEM_RESULTS")."""

    DONE = 0
    """Cancelled (never delivered), rescheduled or redriven."""
    DELIVERED = 1
    """CANCEL: removed, but it had been delivered already (at least once)."""
    UNKNOWN = 2
    """Not pending there: never published, or already acked, expired, dead-lettered,
    cancelled or purged (or, with a group, not in that group)."""
    NO_TARGET = 3
    """REDRIVE: its original group no longer exists; it stays a dead letter."""


MAX_MESSAGE_ID = 2**64 - 1
"""Largest message id (``docs/protocol.md``, "Message ids")."""


class RevokeReason(enum.IntEnum):
    """Why a REVOKE took deliveries back (``docs/protocol.md``, "REVOKE")."""

    VISIBILITY_TIMEOUT = 1
    """The visibility timeout passed unsettled: the message is due for the group again."""
    REMOVED = 2
    """The message expired while the delivery was out (sent at the expiry), or a
    command removed or moved it (RESCHEDULE)."""
    CANCELLED = 3
    """A CANCEL or PURGE removed the message from the group: do not process it."""


class AckLevel(enum.IntEnum):
    """When the server answers a PUBLISH (``docs/protocol.md``, "PUBLISH").

    NONE: right after validation, before the batch is durable (ids unknown).
    LEADER: once the batch is durable on the leader.
    QUORUM: once the batch is committed by a quorum (single node: same as LEADER).
    """

    NONE = 0
    LEADER = 1
    QUORUM = 2


def _bad(frame: str, message: str) -> RemoteProtocolError:
    return RemoteProtocolError(ErrorCode.INVALID_FRAME, f"{frame} frame: {message}")


def _int(frame: str, name: str, value: Any, *, minimum: int | None = None) -> int:
    # bool is an int subclass in Python; msgpack true/false are never integers here.
    if type(value) is not int:
        raise _bad(frame, f"field {name!r} must be an integer, got {describe(value)}")
    if minimum is not None and value < minimum:
        raise _bad(frame, f"field {name!r} must be >= {minimum}, got {value}")
    return value


def _opt_int(frame: str, name: str, value: Any, *, minimum: int | None = None) -> int | None:
    return None if value is None else _int(frame, name, value, minimum=minimum)


def _str(frame: str, name: str, value: Any) -> str:
    if type(value) is not str:
        raise _bad(frame, f"field {name!r} must be a string, got {describe(value)}")
    return value


def _opt_str(frame: str, name: str, value: Any) -> str | None:
    return None if value is None else _str(frame, name, value)


def _list(frame: str, name: str, value: Any) -> list[Any]:
    if type(value) is not list:
        raise _bad(frame, f"field {name!r} must be an array, got {describe(value)}")
    return value


def _items_as_tuples(items: list[Any]) -> list[Any]:
    """``items`` with each list in it as a tuple (see :class:`Publish`)."""
    return [tuple(item) if type(item) is list else item for item in items]


def _int_list(frame: str, name: str, value: Any) -> list[int]:
    items = _list(frame, name, value)
    for i, item in enumerate(items):
        if type(item) is not int:
            raise _bad(frame, f"{name}[{i}] must be an integer, got {describe(item)}")
    return items


def _bytes_list(frame: str, name: str, value: Any) -> list[bytes]:
    items = _list(frame, name, value)
    for i, item in enumerate(items):
        if type(item) is not bytes:
            raise _bad(frame, f"{name}[{i}] must be binary, got {describe(item)}")
    return items


MAX_REQUEST_ID = 2**63 - 1


@attrs.frozen
class Hello:
    """First frame from a client: the versions it speaks and an optional auth token."""

    TYPE: ClassVar[FrameType] = FrameType.HELLO
    request_id: int
    versions: tuple[int, ...]
    client_name: str = ""
    token: str | None = None

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, list(self.versions), self.client_name, self.token]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Hello:
        _arity("HELLO", f, 3)
        versions = _list("HELLO", "versions", f[0])
        for v in versions:
            _int("HELLO", "versions[]", v, minimum=0)
        return cls(
            rid,
            tuple(versions),
            _str("HELLO", "client_name", f[1]),
            _opt_str("HELLO", "token", f[2]),
        )


@attrs.frozen
class HelloOk:
    """Server's answer to HELLO: the chosen version, node id and leader's client address.

    ``shards``: how many shards the node runs (an optional trailing field, sent only
    when above 1); a client then asks SLOT_MAP and routes by topic (``docs/sharding.md``).
    """

    TYPE: ClassVar[FrameType] = FrameType.HELLO_OK
    request_id: int
    version: int
    node_id: int
    leader_address: str | None
    max_frame_bytes: int
    server_version: str
    shards: int = 1

    def to_wire(self) -> list[Any]:
        wire = [
            self.TYPE,
            self.request_id,
            self.version,
            self.node_id,
            self.leader_address,
            self.max_frame_bytes,
            self.server_version,
        ]
        if self.shards != 1:
            wire.append(self.shards)
        return wire

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> HelloOk:
        if len(f) != 6:
            _arity("HELLO_OK", f, 5)
        return cls(
            rid,
            _int("HELLO_OK", "version", f[0]),
            _int("HELLO_OK", "node_id", f[1]),
            _opt_str("HELLO_OK", "leader_address", f[2]),
            _int("HELLO_OK", "max_frame_bytes", f[3], minimum=1),
            _str("HELLO_OK", "server_version", f[4]),
            _int("HELLO_OK", "shards", f[5], minimum=1) if len(f) == 6 else 1,
        )


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
    element for a subscription that asked for them; ``delivered_ms`` is the server's
    wall clock when it sent the frame (ms since the Unix epoch).
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
class Status:
    """Ask for the node's status (topics, groups, counts); answered with STATUS_OK."""

    TYPE: ClassVar[FrameType] = FrameType.STATUS
    request_id: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Status:
        _arity("STATUS", f, 0)
        return cls(rid)


@attrs.frozen
class StatusOk:
    """The node's status as a msgpack map (shape in ``docs/protocol.md``, "STATUS")."""

    TYPE: ClassVar[FrameType] = FrameType.STATUS_OK
    request_id: int
    status: dict[str, Any]

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.status]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> StatusOk:
        _arity("STATUS_OK", f, 1)
        if type(f[0]) is not dict:
            raise _bad("STATUS_OK", "field 'status' must be a map")
        return cls(rid, f[0])


@attrs.frozen
class Error:
    """A refused request (2xx, 3xx codes) or a protocol error (1xx, then the server closes)."""

    TYPE: ClassVar[FrameType] = FrameType.ERROR
    request_id: int
    code: int
    message: str
    item_index: int | None = None
    leader_address: str | None = None

    def to_wire(self) -> list[Any]:
        return [
            self.TYPE,
            self.request_id,
            self.code,
            self.message,
            self.item_index,
            self.leader_address,
        ]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Error:
        _arity("ERROR", f, 4)
        return cls(
            rid,
            _int("ERROR", "code", f[0]),
            _str("ERROR", "message", f[1]),
            _opt_int("ERROR", "item_index", f[2], minimum=0),
            _opt_str("ERROR", "leader_address", f[3]),
        )


@attrs.frozen
class Ok:
    """Success answer to ACK, NACK, UNSUBSCRIBE, GROUP_CREATE and GROUP_DELETE.

    ``result`` is request specific: the number of tags acked or nacked, else None.
    """

    TYPE: ClassVar[FrameType] = FrameType.OK
    request_id: int
    result: int | None = None

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.result]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Ok:
        _arity("OK", f, 1)
        return cls(rid, _opt_int("OK", "result", f[0]))


@attrs.frozen
class Unsubscribe:
    """End a subscription; its unacked deliveries go back to the group."""

    TYPE: ClassVar[FrameType] = FrameType.UNSUBSCRIBE
    request_id: int
    subscription_id: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.subscription_id]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Unsubscribe:
        _arity("UNSUBSCRIBE", f, 1)
        return cls(rid, _int("UNSUBSCRIBE", "subscription_id", f[0]))


@attrs.frozen
class Ping:
    """Liveness probe; answered with PONG."""

    TYPE: ClassVar[FrameType] = FrameType.PING
    request_id: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Ping:
        _arity("PING", f, 0)
        return cls(rid)


@attrs.frozen
class Pong:
    """Answer to PING."""

    TYPE: ClassVar[FrameType] = FrameType.PONG
    request_id: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Pong:
        _arity("PONG", f, 0)
        return cls(rid)


@attrs.frozen
class GroupCreate:
    """Create a consumer group (idempotent); None fields take the server's defaults.

    ``visibility_timeout_ms``: how long a delivery may stay unacked before it is
    delivered again (ms, >= 1). ``max_deliveries``: attempts before dead-lettering (>= 1).
    Optional trailing fields, sent only when set: ``from_backlog``, a group this
    creates also gets every message of the topic still pending in its other groups;
    ``dead_letter_expired``, an expired message goes to the dead-letter topic (reason
    ``expired``) instead of being dropped (None keeps the group's setting).
    """

    TYPE: ClassVar[FrameType] = FrameType.GROUP_CREATE
    request_id: int
    topic: str
    group: str
    visibility_timeout_ms: int | None = None
    max_deliveries: int | None = None
    from_backlog: bool = False
    dead_letter_expired: bool | None = None

    def to_wire(self) -> list[Any]:
        value: list[Any] = [
            self.TYPE,
            self.request_id,
            self.topic,
            self.group,
            self.visibility_timeout_ms,
            self.max_deliveries,
        ]
        if self.dead_letter_expired is not None:
            value += [self.from_backlog, self.dead_letter_expired]
        elif self.from_backlog:
            value.append(True)
        return value

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> GroupCreate:
        if len(f) not in (5, 6):
            _arity("GROUP_CREATE", f, 4)
        from_backlog = False
        dead_letter_expired = None
        if len(f) >= 5:
            if type(f[4]) is not bool:
                raise _bad(
                    "GROUP_CREATE",
                    f"field 'from_backlog' must be true or false, got {describe(f[4])}",
                )
            from_backlog = f[4]
        if len(f) == 6:
            if f[5] is not None and type(f[5]) is not bool:
                raise _bad(
                    "GROUP_CREATE",
                    f"field 'dead_letter_expired' must be true, false or nil, got {describe(f[5])}",
                )
            dead_letter_expired = f[5]
        return cls(
            rid,
            _str("GROUP_CREATE", "topic", f[0]),
            _str("GROUP_CREATE", "group", f[1]),
            _opt_int("GROUP_CREATE", "visibility_timeout_ms", f[2]),
            _opt_int("GROUP_CREATE", "max_deliveries", f[3]),
            from_backlog,
            dead_letter_expired,
        )


@attrs.frozen
class GroupDelete:
    """Delete a consumer group and every pending delivery it still holds."""

    TYPE: ClassVar[FrameType] = FrameType.GROUP_DELETE
    request_id: int
    topic: str
    group: str

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.topic, self.group]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> GroupDelete:
        _arity("GROUP_DELETE", f, 2)
        return cls(rid, _str("GROUP_DELETE", "topic", f[0]), _str("GROUP_DELETE", "group", f[1]))


@attrs.frozen
class ClusterStatus:
    """Ask for the cluster's membership, term, leader and replication progress."""

    TYPE: ClassVar[FrameType] = FrameType.CLUSTER_STATUS
    request_id: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> ClusterStatus:
        _arity("CLUSTER_STATUS", f, 0)
        return cls(rid)


@attrs.frozen
class ClusterStatusOk:
    """The cluster view of the answering node (shape in ``docs/protocol.md``)."""

    TYPE: ClassVar[FrameType] = FrameType.CLUSTER_STATUS_OK
    request_id: int
    status: dict[str, Any]

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.status]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> ClusterStatusOk:
        _arity("CLUSTER_STATUS_OK", f, 1)
        if type(f[0]) is not dict:
            raise _bad("CLUSTER_STATUS_OK", "field 'status' must be a map")
        return cls(rid, f[0])


@attrs.frozen
class ClusterAddNode:
    """Add a node: it joins as a learner, catches up, then is promoted to voter."""

    TYPE: ClassVar[FrameType] = FrameType.CLUSTER_ADD_NODE
    request_id: int
    node_id: int
    raft_address: str
    client_address: str

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.node_id, self.raft_address, self.client_address]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> ClusterAddNode:
        _arity("CLUSTER_ADD_NODE", f, 3)
        return cls(
            rid,
            _int("CLUSTER_ADD_NODE", "node_id", f[0], minimum=1),
            _str("CLUSTER_ADD_NODE", "raft_address", f[1]),
            _str("CLUSTER_ADD_NODE", "client_address", f[2]),
        )


@attrs.frozen
class ClusterRemoveNode:
    """Remove a node from the cluster (the leader too: it hands over first)."""

    TYPE: ClassVar[FrameType] = FrameType.CLUSTER_REMOVE_NODE
    request_id: int
    node_id: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.node_id]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> ClusterRemoveNode:
        _arity("CLUSTER_REMOVE_NODE", f, 1)
        return cls(rid, _int("CLUSTER_REMOVE_NODE", "node_id", f[0], minimum=1))


@attrs.frozen
class ClusterTransferLeader:
    """Hand leadership to ``node_id`` (None: the most up-to-date voter)."""

    TYPE: ClassVar[FrameType] = FrameType.CLUSTER_TRANSFER_LEADER
    request_id: int
    node_id: int | None = None

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.node_id]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> ClusterTransferLeader:
        _arity("CLUSTER_TRANSFER_LEADER", f, 1)
        return cls(rid, _opt_int("CLUSTER_TRANSFER_LEADER", "node_id", f[0], minimum=1))


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


MIN_WATCH_INTERVAL_MS = 250
"""Shortest WATCH interval a server accepts (ms)."""
MAX_WATCH_INTERVAL_MS = 60_000
"""Longest WATCH interval a server accepts (ms)."""


@attrs.frozen
class Watch:
    """Ask for the node's overview now and then every ``interval_ms`` (WATCH_UPDATE).

    One watch per connection; a second WATCH replaces the first.
    """

    TYPE: ClassVar[FrameType] = FrameType.WATCH
    request_id: int
    interval_ms: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.interval_ms]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Watch:
        _arity("WATCH", f, 1)
        return cls(rid, _int("WATCH", "interval_ms", f[0]))


@attrs.frozen
class WatchUpdate:
    """One overview of the node (shape in ``docs/protocol.md``, "WATCH_UPDATE"),
    echoing the WATCH's request id."""

    TYPE: ClassVar[FrameType] = FrameType.WATCH_UPDATE
    request_id: int
    overview: dict[str, Any]

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.overview]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> WatchUpdate:
        _arity("WATCH_UPDATE", f, 1)
        if type(f[0]) is not dict:
            raise _bad("WATCH_UPDATE", "field 'overview' must be a map")
        return cls(rid, f[0])


@attrs.frozen
class Unwatch:
    """Stop this connection's watch; answered with OK."""

    TYPE: ClassVar[FrameType] = FrameType.UNWATCH
    request_id: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Unwatch:
        _arity("UNWATCH", f, 0)
        return cls(rid)


@attrs.frozen
class Cancel:
    """Remove scheduled messages by id from one group of a topic, or from every group.

    ``group`` None: every group of ``topic``. ``ids``: message ids (as PUBLISH_OK gave
    them), at most ``max_batch_items``. Answered with ITEM_RESULTS, one
    :class:`ItemStatus` per id, once committed.
    """

    TYPE: ClassVar[FrameType] = FrameType.CANCEL
    request_id: int
    topic: str
    group: str | None
    ids: list[int]

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.topic, self.group, self.ids]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Cancel:
        _arity("CANCEL", f, 3)
        return cls(
            rid,
            _str("CANCEL", "topic", f[0]),
            _opt_str("CANCEL", "group", f[1]),
            _int_list("CANCEL", "ids", f[2]),
        )


@attrs.frozen
class ItemResults:
    """Answer to CANCEL: one :class:`ItemStatus` number per item, in request order."""

    TYPE: ClassVar[FrameType] = FrameType.ITEM_RESULTS
    request_id: int
    results: list[int]

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.results]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> ItemResults:
        _arity("ITEM_RESULTS", f, 1)
        return cls(rid, _int_list("ITEM_RESULTS", "results", f[0]))


def _opt_bytes(frame: str, name: str, value: Any) -> bytes | None:
    if value is not None and type(value) is not bytes:
        raise _bad(frame, f"field {name!r} must be binary or nil, got {describe(value)}")
    return value


@attrs.frozen
class Browse:
    """Read a page of one group's pending messages in due order, claiming none.

    ``group`` None: the topic's only group. ``from_due_ms`` / ``to_due_ms``: due at or
    after / before (ms; None: unbounded). ``cursor``: BROWSE_OK's ``next_cursor`` for
    the next page (None: the first). ``limit``: messages per page (1 to 1000).
    ``preview_bytes``: payload bytes to include per message (0 to 1024). Answered
    with BROWSE_OK.
    """

    TYPE: ClassVar[FrameType] = FrameType.BROWSE
    request_id: int
    topic: str
    group: str | None
    from_due_ms: int | None
    to_due_ms: int | None
    cursor: bytes | None
    limit: int
    preview_bytes: int

    def to_wire(self) -> list[Any]:
        return [
            self.TYPE,
            self.request_id,
            self.topic,
            self.group,
            self.from_due_ms,
            self.to_due_ms,
            self.cursor,
            self.limit,
            self.preview_bytes,
        ]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Browse:
        _arity("BROWSE", f, 7)
        return cls(
            rid,
            _str("BROWSE", "topic", f[0]),
            _opt_str("BROWSE", "group", f[1]),
            _opt_int("BROWSE", "from_due_ms", f[2]),
            _opt_int("BROWSE", "to_due_ms", f[3]),
            _opt_bytes("BROWSE", "cursor", f[4]),
            _int("BROWSE", "limit", f[5]),
            _int("BROWSE", "preview_bytes", f[6]),
        )


@attrs.frozen
class BrowseOk:
    """Answer to BROWSE: ``group`` (the one browsed), ``messages`` and ``next_cursor``.

    A message is ``[id, due_ms | nil (parked), attempt, payload_bytes, headers | nil,
    preview | nil, expire_ms | nil]`` (``docs/protocol.md``, "BROWSE_OK");
    ``next_cursor`` None: nothing more in the range.
    """

    TYPE: ClassVar[FrameType] = FrameType.BROWSE_OK
    request_id: int
    group: str
    messages: list[list[Any]]
    next_cursor: bytes | None

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.group, self.messages, self.next_cursor]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> BrowseOk:
        _arity("BROWSE_OK", f, 3)
        messages = _list("BROWSE_OK", "messages", f[1])
        for i, m in enumerate(messages):
            if (
                type(m) is not list
                or len(m) != 7
                or type(m[0]) is not int
                or (m[1] is not None and type(m[1]) is not int)
                or type(m[2]) is not int
                or type(m[3]) is not int
                or (m[4] is not None and type(m[4]) is not dict)
                or (m[5] is not None and type(m[5]) is not bytes)
                or (m[6] is not None and type(m[6]) is not int)
            ):
                raise _bad(
                    "BROWSE_OK",
                    f"messages[{i}] must be [id, due_ms, attempt, "
                    "payload_bytes, headers, preview, expire_ms]",
                )
        return cls(
            rid,
            _str("BROWSE_OK", "group", f[0]),
            messages,
            _opt_bytes("BROWSE_OK", "next_cursor", f[2]),
        )


@attrs.frozen
class BrowseCounts:
    """Count one group's pending messages by due-time bucket, claiming none.

    ``group`` None: the topic's only group. ``bounds_ms``: 1 to 32 strictly increasing
    bucket bounds (ms since the Unix epoch; with ``relative`` true, ms from the leader's
    cluster time instead, each >= 0). Answered with BROWSE_COUNTS_OK
    (``docs/protocol.md``, "BROWSE_COUNTS").
    """

    TYPE: ClassVar[FrameType] = FrameType.BROWSE_COUNTS
    request_id: int
    topic: str
    group: str | None
    bounds_ms: list[int]
    relative: bool

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.topic, self.group, self.bounds_ms, self.relative]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> BrowseCounts:
        _arity("BROWSE_COUNTS", f, 4)
        if type(f[3]) is not bool:
            raise _bad("BROWSE_COUNTS", f"field 'relative' must be a boolean, got {describe(f[3])}")
        return cls(
            rid,
            _str("BROWSE_COUNTS", "topic", f[0]),
            _opt_str("BROWSE_COUNTS", "group", f[1]),
            _int_list("BROWSE_COUNTS", "bounds_ms", f[2]),
            f[3],
        )


@attrs.frozen
class BrowseCountsOk:
    """Answer to BROWSE_COUNTS.

    ``group``: the group counted. ``bounds_ms``: the bounds, absolute (ms since the
    epoch). ``counts[i]``: entries due before ``bounds_ms[0]`` (i = 0; overdue ones
    included) or in ``[bounds_ms[i-1], bounds_ms[i])``. ``later``: the rest of the
    group's pending entries (due at or after the last bound, parked dead letters
    included). ``complete`` false: the count stopped at the per-request read limit; the
    first bucket it stopped in holds a lower bound, later buckets and ``later`` are nil.
    """

    TYPE: ClassVar[FrameType] = FrameType.BROWSE_COUNTS_OK
    request_id: int
    group: str
    bounds_ms: list[int]
    counts: list[int | None]
    later: int | None
    complete: bool

    def to_wire(self) -> list[Any]:
        return [
            self.TYPE,
            self.request_id,
            self.group,
            self.bounds_ms,
            self.counts,
            self.later,
            self.complete,
        ]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> BrowseCountsOk:
        _arity("BROWSE_COUNTS_OK", f, 5)
        bounds = _int_list("BROWSE_COUNTS_OK", "bounds_ms", f[1])
        counts = _list("BROWSE_COUNTS_OK", "counts", f[2])
        if len(counts) != len(bounds) or any(c is not None and type(c) is not int for c in counts):
            raise _bad("BROWSE_COUNTS_OK", "counts must be one integer or nil per bound")
        if type(f[4]) is not bool:
            raise _bad("BROWSE_COUNTS_OK", "field 'complete' must be a boolean")
        return cls(
            rid,
            _str("BROWSE_COUNTS_OK", "group", f[0]),
            bounds,
            counts,
            _opt_int("BROWSE_COUNTS_OK", "later", f[3]),
            f[4],
        )


@attrs.frozen
class Redrive:
    """Move dead letters of ``topic`` (held in ``topic.dlq``) back to the topic and the
    group they died in, by dead-letter message id, due after ``delay_ms`` (>= 0).

    ``group``: the dead-letter topic's group holding them; None: its only group.
    Answered with ITEM_RESULTS: DONE, UNKNOWN or NO_TARGET per id.
    """

    TYPE: ClassVar[FrameType] = FrameType.REDRIVE
    request_id: int
    topic: str
    group: str | None
    ids: list[int]
    delay_ms: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.topic, self.group, self.ids, self.delay_ms]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Redrive:
        _arity("REDRIVE", f, 4)
        return cls(
            rid,
            _str("REDRIVE", "topic", f[0]),
            _opt_str("REDRIVE", "group", f[1]),
            _int_list("REDRIVE", "ids", f[2]),
            _int("REDRIVE", "delay_ms", f[3]),
        )


@attrs.frozen
class Reschedule:
    """Give pending messages of ``topic`` a new due time, by id, in one group or all.

    Exactly one of ``due_ms`` (absolute, ms since the Unix epoch) and ``delay_ms``
    (from the leader's stamp, ms). Attempts are kept; a TTL counts from the new due
    time. Answered with ITEM_RESULTS: DONE or UNKNOWN per id.
    """

    TYPE: ClassVar[FrameType] = FrameType.RESCHEDULE
    request_id: int
    topic: str
    group: str | None
    ids: list[int]
    due_ms: int | None
    delay_ms: int | None

    def to_wire(self) -> list[Any]:
        return [
            self.TYPE,
            self.request_id,
            self.topic,
            self.group,
            self.ids,
            self.due_ms,
            self.delay_ms,
        ]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Reschedule:
        _arity("RESCHEDULE", f, 5)
        return cls(
            rid,
            _str("RESCHEDULE", "topic", f[0]),
            _opt_str("RESCHEDULE", "group", f[1]),
            _int_list("RESCHEDULE", "ids", f[2]),
            _opt_int("RESCHEDULE", "due_ms", f[3]),
            _opt_int("RESCHEDULE", "delay_ms", f[4]),
        )


@attrs.frozen
class Purge:
    """Remove every message pending now in one group of ``topic`` (or all its groups).

    Answered with OK (``result`` = entries to remove) once the purge has started; the
    leader removes them in bounded chunks in the background. Messages published after
    it stay.
    """

    TYPE: ClassVar[FrameType] = FrameType.PURGE
    request_id: int
    topic: str
    group: str | None

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.topic, self.group]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Purge:
        _arity("PURGE", f, 2)
        return cls(rid, _str("PURGE", "topic", f[0]), _opt_str("PURGE", "group", f[1]))


@attrs.frozen
class SlotMap:
    """Ask which shard owns which topics and where each listens; answered by SLOT_MAP_OK."""

    TYPE: ClassVar[FrameType] = FrameType.SLOT_MAP
    request_id: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> SlotMap:
        _arity("SLOT_MAP", f, 0)
        return cls(rid)


@attrs.frozen
class SlotMapOk:
    """The node's slot map as a msgpack map: ``{"version", "slots", "ranges": [[start,
    end, shard], ...], "shards": [address, ...], "shard": this shard}`` (shape in
    ``docs/protocol.md``, "SLOT_MAP"; parsed by :class:`futureq.shards.slots.SlotMap`)."""

    TYPE: ClassVar[FrameType] = FrameType.SLOT_MAP_OK
    request_id: int
    slot_map: dict[str, Any]

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.slot_map]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> SlotMapOk:
        _arity("SLOT_MAP_OK", f, 1)
        if type(f[0]) is not dict:
            raise _bad("SLOT_MAP_OK", "field 'slot_map' must be a map")
        return cls(rid, f[0])


Frame = (
    Hello
    | HelloOk
    | Publish
    | PublishOk
    | Subscribe
    | SubscribeOk
    | Deliver
    | Ack
    | Nack
    | Credit
    | Status
    | StatusOk
    | Error
    | Ok
    | Unsubscribe
    | Ping
    | Pong
    | GroupCreate
    | GroupDelete
    | ClusterStatus
    | ClusterStatusOk
    | ClusterAddNode
    | ClusterRemoveNode
    | ClusterTransferLeader
    | Revoke
    | SubscriptionEnd
    | Extend
    | Release
    | SubscriptionInfo
    | Watch
    | WatchUpdate
    | Unwatch
    | Cancel
    | ItemResults
    | Browse
    | BrowseOk
    | BrowseCounts
    | BrowseCountsOk
    | Redrive
    | Reschedule
    | Purge
    | SlotMap
    | SlotMapOk
)

FRAME_CLASSES: dict[int, Any] = {
    cls.TYPE: cls
    for cls in (
        Hello,
        HelloOk,
        Publish,
        PublishOk,
        Subscribe,
        SubscribeOk,
        Deliver,
        Ack,
        Nack,
        Credit,
        Status,
        StatusOk,
        Error,
        Ok,
        Unsubscribe,
        Ping,
        Pong,
        GroupCreate,
        GroupDelete,
        ClusterStatus,
        ClusterStatusOk,
        ClusterAddNode,
        ClusterRemoveNode,
        ClusterTransferLeader,
        Revoke,
        SubscriptionEnd,
        Extend,
        Release,
        SubscriptionInfo,
        Watch,
        WatchUpdate,
        Unwatch,
        Cancel,
        ItemResults,
        Browse,
        BrowseOk,
        BrowseCounts,
        BrowseCountsOk,
        Redrive,
        Reschedule,
        Purge,
        SlotMap,
        SlotMapOk,
    )
}


def _arity(frame: str, fields: list[Any], expected: int) -> None:
    if len(fields) != expected:
        raise _bad(frame, f"expected {expected} fields after the request id, got {len(fields)}")


_WIRE_TYPES = {
    "dict": "a map",
    "list": "an array",
    "str": "a string",
    "bytes": "binary",
    "NoneType": "nil",
    "bool": "a boolean",
    "float": "a float",
}
_WIRE_TYPE_NAMES = re.compile(r"got (dict|list|str|bytes|NoneType|bool|float)\b")
"""Python's type names in field errors, said in msgpack's terms for other clients."""


def frame_from_wire(value: Any) -> Frame:
    """Build a frame from one decoded msgpack value.

    Args:
        value: What msgpack decoded: must be ``[frame_type, request_id, *fields]``.

    Returns:
        The frame object.

    Raises:
        RemoteProtocolError: INVALID_FRAME for a wrong shape (not an array, no valid
            request id), UNKNOWN_FRAME_TYPE for an unknown type number.
        FrameFieldsError: (a RemoteProtocolError, code INVALID_FRAME) for a known
            type and valid request id with wrong fields; it carries both, so a server
            can answer that request alone (``docs/protocol.md``, "Frames").
    """
    if type(value) is not list or len(value) < 2:
        raise RemoteProtocolError(
            ErrorCode.INVALID_FRAME,
            "a frame must be a msgpack array [frame_type, request_id, ...]",
        )
    frame_type, rid = value[0], value[1]
    if type(frame_type) is not int:
        raise RemoteProtocolError(ErrorCode.INVALID_FRAME, "frame_type must be an integer")
    cls = FRAME_CLASSES.get(frame_type)
    if cls is None:
        raise RemoteProtocolError(
            ErrorCode.UNKNOWN_FRAME_TYPE,
            f"unknown frame type {frame_type}; this server knows {sorted(int(t) for t in FRAME_CLASSES)}",
        )
    if type(rid) is not int or not 0 <= rid <= MAX_REQUEST_ID:
        # Name the type, not the value: a peer's value may be megabytes long.
        got = str(rid) if type(rid) is int else describe(rid)
        raise RemoteProtocolError(
            ErrorCode.INVALID_FRAME, f"request_id must be an integer in [0, 2**63-1], got {got}"
        )
    try:
        frame: Frame = cls.from_wire(rid, value[2:])
    except RemoteProtocolError as exc:
        # Type and request id are sound: the error concerns this request alone.
        message = _WIRE_TYPE_NAMES.sub(lambda m: f"got {_WIRE_TYPES[m[1]]}", exc.message)
        if "fields after the request id" in message:
            names = [a.name for a in attrs.fields(cls)[1:]]
            message += f"; its fields are [{', '.join(names)}] (trailing ones may be optional)"
        raise FrameFieldsError(exc.code, message, rid, frame_type) from None
    return frame
