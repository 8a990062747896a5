"""The protocol's numbers: its version, the frame types, and the enums frames carry
(item statuses, revoke reasons, ack levels).

Numbers are stable protocol constants: each is documented in ``docs/protocol.md`` and
never changes meaning.
"""

from __future__ import annotations

import enum

PROTOCOL_VERSION = 6
"""The highest protocol version this code speaks (``docs/protocol.md``, "Versions")."""
SUPPORTED_VERSIONS: frozenset[int] = frozenset({1, 2, 3, 4, 5, 6})
"""Every version this code speaks: 6 adds GOAWAY (a node that stops serving a connection
names the last request it read: later ones took no effect and may go elsewhere); 5 adds HELLO_OK's ``max_prefetch`` (the server's
``limits.max_prefetch``: the most deliveries one subscription has out, and the largest
SUBSCRIBE window it takes); 4 adds HANDOVER (a leader handing over gracefully asks
each subscription which deliveries its application was handed; only those count); 3 adds
UNSUBSCRIBE's ``handed`` (only the deliveries the application saw count); 2 adds the cluster's member addresses to HELLO_OK; 1 is
still spoken to clients that offer nothing newer (the dashboard, older clients)."""
MAX_MEMBERS = 64
"""Most member addresses a HELLO_OK may carry (a cluster has 1 to 7 voters)."""


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
    # 49-50: graceful leader handover (protocol version 4), leaving a connection (6)
    HANDOVER = 49
    GOAWAY = 50
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


class GroupCreated(enum.IntEnum):
    """What a GROUP_CREATE did: the ``result`` of its OK (``docs/protocol.md``,
    "GROUP_CREATE"). A server of an earlier build answers None."""

    UNCHANGED = 0
    """The group existed with these settings: nothing changed, nothing was copied."""
    UPDATED = 1
    """The group existed: its settings changed; nothing was copied (``from_backlog``
    copies only into a group the request creates)."""
    CREATED = 2
    """A new group, empty (no ``from_backlog``, or the topic had no other group)."""
    CREATED_FROM_BACKLOG = 3
    """A new group ``from_backlog``: the topic's backlog is being copied to it in the
    background (STATUS: ``background`` ``backfilling`` until done)."""
    ADOPTED = 4
    """The topic's implicit ``default`` group became this group, with its backlog."""


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
