"""The turns of one connection's requests (futureq.request_order): effects are queued in
the order of the turns whatever order trio runs the tasks in, a request that failed
lets the next go on, and a pipeline of parked proposals is queued by the request ahead
in the same pass of the event loop, and a parked request whose proposal it queued is
woken once, when that proposal ends."""

from __future__ import annotations

import gc
from collections import Counter

import trio
import trio.testing

from futureq import request_order


async def _request(turn: request_order.Turn, n: int, log: list[int], fail: bool = False) -> None:
    try:
        with request_order.serving(turn), request_order.effect():
            if fail:
                raise ValueError(n)
            await request_order.in_turn(lambda: log.append(n))
    except ValueError:
        pass
    finally:
        turn.pass_on()


async def test_effects_follow_the_turns_whatever_order_the_tasks_start_in() -> None:
    for reverse in (False, True):
        log: list[int] = []
        last: request_order.Turn | None = None
        turns = []
        for _ in range(50):
            last = request_order.Turn(last)
            turns.append(last)
        order = list(range(50))[:: -1 if reverse else 1]
        async with trio.open_nursery() as nursery:
            for n in order:
                nursery.start_soon(_request, turns[n], n, log, n % 7 == 3)
        assert log == [n for n in range(50) if n % 7 != 3]


async def test_parked_proposals_are_queued_by_the_request_ahead_in_one_pass() -> None:
    log: list[int] = []
    first = request_order.Turn(None)
    turns = [first]
    for _ in range(20):
        turns.append(request_order.Turn(turns[-1]))
    async with trio.open_nursery() as nursery:
        for n in range(20, 0, -1):  # all park behind the first
            nursery.start_soon(_request, turns[n], n, log)
        await trio.testing.wait_all_tasks_blocked()
        assert log == []
        with request_order.serving(first), request_order.effect():
            await request_order.in_turn(lambda: log.append(0))
        assert log == list(range(21))  # at once, before any parked task ran again


async def test_a_request_behind_a_background_publish_waits_for_its_place() -> None:
    log: list[str] = []
    none_turn = request_order.Turn(None)
    quorum_turn = request_order.Turn(none_turn)
    place = request_order.Turn(None)
    with request_order.serving(none_turn), request_order.effect():
        await request_order.in_turn(
            lambda: request_order.queued_in_background(none_turn, place),
            behind_background=False,
        )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_request_named, quorum_turn, log)
        await trio.testing.wait_all_tasks_blocked()
        assert log == []  # the background publisher has not queued the earlier one
        place.pass_on()
    assert log == ["quorum"]


async def _request_named(turn: request_order.Turn, log: list[str]) -> None:
    with request_order.serving(turn), request_order.effect():
        await request_order.in_turn(lambda: log.append("quorum"))


async def test_a_request_that_never_waited_keeps_the_background_place_for_the_next() -> None:
    """A PUBLISH refused before its proposal (a bad field, no permission) passes its
    turn without waiting for it: the request after it must still wait for an earlier
    ack-level-NONE publish of the connection. Before, it was logged ahead of it."""
    log: list[str] = []
    none_turn = request_order.Turn(None)
    refused = request_order.Turn(none_turn)
    quorum_turn = request_order.Turn(refused)
    place = request_order.Turn(None)
    with request_order.serving(none_turn), request_order.effect():
        await request_order.in_turn(
            lambda: request_order.queued_in_background(none_turn, place),
            behind_background=False,
        )
    refused.pass_on()  # its turn came after the one before it passed
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_request_named, quorum_turn, log)
        await trio.testing.wait_all_tasks_blocked()
        assert log == []  # before: ["quorum"], ahead of the background publish
        place.pass_on()
    assert log == ["quorum"]


def test_requests_that_pass_without_waiting_keep_no_chain_of_turns() -> None:
    """A connection whose every PUBLISH is refused before its proposal: each turn passes
    once the one before it passed. Before, each kept the one before it, so the
    connection held every turn it ever made (~250 bytes per refused request)."""
    gc.collect()
    before = sum(1 for thing in gc.get_objects() if type(thing) is request_order.Turn)
    last: request_order.Turn | None = None
    for _ in range(1_000):
        last = request_order.Turn(last)
        last.pass_on()
    gc.collect()
    alive = sum(1 for thing in gc.get_objects() if type(thing) is request_order.Turn) - before
    assert alive <= 2, alive  # before: 1000


class _Steps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps: Counter[str] = Counter()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.startswith("request "):
            self.steps[task.name] += 1


async def _request_until_done(
    turn: request_order.Turn, n: int, log: list[int], done: request_order.Done
) -> None:
    try:
        with request_order.serving(turn), request_order.effect():
            await request_order.in_turn(lambda: log.append(n), done=done)
            if not done.is_set():
                await done.wait()
        log.append(100 + n)
    finally:
        turn.pass_on()


async def test_a_parked_request_queued_by_the_one_ahead_is_woken_once_at_its_end() -> None:
    # Before, it was woken when the request ahead queued its proposal, then slept
    # again until the proposal ended: one more task step per parked request, the cost
    # of order on a pipeline of PUBLISHes.
    log: list[int] = []
    turns = [request_order.Turn(None)]
    for _ in range(20):
        turns.append(request_order.Turn(turns[-1]))
    dones = [request_order.Done() for _ in range(21)]
    instrument = _Steps()
    trio.lowlevel.add_instrument(instrument)
    try:
        async with trio.open_nursery() as nursery:
            for n in range(20, 0, -1):  # all park behind the first
                nursery.start_soon(
                    _request_until_done, turns[n], n, log, dones[n], name=f"request {n}"
                )
            await trio.testing.wait_all_tasks_blocked()
            with request_order.serving(turns[0]), request_order.effect():
                await request_order.in_turn(lambda: log.append(0), done=dones[0])
            assert log == list(range(21))
            await trio.testing.wait_all_tasks_blocked()
            assert set(instrument.steps.values()) == {1}  # none woken by being queued
            for n in range(20, 0, -1):  # the ends come in any order
                dones[n].set()
        assert sorted(log[21:]) == [100 + n for n in range(1, 21)]
        assert instrument.steps == Counter({f"request {n}": 2 for n in range(1, 21)})
    finally:
        trio.lowlevel.remove_instrument(instrument)


async def test_a_parked_request_whose_proposal_fails_or_finds_no_room_is_woken() -> None:
    # The request ahead queues what it can; one whose proposal raises learns it at once,
    # and one whose log is full is woken to wait for room itself (the ones behind it too).
    log: list[str] = []
    room = trio.Event()
    turns = [request_order.Turn(None)]
    for _ in range(3):
        turns.append(request_order.Turn(turns[-1]))
    dones = [request_order.Done() for _ in range(4)]
    errors: list[BaseException] = []

    def refuse() -> None:
        raise ValueError("refused")

    def full() -> None:
        raise trio.WouldBlock

    async def wait_for_room() -> None:
        await room.wait()
        log.append("later")

    async def request(n: int, now: object, later: object = None) -> None:
        try:
            with request_order.serving(turns[n]), request_order.effect():
                await request_order.in_turn(now, later, done=dones[n])  # type: ignore[arg-type]
            log.append(f"returned {n}")
        except ValueError as exc:
            errors.append(exc)
        finally:
            turns[n].pass_on()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(request, 3, lambda: log.append("3"))
        nursery.start_soon(request, 2, full, wait_for_room)
        nursery.start_soon(request, 1, refuse)
        await trio.testing.wait_all_tasks_blocked()
        with request_order.serving(turns[0]), request_order.effect():
            await request_order.in_turn(lambda: log.append("0"), done=dones[0])
        await trio.testing.wait_all_tasks_blocked()
        assert [str(e) for e in errors] == ["refused"]
        assert log == ["0"]  # 2 waits for room, 3 behind it
        room.set()
        await trio.testing.wait_all_tasks_blocked()
        assert log == ["0", "later", "3", "returned 2"]  # 2 queued 3 as it passed
        dones[3].set()
    assert log[-1] == "returned 3"


async def test_a_parked_request_cancelled_takes_no_effect_and_holds_none_back() -> None:
    log: list[int] = []
    turns = [request_order.Turn(None)]
    for _ in range(3):
        turns.append(request_order.Turn(turns[-1]))
    dones = [request_order.Done() for _ in range(4)]
    scopes = [trio.CancelScope() for _ in range(4)]

    async def request(n: int) -> None:
        with scopes[n]:
            await _request_until_done(turns[n], n, log, dones[n])

    async with trio.open_nursery() as nursery:
        for n in (3, 2, 1):
            nursery.start_soon(request, n)
        await trio.testing.wait_all_tasks_blocked()
        scopes[2].cancel()  # its connection closed, say
        await trio.testing.wait_all_tasks_blocked()
        with request_order.serving(turns[0]), request_order.effect():
            await request_order.in_turn(lambda: log.append(0), done=dones[0])
        assert log == [0, 1, 3]
        assert turns[3].passed
        dones[1].set()
        dones[3].set()
    assert sorted(log[3:]) == [101, 103]


async def test_tasks_moved_to_a_done_sleep_until_it_is_set() -> None:
    lot = trio.lowlevel.ParkingLot()
    woken: list[str] = []

    async def sleeper(name: str) -> None:
        await lot.park()
        woken.append(name)

    done = request_order.Done()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sleeper, "a")
        await trio.testing.wait_all_tasks_blocked()
        done.wake_on_set(lot)  # moved, not woken
        await trio.testing.wait_all_tasks_blocked()
        assert woken == []
        assert not lot
        done.set()
        await trio.testing.wait_all_tasks_blocked()
        assert woken == ["a"]
        nursery.start_soon(sleeper, "b")
        await trio.testing.wait_all_tasks_blocked()
        done.wake_on_set(lot)  # set already: woken at once
        await trio.testing.wait_all_tasks_blocked()
        assert woken == ["a", "b"]
