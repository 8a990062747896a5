"""Consumers resubscribed to a new leader (after a transfer) receive what is due, and
split it; back and forth a few times."""

from __future__ import annotations

import time

from cluster_process import Cluster
from wire_client import WireClient

from futureq.wire import frames


def test_consumers_after_leader_transfers(cluster3: Cluster) -> None:
    for cycle in range(3):
        leader = cluster3.leader(30)
        consumers = [WireClient(leader.client_address) for _ in range(3)]
        for c in consumers:
            c.subscribe("t", "g", prefetch=1000)
        pub = WireClient(leader.client_address)
        answer = pub.publish([["t", b"%d" % i, None, None, None] for i in range(30)])
        assert isinstance(answer, frames.PublishOk), answer
        per = [0, 0, 0]
        deadline = time.monotonic() + 15
        while sum(per) < 30:
            assert time.monotonic() < deadline, (cycle, per)
            for i, c in enumerate(consumers):
                ds = c.poll_deliveries()
                if not ds:
                    continue
                per[i] += len(ds)
                answer = c.request(frames.Ack(c.next_id(), [d[0] for d in ds]))
                assert isinstance(answer, frames.Ok), answer
        assert min(per) > 0, per
        target = next(n for n in cluster3.nodes if n != leader.node_id)
        answer = pub.request(frames.ClusterTransferLeader(pub.next_id(), target), 30)
        assert isinstance(answer, frames.Ok), answer
        for c in [*consumers, pub]:
            c.close()
        deadline = time.monotonic() + 30
        while cluster3.leader(30).node_id != target:
            assert time.monotonic() < deadline
            time.sleep(0.05)
