"""``futureq-cli consume``: receive a consumer group's deliveries, print each (readable, or
one JSON line with ``--json``), then ack or nack it.

A delivery is settled only after its line is printed and flushed, and never more are
taken than ``--count`` will print (``docs/cli.md``, "consume").
"""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Final

import trio

from futureq.cli import manage_commands
from futureq.cli.durations import MAX_DEADLINE_MS
from futureq.cli.interrupts import Interrupt, ctrl_c_requests
from futureq.cli.jsonl import record_line, render_payload
from futureq.cli.output import EXIT_OK, Output, format_ms, write_errors, write_lines
from futureq.client import Client, Delivery, Subscription, _checks
from futureq.client.subscription import LEASE_REFRESH_FRACTION
from futureq.errors import ConnectionLostError, ErrorCode, FutureQError, RequestError


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


async def _receive_within(sub: Subscription, idle_ms: int) -> Delivery | None:
    """The next delivery, or None once none came for ``idle_ms``: waited in parts of at
    most a day, the longest :meth:`Subscription.receive` takes (``--idle-timeout 2d``
    subscribed, then died with a ValueError traceback; found by a tester)."""
    left_ms = idle_ms
    while True:
        part_ms = min(left_ms, MAX_DEADLINE_MS)
        delivery = await sub.receive(part_ms / 1000)
        left_ms -= part_ms
        if delivery is not None or left_ms <= 0:
            return delivery


DEFAULT_PREFETCH: Final = 100
"""``consume``'s window when ``--prefetch`` is not given (deliveries)."""
RELEASE_GRACE_S: Final = 5.0
"""Longest wait to give back a delivery whose line could not be printed (s)."""


async def run_consume(client: Client, args: argparse.Namespace, io: Output) -> int:
    """``futureq-cli consume``: print and settle deliveries until ``--count``,
    ``--idle-timeout`` or Ctrl-C.

    Ctrl-C (the first) stops the wait for the next delivery, not the settling of one
    already printed: the deliveries received and not printed are given back
    unprocessed as the subscription ends, and the exit status is 130 (143 for
    SIGTERM, taken the same way; :mod:`futureq.cli.interrupts`). A second one stops at
    once.
    """
    interrupt = Interrupt()
    async with ctrl_c_requests(interrupt):
        await _consume(client, args, io, interrupt)
    return interrupt.exit_status if interrupt.requested else EXIT_OK


async def _consume(
    client: Client, args: argparse.Namespace, io: Output, interrupt: Interrupt
) -> None:
    prefetch = DEFAULT_PREFETCH if args.prefetch is None else args.prefetch
    if args.count is not None:
        # Never take more than we will print: a delivery received but not printed
        # would go back to the group with its attempt count raised. With --no-ack the
        # unacked deliveries hold their credit, so the window must fit all of them.
        # (At most what any server grants: a larger --count is no window at all.)
        prefetch = min(args.count, _checks.MAX_CREDIT) if args.no_ack else min(prefetch, args.count)
    received = 0
    async with contextlib.AsyncExitStack() as stack:
        with interrupt.batch():
            try:
                sub = await stack.enter_async_context(
                    client.subscribe(args.topic, args.group, prefetch)
                )
            except RequestError as exc:
                raise _window_error(exc, args, prefetch) from None
            if args.no_ack and args.count is not None and sub.window < prefetch:
                # The server took a smaller window (its limits.max_prefetch): no more
                # than that is ever out, and with --no-ack nothing printed is settled,
                # so the rest would never come (the consume would end idle, short).
                raise RequestError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"this server's limits.max_prefetch is {sub.window}: no more deliveries "
                    "than that are out at once, and with --no-ack every message printed "
                    f"stays out until the end, so --count {args.count} needs a window of "
                    f"{prefetch}, which it does not give; give a --count of at most "
                    f"{sub.window}, or drop --no-ack",
                )
        if interrupt.requested:
            return
        while args.count is None or received < args.count:
            delivery: Delivery | None = None
            with interrupt.batch():
                # A checkpoint each time, so a Ctrl-C is heard though deliveries are
                # buffered (taking a buffered one does not wait).
                await trio.lowlevel.checkpoint()
                if args.idle_timeout_ms is None:
                    delivery = await sub.__anext__()
                else:
                    delivery = await _receive_within(sub, args.idle_timeout_ms)
                    if delivery is None:
                        if client.connected_address is None:
                            # Quiet because the broker is gone, not because the topic is.
                            raise ConnectionLostError(
                                f"lost the connection to {','.join(client.servers)} and "
                                f"could not reconnect; no message for --idle-timeout "
                                f"{args.idle_timeout_ms} ms, stopped after {received} "
                                "message(s)"
                            )
                        return
            if delivery is None:
                return  # Ctrl-C while waiting: what is buffered is released on leaving
            await _print(sub, delivery, args, io)
            received += 1
            if received == args.count or interrupt.requested:
                # The last one: settling it must not invite another push (one pushed
                # now would be dropped as the subscription ends, and counted).
                sub.pause()
            # Settle only after the line is printed and flushed (io.out flushes).
            try:
                if args.nack:
                    await delivery.nack(args.requeue_delay or 0)
                elif not args.no_ack:
                    await delivery.ack()
            except RequestError as exc:
                if args.nack and exc.code is ErrorCode.INVALID_DELAY:
                    # --requeue-delay over the server's limit (only it knows the
                    # limit): the message left counted as the run ended, and with
                    # max_deliveries 1 went to the dead-letter topic though the NACK
                    # that would have requeued it was refused (found by a tester).
                    await _give_back(sub, delivery)
                    raise RequestError(
                        exc.code,
                        f"{exc.message}; message {delivery.id} was given back uncounted",
                        exc.item_index,
                    ) from None
                if exc.code is not ErrorCode.UNKNOWN_DELIVERY_TAG:
                    raise
                # The visibility timeout passed before we settled it: the broker has
                # already handed it out again (at-least-once). Not fatal for the run.
                await write_errors(
                    io,
                    [
                        f"warning: message {delivery.id} was not settled in time "
                        "(visibility timeout); it will be delivered again"
                    ],
                )
            if interrupt.requested:
                return


def _window_error(exc: RequestError, args: argparse.Namespace, prefetch: int) -> RequestError:
    """SUBSCRIBE's refusal, saying why the window was that large when the user did not
    ask for it: ``--no-ack --count N`` needs a window of N (every printed message stays
    out), and ``consume --no-ack --count 20000`` said only ``prefetch must be between 1
    and 10000, got 20000`` of a ``--prefetch`` never given (found by a tester). Likewise
    the default window (:data:`DEFAULT_PREFETCH`) on a server whose
    ``limits.max_prefetch`` is lower."""
    if exc.code is not ErrorCode.INVALID_ARGUMENT:
        return exc
    if args.prefetch is None and prefetch == DEFAULT_PREFETCH:
        return RequestError(
            exc.code,
            f"{exc.message}: --prefetch is {DEFAULT_PREFETCH} by default; give a --prefetch "
            "the server's limit takes",
            exc.item_index,
        )
    if not args.no_ack or prefetch == args.prefetch:
        return exc
    return RequestError(
        exc.code,
        f"{exc.message}: with --no-ack every message printed stays out until the end, so "
        f"--count {args.count} needs a window of {prefetch}; give a --count the server's "
        "limit takes, or drop --no-ack",
        exc.item_index,
    )


async def _print(
    sub: Subscription, delivery: Delivery, args: argparse.Namespace, io: Output
) -> None:
    """Print the delivery's line (in a worker thread, so that a reader that pauses
    does not hold the event loop); if that fails (stdout closed: ``consume | head``),
    give the delivery back unprocessed before raising.

    Found by a tester: with ``| head -1`` the second delivery, taken but never printed,
    went back to the group counted as an attempt (with ``max_deliveries`` 1, straight
    to the dead-letter topic) though ``docs/cli.md`` says a message received and not
    printed is given back uncounted. The subscription is paused first: the RELEASE's
    confirmation would otherwise give its credit back, and the server pushed the
    released message again at once, to be dropped as the subscription ended and
    counted by its UNSUBSCRIBE (the test of it failed one run in four).
    """
    line = delivery_json(delivery) if args.json else delivery_line(delivery)
    try:
        # In a worker thread (write_lines): blocking the event loop on a full pipe
        # left the server's keepalive PING unanswered, so the broker closed the
        # connection and the run ended with [CONNECTION_LOST], the deliveries it held
        # counted (found by a tester).
        # The delivery is kept meanwhile (EXTEND as the client's buffer does, at
        # LEASE_REFRESH_FRACTION of the group's visibility timeout):
        # a reader paused longer than that timeout made the ack of a message whose line
        # it then read fail, and the message was delivered and printed again (found by a
        # tester).
        failure: BaseException | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_keep_while_printing, sub, delivery)
            try:
                await write_lines(io, [line])
            except BaseException as exc:  # raised below, not wrapped in a group
                failure = exc
            nursery.cancel_scope.cancel()
        if failure is not None:
            raise failure
    except BaseException:
        await _give_back(sub, delivery)
        raise


async def _keep_while_printing(sub: Subscription, delivery: Delivery) -> None:
    """Extend ``delivery`` by the group's visibility timeout each time
    :data:`~futureq.client.subscription.LEASE_REFRESH_FRACTION` of it passed (half), as
    the client does for the deliveries it buffers, until cancelled (its line written). A refused or failed EXTEND ends the keeping: the
    settlement after the line then says what happened."""
    timeout_ms = sub.visibility_timeout_ms
    if timeout_ms is None:
        return
    while True:
        await trio.sleep(timeout_ms * LEASE_REFRESH_FRACTION / 1000)
        try:
            await delivery.extend()
        except (FutureQError, ValueError):
            return


async def _give_back(sub: Subscription, delivery: Delivery) -> None:
    """Release ``delivery`` uncounted, the subscription paused first (see :func:`_print`),
    within :data:`RELEASE_GRACE_S`; if that fails it comes back as the subscription
    ends, counted."""
    sub.pause()
    with trio.move_on_after(RELEASE_GRACE_S, shield=True):
        try:
            await delivery.release()
        except FutureQError:
            pass
