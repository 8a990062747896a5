"""RESCHEDULE while a group is being filled from the backlog, on a real broker.

A real RocksDB and SingleNodeLog; the backfill's chunks (BACKFILL_GROUP) are proposed
by the test, one at a time, as the dispatcher's reaper would. Source:
``docs/protocol.md``, "GROUP_CREATE" (``from_backlog``: every message still pending in
the topic's other groups), "RESCHEDULE".
"""

from __future__ import annotations

from pathlib import Path

import trio
from broker_helpers import REAL_NOW_MS, open_real_broker

from futureq.broker import manage
from futureq.state import commands
from futureq.state.commands import CommandKind
from futureq.wire import frames


async def test_a_message_rescheduled_during_a_backfill_still_reaches_the_new_group(
    tmp_path: Path,
) -> None:
    """Found by a tester: messages due over the next hour, a group created from the
    backlog, and meanwhile an operator rescheduled one the backfill had not reached to
    'now' in the old group: the backfill's cursor (in due order) had passed 'now', so
    the new group never got that message. The leader now writes the RESCHEDULE as
    RESCHEDULE_BACKFILLING while a group of the topic is being filled, and apply
    copies the message to that group before moving it."""
    async with open_real_broker(tmp_path) as (broker, log):
        async with trio.open_nursery() as running:
            await running.start(log.run)
            await log.propose(commands.create_group("t", "g", None, None))
            items = [("t", b"m%d" % n, REAL_NOW_MS + 60_000 * n, None) for n in range(1, 7)]
            first = await log.propose(commands.publish(REAL_NOW_MS, items))
            ids = [first + n for n in range(6)]
            late = await log.propose(
                commands.create_group("t", "late", None, None, from_backlog=True)
            )
            assert await log.propose(commands.backfill_group(late, 3)) == 3
            proposed: list[bytes] = []
            propose = log.propose

            async def recording(command: bytes, decoded: object = None) -> object:
                proposed.append(command)
                return await propose(command)

            log.propose = recording  # type: ignore[method-assign]
            frame = frames.Reschedule(1, "t", "g", [ids[5]], None, 0)  # due now
            assert await manage.reschedule(broker, frame) == [frames.ItemStatus.DONE]
            log.propose = propose  # type: ignore[method-assign]
            assert [commands.decode(c)[0] for c in proposed] == [CommandKind.RESCHEDULE_BACKFILLING]
            while late in broker.state.backfilling:
                await log.propose(commands.backfill_group(late, 3))
            held = sorted(mid for _d, mid, _a, _e in broker.state.scan_schedule(late, 0, 0, 100))
            assert held == ids  # before: ids[5] missing, for good
            info = broker.state.find_group("t", "late")
            assert info is not None and info.pending == 6
            # With no backfill running the RESCHEDULE is written as before (kind 31).
            proposed.clear()
            log.propose = recording  # type: ignore[method-assign]
            frame = frames.Reschedule(2, "t", "g", [ids[4]], None, 0)
            assert await manage.reschedule(broker, frame) == [frames.ItemStatus.DONE]
            log.propose = propose  # type: ignore[method-assign]
            assert [commands.decode(c)[0] for c in proposed] == [CommandKind.RESCHEDULE_COUNTED]
            running.cancel_scope.cancel()
