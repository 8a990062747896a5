"""A settlement of a dead delivery tag is told why the tag is dead (issue: delivery
state broken as a misbehaving consumer would), against a real ``futureq start``.

Found by a breaker: an ACK, NACK, RELEASE or EXTEND of a tag taken back after its
visibility timeout, by the end of its subscription, by its message's expiry or
RESCHEDULE, by its group's deletion, or handed out before a crash, was answered with
the one sentence "unknown delivery tag: already settled, taken back after its
visibility timeout (see REVOKE), or never delivered" -- wrong for most of them (a
message that expired while out is never delivered again; a tag of a deleted group
can never settle; a tag of a crashed leader's delivery comes again with a new tag).
The code stays UNKNOWN_DELIVERY_TAG; the sentence now names the cause.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cluster_process import Cluster
from wire_client import WireClient

from futureq.errors import ErrorCode
from futureq.wire import frames


def refused(client: WireClient, frame: frames.Frame) -> str:
    """The sentence of ``frame``'s UNKNOWN_DELIVERY_TAG answer (asserted)."""
    answer = client.request(frame)
    assert isinstance(answer, frames.Error), answer
    assert (answer.code, answer.item_index) == (ErrorCode.UNKNOWN_DELIVERY_TAG, 0), answer
    return str(answer.message)


def create(client: WireClient, topic: str, visibility_timeout_ms: int) -> None:
    answer = client.request(
        frames.GroupCreate(client.next_id(), topic, "g", visibility_timeout_ms, 10)
    )
    assert isinstance(answer, frames.Ok), answer


def one_delivery(client: WireClient, topic: str, ttl_ms: int | None = None) -> list[Any]:
    assert isinstance(client.publish([[topic, b"x", 0, None, ttl_ms]]), frames.PublishOk)
    client.subscribe(topic, "g", prefetch=1)
    [delivery] = client.deliveries(1)
    return delivery


def test_a_dead_tag_is_told_why(broker: Any) -> None:
    client = WireClient(broker.client_address)
    admin = WireClient(broker.client_address)

    # Taken back after its visibility timeout: it comes again, counted.
    create(client, "why.vt", 300)
    tag = one_delivery(client, "why.vt")[0]
    client.wait_notice(frames.Revoke)
    for frame in (
        frames.Ack(client.next_id(), [tag]),
        frames.Extend(client.next_id(), [tag], 10_000),
    ):
        message = refused(client, frame)
        assert "taken back after its visibility timeout" in message, message
        assert "comes again with a new tag" in message, message

    # Its message expired while out: never delivered again.
    client = WireClient(broker.client_address)  # (the last one's pushes go on)
    create(client, "why.ttl", 60_000)
    tag = one_delivery(client, "why.ttl", ttl_ms=300)[0]
    client.wait_notice(frames.Revoke)
    message = refused(client, frames.Nack(client.next_id(), [tag], 0))
    assert "expired (its ttl_ms ran out) while it was out" in message, message

    # Its message was rescheduled while out.
    client = WireClient(broker.client_address)  # (the last one's pushes go on)
    create(client, "why.moved", 60_000)
    delivery = one_delivery(client, "why.moved")
    answer = admin.request(
        frames.Reschedule(admin.next_id(), "why.moved", "g", [delivery[1]], None, 60_000)
    )
    assert isinstance(answer, frames.ItemResults), answer
    client.wait_notice(frames.Revoke)
    message = refused(client, frames.Ack(client.next_id(), [delivery[0]]))
    assert "rescheduled (RESCHEDULE) while it was out" in message, message

    # Its subscription ended (UNSUBSCRIBE) while it was out.
    client = WireClient(broker.client_address)  # (the last one's pushes go on)
    create(client, "why.left", 60_000)
    assert isinstance(client.publish([["why.left", b"x", 0, None, None]]), frames.PublishOk)
    sid = client.subscribe("why.left", "g", prefetch=1)
    [delivery] = client.deliveries(1)
    assert isinstance(client.request(frames.Unsubscribe(client.next_id(), sid)), frames.Ok)
    message = refused(client, frames.Release(client.next_id(), [delivery[0]]))
    assert "taken back when its subscription ended" in message, message

    # Its group was deleted while it was out, then created again with the same name.
    client = WireClient(broker.client_address)  # (the last one's pushes go on)
    create(client, "why.gone", 60_000)
    tag = one_delivery(client, "why.gone")[0]
    answer = admin.request(frames.GroupDelete(admin.next_id(), "why.gone", "g"))
    assert isinstance(answer, frames.Ok), answer
    create(admin, "why.gone", 60_000)
    message = refused(client, frames.Ack(client.next_id(), [tag]))
    assert "consumer group was deleted while it was out" in message, message


def test_a_tag_from_before_a_crash_is_told_so(broker_factory: Callable[..., Any]) -> None:
    """SIGKILL while a delivery is out: the restarted node delivers it again with a new
    tag (docs/protocol.md, "Delivery tags across leaders"); the old tag is refused with
    a sentence saying it was handed out before (by an earlier leader or before a
    restart), and the new one settles it."""
    node = broker_factory()
    client = WireClient(node.client_address)
    create(client, "why.crash", 60_000)
    before = one_delivery(client, "why.crash")
    node.kill()
    client.close()
    node.start()
    client = WireClient(node.client_address)
    client.subscribe("why.crash", "g", prefetch=1)
    [after] = client.deliveries(1)
    assert after[1] == before[1] and after[0] != before[0]
    message = refused(client, frames.Ack(client.next_id(), [before[0]]))
    assert (
        "not handed out by this leader: an earlier leader (or this node before a restart)"
        in message
    )
    answer = client.request(frames.Ack(client.next_id(), [after[0]]))
    assert isinstance(answer, frames.Ok) and answer.result == 1, answer


def test_a_held_tag_settled_on_the_next_leader_says_so_the_second_time(cluster3: Cluster) -> None:
    """A delivery out when its leader hands over (CLUSTER_TRANSFER_LEADER) is settled by
    its tag on the next leader, once; the second ACK of it is told it was settled
    already (before: the generic sentence, which named a visibility timeout)."""
    leader = cluster3.leader(30)
    client = WireClient(leader.client_address)
    create(client, "why.held", 60_000)
    tag = one_delivery(client, "why.held")[0]
    target = next(n for n in cluster3.nodes if n != leader.node_id)
    answer = client.request(frames.ClusterTransferLeader(client.next_id(), target), 30)
    assert isinstance(answer, frames.Ok), answer
    client.close()
    deadline = time.monotonic() + 30
    while (leader := cluster3.leader(30)).node_id != target:
        assert time.monotonic() < deadline, "the transfer did not happen"
        time.sleep(0.05)
    other = WireClient(leader.client_address)
    answer = other.request(frames.Ack(other.next_id(), [tag]))
    assert isinstance(answer, frames.Ok) and answer.result == 1, answer
    message = refused(other, frames.Ack(other.next_id(), [tag]))
    assert "was already settled by its tag" in message, message
