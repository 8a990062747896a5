"""Settling deliveries whose leader stepped down, through the real client and cluster.

A leader that hands over gracefully (here: a leadership transfer) leaves the deliveries
the application holds out on the next leader until their visibility deadline, and
honours their tags there (``docs/protocol.md``, "Delivery tags across leaders"): the
client sends the settlement to the new leader, whether the old leader closed the
connection first or answered NOT_LEADER (a race here), and the message is not
delivered again. A leader that *loses* leadership keeps nothing out: its tags die with
it, and the client says so as for a lost connection (``ConnectionLostError``, never
``NotLeaderError``; ``tests/unit/client/test_client_fake_broker.py`` pins that answer).
"""

from __future__ import annotations

import random
import time

import anyio
import pytest
from cluster_process import Cluster

from futureq.client import open_client
from futureq.client.subscription import DeliveryState


def _wait_for_leader(cluster: Cluster, node_id: int) -> None:
    deadline = time.monotonic() + 30
    while cluster.leader(30).node_id != node_id:
        assert time.monotonic() < deadline, "the transfer did not happen"
        time.sleep(0.05)


async def _settle_after_the_leader_steps_down(cluster3: Cluster, how: str) -> None:
    leader = cluster3.leader(30)
    servers = [leader.client_address] + [a for a in cluster3.servers if a != leader.client_address]
    async with open_client(servers, request_timeout_s=20.0, rng=random.Random(5)) as client:
        message_id = await client.publish("handover", b"x")
        async with client.subscribe("handover", "g", prefetch=1) as sub:
            held = await sub.receive(timeout_s=10.0)
            assert held is not None and held.id == message_id
            target = next(n for n in cluster3.nodes if n != leader.node_id)
            await client.transfer_leader(target)
            await anyio.to_thread.run_sync(_wait_for_leader, cluster3, target)
            # Before: ConnectionLostError, and the message came again.
            if how == "extend":
                await held.extend()
                assert held.state is DeliveryState.HELD
            await held.ack()
            assert held.state is DeliveryState.SETTLED
            # Settled on the new leader: it is not delivered again.
            assert await sub.receive(timeout_s=1.5) is None


@pytest.mark.parametrize("how", ["ack", "extend"])
def test_settling_a_delivery_held_across_a_handover_reaches_the_new_leader(
    cluster3: Cluster, how: str
) -> None:
    anyio.run(_settle_after_the_leader_steps_down, cluster3, how)
