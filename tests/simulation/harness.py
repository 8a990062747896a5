"""Deterministic simulation of a cluster of RaftCores (TigerBeetle VOPR / etcd style).

* :class:`SimNetwork` — a seeded network: loss, duplication, reordering (random delay),
  symmetric/asymmetric/bridge partitions, heal.
* :class:`SimNode` — a RaftCore over a MemoryStorage with a trivial replicated state
  machine (a hash chain of applied entries). A crash throws away the core and the
  state machine and rolls storage back to its last synced write; a restart rebuilds
  both from storage, exactly as a real node would. Disk faults (``docs/raft.md``,
  "Disk faults"): a *wipe* gives a node an empty data directory with a new
  incarnation; a *rollback* puts back an earlier durable copy of its own directory.
  Every start has a new boot id and runs the core's recovery.
* :class:`Checker` — safety invariants, checked after every step: at most one leader
  per term (paper §5.2 Election Safety), log matching (§5.3), leader completeness
  (§5.4), state machine safety (§5.4.3: the same entry digest at each applied index
  everywhere), acknowledged proposals never lost, reads never stale (thesis §6.4),
  and across disk faults a node's term and votes never go back as seen by peers.
* :class:`SimCluster` — drives a :class:`Scenario` for one seed, then heals everything
  and checks liveness: a leader is elected and a proposal commits on every member.
* Clocks (scenarios with ``clocks``): every node has a :class:`SimClock` (a wall clock
  with its own offset and drift, a monotonic clock with its own drift) and a
  :class:`~futureq.raft.timekeeper.TimeKeeper`; clock pings travel the same faulty
  network. ``clock_faults`` add per-node clock skews, drifts and steps (forwards and
  back, on a minority of the voters at a time). After every step the checker asserts
  that at most one node may dispatch (the leader lease, thesis §6.4.1) and that the
  one that may has a cluster time within half of the bound of true time, so nothing
  it releases is earlier than due minus the bound (``docs/architecture.md``, "Time").

Everything random comes from one ``random.Random(seed)``; nothing reads a clock or
iterates a set of non-integers, so a seed replays exactly.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Iterable
from typing import Any

import attrs
import msgpack

from futureq.raft.cluster_clock import ClockConfig
from futureq.raft.core import ProposalDroppedError, RaftConfig, RaftCore, RaftNotLeaderError
from futureq.raft.message_codec import decode_message, encode_message
from futureq.raft.messages import (
    CLOCK_MESSAGES,
    LogIndex,
    Message,
    NodeId,
    NotMember,
    Ready,
    RecoveryRequest,
    RecoveryResponse,
    RequestVote,
    RequestVoteResponse,
    Term,
)
from futureq.raft.roles import Role
from futureq.raft.storage import MemoryStorage
from futureq.raft.timekeeper import TimeConfig, TimeKeeper
from futureq.raft.values import (
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryKind,
    HardState,
    Membership,
    Snapshot,
)

TICK_US = 10_000
"""Simulated time per tick (µs): 10 ms, so the default election timeout is 100 ms."""
EPOCH_US = 1_800_000_000_000_000
"""True wall time (µs since the Unix epoch) at tick 0."""
PPM = 1_000_000
MAX_GOOD_OFFSET_US = 5_000
"""A good clock's wall offset from true time (µs)."""
MAX_GOOD_WALL_DRIFT_PPM = 100
MAX_MONO_DRIFT_PPM = 2_500
"""Monotonic clocks drift at most this much: a quarter of the lease's allowance."""


class InvariantViolation(AssertionError):
    """A safety or liveness property failed."""


@attrs.define
class SimClock:
    """One machine's clocks as functions of true time (µs since tick 0).

    ``wall = EPOCH + true + wall_offset + true * wall_drift``;
    ``mono = mono_offset + true + true * mono_drift`` (never steps).
    """

    wall_offset_us: int
    wall_drift_ppm: int
    mono_offset_us: int
    mono_drift_ppm: int

    def wall_us(self, true_us: int) -> int:
        return EPOCH_US + true_us + self.wall_offset_us + true_us * self.wall_drift_ppm // PPM

    def mono_us(self, true_us: int) -> int:
        return self.mono_offset_us + true_us + true_us * self.mono_drift_ppm // PPM

    def set_wall_drift(self, true_us: int, drift_ppm: int) -> None:
        """Change the wall clock's rate from now on, without a jump."""
        self.wall_offset_us += true_us * (self.wall_drift_ppm - drift_ppm) // PPM
        self.wall_drift_ppm = drift_ppm

    def wall_error_us(self, true_us: int) -> int:
        """The wall clock minus true time now."""
        return self.wall_us(true_us) - EPOCH_US - true_us


@attrs.frozen
class Scenario:
    """The knobs of one simulated run; durations in ticks, rates in [0, 1)."""

    name: str
    voters: int = 3
    spares: int = 0
    steps: int = 250
    drop_rate: float = 0.0
    duplicate_rate: float = 0.0
    max_delay_ticks: int = 2
    straggler_rate: float = 0.0
    tick_skip_rate: float = 0.0
    partitions: bool = False
    crashes: bool = False
    max_crashed: int = 1
    membership_changes: bool = False
    compaction_every: int = 0
    snapshot_chunk_bytes: int = 16
    transfers: bool = False
    reads: bool = False
    propose_rate: float = 0.3
    fault_rate: float = 0.07
    election_timeout_ticks: int = 10
    heartbeat_interval_ticks: int = 2
    max_inflight: int = 4
    max_append_bytes: int = 64
    leader_faults: bool = False
    wire_roundtrip: bool = False
    clocks: bool = False
    clock_faults: bool = False
    max_clock_offset_ms: int = 400
    disk_faults: bool = False
    """Wipe a node's storage, or roll it back to an earlier copy of itself."""
    mid_write_crashes: bool = False
    """With ``crashes``: the leader dies during a write, after replicating it (§10.2.1)."""


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("lossy3", drop_rate=0.08, duplicate_rate=0.05, max_delay_ticks=4, crashes=True,
             fault_rate=0.03, straggler_rate=0.01, tick_skip_rate=0.1, disk_faults=True),
    Scenario("partition3", partitions=True, crashes=True, drop_rate=0.02, disk_faults=True),
    Scenario("partition5", voters=5, partitions=True, crashes=True, max_crashed=2),
    Scenario("crash5", voters=5, crashes=True, max_crashed=2, drop_rate=0.03, fault_rate=0.1,
             disk_faults=True),
    Scenario("snapshot3", compaction_every=6, crashes=True, partitions=True, drop_rate=0.03,
             wire_roundtrip=True, straggler_rate=0.01, disk_faults=True),
    Scenario("membership", voters=3, spares=3, membership_changes=True, crashes=True,
             partitions=True, compaction_every=10, fault_rate=0.1, disk_faults=True),
    Scenario("transfer_read5", voters=5, transfers=True, reads=True, partitions=True,
             crashes=True, drop_rate=0.02, straggler_rate=0.01, tick_skip_rate=0.05),
    Scenario("chaos5", voters=5, spares=2, partitions=True, crashes=True, max_crashed=2,
             membership_changes=True, compaction_every=8, transfers=True, reads=True,
             drop_rate=0.04, duplicate_rate=0.03, max_delay_ticks=4, fault_rate=0.1,
             straggler_rate=0.005, tick_skip_rate=0.05, disk_faults=True),
    Scenario("figure8_5", voters=5, crashes=True, max_crashed=2, leader_faults=True,
             max_append_bytes=1, max_inflight=2, drop_rate=0.05, max_delay_ticks=5,
             fault_rate=0.15, propose_rate=0.5),
)  # fmt: skip
SCENARIOS = tuple(attrs.evolve(s, mid_write_crashes=s.crashes) for s in SCENARIOS)
"""Every scenario with crashes also crashes leaders during their writes (§10.2.1)."""


CLOCK_SCENARIOS: tuple[Scenario, ...] = (
    Scenario("clock3", clocks=True, clock_faults=True, crashes=True, partitions=True,
             drop_rate=0.03, fault_rate=0.08, steps=300),
    Scenario("clock5", voters=5, clocks=True, clock_faults=True, crashes=True, max_crashed=2,
             partitions=True, transfers=True, drop_rate=0.03, duplicate_rate=0.02,
             max_delay_ticks=3, fault_rate=0.1, tick_skip_rate=0.05, steps=300),
    Scenario("clock_lease3", clocks=True, clock_faults=True, leader_faults=True,
             transfers=True, partitions=True, crashes=True, straggler_rate=0.01,
             drop_rate=0.02, fault_rate=0.12, steps=300),
)  # fmt: skip
"""Scenarios with clocks: cluster time, the lease, and clock faults."""


def scenario_for_seed(seed: int) -> Scenario:
    """The scenario a seed runs: seeds cycle through :data:`SCENARIOS`."""
    return SCENARIOS[seed % len(SCENARIOS)]


def clock_scenario_for_seed(seed: int) -> Scenario:
    """The clock scenario a seed runs: seeds cycle through :data:`CLOCK_SCENARIOS`."""
    return CLOCK_SCENARIOS[seed % len(CLOCK_SCENARIOS)]


def sim_time_config(scenario: Scenario) -> TimeConfig:
    """The timekeeper's configuration at simulation scale (10 ms ticks)."""
    election_us = scenario.election_timeout_ticks * TICK_US
    return TimeConfig(
        clock=ClockConfig(
            max_offset_us=scenario.max_clock_offset_ms * 1000,
            window_min_us=election_us // 2,
            window_max_us=3 * election_us,
            epoch_max_us=6 * election_us,
        ),
        tick_us=TICK_US,
        election_timeout_ticks=scenario.election_timeout_ticks,
        ping_every_ticks=2,
    )


class SimNetwork:
    """A seeded message network over logical time (ticks).

    Args:
        rng: The simulation's random source.
        drop_rate: Probability that a message is lost.
        duplicate_rate: Probability that a message is delivered twice.
        max_delay_ticks: Messages arrive after 1..max_delay_ticks ticks, so they reorder.
        straggler_rate: Probability that a message is instead held for up to 60 ticks,
            arriving long after its term or round ended.
    """

    def __init__(
        self,
        rng: random.Random,
        drop_rate: float,
        duplicate_rate: float,
        max_delay_ticks: int,
        straggler_rate: float = 0.0,
    ) -> None:
        self._rng = rng
        self.drop_rate = drop_rate
        self.duplicate_rate = duplicate_rate
        self.max_delay_ticks = max_delay_ticks
        self.straggler_rate = straggler_rate
        self._queue: list[tuple[int, int, Message]] = []
        self._seq = 0
        self.blocked: set[tuple[NodeId, NodeId]] = set()

    def send(self, message: Message, now: int) -> None:
        """Queue ``message`` sent at tick ``now``: maybe lost, maybe duplicated, delayed."""
        if self._rng.random() < self.drop_rate:
            return
        copies = 2 if self._rng.random() < self.duplicate_rate else 1
        for _ in range(copies):
            self._seq += 1
            delay = self._rng.randint(1, self.max_delay_ticks)
            if self.straggler_rate and self._rng.random() < self.straggler_rate:
                delay = self._rng.randint(self.max_delay_ticks, 60)
            heapq.heappush(self._queue, (now + delay, self._seq, message))

    def due(self, now: int) -> list[Message]:
        """Pop the messages due by ``now`` whose link is not cut, in arrival order."""
        out: list[Message] = []
        while self._queue and self._queue[0][0] <= now:
            _, _, message = heapq.heappop(self._queue)
            if (message.from_id, message.to_id) not in self.blocked:
                out.append(message)
        return out

    def partition(self, groups: Iterable[Iterable[NodeId]]) -> None:
        """Cut every link between different groups (symmetric partition)."""
        group_of: dict[NodeId, int] = {}
        for number, group in enumerate(groups):
            for node in group:
                group_of[node] = number
        for a in sorted(group_of):
            for b in sorted(group_of):
                if group_of[a] != group_of[b]:
                    self.blocked.add((a, b))

    def drop_from(self, node: NodeId) -> None:
        """Lose every message ``node`` sent that is still in flight.

        Used when a node's disk is replaced: that takes the node down for longer than
        any message stays in flight (a TCP connection dies with its process), so its
        old messages arrived already or never will.
        """
        self._queue = [item for item in self._queue if item[2].from_id != node]
        heapq.heapify(self._queue)

    def cut_one_way(self, a: NodeId, b: NodeId) -> None:
        """Asymmetric partition: messages from ``a`` to ``b`` are lost."""
        self.blocked.add((a, b))

    def heal(self) -> None:
        """Reconnect every link."""
        self.blocked.clear()


class StateMachine:
    """The replicated state: a hash chain over every applied entry."""

    def __init__(self) -> None:
        self.applied_index = LogIndex(0)
        self.digest = b""
        self.normal_count = 0

    def apply(self, entry: Entry) -> None:
        """Fold ``entry`` (the next index) into the hash chain."""
        assert entry.index == self.applied_index + 1, "applied out of order"
        h = hashlib.blake2b(self.digest, digest_size=16)
        h.update(b"%d/%d/%d/" % (entry.index, entry.term, entry.kind))
        h.update(entry.data)
        self.digest = h.digest()
        self.applied_index = entry.index
        if entry.kind is EntryKind.NORMAL:
            self.normal_count += 1

    def snapshot_data(self) -> bytes:
        """Serialized state: msgpack ``[applied_index, digest, normal_count]``."""
        packed: bytes = msgpack.packb([self.applied_index, self.digest, self.normal_count])
        return packed

    def restore(self, data: bytes) -> None:
        """Replace the state with :meth:`snapshot_data` output (empty: initial state)."""
        if not data:
            self.applied_index, self.digest, self.normal_count = LogIndex(0), b"", 0
            return
        index, digest, count = msgpack.unpackb(data)
        self.applied_index, self.digest, self.normal_count = LogIndex(index), digest, count


class SimNode:
    """One server: storage survives crashes (up to its last sync), the rest does not.

    Args:
        node_id: Its id.
        config: Its core's configuration (incarnation and boot id are set per start).
        membership: The membership of a new data directory (empty for a joining node).
        incarnation: The stamp of its first data directory.
    """

    def __init__(
        self, node_id: NodeId, config: RaftConfig, membership: Membership, incarnation: int = 1
    ) -> None:
        self.id = node_id
        self.config = config
        self.bootstrap_membership = membership
        self.incarnation = incarnation
        self.storage = MemoryStorage(membership)
        self.synced_hard_state = self.storage.hard_state()
        self.core: RaftCore | None = None
        self.sm = StateMachine()
        self.crash_after_persist = False
        self.crash_mid_write = False
        """Crash at the next write, after sending ``Ready.leader_messages``, before the
        write is durable (a leader that dies with its fsync in flight, thesis §10.2.1)."""
        self.last_committed_seen = LogIndex(0)
        self.clock: SimClock | None = None
        """The machine's clocks (survive a crash); None without the clock model."""
        self.time_config: TimeConfig | None = None
        self.keeper: TimeKeeper | None = None
        """The process's timekeeper (lost in a crash)."""
        self.true_us = 0
        """True time as of the cluster's current step (set by the cluster)."""

    def mono_us(self) -> int:
        assert self.clock is not None
        return self.clock.mono_us(self.true_us)

    def wall_us(self) -> int:
        assert self.clock is not None
        return self.clock.wall_us(self.true_us)

    def start_keeper(self) -> None:
        """A new process: a fresh timekeeper reading the machine's clocks."""
        if self.clock is not None and self.time_config is not None:
            self.keeper = TimeKeeper(
                self.id, self.time_config, mono_us=self.mono_us(), wall_us=self.wall_us()
            )
        self.copies: list[Any] = []
        """Earlier durable copies of its data directory, oldest first."""

    @property
    def up(self) -> bool:
        """Whether the process is running."""
        return self.core is not None

    def start(self, rng: random.Random) -> None:
        """Boot from storage: state machine from the snapshot, core from the log."""
        assert self.core is None
        self.sm = StateMachine()
        self.sm.restore(self.storage.snapshot().data)
        self.core = RaftCore(self._start_config(rng), self.storage, rng)
        assert self.core.log.applied == self.sm.applied_index
        self.last_committed_seen = self.core.log.committed
        self.start_keeper()

    def _start_config(self, rng: random.Random) -> RaftConfig:
        """This start's core configuration: the directory's incarnation, a new boot id."""
        return attrs.evolve(
            self.config, incarnation=self.incarnation, boot_id=rng.getrandbits(63) or 1
        )

    def durable_copy(self) -> Any:
        """A copy of what is on disk now (what a crash at this moment would leave)."""
        storage = self.storage.clone()
        storage.set_hard_state(self.synced_hard_state)
        return (self.incarnation, storage)

    def restore_copy(self, copy: Any) -> None:
        """Put an earlier :meth:`durable_copy` back in place (the node must be down)."""
        assert self.core is None
        incarnation, storage = copy
        self.incarnation = incarnation
        self.storage = storage.clone()
        self.synced_hard_state = self.storage.hard_state()

    def wipe(self, incarnation: int) -> None:
        """Replace the data directory with a new, empty one (the node must be down)."""
        assert self.core is None
        self.incarnation = incarnation
        self.storage = MemoryStorage(self.bootstrap_membership)
        self.synced_hard_state = self.storage.hard_state()

    def crash(self) -> None:
        """Lose the process: core and state machine gone, unsynced writes rolled back."""
        self.core = None
        self.keeper = None
        self.crash_after_persist = False
        self.crash_mid_write = False
        self.storage.set_hard_state(self.synced_hard_state)

    def persist(self, ready: Ready) -> None:
        """Adapter step 1: write the Ready; a synced write makes everything durable."""
        if ready.snapshot is not None:
            self.storage.apply_snapshot(ready.snapshot)
        self.storage.append(ready.entries)
        if ready.hard_state is not None:
            self.storage.set_hard_state(ready.hard_state)
        if ready.must_sync:
            self.synced_hard_state = self.storage.hard_state()


class Checker:
    """Cluster-wide safety invariants, fed by the cluster as things happen."""

    def __init__(self) -> None:
        self.leader_of_term: dict[Term, NodeId] = {}
        # (index, term) -> (kind, data, term of the previous entry): log matching.
        self.entry_by_key: dict[tuple[LogIndex, Term], tuple[EntryKind, bytes, Term]] = {}
        # index -> state machine digest after applying it: state machine safety.
        self.digest_at: dict[LogIndex, bytes] = {}
        # index -> (entry term, lowest term at which any node saw it committed).
        self.committed: dict[LogIndex, tuple[Term, Term]] = {}
        self.max_committed = LogIndex(0)
        self.acked: dict[bytes, LogIndex] = {}
        # Disk faults (docs/raft.md): what peers saw of each node, and what it must keep.
        self.term_seen: dict[NodeId, Term] = {}
        self.votes_given: dict[tuple[NodeId, Term], NodeId] = {}
        self.term_floor: dict[NodeId, Term] = {}

    def delivered(self, message: Message) -> None:
        """A peer received ``message``: a node's term and votes never go back as seen by
        peers, across disk faults (``docs/raft.md``, "Disk faults").

        Messages of a recovering node (which says so) and of the recovery exchange carry
        its durable state, which a disk fault may have turned back; they are allowed to.
        """
        if message.sender.recovering or isinstance(
            message, RecoveryRequest | RecoveryResponse | NotMember
        ):
            return
        node = message.from_id
        if isinstance(message, RequestVoteResponse):
            if message.pre_vote:
                return  # a pre-vote grant names the term asked about, not the voter's own
            if message.granted:
                key = (node, message.term)
                known = self.votes_given.setdefault(key, message.to_id)
                if known != message.to_id:
                    raise InvariantViolation(
                        f"node {node} voted for {known} and for {message.to_id} in term "
                        f"{message.term}"
                    )
        term = (
            Term(message.term - 1)
            if isinstance(message, RequestVote) and (message.pre_vote)
            else message.term
        )
        floor = self.term_floor.get(node)
        if floor is not None and term < floor:
            raise InvariantViolation(
                f"node {node} acts in term {term} after its disk fault, but peers had seen it "
                f"in term {floor}"
            )
        if term > self.term_seen.get(node, 0):
            self.term_seen[node] = term

    def disk_fault(self, node: NodeId) -> None:
        """``node`` lost its disk: from now on it must act in terms at least as high as
        any peer has seen it use."""
        self.term_floor[node] = max(
            self.term_floor.get(node, Term(0)), self.term_seen.get(node, Term(0))
        )

    def hard_state_written(self, node: NodeId, before: HardState, after: HardState) -> None:
        """A node's durable term never goes back, nor its vote within a term."""
        if after.term < before.term or (
            after.term == before.term and before.vote is not None and after.vote != before.vote
        ):
            raise InvariantViolation(
                f"node {node} wrote hard state term {after.term} vote {after.vote} over "
                f"term {before.term} vote {before.vote}"
            )

    def leader_seen(self, node: SimNode, core: RaftCore) -> None:
        """Election Safety (§5.2) and Leader Completeness (§5.4) for a leader."""
        known = self.leader_of_term.get(core.term)
        if known is None:
            self.leader_of_term[core.term] = node.id
            for index, (term, seen_term) in self.committed.items():
                if seen_term <= core.term:
                    self._check_has_entry(core, index, term, "new leader")
        elif known != node.id:
            raise InvariantViolation(f"two leaders in term {core.term}: {known} and {node.id}")

    def _check_has_entry(self, core: RaftCore, index: LogIndex, term: Term, why: str) -> None:
        if index < core.log.first_index():
            return  # covered by its snapshot, which only holds committed state
        if core.log.term(index) != term:
            raise InvariantViolation(
                f"leader completeness: {why} {core.id} (term {core.term}) lacks committed "
                f"entry {index} of term {term}; it has term {core.log.term(index)}"
            )

    def persisted(self, storage: MemoryStorage, entries: tuple[Entry, ...]) -> None:
        """Log Matching (§5.3): an (index, term) names one entry and one predecessor term."""
        for entry in entries:
            prev_term = storage.term(LogIndex(entry.index - 1))
            key = (entry.index, entry.term)
            value = (entry.kind, entry.data, prev_term)
            known = self.entry_by_key.setdefault(key, value)
            if known != value:
                raise InvariantViolation(
                    f"log matching: two different entries at index {entry.index} term "
                    f"{entry.term}: {known} vs {value}"
                )

    def commit_seen(self, core: RaftCore, upto: LogIndex, nodes: dict[NodeId, SimNode]) -> None:
        """``core`` committed past ``upto``: record the entries, check live leaders have them."""
        for index in range(core.log.committed, upto, -1):
            term = core.log.term(LogIndex(index))
            if term is None:
                break
            known = self.committed.get(LogIndex(index))
            if known is not None:
                if known[0] != term:
                    raise InvariantViolation(
                        f"committed entry {index} has term {known[0]} and {term} on {core.id}"
                    )
                if known[1] <= core.term:
                    continue
            self.committed[LogIndex(index)] = (term, core.term)
            for other in nodes.values():
                leader = other.core
                if leader is not None and leader.role is Role.LEADER and leader.term > core.term:
                    self._check_has_entry(leader, LogIndex(index), term, "leader")
        self.max_committed = LogIndex(max(self.max_committed, core.log.committed))

    def applied(self, node_id: NodeId, index: LogIndex, digest: bytes) -> None:
        """State Machine Safety (§5.4.3): the same state at the same applied index."""
        known = self.digest_at.setdefault(index, digest)
        if known != digest:
            raise InvariantViolation(
                f"state machine safety: node {node_id} has a different state at index {index}"
            )


class SimCluster:
    """A cluster under a scenario, advanced one tick at a time."""

    def __init__(self, seed: int, scenario: Scenario) -> None:
        self.seed = seed
        self.scenario = scenario
        self.rng = random.Random(seed)
        self.now = 0
        self.network = SimNetwork(
            self.rng,
            scenario.drop_rate,
            scenario.duplicate_rate,
            scenario.max_delay_ticks,
            scenario.straggler_rate,
        )
        self.checker = Checker()
        voter_ids = [NodeId(i) for i in range(1, scenario.voters + 1)]
        self.spare_ids = [
            NodeId(i) for i in range(scenario.voters + 1, scenario.voters + scenario.spares + 1)
        ]
        initial = Membership(frozenset(voter_ids))
        self.nodes: dict[NodeId, SimNode] = {}
        for node_id in voter_ids:
            self._add_node(node_id, initial)
        self.pending_proposals: dict[tuple[NodeId, LogIndex], bytes] = {}
        self.read_floor: dict[bytes, LogIndex] = {}
        self.reads_served = 0
        self._proposal_counter = 0
        self._read_counter = 0
        self.crash_count = 0
        self.disk_faults = 0
        self.disk_faulted: NodeId | None = None
        self.trace: list[str] = []
        self.bad_clocks: set[NodeId] = set()
        self.dispatch_steps = 0
        self.clock_faults = 0

    # --- plumbing ------------------------------------------------------------------------

    def _new_incarnation(self) -> int:
        return self.rng.getrandbits(63) or 1

    def _config(self, node_id: NodeId) -> RaftConfig:
        s = self.scenario
        return RaftConfig(
            node_id=node_id,
            election_timeout_ticks=s.election_timeout_ticks,
            heartbeat_interval_ticks=s.heartbeat_interval_ticks,
            max_append_bytes=s.max_append_bytes,
            max_inflight_messages=s.max_inflight,
            snapshot_chunk_bytes=s.snapshot_chunk_bytes,
            max_committed_bytes_per_ready=256,
            recovery=True,
            boot_id=1,  # replaced at every start
            member_record_ticks=40,
        )

    def _add_node(self, node_id: NodeId, membership: Membership) -> SimNode:
        node = SimNode(node_id, self._config(node_id), membership, self._new_incarnation())
        self.equip(node)
        self.nodes[node_id] = node
        node.start(random.Random(self.rng.getrandbits(64)))
        return node

    def equip(self, node: SimNode) -> None:
        """Give a new machine its clocks (clock scenarios only): a good wall clock, and a
        monotonic clock with its own origin and drift."""
        if not self.scenario.clocks:
            return
        rng = self.rng
        node.clock = SimClock(
            wall_offset_us=rng.randint(-MAX_GOOD_OFFSET_US, MAX_GOOD_OFFSET_US),
            wall_drift_ppm=rng.randint(-MAX_GOOD_WALL_DRIFT_PPM, MAX_GOOD_WALL_DRIFT_PPM),
            mono_offset_us=rng.randint(0, 10**12),
            mono_drift_ppm=rng.randint(-MAX_MONO_DRIFT_PPM, MAX_MONO_DRIFT_PPM),
        )
        node.time_config = sim_time_config(self.scenario)
        node.true_us = self.now * TICK_US

    def _send(self, message: Message) -> None:
        if self.scenario.wire_roundtrip:
            message = decode_message(encode_message(message))
        self.network.send(message, self.now)

    def _log(self, text: str) -> None:
        self.trace.append(f"t={self.now} {text}")

    def process(self, node: SimNode) -> None:
        """Run the adapter loop for ``node``: persist, send, apply, advance."""
        core = node.core
        while core is not None and core.has_ready():
            ready = core.ready()
            if node.keeper is not None:
                node.keeper.on_ready(ready, node.mono_us())
            for message in ready.leader_messages:
                self._send(message)  # replicated while our own write runs (§10.2.1)
            if node.crash_mid_write:
                self._log(f"crash {node.id} before its write of {len(ready.entries)} entries")
                node.crash()
                return
            if ready.hard_state is not None:
                self.checker.hard_state_written(
                    node.id, node.storage.hard_state(), ready.hard_state
                )
            node.persist(ready)
            self.checker.persisted(node.storage, ready.entries)
            if node.crash_after_persist:
                self._log(f"crash {node.id} after persisting")
                node.crash()
                return
            for message in ready.messages:
                self._send(message)
            if ready.snapshot is not None:
                node.sm.restore(ready.snapshot.data)
                self.checker.applied(node.id, node.sm.applied_index, node.sm.digest)
            for entry in ready.committed_entries:
                node.sm.apply(entry)
                self.checker.applied(node.id, entry.index, node.sm.digest)
                payload = self.pending_proposals.pop((node.id, entry.index), None)
                if payload is not None and payload == entry.data:
                    self.checker.acked[payload] = entry.index
            for read in ready.read_states:
                floor = self.read_floor.pop(read.request_ctx, None)
                if floor is not None and read.index < floor:
                    raise InvariantViolation(
                        f"stale read on {node.id}: read index {read.index} < {floor} committed "
                        "when the read started"
                    )
                self.reads_served += 1
            core.advance(ready)
            if core.log.committed > node.last_committed_seen:
                self.checker.commit_seen(core, node.last_committed_seen, self.nodes)
                node.last_committed_seen = core.log.committed
        if core is not None and core.role is Role.LEADER:
            self.checker.leader_seen(node, core)

    def step(self) -> None:
        """One tick: every live node ticks, then due messages are delivered."""
        self.tick_nodes()
        for message in self.network.due(self.now):
            self.deliver(message)
        if self.scenario.clocks:
            self.check_time()

    def tick_nodes(self) -> None:
        """Advance time one tick and tick every live node (the first half of :meth:`step`)."""
        self.now += 1
        for node in self.nodes.values():
            node.true_us = self.now * TICK_US
        for node_id in sorted(self.nodes):
            node = self.nodes[node_id]
            if node.core is not None:
                # Clocks drift: a node sometimes misses a tick.
                skew = self.scenario.tick_skip_rate
                if skew and self.rng.random() < skew:
                    continue
                node.core.tick()
                if node.keeper is not None:
                    messages, _ = node.keeper.on_tick(node.core, node.mono_us(), node.wall_us())
                    for message in messages:
                        self._send(message)
                self.process(node)

    def deliver(self, message: Message) -> None:
        """Hand one message that arrived to its target node (if it runs)."""
        target = self.nodes.get(message.to_id)
        if target is None or target.core is None:
            return
        if isinstance(message, CLOCK_MESSAGES):
            if target.keeper is not None:
                answer = target.keeper.on_message(
                    target.core, message, target.mono_us(), target.wall_us()
                )
                if answer is not None:
                    self._send(answer)
            return
        self.checker.delivered(message)
        target.core.step(message)
        self.process(target)

    def check_time(self) -> None:
        """The leader lease and the bound, at this instant of true time.

        At most one node may dispatch (thesis §6.4.1), and its cluster time is within
        half of ``max_clock_offset_ms`` of true time: whatever it releases is due by a
        time stamped within half the bound too, so nothing is delivered earlier than
        due minus the bound.
        """
        bound_us = self.scenario.max_clock_offset_ms * 1000
        true_wall_us = EPOCH_US + self.now * TICK_US
        dispatching: list[NodeId] = []
        for node_id, node in sorted(self.nodes.items()):
            if node.core is None or node.keeper is None:
                continue
            mono = node.mono_us()
            if not node.keeper.can_dispatch(node.core, mono):
                continue
            dispatching.append(node_id)
            error_us = node.keeper.clock.now_us(mono) - true_wall_us
            if abs(error_us) > bound_us // 2:
                raise InvariantViolation(
                    f"node {node_id} may dispatch with a cluster time {error_us / 1000:+.1f} ms "
                    f"from true time (bound ±{bound_us // 2000} ms); its wall clock is "
                    f"{node.clock.wall_error_us(node.true_us) / 1000 if node.clock else 0:+.1f} ms off"
                )
        if len(dispatching) > 1:
            terms = {n: self.nodes[n].core.term for n in dispatching}  # type: ignore[union-attr]
            raise InvariantViolation(
                f"nodes {dispatching} may all dispatch at once (terms {terms}): the leader "
                "lease did not hold"
            )
        if dispatching:
            self.dispatch_steps += 1

    def live_leaders(self) -> list[SimNode]:
        """Running nodes that believe they lead, by id."""
        return [
            n
            for _, n in sorted(self.nodes.items())
            if n.core is not None and n.core.role is Role.LEADER
        ]

    def leader(self) -> SimNode | None:
        """The live leader with the highest term, if any."""
        leaders = self.live_leaders()
        if not leaders:
            return None
        return max(leaders, key=lambda n: n.core.term if n.core else 0)

    # --- workload and faults -------------------------------------------------------------

    def propose(self) -> None:
        """A client proposes a unique payload to a leader (or, misdirected, anyone)."""
        live = [n for _, n in sorted(self.nodes.items()) if n.core is not None]
        if not live:
            return
        leaders = [n for n in live if n.core is not None and n.core.role is Role.LEADER]
        node = self.rng.choice(leaders or live)
        assert node.core is not None
        self._proposal_counter += 1
        payload = b"p%d" % self._proposal_counter
        try:
            index = node.core.propose(payload)
        except (RaftNotLeaderError, ProposalDroppedError):
            return
        self.pending_proposals[(node.id, index)] = payload
        self.process(node)

    def read(self) -> None:
        """A client starts a ReadIndex read at a random node (thesis §6.4)."""
        live = [n for _, n in sorted(self.nodes.items()) if n.core is not None]
        node = self.rng.choice(live) if live else None
        if node is None or node.core is None:
            return
        self._read_counter += 1
        ctx = b"r%d" % self._read_counter
        self.read_floor[ctx] = self.checker.max_committed
        try:
            node.core.read_index(ctx)
        except RaftNotLeaderError:
            del self.read_floor[ctx]
            return
        self.process(node)

    def inject_fault(self) -> None:
        """Apply one random fault allowed by the scenario."""
        s = self.scenario
        choices: list[str] = []
        if s.partitions:
            choices += ["partition", "one_way", "bridge", "isolate_leader", "heal", "heal"]
        if s.crashes:
            choices += ["crash", "crash_after_persist", "restart", "restart"]
            if s.mid_write_crashes:
                choices += ["crash_mid_write"]
        if s.membership_changes:
            choices += ["add_learner", "add_learner", "promote", "promote", "remove"]
        if s.transfers:
            choices += ["transfer"]
        if s.leader_faults:
            choices += ["crash_leader", "crash_leader", "isolate_leader", "heal"]
        if s.clock_faults:
            choices += ["clock_step", "clock_step", "clock_skew", "clock_drift", "clock_heal"]
        if s.disk_faults:
            choices += ["wipe", "rollback"]
        if not choices:
            return
        kind = self.rng.choice(choices)
        getattr(self, f"_fault_{kind}")()

    def _members(self) -> list[NodeId]:
        return sorted(self.nodes)

    def _fault_partition(self) -> None:
        ids = self._members()
        self.rng.shuffle(ids)
        cut = self.rng.randint(1, len(ids) - 1)
        self.network.heal()
        self.network.partition([ids[:cut], ids[cut:]])
        self._log(f"partition {sorted(ids[:cut])} | {sorted(ids[cut:])}")

    def _fault_one_way(self) -> None:
        ids = self._members()
        a, b = self.rng.sample(ids, 2)
        self.network.cut_one_way(a, b)
        self._log(f"cut {a} -> {b}")

    def _fault_bridge(self) -> None:
        ids = self._members()
        if len(ids) < 3:
            return
        self.rng.shuffle(ids)
        bridge = ids[0]
        rest = ids[1:]
        cut = self.rng.randint(1, len(rest) - 1)
        self.network.heal()
        self.network.partition([rest[:cut], rest[cut:]])
        for other in ids:
            self.network.blocked.discard((bridge, other))
            self.network.blocked.discard((other, bridge))
        self._log(f"bridge {bridge} between {sorted(rest[:cut])} and {sorted(rest[cut:])}")

    def _fault_isolate_leader(self) -> None:
        leader = self.leader()
        if leader is None:
            return
        others = [i for i in self._members() if i != leader.id]
        self.network.partition([[leader.id], others])
        self._log(f"isolate leader {leader.id}")

    def _fault_heal(self) -> None:
        self.network.heal()
        self._log("heal")

    def _fault_crash(self, after_persist: bool = False) -> None:
        live = [n for _, n in sorted(self.nodes.items()) if n.core is not None]
        down = len(self.nodes) - len(live)
        if not live or down >= self.scenario.max_crashed:
            return
        node = self.rng.choice(live)
        self.crash_count += 1
        if after_persist:
            node.crash_after_persist = True
            self._log(f"crash {node.id} at its next write")
        else:
            node.crash()
            self._log(f"crash {node.id}")

    def _fault_crash_leader(self) -> None:
        leader = self.leader()
        down = sum(1 for n in self.nodes.values() if n.core is None)
        if leader is None or down >= self.scenario.max_crashed:
            return
        self.crash_count += 1
        leader.crash()
        self._log(f"crash leader {leader.id}")

    def _fault_crash_after_persist(self) -> None:
        self._fault_crash(after_persist=True)

    def _fault_crash_mid_write(self) -> None:
        """A node dies at its next write, before it is durable: half the time the
        leader (after its AppendEntries for the write left, thesis §10.2.1), else any
        node (whose answers for the write must then never have left)."""
        live = [n for _, n in sorted(self.nodes.items()) if n.core is not None]
        if not live or len(self.nodes) - len(live) >= self.scenario.max_crashed:
            return
        leader = self.leader()
        node = leader if leader is not None and self.rng.random() < 0.5 else self.rng.choice(live)
        self.crash_count += 1
        node.crash_mid_write = True
        self._log(f"crash {node.id} during its next write")

    def _fault_restart(self) -> None:
        down = [n for _, n in sorted(self.nodes.items()) if n.core is None]
        if not down:
            return
        node = self.rng.choice(down)
        node.start(random.Random(self.rng.getrandbits(64)))
        self._log(f"restart {node.id}")
        self.process(node)

    # --- clock faults (docs/architecture.md, "Time") ---------------------------------

    def _clock_victim(self) -> SimNode | None:
        """A node whose clock may go wrong: one already wrong, or any while fewer than a
        minority of the voters have a wrong clock (the fault model)."""
        bad = sorted(self.bad_clocks)
        budget = (len(self.nodes) - 1) // 2
        candidates = bad if len(bad) >= budget else sorted(self.nodes)
        if not candidates:
            return None
        node = self.nodes[self.rng.choice(candidates)]
        return node if node.clock is not None else None

    def _clock_fault(self, node: SimNode, what: str) -> None:
        self.bad_clocks.add(node.id)
        self.clock_faults += 1
        assert node.clock is not None
        error = node.clock.wall_error_us(self.now * TICK_US)
        self._log(f"clock of {node.id}: {what}, now {error / 1000:+.1f} ms off")

    def _fault_clock_step(self) -> None:
        node = self._clock_victim()
        if node is None or node.clock is None:
            return
        step_us = self.rng.choice((-3_600_000_000, -5_000_000, -600_000, 600_000, 5_000_000,
                                   3_600_000_000))  # fmt: skip
        node.clock.wall_offset_us += step_us
        self._clock_fault(node, f"stepped {step_us / 1000:+.0f} ms")

    def _fault_clock_skew(self) -> None:
        node = self._clock_victim()
        if node is None or node.clock is None:
            return
        bound_us = self.scenario.max_clock_offset_ms * 1000
        skew_us = self.rng.choice((-1, 1)) * self.rng.randint(bound_us // 2, 10_000_000)
        node.clock.wall_offset_us += skew_us - node.clock.wall_error_us(self.now * TICK_US)
        self._clock_fault(node, f"set {skew_us / 1000:+.0f} ms off")

    def _fault_clock_drift(self) -> None:
        node = self._clock_victim()
        if node is None or node.clock is None:
            return
        drift = self.rng.choice((-1, 1)) * self.rng.randint(5_000, 50_000)
        node.clock.set_wall_drift(self.now * TICK_US, drift)
        self._clock_fault(node, f"drifting {drift} ppm")

    def _fault_clock_heal(self) -> None:
        if not self.bad_clocks:
            return
        node = self.nodes[self.rng.choice(sorted(self.bad_clocks))]
        self._heal_clock(node)

    def _heal_clock(self, node: SimNode) -> None:
        clock = node.clock
        if clock is None:
            return
        true_us = self.now * TICK_US
        clock.set_wall_drift(true_us, self.rng.randint(-MAX_GOOD_WALL_DRIFT_PPM,
                                                       MAX_GOOD_WALL_DRIFT_PPM))  # fmt: skip
        target = self.rng.randint(-MAX_GOOD_OFFSET_US, MAX_GOOD_OFFSET_US)
        clock.wall_offset_us += target - clock.wall_error_us(true_us)
        self.bad_clocks.discard(node.id)
        self._log(f"clock of {node.id} fixed, {target / 1000:+.1f} ms off")

    # --- disk faults (docs/raft.md, "Disk faults") ----------------------------------------

    def take_copy(self) -> None:
        """Copy one node's data directory as it is on disk now (kept for a rollback)."""
        node = self.nodes[self.rng.choice(sorted(self.nodes))]
        node.copies.append(node.durable_copy())
        if len(node.copies) > 3:
            del node.copies[self.rng.randrange(len(node.copies) - 1)]

    def _disk_fault_allowed(self) -> bool:
        """One disk at a time: the last node that lost its disk has recovered and caught
        up past the best log it heard of (its vote floor is gone)."""
        if self.disk_faulted is None:
            return True
        core = self.nodes[self.disk_faulted].core
        if core is None or core.recovering or core.recovery_status().vote_floor is not None:
            return False
        self.disk_faulted = None
        return True

    def _disk_fault(self, node: SimNode, what: str) -> None:
        """Stop ``node`` (if up), let its in-flight messages go, change its disk, start it."""
        if node.core is not None:
            node.crash()
        self.network.drop_from(node.id)
        self.checker.disk_fault(node.id)
        self.disk_faults += 1
        self.disk_faulted = node.id
        self._log(f"{what} {node.id}, restart it")
        node.start(random.Random(self.rng.getrandbits(64)))
        self.process(node)

    def _fault_wipe(self) -> None:
        if not self._disk_fault_allowed():
            return
        node = self.nodes[self.rng.choice(sorted(self.nodes))]
        if node.core is not None:
            node.crash()
        node.wipe(self._new_incarnation())
        self._disk_fault(node, "wipe")

    def _fault_rollback(self) -> None:
        if not self._disk_fault_allowed():
            return
        candidates = [n for _, n in sorted(self.nodes.items()) if n.copies]
        if not candidates:
            return
        node = self.rng.choice(candidates)
        copy = node.copies[self.rng.randrange(len(node.copies))]
        if node.core is not None:
            node.crash()
        node.restore_copy(copy)
        self._disk_fault(node, "roll back")

    def _conf_change(self, change: ConfChange) -> bool:
        leader = self.leader()
        if leader is None or leader.core is None:
            return False
        try:
            leader.core.propose_conf_change(change)
        except (RaftNotLeaderError, ProposalDroppedError):
            return False
        except Exception as exc:  # INVALID_ARGUMENT: the change does not fit; skip it
            if type(exc).__name__ != "RequestError":
                raise
            return False
        self._log(f"conf change {change.op.name} {change.node_id} via {leader.id}")
        self.process(leader)
        return True

    def _fault_add_learner(self) -> None:
        if not self.spare_ids:
            return
        node_id = self.spare_ids[0]
        if node_id not in self.nodes:
            self._add_node(node_id, Membership())  # joins knowing nothing
        if self._conf_change(ConfChange(ConfChangeOp.ADD_LEARNER, node_id)):
            self.spare_ids.pop(0)

    def _fault_promote(self) -> None:
        leader = self.leader()
        if leader is None or leader.core is None or not leader.core.membership.learners:
            return
        learner = self.rng.choice(sorted(leader.core.membership.learners))
        self._conf_change(ConfChange(ConfChangeOp.PROMOTE_VOTER, learner))

    def _fault_remove(self) -> None:
        leader = self.leader()
        if leader is None or leader.core is None:
            return
        membership = leader.core.membership
        # Keep at least 3 voters so a single crash does not stop the cluster.
        candidates = sorted(membership.learners)
        if len(membership.voters) > 3:
            candidates += sorted(membership.voters)
        if candidates:
            self._conf_change(ConfChange(ConfChangeOp.REMOVE_NODE, self.rng.choice(candidates)))

    def _fault_transfer(self) -> None:
        leader = self.leader()
        if leader is None or leader.core is None:
            return
        voters = [v for v in sorted(leader.core.membership.voters) if v != leader.id]
        if not voters:
            return
        target = self.rng.choice(voters)
        try:
            leader.core.transfer_leadership(target)
        except ProposalDroppedError:
            return  # the target is recovering after a restart
        self._log(f"transfer {leader.id} -> {target}")
        self.process(leader)

    def compact(self) -> None:
        """Each live node snapshots its state machine once enough is applied (paper §7)."""
        every = self.scenario.compaction_every
        for node_id in sorted(self.nodes):
            node = self.nodes[node_id]
            core = node.core
            if core is None:
                continue
            applied = core.log.applied
            if applied - node.storage.snapshot().metadata.index < every:
                continue
            if self.rng.random() < 0.5:
                continue
            assert node.sm.applied_index == applied
            snapshot: Snapshot = core.compact(applied, node.sm.snapshot_data())
            node.storage.compact(snapshot)

    # --- the run --------------------------------------------------------------------------

    def run(self) -> None:
        """Run the scenario, then heal and check liveness."""
        s = self.scenario
        for _ in range(s.steps):
            if self.rng.random() < s.fault_rate:
                self.inject_fault()
            if self.rng.random() < s.propose_rate:
                self.propose()
            if s.reads and self.rng.random() < 0.1:
                self.read()
            if s.compaction_every:
                self.compact()
            if s.disk_faults and self.rng.random() < 0.04:
                self.take_copy()
            self.step()
        self.check_liveness()
        self.check_acknowledged_kept()

    def check_liveness(self, budget_ticks: int = 300) -> None:
        """Heal the network, restart every node, and require progress (paper §5.2)."""
        # Liveness needs an eventually well-behaved network (paper §5.6): after healing,
        # no loss, no duplicates, and in-order delivery one tick later.
        self.network.heal()
        self.network.drop_rate = 0.0
        self.network.duplicate_rate = 0.0
        self.network.max_delay_ticks = 1
        self.network.straggler_rate = 0.0
        for node_id in sorted(self.bad_clocks):
            self._heal_clock(self.nodes[node_id])
        for node_id in sorted(self.nodes):
            node = self.nodes[node_id]
            node.crash_after_persist = False
            node.crash_mid_write = False
            if node.core is None:
                node.start(random.Random(self.rng.getrandbits(64)))
                self.process(node)
        self._log("liveness phase: healed, all nodes up")
        marker = b"liveness-marker"
        proposed_at: tuple[NodeId, LogIndex, Term] | None = None
        for _ in range(budget_ticks):
            self.step()
            leader = self.leader()
            if leader is None or leader.core is None:
                continue
            core = leader.core
            if proposed_at is None or proposed_at[2] != core.term:
                try:
                    index = core.propose(marker)
                except (RaftNotLeaderError, ProposalDroppedError):
                    continue
                proposed_at = (leader.id, index, core.term)
                self.process(leader)
                continue
            index = proposed_at[1]
            members = core.membership.members()
            done = all(
                self.nodes[m].core is not None and self.nodes[m].sm.applied_index >= index
                for m in members
                if m in self.nodes
            )
            if done and core.log.term(index) == proposed_at[2]:
                return
        states = {
            node_id: (
                (n.core.role.value, n.core.term, n.core.log.committed, n.sm.applied_index)
                if n.core
                else "down"
            )
            for node_id, n in sorted(self.nodes.items())
        }
        raise InvariantViolation(
            f"liveness: no leader committed a proposal on all members within {budget_ticks} "
            f"ticks after healing; nodes (role, term, commit, applied): {states}"
        )

    def check_acknowledged_kept(self) -> None:
        """After the liveness phase: every acknowledged proposal is still in the log of
        the leader, at its index (or covered by its snapshot) — none was lost."""
        leader = self.leader()
        assert leader is not None and leader.core is not None
        log = leader.core.log
        for payload, index in sorted(self.checker.acked.items()):
            if index < log.first_index():
                continue  # in its snapshot, which only holds committed state
            (entry,) = log.slice(index, LogIndex(index + 1))
            if entry.data != payload:
                raise InvariantViolation(
                    f"acknowledged proposal {payload!r} at index {index} is lost: the leader "
                    f"{leader.id} holds {entry.data!r} there"
                )


def run_seed(seed: int) -> SimCluster:
    """Run one seed's scenario end to end; raises :class:`InvariantViolation` on failure."""
    cluster = SimCluster(seed, scenario_for_seed(seed))
    cluster.run()
    return cluster
