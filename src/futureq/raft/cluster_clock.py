"""Cluster time: the one clock the replicas agree on, built from clock samples (sans-IO).

A release is never earlier than its due time by more than the stated bound only if the
leader's idea of "now" is right, and one node's wall clock can be set badly or stepped
at any moment. So no node acts on its own wall clock. Each node keeps a **cluster
time** ``C = monotonic + base``: its monotonic clock (which never jumps) plus an offset
``base`` that the replicas agree on. This module is that computation; it never reads a
clock, every reading is passed in (integer microseconds), so the simulation drives it
with virtual clocks and the trio driver (:mod:`futureq.raft.node`) with the OS clocks.

How ``base`` is found (TigerBeetle's ``src/vsr/clock.zig`` and ``marzullo.zig`` are
the model; see ``docs/architecture.md``, "Time"):

1. Every node pings every other member (``ClockPing`` carrying its monotonic time
   ``m0``); the peer answers at once (``ClockPong`` echoing ``m0`` with its wall time
   ``t1``); the answer arrives at our monotonic ``m2``. The peer's wall clock, measured
   against *our monotonic clock*, is ``t1 + (m2 - m0) / 2 - m2`` give or take the one-way
   delay ``(m2 - m0) / 2`` (round-trip corrected). Measuring against the monotonic clock
   means a step of our own wall clock does not disturb what we learn of the others.
2. Samples collect in a **window** (at least ``window_min_us``); per peer the sample
   with the smallest round trip is kept. Our own wall clock is a source too (delay 0).
3. Each source becomes an interval ``[offset - delay - tolerance, offset + delay +
   tolerance]``. Marzullo's algorithm (:func:`smallest_interval`) finds the smallest
   interval that a quorum (a majority of the voters) agrees on. The tolerance starts at
   a quarter of ``max_offset_us`` and halves while a quorum still agrees, so the
   interval is as tight as the clocks allow. No quorum within a quarter of the bound: no
   agreement, the window is retried. The last agreement stays in force, carried by the
   monotonic clock, for ``epoch_max_us`` (long: the monotonic clock drifts little, and
   this node's own wall clock must keep agreeing with it, step 4); after that without a
   new agreement the node is **unsynchronized**.
4. The target offset is this node's own wall clock clamped into the agreed interval
   (a good clock is kept as it is; a wrong one is pulled to the edge of what the others
   agree on). A node that is not leading adopts it at once when it is more than an
   eighth of the bound away; otherwise ``base`` **slews** towards it, at most
   ``slew_up_ppm`` faster or ``slew_down_ppm`` slower than the monotonic clock. A leader
   never jumps: if its cluster time drifts an eighth of the bound from the agreement,
   it is out of bound and must step down (then it jumps as a follower).

What a caller gets:

* :meth:`ClusterClock.now_us` never goes backwards and, apart from the bounded slew,
  never runs faster than the monotonic clock: a wall clock stepped forwards or
  backwards by an hour changes nothing. (A step back of this node's clock holds it
  until a majority answered pings sent after the step: if every clock stepped back,
  cluster time must hold from the step, and only their answers tell. Then it holds on
  as below if theirs stepped too, or else resumes where the monotonic clock carried the
  agreement meanwhile: a jump forward by the length of the hold, on a node that was
  out of bound throughout, so nothing was stamped or released on the held time.)
  (Before its first agreement a clustered node's cluster time is provisional, its own
  wall clock, and is replaced by the agreement; such a node may not lead, so nothing
  was stamped or released by it.)
* :attr:`ClusterClock.in_bound` — this node may lead, stamp and dispatch: it is
  synchronized, its own wall clock is within half of ``max_offset_us`` of cluster time
  (CockroachDB's rule: a node whose clock is too far off stops taking part rather than
  act on a wrong time), and its cluster time tracks the agreement. Once its clock went
  past that, it is back only within :data:`RETURN_FRACTION` of it (hysteresis: a clock
  that hovers at the edge does not flip in and out, moving leadership each time).
* Each peer's offset from cluster time (:meth:`ClusterClock.offsets_us`) for metrics
  and status, and :class:`ClockNotice` values for the log (a peer whose offset grows
  past half the bound, agreement lost or regained, this node out of bound).

A node with no other voter (a single-node cluster) has no second opinion: its cluster
time starts from its wall clock and follows it by slewing, but a step of more than a
quarter of the bound is not followed (a notice says so); restart the node to adopt it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

import attrs

from futureq.errors import ConfigError
from futureq.raft.basics import majority

US_PER_MS = 1000
PPM = 1_000_000
RECENT_SAMPLES = 8
"""Samples per peer kept for its exported offset (the shortest round trip wins)."""
PEER_NOTICE_EVERY_US = 60_000_000
"""A peer whose offset stays past half the bound is logged again this often (µs)."""
RETURN_FRACTION = (7, 8)
"""A node whose own wall clock went more than half of the bound from cluster time is in
bound again only once within this fraction (numerator, denominator) of that half: with
``max_clock_offset_ms`` 500, out past 250 ms, back within 218.75 ms."""


@attrs.frozen
class Interval:
    """The result of :func:`smallest_interval`.

    Attributes:
        lower_us: Lower end of the smallest interval the most sources agree on.
        upper_us: Upper end (inclusive); equal to ``lower_us`` for a single point.
        sources_true: How many sources' intervals contain it ("true chimers").
        sources_false: How many do not; ``sources_true + sources_false`` is the number
            of sources given.
    """

    lower_us: int
    upper_us: int
    sources_true: int
    sources_false: int


def smallest_interval(bounds: Sequence[tuple[int, int]]) -> Interval:
    """Marzullo's algorithm: the smallest interval consistent with the most sources.

    Args:
        bounds: One ``(lower, upper)`` pair per source, inclusive, ``lower <= upper``.

    Returns:
        The interval contained in the largest number of source intervals; among
        several with that number, the narrowest (the first of equal width). With no
        sources, ``Interval(0, 0, 0, 0)``.

    Source: K. Marzullo, PhD thesis (1984); TigerBeetle ``src/vsr/marzullo.zig``. A
    lower end sorts before an upper end at the same offset, so intervals that only touch
    count as overlapping (in a zero-width interval).
    """
    if not bounds:
        return Interval(0, 0, 0, 0)
    points: list[tuple[int, int, int]] = []
    for source, (lower, upper) in enumerate(bounds):
        assert lower <= upper, f"source {source}: lower {lower} > upper {upper}"
        points.append((lower, 0, source))
        points.append((upper, 1, source))
    points.sort()
    best = 0
    count = 0
    lower_us = upper_us = 0
    for i, (offset, kind, _source) in enumerate(points[:-1]):
        count += 1 if kind == 0 else -1
        following = points[i + 1]
        if count > best:
            best = count
            lower_us, upper_us = offset, following[0]
        elif count == best and following[1] == 1 and following[0] - offset < upper_us - lower_us:
            lower_us, upper_us = offset, following[0]
    return Interval(lower_us, upper_us, best, len(bounds) - best)


@attrs.frozen
class ClockConfig:
    """Tuning of a :class:`ClusterClock`; every duration in microseconds.

    Attributes:
        max_offset_us: The stated bound (``cluster.max_clock_offset_ms``): cluster times
            of the nodes that lead or dispatch stay within half of it of each other's
            agreement, so a release is never earlier than due minus this bound.
        window_min_us: Samples collected before an agreement is computed.
        window_max_us: A window that reached no agreement by then starts again.
        epoch_max_us: Without a new agreement for this long the node is unsynchronized
            (it may not lead or stamp); until then the last agreement is carried by the
            monotonic clock (a majority of clocks may be unreachable meanwhile, e.g. one
            node down and another with a wrong clock).
        slew_up_ppm: Cluster time runs at most this much faster than the monotonic
            clock while it catches up (parts per million; NTP's kernel limit is 500).
        slew_down_ppm: ...and at most this much slower while it falls back.
    """

    max_offset_us: int = 500_000
    window_min_us: int = 500_000
    window_max_us: int = 5_000_000
    epoch_max_us: int = 10_000_000
    slew_up_ppm: int = 500
    slew_down_ppm: int = 10_000

    def __attrs_post_init__(self) -> None:
        checks = [
            ("max_offset_us", self.max_offset_us, self.max_offset_us >= 8, ">= 8"),
            ("window_min_us", self.window_min_us, self.window_min_us >= 0, ">= 0"),
            ("window_max_us", self.window_max_us, self.window_max_us > self.window_min_us,
             "> window_min_us"),
            ("epoch_max_us", self.epoch_max_us, self.epoch_max_us >= self.window_max_us,
             ">= window_max_us"),
            ("slew_up_ppm", self.slew_up_ppm, 0 <= self.slew_up_ppm < PPM, "in [0, 1000000)"),
            ("slew_down_ppm", self.slew_down_ppm, 0 <= self.slew_down_ppm < PPM,
             "in [0, 1000000)"),
        ]  # fmt: skip
        for key, value, ok, allowed in checks:
            if not ok:
                raise ConfigError(f"clock config {key}={value} is invalid; it must be {allowed}")

    @property
    def tolerance_max_us(self) -> int:
        """Largest tolerance of a source interval: a quarter of the bound."""
        return self.max_offset_us // 4

    @property
    def track_us(self) -> int:
        """How far cluster time may be from the agreement before it re-anchors (or, on a
        leader, before the node is out of bound): an eighth of the bound."""
        return self.max_offset_us // 8


@attrs.frozen
class ClockNotice:
    """Something an operator should read in the log.

    Attributes:
        level: ``"info"``, ``"warning"`` or ``"error"``.
        text: One sentence, with the figures.
    """

    level: str
    text: str


@attrs.frozen
class ClockStatus:
    """A snapshot of a :class:`ClusterClock` for status pages and metrics.

    Attributes:
        synchronized: An agreement of a quorum of clocks is current.
        in_bound: This node may lead, stamp and dispatch (see :attr:`ClusterClock.in_bound`).
        standalone: No other voter: cluster time follows only this node's clock.
        own_offset_us: This node's wall clock minus cluster time.
        offsets_us: Per peer, its wall clock minus our cluster time (latest sample).
        accuracy_us: Width of the agreed interval, or None when not synchronized.
        sources_true: Clocks in the agreement (this node included), or 0.
        max_offset_us: The bound.
    """

    synchronized: bool
    in_bound: bool
    standalone: bool
    own_offset_us: int
    offsets_us: dict[int, int]
    accuracy_us: int | None
    sources_true: int
    max_offset_us: int


@attrs.frozen
class _Sample:
    offset_us: int
    """The peer's wall clock minus our monotonic clock."""
    delay_us: int
    """Half the round trip: how far the true offset may be from ``offset_us``."""
    at_us: int = 0
    """Our monotonic clock when the answer arrived."""


@attrs.frozen
class _Epoch:
    lower_us: int
    upper_us: int
    sources_true: int
    synchronized_at_us: int


class ClusterClock:
    """One node's cluster time, from its monotonic clock and the cluster's clock samples.

    Args:
        node_id: This node's id.
        config: Bound and timing.
        mono_us: The monotonic clock now (µs, any origin).
        wall_us: The wall clock now (µs since the Unix epoch).
        voters: The voting members (this node included if it votes).

    The driver calls :meth:`tick` regularly (every Raft tick), :meth:`learn` for every
    ``ClockPong`` and :meth:`set_voters` when the membership changes; it answers pings
    itself (with its wall clock and :attr:`in_bound`).
    """

    def __init__(
        self,
        node_id: int,
        config: ClockConfig,
        *,
        mono_us: int,
        wall_us: int,
        voters: Iterable[int] = (),
    ) -> None:
        self.id = node_id
        self.config = config
        self.leading = False
        """Set by the driver while this node leads: cluster time then never jumps."""
        self._voters: frozenset[int] = frozenset()
        self._base_us = wall_us - mono_us
        self._wall_offset_us = wall_us - mono_us
        self._mono_us = mono_us
        self._last_now_us = wall_us
        self._anchored = False
        self._window_start_us = mono_us
        self._window: dict[int, _Sample] = {}
        self._window_samples = 0
        self._window_slow = 0
        self._learned = False
        self._epoch: _Epoch | None = None
        self._latest: dict[int, deque[_Sample]] = {}
        self._eligible: dict[int, tuple[bool, int]] = {}
        self._peer_noticed: dict[int, int] = {}
        self._peer_contradicting: set[int] = set()
        """Peers that say they may lead while this node measures them too far off (logged once)."""
        self._was_in_bound: bool | None = None
        self._own_out = False
        """This node's own wall clock went more than half of the bound from cluster time
        and has not come back within :data:`RETURN_FRACTION` of that since (set at each
        tick while synchronized; :attr:`in_bound`)."""
        self._step_noticed = False
        self._window_failing = False
        self._was_standalone = False
        self._stepped_together = 0
        """+1 / -1 while a majority of the voters' clocks (this one included) are certainly
        more than half of the bound ahead of / behind cluster time together: the
        clocks stepped, not this node's alone (:meth:`_clocks_stepped_together`)."""
        self._stepped_wall_us = 0
        """While the clocks stand stepped forward together: the latest time a majority
        of the voters' wall clocks read at least (the latest answers), as an offset from
        our monotonic clock: where the next agreement puts cluster time."""
        self._own_stepped = False
        """While the clocks stand stepped together: this node's own clock is one of the
        clocks that stepped alike (:meth:`_clocks_stepped_together`)."""
        self._behind_since: int | None = None
        """Our monotonic clock at the tick that first saw this node's own wall clock more
        than half of the bound behind the agreement (clustered), or None while it is not."""
        self._own_behind = False
        """Cluster time holds (:meth:`now_us`) because this node's own wall clock is that
        far behind and not enough answers to pings sent since show whether the others'
        clocks stepped back with it (:meth:`_hold_for_own_step`)."""
        self._unagreed_us = 0
        """The highest cluster time handed out on this node's own stepped wall clock
        (:meth:`now_us` while the clocks stood stepped forward together): no agreement
        vouched for it, so nothing is released while it is ahead of the agreement
        (:meth:`release_refusal`)."""
        self.set_voters(voters)

    # --- inputs -----------------------------------------------------------------------

    def set_voters(self, voters: Iterable[int]) -> None:
        """The voting members changed (the quorum of clocks is a majority of them)."""
        self._voters = frozenset(voters)

    def learn(self, peer: int, m0_us: int, t1_us: int, m2_us: int, peer_in_bound: bool) -> None:
        """A ``ClockPong`` from ``peer`` arrived.

        Args:
            peer: The node that answered.
            m0_us: Our monotonic clock when we sent the ping (echoed by the peer).
            t1_us: The peer's wall clock when it answered (µs since the Unix epoch).
            m2_us: Our monotonic clock now, as the answer is processed.
            peer_in_bound: The peer's own :attr:`in_bound` when it answered.

        A pong with ``m0 > m2`` (not our ping) is ignored. The sample joins the current
        window (whenever its ping left: a round trip stretched across a window's reset
        still measures the peer) unless its one-way uncertainty ``(m2 - m0) / 2`` is
        more than a quarter of the bound: such a sample cannot show the peer's clock
        within the tolerance, yet its wide interval would agree with any clock (a node
        could count it as a second opinion for its own wrong clock). It still counts
        for :meth:`peer_in_bound` and the exported offsets.
        """
        if peer == self.id or m0_us > m2_us:
            return
        self._eligible[peer] = (peer_in_bound, m2_us)
        delay_us = (m2_us - m0_us) // 2
        sample = _Sample(t1_us + delay_us - m2_us, delay_us, m2_us)
        recent = self._latest.setdefault(peer, deque(maxlen=RECENT_SAMPLES))
        recent.append(sample)
        if delay_us > self.config.tolerance_max_us:
            self._window_slow += 1
            return
        known = self._window.get(peer)
        if known is None or sample.delay_us <= known.delay_us:
            self._window[peer] = sample  # the shortest round trip is the most accurate
        self._window_samples += 1
        self._learned = True

    def tick(self, mono_us: int, wall_us: int) -> list[ClockNotice]:
        """Advance: read our own clock sample, agree when a window is ready, slew.

        Args:
            mono_us: The monotonic clock now (µs).
            wall_us: The wall clock now (µs since the Unix epoch).

        Returns:
            Notices for the log (often none).
        """
        notices: list[ClockNotice] = []
        elapsed_us = max(0, mono_us - self._mono_us)
        self._mono_us = max(self._mono_us, mono_us)
        self._wall_offset_us = wall_us - mono_us
        if self.standalone:
            self._stepped_together = 0
            self._own_out = False  # its own clock is the reference: never off
            self._tick_standalone(elapsed_us, notices)
        else:
            self._tick_clustered(elapsed_us, notices)
            self._notice_stepped_together(notices)
            # Standing stepped together, cluster time follows that rule (now_us), which
            # a leader may stamp on: a hold there would stamp due early by the majority.
            self._own_behind = self._hold_for_own_step() and self._stepped_together == 0
            self._note_own_offset()
        self._notice_bound(notices)
        return notices

    # --- outputs ------------------------------------------------------------------------

    def now_us(self, mono_us: int) -> int:
        """Cluster time (µs since the Unix epoch) at monotonic time ``mono_us``.

        Never less than a value returned before, even for an older ``mono_us``. Holds
        still while this node's own clock stands stepped back and a majority has not
        answered since (:meth:`_hold_for_own_step`). While the clocks of a majority stand
        stepped together (:attr:`in_bound` explains): after a backward step it holds
        still, never running ahead of the clocks a new agreement will follow; after a
        forward step it is the latest clock a majority of the voters reads at least (this
        node's stepped wall clock when the clocks stepped alike, one machine's clock),
        where that agreement will put it, so what is stamped now is not due early by them
        (nothing is released meanwhile, nor later while what it reached so is ahead of
        the agreement: :meth:`release_refusal`).
        """
        if self._stepped_together < 0 or self._own_behind:
            return self._last_now_us
        base = self._base_us
        if self._stepped_together > 0:
            base = max(base, self._stepped_wall_us)
            if self._own_stepped:
                base = max(base, self._wall_offset_us)
        now = max(self._last_now_us, mono_us + base)
        self._last_now_us = now
        if self._stepped_together > 0:
            self._unagreed_us = now
        return now

    def now_ms(self, mono_us: int) -> int:
        """:meth:`now_us` in integer milliseconds (floored)."""
        return self.now_us(mono_us) // US_PER_MS

    @property
    def standalone(self) -> bool:
        """No other voter: synchronization is off and this node's clock is the reference."""
        return not (self._voters - {self.id})

    @property
    def synchronized(self) -> bool:
        """An agreement of a quorum of clocks is current (always true when standalone)."""
        return self.standalone or (self._epoch is not None and self._anchored)

    @property
    def in_bound(self) -> bool:
        """This node may lead, stamp and dispatch.

        Standalone: always. Otherwise: synchronized, its cluster time within an eighth of
        the bound of the agreement's target, and its wall clock within half of
        ``max_offset_us`` of cluster time, unless the wall clocks of a majority of the
        voters (this one's counts when it is that far too) are all, for certain, that far
        from cluster time in the same direction and agree with each other (within the
        tolerance of a common point), this one's among them. Then the clocks stepped
        together (one machine's clock under every node, a resumed host): that is no
        fault of this node's clock (and if its clock did not step, the next agreement
        follows theirs, not it, so it stands in the same state while it is in bound). A
        clock far from theirs too (days fast while they stepped seconds) is excused by
        nothing: it is a fault of its own. It may lead
        and stamp, with a cluster time that no stamp can make due early (:meth:`now_us`),
        but releases nothing (:meth:`release_refusal`) until a new agreement, which, once
        answers are fast enough to use, follows the stepped clocks. Deciding this needs
        no precise sample: a step of seconds is far beyond the uncertainty of answers too
        slow to place a clock within the tolerance.
        """
        if self.standalone:
            return True
        if not self.synchronized:
            return False
        target = self._target_us()
        if abs(self._base_us - target) > self.config.track_us:
            return False
        return abs(self._wall_offset_us - target) <= self._own_limit_us() or (
            self._stepped_together != 0 and self._own_stepped
        )

    def _own_limit_us(self) -> int:
        """How far this node's wall clock may be from cluster time and the node in bound
        (µs): half the bound, or :data:`RETURN_FRACTION` of that while it has not come
        back since it went past (never more than half: the hysteresis only delays the
        return)."""
        half = self.config.max_offset_us // 2
        if not self._own_out:
            return half
        numerator, denominator = RETURN_FRACTION
        return half * numerator // denominator

    def _note_own_offset(self) -> None:
        """At a tick: whether this node's own clock went past half the bound (out until
        within :data:`RETURN_FRACTION` of it again). Unchanged while unsynchronized, and
        while the clocks stand stepped together: that far is then no fault of this clock
        (:attr:`in_bound` excuses it), so it is not held out once the next agreement
        follows the stepped clocks; and while the agreement is the provisional one of a
        single node that grew into a cluster (its own old time, no quorum's), which the
        first real one replaces."""
        epoch = self._epoch
        if (
            not self.synchronized
            or (self._stepped_together != 0 and self._own_stepped)
            or epoch is None
            or epoch.sources_true < majority(len(self._voters))
        ):
            return
        offset = abs(self._wall_offset_us - self._target_us())
        half = self.config.max_offset_us // 2
        if offset > half:
            self._own_out = True
        elif self._own_out and offset <= self._own_limit_us():
            self._own_out = False

    def refusal(self) -> str | None:
        """Why this node may not lead, stamp or dispatch (a sentence), or None."""
        if self.in_bound:
            return None
        if not self.synchronized:
            return (
                f"node {self.id} has no agreement on cluster time with a majority of the voters "
                "(not enough clock samples: it is starting, partitioned, or the clocks disagree "
                f"by more than max_clock_offset_ms={self.config.max_offset_us // US_PER_MS})"
            )
        own = self._wall_offset_us - self._base_us
        bound_ms = self.config.max_offset_us // US_PER_MS
        target = self._target_us()
        offset = abs(self._wall_offset_us - target)
        if abs(self._base_us - target) > self.config.track_us and offset <= self._own_limit_us():
            # Not the wall clock: this node's cluster time drifted from the agreement
            # (a leader only slews, and a narrow agreement can move faster than that).
            return (
                f"node {self.id}'s cluster time is {describe_offset(self._base_us - target)} the "
                f"agreement of the clocks, more than an eighth of max_clock_offset_ms={bound_ms} "
                "(its wall clock is within the bound): a leader hands over and then follows "
                "the agreement at once"
            )
        if self._own_out and self._own_limit_us() < offset <= self.config.max_offset_us // 2:
            numerator, denominator = RETURN_FRACTION
            return (
                f"node {self.id}'s wall clock is {describe_offset(own)} cluster time: it went "
                f"more than half of max_clock_offset_ms={bound_ms} off and may lead again once "
                f"within {self._own_limit_us() / 1000:g} ms ({numerator}/{denominator} of "
                "that half); fix its clock (NTP)"
            )
        return (
            f"node {self.id}'s wall clock is {describe_offset(own)} cluster time, more than half of "
            f"max_clock_offset_ms={bound_ms}; fix its clock (NTP) before it may lead"
        )

    def release_refusal(self) -> str | None:
        """Why this node, though :attr:`in_bound`, may not release messages now (a
        sentence), or None. It may not while the clocks of a majority stand stepped
        together from the agreement it holds: which of the two times is right is not
        known until a new agreement, and a release by either could be early by the other
        (or a message delivered past its expiry). Nor, after the clocks stepped forward
        together, while the cluster time it then reached on its own stepped wall clock is
        ahead of the agreement by more than an eighth of the bound: the step was undone
        (or the clocks fixed) before an agreement followed it, cluster time holds there
        (it never goes back), and a release by it would be early by every clock; it
        waits until the agreement catches up."""
        if self._stepped_together != 0:
            return (
                "the wall clocks of a majority of the voters stepped together; messages are "
                "released again once a new agreement on cluster time follows them"
            )
        ahead = self._unagreed_us - (self._mono_us + self._base_us)
        if ahead <= self.config.track_us:
            return None
        return (
            f"cluster time stands {describe_offset(ahead)} the agreement, reached on this "
            "node's wall clock while the clocks stood stepped forward together, and no "
            "agreement followed the step; messages are released again once the agreement "
            "catches up (cluster time never goes back)"
        )

    def own_offset_us(self) -> int:
        """This node's wall clock minus its cluster time (µs)."""
        return self._wall_offset_us - self._base_us

    def offsets_us(self) -> dict[int, int]:
        """Per peer with a sample: its wall clock minus our cluster time (µs), from the
        most accurate (shortest round trip) of its last few samples."""
        return {
            peer: offset
            for peer in sorted(self._latest)
            if (offset := self.peer_offset_us(peer)) is not None
        }

    def peer_clock_off(self, peer: int, limit_us: int | None = None) -> bool:
        """True when a sample puts ``peer``'s wall clock further than ``limit_us``
        (default: half of ``max_offset_us``, the bound a node's own clock must keep to
        lead: :attr:`in_bound`) from cluster time, beyond the sample's uncertainty;
        False without a sample."""
        known = self.peer_offset_range_us(peer)
        if known is None:
            return False
        offset_us, uncertainty_us = known
        limit = self.config.max_offset_us // 2 if limit_us is None else limit_us
        return abs(offset_us) - uncertainty_us > limit

    def peer_clock_refused(self, peer: int, limit_us: int | None = None) -> bool:
        """True when this node, its own clock standing in the agreement (in bound, no
        step of a majority's clocks standing), measures ``peer``'s wall clock, beyond the
        sample's uncertainty, further than ``limit_us`` (default: half of
        ``max_offset_us``) from cluster time.

        Such a peer must not lead, whatever it says of itself: it judges its clock by
        another bound (its ``cluster.max_clock_offset_ms`` is larger than this node's),
        and once an agreement of two clocks follows its own it stamps and releases on it.
        A node 20 s fast under a bound of 60,000 ms said it was in bound, was handed
        leadership by a leader whose bound was 500 ms, and released messages 15 s early
        once a third node stopped (breaker run). The measure counts while this node's own
        wall clock is within half the bound of its cluster time, agreement or not (two
        voters of three whose clocks cannot agree elect neither): when this node's clock
        is the one that is off, or the clocks stand stepped together, its measure proves
        nothing (the peer may be right), so nothing is refused then.
        """
        if (
            self.standalone
            or not self._anchored
            or self._stepped_together != 0
            or abs(self.own_offset_us()) > self.config.max_offset_us // 2
        ):
            return False
        return self.peer_clock_off(peer, limit_us)

    def peer_in_bound(self, peer: int) -> bool | None:
        """What ``peer`` last said of itself (may it lead?), or None when it has not
        answered a ping within ``epoch_max_us``."""
        known = self._eligible.get(peer)
        if known is None or self._mono_us - known[1] > self.config.epoch_max_us:
            return None
        return known[0]

    def peer_round_trip_us(self, peer: int) -> int | None:
        """The slowest round trip among ``peer``'s last few clock samples (µs), or None
        without a sample: how late a message to it and back may be right now."""
        recent = self._latest.get(peer)
        if not recent:
            return None
        return 2 * max(sample.delay_us for sample in recent)

    def peer_offset_us(self, peer: int) -> int | None:
        """``peer``'s wall clock minus our cluster time, or None without a sample."""
        known = self.peer_offset_range_us(peer)
        return None if known is None else known[0]

    def peer_offset_range_us(self, peer: int) -> tuple[int, int] | None:
        """``(offset, uncertainty)``: :meth:`peer_offset_us` and how far the true offset
        may be from it (half the sample's round trip), or None without a sample."""
        recent = self._latest.get(peer)
        if not recent:
            return None
        best = min(reversed(recent), key=lambda sample: sample.delay_us)  # newest on ties
        return best.offset_us - self._base_us, best.delay_us

    def status(self) -> ClockStatus:
        """A snapshot for status pages and metrics."""
        epoch = self._epoch
        return ClockStatus(
            synchronized=self.synchronized,
            in_bound=self.in_bound,
            standalone=self.standalone,
            own_offset_us=self.own_offset_us(),
            offsets_us=self.offsets_us(),
            accuracy_us=None if epoch is None else epoch.upper_us - epoch.lower_us,
            sources_true=0 if epoch is None else epoch.sources_true,
            max_offset_us=self.config.max_offset_us,
        )

    # --- internals ----------------------------------------------------------------------

    def _clocks_stepped_together(self) -> tuple[int, int, int, bool]:
        """``(direction, wall, level, own)``: direction +1 (-1) when the wall clocks of a
        majority of the voters are each for certain more than half of the bound ahead of
        (behind) cluster time, from their latest answers of the last ``window_max_us``
        (their uncertainty, half the round trip, taken off) and this node's own clock,
        and agree with each other as an agreement would need them to (each within the
        tolerance, a quarter of the bound, of a common point: Marzullo's algorithm over
        them alone), else 0 (only with a current agreement); wall, with a direction, the
        latest time a majority of those agreeing clocks read at least (an offset from
        our monotonic clock: a stamp below it could be due early by them, since this
        node's clock may have stepped less than theirs), else 0; level, how many of the
        clocks (this node's and the answers of the last ``window_max_us``) are for
        certain not that far behind (0 without a current agreement); own, whether this
        node's clock is one of the agreeing ones.

        This node's clock need not be among them: if a majority's clocks stepped and
        its own did not, the next agreement follows theirs, so it too must stamp on
        their clocks and release nothing until then (it would stamp due early by them,
        or release early by them). Clocks that are all far from cluster time the same
        way but far from each other too (one three days fast, the leader's stepped two
        seconds) are two faults, not one step: no agreement will follow them, and
        taking them for one let the clock three days fast lead and stamp on itself."""
        if self._epoch is None or not self._anchored:
            return 0, 0, 0, False
        target = self._target_us()
        half = self.config.max_offset_us // 2
        own = self._wall_offset_us - target
        voting = self.id in self._voters
        level = int(voting and own >= -half)
        # (offset from our monotonic clock, uncertainty, whether it is ours)
        sources: list[tuple[int, int, bool]] = [(self._wall_offset_us, 0, True)] if voting else []
        for peer in sorted(self._voters - {self.id}):
            recent = self._latest.get(peer)
            if not recent:
                continue
            latest = recent[-1]
            if self._mono_us - latest.at_us > self.config.window_max_us:
                continue  # not heard from lately: it may have been fixed since
            sources.append((latest.offset_us, latest.delay_us, False))
            if -(latest.offset_us - target) + latest.delay_us <= half:
                level += 1  # for certain not that far behind: a slow answer is no proof
        quorum = majority(len(self._voters))
        tolerance = self.config.tolerance_max_us
        for direction in (1, -1):
            far = [
                source for source in sources if direction * (source[0] - target) - source[1] > half
            ]
            if len(far) < quorum:
                continue
            bounds = [
                (offset - delay - tolerance, offset + delay + tolerance) for offset, delay, _ in far
            ]
            agreed = smallest_interval(bounds)
            if agreed.sources_true < quorum:
                continue
            together = [
                source
                for source, (lower, upper) in zip(far, bounds, strict=True)
                if lower <= agreed.lower_us and agreed.upper_us <= upper
            ]
            wall = sorted((offset for offset, _, _ in together), reverse=True)[quorum - 1]
            return direction, wall, level, any(ours for _, _, ours in together)
        return 0, 0, level, False

    def _hold_for_own_step(self) -> bool:
        """Whether cluster time must hold because this node's own wall clock stepped back.

        A step back of every clock shows here at the next tick, but in the others'
        answers only a ping round later (:meth:`_clocks_stepped_together`). Running on
        until then would move the point where cluster time then holds past the step,
        and a message due in between would be released at the next agreement, early by
        every clock. So it holds from the tick that saw this clock behind until a
        majority of the voters (this one included) answered pings sent after that tick:
        then either they stepped too (it goes on holding, stepped together) or this
        clock alone did (it resumes at the monotonic clock plus the agreement's offset,
        where it would stand had it not held: a jump forward by the hold's length, but
        the node was out of bound throughout, so nothing was stamped or released on the
        held time). A node that hears from no majority (cut off) holds until it does.
        Not while the clocks stand stepped together: that rule sets cluster time then,
        and a leader may stamp on it."""
        behind = self._anchored and (
            self._wall_offset_us - self._target_us() < -(self.config.max_offset_us // 2)
        )
        if not behind:
            self._behind_since = None
            return False
        if self._behind_since is None:
            self._behind_since = self._mono_us
        since = self._behind_since
        answered = int(self.id in self._voters)
        for peer in self._voters - {self.id}:
            recent = self._latest.get(peer)
            if recent and recent[-1].at_us - 2 * recent[-1].delay_us >= since:
                answered += 1
        return answered < majority(len(self._voters))

    def _notice_stepped_together(self, notices: list[ClockNotice]) -> None:
        stepped, wall, level, own_stepped = self._clocks_stepped_together()
        if self._stepped_together < 0 and stepped == 0 and level < majority(len(self._voters)):
            # A backward stand ends only once a majority of the clocks are seen, for
            # certain, not behind (a new agreement that followed them, or the clocks
            # fixed). Answers that aged out (a node cut off) or came back too slowly to
            # place a clock show nothing: cluster time would run on from the old
            # agreement, past the step, and once the next agreement followed the
            # stepped clocks, what fell due meanwhile would be released on it, early by
            # them (breaker runs: up to 11.5 s early, in real processes too).
            return
        self._stepped_wall_us = wall
        self._own_stepped = own_stepped
        if stepped == self._stepped_together:
            return
        self._stepped_together = stepped
        if stepped == 0:
            notices.append(
                ClockNotice(
                    "info",
                    "the wall clocks of a majority no longer stand stepped from cluster time",
                )
            )
            return
        own = self._wall_offset_us - self._target_us()
        runs = (
            "cluster time follows the clocks a majority reads"
            if stepped > 0
            else "cluster time holds still"
        )
        notices.append(
            ClockNotice(
                "warning",
                f"the wall clocks of a majority of the voters stepped together: this node's is "
                f"{describe_offset(own)} cluster time, and a majority's are "
                f"{'ahead of' if stepped > 0 else 'behind'} it; it may lead and stamp ({runs}) "
                "but releases nothing until a new agreement follows them",
            )
        )

    def _target_us(self) -> int:
        epoch = self._epoch
        if epoch is None:
            return self._base_us
        return min(max(self._wall_offset_us, epoch.lower_us), epoch.upper_us)

    def _slew(self, target_us: int, elapsed_us: int) -> None:
        difference = target_us - self._base_us
        up = elapsed_us * self.config.slew_up_ppm // PPM
        down = elapsed_us * self.config.slew_down_ppm // PPM
        self._base_us += max(-down, min(up, difference))

    def _tick_standalone(self, elapsed_us: int, notices: list[ClockNotice]) -> None:
        self._epoch = None
        # Only a node that is the one voter is the cluster's time; a node that has not
        # learned the membership yet (a joining one) is nobody's, and its time stays
        # provisional until its first agreement.
        sole_voter = self._voters == {self.id}
        self._anchored = self._anchored or sole_voter
        self._was_standalone = sole_voter
        difference = self._wall_offset_us - self._base_us
        if abs(difference) > self.config.tolerance_max_us:
            if not self._step_noticed:
                self._step_noticed = True
                notices.append(
                    ClockNotice(
                        "error",
                        f"the wall clock jumped: it is {describe_offset(difference)} cluster time; "
                        "cluster time keeps running on the monotonic clock and does not follow "
                        "a step of more than a quarter of max_clock_offset_ms="
                        f"{self.config.max_offset_us // US_PER_MS} (restart the node to adopt "
                        "the new wall clock)",
                    )
                )
            return
        if self._step_noticed:
            self._step_noticed = False
            notices.append(ClockNotice("info", "the wall clock agrees with cluster time again"))
        self._slew(self._wall_offset_us, elapsed_us)

    def _tick_clustered(self, elapsed_us: int, notices: list[ClockNotice]) -> None:
        if self._was_standalone:
            # A single node grew into a cluster: its own time was the cluster's, so it
            # stands as the agreement until the new members' samples make a real one
            # (the leader keeps leading meanwhile).
            self._was_standalone = False
            self._epoch = _Epoch(self._base_us, self._base_us, 1, self._mono_us)
            self._reset_window()
        self._synchronize(notices)
        epoch = self._epoch
        if (
            epoch is not None
            and self._mono_us - epoch.synchronized_at_us >= self.config.epoch_max_us
        ):
            self._epoch = None
            notices.append(
                ClockNotice(
                    "error",
                    f"no agreement on cluster time for {self.config.epoch_max_us / 1e6:.1f} s "
                    "(partitioned, or too many clocks disagree); this node will not lead",
                )
            )
        if self._epoch is None:
            return
        target = self._target_us()
        difference = target - self._base_us
        # A leader never jumps while it may release, but one that stood stepped together
        # with the others released nothing since the step, so it adopts the new agreement.
        may_jump = not self.leading or self._stepped_together != 0
        if not self._anchored or (abs(difference) > self.config.track_us and may_jump):
            if self._anchored:
                notices.append(
                    ClockNotice(
                        "warning",
                        f"cluster time re-anchored by {difference / 1000:+.1f} ms to the "
                        "cluster's agreement",
                    )
                )
            if not self._anchored:
                # Before its first agreement a node's cluster time was provisional (its
                # own wall clock) and nothing was stamped or released by it: replace it.
                self._last_now_us = self._mono_us + target
            self._base_us = target
            self._anchored = True
        else:
            self._slew(target, elapsed_us)

    def _synchronize(self, notices: list[ClockNotice]) -> None:
        config = self.config
        elapsed_us = self._mono_us - self._window_start_us
        if elapsed_us < config.window_min_us:
            return
        if elapsed_us >= config.window_max_us:
            if not self._window_failing:
                self._window_failing = True
                sampled = 1 + sum(1 for peer in self._window if peer in self._voters)
                carried = (
                    "; cluster time runs on from the last agreement"
                    if self._epoch is not None
                    else ""
                )
                slow = (
                    f" ({self._window_slow} answers came back too slowly to use: a round "
                    f"trip over {2 * config.tolerance_max_us / 1000:.0f} ms)"
                    if self._window_slow
                    else ""
                )
                notices.append(
                    ClockNotice(
                        "warning",
                        f"clock synchronization failed: {sampled} of "
                        f"{len(self._voters | {self.id})} clocks sampled in "
                        f"{elapsed_us / 1e6:.1f} s{slow}, and no majority agrees within "
                        f"±{config.tolerance_max_us / 1000:.0f} ms{carried}",
                    )
                )
            self._reset_window()
            return
        if not self._learned:
            return
        self._learned = False
        sources = [_Sample(self._wall_offset_us, 0)]
        sources += [s for peer, s in sorted(self._window.items()) if peer in self._voters]
        quorum = majority(len(self._voters))
        tolerance = config.tolerance_max_us
        agreed: Interval | None = None
        while True:
            interval = smallest_interval(
                [
                    (s.offset_us - s.delay_us - tolerance, s.offset_us + s.delay_us + tolerance)
                    for s in sources
                ]
            )
            if interval.sources_true < quorum:
                break
            agreed = interval  # keep narrowing while a quorum still agrees
            if tolerance == 0:
                break
            tolerance //= 2
        if agreed is None:
            return  # wait for better samples, or until the window runs out
        if self._epoch is None or self._window_failing:
            self._window_failing = False
            notices.append(
                ClockNotice(
                    "info",
                    f"cluster time synchronized: {agreed.sources_true} of "
                    f"{len(self._voters | {self.id})} clocks agree within "
                    f"{(agreed.upper_us - agreed.lower_us) / 1000:.1f} ms",
                )
            )
        self._epoch = _Epoch(agreed.lower_us, agreed.upper_us, agreed.sources_true, self._mono_us)
        self._reset_window()
        self._notice_peers(notices)

    def _reset_window(self) -> None:
        self._window_start_us = self._mono_us
        self._window = {}
        self._window_samples = 0
        self._window_slow = 0
        self._learned = False

    def _notice_peers(self, notices: list[ClockNotice]) -> None:
        """Warn of a peer whose clock is past half the bound for certain: a sample whose
        round trip was stretched (a busy host, a paused process) says little about the
        peer's clock, so the offset counts only beyond its uncertainty."""
        half = self.config.max_offset_us // 2
        for peer in sorted(self._latest):
            known = self.peer_offset_range_us(peer)
            if known is None:
                continue
            offset, uncertainty = known
            if abs(offset) - uncertainty <= half:
                if self._peer_noticed.pop(peer, None) is not None:
                    notices.append(
                        ClockNotice("info", f"node {peer}'s clock is back within half of the bound")
                    )
                continue
            last = self._peer_noticed.get(peer)
            if last is None or self._mono_us - last >= PEER_NOTICE_EVERY_US:
                self._peer_noticed[peer] = self._mono_us
                notices.append(
                    ClockNotice(
                        "warning",
                        f"node {peer}'s clock is {describe_offset(offset)} cluster time "
                        f"(±{uncertainty / 1000:.1f} ms), more than half of "
                        f"max_clock_offset_ms={self.config.max_offset_us // US_PER_MS}",
                    )
                )
        for peer in sorted(self._latest):
            # A peer this far off that says it may lead judges itself by a larger
            # bound: a configuration fault, said once (again after it ended).
            if not (self.peer_in_bound(peer) is True and self.peer_clock_refused(peer)):
                self._peer_contradicting.discard(peer)
            elif peer not in self._peer_contradicting:
                self._peer_contradicting.add(peer)
                notices.append(
                    ClockNotice(
                        "error",
                        f"node {peer} says it may lead, but its clock is "
                        f"{describe_offset(self.peer_offset_us(peer) or 0)} cluster time by "
                        "this node's measure, more than half of this node's "
                        f"max_clock_offset_ms={self.config.max_offset_us // US_PER_MS}: its "
                        "cluster.max_clock_offset_ms must be larger; give every node the same "
                        "bound (this node does not hand it leadership, nor votes for it while "
                        "its clock is further off than the bound)",
                    )
                )

    def _notice_bound(self, notices: list[ClockNotice]) -> None:
        if not self._anchored:
            return  # nothing is known yet
        now_in_bound = self.in_bound
        if now_in_bound == self._was_in_bound:
            return
        self._was_in_bound = now_in_bound
        if now_in_bound:
            if not self.standalone:
                notices.append(
                    ClockNotice("info", f"node {self.id}'s clock is within the bound; it may lead")
                )
            return
        reason = self.refusal()
        if reason is not None:
            notices.append(ClockNotice("error", reason + "; it will not lead or dispatch"))


def describe_offset(offset_us: int) -> str:
    """``"12.5 s ahead of"`` / ``"300.0 ms behind"`` for an offset in µs (then a noun)."""
    direction = "ahead of" if offset_us >= 0 else "behind"
    size = abs(offset_us)
    amount = f"{size / 1e6:.1f} s" if size >= 10_000_000 else f"{size / 1000:.1f} ms"
    return f"{amount} {direction}"


__all__ = [
    "ClockConfig",
    "ClockNotice",
    "ClockStatus",
    "ClusterClock",
    "Interval",
    "describe_offset",
    "smallest_interval",
]
