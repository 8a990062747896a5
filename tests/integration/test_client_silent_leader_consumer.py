"""A consumer whose leader stops answering (SIGSTOP) moves to the new leader.

A subscriber waiting for deliveries owes the server nothing, so the silence probe of
requests never looked at its connection: with its leader stopped (its TCP connection
open) it sat on it and received nothing, however long the other nodes had had a new
leader. Now a connection with a subscription is PINGed after a second of silence
(``docs/client.md``, "Reconnects and leader following").
"""

from __future__ import annotations

import os
import random
import signal

import anyio
from cluster_process import Cluster

from futureq.client import open_client


async def _consume_past_a_stopped_leader(cluster3: Cluster) -> None:
    leader = cluster3.leader(30)
    async with (
        open_client(leader.client_address, request_timeout_s=10, rng=random.Random(9)) as consumer,
        open_client(cluster3.servers, request_timeout_s=10, rng=random.Random(10)) as producer,
    ):
        async with consumer.subscribe("quiet", "g", prefetch=10) as sub:
            first = await producer.publish("quiet", b"before")
            got = await sub.receive(timeout_s=10)
            assert got is not None and got.id == first
            await got.ack()
            assert consumer.connected_address == leader.client_address
            assert leader.process is not None
            os.kill(leader.process.pid, signal.SIGSTOP)
            try:
                after = await producer.publish("quiet", b"after the stop")
                # Before: None, the subscription still waiting on the stopped node.
                got = await sub.receive(timeout_s=8)
                assert got is not None and got.id == after
                assert consumer.connected_address != leader.client_address
            finally:
                os.kill(leader.process.pid, signal.SIGCONT)


def test_a_consumer_leaves_a_leader_that_answers_nothing(cluster3: Cluster) -> None:
    anyio.run(_consume_past_a_stopped_leader, cluster3)
