"""PUBLISHes a connection's reader proposes itself (``INLINE_PUBLISH_ITEMS``): what they
hold is given back however they end, and a long pipeline of them does not hold the event
loop for its whole read.

A real broker (RocksDB in a temporary directory, a real SingleNodeLog) serves one
connection over an in-memory stream pair."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing
from broker_helpers import open_real_broker

from futureq.broker.buffers import NodeBuffers
from futureq.broker.connection import INLINE_PUBLISH_ITEMS, Connection
from futureq.wire import codec, frames

HELLO = codec.encode_frame(frames.Hello(1, tuple(frames.SUPPORTED_VERSIONS), "test", None))


def _publishes(count: int, topic_of: str = "t{n}", first_id: int = 2) -> bytes:
    return b"".join(
        codec.encode_frame(
            frames.Publish(
                first_id + n,
                frames.AckLevel.QUORUM if n % 2 else frames.AckLevel.LEADER,
                [[topic_of.format(n=n), b"x", 60_000, None, None]],
            )
        )
        for n in range(count)
    )


async def test_publishes_cancelled_before_their_commit_give_back_what_they_held(
    tmp_path: Path,
) -> None:
    async with open_real_broker(tmp_path) as (broker, log):
        buffers = NodeBuffers(broker.config.limits.max_node_buffer_bytes)
        client, server = trio.testing.memory_stream_pair()
        connection = Connection(broker, server, node_buffers=buffers, peer="test")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(connection.serve)
            # Each names a new topic: its implicit group is reserved until it commits.
            await client.send_all(HELLO + _publishes(40))
            await trio.testing.wait_all_tasks_blocked()
            # The log is not running: every one waits for its commit, holding its bytes,
            # its slot and its group's reservation.
            assert buffers.requests > 0
            assert len(broker._groups_reserved) == 40
            nursery.cancel_scope.cancel()  # the server stops: the connection is cancelled
        assert buffers.requests == 0
        assert not broker._groups_reserved
        async with trio.open_nursery() as nursery:
            await nursery.start(log.run)
            with trio.fail_after(10):
                await log.wait_idle()  # no proposal is counted as still waiting for its answer
                # One more, committed after them: they went on, unanswered.
                await broker.publish([["later", b"x", 60_000, None, None]], frames.AckLevel.QUORUM)
            nursery.cancel_scope.cancel()
        assert broker.state.applied_index == 41


async def test_a_long_pipeline_of_small_publishes_lets_other_tasks_run_while_read(
    tmp_path: Path,
) -> None:
    batch = 100
    count = 200
    publishes = [
        codec.encode_frame(
            frames.Publish(2 + n, frames.AckLevel.QUORUM, [["t", b"x", 60_000, None, None]] * batch)
        )
        for n in range(count)
    ]
    async with open_real_broker(tmp_path) as (broker, log):
        client, server = trio.testing.memory_stream_pair()
        connection = Connection(broker, server, peer="test")
        async with trio.open_nursery() as nursery:
            await nursery.start(log.run)
            nursery.start_soon(connection.serve)
            await client.send_all(HELLO)
            await trio.testing.wait_all_tasks_blocked()
            unread: list[int] = []

            async def watch() -> None:
                # The bytes read and not yet taken as requests, at each pass of the loop.
                while True:
                    unread.append(connection.session.buffered_bytes)
                    await trio.lowlevel.checkpoint()

            nursery.start_soon(watch)
            await client.send_all(b"".join(publishes))
            decoder = codec.FrameDecoder(1 << 24)
            answered = 0
            with trio.fail_after(30):
                while answered < count + 1:  # HELLO_OK too
                    decoder.receive_data(await client.receive_some(1 << 16))
                    while (frame := decoder.next_frame()) is not codec.NEED_DATA:
                        assert isinstance(frame, frames.HelloOk | frames.PublishOk), frame
                        answered += 1
            nursery.cancel_scope.cancel()
    # The reader took a few of them at a time (about INLINE_PUBLISH_ITEMS items: twice
    # that between two looks, as trio runs the tasks of a pass in either order), never
    # a whole read's worth (256 KiB, up to 256 requests) in one pass.
    taken = [a - b for a, b in zip(unread, unread[1:], strict=False) if a > b]
    assert taken, "the reader took every request of a read in one pass"
    most = 2 * (INLINE_PUBLISH_ITEMS // batch + 1) * max(map(len, publishes))
    assert max(taken) <= most, (max(taken), most)


async def test_pipelined_keyed_publishes_are_answered_with_their_duplicates(
    tmp_path: Path,
) -> None:
    # A keyed batch is answered from its apply result, not its log index, at either level.
    keyed = ["k", b"x", 60_000, None, None, None, "key-1"]
    requests = [
        frames.Publish(2, frames.AckLevel.LEADER, [keyed]),
        frames.Publish(3, frames.AckLevel.LEADER, [["k", b"y", 60_000, None, None], keyed]),
        frames.Publish(4, frames.AckLevel.QUORUM, [keyed]),
    ]
    async with open_real_broker(tmp_path) as (broker, log):
        client, server = trio.testing.memory_stream_pair()
        connection = Connection(broker, server, peer="test")
        async with trio.open_nursery() as nursery:
            await nursery.start(log.run)
            nursery.start_soon(connection.serve)
            await client.send_all(HELLO + b"".join(map(codec.encode_frame, requests)))
            decoder = codec.FrameDecoder(1 << 24)
            answers: dict[int, frames.Frame] = {}
            with trio.fail_after(10):
                while len(answers) < 4:
                    decoder.receive_data(await client.receive_some(1 << 16))
                    while (frame := decoder.next_frame()) is not codec.NEED_DATA:
                        answers[frame.request_id] = frame  # type: ignore[attr-defined]
            nursery.cancel_scope.cancel()
    first = answers[2]
    assert isinstance(first, frames.PublishOk) and first.duplicates is None, first
    for request_id, count, position in ((3, 2, 1), (4, 1, 0)):
        answer = answers[request_id]
        assert isinstance(answer, frames.PublishOk), answer
        assert (answer.count, answer.duplicates) == (count, [[position, first.first_id]])
