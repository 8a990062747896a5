"""What one connection sends in order takes effect in order (``docs/protocol.md``,
"Requests"): a raw socket pipelines many state-changing requests in one write, without
waiting for any answer, and the effects must follow the order sent.

Before, each request ran in its own task and trio runs a batch of new tasks in either
order, so two PUBLISHes sent together got their ids (their place in the log) reversed
about half the time, a NACK sent after an ACK of the same delivery could take it first,
and a GROUP_DELETE sent after a GROUP_CREATE could be told the group does not exist.
"""

from __future__ import annotations

from typing import Any

from broker_process import BrokerProcess
from cluster_process import Cluster
from wire_client import WireClient

from futureq.wire import codec, frames

ROUNDS = 150


def _answers(client: WireClient, ids: list[int]) -> dict[int, Any]:
    """The answer to each request id of ``ids`` (pushes meanwhile are kept)."""
    wanted = set(ids)
    got: dict[int, Any] = {}
    while len(got) < len(wanted):
        frame = client.receive(30)
        assert frame is not codec.CLOSED, got
        if isinstance(frame, frames.Deliver):
            client.pushed.append(frame)
            continue
        if client._is_notice(frame):
            client.notices.append(frame)
            continue
        assert frame.request_id in wanted, frame
        got[frame.request_id] = frame
    return got


def _pipeline(client: WireClient, requests: list[frames.Frame]) -> list[Any]:
    """Send every request in one write; their answers, in the order sent."""
    client.send_raw(b"".join(codec.encode_frame(request, 2**31) for request in requests))
    got = _answers(client, [request.request_id for request in requests])  # type: ignore[attr-defined]
    return [got[request.request_id] for request in requests]  # type: ignore[attr-defined]


def _item(payload: bytes) -> list[Any]:
    return ["ordered", payload, None, None, None]


def test_pipelined_publishes_are_logged_in_the_order_sent(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address)
    # A large batch first (its validation yields to the event loop in steps), then
    # small ones: each must still be placed after the one sent before it.
    big = [_item(b"%d" % i) for i in range(5_000)]
    requests: list[frames.Frame] = []
    for n in range(ROUNDS):
        items = big if n % 50 == 0 else [_item(b"one")]
        level = frames.AckLevel.LEADER if n % 2 else frames.AckLevel.QUORUM
        requests.append(frames.Publish(client.next_id(), level, items))
    answers = _pipeline(client, requests)
    first_ids = []
    for answer in answers:
        assert isinstance(answer, frames.PublishOk), answer
        first_ids.append(answer.first_id)
    out_of_order = [
        (n, first_ids[n - 1], first_ids[n])
        for n in range(1, len(first_ids))
        if first_ids[n] <= first_ids[n - 1]
    ]
    assert not out_of_order, f"{len(out_of_order)} publishes logged before an earlier one"


def test_pipelined_ack_then_nack_of_one_delivery_acknowledges_it(broker: BrokerProcess) -> None:
    publisher = WireClient(broker.client_address)
    answer = publisher.publish([["acks", b"m%d" % i, None, None, None] for i in range(ROUNDS)])
    assert isinstance(answer, frames.PublishOk), answer
    consumer = WireClient(broker.client_address)
    consumer.subscribe("acks", "g", prefetch=ROUNDS)
    tags = [delivery[0] for delivery in consumer.deliveries(ROUNDS)]
    requests: list[frames.Frame] = []
    for tag in tags:
        requests.append(frames.Ack(consumer.next_id(), [tag]))
        requests.append(frames.Nack(consumer.next_id(), [tag], 0))
    answers = _pipeline(consumer, requests)
    acked = answers[0::2]
    nacked = answers[1::2]
    assert all(isinstance(a, frames.Ok) and a.result == 1 for a in acked), [
        a for a in acked if not (isinstance(a, frames.Ok) and a.result == 1)
    ][:3]
    # The NACK came after its delivery was acknowledged: nothing left to refuse.
    assert all(not (isinstance(a, frames.Ok) and a.result) for a in nacked), nacked[:3]
    consumer.expect_nothing(0.3)  # none came back: every one was acknowledged


def test_pipelined_group_create_then_delete_finds_the_group(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address)
    requests: list[frames.Frame] = []
    for n in range(ROUNDS // 3):
        requests.append(frames.GroupCreate(client.next_id(), "admin", f"g{n}", 30_000))
        requests.append(frames.GroupDelete(client.next_id(), "admin", f"g{n}"))
        requests.append(frames.GroupCreate(client.next_id(), "admin", f"g{n}", 40_000))
    answers = _pipeline(client, requests)
    wrong = [(n, a) for n, a in enumerate(answers) if not isinstance(a, frames.Ok)]
    assert not wrong, f"{len(wrong)} refused, first {wrong[:3]}"
    status = client.status()
    (topic,) = [entry for entry in status["topics"] if entry["topic"] == "admin"]
    groups = {g["group"] for g in topic["groups"]}
    assert groups >= {f"g{n}" for n in range(ROUNDS // 3)}, groups


def _logged_in_order(client: WireClient, topic: str, count: int) -> list[int]:
    """Subscribe to ``topic``'s default group: the sequence numbers (payloads) of its
    ``count`` messages, in id order (the order of the log)."""
    client.subscribe(topic, "default", prefetch=count)
    by_id = sorted((delivery[1], int(delivery[2])) for delivery in client.deliveries(count))
    return [sequence for _id, sequence in by_id]


def test_pipelined_publishes_of_mixed_ack_levels_are_logged_in_the_order_sent(
    broker: BrokerProcess,
) -> None:
    """Ack-level-NONE publishes go through the background publisher: one sent before a
    publish of another level must still be logged first."""
    client = WireClient(broker.client_address)
    levels = [frames.AckLevel.NONE, frames.AckLevel.LEADER, frames.AckLevel.QUORUM]
    requests: list[frames.Frame] = [
        frames.Publish(
            client.next_id(),
            levels[(n // 3 + n) % 3],
            [["mixed", b"%d" % n, None, None, None]],
        )
        for n in range(ROUNDS)
    ]
    answers = _pipeline(client, requests)
    assert all(isinstance(answer, frames.PublishOk) for answer in answers), answers
    sequences = _logged_in_order(client, "mixed", ROUNDS)
    assert sequences == list(range(ROUNDS)), sequences


def test_pipelined_requests_to_a_cluster_leader_take_effect_in_order(cluster3: Cluster) -> None:
    """The same through Raft: publishes of every ack level, then an ACK and a NACK of
    each delivery, sent without waiting."""
    client = WireClient(cluster3.leader(30).client_address)
    levels = [frames.AckLevel.QUORUM, frames.AckLevel.NONE, frames.AckLevel.LEADER]
    requests: list[frames.Frame] = [
        frames.Publish(client.next_id(), levels[n % 3], [["raft", b"%d" % n, None, None, None]])
        for n in range(ROUNDS)
    ]
    answers = _pipeline(client, requests)
    assert all(isinstance(answer, frames.PublishOk) for answer in answers), answers
    client.subscribe("raft", "default", prefetch=ROUNDS)
    deliveries = client.deliveries(ROUNDS)
    by_id = sorted((delivery[1], int(delivery[2])) for delivery in deliveries)
    assert [sequence for _id, sequence in by_id] == list(range(ROUNDS))
    settle: list[frames.Frame] = []
    for delivery in deliveries:
        settle.append(frames.Ack(client.next_id(), [delivery[0]]))
        settle.append(frames.Nack(client.next_id(), [delivery[0]], 0))
    answers = _pipeline(client, settle)
    assert all(isinstance(a, frames.Ok) and a.result == 1 for a in answers[0::2]), answers[:6]


def test_a_refused_publish_between_two_keeps_the_order_of_the_others(
    broker: BrokerProcess,
) -> None:
    """An ack-level-NONE publish, then one refused (a bad field) once the first is
    queued for the background publisher, then one of another level: the third must
    still be logged after the first. Before, the refused one passed its turn without
    saying the first was still with the background publisher, so the third overtook it
    whenever that publisher was busy."""
    client = WireClient(broker.client_address)
    # An ack-level-NONE batch ahead keeps the background publisher busy, so that the
    # publish after it waits there while the requests after it are served.
    backlog = [["backlog", b"x" * 100, None, None, None]] * 5_000
    refused_ids: list[int] = []
    answers: dict[int, Any] = {}
    rounds = 10
    for n in range(rounds):
        first = [
            *[frames.Publish(client.next_id(), frames.AckLevel.NONE, backlog) for _ in range(8)],
            frames.Publish(
                client.next_id(),
                frames.AckLevel.NONE,
                [["refused", b"%d" % (2 * n), None, None, None]],
            ),
        ]
        client.send_raw(b"".join(codec.encode_frame(request, 2**31) for request in first))
        # Answered once queued for the background publisher, which has the batches
        # ahead of it to log first.
        answers.update(_answers(client, [request.request_id for request in first]))
        refused = frames.Publish(
            client.next_id(), frames.AckLevel.LEADER, [["refused", b"bad", -5, None, None]]
        )
        third = frames.Publish(
            client.next_id(),
            frames.AckLevel.LEADER,
            [["refused", b"%d" % (2 * n + 1), None, None, None]],
        )
        client.send_raw(
            b"".join(codec.encode_frame(request, 2**31) for request in (refused, third))
        )
        answers.update(_answers(client, [refused.request_id, third.request_id]))
        refused_ids.append(refused.request_id)
    for request_id in answers:
        expected = frames.Error if request_id in refused_ids else frames.PublishOk
        assert isinstance(answers[request_id], expected), answers[request_id]
    sequences = _logged_in_order(client, "refused", 2 * rounds)
    assert sequences == list(range(2 * rounds)), sequences
