"""A member the client learned that refuses its HELLO does not end the client.

HELLO_OK (protocol version 2) names the cluster's voters and the client tries them
(``docs/client.md``, "Servers it learns"). A node configured apart (here: another
``server.auth_token``) refuses the client's HELLO with AUTH_FAILED. Before, that
refusal was fatal for a member the user never gave, as for a given server: a
NOT_LEADER naming that node ended the client for ever, and every later call raised
AUTH_FAILED though the servers given accepted its token once the leadership moved.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from cluster_process import Cluster

from futureq.client import open_client
from futureq.errors import FutureQError, RemoteProtocolError

TOKEN = "token-of-nodes-1-and-2"
OTHER_TOKEN = "token-of-node-3-alone"


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[Cluster]:
    configs = {}
    for node_id, token in ((1, TOKEN), (2, TOKEN), (3, OTHER_TOKEN)):
        config = tmp_path / f"node{node_id}.toml"
        config.write_text(f'[server]\nauth_token = "{token}"\n')
        configs[node_id] = ["--config", str(config)]
    cluster = Cluster(tmp_path / "cluster", 3, node_args=configs)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


TOKENS = {1: TOKEN, 2: TOKEN, 3: OTHER_TOKEN}


async def _leader_id(cluster: Cluster, node_id: int) -> int:
    """The leader as node ``node_id`` sees it, once it names one (its HTTP port needs
    a token, so ``cluster.leader()`` cannot ask it)."""
    address = cluster.nodes[node_id].client_address
    async with open_client(address, token=TOKENS[node_id], request_timeout_s=30.0) as client:
        with anyio.fail_after(30):
            while True:
                leader = (await client.cluster_status(local=True)).get("leader_id")
                if leader is not None:
                    return int(leader)
                await anyio.sleep(0.1)


async def _lead(cluster: Cluster, node_id: int) -> None:
    """Hand leadership to ``node_id``, asking the present leader with its own token."""
    leader = await _leader_id(cluster, node_id)
    if leader != node_id:
        address = cluster.nodes[leader].client_address
        async with open_client(address, token=TOKENS[leader], request_timeout_s=30.0) as admin:
            await admin.transfer_leader(node_id)
    with anyio.fail_after(30):
        while True:
            if await _leader_id(cluster, node_id) == node_id:
                return
            await anyio.sleep(0.1)


async def _client_outlives_a_refusing_member(cluster: Cluster) -> None:
    node1, node3 = cluster.nodes[1], cluster.nodes[3]
    await _lead(cluster, 3)
    async with open_client(
        node1.client_address, token=TOKEN, request_timeout_s=5.0, rng=random.Random(5)
    ) as client:
        assert node3.client_address in client._known_servers()
        # Node 1 names node 3 the leader, which refuses this client's token.
        with pytest.raises(FutureQError) as failed:
            await client.publish("refusal", b"while node 3 leads")
        assert not isinstance(failed.value, RemoteProtocolError), failed.value
        await _lead(cluster, 1)
        client.request_timeout_s = 30.0
        await client.publish("refusal", b"once node 1 leads")
        assert client.connected_address == node1.client_address


def test_a_learned_member_refusing_hello_is_one_failed_attempt(cluster3: Cluster) -> None:
    anyio.run(_client_outlives_a_refusing_member, cluster3)
