"""Short blocking calls in a worker thread without the full cost of the hop back.

``trio.to_thread.run_sync`` returns through the event loop: the worker posts the
result (``run_sync_soon``: a write to the loop's wake-up socket), the loop wakes from
``epoll``, takes the GIL from the worker and reschedules the waiting task. On a busy
2-core machine the round trip to a worker and back cost 0.2-0.3 ms around a synced
write of 0.2-0.3 ms, on the path of every acknowledgement.

:func:`run_sync_quick` starts the call in a worker thread just the same, but while no
other task is ready to run it waits for the result on a ``threading.Event`` (the GIL
released, the worker woken directly) for at most ``wait_s``; only a slower call (a
stalled disk) falls back to waiting on the event loop, which then serves everything
else meanwhile. The loop is held for at most ``wait_s``, and only when it had nothing
else to run: clock samples and deliveries are late by at most that much, never by a
stalled fsync (issue 15).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, Final, TypeVar

import trio

T = TypeVar("T")

QUICK_WAIT_S: Final = 0.002
"""How long the loop waits for the worker before it waits asynchronously (seconds)."""

_RUN_CONTEXT: object = None
"""trio's run context, whose runner holds the run queue tasks_runnable reads in O(1)
(no public accessor exists); None with a trio that no longer has it."""
try:
    from trio._core._run import GLOBAL_RUN_CONTEXT

    _RUN_CONTEXT = GLOBAL_RUN_CONTEXT
except ImportError:  # pragma: no cover - a trio without it: the statistics instead
    pass


def tasks_runnable() -> int:
    """How many tasks are ready to run besides the caller (trio's run queue length).

    ``trio.lowlevel.current_statistics().tasks_runnable`` answers the same, but the call
    also counts the tasks waiting on every registered file descriptor: O(descriptors),
    39 µs with 1,000 idle client connections and 150 µs with 5,000 on this machine, paid
    on every synced write. This reads the run queue of the running loop instead, and
    falls back to the statistics if trio's internals no longer have it
    (``test_quick_thread`` checks that both agree).

    Raises:
        RuntimeError: called outside ``trio.run``.
    """
    runq = getattr(getattr(_RUN_CONTEXT, "runner", None), "runq", None)
    if runq is None:
        return trio.lowlevel.current_statistics().tasks_runnable
    return len(runq)


async def run_sync_quick(fn: Callable[..., T], *args: Any, wait_s: float = QUICK_WAIT_S) -> T:
    """Run ``fn(*args)`` in a worker thread and return its result (or raise its error).

    Not cancellable once started, like ``trio.to_thread.run_sync`` with its default
    ``abandon_on_cancel=False``: a synced write must finish before the caller goes on.
    With other tasks ready to run it is ``trio.to_thread.run_sync`` itself.
    """
    if tasks_runnable():
        return await trio.to_thread.run_sync(fn, *args)
    token = trio.lowlevel.current_trio_token()
    finished = threading.Event()
    woken = trio.Event()
    results: list[Any] = []  # one outcome.Outcome (trio's own dependency)
    lock = threading.Lock()
    waits_on_loop = False  # set, under the lock, once the loop gave up waiting here

    def deliver(result: Any) -> None:
        with lock:
            results.append(result)
            finished.set()
            if not waits_on_loop:
                return  # the loop took it from ``finished``: no wake-up to send
        try:
            token.run_sync_soon(woken.set)
        except trio.RunFinishedError:  # pragma: no cover - the loop is gone
            pass

    await trio.lowlevel.checkpoint_if_cancelled()
    trio.lowlevel.start_thread_soon(functools.partial(fn, *args), deliver)
    if not finished.wait(wait_s):
        with lock:
            waits_on_loop = not finished.is_set()
        if waits_on_loop:
            with trio.CancelScope(shield=True):
                await woken.wait()
    value: T = results[0].unwrap()
    return value


__all__ = ["QUICK_WAIT_S", "run_sync_quick", "tasks_runnable"]
