"""BROWSE_COUNTS on the leader (:func:`futureq.broker.manage.browse_counts`): buckets,
the read limit, relative bounds and bad bounds, over a real QueueState.

The broker seam is a stand-in holding a real QueueState, the test log that applies
proposals at once (``broker_helpers.SyncLog``) and a fixed stamp; the read limit and
chunk size are made small so a few entries exercise the chunked and incomplete paths.
Source: ``docs/protocol.md``, "BROWSE_COUNTS".
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio
from broker_helpers import SyncLog

from futureq.broker import due_counts, manage
from futureq.broker.due_counts import DueCounts
from futureq.errors import ErrorCode, RequestError
from futureq.state import commands
from futureq.state.queue_state import QueueState
from futureq.state.store import MemoryStore
from futureq.wire import frames

NOW_MS = 1_800_000_000_000


class CountingLog(SyncLog):
    """SyncLog with the read barrier BROWSE_COUNTS waits on (applied already: a no-op)."""

    async def read_barrier(self) -> None:
        await trio.lowlevel.checkpoint()


class LeaderSeam:
    """What ``manage.browse_counts`` uses of a Broker: state, log, leadership, stamp,
    and the due-time histograms (the state's observer, as the dispatcher feeds them)."""

    def __init__(self) -> None:
        self.state = QueueState(MemoryStore())
        self.log = CountingLog(self.state)
        self.due_counts = DueCounts(self.state, time.monotonic)
        self.state.observer = self.due_counts

    def require_leader(self) -> None:
        """Always the leader here."""

    def stamp(self) -> int:
        return NOW_MS


def seam_with(due_offsets_ms: list[int], groups: tuple[str, ...] = ("g",)) -> LeaderSeam:
    seam = LeaderSeam()
    for name in groups:
        seam.log.apply(commands.create_group("t", name, None, None))
    seam.log.apply(
        commands.publish(NOW_MS, [("t", b"x", NOW_MS + offset, None) for offset in due_offsets_ms])
    )
    return seam


def count(
    seam: LeaderSeam, bounds: list[int], relative: bool = True, group: str | None = None
) -> Any:
    frame = frames.BrowseCounts(7, "t", group, bounds, relative)
    return trio.run(manage.browse_counts, seam, frame)


def test_buckets_count_what_falls_due_in_each() -> None:
    # 2 due now, 3 within a minute, 1 within an hour, 4 later than a day.
    seam = seam_with([0, 0, 10_000, 30_000, 59_999, 60_000, *[90_000_000] * 4])
    answer = count(seam, [1, 60_000, 3_600_000, 86_400_000])
    assert answer == frames.BrowseCountsOk(
        7,
        "g",
        [NOW_MS + 1, NOW_MS + 60_000, NOW_MS + 3_600_000, NOW_MS + 86_400_000],
        [2, 3, 1, 0],
        4,
        True,
    )
    absolute = count(seam, [NOW_MS + 30_000], relative=False)
    assert (absolute.counts, absolute.later) == ([3], 7)


def test_the_read_limit_gives_a_lower_bound_and_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    # The scan fallback: a histogram not built in time (no time at all here).
    monkeypatch.setattr(manage, "COUNT_BUILD_WAIT_S", 0)
    monkeypatch.setattr(manage, "MAX_COUNTED_ENTRIES", 5)
    monkeypatch.setattr(manage, "COUNT_CHUNK_ENTRIES", 2)
    seam = seam_with([0, 1, 2, 100, 101, 102, 103, 500])
    answer = count(seam, [50, 200, 1000])
    assert answer.counts == [3, 2, None]  # the second bucket holds 4: 2 is a lower bound
    assert (answer.later, answer.complete) == (None, False)
    # Exactly at the limit is still complete: the range ended there.
    monkeypatch.setattr(manage, "MAX_COUNTED_ENTRIES", 8)
    answer = count(seam, [50, 200, 1000])
    assert (answer.counts, answer.later, answer.complete) == ([3, 4, 1], 0, True)


@pytest.mark.parametrize("build_wait_s", [0, 10.0])
def test_chunks_across_buckets_count_every_entry_once(
    monkeypatch: pytest.MonkeyPatch, build_wait_s: float
) -> None:
    monkeypatch.setattr(manage, "COUNT_BUILD_WAIT_S", build_wait_s)
    monkeypatch.setattr(manage, "COUNT_CHUNK_ENTRIES", 3)
    offsets = [n * 7 for n in range(50)]
    seam = seam_with(offsets)
    bounds = [0, 13, 14, 100, 101, 343, 10_000]
    answer = count(seam, bounds)
    assert answer.counts == [
        sum(1 for o in offsets if lo <= o < hi)
        for lo, hi in zip([-1, *bounds], bounds, strict=False)
    ]
    assert sum(answer.counts) + answer.later == 50


@pytest.mark.parametrize(
    ("bounds", "relative", "words"),
    [
        ([], True, "1 to 32"),
        (list(range(33)), True, "1 to 32"),
        ([5, 5], True, "strictly increasing"),
        ([10, 3], False, "strictly increasing"),
        ([-1, 3], True, ">= 0"),
        ([-1], False, "[0, 2**63-1)"),
        ([2**63], False, "[0, 2**63-1)"),
    ],
)
def test_bad_bounds_are_refused_with_a_sentence(
    bounds: list[int], relative: bool, words: str
) -> None:
    seam = seam_with([0])
    with pytest.raises(RequestError) as info:
        count(seam, bounds, relative)
    assert info.value.code is ErrorCode.INVALID_ARGUMENT
    assert words in info.value.message


def test_an_absolute_bound_in_seconds_is_an_implausible_time() -> None:
    seam = seam_with([0])
    with pytest.raises(RequestError) as info:
        count(seam, [1_700_000_000], relative=False)
    assert info.value.code is ErrorCode.IMPLAUSIBLE_TIME
    assert info.value.message.startswith("BROWSE_COUNTS bounds_ms[0] 1700000000")
    assert "seconds" in info.value.message
    assert count(seam, [NOW_MS + 1], relative=False).counts == [1]


def test_a_topic_with_two_groups_needs_one_named() -> None:
    seam = seam_with([0, 120_000], groups=("a", "b"))
    with pytest.raises(RequestError) as info:
        count(seam, [60_000])
    assert info.value.code is ErrorCode.GROUP_REQUIRED
    assert info.value.message.startswith("BROWSE_COUNTS: ")
    assert count(seam, [60_000], group="b").counts == [1]


def test_a_bound_inside_a_busy_minute_is_counted_from_either_side(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(due_counts, "EDGE_SCAN_KEYS", 4)
    monkeypatch.setattr(due_counts, "EDGE_CHUNK_KEYS", 2)
    minute_ms = due_counts.MINUTE_MS
    start = NOW_MS // minute_ms * minute_ms  # the minute NOW_MS falls in
    # 6 entries early in the minute, 3 late, 1 in the next minute.
    offsets = [start - NOW_MS + ms for ms in (1, 2, 3, 4, 5, 6, 50_000, 50_001, 50_002)]
    seam = seam_with([*offsets, start - NOW_MS + minute_ms])
    # The part below the bound holds 6 (over the limit of 4): the part above is counted.
    answer = count(seam, [start + 10_000, start + 2 * minute_ms], relative=False)
    assert (answer.counts, answer.later, answer.complete) == ([6, 4], 0, True)
    # The part below holds 3: counted directly.
    answer = count(seam, [start + 4], relative=False)
    assert (answer.counts, answer.later, answer.complete) == ([3], 7, True)
    # Both parts over the limit: a lower bound, the rest unknown.
    seam = seam_with([start - NOW_MS + ms for ms in (*range(1, 7), *range(50_000, 50_006))])
    answer = count(seam, [start + 10_000, start + 2 * minute_ms], relative=False)
    assert answer.complete is False
    assert answer.counts[1:] == [None] and answer.later is None
    assert answer.counts[0] is not None and 4 <= answer.counts[0] <= 6
