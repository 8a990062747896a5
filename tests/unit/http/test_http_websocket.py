"""The ``/ws`` adapter in isolation: Origin rules, and the ASGI WebSocket turned into a
stream of whole frames (one message per frame each way). The endpoint itself is tested
against a real node with a real WebSocket client in tests/integration/test_websocket.py."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from futureq.broker.websocket import WebSocketStream, origin_allowed
from futureq.errors import ErrorCode
from futureq.wire import codec, frames


@pytest.mark.parametrize(
    ("origin", "host", "scheme", "allowed", "expected"),
    [
        (None, "127.0.0.1:7452", "ws", [], True),  # not a browser
        ("http://127.0.0.1:7452", "127.0.0.1:7452", "ws", [], True),
        ("HTTP://LOCALHOST:7452", "localhost:7452", "ws", [], True),
        ("http://localhost", "localhost:80", "ws", [], True),  # default port
        ("https://127.0.0.1", "127.0.0.1", "wss", [], True),
        # A name the page's own site may point here (DNS rebinding) must be listed.
        ("https://example.com", "example.com", "wss", [], False),
        ("http://evil.example:7452", "evil.example:7452", "ws", [], False),
        ("https://q.example.com", "q.example.com", "wss", ["https://q.example.com"], True),
        ("http://[::1]:7452", "[::1]:7452", "ws", [], True),
        ("https://127.0.0.1:7452", "127.0.0.1:7452", "ws", [], False),  # other scheme
        ("http://127.0.0.1:7453", "127.0.0.1:7452", "ws", [], False),  # other port
        ("http://evil.example", "127.0.0.1:7452", "ws", [], False),
        ("null", "127.0.0.1:7452", "ws", [], False),  # sandboxed page, file://
        ("http://evil.example", None, "ws", [], False),
        ("https://app.example.com", "127.0.0.1:7452", "ws", ["https://app.example.com/"], True),
        ("http://evil.example", "127.0.0.1:7452", "ws", ["*"], True),
    ],
)
def test_origin_rules(
    origin: str | None, host: str | None, scheme: str, allowed: list[str], expected: bool
) -> None:
    assert origin_allowed(origin, host, scheme, allowed) is expected


class FakeAsgi:
    """ASGI receive/send over lists: what hypercorn would hand the app."""

    def __init__(self, incoming: list[dict[str, Any]]) -> None:
        self.incoming = incoming
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        if not self.incoming:
            return {"type": "websocket.disconnect", "code": 1000}
        return self.incoming.pop(0)

    async def send(self, message: dict[str, Any]) -> None:
        await trio.lowlevel.checkpoint()
        self.sent.append(message)


def _message(data: bytes | None = None, text: str | None = None) -> dict[str, Any]:
    return {"type": "websocket.receive", "bytes": data, "text": text}


async def test_each_frame_sent_is_one_message() -> None:
    asgi = FakeAsgi([])
    stream = WebSocketStream(asgi.receive, asgi.send)  # type: ignore[arg-type]
    encoded = [codec.encode_frame(frames.Pong(i)) for i in range(3)]
    await stream.send_all(b"".join(encoded))
    assert [m["bytes"] for m in asgi.sent] == encoded


async def test_messages_come_out_whole_or_split_to_the_size_asked() -> None:
    one = codec.encode_frame(frames.Ping(1))
    two = codec.encode_frame(frames.Status(2))
    asgi = FakeAsgi([_message(one), _message(two)])
    stream = WebSocketStream(asgi.receive, asgi.send)  # type: ignore[arg-type]
    assert await stream.receive_some() == one
    assert await stream.receive_some(3) == two[:3]
    assert await stream.receive_some(1000) == two[3:]
    assert await stream.receive_some() == b""  # the peer closed: end of stream
    assert await stream.receive_some() == b""


@pytest.mark.parametrize(
    ("message", "close_code"),
    [
        (_message(text="hello"), 1003),
        (_message(codec.encode_frame(frames.Ping(1)) * 2), 1008),
        (_message(codec.encode_frame(frames.Ping(1))[:-1]), 1008),
        (_message(b"\x00"), 1008),
    ],
)
async def test_a_message_that_is_not_one_frame_is_refused(
    message: dict[str, Any], close_code: int
) -> None:
    refused: list[ErrorCode] = []
    asgi = FakeAsgi([message, _message(codec.encode_frame(frames.Ping(2)))])
    stream = WebSocketStream(asgi.receive, asgi.send, refused.append)  # type: ignore[arg-type]
    assert await stream.receive_some() == b""  # nothing after the bad message is read
    assert refused == [ErrorCode.WEBSOCKET_MESSAGE]
    error_message, close = asgi.sent
    decoder = codec.FrameDecoder(1 << 20)
    decoder.receive_data(error_message["bytes"])
    error = decoder.next_frame()
    assert isinstance(error, frames.Error) and error.code == ErrorCode.WEBSOCKET_MESSAGE
    assert close == {"type": "websocket.close", "code": close_code, "reason": ""}


async def test_aclose_closes_once_and_then_refuses_use() -> None:
    asgi = FakeAsgi([])
    stream = WebSocketStream(asgi.receive, asgi.send)  # type: ignore[arg-type]
    await stream.aclose()
    await stream.aclose()
    assert asgi.sent == [{"type": "websocket.close", "code": 1000, "reason": ""}]
    with pytest.raises(trio.ClosedResourceError):
        await stream.send_all(codec.encode_frame(frames.Ping(1)))
    with pytest.raises(trio.ClosedResourceError):
        await stream.receive_some()
