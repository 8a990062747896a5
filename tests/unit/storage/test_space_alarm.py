"""SpaceAlarm.writing: the lock that keeps the reopen away from a write in a thread."""

from __future__ import annotations

import pytest
import trio

from futureq.storage.db import Database
from futureq.storage.space import SpaceAlarm


async def test_a_free_lock_is_taken_without_a_pass_of_the_event_loop(db: Database) -> None:
    alarm = SpaceAlarm(db)
    ran: list[str] = []

    async def other() -> None:
        ran.append("other")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        async with alarm.writing():
            assert alarm.lock.locked()
            assert ran == []  # no scheduling point: the spawned task has not run
    assert ran == ["other"] and not alarm.lock.locked()


async def test_a_write_waits_for_the_holder_and_the_lock_is_released_on_error(
    db: Database,
) -> None:
    alarm = SpaceAlarm(db)
    order: list[str] = []
    async with trio.open_nursery() as nursery:
        async with alarm.writing():

            async def second() -> None:
                async with alarm.writing():
                    order.append("second")

            nursery.start_soon(second)
            await trio.sleep(0.01)
            order.append("first done")
    assert order == ["first done", "second"]
    with pytest.raises(OSError):
        async with alarm.writing():
            raise OSError("write failed")
    assert not alarm.lock.locked()


async def test_a_cancelled_caller_raises_before_taking_the_lock(db: Database) -> None:
    alarm = SpaceAlarm(db)
    entered = False
    with trio.CancelScope() as scope:
        scope.cancel()
        async with alarm.writing():
            entered = True
    assert scope.cancelled_caught and not entered and not alarm.lock.locked()
