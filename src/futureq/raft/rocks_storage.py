"""The Raft :class:`~futureq.raft.storage.Storage` on the node's RocksDB.

Layout (``DESIGN.md``, "Storage layout"):

* family ``raft_log``: key = log index as 8 bytes big-endian; value = msgpack
  ``[term, kind, data]`` (the layout :class:`~futureq.broker.command_log.SingleNodeLog`
  also writes);
* family ``raft_state``: ``hard_state`` = msgpack ``[term, vote or nil, commit]``;
  ``snapshot`` = msgpack ``[index, term, voters, learners, file name, registry]`` (the
  member registry as :func:`~futureq.raft.payload_codec.encode_registry` bytes; absent in
  data written before it existed); ``identity`` = msgpack ``[cluster id, node id,
  incarnation]``, the stamp a data directory gets when it is created (``docs/raft.md``,
  "Disk faults");
  ``log_start`` = msgpack ``[index, term]``, the entry just before the first stored one
  (equal to the snapshot's index and term unless entries are kept behind the snapshot);
* the snapshot's data bytes live in a file of ``snapshot_dir`` (written to a temporary
  name, fsynced, renamed, directory fsynced) because they can be large.

:meth:`RocksStorage.persist` writes everything a :class:`~futureq.raft.messages.Ready`
asks for (snapshot metadata, entries, hard state) in ONE RocksDB write batch, synced
when ``ready.must_sync``: after a crash either all of it or none of it is there.

Term lookups are hot (every AppendEntries consistency check), so the terms of all
stored entries are kept in memory (one int per entry), and recent entries are cached
(the leader reads them back to replicate).

The methods are not thread safe: the driver calls them from one worker thread at a
time while the event loop does not touch the storage (``raft/node.py``).
"""

from __future__ import annotations

import os
from collections import deque
from typing import TYPE_CHECKING, Final

import attrs
import msgpack

from futureq.errors import RemoteProtocolError, StorageError
from futureq.raft.messages import LogIndex, NodeId, Ready, Term
from futureq.raft.payload_codec import decode_registry, encode_registry
from futureq.raft.storage import (
    CompactedError,
    SnapshotOutOfDateError,
    UnavailableError,
    check_appendable,
)
from futureq.raft.values import (
    EMPTY_REGISTRY,
    Entry,
    EntryKind,
    HardState,
    Membership,
    Snapshot,
    SnapshotMetadata,
)
from futureq.storage.db import LOG_FAMILY as LOG_FAMILY
from futureq.storage.db import STATE_FAMILY as STATE_FAMILY
from futureq.storage.db import storage_error

if TYPE_CHECKING:
    from rocksdict import ColumnFamily, WriteBatch

    from futureq.storage.db import Database

_HARD_STATE: Final = b"hard_state"
_SNAPSHOT: Final = b"snapshot"
_LOG_START: Final = b"log_start"
_IDENTITY: Final = b"identity"
_MAX_KEY: Final = b"\xff" * 8
DEFAULT_CACHE_BYTES: Final = 64 << 20
"""Recent entries kept in memory for the leader's replication reads (bytes)."""

_pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack


@attrs.frozen
class StoreIdentity:
    """The stamp of a data directory (``docs/raft.md``, "Disk faults").

    Attributes:
        cluster_id: The cluster it belongs to.
        node_id: The node it belongs to.
        incarnation: Random id drawn when the directory was created (> 0); a wiped
            directory gets a new one, so peers can tell it from the one they knew.
    """

    cluster_id: str
    node_id: int
    incarnation: int


def log_key(index: int) -> bytes:
    """``raft_log`` key of a log index: 8 bytes, big-endian (keys sort by index)."""
    return index.to_bytes(8, "big")


def _unpack(data: bytes, what: str) -> list[object]:
    try:
        value = msgpack.unpackb(data, raw=False, use_list=True)
    except Exception as exc:  # msgpack raises many types; all mean "corrupt"
        raise StorageError(f"stored raft {what} is not valid msgpack: {exc}") from None
    if not isinstance(value, list):
        raise StorageError(f"stored raft {what} is not an array")
    return value


def _int(value: object, what: str) -> int:
    if type(value) is not int:
        raise StorageError(f"stored raft {what} is not an integer: {value!r:.40}")
    return value


def _decode_entry(index: int, raw: bytes) -> Entry:
    fields = _unpack(raw, f"entry {index}")
    if len(fields) != 3 or not isinstance(fields[2], bytes):
        raise StorageError(f"stored raft entry {index} is not [term, kind, data]")
    return Entry(
        Term(_int(fields[0], "entry term")),
        LogIndex(index),
        EntryKind(_int(fields[1], "entry kind")),
        fields[2],
    )


def _encode_entry(entry: Entry) -> bytes:
    packed: bytes = _pack([entry.term, int(entry.kind), entry.data])
    return packed


def _entry_term(raw: bytes) -> int:
    """The term of a stored entry without copying its data."""
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(raw)
    unpacker.read_array_header()
    term: int = unpacker.unpack()
    return term


class RocksStorage:
    """Raft storage on RocksDB: the core's read side plus the driver's write side.

    A fresh database starts with the "bootstrap" snapshot at index 0, term 0 whose
    membership is ``membership`` (empty for a node that will be added later); the
    bootstrap snapshot's metadata is written at once.

    Args:
        db: The node's open database (families ``raft_log`` and ``raft_state``).
        snapshot_dir: Directory for snapshot data files; created if missing.
        membership: Initial configuration, used only when the database holds no raft
            state yet.
        cache_bytes: Budget of the recent-entries cache (bytes).

    Raises:
        StorageError: the stored raft state is corrupt, a snapshot file is missing,
            or the directory cannot be created.
    """

    def __init__(
        self,
        db: Database,
        snapshot_dir: str,
        membership: Membership | None = None,
        *,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        self._db = db
        self._snapshot_dir = snapshot_dir
        self._cache_bytes = cache_bytes
        try:
            os.makedirs(snapshot_dir, exist_ok=True)
        except OSError as exc:
            raise StorageError(
                f"cannot create the snapshot directory {snapshot_dir!r}: {exc}"
            ) from exc
        raw_hard_state = db.get(STATE_FAMILY, _HARD_STATE)
        raw_snapshot = db.get(STATE_FAMILY, _SNAPSHOT)
        if raw_snapshot is None:
            self._hard_state = HardState()
            self._snapshot_meta = SnapshotMetadata(LogIndex(0), Term(0), membership or Membership())
            self._snapshot_file = ""
            self._log_start = (LogIndex(0), Term(0))
            batch = db.new_batch()
            self._put_snapshot_meta(batch)
            db.write_batch(batch, True)
        else:
            self._hard_state = self._decode_hard_state(raw_hard_state)
            self._snapshot_meta, self._snapshot_file = self._decode_snapshot(raw_snapshot)
            raw_start = db.get(STATE_FAMILY, _LOG_START)
            if raw_start is None:
                self._log_start = (self._snapshot_meta.index, self._snapshot_meta.term)
            else:
                fields = _unpack(raw_start, "log start")
                self._log_start = (
                    LogIndex(_int(fields[0], "log start index")),
                    Term(_int(fields[1], "log start term")),
                )
            if self._snapshot_file and not os.path.exists(self._snapshot_path()):
                raise StorageError(
                    f"snapshot file {self._snapshot_path()!r} for index "
                    f"{self._snapshot_meta.index} is missing; the data directory is damaged"
                )
        self._snapshot_data: bytes | None = b"" if not self._snapshot_file else None
        # _terms[k] is the term of entry log_start + 1 + k.
        self._terms: list[int] = []
        self._load_terms()
        # Recent entries (a suffix of the log) for cheap replication reads.
        self._cache: deque[Entry] = deque()
        self._cached_bytes = 0

    # Handles are looked up per use: rocksdict keeps the database (and its LOCK) open
    # while any handle object lives, so holding one would block Database.close().
    @property
    def _log_handle(self) -> ColumnFamily:
        return self._db.handle(LOG_FAMILY)

    @property
    def _state_handle(self) -> ColumnFamily:
        return self._db.handle(STATE_FAMILY)

    # --- loading ----------------------------------------------------------------------

    @staticmethod
    def _decode_hard_state(raw: bytes | None) -> HardState:
        if raw is None:
            return HardState()
        fields = _unpack(raw, "hard state")
        if len(fields) != 3:
            raise StorageError("stored raft hard state is not [term, vote, commit]")
        vote = fields[1]
        return HardState(
            Term(_int(fields[0], "term")),
            None if vote is None else NodeId(_int(vote, "vote")),
            LogIndex(_int(fields[2], "commit")),
        )

    @staticmethod
    def _decode_snapshot(raw: bytes) -> tuple[SnapshotMetadata, str]:
        fields = _unpack(raw, "snapshot metadata")
        if (
            len(fields) not in (5, 6)
            or not isinstance(fields[2], list)
            or not isinstance(fields[3], list)
        ):
            raise StorageError("stored raft snapshot metadata is malformed")
        registry = EMPTY_REGISTRY
        if len(fields) == 6:
            if not isinstance(fields[5], bytes):
                raise StorageError("stored raft snapshot registry is not binary")
            try:
                registry = decode_registry(fields[5])
            except RemoteProtocolError as exc:
                raise StorageError(f"stored raft snapshot registry is corrupt: {exc}") from None
        file_name = fields[4]
        if not isinstance(file_name, str):
            raise StorageError("stored raft snapshot file name is not a string")
        membership = Membership(
            frozenset(NodeId(_int(v, "voter")) for v in fields[2]),
            frozenset(NodeId(_int(v, "learner")) for v in fields[3]),
        )
        metadata = SnapshotMetadata(
            LogIndex(_int(fields[0], "snapshot index")),
            Term(_int(fields[1], "snapshot term")),
            membership,
            registry,
        )
        return metadata, file_name

    def _load_terms(self) -> None:
        start = self._log_start[0]
        expected = start + 1
        for key, raw in self._db.scan(LOG_FAMILY, log_key(expected)):
            index = int.from_bytes(key, "big")
            if index != expected:
                raise StorageError(
                    f"raft log entry {expected} is missing (found {index} next); "
                    "the data directory is damaged"
                )
            try:
                self._terms.append(_entry_term(raw))
            except Exception as exc:
                raise StorageError(f"stored raft entry {index} is corrupt: {exc}") from None
            expected += 1

    # --- Storage protocol -----------------------------------------------------------------

    def initial_state(self) -> tuple[HardState, Membership]:
        """See :meth:`futureq.raft.storage.Storage.initial_state`."""
        return self._hard_state, self._snapshot_meta.membership

    def first_index(self) -> LogIndex:
        """See :meth:`futureq.raft.storage.Storage.first_index`.

        Equals snapshot index + 1 unless :meth:`compact` kept entries behind it.
        """
        return LogIndex(self._log_start[0] + 1)

    def last_index(self) -> LogIndex:
        """See :meth:`futureq.raft.storage.Storage.last_index`."""
        return LogIndex(self._log_start[0] + len(self._terms))

    def term(self, index: LogIndex) -> Term:
        """See :meth:`futureq.raft.storage.Storage.term`."""
        start, start_term = self._log_start
        if index < start:
            raise CompactedError(f"term of {index} is compacted (log starts after {start})")
        if index == start:
            return start_term
        if index > self.last_index():
            raise UnavailableError(f"entry {index} is past the last index {self.last_index()}")
        return Term(self._terms[index - start - 1])

    def entries(self, lo: LogIndex, hi: LogIndex, max_bytes: int) -> list[Entry]:
        """See :meth:`futureq.raft.storage.Storage.entries`."""
        if lo < self.first_index():
            raise CompactedError(f"entry {lo} is compacted (first index {self.first_index()})")
        if hi > self.last_index() + 1:
            raise UnavailableError(f"entry {hi - 1} is past the last index {self.last_index()}")
        result: list[Entry] = []
        if lo >= hi:
            return result
        size = 0
        cache_start = self._cache[0].index if self._cache else hi
        index = lo
        if index < cache_start:
            stop = min(hi, cache_start)
            for key, raw in self._db.scan(LOG_FAMILY, log_key(index), log_key(stop)):
                entry = _decode_entry(int.from_bytes(key, "big"), raw)
                size += entry.size_bytes()
                if result and size > max_bytes:
                    return result
                result.append(entry)
            index = LogIndex(stop)
            if len(result) != stop - lo:
                raise StorageError(f"raft log entries between {lo} and {stop} are missing")
        offset = index - cache_start
        while index < hi:
            entry = self._cache[offset]
            size += entry.size_bytes()
            if result and size > max_bytes:
                break
            result.append(entry)
            index = LogIndex(index + 1)
            offset += 1
        return result

    def snapshot(self) -> Snapshot:
        """See :meth:`futureq.raft.storage.Storage.snapshot`.

        The data is read from its file on first use and kept in memory.

        Raises:
            StorageError: the snapshot file cannot be read.
        """
        if self._snapshot_data is None:
            try:
                with open(self._snapshot_path(), "rb") as file:
                    self._snapshot_data = file.read()
            except OSError as exc:
                raise StorageError(
                    f"cannot read snapshot {self._snapshot_path()!r}: {exc}"
                ) from exc
        return Snapshot(self._snapshot_meta, self._snapshot_data)

    # --- reads used by the driver ------------------------------------------------------

    def hard_state(self) -> HardState:
        """The last hard state written."""
        return self._hard_state

    def snapshot_metadata(self) -> SnapshotMetadata:
        """Metadata of the stored snapshot, without loading its data."""
        return self._snapshot_meta

    def identity(self) -> StoreIdentity | None:
        """The data directory's stamp, or None if it was never stamped.

        Raises:
            StorageError: the stored stamp is corrupt.
        """
        raw = self._db.get(STATE_FAMILY, _IDENTITY)
        if raw is None:
            return None
        fields = _unpack(raw, "identity")
        if len(fields) != 3 or not isinstance(fields[0], str):
            raise StorageError("stored raft identity is not [cluster id, node id, incarnation]")
        return StoreIdentity(fields[0], _int(fields[1], "node id"), _int(fields[2], "incarnation"))

    def is_pristine(self) -> bool:
        """Whether nothing was ever written here: no entry, hard state or snapshot."""
        return (
            self._snapshot_meta.index == 0
            and not self._terms
            and self._hard_state == HardState()
            and not self._snapshot_meta.membership.voters
            and not self._snapshot_meta.membership.learners
        )

    # --- writes -------------------------------------------------------------------------

    def stamp_identity(self, identity: StoreIdentity) -> None:
        """Write the data directory's stamp (synced).

        Raises:
            StorageError: the write failed.
        """
        batch = self._db.new_batch()
        batch.put(
            _IDENTITY,
            _pack([identity.cluster_id, identity.node_id, identity.incarnation]),
            self._state_handle,
        )
        self._db.write_batch(batch, True)

    def bootstrap(self, membership: Membership) -> bool:
        """Set the initial configuration if the storage is pristine (never written to).

        A node started with ``bootstrap_voters`` calls this; a node that joins later
        keeps the empty membership and learns the real one from the leader.

        Returns:
            True if the membership was stored, False if the storage already had state.
        """
        if not self.is_pristine():
            return False
        self._snapshot_meta = SnapshotMetadata(LogIndex(0), Term(0), membership)
        batch = self._db.new_batch()
        self._put_snapshot_meta(batch)
        self._db.write_batch(batch, True)
        return True

    def remove_snapshot_file(self, index: int) -> None:
        """Delete the data file written for a snapshot at ``index`` unless it is in use."""
        self._remove_snapshot_file(f"snapshot-{index:020d}.bin")

    def persist(self, ready: Ready) -> None:
        """Write a Ready's snapshot (if any), entries and hard state in one batch.

        The snapshot's data file is written (and fsynced) before the batch that points
        to it. The batch is synced when ``ready.must_sync``.

        Raises:
            StorageError: the write failed; the node must stop.
            SnapshotOutOfDateError: ``ready.snapshot`` is not newer than the stored one.
            ValueError: the entries are not consecutive or leave a gap.
        """
        batch = self._db.new_batch()
        old_file = self._snapshot_file
        if ready.snapshot is not None:
            self._stage_apply_snapshot(batch, ready.snapshot)
        self._stage_append(batch, ready.entries)
        if ready.hard_state is not None:
            self._stage_hard_state(batch, ready.hard_state)
        self._db.write_batch(batch, ready.must_sync)
        if ready.snapshot is not None:
            self._remove_snapshot_file(old_file)

    def set_hard_state(self, hard_state: HardState) -> None:
        """Persist ``hard_state`` (synced)."""
        batch = self._db.new_batch()
        self._stage_hard_state(batch, hard_state)
        self._db.write_batch(batch, True)

    def append(self, entries: tuple[Entry, ...] | list[Entry]) -> None:
        """Append ``entries`` (synced), first deleting stored entries from the first one on.

        Entries at or before the log start are ignored (already covered).

        Raises:
            ValueError: if the entries are not consecutive or would leave a gap.
        """
        batch = self._db.new_batch()
        self._stage_append(batch, entries)
        self._db.write_batch(batch, True)

    def apply_snapshot(self, snapshot: Snapshot) -> None:
        """Replace the whole log with ``snapshot`` received from the leader (synced).

        Raises:
            SnapshotOutOfDateError: if ``snapshot`` is not newer than the stored one.
        """
        self.persist(Ready(snapshot=snapshot, must_sync=True))

    def write_snapshot_file(self, index: LogIndex, data: bytes) -> str:
        """Write snapshot data durably to its file (no metadata); call from a worker thread.

        :meth:`compact` with a snapshot of that index and data then skips the write.

        Returns:
            The file name inside ``snapshot_dir``.

        Raises:
            StorageError: the file cannot be written.
        """
        name = f"snapshot-{index:020d}.bin"
        path = os.path.join(self._snapshot_dir, name)
        temp = path + ".tmp"
        try:
            with open(temp, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temp, path)
            directory = os.open(self._snapshot_dir, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as exc:
            raise storage_error(f"cannot write snapshot file {path!r}", exc) from exc
        return name

    def compact(self, snapshot: Snapshot, *, keep_entries: int = 0) -> None:
        """Store a locally taken ``snapshot`` and drop log entries it covers.

        Args:
            snapshot: From ``RaftCore.compact``.
            keep_entries: Keep up to this many entries at and before the snapshot index,
                so slightly lagging followers catch up from the log instead of needing
                the snapshot (etcd's ``SnapshotCatchUpEntries``). With 0 the log starts
                right after the snapshot, as the Storage contract describes.

        Raises:
            SnapshotOutOfDateError: if ``snapshot`` is not newer than the stored one.
            UnavailableError: if its index is past the last stored entry.
            ValueError: if its term disagrees with the stored entry at its index.
            StorageError: the write failed.
        """
        index = snapshot.metadata.index
        if index <= self._snapshot_meta.index:
            raise SnapshotOutOfDateError(
                f"snapshot at {index} is not newer than the stored one "
                f"at {self._snapshot_meta.index}"
            )
        if index > self.last_index():
            raise UnavailableError(f"cannot compact to {index} past last index {self.last_index()}")
        if index < self._log_start[0] or self.term(index) != snapshot.metadata.term:
            raise ValueError(
                f"snapshot term {snapshot.metadata.term} differs from the log's term at {index}"
            )
        old_file = self._snapshot_file
        name = f"snapshot-{index:020d}.bin"
        if not os.path.exists(os.path.join(self._snapshot_dir, name)):
            name = self.write_snapshot_file(index, snapshot.data)
        new_start = LogIndex(max(self._log_start[0], index - keep_entries))
        batch = self._db.new_batch()
        self._snapshot_meta = snapshot.metadata
        self._snapshot_file = name
        self._snapshot_data = snapshot.data
        self._put_snapshot_meta(batch)
        self._truncate_front(batch, new_start)
        self._db.write_batch(batch, False)
        if old_file != name:
            self._remove_snapshot_file(old_file)

    # --- staging ------------------------------------------------------------------------

    def _put_snapshot_meta(self, batch: WriteBatch) -> None:
        meta = self._snapshot_meta
        value = _pack(
            [
                meta.index,
                meta.term,
                sorted(meta.membership.voters),
                sorted(meta.membership.learners),
                self._snapshot_file,
                encode_registry(meta.registry),
            ]
        )
        batch.put(_SNAPSHOT, value, self._state_handle)
        batch.put(_LOG_START, _pack(list(self._log_start)), self._state_handle)

    def _stage_hard_state(self, batch: WriteBatch, hard_state: HardState) -> None:
        batch.put(
            _HARD_STATE,
            _pack([hard_state.term, hard_state.vote, hard_state.commit]),
            self._state_handle,
        )
        self._hard_state = hard_state

    def _stage_apply_snapshot(self, batch: WriteBatch, snapshot: Snapshot) -> None:
        metadata = snapshot.metadata
        if metadata.index <= self._snapshot_meta.index:
            raise SnapshotOutOfDateError(
                f"snapshot at {metadata.index} is not newer than the stored one "
                f"at {self._snapshot_meta.index}"
            )
        name = self.write_snapshot_file(metadata.index, snapshot.data)
        batch.delete_range(log_key(0), _MAX_KEY, self._log_handle)
        self._terms = []
        self._cache.clear()
        self._cached_bytes = 0
        self._log_start = (metadata.index, metadata.term)
        self._snapshot_meta = metadata
        self._snapshot_file = name
        self._snapshot_data = snapshot.data
        self._put_snapshot_meta(batch)

    def _stage_append(self, batch: WriteBatch, entries: tuple[Entry, ...] | list[Entry]) -> None:
        if not entries:
            return
        last = self.last_index()
        check_appendable(entries, last)
        start = self._log_start[0]
        kept = [e for e in entries if e.index > start]
        if not kept:
            return
        first_kept = kept[0].index
        if first_kept <= last:
            # Paper §5.3: a conflicting suffix is deleted before the new entries go in.
            batch.delete_range(log_key(first_kept), log_key(last + 1), self._log_handle)
            del self._terms[first_kept - start - 1 :]
            while self._cache and self._cache[-1].index >= first_kept:
                self._cached_bytes -= self._cache.pop().size_bytes()
        handle = self._log_handle
        for entry in kept:
            batch.put(log_key(entry.index), _encode_entry(entry), handle)
            self._terms.append(entry.term)
        if self._cache and self._cache[-1].index + 1 != first_kept:
            self._cache.clear()
            self._cached_bytes = 0
        for entry in kept:
            self._cache.append(entry)
            self._cached_bytes += entry.size_bytes()
        while self._cached_bytes > self._cache_bytes and len(self._cache) > 1:
            self._cached_bytes -= self._cache.popleft().size_bytes()

    def _truncate_front(self, batch: WriteBatch, new_start: LogIndex) -> None:
        old_start = self._log_start[0]
        if new_start <= old_start:
            return
        new_start_term = self.term(new_start)
        batch.delete_range(log_key(0), log_key(new_start + 1), self._log_handle)
        del self._terms[: new_start - old_start]
        self._log_start = (new_start, new_start_term)
        batch.put(_LOG_START, _pack(list(self._log_start)), self._state_handle)
        while self._cache and self._cache[0].index <= new_start:
            self._cached_bytes -= self._cache.popleft().size_bytes()

    # --- files ----------------------------------------------------------------------------

    def _snapshot_path(self) -> str:
        return os.path.join(self._snapshot_dir, self._snapshot_file)

    def _remove_snapshot_file(self, name: str) -> None:
        if not name or name == self._snapshot_file:
            return
        try:
            os.remove(os.path.join(self._snapshot_dir, name))
        except FileNotFoundError:
            pass
        except OSError:
            pass  # a stale file wastes space but harms nothing; the next one retries


__all__ = ["LOG_FAMILY", "STATE_FAMILY", "RocksStorage", "StoreIdentity", "log_key"]
