"""A consumer set aside while the node-wide buffer was full gets its messages once it is not.

A consumer found unable to receive because the *node's* buffers are full leaves its
group's turn (``GroupRuntime.ready``) until ``Hub.wake``. The node wakes every consumer
only once its outbound bytes fall below half its limit (``ROOM_AGAIN_FRACTION``), which
another connection that does not read can keep from happening; so each connection
refused for the node's sake is told as soon as the node is below its limit
(``NodeBuffers`` -> ``Outbox.room_again``). Found by a breaker run against the ready set:
without that, the consumer here (credit 10, an empty buffer) got nothing.
"""

from __future__ import annotations

import time

from broker_process import BrokerProcess, connection_buffer_bytes
from wire_client import WireClient, non_reading_client

from futureq.wire import frames

KIB = 1024
NODE = 1024 * KIB
CONN = 768 * KIB  # > NODE / 2: one silent reader alone keeps the node above half
PAYLOAD = 16 * KIB


def _outbound(http_address: str) -> float:
    return connection_buffer_bytes(http_address, "out")


def test_consumer_with_credit_gets_due_messages_after_node_buffer_drops_below_limit(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        env={
            "FUTUREQ_LIMITS_MAX_NODE_BUFFER_BYTES": str(NODE),
            "FUTUREQ_LIMITS_MAX_CONNECTION_BUFFER_BYTES": str(CONN),
            "FUTUREQ_LIMITS_MAX_FRAME_BYTES": str(256 * KIB),
            "FUTUREQ_LIMITS_MAX_PAYLOAD_BYTES": str(64 * KIB),
            "FUTUREQ_LIMITS_SEND_TIMEOUT_MS": "300000",
            "FUTUREQ_LIMITS_KEEPALIVE_INTERVAL_MS": "300000",
            "FUTUREQ_LIMITS_KEEPALIVE_TIMEOUT_MS": "300000",
        }
    )
    addr = broker.client_address
    # A subscriber that never reads fills its own buffer (the node is not full yet)...
    pub = WireClient(addr)
    payload = b"x" * PAYLOAD

    def fill_to(level: float) -> None:
        deadline = time.monotonic() + 60
        while _outbound(broker.http_address) < level:
            assert time.monotonic() < deadline, _outbound(broker.http_address)
            answer = pub.publish([["t", payload, None, None, None] for _ in range(4)])
            assert isinstance(answer, frames.PublishOk), answer

    y1 = non_reading_client(addr)
    y1.subscribe("t", "g", prefetch=10_000)
    fill_to(CONN)
    # ... and a second one fills the node's.
    y2 = non_reading_client(addr)
    y2.subscribe("t", "g", prefetch=10_000)
    fill_to(NODE)
    # The node is full: a new consumer with credit is looked at and found unable.
    c = WireClient(addr)
    sid = c.subscribe("t", "g", prefetch=10)
    answer = pub.publish([["t", b"small", None, None, None]])
    assert isinstance(answer, frames.PublishOk), answer
    time.sleep(0.5)
    assert not c.pushed
    # One silent reader goes: the node is below its limit, above half (y1 keeps it).
    y2.close()
    deadline = time.monotonic() + 10
    while _outbound(broker.http_address) >= NODE:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    held = _outbound(broker.http_address)
    assert NODE / 2 <= held < NODE, held
    # More due messages; c has credit 10 and an empty outbox, the node has room.
    answer = pub.publish([["t", b"late", None, None, None] for _ in range(5)])
    assert isinstance(answer, frames.PublishOk), answer
    got = c.deliveries(1, timeout_s=10)
    assert got, sid
