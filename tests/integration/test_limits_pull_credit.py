"""Pull-mode fetches against a node whose ``limits.max_prefetch`` is below a fetch's
``count``, with a real ``futureq start`` process.

Found by a tester: with ``FUTUREQ_LIMITS_MAX_PREFETCH=100``, ``consume(count=500)``
returned 100 and every later ``consume`` returned nothing, for good: the server capped
the CREDIT it was given at 100 without a word, the client went on believing 400
credits were out and asked for no more. A first ``consume(count=500)`` failed with
"prefetch must be between 1 and 100, got 500" of a prefetch the user never gave. Now
the server keeps the credit it is granted (deliveries out stay bounded per connection
and per node) and a pull subscription subscribes with the least window a server takes.
"""

from __future__ import annotations

from typing import Any

from broker_process import BrokerProcess
from wire_client import WireClient

from futureq.client import PublishItem
from futureq.client.sync import SyncClient
from futureq.errors import ErrorCode
from futureq.wire import frames

LIMIT_ENV = {"FUTUREQ_LIMITS_MAX_PREFETCH": "100"}


def publish(broker: BrokerProcess, topic: str, count: int) -> None:
    with SyncClient(broker.client_address) as client:
        client.publish_batch([PublishItem(topic, f"m{n}".encode()) for n in range(count)])


def test_pull_fetches_past_max_prefetch_keep_receiving(broker_factory: object) -> None:
    broker: BrokerProcess = broker_factory(env=LIMIT_ENV)  # type: ignore[operator]
    publish(broker, "pf2", 1_000)
    seen: list[bytes] = []
    with SyncClient(broker.client_address) as client:
        # A fetch returns at most the limit (no more is out to one subscription),
        # acked before the next: before the fix 50, 100, 0, 0 came, then nothing.
        for count in (50, 500, 300, 150, *[500] * 6, 50):
            got = client.consume("pf2", "g", count=count, timeout_s=2)
            assert len(got) == min(count, 100), (count, len(got))
            seen.extend(delivery.payload for delivery in got)
            for delivery in got:
                delivery.ack()
    assert sorted(seen) == sorted(f"m{n}".encode() for n in range(1_000))


def test_a_first_pull_fetch_past_max_prefetch_is_not_refused(broker_factory: object) -> None:
    broker: BrokerProcess = broker_factory(env=LIMIT_ENV)  # type: ignore[operator]
    publish(broker, "pf3", 500)
    with SyncClient(broker.client_address) as client:
        # Before: RequestError "prefetch must be between 1 and 100, got 500".
        got = client.consume("pf3", "g", count=500, timeout_s=2)
        assert len(got) == 100  # the limit out at once; more as these are settled


def test_credit_is_kept_and_refused_only_past_the_protocol_bound(broker_factory: object) -> None:
    broker: BrokerProcess = broker_factory(env=LIMIT_ENV)  # type: ignore[operator]
    publish(broker, "pf4", 300)
    wire = WireClient(broker.client_address, versions=(5,))
    # Push mode: a window past the limit is refused, with the limit named (a client of
    # version 5 is told the limit in HELLO_OK).
    answer = wire.request(frames.Subscribe(wire.next_id(), "pf4", "g", 500))
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.INVALID_ARGUMENT
    assert "100" in answer.message, answer.message
    subscription_id = wire.subscribe("pf4", "g", prefetch=100)
    # CREDIT past max_prefetch is kept: 100 + 150 deliveries come, at most 100 out.
    wire.send(frames.Credit(0, subscription_id, 150))
    got: list[list[Any]] = []
    while len(got) < 250:
        batch = wire.poll_deliveries(2.0)
        assert batch, len(got)
        got.extend(batch)
        if len(got) % 100 == 0:
            answer = wire.request(frames.Ack(wire.next_id(), [d[0] for d in got[-100:]]))
            assert isinstance(answer, frames.Ok), answer
    assert len(got) == 250
    answer = wire.request(frames.Ack(wire.next_id(), [d[0] for d in got[200:]]))
    assert isinstance(answer, frames.Ok), answer
    # Credit up to what the protocol allows held is kept; past it, refused, not cut.
    wire.send(frames.Credit(0, subscription_id, 1_000_000))  # it held none: now the most
    rest = wire.deliveries(50)  # the other 50 go out: it holds 999,950
    wire.send(frames.Credit(0, subscription_id, 51))
    error = wire.receive_answer()
    assert isinstance(error, frames.Error) and error.code == ErrorCode.INVALID_ARGUMENT, error
    assert "1000001" in error.message.replace(",", ""), error.message
    ids = [delivery[1] for delivery in [*got, *rest]]
    assert len(set(ids)) == 300
