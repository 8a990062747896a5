"""``transfer_leader`` on a client that is busy with other requests meanwhile, against a
real 3-node cluster.

Found by a tester: a client that consumed (and acked) while it moved the leadership was
told ``ConnectionLostError`` after every transfer that succeeded. The node hands over
before it answers the transfer; another request of the client answered NOT_LEADER in
between closed the connection (the client follows the new leader), and the answer
to the transfer was lost with it.
"""

from __future__ import annotations

import random

import trio
from cluster_process import Cluster

from futureq.client import Delivery, PublishItem, open_client
from futureq.errors import FutureQError


async def test_transfer_leader_returns_once_the_leadership_moved_while_acks_run(
    cluster3: Cluster,
) -> None:
    rng = random.Random(7)
    async with open_client(cluster3.servers, request_timeout_s=30) as client:
        await client.publish_batch([PublishItem("busy", b"%d" % n) for n in range(5_000)])

        async def ack(delivery: Delivery) -> None:
            await trio.sleep(rng.random() * 0.3)  # the application works on it
            try:
                await delivery.ack()
            except FutureQError:
                pass  # a delivery the handover took back: not what is tested

        async def consume(nursery: trio.Nursery, started: trio.Event) -> None:
            async with client.subscribe("busy", "g", prefetch=200) as sub:
                async for delivery in sub:
                    started.set()
                    nursery.start_soon(ack, delivery)

        async with trio.open_nursery() as nursery:
            started = trio.Event()
            nursery.start_soon(consume, nursery, started)
            await started.wait()
            for _ in range(2):
                leader = await trio.to_thread.run_sync(cluster3.leader, 30)
                target = next(n for n in cluster3.nodes if n != leader.node_id)
                # Before: ConnectionLostError ("... is not the leader; reconnecting to
                # ..." or "... knows no leader; trying the next server").
                await client.transfer_leader(target)
                now = await trio.to_thread.run_sync(cluster3.leader, 30)
                assert now.node_id == target
            nursery.cancel_scope.cancel()
