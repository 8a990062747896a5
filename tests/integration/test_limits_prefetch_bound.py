"""``limits.max_prefetch`` bounds the deliveries one subscription has out, whatever
credit it holds, and clients of every protocol version keep receiving on a node whose
limit is low (a real ``futureq start`` process; old clients are real old frames).

Found after the round that kept CREDIT whole: a subscription on a node with
``max_prefetch`` 100 could have any number of deliveries out (repeated CREDIT got
past the limit even before); a client of protocol version 3, which subscribes a pull
fetch with its whole count as the window, was refused on such a node; and HELLO_OK did
not say the limit, so a client could not keep its credit within it.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from broker_process import BrokerProcess
from cli_process import cli
from wire_client import WireClient

from futureq.client import PublishItem, open_client
from futureq.client.sync import SyncClient
from futureq.errors import ErrorCode
from futureq.wire import frames

LIMIT = 100
LIMIT_ENV = {"FUTUREQ_LIMITS_MAX_PREFETCH": str(LIMIT)}
QUIET_S = 0.5
"""How long a test waits to see that nothing more is pushed (s)."""


def publish(broker: BrokerProcess, topic: str, count: int) -> None:
    with SyncClient(broker.client_address) as client:
        client.publish_batch([PublishItem(topic, f"m{n}".encode()) for n in range(count)])


def ack(wire: WireClient, held: list[list[Any]]) -> None:
    answer = wire.request(frames.Ack(wire.next_id(), [delivery[0] for delivery in held]))
    assert isinstance(answer, frames.Ok), answer


def test_credit_past_max_prefetch_is_used_only_as_settlements_free_room(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory(env=LIMIT_ENV)  # type: ignore[operator]
    publish(broker, "pb1", 300)
    wire = WireClient(broker.client_address, versions=(1, 2, 3, 4, 5))
    subscription_id = wire.subscribe("pb1", "g", prefetch=LIMIT)
    wire.send(frames.Credit(0, subscription_id, 400))  # 500 credit held: kept whole
    held = wire.deliveries(LIMIT)
    assert len(held) == LIMIT
    wire.expect_nothing(QUIET_S)  # before: all 300 came, none settled
    ack(wire, held[:30])
    more = wire.deliveries(30)  # the credit was kept: 30 settled, 30 more out
    assert len(more) == 30
    wire.expect_nothing(QUIET_S)
    ack(wire, [*held[30:], *more])
    rest = wire.deliveries(LIMIT)  # 170 left, 100 at most out
    wire.expect_nothing(QUIET_S)
    ack(wire, rest)
    last = wire.deliveries(70)  # 400 + 100 credit in all: enough for the 300
    assert len({d[1] for d in [*held, *more, *rest, *last]}) == 300


def test_hello_ok_names_max_prefetch_from_version_5_only(broker_factory: object) -> None:
    broker: BrokerProcess = broker_factory(env=LIMIT_ENV)  # type: ignore[operator]
    answers = {}
    for versions in ((1, 2, 3, 4), (1, 2, 3, 4, 5)):
        wire = WireClient(broker.client_address, hello=False)
        wire.send(frames.Hello(1, versions, "test", None))
        answers[max(versions)] = wire.receive()
        wire.close()
    assert answers[5].version == 5 and answers[5].max_prefetch == LIMIT  # before: version 4
    # A version 4 client reads the HELLO_OK it always did (7 fields, no limit).
    assert answers[4].version == 4 and answers[4].max_prefetch is None
    assert len(answers[4].to_wire()) == 9  # frame type and request id, then 7 fields


def test_a_version_3_pull_client_is_not_refused_and_never_stalls(broker_factory: object) -> None:
    """What the reference client of protocol version 3 sends for ``consume(count=500)``
    then ``consume(count=50)``: SUBSCRIBE with the whole count as the window; after the
    first fetch returned what came, it counts the rest of its window as credit still
    out, and the second fetch (of fewer than that) asks for no more."""
    broker: BrokerProcess = broker_factory(env=LIMIT_ENV)  # type: ignore[operator]
    publish(broker, "pb3", 300)
    wire = WireClient(broker.client_address, versions=(1, 2, 3))
    answer = wire.request(frames.Subscribe(wire.next_id(), "pb3", "g", 500))
    # Before: ERROR INVALID_ARGUMENT "prefetch must be between 1 and 100, got 500".
    assert isinstance(answer, frames.SubscribeOk), answer
    first = wire.deliveries(LIMIT)
    assert len(first) == LIMIT
    wire.expect_nothing(QUIET_S)  # never more than the limit out
    ack(wire, first)
    # The second fetch grants nothing (the client believes 400 credits out): the
    # server holds them, so what is due comes.
    second = wire.deliveries(LIMIT)
    assert len(second) == LIMIT
    ack(wire, second)
    third = wire.deliveries(LIMIT)
    assert len({d[1] for d in [*first, *second, *third]}) == 300
    # A version 5 connection is told the limit, so its window past it is refused.
    new = WireClient(broker.client_address, versions=(5,))
    refused = new.request(frames.Subscribe(new.next_id(), "pb3", "g", 500))
    assert isinstance(refused, frames.Error) and refused.code == ErrorCode.INVALID_ARGUMENT
    assert "limits.max_prefetch is 100" in refused.message, refused.message


def test_sync_consume_past_max_prefetch_gets_the_limit_then_more_as_it_acks(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory(env=LIMIT_ENV)  # type: ignore[operator]
    publish(broker, "pb4", 200)
    with SyncClient(broker.client_address) as client:
        first = client.consume("pb4", "g", count=500, timeout_s=5)
        assert len(first) == LIMIT  # before: 200, past the limit
        # All 100 unsettled: nothing more may come.
        assert client.consume("pb4", "g", count=10, timeout_s=QUIET_S) == []
        for delivery in first[:40]:
            delivery.ack()
        second = client.consume("pb4", "g", count=500, timeout_s=5)
        assert len(second) == 40
        for delivery in [*first[40:], *second]:
            delivery.ack()
        rest = client.consume("pb4", "g", count=500, timeout_s=5)
        assert len(rest) == 200 - LIMIT - 40
        ids = {d.id for d in [*first, *second, *rest]}
    assert len(ids) == 200


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_push_subscribe_past_max_prefetch_gets_the_server_s_window(
    broker_factory: object, backend: str
) -> None:
    broker: BrokerProcess = broker_factory(env=LIMIT_ENV)  # type: ignore[operator]
    publish(broker, "pb5", 150)

    async def main() -> tuple[int, int]:
        async with open_client(broker.client_address) as client:
            # Before: RequestError INVALID_ARGUMENT "prefetch must be between 1 and 100".
            async with client.subscribe("pb5", "g", prefetch=500) as sub:
                held = [await sub.__anext__() for _ in range(LIMIT)]
                assert sub.window == LIMIT and sub.prefetch == 500
                with anyio.move_on_after(QUIET_S):
                    await sub.__anext__()
                    raise AssertionError("more than limits.max_prefetch out")
                for delivery in held:
                    await delivery.ack()
                rest = [await sub.__anext__() for _ in range(50)]
                for delivery in rest:
                    await delivery.ack()
                return len(held), len({d.id for d in [*held, *rest]})

    assert anyio.run(main, backend=backend) == (LIMIT, 150)


def test_cli_consume_past_max_prefetch_reads_with_the_server_s_window(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        env={"FUTUREQ_LIMITS_MAX_PREFETCH": "50"}
    )
    for args in ((), ("--prefetch", "200")):
        topic = f"pb6.{len(args)}"
        publish(broker, topic, 120)
        done = cli(
            broker.client_address,
            "consume",
            topic,
            "--group",
            "g",
            "--count",
            "120",
            "--idle-timeout",
            "2s",
            *args,
        )
        # Before: refused, "prefetch must be between 1 and 50, got 100" (or 200).
        assert done.returncode == 0, done.stderr
        assert len(done.stdout.splitlines()) == 120, done.stdout[-500:]
    # With --no-ack nothing printed is settled: a --count past the limit could never
    # be printed, so it is refused, naming the limit (not left to end idle and short).
    held = cli(
        broker.client_address,
        "consume",
        "pb6",
        "--group",
        "g9",
        "--no-ack",
        "--count",
        "120",
        "--idle-timeout",
        "2s",
    )
    assert held.returncode == 1, held.stderr
    assert "limits.max_prefetch is 50" in held.stderr and "--count of at most 50" in (
        held.stderr
    ), held.stderr


def test_an_old_client_s_window_counts_up_to_max_prefetch_per_connection(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        env={**LIMIT_ENV, "FUTUREQ_LIMITS_MAX_PREFETCH_PER_CONNECTION": "150"}
    )
    wire = WireClient(broker.client_address, versions=(1, 2, 3))
    # Before: refused, "prefetch must be between 1 and 100, got 500".
    wire.subscribe("pb7", "g1", prefetch=500)  # counted as 100: what may be out
    answer = wire.request(frames.Subscribe(wire.next_id(), "pb7", "g2", 500))
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.INVALID_ARGUMENT
    assert "prefetch 500 (counted as 100) would take" in answer.message, answer.message
    assert "to 200 prefetch together (they hold 100)" in answer.message, answer.message
    wire.subscribe("pb7", "g3", prefetch=50)


def test_a_subscription_at_its_limit_leaves_the_rest_to_the_group_s_others(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory(env=LIMIT_ENV)  # type: ignore[operator]
    first = WireClient(broker.client_address, versions=(1, 2, 3))
    first.subscribe("pb8", "g", prefetch=500)  # credit 500, at most 100 out
    second = WireClient(broker.client_address, versions=(5,))
    second.subscribe("pb8", "g", prefetch=LIMIT)
    publish(broker, "pb8", 250)
    held_first = first.deliveries(LIMIT)
    held_second = second.deliveries(LIMIT)
    assert len(held_first) == len(held_second) == LIMIT  # before: first took 250
    first.expect_nothing(QUIET_S)
    second.expect_nothing(0)
    ack(first, held_first)
    rest = first.deliveries(50)  # its kept credit takes the rest
    ids = {d[1] for d in [*held_first, *held_second, *rest]}
    assert len(ids) == 250
