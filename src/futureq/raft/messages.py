"""Raft value types and peer messages, with their compact msgpack form.

Everything here is a frozen attrs class: log entries, hard state, membership,
snapshots, the :class:`Ready` batch the core hands to its adapter, and one class per
peer message (Raft paper, Figure 2; thesis §3.10, §4, §6.4, §9.6 for the extensions).

The wire form of a message is a msgpack array whose first element is a small type tag
and whose other elements are the fields in declaration order (:func:`encode_message`,
:func:`decode_message`). Any byte string either decodes to a message or raises
:class:`~futureq.errors.RemoteProtocolError`; nothing else escapes the decoder.
"""

from __future__ import annotations

import enum

import attrs
import msgpack

from futureq.errors import ErrorCode, RemoteProtocolError
from futureq.raft.basics import LogIndex as LogIndex
from futureq.raft.basics import NodeId as NodeId
from futureq.raft.basics import Term as Term
from futureq.wire.codec import msgpack_fault


class EntryKind(enum.IntEnum):
    """What a log entry carries; the numbers are part of the stored and wire form."""

    NORMAL = 0
    """An opaque command for the replicated state machine."""
    NOOP = 1
    """The empty entry a new leader appends to commit its term (thesis §6.4)."""
    CONFIG_CHANGE = 2
    """A membership change; ``data`` is :func:`encode_config_change` (thesis §4.1)."""
    MEMBER_RECORDS = 9
    """The leader's record of every member's incarnation and acknowledged progress;
    ``data`` is :func:`encode_registry` (``docs/raft.md``, "Disk faults"). Numbered from
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


# --- peer messages -----------------------------------------------------------------


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


# --- membership change payloads --------------------------------------------------


def encode_config_change(change: ConfChange, membership: Membership) -> bytes:
    """Encode a CONFIG_CHANGE entry's data: the change and the full resulting membership.

    Storing the full membership (not only the delta) lets a node that joins with an
    empty configuration learn it from any config entry or snapshot it receives.
    """
    packed: bytes = msgpack.packb(
        [int(change.op), change.node_id, sorted(membership.voters), sorted(membership.learners)]
    )
    return packed


def decode_config_change(data: bytes) -> tuple[ConfChange, Membership]:
    """Decode what :func:`encode_config_change` wrote.

    Raises:
        RemoteProtocolError: If ``data`` is not a valid config change.
    """
    value = _unpack(data)
    fields = _expect_list(value, 4, "config change")
    op = _expect_int(fields[0], "config change op")
    if op not in ConfChangeOp._value2member_map_:
        raise _invalid(f"config change op {op} is unknown")
    node_id = _expect_node(fields[1], "config change node id")
    membership = _membership(fields[2], fields[3])
    return ConfChange(ConfChangeOp(op), node_id), membership


def _registry_fields(registry: Registry) -> list[object]:
    return [
        [[r.node_id, r.incarnation, r.acked_term, r.acked_index] for r in registry.records],
        [[node_id, index] for node_id, index in registry.removed],
    ]


def _registry(value: object) -> Registry:
    fields = _expect_list(value, 2, "registry")
    records_raw, removed_raw = fields
    if not isinstance(records_raw, list) or not isinstance(removed_raw, list):
        raise _invalid("registry records and removals must be arrays")
    records = []
    for raw in records_raw:
        item = _expect_list(raw, 4, "member record")
        records.append(
            MemberRecord(
                _expect_node(item[0], "member record node id"),
                _expect_int(item[1], "member record incarnation"),
                Term(_expect_int(item[2], "member record term")),
                LogIndex(_expect_int(item[3], "member record index")),
            )
        )
    removed = []
    for raw in removed_raw:
        item = _expect_list(raw, 2, "removal")
        removed.append(
            (_expect_node(item[0], "removed node id"), LogIndex(_expect_int(item[1], "removal")))
        )
    ids = [r.node_id for r in records]
    removed_ids = [n for n, _ in removed]
    if ids != sorted(set(ids)) or removed_ids != sorted(set(removed_ids)):
        raise _invalid("registry entries must be sorted by node id, each id once")
    return Registry(tuple(records), tuple(removed))


def encode_registry(registry: Registry) -> bytes:
    """Encode a MEMBER_RECORDS entry's data (and a snapshot's registry).

    Returns:
        msgpack ``[[[node, incarnation, acked_term, acked_index], ...], [[node, index], ...]]``.
    """
    packed: bytes = msgpack.packb(_registry_fields(registry))
    return packed


def decode_registry(data: bytes) -> Registry:
    """Decode what :func:`encode_registry` wrote.

    Raises:
        RemoteProtocolError: If ``data`` is not a valid registry.
    """
    return _registry(_unpack(data))


# --- wire codec ----------------------------------------------------------------------


class _Tag(enum.IntEnum):
    REQUEST_VOTE = 1
    REQUEST_VOTE_RESPONSE = 2
    APPEND_ENTRIES = 3
    APPEND_ENTRIES_RESPONSE = 4
    HEARTBEAT = 5
    HEARTBEAT_RESPONSE = 6
    INSTALL_SNAPSHOT = 7
    INSTALL_SNAPSHOT_RESPONSE = 8
    TIMEOUT_NOW = 9
    READ_INDEX = 10
    READ_INDEX_RESPONSE = 11
    # 20-24: issue 7 (disk faults and membership trust)
    RECOVERY_REQUEST = 20
    RECOVERY_RESPONSE = 21
    NOT_MEMBER = 22
    # 25-29: issue 8 (cluster time)
    CLOCK_PING = 25
    CLOCK_PONG = 26


def _entry_fields(entry: Entry) -> list[object]:
    return [entry.term, entry.index, int(entry.kind), entry.data]


def encode_message(message: Message) -> bytes:
    """Encode a peer message as a msgpack array.

    Layout: ``[tag, term, from_id, to_id, incarnation, boot, recovering, ...]`` where
    the middle three are ``message.sender`` and the rest are the other fields in the
    order of the message's class.

    Returns:
        The msgpack bytes.
    """
    sender = message.sender
    head: list[object] = [
        message.term,
        message.from_id,
        message.to_id,
        sender.incarnation,
        sender.boot,
        sender.recovering,
    ]
    body: list[object]
    match message:
        case RequestVote():
            tag = _Tag.REQUEST_VOTE
            body = [
                message.last_log_index,
                message.last_log_term,
                message.pre_vote,
                message.leadership_transfer,
            ]
        case RequestVoteResponse():
            tag = _Tag.REQUEST_VOTE_RESPONSE
            body = [message.granted, message.pre_vote]
        case AppendEntries():
            tag = _Tag.APPEND_ENTRIES
            body = [
                message.prev_log_index,
                message.prev_log_term,
                [_entry_fields(e) for e in message.entries],
                message.leader_commit,
            ]
        case AppendEntriesResponse():
            tag = _Tag.APPEND_ENTRIES_RESPONSE
            body = [message.success, message.index, message.reject_hint, message.log_term]
        case Heartbeat():
            tag = _Tag.HEARTBEAT
            body = [message.commit, message.read_seq]
        case HeartbeatResponse():
            tag = _Tag.HEARTBEAT_RESPONSE
            body = [message.read_seq]
        case InstallSnapshot():
            tag = _Tag.INSTALL_SNAPSHOT
            body = [
                message.snapshot_index,
                message.snapshot_term,
                sorted(message.membership.voters),
                sorted(message.membership.learners),
                message.offset,
                message.data,
                message.done,
                _registry_fields(message.registry),
            ]
        case InstallSnapshotResponse():
            tag = _Tag.INSTALL_SNAPSHOT_RESPONSE
            body = [
                message.snapshot_index,
                message.chunk_offset,
                message.next_offset,
                message.done,
                message.match_index,
            ]
        case TimeoutNow():
            tag = _Tag.TIMEOUT_NOW
            body = []
        case ReadIndex():
            tag = _Tag.READ_INDEX
            body = [message.request_ctx]
        case ReadIndexResponse():
            tag = _Tag.READ_INDEX_RESPONSE
            body = [message.request_ctx, message.index]
        case RecoveryRequest():
            tag = _Tag.RECOVERY_REQUEST
            body = [message.nonce, message.last_log_index, message.last_log_term]
        case RecoveryResponse():
            tag = _Tag.RECOVERY_RESPONSE
            body = [
                message.nonce,
                message.log_index,
                message.log_term,
                message.config_index,
                sorted(message.voters),
                message.commit_index,
                message.known_incarnation,
                message.acked_term,
                message.acked_index,
            ]
        case NotMember():
            tag = _Tag.NOT_MEMBER
            body = [message.removed_at]
        case ClockPing():
            tag = _Tag.CLOCK_PING
            body = [message.mono_us]
        case ClockPong():
            tag = _Tag.CLOCK_PONG
            body = [message.ping_mono_us, message.wall_us, message.in_bound]
    packed: bytes = msgpack.packb([int(tag), *head, *body], use_bin_type=True)
    return packed


_BODY_LENGTHS: dict[_Tag, int] = {
    _Tag.REQUEST_VOTE: 4,
    _Tag.REQUEST_VOTE_RESPONSE: 2,
    _Tag.APPEND_ENTRIES: 4,
    _Tag.APPEND_ENTRIES_RESPONSE: 4,
    _Tag.HEARTBEAT: 2,
    _Tag.HEARTBEAT_RESPONSE: 1,
    _Tag.INSTALL_SNAPSHOT: 8,
    _Tag.INSTALL_SNAPSHOT_RESPONSE: 5,
    _Tag.TIMEOUT_NOW: 0,
    _Tag.READ_INDEX: 1,
    _Tag.READ_INDEX_RESPONSE: 2,
    _Tag.RECOVERY_REQUEST: 3,
    _Tag.RECOVERY_RESPONSE: 9,
    _Tag.NOT_MEMBER: 1,
    _Tag.CLOCK_PING: 1,
    _Tag.CLOCK_PONG: 3,
}
_HEAD_LENGTH = 7
"""tag, term, from_id, to_id, and the sender's incarnation, boot and recovering flag."""
_senders: dict[tuple[int, int, bool], Sender] = {}
"""Decoded sender stamps, shared: a node sees the same few over and over."""


def decode_message(data: bytes) -> Message:
    """Decode bytes written by :func:`encode_message`.

    Raises:
        RemoteProtocolError: ``MALFORMED_FRAME`` if ``data`` is not one msgpack value;
            ``INVALID_FRAME`` if it is not a well-typed message array.
    """
    fields = _unpack(data)
    if not isinstance(fields, list) or not fields:
        raise _invalid("a raft message must be a non-empty msgpack array")
    raw_tag = _expect_int(fields[0], "message tag")
    if raw_tag not in _Tag._value2member_map_:
        raise _invalid(f"raft message tag {raw_tag} is unknown")
    tag = _Tag(raw_tag)
    if len(fields) != _HEAD_LENGTH + _BODY_LENGTHS[tag]:
        raise _invalid(
            f"raft message {tag.name} needs {_HEAD_LENGTH + _BODY_LENGTHS[tag]} fields, "
            f"got {len(fields)}"
        )
    term = Term(_expect_int(fields[1], "term"))
    from_id = _expect_node(fields[2], "from_id")
    to_id = _expect_node(fields[3], "to_id")
    key = (
        _expect_int(fields[4], "sender incarnation"),
        _expect_int(fields[5], "sender boot"),
        _expect_bool(fields[6], "sender recovering"),
    )
    sender = _senders.get(key)
    if sender is None:
        if len(_senders) >= 256:
            _senders.clear()
        sender = _senders[key] = Sender(*key)
    b = fields[_HEAD_LENGTH:]
    return _decode_body(tag, term, from_id, to_id, b, sender)


def _decode_body(  # noqa: PLR0911, PLR0912 - one branch per message type
    tag: _Tag, term: Term, from_id: NodeId, to_id: NodeId, b: list[object], sender: Sender
) -> Message:
    if tag is _Tag.REQUEST_VOTE:
        return RequestVote(
            term,
            from_id,
            to_id,
            LogIndex(_expect_int(b[0], "last_log_index")),
            Term(_expect_int(b[1], "last_log_term")),
            _expect_bool(b[2], "pre_vote"),
            _expect_bool(b[3], "leadership_transfer"),
            sender=sender,
        )
    if tag is _Tag.REQUEST_VOTE_RESPONSE:
        return RequestVoteResponse(
            term,
            from_id,
            to_id,
            _expect_bool(b[0], "granted"),
            _expect_bool(b[1], "pre_vote"),
            sender=sender,
        )
    if tag is _Tag.APPEND_ENTRIES:
        raw_entries = b[2]
        if not isinstance(raw_entries, list):
            raise _invalid("entries must be an array")
        return AppendEntries(
            term,
            from_id,
            to_id,
            LogIndex(_expect_int(b[0], "prev_log_index")),
            Term(_expect_int(b[1], "prev_log_term")),
            tuple(_entry(e) for e in raw_entries),
            LogIndex(_expect_int(b[3], "leader_commit")),
            sender=sender,
        )
    if tag is _Tag.APPEND_ENTRIES_RESPONSE:
        return AppendEntriesResponse(
            term,
            from_id,
            to_id,
            _expect_bool(b[0], "success"),
            LogIndex(_expect_int(b[1], "index")),
            LogIndex(_expect_int(b[2], "reject_hint")),
            Term(_expect_int(b[3], "log_term")),
            sender=sender,
        )
    if tag is _Tag.HEARTBEAT:
        return Heartbeat(
            term,
            from_id,
            to_id,
            LogIndex(_expect_int(b[0], "commit")),
            _expect_int(b[1], "read_seq"),
            sender=sender,
        )
    if tag is _Tag.HEARTBEAT_RESPONSE:
        return HeartbeatResponse(term, from_id, to_id, _expect_int(b[0], "read_seq"), sender=sender)
    if tag is _Tag.INSTALL_SNAPSHOT:
        return InstallSnapshot(
            term,
            from_id,
            to_id,
            LogIndex(_expect_int(b[0], "snapshot_index")),
            Term(_expect_int(b[1], "snapshot_term")),
            _membership(b[2], b[3]),
            _expect_int(b[4], "offset"),
            _expect_bytes(b[5], "data"),
            _expect_bool(b[6], "done"),
            _registry(b[7]),
            sender=sender,
        )
    if tag is _Tag.INSTALL_SNAPSHOT_RESPONSE:
        return InstallSnapshotResponse(
            term,
            from_id,
            to_id,
            LogIndex(_expect_int(b[0], "snapshot_index")),
            _expect_int(b[1], "chunk_offset"),
            _expect_int(b[2], "next_offset"),
            _expect_bool(b[3], "done"),
            LogIndex(_expect_int(b[4], "match_index")),
            sender=sender,
        )
    if tag is _Tag.TIMEOUT_NOW:
        return TimeoutNow(term, from_id, to_id, sender=sender)
    if tag is _Tag.READ_INDEX:
        return ReadIndex(term, from_id, to_id, _expect_bytes(b[0], "request_ctx"), sender=sender)
    if tag is _Tag.READ_INDEX_RESPONSE:
        return ReadIndexResponse(
            term,
            from_id,
            to_id,
            _expect_bytes(b[0], "request_ctx"),
            LogIndex(_expect_int(b[1], "index")),
            sender=sender,
        )
    if tag is _Tag.RECOVERY_REQUEST:
        return RecoveryRequest(
            term,
            from_id,
            to_id,
            _expect_int(b[0], "nonce"),
            LogIndex(_expect_int(b[1], "last_log_index")),
            Term(_expect_int(b[2], "last_log_term")),
            sender=sender,
        )
    if tag is _Tag.RECOVERY_RESPONSE:
        voters = b[4]
        if not isinstance(voters, list):
            raise _invalid("voters must be an array")
        return RecoveryResponse(
            term,
            from_id,
            to_id,
            _expect_int(b[0], "nonce"),
            LogIndex(_expect_int(b[1], "log_index")),
            Term(_expect_int(b[2], "log_term")),
            LogIndex(_expect_int(b[3], "config_index")),
            frozenset(_expect_node(v, "voter id") for v in voters),
            LogIndex(_expect_int(b[5], "commit_index")),
            _expect_int(b[6], "known_incarnation"),
            Term(_expect_int(b[7], "acked_term")),
            LogIndex(_expect_int(b[8], "acked_index")),
            sender=sender,
        )
    if tag is _Tag.CLOCK_PING:
        return ClockPing(term, from_id, to_id, _expect_int(b[0], "mono_us"), sender=sender)
    if tag is _Tag.CLOCK_PONG:
        return ClockPong(
            term,
            from_id,
            to_id,
            _expect_int(b[0], "ping_mono_us"),
            _expect_int(b[1], "wall_us"),
            _expect_bool(b[2], "in_bound"),
            sender=sender,
        )
    assert tag is _Tag.NOT_MEMBER
    return NotMember(term, from_id, to_id, LogIndex(_expect_int(b[0], "removed_at")), sender=sender)


def _unpack(data: bytes) -> object:
    try:
        value: object = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:  # msgpack raises many types for bad input; all mean "malformed"
        raise RemoteProtocolError(
            ErrorCode.MALFORMED_FRAME, f"raft message is not valid msgpack: {msgpack_fault(exc)}"
        ) from None
    return value


def _invalid(message: str) -> RemoteProtocolError:
    return RemoteProtocolError(ErrorCode.INVALID_FRAME, message)


def _expect_int(value: object, name: str) -> int:
    # bool is an int subclass in Python; msgpack keeps them apart, so must we.
    if type(value) is not int or value < 0:
        raise _invalid(f"{name} must be a non-negative integer, got {value!r:.40}")
    return value


def _expect_node(value: object, name: str) -> NodeId:
    number = _expect_int(value, name)
    if number < 1:
        raise _invalid(f"{name} must be a node id >= 1, got {number}")
    return NodeId(number)


def _expect_bool(value: object, name: str) -> bool:
    if type(value) is not bool:
        raise _invalid(f"{name} must be a boolean, got {value!r:.40}")
    return value


def _expect_bytes(value: object, name: str) -> bytes:
    if type(value) is not bytes:
        raise _invalid(f"{name} must be binary, got {type(value).__name__}")
    return value


def _expect_list(value: object, length: int, name: str) -> list[object]:
    if not isinstance(value, list) or len(value) != length:
        raise _invalid(f"{name} must be an array of {length} elements")
    return value


def _entry(value: object) -> Entry:
    fields = _expect_list(value, 4, "entry")
    kind = _expect_int(fields[2], "entry kind")
    if kind not in EntryKind._value2member_map_:
        raise _invalid(f"entry kind {kind} is unknown")
    return Entry(
        Term(_expect_int(fields[0], "entry term")),
        LogIndex(_expect_int(fields[1], "entry index")),
        EntryKind(kind),
        _expect_bytes(fields[3], "entry data"),
    )


def _membership(voters: object, learners: object) -> Membership:
    if not isinstance(voters, list) or not isinstance(learners, list):
        raise _invalid("membership voters and learners must be arrays")
    voter_ids = frozenset(_expect_node(v, "voter id") for v in voters)
    learner_ids = frozenset(_expect_node(v, "learner id") for v in learners)
    if voter_ids & learner_ids:
        raise _invalid("a node cannot be both voter and learner")
    return Membership(voter_ids, learner_ids)
