"""Delivery tags across leaderships: a delivery out when its leader hands over stays out.

A real broker on a real RocksDB and SingleNodeLog. The leader hands over
(``hold_and_record_deliveries``, as before a SIGTERM or TRANSFER_LEADER); the next
leadership is the same node's dispatcher deactivated and activated again: an empty hub,
a new tag salt, the replicated state only, as on the node that leads next. Source:
``docs/protocol.md``, "Delivery tags across leaders".

Found by a tester: an application handed a delivery by the old leader that acked it on
the new one was refused UNKNOWN_DELIVERY_TAG, the message was delivered again at once,
and with ``max_deliveries`` 1 the processed message went to the dead-letter topic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from broker_helpers import REAL_NOW_MS, RecordingOutbox, open_real_broker

from futureq.broker.broker import Broker
from futureq.broker.command_log import SingleNodeLog
from futureq.broker.handover_handed import HandedAsk
from futureq.broker.hub import Consumer
from futureq.errors import ErrorCode, RequestError
from futureq.state import commands

VISIBILITY_MS = 30_000


class SteppingClock:
    """Wall time that moves only when the test says (ms); monotonic time is trio's."""

    def __init__(self) -> None:
        self.now_ms = REAL_NOW_MS

    def wall_ms(self) -> int:
        return self.now_ms

    def monotonic_s(self) -> float:
        return trio.current_time()


def _use_clock(broker: Broker) -> SteppingClock:
    clock = SteppingClock()
    broker.clock = clock
    broker.dispatcher.clock = clock
    return clock


async def _deliver(
    broker: Broker, log: SingleNodeLog, payloads: list[bytes], max_deliveries: int
) -> tuple[int, Consumer, list[list[Any]]]:
    """Group g of topic t; ``payloads`` published, due now, delivered to a consumer on
    connection 1. Returns ``(group id, consumer, deliveries)``."""
    gid = await log.propose(commands.create_group("t", "g", VISIBILITY_MS, max_deliveries))
    now = broker.clock.wall_ms()
    await log.propose(commands.publish(now, [("t", p, now, None) for p in payloads]))
    consumer = Consumer(broker.hub.new_subscription_id(), gid, "t", "g", 1, RecordingOutbox(), 10)
    broker.hub.add_consumer(consumer)
    broker.dispatcher.dispatch_once()
    assert isinstance(consumer.outbox, RecordingOutbox)
    deliveries = consumer.outbox.take()
    assert [d[2] for d in deliveries] == payloads
    return gid, consumer, deliveries


def _next_leadership(broker: Broker) -> None:
    """The leader handed over; the next leadership starts from the replicated state."""
    broker.dispatcher.deactivate()
    broker.dispatcher.resume()
    broker.dispatcher.activate()


def _subscribe(broker: Broker, gid: int, connection_id: int) -> RecordingOutbox:
    outbox = RecordingOutbox()
    consumer = Consumer(broker.hub.new_subscription_id(), gid, "t", "g", connection_id, outbox, 10)
    broker.hub.add_consumer(consumer)
    broker.dispatcher.dispatch_once()
    return outbox


async def _push_redeliveries(broker: Broker, log: SingleNodeLog) -> None:
    """A pass, then what it staged (redeliveries: their DELIVERED commits first)
    pushed, as the dispatcher's recorder task does."""
    broker.dispatcher.dispatch_once()
    command, batches = broker.dispatcher.take_staged()
    if command is not None:
        await log.propose(command)
    broker.dispatcher.push_staged(batches)


def _dead_letters(broker: Broker) -> int:
    dlq = broker.state.find_group("t.dlq", "default")
    return 0 if dlq is None else dlq.pending


async def test_an_ack_on_the_next_leader_within_the_visibility_timeout_is_honoured(
    tmp_path: Path,
) -> None:
    """max_deliveries 1: the delivery the application holds is neither delivered again
    nor dead-lettered by the next leader, and its ACK there (from another connection:
    the client reconnected) settles it. Before: the next leader dead-lettered it at once
    and refused the ACK (UNKNOWN_DELIVERY_TAG)."""
    async with open_real_broker(tmp_path) as (broker, log):
        async with trio.open_nursery() as running:
            await running.start(log.run)
            gid, _consumer, [delivery] = await _deliver(broker, log, [b"x"], max_deliveries=1)
            await broker.hold_and_record_deliveries()
            _next_leadership(broker)
            other = _subscribe(broker, gid, connection_id=2)
            assert other.take() == []  # still out: invisible to the group
            await trio.testing.wait_all_tasks_blocked()
            assert _dead_letters(broker) == 0
            assert await broker.ack(3, [delivery[0]]) == 1
            broker.dispatcher.dispatch_once()
            await trio.testing.wait_all_tasks_blocked()
            running.cancel_scope.cancel()
        assert broker.state.get_message(delivery[1]) is None
        assert other.take() == []
        assert _dead_letters(broker) == 0


async def test_an_ack_before_any_dispatch_pass_of_the_next_leader_is_honoured(
    tmp_path: Path,
) -> None:
    """A new leader loads its groups over its first passes; an ACK that comes first
    (the client reconnected at once) finds the delivery in the replicated state."""
    async with open_real_broker(tmp_path) as (broker, log):
        async with trio.open_nursery() as running:
            await running.start(log.run)
            _gid, _consumer, [delivery] = await _deliver(broker, log, [b"x"], max_deliveries=1)
            await broker.hold_and_record_deliveries()
            _next_leadership(broker)
            assert await broker.ack(2, [delivery[0]]) == 1
            running.cancel_scope.cancel()
        assert broker.state.get_message(delivery[1]) is None
        assert _dead_letters(broker) == 0


async def test_a_settled_or_superseded_tag_is_refused_on_the_next_leader(
    tmp_path: Path,
) -> None:
    """The rule's other half: the old tag settles the delivery once, and never one of
    a later attempt. A NACK of it is honoured (the message is due again, counted); the
    same tag again is refused, and so is it once the message went out again (attempt 2,
    to another consumer, whose own tag works)."""
    async with open_real_broker(tmp_path) as (broker, log):
        async with trio.open_nursery() as running:
            await running.start(log.run)
            gid, _consumer, [a, b] = await _deliver(broker, log, [b"a", b"b"], max_deliveries=5)
            await broker.hold_and_record_deliveries()
            _next_leadership(broker)
            other = _subscribe(broker, gid, connection_id=2)
            assert other.take() == []
            assert await broker.nack(3, [a[0]], 0) == 1
            with pytest.raises(RequestError) as refused:
                await broker.ack(3, [a[0]])  # settled already
            assert refused.value.code is ErrorCode.UNKNOWN_DELIVERY_TAG
            await _push_redeliveries(broker, log)
            [again] = other.take()
            assert (again[1], again[5]) == (a[1], 2)
            with pytest.raises(RequestError) as stale:
                await broker.ack(2, [a[0]])  # an earlier attempt's tag
            assert stale.value.code is ErrorCode.UNKNOWN_DELIVERY_TAG
            # The one still held: its tag from the old leader is honoured, a tag of the
            # same key with another stamp is not.
            forged = b[0][:-4] + ((int.from_bytes(b[0][-4:], "big") + 1) % 2**32).to_bytes(4, "big")
            with pytest.raises(RequestError) as wrong:
                await broker.ack(3, [forged])
            assert wrong.value.code is ErrorCode.UNKNOWN_DELIVERY_TAG
            assert await broker.ack(2, [again[0], b[0]]) == 2
            running.cancel_scope.cancel()
        assert broker.state.get_message(a[1]) is None
        assert broker.state.get_message(b[1]) is None


async def test_a_delivery_left_out_comes_back_counted_at_its_deadline(tmp_path: Path) -> None:
    """Not settled by its visibility deadline (EXTENDs included, as the old leader
    knew it): it comes back then, its attempt counted, and not a moment before; its
    tag is dead from then on."""
    async with open_real_broker(tmp_path) as (broker, log):
        clock = _use_clock(broker)
        async with trio.open_nursery() as running:
            await running.start(log.run)
            gid, _consumer, [delivery] = await _deliver(broker, log, [b"x"], max_deliveries=2)
            clock.now_ms += 1_000
            assert broker.extend(1, [delivery[0]], 60_000) == 1  # deadline: now + 60 s
            await broker.hold_and_record_deliveries()
            _next_leadership(broker)
            other = _subscribe(broker, gid, connection_id=2)
            clock.now_ms += 59_999
            await _push_redeliveries(broker, log)
            assert other.take() == []  # before: delivered again at once (attempt 2)
            clock.now_ms += 1
            await _push_redeliveries(broker, log)
            [again] = other.take()
            assert (again[1], again[5]) == (delivery[1], 2)
            with pytest.raises(RequestError) as late:
                await broker.ack(3, [delivery[0]])
            assert late.value.code is ErrorCode.UNKNOWN_DELIVERY_TAG
            running.cancel_scope.cancel()


async def test_a_hold_is_kept_across_a_second_handover(tmp_path: Path) -> None:
    """Two transfers in a row before the application acks: the second leader hands
    the delivery it kept out over again, with the same tag and deadline."""
    async with open_real_broker(tmp_path) as (broker, log):
        async with trio.open_nursery() as running:
            await running.start(log.run)
            gid, _consumer, [delivery] = await _deliver(broker, log, [b"x"], max_deliveries=1)
            await broker.hold_and_record_deliveries()
            _next_leadership(broker)
            other = _subscribe(broker, gid, connection_id=2)
            await broker.hold_and_record_deliveries()
            _next_leadership(broker)
            other = _subscribe(broker, gid, connection_id=3)
            assert other.take() == []
            assert await broker.ack(4, [delivery[0]]) == 1
            running.cancel_scope.cancel()
        assert broker.state.get_message(delivery[1]) is None
        assert _dead_letters(broker) == 0


async def test_a_held_delivery_is_settled_only_by_a_client_that_may_consume_its_topic(
    tmp_path: Path,
) -> None:
    """Any connection may settle a delivery an earlier leader handed over (the client
    reconnected), so the tag alone must not let a client settle a topic it may not
    consume from: the connection's check refuses it, naming the tag."""
    async with open_real_broker(tmp_path) as (broker, log):
        async with trio.open_nursery() as running:
            await running.start(log.run)
            _gid, _consumer, [delivery] = await _deliver(broker, log, [b"x"], max_deliveries=1)
            await broker.hold_and_record_deliveries()
            _next_leadership(broker)
            asked: list[tuple[str, str]] = []

            def deny(topic: str, group: str) -> None:
                asked.append((topic, group))
                raise RequestError(ErrorCode.PERMISSION_DENIED, f"may not consume from {topic}")

            for settle in (
                broker.ack(2, [delivery[0]], deny),
                broker.nack(2, [delivery[0]], 0, may_settle=deny),
                broker.release(2, [delivery[0]], deny),
            ):
                with pytest.raises(RequestError) as refused:
                    await settle
                assert (refused.value.code, refused.value.item_index) == (
                    ErrorCode.PERMISSION_DENIED,
                    0,
                )
            with pytest.raises(RequestError) as refused:
                broker.extend(2, [delivery[0]], 60_000, deny)
            assert refused.value.code is ErrorCode.PERMISSION_DENIED
            assert asked == [("t", "g")] * 4

            def allow(topic: str, group: str) -> None:
                pass

            assert await broker.ack(2, [delivery[0]], allow) == 1
            running.cancel_scope.cancel()


async def test_a_handed_delivery_stays_settleable_when_the_transfer_fails(
    tmp_path: Path,
) -> None:
    """The handover recorded the delivery the application held (its subscription ended
    with the HANDOVER answer), then the transfer failed and this node leads on: the
    client, reconnected, settles it from its new connection (before: FOREIGN_DELIVERY_TAG,
    and with max_deliveries 1 it went to the dead-letter topic at its deadline)."""
    async with open_real_broker(tmp_path) as (broker, log):
        async with trio.open_nursery() as running:
            await running.start(log.run)
            _gid, consumer, [delivery] = await _deliver(broker, log, [b"x"], max_deliveries=1)
            # The answer to HANDOVER: the application holds it.
            broker.handed_ask = HandedAsk({consumer.subscription_id})
            await broker.unsubscribe_handed(consumer, [delivery[0]])
            broker.handed_ask = None
            await broker.hold_and_record_deliveries()
            broker.dispatcher.resume()  # the transfer failed: still the leader
            assert await broker.ack(2, [delivery[0]]) == 1
            running.cancel_scope.cancel()
        assert broker.state.get_message(delivery[1]) is None
