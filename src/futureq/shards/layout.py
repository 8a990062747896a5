"""Where shard ``K`` of a node keeps its data and listens, and the shard-count stamp.

Shard ``K`` of a node started with ``node.shards = N > 1``:

* keeps its RocksDB in ``DATA_DIR/shard-K``;
* listens on every port of the node plus ``K * node.shard_port_stride`` (client, HTTP,
  Raft), and announces addresses shifted the same way (``server.advertise``,
  ``cluster.advertise_raft``, each address of ``cluster.peers`` and ``cluster.join``),
  so shard ``K`` of every node forms one Raft group with the same members;
* shard 0 therefore answers on the node's own client port.

``DATA_DIR/SHARDS`` holds the shard count, written when the node's data is created;
starting the same data directory with another count is refused (moving topics between
shards is not done yet), and so is a ``SHARDS`` the shard directories' stamps contradict
(edited by hand: :func:`check_shard_count`). With ``N = 1`` nothing changes: no stamp, no subdirectory.

``node.shards = auto`` (the default) is resolved by :func:`resolve_shard_count`: the
stamp, else 1 for a directory that already holds data (a single node's, or one made by
a build from before sharding: existing data is never re-sharded), else the usable cores.

Source: ``docs/sharding.md``, "Ports and data".
"""

from __future__ import annotations

import os
import re

import attrs

from futureq.config import AUTO_SHARDS, Config, join_host_port, parse_peers, split_host_port
from futureq.errors import ConfigError
from futureq.shards.slots import SlotMap, even_map

STAMP_FILE = "SHARDS"
"""File in the data directory naming the node's shard count (one decimal line)."""

FIRST_START_FILE = "SHARDS.first-start"
"""Beside the stamp from its writing until every shard of that first start was ready:
a start that failed (a taken port) left a stamp, and a later start with another count
is told so, with what to do, instead of only that the count is fixed."""


def shift_address(address: str, offset: int) -> str:
    """``address`` (``HOST:PORT``, ``[v6]:PORT``) with ``offset`` added to its port."""
    host, port = split_host_port(address)
    return join_host_port(host, port + offset)


def shard_data_dir(data_dir: str, shard: int) -> str:
    """``DATA_DIR/shard-K``."""
    return os.path.join(data_dir, f"shard-{shard}")


def shard_config(config: Config, shard: int) -> Config:
    """The configuration shard ``shard`` of this node runs with (see the module doc).

    Args:
        config: The node's configuration, ``node.shards > 1``.
        shard: 0-based shard number, below ``node.shards``.

    Raises:
        ValueError: ``shard`` is out of range.
    """
    shards = config.node.shards
    if not 0 <= shard < shards:
        raise ValueError(f"shard {shard} does not exist; this node has {shards} shards")
    offset = shard * config.node.shard_port_stride
    server, cluster = config.server, config.cluster
    server = attrs.evolve(
        server,
        data_dir=shard_data_dir(server.data_dir, shard),
        listen=shift_address(server.listen, offset),
        http=shift_address(server.http, offset),
        advertise=None if server.advertise is None else shift_address(server.advertise, offset),
    )
    peers = ",".join(
        f"{node_id}={shift_address(address, offset)}"
        for node_id, address in parse_peers(cluster.peers).items()
    )
    cluster = attrs.evolve(
        cluster,
        raft_listen=shift_address(cluster.raft_listen, offset),
        advertise_raft=(
            None
            if cluster.advertise_raft is None
            else shift_address(cluster.advertise_raft, offset)
        ),
        peers=peers,
        join=None if cluster.join is None else shift_address(cluster.join, offset),
    )
    return attrs.evolve(config, server=server, cluster=cluster)


def node_slot_map(config: Config) -> SlotMap:
    """The node's slot map: slots spread evenly over its shards, each named by the
    client address it announces (``server.advertise``, else ``server.listen``)."""
    addresses = []
    for shard in range(config.node.shards):
        server = shard_config(config, shard).server if config.node.shards > 1 else config.server
        addresses.append(server.advertise or server.listen)
    return even_map(addresses)


@attrs.frozen
class ShardRole:
    """What a shard process knows of its place in the node.

    Attributes:
        index: This shard's number (0-based).
        slot_map: The node's slot map (which shard owns which topics, and where each
            shard listens on this node).
        port_stride: ``node.shard_port_stride``: shard ``K`` of every node listens on
            that node's ports plus ``K * port_stride``.
    """

    index: int
    slot_map: SlotMap
    port_stride: int = 100

    def owns(self, topic: str) -> bool:
        """True when ``topic`` hashes to one of this shard's slots."""
        return self.slot_map.shard_of(topic) == self.index


def shard_role(config: Config, shard: int) -> ShardRole:
    """Shard ``shard``'s :class:`ShardRole` in the node configured by ``config``."""
    return ShardRole(shard, node_slot_map(config), config.node.shard_port_stride)


def usable_cores() -> int:
    """How many CPUs this process may run on: ``os.process_cpu_count()`` (3.13+), else
    the scheduler's affinity mask, else ``os.cpu_count()``; at least 1."""
    counter = getattr(os, "process_cpu_count", None)
    if counter is not None:
        count = counter()
    elif hasattr(os, "sched_getaffinity"):
        count = len(os.sched_getaffinity(0))
    else:
        count = os.cpu_count()
    return max(1, count or 1)


def resolve_shard_count(config: Config) -> Config:
    """``config`` with ``node.shards = auto`` (:data:`AUTO_SHARDS`) replaced by a count:
    the one stamped in the data directory; 1 for a directory that holds a single node's
    data (no stamp); for a new directory the number of usable cores (capped at
    ``MAX_SHARDS``), which :func:`check_shard_count` then stamps, so later starts keep
    it whatever the machine. Any other count is returned unchanged.

    Raises:
        ConfigError: the stamp is unreadable, or the chosen count needs fixed ports
            that the configuration leaves to the OS (port 0 in a cluster).
    """
    from futureq.config_cross_checks import shard_port_problems

    if config.node.shards != AUTO_SHARDS:
        return config
    data_dir = config.server.data_dir
    count, _ = auto_count(data_dir)
    resolved = attrs.evolve(config, node=attrs.evolve(config.node, shards=count))
    problems = shard_port_problems(resolved)
    if problems:
        if any("must name a fixed port" in problem for problem in problems):
            remedy = (
                "give fixed ports, or --shards 1 (node.shards = 1) to run the node as one "
                "process on ports the OS chooses"
            )
        else:  # no room below 65536: the problem says what to lower
            remedy = "or run the node as one process with --shards 1 (node.shards = 1)"
        raise ConfigError(
            f"node.shards is auto (the default), which chose {count} shards for the "
            f"data directory {data_dir}, but {'; '.join(problems)}; {remedy}"
        )
    return resolved


def auto_count(data_dir: str) -> tuple[int, str]:
    """The shard count ``node.shards = auto`` gives ``data_dir``, and where it comes
    from: the stamp (``"stamp"``); 1 for a directory holding data without one
    (``"data"``); else the usable cores, at most ``MAX_SHARDS`` (``"cores"``).

    Raises:
        ConfigError: the stamp is unreadable (:func:`read_stamp`).
    """
    from futureq.shards.slots import MAX_SHARDS

    stamped = read_stamp(data_dir)
    if stamped is not None:
        return stamped, "stamp"
    if holds_data(data_dir):
        return 1, "data"
    return min(usable_cores(), MAX_SHARDS), "cores"


def read_stamp(data_dir: str) -> int | None:
    """The shard count stamped in ``data_dir``, or None when there is no stamp.

    Raises:
        ConfigError: the stamp is not a count of 1 to ``MAX_SHARDS`` (a damaged or
            hand-edited stamp: before, 0 or a negative one ran a single process writing
            its data beside the stamp, and 99 started 99 processes, then failed with a
            traceback).
    """
    from futureq.shards.slots import MAX_SHARDS

    path = os.path.join(data_dir, STAMP_FILE)
    try:
        with open(path, encoding="utf-8") as stamp:
            text = stamp.read().strip()
    except FileNotFoundError:
        return None
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_SHARDS:
        raise ConfigError(
            f"{path} should hold the node's shard count (1 to {MAX_SHARDS}, written when the "
            f"data directory was created), not {text!r}: it is damaged; write the count the "
            f"node was created with (the number of shard-K directories beside it)"
        )
    return count


def holds_data(data_dir: str) -> bool:
    """True when ``data_dir`` exists and has any entry."""
    try:
        with os.scandir(data_dir) as entries:
            return any(True for _ in entries)
    except FileNotFoundError:
        return False


def holds_rocksdb(directory: str) -> bool:
    """True when ``directory`` holds a RocksDB: its ``CURRENT`` file, which RocksDB
    writes when it creates a database and which names the live manifest. Other entries
    prove nothing (a newly formatted volume mounted there holds ``lost+found``)."""
    return os.path.isfile(os.path.join(directory, "CURRENT"))


SHARD_DIR_PATTERN = re.compile(r"shard-(\d+)")
"""Name of a shard's directory in a node's data directory (:func:`shard_data_dir`)."""


def shard_dirs(data_dir: str) -> dict[int, str]:
    """The ``shard-K`` directories in ``data_dir``: ``{K: path}``."""
    found: dict[int, str] = {}
    try:
        with os.scandir(data_dir) as entries:
            for entry in entries:
                match = SHARD_DIR_PATTERN.fullmatch(entry.name)
                if match and entry.is_dir():
                    found[int(match.group(1))] = entry.path
    except (FileNotFoundError, NotADirectoryError):
        pass
    return dict(sorted(found.items()))


def _check_stamp_file_missing(data_dir: str) -> None:
    """Refuse a data directory holding ``shard-K`` directories but no ``SHARDS`` file
    (deleted, or left behind by a copy): before, ``auto`` took it for a single node's
    data and created a new, empty RocksDB beside the shards, and ``--shards N`` was told
    it held a node of 1 shard. The count is what the directories' stamps say.

    Raises:
        ConfigError: shard directories without ``SHARDS``, with what to write in it.
        StorageError: a shard's RocksDB cannot be read.
    """
    # Empty ones hold nothing to protect (mount points made ahead, a restore's targets).
    found = {k: path for k, path in shard_dirs(data_dir).items() if holds_data(path)}
    if not found:
        return
    from futureq.shards.stamp import read_directory_stamp

    counts = set()
    for path in found.values():
        stamp = read_directory_stamp(path)
        if stamp is not None:
            counts.add(stamp[1])
    names = ", ".join(os.path.basename(path) for path in found.values())
    stamp_path = os.path.join(data_dir, STAMP_FILE)
    if len(counts) == 1:
        (count,) = counts
        said = f"their stamps say the node has {count} shards"
        remedy = (
            f"restore it with that count (echo {count} > {stamp_path}) and start again "
            f"(--shards {count} or the default auto)"
        )
    else:
        said = (
            "their stamps disagree on the shard count "
            f"({', '.join(str(c) for c in sorted(counts))})"
            if counts
            else "they carry no stamp that says the count"
        )
        remedy = (
            f"restore it (the count the node was created with, one line: echo N > "
            f"{stamp_path}; the shard directories were {names}) and start again"
        )
    raise ConfigError(
        f"{stamp_path} is missing, but {data_dir} holds shard directories ({names}), the "
        f"data of a sharded node; {said}. The file recording the node's shard count was "
        f"deleted or not copied; {remedy}. Nothing was changed (no store is created "
        "beside the shards)"
    )


def _check_stamp_matches_dirs(data_dir: str, stamped: int) -> None:
    """Refuse a ``SHARDS`` file that disagrees with the data beside it: the stamps of
    the ``shard-K`` directories holding a RocksDB, ``shard-K`` directories beyond the
    count, or a RocksDB in ``data_dir`` itself (a node of 1 shard) under a count of more.

    Before, ``SHARDS`` edited to 1 on a node of 2 shards started a new, empty single
    node whose RocksDB was created beside the shards (its acknowledged messages were
    ignored once ``SHARDS`` said 2 again), and edited to 3 it was told to start a third
    shard empty, which then refused itself as another node's copy. Directories that are
    empty or hold no RocksDB (mount points made ahead, a wiped or lost shard, whose own
    checks run when it starts) say nothing about the count.

    Raises:
        ConfigError: what ``SHARDS`` says, what the directories say, and what to do.
        StorageError: a shard's RocksDB cannot be read.
    """
    from futureq.shards.stamp import read_directory_stamp

    stamp_path = os.path.join(data_dir, STAMP_FILE)
    held = {k: path for k, path in shard_dirs(data_dir).items() if holds_rocksdb(path)}
    stamps = {k: read_directory_stamp(path) for k, path in held.items()}
    counts: dict[int, list[str]] = {}
    for k, stamp in stamps.items():
        if stamp is not None:
            counts.setdefault(stamp[1], []).append(f"shard-{k}")
    says = f"{stamp_path} says the node has {stamped} shard{'s' if stamped != 1 else ''}"
    nothing = "Nothing was changed (no store or shard directory is created)"
    if counts and stamped not in counts:
        if len(counts) == 1:
            ((count, names),) = counts.items()
            said = (
                f"the stamps of its shard directories ({', '.join(names)}) say it has "
                f"{count} shards"
            )
            remedy = (
                f"restore it to that count (echo {count} > {stamp_path}) and start again "
                f"(--shards {count} or the default auto)"
            )
        else:
            said = (
                "the stamps of its shard directories disagree on the count ("
                + "; ".join(
                    f"{', '.join(names)}: {count} shards" for count, names in sorted(counts.items())
                )
                + ")"
            )
            remedy = (
                f"restore it to the count the node was created with (one line: echo N > "
                f"{stamp_path}), and put back any shard directory copied from another node"
            )
        raise ConfigError(
            f"{says}, but {said}: the file recording the node's shard count was edited or "
            f"replaced, and {data_dir} is not a node of {stamped}; {remedy}. {nothing}"
        )
    if stamped > 1 and holds_rocksdb(data_dir):
        if not held:
            raise ConfigError(
                f"{says}, but {data_dir} holds a RocksDB of its own and no shard-K directory "
                "holding one: the data of a node of 1 shard (a node of more keeps its data "
                f"in shard-0 to shard-{stamped - 1}); the file recording the shard count was "
                f"edited or copied in; restore it (echo 1 > {stamp_path}, or remove it: a "
                f"node of 1 shard needs none) and start again (--shards 1 or the default "
                f"auto). {nothing}"
            )
        raise ConfigError(
            f"{says}, and so do its shard directories, but {data_dir} also holds a RocksDB "
            "of its own (its CURRENT file), the data of a node of 1 shard, which a node of "
            f"{stamped} shards never writes: it was made by a start while {stamp_path} said "
            f"1, or copied in, and its messages belong to no shard; move that RocksDB's "
            f"files out of {data_dir} (start them elsewhere as a node of 1 shard to deliver "
            f"what they hold) and start again. {nothing}"
        )
    beyond = [k for k in held if stamped == 1 or k >= stamped]
    if beyond:
        listed = ", ".join(f"shard-{k}" for k in beyond)
        raise ConfigError(
            f"{says}, but {data_dir} holds shard directories with data beyond that count "
            f"({listed}; a node of {stamped} shard{'s' if stamped != 1 else ''} has "
            + ("none" if stamped == 1 else f"shard-0 to shard-{stamped - 1}")
            + f"): the file recording the shard count was edited or replaced, or a shard "
            f"directory was copied in; restore it to the count the node was created with "
            f"(echo N > {stamp_path}: the number of its shard-K directories) and start "
            f"again. {nothing}"
        )


def check_shard_count(config: Config, *, starting: bool = True) -> None:
    """Refuse a data directory made for another shard count; stamp a new sharded one.

    With ``node.shards = 1``: refused when the directory carries a stamp of more.
    With ``N > 1``: a directory without a stamp must be empty (or missing); it is
    stamped ``N``, and, when ``starting`` (not a restore, which fills it with data),
    marked as a first start until every shard is ready (:data:`FIRST_START_FILE`).
    A stamp naming another count is refused, and so are ``shard-K`` directories
    without a stamp (``SHARDS`` deleted), a stamp the data beside it contradicts
    (``SHARDS`` edited: :func:`_check_stamp_matches_dirs`, checked first, so the
    advice names the edited file) and a shard's own directory.

    Raises:
        ConfigError: with a sentence saying what the directory holds and what to do.
        StorageError: a shard directory's RocksDB cannot be read for its stamp.
        OSError: the stamp cannot be written.
    """
    data_dir = config.server.data_dir
    wanted = config.node.shards
    stamped = read_stamp(data_dir)
    if stamped is None:
        _check_stamp_file_missing(data_dir)
        if wanted == 1:
            return  # a shard's directory is refused once RocksDB is open (stamp.py)
        if holds_data(data_dir):
            from futureq.shards.stamp import check_directory_not_a_shard

            check_directory_not_a_shard(data_dir)  # --shards N on DATA_DIR/shard-K
            raise ConfigError(
                f"{data_dir} holds the data of a node with 1 shard; start it without "
                f"--shards (or --shards 1), or give --shards {wanted} an empty data "
                "directory (moving topics between shards is not supported yet)"
            )
        os.makedirs(data_dir, exist_ok=True)
        if starting:
            _write_synced(os.path.join(data_dir, FIRST_START_FILE), "")
        temp = os.path.join(data_dir, f"{STAMP_FILE}.partial")
        _write_synced(temp, f"{wanted}\n")
        os.replace(temp, os.path.join(data_dir, STAMP_FILE))
        return
    _check_stamp_matches_dirs(data_dir, stamped)
    if stamped != wanted:
        if os.path.exists(os.path.join(data_dir, FIRST_START_FILE)):
            raise ConfigError(
                f"{data_dir} was created with {stamped} shards by a start that never got "
                f"ready (it stopped before every shard was serving), and its shard count "
                f"is fixed; if nothing was published to it, remove {data_dir} and start "
                f"again with --shards {wanted}; else start it with --shards {stamped} "
                "(node.shards)"
            )
        raise ConfigError(
            f"{data_dir} was created with {stamped} shards; start it with --shards "
            f"{stamped} (node.shards), not {wanted}: the shard count is fixed when the data "
            "directory is created"
        )


def note_first_start_ready(data_dir: str) -> None:
    """Every shard of the node is serving: the stamp is no longer only a failed first
    start's (removes :data:`FIRST_START_FILE`; nothing to do on later starts)."""
    try:
        os.remove(os.path.join(data_dir, FIRST_START_FILE))
    except FileNotFoundError:
        pass


def _write_synced(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
