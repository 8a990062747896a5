"""How much disk the node's data directory takes, measured now and then.

The walk runs in a worker thread (a directory of many SST files must not hold the
event loop) every :data:`INTERVAL_S` seconds; the result goes to the
``futureq_data_dir_bytes`` gauge and the overview.

Source: issue 13 ("Observability basics").
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import trio

log = logging.getLogger(__name__)

INTERVAL_S = 15.0
"""Seconds between two measurements."""


def directory_bytes(path: str) -> int:
    """Bytes of every regular file under ``path`` (symlinks not followed).

    Files that vanish during the walk (RocksDB compactions delete them) are skipped.

    Raises:
        OSError: ``path`` itself cannot be read.
    """
    total = 0
    pending = [path]
    first = True
    while pending:
        directory = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            if first:
                raise
            continue
        first = False
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                continue
    return total


async def measure_data_dir(
    path: str, on_size: Callable[[int], None], interval_s: float = INTERVAL_S
) -> None:
    """Measure ``path`` now and every ``interval_s`` seconds until cancelled.

    Args:
        path: The data directory.
        on_size: Called on the event loop with each measurement (bytes).
        interval_s: Seconds between measurements.
    """
    while True:
        try:
            size = await trio.to_thread.run_sync(directory_bytes, path, abandon_on_cancel=True)
        except OSError as exc:
            log.warning("cannot measure the data directory %s: %s", path, exc)
        else:
            on_size(size)
        await trio.sleep(interval_s)
