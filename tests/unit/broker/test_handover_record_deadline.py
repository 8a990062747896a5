"""A leader handing over records its first deliveries out, but waits for that a bounded time.

``Broker.hold_and_record_deliveries`` runs before a graceful shutdown, an operator's
``cluster transfer-leader`` and a shard's balancing transfer. It proposes a
RETURN_COUNTED and waited for it without a deadline: a log that did not commit held the
handover (and, on the shutdown path, the whole grace period) for as long. A real RocksDB
in ``tmp_path`` and a real SingleNodeLog, whose writer is stopped after the delivery went
out, stand for a log that cannot commit.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
from broker_helpers import RecordingOutbox

from futureq.broker import membership
from futureq.broker.broker import Broker
from futureq.broker.command_log import SingleNodeLog
from futureq.broker.dispatcher import Dispatcher
from futureq.broker.hub import Consumer, Hub
from futureq.config import Config
from futureq.metrics import Metrics
from futureq.state import commands
from futureq.state.queue_state import QueueState
from futureq.storage.db import Database

NOW_MS = 1_700_000_000_000


class WallClock:
    def wall_ms(self) -> int:
        return NOW_MS

    def monotonic_s(self) -> float:
        return trio.current_time()


async def test_a_handover_goes_on_when_its_records_do_not_commit_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(membership, "RECORD_BEFORE_HANDOVER_S", 0.3)
    db = Database(str(tmp_path / "db"))
    try:
        config = Config()
        state = QueueState(db)
        log = SingleNodeLog(db, state, address="127.0.0.1:1")
        log.recover()
        hub = Hub()
        metrics = Metrics()
        dispatcher = Dispatcher(state, log, hub, WallClock(), config.queue, metrics)
        state.observer = dispatcher
        broker = Broker(config, state, log, hub, dispatcher, WallClock(), metrics)
        async with trio.open_nursery() as running:
            await running.start(log.run)
            gid = await log.propose(commands.create_group("t", "g", None, None))
            await log.propose(commands.publish(NOW_MS, [("t", b"m", NOW_MS, None)]))
            outbox = RecordingOutbox()
            hub.add_consumer(Consumer(hub.new_subscription_id(), gid, "t", "g", 1, outbox, 1))
            dispatcher.dispatch_once()  # a first delivery goes out from the pass itself
            assert [d[5] for d in outbox.take()] == [1]
            running.cancel_scope.cancel()  # the log commits nothing from here on
        with trio.fail_after(10):  # before: waited for ever
            await broker.hold_and_record_deliveries()
        assert dispatcher.held  # nothing more goes out while handing over
        assert "not recorded within 0.3 s" in caplog.text
        assert any(r.levelno == logging.WARNING for r in caplog.records)
    finally:
        db.close()
