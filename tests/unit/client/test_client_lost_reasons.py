"""The reason a lost connection gives is never empty (a real socket, reset by its peer).

AnyIO raises ``BrokenResourceError`` with no message when a send meets a reset
connection; the client used to print "connection to ... broke: " and nothing after it.
"""

from __future__ import annotations

import socket
import struct

import anyio
import anyio.abc
import pytest
from tests.backends import on_both_backends

from futureq.client import open_client
from futureq.errors import ConnectionLostError
from futureq.wire import codec, frames


async def _reset_after_hello(stream: anyio.abc.SocketStream) -> None:
    """Greet, then answer the first request by resetting the connection (RST)."""
    try:
        await _greet_then_reset(stream)
    finally:
        await anyio.aclose_forcefully(stream)


async def _greet_then_reset(stream: anyio.abc.SocketStream) -> None:
    decoder = codec.FrameDecoder()
    answered = False
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
        if not answered:
            answered = True
            rid = frame.request_id  # type: ignore[union-attr]
            hello_ok = frames.HelloOk(rid, 1, 1, None, 4 * 1024 * 1024, "reset")
            await stream.send(codec.encode_frame(hello_ok))
            continue
        raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await anyio.aclose_forcefully(stream)
        return


@on_both_backends
async def test_a_reset_connection_names_a_reason() -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as group:
        group.start_soon(listener.serve, _reset_after_hello)
        async with open_client(
            f"127.0.0.1:{port}", request_timeout_s=5.0, retry_unknown_outcome=False
        ) as client:
            reasons = []
            for _ in range(5):  # whichever of reader or writer notices first
                with pytest.raises(ConnectionLostError) as info:
                    await client.publish("t", b"x" * 200_000)
                reasons.append(str(info.value))
        group.cancel_scope.cancel()
    for reason in reasons:
        assert not reason.rstrip().endswith(":"), reasons
        assert "broke: " not in reason or reason.split("broke: ", 1)[1].strip(), reasons
