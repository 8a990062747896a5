"""The client's silence probe against a server on a real socket that it can hold still:
one that takes long to answer a request but answers PINGs keeps its connection; one
that answers nothing at all, PINGs included, is left within the call's deadline.

A real node cannot be made slow-but-alive on demand, so this server speaks just
enough of the protocol (HELLO, PING, STATUS) to be held; ``test_client_silent_server``
stops a real leader.
"""

from __future__ import annotations

import random

import anyio
import anyio.abc

from futureq.client import open_client
from futureq.client._connection import PING_PROBE_S, SILENT_SERVER_S
from futureq.errors import ErrorCode, RequestError
from futureq.wire import codec, frames

HOLD_S = 2 * (SILENT_SERVER_S + PING_PROBE_S)
"""How long the server holds each STATUS: longer than the silence the client allows."""


class HeldServer:
    """Answers HELLO at once, PING at once unless ``mute``, STATUS after ``HOLD_S``
    (never if ``mute``); counts the connections it accepted."""

    def __init__(self, *, mute: bool) -> None:
        self.mute = mute
        self.accepted = 0

    async def serve(self, stream: anyio.abc.SocketStream) -> None:
        self.accepted += 1
        decoder = codec.FrameDecoder()
        async with stream, anyio.create_task_group() as group:
            while True:
                frame = decoder.next_frame()
                if frame is codec.NEED_DATA:
                    try:
                        decoder.receive_data(bytes(await stream.receive()))
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        decoder.receive_data(b"")
                    continue
                if frame is codec.CLOSED:
                    group.cancel_scope.cancel()
                    return
                if isinstance(frame, frames.Hello):
                    hello = frames.HelloOk(frame.request_id, 1, 1, None, 1 << 20, "held")
                    await stream.send(codec.encode_frame(hello))
                elif isinstance(frame, frames.Ping) and not self.mute:
                    await stream.send(codec.encode_frame(frames.Pong(frame.request_id)))
                elif isinstance(frame, frames.Status) and not self.mute:
                    group.start_soon(self._answer_late, stream, frame.request_id)

    async def _answer_late(self, stream: anyio.abc.SocketStream, request_id: int) -> None:
        await anyio.sleep(HOLD_S)
        await stream.send(codec.encode_frame(frames.StatusOk(request_id, {"role": "leader"})))


async def _status(
    server: HeldServer, request_timeout_s: float
) -> tuple[dict[str, object] | RequestError, int]:
    """STATUS through a client of ``server``: its answer (or the RequestError it
    raised) and how many connections the client made."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as group:
        group.start_soon(listener.serve, server.serve)
        try:
            async with open_client(
                f"127.0.0.1:{port}", request_timeout_s=request_timeout_s, rng=random.Random(6)
            ) as client:
                try:
                    answer: dict[str, object] | RequestError = await client.status()
                except RequestError as exc:
                    answer = exc
                return answer, client._epoch
        finally:
            group.cancel_scope.cancel()


def test_a_slow_server_that_answers_pings_keeps_the_connection() -> None:
    answer, connections = anyio.run(_status, HeldServer(mute=False), 3 * HOLD_S)
    assert isinstance(answer, dict) and answer["role"] == "leader"
    assert connections == 1  # never left for silence


def test_a_server_that_answers_nothing_is_left_before_the_deadline() -> None:
    answer, connections = anyio.run(_status, HeldServer(mute=True), 4.0)
    assert isinstance(answer, RequestError) and answer.code is ErrorCode.TIMEOUT
    # Before: the one connection waited out the whole 4 s (only a deadline of 5 s or
    # more led to a PING). Now it is PINGed and left, and the STATUS resent on a new one.
    assert connections >= 2
