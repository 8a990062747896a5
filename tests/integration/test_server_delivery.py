"""Delivery semantics against a real server: never early, TTL from the due time,
fan-out across groups, round-robin within a group, credit, visibility timeout,
redelivery when a consumer leaves, nack, dead-lettering. Real time on 127.0.0.1:
waits are socket deadlines, and delays are kept short."""

from __future__ import annotations

import time

from broker_process import BrokerProcess
from wire_client import WireClient

from futureq.wire import frames


def _ids(deliveries: list[list[object]]) -> list[object]:
    return [d[1] for d in deliveries]


def test_delayed_message_is_never_delivered_early(broker: BrokerProcess) -> None:
    consumer = WireClient(broker.client_address)
    consumer.subscribe("delayed", "g")
    producer = WireClient(broker.client_address)
    sent_ms = time.time() * 1000
    answer = producer.publish(
        [["delayed", b"later", 400, None, None], ["delayed", b"now", 0, None, None]]
    )
    assert isinstance(answer, frames.PublishOk)
    first, second = consumer.deliveries(2)
    assert first[2] == b"now" and second[2] == b"later"
    for delivery in (first, second):
        due_ms, _publish_ms, attempt, delivered_ms = (
            delivery[3],
            delivery[4],
            delivery[5],
            delivery[6],
        )
        assert delivered_ms >= due_ms, "delivered before it was due"
        assert attempt == 1
    assert second[3] - second[4] == 400
    assert (
        time.time() * 1000 >= sent_ms + 400 - 5
    )  # the client saw it no earlier either (5 ms clock slack)


def test_absolute_due_time_in_the_past_is_due_at_once(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address)
    client.subscribe("absolute", "g")
    # A minute ago (a time decades ago, like 1_000, is refused as a unit mistake:
    # docs/protocol.md, "Units").
    client.publish([["absolute", b"x", None, int(time.time() * 1000) - 60_000, None]])
    (delivery,) = client.deliveries(1)
    assert delivery[3] == delivery[4]  # due_ms clamped to the publish time


def test_ttl_counts_from_due_time_and_expired_is_never_delivered(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address)
    # Due in 300 ms, may be delivered for 5 s after that: a long delay does not eat the TTL.
    client.publish([["ttl", b"keeps", 300, None, 5_000]])
    # Due now, expires 100 ms later, and nobody consumes until well after.
    client.publish([["ttl", b"expires", 0, None, 100]])
    deadline = time.monotonic() + 10
    while client.group_pending("ttl", "default") != 1:
        assert time.monotonic() < deadline, client.status()
        client.expect_nothing(0.05)
    consumer = WireClient(broker.client_address)
    consumer.subscribe("ttl", "workers")
    (delivery,) = consumer.deliveries(1)
    assert delivery[2] == b"keeps"
    consumer.expect_nothing(0.3)


def test_fan_out_to_every_group_and_round_robin_within_a_group(broker: BrokerProcess) -> None:
    a1 = WireClient(broker.client_address)
    a2 = WireClient(broker.client_address)
    b = WireClient(broker.client_address)
    a1.subscribe("fan", "A")
    a2.subscribe("fan", "A")
    b.subscribe("fan", "B")
    b.publish([["fan", str(i).encode(), 0, None, None] for i in range(20)])
    got_b = b.deliveries(20)
    assert sorted(d[2] for d in got_b) == sorted(str(i).encode() for i in range(20))
    got_a1: list[list[object]] = []
    got_a2: list[list[object]] = []
    deadline = time.monotonic() + 10
    while len(got_a1) + len(got_a2) < 20 and time.monotonic() < deadline:
        for client, got in ((a1, got_a1), (a2, got_a2)):
            try:
                got.extend(client.deliveries(1, timeout_s=0.2))
            except TimeoutError:
                pass
    assert len(got_a1) + len(got_a2) == 20
    assert set(_ids(got_a1)).isdisjoint(_ids(got_a2)), "a group delivered one message twice"
    assert got_a1 and got_a2, "one consumer of the group got nothing"


def test_credit_bounds_unacked_deliveries(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address)
    subscription = client.subscribe("credit", "g", prefetch=2)
    client.publish([["credit", b"m", 0, None, None] for _ in range(5)])
    first = client.deliveries(2)
    client.expect_nothing(0.3)
    answer = client.request(frames.Ack(client.next_id(), [d[0] for d in first]))
    assert isinstance(answer, frames.Ok) and answer.result == 2
    client.expect_nothing(0.2)  # acking does not grant credit by itself
    client.send(frames.Credit(0, subscription, 3))
    rest = client.deliveries(3)
    assert len(set(_ids(first + rest))) == 5


def test_visibility_timeout_redelivers_with_next_attempt(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address)
    answer = client.request(frames.GroupCreate(client.next_id(), "vis", "g", 300, None))
    assert isinstance(answer, frames.Ok)
    client.subscribe("vis", "g", prefetch=10)
    client.publish([["vis", b"slow", 0, None, None]])
    (first,) = client.deliveries(1)
    (second,) = client.deliveries(1, timeout_s=5)
    assert second[1] == first[1] and second[5] == 2
    assert second[6] - first[6] >= 300
    # The first attempt's tag is stale now; the second acks.
    stale = client.request(frames.Ack(client.next_id(), [first[0]]))
    assert isinstance(stale, frames.Error)
    assert isinstance(client.request(frames.Ack(client.next_id(), [second[0]])), frames.Ok)
    client.expect_nothing(0.5)


def test_consumer_disconnect_redelivers_to_another(broker: BrokerProcess) -> None:
    leaving = WireClient(broker.client_address)
    leaving.subscribe("leave", "g")
    leaving.publish([["leave", b"m", 0, None, None]])
    (delivery,) = leaving.deliveries(1)
    staying = WireClient(broker.client_address)
    staying.subscribe("leave", "g")
    leaving.close()
    (again,) = staying.deliveries(1)
    assert again[1] == delivery[1] and again[5] == 2


def test_nack_with_delay_then_dead_letter(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address)
    client.request(frames.GroupCreate(client.next_id(), "jobs", "g", None, 2))
    client.subscribe("jobs", "g")
    client.publish([["jobs", b"poison", 0, None, None]])
    (first,) = client.deliveries(1)
    answer = client.request(frames.Nack(client.next_id(), [first[0]], 200))
    assert isinstance(answer, frames.Ok) and answer.result == 1
    (second,) = client.deliveries(1)
    assert second[1] == first[1] and second[5] == 2
    assert second[3] >= first[6] + 200  # due again no earlier than nack + delay
    client.request(frames.Nack(client.next_id(), [second[0]], 0))
    client.expect_nothing(0.3)  # max_deliveries = 2: no third attempt
    dlq = WireClient(broker.client_address)
    dlq.subscribe("jobs.dlq", "ops")
    (dead,) = dlq.deliveries(1)
    assert dead[2] == b"poison" and dead[5] == 1
    assert client.group_pending("jobs", "g") == 0


def test_first_subscriber_adopts_messages_published_before_any_group(broker: BrokerProcess) -> None:
    producer = WireClient(broker.client_address)
    producer.publish([["early", b"before-any-consumer", 0, None, None]])
    consumer = WireClient(broker.client_address)
    consumer.subscribe("early", "billing")
    (delivery,) = consumer.deliveries(1)
    assert delivery[2] == b"before-any-consumer"
    later_group = WireClient(broker.client_address)
    later_group.subscribe("early", "audit")
    later_group.expect_nothing(0.3)  # groups get what is published after they exist


def test_group_create_alone_adopts_the_backlog_before_any_subscriber(
    broker: BrokerProcess,
) -> None:
    """``docs/protocol.md``, "Consumer groups and fan-out": the first group *created*
    adopts the implicit ``default`` group, by GROUP_CREATE as by SUBSCRIBE."""
    client = WireClient(broker.client_address)
    client.publish([["adopt", b"early", 0, None, None]])
    assert client.group_pending("adopt", "default") == 1
    answer = client.request(frames.GroupCreate(client.next_id(), "adopt", "g1", None, None))
    assert isinstance(answer, frames.Ok), answer
    assert (client.group_pending("adopt", "default"), client.group_pending("adopt", "g1")) == (
        None,
        1,
    )
    second = WireClient(broker.client_address)
    second.subscribe("adopt", "g2")
    second.expect_nothing(0.3)  # the backlog stayed with g1
    first = WireClient(broker.client_address)
    first.subscribe("adopt", "g1")
    (delivery,) = first.deliveries(1)
    assert delivery[2] == b"early"


def test_status_counts(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address)
    client.request(frames.GroupCreate(client.next_id(), "counts", "g", None, None))
    client.publish([["counts", b"a", 0, None, None], ["counts", b"b", 3_600_000, None, None]])
    status = client.status()
    assert status["role"] == "leader" and status["node_id"] == 1
    (topic,) = [t for t in status["topics"] if t["topic"] == "counts"]
    (group,) = topic["groups"]
    assert (group["pending"], group["due"], group["in_flight"], group["consumers"]) == (2, 1, 0, 0)
    client.subscribe("counts", "g")
    client.deliveries(1)
    (topic,) = [t for t in client.status()["topics"] if t["topic"] == "counts"]
    (group,) = topic["groups"]
    assert (group["pending"], group["due"], group["in_flight"], group["consumers"]) == (2, 0, 1, 1)
