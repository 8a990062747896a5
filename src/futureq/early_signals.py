"""SIGHUP while the node starts: remembered, never fatal.

SIGHUP asks a running node to read its credentials file again. Its default action is to
end the process, and a node may take a while to start (opening RocksDB, replaying the
log), so a reload sent then (``systemctl reload``, a config watcher) would kill it with
exit code 129 and no log line. ``futureq start`` calls :func:`defer_sighup` first thing;
the server's SIGHUP handler, once installed, calls :func:`take_deferred_sighup` and
reloads if one arrived meanwhile.

A stop signal (SIGTERM/SIGINT) that repeats the first within
:data:`REPEAT_SIGNAL_WINDOW_S` is the same request delivered twice, not a request to force
the stop (:func:`is_repeat_signal`).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

_received = threading.Event()


def _remember(signum: int, frame: FrameType | None) -> None:
    _received.set()


def defer_sighup() -> None:
    """Until the server installs its own handler, SIGHUP is only remembered.

    Call from the main thread (where Python runs signal handlers).
    """
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, _remember)


def take_deferred_sighup() -> bool:
    """True once if a SIGHUP arrived before the server's handler was installed."""
    if _received.is_set():
        _received.clear()
        return True
    return False


REPEAT_SIGNAL_WINDOW_S = 1.0
"""A stop signal repeated within this long (s) of the first is the same request delivered
twice, not a request to force: systemd's default ``KillMode=control-group`` signals the
supervisor and every shard process, which then also get the supervisor's SIGTERM, and
``timeout`` signals its command and then its process group."""


def is_repeat_signal(first_at: float, now: float) -> bool:
    """Whether a stop signal at ``now`` repeats the one at ``first_at`` (seconds, one
    clock) rather than asking to force the stop."""
    return now - first_at < REPEAT_SIGNAL_WINDOW_S
