"""A node's time duties around its RaftCore: clock samples, the leader lease, who may lead.

Sans-IO like the core: every clock reading is passed in (integer microseconds), so the
trio driver (:mod:`futureq.raft.node`) and the simulation drive the same code.

* **Clock samples.** Every ``ping_every_ticks`` ticks (200 ms by default) the node pings every other member
  (:class:`~futureq.raft.messages.ClockPing`); a ping is answered at once with the
  wall clock (:class:`~futureq.raft.messages.ClockPong`), a pong feeds the
  :class:`~futureq.raft.cluster_clock.ClusterClock`.
* **Who may lead.** ``core.campaign_allowed`` follows the clock's ``in_bound``: a node
  whose clock is unsynchronized or outside the bound neither campaigns nor answers
  TimeoutNow. A leader that leaves the bound hands leadership to a peer that says it is
  in bound, or steps down when there is none; with an owner that records the
  deliveries out (``TimeKeeper.handover_grace_us``) it first waits for that, briefly.
* **The leader lease** (Raft thesis §6.4.1). The leader dispatches only while it holds
  a lease: a majority of voters answered a heartbeat round sent less than
  :attr:`TimeConfig.lease_us` ago (measured on the leader's monotonic clock from when
  the round was *sent*). See :class:`LeaderLease` for why no other leader can exist
  meanwhile. During a leadership transfer the lease does not count (the target may win
  at once), and a transfer that does not complete ends this leadership: the node steps
  down, so that a TimeoutNow delivered late cannot make a second dispatcher.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import attrs

from futureq.errors import ConfigError
from futureq.raft.cluster_clock import ClockConfig, ClockNotice, ClusterClock
from futureq.raft.messages import ClockPing, ClockPong, Heartbeat, Message, NodeId
from futureq.raft.roles import Role

if TYPE_CHECKING:
    from futureq.raft.core import RaftCore
    from futureq.raft.messages import Ready

PPM = 1_000_000
HOLDOVER_DRIFT_PPM = 500
"""The monotonic clock's rate error assumed when an agreement is carried forward without
new samples (NTP's limit; real quartz is within 100): with the default bound of 500 ms an
agreement stays usable for 250 s, so two live nodes of three, one with a wrong clock,
keep a leader that long."""
MAX_ROUNDS_KEPT = 4096
"""Heartbeat rounds remembered while waiting for a majority to answer them."""


@attrs.frozen
class TimeConfig:
    """Timing of a :class:`TimeKeeper`.

    Attributes:
        clock: The cluster clock's bound and windows.
        tick_us: Length of one Raft tick (µs).
        election_timeout_ticks: The Raft election timeout T (ticks); followers wait at
            least T ticks after hearing from a leader before they vote for another.
        ping_every_ticks: Ticks between two rounds of clock pings.
        max_drift_ppm: Largest rate difference between two nodes' monotonic clocks the
            lease allows for (parts per million; 10,000 = 1 %, far above real quartz).
    """

    clock: ClockConfig
    tick_us: int
    election_timeout_ticks: int
    ping_every_ticks: int = 4
    max_drift_ppm: int = 10_000

    def __attrs_post_init__(self) -> None:
        if self.election_timeout_ticks < 3:
            raise ConfigError(
                f"election_timeout_ticks={self.election_timeout_ticks} leaves no leader lease; "
                "it must be >= 3"
            )
        if self.tick_us < 1 or self.ping_every_ticks < 1:
            raise ConfigError("tick_us and ping_every_ticks must be >= 1")
        if not 0 <= self.max_drift_ppm < PPM:
            raise ConfigError(f"max_drift_ppm={self.max_drift_ppm} must be in [0, 1000000)")

    @property
    def lease_us(self) -> int:
        """How long a heartbeat round answered by a majority lets the leader dispatch.

        ``(T - 2)`` ticks, less the drift allowance. A follower that answered the round
        at time ``r`` (after it was sent) counts T ticks before it votes for another
        candidate or campaigns; its ticker fires at most ``x / tick + 2`` times in any
        span ``x`` (it never bursts to catch up), so that takes at least ``(T - 2)``
        ticks of its monotonic clock, which runs at most ``max_drift_ppm`` slower than
        ours.
        """
        ticks_us = (self.election_timeout_ticks - 2) * self.tick_us
        return ticks_us * (PPM - self.max_drift_ppm) // PPM

    @classmethod
    def for_raft(
        cls, tick_ms: int, election_timeout_ticks: int, max_clock_offset_ms: int
    ) -> TimeConfig:
        """The timing a real node uses: clock windows scale with the election timeout.

        Args:
            tick_ms: Raft tick (ms).
            election_timeout_ticks: Raft election timeout (ticks).
            max_clock_offset_ms: The stated bound (``cluster.max_clock_offset_ms``).
        """
        election_us = tick_ms * election_timeout_ticks * 1000
        max_offset_us = max_clock_offset_ms * 1000
        window_max_us = 10 * election_us
        return cls(
            clock=ClockConfig(
                max_offset_us=max_offset_us,
                window_min_us=election_us,
                window_max_us=window_max_us,
                # An agreement stays good while the monotonic clock carries it: at
                # HOLDOVER_DRIFT_PPM it moves a quarter of the bound in this long.
                epoch_max_us=max(window_max_us, max_offset_us // 4 * PPM // HOLDOVER_DRIFT_PPM),
            ),
            tick_us=tick_ms * 1000,
            election_timeout_ticks=election_timeout_ticks,
        )


class LeaderLease:
    """When the leader's lease runs out (Raft thesis §6.4.1).

    The driver records when each heartbeat round was sent (:meth:`round_sent`, with the
    leader's monotonic clock when the Ready holding it was taken, before it was
    written or sent: never later than the real send). The core reports the latest
    round a majority of voters answered (``RaftCore.quorum_heartbeat_round``); the
    lease runs until that round's send time plus ``duration_us``.

    Why no other leader can exist before then: each voter of that majority received the
    round after it was sent, reset its election timer, and (CheckQuorum's leader
    stickiness, thesis §4.2.3) neither votes for another candidate nor campaigns for T
    ticks, longer than ``duration_us`` (:attr:`TimeConfig.lease_us`). A restarted voter
    keeps the same quiet period (``RaftCore``). Any new leader needs the vote of one of
    them. Only a leadership transfer skips the stickiness, and the leader gives up its
    lease for good when it starts one (:class:`TimeKeeper`).

    Args:
        duration_us: The lease length (:attr:`TimeConfig.lease_us`).
    """

    def __init__(self, duration_us: int) -> None:
        self.duration_us = duration_us
        self._term = -1
        self._sent: deque[tuple[int, int]] = deque(maxlen=MAX_ROUNDS_KEPT)
        """``(round, mono_us)`` of the rounds not yet answered by a majority, in order."""

    def round_sent(self, term: int, round_number: int, mono_us: int) -> None:
        """Heartbeat round ``round_number`` of ``term`` left at (or after) ``mono_us``."""
        if term != self._term:
            self._term = term
            self._sent.clear()
        if not self._sent or round_number > self._sent[-1][0]:
            self._sent.append((round_number, mono_us))  # rounds only grow within a term

    def expiry_us(self, term: int, quorum_round: int | None) -> int | None:
        """When the lease runs out (monotonic µs), or None without an answered round.

        Args:
            term: The leader's current term.
            quorum_round: ``RaftCore.quorum_heartbeat_round()``.
        """
        if term != self._term or not quorum_round:
            return None
        sent = self._sent
        while len(sent) > 1 and sent[1][0] <= quorum_round:
            sent.popleft()  # answered rounds older than the newest answered one
        if not sent or sent[0][0] > quorum_round:
            return None  # forgotten (too many unanswered rounds) or never noted
        return sent[0][1] + self.duration_us


class TimeKeeper:
    """Clock samples, the leader lease and leadership eligibility of one node.

    Args:
        node_id: This node's id.
        config: Timing.
        mono_us: The monotonic clock now (µs).
        wall_us: The wall clock now (µs since the Unix epoch).
    """

    def __init__(self, node_id: int, config: TimeConfig, *, mono_us: int, wall_us: int) -> None:
        self.id = NodeId(node_id)
        self.config = config
        self.clock = ClusterClock(node_id, config.clock, mono_us=mono_us, wall_us=wall_us)
        self.lease = LeaderLease(config.lease_us)
        self._ticks = 0
        self._transfer_term: int | None = None
        self.handover_grace_us = 0
        """How long a leader whose clock left the bound waits, before it hands leadership
        over or steps down, for its owner to record the deliveries out
        (:meth:`handover_recorded`); 0: it does not wait (nobody records them). Set by
        the owner that watches :attr:`handover_wanted`."""
        self.handover_wanted: int | None = None
        """The term in which this leader's clock left the bound and it waits to give up
        leadership once the deliveries out are recorded (:attr:`handover_grace_us`), or
        None. It dispatches nothing meanwhile (its clock is out of bound)."""
        self._handover_deadline_us = 0
        self._handover_recorded_term: int | None = None

    def on_tick(
        self, core: RaftCore, mono_us: int, wall_us: int
    ) -> tuple[list[Message], list[ClockNotice]]:
        """Call after every ``core.tick()`` (no Ready outstanding).

        Returns:
            ``(messages to send, notices to log)``: clock pings every
            ``ping_every_ticks`` ticks; notices from the clock and about leadership.
        """
        membership = core.membership
        clock = self.clock
        clock.set_voters(membership.voters)
        clock.leading = core.role is Role.LEADER
        notices = clock.tick(mono_us, wall_us)
        core.campaign_allowed = clock.in_bound
        core.votes_refused = frozenset(
            peer
            for peer in membership.voters
            if peer != self.id and clock.peer_clock_refused(peer, clock.config.max_offset_us)
        )
        self._enforce(core, notices, mono_us)
        self._ticks += 1
        messages: list[Message] = []
        if self._ticks % self.config.ping_every_ticks == 0:
            messages = [
                ClockPing(core.term, self.id, peer, mono_us)
                for peer in membership.members()
                if peer != self.id
            ]
        return messages, notices

    def on_message(
        self, core: RaftCore, message: ClockPing | ClockPong, mono_us: int, wall_us: int
    ) -> ClockPong | None:
        """A clock message arrived: a ping is answered (the pong to send), a pong learned."""
        if isinstance(message, ClockPing):
            return ClockPong(
                core.term, self.id, message.from_id, message.mono_us, wall_us, self.clock.in_bound
            )
        self.clock.learn(
            message.from_id, message.ping_mono_us, message.wall_us, mono_us, message.in_bound
        )
        return None

    def on_ready(self, ready: Ready, mono_us: int) -> None:
        """Call right after ``core.ready()``: note when each heartbeat round leaves."""
        for message in ready.leader_messages + ready.messages:
            if isinstance(message, Heartbeat):
                self.lease.round_sent(message.term, message.read_seq, mono_us)

    def lease_expiry_us(self, core: RaftCore) -> int | None:
        """When this leader's lease runs out (monotonic µs), or None without one."""
        if core.role is not Role.LEADER:
            return None
        return self.lease.expiry_us(core.term, core.quorum_heartbeat_round())

    def dispatch_refusal(self, core: RaftCore, mono_us: int) -> str | None:
        """Why this node may not hand out messages now (a sentence), or None if it may.

        It may while it leads, its clock is in bound (and not standing stepped together
        with the others': ``ClusterClock.release_refusal``), no leadership transfer is
        under way or failed in this term, and it holds the lease (always, with a single voter
        or without CheckQuorum, which the lease argument needs).
        """
        if core.role is not Role.LEADER:
            return "this node is not the leader"
        if core.lead_transferee is not None or self._transfer_term == core.term:
            return "leadership is being handed to another node"
        refusal = self.clock.refusal() or self.clock.release_refusal()
        if refusal is not None:
            return refusal
        voters = core.membership.voters
        if voters <= {self.id} or not core.config.check_quorum:
            return None
        expiry = self.lease_expiry_us(core)
        if expiry is None or mono_us >= expiry:
            return "the leader has not heard from a majority within its lease"
        return None

    def can_dispatch(self, core: RaftCore, mono_us: int) -> bool:
        """Whether this node may hand out messages now (:meth:`dispatch_refusal` is None)."""
        return self.dispatch_refusal(core, mono_us) is None

    def best_transfer_target(self, core: RaftCore) -> NodeId | None:
        """The most up-to-date voter that says it may lead (and is not recovering after a
        restart, ``docs/raft.md``, "Disk faults"), or None (leader only).

        Voters that answered this leader within the last two election timeouts (the
        CheckQuorum marks, thesis §6.2) come first: a voter that stopped keeps the match
        index it had, and one down was chosen on a tie (the lowest id), so a leader's
        graceful stop waited out the transfer and left the cluster to an election.
        """
        best: tuple[bool, int, int] | None = None
        for node_id, pr in sorted(core.progress.items()):
            if node_id == self.id or node_id not in core.membership.voters or pr.peer_recovering:
                continue
            if self.clock.peer_in_bound(node_id) is not True or self.clock.peer_clock_refused(
                node_id
            ):
                continue
            answering = pr.recent_active or pr.was_active
            candidate = (answering, int(pr.match), -int(node_id))
            if best is None or candidate > best:
                best = candidate
        return None if best is None else NodeId(-best[2])

    def handover_recorded(self, term: int) -> None:
        """The owner recorded the deliveries out in ``term`` (or gave up trying): a
        leader waiting in :attr:`handover_wanted` hands over at its next tick."""
        if self.handover_wanted == term:
            self._handover_recorded_term = term

    def _enforce(self, core: RaftCore, notices: list[ClockNotice], mono_us: int) -> None:
        if core.role is not Role.LEADER or self.handover_wanted not in (None, int(core.term)):
            self.handover_wanted = None
        if core.role is not Role.LEADER:
            return
        if core.lead_transferee is not None:
            self._transfer_term = int(core.term)
            return
        if self._transfer_term == core.term:
            notices.append(
                ClockNotice(
                    "warning",
                    "the leadership transfer did not complete; stepping down so that the "
                    "cluster elects a leader (a transfer ends this leader's lease)",
                )
            )
            core.step_down()
            return
        if self.clock.in_bound:
            self.handover_wanted = None
            self._handover_recorded_term = None  # what goes out from now is not recorded
            return
        reason = self.clock.refusal()
        if self.handover_grace_us > 0 and self._handover_recorded_term != core.term:
            # A consumer holding a delivery across the step kept it until its
            # visibility deadline only when the leader recorded it (HANDED_OUT), as a
            # transfer or a stop does; handed over at once, the next leader pushed it
            # again at once, with the same attempt number (breaker run).
            if self.handover_wanted is None:
                self.handover_wanted = int(core.term)
                self._handover_deadline_us = mono_us + self.handover_grace_us
                notices.append(
                    ClockNotice(
                        "error",
                        f"{reason}; recording the deliveries out before giving up leadership",
                    )
                )
                return
            if mono_us < self._handover_deadline_us:
                return
        self.handover_wanted = None
        target = self.best_transfer_target(core)
        if target is not None:
            notices.append(ClockNotice("error", f"{reason}; handing leadership to node {target}"))
            core.transfer_leadership(target)
            self._transfer_term = int(core.term)
        else:
            notices.append(
                ClockNotice("error", f"{reason}; stepping down (no other node may lead now)")
            )
            core.step_down()


__all__ = ["LeaderLease", "TimeConfig", "TimeKeeper"]
