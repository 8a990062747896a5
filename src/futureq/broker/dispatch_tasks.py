"""The dispatcher's proposer and reaper tasks.

Plain functions over a :class:`~futureq.broker.dispatcher.Dispatcher`. The proposer
commits the EXPIRE, DEAD_LETTER and RETURN_COUNTED commands a pass queues
(:func:`submit`); entries whose command the log refused are parked and put back after
:data:`PROPOSE_RETRY_MS` (:func:`park`, :func:`unpark`). The reaper removes the schedule
entries of deleted and purged groups, and fills groups created from the backlog, in
bounded chunks (:data:`PURGE_CHUNK_ENTRIES`).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import trio

from futureq.errors import FutureQError
from futureq.state import commands

if TYPE_CHECKING:
    from .dispatcher import Dispatcher

log = logging.getLogger(__name__)

PROPOSE_RETRY_MS = 200
"""Wait before retrying an EXPIRE or DEAD_LETTER the log refused (ms)."""
PURGE_CHUNK_ENTRIES = 250
"""Schedule entries of a deleted group one PURGE_GROUP removes: about 2 ms of apply on
this kind of machine (RocksDB, 100-byte payloads), so a follower applying a slice of
several still answers heartbeats in time."""


async def reaper(dispatcher: Dispatcher) -> None:
    """Remove the schedule entries of deleted and purged groups, and fill groups
    created from the backlog, one bounded chunk per command.

    Each PURGE_GROUP applies in a few milliseconds, so the loop, heartbeats and
    other commands go on between chunks (``DESIGN.md``, "no request holds the
    event loop").
    """
    while True:
        command = background_chunk(dispatcher) if dispatcher.active else None
        if command is None:
            dispatcher._deleting_changed = trio.Event()
            await dispatcher._deleting_changed.wait()
            continue
        try:
            await dispatcher.log.propose(command)
        except FutureQError as exc:
            log.warning("could not run a purge or backfill chunk (retrying): %s", exc)
            await trio.sleep(PROPOSE_RETRY_MS / 1000)


def background_chunk(dispatcher: Dispatcher) -> bytes | None:
    """The next bounded chunk of background work, or None: purge a deleted group,
    then a purged group (PURGE), then fill a group created from the backlog."""
    state = dispatcher.state
    if state.deleting:
        return commands.purge_group(min(state.deleting), PURGE_CHUNK_ENTRIES)
    if state.purging:
        return commands.purge_group(min(state.purging), PURGE_CHUNK_ENTRIES)
    if state.backfilling:
        return commands.backfill_group(
            min(state.backfilling), PURGE_CHUNK_ENTRIES, dispatcher.clock.wall_ms()
        )
    return None


async def proposer(dispatcher: Dispatcher) -> None:
    async with dispatcher._proposals_receive:
        async for command, restore in dispatcher._proposals_receive:
            try:
                await dispatcher.log.propose(command)
            except FutureQError as exc:
                log.warning("could not commit a dispatcher command (retrying): %s", exc)
                park(dispatcher, restore)
            finally:
                if dispatcher._proposals_receive.statistics().current_buffer_used == 0:
                    dispatcher._proposals_idle.set()


def submit(dispatcher: Dispatcher, command: bytes, restore: list[Any]) -> None:
    if dispatcher.clock.wall_ms() < dispatcher._retry_after_ms:
        park(dispatcher, restore)
        return
    try:
        dispatcher._proposals_send.send_nowait((command, restore))
    except trio.WouldBlock:
        park(dispatcher, restore)  # the log is backed up
        return
    note_queued(dispatcher)


def park(dispatcher: Dispatcher, restore: list[Any]) -> None:
    """Hold entries whose EXPIRE/DEAD_LETTER could not be committed, and retry later.

    They stay out of the index meanwhile, so they are never delivered (they are
    expired or out of attempts) and the loop does not spin on them.
    """
    dispatcher._parked.extend(restore)
    dispatcher._retry_after_ms = dispatcher.clock.wall_ms() + PROPOSE_RETRY_MS
    dispatcher.kick()


def unpark(dispatcher: Dispatcher, now_ms: int) -> float:
    """Put parked entries back once the retry delay passed; return when to look again."""
    if not dispatcher._parked:
        return math.inf
    if now_ms < dispatcher._retry_after_ms:
        return float(dispatcher._retry_after_ms)
    parked, dispatcher._parked = dispatcher._parked, []
    for owner, due_ms, mid, expire_ms, attempt in parked:
        current = dispatcher.hub.groups.get(owner.info.group_id)
        if current is not None and current is owner:
            current.index.add(due_ms, mid, expire_ms, attempt)
            dispatcher.hub.touched.add(owner.info.group_id)
            dispatcher.note_expiry(expire_ms)
    return math.inf


def note_queued(dispatcher: Dispatcher) -> None:
    """A command went to the proposer: it is busy until the queue is empty again."""
    if dispatcher._proposals_idle.is_set():
        dispatcher._proposals_idle = trio.Event()
