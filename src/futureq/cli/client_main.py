"""``futureq-cli``: publish, consume and inspect a FutureQ cluster from the shell.

::

    futureq-cli [--server HOST:PORT[,...]] [--tls-ca FILE] [--token T]
                [--request-timeout D] COMMAND

    publish TOPIC PAYLOAD [--delay D | --at TIME] [--ttl D]     print the message id
    publish TOPIC - [...]                                        payload bytes from stdin
    publish TOPIC --payload-file F [...]                         binary payload
    publish --file batch.jsonl [--batch-size N]                  JSON lines, with a summary
    consume TOPIC --group G [--count N] [--json] [--no-ack | --nack [--requeue-delay D]]
                  [--prefetch N] [--idle-timeout D]
    status [--json] [--local]   the cluster's topics and groups (asked of the leader)
    group create TOPIC GROUP [--visibility-timeout D] [--max-deliveries N]
    group delete TOPIC GROUP
    group list [--json]
    topic list [--json]
    cluster status [--json] [--local]
    cluster add-node NODE_ID RAFT_HOST:PORT CLIENT_HOST:PORT
    cluster remove-node NODE_ID
    cluster transfer-leader [NODE_ID]
    completion bash|zsh|tcsh

Durations are ``250ms``, ``5s``, ``10m``, ``2h``, ``3d``, ``1h30m`` or bare milliseconds
(:mod:`futureq.cli.durations`); JSON lines and ``consume --json`` in
:mod:`futureq.cli.jsonl`. Exit status: 0 success (also when ``consume`` stops
at ``--count`` or ``--idle-timeout``, unless its connection was lost), 1 any error or
any failed line, 2 usage error,
130 interrupted. Errors are one line on stderr: ``error: [CODE_NAME] sentence``.
Every command and flag is described in ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import binascii
import collections
import datetime
import json
import os
import re
import ssl
import sys
import time
from collections.abc import Callable, Sequence
from typing import IO, Any, Final

import attrs
import shtab
import trio

from futureq import __version__
from futureq.cli import manage_commands
from futureq.cli.argv_text import argv_bytes, not_text, text_arg
from futureq.cli.durations import (
    BEYOND_ANY_SERVER,
    MAX_DELAY_MS,
    delay_ms_arg,
    duration_ms_arg,
    positive_duration_ms_arg,
)
from futureq.cli.jsonl import (
    JsonlItem,
    LineFailure,
    parse_jsonl,
    record_line,
    render_payload,
)
from futureq.client import Client, Delivery, _checks, open_client
from futureq.client._base import parse_servers
from futureq.client._batching import PUBLISH_FRAME_OVERHEAD_BYTES, split_by_size
from futureq.clock import SystemClock
from futureq.config import split_host_port
from futureq.errors import (
    ClientClosedError,
    ConnectionLostError,
    ErrorCode,
    FutureQError,
    ProtocolError,
    RequestError,
)
from futureq.wire import validation
from futureq.wire.validation import (
    MAX_PLAUSIBLE_EPOCH_MS,
    MIN_PLAUSIBLE_EPOCH_MS,
    implausible_epoch_ms,
)

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130

COMPLETION_SHELLS: Final = ("bash", "zsh", "tcsh")
STDIN_PAYLOAD: Final = "-"
"""``publish TOPIC -`` reads the payload bytes from standard input."""
SERVER_ENV: Final = "FUTUREQ_SERVER"
TOKEN_ENV: Final = "FUTUREQ_TOKEN"
DEFAULT_SERVER: Final = "127.0.0.1:7450"
DEFAULT_BATCH_SIZE: Final = 500
MAX_BATCH_SIZE: Final = 1000
"""Most messages per PUBLISH of ``publish --file`` (``docs/cli.md``): the client's
``max_batch_items``, which :func:`run_command` passes to ``open_client``."""
MAX_FAILURES_SHOWN: Final = 50


# ---------------------------------------------------------------------------------
# Pure helpers (unit-tested in tests/unit/client/test_client_cli_helpers.py)
# ---------------------------------------------------------------------------------


def delivery_json(delivery: Delivery) -> str:
    """The line ``consume --json`` prints for one delivery: strict JSON, shape
    ``{"id", "topic", "group", "payload", "payload_encoding" ("json" | "text" |
    "base64"), "due_ms", "delivered_ms", "attempt"}``, plus ``"headers"`` when the
    message has any; times in ms since the Unix epoch (payload encodings in
    :mod:`futureq.cli.jsonl`)."""
    return record_line(
        {"id": delivery.id, "topic": delivery.topic, "group": delivery.group},
        delivery.payload,
        {
            "due_ms": delivery.due_ms,
            "delivered_ms": delivery.delivered_ms,
            "attempt": delivery.attempt,
            **({"headers": delivery.headers} if delivery.headers else {}),
        },
    )


def publish_topic_arg(text: str) -> str:
    """An argparse type: a topic one may publish to (``docs/protocol.md``, "Names").

    Raises:
        argparse.ArgumentTypeError: the server would refuse the name.
    """
    try:
        validation.check_name("topic", text)  # the server also refuses the .dlq suffix
    except RequestError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


def existing_name_arg(kind: str) -> Callable[[str], str]:
    """An argparse type for a topic or group to consume from or manage: the name grammar,
    or a name stored by an earlier version (the server decides which exist)."""

    def check(text: str) -> str:
        try:
            validation.check_legacy_name(kind, text)
        except RequestError as exc:
            raise argparse.ArgumentTypeError(exc.message) from None
        return text

    return check


def format_ms(ms: int) -> str:
    """``2026-01-02T03:04:05.678Z`` for a wall-clock time in ms since the Unix epoch."""
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def delivery_line(delivery: Delivery) -> str:
    """The readable one-line form ``consume`` prints without ``--json``: a JSON payload
    as it is, other UTF-8 text as it is, other bytes as ``base64:...``; in the text
    every non-printable character (a line break, ESC, U+2028) is escaped, ``\\n``,
    ``\\u001b``, so a payload cannot forge a line or drive the terminal."""
    shown, encoding = render_payload(delivery.payload)
    if encoding == "text":
        shown = manage_commands.escape_controls(json.loads(shown))
    elif encoding == "json":
        shown = manage_commands.escape_controls(shown)  # U+2028 may stand in a JSON string
    elif encoding == "base64":
        shown = f"base64:{json.loads(shown)}"
    return (
        f"#{delivery.id} {delivery.topic}/{delivery.group} attempt={delivery.attempt} "
        f"due={format_ms(delivery.due_ms)}: {shown}"
    )


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_RFC3339 = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})[Tt ](?P<time>\d{2}:\d{2}(?::\d{2})?)"
    r"(?:\.(?P<fraction>\d+))?(?P<zone>[Zz]|[+-]\d{2}:\d{2})?"
)


def parse_at_ms(text: str, *, now_ms: int | None = None) -> int:
    """``--at`` (and ``--from``, ``--to``): an RFC 3339 time, or integer **milliseconds**
    since the Unix epoch.

    RFC 3339 / ISO 8601: ``2026-05-01T12:00:00Z``, ``2026-05-01T12:00:00.250+02:00``,
    ``2026-05-01 12:00:00z``; fractions of a second to the millisecond (more digits
    are cut); no zone means UTC. A number must be milliseconds: one that can only be
    seconds (or micro- or nanoseconds) since the epoch is refused with a sentence
    saying so (``docs/cli.md``, "Times"), suggesting only a value this function takes;
    0 means "at once". A time more than :data:`~futureq.cli.durations.MAX_DELAY_MS`
    ahead of ``now_ms`` is refused as too far ahead, like such a delay: no server takes
    it, and no message can be due then.

    Args:
        text: The time as typed.
        now_ms: This machine's wall clock in ms (default: read it).

    Raises:
        argparse.ArgumentTypeError: not a time, a unit mistake, or too far ahead.
    """
    latest_ms = (SystemClock().wall_ms() if now_ms is None else now_ms) + MAX_DELAY_MS
    stripped = text.strip()
    if stripped.isdigit():
        value = int(stripped)
        if value > latest_ms and not _unit_reading_within(value, latest_ms):
            raise argparse.ArgumentTypeError(_too_far_ahead(text, value, latest_ms))
        # Not named "--at": --from and --to take times too (argparse names the flag).
        mistake = implausible_epoch_ms("the time", value)
        if mistake is not None:
            if 0 < value < MIN_PLAUSIBLE_EPOCH_MS and value * 1000 > latest_ms:
                # Seconds would be as far ahead as the milliseconds are behind.
                mistake = mistake.split(": it looks like")[0] + (
                    ": the time must be milliseconds since the Unix epoch"
                )
            raise argparse.ArgumentTypeError(mistake + ", or give an RFC 3339 time")
        if value > latest_ms:
            raise argparse.ArgumentTypeError(_too_far_ahead(text, value, latest_ms))
        return value
    match = _RFC3339.fullmatch(stripped)
    moment: datetime.datetime | None = None
    if match is not None:
        fraction = (match["fraction"] or "")[:6]
        zone = (match["zone"] or "+00:00").upper().replace("Z", "+00:00")
        clock = match["time"] if match["time"].count(":") == 2 else match["time"] + ":00"
        iso = f"{match['date']}T{clock}{'.' + fraction.ljust(6, '0') if fraction else ''}{zone}"
        try:
            moment = datetime.datetime.fromisoformat(iso)
        except ValueError:
            moment = None
    if moment is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an RFC 3339 / ISO 8601 time (e.g. 2026-05-01T12:00:00Z) "
            "nor milliseconds since the Unix epoch"
        )
    value = (moment - _EPOCH) // datetime.timedelta(milliseconds=1)
    if value > latest_ms:
        raise argparse.ArgumentTypeError(_too_far_ahead(text, value, latest_ms))
    if value != 0 and value < MIN_PLAUSIBLE_EPOCH_MS:  # 1970-01-01T00:00:00Z: "at once"
        raise argparse.ArgumentTypeError(f"{text!r} is before 2000-01-01; give a time to come")
    return value


def _unit_reading_within(value: int, latest_ms: int) -> bool:
    """Whether ``value`` read as micro- or nanoseconds is a time :func:`parse_at_ms`
    takes (then its unit-mistake sentence suggests it)."""
    return any(
        MIN_PLAUSIBLE_EPOCH_MS <= value // divisor <= min(latest_ms, MAX_PLAUSIBLE_EPOCH_MS)
        for divisor in (1000, 1_000_000)
    )


def _too_far_ahead(text: str, value: int, latest_ms: int) -> str:
    ahead_ms = value - (latest_ms - MAX_DELAY_MS)
    return (
        f"{text!r} is {ahead_ms / 86_400_000 / 365.25:.0f} years from now ({ahead_ms} ms), "
        f"{BEYOND_ANY_SERVER}"
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


MAX_DELIVERIES: Final = 1_000_000
"""Largest ``--max-deliveries`` (GROUP_CREATE ``max_deliveries``: 1 to 1,000,000 attempts,
``docs/protocol.md``)."""


def _bounded_int(what: str, high: int) -> Callable[[str], int]:
    """argparse type: a whole number from 1 to ``high`` (``--prefetch``,
    ``--max-deliveries``); a larger one is a usage error naming the range, not a request
    the server refuses or one that cannot even be encoded (``10**30``)."""

    def parse(text: str) -> int:
        value = _positive_int(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"{what} is 1 to {high:,}, got {text.strip()}")
        return value

    return parse


def _batch_size(text: str) -> int:
    """argparse type of ``--batch-size``: 1 to :data:`MAX_BATCH_SIZE` (a larger value
    was silently cut to it)."""
    value = _positive_int(text)
    if value > MAX_BATCH_SIZE:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_BATCH_SIZE} messages go in one PUBLISH, got {value}; "
            f"give 1 to {MAX_BATCH_SIZE} (default {DEFAULT_BATCH_SIZE})"
        )
    return value


def check_servers(text: str) -> None:
    """A ``--server`` / ``$FUTUREQ_SERVER`` value: one or more ``HOST:PORT``, commas
    between them.

    Raises:
        ValueError: with a sentence naming the bad address.
    """
    addresses = [part.strip() for part in text.split(",") if part.strip()]
    if not addresses:
        raise ValueError("give at least one server address HOST:PORT")
    for address in addresses:
        check_address(address)


def check_address(address: str) -> None:
    """One ``HOST:PORT`` the client may connect to: a port, and a host name the
    resolver can look up (UTF-8 text; a non-ASCII name must have an IDNA form, which is
    what the client's resolver sends).

    Raises:
        ValueError: with a sentence naming the bad address.
    """
    split_host_port(address)
    problem = not_text(address)
    if problem is not None:
        raise ValueError(f"the address {problem}")
    _checks.check_server_address(address)  # the client library's own rule


def _address_arg(text: str) -> str:
    """argparse type: a ``HOST:PORT`` (:func:`check_address`)."""
    try:
        check_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def error_line(exc: BaseException, servers: str) -> str:
    """The one line printed on stderr for an error: ``error: [CODE_NAME] sentence``."""
    if isinstance(exc, RequestError | ProtocolError):
        return f"error: [{exc.code.name}] {exc.message}"
    if isinstance(exc, ConnectionLostError):
        hint = ""
        text = str(exc)
        # Ask about the --server addresses only when they are what failed: a sharded
        # node's shard K listens elsewhere, and its failure names its own address.
        asked = any(
            re.search(rf"{re.escape(address)}(?!\d)", text) for address in parse_servers(servers)
        )
        if asked and ("could not connect" in text or "no connection to any" in text):
            hint = (
                f"; is a FutureQ server running at {servers}? "
                "(start one with `make run`, or pass --server / set FUTUREQ_SERVER)"
            )
        return f"error: [CONNECTION_LOST] {exc}{hint}"
    if isinstance(exc, ClientClosedError):
        return f"error: [CLIENT_CLOSED] {exc}"
    if isinstance(exc, OSError):
        return f"error: [OS_ERROR] {exc.strerror or exc}" + (
            f": {exc.filename}" if exc.filename else ""
        )
    return f"error: [{type(exc).__name__}] {exc}"


# ---------------------------------------------------------------------------------
# Argument parsing
# ---------------------------------------------------------------------------------


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
        "--file", metavar="F", help="publish every line of a JSONL file"
    ).complete = shtab.FILE  # type: ignore[attr-defined]
    publish.add_argument(
        "--batch-size",
        type=_batch_size,
        default=None,
        metavar="N",
        help=f"messages per PUBLISH with --file (default {DEFAULT_BATCH_SIZE}, "
        f"at most {MAX_BATCH_SIZE})",
    )

    consume = commands.add_parser(
        "consume",
        help="receive messages as a member of a consumer group",
        description="Print each delivered message, then ack it (unless --no-ack/--nack).",
    )
    consume.add_argument("topic", type=existing_name_arg("topic"))
    consume.add_argument(
        "--group",
        required=True,
        type=existing_name_arg("group"),
        help="consumer group (created if new)",
    )
    consume.add_argument("--count", type=_positive_int, metavar="N", help="stop after N messages")
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
        type=_bounded_int("the window", _checks.MAX_CREDIT),
        default=100,
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
    create.add_argument("topic", type=existing_name_arg("topic"))
    create.add_argument("group", type=existing_name_arg("group"))
    create.add_argument(
        "--visibility-timeout",
        type=duration_ms_arg,
        metavar="D",
        help="redeliver a delivery not acked within D (default: the server's)",
    )
    create.add_argument(
        "--max-deliveries",
        type=_bounded_int("the number of attempts", MAX_DELIVERIES),
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
        help="a new group also gets every message of TOPIC still pending (not only later ones)",
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
    add_node.add_argument("node_id", type=_node_id, metavar="NODE_ID")
    add_node.add_argument("raft_address", type=_address_arg, metavar="RAFT_HOST:PORT")
    add_node.add_argument("client_address", type=_address_arg, metavar="CLIENT_HOST:PORT")
    remove_node = cluster_commands.add_parser("remove-node", help="remove a node")
    remove_node.add_argument("node_id", type=_node_id, metavar="NODE_ID")
    transfer = cluster_commands.add_parser(
        "transfer-leader", help="hand leadership to a node (default: the most up-to-date)"
    )
    transfer.add_argument("node_id", type=_node_id, nargs="?", default=None, metavar="NODE_ID")
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


def _node_id(text: str) -> int:
    """argparse type: a node id, an integer in 1..2**31-1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a node id (a whole number >= 1)"
        ) from None
    if not 1 <= value <= 2**31 - 1:
        raise argparse.ArgumentTypeError(f"node ids are 1 to 2147483647, got {value}")
    return value


def _check_publish_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    given: dict[str, str] = {}
    for name, value in args.headers or ():
        if name in given:
            # A dict keeps the last: a=1 would vanish without a word.
            parser.error(
                f"argument --header: {name!r} is given twice ({name}={given[name]}, "
                f"{name}={value}); a message has one value per header name"
            )
        given[name] = value
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
        if args.batch_size is None:
            args.batch_size = DEFAULT_BATCH_SIZE
        return
    if args.batch_size is not None:
        parser.error("argument --batch-size: only with --file (one message is one PUBLISH)")
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


# ---------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------


@attrs.define
class Output:
    """Where a command writes: ``stdout`` for results, ``stderr`` for errors; ``stdin``
    is where ``publish TOPIC -`` reads its payload."""

    stdout: IO[str]
    stderr: IO[str]
    stdin: IO[bytes] | None = None

    def out(self, text: str) -> None:
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def err(self, text: str) -> None:
        self.stderr.write(text + "\n")
        self.stderr.flush()

    @property
    def is_terminal(self) -> bool:
        return self.stdout.isatty()


def read_payload(handle: IO[bytes], limit: int, source: str) -> bytes:
    """Read a payload from ``handle``, at most ``limit`` + 1 bytes (``/dev/zero`` or
    ``yes |`` would otherwise fill the memory).

    Raises:
        RequestError: PAYLOAD_TOO_LARGE when there are more than ``limit`` bytes.
    """
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = handle.read(limit + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:
        raise RequestError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"the payload from {source} is more than {limit} bytes, the largest frame the "
            "server accepts (its payload limit, max_payload_bytes, is 1 MiB by default); "
            "send a smaller payload",
        )
    return b"".join(chunks)


async def _publish_one(client: Client, args: argparse.Namespace, io: Output) -> int:
    # No payload can be larger than a frame: read one byte more to know it is too large.
    limit = client.max_frame_bytes
    if args.payload_file is not None:
        with open(args.payload_file, "rb") as handle:  # noqa: ASYNC230 - a bounded read
            payload = read_payload(handle, limit, args.payload_file)
    elif args.payload == STDIN_PAYLOAD:
        stdin = io.stdin if io.stdin is not None else sys.stdin.buffer
        payload = await trio.to_thread.run_sync(read_payload, stdin, limit, "standard input")
    else:
        # The bytes the shell passed: a payload is bytes, so $'\xff' is sent as 0xff
        # (argv is decoded with surrogateescape; UTF-8 text stays its UTF-8).
        payload = argv_bytes(args.payload)
    message_id = await client.publish(
        args.topic,
        payload,
        delay_ms=args.delay,
        deliver_at_ms=args.at,
        ttl_ms=args.ttl,
        headers=dict(args.headers) if args.headers else None,
        idempotency_key=args.idempotency_key,
    )
    io.out(str(message_id))
    return EXIT_OK


@attrs.define
class PublishSummary:
    """Outcome of ``publish --file``."""

    published: int = 0
    duplicates: int = 0
    """Lines that stored nothing: their idempotency key named an earlier message."""
    failures: list[LineFailure] = attrs.Factory(list)
    stopped_at_line: int | None = None
    """The first line of the batch that found no server within --request-timeout, after
    which nothing more was sent (None: every batch was tried)."""
    not_sent: int = 0
    """Lines of the batches after that one, reported as failed without being sent."""


def frame_batches(
    items: Sequence[JsonlItem], batch_size: int, max_frame_bytes: int
) -> list[list[JsonlItem]]:
    """Consecutive batches of at most ``batch_size`` items whose PUBLISH frame stays
    within ``max_frame_bytes`` (an item too large for any frame goes alone): the
    client's own split (:func:`~futureq.client._batching.split_by_size`), one frame per
    batch, so a refused item's batch can be sent again without it."""
    budget = max_frame_bytes - PUBLISH_FRAME_OVERHEAD_BYTES
    batches: list[list[JsonlItem]] = []
    start = 0
    while start < len(items):
        end = split_by_size(items, start, batch_size, budget)
        batches.append(list(items[start:end]))
        start = end
    return batches


async def publish_items(
    client: Client,
    items: Sequence[JsonlItem],
    batch_size: int,
    on_progress: Callable[[int], None] = lambda n: None,
    max_frame_bytes: int | None = None,
) -> PublishSummary:
    """Publish JSONL items in batches; a refused item is reported and the rest resent.

    Batches hold at most ``batch_size`` items and fit one PUBLISH frame of the
    server's ``max_frame_bytes`` (by each item's ``wire_bytes``). The server stores
    nothing of a refused PUBLISH and names its first bad item, so that line becomes a
    failure and the batch is sent again without it (a line the client cannot encode
    never gets here: :class:`PublishItem` refuses it when the line is read). Errors not
    naming an item (connection lost, 3xx after retries) fail every line of the batch;
    those two mean no server answered for a whole ``request_timeout_s``, so the lines
    of the later batches are failed as not sent rather than each batch waiting as long
    again (:attr:`PublishSummary.stopped_at_line`).

    Args:
        client: A connected client.
        items: The good lines, in order.
        batch_size: Messages per PUBLISH (capped at the client's ``max_batch_items``).
        on_progress: Called with the number of lines settled (published or failed).
        max_frame_bytes: The server's frame limit (default: learned from the client).

    Returns:
        The counts published and already published (a duplicate idempotency key) and
        the failed lines, in line order.
    """
    summary = PublishSummary()
    size = max(1, min(batch_size, client.max_batch_items))
    limit = client.max_frame_bytes if max_frame_bytes is None else max_frame_bytes
    pending = collections.deque(frame_batches(items, size, limit))
    while pending:
        batch = pending.popleft()
        too_big = [e for e in batch if e.wire_bytes > limit - PUBLISH_FRAME_OVERHEAD_BYTES]
        if len(batch) == 1 and too_big:
            summary.failures.append(
                LineFailure(
                    batch[0].line_number,
                    f"[{ErrorCode.FRAME_TOO_LARGE.name}] the message takes "
                    f"{batch[0].wire_bytes} bytes; the server takes frames of at most "
                    f"{limit} bytes (and payloads of at most its max_payload_bytes)",
                )
            )
            on_progress(1)
            continue
        while batch:
            duplicates: list[int] = []
            # What was stored even though the call raised: on a sharded node the other
            # shards' parts of a batch one shard refused. Counted here and never resent.
            stored: dict[int, int] = {}
            try:
                await client.publish_batch(
                    [entry.item for entry in batch], duplicates=duplicates, stored=stored
                )
            except RequestError as exc:
                index = exc.item_index
                named = index is not None and 0 <= index < len(batch) and index not in stored
                bad_entry = batch[index] if named and index is not None else None
                batch = _drop_stored(batch, stored, duplicates, summary, on_progress)
                if bad_entry is not None:
                    batch = [entry for entry in batch if entry is not bad_entry]
                    summary.failures.append(
                        LineFailure(bad_entry.line_number, f"[{exc.code.name}] {exc.message}")
                    )
                    on_progress(1)
                    continue
                reason = f"[{exc.code.name}] {exc.message}"
                # A 3xx error reaches us only once retrying it would pass the deadline.
                unavailable = exc.code.retryable
            except (ConnectionLostError, ProtocolError) as exc:
                batch = _drop_stored(batch, stored, duplicates, summary, on_progress)
                reason = error_line(exc, ",".join(client.servers)).removeprefix("error: ")
                unavailable = isinstance(exc, ConnectionLostError)
            else:
                summary.published += len(batch) - len(duplicates)
                summary.duplicates += len(duplicates)
                on_progress(len(batch))
                break
            summary.failures.extend(LineFailure(entry.line_number, reason) for entry in batch)
            on_progress(len(batch))
            if unavailable and batch:
                # The client retried until --request-timeout ran out: every later batch
                # would wait as long again (300 batches x 8 s is 40 minutes of silence).
                # One deadline per outage, not one per batch: stop, and report the rest.
                _fail_not_sent(pending, batch[0].line_number, reason, summary, on_progress)
            break
    summary.failures.sort(key=lambda failure: failure.line_number)
    return summary


def _fail_not_sent(
    pending: collections.deque[list[JsonlItem]],
    failed_line: int,
    reason: str,
    summary: PublishSummary,
    on_progress: Callable[[int], None],
) -> None:
    """Report every line of the batches still ``pending`` as not sent, and empty it:
    the batch starting at ``failed_line`` found the cluster unavailable for a whole
    ``--request-timeout`` (``reason``), so publishing stops there (``docs/cli.md``,
    "publish --file")."""
    code = reason.split("]", 1)[0] + "]" if reason.startswith("[") else "[CONNECTION_LOST]"
    why = (
        f"{code} not sent: publishing stopped when the batch from line {failed_line} "
        "found no available server within --request-timeout"
    )
    count = 0
    while pending:
        for entry in pending.popleft():
            summary.failures.append(LineFailure(entry.line_number, why))
            count += 1
    summary.stopped_at_line = failed_line
    summary.not_sent = count
    on_progress(count)


def _drop_stored(
    batch: list[JsonlItem],
    stored: dict[int, int],
    duplicates: list[int],
    summary: PublishSummary,
    on_progress: Callable[[int], None],
) -> list[JsonlItem]:
    """Count the lines of ``batch`` a failed call stored anyway (``stored``: positions
    in ``batch``; ``duplicates``: those of them that were already published) and return
    the lines still to send, in order."""
    if not stored:
        return batch
    repeated = set(duplicates)
    summary.duplicates += sum(1 for position in stored if position in repeated)
    summary.published += sum(1 for position in stored if position not in repeated)
    on_progress(len(stored))
    return [entry for position, entry in enumerate(batch) if position not in stored]


async def _publish_file(client: Client, args: argparse.Namespace, io: Output) -> int:
    with open(args.file, encoding="utf-8", errors="surrogateescape") as handle:  # noqa: ASYNC230
        items, failures = parse_jsonl(handle)
    batch_size = args.batch_size or DEFAULT_BATCH_SIZE
    started = time.monotonic()
    if io.is_terminal and items:
        from rich.progress import Progress

        with Progress(transient=True) as progress:
            task = progress.add_task("publishing", total=len(items))
            summary = await publish_items(
                client, items, batch_size, lambda n: progress.advance(task, n)
            )
    else:
        summary = await publish_items(client, items, batch_size)
    elapsed_s = max(time.monotonic() - started, 1e-9)
    summary.failures = sorted(failures + summary.failures, key=lambda f: f.line_number)
    rate = summary.published / elapsed_s
    already = (
        f", {summary.duplicates} already published (same idempotency key)"
        if summary.duplicates
        else ""
    )
    io.out(
        f"published {summary.published} message(s){already} in {elapsed_s:.2f} s "
        f"({rate:.0f} msgs/s); {len(summary.failures)} failed line(s)"
    )
    for failure in summary.failures[:MAX_FAILURES_SHOWN]:
        io.err(str(failure))
    if len(summary.failures) > MAX_FAILURES_SHOWN:
        io.err(f"... and {len(summary.failures) - MAX_FAILURES_SHOWN} more failed line(s)")
    if summary.stopped_at_line is not None:
        io.err(
            f"stopped at line {summary.stopped_at_line}: its batch found no available "
            f"server within --request-timeout, so the {summary.not_sent} line(s) after "
            "that batch were not sent"
        )
    return EXIT_ERROR if summary.failures else EXIT_OK


async def _consume(client: Client, args: argparse.Namespace, io: Output) -> int:
    prefetch = args.prefetch
    if args.count is not None:
        # Never take more than we will print: a delivery received but not printed
        # would go back to the group with its attempt count raised. With --no-ack the
        # unacked deliveries hold their credit, so the window must fit all of them.
        # (At most what any server grants: a larger --count is no window at all.)
        prefetch = min(args.count, _checks.MAX_CREDIT) if args.no_ack else min(prefetch, args.count)
    received = 0
    async with client.subscribe(args.topic, args.group, prefetch) as sub:
        while args.count is None or received < args.count:
            if args.idle_timeout_ms is None:
                delivery = await sub.__anext__()
            else:
                maybe = await sub.receive(args.idle_timeout_ms / 1000)
                if maybe is None:
                    if client.connected_address is None:
                        # Quiet because the broker is gone, not because the topic is.
                        raise ConnectionLostError(
                            f"lost the connection to {','.join(client.servers)} and could "
                            f"not reconnect; no message for --idle-timeout "
                            f"{args.idle_timeout_ms} ms, stopped after {received} message(s)"
                        )
                    break
                delivery = maybe
            if args.json:
                io.out(delivery_json(delivery))
            else:
                io.out(delivery_line(delivery))
            received += 1
            if received == args.count:
                sub.pause()  # the last one: settling it must not invite another push
            # Settle only after the line is printed and flushed (io.out flushes).
            try:
                if args.nack:
                    await delivery.nack(args.requeue_delay or 0)
                elif not args.no_ack:
                    await delivery.ack()
            except RequestError as exc:
                if exc.code is not ErrorCode.UNKNOWN_DELIVERY_TAG:
                    raise
                # The visibility timeout passed before we settled it: the broker has
                # already handed it out again (at-least-once). Not fatal for the run.
                io.err(
                    f"warning: message {delivery.id} was not settled in time (visibility "
                    "timeout); it will be delivered again"
                )
    return EXIT_OK


def _groups(status: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for topic in status.get("topics", []):
        for group in topic.get("groups", []):
            rows.append({"topic": topic.get("topic"), **group})
    return rows


def _topics(status: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for topic in status.get("topics", []):
        groups = topic.get("groups", [])
        rows.append(
            {
                "topic": topic.get("topic"),
                "groups": len(groups),
                "pending": sum(g.get("pending", 0) for g in groups),
                "due": sum(g.get("due", 0) for g in groups),
                "in_flight": sum(g.get("in_flight", 0) for g in groups),
                "consumers": sum(g.get("consumers", 0) for g in groups),
            }
        )
    return rows


_NODE_KEYS: Final = (
    "node_id",
    "role",
    "leader_address",
    "server_version",
    "applied_index",
    "uptime_s",
)
_GROUP_COLUMNS: Final = (
    "topic",
    "group",
    "pending",
    "due",
    "in_flight",
    "consumers",
    "oldest_due_age",
    "next_due",
    "visibility_timeout_ms",
    "max_deliveries",
)


def age_text(ms: int) -> str:
    """``0s``, ``950ms``, ``1m30s``, ``2d3h``: a duration as a person reads it (the two
    largest units)."""
    if ms < 1000:
        return f"{ms}ms" if ms > 0 else "0s"
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size:
            parts.append(f"{ms // size}{unit}")
            ms %= size
    return "".join(parts[:2])


def group_table_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the ``consumer groups`` table: each STATUS group with its
    ``oldest_due_age`` (how long the earliest due message has waited, from
    ``oldest_due_age_ms``) and ``next_due`` (when its earliest waiting entry falls due,
    from ``next_due_ms``, UTC; blank: none)."""
    shown = []
    for row in rows:
        age, due = row.get("oldest_due_age_ms"), row.get("next_due_ms")
        shown.append(
            {
                **row,
                "oldest_due_age": None if age is None else age_text(int(age)),
                "next_due": None if due is None else format_ms(int(due)),
            }
        )
    return shown


def _table(title: str, columns: Sequence[str], rows: Sequence[dict[str, Any]], io: Output) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        numeric = column not in ("topic", "group")
        table.add_column(column.replace("_", " "), justify="right" if numeric else "left")
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in columns))
    Console(file=io.stdout, width=None if io.is_terminal else 160).print(table)


def view_line(status: dict[str, Any], *, local_asked: bool = False) -> str:
    """One sentence saying whose numbers a STATUS answer holds (the leader's, or one
    node's local view and which fields that affects). ``local_asked``: ``--local``
    asked for this node's own view, so the leader was not asked."""
    node = f"node {status.get('node_id')}"
    if status.get("view", "cluster") != "local":
        return f"cluster view, from the leader ({node})"
    leader_id, leader = status.get("leader_id"), status.get("leader_address")
    if leader is None:
        where = "no leader is known right now"
    else:
        named = f"node {leader_id} at {leader}" if leader_id is not None else leader
        where = f"the leader is {named}, which could not be asked"
        if local_asked:
            where = f"--local asked for this node's own view (the leader is {named})"
    fields = ", ".join(f.replace("_", " ") for f in status.get("leader_only", []))
    return (
        f"LOCAL VIEW of {node} ({status.get('role')}): {fields or 'some numbers'} are known only "
        f"to the leader and show this node's own values; {where}"
    )


def _print_node(status: dict[str, Any], io: Output, *, local_asked: bool = False) -> None:
    io.out(view_line(status, local_asked=local_asked))
    io.out(
        f"node {status.get('node_id')} role={status.get('role')} "
        f"leader={status.get('leader_address') or '(none known)'} "
        f"version={status.get('server_version')} applied_index={status.get('applied_index')} "
        f"uptime={status.get('uptime_s')}s"
    )


def _missing_shards(status: dict[str, Any], io: Output) -> int:
    """Say on stderr which shards of a sharded node did not answer (their topics are
    missing from the answer); EXIT_ERROR if any did, else EXIT_OK."""
    missing = [
        shard
        for shard in status.get("shards") or []
        if isinstance(shard, dict) and shard.get("error")
    ]
    for shard in missing:
        io.err(
            f"warning: {shard['error']} (at {shard.get('address')}); "
            "its topics and numbers are missing from this answer"
        )
    return EXIT_ERROR if missing else EXIT_OK


async def _status(client: Client, args: argparse.Namespace, io: Output) -> int:
    status = await client.status(local=args.local)
    if args.json:
        io.out(json.dumps(status, ensure_ascii=False))
        return _missing_shards(status, io)
    _print_node(status, io, local_asked=args.local)
    rows = _groups(status)
    if rows:
        _table("consumer groups", _GROUP_COLUMNS, group_table_rows(rows), io)
    else:
        io.out("no topics yet")
    subscriptions = [
        {"topic": row["topic"], "group": row["group"], **sub}
        for row in rows
        for sub in row.get("subscriptions", [])
    ]
    if subscriptions:
        # Credit 0 with in_flight = prefetch is a consumer that holds its whole window.
        columns = ("topic", "group", "subscription_id", "prefetch", "credit", "in_flight")
        _table("subscriptions (credit and deliveries held)", columns, subscriptions, io)
    for deleting in status.get("deleting_groups", []):
        io.out(
            f"group {deleting['group']!r} of topic {deleting['topic']!r} was deleted; "
            f"{deleting['pending']} entries left to purge"
        )
    return _missing_shards(status, io)


async def _group(client: Client, args: argparse.Namespace, io: Output) -> int:
    if args.group_command == "create":
        await client.create_group(
            args.topic,
            args.group,
            visibility_timeout_ms=args.visibility_timeout,
            max_deliveries=args.max_deliveries,
            from_backlog=args.from_backlog,
            dead_letter_expired=args.dead_letter_expired,
        )
        io.out(f"group {args.group!r} of topic {args.topic!r} exists")
    elif args.group_command == "delete":
        await client.delete_group(args.topic, args.group)
        io.out(f"group {args.group!r} of topic {args.topic!r} deleted")
    else:
        status = await client.status()
        if status.get("view") == "local":
            io.err(view_line(status))
        rows = _groups(status)
        if args.json:
            io.out(json.dumps(rows, ensure_ascii=False))
        elif rows:
            _table("consumer groups", _GROUP_COLUMNS, group_table_rows(rows), io)
        else:
            io.out("no consumer groups yet")
        return _missing_shards(status, io)
    return EXIT_OK


async def _topic(client: Client, args: argparse.Namespace, io: Output) -> int:
    status = await client.status()
    if status.get("view") == "local":
        io.err(view_line(status))
    rows = _topics(status)
    if args.json:
        io.out(json.dumps(rows, ensure_ascii=False))
    elif rows:
        _table("topics", ("topic", "groups", "pending", "due", "in_flight", "consumers"), rows, io)
    else:
        io.out("no topics yet")
    return _missing_shards(status, io)


async def _cluster(client: Client, args: argparse.Namespace, io: Output) -> int:
    if args.cluster_command == "add-node":
        await client.add_node(args.node_id, args.raft_address, args.client_address)
        io.out(f"node {args.node_id} added as a learner; it becomes a voter once caught up")
        return EXIT_OK
    if args.cluster_command == "remove-node":
        await client.remove_node(args.node_id)
        io.out(f"node {args.node_id} removed")
        return EXIT_OK
    if args.cluster_command == "transfer-leader":
        await client.transfer_leader(args.node_id)
        io.out("leadership transferred")
        return EXIT_OK
    view = await client.cluster_status(local=args.local)
    if args.json:
        io.out(json.dumps(view, ensure_ascii=False))
        return _missing_shards(view, io)
    if view.get("mode") == "single":
        io.out(
            f"node {view.get('node_id')}: runs alone (no Raft), applied index "
            f"{view.get('applied_index')}"
        )
        _shards_table(view, io)
        return _missing_shards(view, io)
    leader = (
        f"leader node {view['leader_id']} at {view.get('leader_address') or 'an unknown address'}"
        if view.get("leader_id") is not None
        else "no leader known"
    )
    io.out(
        f"node {view.get('node_id')}: {view.get('role')}, term {view.get('term')}, {leader}, "
        f"commit index {view.get('commit_index')}, applied index {view.get('applied_index')}"
    )
    if view.get("role") != "leader":
        io.out(
            f"LOCAL VIEW of node {view.get('node_id')}: match index and lag are known only to "
            "the leader"
            + (
                " (--local: not asked)"
                if args.local
                else ", which could not be asked"
                if view.get("leader_address")
                else ""
            )
        )
    clock = view.get("clock")
    if isinstance(clock, dict):
        state = "in bound" if clock.get("in_bound") else "OUT OF BOUND: it will not lead"
        io.out(
            f"cluster time: {'synchronized' if clock.get('synchronized') else 'NOT synchronized'}"
            f", {state} (max_clock_offset_ms {clock.get('max_clock_offset_ms')})"
        )
    nodes = [
        {
            "node": node.get("node_id"),
            "role": node.get("role", ""),
            "raft_address": node.get("raft_address", ""),
            "client_address": node.get("client_address", ""),
            "match_index": node.get("match_index", ""),
            "lag": node.get("lag", ""),
            "clock_offset_ms": node.get("clock_offset_ms", ""),
        }
        for node in view.get("nodes", [])
    ]
    if nodes:
        _table(
            "members",
            (
                "node",
                "role",
                "raft_address",
                "client_address",
                "match_index",
                "lag",
                "clock_offset_ms",
            ),
            nodes,
            io,
        )
    _shards_table(view, io)
    return _missing_shards(view, io)


def _shards_table(view: dict[str, Any], io: Output) -> None:
    """A sharded node's ``cluster_status`` is shard 0's group with every shard's own
    answer under ``shards``: one row per shard, so each group's leader shows (shard 1
    is led by another node than shard 0 once leaders are balanced, docs/sharding.md)."""
    shards = view.get("shards")
    if not isinstance(shards, list) or len(shards) < 2:
        return
    rows = []
    for shard in shards:
        if not isinstance(shard, dict):
            continue
        leader_id = shard.get("leader_id")
        leader = shard.get("leader_address") or ""
        if leader_id is not None:
            leader = f"node {leader_id} at {leader or 'an unknown address'}"
        rows.append(
            {
                "shard": shard.get("shard", ""),
                "address": shard.get("address", ""),
                "role": shard.get("role", "") if "error" not in shard else "",
                "term": shard.get("term", ""),
                "leader": leader,
                "commit_index": shard.get("commit_index", ""),
                "applied_index": shard.get("applied_index", ""),
                "error": shard.get("error", ""),
            }
        )
    columns = ["shard", "address", "role", "term", "leader", "commit_index", "applied_index"]
    if any(row["error"] for row in rows):
        columns.append("error")
    _table("shards", tuple(columns), rows, io)


def _ssl_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    if args.tls_ca is not None:
        return ssl.create_default_context(cafile=args.tls_ca)
    if args.tls:
        return ssl.create_default_context()
    return None


async def run_command(args: argparse.Namespace, io: Output) -> int:
    """Connect and run the parsed command.

    Returns:
        The exit status.

    Raises:
        FutureQError, OSError: reported by :func:`main` as one ``error:`` line.
    """
    handlers: dict[str, Callable[[Client, argparse.Namespace, Output], Any]] = {
        "publish": _publish_file if args.command == "publish" and args.file else _publish_one,
        "consume": _consume,
        "status": _status,
        "group": _group,
        "topic": _topic,
        "cluster": _cluster,
        "cancel": manage_commands.run_cancel,
        "browse": manage_commands.run_browse,
        "reschedule": manage_commands.run_reschedule,
        "purge": manage_commands.run_purge,
        "dlq": manage_commands.run_dlq,
    }
    timeout_s = args.request_timeout_ms / 1000
    async with open_client(
        args.server,
        ssl_context=_ssl_context(args),
        token=args.token,
        connect_timeout_s=min(5.0, timeout_s),
        request_timeout_s=timeout_s,
        max_batch_items=MAX_BATCH_SIZE,
    ) as client:
        result: int = await handlers[args.command](client, args, io)
        return result


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    stdin: IO[bytes] | None = None,
) -> int:
    """Entry point of ``futureq-cli``.

    Args:
        argv: Arguments without the program name (default ``sys.argv[1:]``).
        stdout: Where results go (default ``sys.stdout``).
        stderr: Where errors go (default ``sys.stderr``).
        stdin: Where ``publish TOPIC -`` reads (default ``sys.stdin.buffer``).

    Returns:
        The exit status (also used by ``sys.exit`` when run as a script): 0 ok,
        1 error, 2 usage error, 130 interrupted.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    try:
        if args.command == "publish":
            _check_publish_args(parser, args)
        if args.command == "consume" and args.requeue_delay is not None and not args.nack:
            parser.error(
                "argument --requeue-delay: only with --nack (it says when a nacked "
                "message comes back); add --nack or drop --requeue-delay"
            )
        if args.command != "completion":
            try:
                check_servers(args.server)
            except ValueError as exc:
                source = (
                    "--server"
                    if getattr(args, "server_from_flag", False) or not os.environ.get(SERVER_ENV)
                    else f"${SERVER_ENV}"
                )
                parser.error(
                    f"{source}: {exc}; give HOST:PORT[,HOST:PORT...], e.g. {DEFAULT_SERVER}"
                )
            problem = None if args.token is None else not_text(args.token)
            if problem is not None:
                source = "--token" if getattr(args, "token_from_flag", False) else f"${TOKEN_ENV}"
                parser.error(f"{source}: the token {problem}; a token is text (docs/security.md)")
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    io = Output(stdout or sys.stdout, stderr or sys.stderr, stdin)
    for warning in deprecation_warnings(args):
        io.err(warning)
    if args.command == "completion":
        io.stdout.write(shtab.complete(parser, shell=args.shell))
        return EXIT_OK
    if args.command == "purge":
        refused = manage_commands.confirm_purge(args, sys.stdin, io)
        if refused is not None:
            return refused
    try:
        return trio.run(run_command, args, io)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # pragma: no cover - stdout closed early, e.g. by `| head`
        return EXIT_OK
    except (FutureQError, OSError, ssl.SSLError, binascii.Error) as exc:
        io.err(error_line(exc, args.server))
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
