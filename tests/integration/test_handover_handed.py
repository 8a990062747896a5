"""A graceful leader handover counts only what the application was handed
(``docs/protocol.md``, HANDOVER, protocol version 4), against a real 3-node cluster.

Found by two testers: a leader handing over gracefully (``futureq-cli cluster
transfer-leader``, a SIGTERM of the leader node) recorded every first delivery out as
a counted attempt, the deliveries a client had only buffered (prefetch) included: with
``max_deliveries`` 1, a rolling restart sent every consumer's unread buffer to the
dead-letter topic without the application ever seeing it. Now the leader asks each
subscription what its application was handed; only those count.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from cluster_process import Cluster
from wire_client import WireClient

from futureq.client import PublishItem, open_client
from futureq.errors import ErrorCode, FutureQError, RequestError
from futureq.wire import codec, frames

HANDED = 2
"""Deliveries the application takes and never settles (it 'crashed' working on them)."""
PUBLISHED = 12


async def _buffered(sub: Any, count: int) -> None:
    with trio.fail_after(15):
        while sub.buffered < count:  # noqa: ASYNC110 - no event says "buffered", under a deadline
            await trio.sleep(0.005)


async def _dead_letters(client: Any, topic: str, count: int) -> list[bytes]:
    """The payloads of ``topic``'s dead-letter topic once ``count`` are there."""
    got: list[bytes] = []
    async with client.subscribe(f"{topic}.dlq", "inspect", prefetch=50) as sub:
        while len(got) < count:
            delivery = await sub.receive(15)
            assert delivery is not None, got
            got.append(delivery.payload)
            await delivery.ack()
        assert await sub.receive(0.3) is None
    return sorted(got)


async def _hand_over(cluster: Cluster, client: Any, topic: str, how: str) -> None:
    # The handed ones stay out on the next leader until their visibility deadline.
    await client.create_group(topic, "g", visibility_timeout_ms=3_000, max_deliveries=1)
    await client.publish_batch([PublishItem(topic, b"%d" % i) for i in range(PUBLISHED)])
    async with client.subscribe(topic, "g", prefetch=50) as sub:
        handed = [await sub.__anext__() for _ in range(HANDED)]
        await _buffered(sub, PUBLISHED - HANDED)
        leader = cluster.leader(30)
        if how == "transfer":
            target = next(n for n in cluster.nodes if n != leader.node_id)
            await client.transfer_leader(target)
        else:
            await trio.to_thread.run_sync(leader.terminate)
        # Every unread one comes again (from the new leader), none of them counted out.
        unread: list[bytes] = []
        while len(unread) < PUBLISHED - HANDED:
            delivery = await sub.receive(10)
            if delivery is None:
                break  # before: the unread ones went to the dead-letter topic instead
            try:
                await delivery.ack()
            except FutureQError:
                continue  # handed by the old leader just before it went: it comes again
            unread.append(delivery.payload)
        expected = {b"%d" % i for i in range(PUBLISHED)} - {d.payload for d in handed}
        assert sorted(unread) == sorted(expected), how
        # The handed and never settled ones count, as before: max_deliveries 1, dead
        # letters, once their visibility deadline passed (docs/protocol.md, "Delivery
        # tags across leaders"; a group is dispatched while it has a consumer).
        dead = await _dead_letters(client, topic, HANDED)
        assert dead == sorted(d.payload for d in handed), how


async def test_a_graceful_handover_dead_letters_no_unread_delivery(cluster3: Cluster) -> None:
    async with open_client(cluster3.servers, request_timeout_s=30) as client:
        await _hand_over(cluster3, client, "moved", "transfer")
        await _hand_over(cluster3, client, "stopped", "sigterm")


def _frames_until_closed(client: WireClient) -> list[Any]:
    seen: list[Any] = [*client.notices]
    while (frame := client.receive(30)) is not codec.CLOSED:
        seen.append(frame)
    return seen


def test_a_version_3_connection_is_not_asked_and_one_that_does_not_answer_counts(
    cluster3: Cluster,
) -> None:
    # A client of version 3 gets no HANDOVER (it would not know the frame); one of
    # version 4 that does not answer is not waited for past the bound. Every delivery
    # out to either counts, as before version 4 (docs/protocol.md, "Versions"), and
    # stays out on the next leader until its visibility deadline (2 s here).
    leader = cluster3.leader(30)
    admin = WireClient(leader.client_address, versions=(4,))
    consumers: dict[str, WireClient] = {}
    got: dict[str, list[list[Any]]] = {}
    for topic, versions in (("old", (1, 2, 3)), ("silent", (4,))):
        answer = admin.request(frames.GroupCreate(admin.next_id(), topic, "g", 2_000, 1))
        assert isinstance(answer, frames.Ok), answer
        answer = admin.publish([[topic, b"%d" % i, None, None, None] for i in range(4)])
        assert isinstance(answer, frames.PublishOk), answer
        consumers[topic] = WireClient(leader.client_address, versions=versions)
        consumers[topic].subscribe(topic, "g", prefetch=10)
        got[topic] = consumers[topic].deliveries(4)
    target = next(n for n in cluster3.nodes if n != leader.node_id)
    answer = admin.request(frames.ClusterTransferLeader(admin.next_id(), target), 30)
    assert isinstance(answer, frames.Ok), answer
    asked = {
        topic: [f for f in _frames_until_closed(c) if isinstance(f, frames.Handover)]
        for topic, c in consumers.items()
    }
    assert asked["old"] == [], asked
    assert len(asked["silent"]) == 1, asked
    new_leader = cluster3.leader(30, exclude={leader.node_id}).client_address
    reader = WireClient(new_leader)
    for topic in consumers:
        # A group is dispatched (here: dead-lettered) while it has a consumer.
        WireClient(new_leader).subscribe(topic, "g", prefetch=10)
        reader.subscribe(f"{topic}.dlq", "inspect", prefetch=10)
        dead = reader.deliveries(4)
        assert sorted(d[2] for d in dead) == sorted(d[2] for d in got[topic]), topic


async def test_a_transfer_to_a_node_that_is_not_a_voter_disturbs_no_subscription(
    cluster3: Cluster,
) -> None:
    # Refused before any HANDOVER: the subscription keeps what it buffered.
    async with open_client(cluster3.servers, request_timeout_s=30) as client:
        await client.publish_batch([PublishItem("kept", b"%d" % i) for i in range(4)])
        async with client.subscribe("kept", "g", prefetch=10) as sub:
            await _buffered(sub, 4)
            subscription_id = sub.subscription_id
            with pytest.raises(RequestError) as refused:
                await client.transfer_leader(9)
            assert refused.value.code is ErrorCode.INVALID_ARGUMENT
            assert "node 9 is not a voter" in refused.value.message
            assert (sub.buffered, sub.subscription_id) == (4, subscription_id)


async def test_a_fetch_waiting_for_more_at_a_handover_returns_only_what_it_can_settle(
    cluster3: Cluster,
) -> None:
    # Found by a tester: SyncClient.consume(count=20) waiting for more while the leader
    # handed over had already taken 5 deliveries; the client named them handed (they
    # counted), the call then returned them, their acks failed (the leadership had
    # moved), and with max_deliveries 1 all 5 went to the dead-letter topic. What a
    # fetch in progress took is not handed until it returns: it goes back uncounted and
    # the same fetch receives it again from the new leader.
    topic = "fetching"
    async with open_client(cluster3.servers, request_timeout_s=30) as client:
        await client.create_group(topic, "g", max_deliveries=1)
        await client.publish_batch([PublishItem(topic, b"%d" % i) for i in range(5)])
        async with client.subscribe(topic, "g", 1, pull=True) as sub:
            fetched: list[Any] = []

            async def fetch() -> None:
                fetched.extend(await sub.fetch(20, 5))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(fetch)
                with trio.fail_after(15):
                    # All 5 pushed and taken by the fetch out of the buffer.
                    while sub._outstanding < 5 or sub.buffered:  # noqa: ASYNC110 - no event says "taken", under a deadline
                        await trio.sleep(0.005)
                leader = cluster3.leader(30)
                target = next(n for n in cluster3.nodes if n != leader.node_id)
                await client.transfer_leader(target)
            assert sorted(d.payload for d in fetched) == [b"%d" % i for i in range(5)]
            await sub.ack(fetched)  # before: void, "came on a connection since lost"
    async with open_client(cluster3.servers, request_timeout_s=30) as client:
        async with client.subscribe(f"{topic}.dlq", "inspect", prefetch=10) as dead:
            assert await dead.receive(1) is None
