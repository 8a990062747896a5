"""Each shard's data directory knows which shard it is (``docs/sharding.md``, "Ports and data").

``DATA_DIR/SHARDS`` fixes a node's shard count, but nothing said which ``shard-K``
directory holds which shard's data: swapped ``shard-0`` and ``shard-1`` started without
a word, each shard refusing (WRONG_SHARD) or never dispatching the topics it found, so
acknowledged messages were never delivered; in a cluster the swapped replicas stayed
diverged. A directory that went missing started empty, silently losing a single
node's messages.

* :func:`check_shard_stamp`: the stamp ``[index, count]`` lives in RocksDB's
  ``raft_state`` family (local to the directory: not in Raft snapshots or backups, so a
  snapshot from shard K of another node or a restored backup never carries another
  directory's stamp), so it moves with the data. A new directory is stamped before
  anything else is written, one from a build without the stamp on its first open; a
  directory stamped for another index or count is refused.
* :func:`check_not_a_shard` and :func:`read_directory_stamp`: a stamped shard
  directory started as a node of its own (``--data-dir DATA_DIR/shard-1``) is refused:
  it would acknowledge publishes for topics other shards own, stranded once the node
  runs again.
* :func:`check_shard_present`: before RocksDB creates it, a shard directory that is
  missing, empty or holds no RocksDB (only ``lost+found``: a new volume mounted there)
  while the node's data directory shows the node held data (the
  ``SHARDS`` stamp, its first start complete) is lost data on a single node, refused
  unless the operator says otherwise (:data:`START_EMPTY_SUFFIX`); on a cluster node it
  is a wiped disk, which Raft's recovery handles (``docs/raft.md``, "Disk faults").
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Final

import msgpack

from futureq.errors import ConfigError
from futureq.shards.layout import (
    FIRST_START_FILE,
    holds_data,
    holds_rocksdb,
    read_stamp,
    shard_data_dir,
)
from futureq.storage.db import STATE_FAMILY

if TYPE_CHECKING:
    from futureq.storage.db import Database

log = logging.getLogger(__name__)

SHARD_KEY: Final = b"shard"
"""Key in ``raft_state`` of the stamp: msgpack ``[shard index, shard count]``."""
START_EMPTY_SUFFIX: Final = ".start-empty"
"""``DATA_DIR/shard-K.start-empty``: the operator's leave for a single node's shard
``K`` whose directory is gone to start empty once (its messages are lost); removed
once the new directory is stamped."""


def start_empty_marker(node_dir: str, index: int) -> str:
    """``DATA_DIR/shard-K.start-empty`` (:data:`START_EMPTY_SUFFIX`)."""
    return shard_data_dir(node_dir, index) + START_EMPTY_SUFFIX


def check_shard_present(node_dir: str, index: int, *, clustered: bool) -> None:
    """Refuse to start shard ``index`` of a single node empty when it held data.

    Call before RocksDB opens (which creates the directory). Nothing to check when the
    directory holds a RocksDB (its ``CURRENT`` file: the stamp lives in it, so nothing
    else proves this shard's data is there; any other entry, such as the
    ``lost+found`` of a volume newly formatted and mounted there, does not), when the node has no ``SHARDS`` stamp (restored or made
    by hand) or when its first start is not complete (a shard that never started has
    no directory yet).

    Raises:
        ConfigError: a single node's shard directory is missing, empty or holds no
            RocksDB, and the
            operator did not create :func:`start_empty_marker`.
    """
    directory = shard_data_dir(node_dir, index)
    if holds_rocksdb(directory) or read_stamp(node_dir) is None:
        return
    if os.path.exists(os.path.join(node_dir, FIRST_START_FILE)):
        return
    if not os.path.isdir(directory):
        state = "missing"
    elif holds_data(directory):
        state = f"there but holds no RocksDB (only {_entries(directory)})"
    else:
        state = "empty"
    if clustered:
        log.warning(
            "%s is %s, though this node's shards held data (%s): shard %d starts with an "
            "empty directory, as after a wiped disk, and recovers its data from the other "
            "members of its Raft group (docs/raft.md, 'Disk faults'); if the directory was "
            "moved, stop the node and put it back",
            directory,
            state,
            os.path.join(node_dir, "SHARDS"),
            index,
        )
        return
    marker = start_empty_marker(node_dir, index)
    if os.path.exists(marker):
        log.warning(
            "%s is %s and %s exists: shard %d starts empty, as asked; the messages it "
            "held are lost",
            directory,
            state,
            marker,
            index,
        )
        return
    raise ConfigError(
        f"{directory} is {state}, but this node's shards held data ({node_dir} records "
        f"{read_stamp(node_dir)} shards): shard {index}'s acknowledged messages are gone "
        f"unless that directory is restored; put it back (or restore a backup) and start "
        f"again. To start shard {index} empty knowingly, losing its messages, create "
        f"the file {marker} and start again"
    )


def check_shard_stamp(db: Database, node_dir: str, index: int, count: int) -> None:
    """Check the stamp of shard ``index`` of ``count``'s open database, or write it.

    Raises:
        ConfigError: the directory is stamped for another shard index or count.
        StorageError: the stamp cannot be read or written.
    """
    raw = db.get(STATE_FAMILY, SHARD_KEY)
    if raw is None:
        db.write({STATE_FAMILY: {SHARD_KEY: msgpack.packb([index, count])}}, sync=True)
        log.info("stamped %s as shard %d of %d", db.path, index, count)
        marker = start_empty_marker(node_dir, index)
        try:
            os.remove(marker)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove %s: %s; remove it by hand", marker, exc)
        return
    try:
        found_index, found_count = msgpack.unpackb(raw)
        found_index, found_count = int(found_index), int(found_count)
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"the shard stamp in {db.path} is damaged ({raw!r}); this directory's shard is unknown"
        ) from exc
    if (found_index, found_count) == (index, count):
        return
    if found_count != count:
        raise ConfigError(
            f"{db.path} holds the data of shard {found_index} of a node of {found_count} "
            f"shards, not shard {index} of this node's {count}: it was copied or moved here "
            f"from another node's data directory; put back this node's own shard-{index} "
            "directory (nothing was changed)"
        )
    home = shard_data_dir(node_dir, found_index)
    raise ConfigError(
        f"{db.path} holds the data of shard {found_index}, not shard {index} (each shard "
        f"directory is stamped with its shard when it is created): the shard directories "
        f"were moved or swapped; stop the node and put each back where it was (this one is "
        f"{home}), then start again (nothing was changed)"
    )


def _entries(directory: str, most: int = 3) -> str:
    """Up to ``most`` entry names of ``directory``, sorted and quoted, for a message."""
    names = sorted(os.listdir(directory))
    shown = ", ".join(repr(name) for name in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _not_a_node_error(path: str, index: int, count: int) -> ConfigError:
    parent = os.path.dirname(os.path.abspath(path))
    if read_stamp(parent) == count and os.path.basename(os.path.normpath(path)) == (
        f"shard-{index}"
    ):
        node = f"start the node's data directory instead: futureq start --data-dir {parent}"
    else:
        node = (
            "start the node's data directory instead (the one this came from, holding "
            f"SHARDS and shard-0 to shard-{count - 1}): futureq start --data-dir DATA_DIR"
        )
    return ConfigError(
        f"{path} is shard {index}'s directory of a node of {count} shards (it is stamped "
        f"so), not a node's data directory: started on its own it would acknowledge "
        f"publishes for topics that other shards own, never delivered once the node runs "
        f"again; {node} (node.shards {count} or auto); nothing was changed"
    )


def check_not_a_shard(db: Database) -> None:
    """Refuse a node of one process (``node.shards = 1``) whose open database is a
    shard's directory (it carries a shard stamp): ``--data-dir DATA_DIR/shard-K``.

    Raises:
        ConfigError: naming the node's data directory to start instead.
    """
    raw = db.get(STATE_FAMILY, SHARD_KEY)
    if raw is None:
        return
    try:
        index, count = (int(part) for part in msgpack.unpackb(raw))
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"{db.path} carries a damaged shard stamp ({raw!r}): it is a shard's directory "
            "of a sharded node, not a node's data directory; start that node's data "
            "directory instead"
        ) from exc
    raise _not_a_node_error(db.path, index, count)


def read_directory_stamp(path: str) -> tuple[int, int] | None:
    """The shard stamp ``(index, count)`` of the RocksDB in ``path``, read without
    changing it (RocksDB opened read-only, also while a process has it open); None
    when ``path`` holds no RocksDB or it has no stamp.

    Raises:
        ConfigError: the stamp is damaged.
        StorageError: the RocksDB cannot be read.
    """
    from rocksdict import AccessType, Options, Rdict

    from futureq.storage.db import storage_error

    if not holds_rocksdb(path):
        return None
    try:
        db = Rdict(
            path,
            Options(raw_mode=True),
            column_families={STATE_FAMILY: Options(raw_mode=True)},
            access_type=AccessType.read_only(),
        )
    except Exception as exc:  # rocksdict raises plain Exception subclasses
        raise storage_error(f"cannot read the shard stamp in {path!r}", exc) from exc
    try:
        raw = db.get_column_family(STATE_FAMILY).get(SHARD_KEY)
    finally:
        db.close()
    if raw is None:
        return None
    try:
        index, count = (int(part) for part in msgpack.unpackb(raw))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"the shard stamp in {path} is damaged ({raw!r})") from exc
    return index, count


def check_directory_not_a_shard(path: str) -> None:
    """:func:`check_not_a_shard` before opening for writing (read-only).

    Raises:
        ConfigError: ``path`` is a stamped shard directory.
        StorageError: its RocksDB cannot be read.
    """
    stamp = read_directory_stamp(path)
    if stamp is not None:
        raise _not_a_node_error(path, *stamp)
