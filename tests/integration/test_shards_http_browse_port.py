"""``/api/browse`` on a shard's own HTTP port for a topic another shard owns (issue 15).

The node's HTTP port (shard 0's) routes ``/api/browse`` to the topic's shard; shard
``K``'s own port answers for shard ``K`` alone. Before, shard 1's port answered a topic
of shard 0 as if it were its own: ``400 UNKNOWN_TOPIC ... has no consumer group, so no
message of it is pending`` about a topic whose messages were pending on shard 0. Now
it answers 421 WRONG_SHARD naming the owner and the node's port, as BROWSE over the wire
is refused with WRONG_SHARD. Real ``futureq start --shards 2`` on 127.0.0.1, no mocks.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from test_shards import STRIDE, TOPICS, ShardedNode, cli
from test_shards import node as node  # the fixture: one sharded node

from futureq.shards.layout import shift_address
from futureq.shards.slots import even_map

pytestmark = pytest.mark.timeout(120)


def _get(address: str, target: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://{address}{target}", timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, json.loads(refused.read())


def _one_pending_on_each_shard(node: ShardedNode) -> tuple[str, str]:
    """A topic of shard 0 and one of shard 1, each with group ``g`` and one message
    pending."""
    slot_map = even_map(node.shard_addresses)
    zero = next(t for t in TOPICS if slot_map.shard_of(t) == 0)
    one = next(t for t in TOPICS if slot_map.shard_of(t) == 1)
    for topic in (zero, one):
        assert cli(node.client_address, "group", "create", topic, "g").returncode == 0
        assert cli(node.client_address, "publish", topic, "pending").returncode == 0
    return zero, one


@pytest.mark.parametrize("path", ["/api/browse", "/api/browse/counts"])
def test_a_shards_own_port_refuses_another_shards_topic(node: ShardedNode, path: str) -> None:
    zero, one = _one_pending_on_each_shard(node)
    extra = "&bounds_ms=60000&relative=true" if path.endswith("counts") else ""
    shard1_http = shift_address(node.http_address, STRIDE)

    status, body = _get(shard1_http, f"{path}?topic={zero}{extra}")
    assert status == 421, body
    assert body["code"] == "WRONG_SHARD"
    assert body["shard"] == 0
    assert "belongs to shard 0 of this node" in body["message"]
    assert body["message"].endswith(
        f"ask the node's HTTP port ({node.http_address}), which answers for every shard"
    )
    # The same topic's dead letters are its shard's too.
    status, body = _get(shard1_http, f"{path}?topic={zero}.dlq{extra}")
    assert (status, body["code"]) == (421, "WRONG_SHARD"), body

    # The node's port answers for every shard; shard 1's port for its own topics.
    for address, topic in ((node.http_address, zero), (node.http_address, one), (shard1_http, one)):
        status, body = _get(address, f"{path}?topic={topic}{extra}")
        assert status == 200, (address, topic, body)
        assert body["group"] == "g"


def test_local_true_on_the_node_port_gives_shard_0s_own_browse(node: ShardedNode) -> None:
    """``?local=true`` gives shard 0's own answer on every endpoint (docs/sharding.md).
    Before, ``/api/browse?local=true`` was refused ``400`` as an unknown parameter."""
    zero, one = _one_pending_on_each_shard(node)
    status, body = _get(node.http_address, f"/api/browse?topic={zero}&local=true")
    assert status == 200, body
    assert body["group"] == "g"
    assert len(body["messages"]) == 1
    status, body = _get(node.http_address, f"/api/browse?topic={one}&local=true")
    assert (status, body["code"], body["shard"]) == (421, "WRONG_SHARD", 1), body
