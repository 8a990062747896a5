"""One frozen class per frame type of the FutureQ wire protocol.

A frame travels as one msgpack array, ``[frame_type, request_id, field, ...]`` (list
form, not maps: it packs about three times faster). Every class has ``to_wire()``,
the list it is sent as, and ``from_wire(fields)``, which checks the shape and types
of a received frame and raises :class:`~futureq.errors.RemoteProtocolError` with
``INVALID_FRAME`` when they are wrong. Items inside a PUBLISH batch are checked
later, by :func:`futureq.wire.validation.validate_publish_items`, so that a bad item
fails its request alone instead of closing the connection.

The frame classes live in one module per family, and this package is the one
namespace the rest of the code uses (``from futureq.wire import frames``, then
``frames.Publish``; ``docs/protocol.md``):

* :mod:`~futureq.wire.frames.constants`: protocol version, :class:`FrameType` and the enums frames carry;
* :mod:`~futureq.wire.frames.connection`: HELLO, HELLO_OK, ERROR, OK, PING, PONG;
* :mod:`~futureq.wire.frames.messaging`: publish and consume (PUBLISH ... UNSUBSCRIBE);
* :mod:`~futureq.wire.frames.admin`: STATUS, groups, cluster, WATCH, SLOT_MAP;
* :mod:`~futureq.wire.frames.manage`: CANCEL, REDRIVE, RESCHEDULE, PURGE, BROWSE;
* :mod:`~futureq.wire.frames.registry`: :data:`Frame`, ``FRAME_CLASSES``, :func:`frame_from_wire`;
* :mod:`~futureq.wire.frames.fields`: the field checkers of ``from_wire``.

Source: ``docs/protocol.md``, "Frames".
"""

from __future__ import annotations

from futureq.wire.frames.admin import (
    MAX_WATCH_INTERVAL_MS,
    MIN_WATCH_INTERVAL_MS,
    ClusterAddNode,
    ClusterRemoveNode,
    ClusterStatus,
    ClusterStatusOk,
    ClusterTransferLeader,
    GroupCreate,
    GroupDelete,
    SlotMap,
    SlotMapOk,
    Status,
    StatusOk,
    Unwatch,
    Watch,
    WatchUpdate,
)
from futureq.wire.frames.connection import Error, GoAway, Hello, HelloOk, Ok, Ping, Pong
from futureq.wire.frames.constants import (
    MAX_MEMBERS,
    MAX_MESSAGE_ID,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    AckLevel,
    FrameType,
    GroupCreated,
    ItemStatus,
    RevokeReason,
)
from futureq.wire.frames.manage import (
    Browse,
    BrowseCounts,
    BrowseCountsOk,
    BrowseOk,
    Cancel,
    ItemResults,
    Purge,
    Redrive,
    Reschedule,
)
from futureq.wire.frames.messaging import (
    Ack,
    Credit,
    Deliver,
    Extend,
    Handover,
    Nack,
    Publish,
    PublishOk,
    Release,
    Revoke,
    Subscribe,
    SubscribeOk,
    SubscriptionEnd,
    SubscriptionInfo,
    Unsubscribe,
)
from futureq.wire.frames.registry import FRAME_CLASSES, MAX_REQUEST_ID, Frame, frame_from_wire

__all__ = [
    "Ack",
    "AckLevel",
    "Browse",
    "BrowseCounts",
    "BrowseCountsOk",
    "BrowseOk",
    "Cancel",
    "ClusterAddNode",
    "ClusterRemoveNode",
    "ClusterStatus",
    "ClusterStatusOk",
    "ClusterTransferLeader",
    "Credit",
    "Deliver",
    "Error",
    "Extend",
    "GoAway",
    "Handover",
    "FRAME_CLASSES",
    "Frame",
    "FrameType",
    "GroupCreate",
    "GroupDelete",
    "Hello",
    "HelloOk",
    "ItemResults",
    "GroupCreated",
    "ItemStatus",
    "MAX_MESSAGE_ID",
    "MAX_REQUEST_ID",
    "MAX_WATCH_INTERVAL_MS",
    "MIN_WATCH_INTERVAL_MS",
    "Nack",
    "Ok",
    "MAX_MEMBERS",
    "PROTOCOL_VERSION",
    "Ping",
    "Pong",
    "Publish",
    "PublishOk",
    "Purge",
    "Redrive",
    "Release",
    "Reschedule",
    "Revoke",
    "RevokeReason",
    "SUPPORTED_VERSIONS",
    "SlotMap",
    "SlotMapOk",
    "Status",
    "StatusOk",
    "Subscribe",
    "SubscribeOk",
    "SubscriptionEnd",
    "SubscriptionInfo",
    "Unsubscribe",
    "Unwatch",
    "Watch",
    "WatchUpdate",
    "frame_from_wire",
]
