"""Due-time histograms behind BROWSE_COUNTS (:mod:`futureq.broker.due_counts`) against a
brute-force count of the store, while commands are applied in steps meanwhile.

The observer is a real (follower, inactive) Dispatcher over a real QueueState, fed by
``apply_in_steps`` exactly as on a node; commands cover every path that adds, moves or
removes a schedule entry (publish, cancel, reschedule, ack, nack, release, delivered,
expire, dead letter and parking, redrive, purge, backfill, group delete, snapshot
restore). A checker task builds and rebuilds histograms concurrently (small chunks so
builds span many applies) and compares them with the store whenever it may read.
Source: ``docs/protocol.md``, "BROWSE_COUNTS"; ``docs/architecture.md``.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
from broker_helpers import FakeClock, SyncLog

from futureq.broker import due_counts as due_counts_module
from futureq.broker import manage
from futureq.broker.command_log import apply_in_steps
from futureq.broker.dispatcher import Dispatcher
from futureq.broker.due_counts import MINUTE_MS, DueCounts, DueHistogram
from futureq.broker.hub import Hub
from futureq.config import QueueSection
from futureq.state import commands
from futureq.state.queue_state import QueueState
from futureq.state.records import PARKED_DUE_MS
from futureq.state.store import MemoryStore, StateStore
from futureq.storage.db import Database
from futureq.wire import frames

BASE_MS = 1_800_000_000_000
DAY_MS = 86_400_000


def brute_minutes(store: StateStore, gid: int) -> Counter[int]:
    """The group's entries per minute of due time, parked ones left out (a full scan)."""
    stop = commands.schedule_key(gid, PARKED_DUE_MS, 0)
    return Counter(
        commands.parse_schedule_key(key)[1] // MINUTE_MS
        for key in store.scan_keys("schedule", commands.schedule_key(gid, 0, 0), stop)
    )


def brute_below(store: StateStore, gid: int, bound_ms: int) -> int:
    start = commands.schedule_key(gid, 0, 0)
    return sum(
        1 for _ in store.scan_keys("schedule", start, commands.schedule_key(gid, bound_ms, 0))
    )


def keys_of(state: QueueState, gid: int, parked: bool = False) -> list[bytes]:
    stop = (gid + 1).to_bytes(4, "big")
    found = list(state.store.scan_keys("schedule", gid.to_bytes(4, "big"), stop))
    if parked:
        return found
    return [k for k in found if commands.parse_schedule_key(k)[1] != PARKED_DUE_MS]


class World:
    """A state, its observer (an inactive Dispatcher) and random commands."""

    def __init__(self, store: StateStore, seed: int) -> None:
        self.state = QueueState(store)
        self.rng = random.Random(seed)
        self.clock = FakeClock(BASE_MS)
        self.dispatcher = Dispatcher(
            self.state, SyncLog(self.state), Hub(), self.clock, QueueSection(), active=False
        )
        self.state.observer = self.dispatcher
        self.due_counts: DueCounts = self.dispatcher.due_counts
        self.snapshot: tuple[bytes, int] | None = None
        self.checks = 0

    async def apply(self, data: bytes) -> Any:
        return await apply_in_steps(self.state, self.state.applied_index + 1, data)

    def gid(self, topic: str, name: str) -> int | None:
        info = self.state.find_group(topic, name)
        return None if info is None else info.group_id

    def live_groups(self) -> list[int]:
        return sorted(self.state.groups)

    def due(self) -> int:
        # Over three days, so minutes, hours and days of the histogram all matter; a
        # quarter in one busy minute, so edge scans have work.
        if self.rng.random() < 0.25:
            return BASE_MS + 5 * MINUTE_MS + self.rng.randrange(MINUTE_MS)
        return BASE_MS + self.rng.randrange(3 * DAY_MS)

    def sample(self, keys: list[bytes], most: int) -> list[bytes]:
        return self.rng.sample(keys, min(len(keys), self.rng.randint(1, most))) if keys else []

    async def step(self) -> None:
        rng = self.rng
        state = self.state
        groups = self.live_groups()
        gid = rng.choice(groups) if groups else None
        keys = keys_of(state, gid) if gid is not None else []
        op = rng.choice(
            [
                "publish", "publish", "publish", "cancel", "reschedule", "ack", "nack",
                "nack_dead", "release", "delivered", "expire", "dead_letter", "redrive",
                "purge", "backfill", "delete", "snapshot", "restore", "drop",
            ]
        )  # fmt: skip
        now_ms = BASE_MS + rng.randrange(DAY_MS)
        if op == "publish":
            topic = rng.choice(["t", "t", "u"])
            items = [
                (topic, b"x", self.due(), rng.choice([None, None, 60_000]))
                for _ in range(rng.randint(1, 400))
            ]
            await self.apply(commands.publish(now_ms, items))
        elif op == "cancel" and keys:
            assert gid is not None
            info = state.groups[gid]
            ids = [commands.parse_schedule_key(k)[2] for k in self.sample(keys, 300)]
            await self.apply(commands.cancel(info.topic, rng.choice([gid, None]), ids))
        elif op == "reschedule" and keys:
            assert gid is not None
            info = state.groups[gid]
            ids = [commands.parse_schedule_key(k)[2] for k in self.sample(keys, 300)]
            await self.apply(
                commands.reschedule(now_ms, info.topic, rng.choice([gid, None]), ids, self.due())
            )
        elif op == "ack" and keys:
            await self.apply(commands.ack(self.sample(keys, 300)))
        elif op == "nack" and keys:
            entries = [(k, 1) for k in self.sample(keys, 300)]
            await self.apply(commands.nack(now_ms, rng.choice([0, 90_000]), entries))
        elif op == "nack_dead" and keys:
            entries = [(k, 1) for k in self.sample(keys, 200)]
            await self.apply(commands.nack(now_ms, 0, entries, "bad", dead_letter=True))
        elif op == "release" and keys:
            await self.apply(commands.release([(k, 1) for k in self.sample(keys, 300)]))
        elif op == "delivered" and keys:
            await self.apply(commands.delivered([(k, 2) for k in self.sample(keys, 300)], now_ms))
        elif op == "expire" and keys:
            await self.apply(commands.expire(self.sample(keys, 300), now_ms))
        elif op == "dead_letter" and keys:
            await self.apply(commands.dead_letter(now_ms, [(k, 5) for k in self.sample(keys, 300)]))
        elif op == "redrive":
            dlq = [g for g in groups if state.groups[g].topic.endswith(".dlq")]
            if dlq:
                source = rng.choice(dlq)
                dead = self.sample(keys_of(state, source, parked=True), 100)
                if dead:
                    await self.apply(commands.redrive(now_ms, source, dead, self.due()))
        elif op == "purge" and gid is not None:
            await self.apply(commands.purge([gid]))
            while gid in state.purging:
                await self.apply(commands.purge_group(gid, rng.randint(50, 500)))
        elif op == "backfill":
            name = f"b{state.applied_index}"
            await self.apply(commands.create_group("t", name, None, None, from_backlog=True))
            new = self.gid("t", name)
            assert new is not None
            while new in state.backfilling:
                await self.apply(commands.backfill_group(new, rng.randint(50, 500)))
        elif op == "delete" and gid is not None and len(groups) > 3:
            info = state.groups[gid]
            await self.apply(commands.delete_group(info.topic, info.name))
            while gid in state.deleting:
                await self.apply(commands.purge_group(gid, rng.randint(50, 500)))
        elif op == "snapshot":
            with state.snapshot_source() as view:
                self.snapshot = (view.serialize(), state.applied_index)
        elif op == "restore" and self.snapshot is not None:
            data, index = self.snapshot
            state.restore(data, index)
        elif op == "drop":
            self.due_counts.on_groups_changed()  # every histogram goes, as a sweep may

    def check(self, gid: int, histogram: DueHistogram) -> None:
        """Called with no yield since ``histogram()`` returned: store and callbacks agree."""
        store = self.state.store
        expected = brute_minutes(store, gid)
        assert dict(histogram.minutes) == dict(expected), gid
        hours: Counter[int] = Counter()
        for minute, count in expected.items():
            hours[minute // 60] += count
        assert dict(histogram.hours) == dict(hours)
        assert histogram.total() == sum(expected.values())
        # The node's count of minutes held, which bounds their memory, is exact.
        assert self.due_counts.held.minutes == self.due_counts.minutes_held()
        self.checks += 1


async def checker(world: World, stop: trio.Event) -> None:
    rng = random.Random(world.rng.random())
    while not stop.is_set():
        groups = world.live_groups()
        if groups:
            gid = rng.choice(groups)
            histogram = await world.due_counts.histogram(gid)
            if histogram is not None:
                world.check(gid, histogram)
                bound = world.due() + rng.choice([0, 17, MINUTE_MS // 2])
                below, exact = await world.due_counts.count_below(gid, histogram, bound)
                # No yield inside (edge scans shorter than a chunk): exact and current.
                assert (below, exact) == (brute_below(world.state.store, gid, bound), True)
        await trio.lowlevel.checkpoint()


async def run_world(world: World, steps: int) -> None:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(checker, world, stop)
        for _ in range(steps):
            await world.step()
            await trio.lowlevel.checkpoint()
        stop.set()
    for gid in world.live_groups():  # and once more, everything, at the end
        histogram = await world.due_counts.histogram(gid)
        assert histogram is not None
        world.check(gid, histogram)


@pytest.mark.parametrize("seed", range(6))
def test_histograms_match_a_brute_force_count_under_random_commands(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    # Small build chunks: a build spans many applies, and notifications of one command
    # (more than 128 effects) span several yields.
    monkeypatch.setattr(due_counts_module, "BUILD_CHUNK_KEYS", 37)
    world = World(MemoryStore(), seed)
    trio.run(run_world, world, 150)
    assert world.checks > 20


def test_histograms_match_on_rocksdb(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(due_counts_module, "BUILD_CHUNK_KEYS", 101)
    db = Database(str(tmp_path / "db"))
    try:
        world = World(db, 99)
        trio.run(run_world, world, 100)
        assert world.checks > 10
    finally:
        db.close()


def test_a_histogram_not_asked_about_is_dropped() -> None:
    world = World(MemoryStore(), 1)
    world.state.apply(1, commands.publish(BASE_MS, [("t", b"x", BASE_MS, None)]))
    gid = world.live_groups()[0]
    assert trio.run(world.due_counts.histogram, gid) is not None
    world.clock.advance(int(due_counts_module.IDLE_DROP_S * 1000) - 1)
    assert world.due_counts.sweep() == 0
    world.clock.advance(1)
    assert world.due_counts.sweep() == 1
    assert world.due_counts.histograms == {}


def test_histograms_past_the_minutes_budget_are_dropped_and_counted_by_a_scan() -> None:
    # Before, a histogram held every distinct minute of its group's due times (about
    # 105 bytes each): a producer spreading messages over ten years of minutes made
    # the leader hold 550 MB per group a dashboard showed.
    world = World(MemoryStore(), 1)
    counts = world.due_counts
    counts.max_minutes = 100
    spread = [("wide", b"x", BASE_MS + m * MINUTE_MS, None) for m in range(150)]
    world.state.apply(1, commands.publish(BASE_MS, spread))
    narrow = [("narrow", b"x", BASE_MS + m * MINUTE_MS, None) for m in range(10)]
    world.state.apply(2, commands.publish(BASE_MS, narrow))
    wide, small = world.gid("wide", "default"), world.gid("narrow", "default")
    assert wide is not None and small is not None
    # A build that would pass the budget stops, and the group is refused for a while.
    assert trio.run(counts.histogram, wide) is None
    assert wide in counts.refused and counts.held.minutes <= 100
    assert trio.run(counts.histogram, wide) is None
    built = trio.run(counts.histogram, small)
    assert built is not None and counts.held.minutes == 10
    # Growth past the budget from applied commands drops the largest histogram.
    more = [("narrow", b"x", BASE_MS + (1000 + m) * MINUTE_MS, None) for m in range(95)]
    world.state.apply(3, commands.publish(BASE_MS, more))
    assert counts.histograms == {} and small in counts.refused
    assert counts.held.minutes == 0
    # A refused group gets a histogram again after IDLE_DROP_S, if it fits by then.
    world.clock.advance(int(due_counts_module.IDLE_DROP_S * 1000))
    counts.max_minutes = 1000
    rebuilt = trio.run(counts.histogram, small)
    assert rebuilt is not None and counts.held.minutes == 105 == counts.minutes_held()


class BarrierLog(SyncLog):
    """SyncLog with the read barrier BROWSE_COUNTS waits on (applied already)."""

    async def read_barrier(self) -> None:
        await trio.lowlevel.checkpoint()


class Seam:
    """What ``manage.browse_counts`` uses of a Broker, over a RocksDB state."""

    def __init__(self, state: QueueState) -> None:
        self.state = state
        self.log = BarrierLog(state)
        self.due_counts = DueCounts(state, time.monotonic)
        state.observer = self.due_counts

    def require_leader(self) -> None:
        """Always the leader here."""

    def stamp(self) -> int:
        return BASE_MS


def test_counts_past_the_old_read_limit_are_complete_and_exact(tmp_path: Path) -> None:
    # 250,000 pending (more than the 200,000 keys the scan fallback reads), one minute
    # of due times per 50 entries over about three and a half days.
    pending = 250_000
    db = Database(str(tmp_path / "db"))
    try:
        state = QueueState(db)
        seam = Seam(state)
        state.apply(1, commands.create_group("t", "g", None, None))
        batch = 10_000
        for first in range(0, pending, batch):
            items = [("t", b"", BASE_MS + (first + i) * 1_200, None) for i in range(batch)]
            state.apply(state.applied_index + 1, commands.publish(BASE_MS, items))
        bounds = [
            BASE_MS + 30_000,
            BASE_MS + 3_600_000 + 7,
            BASE_MS + 86_400_000,
            BASE_MS + 2 * 86_400_000 + 599,
            BASE_MS + 3 * 86_400_000 + 61_001,  # 216,051 entries before it
        ]
        frame = frames.BrowseCounts(1, "t", "g", bounds, False)
        answer = trio.run(manage.browse_counts, seam, frame)
        due = [BASE_MS + n * 1_200 for n in range(pending)]
        expected = [
            sum(1 for d in due if low <= d < high)
            for low, high in zip([0, *bounds], bounds, strict=False)
        ]
        assert answer.complete
        assert answer.counts == expected
        assert answer.later == pending - sum(expected)
        # Messages published and acked after the build are counted in and out.
        state.apply(
            state.applied_index + 1,
            commands.publish(BASE_MS, [("t", b"", BASE_MS + 1, None)] * 3),
        )
        first_key = next(iter(state.store.scan_keys("schedule", commands.schedule_key(1, 0, 0))))
        state.apply(state.applied_index + 1, commands.ack([first_key]))
        again = trio.run(manage.browse_counts, seam, frame)
        assert again.counts == [expected[0] + 2, *expected[1:]]
        assert again.later == answer.later
    finally:
        db.close()


def test_a_build_cut_short_resumes_where_it_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(due_counts_module, "BUILD_CHUNK_KEYS", 5)
    world = World(MemoryStore(), 7)
    world.state.apply(1, commands.create_group("t", "g", None, None))
    gid = world.live_groups()[0]
    items = [("t", b"x", BASE_MS + n * 7_001, None) for n in range(100)]
    world.state.apply(2, commands.publish(BASE_MS, items))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(world.due_counts.histogram, gid)
            for _ in range(4):  # a few chunks, then the request goes away
                await trio.lowlevel.checkpoint()
            nursery.cancel_scope.cancel()
        histogram = world.due_counts.histograms[gid]
        assert histogram.cursor is not None and histogram.minutes  # part-built
        # Meanwhile: entries below and above the cursor come and go.
        keys = keys_of(world.state, gid)
        await world.apply(commands.ack([keys[0], keys[-1]]))
        await world.apply(commands.publish(BASE_MS, [("t", b"y", BASE_MS, None)] * 3))
        resumed = await world.due_counts.histogram(gid)
        assert resumed is histogram and histogram.cursor is None
        world.check(gid, histogram)

    trio.run(main)
