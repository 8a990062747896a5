"""Log lines whose count and length a client cannot choose.

Lines about refused or closed connections name what the client sent (a HELLO's
versions, an ``Origin`` header, a reason): an unauthenticated client that repeats the
refusal would otherwise decide how fast the log grows. :class:`RateLimitedLog` passes
at most :data:`LOG_LINES_PER_MINUTE` lines a minute, each argument cut to
:data:`LOGGED_ARGUMENT_CHARS` characters, and sums up the lines it dropped.
"""

from __future__ import annotations

import logging

import trio

LOG_LINES_PER_MINUTE = 60
"""Lines logged per minute by one :class:`RateLimitedLog`; the rest are counted and
summed up in one line."""
LOGGED_ARGUMENT_CHARS = 1000
"""Longest text of one argument of a line (characters): a breaker's HELLO with a 63 KB
list of versions made each line about its refusal 63 KB, and a 14 KB ``Origin`` header
each line about a refused WebSocket 14 KB (122 MB of log in 8 s)."""


class RateLimitedLog:
    """At most ``per_minute`` lines a minute; then one line saying how many were dropped.

    Args:
        logger: Where lines go.
        per_minute: Lines allowed per 60 s window.
        about: What the lines are about, for the line that sums up the dropped ones.
    """

    def __init__(
        self,
        logger: logging.Logger,
        per_minute: int = LOG_LINES_PER_MINUTE,
        about: str = "closed connections",
    ) -> None:
        self._logger = logger
        self._per_minute = per_minute
        self._about = about
        self._window_start = -1e18
        self._lines = 0
        self._dropped = 0

    def log(self, level: int, message: str, *args: object, exc_info: object = None) -> None:
        """Log a line unless this minute's allowance is spent; each argument is shown in
        at most :data:`LOGGED_ARGUMENT_CHARS` characters. Needs a running trio loop."""
        now = trio.current_time()
        if now - self._window_start >= 60:
            if self._dropped:
                self._logger.warning(
                    "%d more lines about %s were not logged in the last minute",
                    self._dropped,
                    self._about,
                )
            self._window_start = now
            self._lines = 0
            self._dropped = 0
        if self._lines >= self._per_minute:
            self._dropped += 1
            return
        self._lines += 1
        shown = [_cut(arg) for arg in args]
        self._logger.log(level, message, *shown, exc_info=exc_info)  # type: ignore[arg-type]


def _cut(arg: object) -> object:
    """``arg``, or its text cut to :data:`LOGGED_ARGUMENT_CHARS` characters when longer."""
    if isinstance(arg, int | float):
        return arg
    text = str(arg)
    if len(text) <= LOGGED_ARGUMENT_CHARS:
        return arg
    return f"{text[: LOGGED_ARGUMENT_CHARS - 3]}..."
