"""Process-wide logging for the ``futureq`` server: one concise line per record on stderr.

Format: ``2025-01-31 12:00:00.123 INFO    futureq.broker.server: listening on ...``
(local time with milliseconds, level, logger name, message). Third-party libraries
that chat at INFO (hypercorn) are kept at WARNING unless the level is ``debug``.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
_NOISY_LIBRARIES = ("hypercorn", "hpack", "h2", "h11", "trio_websocket")
ACCEPT_ERROR_LOG_INTERVAL_S = 10.0
"""At most one line per this many seconds about a listener that cannot accept (s)."""


class AcceptErrorFilter(logging.Filter):
    """One line, without traceback, per :data:`ACCEPT_ERROR_LOG_INTERVAL_S` for
    ``trio.serve_listeners``' "accept returned EMFILE" errors.

    trio logs each failed ``accept`` (out of file descriptors) with a traceback and
    retries every 0.1 s: a 20-line traceback ten times a second per listener. The
    condition is worth one line now and then, saying how many were left out.
    """

    def __init__(self, interval_s: float = ACCEPT_ERROR_LOG_INTERVAL_S) -> None:
        super().__init__()
        self._interval_s = interval_s
        self._last = -1e18
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now - self._last < self._interval_s:
            self._dropped += 1
            return False
        self._last = now
        record.exc_info = None
        record.exc_text = None
        if self._dropped:
            record.msg = f"{record.msg} ({self._dropped} more in the last {self._interval_s:g} s)"
            self._dropped = 0
        return True


def setup_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """Send every log record at ``level`` or above to ``stream`` (stderr by default).

    Replaces handlers on the root logger, so calling it twice does not duplicate lines.

    Args:
        level: ``debug``, ``info``, ``warning`` or ``error`` (config ``server.log_level``).
        stream: Where to write; ``sys.stderr`` when None.

    Raises:
        ValueError: for an unknown level name (config loading rejects those earlier).
    """
    try:
        numeric = LEVELS[level.lower()]
    except KeyError:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}") from None
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(logging.Formatter(LOG_FORMAT, DATE_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    library_level = logging.DEBUG if numeric <= logging.DEBUG else logging.WARNING
    for name in _NOISY_LIBRARIES:
        logging.getLogger(name).setLevel(library_level)
    accept_errors = logging.getLogger("trio.serve_listeners")
    for old_filter in list(accept_errors.filters):
        if isinstance(old_filter, AcceptErrorFilter):
            accept_errors.removeFilter(old_filter)
    accept_errors.addFilter(AcceptErrorFilter())
