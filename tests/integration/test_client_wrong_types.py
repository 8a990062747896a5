"""Wrong types given to the async client, against a real node with one shard and with
two: a TypeError naming the argument at the call, and the client keeps working.

Before, a sharded node's client raised ``AttributeError: 'int' object has no attribute
'endswith'`` for a topic that was not a str, and both raised ``AttributeError`` (no
attribute 'topic' / 'wire_bytes') for a ``publish_batch`` of tuples or of a str.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import pytest

from futureq.client import Client, open_client


class BrokerProcess(Protocol):
    """What these tests use of a broker (tests/integration/conftest.py)."""

    client_address: str


async def _subscribe(client: Client, topic: Any, group: Any) -> None:
    async with client.subscribe(topic, group):
        pass


CALLS: list[tuple[str, Callable[[Client], Awaitable[Any]], str]] = [
    ("publish topic int", lambda c: c.publish(5, b"x"), "topic must be a str, got int"),  # type: ignore[arg-type]
    ("delete_group topic None", lambda c: c.delete_group(None, "g"), "topic must be a str"),  # type: ignore[arg-type]
    ("delete_group group int", lambda c: c.delete_group("t", 5), "group must be a str"),  # type: ignore[arg-type]
    (
        "publish_batch of a str",
        lambda c: c.publish_batch("abc"),
        "items must be a list of PublishItem",
    ),  # type: ignore[arg-type]
    ("subscribe topic int", lambda c: _subscribe(c, 5, "g"), "topic must be a str, got int"),
    ("subscribe group int", lambda c: _subscribe(c, "t", 5), "group must be a str, got int"),
    (
        "publish_batch of tuples",
        lambda c: c.publish_batch([("wrong", b"x")]),  # type: ignore[list-item]
        "items[0] must be a PublishItem",
    ),
]


@pytest.mark.parametrize("shards", ["1", "2"])
@pytest.mark.trio
async def test_wrong_types_raise_type_error_naming_the_argument(
    broker_factory: Callable[..., BrokerProcess], shards: str
) -> None:
    broker = broker_factory(extra_args=["--shards", shards])
    async with open_client(broker.client_address, request_timeout_s=10.0) as client:
        for name, call, sentence in CALLS:
            with pytest.raises(TypeError) as caught:
                await call(client)
            assert sentence in str(caught.value), (name, caught.value)
        assert await client.publish("still.serving", b"ok") > 0
