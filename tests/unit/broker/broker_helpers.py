"""Test doubles for the broker unit tests: a fake clock, a synchronous log, an outbox;
and a real broker on a real RocksDB and SingleNodeLog (:func:`open_real_broker`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from futureq.broker.broker import Broker
from futureq.broker.command_log import SingleNodeLog
from futureq.broker.dispatcher import Dispatcher
from futureq.broker.hub import Hub
from futureq.config import Config, QueueSection
from futureq.metrics import Metrics
from futureq.state.queue_state import QueueState
from futureq.state.store import MemoryStore
from futureq.storage.db import Database
from futureq.wire import frames
from futureq.wire.codec import NEED_DATA, FrameDecoder


class FakeClock:
    """A Clock whose time moves only when the test says so."""

    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now_ms = now_ms

    def wall_ms(self) -> int:
        return self.now_ms

    def monotonic_s(self) -> float:
        return self.now_ms / 1000

    def advance(self, ms: int) -> None:
        self.now_ms += ms


class SyncLog:
    """A CommandLog that applies each proposal at once (the seam the broker sees)."""

    def __init__(self, state: QueueState) -> None:
        self.state = state
        self.proposed: list[bytes] = []
        self.fail_with: Exception | None = None

    def is_leader(self) -> bool:
        return True

    def leader_address(self) -> str | None:
        return None

    @property
    def applied_index(self) -> int:
        return self.state.applied_index

    def apply(self, command: bytes) -> Any:
        """Apply a command the test proposes itself (publish, ack, ...)."""
        return self.state.apply(self.state.applied_index + 1, command)

    async def propose(self, command: bytes, decoded: list[Any] | None = None) -> Any:
        self.proposed.append(command)
        if self.fail_with is not None:
            raise self.fail_with
        return self.apply(command)


class RecordingOutbox:
    """An Outbox that decodes what it is given; ``accept=False`` refuses like a full queue.

    DELIVER frames go to ``frames``; every other push (REVOKE, SUBSCRIPTION_END,
    SUBSCRIPTION_INFO) to ``pushes``.
    """

    def __init__(self, accept: bool = True) -> None:
        self.accept = accept
        self.room = True
        self.frames: list[frames.Deliver] = []
        self.pushes: list[frames.Frame] = []

    def has_room(self) -> bool:
        return self.room

    def send_nowait(self, data: bytes) -> bool:
        if not self.accept:
            return False
        decoder = FrameDecoder(len(data))
        decoder.receive_data(data)
        frame = decoder.next_frame()
        assert decoder.next_frame() is NEED_DATA
        if isinstance(frame, frames.Deliver):
            self.frames.append(frame)
        else:
            assert isinstance(
                frame,
                frames.Revoke | frames.SubscriptionEnd | frames.SubscriptionInfo | frames.Handover,
            )
            self.pushes.append(frame)
        return True

    def revoked(self) -> list[bytes]:
        """Every tag REVOKE frames named, in order; clears them."""
        tags = [t for f in self.pushes if isinstance(f, frames.Revoke) for t in f.tags]
        self.pushes = [f for f in self.pushes if not isinstance(f, frames.Revoke)]
        return tags

    def deliveries(self) -> list[list[Any]]:
        """Every ``[tag, id, payload, due_ms, publish_ms, attempt]`` sent, in order."""
        return [d for frame in self.frames for d in frame.deliveries]

    def take(self) -> list[list[Any]]:
        out = self.deliveries()
        self.frames = []
        return out


def queue_section(**overrides: int) -> QueueSection:
    return QueueSection(**overrides)


def memory_state() -> QueueState:
    return QueueState(MemoryStore())


REAL_NOW_MS = 1_700_000_000_000
"""The wall time of :class:`FixedWallClock` (ms since the Unix epoch)."""


class FixedWallClock:
    """Wall time that stands still; monotonic time is trio's."""

    def wall_ms(self) -> int:
        return REAL_NOW_MS

    def monotonic_s(self) -> float:
        return trio.current_time()


@asynccontextmanager
async def open_real_broker(
    tmp_path: Path, config: Config | None = None
) -> AsyncIterator[tuple[Broker, SingleNodeLog]]:
    """A Broker over a real RocksDB in ``tmp_path`` and a real SingleNodeLog, recovered
    but not running: start ``log.run`` in a nursery for proposals to commit."""
    db = Database(str(tmp_path / "db"))
    try:
        config = config or Config()
        state = QueueState(db)
        log = SingleNodeLog(db, state, address="127.0.0.1:1")
        log.recover()
        hub = Hub()
        metrics = Metrics()
        clock = FixedWallClock()
        dispatcher = Dispatcher(
            state,
            log,
            hub,
            clock,
            config.queue,
            metrics,
            max_deliveries_out=config.limits.max_deliveries_out,
            max_out_per_connection=config.limits.max_prefetch_per_connection,
        )
        state.observer = dispatcher
        yield Broker(config, state, log, hub, dispatcher, clock, metrics), log
    finally:
        db.close()
