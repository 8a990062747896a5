"""Every frame class by type number, the :data:`Frame` union, and
:func:`frame_from_wire`, which turns one decoded msgpack value into a frame.

Source: ``docs/protocol.md``, "Frames".
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from futureq.errors import ErrorCode, FrameFieldsError, RemoteProtocolError
from futureq.wire.frames.admin import (
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
from futureq.wire.msgpack_names import describe

MAX_REQUEST_ID = 2**63 - 1
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
    | Handover
    | GoAway
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
        Handover,
        GoAway,
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
