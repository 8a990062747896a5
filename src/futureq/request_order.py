"""The order of one connection's requests: each state-changing request takes effect after
the one its client sent before it (``docs/protocol.md``, "Requests").

A connection serves its requests in tasks of their own (requests pipeline), so without a
rule a later request could overtake an earlier one: trio runs a batch of new tasks in
either order, and a request that waits (a large batch validated in steps, a leader
lookup) lets later ones pass. Each state-changing request therefore holds a
:class:`Turn`: it waits for the turn of the request before it, and passes its own on
once its effect has its place, so the next one cannot take effect first:

* at once, for a request whose effect is one log proposal (PUBLISH, ACK, NACK,
  RELEASE, RESCHEDULE: a settlement taken while a RESCHEDULE commits follows the
  entries it moves): when that proposal is queued in the log (:func:`proposal_queued`, called
  by the command logs inside :func:`effect`), so pipelined requests still share
  group commits; an ack-level-NONE PUBLISH passes it once queued for the background
  publisher, and a later request that is not one waits until the background
  publisher has queued it (:meth:`Turn.background`);
* else when the request ends (its effects applied, its answer queued).

Plain trio and a context variable: the command logs call :func:`proposal_queued`
without knowing of connections (a proposal made outside a request does nothing).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import trio

__all__ = ["Turn", "current", "effect", "proposal_queued", "queued_in_background", "serving"]


class Turn:
    """One request's place in its connection's order.

    Args:
        before: The turn of the connection's previous state-changing request, or None.
    """

    __slots__ = ("_before", "_done", "background")

    def __init__(self, before: Turn | None) -> None:
        self._before = before
        self._done = trio.Event()
        self.background: Turn | None = None
        """The place of the last ack-level-NONE PUBLISH of this connection up to this
        request in the background publisher's queue, passed on once the background
        publisher queued it in the log (None: none waits); known once :meth:`wait`
        returned."""

    @property
    def passed(self) -> bool:
        return self._done.is_set()

    async def wait(self, *, behind_background: bool = True) -> None:
        """Return once the previous request passed its turn on (and, with
        ``behind_background``, the background publisher queued every earlier
        ack-level-NONE PUBLISH of this connection). No yield when nothing waits."""
        before = self._before
        if before is not None:
            if not before._done.is_set():
                await before._done.wait()
            self.background = before.background
            self._before = None  # a long pipeline does not keep a chain of turns
        background = self.background
        if behind_background and background is not None:
            if not background._done.is_set():
                await background._done.wait()
            self.background = None

    def pass_on(self) -> None:
        """Let the next request go on (again: nothing)."""
        self._done.set()


_current: ContextVar[Turn | None] = ContextVar("futureq_request_turn", default=None)
_in_effect: ContextVar[bool] = ContextVar("futureq_request_effect", default=False)


def current() -> Turn | None:
    """The turn of the request this task serves, or None (no request, or a read)."""
    return _current.get()


@contextmanager
def serving(turn: Turn | None) -> Iterator[None]:
    """Serve a request under ``turn`` (in the request's own task)."""
    token = _current.set(turn)
    try:
        yield
    finally:
        _current.reset(token)


@contextmanager
def effect() -> Iterator[None]:
    """The proposal made inside is the request's effect: once it is queued in the log,
    the next request of the connection may go on (:func:`proposal_queued`)."""
    token = _in_effect.set(True)
    try:
        yield
    finally:
        _in_effect.reset(token)


def proposal_queued() -> None:
    """A command log queued a proposal of this task: if it is the effect of a request
    (inside :func:`effect`), that request passes its turn on.

    Called by the command logs right after a proposal takes its place, before it is
    written or replicated."""
    if _in_effect.get():
        turn = _current.get()
        if turn is not None:
            turn.pass_on()


def queued_in_background(place: Turn) -> None:
    """The request this task serves queued its effect for the background publisher at
    ``place`` (passed on once that publisher queued it in the log): a later request
    of the connection that is not queued there too waits for it; this one passes its
    turn on now."""
    turn = _current.get()
    if turn is not None:
        turn.background = place
        turn.pass_on()
