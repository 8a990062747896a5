"""``futureq-cli`` commands that manage scheduled messages (issue 14): ``cancel``.

Kept apart from :mod:`futureq.cli.client_main` (one module per command group, as
``STYLE.md`` asks). Results go to stdout, one line per item or one JSON document.

Source: ``docs/protocol.md``, "CANCEL"; ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from futureq.wire import frames

if TYPE_CHECKING:
    from futureq.cli.client_main import Output
    from futureq.client import Client

EXIT_OK: Final = 0
CANCEL_CHUNK_IDS: Final = 1000
"""Ids per CANCEL request the CLI sends (a server takes up to ``limits.max_batch_items``)."""
_STATUS_WORDS: Final = {
    frames.ItemStatus.DONE: "cancelled",
    frames.ItemStatus.DELIVERED: "cancelled (had been delivered)",
    frames.ItemStatus.UNKNOWN: "unknown (not pending: acked, expired, cancelled or never published)",
}


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


def add_parsers(commands: Any, name_arg: Callable[[str], Callable[[str], str]]) -> None:
    """Add the ``cancel`` subcommand to ``futureq-cli``'s subparsers.

    ``name_arg(kind)``: the argparse type of an existing topic or group name.
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


async def run_cancel(client: Client, args: argparse.Namespace, io: Output) -> int:
    """``futureq-cli cancel TOPIC ID... [--group G]``: one line per id, then a count."""
    ids: list[int] = args.ids
    statuses: list[frames.ItemStatus] = []
    for start in range(0, len(ids), CANCEL_CHUNK_IDS):
        statuses += await client.cancel(
            args.topic, ids[start : start + CANCEL_CHUNK_IDS], group=args.group
        )
    if args.json:
        rows = [{"id": mid, "status": status.name} for mid, status in zip(ids, statuses, strict=True)]
        io.out(json.dumps(rows))
        return EXIT_OK
    for mid, status in zip(ids, statuses, strict=True):
        io.out(f"{mid}: {_STATUS_WORDS.get(status, status.name)}")
    done = sum(status != frames.ItemStatus.UNKNOWN for status in statuses)
    where = f"group {args.group!r} of topic" if args.group else "topic"
    io.out(f"cancelled {done} of {len(ids)} in {where} {args.topic!r}")
    return EXIT_OK
