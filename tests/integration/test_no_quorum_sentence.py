"""A request that finds no leader says so, not that no server runs.

Found by a tester: with two of a 3-node cluster's nodes stopped (SIGSTOP: their ports
accept connections that never answer), the one left answers
HELLO but knows no leader; a `futureq-cli cancel` (any command) ended with
`[CONNECTION_LOST] no connection to any of A, B, C before the deadline; the request
was not sent; is a FutureQ server running at A,B,C? (start one with `make run` ...)`,
sending the operator to look for a stopped server while one answered. The client knew
why it left that node's connections ("knows no leader") and said nothing of it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_process import cli
from cluster_process import Cluster

from futureq.client import open_client
from futureq.errors import NotSentError


@pytest.fixture
def lone_node(tmp_path: Path) -> Iterator[Cluster]:
    """A 3-node cluster whose nodes 2 and 3 are stopped (SIGSTOP) once it has a leader:
    node 1 answers, and knows no leader once its term's leader is gone or stepped down."""
    cluster = Cluster(tmp_path, 3)
    stopped: list[int] = []
    try:
        cluster.start()
        cluster.leader()
        for node_id in (2, 3):
            process = cluster.nodes[node_id].process
            assert process is not None
            os.kill(process.pid, signal.SIGSTOP)
            stopped.append(process.pid)
        deadline = time.monotonic() + 20
        while cluster.nodes[1].http_json("/api/status").get("leader_id") is not None:
            assert time.monotonic() < deadline, "node 1 kept a leader with no quorum"
            time.sleep(0.1)
        yield cluster
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        cluster.stop()


def test_the_cli_says_the_node_that_answered_knows_no_leader(lone_node: Cluster) -> None:
    servers = ",".join(lone_node.servers)
    done = cli(servers, "--request-timeout", "3s", "cancel", "reminders", "65536")
    assert done.returncode == 1, done
    assert "knows no leader" in done.stderr, done.stderr
    assert lone_node.servers[0] in done.stderr, done.stderr
    assert "the request was not sent" in done.stderr, done.stderr
    assert "is a FutureQ server running" not in done.stderr, done.stderr


async def test_the_client_says_the_node_that_answered_knows_no_leader(lone_node: Cluster) -> None:
    async with open_client(lone_node.servers, request_timeout_s=2.0) as client:
        with pytest.raises(NotSentError) as raised:
            await client.reschedule("reminders", [65536], delay_ms=1000)
    assert "knows no leader" in str(raised.value), str(raised.value)
    assert "no connection to any" not in str(raised.value), str(raised.value)
