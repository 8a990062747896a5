"""Ctrl-C in ``futureq-cli`` commands that must end cleanly: taken from trio's signal
receiver, not raised as :exc:`KeyboardInterrupt` wherever it lands.

Trio raises Ctrl-C's :exc:`KeyboardInterrupt` in whatever task runs when the signal
comes. Landing in the client's reader task it kills the connection, so the command
cannot say or do what it must before it stops: ``publish --file`` printed no summary
(found by a tester); ``consume`` could not give back the deliveries it had received and
not printed, which then came back only after the visibility timeout with their attempt
counted (``docs/cli.md``, "consume"). :func:`ctrl_c_requests` turns the first Ctrl-C
(or SIGTERM) into :meth:`Interrupt.request` (the command stops what it is waiting for
and ends normally, exit 130, or 143 for SIGTERM); a second one raises
:exc:`KeyboardInterrupt` at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import AsyncIterator, Iterator

import anyio
import trio


class Interrupt:
    """A Ctrl-C request, turned into the cancellation of the wait in flight."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_number = signal.SIGINT
        """The signal that asked (SIGINT or SIGTERM), for the exit status."""
        self._in_flight: anyio.CancelScope | None = None
        self._grace_s = 0.0

    @property
    def exit_status(self) -> int:
        """128 + the signal's number, as a shell reports a process it ended: 130 for
        Ctrl-C, 143 for SIGTERM."""
        return 128 + int(self.signal_number)

    def request(self, signal_number: int = signal.SIGINT) -> None:
        """Stop: cancel the wait in flight (:meth:`batch`; one given a grace, once that
        has passed), start no other. Call from a task of the event loop."""
        if not self.requested:
            self.signal_number = signal.Signals(signal_number)
        self.requested = True
        if self._in_flight is not None:
            if self._grace_s > 0:
                deadline = anyio.current_time() + self._grace_s
                self._in_flight.deadline = min(self._in_flight.deadline, deadline)
            else:
                self._in_flight.cancel()

    @contextlib.contextmanager
    def batch(self, grace_s: float = 0.0) -> Iterator[anyio.CancelScope]:
        """The scope of one wait (a batch's call, a wait for the next delivery),
        cancelled by :meth:`request` (at once if it came already, before anything was
        sent). ``grace_s`` (s): a request while it runs lets it go on for that long
        (a PUBLISH already sent is then answered, so its lines' outcome is known, not
        unknown), and cancels it only then; 0: cancelled at once."""
        with anyio.CancelScope() as scope:
            if self.requested:
                scope.cancel()
            self._in_flight = scope
            self._grace_s = grace_s
            try:
                yield scope
            finally:
                self._in_flight = None
                self._grace_s = 0.0


@contextlib.asynccontextmanager
async def ctrl_c_requests(interrupt: Interrupt) -> AsyncIterator[None]:
    """While the block runs, SIGINT calls ``interrupt.request()`` instead of raising
    :exc:`KeyboardInterrupt` where it lands; a second one raises it, for a user who
    does not want to wait. Outside the main thread (where signals cannot be received)
    the block runs as is.

    SIGTERM is taken the same way (exit status 143): ``timeout 60 futureq-cli consume``,
    systemd and Kubernetes stop a command with it, and it used to kill the process
    outright, so the deliveries ``consume`` had buffered went back to the group
    counted as attempts (with ``max_deliveries`` 1, to the dead-letter topic; found by
    a tester)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        try:
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    count = 0
                    async for number in signals:
                        count += 1
                        if count > 1:
                            raise KeyboardInterrupt
                        interrupt.request(number)

                nursery.start_soon(watch)
                yield
                nursery.cancel_scope.cancel()
        except* KeyboardInterrupt:
            raise KeyboardInterrupt from None  # as a Ctrl-C anywhere else: exit 130
