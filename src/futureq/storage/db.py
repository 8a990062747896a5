"""Open, write and close the node's RocksDB (``DESIGN.md``, "Storage layout").

Column families: ``raft_log``, ``raft_state``, ``messages``, ``schedule``, ``groups``,
``meta``. Synced writes are for the log; state-machine writes are unsynced, with the
WAL on, so that after a crash RocksDB recovers a prefix of the writes in the order
they were made (the applied index travels in the same batch as the state it covers).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from typing import Final

from rocksdict import ColumnFamily, Options, Rdict, ReadOptions, WriteBatch, WriteOptions

from futureq.errors import StorageError

FAMILIES: Final = ("raft_log", "raft_state", "messages", "schedule", "groups", "meta")
SCHEMA_VERSION: Final = 1
_SCHEMA_KEY: Final = b"schema_version"


def _options(write_buffer_mb: int, block_cache_mb: int, *, for_family: bool) -> Options:
    options = Options(raw_mode=True)
    if not for_family:
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        options.set_max_total_wal_size(64 * 1024 * 1024)
    options.set_write_buffer_size(write_buffer_mb * 1024 * 1024)
    options.set_max_write_buffer_number(2)
    return options


class Database:
    """The node's RocksDB, opened with every FutureQ column family.

    Args:
        path: Directory of the database; created if missing.
        write_buffer_mb: Memtable size per column family (MiB).
        block_cache_mb: Unused placeholder for the shared block cache size (MiB).

    Raises:
        StorageError: the directory cannot be opened (locked by another process,
            corrupt, or written by a newer schema).
    """

    def __init__(self, path: str, *, write_buffer_mb: int = 16, block_cache_mb: int = 32) -> None:
        self.path = path
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create the data directory {path!r}: {exc}") from exc
        families = {
            name: _options(write_buffer_mb, block_cache_mb, for_family=True) for name in FAMILIES
        }
        try:
            self._db = Rdict(
                path,
                _options(write_buffer_mb, block_cache_mb, for_family=False),
                column_families=families,
            )
        except Exception as exc:  # rocksdict raises plain Exception subclasses
            raise StorageError(f"cannot open RocksDB at {path!r}: {exc}") from exc
        self._handles = {name: self._db.get_column_family_handle(name) for name in FAMILIES}
        self._families = {name: self._db.get_column_family(name) for name in FAMILIES}
        self._synced = WriteOptions()
        self._synced.sync = True
        self._unsynced = WriteOptions()
        self._closed = False
        try:
            self._check_schema()
        except BaseException:
            # Release the LOCK now: the half-built object may live on in the
            # traceback, and RocksDB would refuse any later open in this process.
            self.close()
            raise

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
        for family, items in changes.items():
            handle = self._handles[family]
            for key, value in items.items():
                if value is None:
                    batch.delete(key, handle)
                else:
                    batch.put(key, value, handle)
        self.write_batch(batch, sync)

    def new_batch(self) -> WriteBatch:
        """An empty raw-mode write batch for :meth:`write_batch`."""
        return WriteBatch(raw_mode=True)

    def handle(self, family: str) -> ColumnFamily:
        """The column family handle to pass to ``WriteBatch.put``/``delete``."""
        return self._handles[family]

    def write_batch(self, batch: WriteBatch, sync: bool) -> None:
        """Write a prepared batch; ``sync`` fsyncs the WAL first.

        Raises:
            StorageError: RocksDB refused the write.
        """
        try:
            self._db.write(batch, self._synced if sync else self._unsynced)
        except Exception as exc:
            raise StorageError(f"RocksDB write failed in {self.path!r}: {exc}") from exc

    def delete_range(self, family: str, start: bytes, stop: bytes) -> None:
        """Delete keys in ``[start, stop)`` of one family (unsynced)."""
        batch = WriteBatch(raw_mode=True)
        batch.delete_range(start, stop, self._handles[family])
        self.write_batch(batch, False)

    def scan(
        self, family: str, start: bytes, stop: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Iterate ``(key, value)`` in key order from ``start`` up to ``stop`` (exclusive)."""
        it = self._families[family].iter(ReadOptions())
        it.seek(start)
        while it.valid():
            key: bytes = it.key()
            if stop is not None and key >= stop:
                return
            yield key, it.value()
            it.next()

    def scan_keys(self, family: str, start: bytes, stop: bytes | None = None) -> Iterator[bytes]:
        """Iterate keys only, in order, from ``start`` up to ``stop`` (exclusive)."""
        it = self._families[family].iter(ReadOptions())
        it.seek(start)
        while it.valid():
            key: bytes = it.key()
            if stop is not None and key >= stop:
                return
            yield key
            it.next()

    def last_key(self, family: str) -> bytes | None:
        """The largest key of a family, or None when it is empty."""
        it = self._families[family].iter(ReadOptions())
        it.seek_to_last()
        if not it.valid():
            return None
        key: bytes = it.key()
        return key

    def close(self) -> None:
        """Flush memtables and close; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        # rocksdict keeps the DB (and its LOCK file) alive while any column family
        # object or handle refers to it, so drop them all before closing.
        self._families.clear()
        self._handles.clear()
        try:
            self._db.flush(True)
        finally:
            self._db.close()
            del self._db
            gc.collect()
