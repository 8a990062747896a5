"""``futureq-cli consume``: receive a consumer group's deliveries, print each (readable, or
one JSON line with ``--json``), then ack or nack it.

A delivery is settled only after its line is printed and flushed, and never more are
taken than ``--count`` will print (``docs/cli.md``, "consume").
"""

from __future__ import annotations

import argparse
import json

from futureq.cli import manage_commands
from futureq.cli.jsonl import record_line, render_payload
from futureq.cli.output import EXIT_OK, Output, format_ms
from futureq.client import Client, Delivery, _checks
from futureq.errors import ConnectionLostError, ErrorCode, RequestError


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


async def run_consume(client: Client, args: argparse.Namespace, io: Output) -> int:
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
