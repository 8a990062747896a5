"""Credit given back and deadlines moved earlier take effect at once, on a real node.

The dispatcher sleeps until its next planned wake-up (the earliest due time or
visibility deadline it knows). Each change that gives a consumer credit back or moves
a delivery's deadline earlier must wake it, or the consumer waits for some unrelated
wake-up: here the group's visibility timeout is 20 s and every test expects what it
waits for within 5 s (``docs/protocol.md``, "Flow control", "EXTEND", "REVOKE", "Due
time, TTL and expiry").

* A CANCEL's REVOKE (reason 3) returns a credit, which the next due message uses at once.
* An EXTEND shorter than what was left is honoured: REVOKE reason 1 and the redelivery
  come at the new deadline.
* A held delivery whose message's TTL runs out is revoked at its expiry (reason 2), its
  message removed, and its credit used at once.

Each runs on a single node, on the leader of a 3-node cluster and on a node of 2
shards.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import pytest
from cluster_process import Cluster
from test_shards import ShardedNode
from wire_client import WireClient

from futureq.errors import ErrorCode
from futureq.shards.slots import even_map
from futureq.wire import frames

VISIBILITY_MS = 20_000
"""The group's visibility timeout: what a consumer would wait without the wake-ups."""
WITHIN_S = 5.0
"""How long each test waits for what it expects (well before the visibility timeout)."""


Route = Callable[[str], str]
"""Topic -> the client address serving it (a node of shards routes by topic)."""
TOPICS = ("wake.cancel", "wake.extend", "wake.ttl")
"""The scenarios' topics, one each; on a node of 2 shards they fall on both shards."""


class BrokerProcess(Protocol):
    """What these tests use of the ``broker`` fixture (tests/integration/conftest.py)."""

    client_address: str


def _group(client: WireClient, topic: str) -> None:
    answer = client.request(frames.GroupCreate(client.next_id(), topic, "g", VISIBILITY_MS, None))
    assert isinstance(answer, frames.Ok), answer


def cancel_gives_credit_back(route: Route) -> None:
    topic = "wake.cancel"
    client = WireClient(route(topic))
    _group(client, topic)
    client.publish([[topic, b"x%d" % i, 0, None, None] for i in range(3)])
    client.subscribe(topic, "g", prefetch=2)
    held = client.deliveries(2)
    assert [d[2] for d in held] == [b"x0", b"x1"]
    answer = client.request(frames.Cancel(client.next_id(), topic, "g", [held[0][1]]))
    assert isinstance(answer, frames.ItemResults), answer
    revoke = client.wait_notice(frames.Revoke, timeout_s=WITHIN_S)
    assert (revoke.tags, revoke.reason) == ([held[0][0]], frames.RevokeReason.CANCELLED)
    [next_one] = client.deliveries(1, timeout_s=WITHIN_S)
    assert next_one[2] == b"x2"


def shorter_extend_is_honoured(route: Route) -> None:
    topic = "wake.extend"
    client = WireClient(route(topic))
    _group(client, topic)
    client.publish([[topic, b"work", 0, None, None]])
    client.subscribe(topic, "g", prefetch=1)
    [delivery] = client.deliveries(1)
    answer = client.request(frames.Extend(client.next_id(), [delivery[0]], 100))
    assert isinstance(answer, frames.Ok) and answer.result == 1, answer
    revoke = client.wait_notice(frames.Revoke, timeout_s=WITHIN_S)
    assert (revoke.tags, revoke.reason) == ([delivery[0]], frames.RevokeReason.VISIBILITY_TIMEOUT)
    [again] = client.deliveries(1, timeout_s=WITHIN_S)
    assert (again[1], again[5]) == (delivery[1], 2)


def expired_delivery_is_revoked_at_its_expiry(route: Route) -> None:
    topic = "wake.ttl"
    client = WireClient(route(topic))
    _group(client, topic)
    client.publish([[topic, b"short-ttl", 0, None, 300]])
    client.subscribe(topic, "g", prefetch=1)
    [delivery] = client.deliveries(1)
    client.publish([[topic, b"next", 0, None, None]])
    revoke = client.wait_notice(frames.Revoke, timeout_s=WITHIN_S)
    assert (revoke.tags, revoke.reason) == ([delivery[0]], frames.RevokeReason.REMOVED)
    [next_one] = client.deliveries(1, timeout_s=WITHIN_S)
    assert next_one[2] == b"next"
    answer = client.request(frames.Ack(client.next_id(), [delivery[0]]))
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.UNKNOWN_DELIVERY_TAG
    # The expiry commits through the log (replicated): "next" alone is left, soon.
    deadline = time.monotonic() + WITHIN_S
    while client.group_pending(topic, "g") != 1:
        assert time.monotonic() < deadline, "the expired message was not removed"
        time.sleep(0.05)


SCENARIOS: list[Callable[[Route], None]] = [
    cancel_gives_credit_back,
    shorter_extend_is_honoured,
    expired_delivery_is_revoked_at_its_expiry,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_on_a_single_node(broker: BrokerProcess, scenario: Callable[[Route], None]) -> None:
    scenario(lambda topic: broker.client_address)


def test_on_the_leader_of_a_cluster(cluster3: Cluster) -> None:
    address = cluster3.leader().client_address
    for scenario in SCENARIOS:
        scenario(lambda topic: address)


def test_on_a_node_of_two_shards(tmp_path: Path) -> None:
    node = ShardedNode(tmp_path / "data")
    node.start()
    try:
        slot_map = even_map(node.shard_addresses)
        assert {slot_map.shard_of(topic) for topic in TOPICS} == {0, 1}
        for scenario in SCENARIOS:
            scenario(lambda topic: node.shard_addresses[slot_map.shard_of(topic)])
    finally:
        if node.process is not None and node.process.poll() is None:
            node.terminate()
        node.kill()
