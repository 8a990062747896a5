"""A consumer whose own outbox fills (it reads slowly) then drains gets every due
message; another consumer of the group keeps receiving meanwhile."""

from __future__ import annotations

import time

from broker_process import BrokerProcess
from wire_client import WireClient

from futureq.wire import frames

KIB = 1024


def test_slow_consumer_outbox_fills_then_drains(broker_factory: object) -> None:
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        env={
            "FUTUREQ_LIMITS_MAX_CONNECTION_BUFFER_BYTES": str(256 * KIB),
            "FUTUREQ_LIMITS_MAX_FRAME_BYTES": str(256 * KIB),
            "FUTUREQ_LIMITS_MAX_PAYLOAD_BYTES": str(64 * KIB),
        }
    )
    addr = broker.client_address
    slow = WireClient(addr)
    slow.subscribe("t", "g", prefetch=10_000)
    pub = WireClient(addr)
    for _ in range(50):
        answer = pub.publish([["t", b"x" * 16 * KIB, None, None, None] for _ in range(10)])
        assert isinstance(answer, frames.PublishOk)
    time.sleep(1.0)  # slow has not read: its outbox (and socket) is full
    fast = WireClient(addr)
    fast.subscribe("t", "g", prefetch=10_000)
    got_fast = fast.deliveries(1, timeout_s=10)
    deadline = time.monotonic() + 60
    total = len(got_fast)
    while total < 500:
        assert time.monotonic() < deadline, total
        for c in (slow, fast):
            total += len(c.poll_deliveries())
    # more published after the drain: both still receive
    answer = pub.publish([["t", b"y", None, None, None] for _ in range(40)])
    assert isinstance(answer, frames.PublishOk)
    late = 0
    deadline = time.monotonic() + 10
    per = [0, 0]
    while late < 40:
        assert time.monotonic() < deadline, per
        for i, c in enumerate((slow, fast)):
            n = len(c.poll_deliveries())
            late += n
            per[i] += n
    assert min(per) > 0, per
