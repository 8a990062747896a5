"""Keyed publishes with a small idempotency window in a 3-node cluster, a follower
restarted (its key_time_floor reset) and the leadership moved: replicas must keep the
same applied digest (key_time_floor is node-local)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_process import Cluster
from peer_attacks import converged
from wire_client import WireClient

from futureq.wire import frames


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, 3, env={"FUTUREQ_QUEUE_IDEMPOTENCY_WINDOW_MS": "150"})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _round(cluster: Cluster, seed: int, batches: int) -> None:
    leader = cluster.leader(30)
    pub = WireClient(leader.client_address)
    con = WireClient(leader.client_address)
    con.subscribe("t", "g", prefetch=5000)
    for b in range(batches):
        items = [
            ["t", b"x", None, None, None, None, f"k{seed}-{(b * 8 + i) % 300}"] for i in range(8)
        ]
        answer = pub.publish(items)
        assert isinstance(answer, frames.PublishOk), answer
        if b % 5 == 4:
            # settle some: keys whose message is gone become prunable
            got = con.poll_deliveries(1)
            while con.pushed:
                got += con.poll_deliveries(1)
            if got:
                answer = con.request(frames.Ack(con.next_id(), [d[0] for d in got]))
                assert isinstance(answer, frames.Ok), answer
        if b % 40 == 0:
            time.sleep(0.2)  # past the window
    pub.close()
    con.close()


def test_replicas_agree_after_keyed_publishes_restarts_and_leader_change(
    cluster3: Cluster,
) -> None:
    # converged() waits for one applied index everywhere and asserts one digest there.
    _round(cluster3, 1, 200)
    converged(cluster3, 30)
    leader = cluster3.leader(30)
    follower = next(n for n in cluster3.nodes.values() if n.node_id != leader.node_id)
    follower.restart()
    _round(cluster3, 1, 200)
    converged(cluster3, 30)
    leader.restart()  # leadership moves; its floor resets too
    _round(cluster3, 2, 200)
    _round(cluster3, 1, 100)
    converged(cluster3, 30)
