"""Ack level NONE: the queue of publishes waiting to be proposed is bounded in bytes.

A real RocksDB in ``tmp_path``, a real SingleNodeLog and a real Broker; the test holds
the background publisher back (it is not started) to fill the queue, as a slow commit
would. Found by a breaker: 1,024 commands of up to 4 MiB each could wait, and a leader
of a 3-node cluster grew from 94 MB to 1.66 GB under a flood of 4 MB publishes at ack
level NONE, all answered PUBLISH_OK.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from futureq.broker import publishing
from futureq.broker.broker import Broker
from futureq.broker.command_log import SingleNodeLog
from futureq.broker.dispatcher import Dispatcher
from futureq.broker.hub import Hub
from futureq.config import Config
from futureq.errors import ErrorCode, RequestError
from futureq.metrics import Metrics
from futureq.state.queue_state import QueueState
from futureq.storage.db import Database
from futureq.wire import frames

MIB = 1024 * 1024


class WallClock:
    def __init__(self) -> None:
        self.now_ms = 1_700_000_000_000

    def wall_ms(self) -> int:
        return self.now_ms

    def monotonic_s(self) -> float:
        return trio.current_time()


def _batch(number: int) -> list[list[object]]:
    """4 items of 1 MiB: a command of a little over 4 MiB."""
    return [[f"none.t{number % 3}", bytes(MIB), 60_000, None, None] for _ in range(4)]


async def _pending_reaches(state: QueueState, count: int) -> None:
    for _ in range(1000):  # 10 s
        if state.total_pending >= count:
            return
        await trio.sleep(0.01)
    raise AssertionError(f"{state.total_pending} messages pending, not {count}")


async def test_unacknowledged_publishes_wait_bounded_in_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(publishing, "BACKGROUND_QUEUE_BYTES", 16 * MIB)
    db = Database(str(tmp_path / "db"))
    try:
        config = Config()
        state = QueueState(db)
        log = SingleNodeLog(db, state, address="127.0.0.1:1")
        log.recover()
        hub = Hub()
        clock = WallClock()
        metrics = Metrics()
        dispatcher = Dispatcher(state, log, hub, clock, config.queue, metrics)
        state.observer = dispatcher
        broker = Broker(config, state, log, hub, dispatcher, clock, metrics)
        async with trio.open_nursery() as nursery:
            await nursery.start(log.run)
            # The background publisher is held back: what is accepted waits.
            for number in range(3):
                accepted = await broker.publish(_batch(number), frames.AckLevel.NONE)
                assert accepted == (None, 4, None)
            with pytest.raises(RequestError) as refused:
                await broker.publish(_batch(3), frames.AckLevel.NONE)
            assert refused.value.code == ErrorCode.UNAVAILABLE
            assert "ack level leader or quorum" in refused.value.message
            # Publishes that wait for their commit are not held by the queue.
            first_id, count, _ = await broker.publish(_batch(4), frames.AckLevel.QUORUM)
            assert first_id is not None and count == 4

            nursery.start_soon(broker.run_background_publisher)
            await _pending_reaches(state, 16)
            # Drained: taken again, and nothing accepted was lost.
            assert await broker.publish(_batch(5), frames.AckLevel.NONE) == (None, 4, None)
            await _pending_reaches(state, 20)
            nursery.cancel_scope.cancel()
    finally:
        db.close()
