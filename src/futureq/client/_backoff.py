"""Exponential backoff with jitter for reconnects and retried requests (sans-IO).

A tiny class rather than ``tenacity``: the client's retry loops also have to watch
connection changes, leader hints and per-request deadlines, which fit a plain loop
better than a decorator, and the jitter must come from a seeded ``random.Random`` so
tests are reproducible (``STYLE.md``, "randomness always arrives as a seeded
``random.Random``").
"""

from __future__ import annotations

import random

import attrs


@attrs.define
class Backoff:
    """Delays of ``initial_s * multiplier**n``, capped at ``max_s``, with "equal jitter".

    Each delay is drawn uniformly from ``[cap / 2, cap]`` where ``cap`` is the capped
    exponential value: never zero (no reconnect storm), never more than ``max_s``.

    Attributes:
        rng: Source of jitter; pass a seeded ``random.Random`` in tests.
        initial_s: First cap (seconds).
        max_s: Largest delay (seconds).
        multiplier: Growth of the cap per attempt.
    """

    rng: random.Random = attrs.field(factory=random.Random)
    initial_s: float = 0.05
    max_s: float = 2.0
    multiplier: float = 2.0
    _attempt: int = attrs.field(default=0, init=False)

    def next_delay_s(self) -> float:
        """Return the delay before the next attempt (seconds) and count the attempt."""
        # min() before the power would overflow: stop growing once past the cap.
        exponent = min(self._attempt, 64)
        cap = min(self.max_s, self.initial_s * self.multiplier**exponent)
        self._attempt += 1
        return self.rng.uniform(cap / 2, cap)

    def reset(self) -> None:
        """Start again from ``initial_s`` (after a success)."""
        self._attempt = 0

    @property
    def attempts(self) -> int:
        """How many delays were handed out since the last reset."""
        return self._attempt
