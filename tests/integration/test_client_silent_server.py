"""A client whose server stops answering (SIGSTOP, a hung event loop) moves on.

A stopped process keeps its TCP connections open, so the client saw no lost
connection: every call timed out on the same dead node for as long as it stayed
stopped, though the other nodes had elected a new leader within a second or two.
Now a request that times out with nothing at all heard on its connection since it
was sent (and a deadline of at least ``SILENT_SERVER_S``) makes the client PING the
server; no answer closes the connection, so the next call reconnects
(``docs/client.md``, "Reconnects and leader following").
"""

from __future__ import annotations

import os
import random
import signal

import anyio
import pytest
from cluster_process import Cluster

from futureq.client import open_client
from futureq.client._connection import SILENT_SERVER_S
from futureq.errors import ErrorCode, RequestError


async def _publish_past_a_stopped_leader(cluster3: Cluster) -> None:
    leader = cluster3.leader(30)
    async with open_client(
        cluster3.servers, request_timeout_s=SILENT_SERVER_S + 3, rng=random.Random(3)
    ) as client:
        await client.publish("silent", b"before")
        assert leader.process is not None
        os.kill(leader.process.pid, signal.SIGSTOP)
        try:
            assert client.connected_address == leader.client_address
            with pytest.raises(RequestError) as timed_out:
                await client.publish("silent", b"to the stopped leader")
            assert timed_out.value.code is ErrorCode.TIMEOUT
            # Before: the same TIMEOUT again, on the same stopped node, for ever.
            await client.publish("silent", b"after")
            assert client.connected_address != leader.client_address
        finally:
            os.kill(leader.process.pid, signal.SIGCONT)


def test_a_client_leaves_a_server_that_answers_nothing(cluster3: Cluster) -> None:
    anyio.run(_publish_past_a_stopped_leader, cluster3)
