"""run_sync_quick: a worker thread's result without the hop back through the loop."""

from __future__ import annotations

import threading
import time

import pytest
import trio

from futureq.quick_thread import run_sync_quick, tasks_runnable


async def test_returns_the_result_computed_in_a_worker_thread() -> None:
    main = threading.get_ident()
    result, thread = await run_sync_quick(lambda a, b: (a + b, threading.get_ident()), 2, 3)
    assert result == 5 and thread != main


async def test_raises_the_error_of_the_call() -> None:
    def fail() -> None:
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        await run_sync_quick(fail)


async def test_a_slow_call_holds_the_loop_at_most_wait_s() -> None:
    """A stalled call (a disk write taking seconds) is waited for on the loop after
    ``wait_s``: other tasks run meanwhile (clock pings are answered, issue 15)."""
    release = threading.Event()
    ticks: list[float] = []

    async def ticker() -> None:
        while not release.is_set():
            ticks.append(time.monotonic())
            await trio.sleep(0.01)

    def stalled() -> str:
        release.wait(5)
        return "written"

    async with trio.open_nursery() as nursery:
        started = time.monotonic()

        async def call() -> None:
            assert await run_sync_quick(stalled, wait_s=0.05) == "written"

        nursery.start_soon(call)
        await trio.sleep(0.1)  # call() is waiting for the worker by now
        nursery.start_soon(ticker)
        await trio.sleep(0.5)
        release.set()
    assert len([t for t in ticks if t > started]) >= 10  # the loop ran during the stall


async def test_not_cancelled_half_way() -> None:
    """Like ``trio.to_thread.run_sync``: a started call finishes before cancellation
    takes effect (a synced write must not be abandoned)."""
    done = threading.Event()

    def write() -> None:
        time.sleep(0.1)
        done.set()

    with trio.move_on_after(0.01):
        await run_sync_quick(write, wait_s=0.001)
    assert done.is_set()


async def test_tasks_runnable_agrees_with_trio_statistics() -> None:
    """The O(1) run-queue read says what ``current_statistics`` says (whose cost grows
    with every registered descriptor): a trio upgrade that moves the queue fails here
    rather than silently slowing every synced write."""
    assert tasks_runnable() == trio.lowlevel.current_statistics().tasks_runnable == 0
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(trio.sleep, 0)
        # Spawned, not yet run: on the run queue.
        assert tasks_runnable() == trio.lowlevel.current_statistics().tasks_runnable == 3
        await trio.sleep(0.01)
        assert tasks_runnable() == trio.lowlevel.current_statistics().tasks_runnable == 0
