"""An int the protocol cannot carry (beyond 64 bits) given to a client call is a
``ValueError`` at the call, naming the argument and the range (``docs/client.md``,
"Argument ranges"), against a real broker.

Found by testers: ``reschedule(due_ms=2**70)``, ``redrive(delay_ms=...)``,
``browse(limit=...)`` and their siblings failed deep in the encoder
(``RequestError INVALID_FIELD: cannot encode frame: Integer value out of range``), a
message naming no argument; ``subscribe(prefetch=2**70)`` the same. Every async test
runs under asyncio and trio.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import pytest
from tests.backends import on_both_backends

from futureq.client import Client, open_client
from futureq.errors import RequestError

WIDE = 2**70


class BrokerProcess(Protocol):
    client_address: str


CALLS: list[tuple[str, Callable[[Client], Awaitable[Any]]]] = [
    ("due_ms", lambda c: c.reschedule("t", [1], due_ms=WIDE)),
    ("delay_ms", lambda c: c.reschedule("t", [1], delay_ms=WIDE)),
    ("delay_ms", lambda c: c.redrive("t", [1], delay_ms=-WIDE)),
    ("from_due_ms", lambda c: c.browse("t", from_due_ms=WIDE)),
    ("to_due_ms", lambda c: c.browse("t", to_due_ms=-WIDE)),
    ("limit", lambda c: c.browse("t", limit=WIDE)),
    ("preview_bytes", lambda c: c.browse("t", preview_bytes=WIDE)),
    (r"bounds_ms\[1\]", lambda c: c.browse_counts("t", bounds_ms=[60_000, WIDE])),
    ("visibility_timeout_ms", lambda c: c.create_group("t", "g", visibility_timeout_ms=WIDE)),
    ("max_deliveries", lambda c: c.create_group("t", "g", max_deliveries=WIDE)),
    ("node_id", lambda c: c.add_node(WIDE, "127.0.0.1:1", "127.0.0.1:2")),
    ("node_id", lambda c: c.remove_node(WIDE)),
    ("node_id", lambda c: c.transfer_leader(WIDE)),
]


@on_both_backends
async def test_an_int_beyond_64_bits_is_a_value_error_naming_the_argument(
    broker: BrokerProcess,
) -> None:
    async with open_client(broker.client_address, request_timeout_s=10.0) as client:
        for name, call in CALLS:
            with pytest.raises(ValueError, match=rf"^{name} must be an int from -2\*\*63 to "):
                await call(client)
        with pytest.raises(ValueError, match="prefetch must be an int >= 1 and <= 1,000,000"):
            async with client.subscribe("t", "g", prefetch=WIDE):
                pass
        # Nothing was sent: the connection and the server are as they were.
        assert await client.ping() >= 0
        status = await client.status()
        assert status["topics"] == []
        # The largest int the wire carries is the server's to judge, as before.
        with pytest.raises(RequestError):
            await client.browse("t", limit=2**64 - 1)
