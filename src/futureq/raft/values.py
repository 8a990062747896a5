"""Raft's value types: log entries, hard state, membership and member records,
snapshots and confirmed reads.

Each is a frozen attrs class (paper Figure 2; thesis §4 for membership, §6.4 for
reads, ``docs/raft.md``, "Disk faults", for member records). The numbers of
:class:`EntryKind` and :class:`ConfChangeOp` are part of the stored and wire form.
Peer messages are in :mod:`futureq.raft.messages`, the msgpack forms in
:mod:`futureq.raft.payload_codec` and :mod:`futureq.raft.message_codec`.
"""

from __future__ import annotations

import enum

import attrs

from futureq.raft.basics import LogIndex, NodeId, Term


class EntryKind(enum.IntEnum):
    """What a log entry carries; the numbers are part of the stored and wire form."""

    NORMAL = 0
    """An opaque command for the replicated state machine."""
    NOOP = 1
    """The empty entry a new leader appends to commit its term (thesis §6.4)."""
    CONFIG_CHANGE = 2
    """A membership change; ``data`` is :func:`~futureq.raft.payload_codec.encode_config_change` (thesis §4.1)."""
    MEMBER_RECORDS = 9
    """The leader's record of every member's incarnation and acknowledged progress;
    ``data`` is :func:`~futureq.raft.payload_codec.encode_registry` (``docs/raft.md``, "Disk faults"). Numbered from
    issue 7's range so it cannot collide with other new kinds."""


@attrs.frozen
class Entry:
    """One log entry (paper Figure 2, "log[]").

    Attributes:
        term: Term of the leader that created the entry.
        index: Position in the log, >= 1.
        kind: What ``data`` holds.
        data: Opaque payload bytes (empty for NOOP).
    """

    term: Term
    index: LogIndex
    kind: EntryKind = EntryKind.NORMAL
    data: bytes = b""

    def size_bytes(self) -> int:
        """Approximate in-memory/wire size, used to cap batches: payload plus 16 bytes."""
        return len(self.data) + 16


@attrs.frozen
class HardState:
    """What must be on stable storage before a node answers any RPC (paper Figure 2).

    Attributes:
        term: ``currentTerm``.
        vote: ``votedFor`` in ``term``, or None.
        commit: The commit index known when written. Persisting it is an optimisation
            (entries up to it are re-applied after a restart without waiting for a
            leader) and needs no fsync of its own.
    """

    term: Term = Term(0)
    vote: NodeId | None = None
    commit: LogIndex = LogIndex(0)


@attrs.frozen
class Membership:
    """The cluster configuration: who votes and who only receives the log (thesis §4).

    Attributes:
        voters: Ids whose acknowledgements count towards elections and commitment.
        learners: Non-voting members that receive the log (thesis §4.2.1, "catching
            up new servers"). Disjoint from ``voters``.
    """

    voters: frozenset[NodeId] = frozenset()
    learners: frozenset[NodeId] = frozenset()

    def __attrs_post_init__(self) -> None:
        assert not (self.voters & self.learners), "a node is either voter or learner"

    def members(self) -> list[NodeId]:
        """All voters and learners, in ascending id order (deterministic iteration)."""
        return sorted(self.voters | self.learners)

    def is_voter(self, node_id: NodeId) -> bool:
        """Whether ``node_id`` votes in this configuration."""
        return node_id in self.voters


class ConfChangeOp(enum.IntEnum):
    """A single-server membership change (thesis §4.1); numbers are stored in the log."""

    ADD_LEARNER = 0
    PROMOTE_VOTER = 1
    REMOVE_NODE = 2


@attrs.frozen
class ConfChange:
    """A requested membership change: ``op`` applied to ``node_id``."""

    op: ConfChangeOp
    node_id: NodeId


@attrs.frozen
class MemberRecord:
    """What the cluster remembers of one member's data directory (``docs/raft.md``).

    Attributes:
        node_id: The member.
        incarnation: Random id stamped in its data directory when it was created; a
            wiped or replaced directory has another one.
        acked_term: Term of the leader that recorded the acknowledgement.
        acked_index: Highest log index the member acknowledged to that leader (its log
            held the leader's entries through it, on stable storage).
    """

    node_id: NodeId
    incarnation: int
    acked_term: Term
    acked_index: LogIndex


@attrs.frozen
class Registry:
    """The replicated memory of members: their records and who was removed where.

    It travels in MEMBER_RECORDS entries and snapshot metadata, so it survives the
    loss of any one node's disk (it is committed on a quorum).

    Attributes:
        records: One record per member, by ascending node id.
        removed: ``(node id, index of the committed entry that removed it)``, by id.
    """

    records: tuple[MemberRecord, ...] = ()
    removed: tuple[tuple[NodeId, LogIndex], ...] = ()

    def record(self, node_id: NodeId) -> MemberRecord | None:
        """The record of ``node_id``, or None."""
        for record in self.records:
            if record.node_id == node_id:
                return record
        return None

    def removed_at(self, node_id: NodeId) -> LogIndex | None:
        """Index of the entry that removed ``node_id``, or None if it was not removed."""
        for removed, index in self.removed:
            if removed == node_id:
                return index
        return None

    def with_records(self, records: list[MemberRecord]) -> Registry:
        """A copy whose records are ``records`` (any order)."""
        return Registry(tuple(sorted(records, key=lambda r: r.node_id)), self.removed)

    def with_removal(self, node_id: NodeId, index: LogIndex) -> Registry:
        """A copy recording that ``node_id`` was removed at ``index`` (its record goes)."""
        removed = {n: i for n, i in self.removed if n != node_id}
        removed[node_id] = index
        return Registry(
            tuple(r for r in self.records if r.node_id != node_id),
            tuple(sorted(removed.items())),
        )

    def without_removal(self, node_id: NodeId) -> Registry:
        """A copy forgetting a removal of ``node_id`` (it was added again)."""
        if self.removed_at(node_id) is None:
            return self
        return Registry(self.records, tuple(p for p in self.removed if p[0] != node_id))


EMPTY_REGISTRY = Registry()
"""The registry of a cluster that has recorded nothing yet."""


@attrs.frozen
class SnapshotMetadata:
    """Where a snapshot sits in the log and which membership it carries (paper §7).

    Attributes:
        index: Last log index the snapshot covers (``lastIncludedIndex``).
        term: Term of that entry (``lastIncludedTerm``).
        membership: Membership in effect at ``index`` (thesis §5.1: the snapshot
            keeps the latest configuration as of its last included index).
        registry: The member registry in effect at ``index``.
    """

    index: LogIndex
    term: Term
    membership: Membership
    registry: Registry = EMPTY_REGISTRY


@attrs.frozen
class Snapshot:
    """A state-machine snapshot and its metadata; ``data`` is opaque to Raft."""

    metadata: SnapshotMetadata
    data: bytes = b""


@attrs.frozen
class ReadState:
    """A confirmed linearizable read (thesis §6.4).

    The caller may serve the read identified by ``request_ctx`` once its state machine
    has applied at least ``index``.
    """

    index: LogIndex
    request_ctx: bytes
