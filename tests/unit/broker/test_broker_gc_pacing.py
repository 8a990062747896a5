"""The GC pacer freezes long-lived objects as the state grows (``broker/gc_pacing.py``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import trio

from futureq.broker import gc_pacing


@pytest.fixture(autouse=True)
def _unfreeze() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


async def test_the_young_generation_is_collected_less_often(autojump_clock: trio.abc.Clock) -> None:
    older = gc.get_threshold()[1:]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gc_pacing.pace_gc, lambda: 0)
        await trio.sleep(0.05)
        assert gc.get_threshold() == (gc_pacing.GEN0_THRESHOLD, *older)
        nursery.cancel_scope.cancel()


async def test_freezes_at_start_and_again_only_after_growth(autojump_clock: trio.abc.Clock) -> None:
    size = [0]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gc_pacing.pace_gc, lambda: size[0])
        await trio.sleep(0.05)
        assert gc.get_freeze_count() > 0  # the state loaded at start is frozen
        gc.unfreeze()
        await trio.sleep(1)
        assert gc.get_freeze_count() == 0  # no growth, no freeze
        size[0] = gc_pacing.GROWTH_MIN
        await trio.sleep(2 * gc_pacing.CHECK_INTERVAL_S)
        assert gc.get_freeze_count() > 0
        gc.unfreeze()
        size[0] += gc_pacing.GROWTH_MIN - 1
        await trio.sleep(1)
        assert gc.get_freeze_count() == 0  # not grown enough since the last freeze
        nursery.cancel_scope.cancel()
