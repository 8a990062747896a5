"""Compact the key ranges that many deletes left full of tombstones.

A RocksDB delete writes a tombstone; until compaction drops it, an iterator that seeks
into a run of deleted keys steps over every one of them. After a PURGE, or many CANCELs
or RESCHEDULEs (each moves an entry to a new key), the first page of a group's BROWSE,
the dispatcher's refill and "next due" seeks start at the group's first key and walked
hundreds of thousands of tombstones (~1 s for 500,000, issue 14). The scans also carry
an upper bound (:func:`futureq.storage.db._bounded`), so runs of tombstones past the
range end cost nothing; this task removes those at its start.

Every :data:`CHECK_EVERY_S`, for each family in
:data:`~futureq.storage.db.TOMBSTONE_FAMILIES`, once at least :data:`COMPACT_AFTER_DELETES`
deletes were written since the last look, the range they fell in is compacted in a
worker thread (RocksDB releases the GIL: the event loop keeps serving; measured 8.8 ms
worst loop gap while 400,000 tombstones were compacted in 0.36 s). Node-local; it
changes no state, only how it is stored.

Source: RocksDB wiki, "Delete A Range Of Keys" and "Compaction"; issue 14.
"""

from __future__ import annotations

import logging
import time
from typing import Final

import trio

from futureq.storage.db import TOMBSTONE_FAMILIES, Database

log = logging.getLogger(__name__)

CHECK_EVERY_S: Final = 2.0
"""How often the delete counts are looked at (s)."""
COMPACT_AFTER_DELETES: Final = 100_000
"""Deletes in one family since the last compaction that start one (a seek over this
many tombstones costs tens of ms)."""


async def compact_tombstones(
    db: Database, *, every_s: float = CHECK_EVERY_S, after_deletes: int = COMPACT_AFTER_DELETES
) -> None:
    """Run until cancelled: compact each family's deleted range once it is large enough.

    Raises:
        StorageError: RocksDB failed to compact (the node stops, as for a failed write).
    """
    while True:
        await trio.sleep(every_s)
        for family in TOMBSTONE_FAMILIES:
            taken = db.take_tombstones(family, after_deletes)
            if taken is None:
                continue
            low, high = taken
            began = time.perf_counter()
            await trio.to_thread.run_sync(db.compact_range, family, low, high)
            log.info(
                "compacted %s keys %s..%s after %d+ deletes in %.2f s",
                family,
                low[:12].hex(),
                high[:12].hex(),
                after_deletes,
                time.perf_counter() - began,
            )
