"""``futureq-cli`` commands that manage scheduled messages (issue 14): ``cancel``,
``browse`` and ``dlq list``.

Kept apart from :mod:`futureq.cli.client_main` (one module per command group, as
``STYLE.md`` asks). Results go to stdout, one line per item or one JSON document.

Source: ``docs/protocol.md``, "CANCEL", "BROWSE"; ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, Final

from futureq.cli.argv_text import not_text
from futureq.cli.durations import delay_ms_arg
from futureq.cli.jsonl import render_payload
from futureq.cli.leader_time import leader_now_ms, passed_warning
from futureq.cli.output import Report, format_ms, reported, write_errors, write_lines
from futureq.wire import frames

if TYPE_CHECKING:
    from futureq.cli.output import Output
    from futureq.client import BrowsePage, Client, DueCounts, ItemStatuses, PendingMessage

EXIT_OK: Final = 0
EXIT_USAGE: Final = 2
CANCEL_CHUNK_IDS: Final = 1000
"""Ids per CANCEL request the CLI sends (a server takes up to ``limits.max_batch_items``)."""
_RESCHEDULE_WORDS: Final = {
    frames.ItemStatus.DONE: "rescheduled",
    frames.ItemStatus.UNKNOWN: "unknown (not pending: acked, expired, cancelled or never published)",
}
_STATUS_WORDS: Final = {
    frames.ItemStatus.DONE: "cancelled",
    frames.ItemStatus.DELIVERED: "cancelled (had been delivered)",
    frames.ItemStatus.UNKNOWN: "unknown (not pending: acked, expired, cancelled or never published)",
}


DEAD_LETTER_REASONS: Final = ("max-deliveries", "rejected", "expired")
"""The ``futureq-reason`` values a dead letter carries (``docs/protocol.md``, "Dead letters")."""
MAX_PREVIEW_BYTES: Final = 1024
"""The most payload bytes a BROWSE previews (the server's ``MAX_PREVIEW_BYTES``)."""

DEFAULT_BUCKETS_MS: Final = (60_000, 3_600_000, 86_400_000)
"""``browse --counts`` buckets: due within the next minute, hour and day."""


def _buckets_arg(duration_arg: Callable[[str], int]) -> Callable[[str], list[int]]:
    """argparse type of ``--buckets``: comma-separated durations, strictly increasing."""

    def parse(text: str) -> list[int]:
        bounds = [duration_arg(part.strip()) for part in text.split(",")]
        for earlier, later in zip(bounds, bounds[1:], strict=False):
            if later <= earlier:
                raise argparse.ArgumentTypeError(
                    f"bucket bounds must increase, e.g. 1m,1h,1d; got {text!r}"
                )
        return bounds

    return parse


def header_arg(text: str) -> tuple[str, str]:
    """argparse type: ``NAME=VALUE`` of ``publish --header``."""
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    for part, what in ((name, "name"), (value, "value")):
        problem = not_text(part)
        if problem is not None:
            shown = repr(name) if what == "value" and not_text(name) is None else "a header"
            raise argparse.ArgumentTypeError(f"the {what} of {shown} {problem}; headers are text")
    return name, value


def message_id_arg(text: str) -> int:
    """argparse type: a message id, a whole number in [0, 2**64-1]."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a message id (a whole number, as publish printed it)"
        ) from None
    if not 0 <= value <= frames.MAX_MESSAGE_ID:
        raise argparse.ArgumentTypeError(f"message ids are 0 to 2**64-1, got {value}")
    return value


def add_parsers(
    commands: Any,
    name_arg: Callable[[str], Callable[[str], str]],
    at_arg: Callable[[str], int],
    duration_arg: Callable[[str], int],
) -> None:
    """Add ``cancel``, ``browse`` and ``dlq`` to ``futureq-cli``'s subparsers.

    ``name_arg(kind)``: the argparse type of an existing topic or group name;
    ``at_arg``: of an absolute time (ms); ``duration_arg``: of a duration (ms).
    """
    cancel = commands.add_parser(
        "cancel", help="cancel scheduled messages by id (in one group or all)"
    )
    cancel.add_argument("topic", type=name_arg("topic"))
    cancel.add_argument("ids", type=message_id_arg, nargs="+", metavar="ID")
    cancel.add_argument(
        "--group",
        type=name_arg("group"),
        default=None,
        help="cancel only this group's copy (default: every group's)",
    )
    cancel.add_argument("--json", action="store_true", help="print [{id, status}, ...]")

    reschedule = commands.add_parser(
        "reschedule", help="give pending messages a new due time by id (in one group or all)"
    )
    reschedule.add_argument("topic", type=name_arg("topic"))
    reschedule.add_argument("ids", type=message_id_arg, nargs="+", metavar="ID")
    when = reschedule.add_mutually_exclusive_group(required=True)
    when.add_argument("--at", type=at_arg, metavar="T", help="due at T")
    # A delay the server applies: refused here as publish --delay refuses it (an
    # epoch-ms number, beyond any server), not sent to be refused by the server.
    when.add_argument("--delay", type=delay_ms_arg, metavar="D", help="due D from now")
    reschedule.add_argument(
        "--group", type=name_arg("group"), default=None, help="only this group's copy"
    )
    reschedule.add_argument("--json", action="store_true", help="print [{id, status}, ...]")

    purge = commands.add_parser(
        "purge", help="remove every message pending now in a topic's groups (or one group)"
    )
    purge.add_argument("topic", type=name_arg("topic"))
    purge.add_argument(
        "--group", type=name_arg("group"), default=None, help="only this group (default: all)"
    )
    purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    browse = commands.add_parser(
        "browse",
        help="list pending messages in due order without claiming them",
        description="Read a group's pending messages (nothing is delivered, claimed or "
        "created). Use it, not consume --no-ack, to look at a queue or a dead-letter topic.",
    )
    browse.add_argument("topic", type=name_arg("topic"))
    browse.add_argument(
        "--group", type=name_arg("group"), default=None, help="the group (default: the only one)"
    )
    browse.add_argument(
        "--from", dest="from_ms", type=at_arg, metavar="T", help="due at or after T"
    )
    until = browse.add_mutually_exclusive_group()
    until.add_argument("--to", dest="to_ms", type=at_arg, metavar="T", help="due before T")
    until.add_argument(
        "--within", type=duration_arg, metavar="D", help="due within D from now (e.g. 1h)"
    )
    _paging_args(browse)
    browse.add_argument(
        "--counts",
        action="store_true",
        help="print how many are due in each bucket (see --buckets) instead of the messages",
    )
    browse.add_argument(
        "--buckets",
        type=_buckets_arg(duration_arg),
        default=list(DEFAULT_BUCKETS_MS),
        metavar="D1,D2,...",
        help="with --counts: bucket bounds as durations from now, increasing "
        "(default 1m,1h,1d: due within the next minute, hour and day)",
    )

    dlq = commands.add_parser("dlq", help="dead letters: list them without claiming them")
    dlq_commands = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    dlq_list = dlq_commands.add_parser(
        "list", help="the dead letters of TOPIC (TOPIC.dlq) with where they came from and why"
    )
    dlq_list.add_argument("topic", type=name_arg("topic"))
    _dlq_group_arg(dlq_list, name_arg)
    _paging_args(dlq_list)
    dlq_redrive = dlq_commands.add_parser(
        "redrive",
        help="move dead letters of TOPIC back to TOPIC and the group they died in",
    )
    dlq_redrive.add_argument("topic", type=name_arg("topic"))
    _dlq_group_arg(dlq_redrive, name_arg)
    dlq_redrive.add_argument(
        "ids", type=message_id_arg, nargs="*", metavar="ID", help="dead-letter ids (dlq list)"
    )
    dlq_redrive.add_argument(
        "--all", action="store_true", help="every dead letter (that matches the filters)"
    )
    dlq_redrive.add_argument(
        "--from-group",
        type=name_arg("group"),
        metavar="GROUP",
        help="with --all: only those that died in GROUP",
    )
    dlq_redrive.add_argument(
        "--reason",
        choices=DEAD_LETTER_REASONS,
        metavar="REASON",
        help="with --all: only those that died for REASON (%(choices)s)",
    )
    dlq_redrive.add_argument(
        "--delay", type=delay_ms_arg, default=0, metavar="D", help="due D after now (default 0)"
    )


def _dlq_group_arg(
    parser: argparse.ArgumentParser, name_arg: Callable[[str], Callable[[str], str]]
) -> None:
    parser.add_argument(
        "--group",
        type=name_arg("group"),
        default=None,
        help="the group of TOPIC.dlq to read (default: its only group, else 'default')",
    )


def _positive_int(text: str) -> int:
    """argparse type of ``--limit``: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value} (--all for every one)")
    return value


def _preview_bytes(text: str) -> int:
    """argparse type of ``--preview``: 0 to :data:`MAX_PREVIEW_BYTES` (the server's most)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of bytes") from None
    if not 0 <= value <= MAX_PREVIEW_BYTES:
        raise argparse.ArgumentTypeError(
            f"the preview is 0 to {MAX_PREVIEW_BYTES} bytes (the server's most), got {value}"
        )
    return value


def _paging_args(parser: argparse.ArgumentParser) -> None:
    how_many = parser.add_mutually_exclusive_group()
    how_many.add_argument(
        "--limit",
        type=_positive_int,
        default=100,
        metavar="N",
        help="print at most N (default 100)",
    )
    how_many.add_argument("--all", action="store_true", help="print every one, page by page")
    parser.add_argument(
        "--preview",
        type=_preview_bytes,
        default=0,
        metavar="BYTES",
        help=f"show the first BYTES of each payload (0 to {MAX_PREVIEW_BYTES}; default none)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")


@reported
async def run_cancel(client: Client, args: argparse.Namespace, io: Report) -> int:
    """``futureq-cli cancel TOPIC ID... [--group G]``: one line per id, then a count."""
    ids: list[int] = args.ids
    outcomes = _Outcomes()
    for start in range(0, len(ids), CANCEL_CHUNK_IDS):
        outcomes.add(
            await client.cancel(args.topic, ids[start : start + CANCEL_CHUNK_IDS], group=args.group)
        )
    statuses, maybe = outcomes.statuses, outcomes.maybe
    unsure_ids = outcomes.warn_unsure(ids, "cancelled", io)
    if args.json:
        rows = [
            {"id": mid, "status": status.name} for mid, status in zip(ids, statuses, strict=True)
        ]
        io.out(json.dumps(rows))
        return EXIT_OK
    for mid, status, unsure in zip(ids, statuses, maybe, strict=True):
        io.out(f"{mid}: {_MAYBE_CANCELLED if unsure else _STATUS_WORDS.get(status, status.name)}")
    done = sum(status != frames.ItemStatus.UNKNOWN for status in statuses)
    where = f"group {args.group!r} of topic" if args.group else "topic"
    unsure_text = f" ({unsure_ids} more may have been: outcome unknown)" if unsure_ids else ""
    io.out(f"cancelled {done} of {len(ids)}{unsure_text} in {where} {args.topic!r}")
    return EXIT_OK


_MAYBE_CANCELLED: Final = (
    "outcome unknown (not pending now; the request was sent again after its answer was "
    "lost, and its first attempt may have cancelled it)"
)


class _Outcomes:
    """The per-id statuses of a CANCEL or RESCHEDULE sent in chunks of ids, and which
    UNKNOWNs an earlier attempt of their request may have handled (its answer lost:
    ``ItemStatuses.earlier_attempt``)."""

    def __init__(self) -> None:
        self.statuses: list[frames.ItemStatus] = []
        self.maybe: list[bool] = []
        """Per id: UNKNOWN in the answer to a request sent again after a lost answer."""
        self.earlier: str | None = None

    def add(self, chunk: ItemStatuses) -> None:
        """Take one chunk's answer (its ids follow the previous chunk's)."""
        self.statuses += chunk
        self.maybe += [
            chunk.earlier_attempt is not None and status == frames.ItemStatus.UNKNOWN
            for status in chunk
        ]
        self.earlier = self.earlier or chunk.earlier_attempt

    def warn_unsure(self, ids: list[int], done: str, io: Report) -> int:
        """Say on stderr how many distinct ids may have been ``done`` by a lost attempt;
        return that count (an id given twice counts once)."""
        unsure = len({mid for mid, maybe in zip(ids, self.maybe, strict=True) if maybe})
        if self.earlier is not None and unsure:
            io.err(_earlier_attempt_warning(done, unsure, self.earlier))
        return unsure


def _earlier_attempt_warning(done: str, count: int, why: str) -> str:
    """The stderr line saying ``count`` ids answered UNKNOWN may have been ``done``
    (``cancelled``, ``redriven``) by an earlier attempt whose outcome is unknown (``why``)."""
    return (
        f"warning: outcome unknown for {count} id(s) reported unknown: an earlier attempt "
        f"of the request may have {done} them ({why}); the request was sent again, and "
        "they are not pending now either way"
    )


BROWSE_PAGE: Final = 1000
"""Messages per BROWSE request the CLI sends (the server's most)."""


async def _print_pages(
    client: Client,
    topic: str,
    group: str | None,
    args: argparse.Namespace,
    from_ms: int | None,
    to_ms: int | None,
    io: Output,
    *,
    dead_letters: bool,
) -> int:
    """Print every message ``--limit`` / ``--all`` asks for, a page at a time as it
    comes (following cursors; so ``--all`` holds one page, not the topic); return how
    many were printed.

    A page's lines are written from a worker thread (:func:`write_lines`): a reader
    that pauses (``browse --all | less``) blocks the write once the pipe is full, and
    blocking the event loop left the server's keepalive PING unanswered, so the broker
    closed the connection (as ``consume``'s did: :mod:`futureq.cli.consume_command`).
    """
    wanted = None if args.all else max(0, args.limit)
    shown = 0
    cursor: bytes | None = None
    while wanted is None or shown < wanted:
        size = BROWSE_PAGE if wanted is None else min(BROWSE_PAGE, wanted - shown)
        page: BrowsePage = await client.browse(
            topic,
            group,
            from_due_ms=from_ms,
            to_due_ms=to_ms,
            cursor=cursor,
            limit=max(1, size),
            preview_bytes=args.preview,
        )
        await write_lines(
            io,
            [
                json.dumps(pending_record(topic, page.group, message), ensure_ascii=False)
                if args.json
                else pending_line(message, dead_letters=dead_letters)
                for message in page.messages
            ],
        )
        shown += len(page.messages)
        cursor = page.next_cursor
        if cursor is None:
            break
    return shown


def _preview_value(payload: bytes) -> tuple[Any, str]:
    """``(value, encoding)`` of a payload preview: the JSON value (``"json"``), the text
    (``"text"``) or base64 text (``"base64"``); see :func:`futureq.cli.jsonl.render_payload`."""
    text, encoding = render_payload(payload)
    return json.loads(text), encoding


def pending_record(topic: str, group: str, message: PendingMessage) -> dict[str, Any]:
    """The JSON object ``browse --json`` and ``dlq list --json`` print for a message.

    Shape: ``{"id", "topic", "group", "due_ms" (null: parked), "attempt",
    "payload_bytes", "expire_ms", "headers", "preview", "preview_encoding"}``.
    """
    record: dict[str, Any] = {
        "id": message.id,
        "topic": topic,
        "group": group,
        "due_ms": message.due_ms,
        "attempt": message.attempt,
        "payload_bytes": message.payload_bytes,
        "expire_ms": message.expire_ms,
        "headers": message.headers,
    }
    if message.preview is not None:
        record["preview"], record["preview_encoding"] = _preview_value(message.preview)
    return record


_PLAIN_EXCLUDED: Final = frozenset(' ="\\')


def shown_text(text: str) -> str:
    """A header name or value as one token of a human output line: as it is when it
    is printable and holds no space, ``=``, quote or backslash; else a double-quoted
    JSON-style string in which every non-printable character (newline, NUL, other
    control and format characters such as U+2028 or U+202E) is escaped. So a publisher
    cannot split an operator's line or forge one."""
    if text and text.isprintable() and _PLAIN_EXCLUDED.isdisjoint(text):
        return text
    return quoted_text(text)


def quoted_text(text: str) -> str:
    """``text`` double-quoted, with ``"`` and ``\\`` backslashed and every
    non-printable character escaped as JSON does (``\\n``, ``\\u0000``, ``\\u2028``)."""
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char.isprintable():
            out.append(char)
        else:
            out.append(json.dumps(char)[1:-1])  # \n, \u0000, \u2028, ...
    return '"' + "".join(out) + '"'


def escape_controls(text: str) -> str:
    """``text`` for a human output line: every non-printable character (newline, ESC,
    NUL, U+2028, U+202E, ...) escaped as JSON does (``\\n``, ``\\u001b``), the rest as
    it is. A payload shown this way cannot start a line, forge one or drive the
    terminal (``--json`` output stays exact)."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else json.dumps(char)[1:-1] for char in text)


def pending_line(message: PendingMessage, dead_letters: bool) -> str:
    """The human line ``browse`` and ``dlq list`` print for a message (header names
    and values quoted by :func:`shown_text` when needed)."""
    due = "parked" if message.due_ms is None else format_ms(message.due_ms)
    text = f"#{message.id} due={due} attempt={message.attempt} bytes={message.payload_bytes}"
    headers = message.headers

    def field(name: str) -> str:
        return shown_text(headers.get(name, "?"))

    if dead_letters:
        origin = (
            f" from={field('futureq-original-topic')}/{field('futureq-original-group')}"
            f" original=#{field('futureq-original-id')}"
            f" attempts={field('futureq-attempts')}"
            f" reason={field('futureq-reason')}"
        )
        if "futureq-reason-text" in headers:
            origin += f" text={quoted_text(headers['futureq-reason-text'])}"
        text += origin
    elif headers:
        text += " " + " ".join(
            f"{shown_text(name)}={shown_text(value)}" for name, value in sorted(headers.items())
        )
    if message.preview is not None:
        value, encoding = _preview_value(message.preview)
        shown = json.dumps(value, ensure_ascii=False) if encoding == "json" else str(value)
        text += f": {escape_controls(shown) if encoding != 'base64' else 'base64:' + shown}"
    return text


async def run_browse(client: Client, args: argparse.Namespace, io: Output) -> int:
    """``futureq-cli browse TOPIC``: pending messages in due order, none claimed."""
    if args.counts:
        return await _run_browse_counts(client, args, io)
    to_ms = args.to_ms
    if args.within is not None:
        to_ms = await leader_now_ms(client) + args.within
    if args.from_ms is not None and to_ms is not None and args.from_ms >= to_ms:
        # Found by a tester: the server's INVALID_ARGUMENT (exit 1) named its own fields.
        end = "--to" if args.within is None else "the end of --within"
        await write_errors(
            io,
            [
                f"error: --from ({format_ms(args.from_ms)}) is not before {end} "
                f"({format_ms(to_ms)}): no message is due in that range; swap them or widen it"
            ],
        )
        return EXIT_USAGE
    shown = await _print_pages(
        client, args.topic, args.group, args, args.from_ms, to_ms, io, dead_letters=False
    )
    if not args.json:
        await write_lines(io, [f"{shown} pending shown"])
    return EXIT_OK


def _duration_text(ms: int) -> str:
    """``90s``, ``1h``, ``1d2h``: a bound of ``--buckets`` as a person writes it."""
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size:
            parts.append(f"{ms // size}{unit}")
            ms %= size
    if ms or not parts:
        parts.append(f"{ms}ms")
    return "".join(parts)


@reported
async def _run_browse_counts(client: Client, args: argparse.Namespace, io: Report) -> int:
    """``futureq-cli browse TOPIC --counts``: pending messages counted by due bucket."""
    if args.from_ms is not None or args.to_ms is not None or args.within is not None:
        io.err("error: --counts counts the whole group; use --buckets, not --from/--to/--within")
        return EXIT_USAGE
    counts: DueCounts = await client.browse_counts(
        args.topic, args.group, bounds_ms=args.buckets, relative=True
    )
    if args.json:
        io.out(
            json.dumps(
                {
                    "topic": args.topic,
                    "group": counts.group,
                    "bounds_ms": counts.bounds_ms,
                    "counts": counts.counts,
                    "later": counts.later,
                    "complete": counts.complete,
                }
            )
        )
        return EXIT_OK
    io.out(f"group {counts.group!r} of {args.topic!r}, pending by due time:")
    previous = None
    counted = [i for i, count in enumerate(counts.counts) if count is not None]
    for position, (relative_ms, count) in enumerate(zip(args.buckets, counts.counts, strict=True)):
        label = f"within {_duration_text(relative_ms)}"
        if previous is not None:
            label += f" (after {_duration_text(previous)})"
        shown = "not counted" if count is None else str(count)
        if not counts.complete and counted and position == counted[-1]:
            shown = f"at least {count}"
        io.out(f"  {label}: {shown}")
        previous = relative_ms
    later = "not counted" if counts.later is None else str(counts.later)
    io.out(f"  later (or parked): {later}")
    if not counts.complete:
        io.out("  (the server stopped counting at its limit: the counts are lower bounds)")
    return EXIT_OK


DLQ_DEFAULT_GROUP: Final = "default"
"""The group dead letters land in when a ``.dlq`` topic has none yet (its implicit one)."""


class _NoDeadLetters(Exception):
    """The ``.dlq`` topic has no group yet: nothing was ever dead-lettered there."""


async def _dlq_group(client: Client, dlq_topic: str, args: argparse.Namespace) -> str | None:
    """The group of ``dlq_topic`` that ``dlq list`` / ``dlq redrive`` read: ``--group``;
    else the topic's only group (None: the server picks it); else ``default``, the
    implicit group dead letters land in, when it exists.

    Raises:
        _NoDeadLetters: the topic has no group (no dead letter yet).
        RequestError: GROUP_REQUIRED, its sentence naming the groups and ``--group``,
            when there are several and none is ``default``; as BROWSE otherwise.
    """
    from futureq.errors import ErrorCode, RequestError

    if args.group is not None:
        return str(args.group)
    try:
        await client.browse(dlq_topic, None, limit=1)
    except RequestError as error:
        if error.code is ErrorCode.UNKNOWN_TOPIC:
            raise _NoDeadLetters from None
        if error.code is not ErrorCode.GROUP_REQUIRED:
            raise
        try:
            await client.browse(dlq_topic, DLQ_DEFAULT_GROUP, limit=1)
        except RequestError as again:
            if again.code is not ErrorCode.UNKNOWN_GROUP:
                raise
            raise RequestError(
                ErrorCode.GROUP_REQUIRED,
                f"{error.message.removeprefix('BROWSE: ')}; none is {DLQ_DEFAULT_GROUP!r}, so "
                "choose the one to read with --group NAME",
            ) from None
        return DLQ_DEFAULT_GROUP
    return None


async def run_dlq(client: Client, args: argparse.Namespace, io: Output) -> int:
    """``futureq-cli dlq list|redrive TOPIC [--group G]``: TOPIC's dead letters with
    their provenance, or moved back where they died (with a count and progress on
    stderr). The dead letters are read from one group of ``TOPIC.dlq``
    (:func:`_dlq_group`); with none yet there is nothing to list or move."""
    topic = args.topic if args.topic.endswith(".dlq") else args.topic + ".dlq"
    try:
        group = await _dlq_group(client, topic, args)
    except _NoDeadLetters:
        group = None
        if args.dlq_command == "list":
            if not args.json:
                await write_lines(io, [f"0 dead letters: {topic!r} has none yet"])
            return EXIT_OK
        if args.all:
            await write_lines(
                io,
                [f"redriven 0 of 0 to {args.topic.removesuffix('.dlq')!r}: {topic!r} has none"],
            )
            return EXIT_OK
    if args.dlq_command == "redrive":
        return await _run_dlq_redrive(client, args, io, group)
    shown = await _print_pages(client, topic, group, args, None, None, io, dead_letters=True)
    if not args.json:
        await write_lines(io, [f"{shown} dead letters shown"])
    return EXIT_OK


async def _run_dlq_redrive(
    client: Client, args: argparse.Namespace, io: Output, group: str | None
) -> int:
    topic = args.topic.removesuffix(".dlq")
    ids: list[int] = list(args.ids)
    if args.all:
        cursor: bytes | None = None
        while True:
            page = await client.browse(topic + ".dlq", group, cursor=cursor, limit=BROWSE_PAGE)
            for message in page.messages:
                headers = message.headers
                if args.from_group and headers.get("futureq-original-group") != args.from_group:
                    continue
                if args.reason and headers.get("futureq-reason") != args.reason:
                    continue
                ids.append(message.id)
            cursor = page.next_cursor
            if cursor is None:
                break
    elif not ids:
        await write_errors(
            io, ["error: name dead-letter ids (futureq-cli dlq list TOPIC), or give --all"]
        )
        return EXIT_USAGE
    counts = dict.fromkeys(frames.ItemStatus, 0)
    maybe = 0
    """UNKNOWN in answers to requests an earlier attempt of which may have redriven
    them (its answer lost: ``ItemStatuses.earlier_attempt``)."""
    for start in range(0, len(ids), CANCEL_CHUNK_IDS):
        chunk = ids[start : start + CANCEL_CHUNK_IDS]
        statuses = await client.redrive(topic, chunk, delay_ms=args.delay, group=group)
        for status in statuses:
            counts[status] += 1
        progress = f"redrive: {min(start + len(chunk), len(ids))}/{len(ids)}"
        unknown = statuses.count(frames.ItemStatus.UNKNOWN)
        if statuses.earlier_attempt is not None and unknown:
            maybe += unknown
            await write_errors(
                io, [_earlier_attempt_warning("redriven", unknown, statuses.earlier_attempt)]
            )
        await write_errors(io, [progress])
    unknown_text = f"{counts[frames.ItemStatus.UNKNOWN]} unknown"
    if maybe:
        unknown_text += f" ({maybe} of them outcome unknown: maybe redriven by a first attempt)"
    await write_lines(
        io,
        [
            f"redriven {counts[frames.ItemStatus.DONE]} of {len(ids)} to {topic!r}; "
            f"{counts[frames.ItemStatus.NO_TARGET]} kept (their group is gone), "
            f"{unknown_text}"
        ],
    )
    return EXIT_OK


@reported
async def run_reschedule(client: Client, args: argparse.Namespace, io: Report) -> int:
    """``futureq-cli reschedule TOPIC ID... --at T | --delay D [--group G]``."""
    ids: list[int] = args.ids
    outcomes = _Outcomes()
    for start in range(0, len(ids), CANCEL_CHUNK_IDS):
        outcomes.add(
            await client.reschedule(
                args.topic,
                ids[start : start + CANCEL_CHUNK_IDS],
                due_ms=args.at,
                delay_ms=args.delay,
                group=args.group,
            )
        )
    statuses, maybe = outcomes.statuses, outcomes.maybe
    unsure_ids = outcomes.warn_unsure(ids, "rescheduled", io)
    if frames.ItemStatus.DONE in statuses:
        warning = await passed_warning(client, args.at, "--at")
        if warning is not None:
            io.err(warning)
    if args.json:
        rows = [{"id": mid, "status": s.name} for mid, s in zip(ids, statuses, strict=True)]
        io.out(json.dumps(rows))
        return EXIT_OK
    for mid, status, unsure in zip(ids, statuses, maybe, strict=True):
        words = _MAYBE_RESCHEDULED if unsure else _RESCHEDULE_WORDS.get(status, status.name)
        io.out(f"{mid}: {words}")
    done = sum(status == frames.ItemStatus.DONE for status in statuses)
    unsure_text = f" ({unsure_ids} more may have been: outcome unknown)" if unsure_ids else ""
    io.out(f"rescheduled {done} of {len(ids)}{unsure_text} in topic {args.topic!r}")
    return EXIT_OK


_MAYBE_RESCHEDULED: Final = (
    "outcome unknown (not pending now; the request was sent again after its answer was "
    "lost, and its first attempt may have rescheduled it before it was delivered, "
    "acked or expired)"
)


def _purge_target(args: argparse.Namespace) -> str:
    if args.group:
        return f"group {args.group!r} of topic {args.topic!r}"
    return f"every group of topic {args.topic!r}"


def confirm_purge(args: argparse.Namespace, stdin: IO[str] | None, io: Output) -> int | None:
    """Ask before a ``purge`` (before connecting, so no connection idles meanwhile).

    Returns:
        None to go on (``--yes``, or the user typed ``yes``); else the exit status.
    """
    if args.yes:
        return None
    what = _purge_target(args)
    # stdin None: started with it closed (`<&-`); stderr None: closed (`2>&-`), so
    # the question could not be seen (it waited for an answer to nothing).
    if stdin is None or not stdin.isatty() or io.stderr is None:
        io.err(f"error: purge removes every message pending in {what}; add --yes to confirm")
        return EXIT_USAGE
    io.err(f"Remove every message pending now in {what}? Type 'yes': ")
    if stdin.readline().strip() != "yes":
        io.err("not purged")
        return EXIT_USAGE
    return None


@reported
async def run_purge(client: Client, args: argparse.Namespace, io: Report) -> int:
    """``futureq-cli purge TOPIC [--group G] --yes`` (confirmed by :func:`confirm_purge`)."""
    count = await client.purge(args.topic, group=args.group)
    if count.earlier_attempt is not None:
        # The purge was sent again after its answer was lost: this count is the later
        # attempt's, without what the first one had removed by then.
        io.err(
            "warning: outcome unknown for the first attempt of the purge (its answer was "
            f"lost: {count.earlier_attempt}); it was sent again, so the count printed "
            "leaves out what the first attempt had already removed, and messages "
            "published in between are purged too"
        )
        io.out(
            f"purging the pending entries of {_purge_target(args)} (in the background, in "
            f"chunks): a first attempt's answer was lost (outcome unknown); sent again, it "
            f"found {count} entries still held"
        )
        return EXIT_OK
    io.out(
        f"purging {count} pending entries of {_purge_target(args)} (in the background, in chunks)"
    )
    return EXIT_OK
