"""Cluster time for the broker: a :class:`~futureq.clock.Clock` whose wall time is agreed.

The broker stamps publishes, and the dispatcher decides what is due and when visibility
timeouts run out, by ``clock.wall_ms()``. On a node that is given a
:class:`ClusterTime` that value is the node's cluster time
(:class:`~futureq.raft.cluster_clock.ClusterClock`): it never goes backwards, never runs
faster than the monotonic clock (apart from a bounded slew), and a step of the wall
clock does not move it. ``monotonic_s`` stays the OS monotonic clock.

In a cluster the Raft driver owns and ticks the cluster clock (``RaftNode.timekeeper``);
a node that runs alone ticks its own with :func:`run_standalone_clock`. Either way
:func:`export_clock_metrics` copies the clock's figures into the metrics.

Source: ``docs/architecture.md``, "Time".
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from futureq.errors import ErrorCode, RequestError
from futureq.raft.cluster_clock import ClockConfig, ClusterClock

if TYPE_CHECKING:
    from futureq.clock import MicroClock
    from futureq.metrics import Metrics
    from futureq.raft.cluster_clock import ClockNotice

log = logging.getLogger(__name__)

STANDALONE_TICK_S = 0.05
"""How often a node that runs alone ticks its cluster clock (s)."""
METRICS_INTERVAL_S = 1.0
_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class ClusterTime:
    """A :class:`~futureq.clock.Clock` reading cluster time.

    Args:
        source: The OS clocks.
        cluster_clock: The node's cluster clock (ticked elsewhere).
    """

    def __init__(self, source: MicroClock, cluster_clock: ClusterClock) -> None:
        self.source = source
        self.cluster_clock = cluster_clock

    @classmethod
    def standalone(cls, source: MicroClock, node_id: int, max_offset_ms: int) -> ClusterTime:
        """Cluster time of a node that runs alone (its own clock is the reference)."""
        clock = ClusterClock(
            node_id,
            ClockConfig(max_offset_us=max_offset_ms * 1000),
            mono_us=source.monotonic_us(),
            wall_us=source.wall_us(),
            voters=(node_id,),
        )
        return cls(source, clock)

    def wall_ms(self) -> int:
        """Cluster time in integer milliseconds since the Unix epoch (never decreases)."""
        return self.cluster_clock.now_ms(self.source.monotonic_us())

    def monotonic_s(self) -> float:
        """The OS monotonic clock in float seconds."""
        return self.source.monotonic_us() / 1e6

    def check_can_stamp(self) -> None:
        """Refuse to stamp a command with a time the cluster does not agree on.

        Raises:
            RequestError: CLOCK_NOT_SYNCHRONIZED (retryable), with the reason.
        """
        refusal = self.cluster_clock.refusal()
        if refusal is not None:
            raise RequestError(
                ErrorCode.CLOCK_NOT_SYNCHRONIZED, f"{refusal}; retry (another node may lead)"
            )


def log_notices(notices: list[ClockNotice]) -> None:
    """Write cluster clock notices to the log at their level."""
    for notice in notices:
        log.log(_LEVELS.get(notice.level, logging.INFO), "%s", notice.text)


def export_clock_metrics(clock: ClusterClock, metrics: Metrics, seen: set[int]) -> set[int]:
    """Copy the clock's offsets and state into the gauges.

    Args:
        clock: The node's cluster clock.
        metrics: Where the gauges are.
        seen: Node ids exported last time (their series are removed when gone).

    Returns:
        The node ids exported now (pass them back next time).
    """
    status = clock.status()
    offsets = {clock.id: status.own_offset_us, **status.offsets_us}
    for node_id in seen - set(offsets):
        metrics.clock_offset_seconds.remove(str(node_id))
    for node_id, offset_us in offsets.items():
        metrics.clock_offset_seconds.labels(str(node_id)).set(offset_us / 1e6)
    metrics.clock_synchronized.set(1 if status.synchronized else 0)
    metrics.clock_in_bound.set(1 if status.in_bound else 0)
    return set(offsets)


async def run_standalone_clock(time: ClusterTime, metrics: Metrics) -> None:
    """Tick a single node's cluster clock, log its notices, export its metrics. Never returns."""
    clock = time.cluster_clock
    source = time.source
    seen: set[int] = set()
    next_export = 0.0
    while True:
        log_notices(clock.tick(source.monotonic_us(), source.wall_us()))
        now = trio.current_time()
        if now >= next_export:
            seen = export_clock_metrics(clock, metrics, seen)
            next_export = now + METRICS_INTERVAL_S
        await trio.sleep(STANDALONE_TICK_S)


__all__ = ["ClusterTime", "export_clock_metrics", "log_notices", "run_standalone_clock"]
