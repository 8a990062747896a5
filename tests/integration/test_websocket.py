"""The ``/ws`` endpoint of a real ``futureq start`` process, driven by trio-websocket, an
independent WebSocket client: the same frames as TCP (one per binary message), the same
HELLO, token and connection limit, refusals with ERROR frames and close codes, Origin
checks, and ``wss://`` when the HTTP port has TLS.

Source: docs/protocol.md, "WebSocket"."""

from __future__ import annotations

import http.client
import signal
import ssl
import urllib.request
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from broker_process import BrokerProcess
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    WebSocketConnection,
    wrap_client_stream,
)
from wire_client import WireClient

from futureq.errors import ErrorCode
from futureq.wire import codec, frames

Factory = Any
DEADLINE_S = 10.0


def _decode(message: bytes | str) -> Any:
    """The one frame a server message must hold (its header must match its size)."""
    assert isinstance(message, bytes), "the server sends binary messages only"
    decoder = codec.FrameDecoder(64 * 1024 * 1024)
    decoder.receive_data(message)
    frame = decoder.next_frame()
    assert frame is not codec.NEED_DATA, "a message held less than one frame"
    decoder.receive_data(b"")
    assert decoder.next_frame() is codec.CLOSED, "a message held more than one frame"
    return frame


async def _receive(ws: WebSocketConnection) -> Any:
    with trio.fail_after(DEADLINE_S):
        return _decode(await ws.get_message())


async def _request(ws: WebSocketConnection, frame: frames.Frame) -> Any:
    await ws.send_message(codec.encode_frame(frame))
    return await _receive(ws)


async def _hello(ws: WebSocketConnection, token: str | None = None) -> frames.HelloOk:
    answer = await _request(ws, frames.Hello(1, (1,), "ws-test", token))
    assert isinstance(answer, frames.HelloOk), answer
    return answer


async def _closed(ws: WebSocketConnection) -> int:
    """Wait for the server to close; return the close code."""
    with trio.fail_after(DEADLINE_S):
        try:
            while True:
                await ws.get_message()
        except ConnectionClosed as closed:
            return int(closed.reason.code)


@asynccontextmanager
async def open_ws(
    address: str,
    path: str = "/ws",
    *,
    ssl_context: ssl.SSLContext | None = None,
    extra_headers: Sequence[tuple[str, str]] = (),
    subprotocols: Sequence[str] = (),
) -> AsyncIterator[WebSocketConnection]:
    """A trio-websocket client connection over a TCP stream this helper owns (and
    always closes: trio-websocket leaves the socket open when the server closes first)."""
    host, port = address.rsplit(":", 1)
    stream: trio.abc.Stream = await trio.open_tcp_stream(host, int(port))
    try:
        if ssl_context is not None:
            stream = trio.SSLStream(stream, ssl_context, server_hostname=host)
            with trio.fail_after(DEADLINE_S):
                await stream.do_handshake()
        async with trio.open_nursery() as nursery:
            # trio-websocket waits for ever when the server drops the connection during
            # the opening handshake.
            with trio.fail_after(DEADLINE_S):
                ws = await wrap_client_stream(
                    nursery,
                    stream,
                    address,  # the Host header: host and port
                    path,
                    subprotocols=list(subprotocols),
                    extra_headers=[(k.encode(), v.encode()) for k, v in extra_headers],
                )
            try:
                yield ws
            finally:
                with trio.move_on_after(2, shield=True):
                    await ws.aclose()
                nursery.cancel_scope.cancel()
    finally:
        with trio.move_on_after(1, shield=True):
            await stream.aclose()


async def test_publish_consume_and_ack_over_websocket(broker: BrokerProcess) -> None:
    async with open_ws(broker.http_address, subprotocols=["futureq.v1"]) as ws:
        assert ws.subprotocol == "futureq.v1"
        hello = await _hello(ws)
        assert hello.max_frame_bytes == 4 * 1024 * 1024
        # Messages published over TCP are delivered over WebSocket and the other way round.
        tcp = WireClient(broker.client_address)
        assert isinstance(
            tcp.publish([["ws.orders", b"from tcp", 0, None, None]]), frames.PublishOk
        )
        answer = await _request(
            ws,
            frames.Publish(
                2, frames.AckLevel.QUORUM, [["ws.orders", b"\x00\xffbin", 0, None, None]]
            ),
        )
        assert isinstance(answer, frames.PublishOk) and answer.count == 1
        subscribed = await _request(ws, frames.Subscribe(3, "ws.orders", "billing", 10))
        assert isinstance(subscribed, frames.SubscribeOk)
        deliveries: list[Any] = []
        while len(deliveries) < 2:
            pushed = await _receive(ws)
            if isinstance(pushed, frames.SubscriptionInfo):  # the group's settings
                assert pushed.subscription_id == subscribed.subscription_id
                continue
            assert isinstance(pushed, frames.Deliver), pushed
            deliveries.extend(pushed.deliveries)
        assert sorted(d[2] for d in deliveries) == [b"\x00\xffbin", b"from tcp"]
        acked = await _request(ws, frames.Ack(4, [d[0] for d in deliveries]))
        assert isinstance(acked, frames.Ok) and acked.result == 2
        assert tcp.group_pending("ws.orders", "billing") == 0
        # Requests pipeline: several frames sent before any answer, answered by request id.
        for rid in (10, 11, 12):
            await ws.send_message(codec.encode_frame(frames.Ping(rid)))
        assert sorted([(await _receive(ws)).request_id for _ in range(3)]) == [10, 11, 12]


async def test_hello_first_and_token(broker_factory: Factory) -> None:
    broker: BrokerProcess = broker_factory(env={"FUTUREQ_SERVER_AUTH_TOKEN": "s3cret"})
    async with open_ws(broker.http_address) as ws:
        answer = await _request(ws, frames.Hello(1, (1,), "ws-test", "wrong"))
        assert isinstance(answer, frames.Error) and answer.code == ErrorCode.AUTH_FAILED
        await _closed(ws)
    async with open_ws(broker.http_address) as ws:
        answer = await _request(ws, frames.Status(1))
        assert isinstance(answer, frames.Error) and answer.code == ErrorCode.HELLO_REQUIRED
    async with open_ws(broker.http_address) as ws:
        await _hello(ws, "s3cret")
        assert isinstance(await _request(ws, frames.Status(2)), frames.StatusOk)


async def test_messages_that_are_not_one_frame_are_refused(broker: BrokerProcess) -> None:
    ping = codec.encode_frame(frames.Ping(5))
    cases = [
        ("a text message", "PING", 1003),
        ("two frames in one message", ping + ping, 1008),
        ("half a frame", ping[:-1], 1008),
        ("a short header", b"\x00\x00", 1008),
    ]
    for what, message, close_code in cases:
        async with open_ws(broker.http_address) as ws:
            await _hello(ws)
            await ws.send_message(message)
            answer = await _receive(ws)
            assert isinstance(answer, frames.Error), what
            assert answer.code == ErrorCode.WEBSOCKET_MESSAGE, (what, answer)
            assert "one" in answer.message and "frame" in answer.message, answer.message
            assert await _closed(ws) == close_code, what
    # A protocol error inside a well-framed message is the TCP protocol's own error.
    async with open_ws(broker.http_address) as ws:
        await _hello(ws)
        await ws.send_message(b"\x00\x00\x00\x01\xc1")  # 0xc1: never valid msgpack
        answer = await _receive(ws)
        assert isinstance(answer, frames.Error) and answer.code == ErrorCode.MALFORMED_FRAME
        await _closed(ws)
    # A message larger than a frame can be is refused as TCP refuses such a frame:
    # FRAME_TOO_LARGE with a sentence naming the limit, then close 1009.
    async with open_ws(broker.http_address) as ws:
        await _hello(ws)
        big = (4 * 1024 * 1024 + 1).to_bytes(4, "big") + bytes(4 * 1024 * 1024 + 1)
        await ws.send_message(big)
        answer = await _receive(ws)
        assert isinstance(answer, frames.Error), answer
        assert answer.code == ErrorCode.FRAME_TOO_LARGE, answer
        assert "limits.max_frame_bytes" in answer.message, answer.message
        assert await _closed(ws) == 1009
    # The server is still serving.
    async with open_ws(broker.http_address) as ws:
        await _hello(ws)


async def test_browser_origins(broker_factory: Factory) -> None:
    broker: BrokerProcess = broker_factory(
        extra_args=["--websocket-origins", "https://app.example.com"]
    )
    own = f"http://{broker.http_address}"
    for origin in (own, "https://app.example.com"):
        async with open_ws(broker.http_address, extra_headers=[("Origin", origin)]) as ws:
            await _hello(ws)
    for origin in ("http://evil.example", f"https://{broker.http_address}", "null"):
        assert await _rejected(broker.http_address, "/ws", origin) == 403, origin
        # The refusal says why and what to change (its body was empty).
        _, body = await _rejection(broker.http_address, "/ws", origin)
        assert "server.websocket_origins" in body, (origin, body)
    # Other paths are not WebSocket endpoints.
    assert await _rejected(broker.http_address, "/other", None) == 403
    assert "open one on /ws" in (await _rejection(broker.http_address, "/other", None))[1]


async def _rejected(address: str, path: str, origin: str | None) -> int:
    """The HTTP status of a refused upgrade (fails if the upgrade is accepted)."""
    return (await _rejection(address, path, origin))[0]


async def _rejection(address: str, path: str, origin: str | None) -> tuple[int, str]:
    """The HTTP status and body of a refused upgrade (fails if it is accepted)."""
    headers = [("Origin", origin)] if origin is not None else []
    statuses: list[int] = []
    bodies: list[str] = []
    try:
        async with open_ws(address, path, extra_headers=headers):
            pass
    except* ConnectionRejected as group:
        _, rest = group.split(ConnectionRejected)
        assert rest is None
        statuses.extend(int(e.status_code) for e in _leaves(group))
        bodies.extend((e.body or b"").decode() for e in _leaves(group))
    assert statuses, f"the upgrade on {path} with Origin {origin!r} was accepted"
    return statuses[0], bodies[0]


def _leaves(error: BaseException) -> list[Any]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


async def test_websocket_connections_share_the_connection_limit(broker_factory: Factory) -> None:
    broker: BrokerProcess = broker_factory(env={"FUTUREQ_LIMITS_MAX_CONNECTIONS": "1"})
    tcp = WireClient(broker.client_address)
    # The TCP connection holds the node's only slot: a WebSocket connection is told so
    # at once (the same admission as TCP: never left waiting) and closed.
    async with open_ws(broker.http_address) as ws:
        refused = await _receive(ws)
        assert isinstance(refused, frames.Error), refused
        assert refused.code == ErrorCode.TOO_MANY_CONNECTIONS
        await _closed(ws)
    tcp.close()
    # The slot is free once the node saw the TCP connection go.
    with trio.fail_after(DEADLINE_S):
        while True:
            async with open_ws(broker.http_address) as ws:
                try:
                    answer = await _request(ws, frames.Hello(1, (1,), "ws-test", None))
                except ConnectionClosed:  # refused and closed before the HELLO went out
                    answer = None
                if isinstance(answer, frames.HelloOk):
                    break
                assert answer is None or answer.code == ErrorCode.TOO_MANY_CONNECTIONS, answer
            await trio.sleep(0.05)


async def test_wss_when_the_http_port_has_tls(
    broker_factory: Factory, tls_files: dict[str, Path], tls_args: list[str]
) -> None:
    broker: BrokerProcess = broker_factory(extra_args=[*tls_args, "--http-tls"])
    trusted = ssl.create_default_context(cafile=str(tls_files["ca"]))
    async with open_ws(broker.http_address, ssl_context=trusted) as ws:
        await _hello(ws)
        answer = await _request(
            ws, frames.Publish(2, frames.AckLevel.QUORUM, [["wss", b"secret", 0, None, None]])
        )
        assert isinstance(answer, frames.PublishOk)
    assert (
        await trio.to_thread.run_sync(
            _get_status, f"https://{broker.http_address}/healthz", trusted
        )
        == 200
    )
    # Without trusting the CA, the TLS handshake fails; plain HTTP gets no answer.
    with pytest.raises(trio.BrokenResourceError) as broken:
        async with open_ws(broker.http_address, ssl_context=ssl.create_default_context()):
            pass
    assert isinstance(broken.value.__cause__, ssl.SSLCertVerificationError)
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        await trio.to_thread.run_sync(_get_status, f"http://{broker.http_address}/healthz", None)


def _get_status(url: str, context: ssl.SSLContext | None) -> int:
    with urllib.request.urlopen(url, context=context, timeout=10) as response:
        return int(response.status)


def test_a_plain_get_of_ws_is_told_to_upgrade(broker: BrokerProcess) -> None:
    """A breaker's plain GET /ws got 404 "no such page", as if there were no /ws."""
    host, port = broker.http_address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        connection.request("GET", "/ws")
        answer = connection.getresponse()
        assert answer.status == 426
        assert answer.getheader("Upgrade") == "websocket"
        assert b"WebSocket upgrade" in answer.read()
    finally:
        connection.close()


async def test_a_stopping_node_closes_its_websockets_as_going_away(broker: BrokerProcess) -> None:
    """SIGTERM: a WebSocket client gets the answers to what it sent, GOAWAY, then close
    code 1001 (going away, RFC 6455 §7.4.1) with a reason, so a browser can tell "the
    server restarts, reconnect" from "done". Before: close code 1000 (normal), no
    reason."""
    async with open_ws(broker.http_address) as ws:
        hello = await _request(ws, frames.Hello(1, frames.SUPPORTED_VERSIONS, "ws-test", None))
        assert isinstance(hello, frames.HelloOk), hello
        await ws.send_message(codec.encode_frame(frames.Ping(2)))
        assert isinstance(await _receive(ws), frames.Pong)
        assert broker.process is not None
        broker.process.send_signal(signal.SIGTERM)
        received: list[Any] = []
        with trio.fail_after(DEADLINE_S):
            try:
                while True:
                    received.append(_decode(await ws.get_message()))
            except ConnectionClosed as closed:
                reason = closed.reason
        assert [type(frame) for frame in received] == [frames.GoAway], received
        assert received[0].code == ErrorCode.UNAVAILABLE
        assert reason.code == 1001, reason
        assert reason.reason and "shutting down" in reason.reason, reason
    assert broker.terminate() == 0
