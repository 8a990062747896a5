"""The ``/ws`` adapter in isolation: Origin rules, and the ASGI WebSocket turned into a
stream of whole frames (one message per frame each way). The endpoint itself is tested
against a real node with a real WebSocket client in tests/integration/test_websocket.py."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from wsproto.events import BytesMessage

from futureq.broker.websocket import (
    MAX_HELLO_MESSAGE_BYTES,
    MessageBuffer,
    WebSocketStream,
    max_websockets,
    origin_allowed,
)
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


def _decoded(data: bytes) -> Any:
    decoder = codec.FrameDecoder(1 << 20)
    decoder.receive_data(data)
    return decoder.next_frame()


HELLO_OK = codec.encode_frame(frames.HelloOk(1, 1, 1, None, 4 << 20, "test"))
BIG = (70_000).to_bytes(4, "big") + bytes(70_000)
"""One well-formed frame header and body, longer than a HELLO may be."""


async def test_before_hello_ok_a_message_longer_than_a_hello_is_frame_too_large() -> None:
    refused: list[ErrorCode] = []
    asgi = FakeAsgi([_message(BIG)])
    stream = WebSocketStream(asgi.receive, asgi.send, refused.append)  # type: ignore[arg-type]
    assert await stream.receive_some() == b""
    assert refused == [ErrorCode.FRAME_TOO_LARGE]
    error_message, close = asgi.sent
    error = _decoded(error_message["bytes"])
    assert isinstance(error, frames.Error) and error.code == ErrorCode.FRAME_TOO_LARGE
    assert "before HELLO" in error.message and str(MAX_HELLO_MESSAGE_BYTES) in error.message
    assert close == {"type": "websocket.close", "code": 1009, "reason": ""}


async def test_after_hello_ok_a_longer_message_is_read() -> None:
    asgi = FakeAsgi([_message(BIG)])
    stream = WebSocketStream(asgi.receive, asgi.send)  # type: ignore[arg-type]
    await stream.send_all(HELLO_OK)
    assert await stream.receive_some() == BIG


async def test_message_buffer_drops_a_long_message_before_hello_and_caps_after() -> None:
    buffer = MessageBuffer(1 << 20)
    buffer.extend(BytesMessage(bytes(60_000), message_finished=False))
    assert not buffer.overflowed.is_set()
    buffer.extend(BytesMessage(bytes(10_000), message_finished=False))
    assert buffer.overflowed.is_set() and buffer.overflow_bytes == 70_000
    assert buffer.length == 0 and buffer.value is None  # nothing of it is held
    buffer.extend(BytesMessage(bytes(60_000), message_finished=True))
    assert buffer.length == 0
    assert buffer.to_message()["bytes"] == b""

    buffer = MessageBuffer(1 << 20)
    buffer.hello_answered()
    buffer.extend(BytesMessage(bytes(1 << 20), message_finished=True))
    assert buffer.to_message()["bytes"] == bytes(1 << 20)
    buffer.clear()
    # Past the frame cap after HELLO: dropped as it arrives too, handed over empty at
    # its end, so the stream can say FRAME_TOO_LARGE before it closes.
    buffer.extend(BytesMessage(bytes(1 << 20), message_finished=False))
    buffer.extend(BytesMessage(bytes(1), message_finished=False))
    assert buffer.overflowed.is_set() and buffer.overflow_after_hello
    assert buffer.overflow_bytes == (1 << 20) + 1 and buffer.overflow_cap == 1 << 20
    buffer.extend(BytesMessage(bytes(1 << 20), message_finished=True))
    assert buffer.length == 0 and buffer.to_message()["bytes"] == b""


async def test_message_buffer_times_each_message_from_its_first_piece() -> None:
    """What the frame deadline of a WebSocket message is measured from: the first piece's
    arrival, kept through an overflow (the message goes on arriving), reset when
    hypercorn hands the message over (``clear``)."""
    buffer = MessageBuffer(100)
    buffer.hello_answered()
    assert buffer.message_started is None and not buffer.message_began.is_set()
    before = trio.current_time()
    buffer.extend(BytesMessage(bytes(60), message_finished=False))
    started = buffer.message_started
    assert started is not None and before <= started <= trio.current_time()
    assert buffer.message_began.is_set()
    await trio.sleep(0.01)
    buffer.extend(BytesMessage(bytes(60), message_finished=False))  # past the cap
    assert buffer.overflowed.is_set()
    buffer.extend(BytesMessage(bytes(5), message_finished=False))
    assert buffer.message_started == started and buffer.message_bytes == 125
    buffer.clear()
    assert buffer.message_started is None and buffer.message_bytes == 0
    assert not buffer.message_began.is_set()


@pytest.mark.parametrize(("http", "websockets"), [(128, 96), (8, 6), (2, 1), (1, 1)])
def test_websockets_leave_a_quarter_of_the_http_connections(http: int, websockets: int) -> None:
    assert max_websockets(http) == websockets
