"""A delivery held across a leadership transfer, then rescheduled on the new leader:
its tag's settlement is refused UNKNOWN_DELIVERY_TAG saying it was rescheduled, as on
the leader that handed it out (``docs/protocol.md``, RESCHEDULE and "Delivery tags
across leaders").

Found by a tester: group ``mv/g`` (visibility 30 s), a message taken by a consumer;
TRANSFER_LEADER; on the new leader RESCHEDULE of it answered DONE, then the ACK of the
held tag was told "this delivery tag was not handed out by this leader: an earlier
leader ... did not hand it over (a crash, or leadership lost)", though it was handed
over and the cause is the RESCHEDULE (on the leader that handed it out, the same ACK is
told "rescheduled (RESCHEDULE) while it was out"). The sibling of the CANCEL case of
``test_held_cancel_cluster.py``.
"""

from __future__ import annotations

from cluster_process import Cluster
from wire_client import WireClient

from futureq.client import open_client
from futureq.errors import ErrorCode
from futureq.wire import frames


async def test_reschedule_of_a_delivery_held_across_a_transfer(cluster3: Cluster) -> None:
    async with open_client(cluster3.servers, request_timeout_s=30) as client:
        await client.create_group("mv", "g", visibility_timeout_ms=30_000, max_deliveries=5)
        await client.publish("mv", b"m")
        leader = cluster3.leader(30)
        consumer = WireClient(leader.client_address)
        consumer.subscribe("mv", "g", prefetch=10)
        (held,) = consumer.deliveries(1, timeout_s=15)
        target = next(n for n in cluster3.nodes if n != leader.node_id)
        await client.transfer_leader(target)
    new_leader = cluster3.leader(30, exclude={leader.node_id})
    other = WireClient(new_leader.client_address)
    answer = other.request(frames.Reschedule(other.next_id(), "mv", "g", [held[1]], None, 600_000))
    assert isinstance(answer, frames.ItemResults), answer
    assert answer.results == [int(frames.ItemStatus.DONE)]
    for settle in (
        frames.Ack(other.next_id(), [held[0]]),
        frames.Nack(other.next_id(), [held[0]], 0),
    ):
        answer = other.request(settle)
        assert isinstance(answer, frames.Error), answer
        assert (answer.code, answer.item_index) == (ErrorCode.UNKNOWN_DELIVERY_TAG, 0), answer
        assert "rescheduled (RESCHEDULE) while it was out" in answer.message, answer.message
    # The message stays pending at its new time (the refused settlements changed nothing).
    assert other.group_pending("mv", "g") == 1
