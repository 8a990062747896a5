"""Deliveries out (handed to consumers, not yet settled) are bounded, per node and per
connection, against a real ``futureq start`` process.

Found by a tester: the leader's memory for deliveries out had no bound (~500 bytes
each; 10 SUBSCRIBEs of prefetch 10,000 on one connection that acks nothing held 100k,
and 1,024 subscriptions would hold 10 M). Now ``limits.max_deliveries_out`` holds the
dispatcher back (nothing lost, nothing early: the rest goes out as deliveries are
settled) and ``limits.max_prefetch_per_connection`` refuses a SUBSCRIBE that would take
one connection's prefetch past it (docs/operations.md, "Limits").
"""

from __future__ import annotations

import time
import urllib.request

from broker_process import BrokerProcess
from wire_client import WireClient

from futureq.errors import ErrorCode
from futureq.wire import codec, frames


def metric(broker: BrokerProcess, name: str) -> float:
    with urllib.request.urlopen(f"http://{broker.http_address}/metrics", timeout=10) as response:
        text = response.read().decode()
    [line] = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.rsplit(" ", 1)[1])


def drain(clients: list[WireClient], within_s: float = 1.0) -> list[list[list[object]]]:
    """Every delivery each client gets until none of them got one for ``within_s``."""
    got: list[list[list[object]]] = [[] for _ in clients]
    quiet_until = time.monotonic() + within_s
    while time.monotonic() < quiet_until:
        for position, client in enumerate(clients):
            batch = client.poll_deliveries(0.05)
            if batch:
                got[position].extend(batch)
                quiet_until = time.monotonic() + within_s
    return got


def test_the_node_hands_out_no_more_than_max_deliveries_out(broker_factory: object) -> None:
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        env={"FUTUREQ_LIMITS_MAX_DELIVERIES_OUT": "30"}
    )
    producer = WireClient(broker.client_address)
    items = [["out.t", f"m{n}".encode(), 0, None, None] for n in range(100)]
    assert isinstance(producer.publish(items), frames.PublishOk)
    clients = [WireClient(broker.client_address), WireClient(broker.client_address)]
    for client in clients:
        for _ in range(3):  # the reported shape: several subscriptions, none acking
            client.subscribe("out.t", "g", prefetch=100)

    held = drain(clients)
    assert sum(map(len, held)) == 30, [len(got) for got in held]  # before: all 100
    assert metric(broker, "futureq_deliveries_out") == 30
    assert metric(broker, "futureq_deliveries_held_back_total") >= 1
    warnings = [
        line
        for line in broker.stderr_path.read_text().splitlines()
        if "limits.max_deliveries_out = 30" in line
    ]
    assert len(warnings) == 1, warnings  # said once a minute, not per pass

    # Settling frees room: as many go out again, with no CREDIT sent (back-pressure,
    # not loss), and nothing is handed out twice.
    settled = 0
    for client, got in zip(clients, held, strict=True):
        tags = [delivery[0] for delivery in got[:5]]
        if tags:
            answer = client.request(frames.Ack(client.next_id(), tags))
            assert isinstance(answer, frames.Ok), answer
            settled += len(tags)
    more = drain(clients)
    assert sum(map(len, more)) == settled, [len(got) for got in more]
    assert metric(broker, "futureq_deliveries_out") == 30
    ids = [delivery[1] for got in held + more for delivery in got]
    assert len(set(ids)) == len(ids) == 30 + settled
    assert producer.group_pending("out.t", "g") == 100 - settled


def test_a_subscribe_past_the_connections_prefetch_total_is_refused(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        env={
            "FUTUREQ_LIMITS_MAX_PREFETCH": "100",
            "FUTUREQ_LIMITS_MAX_PREFETCH_PER_CONNECTION": "150",
        }
    )
    client = WireClient(broker.client_address)
    kept = client.subscribe("per.t", "g", prefetch=100)
    refused = client.request(frames.Subscribe(client.next_id(), "per.t", "g", 60))
    assert isinstance(refused, frames.Error), refused  # before: SUBSCRIBE_OK
    assert refused.code == ErrorCode.INVALID_ARGUMENT
    assert "limits.max_prefetch_per_connection = 150" in refused.message, refused.message
    assert "they hold 100" in refused.message and "at most 50" in refused.message
    # The connection stays usable; what is left of the limit may still be asked for.
    assert isinstance(client.request(frames.Ping(client.next_id())), frames.Pong)
    client.subscribe("per.t", "g", prefetch=50)
    answer = client.request(frames.Unsubscribe(client.next_id(), kept))
    assert isinstance(answer, frames.Ok), answer
    client.subscribe("per.t", "other", prefetch=100)  # unsubscribing gave its share back
    # Another connection has its own share.
    WireClient(broker.client_address).subscribe("per.t", "g", prefetch=100)
    # SUBSCRIBEs pipelined together (new groups: each awaits its creation) see each other.
    pipelined = WireClient(broker.client_address)
    requests = [frames.Subscribe(pipelined.next_id(), "per.t", f"p{n}", 60) for n in range(3)]
    pipelined.send_raw(b"".join(codec.encode_frame(frame, 2**31) for frame in requests))
    answers = [pipelined.receive_answer() for _ in requests]
    assert sorted(type(answer).__name__ for answer in answers) == [
        "Error",
        "SubscribeOk",
        "SubscribeOk",
    ], answers


def test_credit_without_acks_does_not_take_a_connection_past_its_limit(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        env={
            "FUTUREQ_LIMITS_MAX_PREFETCH": "10",
            "FUTUREQ_LIMITS_MAX_PREFETCH_PER_CONNECTION": "10",
        }
    )
    producer = WireClient(broker.client_address)
    items = [["credit.t", f"m{n}".encode(), 0, None, None] for n in range(50)]
    assert isinstance(producer.publish(items), frames.PublishOk)
    client = WireClient(broker.client_address)
    subscription = client.subscribe("credit.t", "g", prefetch=10)
    held = client.deliveries(10)
    for _ in range(3):  # credit granted, nothing settled
        client.send(frames.Credit(client.next_id(), subscription, 10))
    client.expect_nothing(0.5)  # before: 30 more
    assert metric(broker, "futureq_deliveries_out") == 10
    answer = client.request(frames.Ack(client.next_id(), [d[0] for d in held[:4]]))
    assert isinstance(answer, frames.Ok), answer
    assert len(client.deliveries(4)) == 4  # the credit granted is kept, used as room frees
    client.expect_nothing(0.5)
