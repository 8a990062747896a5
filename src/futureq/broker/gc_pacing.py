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

The young generation is also collected far less often (:data:`GEN0_THRESHOLD` instead
of 700). CPython counts tracked containers allocated minus those freed and collects the
young generation when the count passes the threshold; each collection walks every young
object still alive, and at full publish rate that is the publishes in flight (tens of
thousands of items at batch 100), whatever the threshold. So a low threshold does not
make collections shorter, only more frequent: at 10,000, ``bench.gc_cost`` (one node,
batch 100, 4 pipelined connections) saw 60-80 young and 6-7 middle collections in 5 s,
9-10 % of the window spent collecting and ~30 pauses of 5 ms or more, the longest
17-35 ms (15-16 % and up to 73 ms while PUBLISH items were lists, not tuples:
``frames.Publish``). In steady load the count only follows how much is in flight, so at
100,000 it stays under the threshold: no collection in the window. It is passed when
the live population grows by that much (a burst of connections or new groups; growth
of the state is frozen as above), and the pause is then as long as one at 10,000 with
the same load in flight. Young objects are freed by reference counting as before; only
cyclic garbage waits longer (at most the threshold's worth of objects: under a churn of
connections that publish, fail requests and drop, RSS levelled off ~10 % higher than at
10,000).

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
GEN0_THRESHOLD = 100_000
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
