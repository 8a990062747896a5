"""Wall-clock steps and drift against whole nodes (RaftCore + TimeKeeper), sans-IO.

A machine's wall clock can step (an operator, NTP's ``makestep``, a VM resumed and
corrected) on every node at once or on one node, forwards or back. The fault runs saw
every process of a sharded cluster see the machine's clock step +36 s, then no leader
for minutes. This file pins down what the time code must do, with production timing
(``TimeConfig.for_raft(50, 10, 500)``: 50 ms ticks, election timeout 10 ticks, bound
500 ms), in a lock-step cluster where every message arrives one tick after it was sent
(a 50 ms round trip):

* all nodes step: a leader that may dispatch again within :data:`RECOVERY_US` (below),
  cluster time never goes backwards on any node, and it follows the wall clocks the
  majority agrees on (forwards at once, backwards by holding still);
* one node steps: that node alone leaves the bound at once and says why, the others
  never stop, and it comes back within :data:`RECOVERY_US` of its clock being fixed;
* drift: all wall clocks drifting together within the slew limit keep the leader; one
  drifting away is flagged once it is past half of the bound.

The bound: a step is seen at the next tick. The window open at the step may still hold
pre-step samples (per peer the shortest round trip is kept), so its agreement can be the
old one; the next window (``window_min_us`` = one election timeout) holds only samples
taken after the step: a new agreement within two windows plus a ping period and a round
trip. A node that led steps down within one election timeout of leaving the bound (a
failed transfer ends its leadership) and a new election needs at most two election
timeouts (randomised timeout, pre-vote). Then the lease: a heartbeat round answered.
"""

from __future__ import annotations

import random
from collections import deque

import pytest
from raft_helpers import drain_timed

from futureq.raft.core import RaftConfig, RaftCore
from futureq.raft.messages import CLOCK_MESSAGES, Message, NodeId
from futureq.raft.roles import Role
from futureq.raft.storage import MemoryStorage
from futureq.raft.timekeeper import TimeConfig, TimeKeeper
from futureq.raft.values import Membership

MS = 1000
S = 1_000_000
EPOCH_US = 1_800_000_000 * S
"""True wall time (µs since the Unix epoch) at true time 0."""
TIME = TimeConfig.for_raft(tick_ms=50, election_timeout_ticks=10, max_clock_offset_ms=500)
TICK_US = TIME.tick_us
ELECTION_US = TIME.election_timeout_ticks * TICK_US
PING_US = TIME.ping_every_ticks * TICK_US
HALF_BOUND_US = TIME.clock.max_offset_us // 2
RECOVERY_US = 2 * TIME.clock.window_min_us + PING_US + 2 * TICK_US + 4 * ELECTION_US
"""Longest time from a step (or the fix of a stepped clock) to a node that may dispatch:
two windows, a ping period and a round trip for the agreement, then a step-down and an
election (module docstring). 3.3 s with the defaults: seconds, never minutes."""


class Machine:
    """One node: its clocks (wall = true + offset + drift, monotonic = true + origin),
    a RaftCore over memory storage and its TimeKeeper."""

    def __init__(self, node_id: int, voters: range) -> None:
        self.id = NodeId(node_id)
        self.mono_origin_us = node_id * 1000 * S  # every machine's monotonic clock differs
        self.wall_offset_us = 0
        self.wall_drift_ppm = 0
        self.drift_since_us = 0
        self.storage = MemoryStorage(Membership(frozenset(NodeId(v) for v in voters)))
        self.core = RaftCore(
            RaftConfig(node_id=self.id, election_timeout_ticks=TIME.election_timeout_ticks),
            self.storage,
            random.Random(node_id),
        )
        self.keeper = TimeKeeper(node_id, TIME, mono_us=self.mono(0), wall_us=self.wall(0))
        self.last_now_us = 0

    def mono(self, true_us: int) -> int:
        return self.mono_origin_us + true_us

    def wall(self, true_us: int) -> int:
        drifted = (true_us - self.drift_since_us) * self.wall_drift_ppm // 1_000_000
        return EPOCH_US + true_us + self.wall_offset_us + drifted

    def drift(self, true_us: int, ppm: int) -> None:
        """From now on the wall clock runs ``ppm`` fast (negative: slow), without a jump."""
        self.wall_offset_us = self.wall(true_us) - EPOCH_US - true_us
        self.drift_since_us = true_us
        self.wall_drift_ppm = ppm

    def drain(self, true_us: int) -> list[Message]:
        return drain_timed(self.core, self.keeper, self.storage, self.mono(true_us))


class Cluster:
    """Machines in lock step: a message sent during one tick arrives at the next."""

    def __init__(self, size: int = 3) -> None:
        self.true_us = 0
        self.machines = {NodeId(i): Machine(i, range(1, size + 1)) for i in range(1, size + 1)}
        self.in_flight: list[tuple[int, Message]] = []
        """``(tick it arrives at, message)``."""
        self.ticks = 0
        self.clock_delay_ticks = 0
        """Extra ticks every clock ping and pong spends on the way (a loaded machine)."""
        self.notices: list[tuple[int, str]] = []
        self.reference_shift_us = 0
        """How far the clocks every node agrees with moved from true time (all-node steps)."""

    def step(self) -> None:
        """One tick: deliver what was sent last tick, tick every node, check time."""
        self.true_us += TICK_US
        self.ticks += 1
        queue: deque[Message] = deque(m for due, m in self.in_flight if due <= self.ticks)
        self.in_flight = [(due, m) for due, m in self.in_flight if due > self.ticks]
        sent: list[Message] = []
        for machine in self.machines.values():
            machine.core.tick()
            messages, notices = machine.keeper.on_tick(
                machine.core, machine.mono(self.true_us), machine.wall(self.true_us)
            )
            self.notices += [(int(machine.id), n.text) for n in notices]
            sent += messages + machine.drain(self.true_us)
        while queue:
            message = queue.popleft()
            target = self.machines[message.to_id]
            if isinstance(message, CLOCK_MESSAGES):
                answer = target.keeper.on_message(
                    target.core, message, target.mono(self.true_us), target.wall(self.true_us)
                )
                if answer is not None:
                    sent.append(answer)
                continue
            target.core.step(message)
            sent += target.drain(self.true_us)
        for message in sent:
            slow = self.clock_delay_ticks if isinstance(message, CLOCK_MESSAGES) else 0
            self.in_flight.append((self.ticks + 1 + slow, message))
        self._check_time()

    def _check_time(self) -> None:
        """Cluster time never goes backwards; at most one node may dispatch, and its
        cluster time is within half of the bound of the clocks the cluster agrees on, or
        (after every clock stepped back) held at a time it had reached already."""
        dispatching = []
        for machine in self.machines.values():
            mono = machine.mono(self.true_us)
            now = machine.keeper.clock.now_us(mono)
            assert now >= machine.last_now_us, f"node {machine.id}'s cluster time went back"
            held = now == machine.last_now_us
            machine.last_now_us = now
            if machine.keeper.can_dispatch(machine.core, mono):
                dispatching.append(machine.id)
                error = now - (EPOCH_US + self.true_us + self.reference_shift_us)
                assert abs(error) <= HALF_BOUND_US or (held and error > 0), (
                    f"node {machine.id} may dispatch with cluster time {error / MS:+.1f} ms "
                    "from the agreed clocks"
                )
        assert len(dispatching) <= 1, f"{dispatching} may all dispatch at once"

    def run(self, us: int) -> None:
        for _ in range(us // TICK_US):
            self.step()

    def dispatcher(self) -> Machine | None:
        for machine in self.machines.values():
            if machine.keeper.can_dispatch(machine.core, machine.mono(self.true_us)):
                return machine
        return None

    def until_dispatcher(self, limit_us: int) -> int:
        """Run until a node may dispatch; returns how long that took (µs)."""
        start = self.true_us
        while self.dispatcher() is None:
            assert self.true_us - start <= limit_us, (
                f"no node may dispatch {(self.true_us - start) / S:.2f} s after the step; "
                f"last notices: {self.notices[-6:]}"
            )
            self.step()
        return self.true_us - start

    def leader(self) -> Machine:
        self.until_dispatcher(10 * S)
        machine = self.dispatcher()
        assert machine is not None
        return machine


def started() -> Cluster:
    cluster = Cluster()
    cluster.run(2 * S)
    cluster.leader()
    return cluster


@pytest.mark.parametrize("step_s", [36, -36, 3600, -3600, 1, -1])
def test_every_wall_clock_stepping_at_once_costs_seconds_not_minutes(step_s: int) -> None:
    """The machine's clock steps under every node (the fault runs: +36 s). A leader that
    may dispatch is back within RECOVERY_US, and cluster time follows the clocks the
    cluster agrees on: at once forwards; backwards it holds still until they catch up."""
    cluster = started()
    old = cluster.leader()
    for machine in cluster.machines.values():
        machine.wall_offset_us += step_s * S
    cluster.reference_shift_us = step_s * S
    took = cluster.until_dispatcher(RECOVERY_US)
    new = cluster.dispatcher()
    assert new is not None
    assert took <= RECOVERY_US
    cluster.run(2 * S)  # ...and it stays so
    new = cluster.dispatcher()
    assert new is not None and new.keeper.clock.in_bound
    agreed = EPOCH_US + cluster.true_us + step_s * S
    now = new.keeper.clock.now_us(new.mono(cluster.true_us))
    if step_s > 0:
        assert abs(now - agreed) <= HALF_BOUND_US
    else:
        assert now >= agreed  # held still, never back
        if step_s >= -60:  # (an hour of ticks would make a slow test)
            cluster.run(-step_s * S + S)
            now = new.keeper.clock.now_us(new.mono(cluster.true_us))
            assert abs(now - (EPOCH_US + cluster.true_us + step_s * S)) <= HALF_BOUND_US
    for machine in cluster.machines.values():
        assert machine.keeper.clock.in_bound, (machine.id, machine.keeper.clock.refusal())
    assert old.keeper.clock.synchronized


@pytest.mark.parametrize("step_s", [36, -36, 3600, -3600])
@pytest.mark.parametrize("victim", ["leader", "follower"])
def test_one_wall_clock_stepping_is_flagged_and_the_others_keep_serving(
    step_s: int, victim: str
) -> None:
    """One machine's clock steps: that node leaves the bound at the next tick and says
    by how much; a leader is serving again within RECOVERY_US (at once if the stepped
    node followed); cluster time stays true time. Once its clock is fixed, the node is
    in the bound again within RECOVERY_US."""
    cluster = started()
    leader = cluster.leader()
    stepped = (
        leader
        if victim == "leader"
        else next(m for m in cluster.machines.values() if m is not leader)
    )
    stepped.wall_offset_us += step_s * S
    cluster.step()
    clock = stepped.keeper.clock
    assert not clock.in_bound
    direction = "ahead of" if step_s > 0 else "behind"
    assert f"{abs(step_s):.1f} s {direction} cluster time" in (clock.refusal() or "")
    took = cluster.until_dispatcher(RECOVERY_US)
    if victim == "follower":
        assert took == 0  # the leader never stopped
    cluster.run(2 * S)
    serving = cluster.dispatcher()
    assert serving is not None and serving is not stepped
    assert not clock.in_bound and not stepped.core.campaign_allowed
    assert any(
        f"node {stepped.id}'s clock is {abs(step_s):.1f} s {direction} cluster time" in text
        for node, text in cluster.notices
        if node != stepped.id
    )
    stepped.wall_offset_us -= step_s * S  # NTP fixes it
    for _ in range(RECOVERY_US // TICK_US):
        cluster.step()
        if clock.in_bound:
            break
    assert clock.in_bound, clock.refusal()


def test_clocks_drifting_together_within_the_slew_limit_keep_the_leader() -> None:
    """All wall clocks run 300 ppm fast (an NTP-less machine): cluster time follows
    them by slewing; the leader never has to step down."""
    cluster = started()
    leader = cluster.leader()
    term = leader.core.term
    for machine in cluster.machines.values():
        machine.drift(cluster.true_us, 300)
    for _ in range(60):
        cluster.run(S)
        drifted = cluster.true_us * 300 // 1_000_000
        cluster.reference_shift_us = drifted
        assert cluster.dispatcher() is leader
    assert leader.core.term == term


def test_one_clock_drifting_away_is_flagged_past_half_the_bound() -> None:
    """One follower's wall clock runs 5000 ppm fast: it stays in the bound while it is
    within half of the bound of the others, and is flagged from then on (about 50 s);
    the leader never stops. "Half of the bound" is measured from the interval the
    majority agrees on, which is as wide as the tolerance that still lets a quorum
    agree (at most a quarter of the bound): flagged once the offset is past half of
    the bound (50 s) and before it is past three quarters (75 s)."""
    cluster = started()
    leader = cluster.leader()
    drifting = next(m for m in cluster.machines.values() if m is not leader)
    drifting.drift(cluster.true_us, 5000)
    start = cluster.true_us
    flagged_after_us = None
    for _ in range(90):
        cluster.run(S)
        assert cluster.dispatcher() is leader
        if flagged_after_us is None and not drifting.keeper.clock.in_bound:
            flagged_after_us = cluster.true_us - start
    assert flagged_after_us is not None
    assert 50 * S <= flagged_after_us <= 75 * S
    assert "ahead of cluster time" in (drifting.keeper.clock.refusal() or "")


@pytest.mark.parametrize("step_s", [36, -36])
def test_every_wall_clock_stepping_while_clock_answers_are_slow_costs_seconds(step_s: int) -> None:
    """The fault runs at load 12-13: every clock answer took longer than the quarter of
    the bound a usable sample allows (here 1.2 s), so the nodes ran on their last
    agreement (held by the monotonic clock, ``epoch_max_us``); then the machine's clock
    stepped +36 s under every node. Before the fix each node saw its own clock far from
    cluster time and left the bound, and no new agreement could form until answers were
    fast again: minutes without a leader. A step that a majority of the clocks took
    together (certain even from slow answers: 36 s is far beyond their uncertainty) is not
    this node's fault: a leader keeps leading and stamping, with a cluster time no stamp
    can make due early by the stepped clocks (its own stepped clock forwards; held
    still backwards), and releases nothing until a new agreement follows the clocks, which it
    then adopts without an election."""
    cluster = started()
    cluster.clock_delay_ticks = 11  # a 1.2 s round trip: every sample too slow to use
    slow_round_trip_us = 2 * (1 + cluster.clock_delay_ticks) * TICK_US
    cluster.run(10 * S)
    leader = cluster.dispatcher()
    assert leader is not None
    assert any("answers came back too slowly" in text for _, text in cluster.notices)
    for machine in cluster.machines.values():
        machine.wall_offset_us += step_s * S
    cluster.reference_shift_us = step_s * S
    before = leader.keeper.clock.now_us(leader.mono(cluster.true_us))
    cluster.run(RECOVERY_US)
    leaders = [m for m in cluster.machines.values() if m.core.role is Role.LEADER]
    assert len(leaders) == 1, f"no leader; last notices: {cluster.notices[-6:]}"
    stamping = leaders[0]
    clock = stamping.keeper.clock
    assert clock.in_bound and clock.refusal() is None  # it stamps publishes
    assert cluster.dispatcher() is None  # nothing is released meanwhile
    assert "stepped together" in (clock.release_refusal() or "")
    after = clock.now_us(stamping.mono(cluster.true_us))
    stepped_clocks = EPOCH_US + cluster.true_us + step_s * S
    if step_s > 0:
        # Its own stepped clock: a stamp now is not due early by the stepped clocks.
        assert stepped_clocks <= after <= stepped_clocks + TICK_US
    else:
        # Held still from when the answers showed the others' clocks stepped too.
        assert after <= before + PING_US + slow_round_trip_us + TICK_US
    # Answers fast again: the new agreement takes over, with no election.
    term = stamping.core.term
    cluster.clock_delay_ticks = 0
    if step_s < 0:
        cluster.run(-step_s * S)
    cluster.run(RECOVERY_US)
    serving = cluster.dispatcher()
    assert serving is stamping and serving.core.term == term
    now = serving.keeper.clock.now_us(serving.mono(cluster.true_us))
    assert abs(now - (EPOCH_US + cluster.true_us + step_s * S)) <= HALF_BOUND_US


@pytest.mark.parametrize("step_s", [36, -36])
def test_one_wall_clock_stepping_while_answers_are_slow_is_still_flagged(step_s: int) -> None:
    """Slow answers vouch for a step only when a majority's clocks took it: the leader's
    clock stepping alone still takes it out of the bound at once, and another node
    serves on the agreement it holds."""
    cluster = started()
    cluster.clock_delay_ticks = 11
    cluster.run(10 * S)
    leader = cluster.dispatcher()
    assert leader is not None
    leader.wall_offset_us += step_s * S
    cluster.step()
    assert not leader.keeper.clock.in_bound
    cluster.run(RECOVERY_US)
    serving = cluster.dispatcher()
    assert serving is not None and serving is not leader
    cluster.run(5 * S)
    assert not leader.keeper.clock.in_bound
    assert not any("stepped together" in text for _, text in cluster.notices)
