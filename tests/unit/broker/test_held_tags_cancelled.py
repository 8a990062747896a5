"""A delivery held across a handover and then cancelled or purged: its tag answers
DELIVERY_CANCELLED, as for a delivery the leader itself handed out.

A real broker on a real RocksDB and SingleNodeLog, as in ``test_tags_across_leaders``:
the leader hands over (``hold_and_record_deliveries``); the next leadership is the same
node's dispatcher deactivated and activated again. Source: ``docs/protocol.md``,
"Delivery tags across leaders" (a CANCEL or purge ends the hold) and "A delivery whose
message was cancelled" (its tag then answers ``DELIVERY_CANCELLED``).

Found by a tester on a 3-node cluster: a group's 4 deliveries out at a
CLUSTER_TRANSFER_LEADER, CANCEL of two of them on the new leader answered DELIVERED,
then an ACK of one of their tags got UNKNOWN_DELIVERY_TAG, which clients read as "taken
back and delivered again": those messages are never delivered again. PURGE did the
same. The other removals (expiry, RESCHEDULE, REDRIVE, group delete) answer
UNKNOWN_DELIVERY_TAG for a held delivery as for any other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from broker_helpers import RecordingOutbox, open_real_broker

from futureq.broker import manage
from futureq.broker.broker import Broker
from futureq.broker.command_log import SingleNodeLog
from futureq.broker.hub import Consumer
from futureq.errors import ErrorCode, RequestError
from futureq.state import commands
from futureq.wire import frames

VISIBILITY_MS = 60_000


async def _hand_over_four(broker: Broker, log: SingleNodeLog) -> tuple[int, list[list[Any]]]:
    """Group g of topic t (visibility 60 s, max_deliveries 3); 4 messages delivered to
    a consumer of connection 1; the leader hands over and the next leadership starts
    (with no subscription of the group: the client's connection was to the old leader).
    Returns ``(group id, deliveries)``."""
    gid = await log.propose(commands.create_group("t", "g", VISIBILITY_MS, 3))
    now = broker.clock.wall_ms()
    payloads = [b"0", b"1", b"2", b"3"]
    await log.propose(commands.publish(now, [("t", p, now, None) for p in payloads]))
    consumer = Consumer(broker.hub.new_subscription_id(), gid, "t", "g", 1, RecordingOutbox(), 10)
    broker.hub.add_consumer(consumer)
    broker.dispatcher.dispatch_once()
    assert isinstance(consumer.outbox, RecordingOutbox)
    deliveries = consumer.outbox.take()
    assert [d[2] for d in deliveries] == payloads
    await broker.hold_and_record_deliveries()
    broker.dispatcher.deactivate()
    broker.dispatcher.resume()
    broker.dispatcher.activate()
    return gid, deliveries


def _load_group(broker: Broker, gid: int) -> RecordingOutbox:
    """A consumer of the group on connection 2: the next pass loads the group, and
    with it the held deliveries (out, to nobody on this node)."""
    outbox = RecordingOutbox()
    consumer = Consumer(broker.hub.new_subscription_id(), gid, "t", "g", 2, outbox, 10)
    broker.hub.add_consumer(consumer)
    broker.dispatcher.dispatch_once()
    assert outbox.take() == []  # all 4 still out
    return outbox


async def _refused(settle: Any) -> ErrorCode:
    with pytest.raises(RequestError) as refused:
        await settle
    assert refused.value.item_index == 0
    return refused.value.code


@pytest.mark.parametrize("loaded", [False, True], ids=["not-loaded", "loaded"])
async def test_a_cancelled_held_delivery_answers_delivery_cancelled(
    tmp_path: Path, loaded: bool
) -> None:
    """CANCEL of two held deliveries on the next leader: ACK, NACK, RELEASE and
    EXTEND of their tags answer DELIVERY_CANCELLED; the other two still settle.
    Before (group not loaded by a pass on the new leader): UNKNOWN_DELIVERY_TAG."""
    async with open_real_broker(tmp_path) as (broker, log):
        async with trio.open_nursery() as running:
            await running.start(log.run)
            gid, [d0, d1, d2, d3] = await _hand_over_four(broker, log)
            if loaded:
                _load_group(broker, gid)
            statuses = await manage.cancel(broker, "t", "g", [d0[1], d1[1]])
            assert statuses == [int(frames.ItemStatus.DELIVERED)] * 2
            assert await _refused(broker.ack(3, [d0[0]])) is ErrorCode.DELIVERY_CANCELLED
            assert await _refused(broker.nack(3, [d1[0]], 0)) is ErrorCode.DELIVERY_CANCELLED
            assert await _refused(broker.release(3, [d0[0]])) is ErrorCode.DELIVERY_CANCELLED
            with pytest.raises(RequestError) as extend:
                broker.extend(3, [d1[0]], 10_000)
            assert extend.value.code is ErrorCode.DELIVERY_CANCELLED
            assert await broker.ack(3, [d2[0], d3[0]]) == 2
            running.cancel_scope.cancel()
        for d in (d0, d1, d2, d3):
            assert broker.state.get_message(d[1]) is None


@pytest.mark.parametrize("loaded", [False, True], ids=["not-loaded", "loaded"])
async def test_a_purged_held_delivery_answers_delivery_cancelled(
    tmp_path: Path, loaded: bool
) -> None:
    """PURGE on the next leader: a held delivery's tag answers DELIVERY_CANCELLED
    both before the purge's chunks removed its entry and after. Before: the group not
    loaded, UNKNOWN_DELIVERY_TAG; loaded, the purge left the held deliveries out and
    an ACK of one was honoured (the purged message acked, as if nothing happened)."""
    async with open_real_broker(tmp_path) as (broker, log):
        async with trio.open_nursery() as running:
            await running.start(log.run)
            gid, [d0, d1, d2, d3] = await _hand_over_four(broker, log)
            if loaded:
                _load_group(broker, gid)
            assert await log.propose(commands.purge([gid])) == 4
            assert gid in broker.state.purging  # no chunk applied yet
            assert await _refused(broker.ack(3, [d0[0]])) is ErrorCode.DELIVERY_CANCELLED
            assert (
                await _refused(broker.nack(3, [d1[0]], 0, None, True))
                is ErrorCode.DELIVERY_CANCELLED
            )
            await log.propose(commands.purge_group(gid, 100))
            assert gid not in broker.state.purging
            for d in (d0, d1, d2, d3):
                code = await _refused(broker.ack(3, [d[0]]))
                assert code is ErrorCode.DELIVERY_CANCELLED, d[2]
            running.cancel_scope.cancel()
        dlq = broker.state.find_group("t.dlq", "default")
        assert dlq is None or dlq.pending == 0


async def test_other_removals_of_a_held_delivery_answer_as_for_any_delivery(
    tmp_path: Path,
) -> None:
    """RESCHEDULE, expiry, dead-lettering and group delete remove or move a held
    delivery as they do a delivery out on this leader: its tag then answers
    UNKNOWN_DELIVERY_TAG (not DELIVERY_CANCELLED: only CANCEL and PURGE say "do not
    process it"). A guard: these answered so before the fix too."""
    async with open_real_broker(tmp_path) as (broker, log):
        async with trio.open_nursery() as running:
            await running.start(log.run)
            gid, [d0, d1, d2, d3] = await _hand_over_four(broker, log)
            now = broker.clock.wall_ms()
            await log.propose(commands.reschedule(now, "t", gid, [d0[1]], now + 5))
            assert await _refused(broker.ack(3, [d0[0]])) is ErrorCode.UNKNOWN_DELIVERY_TAG
            key2 = commands.parse_delivery_tag(d2[0])
            key3 = commands.parse_delivery_tag(d3[0])
            assert key2 is not None and key3 is not None
            assert await log.propose(commands.expire([key2[0]])) == 1
            assert await _refused(broker.ack(3, [d2[0]])) is ErrorCode.UNKNOWN_DELIVERY_TAG
            assert await log.propose(commands.dead_letter(now, [(key3[0], 1)]))
            assert await _refused(broker.ack(3, [d3[0]])) is ErrorCode.UNKNOWN_DELIVERY_TAG
            assert await log.propose(commands.delete_group("t", "g"))
            assert await _refused(broker.ack(3, [d1[0]])) is ErrorCode.UNKNOWN_DELIVERY_TAG
            await log.propose(commands.purge_group(gid, 100))  # its entries go
            assert await _refused(broker.ack(3, [d1[0]])) is ErrorCode.UNKNOWN_DELIVERY_TAG
            running.cancel_scope.cancel()


class _SteppingClock:
    """Wall time that moves only when the test says (ms); monotonic time is trio's."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def wall_ms(self) -> int:
        return self.now_ms

    def monotonic_s(self) -> float:
        return trio.current_time()


async def test_a_held_delivery_cancelled_after_its_deadline_answers_unknown(
    tmp_path: Path,
) -> None:
    """Past its visibility deadline the held delivery was taken back (its tag dead),
    as any timed-out one: a CANCEL then finds a message no longer out, and its tag
    answers UNKNOWN_DELIVERY_TAG, as it did before the CANCEL. A guard for the
    deadline check the fix makes."""
    async with open_real_broker(tmp_path) as (broker, log):
        clock = _SteppingClock(broker.clock.wall_ms())
        broker.clock = clock
        broker.dispatcher.clock = clock
        async with trio.open_nursery() as running:
            await running.start(log.run)
            gid, [d0, *_] = await _hand_over_four(broker, log)
            clock.now_ms += VISIBILITY_MS
            assert await _refused(broker.ack(3, [d0[0]])) is ErrorCode.UNKNOWN_DELIVERY_TAG
            await manage.cancel(broker, "t", "g", [d0[1]])
            assert await _refused(broker.ack(3, [d0[0]])) is ErrorCode.UNKNOWN_DELIVERY_TAG
            assert gid in broker.state.groups
            running.cancel_scope.cancel()
