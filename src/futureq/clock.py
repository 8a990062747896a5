"""The one place FutureQ reads the operating system's clocks.

Cores never read a clock; adapters are handed a :class:`Clock`, so tests can pass a
fake one and simulations a virtual one.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Source of wall-clock and monotonic time."""

    def wall_ms(self) -> int:
        """Wall-clock time in integer milliseconds since the Unix epoch (floored)."""
        ...

    def monotonic_s(self) -> float:
        """Monotonic time in float seconds, for timeouts and durations."""
        ...


class MicroClock(Protocol):
    """Wall-clock and monotonic time in integer microseconds (the cluster clock's input)."""

    def wall_us(self) -> int:
        """Wall-clock time in integer microseconds since the Unix epoch (floored)."""
        ...

    def monotonic_us(self) -> int:
        """Monotonic time in integer microseconds (arbitrary origin, never steps)."""
        ...


class SystemClock:
    """The operating system's clocks: ``time.time_ns`` and ``time.monotonic_ns``."""

    def wall_ms(self) -> int:
        """Wall-clock time in integer milliseconds since the Unix epoch (floored)."""
        return time.time_ns() // 1_000_000

    def monotonic_s(self) -> float:
        """Monotonic time in float seconds."""
        return time.monotonic()

    def wall_us(self) -> int:
        """Wall-clock time in integer microseconds since the Unix epoch (floored)."""
        return time.time_ns() // 1000

    def monotonic_us(self) -> int:
        """Monotonic time in integer microseconds."""
        return time.monotonic_ns() // 1000
