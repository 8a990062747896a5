"""Raft peer messages and the Ready batch.

Everything here is a frozen attrs class: one class per peer message (Raft paper,
Figure 2; thesis §3.10, §4, §6.4, §9.6 for the extensions), the :class:`Sender` stamp
every message carries, and the :class:`Ready` batch the core hands to its adapter.

The value types they carry (log entries, hard state, membership, snapshots) are in
:mod:`futureq.raft.values`; the wire form of a message is in
:mod:`futureq.raft.message_codec` (:func:`~futureq.raft.message_codec.encode_message`,
:func:`~futureq.raft.message_codec.decode_message`).
"""

from __future__ import annotations

import attrs

from futureq.raft.basics import LogIndex as LogIndex
from futureq.raft.basics import NodeId as NodeId
from futureq.raft.basics import Term as Term
from futureq.raft.values import (
    EMPTY_REGISTRY,
    Entry,
    HardState,
    Membership,
    ReadState,
    Registry,
    Snapshot,
)


@attrs.frozen
class Sender:
    """Who sent a message, beyond its id (``docs/raft.md``, "Disk faults").

    Attributes:
        incarnation: The sender's data-directory incarnation (0: not stamped).
        boot: Random id of the sender's current process start (0: unknown); a new value
            tells the leader the sender restarted, so what it acknowledged before may be
            gone.
        recovering: The sender has not finished recovery after a start: it neither
            votes nor counts towards any quorum.
    """

    incarnation: int = 0
    boot: int = 0
    recovering: bool = False


NO_SENDER = Sender()
"""The sender stamp of messages built without one (unit tests, old peers)."""


@attrs.frozen
class RequestVote:
    """RequestVote RPC (paper §5.2, Figure 2), also the PreVote request (thesis §9.6).

    Attributes:
        term: Candidate's term; for a pre-vote, the term it *would* campaign in.
        last_log_index: Index of the candidate's last entry (§5.4.1 up-to-date check).
        last_log_term: Term of that entry.
        pre_vote: True for a PreVote round, which changes no receiver's state.
        leadership_transfer: True when the candidate campaigns because of TimeoutNow;
            receivers then skip the leader-stickiness check (thesis §3.10, §4.2.3).
    """

    term: Term
    from_id: NodeId
    to_id: NodeId
    last_log_index: LogIndex
    last_log_term: Term
    pre_vote: bool = False
    leadership_transfer: bool = False
    sender: Sender = NO_SENDER


@attrs.frozen
class RequestVoteResponse:
    """Answer to :class:`RequestVote`; ``term`` is the request's term when granted."""

    term: Term
    from_id: NodeId
    to_id: NodeId
    granted: bool
    pre_vote: bool = False
    sender: Sender = NO_SENDER


@attrs.frozen
class AppendEntries:
    """AppendEntries RPC (paper §5.3, Figure 2).

    Attributes:
        prev_log_index: Index of the entry immediately preceding ``entries``.
        prev_log_term: Term of that entry (the log-matching consistency check).
        entries: Entries to store, in index order, starting at ``prev_log_index + 1``.
        leader_commit: Leader's commit index.
    """

    term: Term
    from_id: NodeId
    to_id: NodeId
    prev_log_index: LogIndex
    prev_log_term: Term
    entries: tuple[Entry, ...]
    leader_commit: LogIndex
    sender: Sender = NO_SENDER


@attrs.frozen
class AppendEntriesResponse:
    """Answer to :class:`AppendEntries`.

    Attributes:
        success: True when the follower's log matches through ``index``.
        index: On success the last index known to match the leader; on rejection the
            ``prev_log_index`` that was rejected (lets the leader drop stale answers).
        reject_hint: On rejection, the largest index ``<= index`` at which the
            follower's entry term is ``<= prev_log_term`` (thesis §5.3 fast back-off,
            etcd's variant of "conflicting term and first index of that term").
        log_term: Term of the follower's entry at ``reject_hint`` (0 if none).
    """

    term: Term
    from_id: NodeId
    to_id: NodeId
    success: bool
    index: LogIndex
    reject_hint: LogIndex = LogIndex(0)
    log_term: Term = Term(0)
    sender: Sender = NO_SENDER


@attrs.frozen
class Heartbeat:
    """Leader heartbeat (paper §5.2): asserts leadership, carries a safe commit index.

    Attributes:
        commit: ``min(leader commit, follower's match index)``, so a follower never
            commits an entry it has not been shown to match.
        read_seq: Highest ReadIndex round started by the leader (thesis §6.4); echoed.
    """

    term: Term
    from_id: NodeId
    to_id: NodeId
    commit: LogIndex
    read_seq: int = 0
    sender: Sender = NO_SENDER


@attrs.frozen
class HeartbeatResponse:
    """Answer to :class:`Heartbeat`, echoing its ``read_seq``."""

    term: Term
    from_id: NodeId
    to_id: NodeId
    read_seq: int = 0
    sender: Sender = NO_SENDER


@attrs.frozen
class InstallSnapshot:
    """One chunk of the InstallSnapshot RPC (paper §7, Figure 13).

    Attributes:
        snapshot_index: ``lastIncludedIndex``.
        snapshot_term: ``lastIncludedTerm``.
        membership: Membership carried by the snapshot.
        offset: Byte offset of ``data`` within the snapshot data.
        data: The chunk's bytes.
        done: True for the last chunk.
        registry: The member registry carried by the snapshot (``docs/raft.md``).
    """

    term: Term
    from_id: NodeId
    to_id: NodeId
    snapshot_index: LogIndex
    snapshot_term: Term
    membership: Membership
    offset: int
    data: bytes
    done: bool
    registry: Registry = EMPTY_REGISTRY
    sender: Sender = NO_SENDER


@attrs.frozen
class InstallSnapshotResponse:
    """Answer to :class:`InstallSnapshot`.

    Attributes:
        snapshot_index: Which snapshot this is about.
        chunk_offset: Offset of the chunk being answered.
        next_offset: Bytes the follower holds contiguously; the leader sends from here.
        done: True once the snapshot is complete and persisted (or already covered).
        match_index: When ``done``, the index the follower's log now matches.
    """

    term: Term
    from_id: NodeId
    to_id: NodeId
    snapshot_index: LogIndex
    chunk_offset: int
    next_offset: int
    done: bool = False
    match_index: LogIndex = LogIndex(0)
    sender: Sender = NO_SENDER


@attrs.frozen
class TimeoutNow:
    """Tells the target of a leadership transfer to campaign at once (thesis §3.10)."""

    term: Term
    from_id: NodeId
    to_id: NodeId
    sender: Sender = NO_SENDER


@attrs.frozen
class ReadIndex:
    """A follower forwards a linearizable read to the leader (thesis §6.4)."""

    term: Term
    from_id: NodeId
    to_id: NodeId
    request_ctx: bytes
    sender: Sender = NO_SENDER


@attrs.frozen
class ReadIndexResponse:
    """The leader's confirmed read index for a forwarded :class:`ReadIndex`."""

    term: Term
    from_id: NodeId
    to_id: NodeId
    request_ctx: bytes
    index: LogIndex
    sender: Sender = NO_SENDER


@attrs.frozen
class RecoveryRequest:
    """A node that (re)started asks a voter what it knows (``docs/raft.md``, "Disk faults").

    Viewstamped Replication Revisited §4.3's RECOVERY message adapted to Raft.

    Attributes:
        nonce: Identifies this round of requests; the answer echoes it.
        last_log_index: With ``last_log_term``, this node's log as it is now (its
            durable state, which may be older than what it once told its peers).
    """

    term: Term
    from_id: NodeId
    to_id: NodeId
    nonce: int
    last_log_index: LogIndex
    last_log_term: Term
    sender: Sender = NO_SENDER


@attrs.frozen
class RecoveryResponse:
    """A voter's answer to :class:`RecoveryRequest` (VRR §4.3 RECOVERYRESPONSE).

    Attributes:
        nonce: The request's nonce; answers to another round are ignored.
        log_index: With ``log_term``, the position of this voter's last log entry.
        log_term: See ``log_index``.
        config_index: Index of the configuration entry this voter's ``voters`` come from.
        voters: The voters of this voter's latest configuration.
        commit_index: This voter's commit index (tells whether that configuration is
            committed).
        known_incarnation: The requester's incarnation in this voter's registry (0: none).
        acked_term: Term of the requester's recorded acknowledgement (0: none).
        acked_index: Index the requester was recorded to have acknowledged (0: none).
    """

    term: Term
    from_id: NodeId
    to_id: NodeId
    nonce: int
    log_index: LogIndex
    log_term: Term
    config_index: LogIndex
    voters: frozenset[NodeId]
    commit_index: LogIndex = LogIndex(0)
    known_incarnation: int = 0
    acked_term: Term = Term(0)
    acked_index: LogIndex = LogIndex(0)
    sender: Sender = NO_SENDER


@attrs.frozen
class NotMember:
    """Tells a node that missed its own removal that it is no longer a member.

    Attributes:
        removed_at: Index of the committed configuration entry that removed it.
    """

    term: Term
    from_id: NodeId
    to_id: NodeId
    removed_at: LogIndex
    sender: Sender = NO_SENDER


@attrs.frozen
class ClockPing:
    """Asks a peer for its wall clock (``docs/architecture.md``, "Time").

    Sent by every node to every other member every few ticks, by the driver, never by
    the core. ``term`` is the sender's current term, for diagnostics only.

    Attributes:
        mono_us: The sender's monotonic clock when it sent the ping (µs); echoed.
    """

    term: Term
    from_id: NodeId
    to_id: NodeId
    mono_us: int
    sender: Sender = NO_SENDER


@attrs.frozen
class ClockPong:
    """Answer to :class:`ClockPing`: one clock sample for the pinger's cluster clock.

    Attributes:
        ping_mono_us: The ping's ``mono_us``, echoed.
        wall_us: The answering node's wall clock when it answered (µs since the Unix
            epoch).
        in_bound: Whether the answering node may lead (its clock is synchronized and
            within the bound); the leader picks transfer targets by it.
    """

    term: Term
    from_id: NodeId
    to_id: NodeId
    ping_mono_us: int
    wall_us: int
    in_bound: bool
    sender: Sender = NO_SENDER


Message = (
    RequestVote
    | RequestVoteResponse
    | AppendEntries
    | AppendEntriesResponse
    | Heartbeat
    | HeartbeatResponse
    | InstallSnapshot
    | InstallSnapshotResponse
    | TimeoutNow
    | ReadIndex
    | ReadIndexResponse
    | RecoveryRequest
    | RecoveryResponse
    | NotMember
    | ClockPing
    | ClockPong
)
"""Any peer message; every one has ``term``, ``from_id``, ``to_id`` and ``sender``.

:class:`ClockPing` and :class:`ClockPong` are answered and consumed by the driver (the
cluster clock); they never reach ``RaftCore.step``.
"""
CLOCK_MESSAGES = (ClockPing, ClockPong)
"""The message classes of the cluster clock (not for the Raft core)."""


@attrs.frozen
class Ready:
    """Everything the core wants done, handed out by ``RaftCore.ready()``.

    The adapter must, in this order: send ``leader_messages`` (at once, before or
    while writing); persist ``snapshot`` (if any), ``entries`` and ``hard_state``
    (fsync when ``must_sync``); then send ``messages``; then install ``snapshot`` into
    the state machine and apply ``committed_entries`` in order; then call
    ``RaftCore.advance(ready)``. ``messages`` may depend on the persisted state (a
    vote, an acknowledged entry), which is why they come after the write (paper §5,
    Figure 2: "respond to RPCs only after updating stable storage").
    ``leader_messages`` promise nothing about this node's disk: a leader may replicate
    entries before its own write of them finishes (thesis §10.2.1), because it counts
    itself toward a quorum only from ``advance`` on, once the write is durable.

    Attributes:
        entries: New log entries to append (they may overwrite a conflicting suffix).
        hard_state: New hard state to persist, or None when unchanged.
        snapshot: A snapshot received from the leader to persist and install, or None.
        committed_entries: Entries to apply, consecutive, following the applied index.
        messages: Peer messages to send, after persisting.
        leader_messages: The leader's AppendEntries, Heartbeat and InstallSnapshot
            messages of a term whose term and vote are already durable: send them
            before (or while) persisting.
        read_states: Confirmed reads (thesis §6.4).
        must_sync: Whether the write must be fsynced before sending.
    """

    entries: tuple[Entry, ...] = ()
    hard_state: HardState | None = None
    snapshot: Snapshot | None = None
    committed_entries: tuple[Entry, ...] = ()
    messages: tuple[Message, ...] = ()
    read_states: tuple[ReadState, ...] = ()
    must_sync: bool = False
    leader_messages: tuple[Message, ...] = ()
