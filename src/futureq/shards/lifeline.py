"""A shard process stops gracefully once its supervisor is gone, from its first moment.

A shard of a sharded node (``futureq start --shards N``) whose supervisor was SIGKILLed
must not run on alone, holding its ports and its RocksDB lock, so that the next
``futureq start`` fails. The supervisor gives each shard its pid
(:data:`SUPERVISOR_PID_ENV`); :func:`watch_supervisor`, called by ``futureq start`` as
soon as it knows it runs a shard, checks every :data:`CHECK_S` from a daemon thread
that the shard's parent is still that pid (a dead parent's children are reparented, to
init or a subreaper). Once it is not, the shard stops gracefully:

* while it serves, through the stop the server registered (:func:`on_supervisor_gone`):
  the same graceful shutdown as a SIGTERM, without counting as one (a SIGTERM from the
  operator afterwards is still the first, not a request to force);
* while it starts (opening RocksDB, replaying its log, waiting for disk space), by a
  SIGTERM to itself, which ``futureq.early_signals`` remembers and the start acts on at
  its next check: it stops without serving. None is sent when a stop signal came
  already.

Before, the check began only once the shard served, with the parent it had then: a
supervisor killed while its shards started left them with init as that parent, so they
never noticed; they ran on until printing READY failed on the closed pipe (``ERROR
Broken pipe``), or forever when they waited before READY (a ``--join`` not yet
accepted, a full disk). ``PR_SET_PDEATHSIG`` does not do: it fires when the parent
*thread* ends, and trio spawns processes from worker threads that idle out.

Source: ``docs/sharding.md``, "Supervision".
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Final

from futureq import early_signals

log = logging.getLogger(__name__)

SUPERVISOR_PID_ENV: Final = "FQ_SHARD_SUPERVISOR_PID"
"""Environment variable the supervisor sets to its pid for every shard it starts."""
CHECK_S: Final = 0.2
"""How often a shard checks that its supervisor still runs (s)."""

_lock = threading.Lock()
_stop: Callable[[], None] | None = None
_gone = False


def supervisor_pid() -> int | None:
    """The pid of this shard's supervisor (:data:`SUPERVISOR_PID_ENV`), or None (not a
    shard started by a supervisor, or a value that is not a pid)."""
    value = os.environ.get(SUPERVISOR_PID_ENV, "")
    try:
        pid = int(value)
    except ValueError:
        return None
    return pid if pid > 1 else None


def on_supervisor_gone(stop: Callable[[], None] | None) -> None:
    """Register how a serving shard stops when its supervisor is gone (thread-safe and
    non-blocking: called from the watching thread, e.g. ``TrioToken.run_sync_soon``), or
    None once it no longer can. Called at once when the supervisor is gone already."""
    global _stop
    with _lock:
        _stop = stop
        gone = _gone
    if gone and stop is not None:
        _call(stop)


def watch_supervisor() -> bool:
    """Start the daemon thread that stops this shard once its supervisor is gone (module
    doc); nothing when this process was not started by a supervisor. Call after
    :func:`futureq.early_signals.defer_stop_signals` (its SIGTERM must be remembered,
    not end the process). Returns whether it watches."""
    pid = supervisor_pid()
    if pid is None:
        return False
    threading.Thread(target=_watch, args=(pid,), name="supervisor-lifeline", daemon=True).start()
    return True


def _watch(pid: int) -> None:
    global _gone
    while os.getppid() == pid:
        time.sleep(CHECK_S)
    log.warning("the supervisor (pid %d) of this shard is gone: shutting down", pid)
    with _lock:
        _gone = True
        stop = _stop
    if stop is not None:
        _call(stop)
    elif not early_signals.stop_signal_seen():
        os.kill(os.getpid(), signal.SIGTERM)  # remembered while starting: stops, no READY


def _call(stop: Callable[[], None]) -> None:
    try:
        stop()
    except Exception:  # the trio run ended meanwhile: the process is exiting anyway
        log.debug("the shard's stop was not needed: it is exiting", exc_info=True)


__all__ = [
    "CHECK_S",
    "SUPERVISOR_PID_ENV",
    "on_supervisor_gone",
    "supervisor_pid",
    "watch_supervisor",
]
