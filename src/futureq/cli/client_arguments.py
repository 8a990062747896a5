"""The argparse value types of ``futureq-cli``: names, times, counts and addresses.

Each takes the text as typed and returns the value, or raises
``argparse.ArgumentTypeError`` with a sentence naming the limit (a usage error, exit 2),
so a value the server would refuse, or one the protocol cannot carry, never leaves the
shell. Times: :func:`parse_at_ms` (``docs/cli.md``, "Times"); durations are in
:mod:`futureq.cli.durations`.
"""

from __future__ import annotations

import argparse
import datetime
import re
from collections.abc import Callable
from typing import Final

from futureq.cli.argv_text import not_text
from futureq.cli.durations import BEYOND_ANY_SERVER, MAX_DELAY_MS, duration_ms_arg, is_decimal
from futureq.client import _checks
from futureq.clock import SystemClock
from futureq.config import split_host_port
from futureq.errors import RequestError
from futureq.wire import validation
from futureq.wire.validation import (
    MAX_PLAUSIBLE_EPOCH_MS,
    MIN_PLAUSIBLE_EPOCH_MS,
    implausible_epoch_ms,
)

DEFAULT_BATCH_SIZE: Final = 500
MAX_BATCH_SIZE: Final = 1000
"""Most messages per PUBLISH of ``publish --file`` (``docs/cli.md``): the client's
``max_batch_items``, which :func:`run_command` passes to ``open_client``."""


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


def existing_name_arg(kind: str, *, consume: bool = False) -> Callable[[str], str]:
    """An argparse type for a topic or group to consume from or manage: the name grammar,
    or a name stored by an earlier version (the server decides which exist).

    ``consume``: a topic to consume from or create a group of, so not ``T.dlq.dlq``
    (:func:`~futureq.wire.validation.check_not_dead_letters_of_dead_letters`)."""

    def check(text: str) -> str:
        try:
            if consume:
                validation.check_not_dead_letters_of_dead_letters(text)
            validation.check_legacy_name(kind, text)
        except RequestError as exc:
            raise argparse.ArgumentTypeError(exc.message) from None
        return text

    return check


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_RFC3339 = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})[Tt ](?P<time>\d{2}:\d{2}(?::\d{2})?)"
    r"(?:\.(?P<fraction>\d+))?(?P<zone>[Zz]|[+-]\d{2}:\d{2})?",
    re.ASCII,
)


def parse_at_ms(text: str, *, now_ms: int | None = None) -> int:
    """``--at`` (and ``--from``, ``--to``): an RFC 3339 time, or integer **milliseconds**
    since the Unix epoch.

    RFC 3339 / ISO 8601: ``2026-05-01T12:00:00Z``, ``2026-05-01T12:00:00.250+02:00``,
    ``2026-05-01 12:00:00z``; fractions of a second to the millisecond (more digits
    are cut); no zone means UTC; a leap second (``23:59:60``) is the second after
    ``:59``, as in POSIX time. ASCII digits only. A number must be milliseconds: one that can only be
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
    if is_decimal(stripped):  # not ``²`` nor other scripts' digits
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
        # RFC 3339 writes a leap second as :60; in ms since the epoch (POSIX time, no
        # leap seconds) it is the second after :59. Python's datetime has no :60.
        leap = clock.endswith(":60")
        if leap:
            clock = clock[:-2] + "59"
        iso = f"{match['date']}T{clock}{'.' + fraction.ljust(6, '0') if fraction else ''}{zone}"
        try:
            moment = datetime.datetime.fromisoformat(iso)
        except ValueError:
            moment = None
        if moment is not None and leap:
            moment += datetime.timedelta(seconds=1)
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


def _whole_number(text: str) -> int | None:
    """``text`` as an int if it is ASCII digits (a sign and spaces around allowed), as
    the time flags take them (:func:`~futureq.cli.durations.is_decimal`): ``int()`` also
    takes ``١٠`` (Arabic-Indic digits) and ``1_000`` (found by a tester)."""
    stripped = text.strip()
    digits = stripped[1:] if stripped[:1] in ("+", "-") else stripped
    return int(stripped) if is_decimal(digits) else None


def positive_int_arg(text: str) -> int:
    """argparse type: a whole number >= 1 (``--count``, ``--prefetch``...)."""
    value = _whole_number(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer (digits 0-9)")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


MAX_DELIVERIES: Final = 1_000_000
"""Largest ``--max-deliveries`` (GROUP_CREATE ``max_deliveries``: 1 to 1,000,000 attempts,
``docs/protocol.md``)."""


def bounded_int_arg(what: str, high: int) -> Callable[[str], int]:
    """argparse type: a whole number from 1 to ``high`` (``--prefetch``,
    ``--max-deliveries``); a larger one is a usage error naming the range, not a request
    the server refuses or one that cannot even be encoded (``10**30``)."""

    def parse(text: str) -> int:
        value = positive_int_arg(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"{what} is 1 to {high:,}, got {text.strip()}")
        return value

    return parse


def visibility_timeout_arg(text: str) -> int:
    """argparse type of ``group create --visibility-timeout``: a duration (ms) from
    ``MIN_VISIBILITY_TIMEOUT_MS`` (100 ms) to ``MAX_VISIBILITY_TIMEOUT_MS`` (12 h), the
    range the server takes (``docs/protocol.md``, GROUP_CREATE). Outside it was refused
    by the server after connecting, with advice in wire terms ("send nil").

    Raises:
        argparse.ArgumentTypeError: not a duration, or outside the range.
    """
    value = duration_ms_arg(text)
    if not validation.MIN_VISIBILITY_TIMEOUT_MS <= value <= validation.MAX_VISIBILITY_TIMEOUT_MS:
        raise argparse.ArgumentTypeError(
            f"a visibility timeout is {validation.MIN_VISIBILITY_TIMEOUT_MS}ms to 12h, got "
            f"{text.strip()!r}; leave --visibility-timeout out to keep the group's (or the "
            "server's default)"
        )
    return value


def batch_size_arg(text: str) -> int:
    """argparse type of ``--batch-size``: 1 to :data:`MAX_BATCH_SIZE` (a larger value
    was silently cut to it)."""
    value = positive_int_arg(text)
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
    _checks.check_ipv6_brackets(address)  # before split_host_port reads "[::1]" as port "1]"
    split_host_port(address)
    problem = not_text(address)
    if problem is not None:
        raise ValueError(f"the address {problem}")
    _checks.check_server_address(address)  # the client library's own rule


def address_arg(text: str) -> str:
    """argparse type: a ``HOST:PORT`` (:func:`check_address`)."""
    try:
        check_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def node_id_arg(text: str) -> int:
    """argparse type: a node id, an integer in 1..2**31-1."""
    value = _whole_number(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a node id (a whole number >= 1)")
    if not 1 <= value <= 2**31 - 1:
        raise argparse.ArgumentTypeError(f"node ids are 1 to 2147483647, got {value}")
    return value
