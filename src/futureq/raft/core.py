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

This module holds the core's state, its inputs (tick, step, propose, ...), Ready/advance
and the role changes; the rules for each part are plain functions over the core, one
module each: :mod:`~futureq.raft.terms` (what a message's term decides first),
:mod:`~futureq.raft.election` (timer, campaigns, votes),
:mod:`~futureq.raft.follower` (AppendEntries, InstallSnapshot),
:mod:`~futureq.raft.leader` (heartbeats, CheckQuorum, responses, commitment),
:mod:`~futureq.raft.replication` (what the leader sends each follower),
:mod:`~futureq.raft.read_index` (ReadIndex) and :mod:`~futureq.raft.recovery_steps`
(recovery after a start, member records).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import attrs

from futureq.errors import (
    ConfigError,
    ErrorCode,
    NotLeaderError,
    RequestError,
)
from futureq.raft import (
    election,
    follower,
    leader,
    read_index,
    recovery_steps,
    replication,
    terms,
)
from futureq.raft.log import RaftLog
from futureq.raft.messages import (
    CLOCK_MESSAGES,
    AppendEntries,
    Heartbeat,
    InstallSnapshot,
    LogIndex,
    Message,
    NodeId,
    NotMember,
    ReadIndex,
    Ready,
    RecoveryRequest,
    RecoveryResponse,
    RequestVote,
    RequestVoteResponse,
    Sender,
    Term,
    TimeoutNow,
)
from futureq.raft.payload_codec import encode_config_change
from futureq.raft.progress import Progress, SnapshotReceiver
from futureq.raft.quorum import (
    MembershipHistory,
    ReadIndexQueue,
    apply_conf_change,
    committed_index,
    validate_conf_change,
)
from futureq.raft.recovery import Position, Recovery
from futureq.raft.registry import RegistryHistory
from futureq.raft.roles import Role
from futureq.raft.values import (
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryKind,
    HardState,
    Membership,
    ReadState,
    Registry,
    Snapshot,
    SnapshotMetadata,
)

if TYPE_CHECKING:
    import random

    from futureq.raft.storage import Storage


log = logging.getLogger(__name__)

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
            ``spread`` of the next wait are doubled, up to :data:`~futureq.raft.election.MAX_CAMPAIGN_BACKOFF` times, until a leader is heard
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
        self._last_campaign: tuple[bool, Term, frozenset[NodeId], dict[NodeId, bool]] | None = None
        """This node's last campaign since it last heard a leader: pre-vote or not, the
        term it asked votes for, the voters, and the votes (the ``_votes`` dict of that
        campaign, which a new campaign replaces): :func:`~futureq.raft.election.campaign_status`."""
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
        self.votes_refused: frozenset[NodeId] = frozenset()
        """Set by the driver: voters this node votes for in no election or PreVote,
        as their clocks, by its own measure, are too far from cluster time for them to
        lead (:meth:`~futureq.raft.cluster_clock.ClusterClock.peer_clock_refused`)."""
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
            recovery_steps.start_recovery(self)

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
            tuple(recovery.missing(recovery_steps.recovery_required(self) or ()))
            if self.recovering
            else ()
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
            leader.tick_heartbeat(self)
        else:
            recovery_steps.tick_recovery(self)
            election.tick_election(self)

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
                this leader heard from lately (:func:`leader.check_quorum_after`).
        """
        self._check_no_outstanding_ready()
        if self.role is not Role.LEADER:
            raise RaftNotLeaderError(self.leader_id)
        if not leader.committed_in_current_term(self):
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
        leader.check_quorum_after(self, change)
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
            replication.send_append(self, target)

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
            read_index.handle_read_request(self, request_ctx, self.id)
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
        leader.append_leader_entries(self, [entry])
        replication.broadcast_append(self)
        return entry.index

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
            # Outside the term rules: a restarted node's durable term may be older than
            # what it once told its peers.
            recovery_steps.step_recovery(self, message)
            return
        if isinstance(message, RequestVote) and recovery_steps.tell_if_removed(
            self, message.from_id, message.last_log_index
        ):
            return
        if isinstance(message, RequestVoteResponse) and not message.pre_vote:
            election.note_late_vote(self, message)
        if message.term > self.term:
            if isinstance(message, RequestVote) and terms.ignores_vote_request(self, message):
                return
            if isinstance(message, RequestVote) and message.pre_vote:
                pass  # a PreVote changes no state (thesis §9.6)
            elif isinstance(message, RequestVoteResponse) and message.pre_vote and message.granted:
                pass  # granted pre-votes carry the term we are about to campaign in
            else:
                # Paper §5.1: a higher term makes us a follower of that term.
                new_leader = (
                    message.from_id
                    if isinstance(message, AppendEntries | Heartbeat | InstallSnapshot)
                    else None
                )
                self._become_follower(message.term, new_leader)
        elif message.term < self.term:
            terms.answer_stale_term(self, message)
            return  # paper §5.1: stale-term requests are rejected
        if isinstance(message, RequestVote):
            election.handle_request_vote(self, message)
        elif self.role is Role.LEADER:
            leader.step_leader(self, message)
        elif self.role is Role.FOLLOWER:
            follower.step_follower(self, message)
        else:
            election.step_candidate(self, message)

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
                if leader.maybe_commit(self):
                    replication.send_pending_appends(self)

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

    @property
    def campaign_backoff(self) -> int:
        """How many times longer than configured this node now waits before it campaigns
        (1, 2, 4, ... up to :data:`~futureq.raft.election.MAX_CAMPAIGN_BACKOFF`).

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
        if leader_id is not None:
            self._last_campaign = None

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
        self._last_campaign = None
        self._reset(self.term)
        self.role = Role.LEADER
        self.leader_id = self.id
        self._records_check = True
        self._sync_progress()
        # Thesis §6.4: a no-op entry commits the leader's term, which tells it which
        # earlier entries are committed (needed before serving reads).
        noop = Entry(self.term, LogIndex(self.log.last_index() + 1), EntryKind.NOOP)
        self._term_start_index = noop.index
        leader.append_leader_entries(self, [noop])
        replication.broadcast_append(self)

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
        return committed_index(self.membership.voters, read_index.heartbeat_rounds_acked(self))

    def _send(self, message: Message) -> None:
        self._outbox.append(message)
