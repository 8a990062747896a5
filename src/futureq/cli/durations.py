"""Human durations for the command line: ``250ms``, ``5s``, ``10m``, ``2h``, ``3d``,
``1h30m``, ``1500``.

Every time a ``futureq-cli`` flag takes (``--delay``, ``--ttl``, ``--request-timeout``,
``--idle-timeout``, ``--requeue-delay``, ``--visibility-timeout``) goes through
:func:`parse_duration_ms`,
so all of them accept the same spellings and all end up as integer milliseconds, the
unit of the wire protocol (``docs/cli.md``, "Durations").
"""

from __future__ import annotations

import argparse
import re
from fractions import Fraction
from typing import Final

from futureq.client import _checks

_UNIT_MS: Final[dict[str, int]] = {
    "ms": 1,
    "s": 1_000,
    "m": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}

_PART = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>ms|s|m|h|d)\s*")
_ORDER: Final = ("d", "h", "m", "s", "ms")

MAX_DURATION_MS: Final = 2**63 - 1
"""Largest duration accepted (ms): the largest 64-bit millisecond value of the protocol."""

MAX_DELAY_MS: Final = 100 * 366 * 86_400_000
"""Largest delay any server takes (ms): the ceiling of ``limits.max_delay_ms`` and
``limits.max_ttl_ms`` (100 years, ``config_checks.MAXIMA``); a server's own limit is at
most this (10 years by default)."""

MIN_PLAUSIBLE_EPOCH_MS: Final = 946_684_800_000
"""2000-01-01 in ms since the Unix epoch: a bare number of ms this large given as a
delay is an absolute time typed where a duration goes (``wire.validation``)."""

_FORMS: Final = (
    "use a number with a unit ms, s, m, h or d, or several from the largest unit down "
    "(e.g. 250ms, 5s, 10m, 2h, 3d, 1h30m, 2m30s; a bare number is ms)"
)


def is_decimal(text: str) -> bool:
    """Whether ``text`` is ASCII digits only: ``str.isdigit`` also takes ``²`` (then
    ``int`` fails with Python's own sentence) and other scripts' digits (``١٢``)."""
    return text.isascii() and text.isdigit()


def parse_duration_ms(text: str) -> int:
    """Parse a duration into integer milliseconds.

    Accepted: a bare non-negative integer (milliseconds), or one or more parts, each a
    non-negative number and a unit — ``ms``, ``s``, ``m`` (minutes), ``h`` or ``d``
    (days) — from the largest unit to the smallest, each unit at most once: ``1h30m``,
    ``2m30s``, ``1d12h``, ``1m 30s``. Fractions are allowed (``1.5s`` is 1500 ms) and
    the total must come to a whole number of milliseconds.

    Args:
        text: The duration as typed, e.g. ``"250ms"``, ``"1h30m"``, ``"1500"``.

    Returns:
        The duration in milliseconds, >= 0.

    Raises:
        ValueError: with a sentence naming the bad text and the accepted forms.
    """
    stripped = text.strip().lower()
    if stripped.startswith("-"):
        raise ValueError(f"{text!r} is negative; durations cannot be negative (0 means at once)")
    if is_decimal(stripped):
        value = int(stripped)
    else:
        total = Fraction(0)
        units: list[str] = []
        position = 0
        while position < len(stripped):
            part = _PART.match(stripped, position)
            if part is None:
                raise ValueError(f"{text!r} is not a duration; {_FORMS}")
            units.append(part["unit"])
            total += Fraction(part["number"]) * _UNIT_MS[part["unit"]]
            position = part.end()
        if not units:
            raise ValueError(f"{text!r} is not a duration; {_FORMS}")
        ranks = [_ORDER.index(unit) for unit in units]
        if ranks != sorted(set(ranks)):
            raise ValueError(
                f"{text!r} is not a duration: give each unit once, from the largest to the "
                "smallest (e.g. 1h30m, not 30m1h)"
            )
        if total.denominator != 1:
            raise ValueError(
                f"{text!r} is not a whole number of milliseconds; "
                "use a smaller unit (e.g. 1500ms instead of 1.5005s)"
            )
        value = int(total)
    if value > MAX_DURATION_MS:
        raise ValueError(f"{text!r} is longer than the largest duration of {MAX_DURATION_MS} ms")
    return value


def duration_ms_arg(text: str) -> int:
    """argparse ``type=`` adapter for :func:`parse_duration_ms`.

    Raises:
        argparse.ArgumentTypeError: with the same sentence, so argparse prints
            ``error: argument --delay: '5x' is not a duration; ...`` and exits 2.
    """
    try:
        return parse_duration_ms(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


MAX_DEADLINE_MS: Final = _checks.MAX_TIMEOUT_S * 1000
"""Longest ``--request-timeout`` and longest wait of one ``consume`` receive (ms): one
day, the most the client library takes for a deadline (``docs/client.md``, "Argument
ranges")."""


def positive_duration_ms_arg(text: str) -> int:
    """argparse ``type=`` for a deadline: a duration above 0 (``--request-timeout 0``
    would leave no time for any request) and at most :data:`MAX_DEADLINE_MS`.

    Raises:
        argparse.ArgumentTypeError: not a duration, 0, or more than a day.
    """
    value = duration_ms_arg(text)
    if value == 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} leaves no time for any request; give a deadline above 0 (e.g. 30s)"
        )
    if value > MAX_DEADLINE_MS:
        # The client library takes deadlines of at most a day (docs/client.md,
        # "Argument ranges"): `--request-timeout 2d` passed here and then died in
        # open_client with a ValueError traceback (found by a tester).
        raise argparse.ArgumentTypeError(
            f"{text!r} is {value} ms; a request deadline is at most 1d ({MAX_DEADLINE_MS} ms)"
        )
    return value


def delay_ms_arg(text: str) -> int:
    """argparse ``type=`` for a delay the server applies (``publish --delay``, ``--ttl``,
    ``consume --requeue-delay``): a duration no server can take is refused here, before
    anything is sent or received (``consume --nack`` would otherwise receive and print
    messages and then have every NACK refused).

    Raises:
        argparse.ArgumentTypeError: not a duration (as :func:`duration_ms_arg`), a bare
            number that is an absolute time in ms (2000 or later), or longer than
            :data:`MAX_DELAY_MS`.
    """
    value = duration_ms_arg(text)
    if is_decimal(text.strip()) and value >= MIN_PLAUSIBLE_EPOCH_MS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is {value / 86_400_000 / 366:.0f} years: it looks like an absolute "
            "time in ms since the Unix epoch, and this flag takes a duration (a bare number "
            "is ms; e.g. 10m, 2h, 3d)"
        )
    if value > MAX_DELAY_MS:
        raise argparse.ArgumentTypeError(f"{text!r} is {value} ms, {BEYOND_ANY_SERVER}")
    return value


BEYOND_ANY_SERVER: Final = (
    "longer than any server takes: limits.max_delay_ms (and max_ttl_ms) is "
    f"at most {MAX_DELAY_MS} ms (100 years), 316224000000 ms (10 years) unless the "
    "operator raised it"
)
"""Why a delay above :data:`MAX_DELAY_MS`, or a time further ahead, is refused."""


DEFAULT_LINGER_MS: Final = 100
"""``publish --file``'s ``--linger`` when not given (ms): a line from a pipe or a
terminal is published at most this long after it arrived, though its batch is not full
(``docs/cli.md``, "publish --file")."""
MAX_LINGER_MS: Final = 60_000
"""The longest ``--linger`` (ms): past a minute a line would look lost, not lingering."""


def linger_ms_arg(text: str) -> int:
    """argparse ``type=`` for ``publish --linger``: a duration from 0 (publish what has
    arrived at once) to :data:`MAX_LINGER_MS`.

    Raises:
        argparse.ArgumentTypeError: not a duration, or longer than a minute.
    """
    value = duration_ms_arg(text)
    if value > MAX_LINGER_MS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is {value} ms; --linger is at most 1m ({MAX_LINGER_MS} ms): a line "
            "waiting longer for its batch to fill would look lost"
        )
    return value
