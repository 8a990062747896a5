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

This module holds the :class:`RaftNode`: its state, its views, the CommandLog and client
operations and the role and recovery notes. The rest are plain functions over it:

* :mod:`~futureq.raft.node_driver`: loading, the driver loop and the tasks feeding it;
* :mod:`~futureq.raft.node_ready`: persisting, sending and applying a Ready;
* :mod:`~futureq.raft.node_ops`: the queued operations and their waiters;
* :mod:`~futureq.raft.node_config`: :class:`RaftNodeConfig` and the state machine seam.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from typing import TYPE_CHECKING, Any

import trio

from futureq import request_order
from futureq.clock import SystemClock
from futureq.errors import (
    ErrorCode,
    NotLeaderError,
    RequestError,
)
from futureq.raft import election, node_driver, node_ready
from futureq.raft.basics import majority
from futureq.raft.cluster_clock import describe_offset
from futureq.raft.core import RaftCore
from futureq.raft.leader import voters_after
from futureq.raft.messages import (
    Message,
    NodeId,
)
from futureq.raft.node_config import RaftNodeConfig, SnapshotSource, StateMachine
from futureq.raft.node_ops import Op, Waiter, outcome_unknown
from futureq.raft.quorum import has_quorum
from futureq.raft.roles import Role
from futureq.raft.timekeeper import TimeKeeper
from futureq.raft.values import ConfChange, ConfChangeOp, Entry, Membership

if TYPE_CHECKING:
    from futureq.clock import MicroClock
    from futureq.metrics import Metrics
    from futureq.raft.rocks_storage import RocksStorage
    from futureq.raft.transport import Transport
    from futureq.storage.space import SpaceAlarm

log = logging.getLogger(__name__)


APPLY_QUEUE_BATCHES = 64
"""Committed batches waiting for the applier before persisting waits for it."""
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
        self._ops: list[Op] = []
        self._apply_waiters: dict[int, Waiter] = {}
        self._durable_waiters: dict[int, Waiter] = {}
        self._read_waiters: dict[bytes, Waiter] = {}
        self._reads_after_apply: list[tuple[int, Waiter]] = []
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
        """The leader of the current term as far as this node knows, or None: None too
        on a follower that has not heard from it for two election timeouts.

        A follower that may not campaign (its clock out of the bound, a learner, a node
        recovering) kept the leader it last heard for good: with that leader and the
        other voters stopped, its /readyz answered 200, cluster status named the dead
        leader and clients were sent to it (found by a tester). One that may campaign
        has campaigned by then (its timeout is drawn below two election timeouts), which
        forgets the leader in the core as well.
        """
        core = self._core
        if core is None or self._stopped:
            return None
        if self._disk_full and core.leader_id == self.id:
            return None  # we cannot write: not a leader to send clients to
        if (
            core.role is not Role.LEADER
            and core._election_elapsed >= 2 * self.config.election_timeout_ticks
        ):
            return None
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

    def link_refusals(self) -> dict[int, str]:
        """Why this node's Raft link to each peer is refused now, by node id (a
        sentence; :meth:`~futureq.raft.transport.Transport.link_refusals`), and, while
        this node is a member, each member that took its connection but opens none back
        (:meth:`~futureq.raft.transport.Transport.one_way_links`)."""
        refusals = self._transport.link_refusals()
        core = self._core
        if core is None:
            return refusals
        members = core.membership.members()
        if self.id not in members:
            return refusals  # a joiner: members do not talk to it yet
        for peer, connected_s in self._transport.one_way_links().items():
            if peer in members:
                # A node moved to another Raft address reached its peers, which still
                # dialled its old one: it said only that it waited for them to answer
                # (found by a tester).
                refusals[peer] = (
                    f"node {peer} takes this node's Raft connection but has not connected "
                    f"back in {connected_s:.0f} s, as every member does to ping: it dials "
                    "another address for this node, or cannot reach it; this node's Raft "
                    f"address is {self._transport.advertise_address}: correct this node's "
                    f"entry in node {peer}'s --peers"
                )
        return refusals

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
        if core is None or self._stopped or self.leader_id() is None or core.recovering:
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

    def _enqueue(self, op: Op) -> None:
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
        waiter = Waiter(decoded)
        op = Op("propose", waiter, data=command)
        # The ops run in order; a waiter queued by the request ahead is woken once, here.
        await request_order.in_turn(lambda: self._enqueue(op), done=waiter.done)
        if not waiter.done.is_set():  # set: in_turn waited for it (one wake-up)
            await waiter.done.wait()
        return waiter.outcome()

    async def propose_durable(self, command: bytes) -> int:
        """Append ``command`` and return its log index once persisted on this leader.

        The entry is not yet committed: it may still be lost if leadership changes.

        Raises:
            NotLeaderError, RequestError: as :meth:`propose`.
        """
        self._check_can_lead()
        waiter = Waiter()
        op = Op("durable", waiter, data=command)
        await request_order.in_turn(lambda: self._enqueue(op), done=waiter.done)
        if not waiter.done.is_set():
            await waiter.done.wait()
        index: int = waiter.outcome()
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
        waiter = Waiter()
        self._enqueue(Op("read", waiter, data=self._read_seq.to_bytes(8, "big")))
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
            self._check_clocks_after(ConfChange(op, NodeId(node_id)))
            waiter = Waiter()
            self._enqueue(Op("conf", waiter, change=ConfChange(op, NodeId(node_id))))
            await waiter.wait()

    def _check_clocks_after(self, change: ConfChange) -> None:
        """Refuse a change whose voters would not hold a majority of clocks in bound.

        A majority of the voters' clocks must agree for any node to lead (``docs/
        architecture.md``, "Time"). With node 3's wall clock 5 minutes fast, removing node
        2, a healthy voter, left voters 1 and 3, whose clocks never agreed: once the last
        agreement ran out (250 s at the default bound) the leader stepped down and nothing
        could lead until node 3's clock was fixed (breaker run). Like ``QUORUM_AT_RISK``
        for voters not heard from (``raft/leader.py``), counted here because the clock
        samples are the driver's, not the core's. Only evidence refuses: a voter whose
        wall clock this leader measured further than half the bound from cluster time
        (less the sample's uncertainty). One not measured yet, or not yet saying it is in
        bound (a node promoted a moment ago synchronizes within an election timeout),
        counts as good: refusing on its silence stopped ordinary membership changes.

        Raises:
            RequestError: QUORUM_AT_RISK, naming the voters whose clocks are off.
        """
        after = voters_after(self.core, change)
        if after is None:
            return
        clock = self.timekeeper.clock
        off = {voter for voter in after if voter != self.id and clock.peer_clock_off(voter)}
        if has_quorum(after, after - off):
            return
        action = "removing" if change.op is ConfChangeOp.REMOVE_NODE else "promoting"
        raise RequestError(
            ErrorCode.QUORUM_AT_RISK,
            f"{action} node {change.node_id} would leave voters {sorted(int(n) for n in after)}, "
            f"of which node(s) {sorted(int(n) for n in off)} have wall clocks further than "
            f"half of max_clock_offset_ms={self.config.max_clock_offset_ms} from cluster "
            f"time: fewer than a majority ({majority(len(after))} of {len(after)}) of clocks "
            "would be left to agree on cluster time, and no node could lead once the last "
            "agreement ran out. Fix those clocks (NTP) first",
        )

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
                synchronized and in bound within ``timeout_s``, or this node measures it
                past half its own bound (``ClusterClock.peer_clock_refused``; for None:
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
        waiter = Waiter()
        self._enqueue(Op("transfer", waiter, target=target))
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
                    or (
                        clock.peer_in_bound(target) is True and not clock.peer_clock_refused(target)
                    )
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
        node_driver.load(self)
        self._running = True
        compact_send, compact_receive = trio.open_memory_channel[Any](1)
        apply_send, apply_receive = trio.open_memory_channel[tuple[Entry, ...]](APPLY_QUEUE_BATCHES)
        self._apply_send = apply_send
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(node_ready.applier, self, apply_receive)
                nursery.start_soon(node_driver.ticker, self)
                nursery.start_soon(node_driver.receiver, self)
                nursery.start_soon(node_driver.compactor, self, compact_receive)
                nursery.start_soon(node_driver.readiness_prober, self)
                task_status.started()
                await node_driver.drive(self, compact_send)
        finally:
            self._stopped = True
            node_driver.fail_all(
                self,
                RequestError(
                    ErrorCode.UNAVAILABLE,
                    "the raft node stopped; the outcome of this request is unknown",
                ),
            )
            self._note_role()

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
                waiter.fail(outcome_unknown(waiter.index, "leadership was lost"))
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

    def recovery_waiting_for(self) -> list[int]:
        """The voters this node still waits to hear from before it votes and counts
        (ascending node ids); empty once it finished recovery."""
        core = self._core
        if core is None or not core.recovering:
            return []
        return sorted(int(n) for n in core.recovery_status().waiting_for)

    def last_campaign(self) -> dict[str, Any] | None:
        """While no leader is known, what this node's last campaign got (a map:
        ``pre_vote`` bool, ``term``, ``needed`` votes, and ``granted``, ``refused`` and
        ``silent`` voter ids, ascending; :class:`~futureq.raft.election.CampaignStatus`);
        None once a leader is known, or if it has not campaigned since it last heard one."""
        core = self._core
        if core is None or core.leader_id is not None:
            return None
        status = election.campaign_status(core)
        if status is None:
            return None
        return {
            "pre_vote": status.pre_vote,
            "term": int(status.term),
            "needed": status.needed,
            "granted": [int(n) for n in status.granted],
            "refused": [int(n) for n in status.refused],
            "silent": [int(n) for n in status.silent],
        }

    def removed_at(self) -> int | None:
        """The log index at which a member said this node was removed, or None."""
        core = self._core
        return None if core is None or core.removed_at is None else int(core.removed_at)

    def foreign_directory(self) -> str | None:
        """Why this node's data directory is not the one the cluster knows while it holds
        a log (``RecoveryStatus.foreign``): the node must stop; None otherwise."""
        core = self._core
        return None if core is None else core.recovery_status().foreign


# RaftNodeConfig's home is node_config; it is named here too, as docs/raft.md builds a
# RaftNode with it.
__all__ = [
    "RaftNode",
    "RaftNodeConfig",
    "SnapshotSource",
    "StateMachine",
]
