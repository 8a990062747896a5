"""A sharded node's client when one shard refuses, hangs or answers for another node.

Faults found by trying a node of 2 shards as an operator would: ``publish --file``
stored one shard's lines again after the other shard refused a line; one stopped
(SIGSTOP) shard kept every new client and CLI command from starting; node-wide calls
raised a bare exception group; ``cluster status`` paired the asked node's address with
the leader's answer. Real ``futureq start --shards 2`` and ``futureq-cli`` processes on
127.0.0.1, no mocks.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from test_shards import TOPICS, ShardedNode, _sharded_cluster, cli
from test_shards import node as node  # the fixture: one sharded node

from futureq.client import open_client
from futureq.errors import ConnectionLostError, FutureQError, RequestError
from futureq.shards.slots import even_map

pytestmark = pytest.mark.timeout(120)


def _topic_of_shard(node: ShardedNode, shard: int, prefix: str = "") -> str:
    slot_map = even_map(node.shard_addresses)
    return next(f"{prefix}{t}" for t in TOPICS if slot_map.shard_of(f"{prefix}{t}") == shard)


def _pending(node: ShardedNode, topic: str) -> list[str]:
    """The payloads stored for ``topic`` (``futureq-cli browse --json``)."""
    done = cli(node.client_address, "browse", topic, "--preview", "100", "--json")
    assert done.returncode == 0, done.stderr
    return [json.loads(line)["preview"] for line in done.stdout.splitlines() if line.strip()]


def test_publish_file_never_resends_what_another_shard_stored(
    node: ShardedNode, tmp_path: Path
) -> None:
    """docs/cli.md: a refused line is reported and the rest of its batch is sent again
    without it; duplicates come only from a lost connection. Before, the shard-0 line
    was stored once per refused shard-1 line (5 times) and the summary said 1."""
    good0 = _topic_of_shard(node, 0, "good.")
    good1 = _topic_of_shard(node, 1, "good.")
    bad1 = _topic_of_shard(node, 1, "bad.")
    for topic in (good0, good1):
        assert cli(node.client_address, "group", "create", topic, "g").returncode == 0
    refused = '{"topic":"%s","payload":"bad%d","headers":{"futureq-x":"1"}}\n'
    lines = (
        f'{{"topic":"{good0}","payload":"g0"}}\n'
        + "".join(refused % (bad1, i) for i in range(4))
        + f'{{"topic":"{good1}","payload":"g1"}}\n'
    )
    batch = tmp_path / "mixed.jsonl"
    batch.write_text(lines)
    done = cli(node.client_address, "publish", "--file", str(batch))
    assert done.returncode != 0
    assert done.stdout.startswith("published 2 message(s) in"), done.stdout
    assert "4 failed line(s)" in done.stdout
    assert [line.split(":")[0] for line in done.stderr.splitlines()] == [
        "line 2",
        "line 3",
        "line 4",
        "line 5",
    ]
    assert _pending(node, good0) == ["g0"]
    assert _pending(node, good1) == ["g1"]


def _stopped_shard(node: ShardedNode, shard: int) -> int:
    pid = node.pid_of_shard(shard)
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    return pid


def test_a_hung_shard_leaves_the_other_shards_serving(node: ShardedNode) -> None:
    """docs/sharding.md: the other shards keep serving while one is down. Before, a new
    client (and so every CLI command) failed to open with CONNECTION_LOST naming the
    stopped shard's port, and asked whether a server ran at --server."""
    healthy = _topic_of_shard(node, 0)
    hung = _topic_of_shard(node, 1)
    hung_address = node.shard_addresses[1]
    pid = _stopped_shard(node, 1)
    try:

        async def main() -> None:
            async with open_client(
                node.client_address, connect_timeout_s=2, request_timeout_s=3
            ) as client:
                assert await client.publish(healthy, b"x") >= 0
                status = await client.status()
                assert status["missing_shards"] == [1]
                assert status["shards"][0]["role"] is not None
                assert "shard 1 did not answer" in status["shards"][1]["error"]
                with pytest.raises(ConnectionLostError, match=f"shard 1: .*{hung_address}"):
                    await client.publish(hung, b"y")

        anyio.run(main)

        published = cli(node.client_address, "--request-timeout", "3s", "publish", healthy, "z")
        assert published.returncode == 0, published.stderr
        status = cli(node.client_address, "--request-timeout", "3s", "status")
        assert healthy in status.stdout
        assert "shard 1 did not answer" in status.stderr and hung_address in status.stderr
        assert status.returncode != 0
        refused = cli(node.client_address, "--request-timeout", "3s", "publish", hung, "z")
        assert refused.returncode != 0
        assert "shard 1" in refused.stderr and hung_address in refused.stderr
        assert "is a FutureQ server running" not in refused.stderr, refused.stderr
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_node_wide_calls_raise_a_futureq_error_not_a_group(node: ShardedNode, backend: str) -> None:
    """docs/client.md, "Errors": every error is a FutureQError. Before, a node-wide call
    every shard refused (transfer_leader on a node running alone) raised ExceptionGroup,
    and so did status() with every shard stopped."""

    async def main() -> None:
        async with open_client(
            node.client_address, connect_timeout_s=2, request_timeout_s=3
        ) as client:
            calls: list[Callable[[], Awaitable[None]]] = [
                lambda: client.transfer_leader(9),
                lambda: client.remove_node(9),
            ]
            for call in calls:
                with pytest.raises(RequestError) as refused:
                    await call()
                assert "shard 0" in str(refused.value) and "shard 1" in str(refused.value)
            pids = [_stopped_shard(node, shard) for shard in (0, 1)]
            try:
                with pytest.raises(FutureQError) as lost:
                    await client.status()
                assert "shard 1" in str(lost.value)
            finally:
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)

    anyio.run(main, backend=backend)


@pytest.mark.slow
def test_cluster_status_rows_describe_the_asked_nodes_shards(tmp_path: Path) -> None:
    """docs/cli.md: the shards table gives each shard's address on the asked node and
    its role. Before, the row of a shard the asked node follows held the leader's
    answer (its node_id and role) beside the asked node's address."""
    nodes, ports = _sharded_cluster(tmp_path)
    try:
        for each in nodes.values():
            each.start()
        for node_id, (client_port, _, _) in ports.items():
            address = f"127.0.0.1:{client_port}"
            done = cli(address, "cluster", "status", "--json")
            assert done.returncode == 0, done.stderr
            view: dict[str, Any] = json.loads(done.stdout)
            for row in view["shards"]:
                assert row["node_id"] == node_id, (node_id, row)
                assert row["address"] == f"127.0.0.1:{client_port + row['shard']}", row
    finally:
        for each in nodes.values():
            if each.alive():
                each.terminate()


def test_seeds_with_a_shards_own_port_name_the_stopped_shard_0(node: ShardedNode) -> None:
    """Given the node's port and shard 1's (``--server N:P0,N:P1``), a client reaches
    shard 1 while shard 0 is stopped, and a call for shard 0's topics says shard 0 did
    not answer. Before, shard 1's port was shifted as if it were public, so shard 0's
    client tried shard 1 and answered ``WRONG_SHARD ... this is shard 1``."""
    zero = _topic_of_shard(node, 0)
    one = _topic_of_shard(node, 1)
    both = ",".join(node.shard_addresses)
    stopped = _stopped_shard(node, 0)
    try:
        done = cli(both, "--request-timeout", "4s", "publish", one, "fine")
        assert done.returncode == 0, done.stderr
        done = cli(both, "--request-timeout", "4s", "publish", zero, "waits")
        assert done.returncode == 1
        assert "[CONNECTION_LOST] shard 0: no connection to any of" in done.stderr, done.stderr
        assert "WRONG_SHARD" not in done.stderr
    finally:
        os.kill(stopped, signal.SIGCONT)
