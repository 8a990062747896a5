"""The node's bound on deliveries out (``limits.max_deliveries_out``) on a real broker.

A real RocksDB in ``tmp_path`` and a real SingleNodeLog; passes are driven one at a
time. Before, every consumer got what its credit allowed, whatever the node held out:
memory for deliveries out had no bound (~500 bytes each).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio
from broker_helpers import REAL_NOW_MS, RecordingOutbox, open_real_broker

from futureq.broker import dispatch_pass, dispatch_tasks
from futureq.broker.broker import Broker
from futureq.broker.command_log import SingleNodeLog
from futureq.broker.hub import Consumer
from futureq.broker.overview import ActivityHistory, build_overview
from futureq.config import Config
from futureq.state import commands
from futureq.wire.validation import MAX_CREDIT


async def test_at_the_bound_nothing_more_goes_out_until_a_settlement_wakes_the_dispatcher(
    tmp_path: Path,
) -> None:
    config = Config()
    config = attrs.evolve(config, limits=attrs.evolve(config.limits, max_deliveries_out=5))
    async with open_real_broker(tmp_path, config) as (broker, log):
        hub, dispatcher = broker.hub, broker.dispatcher
        async with trio.open_nursery() as running:
            await running.start(log.run)
            gid = await log.propose(commands.create_group("t", "g", None, None))
            items = [("t", f"m{n}".encode(), REAL_NOW_MS, None) for n in range(20)]
            await log.propose(commands.publish(REAL_NOW_MS, items))
            outboxes = [RecordingOutbox(), RecordingOutbox()]
            for connection_id, outbox in enumerate(outboxes, 1):
                hub.add_consumer(
                    Consumer(hub.new_subscription_id(), gid, "t", "g", connection_id, outbox, 10)
                )
            for _ in range(3):
                next_ms = dispatcher.dispatch_once()
            got = [outbox.take() for outbox in outboxes]
            assert sum(map(len, got)) == 5, [len(g) for g in got]  # before: 20
            assert len(hub.in_flight) == 5 and hub.held_back
            # Held back, the pass plans no early look (no busy loop): the next visibility
            # deadline, not now.
            assert math.isinf(next_ms) or next_ms > REAL_NOW_MS
            assert broker.metrics.deliveries_held_back_total._value.get() >= 1
            # The dashboard says so (before, only /metrics and a log line did).
            history = ActivityHistory(broker.metrics)
            alarms = build_overview(broker, history)["alarms"]
            assert [a["name"] for a in alarms] == ["DELIVERIES_HELD_BACK"], alarms
            assert alarms[0]["text"].startswith("5 deliveries are out"), alarms

            # An ACK (no CREDIT follows here) frees room and wakes the dispatcher.
            dispatcher._wake = trio.Event()
            owner = 1 if got[0] else 2
            tags = [delivery[0] for delivery in got[owner - 1][:2]]
            assert await broker.ack(owner, tags) == 2
            assert dispatcher._wake.is_set() and not hub.held_back
            assert build_overview(broker, history)["alarms"] == []
            dispatcher.dispatch_once()
            assert sum(len(outbox.take()) for outbox in outboxes) == 2
            assert len(hub.in_flight) == 5
            running.cancel_scope.cancel()


async def test_credit_without_settling_does_not_take_a_connection_past_its_limit(
    tmp_path: Path,
) -> None:
    """CREDIT adds credit whether or not anything was settled (so does a pull-mode
    client that fetches without settling): before, one connection could so take every
    delivery the node may have out, whatever its prefetch."""
    config = Config()
    limits = attrs.evolve(config.limits, max_prefetch=10, max_prefetch_per_connection=10)
    config = attrs.evolve(config, limits=limits)
    async with open_real_broker(tmp_path, config) as (broker, log):
        hub, dispatcher = broker.hub, broker.dispatcher
        async with trio.open_nursery() as running:
            await running.start(log.run)
            gid = await log.propose(commands.create_group("t", "g", None, None))
            items = [("t", f"m{n}".encode(), REAL_NOW_MS, None) for n in range(40)]
            await log.propose(commands.publish(REAL_NOW_MS, items))
            mine, other = RecordingOutbox(), RecordingOutbox()
            subscriptions = []
            for connection_id, outbox, credit in ((1, mine, 10), (1, mine, 10), (2, other, 5)):
                consumer = Consumer(
                    hub.new_subscription_id(), gid, "t", "g", connection_id, outbox, credit
                )
                hub.add_consumer(consumer)
                subscriptions.append(consumer.subscription_id)

            def passes() -> None:
                for _ in range(4):
                    dispatcher.dispatch_once()

            passes()
            held = mine.take()
            assert len(held) == 10 and len(other.take()) == 5
            hub.grant_credit(subscriptions[0], 1, 10, MAX_CREDIT)  # no settlement
            passes()
            assert mine.take() == []  # before: 10 more
            assert hub.out_by_connection == {1: 10, 2: 5}
            for _ in range(3):  # CREDIT while capped: the consumer is remembered once
                hub.grant_credit(subscriptions[1], 1, 1, MAX_CREDIT)
                passes()
            assert [len(skipped) for skipped in hub.capped.values()] == [2]

            dispatcher._wake = trio.Event()
            assert await broker.ack(1, [delivery[0] for delivery in held[:3]]) == 3
            assert dispatcher._wake.is_set()  # the connection's consumers were woken
            passes()
            assert len(mine.take()) == 3
            assert hub.out_by_connection == {1: 10, 2: 5}
            running.cancel_scope.cancel()


@attrs.define
class _MovingClock:
    """Wall time the test moves; monotonic time is trio's."""

    now_ms: int = REAL_NOW_MS

    def wall_ms(self) -> int:
        return self.now_ms

    def monotonic_s(self) -> float:
        return trio.current_time()


@attrs.define
class _HeldBack:
    """A real broker held back at ``max_deliveries_out`` 2 (:func:`_held_back_node`)."""

    broker: Broker
    log: SingleNodeLog
    clock: _MovingClock
    gid: int
    outbox: RecordingOutbox


@asynccontextmanager
async def _held_back_node(tmp_path: Path) -> AsyncIterator[_HeldBack]:
    """A broker with ``limits.max_deliveries_out`` 2, its log and the proposer running
    (it commits EXPIRE) and its clock in the test's hands; group g of topic t has 3
    messages due and a consumer (connection 3, credit 10) holding 2 of them, so the node
    is held back."""
    config = Config()
    config = attrs.evolve(config, limits=attrs.evolve(config.limits, max_deliveries_out=2))
    async with open_real_broker(tmp_path, config) as (broker, log):
        hub, dispatcher = broker.hub, broker.dispatcher
        clock = _MovingClock()
        dispatcher.clock = clock
        async with trio.open_nursery() as running:
            await running.start(log.run)
            running.start_soon(dispatch_tasks.proposer, dispatcher)
            gid = await log.propose(commands.create_group("t", "g", None, None))
            held = [("t", b"held%d" % n, REAL_NOW_MS, None) for n in range(3)]
            await log.propose(commands.publish(REAL_NOW_MS, held))
            outbox = RecordingOutbox()
            hub.add_consumer(Consumer(hub.new_subscription_id(), gid, "t", "g", 3, outbox, 10))
            for _ in range(3):
                dispatcher.dispatch_once()
            assert len(outbox.take()) == 2 and hub.held_back
            yield _HeldBack(broker, log, clock, gid, outbox)
            running.cancel_scope.cancel()


async def test_what_expires_while_the_node_is_held_back_is_removed(tmp_path: Path) -> None:
    """Found by a tester: at ``limits.max_deliveries_out`` a pass looked at no group, so
    messages whose TTL ran out stayed pending (and in a ``dead_letter_expired`` group
    reached the dead-letter topic late) until consumers settled something."""
    async with _held_back_node(tmp_path) as node:
        broker, log, clock, gid = node.broker, node.log, node.clock, node.gid
        hub, dispatcher = broker.hub, broker.dispatcher
        other = await log.propose(commands.create_group("u", "g", None, None))
        hub.add_consumer(Consumer(hub.new_subscription_id(), other, "u", "g", 3, node.outbox, 10))
        # Due now, expiring in 1 s and 2 s, in both groups; then held back.
        expiring = [("t", b"a", REAL_NOW_MS, 1000), ("t", b"b", REAL_NOW_MS, 2000)]
        await log.propose(commands.publish(REAL_NOW_MS, expiring))
        await log.propose(commands.publish(REAL_NOW_MS, [("u", b"c", REAL_NOW_MS, 1000)]))
        next_ms = dispatcher.dispatch_once()
        assert hub.held_back and next_ms == REAL_NOW_MS + 1000  # no busy loop
        clock.now_ms = REAL_NOW_MS + 1000
        assert dispatcher.dispatch_once() == REAL_NOW_MS + 2000
        with trio.fail_after(5):
            await dispatcher._proposals_idle.wait()  # the EXPIRE committed
        assert (broker.state.groups[gid].pending, broker.state.groups[other].pending) == (4, 0)
        clock.now_ms = REAL_NOW_MS + 2000
        dispatcher.dispatch_once()
        with trio.fail_after(5):
            await dispatcher._proposals_idle.wait()
        assert broker.state.groups[gid].pending == 3
        assert node.outbox.take() == [] and hub.held_back  # the two held are still out


async def test_what_is_published_during_a_held_back_round_still_expires_on_time(
    tmp_path: Path,
) -> None:
    """Found by a tester: a held-back node looks at its groups for expiry in rounds of
    several passes (256 groups a pass). A message with a TTL published during a round
    to a group with consumers the round had already looked at was not counted in the
    round's earliest expiry, and nothing else planned a pass for it: it stayed pending
    past its expiry until something else woke the dispatcher."""
    async with _held_back_node(tmp_path) as node:
        broker, log, clock, outbox = node.broker, node.log, node.clock, node.outbox
        hub, dispatcher = broker.hub, broker.dispatcher
        topic_of: dict[int, str] = {}
        for n in range(300):
            group = await log.propose(commands.create_group(f"w{n}", "g", None, None))
            topic_of[group] = f"w{n}"
            hub.add_consumer(
                Consumer(hub.new_subscription_id(), group, f"w{n}", "g", 1, outbox, 10)
            )
        waiting = [(topic, b"w", REAL_NOW_MS, None) for topic in topic_of.values()]
        await log.propose(commands.publish(REAL_NOW_MS, waiting))
        assert dispatcher.dispatch_once() == REAL_NOW_MS + dispatch_pass.HELD_BACK_SCAN_MS
        looked = [group for group in topic_of if group not in dispatcher._held_back_scan]
        assert looked  # the round's first pass looked at these
        expiring = [(topic_of[group], b"x", REAL_NOW_MS, 1000) for group in looked]
        await log.propose(commands.publish(REAL_NOW_MS, expiring))
        while dispatcher._held_back_scan:
            next_ms = dispatcher.dispatch_once()
        assert hub.held_back and next_ms == REAL_NOW_MS + 1000
        clock.now_ms = REAL_NOW_MS + 1000
        while dispatcher.dispatch_once() <= clock.now_ms or dispatcher._held_back_scan:
            pass
        with trio.fail_after(5):
            await dispatcher._proposals_idle.wait()  # the EXPIRE committed
        assert [broker.state.groups[group].pending for group in looked] == [1] * len(looked)
        assert outbox.take() == [] and hub.held_back


@attrs.define
class _SlowDiskClock(_MovingClock):
    """Each look at the monotonic clock finds a second passed: every group a pass
    loads looks like a slow disk read."""

    monotonic_now_s: float = 0.0

    def monotonic_s(self) -> float:
        self.monotonic_now_s += 1.0
        return self.monotonic_now_s


async def test_a_held_back_pass_stops_looking_at_groups_once_its_time_is_spent(
    tmp_path: Path,
) -> None:
    """Found by a tester: a node held back just after it took leadership looked at 256
    groups for expiry in one pass, loading each one's entries from disk: with 2,000
    entries in each of 300 groups the pass held the event loop 1.4 s, past a
    cluster's election timeout (0.5 s). A held-back pass now keeps to the pass's time
    budget, as a pass that hands out does, and the round goes on after a yield."""
    async with _held_back_node(tmp_path) as node:
        log, hub, dispatcher = node.log, node.broker.hub, node.broker.dispatcher
        for n in range(20):
            await log.propose(commands.create_group(f"w{n}", "g", None, None))
        waiting = [(f"w{n}", b"w", REAL_NOW_MS, 1000) for n in range(20)]
        await log.propose(commands.publish(REAL_NOW_MS, waiting))
        dispatcher.clock = _SlowDiskClock()
        assert dispatcher.dispatch_once() == REAL_NOW_MS + dispatch_pass.HELD_BACK_SCAN_MS
        assert len(dispatcher._held_back_scan) >= 19  # one look, then the budget ran out
        passes = 1
        while dispatcher._held_back_scan:
            next_ms = dispatcher.dispatch_once()
            passes += 1
        assert passes >= 20 and next_ms == REAL_NOW_MS + 1000 and hub.held_back
