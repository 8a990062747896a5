"""SIGHUP while the node starts: remembered, never fatal.

SIGHUP asks a running node to read its credentials file again. Its default action is to
end the process, and a node may take a while to start (opening RocksDB, replaying the
log), so a reload sent then (``systemctl reload``, a config watcher) would kill it with
exit code 129 and no log line. ``futureq start`` calls :func:`defer_sighup` first thing;
the server's SIGHUP handler, once installed, calls :func:`take_deferred_sighup` and
reloads if one arrived meanwhile.
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
