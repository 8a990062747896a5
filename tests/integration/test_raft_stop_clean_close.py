"""A node's graceful stop ends its Raft peer connections cleanly: the other nodes see
their links closed (logged at INFO, "that node closed it"), not broken by a reset.

Before, a stopping node closed its inbound peer connections with the peers' messages
unread (a reset) and the peers, which only wrote on their links, found out by a write
failing (``Broken pipe``). Real ``futureq start`` processes on 127.0.0.1.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from cluster_process import Cluster


def test_the_peers_of_a_stopping_node_see_its_links_closed_not_broken(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 3, env={"FUTUREQ_SERVER_LOG_LEVEL": "debug"})
    try:
        cluster.start()
        leader = cluster.leader()
        stopping = next(n for n in cluster.nodes.values() if n is not leader)
        others = [n for n in cluster.nodes.values() if n is not stopping]
        assert stopping.terminate() == 0
        # The leader's link to it was up (it is ready: the stopping node acknowledged
        # its first entry): it ends one way or the other.
        closed = (
            f"raft link to node {stopping.node_id} at {stopping.raft_address}: that node "
            "closed it (stopping or restarting)"
        )
        broke = f"raft link to node {stopping.node_id} broke"
        deadline = time.monotonic() + 10
        while closed not in (text := leader.stderr_text()) and broke not in text:
            assert time.monotonic() < deadline, text[-3000:]
            time.sleep(0.02)
        for node in others:
            text = node.stderr_text()
            broken = re.findall(rf".*raft link to node {stopping.node_id} broke.*", text)
            assert not broken, broken
            loud = [
                line
                for line in text.splitlines()
                if (" WARNING " in line or " ERROR " in line) and f"node {stopping.node_id}" in line
            ]
            assert not loud, loud
    finally:
        cluster.stop()
