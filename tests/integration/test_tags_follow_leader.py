"""A delivery the application holds when the leader hands over is settled on the next
leader by its tag (``docs/protocol.md``, "Delivery tags across leaders"), against a
real 3-node cluster.

Found by a tester: under leadership transfers, an application handed a delivery by the
old leader that acked it after reconnecting was refused (the tag was unknown to the new
leader), the message was delivered again, and with ``max_deliveries`` 1 the processed
message went to the dead-letter topic (3 of 300 under three transfers in a loop).
"""

from __future__ import annotations

from typing import Any

import trio
from cluster_process import Cluster
from wire_client import WireClient

from futureq.client import PublishItem, open_client
from futureq.errors import ErrorCode
from futureq.wire import frames

HANDED = 3
VISIBILITY_MS = 60_000
"""Far beyond the test: what is held must not come back by its deadline here."""


async def _hold_across(cluster: Cluster, client: Any, topic: str, how: str) -> list[bytes]:
    """The application takes every message, the leader hands over (``how``), then the
    application acks them all. Returns their tags."""
    await client.create_group(topic, "g", visibility_timeout_ms=VISIBILITY_MS, max_deliveries=1)
    await client.publish_batch([PublishItem(topic, b"%d" % i) for i in range(HANDED)])
    async with client.subscribe(topic, "g", prefetch=10) as sub:
        with trio.fail_after(15):
            handed = [await sub.__anext__() for _ in range(HANDED)]
        leader = cluster.leader(30)
        if how == "transfer":
            target = next(n for n in cluster.nodes if n != leader.node_id)
            await client.transfer_leader(target)
        else:
            await trio.to_thread.run_sync(leader.terminate)
        new_leader = cluster.leader(30, exclude={leader.node_id})
        assert new_leader.node_id != leader.node_id
        # Before: ConnectionLostError / the server refused the tags, and the messages
        # came again (max_deliveries 1: to the dead-letter topic).
        await sub.ack(handed)
        assert all(d.settled for d in handed)
        # Settled: not delivered again, to this subscription or any.
        assert await sub.receive(1.5) is None
    async with client.subscribe(f"{topic}.dlq", "inspect", prefetch=10) as dead:
        assert await dead.receive(0.5) is None
    pending = WireClient(new_leader.client_address).group_pending(topic, "g")
    assert pending == 0, (how, pending)
    return [d.tag for d in handed]


async def test_an_ack_after_a_handover_settles_what_the_application_held(
    cluster3: Cluster,
) -> None:
    async with open_client(cluster3.servers, request_timeout_s=30) as client:
        moved = await _hold_across(cluster3, client, "moved", "transfer")
        stopped = await _hold_across(cluster3, client, "stopped", "sigterm")
    # A tag settled once is refused afterwards, from any connection.
    leader = cluster3.leader(30)
    other = WireClient(leader.client_address)
    for tags in (moved, stopped):
        answer = other.request(frames.Ack(other.next_id(), tags[:1]))
        assert isinstance(answer, frames.Error), answer
        assert answer.code == ErrorCode.UNKNOWN_DELIVERY_TAG, answer
