"""``limits.max_groups``: a group that requests in flight will create is counted once.

A real RocksDB in ``tmp_path``, a real SingleNodeLog and a real Broker; the log's
writer is started late, so proposals stay in flight while other requests are checked.
A PUBLISH to a new topic and a SUBSCRIBE (or GROUP_CREATE) of a named group of it make
one group between them, whichever commits first: the publish makes the implicit group
and the name adopts it, or the name makes its group and the publish finds it. Found by
a tester: under a limit of one, the second of the two was refused (both were counted).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing
from broker_helpers import open_real_broker

from futureq.broker.broker import Broker
from futureq.broker.command_log import SingleNodeLog
from futureq.config import Config
from futureq.errors import ErrorCode, RequestError
from futureq.wire import frames


@asynccontextmanager
async def open_broker(
    tmp_path: Path, max_groups: int
) -> AsyncIterator[tuple[Broker, SingleNodeLog]]:
    base = Config()
    config = attrs.evolve(base, limits=attrs.evolve(base.limits, max_groups=max_groups))
    async with open_real_broker(tmp_path, config) as opened:
        yield opened


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(1000):  # 10 s
        if condition():
            return
        await trio.sleep(0.01)
    raise AssertionError("the proposals in flight did not commit within 10 s")


def _item(topic: str) -> list[object]:
    return [topic, b"x", 60_000, None, None]


async def test_a_publish_in_flight_and_a_name_for_its_new_topic_make_one_group(
    tmp_path: Path,
) -> None:
    async with open_broker(tmp_path, max_groups=1) as (broker, log):
        async with trio.open_nursery() as nursery:
            # Held in the background publisher's queue: its implicit group is reserved.
            assert await broker.publish([_item("t")], frames.AckLevel.NONE) == (None, 1, None)
            await nursery.start(log.run)
            info = await broker.ensure_group("t", "g")  # refused before: counted twice
            assert info.name == "g"
            nursery.start_soon(broker.run_background_publisher)
            await _until(lambda: broker.state.total_pending == 1)
            assert [(g.topic, g.name) for g in broker.state.groups.values()] == [("t", "g")]
            # The limit still holds for a group that is truly new.
            with pytest.raises(RequestError) as refused:
                await broker.ensure_group("t", "second")
            assert refused.value.code == ErrorCode.TOO_MANY_GROUPS
            nursery.cancel_scope.cancel()


async def test_a_name_in_flight_and_a_publish_to_its_new_topic_make_one_group(
    tmp_path: Path,
) -> None:
    async with open_broker(tmp_path, max_groups=1) as (broker, log):
        async with trio.open_nursery() as nursery:
            created = trio.Event()

            async def create() -> None:
                await broker.ensure_group("t", "g")
                created.set()

            nursery.start_soon(create)
            await trio.testing.wait_all_tasks_blocked()  # its proposal waits for the writer
            published = await broker.publish([_item("t")], frames.AckLevel.NONE)
            assert published == (None, 1, None)  # refused before: counted twice
            with pytest.raises(RequestError) as refused:
                await broker.publish([_item("other")], frames.AckLevel.NONE)
            assert refused.value.code == ErrorCode.TOO_MANY_GROUPS
            assert "max_groups = 1" in refused.value.message
            await nursery.start(log.run)
            nursery.start_soon(broker.run_background_publisher)
            await created.wait()
            await _until(lambda: broker.state.total_pending == 1)
            assert [(g.topic, g.name) for g in broker.state.groups.values()] == [("t", "g")]
            nursery.cancel_scope.cancel()


async def test_names_in_flight_before_the_implicit_group_committed_count_one_adopter(
    tmp_path: Path,
) -> None:
    """Two names reserved while the topic had no group, then its implicit group commits:
    one of the two adopts it, so they make two groups, not three."""
    async with open_broker(tmp_path, max_groups=2) as (broker, log):
        async with trio.open_nursery() as nursery:
            assert await broker.publish([_item("t")], frames.AckLevel.NONE) == (None, 1, None)
            for name in ("a", "b"):
                nursery.start_soon(broker.ensure_group, "t", name)
            await trio.testing.wait_all_tasks_blocked()
            await nursery.start(log.run)
            nursery.start_soon(broker.run_background_publisher)
            await _until(lambda: len(broker.state.groups) == 2 and broker.state.total_pending >= 1)
            names = sorted(g.name for g in broker.state.groups.values())
            assert names == ["a", "b"]
            nursery.cancel_scope.cancel()
