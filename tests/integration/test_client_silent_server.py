"""A client whose server stops answering (SIGSTOP, a hung event loop) moves on.

A stopped process keeps its TCP connections open, so the client saw no lost
connection. Before, only a request that reached its own deadline (at least 5 s, 30 s
by default) with nothing heard made the client PING the server: the call itself
failed with TIMEOUT, though the other nodes had elected a new leader within a second.
Now a connection silent for ``SILENT_SERVER_S`` with an answer owed is PINGed, and
closed when the PING goes unanswered for ``PING_PROBE_S`` too: the request is resent
on the next connection, to the new leader, within its deadline (``docs/client.md``,
"Reconnects and leader following"). ``test_client_silence_probe`` holds a server
still on purpose: one slow to answer but answering PINGs keeps the connection.
"""

from __future__ import annotations

import os
import random
import signal

import anyio
from cluster_process import Cluster

from futureq.client import open_client


async def _publish_past_a_stopped_leader(cluster3: Cluster) -> None:
    leader = cluster3.leader(30)
    async with open_client(cluster3.servers, request_timeout_s=10, rng=random.Random(3)) as client:
        await client.publish("silent", b"before")
        if client.connected_address != leader.client_address:
            await client.publish("silent", b"follows the redirect")
        assert client.connected_address == leader.client_address
        assert leader.process is not None
        os.kill(leader.process.pid, signal.SIGSTOP)
        try:
            # Before: TIMEOUT after the whole request_timeout_s, on the stopped node.
            await client.publish("silent", b"sent to the stopped leader, then resent")
            assert client.connected_address not in (None, leader.client_address)
        finally:
            os.kill(leader.process.pid, signal.SIGCONT)


def test_a_request_to_a_server_that_answers_nothing_goes_to_the_new_leader(
    cluster3: Cluster,
) -> None:
    anyio.run(_publish_past_a_stopped_leader, cluster3)
