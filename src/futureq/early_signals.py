"""Signals while the node starts: SIGHUP remembered, never fatal; a stop signal remembered
and acted on gracefully (:func:`defer_stop_signals`).

SIGHUP asks a running node to read its credentials file again. Its default action is to
end the process, and a node may take a while to start (opening RocksDB, replaying the
log), so a reload sent then (``systemctl reload``, a config watcher) would kill it with
exit code 129 and no log line. ``futureq start`` calls :func:`defer_from_the_start` on
the first line of its own code (SIGHUP and the stop signals); the server's SIGHUP
handler, once installed, calls :func:`take_deferred_sighup` and reloads if one arrived
meanwhile.

A stop signal (SIGTERM/SIGINT) that repeats the first within
:data:`REPEAT_SIGNAL_WINDOW_S` is the same request delivered twice, not a request to force
the stop (:func:`is_repeat_signal`); that holds too when the repeat comes after the
graceful shutdown is done, while the process exits (:func:`stand_in_for_stop_signals`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator
from types import FrameType

log = logging.getLogger(__name__)

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


_first_stop_at: float | None = None
"""``time.monotonic()`` when this process took its first stop signal, or None."""


def note_stop_signal() -> None:
    """Record that the first stop signal arrived now (later calls change nothing)."""
    global _first_stop_at
    if _first_stop_at is None:
        _first_stop_at = time.monotonic()


def stop_signal_seen() -> bool:
    """Whether this process took a stop signal already (:func:`note_stop_signal`)."""
    return _first_stop_at is not None


def repeats_first_stop() -> bool:
    """Whether a stop signal arriving now repeats this process's first one
    (:func:`note_stop_signal`): within :data:`REPEAT_SIGNAL_WINDOW_S` of it."""
    first = _first_stop_at
    return first is not None and is_repeat_signal(first, time.monotonic())


_stopped = False
"""Set once the server (or supervisor) stopped, for any reason (:func:`note_stopped`)."""


def note_stopped() -> None:
    """The node is stopping or stopped (a stop signal, its removal from the cluster, a
    failure): a stop signal that reaches no receiver from now on changes nothing (the
    process finishes its shutdown and exits)."""
    global _stopped
    _stopped = True


def _stop_signal_without_receiver(signum: int, frame: FrameType | None) -> None:
    if repeats_first_stop():
        log.info(
            "received %s again within %g s of the first: the same request; the shutdown is "
            "done and the process is exiting",
            signal.Signals(signum).name,
            REPEAT_SIGNAL_WINDOW_S,
        )
        return
    if _stopped:
        log.info(
            "received %s after the node stopped: the process is exiting",
            signal.Signals(signum).name,
        )
        return
    if signum == signal.SIGINT:
        signal.default_int_handler(signum, frame)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


_ignored_at_start: frozenset[int] | None = None
"""SIGINT when the process began with it ignored (:func:`stop_signals`); set once."""


def stop_signals() -> tuple[int, ...]:
    """The signals that stop the node: SIGTERM, and SIGINT unless the process began with
    it ignored.

    A shell starts a background job (``futureq start &`` in a script) with SIGINT
    ignored, so that the Ctrl-C meant for the script does not reach it; POSIX asks a
    program to leave such a signal ignored, as Python itself does. The node used to
    install its own SIGINT handler anyway, and stopped on that Ctrl-C. The first call
    (from :func:`defer_stop_signals`, before any handler is installed) looks.
    """
    global _ignored_at_start
    if _ignored_at_start is None:
        ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        _ignored_at_start = frozenset({signal.SIGINT} if ignored else ())
    return tuple(s for s in (signal.SIGTERM, signal.SIGINT) if s not in _ignored_at_start)


_deferred_stop: int | None = None
"""The stop signal that arrived while the node was starting (:func:`defer_stop_signals`)."""


def _defer_stop(signum: int, frame: FrameType | None) -> None:
    global _deferred_stop
    if _deferred_stop is None:
        _deferred_stop = signum
        note_stop_signal()
        return
    # A second one: a repeat of the first is ignored, any other forces the stop.
    _stop_signal_without_receiver(signum, frame)


def defer_stop_signals() -> None:
    """Until the node can stop gracefully, SIGTERM and SIGINT are only remembered.

    A node may take a while to start (opening RocksDB, loading its state, replaying its
    log); Python's default action would end it there with -15 (or a KeyboardInterrupt
    traceback) and no log line, and a shard of a sharded node met the supervisor's
    forwarded SIGTERM that way. The first stop signal is remembered
    (:func:`deferred_stop`, :func:`note_stop_signal`): the node stops at its next check
    of it, or as soon as its own receiver is installed, gracefully. A second one within
    :data:`REPEAT_SIGNAL_WINDOW_S` is the same request; a later one acts as the default
    (forcing the stop). ``futureq start`` calls it once it knows it starts a node. Call
    from the main thread (where Python runs signal handlers).
    """
    for signum in stop_signals():
        signal.signal(signum, _defer_stop)


def deferred_stop() -> str | None:
    """The name of the stop signal that arrived while the node was starting
    (:func:`defer_stop_signals`), or None. Not cleared: a node that saw it never serves."""
    return None if _deferred_stop is None else signal.Signals(_deferred_stop).name


def stand_in_for_stop_signals() -> None:
    """Handle SIGTERM and SIGINT wherever no ``trio.open_signal_receiver`` does.

    :func:`stop_signal_receiver` calls it once its receiver closed, at the end of a
    graceful shutdown. A repeat of the first
    stop signal (:func:`note_stop_signal`) within :data:`REPEAT_SIGNAL_WINDOW_S` is then
    ignored; any other acts as Python's default (SIGTERM ends the process, SIGINT raises
    KeyboardInterrupt). Without it a repeat that came after the shutdown finished, while
    the process was exiting, killed it (exit -15 instead of 0): systemd's
    ``KillMode=control-group`` and the shards' supervisor each send one.
    """
    for signum in stop_signals():
        signal.signal(signum, _stop_signal_without_receiver)


@contextlib.contextmanager
def stop_signal_receiver(*more: int) -> Iterator[AsyncIterator[int]]:
    """``trio.open_signal_receiver`` for the stop signals (:func:`stop_signals`) and
    ``more`` (signal numbers); once it closes, :func:`stand_in_for_stop_signals`. Call
    from trio's main thread.

    While the receiver opens, the handler in place before it (that of
    :func:`defer_stop_signals`) takes a stop signal and remembers it: check
    :func:`deferred_stop` once the receiver is open. Before, the stand-in was installed
    just before the receiver was opened, so a first stop signal landing in between met
    it: a SIGINT raised KeyboardInterrupt out of the receiver's own installation (a
    traceback instead of a graceful stop) and a SIGTERM ended the process with -15.
    """
    import trio  # noqa: PLC0415 - ``futureq start`` imports this module before anything

    try:
        with trio.open_signal_receiver(*stop_signals(), *more) as signals:
            yield signals
    finally:
        stand_in_for_stop_signals()


def ignore_stop_signals_at_exit() -> None:
    """After a graceful shutdown that a stop signal started, ignore SIGTERM and SIGINT
    for the rest of the process: it only exits now.

    While the interpreter finalizes it puts every Python-level handler back to the
    default and runs no Python code, so :func:`stand_in_for_stop_signals` cannot stand in
    there: a repeat of the first signal that arrived then (the supervisor's forwarded
    SIGTERM, systemd's ``control-group`` one) ended the process with -15 after it had
    said it stopped with 0. ``SIG_IGN`` is left in place by the interpreter. The same
    once the node stopped for another cause (:func:`note_stopped`: removed from the
    cluster, which a SIGTERM from Kubernetes then met on its way out with -15); the
    default stays only when neither happened (a failure before the node ran).
    Call from the main thread once the server or supervisor has returned.
    """
    if _first_stop_at is None and not _stopped:
        return
    for signum in stop_signals():
        signal.signal(signum, signal.SIG_IGN)


START_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""The signals a starting node remembers instead of dying of (:func:`defer_from_the_start`)."""


def starts_a_node(main_module: bool, argv: list[str]) -> bool:
    """Whether this process runs ``futureq start`` (``argv``: ``sys.argv``;
    ``main_module``: the ``futureq`` command's module runs as ``__main__``, as under
    ``python -m futureq.cli.server_main``, which the supervisor of a sharded node uses).
    The ``futureq`` console script is known by its name."""
    command = main_module or os.path.basename(argv[0]) == "futureq"
    return command and len(argv) > 1 and argv[1] == "start"


_deferred_from_the_start = False
"""Whether :func:`defer_from_the_start` ran in this process."""


def deferred_from_the_start() -> bool:
    """Whether this process remembers SIGTERM, SIGINT and SIGHUP from the first line of
    ``futureq start``'s own code (:func:`defer_from_the_start` ran): its command then
    installs neither handler again. False when ``main()`` was called otherwise (by
    another program: :func:`starts_a_node`)."""
    return _deferred_from_the_start


def defer_from_the_start() -> None:
    """Remember SIGTERM, SIGINT and SIGHUP from the first line of ``futureq start``'s own
    code on (:func:`defer_sighup`, :func:`defer_stop_signals`), then take those the
    process was started with blocked (:func:`block_start_signals_in_child`).

    Called before the command's other imports (about 0.1 s of them, then reading the
    configuration): a SIGTERM a supervisor sent then ended the process with -15 and no
    word, and a SIGINT raised KeyboardInterrupt wherever it landed, with a traceback,
    or was swallowed (in a destructor) and the node went on to serve. What the
    interpreter does before this module runs (some 20-40 ms) no handler can cover: a
    sharded node's supervisor starts its shards with these signals blocked, so a
    forwarded SIGTERM waits for this function.
    """
    global _deferred_from_the_start
    defer_stop_signals()
    defer_sighup()  # after: a process that catches SIGHUP catches the stop signals
    _deferred_from_the_start = True
    signal.pthread_sigmask(signal.SIG_UNBLOCK, START_SIGNALS)


def block_start_signals_in_child() -> None:
    """A ``preexec_fn`` for a process that runs ``futureq start``: it begins with
    SIGTERM, SIGINT and SIGHUP blocked, so one sent while its interpreter starts waits
    (pending) until :func:`defer_from_the_start` takes it; runs in the child between
    fork and exec, a single C call."""
    signal.pthread_sigmask(signal.SIG_BLOCK, START_SIGNALS)
