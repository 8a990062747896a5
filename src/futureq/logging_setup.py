"""Process-wide logging for the ``futureq`` server: one record per line on stderr.

Text format (``server.log_format = "text"``, the default)::

    2025-01-31 12:00:00.123 INFO    futureq.broker.server: listening on ...

(local time with milliseconds, level, logger name, message). A node of a cluster puts
its id after the level, ``INFO    node=2 futureq...``, so the lines of several nodes
can be told apart once they are collected together.

JSON format (``"json"``), one object per line for log collectors::

    {"time": "2025-01-31T11:00:00.123Z", "level": "INFO", "logger": "futureq.broker.server",
     "node": 2, "message": "listening on ...", "exception": "Traceback ..."}

(UTC time; ``node`` only in a cluster; ``exception`` only with a traceback).

Third-party libraries that chat at INFO (hypercorn) are kept at WARNING unless the
level is ``debug``.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
import time
from typing import Final, TextIO

LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s"
NODE_LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-7s node=%(node_id)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
LOG_FORMATS: Final = ("text", "json")
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


class _NodeFilter(logging.Filter):
    """Stamps every record with the node id (``record.node_id``) and, in a shard
    process, the shard number (``record.shard``)."""

    def __init__(self, node_id: int, shard: int | None = None) -> None:
        super().__init__()
        self.node_id: int | str = node_id if shard is None else f"{node_id} shard={shard}"
        self.shard = shard

    def filter(self, record: logging.LogRecord) -> bool:
        record.node_id = self.node_id
        record.shard = self.shard
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record (keys in the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
        }
        node_id = getattr(record, "node_id", None)
        shard = getattr(record, "shard", None)
        if node_id is not None:
            entry["node"] = node_id if shard is None else int(str(node_id).split()[0])
        if shard is not None:
            entry["shard"] = shard
        entry["message"] = record.getMessage()
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.stack_info:
            entry["exception"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def setup_logging(
    level: str = "info",
    stream: TextIO | None = None,
    *,
    node_id: int | None = None,
    log_format: str = "text",
    shard: int | None = None,
) -> None:
    """Send every log record at ``level`` or above to ``stream`` (stderr by default).

    Replaces handlers on the root logger, so calling it twice does not duplicate lines.

    Args:
        level: ``debug``, ``info``, ``warning`` or ``error`` (config ``server.log_level``).
        stream: Where to write; ``sys.stderr`` when None.
        node_id: Named in every line (a node of a cluster); None leaves it out.
        log_format: ``text`` or ``json`` (config ``server.log_format``).
        shard: In a shard process (``docs/sharding.md``): its number, named in every
            line after the node id (``node=1 shard=0``; JSON key ``shard``).

    Raises:
        ValueError: for an unknown level or format name (config loading rejects those
            earlier).
    """
    try:
        numeric = LEVELS[level.lower()]
    except KeyError:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}") from None
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    if node_id is not None:
        handler.addFilter(_NodeFilter(node_id, shard))
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        text = LOG_FORMAT if node_id is None else NODE_LOG_FORMAT
        handler.setFormatter(logging.Formatter(text, DATE_FORMAT))
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
