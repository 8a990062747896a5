"""The FutureQ exception tree and the stable error codes shared by server and client.

Every ``ErrorCode`` number is part of the wire protocol (``docs/protocol.md``,
"Error codes"): a number never changes meaning once released. The client rebuilds the
same exception class from an ERROR frame with :func:`error_from_code`, so both ends
speak one vocabulary.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """Stable error codes carried by ERROR frames.

    1xx: the peer broke the protocol; the connection is closed after the ERROR frame.
    2xx: a well-formed request was refused; only that request fails.
    3xx: the server cannot serve the request now; retrying (elsewhere or later) may work.
    """

    # 1xx protocol errors (connection closed)
    FRAME_TOO_LARGE = 100
    MALFORMED_FRAME = 101
    UNKNOWN_FRAME_TYPE = 102
    INVALID_FRAME = 103
    UNSUPPORTED_VERSION = 104
    HELLO_REQUIRED = 105
    TRUNCATED_FRAME = 106
    AUTH_FAILED = 107
    # 110-119: issue 10, limits
    FRAME_TIMEOUT = 110
    KEEPALIVE_TIMEOUT = 111
    SLOW_CLIENT = 112
    # 120-124: issue 13, clients and UI
    WEBSOCKET_MESSAGE = 120
    """A WebSocket message that is text, or not exactly one frame (``/ws``)."""

    # 2xx request errors (request fails alone)
    INVALID_FIELD = 200
    INVALID_TOPIC = 201
    RESERVED_TOPIC = 202
    PAYLOAD_TOO_LARGE = 203
    INVALID_DELAY = 204
    DELAY_TOO_LARGE = 205
    INVALID_TTL = 206
    DUE_TIME_OVERFLOW = 207
    BATCH_TOO_LARGE = 208
    EMPTY_BATCH = 209
    UNKNOWN_DELIVERY_TAG = 210
    FOREIGN_DELIVERY_TAG = 211
    UNKNOWN_SUBSCRIPTION = 212
    INVALID_GROUP = 213
    UNKNOWN_GROUP = 214
    INVALID_ARGUMENT = 215
    UNKNOWN_TOPIC = 216
    # 220-224: issue 8, time
    IMPLAUSIBLE_TIME = 220
    NODE_CLOCK_OUT_OF_BOUND = 221
    # 225-234: delivery state (issue 9)
    GROUP_DELETED = 225
    # 235-249: issue 10, limits and access
    PERMISSION_DENIED = 235
    TOO_MANY_SUBSCRIPTIONS = 236
    TOO_MANY_GROUPS = 237
    # 250-259: cluster membership
    QUORUM_AT_RISK = 250
    # 260-279: managing scheduled messages (issue 14)
    INVALID_MESSAGE_ID = 260
    INVALID_CURSOR = 261
    GROUP_REQUIRED = 262
    INVALID_HEADERS = 263
    INVALID_IDEMPOTENCY_KEY = 264
    DELIVERY_CANCELLED = 265
    # 280-289: issue 15, shards
    WRONG_SHARD = 280
    """The topic belongs to another shard of the node; the ERROR frame's
    ``leader_address`` names that shard's client address (``docs/sharding.md``)."""
    SHARD_LAYOUT_MISMATCH = 285
    """A Raft peer runs another shard count, slot map version, shard or port stride
    (peer handshake refusal; ``docs/sharding.md``, "Agreement between nodes")."""

    # 3xx availability errors (retry may succeed)
    NOT_LEADER = 300
    UNAVAILABLE = 301
    STORAGE_FAILURE = 302
    TIMEOUT = 303
    INTERNAL_ERROR = 304
    # 315-319: issue 8, time
    CLOCK_NOT_SYNCHRONIZED = 315
    # 325-329: issue 10, limits
    NO_SPACE = 325
    TOO_MANY_CONNECTIONS = 326

    @property
    def closes_connection(self) -> bool:
        """True for protocol errors (1xx), after which the server closes the connection."""
        return 100 <= self.value < 200

    @property
    def retryable(self) -> bool:
        """True for availability errors (3xx): the same request may succeed later."""
        return 300 <= self.value < 400


class FutureQError(Exception):
    """Base class of every error FutureQ raises on purpose."""


class ProtocolError(FutureQError):
    """A wire-level error: the bytes on a connection broke ``docs/protocol.md``.

    Attributes:
        code: The :class:`ErrorCode` sent in the ERROR frame.
    """

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class LocalProtocolError(ProtocolError):
    """We tried to build or send an invalid frame: a bug on our side."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that break the protocol; answer with ERROR, then close."""


class FrameFieldsError(RemoteProtocolError):
    """A frame with a known type and a valid request id whose fields are wrong.

    A field missing, extra, of the wrong type (a str, float or bool where an int
    belongs, a map where an array belongs) or outside its enumeration. The frame's bytes
    were consumed whole, so the stream is still in step: a server answers that request
    alone with ``INVALID_FIELD`` (200), or ``BATCH_TOO_LARGE`` (208) for more arrays and
    maps than any request needs (``code``), and keeps the connection; a client reading such a
    frame from a server treats it as the protocol error it is (``code`` INVALID_FRAME).

    Attributes:
        request_id: The frame's request id, to answer to.
        frame_type: The frame's type number (a known one).
    """

    def __init__(self, code: ErrorCode, message: str, request_id: int, frame_type: int) -> None:
        super().__init__(code, message)
        self.request_id = request_id
        self.frame_type = frame_type


class RequestError(FutureQError):
    """A well-formed request that the server refuses.

    Attributes:
        code: Stable :class:`ErrorCode`.
        message: A sentence telling the user what to fix.
        item_index: Index of the first bad item in a batch, or None.
    """

    def __init__(self, code: ErrorCode, message: str, item_index: int | None = None) -> None:
        super().__init__(message if item_index is None else f"item {item_index}: {message}")
        self.code = code
        self.message = message
        self.item_index = item_index


class NotLeaderError(RequestError):
    """This node is not the leader.

    Attributes:
        leader_address: ``"host:port"`` of the client listener of the leader, or None
            while no leader is known.
    """

    def __init__(self, leader_address: str | None, message: str | None = None) -> None:
        super().__init__(
            ErrorCode.NOT_LEADER,
            message
            or (
                f"this node is not the leader; send requests to {leader_address}"
                if leader_address
                else "this node is not the leader and knows no leader: an election is under way, "
                "or this node cannot reach a majority of the cluster; retry, or try another node"
            ),
        )
        self.leader_address = leader_address


class WrongShardError(RequestError):
    """The request's topic belongs to another shard (like Redis Cluster's MOVED).

    Attributes:
        address: Client address of the shard that owns the topic (on the node that
            answered), or None if the server did not say.
    """

    def __init__(self, address: str | None, message: str, item_index: int | None = None) -> None:
        super().__init__(ErrorCode.WRONG_SHARD, message, item_index)
        self.address = address
        self.leader_address = address  # the ERROR frame field it travels in


class ConnectionLostError(FutureQError):
    """The other side or the network broke the connection, or no server could be
    reached: raised as itself, the outcome of the request is **unknown** (it was sent
    and its answer never came, so it may or may not have taken effect)."""


class NotSentError(ConnectionLostError):
    """The request took no effect, and sending it again is safe.

    Raised (by the client library) when every attempt at the request is known not to
    have taken effect: it never reached a server (no connection before its deadline,
    a connection lost before it was written), the server's GOAWAY said it was not
    served, or the server refused it in a way that says nothing was applied
    (``NOT_LEADER``, ...). A subclass of :class:`ConnectionLostError`, so code that
    catches that still catches it; catch it first to tell "not sent" from "outcome
    unknown" (``docs/client.md``, "Errors").
    """


class SubscriptionEndedError(FutureQError):
    """The server ended a subscription (a SUBSCRIPTION_END frame), e.g. its group was deleted.

    Attributes:
        code: The :class:`ErrorCode` the server gave (e.g. ``GROUP_DELETED``).
        reason: The server's sentence.
    """

    def __init__(self, code: ErrorCode, reason: str) -> None:
        super().__init__(f"[{code.name}] {reason}")
        self.code = code
        self.reason = reason


class ClientClosedError(FutureQError):
    """The client was closed by its owner and then used."""


class StorageError(FutureQError):
    """RocksDB failed or the data on disk is corrupt; the node stops."""


class DataDirectoryInUseError(StorageError):
    """Another process holds the data directory's lock: the same node runs twice.

    ``futureq start`` refuses to run with exit code 2 (a configuration mistake).
    """


class NoSpaceError(StorageError):
    """A write failed because the disk (or the process's file size limit) is full.

    Unlike other storage errors the node does not stop: it refuses writes with
    ``NO_SPACE``, keeps serving what needs no new space, and retries until space comes
    back (``docs/operations.md``, "Full disk").
    """


class ConfigError(FutureQError):
    """Bad configuration, reported at start with the key, the value and what is allowed."""


def error_from_code(
    code: int,
    message: str,
    item_index: int | None = None,
    leader_address: str | None = None,
) -> FutureQError:
    """Rebuild the exception an ERROR frame stands for.

    Args:
        code: The ERROR frame's code; an unknown number maps to INTERNAL_ERROR.
        message: The ERROR frame's sentence.
        item_index: First bad item of a batch, if the server named one.
        leader_address: The leader's client address, for NOT_LEADER.

    Returns:
        A :class:`RemoteProtocolError` for 1xx codes, :class:`NotLeaderError` for
        NOT_LEADER, :class:`WrongShardError` for WRONG_SHARD, else a :class:`RequestError`.
    """
    try:
        error_code = ErrorCode(code)
    except ValueError:
        error_code = ErrorCode.INTERNAL_ERROR
    if error_code is ErrorCode.NOT_LEADER:
        return NotLeaderError(leader_address, message)
    if error_code is ErrorCode.WRONG_SHARD:
        return WrongShardError(leader_address, message, item_index)
    if error_code.closes_connection:
        return RemoteProtocolError(error_code, message)
    return RequestError(error_code, message, item_index)
