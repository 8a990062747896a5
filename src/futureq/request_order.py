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
  entries it moves): when that proposal is queued in the log (:func:`in_turn`, called
  by the command logs; the request marks its proposal with :func:`effect`), so
  pipelined requests still share group commits, and a PUBLISH waits for its turn only
  there: the request ahead queues its proposal for it when it passes, so a pipeline of
  them is queued in one pass of the event loop, and its task sleeps on until that
  proposal ends (:class:`Done`): woken once, as without order, not also to learn it
  was queued; an ack-level-NONE PUBLISH passes it once queued for the background
  publisher, and a later request that is not one waits until the background
  publisher has queued it (:meth:`Turn.background`);
* else when the request ends (its effects applied, its answer queued).

A small PUBLISH on a single node whose connection's last turn has passed (and the
background publisher's place it carries) is queued by the connection's reader at once,
with no turn of its own (``broker.connection.INLINE_PUBLISH_ITEMS``): nothing read
before it still waits to take effect, so the order holds.

Plain trio and a context variable: the command logs call :func:`in_turn` without
knowing of connections (a proposal made outside a request does nothing).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar, Token
from typing import Any

import trio

__all__ = ["Done", "Turn", "current", "effect", "in_turn", "queued_in_background", "serving"]


class Done:
    """A one-shot event, as ``trio.Event`` (``set``, ``is_set``, ``wait``), for a
    proposal's end: a request whose proposal the request ahead of it queued
    (:func:`in_turn` with ``done``) sleeps on from its park to its commit, so it is
    woken once, not once to learn it was queued and again at the commit."""

    __slots__ = ("_flag", "_lot")

    def __init__(self) -> None:
        self._flag = False
        self._lot = trio.lowlevel.ParkingLot()

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        """Set it and wake every waiter (again: nothing)."""
        if not self._flag:
            self._flag = True
            self._lot.unpark_all()

    def wake_on_set(self, lot: trio.lowlevel.ParkingLot) -> None:
        """Move the tasks sleeping in ``lot`` to sleep until this is set (woken at once
        if it is set already): they do not run in between."""
        if self._flag:
            lot.unpark_all()
        else:
            lot.repark_all(self._lot)

    async def wait(self) -> None:
        """Return once it is set (a checkpoint either way)."""
        if self._flag:
            await trio.lowlevel.checkpoint()
        else:
            await self._lot.park()


class Turn:
    """One request's place in its connection's order.

    Args:
        before: The turn of the connection's previous state-changing request, or None.
    """

    __slots__ = (
        "_before",
        "_error",
        "_next",
        "_parked",
        "_passed",
        "_passing",
        "_wants_pass",
        "background",
    )

    def __init__(self, before: Turn | None) -> None:
        self._before = before
        if before is not None:
            before._next = self
        self._next: Turn | None = None
        self._passed = False
        self._passing: trio.Event | None = None
        """Set once it passed; made only for a request that waits for that (most find
        it passed, or park their proposal)."""
        self._parked: _Parked | None = None
        """The proposal this request waits to queue (:func:`in_turn`): the request
        before it queues it on its behalf when it passes, in the same pass of the event
        loop (else a long pipeline took one pass per request)."""
        self._wants_pass = False
        """It ended (or has no effect) before the request ahead of it passed."""
        self._error: BaseException | None = None
        self.background: Turn | None = None
        """The place of the last ack-level-NONE PUBLISH of this connection up to this
        request in the background publisher's queue, passed on once the background
        publisher queued it in the log (None: none waits); known once :meth:`wait`
        returned."""

    @property
    def passed(self) -> bool:
        return self._passed

    def _ready(self, behind_background: bool) -> bool:
        """Whether it may take effect now, without a wait."""
        before = self._before
        if before is not None:
            if not before._passed:
                return False
            self.background = before.background
            self._before = None
        background = self.background
        if behind_background and background is not None:
            if not background._passed:
                return False
            self.background = None
        return True

    async def wait(self, *, behind_background: bool = True) -> None:
        """Return once the previous request passed its turn on (and, with
        ``behind_background``, the background publisher queued every earlier
        ack-level-NONE PUBLISH of this connection). No yield when nothing waits."""
        before = self._before
        if before is not None:
            if not before._passed:
                await before._wait_passed()
            self.background = before.background
            self._before = None  # a long pipeline does not keep a chain of turns
        background = self.background
        if behind_background and background is not None:
            if not background._passed:
                await background._wait_passed()
            self.background = None

    def _set_passed(self) -> None:
        self._passed = True
        if self._passing is not None:
            self._passing.set()

    async def _wait_passed(self) -> None:
        if self._passing is None:
            self._passing = trio.Event()
        await self._passing.wait()

    def pass_on(self) -> None:
        """Let the next request go on (again: nothing). A request that has not had its
        turn yet (one that does not wait for it before its effect) passes once the one
        ahead of it does. Queues the proposals of the requests behind it that wait to
        queue one, in order, as far as they may go now."""
        if self._passed:
            return
        before = self._before
        if before is not None:
            if not before._passed:
                self._wants_pass = True
                return
            # It never waited (a PUBLISH refused before its proposal): what the
            # requests before it wait for stays so for the next one (the background
            # publisher's place), and it holds no earlier turn (a long run of such
            # requests kept a chain of all of them for the connection's lifetime).
            if self.background is None:
                self.background = before.background
            self._before = None
        self._set_passed()
        passed, turn = self, self._next
        while turn is not None and (turn._wants_pass or turn._parked is not None):
            if turn._wants_pass:  # it took no effect: what was before it stays so
                turn._before = None
                turn.background = passed.background
                turn._set_passed()
                passed, turn = turn, turn._next
                continue
            parked = turn._parked
            assert parked is not None
            if not turn._ready(parked.behind_background):
                parked.lot.unpark_all()  # it waits for the background publisher itself
                return
            queued = False
            try:
                parked.now()
                queued = True
            except trio.WouldBlock:
                if parked.later is not None:
                    parked.lot.unpark_all()  # its log's queue is full: it waits for room
                    return
                turn._error = parked.full
            except BaseException as exc:  # noqa: BLE001 - the request's own error
                turn._error = exc
            turn._parked = None
            done = parked.done
            if queued and done is not None and not done.is_set():
                parked.lot.repark_all(done._lot)  # woken at its commit, not now
            else:
                parked.lot.unpark_all()
            turn._set_passed()
            passed, turn = turn, turn._next


class _Parked:
    __slots__ = ("behind_background", "done", "full", "later", "lot", "now")

    def __init__(
        self,
        now: Callable[[], None],
        later: Callable[[], Awaitable[None]] | None,
        full: BaseException | None,
        behind_background: bool,
        done: Done | None,
    ) -> None:
        self.now = now
        self.later = later
        self.full = full
        self.behind_background = behind_background
        self.done = done
        self.lot = trio.lowlevel.ParkingLot()
        """Where its task sleeps until the request ahead passes: woken then, or, when
        that request queued its proposal and ``done`` is given, moved to ``done``."""


_current: ContextVar[Turn | None] = ContextVar("futureq_request_turn", default=None)
_in_effect: ContextVar[bool] = ContextVar("futureq_request_effect", default=False)


def current() -> Turn | None:
    """The turn of the request this task serves, or None (no request, or a read)."""
    return _current.get()


class _Setting:
    """``with``: ``var`` holds ``value`` inside (a class, not a generator: it is entered
    twice per request)."""

    __slots__ = ("_token", "_value", "_var")

    _token: Token[Any]

    def __init__(self, var: ContextVar[Any], value: object) -> None:
        self._var = var
        self._value = value

    def __enter__(self) -> None:
        self._token = self._var.set(self._value)

    def __exit__(self, *_exc: object) -> None:
        self._var.reset(self._token)


def serving(turn: Turn | None) -> _Setting:
    """Serve a request under ``turn`` (in the request's own task): ``with serving(turn):``."""
    return _Setting(_current, turn)


def effect() -> _Setting:
    """``with effect():`` the proposal made inside is the request's effect: once it is
    queued in the log, the next request of the connection may go on (:func:`in_turn`)."""
    return _Setting(_in_effect, True)


async def in_turn(
    now: Callable[[], None],
    later: Callable[[], Awaitable[None]] | None = None,
    *,
    full: BaseException | None = None,
    behind_background: bool = True,
    done: Done | None = None,
) -> None:
    """Queue a proposal (``now``: puts it in a log's queue, or raises ``trio.WouldBlock``
    when that is full; ``later``: waits for room and puts it, None: ``full`` is raised
    instead) in the turn of the request this task serves, when the proposal is that
    request's effect (inside :func:`effect`); then pass the turn on. Elsewhere the
    proposal is queued at once.

    A request whose turn has not come parks its proposal: the request ahead of it
    queues it when it passes (in the same pass of the event loop), else it is woken to
    queue it itself. ``behind_background``: it waits for the connection's earlier
    ack-level-NONE publishes to be queued in the log too. ``done``: what the caller waits
    on next (set when the proposal ends): a request whose proposal the request ahead
    queued returns only once it is set (one wake-up for both), so the caller waits on
    it only if it is not set yet.

    Raises:
        What ``now`` or ``later`` raises, or ``full``.
    """
    turn = _current.get()
    if turn is None or not _in_effect.get() or turn.passed:
        await _queue(now, later, full)
        return
    if not turn._ready(behind_background):
        parked = turn._parked = _Parked(now, later, full, behind_background, done)
        before = turn._before
        try:
            if before is not None and not before._passed:
                await parked.lot.park()  # woken by pass_on() (or, with done, at its end)
            if turn._parked is None:  # queued by the request ahead of it
                error, turn._error = turn._error, None
                if error is not None:
                    raise error
                return
            await turn.wait(behind_background=behind_background)
        finally:
            if turn._parked is parked:
                turn._parked = None  # queued below, or given up (cancelled)
    try:
        await _queue(now, later, full)
    finally:
        turn.pass_on()


async def _queue(
    now: Callable[[], None],
    later: Callable[[], Awaitable[None]] | None,
    full: BaseException | None,
) -> None:
    try:
        now()
    except trio.WouldBlock:
        if later is None:
            assert full is not None
            raise full from None
        await later()


def queued_in_background(turn: Turn | None, place: Turn) -> None:
    """The request of ``turn`` (None: none) queued its effect for the background
    publisher at ``place`` (passed on once that publisher queued it in the log): a
    later request of the connection that is not queued there too waits for it. Call
    from the ``now`` of :func:`in_turn` (which the request ahead may run: ``turn`` is
    the request's own, taken before)."""
    if turn is not None:
        turn.background = place
