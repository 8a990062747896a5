"""The ``futureq`` command: start a broker node, or check a configuration.

::

    futureq start [--config FILE] [--data-dir DIR] [--listen HOST:PORT] ...
    futureq check-config [--config FILE] [same flags] [--json]
    futureq health [--config FILE] [same flags] [--ready]
    futureq convert-to-cluster [--config FILE] [same flags]
    futureq backup [--config FILE] [same flags] --out FILE
    futureq restore [--config FILE] [same flags] --from FILE [--single-node]
    futureq generate-secret FILE
    futureq hash-token --name NAME [--json]
    futureq --version

Every flag overrides one config key; the order is defaults < TOML file < ``FUTUREQ_*``
environment < flags (:func:`futureq.config_loader.load_config`). Exit codes: 0 fine,
2 bad configuration or usage, 1 ``health`` found the node unhealthy (or not ready),
3 a storage failure (data commands), otherwise what the server returns.

Source: DESIGN.md, "Processes and ports"; docs/operations.md, "Configuration".
"""

from __future__ import annotations

import sys

from futureq import early_signals  # stdlib only: first, before the slower imports

if early_signals.starts_a_node(__name__ == "__main__", sys.argv):
    early_signals.defer_from_the_start()

import argparse
import importlib
import json
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from futureq import __version__, fd_budget
from futureq.config import AUTO_SHARDS, WILDCARD_HOSTS, Config, join_host_port, split_host_port
from futureq.config_checks import LOG_LEVELS
from futureq.config_cross_checks import config_warnings
from futureq.config_loader import env_var_name, load_config
from futureq.errors import ConfigError, StorageError
from futureq.logging_setup import LOG_FORMATS, setup_logging
from futureq.peer_credentials import generate_secret_file

if TYPE_CHECKING:
    from collections.abc import Callable

    from futureq.shards.layout import ShardRole

EXIT_OK = 0
EXIT_CONFIG = 2
CONFIG_ENV = "FUTUREQ_CONFIG"
_SECRET_KEYS = frozenset({"server.auth_token"})
_REDACTED = "<redacted>"


@attrs.frozen
class _Flag:
    """A command-line flag that overrides one config key."""

    flags: tuple[str, ...]
    section: str
    key: str
    metavar: str | None
    text: str
    type: Callable[[str], Any] = str
    choices: tuple[str, ...] | None = None
    store_false: bool = False
    store_true: bool = False

    @property
    def dest(self) -> str:
        return f"{self.section}__{self.key}"


def _shard_count(text: str) -> int:
    """``--shards``: a count, or ``auto`` (:data:`futureq.config.AUTO_SHARDS`)."""
    if text.strip() == "auto":
        return AUTO_SHARDS
    try:
        count = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of shards; give a whole number or auto"
        ) from None
    if count == AUTO_SHARDS:  # 0 stands for auto inside; written, it is a mistake
        from futureq.shards.slots import MAX_SHARDS

        raise argparse.ArgumentTypeError(
            f"0 is not a number of shards; give 1 to {MAX_SHARDS}, or auto (one per core)"
        )
    return count


_FLAGS: tuple[_Flag, ...] = (
    _Flag(("--data-dir",), "server", "data_dir", "DIR", "directory of the RocksDB data"),
    _Flag(("--listen",), "server", "listen", "HOST:PORT", "client listener address"),
    _Flag(
        ("--http",),
        "server",
        "http",
        "HOST:PORT",
        "address of /metrics, /healthz, /readyz and the dashboard",
    ),
    _Flag(("--node-id",), "server", "node_id", "N", "this node's id (>= 1)", type=int),
    _Flag(
        ("--advertise-client", "--advertise"),
        "server",
        "advertise",
        "HOST:PORT",
        "client address this node announces to peers and clients (NOT_LEADER, cluster "
        "status); never a wildcard; unset means --listen",
    ),
    _Flag(
        ("--log-level",),
        "server",
        "log_level",
        "LEVEL",
        "log level on stderr",
        choices=LOG_LEVELS,
    ),
    _Flag(
        ("--log-format",),
        "server",
        "log_format",
        "FORMAT",
        "text (readable lines) or json (one object per line); in a cluster lines name the node",
        choices=LOG_FORMATS,
    ),
    _Flag(
        ("--tls-cert",), "tls", "cert_file", "FILE", "PEM certificate; with --tls-key turns TLS on"
    ),
    _Flag(("--tls-key",), "tls", "key_file", "FILE", "PEM private key of --tls-cert"),
    _Flag(("--tls-ca",), "tls", "ca_file", "FILE", "PEM CA bundle to verify client certificates"),
    _Flag(
        ("--http-tls",),
        "tls",
        "http",
        None,
        "serve the HTTP port (dashboard, /metrics, /ws) over HTTPS with --tls-cert",
        store_true=True,
    ),
    _Flag(
        ("--websocket-origins",),
        "server",
        "websocket_origins",
        "ORIGINS",
        "browser origins allowed to open /ws besides the dashboard's own "
        "(comma-separated https://host[:port], or *)",
    ),
    _Flag(
        ("--raft-listen",),
        "cluster",
        "raft_listen",
        "HOST:PORT",
        "where peers connect for Raft traffic",
    ),
    _Flag(
        ("--advertise-raft",),
        "cluster",
        "advertise_raft",
        "HOST:PORT",
        "Raft address this node announces to peers; never a wildcard; unset means --raft-listen",
    ),
    _Flag(
        ("--peers",),
        "cluster",
        "peers",
        "ID=HOST:PORT,...",
        "initial voters incl. this node, e.g. 1=h1:7451,2=h2:7451,3=h3:7451; empty: single node",
    ),
    _Flag(
        ("--join",),
        "cluster",
        "join",
        "HOST:PORT",
        "client address of a cluster member to ask to add this node",
    ),
    _Flag(
        ("--cluster-id",),
        "cluster",
        "cluster_id",
        "NAME",
        "name shared by every node of the cluster",
    ),
    _Flag(
        ("--initial-cluster-state",),
        "cluster",
        "initial_cluster_state",
        "new|existing",
        "new: this start forms a brand-new cluster, with a majority of blank voters; "
        "never use it to restart a node",
        choices=("new", "existing"),
    ),
    _Flag(
        ("--cluster-secret-file",),
        "cluster",
        "secret_file",
        "FILE",
        "file holding the secret every node of the cluster shares (futureq generate-secret "
        "FILE); peers must prove they hold it",
    ),
    _Flag(
        ("--insecure-peers",),
        "cluster",
        "insecure_peers",
        None,
        "run with peers although neither mutual TLS nor a cluster secret authenticates them "
        "(anyone who reaches the Raft port can rewrite the log)",
        store_true=True,
    ),
    _Flag(
        ("--shards",),
        "node",
        "shards",
        "N",
        "shard processes of this node, each its own RocksDB and Raft group; fixed when "
        "the data directory is created (env FUTUREQ_SHARDS works too); auto (the "
        "default): the count recorded in the data directory, 1 for a single node's "
        "existing data, for a new one the cluster's count with --join, else the number "
        "of usable cores; see docs/sharding.md",
        type=_shard_count,
    ),
    _Flag(
        ("--no-fsync",),
        "storage",
        "fsync",
        None,
        "do not fsync the log (risks acknowledged messages on power loss)",
        store_false=True,
    ),
)


def _default_text(section: str, key: str) -> str:
    value = getattr(getattr(Config(), section), key)
    if isinstance(value, bool):
        return str(value).lower()
    return "unset" if value is None else str(value)


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=os.environ.get(CONFIG_ENV),
        help=f"TOML config file (env {CONFIG_ENV}; default: none, built-in defaults)",
    )
    for flag in _FLAGS:
        where = f"config {flag.section}.{flag.key}, env {env_var_name(flag.section, flag.key)}"
        default = _default_text(flag.section, flag.key)
        if flag.store_true:
            parser.add_argument(
                *flag.flags,
                dest=flag.dest,
                action="store_const",
                const=True,
                default=None,
                help=f"{flag.text} (default: off; {where}=true)",
            )
        elif flag.store_false:
            parser.add_argument(
                *flag.flags,
                dest=flag.dest,
                action="store_const",
                const=False,
                default=None,
                help=f"{flag.text} (default: fsync on; {where}=false)",
            )
        else:
            parser.add_argument(
                *flag.flags,
                dest=flag.dest,
                metavar=flag.metavar,
                type=flag.type,
                choices=flag.choices,
                default=None,
                help=f"{flag.text} (default: {default}; {where})",
            )


def build_parser() -> argparse.ArgumentParser:
    """The ``futureq`` argument parser, with its ``start`` and ``check-config`` commands."""
    parser = argparse.ArgumentParser(
        prog="futureq",
        description="FutureQ broker node: a Raft-replicated delayed-message queue.",
        epilog="Order of precedence: defaults < --config file < FUTUREQ_<SECTION>_<KEY> "
        "environment variables < flags. See docs/operations.md.",
    )
    parser.add_argument("--version", action="version", version=f"futureq {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    start = commands.add_parser(
        "start",
        help="run a broker node until SIGTERM or SIGINT",
        description="Run a broker node until SIGTERM or SIGINT (graceful shutdown).",
    )
    _add_config_flags(start)
    # Internal: the supervisor of a sharded node starts shard K with it (docs/sharding.md).
    start.add_argument("--shard-index", type=int, default=None, help=argparse.SUPPRESS)
    check = commands.add_parser(
        "check-config",
        help="print the effective configuration and exit (2 if it is invalid)",
        description="Load the configuration exactly as `start` would, print it, exit 0; "
        "or print every problem on stderr and exit 2.",
    )
    _add_config_flags(check)
    check.add_argument("--json", action="store_true", help="print JSON instead of TOML")
    token = commands.add_parser(
        "hash-token",
        help="make a client token and the [[client]] entry of the credentials file",
        description="Print a [[client]] entry for server.credentials_file (the secret stored "
        "as a salted scrypt hash) on stdout, and the client's token, shown once, on stderr. "
        "Add the permissions to the entry, then reload the server with SIGHUP. "
        'See docs/security.md, "Client access".',
    )
    token.add_argument("--name", required=True, help="the client's name (letters, digits, . _ -)")
    token.add_argument(
        "--json", action="store_true", help='print {"name", "token", "secret_hash"} instead'
    )
    health = commands.add_parser(
        "health",
        help="exit 0 when this node's /healthz (--ready: /readyz) answers 200, else 1 "
        "(with --shards: every shard's)",
        description="Ask the node configured like `start` (same config, environment and "
        "flags) for /healthz, or /readyz with --ready, on its HTTP listener; exit 0 on 200, "
        "1 otherwise. Meant for container health checks (Dockerfile HEALTHCHECK).",
    )
    _add_config_flags(health)
    health.add_argument("--ready", action="store_true", help="ask /readyz instead of /healthz")
    health.add_argument(
        "--timeout", type=float, default=3.0, metavar="SECONDS", help="deadline (default 3)"
    )
    convert = commands.add_parser(
        "convert-to-cluster",
        help="make a stopped single node's data the first node of a new cluster",
        description="Turn the single node's data in --data-dir into node --node-id of a new "
        "cluster, losing nothing: the whole state becomes the cluster's first Raft snapshot "
        "and the node its only voter. Then start it with --peers naming itself, and add the "
        "other nodes with --join. The node must be stopped. See docs/operations.md.",
    )
    _add_config_flags(convert)
    backup = commands.add_parser(
        "backup",
        help="write a backup of the node's queue state (the node may keep running)",
        description="Read the queue state in --data-dir at one applied index (through a "
        "RocksDB secondary instance: a running node keeps serving) and write it to --out. "
        "Restore it with `futureq restore`. See docs/operations.md.",
    )
    _add_config_flags(backup)
    backup.add_argument(
        "--out", required=True, metavar="FILE", help="backup file to write; - for stdout"
    )
    restore = commands.add_parser(
        "restore",
        help="lay a backup into an empty data directory",
        description="Write the backup into the empty --data-dir as node --node-id, the only "
        "voter of a new cluster (start it with --peers naming itself, then --join the "
        "others), or with --single-node as a single node's data. See docs/operations.md.",
    )
    _add_config_flags(restore)
    restore.add_argument(
        "--from", dest="source", required=True, metavar="FILE", help="backup file; - for stdin"
    )
    restore.add_argument(
        "--single-node", action="store_true", help="restore as a single node, not a cluster"
    )
    generate = commands.add_parser(
        "generate-secret",
        help="write a new random cluster secret to FILE (mode 0600)",
        description="Write 32 random bytes as 64 hex digits to FILE, readable by its owner "
        "only, for cluster.secret_file (--cluster-secret-file). Copy the same file to every "
        "node. An existing FILE is never overwritten.",
    )
    generate.add_argument("file", metavar="FILE")
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, dict[str, object]]:
    overrides: dict[str, dict[str, object]] = {}
    for flag in _FLAGS:
        value = getattr(args, flag.dest)
        if value is not None:
            overrides.setdefault(flag.section, {})[flag.key] = value
    return overrides


def _load(args: argparse.Namespace) -> Config:
    return load_config(args.config, env=os.environ, overrides=_overrides(args))


def config_as_dict(config: Config, *, redact: bool = True) -> dict[str, dict[str, Any]]:
    """The config as ``{section: {key: value}}``; secrets replaced when ``redact``."""
    result: dict[str, dict[str, Any]] = attrs.asdict(config)
    if result["node"]["shards"] == AUTO_SHARDS:  # written as the file and flag take it
        result["node"]["shards"] = "auto"
    if redact:
        for dotted in _SECRET_KEYS:
            section, key = dotted.split(".")
            if result[section][key] is not None:
                result[section][key] = _REDACTED
    return result


def config_as_toml(config: Config) -> str:
    """The effective config as TOML text; unset keys appear as comments."""
    lines: list[str] = []
    for section, table in config_as_dict(config).items():
        if lines:
            lines.append("")
        lines.append(f"[{section}]")
        for key, value in table.items():
            if value is None:
                lines.append(f"# {key} = (unset)")
            elif isinstance(value, bool):
                lines.append(f"{key} = {str(value).lower()}")
            elif isinstance(value, int):
                lines.append(f"{key} = {value}")
            else:
                lines.append(f"{key} = {json.dumps(value)}")  # a valid TOML basic string
    return "\n".join(lines) + "\n"


def _check_config(args: argparse.Namespace) -> int:
    try:
        config = _load(args)
    except ConfigError as error:
        print(f"futureq: {error}", file=sys.stderr)
        return EXIT_CONFIG
    for warning in config_warnings(config):
        print(f"futureq: warning: {warning}", file=sys.stderr)
    # `start` raises the soft open-file limit to the hard one first.
    descriptors = fd_budget.budget(
        config.limits.max_connections,
        fd_budget.open_file_limit(hard=True),
        config.limits.max_http_connections,
    )
    too_few = descriptors.warning()
    if too_few is not None:
        print(f"futureq: warning: {too_few}", file=sys.stderr)
    if args.json:
        print(json.dumps(config_as_dict(config), indent=2))
    else:
        print(config_as_toml(config), end="")
    return EXIT_OK


def _hash_token(args: argparse.Namespace) -> int:
    from futureq.broker.access import new_token  # hashlib only; no broker start-up

    try:
        token, secret_hash = new_token(args.name)
    except ValueError as error:
        print(f"futureq: {error}", file=sys.stderr)
        return EXIT_CONFIG
    if args.json:
        print(json.dumps({"name": args.name, "token": token, "secret_hash": secret_hash}))
        return EXIT_OK
    print("[[client]]")
    print(f'name = "{args.name}"')
    print(f'secret_hash = "{secret_hash}"')
    print('publish = []          # topic patterns, e.g. "orders.>"')
    print("consume = []")
    print("manage_groups = []")
    print("manage_cluster = false")
    print("monitor = false")
    print(
        f"futureq: token of client {args.name!r} (shown once; give it to the client, it is "
        f"not stored): {token}",
        file=sys.stderr,
    )
    return EXIT_OK


EXIT_UNHEALTHY = 1
EXIT_STORAGE = 3


def _data_command(args: argparse.Namespace) -> int:
    """convert-to-cluster, backup, restore (:mod:`futureq.data_tools`)."""
    from futureq import data_tools  # RocksDB tooling: not needed by --help
    from futureq.shards import layout

    try:
        config = _load(args)
        data_dir = config.server.data_dir
        if args.command == "restore":
            _restore(args, config)
            return EXIT_OK
        # A sharded node's data directory (stamped): every shard, each in shard-K.
        shards = layout.read_stamp(data_dir) or 1
        if shards > 1:
            config = attrs.evolve(config, node=attrs.evolve(config.node, shards=shards))
        if args.command == "convert-to-cluster":
            node_id = config.server.node_id
            if shards > 1:
                converted = _convert_shards(config, shards)
                what = f"every shard of {data_dir} is now"
            else:
                index = data_tools.convert_to_cluster(config)
                what = f"{data_dir} is now"
                converted = f"everything up to index {index}"
            print(
                f"{what} node {node_id} of a new cluster, holding {converted}. Start it "
                f"with {_first_node_start(data_dir, node_id, shards)}."
            )
        elif args.command == "backup":

            def write(out: Any) -> str:
                if shards > 1:
                    infos = data_tools.write_node_backup(data_dir, shards, out)
                    parts = ", ".join(
                        f"shard {k} at index {info.index}" for k, info in enumerate(infos)
                    )
                    total = sum(info.size_bytes for info in infos)
                    return f"({shards} shards: {parts}; {total} bytes of state)"
                info = data_tools.write_backup(data_dir, out)
                return f"at index {info.index} ({info.size_bytes} bytes of state)"

            if args.out == "-":
                said = write(sys.stdout.buffer)
            else:
                temp = f"{args.out}.partial"
                with open(temp, "wb") as out:
                    said = write(out)
                    os.fsync(out.fileno())
                os.replace(temp, args.out)
            print(f"backup of {data_dir} {said} written to {args.out}", file=sys.stderr)
    except ConfigError as error:
        print(f"futureq: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except OSError as error:
        print(f"futureq: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except StorageError as error:
        print(f"futureq: storage failure: {error}", file=sys.stderr)
        return EXIT_STORAGE
    return EXIT_OK


def _shards_flag(shards: int) -> str:
    """`` --shards N`` for a sharded node, else nothing."""
    return "" if shards == 1 else f" --shards {shards}"


def _first_node_start(data_dir: str, node_id: int, shards: int) -> str:
    """The flags that start the only voter of a new cluster (after convert-to-cluster or
    restore), and how the others then come: for "Start it with ..."."""
    flag = _shards_flag(shards)
    return (
        f"--data-dir {data_dir} --node-id {node_id}{flag} --peers {node_id}=<its raft "
        f"HOST:PORT>, then start the other nodes with --join{flag}"
    )


def _convert_shards(config: Config, shards: int) -> str:
    """convert-to-cluster on every shard of a sharded node (``config.node.shards``);
    a shard already converted (a rerun after a failure) is left as it is.

    Returns:
        What each shard holds, for the message (``shard 0 up to index 12, ...``).
    """
    from futureq import data_tools
    from futureq.shards import layout

    said: list[str] = []
    for shard in range(shards):
        shard_config = layout.shard_config(config, shard)
        try:
            index = data_tools.convert_to_cluster(shard_config)
        except ConfigError:
            if _data_kind_of(shard_config) != "cluster":
                raise
            said.append(f"shard {shard} converted before")
            continue
        said.append(f"shard {shard} up to index {index}")
    if all(part.endswith("converted before") for part in said):
        raise ConfigError(
            f"{config.server.data_dir} already holds a cluster node's data in every shard "
            "(Raft state); there is nothing to convert"
        )
    return ", ".join(said)


def _data_kind_of(config: Config) -> str:
    """``data_kind`` of ``server.data_dir`` (blank, single or cluster)."""
    from futureq import data_tools

    db = data_tools._open(config)
    try:
        return data_tools.data_kind(db)
    finally:
        db.close()


def _restore(args: argparse.Namespace, config: Config) -> None:
    """``futureq restore``: a node backup into a sharded node's data directory (its
    shard count must be ``node.shards``), or a one-directory backup into a node of 1.

    Raises:
        ConfigError: mismatched shard counts, a directory not empty of data, a bad file.
    """
    from futureq import data_tools
    from futureq.shards import layout

    if args.source == "-":
        raw = sys.stdin.buffer.read()
    else:
        with open(args.source, "rb") as source:
            raw = source.read()
    data_dir = config.server.data_dir
    parts = data_tools.read_node_backup(raw)
    wanted = config.node.shards
    if wanted == AUTO_SHARDS:  # auto: the backup's count
        wanted = 1 if parts is None else len(parts)
        config = attrs.evolve(config, node=attrs.evolve(config.node, shards=wanted))
    node_id = config.server.node_id
    where = (
        "as a single node"
        if args.single_node
        else f"as node {node_id}, the only voter of a new cluster"
    )
    start = "start it with " + (
        f"--data-dir {data_dir}{_shards_flag(wanted)}"
        if args.single_node
        else _first_node_start(data_dir, node_id, wanted)
    )
    if parts is None:
        if wanted > 1:
            raise ConfigError(
                f"{args.source} is the backup of one data directory (a node of 1 shard, or "
                f"one shard's); restore it without --shards (node.shards 1), not --shards "
                f"{wanted}: its topics hash to every shard of a node of {wanted}"
            )
        # Any entry refuses it, as documented (docs/operations.md, "Backup and restore"):
        # RocksDB's own check only sees its data, and a restore laid over files of
        # unknown purpose (another program's, a half-deleted directory) mixes the two.
        if layout.holds_data(data_dir):
            raise ConfigError(
                f"{data_dir} is not empty (it holds {_some_entries(data_dir)}); restore into "
                "an empty data directory (or one not yet made)"
            )
        layout.check_shard_count(config)
        info = data_tools.restore_backup(config, raw, single_node=args.single_node)
        print(f"restored the backup at index {info.index} into {data_dir} {where}; {start}")
        return
    if wanted != len(parts):
        raise ConfigError(
            f"{args.source} is the backup of a node of {len(parts)} shards; restore it "
            f"with --shards {len(parts)} (node.shards), not {wanted}: each shard's topics "
            "belong to that shard, and a node's shard count is fixed when its data is created"
        )
    stamped = layout.read_stamp(data_dir)
    if stamped is not None and stamped != wanted:
        raise ConfigError(
            f"{data_dir} holds the data of a node of {stamped} shards; restore a backup of "
            f"{wanted} shards into an empty data directory"
        )
    for shard in range(wanted):  # every shard must be empty before any is written
        shard_dir = layout.shard_data_dir(data_dir, shard)
        if layout.holds_data(shard_dir):
            raise ConfigError(f"{shard_dir} is not empty; restore into an empty data directory")
    layout.check_shard_count(config, starting=False)
    said = []
    for shard, part in enumerate(parts):
        info = data_tools.restore_backup(
            layout.shard_config(config, shard), part, single_node=args.single_node
        )
        said.append(f"shard {shard} at index {info.index}")
    print(
        f"restored the backup of {wanted} shards ({', '.join(said)}) into {data_dir} {where}; "
        f"{start}"
    )


def _some_entries(directory: str, most: int = 3) -> str:
    """Up to ``most`` entry names of ``directory``, sorted and quoted, for a message."""
    names = sorted(os.listdir(directory))
    shown = ", ".join(repr(name) for name in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _health(args: argparse.Namespace) -> int:
    """``futureq health``: with ``node.shards = auto`` (the default) the count stamped in
    the data directory, else 1: the node's own HTTP port, which a sharded node's shard 0
    answers for every shard. Never the machine's cores: a health check run where the
    node's data directory is not (another working directory, a container probe) would
    otherwise ask ports a single-process node never opened and report it unhealthy."""
    try:
        config = _load(args)
        if config.node.shards == AUTO_SHARDS:
            from futureq.shards import layout

            count = layout.read_stamp(config.server.data_dir) or 1
            config = attrs.evolve(config, node=attrs.evolve(config.node, shards=count))
    except ConfigError as error:
        print(f"futureq: {error}", file=sys.stderr)
        return EXIT_CONFIG
    if config.node.shards > 1:  # healthy only when every shard is (docs/sharding.md)
        from concurrent.futures import ThreadPoolExecutor

        from futureq.shards.layout import shard_config

        # Every shard at once, so --timeout bounds the whole check: one after another, a
        # node whose shards are stopped took --timeout per shard.
        configs = [shard_config(config, shard) for shard in range(config.node.shards)]
        with ThreadPoolExecutor(len(configs)) as pool:
            answers = list(pool.map(lambda one: _health_answer(one, args), configs))
        for code, line in answers:  # in shard order
            print(line, file=sys.stdout if code == EXIT_OK else sys.stderr)
        return max(code for code, _ in answers)
    code, line = _health_answer(config, args)
    print(line, file=sys.stdout if code == EXIT_OK else sys.stderr)
    return code


def _health_answer(config: Config, args: argparse.Namespace) -> tuple[int, str]:
    """Ask one HTTP port; ``(exit code, the line to print)``: stdout's when healthy."""
    host, port = split_host_port(config.server.http)
    if host in WILDCARD_HOSTS:  # listening everywhere: ask over loopback
        host = "::1" if ":" in host else "127.0.0.1"
    path = "/readyz" if args.ready else "/healthz"
    url = f"http://{join_host_port(host, port)}{path}"
    import http.client  # http.client and email: only `futureq health` needs them
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as response:
            body = response.read().decode("utf-8", "replace").strip()
            return EXIT_OK, f"{url}: {response.status} {body}"
    except urllib.error.HTTPError as error:
        body = error.read().decode("utf-8", "replace").strip()
        return EXIT_UNHEALTHY, f"{url}: {error.code} {body}"
    except http.client.HTTPException as error:
        # Something listens but does not speak HTTP: most likely the binary client port
        # (server.listen) given where the HTTP port (server.http) belongs.
        return EXIT_UNHEALTHY, (
            f"{url}: the address answered, but not in HTTP ({type(error).__name__}); is it "
            "the client port (server.listen)? --http takes the node's HTTP port "
            "(server.http)"
        )
    except (OSError, ValueError) as error:
        return EXIT_UNHEALTHY, f"{url}: no answer ({error})"


def _generate_secret(path: str) -> int:
    try:
        generate_secret_file(path)
    except FileExistsError:
        print(f"futureq: {path} exists; it is never overwritten (remove it first)", file=sys.stderr)
        return EXIT_CONFIG
    except OSError as error:
        print(f"futureq: cannot create {path}: {error.strerror}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"wrote a new cluster secret to {path}; give every node a copy (--cluster-secret-file)")
    return EXIT_OK


def _start(args: argparse.Namespace, start_args: Sequence[str]) -> int:
    # `futureq start` (the console script, `python -m`) took the stop signals and
    # SIGHUP on its first line; a caller of main() in-process takes them here.
    from_the_start = early_signals.deferred_from_the_start()
    if not from_the_start:
        early_signals.defer_sighup()  # a reload sent while starting must not kill the node
    from futureq.shards import layout  # stdlib only

    shard: int | None = args.shard_index
    try:
        loaded = _load(args)
        joined = _joined_shard_count(loaded, shard)
        from_cores = (
            joined.node.shards == AUTO_SHARDS
            and layout.auto_count(joined.server.data_dir)[1] == "cores"
        )
        config = layout.resolve_shard_count(joined)
        if shard is None:
            layout.check_shard_count(config)
    except ConfigError as error:
        print(f"futureq: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except StorageError as error:  # a shard directory's stamp could not be read
        print(f"futureq: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except OSError as error:
        print(
            f"futureq: cannot stamp the shard count in the data directory: {error}", file=sys.stderr
        )
        return EXIT_CONFIG
    # From here on the node may be slow to start (RocksDB, its state, the log): a stop
    # signal is remembered and the node stops gracefully at its next check of it.
    if not from_the_start:
        early_signals.defer_stop_signals()
    if shard is not None:  # its supervisor killed: stop, however far the start is
        from futureq.shards.lifeline import watch_supervisor

        watch_supervisor()
    sharded = config.node.shards > 1
    if shard is not None and not 0 <= shard < config.node.shards:
        print(f"futureq: --shard-index {shard} is not below node.shards", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(
        config.server.log_level,
        node_id=config.server.node_id if config.cluster.clustered or sharded else None,
        log_format=config.server.log_format,
        shard=shard,
    )
    fd_budget.raise_open_file_limit()
    if shard is None:
        for warning in config_warnings(config):
            logging.getLogger("futureq").warning("%s", warning)
        if from_cores and config.cluster.peers:
            logging.getLogger("futureq").info(
                "node.shards = auto: %d shard(s), this machine's usable cores, stamped in the "
                "new data directory; every node of the cluster must run the same count: "
                "if the nodes' machines have other core counts, start every node with the "
                "same --shards",
                config.node.shards,
            )
        elif loaded.node.shards != config.node.shards:
            logging.getLogger("futureq").info(
                "node.shards = auto: %d shard(s): the count the data directory was created "
                "with (a new one: the cluster's at --join, else the usable cores; 1 for a "
                "single node's existing data)",
                config.node.shards,
            )
    try:
        stop = early_signals.deferred_stop()
        if stop is not None:
            logging.getLogger("futureq").info("received %s while starting: stopped", stop)
            return EXIT_OK
        if sharded and shard is None:
            from futureq.shards.supervisor import supervise

            command = [sys.executable, "-m", "futureq.cli.server_main", "start", *start_args]
            return supervise(config, command)
        if sharded:
            assert shard is not None
            return run_server(layout.shard_config(config, shard), layout.shard_role(config, shard))
        return run_server(config)
    finally:
        early_signals.ignore_stop_signals_at_exit()  # the process only exits from here


JOIN_CHECK_S = 15.0
"""Longest a node given an explicit shard count waits for the member at ``--join`` to
say its count before it starts anyway (the join then checks again once started)."""


def _joined_shard_count(config: Config, shard: int | None) -> Config:
    """``config`` with its shard count agreed with the cluster's when the node joins a
    cluster (``--join``) with a new data directory, before anything is written to it.

    ``node.shards = auto`` takes the cluster's count (asked until the member answers):
    the count every node of the cluster must run, not this machine's cores. An explicit
    count is compared with the cluster's (asked for up to :data:`JOIN_CHECK_S`) and
    refused when it differs, so the node stops before READY and leaves its data
    directory as it found it (the join itself compares again, once started, for a
    member that did not answer in time). Unchanged otherwise (a shard process, no
    ``--join``, or a data directory that records or holds data).

    Raises:
        ConfigError: the explicit count differs from the cluster's, or the wait was
            interrupted.
    """
    from futureq.shards import layout

    data_dir = config.server.data_dir
    if (
        shard is not None
        or config.cluster.join is None
        or layout.read_stamp(data_dir) is not None
        or layout.holds_data(data_dir)
    ):
        return config
    import trio

    from futureq.broker.cluster import cluster_shard_count

    auto = config.node.shards == AUTO_SHARDS

    async def ask() -> int | None:
        if auto:
            return await cluster_shard_count(config)
        with trio.move_on_after(JOIN_CHECK_S):
            return await cluster_shard_count(config, why=f"node.shards = {config.node.shards}")
        return None

    try:
        count = trio.run(ask)
    except KeyboardInterrupt:
        raise ConfigError(
            f"interrupted while asking {config.cluster.join} for the cluster's shard count; "
            "nothing was written"
        ) from None
    if count is None:
        return config
    if not auto:
        if count != config.node.shards:
            raise ConfigError(
                f"the cluster at {config.cluster.join} runs {count} shard(s) per node and "
                f"this node was started with {config.node.shards} (node.shards): every node "
                "of a cluster must run the same number of shards (shard K of every node is "
                f"one Raft group); start it again with --shards {count}, or --shards auto "
                f"(which takes the cluster's); nothing was written to {data_dir}"
            )
        return config
    print(
        f"futureq: node.shards = auto: {count} shard(s), the count of the cluster at "
        f"{config.cluster.join} (every node of a cluster runs the same)",
        file=sys.stderr,
        flush=True,
    )
    return attrs.evolve(config, node=attrs.evolve(config.node, shards=count))


def run_server(config: Config, shard: ShardRole | None = None) -> int:
    """Run ``futureq.broker.server.run(config)`` and return its exit code.

    Imported here, not at the top, so this module (``--help``, ``check-config``) loads
    without the broker and its native dependencies.

    Args:
        config: The broker's configuration (a shard's own, from ``shard_config``).
        shard: Which shard this process is, in a sharded node; None otherwise.
    """
    server = importlib.import_module("futureq.broker.server")
    exit_code: int = server.run(config) if shard is None else server.run(config, shard=shard)
    return exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``futureq`` command.

    Args:
        argv: Arguments without the program name; None means ``sys.argv[1:]``.

    Returns:
        The process exit code: 0 success, 2 bad configuration or usage, else the
        server's own code (see ``futureq.broker.server.run``).
    """
    parser = build_parser()
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(arguments)
    except SystemExit as exit_:
        # argparse exits for --help, --version and usage errors; return its code.
        return exit_.code if isinstance(exit_.code, int) else EXIT_CONFIG
    if args.command == "start":
        return _start(args, arguments[arguments.index("start") + 1 :])
    if args.command == "check-config":
        return _check_config(args)
    if args.command == "hash-token":
        return _hash_token(args)
    if args.command == "health":
        return _health(args)
    if args.command in ("convert-to-cluster", "backup", "restore"):
        return _data_command(args)
    if args.command == "generate-secret":
        return _generate_secret(args.file)
    parser.print_help(sys.stderr)
    return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
