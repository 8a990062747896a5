"""After a graceful leader handover the application never holds more than ``prefetch``
unsettled deliveries of a subscription (``docs/client.md``, "Leader handover"), against
a real 3-node cluster.

Found by a tester: with ``subscribe(prefetch=2)``, two deliveries taken and not settled,
then CLUSTER_TRANSFER_LEADER, the client subscribed again on the new leader with a full
window of 2 while the two handed-over deliveries (still settleable by their tags there)
stayed out: the application held 4 unsettled deliveries, and one that spawns a task per
delivery ran twice the concurrency it asked for. Now the next subscription's window
leaves room for the handed-over deliveries still live, and each gives its room back
once settled, void or past its visibility deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from cluster_process import Cluster

from futureq.client import PublishItem, open_client
from futureq.client.subscription import DeliveryState
from futureq.client.sync import SyncClient

PREFETCH = 2


class Holder:
    """What the application holds of one subscription: every delivery it took, and a
    check after each take that no more than ``PREFETCH`` are unsettled (HELD)."""

    def __init__(self, sub: Any) -> None:
        self.sub = sub
        self.taken: list[Any] = []

    def unsettled(self) -> list[Any]:
        return [d for d in self.taken if d.state is DeliveryState.HELD]

    async def take(self, timeout_s: float) -> Any:
        delivery = await self.sub.receive(timeout_s)
        if delivery is not None:
            self.taken.append(delivery)
        held = self.unsettled()
        # Before: 4 unsettled (2 handed over + a full window from the new leader).
        assert len(held) <= PREFETCH, [(d.payload, d.attempt) for d in held]
        return delivery

    async def take_all(self, count: int) -> list[Any]:
        got = [await self.take(15) for _ in range(count)]
        assert None not in got, got
        return got


async def _transfer(cluster: Cluster, client: Any) -> None:
    leader = cluster.leader(30)
    target = next(n for n in cluster.nodes if n != leader.node_id)
    await client.transfer_leader(target)
    assert cluster.leader(30, exclude={leader.node_id}).node_id != leader.node_id


async def test_handed_over_deliveries_keep_their_room_in_the_window_across_handovers(
    cluster3: Cluster,
) -> None:
    topic = "capped"
    async with open_client(cluster3.servers, request_timeout_s=30) as client:
        # Far beyond the test: nothing held comes back by its deadline here.
        await client.create_group(topic, "g", visibility_timeout_ms=60_000)
        await client.publish_batch([PublishItem(topic, b"%d" % i) for i in range(12)])
        async with client.subscribe(topic, "g", prefetch=PREFETCH) as sub:
            app = Holder(sub)
            first, second = await app.take_all(2)
            await _transfer(cluster3, client)
            # Both held: nothing more comes (before: two more came from the new leader).
            assert await app.take(2.5) is None
            # One settled on the new leader: exactly one more.
            await first.ack()
            (third,) = await app.take_all(1)
            assert await app.take(1) is None
            # Held across a second handover: second (from before the first) and third.
            await _transfer(cluster3, client)
            assert await app.take(2.5) is None
            await second.ack()
            (fourth,) = await app.take_all(1)
            assert await app.take(1) is None
            # Everything handed over settled: the full window again, for good.
            await sub.ack([third, fourth])
            fifth, sixth = await app.take_all(2)
            assert await app.take(1) is None
            await sub.ack([fifth, sixth])
            await app.take_all(2)
            assert await app.take(1) is None
            assert not sub._orphaned


async def test_a_handed_over_delivery_past_its_deadline_gives_its_room_back(
    cluster3: Cluster,
) -> None:
    topic = "lapsed"
    async with open_client(cluster3.servers, request_timeout_s=30) as client:
        await client.create_group(topic, "g", visibility_timeout_ms=2_000)
        await client.publish_batch([PublishItem(topic, b"%d" % i) for i in range(6)])
        async with client.subscribe(topic, "g", prefetch=PREFETCH) as sub:
            app = Holder(sub)
            handed = await app.take_all(2)
            await _transfer(cluster3, client)
            # Never settled: past their deadline they are void and the window is full
            # again (each take checks that no more than PREFETCH are unsettled).
            fresh = await app.take_all(2)
            assert all(d.state is DeliveryState.VOID for d in handed), handed
            assert not set(fresh) & set(handed)
            assert await app.take(1) is None
            await sub.ack(fresh)
            await app.take_all(2)  # the window stayed full


@pytest.fixture
def limited_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A 3-node cluster whose ``limits.max_prefetch`` is PREFETCH: the most one pull
    subscription (SyncClient.consume) may hold unsettled."""
    cluster = Cluster(tmp_path, 3, env={"FUTUREQ_LIMITS_MAX_PREFETCH": str(PREFETCH)})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_a_pull_consumer_holds_no_more_than_the_limit_after_a_handover(
    limited_cluster: Cluster,
) -> None:
    topic = "pulled"

    async def transfer() -> None:
        async with open_client(limited_cluster.servers, request_timeout_s=30) as admin:
            await _transfer(limited_cluster, admin)

    with SyncClient(limited_cluster.servers, request_timeout_s=30) as client:
        client.create_group(topic, "g", visibility_timeout_ms=60_000)
        for i in range(8):
            client.publish(topic, b"%d" % i)
        taken = client.consume(topic, "g", count=PREFETCH, timeout_s=10)
        assert len(taken) == PREFETCH
        trio.run(transfer)
        # Holding the limit in handed-over deliveries: nothing more (before: 2 more).
        assert client.consume(topic, "g", count=PREFETCH, timeout_s=2) == []
        taken[0].ack()
        more = client.consume(topic, "g", count=PREFETCH, timeout_s=2)
        assert len(more) == 1, more
        taken[1].ack()
        more[0].ack()
        again = client.consume(topic, "g", count=PREFETCH, timeout_s=5)
        assert len(again) == PREFETCH, again


def test_an_asyncio_task_per_delivery_runs_at_most_prefetch_at_once_across_a_handover(
    cluster3: Cluster,
) -> None:
    # The tester's application: one task per delivery, prefetch as the concurrency cap.
    topic = "tasks"
    published = 8

    async def main() -> tuple[int, list[bytes]]:
        running = 0
        peak = 0
        done: list[bytes] = []
        go = asyncio.Event()

        async def work(delivery: Any) -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await go.wait()
            await delivery.ack()
            done.append(delivery.payload)
            running -= 1

        async with open_client(cluster3.servers, request_timeout_s=30) as client:
            await client.create_group(topic, "g", visibility_timeout_ms=60_000)
            await client.publish_batch([PublishItem(topic, b"%d" % i) for i in range(published)])
            async with client.subscribe(topic, "g", prefetch=PREFETCH) as sub:
                tasks = [asyncio.create_task(work(await sub.__anext__())) for _ in range(2)]
                leader = await asyncio.to_thread(cluster3.leader, 30)
                target = next(n for n in cluster3.nodes if n != leader.node_id)
                await client.transfer_leader(target)
                # Both tasks still run: whatever comes now would be a third.
                extra = await sub.receive(3)
                if extra is not None:
                    tasks.append(asyncio.create_task(work(extra)))
                    await asyncio.sleep(0)
                go.set()
                while len(tasks) < published:
                    delivery = await sub.receive(15)
                    assert delivery is not None, done
                    tasks.append(asyncio.create_task(work(delivery)))
                await asyncio.gather(*tasks)
                assert await sub.receive(1) is None  # each came once
        return peak, done

    peak, done = asyncio.run(main())
    assert peak <= PREFETCH, peak  # before: 3 (2 handed over + 1 from the new leader)
    assert sorted(done) == sorted(b"%d" % i for i in range(published))
