"""Administration and cluster frames: STATUS, consumer groups (GROUP_CREATE,
GROUP_DELETE), cluster membership (CLUSTER_*), the live overview (WATCH, WATCH_UPDATE,
UNWATCH) and the shard map (SLOT_MAP).

Source: ``docs/protocol.md``, "Frames"; ``docs/sharding.md`` for SLOT_MAP.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from futureq.wire.frames.constants import FrameType
from futureq.wire.frames.fields import _arity, _bad, _int, _opt_int, _str
from futureq.wire.msgpack_names import describe


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
