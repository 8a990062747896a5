"""Recording deliveries: staged redeliveries, DELIVERED and RETURN_COUNTED commands.

Plain functions over a :class:`~futureq.broker.dispatcher.Dispatcher`. A redelivery
(attempt 2 and up) is staged by the pass; the recorder task commits one DELIVERED for
everything staged meanwhile and only then pushes the DELIVER frames
(:func:`push_staged`), or gives the deliveries back when the record fails
(:func:`drop_staged`). First deliveries given back are recorded by a RETURN_COUNTED
(:func:`record_returned`), and every first delivery out is recorded before a leader
hands over (:func:`hold_and_record`). Why first deliveries go out unrecorded: the
module docstring of :mod:`futureq.broker.dispatcher`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import attrs
import trio

from futureq.errors import FutureQError
from futureq.state import commands
from futureq.wire import frames

from . import dispatch_counters, dispatch_tasks
from .hub import Consumer, InFlight

if TYPE_CHECKING:
    from .dispatcher import Dispatcher

log = logging.getLogger(__name__)

MAX_DELIVERED_ENTRIES = 8192
"""Most deliveries one DELIVERED command records (the rest go in the next one)."""
MAX_RECORDS_IN_FLIGHT = 4
"""DELIVERED commands being committed at once."""


@attrs.define(eq=False)
class Staged:
    """Deliveries of one pass for one consumer, waiting for their DELIVERED to commit.

    Attributes:
        consumer: Who gets them.
        flights: The deliveries (tracked in the hub, not pushed yet).
        deliveries: Their DELIVER items ``[tag, id, payload, due_ms, publish_ms, attempt]``.
    """

    consumer: Consumer
    flights: list[InFlight]
    deliveries: list[list[Any]]


def take_staged(dispatcher: Dispatcher) -> tuple[bytes | None, list[Staged]]:
    """The work of :meth:`Dispatcher.take_staged` (its docstring: arguments, result, errors)."""
    batches: list[Staged] = []
    entries: list[tuple[bytes, int]] = []
    while dispatcher._staged and len(entries) < MAX_DELIVERED_ENTRIES:
        batch = dispatcher._staged.popleft()
        batches.append(batch)
        entries.extend(
            (flight.key, flight.attempt)
            for flight in batch.flights
            if dispatcher.hub.is_current(flight)
        )
    if dispatcher._staged:
        dispatcher._staged_changed.set()
    # The stamp becomes the entries' last delivery time (a dead letter's provenance).
    command = commands.delivered(entries, dispatcher.clock.wall_ms()) if entries else None
    return command, batches


def push_staged(
    dispatcher: Dispatcher, batches: list[Staged], *, pass_now_ms: int | None = None
) -> int:
    """The work of :meth:`Dispatcher.push_staged` (its docstring: arguments, result, errors)."""
    if pass_now_ms is None:
        now_ms = dispatcher.clock.wall_ms()
        allowed = dispatcher.dispatch_allowed
        if not dispatcher.active or (allowed is not None and not allowed()):
            dispatcher.drop_staged(batches)
            return 0
    else:
        now_ms = pass_now_ms
    pushed = 0
    for batch in batches:
        consumer = batch.consumer
        flights: list[InFlight] = []
        deliveries: list[list[Any]] = []
        for flight, delivery in zip(batch.flights, batch.deliveries, strict=True):
            if not dispatcher.hub.is_current(flight):
                if not consumer.closed:
                    consumer.credit += 1  # never went out: its credit is the consumer's
                    dispatcher.hub.wake(consumer)
                continue
            if flight.expire_ms is not None and flight.expire_ms <= now_ms:
                dispatcher.hub.give_back(flight)  # unpushed: credit back, expired next pass
                dispatcher.kick()
                continue
            flights.append(flight)
            deliveries.append(delivery)
        if not flights:
            continue
        runtime = dispatcher.hub.groups.get(flights[0].group_id)
        sent = runtime is not None and consumer.send(
            frames.Deliver(0, consumer.subscription_id, now_ms, deliveries)
        )
        if not sent:
            for flight in flights:
                dispatcher.hub.give_back(flight)
            continue
        assert runtime is not None
        visibility_ms = runtime.info.visibility_timeout_ms
        for flight in flights:
            dispatcher.hub.mark_pushed(flight, now_ms + visibility_ms, now_ms)
        pushed += len(flights)
        dispatch_counters.count_pushed(dispatcher, runtime, flights, now_ms)
    # mark_pushed told the loop of each new deadline earlier than its wake-up.
    return pushed


def drop_staged(dispatcher: Dispatcher, batches: list[Staged]) -> None:
    """Their DELIVERED could not be committed (or they may not be pushed now): give
    the deliveries back unpushed. One removed meanwhile returns its credit, as in
    :func:`push_staged` (it never went out)."""
    for batch in batches:
        consumer = batch.consumer
        for flight in batch.flights:
            if dispatcher.hub.is_current(flight):
                dispatcher.hub.give_back(flight)
            elif not consumer.closed:
                consumer.credit += 1
                dispatcher.hub.wake(consumer)
    dispatcher.kick()


async def recorder(dispatcher: Dispatcher) -> None:
    """Commit DELIVERED records, then push what they cover.

    Up to :data:`MAX_RECORDS_IN_FLIGHT` commits at a time; what is staged while
    they are all busy goes into the next one (group commit), so a busy dispatcher
    makes few, large records and an idle one waits about one commit.
    """
    slots = trio.Semaphore(MAX_RECORDS_IN_FLIGHT)
    async with trio.open_nursery() as nursery:
        while True:
            if not dispatcher._staged:
                dispatcher._staged_changed = trio.Event()
                await dispatcher._staged_changed.wait()
                continue
            await slots.acquire()
            command, batches = dispatcher.take_staged()
            if command is None:
                dispatcher.push_staged(batches)
                slots.release()
                continue
            nursery.start_soon(record, dispatcher, command, batches, slots)


async def record(
    dispatcher: Dispatcher, command: bytes, batches: list[Staged], slots: trio.Semaphore
) -> None:
    try:
        try:
            await dispatcher.log.propose(command)
        except FutureQError as exc:
            log.warning("could not record deliveries (they go back to their groups): %s", exc)
            dispatcher.drop_staged(batches)
            await trio.sleep(dispatch_tasks.PROPOSE_RETRY_MS / 1000)
            return
        dispatcher.push_staged(batches)
    finally:
        slots.release()


async def hold_and_record(dispatcher: Dispatcher) -> int:
    """Stop handing out deliveries (until :meth:`Dispatcher.resume`), then commit the
    attempts of every first delivery given back unrecorded (RETURN_COUNTED) and of
    every delivery still out (HANDED_OUT, with its tag's stamp and its visibility
    deadline): before a leader shuts down or hands leadership over, so the node that
    delivers next continues their count (``docs/protocol.md``, UNSUBSCRIBE) and keeps
    each delivery still out invisible and settleable by its tag until its deadline
    (``docs/protocol.md``, "Delivery tags across leaders"). Returns how many were
    recorded; 0 when not dispatching.

    Raises:
        FutureQError: the log refused (not leader any more, shutting down).
    """
    dispatcher.held = True
    # A RETURN_COUNTED a pass queued must commit before the log stops taking
    # proposals (a connection closed just before the shutdown: its attempt was lost).
    await dispatcher._proposals_idle.wait()
    recorded = 0
    hub = dispatcher.hub
    while dispatcher.active:
        entries = hub.take_returned(MAX_DELIVERED_ENTRIES)
        if not entries:
            break
        await dispatcher.log.propose(commands.return_counted(entries))
        recorded += len(entries)
    # Nothing new goes out while held; a delivery settled, taken back or removed
    # meanwhile is left out of the next chunk (and a hold on it applies to nothing
    # still out: the entry was acked, moved, or its attempt superseded).
    out = [f for f in hub.in_flight.values() if f.still_out]
    for start in range(0, len(out), MAX_DELIVERED_ENTRIES):
        if not dispatcher.active:
            break
        # Looked at again: each propose let acks and timeouts run.
        chunk = [
            f
            for f in out[start : start + MAX_DELIVERED_ENTRIES]
            if hub.is_current(f) and f.still_out
        ]
        if not chunk:
            continue
        for flight in chunk:
            flight.recorded = True
        await dispatcher.log.propose(
            commands.handed_out(
                [(f.key, f.attempt, f.stamp, f.pushed_ms, f.deadline_ms) for f in chunk]
            )
        )
        recorded += len(chunk)
        for flight in chunk:
            if hub.is_current(flight):
                hub.adopt(flight)
    return recorded


def record_returned(dispatcher: Dispatcher, now_ms: int) -> None:
    """Propose a RETURN_COUNTED of first deliveries given back (their consumer left,
    their visibility timeout passed): they count, and until this commits only this
    leader's index knows it. Left for the next pass while the log is backed up."""
    if now_ms < dispatcher._retry_after_ms:
        return
    entries = dispatcher.hub.take_returned(MAX_DELIVERED_ENTRIES)
    try:
        dispatcher._proposals_send.send_nowait((commands.return_counted(entries), []))
    except trio.WouldBlock:
        for key, attempt, pushed_ms in entries:
            dispatcher.hub.returned.setdefault(key, (attempt, pushed_ms))
        return
    dispatch_tasks.note_queued(dispatcher)
    if dispatcher.hub.returned:
        dispatcher.kick()  # more than one command's worth: the rest on the next pass
