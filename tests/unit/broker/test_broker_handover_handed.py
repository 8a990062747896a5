"""A leader handing over asks its version 4 subscriptions what was handed (HANDOVER):
only that counts (``docs/protocol.md``, HANDOVER). A real RocksDB in ``tmp_path`` and a
real SingleNodeLog; the client's answer is the UNSUBSCRIBE it sends.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing
from broker_helpers import REAL_NOW_MS, RecordingOutbox, open_real_broker

from futureq.broker import handover_handed
from futureq.broker.broker import Broker
from futureq.broker.command_log import SingleNodeLog
from futureq.broker.hub import Consumer
from futureq.state import commands
from futureq.wire import frames


async def test_only_the_handed_deliveries_count_and_stay_settleable(tmp_path: Path) -> None:
    async with open_real_broker(tmp_path) as (broker, log):
        hub, dispatcher = broker.hub, broker.dispatcher
        async with trio.open_nursery() as running:
            await running.start(log.run)
            gid = await log.propose(commands.create_group("t", "g", None, 1))
            await log.propose(
                commands.publish(
                    REAL_NOW_MS, [("t", b"%d" % i, REAL_NOW_MS, None) for i in range(4)]
                )
            )
            outbox = RecordingOutbox()
            consumer = Consumer(hub.new_subscription_id(), gid, "t", "g", 1, outbox, 4)
            consumer.asks_handed = True
            hub.add_consumer(consumer)
            dispatcher.dispatch_once()
            tags = [d[0] for frame in outbox.frames for d in frame.deliveries]
            assert len(tags) == 4
            keys = {tag: hub.find_tags([tag], 1)[0].key for tag in tags}
            handed, unread = tags[:2], tags[2:]

            async def answer() -> None:
                await trio.testing.wait_all_tasks_blocked()
                assert outbox.pushes[-1] == frames.Handover(0, consumer.subscription_id)
                await broker.unsubscribe_handed(consumer, handed)

            with trio.fail_after(5):
                async with trio.open_nursery() as handing_over:
                    handing_over.start_soon(answer)
                    await broker.hold_and_record_deliveries()
            state = broker.state
            # Unread: released (due again, not counted); handed: counted attempts.
            assert [state.get_schedule_entry(keys[t]) for t in unread] == [(1, None, 1)] * 2
            assert [state.get_schedule_entry(keys[t]) for t in handed] == [(1, None, 0)] * 2
            # The application may still settle what it holds while this node leads.
            assert await broker.ack(1, handed[:1]) == 1
            assert state.get_schedule_entry(keys[handed[0]]) is None
            running.cancel_scope.cancel()


async def _one_delivery_out_to_a_v4_subscription(
    broker: Broker, log: SingleNodeLog
) -> tuple[Consumer, RecordingOutbox, bytes]:
    """Publish one message to ``t`` and push it to a new subscription of group ``g``
    whose connection speaks version 4: the subscription, its outbox and the
    delivery's schedule key."""
    hub = broker.hub
    gid = await log.propose(commands.create_group("t", "g", None, 1))
    await log.propose(commands.publish(REAL_NOW_MS, [("t", b"m", REAL_NOW_MS, None)]))
    outbox = RecordingOutbox()
    asked = Consumer(hub.new_subscription_id(), gid, "t", "g", 1, outbox, 1)
    asked.asks_handed = True
    hub.add_consumer(asked)
    broker.dispatcher.dispatch_once()
    [[tag, *_]] = outbox.frames[0].deliveries
    return asked, outbox, hub.find_tags([tag], 1)[0].key


async def test_a_subscription_that_does_not_answer_is_waited_for_a_bounded_time(
    tmp_path: Path,
) -> None:
    async with open_real_broker(tmp_path) as (broker, log):
        async with trio.open_nursery() as running:
            await running.start(log.run)
            asked, outbox, key = await _one_delivery_out_to_a_v4_subscription(broker, log)
            started = trio.current_time()
            with trio.fail_after(5):
                await broker.hold_and_record_deliveries()
            waited = trio.current_time() - started
            assert waited >= handover_handed.HANDED_WAIT_S  # then it went on
            # Not answered: it counts, as before version 4.
            assert broker.state.get_schedule_entry(key) == (1, None, 0)
            assert broker.hub.in_flight[key].recorded
            running.cancel_scope.cancel()


async def test_a_subscription_whose_connection_closes_is_not_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The leader waited the whole bound for a client that had gone (found by a tester):
    # with the bound at 60 s, the handover must still end at once.
    monkeypatch.setattr(handover_handed, "HANDED_WAIT_S", 60.0)
    async with open_real_broker(tmp_path) as (broker, log):
        async with trio.open_nursery() as running:
            await running.start(log.run)
            asked, outbox, key = await _one_delivery_out_to_a_v4_subscription(broker, log)

            async def connection_closes() -> None:
                await trio.testing.wait_all_tasks_blocked()
                assert outbox.pushes[-1] == frames.Handover(0, asked.subscription_id)
                broker.subscription_lost(asked)

            with trio.fail_after(10):
                async with trio.open_nursery() as handing_over:
                    handing_over.start_soon(connection_closes)
                    await broker.hold_and_record_deliveries()
            # Gone without an answer: it counts, as before version 4.
            assert broker.state.get_schedule_entry(key) == (1, None, 0)
            running.cancel_scope.cancel()
