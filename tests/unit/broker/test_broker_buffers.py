"""Connection buffers bounded in bytes: the outbox and the node-wide account
(``futureq.broker.buffers``; issue 10, input 3)."""

from __future__ import annotations

import trio
import trio.testing

from futureq.broker.buffers import NodeBuffers, Outbox


def test_outbox_has_room_below_its_limit_and_says_when_it_has_again() -> None:
    node = NodeBuffers(1000)
    resumed: list[str] = []
    full: list[str] = []
    outbox = Outbox(100, node, lambda: resumed.append("room"), lambda: full.append("full"))
    assert outbox.has_room()
    assert outbox.send_nowait(b"x" * 120)
    assert node.outbound == 120
    assert not outbox.has_room() and not outbox.has_room()
    assert full == ["full"]  # counted once per time it fills
    assert not outbox.overflowed
    outbox.send_nowait(b"y" * 90)  # answers still go in, up to twice the limit
    assert outbox.overflowed
    outbox.written(120)
    # 90 left: room again, but the dispatcher is woken only below half the limit.
    assert resumed == [] and outbox.has_room()
    outbox.written(60)
    assert resumed == ["room"] and outbox.has_room()
    assert node.outbound == 30


def test_the_node_limit_holds_deliveries_on_every_connection() -> None:
    resumed: list[str] = []
    node = NodeBuffers(100, on_room=lambda: resumed.append("room"))
    first, second = Outbox(1000, node), Outbox(1000, node)
    first.send_nowait(b"x" * 100)
    assert not first.has_room() and not second.has_room()
    assert node.full_count == 1
    first.written(40)
    assert resumed == [] and second.has_room()  # below the limit again
    first.written(60)
    assert resumed == ["room"]


async def test_take_joins_frames_and_ends_after_close() -> None:
    outbox = Outbox(1000, NodeBuffers(1000))
    outbox.send_nowait(b"a")
    outbox.send_nowait(b"b")
    assert await outbox.take() == b"ab"
    outbox.close()
    assert not outbox.send_nowait(b"c")  # closing: nothing more is queued
    assert not outbox.has_room()
    assert await outbox.take() is None


async def test_take_waits_for_a_frame() -> None:
    outbox = Outbox(1000, NodeBuffers(1000))
    async with trio.open_nursery() as nursery:
        got: list[bytes | None] = []

        async def taker() -> None:
            got.append(await outbox.take())

        nursery.start_soon(taker)
        await trio.testing.wait_all_tasks_blocked()
        outbox.send_nowait(b"late")
    assert got == [b"late"]


def test_discard_releases_what_was_not_written() -> None:
    node = NodeBuffers(1000)
    outbox = Outbox(1000, node)
    outbox.send_nowait(b"x" * 300)
    outbox.discard()
    assert node.outbound == 0 and outbox.buffered_bytes == 0


async def test_incomplete_frames_wait_while_incoming_bytes_are_at_the_limit() -> None:
    node = NodeBuffers(100)
    node.change(inbound=100)
    node.change(outbound=1000)  # outgoing bytes never hold incoming ones
    with trio.move_on_after(0.01) as waited:
        await node.wait_room()
    assert waited.cancelled_caught
    async with trio.open_nursery() as nursery:
        nursery.start_soon(node.wait_room)
        await trio.testing.wait_all_tasks_blocked()
        node.change(inbound=-50)
