"""Settlements taken while a RESCHEDULE or a REDRIVE of their message may still commit.

A settlement taken while a RESCHEDULE may commit first follows the entry it moves; one
taken while a REDRIVE of its dead letter may commit first waits for it. A real broker on a real RocksDB and SingleNodeLog; the log's writer is stopped while
requests are taken, so what commits, and in which order, is decided by the test, not
by timing. Source: ``docs/protocol.md``, "RESCHEDULE" (a settlement being committed
when the RESCHEDULE commits applies to the message where it was moved), "REDRIVE".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from broker_helpers import REAL_NOW_MS, RecordingOutbox, open_real_broker

from futureq.broker import manage
from futureq.broker.broker import Broker
from futureq.broker.command_log import SingleNodeLog
from futureq.broker.hub import Consumer
from futureq.errors import ErrorCode, RequestError
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


async def _held_dead_letter(broker: Broker, log: SingleNodeLog) -> tuple[int, list[Any]]:
    """A dead letter of t (NACKed with ``dead_letter``) in t.dlq's default group,
    delivered to a consumer there (connection 2). Returns ``(its id, delivery)``."""
    _mid, _consumer, delivery = await _held_delivery(broker, log)
    assert await broker.nack(1, [delivery[0]], 0, "bad", dead_letter=True) == 1
    dlq = broker.state.find_group("t.dlq", "default")
    assert dlq is not None and dlq.pending == 1
    outbox = RecordingOutbox()
    broker.hub.add_consumer(
        Consumer(broker.hub.new_subscription_id(), dlq.group_id, "t.dlq", "default", 2, outbox, 10)
    )
    broker.dispatcher.dispatch_once()
    [letter] = outbox.take()
    return letter[1], letter


@pytest.mark.parametrize("settle", ["ack", "nack", "release"])
@pytest.mark.parametrize("unanswered", [False, True])
async def test_a_settlement_of_a_dead_letter_taken_while_it_is_redriven_is_refused(
    tmp_path: Path, settle: str, unanswered: bool
) -> None:
    """Found by a tester: an ACK of a dead letter taken while a REDRIVE of it was being
    committed was proposed after it and answered OK, though it acknowledged nothing:
    the dead letter was replayed to its topic all the same. The settlement now waits
    for the REDRIVE (for a REDRIVE whose client left, for a NOOP behind it) and is
    refused UNKNOWN_DELIVERY_TAG, as any settlement of a delivery taken back."""
    async with open_real_broker(tmp_path) as (broker, log):
        async with trio.open_nursery() as running:
            await running.start(log.run)
            letter_id, letter = await _held_dead_letter(broker, log)
            running.cancel_scope.cancel()  # proposals wait in the writer's queue
        redriven: list[list[int]] = []
        refused: list[RequestError] = []
        async with trio.open_nursery() as running:

            async def redrive() -> None:
                frame = frames.Redrive(1, "t", None, [letter_id], 0)
                redriven.append(await manage.redrive(broker, frame))

            async def settle_it() -> None:
                tags = [letter[0]]
                with pytest.raises(RequestError) as caught:
                    if settle == "ack":
                        await broker.ack(2, tags)
                    elif settle == "nack":
                        await broker.nack(2, tags, 0)
                    else:
                        await broker.release(2, tags)
                refused.append(caught.value)

            if unanswered:
                with trio.CancelScope() as request:
                    async with trio.open_nursery() as requests:
                        requests.start_soon(redrive)
                        await trio.testing.wait_all_tasks_blocked()  # queued, not written
                        request.cancel()  # its connection broke
                assert broker.redrives_unanswered
            else:
                running.start_soon(redrive)
                await trio.testing.wait_all_tasks_blocked()  # queued, not written
            running.start_soon(settle_it)
            await trio.testing.wait_all_tasks_blocked()
            await running.start(log.run)
            while not refused:
                await trio.testing.wait_all_tasks_blocked()
            running.cancel_scope.cancel()
        # Before: the settlement was answered OK (result 0) and the message replayed.
        assert [error.code for error in refused] == [ErrorCode.UNKNOWN_DELIVERY_TAG]
        assert redriven == ([] if unanswered else [[frames.ItemStatus.DONE]])
        group = broker.state.find_group("t", "g")
        assert group is not None and group.pending == 1  # redriven: due in t again
        dlq = broker.state.find_group("t.dlq", "default")
        assert dlq is not None and dlq.pending == 0
        assert not broker.redriving and not broker.redrives_unanswered


async def test_an_ack_taken_before_a_redrive_of_its_dead_letter_wins(tmp_path: Path) -> None:
    """The other order: an ACK proposed first applies first; the REDRIVE answers
    UNKNOWN and nothing is replayed."""
    async with open_real_broker(tmp_path) as (broker, log):
        async with trio.open_nursery() as running:
            await running.start(log.run)
            letter_id, letter = await _held_dead_letter(broker, log)
            running.cancel_scope.cancel()
        answers: dict[str, Any] = {}
        async with trio.open_nursery() as running:

            async def ack() -> None:
                answers["ack"] = await broker.ack(2, [letter[0]])

            async def redrive() -> None:
                frame = frames.Redrive(1, "t", None, [letter_id], 0)
                answers["redrive"] = await manage.redrive(broker, frame)

            running.start_soon(ack)
            await trio.testing.wait_all_tasks_blocked()
            running.start_soon(redrive)
            await trio.testing.wait_all_tasks_blocked()
            await running.start(log.run)
            while len(answers) < 2:
                await trio.testing.wait_all_tasks_blocked()
            running.cancel_scope.cancel()
        assert answers == {"ack": 1, "redrive": [frames.ItemStatus.UNKNOWN]}
        group = broker.state.find_group("t", "g")
        assert group is not None and group.pending == 0
