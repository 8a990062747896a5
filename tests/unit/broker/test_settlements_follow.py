"""Settlements taken while a RESCHEDULE may still commit follow the entry it moves.

A real broker on a real RocksDB and SingleNodeLog; the log's writer is stopped while
requests are taken, so what commits, and in which order, is decided by the test, not
by timing. Source: ``docs/protocol.md``, "RESCHEDULE" (a settlement being committed
when the RESCHEDULE commits applies to the message where it was moved).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing
from broker_helpers import REAL_NOW_MS, RecordingOutbox, open_real_broker

from futureq.broker import manage
from futureq.broker.broker import Broker
from futureq.broker.command_log import SingleNodeLog
from futureq.broker.hub import Consumer
from futureq.state import commands
from futureq.wire import frames


async def _held_delivery(
    broker: Broker, log: SingleNodeLog, max_deliveries: int = 16
) -> tuple[int, Consumer, list[Any]]:
    """Group g of topic t, one message due, delivered to a consumer (connection 1).

    Returns ``(message id, consumer, delivery)``. The log must be running."""
    gid = await log.propose(commands.create_group("t", "g", 30_000, max_deliveries))
    mid = await log.propose(commands.publish(REAL_NOW_MS, [("t", b"x", REAL_NOW_MS, None)]))
    consumer = Consumer(broker.hub.new_subscription_id(), gid, "t", "g", 1, RecordingOutbox(), 10)
    broker.hub.add_consumer(consumer)
    broker.dispatcher.dispatch_once()
    assert isinstance(consumer.outbox, RecordingOutbox)
    [delivery] = consumer.outbox.take()
    assert delivery[1] == mid
    return mid, consumer, delivery


async def _reschedule_left_unanswered(broker: Broker, mid: int) -> None:
    """A RESCHEDULE of ``mid`` (10 s on) whose request is cancelled once its proposal
    is queued, as when its client's connection breaks; the log is stopped."""
    with trio.CancelScope() as request:
        async with trio.open_nursery() as nursery:

            async def send() -> None:
                frame = frames.Reschedule(1, "t", "g", [mid], None, 10_000)
                await manage.reschedule(broker, frame)

            nursery.start_soon(send)
            await trio.testing.wait_all_tasks_blocked()  # queued, not written
            request.cancel()
    assert broker.reschedules_in_flight == 0


async def test_an_ack_taken_after_the_rescheduling_client_left_still_acknowledges(
    tmp_path: Path,
) -> None:
    """Found by a tester: a client sent RESCHEDULE and its connection broke before the
    answer. The request was cancelled, so the leader stopped counting the RESCHEDULE
    as in flight, but its proposal was queued and committed. An ACK taken in between
    was proposed plain; applied after the RESCHEDULE it removed nothing, was answered
    OK, and the message was delivered again at its new time."""
    async with open_real_broker(tmp_path) as (broker, log):
        async with trio.open_nursery() as running:
            await running.start(log.run)
            mid, consumer, delivery = await _held_delivery(broker, log)
            running.cancel_scope.cancel()  # the writer stops: proposals wait in its queue
        await _reschedule_left_unanswered(broker, mid)
        answers: list[int] = []
        async with trio.open_nursery() as running:

            async def ack() -> None:
                answers.append(await broker.ack(1, [delivery[0]]))

            running.start_soon(ack)
            await trio.testing.wait_all_tasks_blocked()  # the ACK is queued behind it
            await running.start(log.run)
            while not answers:
                await trio.testing.wait_all_tasks_blocked()
            running.cancel_scope.cancel()
        assert answers == [1]  # before: 0 (acknowledged nothing), and answered OK
        assert broker.state.get_message(mid) is None  # before: still there, due again
        group = broker.state.find_group("t", "g")
        assert group is not None and group.pending == 0


async def test_an_unsubscribe_release_after_the_rescheduling_client_left_does_not_count(
    tmp_path: Path,
) -> None:
    """The UNSUBSCRIBE sibling: the deliveries an UNSUBSCRIBE with ``handed`` releases
    were released plain (even while a RESCHEDULE was being committed); applied after
    the RESCHEDULE moved the entry, the release applied to nothing and the unread
    delivery counted: with ``max_deliveries`` 1 the message went to the dead-letter
    topic never processed."""
    async with open_real_broker(tmp_path) as (broker, log):
        async with trio.open_nursery() as running:
            await running.start(log.run)
            mid, consumer, _delivery = await _held_delivery(broker, log, max_deliveries=1)
            running.cancel_scope.cancel()
        await _reschedule_left_unanswered(broker, mid)
        left = trio.Event()
        async with trio.open_nursery() as running:

            async def leave() -> None:
                await broker.unsubscribe_handed(consumer, [])  # it handed nothing out
                left.set()

            running.start_soon(leave)
            await trio.testing.wait_all_tasks_blocked()
            await running.start(log.run)
            await left.wait()
            running.cancel_scope.cancel()
        group = broker.state.find_group("t", "g")
        assert group is not None and group.pending == 1
        key = broker.state.entry_key(mid, group.group_id)
        assert key is not None
        entry = broker.state.get_entry(key)
        # Released: its one attempt does not count, so it is delivered again rather than
        # dead-lettered at its new time (before: released 0, out of attempts).
        assert entry is not None and (entry.attempt, entry.released) == (1, 1)
