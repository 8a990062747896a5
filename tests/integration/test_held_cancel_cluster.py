"""A delivery held across a leadership transfer, then cancelled or purged on the new
leader: its tag answers DELIVERY_CANCELLED (265), against a real 3-node cluster
(``docs/protocol.md``, "Delivery tags across leaders" and "A delivery whose message
was cancelled").

Found by a tester: group ``can/g`` (visibility 60 s, max_deliveries 3), 4 published
and taken by a raw version 1 connection; CLUSTER_TRANSFER_LEADER; on the new leader
CANCEL of two answered DELIVERED, then an ACK of one's tag got UNKNOWN_DELIVERY_TAG
(210), which clients read as "taken back and delivered again", though they never are.
PURGE then ACK or NACK of a held tag did the same.
"""

from __future__ import annotations

import trio
from cluster_process import Cluster
from wire_client import WireClient

from futureq.client import PublishItem, open_client
from futureq.errors import ErrorCode
from futureq.wire import frames


async def test_cancel_and_purge_of_deliveries_held_across_a_transfer(cluster3: Cluster) -> None:
    async with open_client(cluster3.servers, request_timeout_s=30) as client:
        await client.create_group("can", "g", visibility_timeout_ms=60_000, max_deliveries=3)
        await client.publish_batch([PublishItem("can", b"%d" % i) for i in range(4)])
        leader = cluster3.leader(30)
        consumer = WireClient(leader.client_address)
        consumer.subscribe("can", "g", prefetch=10)
        d0, d1, d2, d3 = consumer.deliveries(4, timeout_s=15)
        target = next(n for n in cluster3.nodes if n != leader.node_id)
        await client.transfer_leader(target)
    new_leader = cluster3.leader(30, exclude={leader.node_id})
    other = WireClient(new_leader.client_address)
    answer = other.request(frames.Cancel(other.next_id(), "can", "g", [d0[1], d1[1]]))
    assert isinstance(answer, frames.ItemResults), answer
    assert answer.results == [int(frames.ItemStatus.DELIVERED)] * 2
    for settle in (
        frames.Ack(other.next_id(), [d0[0]]),
        frames.Nack(other.next_id(), [d1[0]], 0),
    ):
        answer = other.request(settle)
        assert isinstance(answer, frames.Error), answer
        assert (answer.code, answer.item_index) == (ErrorCode.DELIVERY_CANCELLED, 0), answer
    answer = other.request(frames.Purge(other.next_id(), "can", "g"))
    assert isinstance(answer, frames.Ok), answer
    for settle in (
        frames.Ack(other.next_id(), [d2[0]]),
        frames.Nack(other.next_id(), [d3[0]], 0),
    ):
        answer = other.request(settle)
        assert isinstance(answer, frames.Error), answer
        assert (answer.code, answer.item_index) == (ErrorCode.DELIVERY_CANCELLED, 0), answer
    # Once the purge's chunks removed the entries, the tags still answer so.
    with trio.fail_after(15):
        while other.group_pending("can", "g") != 0:  # noqa: ASYNC110 - polls the leader, under a deadline
            await trio.sleep(0.05)
    answer = other.request(frames.Ack(other.next_id(), [d0[0], d2[0], d3[0]]))
    assert isinstance(answer, frames.Error), answer
    assert (answer.code, answer.item_index) == (ErrorCode.DELIVERY_CANCELLED, 0), answer
