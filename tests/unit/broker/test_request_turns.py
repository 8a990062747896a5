"""The turns of one connection's requests (futureq.request_order): effects are queued in
the order of the turns whatever order trio runs the tasks in, a request that failed
lets the next go on, and a pipeline of parked proposals is queued by the request ahead
in the same pass of the event loop."""

from __future__ import annotations

import gc

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
