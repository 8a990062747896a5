"""RaftCore: the whole consensus algorithm as a sans-IO state machine.

Inputs are method calls (:meth:`RaftCore.tick`, :meth:`RaftCore.step`,
:meth:`RaftCore.propose`, ...); outputs are collected into a
:class:`~futureq.raft.messages.Ready` that the adapter persists, sends and applies
before calling :meth:`RaftCore.advance` (etcd-io/raft's Ready/Advance contract; see
``docs/raft.md``). The core never blocks, reads a clock or draws global randomness:
timeouts are counted in ticks and randomness comes from the ``random.Random`` passed in.

Implemented, with the rule each part follows:

* leader election with randomized timeouts and the up-to-date check (paper §5.2,
  §5.4.1), PreVote (thesis §9.6), CheckQuorum and leader stickiness (thesis §6.2, §4.2.3);
* log replication with the consistency check, fast conflict back-off (paper §5.3,
  thesis §5.3) and pipelining (thesis §10.2.2);
* commitment of current-term entries only (paper §5.4.2, Figure 8) and a no-op entry at
  the start of each term (thesis §6.4);
* InstallSnapshot in chunks (paper §7, thesis §5);
* single-server membership changes with learners (thesis §4.1, §4.2), including
  removal of the leader (thesis §4.2.2);
* leadership transfer (thesis §3.10) and ReadIndex reads (thesis §6.4);
* recovery after a start whose disk may have forgotten what it acknowledged (wiped,
  or an older copy): no votes, campaigns or quorum counting until every other voter
  answered (Viewstamped Replication Revisited §4.3), a member registry in the log, and
  a "not a member" answer to nodes that missed their removal (``docs/raft.md``,
  "Disk faults").
"""

from __future__ import annotations

import enum
import logging
from typing import TYPE_CHECKING

import attrs

from futureq.errors import (
    ConfigError,
    ErrorCode,
    NotLeaderError,
    RemoteProtocolError,
    RequestError,
)
from futureq.raft.log import RaftLog
from futureq.raft.messages import (
    CLOCK_MESSAGES,
    AppendEntries,
    AppendEntriesResponse,
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryKind,
    HardState,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    LogIndex,
    MemberRecord,
    Membership,
    Message,
    NodeId,
    NotMember,
    ReadIndex,
    ReadIndexResponse,
    ReadState,
    Ready,
    RecoveryRequest,
    RecoveryResponse,
    Registry,
    RequestVote,
    RequestVoteResponse,
    Sender,
    Snapshot,
    SnapshotMetadata,
    Term,
    TimeoutNow,
    decode_config_change,
    encode_config_change,
    encode_registry,
)
from futureq.raft.progress import Progress, ProgressState, SnapshotReceiver
from futureq.raft.quorum import (
    MembershipHistory,
    ReadIndexQueue,
    VoteResult,
    apply_conf_change,
    committed_index,
    has_quorum,
    majority,
    validate_conf_change,
    vote_result,
)
from futureq.raft.recovery import Configurations, Position, Recovery
from futureq.raft.registry import RegistryHistory
from futureq.raft.storage import CompactedError

if TYPE_CHECKING:
    import random

    from futureq.raft.storage import Storage


log = logging.getLogger(__name__)

MAX_CAMPAIGN_BACKOFF = 4
"""Largest factor by which failed campaigns stretch the election timeout (a power of
two; :attr:`RaftCore.campaign_backoff`): with T = 500 ms a starved node waits at most
2-4 s between campaigns, and goes back to 0.5-1 s once it hears a leader."""
"""Debug records of votes and campaigns (pure: nothing here reads them back)."""


class RaftNotLeaderError(NotLeaderError):
    """Raised by the core when a request needs the leader and this node is not it.

    Attributes:
        leader_id: The leader this node knows of, or None. The adapter maps it to
            ``leader_address`` for clients.
    """

    def __init__(self, leader_id: NodeId | None) -> None:
        super().__init__(
            None,
            f"this node is not the leader; the leader is node {leader_id}"
            if leader_id is not None
            else "this node is not the leader and no leader is known yet; retry shortly",
        )
        self.leader_id = leader_id


class ProposalDroppedError(RequestError):
    """The leader refuses a proposal for now (transfer or membership change under way).

    Retrying later may succeed (``ErrorCode.UNAVAILABLE``).
    """

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.UNAVAILABLE, message)


@attrs.frozen
class RaftConfig:
    """Tuning of one :class:`RaftCore`; durations in ticks, sizes in bytes.

    Attributes:
        node_id: This server's id (>= 1).
        election_timeout_ticks: Base election timeout T; followers time out after a
            random number of ticks in ``[T, T + spread)`` (paper §5.2). Also the
            CheckQuorum window and the leader-transfer deadline.
        election_timeout_spread_ticks: ``spread`` above; None: T (the paper's
            ``[T, 2T)``). A smaller spread shortens the worst failover; the split votes
            it would make likelier are settled by PreVote's tie-break (a pre-candidate
            that grants a PreVote to a better-placed one gives up its own campaign).
            After an election whose vote arrived only after it timed out, both ``T`` and
            ``spread`` of the next wait are doubled, up to :data:`MAX_CAMPAIGN_BACKOFF` times, until a leader is heard
            (see :meth:`RaftCore.campaign_backoff`).
        heartbeat_interval_ticks: Ticks between leader heartbeats; must be < T.
        max_append_bytes: Cap on entry bytes per AppendEntries.
        max_inflight_messages: Unanswered AppendEntries per follower in REPLICATE.
        snapshot_chunk_bytes: Snapshot data bytes per InstallSnapshot chunk.
        max_committed_bytes_per_ready: Cap on committed entry bytes per Ready.
        pre_vote: Run a PreVote round before a real election (thesis §9.6).
        check_quorum: Leader steps down without a live quorum, and followers in
            touch with a leader ignore vote requests (thesis §6.2, §4.2.3).
        incarnation: Random id of this node's data directory, stamped when it was
            created (0: not stamped); carried in every message (``docs/raft.md``).
        boot_id: Random id of this start of the process (0: unknown); the nonce of the
            recovery exchange. Must be non-zero when ``recovery`` is on.
        recovery: Start in the RECOVERING state: no votes, no campaigns, not counted
            in any quorum, until every other voter answered a RecoveryRequest; then
            take the highest term heard (abstaining in it) and vote only for logs at
            least as up to date as the k-th best one heard (``docs/raft.md``, "Disk
            faults").
        member_record_ticks: A leader writes the member registry (incarnations and
            acknowledged positions) at most this often when it changed; at once when
            an incarnation changed. 0 turns the registry off.
        new_cluster: This is the first start of a new data directory and the operator
            declared a brand-new cluster: recovery may end once a majority of the voters
            answered with empty logs (``--initial-cluster-state new``).
    """

    node_id: NodeId
    election_timeout_ticks: int = 10
    election_timeout_spread_ticks: int | None = None
    heartbeat_interval_ticks: int = 1
    max_append_bytes: int = 1 << 20
    max_inflight_messages: int = 256
    snapshot_chunk_bytes: int = 1 << 20
    max_committed_bytes_per_ready: int = 8 << 20
    pre_vote: bool = True
    check_quorum: bool = True
    incarnation: int = 0
    boot_id: int = 0
    recovery: bool = False
    member_record_ticks: int = 0
    new_cluster: bool = False

    def __attrs_post_init__(self) -> None:
        checks = [
            ("node_id", self.node_id, self.node_id >= 1, ">= 1"),
            ("heartbeat_interval_ticks", self.heartbeat_interval_ticks,
             self.heartbeat_interval_ticks >= 1, ">= 1"),
            ("election_timeout_ticks", self.election_timeout_ticks,
             self.election_timeout_ticks > self.heartbeat_interval_ticks,
             "> heartbeat_interval_ticks"),
            ("election_timeout_spread_ticks", self.election_timeout_spread_ticks,
             self.election_timeout_spread_ticks is None
             or 1 <= self.election_timeout_spread_ticks <= self.election_timeout_ticks,
             "between 1 and election_timeout_ticks (or None)"),
            ("max_append_bytes", self.max_append_bytes, self.max_append_bytes >= 1, ">= 1"),
            ("max_inflight_messages", self.max_inflight_messages,
             self.max_inflight_messages >= 1, ">= 1"),
            ("snapshot_chunk_bytes", self.snapshot_chunk_bytes,
             self.snapshot_chunk_bytes >= 1, ">= 1"),
            ("max_committed_bytes_per_ready", self.max_committed_bytes_per_ready,
             self.max_committed_bytes_per_ready >= 1, ">= 1"),
            ("incarnation", self.incarnation, self.incarnation >= 0, ">= 0"),
            ("boot_id", self.boot_id, self.boot_id > 0 or not self.recovery,
             "> 0 when recovery is on"),
            ("member_record_ticks", self.member_record_ticks, self.member_record_ticks >= 0,
             ">= 0"),
        ]  # fmt: skip
        for key, value, ok, allowed in checks:
            if not ok:
                raise ConfigError(f"raft config {key}={value} is invalid; it must be {allowed}")


class Role(enum.Enum):
    """A server's role (paper §5.1, plus the PreVote pre-candidate of thesis §9.6)."""

    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@attrs.frozen
class RecoveryStatus:
    """Where a node stands after a start (``docs/raft.md``, "Disk faults").

    Attributes:
        recovering: Still waiting for answers: no votes, campaigns or quorum counting.
        waiting_for: Voters whose answer is still missing.
        findings: Sentences about this node's data directory learned from the
            answers (an incarnation the registry does not know, an acknowledgement
            the directory does not hold).
        vote_floor: ``(term, index)``: the k-th most up-to-date log heard (k: a majority
            of the voters less this node). Until this node's own log reaches it, it votes
            only for candidates at least that far and does not campaign.
        removed_at: A member said this node was removed at this index (None: no).
        foreign: Why this node's data directory holds another cluster's log (a term no
            voter reached; it then never ends recovery and must stop), or None.
    """

    recovering: bool
    waiting_for: tuple[NodeId, ...]
    findings: tuple[str, ...]
    vote_floor: Position | None
    removed_at: LogIndex | None
    foreign: str | None = None


class _Campaign(enum.Enum):
    PRE_VOTE = "pre_vote"
    ELECTION = "election"
    TRANSFER = "transfer"


_LEADER_TRAFFIC = (AppendEntries, Heartbeat, InstallSnapshot)
"""Messages a leader may send before its own write finishes (``Ready.leader_messages``)."""


class RaftCore:
    """One Raft server, driven step by step.

    Args:
        config: Tuning and identity.
        storage: Persisted state to start from (read only; the adapter writes it).
        rng: The only source of randomness (election timeouts).
        applied: Index the state machine already applied; defaults to the stored
            snapshot's index, so entries after it are handed out again.

    Attributes:
        id: This server's id.
        role: Current :class:`Role`.
        term: ``currentTerm``.
        vote: ``votedFor`` in ``term``, or None.
        leader_id: The leader of ``term`` as far as this node knows, or None.
        log: The :class:`RaftLog` (commit and applied indexes live there).
        progress: Leader only: per-member replication progress.
    """

    def __init__(
        self,
        config: RaftConfig,
        storage: Storage,
        rng: random.Random,
        applied: LogIndex | None = None,
    ) -> None:
        self.config = config
        self.id = config.node_id
        self._rng = rng
        self.log = RaftLog(storage, applied)
        hard_state, base_membership = storage.initial_state()
        snapshot_metadata = storage.snapshot().metadata
        snapshot_index = snapshot_metadata.index
        assert self.log.applied >= snapshot_index, "applied index is behind the snapshot"
        self._memberships = MembershipHistory(snapshot_index, base_membership)
        self._registry = RegistryHistory(snapshot_index, snapshot_metadata.registry)
        self._scan_stored_log(storage)
        self.term: Term = hard_state.term
        self.vote: NodeId | None = hard_state.vote
        self.log.commit_to(LogIndex(max(hard_state.commit, snapshot_index)))
        assert self.log.applied <= self.log.committed, "applied index past the commit index"
        self._persisted_hard_state = hard_state
        self.role = Role.FOLLOWER
        self.leader_id: NodeId | None = None
        self.progress: dict[NodeId, Progress] = {}
        self._votes: dict[NodeId, bool] = {}
        self._outbox: list[Message] = []
        self._read_states: list[ReadState] = []
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._randomized_election_timeout = config.election_timeout_ticks
        self._failed_campaigns = 0
        self._timed_out_term = Term(0)
        """The last term whose election this node gave up when its timer fired."""
        self._late_vote_term = Term(0)
        """The last term a vote arrived for after that (campaign_backoff grew for it)."""
        self.lead_transferee: NodeId | None = None
        self._term_start_index = LogIndex(0)
        self._snapshot_receiver = SnapshotReceiver()
        self._reads = ReadIndexQueue()
        self._reads_awaiting_commit: list[tuple[bytes, NodeId]] = []
        self._outstanding_ready: Ready | None = None
        # A node that never saw a term cannot have answered a leader's heartbeat.
        self._ticks_since_start = 0 if hard_state.term > 0 else config.election_timeout_ticks
        self.campaign_allowed = True
        """Set by the driver: False while this node may not lead (its clock is not
        synchronized or outside the bound, ``docs/architecture.md``, "Time"). It then
        neither campaigns nor answers TimeoutNow; it still votes."""
        # How far this term's AppendEntries showed our log to match the leader's.
        self._leader_match = LogIndex(0)
        # Disk faults (docs/raft.md): the recovery exchange after a start.
        self.recovering = False
        self.removed_at: LogIndex | None = None
        self._sender = Sender(config.incarnation, config.boot_id, False)
        self._recovery = Recovery(
            config.incarnation, config.boot_id, (hard_state.term, self.log.last_index())
        )
        self._recovery_elapsed = 0
        self._recovery_asked = False  # no voter known yet to ask
        self._records_elapsed = 0
        self._records_check = False  # leader: look at the registry at the next tick
        self._become_follower(self.term, None)
        if config.recovery:
            self._start_recovery()

    def _scan_stored_log(self, storage: Storage) -> None:
        """Record the config and registry entries of the whole stored log (at start)."""
        index = storage.first_index()
        last = storage.last_index()
        while index <= last:
            batch = storage.entries(index, LogIndex(last + 1), 1 << 20)
            self._memberships.record_entries(batch)
            self._registry.record_entries(batch)
            index = LogIndex(batch[-1].index + 1)

    # --- read-only views -----------------------------------------------------------------

    @property
    def membership(self) -> Membership:
        """The latest membership in the log (in effect as soon as appended, thesis §4.1)."""
        return self._memberships.current()

    def membership_at(self, index: LogIndex) -> Membership:
        """The membership in effect at log ``index``."""
        return self._memberships.at(index)

    def hard_state(self) -> HardState:
        """The current hard state (not necessarily persisted yet)."""
        return HardState(self.term, self.vote, self.log.committed)

    def _promotable(self) -> bool:
        return self.id in self.membership.voters

    def registry_at(self, index: LogIndex) -> Registry:
        """The member registry in effect at log ``index`` (``docs/raft.md``)."""
        return self._registry.at(index)

    def recovery_status(self) -> RecoveryStatus:
        """Where this node stands in its recovery after a start (for logs and status)."""
        recovery = self._recovery
        own = (self.log.last_term(), self.log.last_index())
        recovery.below_floor(own, own)  # drops a floor this node's own log has reached
        waiting = (
            tuple(recovery.missing(self._recovery_required() or ())) if self.recovering else ()
        )
        return RecoveryStatus(
            self.recovering,
            waiting,
            tuple(recovery.findings),
            recovery.vote_floor,
            self.removed_at,
            recovery.foreign,
        )

    # --- inputs ------------------------------------------------------------------------

    def tick(self) -> None:
        """Advance logical time by one tick (election or heartbeat timer by role)."""
        self._check_no_outstanding_ready()
        if self._ticks_since_start < self.config.election_timeout_ticks:
            self._ticks_since_start += 1
        if self.role is Role.LEADER:
            self._tick_heartbeat()
        else:
            self._tick_recovery()
            self._tick_election()

    def propose(self, data: bytes) -> LogIndex:
        """Append a NORMAL entry carrying ``data`` to the leader's log.

        Returns:
            The entry's index. It is committed once it appears in
            ``Ready.committed_entries`` with this index and the proposing term.

        Raises:
            RaftNotLeaderError: if this node is not the leader (with the leader hint).
            ProposalDroppedError: during a leadership transfer (thesis §3.10) or while
                this leader is being removed.
        """
        self._check_no_outstanding_ready()
        return self._propose_entry(EntryKind.NORMAL, data)

    def propose_conf_change(self, change: ConfChange) -> LogIndex:
        """Propose a single-server membership change (thesis §4.1).

        The change takes effect on each server when its entry is appended. Only one
        change may be uncommitted at a time, and not before the leader committed an
        entry of its own term (the fix to single-server changes in thesis §4.1's
        errata, raft-dev 2015).

        Returns:
            The config entry's index.

        Raises:
            RaftNotLeaderError: if this node is not the leader.
            ProposalDroppedError: if a change is still uncommitted, the leader has not
                committed in its term yet, or a transfer is under way.
            RequestError: ``INVALID_ARGUMENT`` if the change does not fit the
                current membership (e.g. promoting a node that is not a learner);
                ``QUORUM_AT_RISK`` if the voters after it would not include a majority
                this leader heard from lately (:meth:`_check_quorum_after`).
        """
        self._check_no_outstanding_ready()
        if self.role is not Role.LEADER:
            raise RaftNotLeaderError(self.leader_id)
        if not self._committed_in_current_term():
            raise ProposalDroppedError(
                "the leader has not yet committed an entry of its term; retry shortly"
            )
        if self._memberships.last_change_index() > self.log.committed:
            raise ProposalDroppedError(
                "a membership change is still uncommitted; retry when it is committed"
            )
        reason = validate_conf_change(self.membership, change)
        if reason is not None:
            raise RequestError(ErrorCode.INVALID_ARGUMENT, reason)
        self._check_quorum_after(change)
        target = self.progress.get(change.node_id)
        if (
            change.op is ConfChangeOp.PROMOTE_VOTER
            and target is not None
            and target.peer_recovering
        ):
            # It would count towards quorums at once but cannot yet (docs/raft.md).
            raise ProposalDroppedError(
                f"node {change.node_id} is recovering after its start; promote it once it "
                "has heard from every voter"
            )
        data = encode_config_change(change, apply_conf_change(self.membership, change))
        return self._propose_entry(EntryKind.CONFIG_CHANGE, data)

    def transfer_leadership(self, target: NodeId) -> None:
        """Hand leadership to voter ``target`` (thesis §3.10).

        The leader stops accepting proposals, brings ``target`` up to date, then sends
        it TimeoutNow; ``target`` campaigns at once. If no new leader appears within an
        election timeout the transfer is aborted and proposals resume.

        Raises:
            RaftNotLeaderError: if this node is not the leader.
            RequestError: ``INVALID_ARGUMENT`` if ``target`` is not a voter.
        """
        self._check_no_outstanding_ready()
        if self.role is not Role.LEADER:
            raise RaftNotLeaderError(self.leader_id)
        if target == self.id:
            return
        if target not in self.membership.voters or target not in self.progress:
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT, f"node {target} is not a voter; cannot transfer to it"
            )
        if self.progress[target].peer_recovering:
            raise ProposalDroppedError(
                f"node {target} is recovering after a restart and cannot lead yet; retry shortly"
            )
        self.lead_transferee = target
        self._election_elapsed = 0  # the transfer deadline counts from now
        if self.progress[target].match == self.log.last_index():
            self._send(TimeoutNow(self.term, self.id, target, sender=self._sender))
        else:
            self._send_append(target)

    def read_index(self, request_ctx: bytes) -> None:
        """Start a linearizable read (thesis §6.4).

        The answer arrives as ``ReadState(index, request_ctx)`` in a later
        ``Ready.read_states``: serve the read once the state machine applied ``index``.
        A follower forwards the request to its leader; requests are lost if leadership
        changes, so the caller retries after a timeout with a fresh context.

        Args:
            request_ctx: Caller-chosen bytes identifying the request (unique).

        Raises:
            RaftNotLeaderError: if this node is not the leader and knows no leader.
        """
        self._check_no_outstanding_ready()
        if self.role is Role.LEADER:
            self._handle_read_request(request_ctx, self.id)
        elif self.leader_id is not None:
            self._send(
                ReadIndex(self.term, self.id, self.leader_id, request_ctx, sender=self._sender)
            )
        else:
            raise RaftNotLeaderError(None)

    def compact(self, index: LogIndex, data: bytes) -> Snapshot:
        """Build the snapshot that lets the log be compacted through ``index`` (paper §7).

        The adapter stores it with ``storage.compact(snapshot)``; afterwards the leader
        sends it to followers whose next entry was compacted away.

        Args:
            index: Last index covered; at most the applied index.
            data: The state machine's serialized state as of ``index``.

        Returns:
            The snapshot, with the term at ``index`` and the membership in effect there.

        Raises:
            ValueError: if ``index`` is past the applied index or not after the
                current first index.
        """
        if index > self.log.applied:
            raise ValueError(f"cannot snapshot at {index}: only {self.log.applied} is applied")
        term = self.log.term(index)
        if term is None or index < self.log.first_index():
            raise ValueError(f"cannot snapshot at {index}: first index is {self.log.first_index()}")
        metadata = SnapshotMetadata(index, term, self.membership_at(index), self.registry_at(index))
        return Snapshot(metadata, data)

    def step(self, message: Message) -> None:
        """Process a message from a peer (paper Figure 2, "Rules for Servers").

        Raises:
            ValueError: if the message is addressed to another node.
        """
        self._check_no_outstanding_ready()
        if message.to_id != self.id:
            raise ValueError(f"message for node {message.to_id} stepped into node {self.id}")
        if isinstance(message, CLOCK_MESSAGES):
            raise ValueError("clock messages are answered by the driver, not the core")
        if isinstance(message, RecoveryRequest | RecoveryResponse | NotMember):
            self._step_recovery(message)  # outside the term rules: a restarted node's
            return  # durable term may be older than what it once told its peers
        if isinstance(message, RequestVote) and self._tell_if_removed(
            message.from_id, message.last_log_index
        ):
            return
        if isinstance(message, RequestVoteResponse) and not message.pre_vote:
            self._note_late_vote(message)
        if message.term > self.term:
            if isinstance(message, RequestVote):
                # Leader stickiness (thesis §4.2.3): ignore a vote request while we
                # hear from a leader, unless the leader itself asked for it (§3.10).
                # A node that just started may have answered a leader's heartbeat
                # before it crashed, so it keeps the same quiet period: the leader's
                # lease counts on it (thesis §6.4.1, raft/timekeeper.py).
                in_lease = (
                    self.config.check_quorum
                    and (self.leader_id is not None or self._recently_started())
                    and self._election_elapsed < self.config.election_timeout_ticks
                )
                if in_lease and not message.leadership_transfer:
                    if log.isEnabledFor(logging.DEBUG):
                        log.debug(
                            "node %d: %s request of node %d for term %d ignored: %s "
                            "(%d of %d ticks since; leader stickiness)",
                            self.id, _vote_kind(message), message.from_id, message.term,
                            "just started" if self.leader_id is None
                            else f"heard from leader {self.leader_id} in term {self.term}",
                            self._election_elapsed, self.config.election_timeout_ticks,
                        )  # fmt: skip
                    if self.leader_id is None:
                        # Restarted: refuse without taking the term (the candidate sees
                        # a refusal, e.g. that we are recovering, docs/raft.md).
                        self._send(
                            RequestVoteResponse(
                                self.term, self.id, message.from_id, False, message.pre_vote,
                                sender=self._sender,
                            )
                        )  # fmt: skip
                    return
            if isinstance(message, RequestVote) and message.pre_vote:
                pass  # a PreVote changes no state (thesis §9.6)
            elif isinstance(message, RequestVoteResponse) and message.pre_vote and message.granted:
                pass  # granted pre-votes carry the term we are about to campaign in
            else:
                # Paper §5.1: a higher term makes us a follower of that term.
                leader = (
                    message.from_id
                    if isinstance(message, AppendEntries | Heartbeat | InstallSnapshot)
                    else None
                )
                self._become_follower(message.term, leader)
        elif message.term < self.term:
            if (self.config.check_quorum or self.config.pre_vote) and isinstance(
                message, AppendEntries | Heartbeat
            ):
                # A stale leader whose term we passed (e.g. after a failed election it
                # never saw) would otherwise never learn it is deposed (as in etcd raft.go).
                self._send(
                    AppendEntriesResponse(
                        self.term,
                        self.id,
                        message.from_id,
                        False,
                        LogIndex(0),
                        sender=self._sender,
                    )
                )
            elif isinstance(message, RequestVote) and message.pre_vote:
                log.debug(
                    "node %d: pre-vote for node %d refused: its term %d is behind ours (%d)",
                    self.id, message.from_id, message.term, self.term,
                )  # fmt: skip
                self._send(
                    RequestVoteResponse(
                        self.term, self.id, message.from_id, False, True, sender=self._sender
                    )
                )
            elif isinstance(message, RequestVote | RequestVoteResponse):
                log.debug(
                    "node %d: stale %s of node %d for term %d dropped (we are in term %d)",
                    self.id, type(message).__name__, message.from_id, message.term, self.term,
                )  # fmt: skip
            return  # paper §5.1: stale-term requests are rejected
        if isinstance(message, RequestVote):
            self._handle_request_vote(message)
        elif self.role is Role.LEADER:
            self._step_leader(message)
        elif self.role is Role.FOLLOWER:
            self._step_follower(message)
        else:
            self._step_candidate(message)

    # --- Ready / advance ---------------------------------------------------------------

    def has_ready(self) -> bool:
        """Whether :meth:`ready` would return anything to do."""
        return bool(
            self._outbox
            or self._read_states
            or self.log.unstable_snapshot is not None
            or self.log.persisted_index() != self.log.last_index()
            or self.hard_state() != self._persisted_hard_state
            or self.log.has_next_committed_entries()
        )

    def ready(self) -> Ready:
        """Collect the pending work; call :meth:`advance` with it when done.

        No other method may be called between ``ready()`` and ``advance()``.
        """
        self._check_no_outstanding_ready()
        hard_state = self.hard_state()
        persisted = self._persisted_hard_state
        hard_state_changed = hard_state != persisted
        entries = tuple(self.log.unstable_entries())
        snapshot = self.log.unstable_snapshot
        term_vote_durable = (hard_state.term, hard_state.vote) == (persisted.term, persisted.vote)
        messages, leader_messages = self._split_outbox(term_vote_durable)
        ready = Ready(
            entries=entries,
            hard_state=hard_state if hard_state_changed else None,
            snapshot=snapshot,
            committed_entries=tuple(
                self.log.next_committed_entries(self.config.max_committed_bytes_per_ready)
            ),
            messages=messages,
            read_states=tuple(self._read_states),
            # term and vote must be durable before any answer (paper Figure 2);
            # commit alone is recoverable and needs no fsync.
            must_sync=bool(entries) or snapshot is not None or not term_vote_durable,
            leader_messages=leader_messages,
        )
        self._outbox.clear()
        self._read_states.clear()
        self._outstanding_ready = ready
        return ready

    def _split_outbox(
        self, term_vote_durable: bool
    ) -> tuple[tuple[Message, ...], tuple[Message, ...]]:
        """``(messages, leader_messages)``: what must wait for the write, what need not.

        A leader whose term and vote are on disk may replicate before its own write of
        the same entries is done (thesis §10.2.1): AppendEntries, heartbeats and snapshot
        chunks acknowledge nothing about its own log, and :meth:`advance` counts the
        leader toward a quorum only for what it has stored. Everything else (votes,
        AppendEntries responses) waits for the write.
        """
        outbox = self._outbox
        if not (outbox and term_vote_durable and self.role is Role.LEADER):
            return tuple(outbox), ()
        early: list[Message] = []
        late: list[Message] = []
        for message in outbox:
            if isinstance(message, _LEADER_TRAFFIC) and message.term == self.term:
                early.append(message)
            else:
                late.append(message)
        return tuple(late), tuple(early)

    def advance(self, ready: Ready) -> None:
        """Acknowledge that ``ready`` was persisted, sent and applied.

        Raises:
            RuntimeError: if ``ready`` is not the one last returned by :meth:`ready`.
        """
        if ready is not self._outstanding_ready:
            raise RuntimeError("advance() must get the Ready returned by the last ready()")
        self._outstanding_ready = None
        if ready.snapshot is not None:
            index = ready.snapshot.metadata.index
            self.log.stable_snapshot_to(index)
            assert self.log.applied <= index <= self.log.committed
            self.log.applied = index
        if ready.entries:
            last = ready.entries[-1]
            self.log.stable_to(last.index, last.term)
        if ready.hard_state is not None:
            self._persisted_hard_state = ready.hard_state
        if ready.committed_entries:
            first = ready.committed_entries[0].index
            assert first == self.log.applied + 1, (
                f"apply out of order: {first} after {self.log.applied}"
            )
            self.log.applied_to(ready.committed_entries[-1].index)
        if self.role is Role.LEADER and self.id in self.progress:
            # The leader counts itself only for entries on its own stable storage.
            if self.progress[self.id].maybe_update(self.log.persisted_index()):
                if self._maybe_commit():
                    self._send_pending_appends()

    def _recently_started(self) -> bool:
        return self._ticks_since_start < self.config.election_timeout_ticks

    def step_down(self) -> None:
        """Leader: give up leadership without naming a successor.

        The node becomes a follower in the same term; the others elect a new leader once
        their election timeout passes. Used when this node may no longer lead (its
        clock left the bound) and no transfer target is available, or after a
        leadership transfer that did not complete. A no-op on a non-leader.
        """
        self._check_no_outstanding_ready()
        if self.role is Role.LEADER:
            self._become_follower(self.term, None)

    def _check_no_outstanding_ready(self) -> None:
        if self._outstanding_ready is not None:
            raise RuntimeError("call advance() for the outstanding Ready first")

    # --- role changes --------------------------------------------------------------------

    def _reset(self, term: Term) -> None:
        assert term >= self.term, f"term would go back from {self.term} to {term}"
        if term != self.term:
            self.term = term
            self.vote = None
        self.leader_id = None
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._reset_randomized_election_timeout()
        self._votes = {}
        self.lead_transferee = None
        self.progress = {}
        self._reads.clear()
        self._reads_awaiting_commit.clear()
        self._leader_match = LogIndex(0)

    def _reset_randomized_election_timeout(self) -> None:
        # Paper §5.2: randomized election timeouts make split votes rare.
        factor = self.campaign_backoff
        timeout = self.config.election_timeout_ticks * factor
        spread = self.config.election_timeout_spread_ticks or self.config.election_timeout_ticks
        self._randomized_election_timeout = timeout + self._rng.randrange(spread * factor)

    def _note_late_vote(self, message: RequestVoteResponse) -> None:
        """An answer to an election this node already gave up (its timer fired first):
        messages take longer than the election timeout, so wait longer next time."""
        term = message.term
        if term == self._timed_out_term and term > self._late_vote_term:
            self._late_vote_term = term
            self._failed_campaigns = min(
                self._failed_campaigns + 1, MAX_CAMPAIGN_BACKOFF.bit_length() - 1
            )
            log.info(
                "node %d: the vote of node %d for term %d came after that election timed "
                "out; waiting up to %d times the election timeout before campaigning",
                self.id, message.from_id, term, self.campaign_backoff,
            )  # fmt: skip

    @property
    def campaign_backoff(self) -> int:
        """How many times longer than configured this node now waits before it campaigns
        (1, 2, 4, ... up to :data:`MAX_CAMPAIGN_BACKOFF`).

        When messages take longer than the election timeout (a starved host: every
        process gets a fifth of a core), a campaign cannot collect its votes before the
        timer fires again and starts the next one, whose requests the late answers of
        the previous one no longer count for, and so on for as long as the host is
        slow. Each election whose vote arrived after it timed out doubles the next wait
        (a candidate waits for its votes longer, and the wider random spread separates
        competing candidates further); hearing from a leader, or leading, restores it.
        A campaign that fails for other reasons (votes refused or lost, peers still
        hearing the old leader) does not: a failover stays as fast as configured. Waiting
        longer than T before campaigning only lengthens the quiet period the leader
        lease counts on, so no safety rule depends on it.
        """
        return 1 << self._failed_campaigns

    def _become_follower(self, term: Term, leader_id: NodeId | None) -> None:
        self._reset(term)
        self.role = Role.FOLLOWER
        self.leader_id = leader_id

    def _become_pre_candidate(self) -> None:
        # Thesis §9.6: a pre-candidate changes neither its term nor its vote.
        assert self.role is not Role.LEADER
        self._votes = {}
        self.role = Role.PRE_CANDIDATE
        self.leader_id = None
        self._reset_randomized_election_timeout()

    def _become_candidate(self) -> None:
        # Paper §5.2: increment the term and vote for ourselves.
        assert self.role is not Role.LEADER
        self._reset(Term(self.term + 1))
        self.vote = self.id
        self.role = Role.CANDIDATE

    def _become_leader(self) -> None:
        assert self.role is Role.CANDIDATE
        self._failed_campaigns = 0
        self._reset(self.term)
        self.role = Role.LEADER
        self.leader_id = self.id
        self._records_check = True
        self._sync_progress()
        # Thesis §6.4: a no-op entry commits the leader's term, which tells it which
        # earlier entries are committed (needed before serving reads).
        noop = Entry(self.term, LogIndex(self.log.last_index() + 1), EntryKind.NOOP)
        self._term_start_index = noop.index
        self._append_leader_entries([noop])
        self._broadcast_append()

    def _sync_progress(self) -> None:
        """Leader: one Progress per member of the latest membership."""
        membership = self.membership
        members = membership.members()
        next_index = LogIndex(self.log.last_index() + 1)
        for node_id in sorted(self.progress):
            if node_id not in members:
                del self.progress[node_id]
                if node_id == self.lead_transferee:
                    self.lead_transferee = None
        for node_id in members:
            pr = self.progress.get(node_id)
            if pr is None:
                pr = Progress(
                    next_index,
                    self.config.max_inflight_messages,
                    is_learner=node_id in membership.learners,
                )
                self.progress[node_id] = pr
                if node_id == self.id:
                    pr.match = self.log.persisted_index()
                    pr.become_replicate()
                    pr.recent_active = True
            pr.is_learner = node_id in membership.learners

    # --- elections (paper §5.2, thesis §9.6) ----------------------------------------------

    def _tick_election(self) -> None:
        self._election_elapsed += 1
        # A node that may not lead lets its timer run on (so it stops ignoring vote
        # requests, leader stickiness) instead of restarting it with a campaign.
        if (
            self._may_campaign()
            and self.campaign_allowed
            and self._election_elapsed >= self._randomized_election_timeout
        ):
            self._election_elapsed = 0
            if self.role is Role.CANDIDATE:
                self._timed_out_term = self.term  # a vote for it now comes too late
            self._campaign(_Campaign.PRE_VOTE if self.config.pre_vote else _Campaign.ELECTION)

    def _may_campaign(self) -> bool:
        """A voter that finished recovery, was not told it was removed, and whose own
        log reached its vote floor (``docs/raft.md``, "Disk faults")."""
        if not self._promotable() or self.recovering or self.removed_at is not None:
            return False
        return not self._below_vote_floor(self.log.last_term(), self.log.last_index())

    def _below_vote_floor(self, last_term: Term, last_index: LogIndex) -> bool:
        """Whether a log ending at ``(last_term, last_index)`` is behind the vote floor
        (the k-th best log the voters held when this node last asked them)."""
        if self._recovery.vote_floor is None:
            return False
        own = (self.log.last_term(), self.log.last_index())
        return self._recovery.below_floor((last_term, last_index), own)

    def _campaign(self, kind: _Campaign) -> None:
        if not self._may_campaign() or not self.campaign_allowed:
            return
        if kind is _Campaign.PRE_VOTE:
            self._become_pre_candidate()
            vote_term = Term(self.term + 1)
        else:
            self._become_candidate()
            vote_term = self.term
        self._votes[self.id] = True
        if self._poll() is VoteResult.WON:  # a single-voter cluster
            if kind is _Campaign.PRE_VOTE:
                self._campaign(_Campaign.ELECTION)
            else:
                self._become_leader()
            return
        last_index = self.log.last_index()
        last_term = self.log.last_term()
        log.debug(
            "node %d: campaigns (%s) for term %d with last term %d, index %d",
            self.id, kind.name.lower(), vote_term, last_term, last_index,
        )  # fmt: skip
        for voter in sorted(self.membership.voters):
            if voter != self.id:
                self._send(
                    RequestVote(
                        vote_term,
                        self.id,
                        voter,
                        last_index,
                        last_term,
                        pre_vote=kind is _Campaign.PRE_VOTE,
                        leadership_transfer=kind is _Campaign.TRANSFER,
                        sender=self._sender,
                    )
                )

    def _poll(self) -> VoteResult:
        return vote_result(self.membership.voters, self._votes)

    def _handle_request_vote(self, message: RequestVote) -> None:
        # Paper §5.2: at most one vote per term, first come first served; thesis §9.6:
        # a pre-vote is granted to any up-to-date candidate of a higher term.
        can_vote = (
            self.vote == message.from_id
            or (self.vote is None and self.leader_id is None)
            or (message.pre_vote and message.term > self.term)
        ) and (
            # docs/raft.md, "Disk faults": a node whose disk may have forgotten what it
            # acknowledged votes for no one, and then only for logs it knows are safe.
            not self.recovering
            and self.removed_at is None
            and not self._below_vote_floor(message.last_log_term, message.last_log_index)
        )
        # Paper §5.4.1: only for a candidate whose log is at least as up-to-date.
        up_to_date = self.log.is_up_to_date(message.last_log_index, message.last_log_term)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "node %d: %s for node %d in term %d %s",
                self.id, _vote_kind(message), message.from_id, message.term,
                "granted" if can_vote and up_to_date
                else "refused: " + self._vote_refusal(message, up_to_date),
            )  # fmt: skip
        if can_vote and up_to_date:
            self._send(
                RequestVoteResponse(
                    message.term,
                    self.id,
                    message.from_id,
                    True,
                    message.pre_vote,
                    sender=self._sender,
                )
            )
            if not message.pre_vote:
                self._election_elapsed = 0
                self.vote = message.from_id
            elif self.role is Role.PRE_CANDIDATE and self._yields_to(message):
                # Two pre-candidates that time out together would grant each other's
                # PreVote, both campaign, vote for themselves and split the election
                # (another whole timeout). The one less placed to win gives up its
                # own campaign: a PreVote changed nothing, so it is as if it had not
                # timed out yet, and it can now vote for the other (thesis §9.6).
                log.debug(
                    "node %d: gives up its pre-campaign for node %d's", self.id,
                    message.from_id,
                )  # fmt: skip
                self._become_follower(self.term, None)
        else:
            self._send(
                RequestVoteResponse(
                    self.term,
                    self.id,
                    message.from_id,
                    False,
                    message.pre_vote,
                    sender=self._sender,
                )
            )

    def _yields_to(self, message: RequestVote) -> bool:
        """Whether the candidate of ``message`` goes first: a longer log (last term, then
        last index), or the same log and a lower node id."""
        theirs = (message.last_log_term, message.last_log_index, -int(message.from_id))
        ours = (self.log.last_term(), self.log.last_index(), -int(self.id))
        return theirs > ours

    def _vote_refusal(self, message: RequestVote, up_to_date: bool) -> str:
        """Why :meth:`_handle_request_vote` refuses ``message`` (for the debug log)."""
        if self.recovering:
            return "this node is recovering after its start"
        if self.removed_at is not None:
            return f"this node was removed at index {self.removed_at}"
        if self._below_vote_floor(message.last_log_term, message.last_log_index):
            return "its log is below this node's vote floor"
        if not (message.pre_vote and message.term > self.term):
            if self.vote is not None and self.vote != message.from_id:
                return f"already voted for node {self.vote} in term {self.term}"
            if self.vote is None and self.leader_id is not None:
                return f"node {self.leader_id} leads term {self.term}"
        if not up_to_date:
            return (
                f"its log (last term {message.last_log_term}, index "
                f"{message.last_log_index}) is behind ours (last term "
                f"{self.log.last_term()}, index {self.log.last_index()})"
            )
        return "not eligible"

    def _step_candidate(self, message: Message) -> None:
        if isinstance(message, AppendEntries | Heartbeat | InstallSnapshot):
            # Paper §5.2: a leader of our term exists; return to follower.
            self._become_follower(self.term, message.from_id)
            self._step_follower(message)
        elif isinstance(message, RequestVoteResponse):
            if message.pre_vote != (self.role is Role.PRE_CANDIDATE):
                return
            self._votes.setdefault(message.from_id, message.granted)
            result = self._poll()
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "node %d: %s of node %d in term %d: %s; votes %s: %s",
                    self.id, "pre-vote" if message.pre_vote else "vote", message.from_id,
                    message.term, "granted" if message.granted else "refused",
                    dict(sorted(self._votes.items())), result.name,
                )  # fmt: skip
            if result is VoteResult.WON:
                if self.role is Role.PRE_CANDIDATE:
                    self._campaign(_Campaign.ELECTION)
                else:
                    self._become_leader()
            elif result is VoteResult.LOST:
                self._become_follower(self.term, None)

    # --- follower ------------------------------------------------------------------------

    def _step_follower(self, message: Message) -> None:
        if isinstance(message, AppendEntries | Heartbeat | InstallSnapshot):
            self._election_elapsed = 0
            self.leader_id = message.from_id
            self._failed_campaigns = 0  # a leader is heard: campaign_backoff is over
            if isinstance(message, AppendEntries):
                self._handle_append_entries(message)
            elif isinstance(message, Heartbeat):
                self._handle_heartbeat(message)
            else:
                self._handle_install_snapshot(message)
        elif isinstance(message, TimeoutNow):
            # Thesis §3.10: campaign at once, skipping PreVote and stickiness.
            if self._may_campaign():
                self._campaign(_Campaign.TRANSFER)
        elif isinstance(message, ReadIndexResponse):
            self._read_states.append(ReadState(message.index, message.request_ctx))

    def _handle_append_entries(self, message: AppendEntries) -> None:
        """AppendEntries receiver (paper Figure 2 and §5.3)."""
        if not self._entries_well_formed(message):
            return
        if message.prev_log_index < self.log.committed:
            # Everything up to our commit index already matches the leader.
            self._leader_match = LogIndex(max(self._leader_match, self.log.committed))
            self._send(
                AppendEntriesResponse(
                    self.term,
                    self.id,
                    message.from_id,
                    True,
                    self.log.committed,
                    sender=self._sender,
                )
            )
            return
        result = self.log.maybe_append(
            message.prev_log_index, message.prev_log_term, message.leader_commit, message.entries
        )
        if result is not None:
            last_new, appended = result
            self._leader_match = LogIndex(max(self._leader_match, last_new))
            if appended:
                self._memberships.truncate_from(appended[0].index)
                self._memberships.record_entries(appended)
                self._registry.truncate_from(appended[0].index)
                self._registry.record_entries(appended)
            self._send(
                AppendEntriesResponse(
                    self.term, self.id, message.from_id, True, last_new, sender=self._sender
                )
            )
            return
        # Thesis §5.3: tell the leader where our log might match so it can skip a
        # whole term of entries per round trip instead of one entry.
        hint_index = LogIndex(min(message.prev_log_index, self.log.last_index()))
        hint_index, hint_term = self.log.find_conflict_by_term(hint_index, message.prev_log_term)
        self._send(
            AppendEntriesResponse(
                self.term,
                self.id,
                message.from_id,
                False,
                message.prev_log_index,
                reject_hint=hint_index,
                log_term=hint_term,
                sender=self._sender,
            )
        )

    @staticmethod
    def _entries_well_formed(message: AppendEntries) -> bool:
        expected = message.prev_log_index + 1
        for entry in message.entries:
            if entry.index != expected or entry.term > message.term:
                return False
            if entry.kind is EntryKind.CONFIG_CHANGE:
                try:
                    decode_config_change(entry.data)
                except RemoteProtocolError:
                    return False
            expected += 1
        return True

    def _handle_heartbeat(self, message: Heartbeat) -> None:
        # The leader sends min(commit, our match). Its idea of our match may predate a
        # restart with a disk that forgot (docs/raft.md, "Disk faults"), so commit only
        # as far as this term's AppendEntries showed our log to match the leader's.
        self.log.commit_to(LogIndex(min(message.commit, self._leader_match)))
        self._send(
            HeartbeatResponse(
                self.term, self.id, message.from_id, message.read_seq, sender=self._sender
            )
        )

    def _handle_install_snapshot(self, message: InstallSnapshot) -> None:
        """InstallSnapshot receiver (paper §7, Figure 13), chunk by chunk."""
        if message.snapshot_index <= self.log.committed:
            # Already covered (e.g. our earlier "done" answer was lost): say so at once
            # instead of receiving the whole snapshot again.
            self._send(
                InstallSnapshotResponse(
                    self.term, self.id, message.from_id, message.snapshot_index,
                    message.offset, message.offset, done=True, match_index=self.log.committed,
                    sender=self._sender,
                )
            )  # fmt: skip
            return
        next_offset, snapshot = self._snapshot_receiver.receive(
            message.term,
            message.snapshot_index,
            message.snapshot_term,
            message.membership,
            message.offset,
            message.data,
            message.done,
            message.registry,
        )
        if snapshot is None:
            self._send(
                InstallSnapshotResponse(
                    self.term,
                    self.id,
                    message.from_id,
                    message.snapshot_index,
                    message.offset,
                    next_offset,
                    sender=self._sender,
                )
            )
            return
        match_index = self._restore(snapshot)
        self._leader_match = LogIndex(max(self._leader_match, match_index))
        self._send(
            InstallSnapshotResponse(
                self.term,
                self.id,
                message.from_id,
                message.snapshot_index,
                message.offset,
                next_offset,
                done=True,
                match_index=match_index,
                sender=self._sender,
            )
        )

    def _restore(self, snapshot: Snapshot) -> LogIndex:
        metadata = snapshot.metadata
        if metadata.index <= self.log.committed:
            return self.log.committed  # we already have (and may have applied) it all
        if self.log.match_term(metadata.index, metadata.term):
            # Paper §7: our log already contains the snapshot's last entry; keep the
            # entries after it and just learn that everything up to it is committed.
            self.log.commit_to(metadata.index)
            return metadata.index
        self.log.restore(snapshot)
        self._memberships.reset(metadata.index, metadata.membership)
        self._registry.reset(metadata.index, metadata.registry)
        return metadata.index

    # --- leader --------------------------------------------------------------------------

    def _tick_heartbeat(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        if self._election_elapsed >= self.config.election_timeout_ticks:
            self._election_elapsed = 0
            if self.config.check_quorum and not self._quorum_recently_active():
                # Thesis §6.2: without a live quorum we may be deposed; step down so
                # clients look for the real leader.
                self._become_follower(self.term, None)
                return
            if self.lead_transferee is not None:
                self.lead_transferee = None  # thesis §3.10: abort after a timeout
        if self._heartbeat_elapsed >= self.config.heartbeat_interval_ticks:
            self._heartbeat_elapsed = 0
            self._broadcast_heartbeat()
        if self.config.member_record_ticks:
            self._tick_member_records()

    def _heard_from(self, *, previous_timeout_too: bool) -> set[NodeId]:
        """This leader and the members that answered it in the current election timeout
        (and, with ``previous_timeout_too``, in the one before), a recovering peer not
        counted (thesis §6.2: a leader steps down without such a quorum)."""
        return {
            node_id
            for node_id, pr in self.progress.items()
            if node_id == self.id
            or (
                (pr.recent_active or (previous_timeout_too and pr.was_active))
                and not pr.peer_recovering
            )
        }

    def _quorum_recently_active(self) -> bool:
        active = self._heard_from(previous_timeout_too=False)
        for node_id, pr in self.progress.items():
            if node_id != self.id:
                pr.was_active = pr.recent_active
                pr.recent_active = False
        return has_quorum(self.membership.voters, active)

    def _check_quorum_after(self, change: ConfChange) -> None:
        """Refuse a change whose voters would not hold a quorum of members this leader
        heard from in the last one or two election timeouts (as etcd's
        ``--strict-reconfig-check``): removing the leader, or a live voter, while
        another is down left the cluster without a leader until the down one came back.

        Raises:
            RequestError: QUORUM_AT_RISK, naming the voters not heard from.
        """
        after = apply_conf_change(self.membership, change).voters
        if after == self.membership.voters or not after:
            return
        heard = self._heard_from(previous_timeout_too=True)
        if has_quorum(after, heard):
            return
        silent = sorted(int(n) for n in after - heard)
        action = "removing" if change.op is ConfChangeOp.REMOVE_NODE else "promoting"
        raise RequestError(
            ErrorCode.QUORUM_AT_RISK,
            f"{action} node {change.node_id} would leave voters "
            f"{sorted(int(n) for n in after)}, of which node(s) {silent} have not answered "
            f"this leader for an election timeout or more (down, partitioned or still "
            f"catching up): fewer than a majority ({majority(len(after))} of {len(after)}) "
            "would be left to elect and commit. Bring those nodes back first (or remove a "
            "node that is down instead)",
        )

    def _propose_entry(self, kind: EntryKind, data: bytes) -> LogIndex:
        if self.role is not Role.LEADER:
            raise RaftNotLeaderError(self.leader_id)
        if self.lead_transferee is not None:
            raise ProposalDroppedError(
                f"leadership is being transferred to node {self.lead_transferee}; retry shortly"
            )
        if self.id not in self.progress:
            raise ProposalDroppedError("this leader is being removed from the cluster")
        entry = Entry(self.term, LogIndex(self.log.last_index() + 1), kind, data)
        self._append_leader_entries([entry])
        self._broadcast_append()
        return entry.index

    def _append_leader_entries(self, entries: list[Entry]) -> None:
        self.log.append(entries)
        if any(e.kind in (EntryKind.CONFIG_CHANGE, EntryKind.MEMBER_RECORDS) for e in entries):
            self._registry.record_entries(entries)
        if any(e.kind is EntryKind.CONFIG_CHANGE for e in entries):
            self._memberships.record_entries(entries)
            # Thesis §4.1: the new configuration is used as soon as it is appended.
            self._sync_progress()
            if self._maybe_commit():
                self._broadcast_append()

    def _step_leader(self, message: Message) -> None:
        if isinstance(message, ReadIndex):
            self._handle_read_request(message.request_ctx, message.from_id)
            return
        assert not isinstance(message, AppendEntries | Heartbeat | InstallSnapshot), (
            f"two leaders in term {self.term}: {self.id} and {message.from_id}"
        )
        pr = self.progress.get(message.from_id)
        if pr is None:
            return
        sender = message.sender
        was_recovering = pr.peer_recovering
        if sender.incarnation != pr.peer_incarnation or sender.recovering != was_recovering:
            self._records_check = True  # a new incarnation to record, perhaps
        restarted = pr.observe(sender, LogIndex(self.log.last_index() + 1))
        if was_recovering and not pr.peer_recovering and self._maybe_commit():
            # Its acknowledgements count from now on (docs/raft.md, "Disk faults").
            self._broadcast_append()
            if self.role is not Role.LEADER:
                return
        pr.recent_active = True
        if isinstance(message, AppendEntriesResponse):
            self._handle_append_response(message, pr)
        elif isinstance(message, HeartbeatResponse):
            self._handle_heartbeat_response(message, pr)
        elif isinstance(message, InstallSnapshotResponse):
            self._handle_snapshot_response(message, pr)
        if restarted and self.role is Role.LEADER and message.from_id in self.progress:
            self._send_append(message.from_id)  # probe the restarted peer's log at once

    def _handle_append_response(self, message: AppendEntriesResponse, pr: Progress) -> None:
        peer = message.from_id
        if not message.success:
            # Thesis §5.3 fast back-off: jump to where the logs may match.
            match_hint = message.reject_hint
            if message.log_term > 0:
                match_hint, _ = self.log.find_conflict_by_term(
                    message.reject_hint, message.log_term
                )
            if pr.maybe_decrease_to(message.index, match_hint):
                if pr.state is ProgressState.REPLICATE:
                    pr.become_probe()
                self._send_append(peer)
            return
        was_paused = pr.is_paused()
        if not pr.maybe_update(message.index):
            return
        if pr.state is ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state is ProgressState.SNAPSHOT and pr.match + 1 >= self.log.first_index():
            pr.become_probe()
            pr.become_replicate()
        if self._maybe_commit():
            self._send_pending_appends()
        elif was_paused:
            self._send_append(peer)
        if self.role is not Role.LEADER:
            return  # committing removed us (thesis §4.2.2)
        while self._send_append(peer, send_if_empty=False):
            pass
        if peer == self.lead_transferee and pr.match == self.log.last_index():
            # Thesis §3.10: the target is up to date; let it start an election now.
            self._send(TimeoutNow(self.term, self.id, peer, sender=self._sender))

    def _handle_heartbeat_response(self, message: HeartbeatResponse, pr: Progress) -> None:
        peer = message.from_id
        pr.probe_sent = False
        if pr.state is ProgressState.REPLICATE and pr.is_paused():
            pr.inflight.popleft()  # one may have been lost; let the pipeline move
        if pr.state is ProgressState.SNAPSHOT:
            if pr.snapshot_stalled():
                self._send_snapshot_chunk(peer, pr)  # the chunk in flight was lost
        elif pr.match < self.log.last_index() or pr.state is ProgressState.PROBE:
            self._send_append(peer)
        if message.read_seq > pr.read_seq_acked and not pr.peer_recovering:
            pr.read_seq_acked = message.read_seq
            self._release_reads()

    def _handle_snapshot_response(self, message: InstallSnapshotResponse, pr: Progress) -> None:
        peer = message.from_id
        snapshot = pr.snapshot
        if pr.state is not ProgressState.SNAPSHOT or snapshot is None:
            return
        if snapshot.metadata.index != message.snapshot_index:
            return
        if message.done:
            pr.maybe_update(message.match_index)
            pr.become_probe()
            if pr.match + 1 >= self.log.first_index():
                pr.become_replicate()
            if self._maybe_commit():
                self._broadcast_append()
            elif self.role is Role.LEADER:
                self._send_append(peer)
            return
        if pr.snapshot_chunk_answered(message.chunk_offset, message.next_offset):
            self._send_snapshot_chunk(peer, pr)

    def _maybe_commit(self) -> bool:
        """Advance the commit index by counting replicas (paper §5.3, §5.4.2)."""
        # A recovering peer's acknowledgements do not count (docs/raft.md, "Disk faults").
        match = {node_id: pr.match for node_id, pr in self.progress.items() if pr.counts}
        index = LogIndex(committed_index(self.membership.voters, match))
        # Paper §5.4.2 / Figure 8: only an entry of the current term is committed by
        # counting; earlier ones are committed with it by the log matching property.
        if not self.log.maybe_commit(index, self.term):
            return False
        if self._reads_awaiting_commit and self._committed_in_current_term():
            waiting, self._reads_awaiting_commit = self._reads_awaiting_commit, []
            for request_ctx, origin in waiting:
                self._handle_read_request(request_ctx, origin)
        if not self._promotable() and self.log.committed >= self._memberships.last_change_index():
            self._step_down_after_removal()
        return True

    def _step_down_after_removal(self) -> None:
        # Thesis §4.2.2: a leader removed from the configuration steps down once the
        # change is committed. Hand over to the most up-to-date voter at once (§3.10)
        # instead of leaving the cluster without a leader for an election timeout.
        best: NodeId | None = None
        for node_id in sorted(self.membership.voters):
            pr = self.progress.get(node_id)
            if pr is not None and pr.match == self.log.last_index() and not pr.peer_recovering:
                best = node_id
                break
        if best is not None:
            self._send(TimeoutNow(self.term, self.id, best, sender=self._sender))
        self._become_follower(self.term, None)

    def _committed_in_current_term(self) -> bool:
        return self.log.committed >= self._term_start_index and self.role is Role.LEADER

    def _broadcast_append(self) -> None:
        for node_id in sorted(self.progress):
            if node_id != self.id:
                self._send_append(node_id)

    def _send_pending_appends(self) -> None:
        """The commit index advanced: send AppendEntries only to followers that have
        entries to receive. The others learn the new commit index with the next
        AppendEntries or heartbeat (at most one heartbeat interval later): an
        AppendEntries carrying nothing but the commit index would cost every follower a
        wakeup, an apply and an answer, and the leader that answer, on the path of the
        next client request (the leader needs no follower's apply to answer)."""
        for node_id in sorted(self.progress):
            if node_id != self.id:
                self._send_append(node_id, send_if_empty=False)

    def _broadcast_heartbeat(self) -> None:
        # Every broadcast is a new round: ReadIndex confirmations and the leader lease
        # (thesis §6.4, §6.4.1) count the rounds a majority answered.
        round_number = self._reads.next_round()
        for node_id in sorted(self.progress):
            if node_id != self.id:
                pr = self.progress[node_id]
                commit = LogIndex(min(pr.match, self.log.committed))
                self._send(
                    Heartbeat(
                        self.term, self.id, node_id, commit, round_number, sender=self._sender
                    )
                )

    def _send_append(self, peer: NodeId, *, send_if_empty: bool = True) -> bool:
        """Send AppendEntries from ``next`` (or a snapshot if compacted away).

        Returns:
            True if a message was sent.
        """
        pr = self.progress[peer]
        if pr.is_paused():
            return False
        prev_index = LogIndex(pr.next - 1)
        prev_term = self.log.term(prev_index)
        try:
            entries = self.log.entries(pr.next, self.config.max_append_bytes)
        except CompactedError:
            prev_term = None
        if prev_term is None:
            return self._send_snapshot(peer, pr)
        if not entries and not send_if_empty:
            return False
        self._send(
            AppendEntries(
                self.term,
                self.id,
                peer,
                prev_index,
                prev_term,
                tuple(entries),
                self.log.committed,
                sender=self._sender,
            )
        )
        if entries:
            pr.sent_entries(entries[-1].index)
        elif pr.state is ProgressState.PROBE:
            pr.probe_sent = True
        return True

    def _send_snapshot(self, peer: NodeId, pr: Progress) -> bool:
        if not pr.recent_active:
            return False  # it may be down; wait until it answers a probe or heartbeat
        pr.become_snapshot(self.log.snapshot())
        self._send_snapshot_chunk(peer, pr)
        return True

    def _send_snapshot_chunk(self, peer: NodeId, pr: Progress) -> None:
        assert pr.snapshot is not None
        metadata = pr.snapshot.metadata
        offset, data, done = pr.next_snapshot_chunk(self.config.snapshot_chunk_bytes)
        self._send(
            InstallSnapshot(
                self.term, self.id, peer, metadata.index, metadata.term, metadata.membership,
                offset, data, done, metadata.registry, sender=self._sender,
            )
        )  # fmt: skip

    # --- ReadIndex (thesis §6.4) ---------------------------------------------------------

    def _handle_read_request(self, request_ctx: bytes, origin: NodeId) -> None:
        if not self._committed_in_current_term():
            # Until its no-op commits, the leader's commit index may be behind entries
            # committed by earlier leaders (thesis §6.4 step 1).
            self._reads_awaiting_commit.append((request_ctx, origin))
            return
        self._reads.add(request_ctx, origin, self.log.committed)
        # Thesis §6.4 step 3: confirm we are still leader with a heartbeat round.
        self._broadcast_heartbeat()
        self._release_reads()

    def _heartbeat_rounds_acked(self) -> dict[NodeId, int]:
        return {
            node_id: (self._reads.seq if node_id == self.id else pr.read_seq_acked)
            for node_id, pr in self.progress.items()
        }

    def quorum_heartbeat_round(self) -> int | None:
        """Leader: the latest heartbeat round a majority of voters answered in this term.

        The leader lease (thesis §6.4.1) runs from when that round was sent: every voter
        of that majority had just heard from this leader, and (with ``check_quorum``)
        ignores other candidates for an election timeout. The driver maps round numbers
        to send times from the :class:`Heartbeat` messages in each ``Ready``.

        Returns:
            The round (0 before any round was answered), or None when not leader.
        """
        if self.role is not Role.LEADER:
            return None
        return committed_index(self.membership.voters, self._heartbeat_rounds_acked())

    def _release_reads(self) -> None:
        acked = self._heartbeat_rounds_acked()
        for read in self._reads.confirmed(self.membership.voters, acked):
            if read.origin == self.id:
                self._read_states.append(ReadState(read.index, read.request_ctx))
            else:
                self._send(
                    ReadIndexResponse(
                        self.term,
                        self.id,
                        read.origin,
                        read.request_ctx,
                        read.index,
                        sender=self._sender,
                    )
                )

    # --- disk faults: recovery after a start (docs/raft.md, "Disk faults") ------------
    #
    # After a start the disk may have forgotten what this node told its peers (wiped, or
    # an older copy). Until every other voter has answered, the node neither votes nor
    # campaigns, and leaders do not count it (its messages say "recovering"). The answers
    # give the highest term in use, in which it then abstains, and a vote floor: the best
    # log they hold. The bookkeeping lives in raft/recovery.py.

    def _start_recovery(self) -> None:
        self._set_recovering(True)
        self._begin_recovery_round()
        self._maybe_finish_recovery()

    def _set_recovering(self, recovering: bool) -> None:
        self.recovering = self._recovery.recovering = recovering
        self._sender = Sender(self.config.incarnation, self.config.boot_id, recovering)

    def _tick_recovery(self) -> None:
        """While recovering, or while a vote floor is set: keep asking.

        A floor may name entries that were never committed and are gone since; asking
        again every election timeout replaces it with what the voters hold now.
        """
        recovery = self._recovery
        if not self.recovering and recovery.vote_floor is None:
            return
        if self.recovering and not self._recovery_asked:
            self._send_recovery_requests()  # it has just learned who the voters are
            return
        self._recovery_elapsed += 1
        if not recovery.round_open:
            if self._recovery_elapsed >= self.config.election_timeout_ticks:
                self._begin_recovery_round()
            return
        # Ask again the voters that did not answer (lost, or down): every half election
        # timeout, so a node that is down for long costs little.
        if self._recovery_elapsed >= max(1, self.config.election_timeout_ticks // 2):
            self._recovery_elapsed = 0
            self._maybe_finish_recovery()  # the membership may have changed
            self._send_recovery_requests()

    def _begin_recovery_round(self) -> None:
        self._recovery.begin_round()
        self._recovery_elapsed = 0
        self._send_recovery_requests()

    def _recovery_configs(self) -> Configurations:
        own = (self._memberships.last_change_index(), self.membership.voters, self.log.committed)
        return self._recovery.configurations(own, self.id)

    def _recovery_required(self) -> frozenset[NodeId] | None:
        return self._recovery_configs().required

    def _send_recovery_requests(self) -> None:
        recovery = self._recovery
        required = self._recovery_required()
        if required is None or not recovery.round_open:
            return
        self._recovery_asked = True
        last_index, last_term = self.log.last_index(), self.log.last_term()
        for voter in recovery.missing(required):
            self._send(
                RecoveryRequest(
                    self.term, self.id, voter, recovery.nonce, last_index, last_term,
                    sender=self._sender,
                )
            )  # fmt: skip

    def _step_recovery(self, message: RecoveryRequest | RecoveryResponse | NotMember) -> None:
        if isinstance(message, RecoveryRequest):
            self._handle_recovery_request(message)
        elif isinstance(message, RecoveryResponse):
            if self._recovery.take(message):
                self._maybe_finish_recovery()
        else:
            self._handle_not_member(message)

    def _handle_recovery_request(self, message: RecoveryRequest) -> None:
        # Any node answers, from its durable state: at most one disk forgets at a time,
        # and the requester hears from every other voter.
        if self._tell_if_removed(message.from_id, message.last_log_index):
            return
        if self.role is Role.LEADER:
            pr = self.progress.get(message.from_id)
            next_index = LogIndex(self.log.last_index() + 1)
            if pr is not None and pr.observe(message.sender, next_index):
                self._send_append(message.from_id)  # probe the restarted peer's log
        record = self.registry_at(self.log.committed).record(message.from_id)
        self._send(
            RecoveryResponse(
                self.term,
                self.id,
                message.from_id,
                message.nonce,
                self.log.last_index(),
                self.log.last_term(),
                self._memberships.last_change_index(),
                self.membership.voters,
                self.log.committed,
                record.incarnation if record is not None else 0,
                record.acked_term if record is not None else Term(0),
                record.acked_index if record is not None else LogIndex(0),
                sender=self._sender,
            )
        )

    def _maybe_finish_recovery(self) -> None:
        if self._recovery.foreign is not None and self.recovering:
            return  # another cluster's log: never take part (docs/raft.md, "Disk faults")
        result = self._recovery.complete(
            self._recovery_configs(), new_cluster=self.config.new_cluster
        )
        if result is None:
            return
        own = (self.log.last_term(), self.log.last_index())
        if (
            self.recovering
            and self._recovery_required()
            and self._recovery.note_foreign(own, result.highest_term)
        ):
            return
        self._recovery.set_floor(result.floor, own)
        self._recovery_elapsed = 0
        if not self.recovering:
            return  # a refresh of the vote floor
        # Abstain in the highest term in use: this node may have voted in it before its
        # disk forgot (a durable vote of that term is kept: it is the one it gave).
        if result.highest_term > self.term:
            self._become_follower(result.highest_term, None)
            self.vote = self.id
        elif self.vote is None:
            self.vote = self.id
        self._set_recovering(False)
        self._election_elapsed = 0
        self._reset_randomized_election_timeout()

    def _tell_if_removed(self, node_id: NodeId, their_last_index: LogIndex) -> bool:
        """Answer a node that missed its own removal (committed here) with NotMember.

        Returns:
            True if it was told (and its message must be ignored).
        """
        if their_last_index == 0 or node_id in self.membership.members():
            # A blank node may be the same id about to be added back (the manual
            # remove, start blank, add-node procedure): it waits, recovering.
            return False
        removed_at = self.registry_at(self.log.committed).removed_at(node_id)
        if removed_at is None or their_last_index >= removed_at:
            return False
        self._send(NotMember(self.term, self.id, node_id, removed_at, sender=self._sender))
        return True

    def _handle_not_member(self, message: NotMember) -> None:
        if self.role is Role.LEADER or self.removed_at is not None:
            return
        if self.log.committed >= message.removed_at:
            return  # we hold its whole log up to there; our own membership says the truth
        self.removed_at = message.removed_at
        self._recovery.findings.append(
            f"node {message.from_id} says this node was removed from the cluster at log "
            f"index {message.removed_at}"
        )
        if self.role is not Role.FOLLOWER:
            self._become_follower(self.term, None)

    def _tick_member_records(self) -> None:
        """Leader: write the member registry when it changed (``docs/raft.md``).

        At once when a member's incarnation is new; otherwise at most every
        ``member_record_ticks`` when acknowledged positions advanced.
        """
        self._records_elapsed += 1
        due = self._records_elapsed >= self.config.member_record_ticks
        if not (due or self._records_check) or (
            not self._committed_in_current_term()
            or self.lead_transferee is not None
            or self.id not in self.progress
            or self._registry.last_change_index() > self.log.committed
        ):
            return
        self._records_check = False
        if due:
            self._records_elapsed = 0
        current = self._registry.current()
        records: list[MemberRecord] = []
        new_incarnation = advanced = False
        for node_id in self.membership.members():
            old = current.record(node_id)
            pr = self.progress.get(node_id)
            new = old
            if node_id == self.id:
                new = MemberRecord(
                    node_id, self.config.incarnation, self.term, self.log.persisted_index()
                )
            elif pr is not None and pr.peer_incarnation and not pr.peer_recovering and pr.match:
                new = MemberRecord(node_id, pr.peer_incarnation, self.term, pr.match)
            if new is None:
                continue
            if old is None or old.incarnation != new.incarnation:
                new_incarnation = True
            elif (new.acked_term, new.acked_index) > (old.acked_term, old.acked_index):
                advanced = True
            records.append(new)
        if not (new_incarnation or (advanced and due)):
            return
        self._records_elapsed = 0
        data = encode_registry(current.with_records(records))
        self._propose_entry(EntryKind.MEMBER_RECORDS, data)

    def _send(self, message: Message) -> None:
        self._outbox.append(message)


def _vote_kind(message: RequestVote) -> str:
    return "pre-vote" if message.pre_vote else "vote"
