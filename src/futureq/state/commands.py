"""The commands that go in the log, and their msgpack form (list form, first the kind).

Every state change of the queue is one of these, proposed by the leader and applied by
:meth:`futureq.state.queue_state.QueueState.apply` on every replica in log order. The
leader stamps wall-clock times into the command; apply never reads a clock.

Layouts (``DESIGN.md``, "Data flow"):

* ``[NOOP]``
* ``[PUBLISH, publish_ms, [[topic, payload, due_ms, ttl_ms | None], ...], settings]``
* ``[ACK, [schedule_key, ...]]``
* ``[NACK, now_ms, requeue_delay_ms, [[schedule_key, attempt], ...]]``
* ``[EXPIRE, [schedule_key, ...]]``
* ``[DEAD_LETTER, publish_ms, [[schedule_key, attempt], ...], settings]``
* ``[CREATE_GROUP, topic, group, visibility_timeout_ms | None, max_deliveries | None,
  settings]``
* ``[DELETE_GROUP, topic, group]``
* ``[NODE_ADDRESS, node_id, raft_address | None, client_address | None]`` (None: forget)
* ``[DELIVERED, [[schedule_key, attempt], ...]]``
* ``[PURGE_GROUP, group_id, max_entries]``
* ``[RELEASE, [[schedule_key, attempt], ...]]``

``settings`` is ``[visibility_timeout_ms, max_deliveries]``: the group settings the
*leader* resolved from its configuration (``[queue]``) for any group the command
creates without settings of its own (an implicit ``default`` group of a new topic or
dead-letter topic, or a CREATE_GROUP of a new group with ``None`` fields). Apply never
reads a node's configuration (``DESIGN.md``, "Apply reads nothing node-local"), so
every replica creates the group with the same settings. Entries written before the
field existed have no ``settings``; they take :data:`BUILTIN_GROUP_SETTINGS`.
"""

from __future__ import annotations

import enum
import struct
from typing import Any, Final

import attrs
import msgpack


class CommandKind(enum.IntEnum):
    """First element of every command; numbers are stored in logs and never change."""

    NOOP = 0
    PUBLISH = 1
    ACK = 2
    NACK = 3
    EXPIRE = 4
    DEAD_LETTER = 5
    CREATE_GROUP = 6
    DELETE_GROUP = 7
    NODE_ADDRESS = 8
    # 9-14 belong to other work (trust, time); 15-19 to delivery state (issue 9).
    DELIVERED = 15
    PURGE_GROUP = 16
    RELEASE = 17


@attrs.frozen
class GroupSettings:
    """Settings of a consumer group: what a leader resolves defaults into.

    Attributes:
        visibility_timeout_ms: How long a delivery may stay unsettled before it is
            delivered again (ms, >= 1).
        max_deliveries: Counted attempts before a message is dead-lettered (>= 1).
    """

    visibility_timeout_ms: int = 30_000
    max_deliveries: int = 16

    def to_wire(self) -> list[int]:
        """The ``settings`` element of a command."""
        return [self.visibility_timeout_ms, self.max_deliveries]

    @classmethod
    def from_wire(cls, value: Any) -> GroupSettings:
        """The settings of a command element (None: :data:`BUILTIN_GROUP_SETTINGS`)."""
        if value is None:
            return BUILTIN_GROUP_SETTINGS
        visibility_timeout_ms, max_deliveries = value
        return cls(visibility_timeout_ms, max_deliveries)


BUILTIN_GROUP_SETTINGS: Final = GroupSettings()
"""What entries written before commands carried ``settings`` resolve to (30 s, 16)."""
MAX_PURGE_ENTRIES: Final = 10_000
"""Most schedule entries one PURGE_GROUP removes, whatever the command asks."""


_SCHEDULE = struct.Struct(">IQQ")
_TAG = struct.Struct(">IQQI")
SCHEDULE_KEY_BYTES: Final = _SCHEDULE.size  # 20
DELIVERY_TAG_BYTES: Final = _TAG.size  # 24
ID_BATCH_BITS: Final = 16
"""Message id = (log index << 16) | position in the batch (``DESIGN.md``)."""
MAX_BATCH_POSITIONS: Final = 1 << ID_BATCH_BITS


def message_id(index: int, position: int) -> int:
    """The id of the message at ``position`` of the batch applied at log ``index``."""
    assert 0 <= position < MAX_BATCH_POSITIONS
    return (index << ID_BATCH_BITS) | position


def schedule_key(group_id: int, due_ms: int, mid: int) -> bytes:
    """``schedule`` family key: group id (4 bytes), due time (8), message id (8), big-endian.

    Keys of one group sort by due time, then by id (publish order).
    """
    return _SCHEDULE.pack(group_id, due_ms, mid)


def parse_schedule_key(key: bytes) -> tuple[int, int, int]:
    """``(group_id, due_ms, message_id)`` of a schedule key.

    Raises:
        struct.error: the key is not 20 bytes.
    """
    result: tuple[int, int, int] = _SCHEDULE.unpack(key)
    return result


def delivery_tag(key: bytes, attempt: int) -> bytes:
    """The 24-byte delivery tag: the schedule key, then the attempt number (4 bytes)."""
    return key + attempt.to_bytes(4, "big")


def parse_delivery_tag(tag: bytes) -> tuple[bytes, int] | None:
    """``(schedule_key, attempt)`` of a tag, or None when it is not a well-formed tag."""
    if type(tag) is not bytes or len(tag) != DELIVERY_TAG_BYTES:
        return None
    return tag[:SCHEDULE_KEY_BYTES], int.from_bytes(tag[SCHEDULE_KEY_BYTES:], "big")


_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def encode(command: list[Any]) -> bytes:
    """msgpack bytes of a command list."""
    data: bytes = _packb(command)
    return data


def decode(data: bytes) -> list[Any]:
    """The command list of msgpack bytes written by :func:`encode`."""
    value = msgpack.unpackb(data, raw=False, use_list=True)
    assert type(value) is list and value, "log entry is not a command"
    return value


def publish(
    publish_ms: int,
    items: list[tuple[str, bytes, int, int | None]],
    settings: GroupSettings = BUILTIN_GROUP_SETTINGS,
) -> bytes:
    """Encode a PUBLISH of validated ``(topic, payload, due_ms, ttl_ms)`` items.

    ``settings``: for the implicit group of a topic that has none (the leader's
    configured defaults).
    """
    return encode([CommandKind.PUBLISH, publish_ms, items, settings.to_wire()])


def ack(keys: list[bytes]) -> bytes:
    """Encode an ACK of schedule keys."""
    return encode([CommandKind.ACK, keys])


def nack(now_ms: int, requeue_delay_ms: int, entries: list[tuple[bytes, int]]) -> bytes:
    """Encode a NACK of ``(schedule_key, attempt)`` pairs, due again at now + delay."""
    return encode([CommandKind.NACK, now_ms, requeue_delay_ms, entries])


def expire(keys: list[bytes]) -> bytes:
    """Encode an EXPIRE of schedule keys."""
    return encode([CommandKind.EXPIRE, keys])


def dead_letter(
    publish_ms: int,
    entries: list[tuple[bytes, int]],
    settings: GroupSettings = BUILTIN_GROUP_SETTINGS,
) -> bytes:
    """Encode a DEAD_LETTER of ``(schedule_key, attempt)`` pairs.

    ``settings``: for the implicit group of a dead-letter topic that has none.
    """
    return encode([CommandKind.DEAD_LETTER, publish_ms, entries, settings.to_wire()])


def create_group(
    topic: str,
    group: str,
    visibility_timeout_ms: int | None,
    max_deliveries: int | None,
    settings: GroupSettings = BUILTIN_GROUP_SETTINGS,
) -> bytes:
    """Encode a CREATE_GROUP (idempotent).

    A None field keeps an existing group's value; a new group takes it from
    ``settings`` (the leader's configured defaults).
    """
    return encode(
        [
            CommandKind.CREATE_GROUP,
            topic,
            group,
            visibility_timeout_ms,
            max_deliveries,
            settings.to_wire(),
        ]
    )


def delete_group(topic: str, group: str) -> bytes:
    """Encode a DELETE_GROUP."""
    return encode([CommandKind.DELETE_GROUP, topic, group])


MAX_NODE_ID: Final = 2**31 - 1
"""Largest node id (its NODE_ADDRESS is stored under a 4-byte key). Ids are checked
against it where they enter (config, CLUSTER_ADD_NODE); apply ignores a NODE_ADDRESS
beyond it rather than fail on every replica."""


def node_address(node_id: int, raft_address: str | None, client_address: str | None) -> bytes:
    """Encode a NODE_ADDRESS: where a cluster member listens (None forgets the node)."""
    return encode([CommandKind.NODE_ADDRESS, node_id, raft_address, client_address])


def delivered(entries: list[tuple[bytes, int]]) -> bytes:
    """Encode a DELIVERED: ``(schedule_key, attempt)`` of deliveries about to be pushed.

    The leader commits it before it pushes them, so attempt counts survive leader
    changes and restarts and never go backwards.
    """
    return encode([CommandKind.DELIVERED, entries])


def purge_group(group_id: int, max_entries: int) -> bytes:
    """Encode a PURGE_GROUP: remove up to ``max_entries`` entries of a deleted group."""
    return encode([CommandKind.PURGE_GROUP, group_id, max_entries])


def release(entries: list[tuple[bytes, int]]) -> bytes:
    """Encode a RELEASE: ``(schedule_key, attempt)`` deliveries given back unprocessed.

    Each is due again at once and its attempt does not count towards
    ``max_deliveries``.
    """
    return encode([CommandKind.RELEASE, entries])


NOOP: Final = encode([CommandKind.NOOP])
