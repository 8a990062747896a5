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
import trio.testing
from broker_helpers import REAL_NOW_MS, RecordingOutbox, open_real_broker

from futureq.broker import membership
from futureq.broker.hub import Consumer
from futureq.state import commands


async def test_a_handover_goes_on_when_its_records_do_not_commit_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(membership, "RECORD_BEFORE_HANDOVER_S", 0.3)
    async with open_real_broker(tmp_path) as (broker, log):
        hub, dispatcher = broker.hub, broker.dispatcher
        async with trio.open_nursery() as running:
            await running.start(log.run)
            gid = await log.propose(commands.create_group("t", "g", None, None))
            await log.propose(commands.publish(REAL_NOW_MS, [("t", b"m", REAL_NOW_MS, None)]))
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


class _TransferringLog:
    """What ``membership.transfer_leadership`` asks of a cluster's log, on a node that
    leads: here the transfer itself is never reached."""

    def __init__(self) -> None:
        self.transfers: list[int | None] = []

    async def transfer_leadership(self, node_id: int | None) -> None:
        self.transfers.append(node_id)

    def membership(self) -> tuple[set[int], set[int]]:
        """Voters and learners: a target that is not a voter is refused first."""
        return {1, 2}, set()


async def test_a_transfer_cancelled_while_recording_leaves_the_leader_dispatching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a tester: a CLUSTER_TRANSFER_LEADER whose request was cancelled while the
    leader recorded its first deliveries out (its connection reset, say) left the
    dispatcher held: the node stayed leader and handed nothing out, ever (the hold
    outlives later leaderships too). The hold now ends however the transfer ends."""
    async with open_real_broker(tmp_path) as (broker, log):
        hub, dispatcher = broker.hub, broker.dispatcher
        cluster = _TransferringLog()
        monkeypatch.setattr(membership, "cluster_log", lambda _broker: cluster)
        async with trio.open_nursery() as running:
            await running.start(log.run)
            gid = await log.propose(commands.create_group("t", "g", None, None))
            await log.propose(commands.publish(REAL_NOW_MS, [("t", b"m", REAL_NOW_MS, None)]))
            outbox = RecordingOutbox()
            hub.add_consumer(Consumer(hub.new_subscription_id(), gid, "t", "g", 1, outbox, 2))
            dispatcher.dispatch_once()
            assert [d[5] for d in outbox.take()] == [1]
            running.cancel_scope.cancel()  # the log commits nothing from here on
        async with trio.open_nursery() as request:
            request.start_soon(membership.transfer_leadership, broker, 2)
            await trio.testing.wait_all_tasks_blocked()
            assert dispatcher.held  # recording the first delivery out
            request.cancel_scope.cancel()  # the request's connection went away
        assert cluster.transfers == []
        assert not dispatcher.held  # before: held for good
