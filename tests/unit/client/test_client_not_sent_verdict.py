"""The client's verdict on a failed request: NotSentError ("not sent, safe to send
again") when every attempt is known to have taken no effect, a plain
ConnectionLostError ("outcome unknown") when one may have. Real sockets on 127.0.0.1:
a one-connection fake server (the real wire codec), and closed ports.

Before, a request whose every attempt took no effect still ended with a plain
ConnectionLostError once no server answered until its deadline: a publish the server's
GOAWAY said it had not served, and one of a client whose server was down from the
start.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
import pytest
from tests.backends import on_both_backends

from futureq.cli.jsonl import JsonlItem
from futureq.cli.publish_commands import publish_items
from futureq.client import PublishItem, open_client
from futureq.client._attempts import Attempts, took_no_effect
from futureq.client.sync import SyncClient
from futureq.errors import (
    ConnectionLostError,
    ErrorCode,
    NotLeaderError,
    NotSentError,
    RequestError,
)
from futureq.wire import codec, frames


def _closed_port() -> str:
    """``127.0.0.1:PORT`` of a port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


REFUSALS = {
    # The server's own sentences (broker/command_log.py, raft/node_ops.py).
    "stopping": "the server is shutting down; retry on another node or later",
    "unknown": "outcome unknown: leadership was lost before log entry 7 was known to be "
    "committed; it may or may not have been applied",
}


class OneConnectionServer:
    """Answers one client's HELLO (protocol version 6), then meets its first PUBLISH
    with ``on_publish`` and stops: connection and listener closed, nothing answered,
    nothing stored. Each later connection attempt is refused."""

    def __init__(self, on_publish: str) -> None:
        self.on_publish = on_publish
        """"goaway": GOAWAY naming none served; "store-first": store the first PUBLISH,
        then as "goaway"; "drop": close; a :data:`REFUSALS` key: answer UNAVAILABLE
        with its sentence."""
        self.address = ""
        self.publishes = 0
        self._done = anyio.Event()

    async def serve(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.address = f"127.0.0.1:{listener.extra(anyio.abc.SocketAttribute.local_port)}"
        task_status.started()
        async with listener, anyio.create_task_group() as group:
            group.start_soon(listener.serve, self._handle)
            await self._done.wait()
            group.cancel_scope.cancel()  # stop listening: the node is gone

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        decoder = codec.FrameDecoder()
        async with stream:
            while True:
                frame = decoder.next_frame()
                if frame is codec.NEED_DATA:
                    try:
                        decoder.receive_data(bytes(await stream.receive(65536)))
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        return
                    continue
                if frame is codec.CLOSED:
                    return
                if isinstance(frame, frames.Hello):
                    answer = frames.HelloOk(
                        frame.request_id, 6, 1, None, 4 << 20, "fake", 1, (self.address,), 100
                    )
                    await stream.send(codec.encode_frame(answer))
                elif isinstance(frame, frames.Publish):
                    self.publishes += 1
                    if self.on_publish == "store-first" and self.publishes == 1:
                        ok = frames.PublishOk(frame.request_id, 1, len(frame.items))
                        await stream.send(codec.encode_frame(ok))
                        continue
                    if self.on_publish in ("goaway", "store-first"):
                        goaway = frames.GoAway(0, 0, ErrorCode.UNAVAILABLE, "shutting down")
                        await stream.send(codec.encode_frame(goaway))
                    elif self.on_publish in REFUSALS:
                        refusal = frames.Error(
                            frame.request_id, ErrorCode.UNAVAILABLE, REFUSALS[self.on_publish]
                        )
                        await stream.send(codec.encode_frame(refusal))
                    self._done.set()
                    return


async def _outcome(
    on_publish: str, retry_unknown_outcome: bool, call: str
) -> tuple[BaseException, int]:
    """What a publish (``call``: "publish" or "publish_batch") raises against a
    :class:`OneConnectionServer`, and how many PUBLISH frames it got."""
    server = OneConnectionServer(on_publish)
    async with anyio.create_task_group() as group:
        await group.start(server.serve)
        async with open_client(
            server.address,
            request_timeout_s=1.0,
            retry_unknown_outcome=retry_unknown_outcome,
            linger_ms=0,
            rng=random.Random(3),
        ) as client:
            publish: Callable[[], Awaitable[Any]] = (
                (lambda: client.publish("t", b"x"))
                if call == "publish"
                else (
                    lambda: client.publish_batch([PublishItem("t", b"x"), PublishItem("t", b"y")])
                )
            )
            with pytest.raises(ConnectionLostError) as raised:
                with anyio.fail_after(10):
                    await publish()
        group.cancel_scope.cancel()
    return raised.value, server.publishes


@pytest.mark.parametrize("call", ["publish", "publish_batch"])
@pytest.mark.parametrize("retry_unknown_outcome", [False, True])
@on_both_backends
async def test_a_publish_a_goaway_said_was_not_served_is_not_sent_when_no_node_comes_back(
    call: str, retry_unknown_outcome: bool
) -> None:
    # The single node stopping (SIGTERM): GOAWAY names no request served, the client
    # sends the publish again, and no node answers until the deadline.
    error, publishes = await _outcome("goaway", retry_unknown_outcome, call)
    assert publishes == 1
    assert isinstance(error, NotSentError), repr(error)
    assert "not sent" in str(error) and "no connection to any of" in str(error), str(error)


@pytest.mark.parametrize("call", ["publish", "publish_batch"])
@pytest.mark.parametrize("retry_unknown_outcome", [False, True])
@on_both_backends
async def test_a_publish_whose_connection_broke_under_it_stays_outcome_unknown(
    call: str, retry_unknown_outcome: bool
) -> None:
    # No GOAWAY: the server may have stored it before the connection broke. Raised at
    # once (at-most-once), or after the retry found no server: never NotSentError.
    error, publishes = await _outcome("drop", retry_unknown_outcome, call)
    assert publishes == 1
    assert type(error) is ConnectionLostError, repr(error)
    if retry_unknown_outcome:
        assert "outcome is unknown" in str(error), str(error)


@pytest.mark.parametrize("retry_unknown_outcome", [False, True])
@on_both_backends
async def test_a_publish_refused_unavailable_stopping_is_not_sent_when_no_node_comes_back(
    retry_unknown_outcome: bool,
) -> None:
    # UNAVAILABLE "shutting down" refuses before anything is proposed: resent, and
    # then no node answers. Before: a plain ConnectionLostError.
    error, publishes = await _outcome("stopping", retry_unknown_outcome, "publish")
    assert publishes == 1
    assert isinstance(error, NotSentError), repr(error)


@on_both_backends
async def test_an_at_most_once_publish_refused_outcome_unknown_is_not_sent_again() -> None:
    # UNAVAILABLE "outcome unknown" (a leader that lost the leadership with it
    # proposed): it may be stored, so an at-most-once publish is not sent again (it
    # could be stored twice) and says so. Before: resent.
    server = OneConnectionServer("unknown")
    async with anyio.create_task_group() as group:
        await group.start(server.serve)
        async with open_client(
            server.address, request_timeout_s=1.0, retry_unknown_outcome=False, linger_ms=0
        ) as client:
            with pytest.raises(RequestError, match="outcome unknown") as raised:
                with anyio.fail_after(10):
                    await client.publish_batch([PublishItem("t", b"x")])
        group.cancel_scope.cancel()
    assert raised.value.code is ErrorCode.UNAVAILABLE
    assert server.publishes == 1


@on_both_backends
async def test_a_publish_resent_after_an_outcome_unknown_refusal_stays_outcome_unknown() -> None:
    error, publishes = await _outcome("unknown", True, "publish")
    assert publishes == 1
    assert type(error) is ConnectionLostError, repr(error)
    assert "outcome is unknown" in str(error) and "leadership was lost" in str(error)


@on_both_backends
async def test_a_publish_batch_whose_first_frame_was_stored_is_not_called_not_sent() -> None:
    # Two frames: the first stored, the second not sent (GOAWAY, then no server).
    # NotSentError would say the whole call took no effect: sent again whole, the
    # first message would be stored twice. A plain ConnectionLostError that says
    # what was stored, caused by the NotSentError of the rest.
    server = OneConnectionServer("store-first")
    stored: dict[int, int] = {}
    async with anyio.create_task_group() as group:
        await group.start(server.serve)
        async with open_client(
            server.address, request_timeout_s=1.0, max_batch_items=1, linger_ms=0
        ) as client:
            with pytest.raises(ConnectionLostError) as raised:
                with anyio.fail_after(10):
                    await client.publish_batch(
                        [PublishItem("t", b"x"), PublishItem("t", b"y")], stored=stored
                    )
        group.cancel_scope.cancel()
    assert type(raised.value) is ConnectionLostError, repr(raised.value)
    assert isinstance(raised.value.__cause__, NotSentError)
    assert "1 of the 2 messages were stored" in str(raised.value)
    assert stored == {0: 1} and server.publishes == 2


async def _serve_without_reading(task_status: anyio.abc.TaskStatus[str]) -> None:
    """Answer one client's HELLO, then read nothing (its writes fill the socket
    buffers and block) and close the connection after 1 s; refuse every later one."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    address = f"127.0.0.1:{listener.extra(anyio.abc.SocketAttribute.local_port)}"
    task_status.started(address)
    async with listener:
        stream = await listener.listeners[0].accept()
    decoder = codec.FrameDecoder()
    async with stream:
        while (hello := decoder.next_frame()) is codec.NEED_DATA:
            decoder.receive_data(bytes(await stream.receive(65536)))
        assert isinstance(hello, frames.Hello)
        answer = frames.HelloOk(hello.request_id, 6, 1, None, 4 << 20, "fake", 1, (), 100)
        await stream.send(codec.encode_frame(answer))
        await anyio.sleep(1.0)


@on_both_backends
async def test_publishes_still_queued_in_the_client_when_the_connection_broke_are_not_sent() -> (
    None
):
    # 16 publishes of 3 MB each, at most once, to a server that reads none of them:
    # the first few fill the socket buffers (written, or being written: outcome
    # unknown when the connection breaks), the others wait in the client's write
    # queue and never reach the socket: not sent. Before, all were "outcome unknown".
    outcomes: list[BaseException] = []
    async with anyio.create_task_group() as group:
        address = await group.start(_serve_without_reading)
        async with open_client(
            address, request_timeout_s=3.0, retry_unknown_outcome=False, linger_ms=0
        ) as client:

            async def publish(n: int) -> None:
                try:
                    await client.publish_batch([PublishItem("t", bytes([n]) * (3 << 20))])
                except ConnectionLostError as exc:
                    outcomes.append(exc)

            with anyio.fail_after(15):
                async with anyio.create_task_group() as publishers:
                    for n in range(16):
                        publishers.start_soon(publish, n)
        group.cancel_scope.cancel()
    assert len(outcomes) == 16
    not_sent = [exc for exc in outcomes if isinstance(exc, NotSentError)]
    unknown = [exc for exc in outcomes if not isinstance(exc, NotSentError)]
    assert unknown, "no publish was written before the connection broke"
    assert len(not_sent) >= 8, [str(exc) for exc in outcomes]


@pytest.mark.parametrize("retry_unknown_outcome", [False, True])
def test_a_sync_client_whose_server_is_down_from_the_start_raises_not_sent(
    retry_unknown_outcome: bool,
) -> None:
    address = _closed_port()
    client = SyncClient(
        address,
        connect_timeout_s=0.3,
        request_timeout_s=0.5,
        retry_unknown_outcome=retry_unknown_outcome,
    )
    try:
        with pytest.raises(NotSentError, match="not sent") as raised:
            client.publish("t", b"x")
        assert address in str(raised.value)
        with pytest.raises(NotSentError):  # and again: the next call tries anew
            client.publish_batch([PublishItem("t", b"y")])
    finally:
        client.close()


@on_both_backends
async def test_open_client_on_a_closed_port_is_connection_lost_naming_it() -> None:
    # Opening sends no request: a plain connection error, as before.
    address = _closed_port()
    with pytest.raises(ConnectionLostError, match=address):
        async with open_client(address, connect_timeout_s=0.3):
            pass


def test_attempts_keep_the_first_that_may_have_taken_effect() -> None:
    attempts = Attempts()
    not_sent = NotSentError("goaway: this one took no effect")
    for error in [
        not_sent,
        NotLeaderError("127.0.0.1:1"),
        RequestError(ErrorCode.NO_SPACE, "disk full"),
        RequestError(ErrorCode.INVALID_TOPIC, "bad topic"),
    ]:
        assert took_no_effect(error)
        attempts.note(error)
    assert attempts.final(not_sent) is not_sent
    lost = ConnectionLostError("server closed the connection")
    assert took_no_effect(RequestError(ErrorCode.UNAVAILABLE, REFUSALS["stopping"]))
    assert not took_no_effect(RequestError(ErrorCode.UNAVAILABLE, REFUSALS["unknown"]))
    for error in [
        lost,
        RequestError(ErrorCode.TIMEOUT, "no answer"),
        RequestError(ErrorCode.UNAVAILABLE, "outcome unknown: leadership was lost"),
    ]:
        assert not took_no_effect(error)
    attempts.note(lost)
    attempts.note(RequestError(ErrorCode.TIMEOUT, "no answer"))
    assert attempts.unknown is lost
    final = attempts.final(not_sent)
    assert type(final) is ConnectionLostError
    assert "server closed the connection" in str(final) and "outcome is unknown" in str(final)
    other = RequestError(ErrorCode.UNAVAILABLE, "no quorum")
    assert attempts.final(other) is other
    assert attempts.copy().unknown is lost


@pytest.mark.parametrize("on_publish", ["goaway", "drop"])
@on_both_backends
async def test_publish_file_counts_a_batch_not_sent_apart_from_one_of_unknown_outcome(
    on_publish: str,
) -> None:
    # `futureq-cli publish --file` (retry_unknown_outcome on): the batch a GOAWAY said
    # was not served, with no node coming back, is not "unknown outcome ... may be
    # stored already" (before, it was); one whose connection broke under it is.
    server = OneConnectionServer(on_publish)
    items = [JsonlItem(n, PublishItem("t", b"%d" % n)) for n in range(1, 7)]
    async with anyio.create_task_group() as group:
        await group.start(server.serve)
        async with open_client(server.address, request_timeout_s=1.0, linger_ms=0) as client:
            with anyio.fail_after(10):
                summary = await publish_items(client, items, batch_size=3)
        group.cancel_scope.cancel()
    assert summary.published == 0
    assert [failure.line_number for failure in summary.failures] == [1, 2, 3, 4, 5, 6]
    assert summary.stopped_at_line == 1 and summary.not_sent == 3
    first_batch = summary.failures[:3]
    assert all(failure.may_be_stored == (on_publish == "drop") for failure in first_batch), [
        str(failure) for failure in first_batch
    ]
    assert not any(failure.may_be_stored for failure in summary.failures[3:])
