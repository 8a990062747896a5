"""Tools on a node's data directory: what kind of data it holds, growing a single node
into a cluster, online backup and restore (``docs/operations.md``, "Backup and restore"
and "Growing a single node into a cluster").

A data directory is one of three kinds (:func:`data_kind`):

* ``blank``: nothing applied and no Raft state (a new node);
* ``single``: a single node's data: the queue state at some applied index, and the
  single-node command log (``raft_log`` entries in the single-node layout, trimmed as
  they are applied; no ``raft_state``);
* ``cluster``: a cluster node's data: Raft's hard state, snapshot and log beside the
  queue state.

A single node's log cannot serve as a Raft log (its entries carry no terms and its
start is trimmed), so a ``single`` directory becomes a cluster node by turning its
state into a Raft snapshot (:func:`convert_to_cluster`): the snapshot covers the applied
index, has term 1 and the membership ``{node_id}``; the node then starts as the one
voter of a new cluster, and the others join it (learners, promoted once caught up).
A backup is the queue state at one applied index (:func:`write_backup`, read from a
running node through a RocksDB secondary instance, so the node keeps serving);
:func:`restore_backup` lays it into an empty directory the same way.

Backup file format (version 1): one msgpack value ``["futureq-backup", 1, info]``
(``info``: a map with ``index``, ``created_ms``, ``server_version``, ``source``), then
the state snapshot bytes of :mod:`futureq.state.snapshot` (which carry their own
applied index, record count and CRC-32).

A sharded node's backup (:func:`write_node_backup`, ``docs/sharding.md``): one msgpack
value ``["futureq-node-backup", 1, {"shards": N, "created_ms", "server_version"}]``,
then for each shard ``K`` in order an 8-byte big-endian length and that many bytes: a
version-1 backup of ``DATA_DIR/shard-K``. Each shard's part is its state at one applied
index of its own Raft group; the shards are read one after another, not at one instant
(there is no cross-shard atomicity to keep: every command touches one shard).

Source: Raft paper §7 (snapshots); thesis §4.2.1 (adding servers as learners first).
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import IO, Final, Literal

import attrs
import msgpack
from rocksdict import AccessType, Options, Rdict, RdictIter, ReadOptions

from futureq import __version__
from futureq.clock import SystemClock
from futureq.config import Config
from futureq.errors import ConfigError, StorageError
from futureq.raft.basics import LogIndex, NodeId, Term
from futureq.state import snapshot
from futureq.state.queue_state import QueueState
from futureq.storage.db import FAMILIES, LOG_FAMILY, SCHEMA_VERSION, STATE_FAMILY, Database

# The Raft message classes and RocksStorage are imported where a directory's Raft state is
# read or written (data_kind, conversion, restore), not here: the broker imports this
# module on every start for check_data_fits_mode, and a single node runs no Raft.

BACKUP_MAGIC: Final = "futureq-backup"
BACKUP_VERSION: Final = 1
NODE_BACKUP_MAGIC: Final = "futureq-node-backup"
NODE_BACKUP_VERSION: Final = 1
FIRST_TERM: Final = Term(1)
"""Term of the snapshot a converted or restored node starts from."""
_RAFT_KEYS: Final = (b"snapshot", b"hard_state")
_MAX_KEY: Final = b"\xff" * 8

DataKind = Literal["blank", "single", "cluster"]


@attrs.frozen
class BackupInfo:
    """What a backup holds.

    Attributes:
        index: The applied index the state covers (Raft log index on a cluster node).
        created_ms: When it was taken (ms since the Unix epoch, the backup host's clock).
        server_version: FutureQ version that wrote it.
        source: Kind of the data directory it was taken from (``single``/``cluster``).
        size_bytes: Bytes of state (the snapshot part).
    """

    index: int
    created_ms: int
    server_version: str
    source: str
    size_bytes: int


def snapshot_dir(data_dir: str) -> str:
    """Where a cluster node keeps its Raft snapshot files."""
    return os.path.join(data_dir, "snapshots")


def _applied_index(db: Database) -> int:
    raw = db.get("meta", snapshot.APPLIED_INDEX_KEY)
    return 0 if raw is None else int.from_bytes(raw, "big")


def data_kind(db: Database) -> DataKind:
    """Which kind of data ``db`` holds (module docstring).

    A directory whose Raft state is still the pristine bootstrap (no membership, no
    entries, term 0) but whose queue state has applied entries is a ``single``
    directory whose conversion was interrupted; converting it again finishes the job.
    """
    has_raft = any(db.get(STATE_FAMILY, key) is not None for key in _RAFT_KEYS)
    applied = _applied_index(db)
    if has_raft:
        from futureq.raft.rocks_storage import RocksStorage
        from futureq.raft.values import HardState

        storage = RocksStorage(db, snapshot_dir(db.path))
        meta = storage.snapshot_metadata()
        pristine = (
            meta.index == 0
            and not meta.membership.voters
            and not meta.membership.learners
            and storage.hard_state() == HardState()
            and storage.last_index() == 0
        )
        if not pristine:
            return "cluster"
        return "single" if applied > 0 else "blank"
    if applied > 0 or db.last_key(LOG_FAMILY) is not None:
        return "single"
    return "blank"


def check_data_fits_mode(db: Database, *, clustered: bool) -> None:
    """Refuse to run a single node on a cluster node's data, or a cluster node on a
    single node's data (cheap: a few point reads, no log scan).

    Raises:
        ConfigError: with the command that fixes it.
    """
    has_raft = any(db.get(STATE_FAMILY, key) is not None for key in _RAFT_KEYS)
    if clustered and not has_raft and (_applied_index(db) > 0 or db.last_key(LOG_FAMILY)):
        raise ConfigError(
            f"{db.path} holds a single node's data (applied index {_applied_index(db)}), "
            "which cannot join a cluster as it is; stop the node and run `futureq "
            f"convert-to-cluster --data-dir {db.path} --node-id N` to make it the first node "
            "of a new cluster (docs/operations.md, 'Growing a single node into a cluster')"
        )
    if not clustered and has_raft:
        raise ConfigError(
            f"{db.path} holds a cluster node's data (Raft state); started alone it would "
            "fork from its cluster: start it with --peers or --join, or restore a backup "
            "into a new directory with `futureq restore --single-node`"
        )


def _lay_out_cluster_node(db: Database, node_id: int, data: bytes, index: int) -> None:
    """Make ``db`` (queue state already at ``index``) the data of the only voter of a
    new cluster: a Raft snapshot at ``index``, term :data:`FIRST_TERM`, membership
    ``{node_id}``, the log empty after it. The one place that lays out a cluster node's
    Raft state from a queue state (data-directory stamps belong here too)."""
    from futureq.raft.rocks_storage import RocksStorage
    from futureq.raft.values import HardState, Membership, Snapshot, SnapshotMetadata

    db.delete_range(LOG_FAMILY, b"", _MAX_KEY)  # every entry is applied: none is needed
    storage = RocksStorage(db, snapshot_dir(db.path))
    membership = Membership(voters=frozenset({NodeId(node_id)}))
    if index == 0:
        storage.bootstrap(membership)
        return
    metadata = SnapshotMetadata(LogIndex(index), FIRST_TERM, membership)
    storage.apply_snapshot(Snapshot(metadata, data))
    storage.set_hard_state(HardState(term=FIRST_TERM, vote=None, commit=LogIndex(index)))


def _open(config: Config) -> Database:
    return Database(
        config.server.data_dir,
        write_buffer_mb=config.storage.write_buffer_mb,
        block_cache_mb=config.storage.block_cache_mb,
        strict_wal=not config.cluster.clustered
        and config.storage.wal_recovery == "strict",  # as the node opens it
    )


def convert_to_cluster(config: Config) -> int:
    """Turn the single node's data in ``server.data_dir`` into node ``server.node_id``
    of a new cluster, losing nothing: entries written but not applied are applied
    first, then the whole state becomes the Raft snapshot (module docstring).

    The node must be stopped (RocksDB's lock refuses a second opener).

    Returns:
        The applied index the cluster starts from.

    Raises:
        ConfigError: the directory already holds a cluster node's data.
        StorageError: RocksDB cannot be opened (e.g. the node still runs) or fails.
    """
    # Imported here: the broker package pulls in trio-heavy modules this tool needs not.
    from futureq.broker.command_log import SingleNodeLog

    db = _open(config)
    try:
        kind = data_kind(db)
        if kind == "cluster":
            raise ConfigError(
                f"{config.server.data_dir} already holds a cluster node's data (Raft state); "
                "there is nothing to convert"
            )
        state = QueueState(db)  # commands carry their group settings: nothing node-local
        if kind == "single" and not any(db.get(STATE_FAMILY, k) is not None for k in _RAFT_KEYS):
            SingleNodeLog(db, state, address=None).recover()
        index = state.applied_index
        data = b""
        if index > 0:
            source = state.snapshot_source()
            try:
                data = source.serialize()
            finally:
                source.close()
        _lay_out_cluster_node(db, config.server.node_id, data, index)
        return index
    finally:
        db.close()


class _SecondaryView:
    """A point-in-time view of the state families of a RocksDB another process may be
    writing (a RocksDB secondary instance, caught up once, then read by iterators)."""

    def __init__(self, path: str) -> None:
        self._scratch = tempfile.mkdtemp(prefix="futureq-backup-")
        families = {name: Options(raw_mode=True) for name in FAMILIES}
        try:
            self._db: Rdict | None = Rdict(
                path,
                Options(raw_mode=True),
                column_families=families,
                access_type=AccessType.secondary(self._scratch),
            )
            self._db.try_catch_up_with_primary()
        except Exception as exc:  # rocksdict raises plain Exception subclasses
            shutil.rmtree(self._scratch, ignore_errors=True)
            raise StorageError(f"cannot read RocksDB at {path!r}: {exc}") from exc
        self._iterators: dict[str, RdictIter] = {
            name: self._db.get_column_family(name).iter(ReadOptions()) for name in FAMILIES
        }

    def get(self, family: str, key: bytes) -> bytes | None:
        iterator = self._iterators[family]
        iterator.seek(key)
        if iterator.valid() and iterator.key() == key:
            value: bytes = iterator.value()
            return value
        return None

    def scan(
        self, family: str, start: bytes, stop: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        iterator = self._iterators[family]
        iterator.seek(start)
        while iterator.valid():
            key: bytes = iterator.key()
            if stop is not None and key >= stop:
                return
            yield key, iterator.value()
            iterator.next()

    def close(self) -> None:
        if self._db is None:
            return
        self._iterators.clear()
        db, self._db = self._db, None
        db.close()
        del db
        shutil.rmtree(self._scratch, ignore_errors=True)


def write_backup(data_dir: str, out: IO[bytes], *, now_ms: int | None = None) -> BackupInfo:
    """Write a backup of the queue state in ``data_dir`` to ``out``; the node may be
    running (it keeps serving) or stopped.

    The state is read at one applied index: everything applied up to it (on a cluster
    node, committed Raft entries only), nothing after it.

    Raises:
        ConfigError: ``data_dir`` holds no FutureQ data.
        StorageError: RocksDB cannot be read, or has another schema version.
    """
    if not os.path.isdir(data_dir):
        raise ConfigError(f"{data_dir} is not a directory")
    view = _SecondaryView(data_dir)
    try:
        schema = view.get("meta", b"schema_version")
        if schema is None:
            raise ConfigError(f"{data_dir} holds no FutureQ data")
        if int.from_bytes(schema, "big") != SCHEMA_VERSION:
            raise StorageError(
                f"{data_dir} has schema version {int.from_bytes(schema, 'big')}; this build "
                f"reads version {SCHEMA_VERSION}"
            )
        raw_index = view.get("meta", snapshot.APPLIED_INDEX_KEY)
        index = 0 if raw_index is None else int.from_bytes(raw_index, "big")
        source_kind = "cluster" if view.get(STATE_FAMILY, b"snapshot") is not None else "single"
        data = snapshot.SnapshotSource(view, index).serialize()
    finally:
        view.close()
    info = BackupInfo(
        index=index,
        created_ms=SystemClock().wall_ms() if now_ms is None else now_ms,
        server_version=__version__,
        source=source_kind,
        size_bytes=len(data),
    )
    out.write(
        msgpack.packb(
            [
                BACKUP_MAGIC,
                BACKUP_VERSION,
                {
                    "index": info.index,
                    "created_ms": info.created_ms,
                    "server_version": info.server_version,
                    "source": info.source,
                },
            ],
            use_bin_type=True,
        )
    )
    out.write(data)
    out.flush()
    return info


def write_node_backup(
    data_dir: str, shards: int, out: IO[bytes], *, now_ms: int | None = None
) -> list[BackupInfo]:
    """Write a backup of every shard of the sharded node in ``data_dir`` (``shard-K``
    subdirectories; format in the module doc); the node may be running.

    Args:
        data_dir: The node's data directory (``server.data_dir``), stamped ``shards``.
        shards: The node's shard count (its ``SHARDS`` stamp).
        out: Where to write; one shard's part is held in memory at a time.

    Returns:
        Each shard's :class:`BackupInfo`, by shard number.

    Raises:
        ConfigError, StorageError: as :func:`write_backup`, for any shard.
    """
    from futureq.shards.layout import shard_data_dir

    created_ms = SystemClock().wall_ms() if now_ms is None else now_ms
    out.write(
        msgpack.packb(
            [
                NODE_BACKUP_MAGIC,
                NODE_BACKUP_VERSION,
                {"shards": shards, "created_ms": created_ms, "server_version": __version__},
            ],
            use_bin_type=True,
        )
    )
    infos: list[BackupInfo] = []
    for shard in range(shards):
        part = io.BytesIO()
        infos.append(write_backup(shard_data_dir(data_dir, shard), part, now_ms=created_ms))
        raw = part.getbuffer()
        out.write(len(raw).to_bytes(8, "big"))
        out.write(raw)
        del raw
    out.flush()
    return infos


def read_node_backup(raw: bytes) -> list[bytes] | None:
    """The shards' parts of a sharded node's backup (each a version-1 backup, checked
    whole by :func:`read_backup`), or None when ``raw`` is not a node backup.

    Raises:
        ConfigError: a node backup of another version, or damaged (truncated, a part
            that is not a valid backup, a wrong shard count).
    """
    unpacker = msgpack.Unpacker(io.BytesIO(raw), raw=False, max_buffer_size=1 << 20)
    try:
        header = next(unpacker)
    except Exception:
        return None
    if not (isinstance(header, list) and len(header) == 3 and header[0] == NODE_BACKUP_MAGIC):
        return None
    if header[1] != NODE_BACKUP_VERSION:
        raise ConfigError(
            f"node backup format version {header[1]}; this build reads version "
            f"{NODE_BACKUP_VERSION}"
        )
    shards = header[2].get("shards") if isinstance(header[2], dict) else None
    if type(shards) is not int or shards < 1:
        raise ConfigError(f"the node backup is damaged: its header names {shards!r} shards")
    parts: list[bytes] = []
    offset = unpacker.tell()
    for shard in range(shards):
        if offset + 8 > len(raw):
            raise ConfigError(f"the node backup is damaged: it ends before shard {shard}")
        size = int.from_bytes(raw[offset : offset + 8], "big")
        offset += 8
        if offset + size > len(raw):
            raise ConfigError(f"the node backup is damaged: shard {shard}'s part is cut short")
        part = raw[offset : offset + size]
        try:
            read_backup(part)
        except ConfigError as exc:
            raise ConfigError(f"shard {shard}'s part of the node backup: {exc}") from None
        parts.append(part)
        offset += size
    if offset != len(raw):
        raise ConfigError(
            f"the node backup is damaged: {len(raw) - offset} bytes follow its last shard"
        )
    return parts


def read_backup(raw: bytes) -> tuple[BackupInfo, bytes]:
    """Check a backup file's bytes whole; return its info and state snapshot bytes.

    Raises:
        ConfigError: not a FutureQ backup, another version, or damaged (the sentence
            says which).
    """
    unpacker = msgpack.Unpacker(io.BytesIO(raw), raw=False, max_buffer_size=1 << 20)
    try:
        header = next(unpacker)
    except Exception:
        raise ConfigError("not a FutureQ backup (no header)") from None
    if isinstance(header, list) and len(header) == 3 and header[0] == NODE_BACKUP_MAGIC:
        shards = header[2].get("shards") if isinstance(header[2], dict) else None
        raise ConfigError(
            f"this is the backup of a whole node of {shards} shards: restore it into the "
            f"node's data directory with --shards {shards}, not into one shard's"
        )
    if not (isinstance(header, list) and len(header) == 3 and header[0] == BACKUP_MAGIC):
        raise ConfigError("not a FutureQ backup (wrong header)")
    if header[1] != BACKUP_VERSION:
        raise ConfigError(
            f"backup format version {header[1]}; this build reads version {BACKUP_VERSION}"
        )
    data = raw[unpacker.tell() :]
    try:
        index = snapshot.snapshot_index(data)
    except snapshot.CorruptSnapshotError as exc:
        raise ConfigError(f"the backup is damaged: {exc}") from None
    fields = header[2]
    if fields.get("index") != index:
        raise ConfigError(
            f"the backup is damaged: its header says index {fields.get('index')}, its state {index}"
        )
    info = BackupInfo(
        index=index,
        created_ms=int(fields.get("created_ms", 0)),
        server_version=str(fields.get("server_version", "")),
        source=str(fields.get("source", "")),
        size_bytes=len(data),
    )
    return info, data


def restore_backup(config: Config, raw: bytes, *, single_node: bool = False) -> BackupInfo:
    """Lay a backup into the empty ``server.data_dir``: as node ``server.node_id``, the
    one voter of a new cluster (others then join it), or with ``single_node`` as a
    single node's data.

    Raises:
        ConfigError: the backup is not valid, or the directory is not empty of data.
        StorageError: RocksDB cannot be opened or fails.
    """
    info, data = read_backup(raw)
    db = _open(config)
    try:
        kind = data_kind(db)
        if kind != "blank":
            raise ConfigError(
                f"{config.server.data_dir} already holds a {kind} node's data; restore "
                "into an empty data directory"
            )
        if info.index > 0:
            QueueState(db).restore(data, info.index)
        if not single_node:
            _lay_out_cluster_node(db, config.server.node_id, data, info.index)
        return info
    finally:
        db.close()
