"""Leaving a subscription gives back what the application never saw uncounted
(``docs/client.md``; ``docs/protocol.md``, UNSUBSCRIBE, version 3), against a real
``futureq start``.

Found by a tester: leaving a ``subscribe`` block released what it buffered, then
unsubscribed. The server still held credit (prefetch above what was due, or returned
by an ack) and pushed a released message straight back; the client dropped it as
closed, and the UNSUBSCRIBE counted it: with ``max_deliveries`` 1 it went to the
dead-letter topic unread.
"""

from __future__ import annotations

from typing import Any, Protocol

import pytest
import trio
from wire_client import WireClient

from futureq.client import PublishItem, open_client
from futureq.errors import ErrorCode
from futureq.wire import codec, frames


class BrokerProcess(Protocol):
    """What these tests use of the ``broker`` fixture (tests/integration/conftest.py)."""

    client_address: str


def _topics(status: dict[str, Any]) -> set[str]:
    return {entry["topic"] for entry in status["topics"]}


def _groups(status: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(entry["topic"], g["group"]): g for entry in status["topics"] for g in entry["groups"]}


async def _take(client: Any, topic: str, within_s: float = 3.0) -> list[bytes]:
    """Subscribe to ``topic`` (group g) and take, ack and return the payloads of what
    is delivered until nothing came for ``within_s``."""
    got: list[bytes] = []
    async with client.subscribe(topic, "g", prefetch=10) as sub:
        while (delivery := await sub.receive(within_s)) is not None:
            got.append(delivery.payload)
            await delivery.ack()
    return sorted(got)


async def test_buffered_deliveries_go_back_uncounted_though_the_server_held_credit(
    broker: BrokerProcess,
) -> None:
    # Each round: 5 due, prefetch 8 (3 credits left on the server), one handed and
    # acked (its credit returned too), 4 buffered when the block is left. Before, a
    # released one pushed straight back was counted most rounds, and the next
    # subscriber saw it go to the dead-letter topic (max_deliveries 1) instead.
    async with open_client(broker.client_address) as client:
        for round_ in range(8):
            topic = f"leave{round_}"
            await client.create_group(topic, "g", max_deliveries=1)
            await client.publish_batch([PublishItem(topic, b"%d" % i) for i in range(5)])
            async with client.subscribe(topic, "g", prefetch=8) as sub:
                first = await sub.__anext__()
                await first.ack()
                with trio.fail_after(10):
                    while sub.buffered < 4:  # noqa: ASYNC110 - no event says "buffered", under a deadline
                        await trio.sleep(0.005)
            left = {b"0", b"1", b"2", b"3", b"4"} - {first.payload}
            assert await _take(client, topic, 0.5) == sorted(left), round_
            assert f"{topic}.dlq" not in _topics(await client.status()), round_


async def test_what_the_application_was_handed_and_did_not_settle_counts(
    broker: BrokerProcess,
) -> None:
    async with open_client(broker.client_address) as client:
        await client.create_group("held", "g", max_deliveries=1)
        await client.publish_batch([PublishItem("held", b"%d" % i) for i in range(6)])
        async with client.subscribe("held", "g", prefetch=6) as sub:
            handed = [await sub.__anext__() for _ in range(2)]  # crashed working on them
            acked = await sub.__anext__()
            await acked.ack()
            with trio.fail_after(10):
                while sub.buffered < 3:  # noqa: ASYNC110 - no event says "buffered", under a deadline
                    await trio.sleep(0.005)
        # The three buffered come again; the two handed had their one attempt
        # (max_deliveries 1) and go to the dead-letter topic.
        seen = {d.payload for d in (*handed, acked)}
        assert await _take(client, "held") == sorted({b"%d" % i for i in range(6)} - seen)
        assert await _take(client, "held.dlq") == sorted(d.payload for d in handed)


def test_unsubscribe_with_handed_on_the_wire(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address, versions=(3,))
    answer = client.request(frames.GroupCreate(client.next_id(), "wire", "g", None, 1))
    assert isinstance(answer, frames.Ok)
    client.publish([["wire", b"%d" % i, 0, None, None] for i in range(3)])
    sid = client.subscribe("wire", "g", prefetch=3)
    delivered = client.deliveries(3)
    tags = [d[0] for d in delivered]
    # Not a list of binaries: refused alone, the subscription and connection stay.
    answer = client.request(frames.Unsubscribe(client.next_id(), sid, ["x"]))  # type: ignore[list-item]
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.INVALID_FIELD
    assert "handed[0] must be binary" in answer.message
    # One handed, one tag it never held (ignored); the other two go back uncounted.
    answer = client.request(frames.Unsubscribe(client.next_id(), sid, [tags[1], b"\0" * 12]))
    assert isinstance(answer, frames.Ok)
    assert client.group_pending("wire", "g") == 3
    # A new subscriber gets the two uncounted; the handed one, counted, is dead-lettered.
    client.subscribe("wire", "g", prefetch=3)
    again = client.deliveries(2)
    assert sorted(d[1] for d in again) == sorted(d[1] for i, d in enumerate(delivered) if i != 1)
    client.expect_nothing(0.3)
    assert client.group_pending("wire.dlq", "default") == 1
    answer = client.request(frames.Unsubscribe(client.next_id(), sid, []))
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.UNKNOWN_SUBSCRIPTION


async def test_a_buffered_delivery_past_max_lease_s_goes_back_uncounted(
    broker: BrokerProcess,
) -> None:
    """Found by a tester: past ``max_lease_s`` the client left a buffered delivery to
    time out, which counted it; with ``max_deliveries`` 1 it went to the dead-letter
    topic without the application ever seeing it. It is released now."""
    async with open_client(broker.client_address, max_lease_s=0.3) as client:
        await client.create_group("lease", "g", visibility_timeout_ms=600, max_deliveries=1)
        await client.publish_batch([PublishItem("lease", b"%d" % i) for i in range(2)])
        async with client.subscribe("lease", "g", prefetch=2) as sub:
            first = await sub.__anext__()  # the application works on it for 1.5 s
            for _ in range(5):
                await trio.sleep(0.3)
                await first.extend(600)
            await first.ack()
            # The other sat in the buffer past the lease and past its visibility
            # timeout: released at 0.3 s and pushed again (attempt 2, uncounted).
            second = await sub.receive(5)
            assert second is not None and second.payload != first.payload
            assert second.attempt >= 2
            await second.ack()
        assert "lease.dlq" not in _topics(await client.status())


async def test_leaving_with_more_handed_than_a_server_frame_holds_keeps_the_connection(
    broker_factory: Any,
) -> None:
    """Found by a tester: the UNSUBSCRIBE named every delivery handed and not settled;
    1,500 tags on a server of ``max_batch_items`` 100 (an array of at most 1,424
    decoded) closed the connection (MALFORMED_FRAME), ending its other subscriptions,
    and every delivery of the connection went back counted: with ``max_deliveries`` 1
    the ones never handed went to the dead-letter topic unread."""
    broker = broker_factory(env={"FUTUREQ_LIMITS_MAX_BATCH_ITEMS": "100"})
    async with open_client(broker.client_address) as client:
        await client.create_group("big", "g", max_deliveries=1)
        for start in range(0, 1600, 100):
            items = [PublishItem("big", b"%d" % i) for i in range(start, start + 100)]
            await client.publish_batch(items)
        async with client.subscribe("side", "g", prefetch=5) as side:
            async with client.subscribe("big", "g", prefetch=1600) as sub:
                with trio.fail_after(10):
                    handed = {(await sub.__anext__()).payload for _ in range(1500)}
                    while sub.buffered < 100:  # noqa: ASYNC110 - no event says "buffered", under a deadline
                        await trio.sleep(0.005)
            await client.publish("side", b"s")
            with trio.fail_after(10):
                assert (await side.__anext__()).payload == b"s"
        unread = sorted({b"%d" % i for i in range(1600)} - handed)
        assert await _take(client, "big", 0.5) == unread
        assert _groups(await client.status())[("big.dlq", "default")]["pending"] == 1500
    assert "MALFORMED_FRAME" not in broker.stderr_text()


@pytest.mark.parametrize("version", [1, 2])
def test_handed_on_a_connection_of_an_older_version_is_refused_as_before(
    broker: BrokerProcess, version: int
) -> None:
    """Found by a tester: a connection that chose version 1 or 2 had its UNSUBSCRIBE
    with handed obeyed, though such a connection is answered exactly as before
    (``docs/protocol.md``, "Versions"): a client built that way worked here and lost
    its connection on an older server. Its deliveries all go back counted, as when a
    connection ends."""
    client = WireClient(broker.client_address, versions=(version,))
    answer = client.request(frames.GroupCreate(client.next_id(), "old", "g", None, 1))
    assert isinstance(answer, frames.Ok)
    client.publish([["old", b"a", 0, None, None]])
    sid = client.subscribe("old", "g", prefetch=1)
    client.deliveries(1)
    answer = client.request(frames.Unsubscribe(client.next_id(), sid, []))
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.INVALID_FRAME
    assert "protocol version 3" in answer.message and f"version {version}" in answer.message
    assert client.receive() is codec.CLOSED
    other = WireClient(broker.client_address)
    other.subscribe("old", "g", prefetch=1)
    other.expect_nothing(0.3)  # counted: max_deliveries 1, so dead-lettered
    assert other.group_pending("old.dlq", "default") == 1


async def test_a_cancelled_fetch_gives_back_what_it_had_taken_uncounted(
    broker: BrokerProcess,
) -> None:
    """Found by a tester: a pull-mode ``fetch`` cancelled while waiting for more kept
    the deliveries it had already taken as handed to the application, which never got
    them; leaving the block counted them (``max_deliveries`` 1: to the dead-letter
    topic unread)."""
    async with open_client(broker.client_address) as client:
        await client.create_group("pulled", "g", max_deliveries=1)
        await client.publish_batch([PublishItem("pulled", b"%d" % i) for i in range(10)])
        async with client.subscribe("pulled", "g", prefetch=5, pull=True) as sub:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sub.fetch, 20, 30.0)  # takes the 10, waits for more
                with trio.fail_after(10):
                    # All 10 pushed and taken out of the buffer by the fetch (which
                    # hands them to the application only as it returns).
                    while sub._outstanding < 10 or sub.buffered:  # noqa: ASYNC110 - no event says "taken", under a deadline
                        await trio.sleep(0.005)
                nursery.cancel_scope.cancel()
            again = await sub.fetch(3, 5.0)  # given back at once: fetched again
            assert len(again) == 3
            for delivery in again:
                await delivery.ack()
        rest = await _take(client, "pulled")
        assert sorted([*rest, *(d.payload for d in again)]) == sorted(b"%d" % i for i in range(10))
        assert "pulled.dlq" not in _topics(await client.status())
