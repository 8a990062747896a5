"""A client given one node of a cluster reaches the others when that node stops.

HELLO_OK of protocol version 2 names the client addresses of the cluster's voters
(``docs/protocol.md``, "HELLO_OK"); the client keeps them after the servers it was
given (``docs/client.md``, "Connecting"). Before, a client given only the leader's
address retried that dead address until its deadline, though two live nodes had
elected a new leader.
"""

from __future__ import annotations

import random

import anyio
from cluster_process import Cluster

from futureq.client import open_client


async def _publish_after_the_only_seed_is_killed(cluster3: Cluster) -> None:
    leader = cluster3.leader(30)
    async with open_client(
        leader.client_address, request_timeout_s=30.0, rng=random.Random(7)
    ) as client:
        assert client.servers == [leader.client_address]
        await client.create_group("members", "g")
        first = await client.publish("members", b"before")
        assert sorted(client._known_servers()) == sorted(cluster3.servers)
        leader.kill()
        await anyio.to_thread.run_sync(cluster3.leader, 30.0, {leader.node_id})
        # The seed is dead: only the members its HELLO_OK named can answer.
        second = await client.publish("members", b"after")
        assert client.connected_address != leader.client_address
        assert client.connected_address in cluster3.servers
        async with client.subscribe("members", "g", prefetch=10) as sub:
            got = [await sub.receive(timeout_s=20.0) for _ in range(2)]
        assert sorted((d.id, d.payload) for d in got if d is not None) == [
            (first, b"before"),
            (second, b"after"),
        ]


def test_a_client_given_only_the_leader_fails_over_to_the_members_it_learned(
    cluster3: Cluster,
) -> None:
    anyio.run(_publish_after_the_only_seed_is_killed, cluster3)
