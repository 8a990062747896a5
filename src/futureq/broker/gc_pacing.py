"""Keep CPython's cyclic garbage collector from pausing the event loop as the state grows.

A full (generation 2) collection walks every container object the collector tracks; it
runs whenever that population grew by a quarter since the last one. A node that holds
100,000 groups tracks millions of objects, and while they are being created (a burst of
new topics) the loop stopped for 50-250 ms at a time, measured with a trio instrument
(issue 10: "no request may hold the event loop for more than a few milliseconds").

The remedy is the one CPython documents for long-lived heaps: :func:`gc.freeze` moves
every object tracked so far into a permanent generation that collections skip. We
freeze once the state is loaded, and again whenever the number of groups grew by a few
percent since the last freeze, so a full collection only walks what was created since.
Objects are still freed by reference counting as usual; only a reference *cycle* that
was alive at a freeze and later became garbage is never reclaimed. FutureQ's long-lived
state (groups, runtimes, due-indexes) holds no cycles, so that is a few stray objects per
freeze, and freezes happen only while the group count grows.

The young generation is also collected less often (:data:`GEN0_THRESHOLD` allocations
instead of 700): at batch 100 every PUBLISH in flight holds a few hundred fresh
containers (decoded items, validated tuples, effects), so the default collected about
every third request and walked what was in flight each time, ~8 % of the event loop's
CPU at full publish rate (measured with ``gc.callbacks``); at 10,000 it is ~1-2 %. Young
objects are freed by reference counting as before; only cyclic garbage waits longer,
and one collection of 10,000 young objects takes about a millisecond.

Source: Python documentation, ``gc.freeze`` and ``gc.set_threshold``; DESIGN.md, "no
request holds the event loop".
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable

import trio

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 0.1
"""How often the growth of the state is checked (s)."""
GROWTH_FRACTION = 0.05
"""Freeze again once the state grew by this fraction since the last freeze."""
GROWTH_MIN = 200
"""... and by at least this many groups."""
GEN0_THRESHOLD = 10_000
"""Allocations (minus deallocations) of tracked objects between two collections of the
young generation (CPython's default: 700). The older generations keep their defaults."""


def freeze_now() -> None:
    """Move every object the collector tracks now into the permanent generation."""
    gc.collect(0)  # young garbage first: no need to keep it for ever
    gc.freeze()


async def pace_gc(size: Callable[[], int]) -> None:
    """Collect the young generation every :data:`GEN0_THRESHOLD` allocations, and freeze
    long-lived objects whenever ``size()`` (the group count) grew; never returns.

    Args:
        size: A cheap measure of the long-lived state, e.g. ``len(state.groups)``.
    """
    gc.set_threshold(GEN0_THRESHOLD, *gc.get_threshold()[1:])
    freeze_now()
    frozen_at = size()
    while True:
        await trio.sleep(CHECK_INTERVAL_S)
        now = size()
        if now - frozen_at >= max(GROWTH_MIN, frozen_at * GROWTH_FRACTION):
            freeze_now()
            log.debug("froze long-lived objects at %d groups (%d before)", now, frozen_at)
            frozen_at = now
        elif now < frozen_at:
            frozen_at = now
