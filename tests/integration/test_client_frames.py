"""What the client cannot send, and what it must split, against a real broker.

A publish the client cannot encode (an int beyond 64 bits, a lone surrogate) fails its
own call with the server's code for that field and never the other calls coalesced
with it; batches larger than the server's ``max_frame_bytes`` (HELLO_OK) are cut into
frames by encoded size (``docs/client.md``, "Publishing"). Every async test runs under
asyncio and trio.
"""

from __future__ import annotations

import random
from typing import Any, Protocol

import anyio
import pytest
from tests.backends import on_both_backends

from futureq.client import PublishItem, open_client
from futureq.errors import ErrorCode, FutureQError, RequestError

MIB = 1024 * 1024


class BrokerProcess(Protocol):
    client_address: str


UNSENDABLE: list[tuple[dict[str, Any], ErrorCode]] = [
    ({"delay_ms": 2**64}, ErrorCode.DUE_TIME_OVERFLOW),
    ({"ttl_ms": 2**64}, ErrorCode.INVALID_TTL),
    ({"delay_ms": -(2**64)}, ErrorCode.INVALID_DELAY),
    ({"deliver_at_ms": 2**64}, ErrorCode.DUE_TIME_OVERFLOW),
    ({"headers": {"a": "\ud800"}}, ErrorCode.INVALID_HEADERS),
    ({"headers": {"\udcff": "v"}}, ErrorCode.INVALID_HEADERS),
    ({"idempotency_key": "\udfff"}, ErrorCode.INVALID_IDEMPOTENCY_KEY),
]


@on_both_backends
async def test_an_unsendable_publish_fails_alone_in_a_shared_batch(
    broker: BrokerProcess,
) -> None:
    # A long linger makes the 50 calls share one PUBLISH, as under load.
    async with open_client(
        broker.client_address, request_timeout_s=20.0, linger_ms=200, rng=random.Random(1)
    ) as client:
        for bad_kwargs, code in UNSENDABLE:
            outcomes: dict[int, int | FutureQError] = {}

            async def one(
                i: int,
                bad_kwargs: dict[str, Any] = bad_kwargs,
                outcomes: dict[int, int | FutureQError] = outcomes,
            ) -> None:
                try:
                    outcomes[i] = await client.publish(
                        "shared", b"%d" % i, **(bad_kwargs if i == 25 else {})
                    )
                except FutureQError as exc:
                    outcomes[i] = exc

            async with anyio.create_task_group() as tasks:
                for i in range(50):
                    tasks.start_soon(one, i)
            bad = outcomes.pop(25)
            assert isinstance(bad, RequestError), (bad_kwargs, bad)
            assert bad.code is code and bad.item_index is None, (bad_kwargs, bad)
            assert all(type(got) is int for got in outcomes.values()), (bad_kwargs, outcomes)
            with pytest.raises(RequestError) as in_batch:
                await client.publish_batch(
                    [PublishItem("shared", b"ok"), PublishItem("shared", b"bad", **bad_kwargs)]
                )
            assert in_batch.value.code is code
        # Not only publishes: an id or a name that cannot be encoded is a RequestError.
        with pytest.raises(RequestError) as id_info:
            await client.cancel("shared", [1, 2**64])
        assert (id_info.value.code, id_info.value.item_index) == (ErrorCode.INVALID_MESSAGE_ID, 1)
        with pytest.raises(RequestError) as name_info:
            await client.create_group("shared", "g\ud800")
        assert name_info.value.code is ErrorCode.INVALID_FIELD
        assert await client.ping() >= 0
        status = await client.status()
        pending = {g["group"]: g["pending"] for t in status["topics"] for g in t["groups"]}
        # 49 good calls per case, nothing of the refused batches.
        assert sum(pending.values()) == 49 * len(UNSENDABLE)


@on_both_backends
async def test_a_batch_over_the_frame_limit_is_split_in_order(broker: BrokerProcess) -> None:
    async with open_client(
        broker.client_address, request_timeout_s=30.0, max_batch_items=20_000
    ) as client:
        payloads = [bytes([i]) * MIB for i in range(10)]  # 10 MiB; frames hold 4 MiB
        ids = await client.publish_batch([PublishItem("big", p) for p in payloads])
        assert len(ids) == 10 and ids == sorted(ids)
        # The coalescer cuts by size too: 30 concurrent ~1 MiB publishes all succeed.
        results: list[int] = []

        async def one() -> None:
            results.append(await client.publish("big", b"y" * 1_000_000))

        async with anyio.create_task_group() as tasks:
            for _ in range(30):
                tasks.start_soon(one)
        assert len(results) == 30
        # max_batch_items above the server's limit (10,000): split, not refused.
        assert len(await client.publish_batch([PublishItem("small", b"z")] * 15_000)) == 15_000
        async with client.subscribe("big", "reader", prefetch=10) as sub:
            got = [await sub.__anext__() for _ in range(10)]
            await sub.ack(got)
        assert [d.payload for d in got] == payloads


@on_both_backends
async def test_a_message_too_large_for_any_frame_fails_alone(broker: BrokerProcess) -> None:
    async with open_client(broker.client_address, request_timeout_s=20.0, linger_ms=200) as client:
        outcomes: list[int | FutureQError] = []

        async def one(payload: bytes) -> None:
            try:
                outcomes.append(await client.publish("huge", payload))
            except FutureQError as exc:
                outcomes.append(exc)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(one, b"x" * 5 * MIB)
            for _ in range(20):
                tasks.start_soon(one, b"small")
        errors = [o for o in outcomes if not isinstance(o, int)]
        assert len(outcomes) == 21 and len(errors) == 1
        assert isinstance(errors[0], RequestError)
        assert errors[0].code is ErrorCode.PAYLOAD_TOO_LARGE
        assert "max_frame_bytes" in errors[0].message
        # In publish_batch it is refused before anything is sent, naming its index.
        with pytest.raises(RequestError) as info:
            await client.publish_batch(
                [PublishItem("huge2", b"a"), PublishItem("huge2", b"x" * 5 * MIB)]
            )
        assert (info.value.code, info.value.item_index) == (ErrorCode.PAYLOAD_TOO_LARGE, 1)
        status = await client.status()
        assert "huge2" not in {t["topic"] for t in status["topics"]}
