"""RaftNode: the trio driver of :class:`~futureq.raft.core.RaftCore`, and a CommandLog.

One task (the driver) owns the core. Every ``tick_ms`` a ticker asks for a tick;
inbound peer messages, proposals, reads, membership changes and transfers are queued
and fed to the core at the top of each round. While the core has a Ready the driver:

0. sends ``ready.leader_messages`` at once: a leader replicates while its own write
   runs (thesis §10.2.1);
1. persists it (snapshot metadata, entries, hard state) with one RocksDB batch in a
   worker thread, synced when ``must_sync`` — not cancellable half way; a loop with
   nothing else to run waits for it briefly without the hop back through the loop
   (:mod:`futureq.quick_thread`);
2. then sends ``ready.messages`` (they may promise what step 1 stored);
3. then installs a received snapshot and applies ``committed_entries`` in order,
   resolving the proposers waiting for them;
4. then calls ``advance``.

Group commit is natural: proposals accumulate while the previous write is in flight
and go into the next Ready together. Compaction runs beside the driver: a point-in-time
:class:`SnapshotSource` is taken on the loop, serialized and written in worker threads,
then the driver calls ``core.compact`` and stores it, keeping a catch-up tail of log.

At start the driver checks the data directory's stamp (cluster id, node id, random
incarnation; written when the directory is created) and runs the core with
``recovery`` on: after every start the node takes no part in votes or quorums until
every other voter has answered it (``docs/raft.md``, "Disk faults").

Leadership as the broker sees it (:meth:`RaftNode.is_leader`) begins once the no-op
entry of the leader's term is *applied* here (so everything committed before is applied)
and ends when the core leaves the LEADER role. :meth:`RaftNode.wait_role_change`
reports every change of ``(is_leader(), leader_id())``.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio

from futureq.clock import SystemClock
from futureq.errors import (
    ConfigError,
    ErrorCode,
    NoSpaceError,
    NotLeaderError,
    RequestError,
    StorageError,
)
from futureq.quick_thread import run_sync_quick
from futureq.raft.cluster_clock import describe_offset
from futureq.raft.core import ProposalDroppedError, RaftConfig, RaftCore, RaftNotLeaderError
from futureq.raft.messages import (
    CLOCK_MESSAGES,
    AppendEntries,
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryKind,
    Heartbeat,
    LogIndex,
    Membership,
    Message,
    NodeId,
    Ready,
)
from futureq.raft.rocks_storage import StoreIdentity
from futureq.raft.roles import Role
from futureq.raft.storage import SnapshotOutOfDateError
from futureq.raft.timekeeper import TimeConfig, TimeKeeper

if TYPE_CHECKING:
    from futureq.clock import MicroClock
    from futureq.metrics import Metrics
    from futureq.raft.rocks_storage import RocksStorage
    from futureq.raft.transport import Transport
    from futureq.storage.space import SpaceAlarm

log = logging.getLogger(__name__)


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


class _Waiter:
    __slots__ = ("decoded", "done", "error", "index", "result", "term")

    def __init__(self, decoded: Any = None) -> None:
        self.done = trio.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.index = 0
        self.term = 0
        self.decoded = decoded
        """The proposer's own reading of its entry's bytes, or None (see ``propose``)."""

    def resolve(self, result: Any) -> None:
        if not self.done.is_set():
            self.result = result
            self.done.set()

    def fail(self, error: BaseException) -> None:
        if not self.done.is_set():
            self.error = error
            self.done.set()

    async def wait(self) -> Any:
        await self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


@attrs.frozen
class _Op:
    kind: str  # "propose", "durable", "conf", "read", "probe", "transfer"
    waiter: _Waiter
    data: bytes = b""
    change: ConfChange | None = None
    target: int = 0


APPLY_QUEUE_BATCHES = 64
"""Committed batches waiting for the applier before persisting waits for it."""
APPLY_SLICE_ENTRIES = 8
"""Entries applied between two yields to the event loop."""
INBOX_LIMIT = 4096
"""Peer messages taken in before the driver has stepped them (then the receiver waits)."""
_LOG_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_PROBE_PREFIX = b"probe:"
"""Request context of the follower's commit-index probes (never a read waiter's)."""


def _outcome_unknown(index: int, why: str) -> RequestError:
    return RequestError(
        ErrorCode.UNAVAILABLE,
        f"outcome unknown: {why} before log entry {index} was known to be committed; "
        "it may or may not have been applied",
    )


LEADER_FRESH_HEARTBEATS = 3
"""A follower names its leader to a held request (:meth:`RaftNode.wait_for_leader`)
only when it heard from it within this many heartbeat intervals."""


class RaftNode:
    """A Raft server: the trio driver around :class:`RaftCore`, and a ``CommandLog``.

    Args:
        config: Identity and tuning.
        storage: Durable raft state (opened on the node's RocksDB).
        transport: Peer links; its ``run`` must be started by the caller (before or
            beside :meth:`run`).
        state_machine: Where committed entries are applied.
        rng: Randomness for election timeouts (seed it in tests).
        metrics: fsync/apply timings and group-commit sizes are observed here.
        space_alarm: The NO_SPACE alarm. With it, a write that finds the disk full does
            not stop the node: it stops leading (the cluster elects a leader that can
            write), acknowledges nothing it could not store, and retries once space
            returns. None: the StorageError stops the node.
        clock: The OS clocks in microseconds (the cluster clock's input, the lease).
    """

    def __init__(
        self,
        config: RaftNodeConfig,
        storage: RocksStorage,
        transport: Transport,
        state_machine: StateMachine,
        *,
        rng: random.Random,
        metrics: Metrics | None = None,
        space_alarm: SpaceAlarm | None = None,
        clock: MicroClock | None = None,
    ) -> None:
        self.config = config
        self._alarm = space_alarm
        self._disk_full = False
        self.id = NodeId(config.node_id)
        self._clock: MicroClock = clock or SystemClock()
        self.timekeeper = TimeKeeper(
            config.node_id,
            config.time_config(),
            mono_us=self._clock.monotonic_us(),
            wall_us=self._clock.wall_us(),
        )
        self._storage = storage
        self._transport = transport
        self._sm = state_machine
        self._rng = rng
        self._metrics = metrics
        self._core: RaftCore | None = None
        self._running = False
        self._stopped = False
        self._wake = trio.Event()
        self._ticks_due = 0
        self._inbox: deque[Message] = deque()
        self._last_heard_s: dict[int, float] = {}
        """trio.current_time() of the last message from each peer (status only)."""
        self._inbox_drained = trio.Event()
        self._ops: list[_Op] = []
        self._apply_waiters: dict[int, _Waiter] = {}
        self._durable_waiters: dict[int, _Waiter] = {}
        self._read_waiters: dict[bytes, _Waiter] = {}
        self._reads_after_apply: list[tuple[int, _Waiter]] = []
        self._read_seq = 0
        self._leader_ready_term = -1
        self._ticks_since_leading = 0
        self._leader_commit_seen = 0
        self._probe_answered = False
        self._caught_up_at: float | None = None
        """When (trio time) this follower last had applied all it knew committed."""
        self._apply_send: trio.MemorySendChannel[tuple[Entry, ...]] | None = None
        self._apply_backlog = 0
        self._applied_all = trio.Event()
        self._applied_all.set()
        self._role_epoch = 0
        self._role_event = trio.Event()
        self._last_role: tuple[bool, int | None] = (False, None)
        self._conf_lock = trio.Lock()
        self._compacting = False
        self._compaction_done: tuple[int, bytes] | None = None
        self.elections_won = 0
        self.incarnation = 0
        self._was_recovering = False
        self._findings_logged = 0
        self._removal_logged = False

    # --- views --------------------------------------------------------------------------

    @property
    def core(self) -> RaftCore:
        """The core (for tests and diagnostics; only the driver may call its inputs)."""
        assert self._core is not None, "RaftNode.run() has not loaded the storage yet"
        return self._core

    def is_leader(self) -> bool:
        """True when this node leads and has applied the no-op of its term."""
        core = self._core
        return (
            core is not None
            and not self._stopped
            and not self._disk_full
            and core.role is Role.LEADER
            and self._leader_ready_term == core.term
        )

    def dispatch_refusal(self) -> str | None:
        """Why this node may not hand out messages now (a sentence), or None if it may.

        It may while :meth:`is_leader`, its clock is within the bound and it holds the
        leader lease (thesis §6.4.1; :mod:`futureq.raft.timekeeper`).
        """
        core = self._core
        if core is None or not self.is_leader():
            return "this node is not the leader"
        return self.timekeeper.dispatch_refusal(core, self._clock.monotonic_us())

    def can_dispatch(self) -> bool:
        """Whether this node may hand out messages now (:meth:`dispatch_refusal`)."""
        return self.dispatch_refusal() is None

    def lease_remaining_s(self) -> float:
        """Seconds left on the leader lease (0 when not leading or without one)."""
        core = self._core
        if core is None:
            return 0.0
        expiry = self.timekeeper.lease_expiry_us(core)
        if expiry is None:
            return 0.0
        return max(0.0, (expiry - self._clock.monotonic_us()) / 1e6)

    def leader_id(self) -> int | None:
        """The leader of the current term as far as this node knows, or None."""
        core = self._core
        if core is None or self._stopped:
            return None
        if self._disk_full and core.leader_id == self.id:
            return None  # we cannot write: not a leader to send clients to
        return core.leader_id

    def leader_address(self) -> str | None:
        """The leader's CLIENT address (from the handshake or address book), or None."""
        leader = self.leader_id()
        if leader is None:
            return None
        if leader == self.id:
            return self.config.client_address
        return self._transport.peer_client_address(leader)

    def member_addresses(self, node_id: int) -> tuple[str | None, str | None]:
        """``(raft address, client address)`` of a member as far as this node knows."""
        if node_id == self.id:
            return self._transport.advertise_address, self.config.client_address
        entry = self._transport.address_book.get(node_id)
        return (None if entry is None else entry[0]), self._transport.peer_client_address(node_id)

    @property
    def applied_index(self) -> int:
        """Index of the last entry applied to the state machine."""
        return self._sm.applied_index

    @property
    def commit_index(self) -> int:
        """Commit index known to this node."""
        return 0 if self._core is None else int(self._core.log.committed)

    @property
    def term(self) -> int:
        """Current term."""
        return 0 if self._core is None else int(self._core.term)

    @property
    def role(self) -> Role:
        """Current role of the core (FOLLOWER before the storage is loaded)."""
        return Role.FOLLOWER if self._core is None else self._core.role

    @property
    def role_epoch(self) -> int:
        """Bumped on every change of ``(is_leader(), leader_id())``."""
        return self._role_epoch

    def membership(self) -> tuple[frozenset[int], frozenset[int]]:
        """``(voters, learners)`` of the latest configuration in the log."""
        membership = self.core.membership if self._core is not None else Membership()
        return frozenset(membership.voters), frozenset(membership.learners)

    def progress(self) -> dict[int, dict[str, Any]]:
        """Leader only: ``{node_id: {"match", "next", "state", "learner", "recovering",
        "answered", "last_heard_ms"}}``; ``{}`` on others. ``answered``: this leader has
        stepped a message of the peer's current start (until then ``recovering`` is only
        a default). ``last_heard_ms`` is how long ago the last message from that peer
        arrived (ms; None if none yet, 0 for this node)."""
        core = self._core
        if core is None or core.role is not Role.LEADER:
            return {}
        now = trio.current_time()
        heard = self._last_heard_s
        return {
            int(node_id): {
                "match": int(pr.match),
                "next": int(pr.next),
                "state": pr.state.value,
                "learner": pr.is_learner,
                "recovering": pr.peer_recovering,
                "answered": node_id == core.id or pr.peer_boot != 0,
                "last_heard_ms": 0
                if node_id == core.id
                else (None if node_id not in heard else round((now - heard[node_id]) * 1000)),
            }
            for node_id, pr in sorted(core.progress.items())
        }

    def ready_for_clients(self) -> bool:
        """A leader is known and we applied what it told us is committed (``/readyz``).

        A follower is ready once it applied what the leader's answer to its probe said
        was committed, and stays ready while it catches up with the commit index at
        least once every :meth:`_caught_up_window_s`, across a leader change too: under a steady load it is always a
        few entries behind between two applies, and a probe that fell there answered
        503, taking a healthy follower out of a load balancer (a breaker: 7 % of probes
        at 300 messages/s).
        """
        core = self._core
        if core is None or self._stopped or core.leader_id is None or core.recovering:
            return False
        if core.role is Role.LEADER:
            return self.is_leader()
        if self._note_caught_up():
            return True
        # Caught up lately, under this leader or the one before (a leader change, as
        # the shards' leadership balancing makes, leaves the followers as current).
        return (
            self._caught_up_at is not None
            and trio.current_time() - self._caught_up_at <= self._caught_up_window_s()
        )

    def _caught_up_window_s(self) -> float:
        """How long (s) a follower stays ready after it last caught up: two election
        timeouts, the time a leader is given to be heard from."""
        return 2 * self.config.election_timeout_ticks * self.config.tick_ms / 1000

    def _note_caught_up(self) -> bool:
        """Whether this follower applied all it knows committed; if so, note when."""
        core = self._core
        if core is None or not self._probe_answered:
            return False
        if self._sm.applied_index < max(int(core.log.committed), self._leader_commit_seen):
            return False
        self._caught_up_at = trio.current_time()
        return True

    async def wait_role_change(self, since_epoch: int) -> int:
        """Block until :attr:`role_epoch` differs from ``since_epoch``; return it.

        Use: ``epoch = node.role_epoch`` then loop ``epoch = await
        node.wait_role_change(epoch)`` and read :meth:`is_leader`/:meth:`leader_id`.
        """
        while self._role_epoch == since_epoch:
            await self._role_event.wait()
        return self._role_epoch

    async def wait_for_leader(self, timeout_s: float | None = None) -> None:
        """Return once a leader that takes requests is known: this node with the
        no-op of its term applied (:meth:`is_leader`), or another node heard from
        within the last ``LEADER_FRESH_HEARTBEATS`` heartbeat intervals; or after
        ``timeout_s`` (default: two election timeouts), or when the node stops.

        A follower that knows no leader (an election is running), or a new leader
        whose no-op is not applied yet, would otherwise answer NOT_LEADER without a
        leader to name, and the client would poll until the election ends. A
        follower whose leader went quiet (killed: the followers time out only after
        an election timeout) would name a dead node.
        """
        config = self.config
        if timeout_s is None:
            timeout_s = 2 * config.election_timeout_ticks * config.tick_ms / 1000
        tick_s = config.tick_ms / 1000
        fresh_s = LEADER_FRESH_HEARTBEATS * config.heartbeat_ticks * tick_s
        with trio.move_on_after(timeout_s):
            epoch = self._role_epoch
            while not self._stopped and not self.is_leader():
                leader = self.leader_id()
                if leader is not None and leader != self.id:
                    heard = self._last_heard_s.get(leader)
                    if heard is not None and trio.current_time() - heard < fresh_s:
                        return
                with trio.move_on_after(tick_s):  # or it is heard from again
                    epoch = await self.wait_role_change(epoch)

    # --- CommandLog and client operations ----------------------------------------------

    def _not_leader(self) -> NotLeaderError:
        return NotLeaderError(self.leader_address())

    def _check_can_lead(self) -> None:
        if self._stopped or not self._running:
            raise RequestError(
                ErrorCode.UNAVAILABLE, "the raft node is not running; retry on another node"
            )
        if self._core is None or self._core.role is not Role.LEADER:
            raise self._not_leader()

    def _enqueue(self, op: _Op) -> None:
        if len(self._ops) >= self.config.max_pending_proposals:
            raise RequestError(
                ErrorCode.UNAVAILABLE,
                f"{len(self._ops)} proposals are already queued (max_pending_proposals); "
                "retry shortly",
            )
        self._ops.append(op)
        self._wake.set()

    async def propose(self, command: bytes, decoded: Any = None) -> Any:
        """Replicate ``command``; return ``state_machine.apply``'s result once applied here.

        ``decoded``: the state machine's own reading of ``command`` (what its
        ``apply_steps`` would decode the bytes to), handed to ``apply_steps`` as its third
        argument when this very entry is applied here (same index and term: the Log
        Matching property, Raft paper §5.3), so a leader does not decode what it just
        encoded; followers, and an entry another leader wrote at the index, decode the
        bytes. None: always decode.

        Raises:
            NotLeaderError: this node is not the leader (with the leader's client
                address), or the entry was overwritten by another leader's entry at
                its index (definitely not applied: safe to retry at the leader).
            RequestError: UNAVAILABLE with "outcome unknown" when leadership was lost
                and the entry's fate stayed unknown for ``outcome_unknown_ticks``, or
                the node stopped; UNAVAILABLE during a leadership transfer or when too
                many proposals are queued (not appended: safe to retry).
        """
        self._check_can_lead()
        waiter = _Waiter(decoded)
        self._enqueue(_Op("propose", waiter, data=command))
        return await waiter.wait()

    async def propose_durable(self, command: bytes) -> int:
        """Append ``command`` and return its log index once persisted on this leader.

        The entry is not yet committed: it may still be lost if leadership changes.

        Raises:
            NotLeaderError, RequestError: as :meth:`propose`.
        """
        self._check_can_lead()
        waiter = _Waiter()
        self._enqueue(_Op("durable", waiter, data=command))
        index: int = await waiter.wait()
        return index

    async def read_barrier(self, timeout_s: float | None = None) -> None:
        """Return once a linearizable read may be served here (thesis §6.4, ReadIndex).

        The leader confirms with a heartbeat round that it still leads, then waits
        until ``applied_index`` reaches the commit index at the time of the request.

        Args:
            timeout_s: Give up after this long; default two election timeouts.

        Raises:
            NotLeaderError: on a follower, or if leadership is lost meanwhile.
            RequestError: TIMEOUT when no quorum confirmed in time.
        """
        self._check_can_lead()
        if timeout_s is None:
            timeout_s = 2 * self.config.election_timeout_ticks * self.config.tick_ms / 1000
        self._read_seq += 1
        waiter = _Waiter()
        self._enqueue(_Op("read", waiter, data=self._read_seq.to_bytes(8, "big")))
        with trio.move_on_after(timeout_s):
            await waiter.wait()
            return
        raise RequestError(
            ErrorCode.TIMEOUT, f"read barrier not confirmed by a quorum within {timeout_s:.1f} s"
        )

    async def add_learner(self, node_id: int) -> None:
        """Add ``node_id`` as a learner; returns once the change is applied here.

        Raises:
            NotLeaderError: not the leader.
            RequestError: INVALID_ARGUMENT if it is already a member; UNAVAILABLE if
                another change is still uncommitted or the leader is new.
        """
        await self._conf_change(ConfChangeOp.ADD_LEARNER, node_id)

    async def promote(self, node_id: int) -> None:
        """Make learner ``node_id`` a voter; returns once applied here. Errors as above."""
        await self._conf_change(ConfChangeOp.PROMOTE_VOTER, node_id)

    async def remove_node(self, node_id: int) -> None:
        """Remove ``node_id`` (may be this leader, which then hands over leadership).

        Errors as :meth:`add_learner`.
        """
        await self._conf_change(ConfChangeOp.REMOVE_NODE, node_id)

    async def _conf_change(self, op: ConfChangeOp, node_id: int) -> None:
        if node_id < 1:
            raise RequestError(ErrorCode.INVALID_ARGUMENT, f"node id {node_id} must be >= 1")
        async with self._conf_lock:
            self._check_can_lead()
            waiter = _Waiter()
            self._enqueue(_Op("conf", waiter, change=ConfChange(op, NodeId(node_id))))
            await waiter.wait()

    async def transfer_leadership(
        self, target: int | None = None, timeout_s: float | None = None
    ) -> int:
        """Hand leadership to ``target`` (None: the most up-to-date other voter).

        Returns:
            The new leader's id, once this node learned of it.

        Raises:
            NotLeaderError: not the leader.
            RequestError: INVALID_ARGUMENT if there is no such voter;
                NODE_CLOCK_OUT_OF_BOUND if the target's clock does not report itself
                synchronized and in bound within ``timeout_s`` (for None:
                CLOCK_NOT_SYNCHRONIZED when no other voter's does); TIMEOUT if no other
                node became leader within ``timeout_s`` (default: two election
                timeouts; the core aborts the transfer after one, and this node then
                steps down).
        """
        self._check_can_lead()
        core = self.core
        if target is None and not any(
            n != self.id and n in core.membership.voters and not pr.peer_recovering
            for n, pr in core.progress.items()
        ):
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT, "there is no other voter to transfer leadership to"
            )
        if timeout_s is None:
            timeout_s = 2 * self.config.election_timeout_ticks * self.config.tick_ms / 1000
        target = await self._eligible_target(target, timeout_s)
        epoch = self._role_epoch
        waiter = _Waiter()
        self._enqueue(_Op("transfer", waiter, target=target))
        await waiter.wait()
        with trio.move_on_after(timeout_s):
            while True:
                leader = self.leader_id()
                if leader is not None and leader != self.id:
                    return leader
                epoch = await self.wait_role_change(epoch)
        raise RequestError(
            ErrorCode.TIMEOUT,
            f"leadership transfer to node {target} did not complete within {timeout_s:.1f} s",
        )

    async def _eligible_target(self, target: int | None, timeout_s: float) -> int:
        """The transfer target, once its clock says it may lead (a node that just started
        needs a moment to synchronize); waits up to ``timeout_s``.

        Raises:
            RequestError: CLOCK_NOT_SYNCHRONIZED when it does not within ``timeout_s``.
        """
        clock = self.timekeeper.clock
        poll_s = self.config.tick_ms / 1000
        with trio.move_on_after(timeout_s):
            while True:
                if target is None:
                    eligible = self.timekeeper.best_transfer_target(self.core)
                    if eligible is not None:
                        return int(eligible)
                elif (
                    target == self.id
                    or target not in self.core.membership.voters  # the core refuses it
                    or clock.peer_in_bound(target) is True
                ):
                    return target
                await trio.sleep(poll_s)
        if target is None:
            raise RequestError(
                ErrorCode.CLOCK_NOT_SYNCHRONIZED,
                "no other voter may lead now: none has reported a clock synchronized with "
                f"the cluster and within max_clock_offset_ms={self.config.max_clock_offset_ms}",
            )
        offset_us = clock.peer_offset_us(target)
        detail = (
            ""
            if offset_us is None
            else f"; its wall clock is {describe_offset(offset_us)} cluster time"
        )
        raise RequestError(
            ErrorCode.NODE_CLOCK_OUT_OF_BOUND,
            f"node {target} may not lead: its clock is not synchronized with the cluster or "
            f"is more than half of max_clock_offset_ms={self.config.max_clock_offset_ms} from "
            f"cluster time{detail}; fix its clock (NTP) first",
        )

    # --- the driver ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load the storage, then tick, step, persist, send and apply until cancelled.

        ``task_status.started()`` is called once the storage is loaded and the state
        machine restored. On exit every waiting caller fails with UNAVAILABLE.

        Raises:
            StorageError: the raft state on disk is unusable, or a write failed.
        """
        if self._running or self._stopped:
            raise RuntimeError("a RaftNode runs once; build a new one to restart")
        self._load()
        self._running = True
        compact_send, compact_receive = trio.open_memory_channel[Any](1)
        apply_send, apply_receive = trio.open_memory_channel[tuple[Entry, ...]](APPLY_QUEUE_BATCHES)
        self._apply_send = apply_send
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._applier, apply_receive)
                nursery.start_soon(self._ticker)
                nursery.start_soon(self._receiver)
                nursery.start_soon(self._compactor, compact_receive)
                nursery.start_soon(self._readiness_prober)
                task_status.started()
                await self._drive(compact_send)
        finally:
            self._stopped = True
            self._fail_all(
                RequestError(
                    ErrorCode.UNAVAILABLE,
                    "the raft node stopped; the outcome of this request is unknown",
                )
            )
            self._note_role()

    def _check_identity(self) -> tuple[int, bool]:
        """Check (or write) the data directory's stamp.

        Returns:
            ``(incarnation, new)``: ``new`` when the directory was never used before.

        Raises:
            ConfigError: the directory belongs to another cluster or another node.
        """
        storage = self._storage
        config = self.config
        found = storage.identity()
        if found is None:
            pristine = storage.is_pristine()
            incarnation = self._rng.getrandbits(63) or 1
            storage.stamp_identity(StoreIdentity(config.cluster_id, config.node_id, incarnation))
            if pristine:
                log.info(
                    "new data directory: node %d of cluster %r, incarnation %x; it votes once "
                    "every other voter has answered (a wiped directory looks the same)",
                    config.node_id,
                    config.cluster_id,
                    incarnation,
                )
            else:
                log.info("stamped the existing raft data of node %d: incarnation %x",
                         config.node_id, incarnation)  # fmt: skip
            return incarnation, pristine
        if found.cluster_id != config.cluster_id:
            raise ConfigError(
                f"the data directory belongs to cluster {found.cluster_id!r}, not "
                f"{config.cluster_id!r}; pass --cluster-id {found.cluster_id} or use another "
                "--data-dir"
            )
        if found.node_id != config.node_id:
            raise ConfigError(
                f"the data directory belongs to node {found.node_id}, not node "
                f"{config.node_id}; pass --node-id {found.node_id} or use another --data-dir"
            )
        if config.new_cluster:
            log.warning(
                "--initial-cluster-state new ignored: node %d's data directory was used "
                "before; it recovers as a member of an existing cluster",
                config.node_id,
            )
        return found.incarnation, False

    def _load(self) -> None:
        storage = self._storage
        self.incarnation, new_directory = self._check_identity()
        # Announced in every peer handshake: a second process running as this node id
        # (another data directory, so another incarnation) is then refused by peers.
        self._transport.set_incarnation(self.incarnation)
        if self.config.bootstrap_voters:
            storage.bootstrap(
                Membership(frozenset(NodeId(v) for v in self.config.bootstrap_voters))
            )
        metadata = storage.snapshot_metadata()
        if self._sm.applied_index < metadata.index:
            self._sm.restore(storage.snapshot().data, metadata.index)
        applied = self._sm.applied_index
        if applied > storage.last_index():
            raise StorageError(
                f"the state machine applied index {applied} is past the raft log's last index "
                f"{storage.last_index()}; the data directory is damaged"
            )
        hard_state = storage.hard_state()
        if applied > hard_state.commit:
            # Entries are applied only once committed; the commit index (unsynced) was lost.
            storage.set_hard_state(attrs.evolve(hard_state, commit=LogIndex(applied)))
        boot_id = self._rng.getrandbits(63) or 1
        self._core = RaftCore(
            self.config.raft_config(self.incarnation, boot_id, new_directory=new_directory),
            storage,
            self._rng,
            applied=LogIndex(applied),
        )
        self._note_recovery()

    async def _ticker(self) -> None:
        tick_s = self.config.tick_ms / 1000
        deadline = trio.current_time()
        while True:
            deadline += tick_s
            now = trio.current_time()
            if deadline < now:
                # After a stall, never fire a burst of ticks to catch up: a follower's
                # election timer must not run faster than real time, or the leader
                # lease (timekeeper.TimeConfig.lease_us) would not hold.
                deadline = now
            await trio.sleep_until(deadline)
            self._ticks_due += 1
            self._wake.set()

    async def _readiness_prober(self) -> None:
        """On a follower, ask the leader for its commit index every half election
        timeout (``ready_for_clients``: applied up to the leader's commit)."""
        interval_s = self.config.election_timeout_ticks * self.config.tick_ms / 2000
        sequence = 0
        while True:
            core = self._core
            if core is not None and core.role is not Role.LEADER and core.leader_id is not None:
                sequence += 1
                with contextlib.suppress(RequestError):  # queue full: probe next time
                    self._enqueue(
                        _Op("probe", _Waiter(), data=_PROBE_PREFIX + sequence.to_bytes(8, "big"))
                    )
            await trio.sleep(interval_s)

    async def _receiver(self) -> None:
        """Move peer messages into the inbox, everything that has arrived at once.

        Every ``receive`` is a scheduling point, so taking one message per wakeup would
        let this node take in only one message per pass of the event loop over all its
        tasks: on a busy machine (a slow pass) a leader, which hears from every
        follower, then falls behind, and its answers wait seconds in the channel and
        the socket buffers behind it (lease lost, clock samples too old, commits late).
        """
        limit = INBOX_LIMIT
        channel = self._transport.receive_channel
        inbox = self._inbox
        last_heard = self._last_heard_s
        async for message in channel:
            now = trio.current_time()
            last_heard[int(message.from_id)] = now
            self._take_in(message)
            while len(inbox) < limit:
                try:
                    message = channel.receive_nowait()
                except trio.WouldBlock:
                    break
                last_heard[int(message.from_id)] = now
                self._take_in(message)
            if inbox:
                self._wake.set()
            if len(inbox) >= limit:
                self._inbox_drained = trio.Event()
                await self._inbox_drained.wait()

    def _take_in(self, message: Message) -> None:
        """Queue a Raft message for the driver; answer or learn a clock message now.

        A clock sample measures the round trip, and anything that delays the answer
        (the driver waiting for an fsync, a long apply or snapshot) widens it: on a busy
        host every sample came back over the quarter-bound limit and the restarted
        nodes stayed unsynchronized, so no node could campaign, for over a minute
        (issue 15, seed 21). Answered here, a sample costs only the transport and
        the event loop. Neither reading moves outside the round trip: the ping is
        answered after it arrived, the pong is timed when it is taken in.
        """
        if not isinstance(message, CLOCK_MESSAGES):
            self._inbox.append(message)
            return
        answer = self.timekeeper.on_message(
            self.core, message, self._clock.monotonic_us(), self._clock.wall_us()
        )
        if answer is not None:
            self._transport.send(answer)

    async def _compactor(self, sources: trio.MemoryReceiveChannel[Any]) -> None:
        async for source in sources:
            try:
                data = await trio.to_thread.run_sync(source.serialize)
                await trio.to_thread.run_sync(self._storage.write_snapshot_file, source.index, data)
            except NoSpaceError as exc:
                if self._alarm is None:
                    raise
                self._alarm.trip(exc)
                log.warning("raft snapshot at %d not written (disk full); later", source.index)
                self._compacting = False
                continue
            finally:
                source.close()
            self._compaction_done = (int(source.index), data)
            self._wake.set()

    async def _drive(self, compact_send: trio.MemorySendChannel[Any]) -> None:
        core = self.core
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            self._feed(core)
            while core.has_ready():
                ready = core.ready()
                self.timekeeper.on_ready(ready, self._clock.monotonic_us())
                await self._handle_ready(ready)
                core.advance(ready)
            self._note_role()
            if core.recovering or self._was_recovering or core.removed_at is not None:
                self._note_recovery()
            self._maybe_start_compaction(compact_send)

    def _feed(self, core: RaftCore) -> None:
        ticks, self._ticks_due = self._ticks_due, 0
        mono_us = self._clock.monotonic_us() if ticks else 0
        wall_us = self._clock.wall_us() if ticks else 0
        for _ in range(ticks):
            core.tick()
            self._tick_time(core, mono_us, wall_us)
            if core.role is Role.LEADER:
                self._ticks_since_leading = 0
            else:
                self._ticks_since_leading += 1
        if (
            self._apply_waiters
            and core.role is not Role.LEADER
            and self._ticks_since_leading >= self._outcome_unknown_ticks()
        ):
            waiters, self._apply_waiters = self._apply_waiters, {}
            for index, waiter in waiters.items():
                waiter.fail(_outcome_unknown(index, "leadership was lost"))
        inbox = self._inbox
        while inbox:
            message = inbox.popleft()
            if isinstance(message, AppendEntries):
                self._leader_commit_seen = max(self._leader_commit_seen, message.leader_commit)
            elif isinstance(message, Heartbeat):
                self._leader_commit_seen = max(self._leader_commit_seen, message.commit)
            core.step(message)
        self._inbox_drained.set()
        if self._compaction_done is not None:
            index, data = self._compaction_done
            self._compaction_done = None
            self._compacting = False
            try:
                snapshot = core.compact(LogIndex(index), data)
                self._storage.compact(
                    snapshot, keep_entries=self.config.keep_entries_after_compaction
                )
                log.info(
                    "raft snapshot taken at index %d (%d bytes); log compacted", index, len(data)
                )
            except (ValueError, SnapshotOutOfDateError) as exc:
                log.info("raft snapshot at %d discarded: %s", index, exc)
                self._storage.remove_snapshot_file(index)
            except NoSpaceError as exc:
                if self._alarm is None:
                    raise
                self._alarm.trip(exc)
                log.warning("raft log not compacted at %d (disk full); later", index)
                self._storage.remove_snapshot_file(index)
        ops, self._ops = self._ops, []
        for op in ops:
            self._start_op(core, op)

    def _tick_time(self, core: RaftCore, mono_us: int, wall_us: int) -> None:
        """The timekeeper's duties of one tick: clock pings, who may lead (notices logged)."""
        messages, notices = self.timekeeper.on_tick(core, mono_us, wall_us)
        for message in messages:
            self._transport.send(message)
        for notice in notices:
            log.log(
                _LOG_LEVELS.get(notice.level, logging.INFO), "node %d: %s", self.id, notice.text
            )

    def _outcome_unknown_ticks(self) -> int:
        configured = self.config.outcome_unknown_ticks
        return 2 * self.config.election_timeout_ticks if configured is None else configured

    def _start_op(self, core: RaftCore, op: _Op) -> None:
        waiter = op.waiter
        try:
            if op.kind in ("propose", "durable"):
                index = core.propose(op.data)
                waiter.index, waiter.term = index, core.term
                waiters = self._durable_waiters if op.kind == "durable" else self._apply_waiters
                waiters[index] = waiter
            elif op.kind == "conf":
                assert op.change is not None
                index = core.propose_conf_change(op.change)
                waiter.index, waiter.term = index, core.term
                self._apply_waiters[index] = waiter
            elif op.kind == "read":
                if core.role is not Role.LEADER:
                    raise RaftNotLeaderError(core.leader_id)
                self._read_waiters[op.data] = waiter
                core.read_index(op.data)
            elif op.kind == "probe":
                # A follower asks the leader for its commit index (a forwarded ReadIndex,
                # thesis §6.4): /readyz waits until we applied that far.
                if core.role is not Role.LEADER and core.leader_id is not None:
                    core.read_index(op.data)
                waiter.resolve(None)
            else:
                core.transfer_leadership(NodeId(op.target))
                waiter.resolve(None)
        except RaftNotLeaderError:
            waiter.fail(self._not_leader())
        except (ProposalDroppedError, RequestError) as exc:
            waiter.fail(exc)

    async def _handle_ready(self, ready: Ready) -> None:
        send = self._transport.send
        for message in ready.leader_messages:
            # Replicate while our own fsync runs (thesis §10.2.1): the followers' writes
            # overlap ours, and the core counts us toward a quorum only after it.
            send(message)
        if ready.snapshot is not None or ready.entries or ready.hard_state is not None:
            started = trio.current_time()
            await self._persist(ready)
            if self._metrics is not None and ready.must_sync:
                self._metrics.fsync_seconds.observe(trio.current_time() - started)
                self._metrics.group_commit_items.observe(len(ready.entries))
        for entry in ready.entries:
            durable = self._durable_waiters.pop(entry.index, None)
            if durable is not None:
                if durable.term == entry.term:
                    durable.resolve(int(entry.index))
                else:
                    durable.fail(self._not_leader())
        for message in ready.messages:
            send(message)
        if ready.snapshot is not None:
            index = int(ready.snapshot.metadata.index)
            await self._wait_applied()  # the snapshot replaces everything applied so far
            started = time.monotonic()
            self._sm.restore(ready.snapshot.data, index)
            log.info(
                "installed a snapshot from the leader at index %d (%d bytes) in %.2f s",
                index,
                len(ready.snapshot.data),
                time.monotonic() - started,
            )
            for waiter_index in [i for i in self._apply_waiters if i <= index]:
                self._apply_waiters.pop(waiter_index).fail(
                    _outcome_unknown(waiter_index, "a snapshot from the new leader replaced it")
                )
        if ready.committed_entries:
            # Applied by the applier task, so the next persist (an fsync in a worker
            # thread) overlaps with applying this batch on the loop.
            self._apply_backlog += 1
            self._applied_all = trio.Event() if self._applied_all.is_set() else self._applied_all
            assert self._apply_send is not None
            await self._apply_send.send(ready.committed_entries)
        for read in ready.read_states:
            if read.request_ctx.startswith(_PROBE_PREFIX):
                self._leader_commit_seen = max(self._leader_commit_seen, int(read.index))
                self._probe_answered = True
                continue
            waiter = self._read_waiters.pop(read.request_ctx, None)
            if waiter is not None:
                self._reads_after_apply.append((int(read.index), waiter))
        self._resolve_reads()

    async def _persist(self, ready: Ready) -> None:
        """Store a Ready; on a full disk stop leading and retry once there is room.

        Nothing of the Ready that vouches for this node's disk (a vote, an
        AppendEntries answer, a client's answer) is sent until it is stored; followers
        elect another leader meanwhile (issue 10, "A full disk"). A leader's
        ``leader_messages`` have left already (thesis §10.2.1): a majority of followers
        may commit those entries without it, which is what the quorum rule allows.
        """
        while True:
            try:
                if ready.must_sync:
                    # Not cancellable: a synced write must finish. A quiet loop waits
                    # for it without the hop back through the loop (quick_thread).
                    if self._alarm is None:
                        await run_sync_quick(self._storage.persist, ready)
                    else:
                        async with self._alarm.writing():
                            await run_sync_quick(self._storage.persist, ready)
                else:
                    # Commit-index-only writes are unsynced and take microseconds: a
                    # thread hop would cost more than the write.
                    self._storage.persist(ready)
                break
            except NoSpaceError as exc:
                self._note_no_space(exc)
            await self._wait_for_space()
        if self._disk_full:
            self._disk_full = False
            self._note_role()

    def _note_no_space(self, exc: NoSpaceError) -> None:
        """A write found the disk full: raise the alarm and stop leading.

        Callers then wait with :meth:`_wait_for_space` *outside* their except block: the
        exception's traceback holds the write batch, which holds RocksDB open, and the
        alarm must be able to reopen it.
        """
        if self._alarm is None:
            raise exc
        self._alarm.trip(exc)
        if not self._disk_full:
            self._disk_full = True
            self._note_role()  # the broker stops leading; clients go elsewhere
            log.error("raft: the disk is full; not leading until there is room again")

    async def _wait_for_space(self) -> None:
        assert self._alarm is not None
        await self._alarm.wait_cleared()

    def _resolve_reads(self) -> None:
        """Answer the reads whose read index is applied now."""
        if self._reads_after_apply:
            applied = self._sm.applied_index
            remaining = []
            for index, waiter in self._reads_after_apply:
                if applied >= index:
                    waiter.resolve(None)
                else:
                    remaining.append((index, waiter))
            self._reads_after_apply = remaining

    async def _wait_applied(self) -> None:
        """Block until the applier has applied every batch handed to it."""
        while self._apply_backlog:
            await self._applied_all.wait()

    async def _applier(self, batches: trio.MemoryReceiveChannel[tuple[Entry, ...]]) -> None:
        async with batches:
            async for entries in batches:
                await self._apply(entries)
                self._apply_backlog -= 1
                if self._apply_backlog == 0:
                    self._applied_all.set()
                self._resolve_reads()
                self._note_role()  # the no-op of our term may just have been applied
                self._note_caught_up()  # /readyz of a follower under load

    async def _apply(self, entries: tuple[Entry, ...]) -> None:
        core = self.core
        sm = self._sm
        started = trio.current_time()
        waiters = self._apply_waiters
        for position, entry in enumerate(entries):
            if position % APPLY_SLICE_ENTRIES == APPLY_SLICE_ENTRIES - 1:
                # Let the dispatcher deliver what fell due while a big batch applies.
                await trio.lowlevel.checkpoint()
            index = int(entry.index)
            if entry.kind is EntryKind.NORMAL:
                error: RequestError | None = None
                result: Any = None
                mine = waiters.get(index) if waiters else None
                decoded = mine.decoded if mine is not None and mine.term == entry.term else None
                try:
                    result = await self._apply_one(index, entry.data, decoded)
                except RequestError as exc:  # pragma: no cover - apply should not refuse
                    error = exc
            else:
                while True:
                    try:
                        sm.apply_other(index)
                        break
                    except NoSpaceError as exc:
                        self._note_no_space(exc)
                    await self._wait_for_space()
                result, error = None, None
                if (
                    entry.kind is EntryKind.NOOP
                    and entry.term == core.term
                    and core.role is Role.LEADER
                ):
                    self._leader_ready_term = int(entry.term)
                    self.elections_won += 1
            waiter = waiters.pop(index, None) if waiters else None
            if waiter is not None:
                if waiter.term != entry.term:
                    # Another leader's entry won this index: ours was never applied.
                    waiter.fail(self._not_leader())
                elif error is not None:
                    waiter.fail(error)
                else:
                    waiter.resolve(result)
        if self._metrics is not None:
            self._metrics.apply_seconds.observe(trio.current_time() - started)

    async def _apply_one(self, index: int, data: bytes, decoded: Any = None) -> Any:
        """Apply one entry; in bounded steps when the state machine offers
        ``apply_steps`` (a generator), yielding to the loop between them; ``decoded``
        (the proposer's reading of ``data``, see :meth:`propose`) goes with them."""
        while True:
            try:
                apply_steps = getattr(self._sm, "apply_steps", None)
                if apply_steps is None:
                    return self._sm.apply(index, data)
                if decoded is None:
                    steps = apply_steps(index, data)
                else:
                    steps = apply_steps(index, data, decoded)
                while True:
                    try:
                        next(steps)
                    except StopIteration as done:
                        return done.value
                    await trio.lowlevel.checkpoint()
            except NoSpaceError as exc:
                # The state machine keeps the entry's changes; applying the same entry
                # again only writes them.
                self._note_no_space(exc)
            await self._wait_for_space()

    def _note_role(self) -> None:
        core = self._core
        now = (self.is_leader(), self.leader_id())
        if now == self._last_role:
            return
        was_leading = self._last_role[0] or bool(self._read_waiters)
        if now[1] != self._last_role[1]:
            self._probe_answered = False  # a new leader: learn its commit index again
        self._last_role = now
        self._role_epoch += 1
        self._role_event.set()
        self._role_event = trio.Event()
        if core is not None and core.role is not Role.LEADER and was_leading:
            # ReadIndex requests are dropped by the core when leadership changes.
            error = self._not_leader()
            for waiter in self._read_waiters.values():
                waiter.fail(error)
            self._read_waiters.clear()
            for _index, waiter in self._reads_after_apply:
                waiter.fail(error)
            self._reads_after_apply.clear()
            for waiter in self._durable_waiters.values():
                waiter.fail(_outcome_unknown(waiter.index, "leadership was lost"))
            self._durable_waiters.clear()

    def _note_recovery(self) -> None:
        """Log where recovery after this start stands (``docs/raft.md``, "Disk faults")."""
        core = self.core
        status = core.recovery_status()
        for finding in status.findings[self._findings_logged :]:
            log.warning("node %d data directory check: %s", self.id, finding)
        self._findings_logged = len(status.findings)
        if status.recovering and not self._was_recovering:
            log.info(
                "node %d is recovering after its start: no votes and no quorum counting "
                "until nodes %s answer",
                self.id,
                ", ".join(str(n) for n in status.waiting_for) or "of the cluster",
            )
        elif self._was_recovering and not status.recovering:
            floor = status.vote_floor
            log.info(
                "node %d finished recovery in term %d%s",
                self.id,
                core.term,
                ""
                if floor is None
                else f"; it votes only for logs at least at term "
                f"{floor[0]} index {floor[1]} until its own log gets there",
            )
        self._was_recovering = status.recovering
        if (
            status.removed_at is not None or status.foreign is not None
        ) and not self._removal_logged:
            self._removal_logged = True
            self._role_epoch += 1  # wake whoever waits on the role to notice the removal
            self._role_event.set()
            self._role_event = trio.Event()

    def recovering(self) -> bool:
        """Whether this node is still recovering after its start (no votes, not counted)."""
        return self._core is not None and self._core.recovering

    def removed_at(self) -> int | None:
        """The log index at which a member said this node was removed, or None."""
        core = self._core
        return None if core is None or core.removed_at is None else int(core.removed_at)

    def foreign_directory(self) -> str | None:
        """Why this node's data directory is not the one the cluster knows while it holds
        a log (``RecoveryStatus.foreign``): the node must stop; None otherwise."""
        core = self._core
        return None if core is None else core.recovery_status().foreign

    def _maybe_start_compaction(self, compact_send: trio.MemorySendChannel[Any]) -> None:
        if self._compacting or self._compaction_done is not None:
            return
        if self._alarm is not None and self._alarm.raised:
            return  # no snapshot view while the database may need reopening
        applied = self._sm.applied_index
        last_snapshot = int(self._storage.snapshot_metadata().index)
        if applied - last_snapshot < self.config.compact_every_entries:
            return
        source = self._sm.snapshot_source()
        try:
            compact_send.send_nowait(source)
        except trio.WouldBlock:  # pragma: no cover - _compacting guards the single slot
            source.close()
            return
        self._compacting = True

    def _fail_all(self, error: RequestError) -> None:
        for op in self._ops:
            op.waiter.fail(error)
        self._ops.clear()
        for waiters in (self._apply_waiters, self._durable_waiters, self._read_waiters):
            for waiter in waiters.values():
                waiter.fail(error)
            waiters.clear()
        for _index, waiter in self._reads_after_apply:
            waiter.fail(error)
        self._reads_after_apply.clear()


__all__ = [
    "RaftNode",
    "RaftNodeConfig",
    "SnapshotSource",
    "StateMachine",
]
