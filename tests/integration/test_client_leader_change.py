"""Settling deliveries whose leader stepped down, through the real client and cluster.

The tags a leader hands out die with its leadership (``docs/protocol.md``, "DELIVER"):
no node can settle them any more, so following the leader cannot help. The client
says so as for a lost connection (``ConnectionLostError``, the delivery VOID), never
``NotLeaderError``, moves to the new leader, and gets the message again there
(``docs/client.md``, "At-least-once"). Whether the old leader closed the connection
first or answered NOT_LEADER is a race here; ``tests/unit/client/
test_client_fake_broker.py`` pins the NOT_LEADER answer.
"""

from __future__ import annotations

import random
import time

import anyio
import pytest
from cluster_process import Cluster

from futureq.client import open_client
from futureq.client.subscription import DeliveryState
from futureq.errors import ConnectionLostError


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
            with pytest.raises(ConnectionLostError):
                if how == "ack":
                    await held.ack()
                elif how == "nack":
                    await held.nack()
                else:
                    await held.extend()
            # VOID, or still HELD for an instant when the connection broke under the
            # ack (its outcome unknown) and the client has not swept it yet.
            assert held.state is not DeliveryState.SETTLED
            # The subscription follows to the new leader, which delivers it again.
            again = await sub.receive(timeout_s=20.0)
            assert again is not None and again.id == message_id
            await again.ack()


@pytest.mark.parametrize("how", ["ack", "extend"])
def test_settling_a_delivery_of_a_leader_that_stepped_down_is_connection_lost(
    cluster3: Cluster, how: str
) -> None:
    anyio.run(_settle_after_the_leader_steps_down, cluster3, how)
