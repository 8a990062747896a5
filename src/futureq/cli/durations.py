"""Human durations for the command line: ``250ms``, ``5s``, ``10m``, ``2h``, ``3d``, ``1500``.

Every time a ``futureq-cli`` flag takes (``--delay``, ``--ttl``, ``--timeout``,
``--requeue-delay``, ``--visibility-timeout``) goes through :func:`parse_duration_ms`,
so all of them accept the same spellings and all end up as integer milliseconds, the
unit of the wire protocol (``docs/cli.md``, "Durations").
"""

from __future__ import annotations

import argparse
import re
from typing import Final

_UNIT_MS: Final[dict[str, int]] = {
    "ms": 1,
    "s": 1_000,
    "m": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}

_DURATION = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>ms|s|m|h|d)?")

MAX_DURATION_MS: Final = 2**63 - 1
"""Largest duration accepted (ms): the largest 64-bit millisecond value of the protocol."""


def parse_duration_ms(text: str) -> int:
    """Parse a duration into integer milliseconds.

    Accepted: a non-negative number followed by an optional unit — ``ms``, ``s``, ``m``
    (minutes), ``h`` or ``d`` (days). A bare number is milliseconds. Fractions are
    allowed with a unit (``1.5s`` is 1500 ms) and must come to a whole number of
    milliseconds.

    Args:
        text: The duration as typed, e.g. ``"250ms"``, ``"5s"``, ``"1500"``.

    Returns:
        The duration in milliseconds, >= 0.

    Raises:
        ValueError: with a sentence naming the bad text and the accepted forms.
    """
    stripped = text.strip().lower()
    match = _DURATION.fullmatch(stripped)
    if match is None:
        raise ValueError(
            f"{text!r} is not a duration; use a number with an optional unit "
            "ms, s, m, h or d (e.g. 250ms, 5s, 10m, 2h, 3d; a bare number is ms)"
        )
    number: str = match["number"]
    unit_ms = _UNIT_MS[match["unit"] or "ms"]
    if "." in number:
        whole, fraction = number.split(".")
        # Exact decimal arithmetic: 0.1s is 100 ms, never 100.00000000000001.
        scale = 10 ** len(fraction)
        numerator = (int(whole) * scale + int(fraction)) * unit_ms
        if numerator % scale:
            raise ValueError(
                f"{text!r} is not a whole number of milliseconds; "
                "use a smaller unit (e.g. 1500ms instead of 1.5005s)"
            )
        value: int = numerator // scale
    else:
        value = int(number) * unit_ms
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
