"""The ``futureq`` command: start a broker node, or check a configuration.

::

    futureq start [--config FILE] [--data-dir DIR] [--listen HOST:PORT] ...
    futureq check-config [--config FILE] [same flags] [--json]
    futureq --version

Every flag overrides one config key; the order is defaults < TOML file < ``FUTUREQ_*``
environment < flags (:func:`futureq.config_loader.load_config`). Exit codes: 0 fine,
2 bad configuration or usage, otherwise what the server returns.

Source: DESIGN.md, "Processes and ports"; docs/operations.md, "Configuration".
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from futureq import __version__
from futureq.config import Config
from futureq.config_loader import LOG_LEVELS, env_var_name, load_config
from futureq.errors import ConfigError
from futureq.logging_setup import setup_logging

if TYPE_CHECKING:
    from collections.abc import Callable

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

    @property
    def dest(self) -> str:
        return f"{self.section}__{self.key}"


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
        ("--advertise",),
        "server",
        "advertise",
        "HOST:PORT",
        "client address other nodes hand to clients as ours; unset means --listen",
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
        ("--tls-cert",), "tls", "cert_file", "FILE", "PEM certificate; with --tls-key turns TLS on"
    ),
    _Flag(("--tls-key",), "tls", "key_file", "FILE", "PEM private key of --tls-cert"),
    _Flag(("--tls-ca",), "tls", "ca_file", "FILE", "PEM CA bundle to verify client certificates"),
    _Flag(
        ("--raft-listen",),
        "cluster",
        "raft_listen",
        "HOST:PORT",
        "where peers connect for Raft traffic",
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
        if flag.store_false:
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
        "See docs/security.md, \"Client access\".",
    )
    token.add_argument("--name", required=True, help="the client's name (letters, digits, . _ -)")
    token.add_argument(
        "--json", action="store_true", help='print {"name", "token", "secret_hash"} instead'
    )
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


def _start(args: argparse.Namespace) -> int:
    try:
        config = _load(args)
    except ConfigError as error:
        print(f"futureq: {error}", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(config.server.log_level)
    return run_server(config)


def run_server(config: Config) -> int:
    """Run ``futureq.broker.server.run(config)`` and return its exit code.

    Imported here, not at the top, so this module (``--help``, ``check-config``) loads
    without the broker and its native dependencies.
    """
    server = importlib.import_module("futureq.broker.server")
    exit_code: int = server.run(config)
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
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        # argparse exits for --help, --version and usage errors; return its code.
        return exit_.code if isinstance(exit_.code, int) else EXIT_CONFIG
    if args.command == "start":
        return _start(args)
    if args.command == "check-config":
        return _check_config(args)
    if args.command == "hash-token":
        return _hash_token(args)
    parser.print_help(sys.stderr)
    return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
