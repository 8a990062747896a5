"""How the shard supervisor counts failures in a row (``docs/sharding.md``: five
failures in a row, each within 30 s of the shard's start, stop the node)."""

from __future__ import annotations

from futureq.shards.supervisor import FAST_FAILURE_S, MAX_FAST_FAILURES, fast_failures_after


def _count(lifetimes_s: list[float]) -> int:
    count = 0
    for lived_s in lifetimes_s:
        count = fast_failures_after(count, lived_s)
    return count


def test_a_shard_that_ran_long_starts_the_count_again() -> None:
    """A shard that ran 33 s, then failed four times within seconds: four fast failures,
    not five (it was counted as the first, and the node stopped a failure early)."""
    assert _count([33.0, 3.0, 3.0, 3.0, 3.0]) == 4 < MAX_FAST_FAILURES
    assert _count([33.0, 3.0, 3.0, 3.0, 3.0, 3.0]) == MAX_FAST_FAILURES


def test_only_failures_within_the_window_count() -> None:
    assert _count([1.0, 2.0]) == 2
    assert _count([1.0, 2.0, FAST_FAILURE_S]) == 0
    assert _count([1.0, FAST_FAILURE_S - 0.001]) == 2
