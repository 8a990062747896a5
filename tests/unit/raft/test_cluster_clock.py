"""The cluster clock (docs/architecture.md, "Time"): Marzullo's algorithm, agreement from
round-trip-corrected samples, monotonic-based cluster time, bounded slew, the bound."""

from __future__ import annotations

import pytest

from futureq.errors import ConfigError
from futureq.raft.cluster_clock import ClockConfig, ClusterClock, Interval, smallest_interval

MS = 1000
S = 1_000_000
EPOCH_US = 1_800_000_000 * S
"""Some wall time (µs since the Unix epoch) for the true clock at monotonic 0."""


def _interval(*flat: int) -> Interval:
    bounds = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
    return smallest_interval(bounds)


@pytest.mark.parametrize(
    ("flat", "expected"),
    [
        # TigerBeetle's src/vsr/marzullo.zig cases.
        ((11, 13, 10, 12, 8, 12), Interval(11, 12, 3, 0)),
        ((8, 12, 11, 13, 14, 15), Interval(11, 12, 2, 1)),
        ((-10, 10, -1, 1, 0, 0), Interval(0, 0, 3, 0)),
        ((8, 12, 10, 11, 8, 10), Interval(10, 10, 3, 0)),  # touching intervals overlap
        ((8, 12, 10, 12, 8, 9), Interval(8, 9, 2, 1)),  # the first smallest tie wins
        ((7, 9, 7, 12, 10, 11), Interval(10, 11, 2, 1)),  # ... a later smaller one wins
        ((-9, -7, -12, -7, -11, -10), Interval(-11, -10, 2, 1)),
        ((), Interval(0, 0, 0, 0)),
        ((1, 3), Interval(1, 3, 1, 0)),
        ((1, 3, 2, 2), Interval(2, 2, 2, 0)),
        ((1, 3, 4, 5), Interval(4, 5, 1, 1)),
    ],
)
def test_marzullo_smallest_interval(flat: tuple[int, ...], expected: Interval) -> None:
    assert _interval(*flat) == expected


class Clocks:
    """Node 1's cluster clock with peers 2 and 3 whose wall clocks are true + offset."""

    def __init__(self, config: ClockConfig | None = None, *, own_offset_us: int = 0) -> None:
        self.config = config or ClockConfig(
            max_offset_us=500 * MS, window_min_us=200 * MS, window_max_us=2 * S, epoch_max_us=5 * S
        )
        self.mono_us = 10 * S
        self.own_offset_us = own_offset_us
        self.peer_offsets_us = {2: 0, 3: 0}
        self.rtt_us = 400
        self.notices: list[str] = []
        self.clock = ClusterClock(
            1,
            self.config,
            mono_us=self.mono_us,
            wall_us=self.wall_us(),
            voters=(1, 2, 3),
        )

    def true_us(self) -> int:
        return EPOCH_US + self.mono_us

    def wall_us(self) -> int:
        return self.true_us() + self.own_offset_us

    def run(self, seconds: float, step_ms: int = 50) -> None:
        """Advance time; ping both peers every step and tick the clock."""
        for _ in range(int(seconds * 1000 / step_ms)):
            m0 = self.mono_us
            self.mono_us += self.rtt_us // 2
            answers = {
                peer: self.true_us() + offset for peer, offset in self.peer_offsets_us.items()
            }
            self.mono_us += self.rtt_us - self.rtt_us // 2
            for peer, t1 in answers.items():
                self.clock.learn(peer, m0, t1, self.mono_us, True)
            self.mono_us += step_ms * MS - self.rtt_us
            self.notices += [n.text for n in self.clock.tick(self.mono_us, self.wall_us())]

    def error_us(self) -> int:
        """Cluster time minus true time."""
        return self.clock.now_us(self.mono_us) - self.true_us()


def test_clocks_that_agree_synchronize_and_cluster_time_is_true_time() -> None:
    clocks = Clocks()
    assert not clocks.clock.synchronized and not clocks.clock.in_bound
    clocks.run(1.0)
    status = clocks.clock.status()
    assert status.synchronized and status.in_bound and status.sources_true == 3
    assert abs(clocks.error_us()) <= clocks.rtt_us
    assert status.accuracy_us is not None and status.accuracy_us <= clocks.rtt_us


def test_a_fast_wall_clock_on_this_node_does_not_move_cluster_time_and_keeps_it_out() -> None:
    """Input 1 of issue 8: a node 5 minutes ahead takes the cluster's time, not its own,
    and refuses to lead (CockroachDB's max offset rule)."""
    clocks = Clocks(own_offset_us=300 * S)
    clocks.run(1.0)
    clock = clocks.clock
    assert clock.synchronized
    assert abs(clocks.error_us()) <= 2 * clocks.rtt_us
    assert not clock.in_bound
    refusal = clock.refusal()
    assert refusal is not None and "300.0 s ahead of" in refusal
    assert clock.own_offset_us() == pytest.approx(300 * S, abs=2 * clocks.rtt_us)


def test_a_clock_hovering_at_half_the_bound_does_not_flip_in_and_out() -> None:
    """An NTP-less clock drifting at the edge (half of max_clock_offset_ms, 250 ms here)
    went in and out of bound with each sample (6 flips in 20 s in a breaker's run), and
    a leader stepped down and up with it. Out past half the bound, a node is back only
    within 7/8 of that half (RETURN_FRACTION): 218.75 ms."""
    clocks = Clocks(own_offset_us=240 * MS)
    clocks.run(1.0)
    clock = clocks.clock
    assert clock.in_bound  # under half the bound, never past it: in
    changes = 0
    was = clock.in_bound
    for k in range(20):
        clocks.own_offset_us = (251 if k % 2 == 0 else 249) * MS
        clocks.run(0.5)
        changes += clock.in_bound != was
        was = clock.in_bound
    assert changes == 1 and not clock.in_bound
    refusal = clock.refusal()
    assert refusal is not None and "may lead again once within 218.75 ms" in refusal, refusal
    clocks.own_offset_us = 225 * MS
    clocks.run(0.5)
    assert not clock.in_bound
    clocks.own_offset_us = 215 * MS
    clocks.run(0.5)
    assert clock.in_bound and clock.refusal() is None
    clocks.own_offset_us = 249 * MS  # back in, under half the bound: stays in
    clocks.run(0.5)
    assert clock.in_bound
    out = [text for text in clocks.notices if "will not lead" in text]
    back = [text for text in clocks.notices if "is within the bound" in text]
    assert len(out) == 1 and len(back) == 2, clocks.notices  # in at start, out once, in once


def test_a_clock_excused_while_the_clocks_stood_stepped_is_not_held_out_after() -> None:
    """Every clock steps 3 s forward together (a resumed host), this one 230 ms more: far
    off only while the clocks stand stepped, which excuses it. Once the next agreement
    follows them it is 230 ms off, under half the bound: in bound, not held out by the
    hysteresis (it was, for as long as the 230 ms lasted, in a breaker's run)."""
    clocks = Clocks()
    clocks.run(1.0)
    clocks.own_offset_us = 3 * S + 230 * MS
    clocks.peer_offsets_us = {2: 3 * S, 3: 3 * S}
    clocks.run(10.0)
    assert clocks.clock.in_bound, clocks.clock.refusal()


def test_a_standalone_spell_clears_an_earlier_out_of_bound() -> None:
    """Out of bound (300 ms off), then the only voter (its own clock is the reference),
    then a cluster again whose agreement is 230 ms from its clock: in bound, as with no
    hysteresis; a judgement from before the standalone spell does not hold it out."""
    clocks = Clocks()
    clocks.run(1.0)
    clocks.own_offset_us = 300 * MS
    clocks.run(1.0)
    assert not clocks.clock.in_bound
    clocks.clock.set_voters({1})
    clocks.peer_offsets_us = {}
    clocks.run(2.0)
    clocks.clock.set_voters({1, 2, 3})
    clocks.peer_offsets_us = {2: 70 * MS, 3: 70 * MS}
    clocks.run(5.0)
    assert clocks.clock.in_bound, clocks.clock.refusal()


def test_a_peer_with_a_wrong_clock_is_outvoted_and_reported() -> None:
    clocks = Clocks()
    clocks.peer_offsets_us[3] = -3600 * S
    clocks.run(1.0)
    notices = clocks.notices
    clock = clocks.clock
    assert clock.in_bound and abs(clocks.error_us()) <= clocks.rtt_us
    assert clock.status().sources_true == 2
    assert clock.peer_offset_us(3) == pytest.approx(-3600 * S, abs=clocks.rtt_us)
    assert any(
        "node 3's clock is 3600.0 s behind cluster time (±0.2 ms)" in text for text in notices
    )


@pytest.mark.parametrize("step_s", [3600, -3600, 2, -2])
def test_a_step_of_this_nodes_wall_clock_neither_moves_nor_stops_cluster_time(step_s: int) -> None:
    """Inputs 2 and 3: the wall clock steps an hour (or two seconds) forwards or back;
    cluster time keeps running with the monotonic clock, and the node leaves the bound."""
    clocks = Clocks()
    clocks.run(1.0)
    before = clocks.clock.now_us(clocks.mono_us)
    clocks.own_offset_us += step_s * S
    clocks.run(2.0)
    after = clocks.clock.now_us(clocks.mono_us)
    assert after - before == pytest.approx(2 * S, abs=2 * clocks.rtt_us)
    assert abs(clocks.error_us()) <= 2 * clocks.rtt_us
    assert not clocks.clock.in_bound


def test_this_nodes_clock_stepping_back_holds_cluster_time_until_answers_after_it() -> None:
    """This node's clock steps back 2 s and the peers go quiet: it cannot tell whether
    their clocks stepped back with it (then cluster time must hold from the step), so
    cluster time holds; an answer to a ping sent before the step does not decide it.
    Once a majority answered pings sent after the tick that saw the step, and their
    clocks did not step, cluster time runs on from the monotonic clock: true time."""
    clocks = Clocks()
    clocks.run(1.0)
    clock = clocks.clock
    stale_ping_us = clocks.mono_us - 1 * MS
    before = clock.now_us(clocks.mono_us)
    clocks.own_offset_us -= 2 * S
    for _ in range(10):  # 0.5 s of ticks without answers
        clocks.mono_us += 50 * MS
        clock.tick(clocks.mono_us, clocks.wall_us())
        assert clock.now_us(clocks.mono_us) == before
    for peer in (2, 3):  # answered long ago, arriving only now
        clock.learn(peer, stale_ping_us, clocks.true_us(), clocks.mono_us, True)
    clocks.mono_us += 50 * MS
    clock.tick(clocks.mono_us, clocks.wall_us())
    assert clock.now_us(clocks.mono_us) == before
    assert not clock.in_bound
    clocks.run(0.2)  # pings sent now, answered at once
    assert abs(clocks.error_us()) <= 2 * clocks.rtt_us
    assert not clock.in_bound


def test_cluster_time_never_goes_backwards_nor_runs_faster_than_the_monotonic_clock() -> None:
    clocks = Clocks()
    clocks.run(1.0)
    clocks.clock.leading = True
    # The cluster's agreement moves 100 ms ahead of this node (both peers step): a leader
    # slews towards it at no more than slew_up_ppm, never jumps.
    clocks.peer_offsets_us = {2: 100 * MS, 3: 100 * MS}
    clocks.own_offset_us = 100 * MS
    last = clocks.clock.now_us(clocks.mono_us)
    last_mono = clocks.mono_us
    for _ in range(100):
        clocks.run(0.05)
        now = clocks.clock.now_us(clocks.mono_us)
        elapsed = clocks.mono_us - last_mono
        assert 0 <= now - last <= elapsed + elapsed * clocks.config.slew_up_ppm // 1_000_000 + 1
        last, last_mono = now, clocks.mono_us
    # The cluster falls back 60 ms: a leader slows down (never runs backwards).
    clocks.peer_offsets_us = {2: 40 * MS, 3: 40 * MS}
    clocks.own_offset_us = 40 * MS
    for _ in range(100):
        clocks.run(0.05)
        now = clocks.clock.now_us(clocks.mono_us)
        assert now >= last
        last = now
    assert clocks.clock.now_us(clocks.mono_us - S) == last  # an older reading: no step back


def test_a_follower_re_anchors_to_a_moved_agreement() -> None:
    clocks = Clocks()
    clocks.run(1.0)
    clocks.peer_offsets_us = {2: 200 * MS, 3: 200 * MS}
    clocks.own_offset_us = 200 * MS
    clocks.run(1.0)
    assert clocks.error_us() == pytest.approx(200 * MS, abs=2 * clocks.rtt_us)
    assert clocks.clock.in_bound


def test_a_leader_that_drifts_from_the_agreement_leaves_the_bound() -> None:
    clocks = Clocks()
    clocks.run(1.0)
    clocks.clock.leading = True
    clocks.peer_offsets_us = {2: 200 * MS, 3: 200 * MS}
    clocks.own_offset_us = 200 * MS
    clocks.run(1.0)
    assert not clocks.clock.in_bound  # 200 ms > max_offset / 8: step down, then re-anchor
    # The reason is its cluster time, not its wall clock, which is right (a breaker read
    # "wall clock is 64 ms ahead ..., more than half of max_clock_offset_ms=500").
    refusal = clocks.clock.refusal() or ""
    assert "cluster time is 199.6 ms behind the agreement" in refusal, refusal  # slewed 0.4
    assert "its wall clock is within the bound" in refusal, refusal
    clocks.clock.leading = False
    clocks.run(0.5)
    assert clocks.clock.in_bound


def test_without_samples_from_a_majority_the_node_loses_agreement() -> None:
    clocks = Clocks()
    clocks.run(1.0)
    assert clocks.clock.synchronized
    clocks.peer_offsets_us = {}  # partitioned: no pongs arrive
    clocks.run(6.0)
    assert not clocks.clock.synchronized and not clocks.clock.in_bound
    assert "no agreement" in (clocks.clock.refusal() or "")


def test_clocks_further_apart_than_the_bound_never_agree() -> None:
    clocks = Clocks()
    clocks.peer_offsets_us = {2: 400 * MS, 3: -400 * MS}
    clocks.run(3.0)
    assert not clocks.clock.synchronized


def test_a_sample_with_a_long_round_trip_or_not_ours_is_ignored() -> None:
    clocks = Clocks()
    clock = clocks.clock
    clock.learn(2, clocks.mono_us + 10, EPOCH_US, clocks.mono_us, True)  # m0 > m2
    assert clock.peer_offset_us(2) is None
    clock.learn(2, clocks.mono_us - 10 * S, EPOCH_US, clocks.mono_us, True)  # 10 s round trip
    clocks.run(0.3)
    assert clock.peer_in_bound(2) is True


def test_a_round_trip_across_a_window_reset_still_counts() -> None:
    """A pong whose ping left before the window was reset (here: a window that ran out)
    still measures the peer: on a busy host round trips stretch across resets."""
    clocks = Clocks()
    clock = clocks.clock
    start = clocks.mono_us
    notices = clock.tick(start + 1_990 * MS, EPOCH_US + start + 1_990 * MS)
    assert not notices and not clock.synchronized
    m0 = start + 1_990 * MS  # pinged, then the window runs out before the pongs arrive
    notices = clock.tick(start + 2 * S, EPOCH_US + start + 2 * S)
    assert any("synchronization failed" in n.text for n in notices)
    m2 = m0 + 60 * MS
    for peer in (2, 3):
        clock.learn(peer, m0, EPOCH_US + m0 + 30 * MS, m2, True)
    later = m2 + 200 * MS
    clock.tick(later, EPOCH_US + later)
    assert clock.synchronized and clock.in_bound


def test_answers_too_slow_to_place_a_clock_do_not_vouch_for_a_wrong_one() -> None:
    """A sample's interval is as wide as its round trip: one stretched past the tolerance
    would agree with any clock, and a node 600 ms off (more than half the bound) must not
    count such answers as a majority for its own time."""
    clocks = Clocks(own_offset_us=600 * MS)
    clock = clocks.clock
    m0 = clocks.mono_us
    m2 = m0 + 1_800 * MS  # the pongs took 1.8 s (a busy or paused host)
    for peer in (2, 3):
        clock.learn(peer, m0, EPOCH_US + m0 + 900 * MS, m2, True)
    notices = clock.tick(m2, EPOCH_US + m2 + 600 * MS)
    assert not clock.synchronized and not clock.in_bound
    notices += clock.tick(m0 + 2 * S, EPOCH_US + m0 + 2 * S + 600 * MS)
    failed = [n.text for n in notices if "synchronization failed" in n.text]
    assert failed and "2 answers came back too slowly to use" in failed[0]


def test_a_peer_is_reported_only_when_its_offset_exceeds_its_uncertainty() -> None:
    """All answers of node 3 take 1 s: its midpoint offset says 500 ms behind, but the true
    offset may be anywhere within 500 ms of that, so no warning (the nodes of a loaded
    test host reported each other 0.25-5 s off this way)."""
    clocks = Clocks()
    clocks.peer_offsets_us = {2: 0}
    clocks.run(1.0)
    clock = clocks.clock
    for _ in range(5):
        m0 = clocks.mono_us - S
        clock.learn(3, m0, EPOCH_US + m0, clocks.mono_us, True)  # answered at once, 1 s back
        clocks.run(0.3)
    offset = clock.peer_offset_us(3)
    assert offset is not None and offset == pytest.approx(-500 * MS, abs=MS)
    assert clock.peer_offset_range_us(3) == (offset, 500 * MS)
    assert clock.in_bound
    assert not any("node 3's clock" in text for text in clocks.notices), clocks.notices


def test_a_single_node_follows_small_corrections_and_ignores_steps() -> None:
    config = ClockConfig(max_offset_us=500 * MS)
    mono = 5 * S
    wall = EPOCH_US + mono
    clock = ClusterClock(1, config, mono_us=mono, wall_us=wall, voters=(1,))
    assert clock.standalone and clock.in_bound and clock.synchronized
    start = clock.now_us(mono)
    notices = []
    for _ in range(200):  # 10 s, the wall clock is stepped an hour ahead
        mono += 50 * MS
        notices += clock.tick(mono, EPOCH_US + mono + 3600 * S)
    assert clock.now_us(mono) - start == pytest.approx(10 * S, abs=1)
    assert any("jumped" in n.text for n in notices)
    # A 20 ms correction is slewed in at slew_down_ppm (1 %: 10 ms per second).
    for _ in range(60):
        mono += 50 * MS
        clock.tick(mono, EPOCH_US + mono - 20 * MS)
    assert clock.now_us(mono) - (EPOCH_US + mono) == pytest.approx(-20 * MS, abs=1)


def test_clock_config_is_checked() -> None:
    with pytest.raises(ConfigError, match="window_max_us"):
        ClockConfig(window_min_us=5 * S, window_max_us=S)
    with pytest.raises(ConfigError, match="max_offset_us"):
        ClockConfig(max_offset_us=0)


def test_a_single_node_that_grows_into_a_cluster_stays_synchronized() -> None:
    """convert-to-cluster / add-node: the one voter's time stands as the agreement until
    the new members' samples make one, so the leader does not step down meanwhile."""
    clocks = Clocks()
    clocks.clock.set_voters((1,))
    clocks.run(0.5)
    assert clocks.clock.standalone and clocks.clock.in_bound
    clocks.clock.set_voters((1, 2, 3))
    clocks.clock.tick(clocks.mono_us, clocks.wall_us())
    assert clocks.clock.synchronized and clocks.clock.in_bound
    clocks.run(1.0)
    assert clocks.clock.status().sources_true == 3 and clocks.clock.in_bound


def test_a_joining_node_does_not_take_its_own_clock_for_the_clusters() -> None:
    clocks = Clocks(own_offset_us=300 * S)
    clocks.clock.set_voters(())  # it has not learned the membership yet
    clocks.run(0.2)
    clocks.clock.set_voters((1, 2, 3))
    clocks.run(1.0)
    assert clocks.clock.synchronized and not clocks.clock.in_bound
    assert abs(clocks.error_us()) <= 2 * clocks.rtt_us  # the others' time, not frozen


def test_after_a_starved_spell_one_fast_answer_resynchronizes_at_once() -> None:
    """Issue 15: on a starved host every answer came back too slowly to use for a minute
    and the node stayed unsynchronized (it may not campaign). Once answers are fast
    again it agrees within the minimum window, without waiting out a failed window."""
    clocks = Clocks()
    clocks.rtt_us = 600 * MS  # over half the bound: no sample is usable
    clocks.run(20.0, step_ms=1000)
    assert not clocks.clock.synchronized
    assert any("came back too slowly to use" in n for n in clocks.notices)
    clocks.rtt_us = 2 * MS
    clocks.run(clocks.config.window_min_us / S + 0.1)
    assert clocks.clock.synchronized and clocks.clock.in_bound
