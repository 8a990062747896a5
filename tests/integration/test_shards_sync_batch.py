"""A ``SyncClient``'s batch over both shards of a node, stored in part (issue 15).

A batch spanning shards is atomic per shard only: one shard may store its part while
another refuses or cannot be reached. The async client says which items were stored
(``publish_batch(..., stored={})``); before, ``SyncClient.publish_batch`` took no such
argument, so a synchronous caller told "6 of the 12 messages were stored ... (their
positions and ids are in publish_batch's stored=)" had no way to learn which, and could
only resend the whole batch (storing one shard's part twice) or drop the other's. And
the error of a part whose outcome is unknown did not say that other parts were stored.
Real ``futureq start --shards 2`` on 127.0.0.1, no mocks.
"""

from __future__ import annotations

import os
import signal

import pytest
from test_shards import TOPICS, ShardedNode
from test_shards import node as node  # the fixture: one sharded node

from futureq.client._batching import PublishItem
from futureq.client.sync import SyncClient
from futureq.errors import ConnectionLostError, RequestError
from futureq.shards.slots import even_map

pytestmark = pytest.mark.timeout(120)


def _topics(node: ShardedNode) -> tuple[str, str]:
    """A topic of shard 0 and one of shard 1."""
    slot_map = even_map(node.shard_addresses)
    return (
        next(t for t in TOPICS if slot_map.shard_of(t) == 0),
        next(t for t in TOPICS if slot_map.shard_of(t) == 1),
    )


def _payloads(client: SyncClient, topic: str) -> list[bytes]:
    """Every pending payload of ``topic``'s group ``g``, in due order."""
    page = client.browse(topic, "g", limit=100, preview_bytes=100)
    return [m.preview or b"" for m in page.messages]


def test_sync_batch_says_what_one_shard_stored_when_the_other_refuses(
    node: ShardedNode,
) -> None:
    zero, one = _topics(node)
    items = [
        PublishItem(zero, b"z0", idempotency_key="k0"),
        PublishItem(one, b"bad", headers={"futureq-x": "1"}),  # reserved header prefix
        PublishItem(zero, b"z1"),
    ]
    with SyncClient(node.client_address, request_timeout_s=10) as client:
        for topic in (zero, one):
            client.create_group(topic, "g")
        first = client.publish(zero, b"earlier", idempotency_key="k0")
        stored: dict[int, int] = {}
        duplicates: list[int] = []
        with pytest.raises(RequestError) as refused:
            client.publish_batch(items, stored=stored, duplicates=duplicates)
        assert refused.value.item_index == 1  # its position in the whole batch
        # Shard 0 stored its part (positions 0 and 2), shard 1 nothing.
        assert sorted(stored) == [0, 2]
        assert stored[0] == first  # the idempotency key named the earlier message
        assert duplicates == [0]
        # Resending only what was not stored stores each message once.
        client.publish_batch([PublishItem(one, b"good")])
        assert _payloads(client, zero) == [b"earlier", b"z1"]
        assert _payloads(client, one) == [b"good"]


def test_sync_batch_says_what_was_stored_when_a_shard_is_stopped(node: ShardedNode) -> None:
    zero, one = _topics(node)
    items = [PublishItem(one, b"o0"), PublishItem(zero, b"z0"), PublishItem(zero, b"z1")]
    with SyncClient(node.client_address, connect_timeout_s=1, request_timeout_s=3) as client:
        for topic in (zero, one):
            client.create_group(topic, "g")
        pid = node.pid_of_shard(1)
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            stored: dict[int, int] = {}
            with pytest.raises(ConnectionLostError) as lost:
                client.publish_batch(items, stored=stored)
            # Sent on a connection shard 1 stopped answering: its part's outcome is
            # unknown; shard 0's part is known stored, by position and id.
            assert sorted(stored) == [1, 2]
            assert all(stored[i] > 0 for i in (1, 2))
            assert "shard 1" in str(lost.value)
            # The message says shard 0's part was stored, so "outcome unknown" is not
            # read as the whole batch's (resent whole, that part is stored twice).
            assert "2 of the 3 messages were stored all the same" in str(lost.value)
            assert "never send those again" in str(lost.value)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert _payloads(client, zero) == [b"z0", b"z1"]
