"""What a :class:`~futureq.raft.node.RaftNode` is built from: its configuration and the
state machine it applies to.

:class:`RaftNodeConfig` holds the node's identity and tuning (ticks, timeouts, batch
sizes, compaction, recovery) and derives the core's :class:`~futureq.raft.core.RaftConfig`
and the timekeeper's :class:`~futureq.raft.timekeeper.TimeConfig` from it;
:class:`StateMachine` and :class:`SnapshotSource` are the seams the node applies
committed entries through (``QueueState`` in the broker, a toy in tests).
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs

from futureq.errors import ConfigError
from futureq.raft.core import RaftConfig
from futureq.raft.messages import NodeId
from futureq.raft.timekeeper import TimeConfig


class SnapshotSource(Protocol):
    """A point-in-time view of the state machine at :attr:`index`."""

    @property
    def index(self) -> int:
        """Applied index the view reflects."""
        ...

    def serialize(self) -> bytes:
        """The state as bytes; runs in a worker thread and must not touch live state."""
        ...

    def close(self) -> None:
        """Release the view (e.g. a RocksDB snapshot)."""
        ...


class StateMachine(Protocol):
    """What the node applies committed entries to (e.g. ``QueueState``)."""

    @property
    def applied_index(self) -> int:
        """Index of the last entry applied (or restored from a snapshot)."""
        ...

    def apply(self, index: int, data: bytes) -> Any:
        """Apply a NORMAL entry; the result is handed to its proposer."""
        ...

    def apply_other(self, index: int) -> None:
        """A NOOP or CONFIG_CHANGE entry: just advance the applied index."""
        ...

    def snapshot_source(self) -> SnapshotSource:
        """A cheap point-in-time view at ``applied_index`` (taken on the event loop)."""
        ...

    def restore(self, data: bytes, index: int) -> None:
        """Replace the whole state with a snapshot's data taken at ``index``."""
        ...


@attrs.frozen
class RaftNodeConfig:
    """Identity and tuning of a :class:`RaftNode`.

    Attributes:
        node_id: This server's id (>= 1).
        tick_ms: Milliseconds per logical tick.
        election_timeout_ticks: Base election timeout (10 ticks = 500 ms by default).
        election_timeout_spread_ticks: Random part of the election timeout (ticks);
            None: as much as the base (``[T, 2T)``).
        heartbeat_ticks: Ticks between leader heartbeats.
        max_inflight_messages: Unanswered AppendEntries per follower.
        max_entries_bytes: Entry bytes per AppendEntries.
        snapshot_chunk_bytes: Snapshot bytes per InstallSnapshot chunk.
        compact_every_entries: Applied entries beyond the last snapshot before a new
            snapshot is taken and the log compacted.
        keep_entries_after_compaction: Log entries kept at and before the snapshot index
            so slightly lagging followers catch up without a snapshot.
        bootstrap_voters: The initial voters when the storage is new; empty for a node
            that will be added to an existing cluster.
        client_address: Our client listener ``HOST:PORT`` (for NOT_LEADER redirects).
        pre_vote: Run PreVote before elections (thesis §9.6).
        check_quorum: CheckQuorum and leader stickiness (thesis §6.2, §4.2.3).
        max_pending_proposals: Proposals queued for the next round before new ones
            are refused with UNAVAILABLE.
        outcome_unknown_ticks: After losing leadership, pending proposals whose fate is
            still unknown after this many ticks fail with UNAVAILABLE ("outcome
            unknown"); default 2 election timeouts.
        max_clock_offset_ms: The cluster clock's bound (``docs/architecture.md``,
            "Time"): a node whose clock is further than half of it from cluster time
            does not lead or dispatch.
        cluster_id: The cluster this node belongs to; stamped in a new data directory
            and checked against the stamp at every start.
        recovery: Recover after every start before voting (``docs/raft.md``, "Disk
            faults"). Off only in tests of the bare algorithm.
        member_record_ticks: How often (at most) a leader records the members'
            acknowledged progress in the log (ticks; 100 = 5 s by default).
        new_cluster: ``--initial-cluster-state new``: on the first start of a new data
            directory, recovery may end once a majority of the voters answered with
            empty logs (``docs/raft.md``, "Disk faults"). Ignored for a directory that
            was used before.
    """

    node_id: int
    tick_ms: int = 50
    election_timeout_ticks: int = 10
    election_timeout_spread_ticks: int | None = None
    heartbeat_ticks: int = 1
    max_inflight_messages: int = 256
    max_entries_bytes: int = 1 << 20
    snapshot_chunk_bytes: int = 1 << 20
    compact_every_entries: int = 50_000
    keep_entries_after_compaction: int = 10_000
    bootstrap_voters: frozenset[int] = frozenset()
    client_address: str | None = None
    pre_vote: bool = True
    check_quorum: bool = True
    max_pending_proposals: int = 65_536
    outcome_unknown_ticks: int | None = None
    max_clock_offset_ms: int = 500
    cluster_id: str = "futureq"
    recovery: bool = True
    member_record_ticks: int = 100
    new_cluster: bool = False

    def __attrs_post_init__(self) -> None:
        for key, value in (
            ("tick_ms", self.tick_ms),
            ("max_clock_offset_ms", self.max_clock_offset_ms),
            ("compact_every_entries", self.compact_every_entries),
            ("max_pending_proposals", self.max_pending_proposals),
        ):
            if value < 1:
                raise ConfigError(f"raft node {key}={value} is invalid; it must be >= 1")
        if self.keep_entries_after_compaction < 0:
            raise ConfigError(
                f"raft node keep_entries_after_compaction={self.keep_entries_after_compaction} "
                "is invalid; it must be >= 0"
            )
        self.raft_config()  # validates the rest
        self.time_config()

    def time_config(self) -> TimeConfig:
        """The timekeeper's configuration (cluster clock windows, lease)."""
        return TimeConfig.for_raft(
            self.tick_ms, self.election_timeout_ticks, self.max_clock_offset_ms
        )

    def raft_config(
        self, incarnation: int = 0, boot_id: int = 0, *, new_directory: bool = False
    ) -> RaftConfig:
        """The core's configuration, for a data directory stamped with ``incarnation``
        (created at this start if ``new_directory``) and a process start identified by
        ``boot_id``."""
        return RaftConfig(
            node_id=NodeId(self.node_id),
            election_timeout_ticks=self.election_timeout_ticks,
            election_timeout_spread_ticks=self.election_timeout_spread_ticks,
            heartbeat_interval_ticks=self.heartbeat_ticks,
            max_append_bytes=self.max_entries_bytes,
            max_inflight_messages=self.max_inflight_messages,
            snapshot_chunk_bytes=self.snapshot_chunk_bytes,
            pre_vote=self.pre_vote,
            check_quorum=self.check_quorum,
            incarnation=incarnation,
            boot_id=boot_id,
            recovery=self.recovery and boot_id > 0,
            member_record_ticks=self.member_record_ticks,
            new_cluster=self.new_cluster and new_directory,
        )
