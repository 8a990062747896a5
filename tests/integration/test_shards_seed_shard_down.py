"""A client given one node of a sharded cluster whose process for one shard is down.

Three nodes of 2 shards; node 3's shard 1 process is stopped (SIGSTOP), the rest of
the cluster serves (shard 1's group has a quorum and a leader on nodes 1 and 2).
``futureq-cli --server NODE3`` for a topic of shard 1: before, the shard's client knew
only node 3's shard 1 (the map's address and the seed's), never having connected to
it, so every such command failed with ``[CONNECTION_LOST] shard 1: no connection to any
of 127.0.0.1:P`` though its group served. Now the shard's client also tries shard 1
on every member shard 0's HELLO_OK named. Real ``futureq start --shards 2`` processes
on 127.0.0.1, no mocks.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from proc_table import children, shard_index
from test_shards import STRIDE, TOPICS, _sharded_cluster, cli

from futureq.shards.slots import even_map

pytestmark = pytest.mark.timeout(180)


def test_cli_on_a_node_whose_shard_is_stopped_reaches_the_shard_on_other_nodes(
    tmp_path: Path,
) -> None:
    nodes, ports = _sharded_cluster(tmp_path)
    stopped: int | None = None
    try:
        for each in nodes.values():
            each.start()
        node3 = f"127.0.0.1:{ports[3][0]}"
        slot_map = even_map([node3, f"127.0.0.1:{ports[3][0] + STRIDE}"])
        topic = next(t for t in TOPICS if slot_map.shard_of(t) == 1)
        made = cli(node3, "--request-timeout", "30s", "group", "create", topic, "g")
        assert made.returncode == 0, made.stderr
        stopped = next(p for p in children(nodes[3].pid) if shard_index(p) == 1)
        os.kill(stopped, signal.SIGSTOP)

        done = cli(node3, "--request-timeout", "30s", "publish", topic, "while-stopped")
        assert done.returncode == 0, done.stderr
        listed = cli(
            node3, "--request-timeout", "30s", "browse", topic, "--json", "--preview", "100"
        )
        assert listed.returncode == 0, listed.stderr
        assert [json.loads(line)["preview"] for line in listed.stdout.splitlines()] == [
            "while-stopped"
        ]
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        for each in nodes.values():
            if each.alive():
                each.terminate()
