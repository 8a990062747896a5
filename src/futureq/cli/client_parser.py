"""The ``futureq-cli`` argument parser: every command and flag (``docs/cli.md``), the
deprecated spellings still taken, and the checks that span several flags.

The value types it uses are in :mod:`futureq.cli.client_arguments`; the commands of
``cancel``, ``browse``, ``reschedule``, ``purge`` and ``dlq`` add their own parsers
(:func:`futureq.cli.manage_commands.add_parsers`).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence
from typing import Any, Final

import shtab

from futureq import __version__
from futureq.cli import manage_commands
from futureq.cli.argv_text import argv_bytes, text_arg
from futureq.cli.client_arguments import (
    DEFAULT_BATCH_SIZE,
    MAX_BATCH_SIZE,
    MAX_DELIVERIES,
    address_arg,
    batch_size_arg,
    bounded_int_arg,
    existing_name_arg,
    node_id_arg,
    parse_at_ms,
    positive_int_arg,
    publish_topic_arg,
    visibility_timeout_arg,
)
from futureq.cli.durations import (
    DEFAULT_LINGER_MS,
    MAX_LINGER_MS,
    delay_ms_arg,
    duration_ms_arg,
    linger_ms_arg,
    positive_duration_ms_arg,
)
from futureq.client import _checks

COMPLETION_SHELLS: Final = ("bash", "zsh", "tcsh")
SERVER_ENV: Final = "FUTUREQ_SERVER"
TOKEN_ENV: Final = "FUTUREQ_TOKEN"
DEFAULT_SERVER: Final = "127.0.0.1:7450"


class DeprecatedFlag(argparse.Action):
    """An old spelling of a flag: stores its value like the new one and leaves a warning
    (printed on stderr by :func:`main`) naming the flag to use instead.

    Args:
        replacement: The flag to use instead.
        meaning: What the flag means where it was given (``--timeout`` meant two things).
    """

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        *,
        replacement: str,
        meaning: str,
        **kwargs: Any,
    ) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.replacement = replacement
        self.meaning = meaning

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        setattr(
            namespace,
            f"{DEPRECATED_PREFIX}{self.dest}",
            f"warning: {option_string} is deprecated: here it sets {self.meaning}; "
            f"use {self.replacement}",
        )


DEPRECATED_PREFIX: Final = "deprecation_"


def deprecation_warnings(args: argparse.Namespace) -> list[str]:
    """The warnings :class:`DeprecatedFlag` left on parsed arguments."""
    return [value for key, value in sorted(vars(args).items()) if key.startswith(DEPRECATED_PREFIX)]


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that takes ``-5s`` as a value, not as an unknown flag.

    argparse reads a word starting with ``-`` as an option unless it looks like a
    negative number, and ``-5s`` did not, so ``--delay -5s`` said "expected one
    argument". With the test Python 3.13 uses (a ``-`` then a digit) the value reaches
    the duration parser, which says that durations cannot be negative.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"-\.?\d")
        self._intermixing = False

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """Parse, taking positionals also after options in a command without
        subcommands: ``publish orders --delay 5s hello`` failed with "unrecognized
        arguments: hello" (argparse gave the optional PAYLOAD its empty match before
        ``--delay``, then had no place for ``hello``), while ``publish orders hello
        --delay 5s`` worked (found by a tester)."""
        if self._intermixing or any(
            isinstance(action, argparse._SubParsersAction) for action in self._actions
        ):
            return super().parse_known_args(args, namespace)
        # parse_known_intermixed_args calls parse_known_args itself (twice).
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


class _FromFlag(argparse.Action):
    """``--server``, ``--token``: the value, and that it came from the flag, not from the
    environment variable (``args.<dest>_from_flag``), so an error names the right one."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_from_flag", True)


def build_parser() -> argparse.ArgumentParser:
    """The ``futureq-cli`` argument parser (exposed for tests and docs)."""
    parser = _Parser(
        prog="futureq-cli",
        description="Publish, consume and inspect a FutureQ delayed-message queue.",
        epilog="Durations: 250ms, 5s, 10m, 2h, 3d, 1h30m, or bare milliseconds. Shell "
        "completion: futureq-cli completion bash|zsh|tcsh. See docs/cli.md.",
    )
    parser.add_argument("--version", action="version", version=f"futureq-cli {__version__}")
    parser.add_argument(
        "--server",
        default=os.environ.get(SERVER_ENV) or DEFAULT_SERVER,
        action=_FromFlag,
        metavar="HOST:PORT[,HOST:PORT...]",
        help=f"server address(es) to try (default ${SERVER_ENV} or {DEFAULT_SERVER})",
    )
    parser.add_argument(
        "--tls-ca", metavar="FILE", help="use TLS, trusting the CA certificates in FILE (PEM)"
    ).complete = shtab.FILE  # type: ignore[attr-defined]
    parser.add_argument("--tls", action="store_true", help="use TLS with the system's trusted CAs")
    parser.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="with --tls or --tls-ca: present this client certificate (PEM, its key too "
        "unless --tls-key), for a server with tls.require_client_cert",
    ).complete = shtab.FILE  # type: ignore[attr-defined]
    parser.add_argument(
        "--tls-key", metavar="FILE", help="the private key of --tls-cert (PEM)"
    ).complete = shtab.FILE  # type: ignore[attr-defined]
    parser.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        action=_FromFlag,
        help=f"auth token sent in HELLO (default ${TOKEN_ENV})",
    )
    parser.add_argument(
        "--request-timeout",
        dest="request_timeout_ms",
        type=positive_duration_ms_arg,
        default=30_000,
        metavar="D",
        help="deadline of each request, retries included (default 30s)",
    )
    parser.add_argument(
        "--timeout",
        dest="request_timeout_ms",
        type=positive_duration_ms_arg,
        action=DeprecatedFlag,
        replacement="--request-timeout",
        meaning="the request deadline",
        default=argparse.SUPPRESS,
        metavar="D",
        help="deprecated spelling of --request-timeout",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    publish = commands.add_parser(
        "publish",
        help="publish one message, or a JSONL file of messages",
        description="Publish one message (TOPIC PAYLOAD) or, with --file, many.",
    )
    publish.add_argument("topic", nargs="?", type=publish_topic_arg, help="topic to publish to")
    publish.add_argument(
        "payload",
        nargs="?",
        help="payload text (sent as UTF-8 bytes); - reads the payload bytes from standard input",
    )
    publish.add_argument(
        "--payload-file", metavar="F", help="read the payload bytes from F"
    ).complete = shtab.FILE  # type: ignore[attr-defined]
    when = publish.add_mutually_exclusive_group()
    when.add_argument("--delay", type=delay_ms_arg, metavar="D", help="deliver D after publishing")
    when.add_argument(
        "--at",
        type=parse_at_ms,
        metavar="TIME",
        help="deliver at TIME: ISO 8601 (UTC if no zone) or ms since the Unix epoch",
    )
    publish.add_argument(
        "--ttl", type=delay_ms_arg, metavar="D", help="drop it if not delivered D after due"
    )
    publish.add_argument(
        "--header",
        dest="headers",
        action="append",
        type=manage_commands.header_arg,
        metavar="NAME=VALUE",
        help="a header kept with the message (repeat for more)",
    )
    publish.add_argument(
        "--idempotency-key",
        type=text_arg("idempotency key"),
        metavar="KEY",
        help="publishing again with KEY returns the first id and stores nothing",
    )
    publish.add_argument(
        "--file", metavar="F", help="publish every line of a JSONL file (-: standard input)"
    ).complete = shtab.FILE  # type: ignore[attr-defined]
    publish.add_argument(
        "--batch-size",
        type=batch_size_arg,
        default=None,
        metavar="N",
        help=f"messages per PUBLISH with --file (default {DEFAULT_BATCH_SIZE}, "
        f"at most {MAX_BATCH_SIZE})",
    )
    publish.add_argument(
        "--failed-out",
        metavar="F",
        help="with --file: write every line that was not stored (refused, failed or not "
        "sent) to F as it was, so that `publish --file F` sends exactly those again",
    ).complete = shtab.FILE  # type: ignore[attr-defined]
    publish.add_argument(
        "--linger",
        type=linger_ms_arg,
        default=None,
        metavar="D",
        help="with --file from a pipe or terminal: publish the lines read at most D after "
        f"the first of them arrived, without waiting for a full batch (default "
        f"{DEFAULT_LINGER_MS}ms; 0: what has arrived, at once; at most {MAX_LINGER_MS // 1000}s)",
    )

    consume = commands.add_parser(
        "consume",
        help="receive messages as a member of a consumer group",
        description="Print each delivered message, then ack it (unless --no-ack/--nack).",
    )
    consume.add_argument("topic", type=existing_name_arg("topic", consume=True))
    consume.add_argument(
        "--group",
        required=True,
        type=existing_name_arg("group"),
        help="consumer group (created if new)",
    )
    consume.add_argument(
        "--count", type=positive_int_arg, metavar="N", help="stop after N messages"
    )
    consume.add_argument("--json", action="store_true", help="one JSON object per line")
    settle = consume.add_mutually_exclusive_group()
    settle.add_argument(
        "--no-ack",
        action="store_true",
        help="do not ack: messages come back later (this still claims them for the group; "
        "to look without claiming, use browse or dlq list)",
    )
    settle.add_argument("--nack", action="store_true", help="nack every message after printing")
    consume.add_argument(
        "--requeue-delay",
        type=delay_ms_arg,
        default=None,
        metavar="D",
        help="with --nack: deliver again after D (default 0)",
    )
    consume.add_argument(
        "--prefetch",
        type=bounded_int_arg("the window", _checks.MAX_CREDIT),
        default=None,
        metavar="N",
        help="most unacked deliveries in flight (default 100)",
    )
    consume.add_argument(
        "--idle-timeout",
        dest="idle_timeout_ms",
        type=duration_ms_arg,
        metavar="D",
        help="stop when no message arrives for D (default: wait for ever)",
    )
    consume.add_argument(
        "--timeout",
        dest="idle_timeout_ms",
        type=duration_ms_arg,
        action=DeprecatedFlag,
        replacement="--idle-timeout",
        meaning="how long consume waits for a message",
        default=argparse.SUPPRESS,
        metavar="D",
        help="deprecated spelling of --idle-timeout",
    )

    status = commands.add_parser(
        "status",
        help="the cluster's topics and groups (asked of the leader)",
        description="Topics, groups and their counts. Asked of the leader: a follower knows "
        "due, in-flight and consumer counts only as its own local view, so the answer of a "
        "follower that names a leader is asked again of the leader. The first line says "
        "whose view it is.",
    )
    status.add_argument("--json", action="store_true", help="print the raw status as JSON")
    status.add_argument(
        "--local",
        action="store_true",
        help="show the connected node's own view (on a follower: due, in flight and "
        "consumers are its local view, not the cluster's)",
    )

    group = commands.add_parser("group", help="create, delete and list consumer groups")
    group_commands = group.add_subparsers(dest="group_command", required=True, metavar="ACTION")
    create = group_commands.add_parser("create", help="create a consumer group (idempotent)")
    create.add_argument("topic", type=existing_name_arg("topic", consume=True))
    create.add_argument("group", type=existing_name_arg("group"))
    create.add_argument(
        "--visibility-timeout",
        type=visibility_timeout_arg,
        metavar="D",
        help="redeliver a delivery not acked within D (default: the server's)",
    )
    create.add_argument(
        "--max-deliveries",
        type=bounded_int_arg("the number of attempts", MAX_DELIVERIES),
        metavar="N",
        help="attempts before a message goes to TOPIC.dlq (default: the server's)",
    )
    create.add_argument(
        "--dead-letter-expired",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="send messages whose TTL runs out to TOPIC.dlq instead of dropping them",
    )
    create.add_argument(
        "--from-backlog",
        action="store_true",
        help="a new group also gets every message of TOPIC pending when it is created, once each "
        "(not only later ones)",
    )
    delete = group_commands.add_parser("delete", help="delete a group and its pending deliveries")
    delete.add_argument("topic", type=existing_name_arg("topic"))
    delete.add_argument("group", type=existing_name_arg("group"))
    group_list = group_commands.add_parser("list", help="every group with its counts")
    group_list.add_argument("--json", action="store_true")

    topic = commands.add_parser("topic", help="list topics")
    topic_commands = topic.add_subparsers(dest="topic_command", required=True, metavar="ACTION")
    topic_list = topic_commands.add_parser("list", help="every topic with its totals")
    topic_list.add_argument("--json", action="store_true")

    cluster = commands.add_parser("cluster", help="cluster membership and leadership")
    cluster_commands = cluster.add_subparsers(
        dest="cluster_command", required=True, metavar="ACTION"
    )
    cluster_status = cluster_commands.add_parser(
        "status", help="membership, term, leader and replication progress"
    )
    cluster_status.add_argument("--json", action="store_true")
    cluster_status.add_argument(
        "--local",
        action="store_true",
        help="show the connected node's own view (match index and lag are the leader's)",
    )
    add_node = cluster_commands.add_parser(
        "add-node", help="add a node (learner, promoted to voter once caught up)"
    )
    add_node.add_argument("node_id", type=node_id_arg, metavar="NODE_ID")
    add_node.add_argument("raft_address", type=address_arg, metavar="RAFT_HOST:PORT")
    add_node.add_argument("client_address", type=address_arg, metavar="CLIENT_HOST:PORT")
    remove_node = cluster_commands.add_parser("remove-node", help="remove a node")
    remove_node.add_argument("node_id", type=node_id_arg, metavar="NODE_ID")
    transfer = cluster_commands.add_parser(
        "transfer-leader", help="hand leadership to a node (default: the most up-to-date)"
    )
    transfer.add_argument("node_id", type=node_id_arg, nargs="?", default=None, metavar="NODE_ID")
    completion = commands.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a completion script for SHELL (made by shtab). For bash: "
        "futureq-cli completion bash > ~/.local/share/bash-completion/completions/futureq-cli; "
        "for zsh: futureq-cli completion zsh > a directory of $fpath as _futureq-cli.",
    )
    completion.add_argument(
        "shell", choices=COMPLETION_SHELLS, metavar="SHELL", help="bash, zsh or tcsh"
    )
    manage_commands.add_parsers(commands, existing_name_arg, parse_at_ms, duration_ms_arg)
    return parser


def check_publish_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    given: dict[str, str] = {}
    for name, value in args.headers or ():
        if name in given:
            # A dict keeps the last: a=1 would vanish without a word.
            parser.error(
                f"argument --header: {name!r} is given twice ({name}={given[name]}, "
                f"{name}={value}); a message has one value per header name"
            )
        given[name] = value
    for flag, path in (("--file", args.file), ("--payload-file", args.payload_file)):
        if path is not None and path != "-":
            _check_readable_file(parser, flag, path)
    if args.file is not None:
        extra = [
            flag
            for flag, value in (
                ("TOPIC", args.topic),
                ("PAYLOAD", args.payload),
                ("--payload-file", args.payload_file),
                ("--delay", args.delay),
                ("--at", args.at),
                ("--ttl", args.ttl),
                # Each line carries its own headers and key; these were dropped unsaid.
                ("--header", args.headers),
                ("--idempotency-key", args.idempotency_key),
            )
            if value is not None
        ]
        if extra:
            parser.error(
                f"publish --file takes topic, payload and times from each line; "
                f"drop {', '.join(extra)}"
            )
        return  # --batch-size and --linger not given: publish --file's defaults
    if args.batch_size is not None:
        parser.error("argument --batch-size: only with --file (one message is one PUBLISH)")
    if args.linger is not None:
        parser.error("argument --linger: only with --file (one message is sent at once)")
    if args.failed_out is not None:
        parser.error("argument --failed-out: only with --file (one message is one PUBLISH)")
    if args.topic is None:
        parser.error("publish needs TOPIC and PAYLOAD (or --payload-file F), or --file F")
    if (args.payload is None) == (args.payload_file is None):
        parser.error("publish needs exactly one of PAYLOAD or --payload-file F")
    if args.payload is not None:
        try:
            argv_bytes(args.payload)
        except UnicodeEncodeError as exc:
            parser.error(
                f"argument PAYLOAD: {exc.object[exc.start]!r} at character {exc.start + 1} "
                "is a lone surrogate, which stands for no byte; pass the payload as bytes"
            )


def _check_readable_file(parser: argparse.ArgumentParser, flag: str, path: str) -> None:
    """Refuse (usage error, exit 2) a ``flag`` path that is no readable file, before
    anything connects. Found by a tester: ``--file /tmp`` printed ``[OS_ERROR] Is a
    directory: /tmp`` (exit 1) naming no flag, and only after connecting, so with the
    server down the user saw CONNECTION_LOST instead."""
    if not os.path.exists(path):
        parser.error(f"argument {flag}: {path}: no such file")
    if os.path.isdir(path):
        parser.error(f"argument {flag}: {path} is a directory; give a file")
    if not os.access(path, os.R_OK):
        parser.error(f"argument {flag}: {path} cannot be read (permission denied)")
