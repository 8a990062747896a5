"""The NO_SPACE alarm: a full disk makes the node refuse writes, not exit.

Modelled on etcd's ``NOSPACE`` alarm. When a write fails because the disk, a quota or the
process's file size limit is full (:class:`~futureq.errors.NoSpaceError`), the writer
trips the alarm. While it is raised:

* requests that write (PUBLISH, GROUP_CREATE) are refused with ``NO_SPACE``; others that
  need the log (ACK, NACK, the dispatcher's expiries) are refused too until there is
  room — nothing half-written, nothing acknowledged lost;
* reads go on: consumers keep receiving what is due, STATUS and ``/healthz`` answer;
  ``/readyz`` answers 503 naming the alarm; ``futureq_storage_alarm{alarm="no_space"}``
  is 1 and the dashboard shows it;
* a Raft node stops leading (so the cluster elects a leader that can write) and does not
  acknowledge entries it could not store.

Every :data:`PROBE_INTERVAL_S` the alarm writes a probe file in the data directory, as
large as what reopening RocksDB may need (a memtable flush). Once that succeeds, RocksDB
is reopened — the only way out of the read-only state a failed write leaves it in, since
rocksdict has no ``Resume()`` — and the alarm clears: the node resumes by itself.

Source: etcd, "maintenance: space quota" (NOSPACE alarm); issue 10, "A full disk".
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final

import trio

from futureq.errors import NoSpaceError, StorageError

if TYPE_CHECKING:
    from futureq.metrics import Metrics
    from futureq.storage.db import Database

log = logging.getLogger(__name__)

PROBE_INTERVAL_S: Final = 1.0
"""How often a raised alarm looks for space again (s)."""
PROBE_FILE: Final = ".space-probe"
PROBE_CHUNK_BYTES: Final = 1024 * 1024


class SpaceAlarm:
    """The node's NO_SPACE alarm and its recovery.

    Args:
        db: The node's database (probed, then reopened when space returns).
        metrics: Where the alarm gauge and the error counter live, or None.
        probe_bytes: Bytes the probe file must take before space counts as back;
            default twice the memtable size (what a reopen may flush).
    """

    def __init__(
        self, db: Database, metrics: Metrics | None = None, probe_bytes: int | None = None
    ) -> None:
        self._db = db
        self._metrics = metrics
        self.probe_bytes = (
            probe_bytes if probe_bytes is not None else 2 * db.write_buffer_mb * 1024 * 1024
        )
        self.raised = False
        self._cleared = trio.Event()
        self._cleared.set()
        self._raise_event = trio.Event()
        self.lock = trio.Lock()
        """Held around writes made in worker threads, and by the reopen."""
        if metrics is not None:
            metrics.storage_alarm.labels("no_space").set(0)

    @asynccontextmanager
    async def writing(self) -> AsyncIterator[None]:
        """Hold :attr:`lock` around a write made in a worker thread (no reopen meanwhile).

        A free lock is taken without a pass of the event loop (``trio.Lock.acquire``
        always yields once, and this is on the path of every synced write); a cancelled
        caller still raises here, before it writes.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self.lock.acquire_nowait()
        except trio.WouldBlock:
            await self.lock.acquire()
        try:
            yield
        finally:
            self.lock.release()

    def trip(self, exc: NoSpaceError) -> None:
        """A write failed for lack of space: raise the alarm (logged once)."""
        if self._metrics is not None:
            self._metrics.no_space_errors_total.inc()
        if self.raised:
            return
        self.raised = True
        self._cleared = trio.Event()
        self._raise_event.set()
        if self._metrics is not None:
            self._metrics.storage_alarm.labels("no_space").set(1)
        log.error(
            "NO_SPACE alarm: %s. Writes are refused until space returns (checked every %g s); "
            "reads and deliveries go on",
            exc,
            PROBE_INTERVAL_S,
        )

    def check(self) -> None:
        """Refuse a write while the alarm is raised.

        Raises:
            NoSpaceError: the alarm is raised.
        """
        if self.raised:
            raise NoSpaceError(
                "the disk is full (NO_SPACE alarm); writes resume when space returns"
            )

    async def wait_cleared(self) -> None:
        """Block until the alarm is not raised."""
        await self._cleared.wait()

    async def run(self) -> None:
        """While the alarm is raised, probe for space and recover; never returns.

        Raises:
            StorageError: RocksDB could not be opened again although the probe found
                space (the node must stop).
        """
        while True:
            if not self.raised:
                await self._raise_event.wait()
                self._raise_event = trio.Event()
                continue
            await trio.sleep(PROBE_INTERVAL_S)
            if self._db.has_open_views:
                continue  # a snapshot is being written; reopen after it
            if not await trio.to_thread.run_sync(self._probe):
                continue
            async with self.lock:
                try:
                    self._db.reopen()
                except NoSpaceError as exc:
                    raise StorageError(
                        f"the disk had room for the probe but RocksDB could not be reopened: {exc}"
                    ) from exc
            self.raised = False
            self._cleared.set()
            if self._metrics is not None:
                self._metrics.storage_alarm.labels("no_space").set(0)
            log.warning("NO_SPACE alarm cleared: there is room again; writes resume")

    def _probe(self) -> bool:
        """Write and remove ``probe_bytes`` in the data directory; True if it fit."""
        path = os.path.join(self._db.path, PROBE_FILE)
        chunk = b"\0" * min(PROBE_CHUNK_BYTES, max(1, self.probe_bytes))
        written = 0
        try:
            with open(path, "wb") as file:
                while written < self.probe_bytes:
                    file.write(chunk)
                    written += len(chunk)
                file.flush()
                os.fsync(file.fileno())
            return True
        except OSError:
            return False
        finally:
            try:
                os.remove(path)
            except OSError:
                pass
