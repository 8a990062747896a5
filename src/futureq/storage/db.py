"""Open, write and close the node's RocksDB (``DESIGN.md``, "Storage layout").

Column families: ``raft_log``, ``raft_state``, ``messages``, ``schedule``, ``groups``,
``meta``, ``index``. Synced writes are for the log; state-machine writes are unsynced, with the
WAL on, so that after a crash RocksDB recovers a prefix of the writes in the order
they were made (the applied index travels in the same batch as the state it covers).
"""

from __future__ import annotations

import errno
import gc
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any, Final

from rocksdict import (
    BottommostLevelCompaction,
    ColumnFamily,
    CompactOptions,
    DBRecoveryMode,
    Options,
    Rdict,
    RdictIter,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from futureq.errors import DataDirectoryInUseError, NoSpaceError, StorageError

log = logging.getLogger(__name__)

LOG_FAMILY: Final = "raft_log"
"""Column family of the Raft log (``futureq.raft.rocks_storage``; a single node's command log)."""
STATE_FAMILY: Final = "raft_state"
"""Column family of the Raft hard state, snapshot metadata and identity."""
FAMILIES: Final = (LOG_FAMILY, STATE_FAMILY, "messages", "schedule", "groups", "meta", "index")
SCHEMA_VERSION: Final = 1
TOMBSTONE_FAMILIES: Final = ("schedule", "index")
"""Families whose deletes are counted, so a range that many CANCELs, RESCHEDULEs or a
PURGE deleted can be compacted (:meth:`Database.take_tombstones`): a scan that starts
before a long run of deleted keys otherwise steps over every tombstone."""
_SCHEMA_KEY: Final = b"schema_version"
_NO_SPACE_TEXTS: Final = tuple(
    os.strerror(number) for number in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
)
"""How RocksDB's IO errors say the disk, a quota or the file size limit is full."""


def storage_error(message: str, exc: BaseException) -> StorageError:
    """A :class:`NoSpaceError` when ``exc`` says the disk is full, else a StorageError."""
    text = str(exc)
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return NoSpaceError(f"{message}: {text}")
    if any(marker in text for marker in _NO_SPACE_TEXTS):
        return NoSpaceError(f"{message}: {text}")
    return StorageError(f"{message}: {text}")


def _bounded(stop: bytes | None) -> ReadOptions:
    """Read options whose iterator stops at ``stop`` inside RocksDB: deleted keys past
    the last live key before ``stop`` are not stepped over."""
    options = ReadOptions()
    if stop is not None:
        options.set_iterate_upper_bound(stop)
    return options


def _range(it: RdictIter, start: bytes, stop: bytes | None, with_values: bool) -> Iterator[Any]:
    """Walk ``it`` from ``start`` to ``stop`` (exclusive): keys, or ``(key, value)`` pairs."""
    it.seek(start)
    while it.valid():
        key: bytes = it.key()
        if stop is not None and key >= stop:
            return
        yield (key, it.value()) if with_values else key
        it.next()


MAX_TOTAL_WAL_MB: Final = 16
"""Live WAL bytes (MiB) past which RocksDB flushes the column families holding the oldest
WAL file. A crash restart replays every live WAL file, so this bounds the replay (with
64 MiB, 1M pending messages after SIGKILL replayed ~32 MiB: about half of the restart
above interpreter start-up); memtables stay at ``write_buffer_mb`` per family."""

WAL_RECYCLE_FILES: Final = 2
"""WAL files RocksDB keeps to write the next WALs over instead of creating new ones
(``recycle_log_file_num``; RocksDB PR 746, as Pebble does by default). Appending to a
new file makes every fdatasync also journal the file's new size; over a recycled file,
whose blocks are already written, it flushes only the data: on this machine's ext4 a
synced 1 KiB ``write_batch`` took p50 112 µs instead of 166 µs, p99 261 µs instead of
316-420 µs, once the WAL had rolled (30,000 writes, 1 MiB memtables; issue 11). The
records carry their log number, so recovery stops at the first record left over from a
file's previous use (point-in-time recovery with recycling: RocksDB PR 12403). Costs up
to this many WAL files of disk (each at most ``MAX_TOTAL_WAL_MB``) kept after they are
obsolete."""


def _options(
    write_buffer_mb: int,
    block_cache_mb: int,
    *,
    for_family: bool,
    max_open_files: int = -1,
    strict_wal: bool = False,
) -> Options:
    options = Options(raw_mode=True)
    if not for_family:
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        options.set_max_total_wal_size(MAX_TOTAL_WAL_MB * 1024 * 1024)
        if strict_wal:
            # Only a torn last record (a write cut short) is dropped on recovery; a
            # damaged record with records after it refuses the open. Not with
            # recycled WAL files, whose leftover tail looks like damage (RocksDB turns
            # recycling off in this mode).
            options.set_wal_recovery_mode(DBRecoveryMode.tolerate_corrupted_tail_records())
        else:
            options.set_recycle_log_file_num(WAL_RECYCLE_FILES)
        options.set_max_open_files(max_open_files)
    options.set_write_buffer_size(write_buffer_mb * 1024 * 1024)
    options.set_max_write_buffer_number(2)
    return options


class Database:
    """The node's RocksDB, opened with every FutureQ column family.

    Args:
        path: Directory of the database; created if missing.
        write_buffer_mb: Memtable size per column family (MiB).
        block_cache_mb: Unused placeholder for the shared block cache size (MiB).
        max_open_files: Most table files RocksDB keeps open (-1: all); the node passes
            its share of the open-file limit (:mod:`futureq.fd_budget`).
        strict_wal: Refuse to open (StorageError) when a WAL record other than the
            last is damaged, instead of ending the log there and dropping what follows
            (RocksDB's point-in-time recovery, which recycled WAL files need). A single
            node's (its only copy: 21 garbage bytes in the middle of its WAL silently
            dropped 163 of 200 acknowledged messages, breaker runs); a cluster node keeps
            recycling, since a shorter log there is an older copy of itself that its
            peers make whole (``docs/raft.md``, "Disk faults"). Costs a single node's
            synced writes the recycling's gain (``WAL_RECYCLE_FILES``).

    Raises:
        StorageError: the directory cannot be opened (locked by another process,
            corrupt, or written by a newer schema).
    """

    def __init__(
        self,
        path: str,
        *,
        write_buffer_mb: int = 16,
        block_cache_mb: int = 32,
        max_open_files: int = -1,
        strict_wal: bool = False,
    ) -> None:
        self.path = path
        self._strict_wal = strict_wal
        self.write_buffer_mb = write_buffer_mb
        self._block_cache_mb = block_cache_mb
        self._max_open_files = max_open_files
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create the data directory {path!r}: {exc}") from exc
        self._open()
        self._unsynced = WriteOptions()
        self._tombstones: dict[str, list[Any]] = {}
        """Family -> ``[deletes, lowest key, highest key]`` since it was last taken."""
        self._views: set[DatabaseView] = set()
        self._closed = False
        try:
            self._check_schema()
        except BaseException:
            # Release the LOCK now: the half-built object may live on in the
            # traceback, and RocksDB would refuse any later open in this process.
            self.close()
            raise

    def _open(self) -> None:
        families = {
            name: _options(self.write_buffer_mb, self._block_cache_mb, for_family=True)
            for name in FAMILIES
        }
        try:
            self._db = Rdict(
                self.path,
                _options(
                    self.write_buffer_mb,
                    self._block_cache_mb,
                    for_family=False,
                    max_open_files=self._max_open_files,
                    strict_wal=self._strict_wal,
                ),
                column_families=families,
            )
        except Exception as exc:  # rocksdict raises plain Exception subclasses
            if self._strict_wal and "Corruption" in str(exc):
                raise StorageError(
                    f"cannot open RocksDB at {self.path!r}: {exc}. If a write-ahead log "
                    "record is damaged (after a power loss, most likely the last write, "
                    "never acknowledged): start once with storage.wal_recovery = "
                    '"point-in-time" (FUTUREQ_STORAGE_WAL_RECOVERY=point-in-time) to end '
                    "the log there, dropping the damaged record and everything after it "
                    "(acknowledged messages among them are lost); or restore a backup"
                ) from exc
            if "LOCK" in str(exc) and "lock" in str(exc).lower():
                raise DataDirectoryInUseError(
                    f"cannot open RocksDB at {self.path!r}: another process is using this data "
                    "directory (is this node already running?); two processes must not share "
                    "a data directory or a node id"
                ) from exc
            raise storage_error(f"cannot open RocksDB at {self.path!r}", exc) from exc
        self._handles = {name: self._db.get_column_family_handle(name) for name in FAMILIES}
        self._families = {name: self._db.get_column_family(name) for name in FAMILIES}

    @property
    def has_open_views(self) -> bool:
        """True while a snapshot view is open (:meth:`reopen` must wait)."""
        return bool(self._views)

    def reopen(self) -> None:
        """Close RocksDB and open it again: how it leaves the read-only state a failed
        write (a full disk) puts it in; rocksdict has no ``Resume()``.

        Everything written before the failure is kept (the WAL is replayed). Call it on
        the thread that owns the database, with no write in progress and no view open.

        Raises:
            StorageError: views are open, or RocksDB cannot be opened again (then the
                node must stop; NoSpaceError if the disk is still full).
        """
        if self._closed:
            raise StorageError(f"RocksDB at {self.path!r} is closed")
        if self._views:
            raise StorageError("cannot reopen RocksDB while a snapshot view is open")
        self._families.clear()
        self._handles.clear()
        try:
            self._db.close()
        except Exception as exc:
            log.info("RocksDB close before reopening reported: %s", exc)
        del self._db
        gc.collect()
        try:
            self._open()
        except StorageError:
            self._closed = True  # nothing left to close
            raise
        log.info("RocksDB reopened at %s", self.path)

    def _check_schema(self) -> None:
        # No column family object in a local: it would live on in the traceback of the
        # error below and keep the database (and its LOCK) open.
        found = self.get("meta", _SCHEMA_KEY)
        if found is None:
            self.write({"meta": {_SCHEMA_KEY: SCHEMA_VERSION.to_bytes(4, "big")}}, sync=True)
            return
        version = int.from_bytes(found, "big")
        if version != SCHEMA_VERSION:
            raise StorageError(
                f"data in {self.path!r} has schema version {version}; this build reads "
                f"version {SCHEMA_VERSION}"
            )

    def get(self, family: str, key: bytes) -> bytes | None:
        """Read one value, or None when the key is absent."""
        value: bytes | None = self._families[family].get(key)
        return value

    def write(self, changes: dict[str, dict[bytes, bytes | None]], *, sync: bool = False) -> None:
        """Write puts (value bytes) and deletes (value None) to several families atomically.

        Args:
            changes: family name -> key -> new value, or None to delete.
            sync: fsync the WAL before returning (the log's writes).

        Raises:
            StorageError: RocksDB refused the write; the node must stop.
        """
        batch = WriteBatch(raw_mode=True)
        put = batch.put
        delete = batch.delete
        handles = self._handles
        for family, items in changes.items():
            if not items:
                continue
            handle = handles[family]
            if family not in TOMBSTONE_FAMILIES:
                for key, value in items.items():
                    if value is None:
                        delete(key, handle)
                    else:
                        put(key, value, handle)
                continue
            deleted: list[bytes] = []
            for key, value in items.items():
                if value is None:
                    delete(key, handle)
                    deleted.append(key)
                else:
                    put(key, value, handle)
            if deleted:
                self._note_deletes(family, len(deleted), min(deleted), max(deleted))
        self.write_batch(batch, sync)

    def _note_deletes(self, family: str, count: int, low: bytes, high: bytes) -> None:
        seen = self._tombstones.get(family)
        if seen is None:
            self._tombstones[family] = [count, low, high]
        else:
            seen[0] += count
            seen[1] = min(seen[1], low)
            seen[2] = max(seen[2], high)

    def take_tombstones(self, family: str, min_deletes: int) -> tuple[bytes, bytes] | None:
        """The key range ``(low, high)`` (both included) that at least ``min_deletes``
        deletes written since the last take fell in, forgetting them; None (keeping
        the count) while there were fewer. Pass it to :meth:`compact_range`."""
        seen = self._tombstones.get(family)
        if seen is None or seen[0] < min_deletes:
            return None
        del self._tombstones[family]
        return seen[1], seen[2]

    def compact_range(self, family: str, low: bytes, high: bytes) -> None:
        """Compact one family's keys in ``[low, high]``: drops the tombstones of deleted
        keys there, so scans no longer step over them. Heavy I/O; RocksDB releases the
        GIL meanwhile, so run it in a worker thread.

        Raises:
            StorageError: RocksDB failed.
        """
        options = CompactOptions()
        # A range already on the bottom level is rewritten too (the default skips it,
        # keeping its tombstones); "optimized" skips files this compaction just wrote.
        options.set_bottommost_level_compaction(BottommostLevelCompaction.force_optimized())
        try:
            self._families[family].compact_range(low, high, options)
        except Exception as exc:
            raise storage_error(f"RocksDB compaction failed in {self.path!r}", exc) from exc

    def new_batch(self) -> WriteBatch:
        """An empty raw-mode write batch for :meth:`write_batch`."""
        return WriteBatch(raw_mode=True)

    def handle(self, family: str) -> ColumnFamily:
        """The column family handle to pass to ``WriteBatch.put``/``delete``."""
        return self._handles[family]

    def write_batch(self, batch: WriteBatch, sync: bool) -> None:
        """Write a prepared batch; ``sync``: return only once the WAL holding it is on disk.

        A synced write is the batch written unsynced, then the WAL synced
        (``flush_wal(sync=True)``), not one ``write`` with ``sync`` set: rocksdict holds
        the GIL for the whole of ``Rdict.write``, the fsync included, so a worker
        thread's synced write stopped the event loop for the length of every fsync;
        ``flush_wal`` releases the GIL while it syncs. It is as durable (the call
        returns after the fsync either way); the one difference (RocksDB's note on
        ``SyncWAL``) is that the batch is readable before it is durable, and nothing
        here takes a log entry for durable before the write that made it returned.

        Raises:
            NoSpaceError: the disk (or a quota, or the file size limit) is full; nothing
                of the batch was written.
            StorageError: RocksDB refused the write for another reason, or the WAL sync
                failed after the batch was written (then never NoSpaceError: the batch
                cannot be taken back, so the node must stop).
        """
        try:
            self._db.write(batch, self._unsynced)
        except Exception as exc:
            raise storage_error(f"RocksDB write failed in {self.path!r}", exc) from exc
        if sync:
            try:
                self._db.flush_wal(True)
            except Exception as exc:
                raise StorageError(
                    f"RocksDB WAL sync failed in {self.path!r} after the write: {exc}"
                ) from exc

    def delete_range(self, family: str, start: bytes, stop: bytes) -> None:
        """Delete keys in ``[start, stop)`` of one family (unsynced)."""
        batch = WriteBatch(raw_mode=True)
        batch.delete_range(start, stop, self._handles[family])
        self.write_batch(batch, False)

    def scan(
        self, family: str, start: bytes, stop: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Iterate ``(key, value)`` in key order from ``start`` up to ``stop`` (exclusive)."""
        yield from _range(self._families[family].iter(_bounded(stop)), start, stop, True)

    def scan_keys(self, family: str, start: bytes, stop: bytes | None = None) -> Iterator[bytes]:
        """Iterate keys only, in order, from ``start`` up to ``stop`` (exclusive)."""
        yield from _range(self._families[family].iter(_bounded(stop)), start, stop, False)

    def last_key(self, family: str) -> bytes | None:
        """The largest key of a family, or None when it is empty."""
        it = self._families[family].iter(ReadOptions())
        it.seek_to_last()
        if not it.valid():
            return None
        key: bytes = it.key()
        return key

    def snapshot_view(self, families: Sequence[str]) -> DatabaseView:
        """A point-in-time, read-only view of ``families`` (for state snapshots).

        One RocksDB iterator per family is created here, back to back; a RocksDB
        iterator reads the implicit snapshot taken when it is created, however long it
        lives, so the view never sees later writes. (rocksdict 0.3.29's
        ``Rdict.snapshot()`` cannot serve: its ``iter()`` drops the snapshot and reads
        live data; only its point gets honour it.) The families are consistent with
        each other as long as no write to them runs between the iterators' creation:
        call this on the thread that applies (the event loop), without yielding.

        Args:
            families: Family names, e.g. the four state families.

        Returns:
            A view whose ``scan`` matches :meth:`scan`; it may be read from a worker
            thread. Close it (or close the database, which closes open views).

        Raises:
            KeyError: an unknown family.
            StorageError: the database is closed.
        """
        if self._closed:
            raise StorageError(f"RocksDB at {self.path!r} is closed")
        iterators = {name: self._families[name].iter(ReadOptions()) for name in families}
        view = DatabaseView(self, iterators)
        self._views.add(view)
        return view

    def clear(self, family: str) -> None:
        """Delete every key of one family with a range delete (unsynced).

        Raises:
            StorageError: RocksDB refused the write.
        """
        last = self.last_key(family)
        if last is None:
            return
        self.delete_range(family, b"", last + b"\x00")

    def close(self) -> None:
        """Flush memtables and close; safe to call twice. Open views are closed first."""
        if self._closed:
            return
        self._closed = True
        if not hasattr(self, "_db"):
            return  # a failed reopen left nothing open
        for view in list(self._views):
            view.close()
        # rocksdict keeps the DB (and its LOCK file) alive while any column family
        # object or handle refers to it, so drop them all before closing.
        self._families.clear()
        self._handles.clear()
        try:
            self._db.flush(True)
            self._db.close()
        except Exception as exc:
            # The node is stopping, often because of this very failure (a full disk):
            # report it, but let the error that stopped the node be the one raised.
            # What was synced stays durable; the WAL replays the rest on the next start.
            log.error("RocksDB could not flush and close cleanly in %r: %s", self.path, exc)
        finally:
            del self._db
            gc.collect()


class DatabaseView:
    """A point-in-time view of some families of a :class:`Database`.

    Made by :meth:`Database.snapshot_view`. Each family has one iterator, so scan one
    family at a time (a second scan of the same family restarts the shared iterator);
    different families may be scanned in any order, on any single thread.
    """

    def __init__(self, db: Database, iterators: dict[str, RdictIter]) -> None:
        self._db: Database | None = db
        self._iterators = iterators

    def scan(
        self, family: str, start: bytes, stop: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` in key order from ``start`` up to ``stop`` (exclusive), as of
        the view.

        Raises:
            StorageError: the view is closed.
            KeyError: ``family`` is not part of the view.
        """
        if self._db is None:
            raise StorageError("the RocksDB snapshot view is closed")
        yield from _range(self._iterators[family], start, stop, True)

    def close(self) -> None:
        """Release the iterators (and the memtables and files they pin); idempotent."""
        db = self._db
        if db is None:
            return
        self._db = None
        self._iterators.clear()
        db._views.discard(self)
