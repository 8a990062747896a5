"""Refreshing the slot map does not wait on a stopped shard process.

``ShardedClient.refresh_slot_map`` (run on every WRONG_SHARD answer) asked the shards
one after another from shard 0: with shard 0's process stopped (SIGSTOP: its port
still accepts, nothing answers) each refresh waited out the whole request timeout on
it before shard 1 was asked. Now every shard is asked at once and the first answer
wins.
"""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from test_shards import ShardedNode

from futureq.client import open_client
from futureq.client._routing import ShardedClient
from futureq.errors import ErrorCode, RequestError

REQUEST_TIMEOUT_S = 30.0
"""Each call's deadline: what a refresh waited on a stopped shard before."""


@pytest.fixture
def two_shards(tmp_path: Path) -> Iterator[ShardedNode]:
    made = ShardedNode(tmp_path / "data", shards=2)
    made.start()
    yield made
    for shard in range(2):
        pid = made.pid_of_shard(shard)
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
    if made.process is not None and made.process.poll() is None:
        made.terminate()
    made.kill()


async def _refresh_with_shard_0_stopped(node: ShardedNode) -> None:
    async with open_client(
        node.shard_addresses[0], request_timeout_s=REQUEST_TIMEOUT_S, rng=random.Random(7)
    ) as client:
        assert isinstance(client, ShardedClient)
        await client.publish("refresh.warm", b"x")  # both shards' clients connected
        for shard_client in client.shard_clients:
            await shard_client.ping()
        pid = node.pid_of_shard(0)
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            # Before: shard 0 was asked first and held the refresh for the whole
            # REQUEST_TIMEOUT_S; shard 1 answers in milliseconds.
            with anyio.fail_after(REQUEST_TIMEOUT_S / 3):
                await client.refresh_slot_map()
            assert client.slot_map.shard_count == 2
        finally:
            os.kill(pid, signal.SIGCONT)


def test_a_refresh_takes_the_first_shard_that_answers(two_shards: ShardedNode) -> None:
    anyio.run(_refresh_with_shard_0_stopped, two_shards)


async def _refresh_with_every_shard_stopped(node: ShardedNode) -> None:
    async with open_client(
        node.shard_addresses[0], request_timeout_s=3, rng=random.Random(8)
    ) as client:
        assert isinstance(client, ShardedClient)
        pids = [node.pid_of_shard(shard) for shard in range(2)]
        for pid in pids:
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(RequestError) as refused:
                await client.refresh_slot_map()
            assert refused.value.code is ErrorCode.UNAVAILABLE
            assert "no shard answered SLOT_MAP" in refused.value.message
        finally:
            for pid in pids:
                assert pid is not None
                os.kill(pid, signal.SIGCONT)


def test_a_refresh_no_shard_answers_fails_within_its_deadline(two_shards: ShardedNode) -> None:
    anyio.run(_refresh_with_every_shard_stopped, two_shards)
