"""Per-peer replication progress (leader side) and snapshot reassembly (follower side).

The leader keeps one :class:`Progress` per member (paper Figure 2, ``nextIndex[]`` and
``matchIndex[]``), extended as in etcd-io/raft's ``tracker/progress.go`` with a state:

* PROBE — we do not know where the follower's log matches; send one AppendEntries at a
  time and back off on rejection (paper §5.3, with the thesis §5.3 fast back-off).
* REPLICATE — the follower is known to match; stream entries optimistically, advancing
  ``next`` before the answer arrives, with at most ``max_inflight`` unanswered
  AppendEntries (pipelining, thesis §10.2.2).
* SNAPSHOT — ``next`` was compacted away; an InstallSnapshot transfer is in progress
  (paper §7), one chunk in flight at a time.

:class:`SnapshotReceiver` is the follower's buffer that reassembles chunks.
"""

from __future__ import annotations

import enum
from collections import deque

import attrs

from futureq.raft.messages import LogIndex, Sender, Term
from futureq.raft.values import EMPTY_REGISTRY, Membership, Registry, Snapshot, SnapshotMetadata


class ProgressState(enum.Enum):
    """How the leader currently replicates to a peer."""

    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


class Progress:
    """The leader's view of one member's log.

    Args:
        next_index: First index to send (``nextIndex``).
        max_inflight: Largest number of unanswered AppendEntries in REPLICATE state.
        is_learner: Whether the member is a non-voting learner.
    """

    def __init__(self, next_index: LogIndex, max_inflight: int, *, is_learner: bool) -> None:
        assert max_inflight >= 1
        self.match: LogIndex = LogIndex(0)
        self.next: LogIndex = next_index
        self.state = ProgressState.PROBE
        self.is_learner = is_learner
        # PROBE: an AppendEntries is outstanding; wait for its answer or a heartbeat.
        self.probe_sent = False
        # REPLICATE: last index of each unanswered AppendEntries, oldest first.
        self.inflight: deque[LogIndex] = deque()
        self.max_inflight = max_inflight
        # SNAPSHOT: the snapshot being sent and how much the follower acknowledged.
        self.snapshot: Snapshot | None = None
        self.snapshot_offset = 0
        self._snapshot_offset_at_heartbeat = -1
        # CheckQuorum (thesis §6.2): heard from this peer in the current window, and
        # in the window before (a membership change must not leave no quorum of peers
        # heard from: RaftCore.propose_conf_change).
        self.recent_active = False
        self.was_active = False
        # ReadIndex (thesis §6.4): highest heartbeat round this peer answered.
        self.read_seq_acked = 0
        # Disk faults (docs/raft.md): who answers, and whether it may count yet.
        self.peer_boot = 0
        self.peer_incarnation = 0
        self.peer_recovering = False

    def __repr__(self) -> str:
        return (
            f"Progress(state={self.state.value}, match={self.match}, next={self.next}, "
            f"inflight={len(self.inflight)}, learner={self.is_learner}, "
            f"recovering={self.peer_recovering})"
        )

    # --- who answers (docs/raft.md, "Disk faults") ---------------------------------------

    def observe(self, sender: Sender, next_index: LogIndex) -> bool:
        """Take the sender stamp of a message from this peer.

        A new ``boot`` means the peer restarted: what it acknowledged before may be gone
        from its disk (wiped, or an older copy), so replication starts over by probing
        from ``next_index`` with ``match = 0``. The commit index is not affected: it
        never goes back.

        Returns:
            True if the peer restarted since the last message seen from it.
        """
        restarted = sender.boot != self.peer_boot
        self.peer_boot = sender.boot
        self.peer_incarnation = sender.incarnation
        self.peer_recovering = sender.recovering
        if restarted:
            self.match = LogIndex(0)
            self.next = next_index
            self._reset(ProgressState.PROBE)
            self.read_seq_acked = 0
        return restarted

    @property
    def counts(self) -> bool:
        """Whether this peer's answers count towards quorums (a voter, not recovering)."""
        return not self.is_learner and not self.peer_recovering

    # --- state transitions -------------------------------------------------------------

    def become_probe(self) -> None:
        """Fall back to probing from ``match + 1`` (or after a just-sent snapshot)."""
        if self.state is ProgressState.SNAPSHOT and self.snapshot is not None:
            self.next = LogIndex(max(self.match + 1, self.snapshot.metadata.index + 1))
        else:
            self.next = LogIndex(self.match + 1)
        self._reset(ProgressState.PROBE)

    def become_replicate(self) -> None:
        """Start pipelining from ``match + 1``."""
        self.next = LogIndex(self.match + 1)
        self._reset(ProgressState.REPLICATE)

    def become_snapshot(self, snapshot: Snapshot) -> None:
        """Start sending ``snapshot`` from byte 0."""
        self._reset(ProgressState.SNAPSHOT)
        self.snapshot = snapshot
        self.snapshot_offset = 0
        self._snapshot_offset_at_heartbeat = -1

    def _reset(self, state: ProgressState) -> None:
        self.state = state
        self.probe_sent = False
        self.inflight.clear()
        if state is not ProgressState.SNAPSHOT:
            self.snapshot = None
            self.snapshot_offset = 0

    # --- acknowledgements -------------------------------------------------------------

    def maybe_update(self, index: LogIndex) -> bool:
        """A successful AppendEntries answer says the log matches through ``index``.

        Returns:
            True if ``match`` advanced.
        """
        updated = False
        if index > self.match:
            self.match = index
            self.probe_sent = False
            updated = True
        self.next = LogIndex(max(self.next, index + 1))
        while self.inflight and self.inflight[0] <= index:
            self.inflight.popleft()
        return updated

    def sent_entries(self, last_index: LogIndex) -> None:
        """Record an AppendEntries carrying entries up to ``last_index`` was sent."""
        if self.state is ProgressState.REPLICATE:
            self.next = LogIndex(last_index + 1)
            self.inflight.append(last_index)
        elif self.state is ProgressState.PROBE:
            self.probe_sent = True

    def maybe_decrease_to(self, rejected: LogIndex, match_hint: LogIndex) -> bool:
        """A rejection of the AppendEntries with ``prev_log_index == rejected``.

        Args:
            rejected: The rejected ``prev_log_index``.
            match_hint: The leader's best guess of the last matching index, from the
                follower's hint (thesis §5.3 fast back-off).

        Returns:
            False if the rejection is stale (answers an older message), else True
            after moving ``next`` back.
        """
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = LogIndex(self.match + 1)
            return True
        if self.next - 1 != rejected or rejected <= self.match:
            return False  # stale: answers an older probe, or one we know matched since
        self.next = LogIndex(max(min(rejected, match_hint + 1), self.match + 1, 1))
        self.probe_sent = False
        return True

    def next_snapshot_chunk(self, chunk_bytes: int) -> tuple[int, bytes, bool]:
        """The chunk to send now: ``(offset, data, done)``, from the acknowledged offset."""
        assert self.snapshot is not None
        offset = self.snapshot_offset
        data = self.snapshot.data[offset : offset + chunk_bytes]
        return offset, data, offset + len(data) >= len(self.snapshot.data)

    def snapshot_chunk_answered(self, chunk_offset: int, next_offset: int) -> bool:
        """Take a follower's answer to a chunk; True if the next chunk should go out.

        A larger ``next_offset`` is progress. The answer to the chunk at our current
        offset is authoritative even when smaller: the follower lost its buffer
        (restarted) and the transfer resumes from what it holds. Anything else is a
        stale or duplicate answer.
        """
        assert self.snapshot is not None
        if next_offset > self.snapshot_offset or (
            chunk_offset == self.snapshot_offset and next_offset != self.snapshot_offset
        ):
            self.snapshot_offset = min(next_offset, len(self.snapshot.data))
            return True
        return False

    def snapshot_stalled(self) -> bool:
        """Called on each heartbeat answer: True if no chunk was acknowledged since the
        previous one, so the chunk in flight was probably lost and should be resent."""
        stalled = self.snapshot_offset == self._snapshot_offset_at_heartbeat
        self._snapshot_offset_at_heartbeat = self.snapshot_offset
        return stalled

    def is_paused(self) -> bool:
        """Whether the leader must hold off sending AppendEntries to this peer."""
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.REPLICATE:
            return len(self.inflight) >= self.max_inflight
        return True


@attrs.frozen
class _TransferKey:
    leader_term: Term
    index: LogIndex
    term: Term


class SnapshotReceiver:
    """Follower-side reassembly of InstallSnapshot chunks (paper §7, Figure 13).

    Chunks must arrive in offset order; a chunk at the current length is appended, any
    other is ignored and answered with the current length, so the leader resends from
    there. A chunk at offset 0 of a different snapshot (or from another term's leader)
    starts over. The buffer lives in memory only: after a crash the leader restarts the
    transfer (it learns the follower's length from the answer).
    """

    def __init__(self) -> None:
        self._key: _TransferKey | None = None
        self._chunks: list[bytes] = []
        self._length = 0

    def _clear(self) -> None:
        self._key = None
        self._chunks = []
        self._length = 0

    def receive(
        self,
        leader_term: Term,
        index: LogIndex,
        term: Term,
        membership: Membership,
        offset: int,
        data: bytes,
        done: bool,
        registry: Registry = EMPTY_REGISTRY,
    ) -> tuple[int, Snapshot | None]:
        """Take one chunk (``registry`` is the snapshot's member registry).

        Returns:
            ``(next_offset, snapshot)``: the number of contiguous bytes held, and the
            assembled snapshot when this chunk completed it (the buffer is then reset).
        """
        key = _TransferKey(leader_term, index, term)
        if key != self._key:
            if offset != 0:
                return 0, None
            self._clear()
            self._key = key
        if offset != self._length:
            return self._length, None
        self._chunks.append(data)
        self._length += len(data)
        if not done:
            return self._length, None
        snapshot = Snapshot(
            SnapshotMetadata(index, term, membership, registry), b"".join(self._chunks)
        )
        length = self._length
        self._clear()
        return length, snapshot
