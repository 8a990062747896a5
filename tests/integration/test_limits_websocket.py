"""``/ws`` against a real ``futureq start`` over raw sockets: before HELLO a WebSocket
message is capped like TCP's first frame, and WebSockets cannot take the HTTP slots that
health probes need.

Found by trying it as a hostile client would: 30 WebSockets each sending 4 MB of a first
message that never ended made the node hold 120 MB until their HELLO timeout (hypercorn
assembles a message whole before the application sees it), with no token; and 4 hosts
holding 32 WebSockets each took all 128 HTTP slots, so ``/healthz`` answered 503 from
everywhere else (a liveness probe would restart a healthy node).

Source: docs/security.md, "What a client can cost"; docs/operations.md, "Limits".
"""

from __future__ import annotations

import base64
import os
import socket
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from broker_process import BrokerProcess

from futureq.errors import ErrorCode
from futureq.wire import codec, frames

DEADLINE_S = 5.0
"""The node answers at once; the HELLO timeout (10 s) is what the old code waited for."""


def _connect(address: str, source: str = "127.0.0.1") -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection(
        (host, int(port)), timeout=DEADLINE_S, source_address=(source, 0)
    )


def _upgrade(
    address: str, source: str = "127.0.0.1", extra: str = ""
) -> tuple[socket.socket, bytes]:
    """Ask for ``/ws`` (``extra``: more header lines, each ending in CRLF); the socket
    and the whole answer head (plus what followed it)."""
    sock = _connect(address, source)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /ws HTTP/1.1\r\nHost: {address}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: 13\r\n{extra}\r\n"
        ).encode()
    )
    answer = b""
    while b"\r\n\r\n" not in answer:
        data = sock.recv(65536)
        if not data:
            break
        answer += data
    return sock, answer


def _client_frame(payload: bytes, announced: int | None = None) -> bytes:
    """A masked binary WebSocket frame (RFC 6455 §5.2) carrying ``payload``; with
    ``announced``, the header promises that many bytes (more than are sent)."""
    length = len(payload) if announced is None else announced
    mask = os.urandom(4)
    if length < 126:
        head = bytes([0x82, 0x80 | length])
    elif length < 65536:
        head = bytes([0x82, 0x80 | 126]) + struct.pack(">H", length)
    else:
        head = bytes([0x82, 0x80 | 127]) + struct.pack(">Q", length)
    masked = bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload))
    return head + mask + masked


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (fails if it stays open)."""
    sock.settimeout(DEADLINE_S)
    got = b""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return got
        if not data:
            return got
        got += data
    raise AssertionError(f"the server kept the connection open; it sent {got[:200]!r}")


def _server_frames(data: bytes) -> list[tuple[int, bytes]]:
    """``(opcode, payload)`` of each unmasked server WebSocket frame in ``data``."""
    found: list[tuple[int, bytes]] = []
    while data:
        opcode, length, offset = data[0] & 0x0F, data[1] & 0x7F, 2
        if length == 126:
            length, offset = struct.unpack(">H", data[2:4])[0], 4
        elif length == 127:
            length, offset = struct.unpack(">Q", data[2:10])[0], 10
        found.append((opcode, data[offset : offset + length]))
        data = data[offset + length :]
    return found


def _decode(message: bytes) -> frames.Frame:
    decoder = codec.FrameDecoder(codec.DEFAULT_MAX_FRAME_BYTES)
    decoder.receive_data(message)
    frame = decoder.next_frame()
    assert isinstance(frame, frames.Frame), frame
    return frame


def test_a_long_first_message_is_refused_as_it_arrives_like_the_first_tcp_frame(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory()  # type: ignore[operator]
    # A first message announcing 4 MiB, of which a little more than a HELLO's worth is
    # sent and the rest never: the node must not wait for it (nor hold it).
    sock, answer = _upgrade(broker.http_address)
    assert answer.startswith(b"HTTP/1.1 101"), answer
    bulk = (4 * 1024 * 1024).to_bytes(4, "big") + bytes(64 * 1024 + 100)
    sock.sendall(_client_frame(bulk, announced=4 * 1024 * 1024 + 4))
    sent = _server_frames(_read_until_closed(sock))
    sock.close()
    assert [opcode for opcode, _ in sent] == [0x2, 0x8], sent
    error = _decode(sent[0][1])
    assert isinstance(error, frames.Error), error
    assert error.code == ErrorCode.FRAME_TOO_LARGE, error
    assert "before HELLO" in error.message and "65536" in error.message, error.message
    assert struct.unpack(">H", sent[1][1][:2])[0] == 1009

    # After HELLO the connection's own limit (limits.max_frame_bytes) applies: a publish
    # of more than 64 KiB is served.
    sock, answer = _upgrade(broker.http_address)
    assert answer.startswith(b"HTTP/1.1 101"), answer
    sock.sendall(_client_frame(codec.encode_frame(frames.Hello(1, (1,), "ws-limit", None))))
    publish = frames.Publish(2, frames.AckLevel.QUORUM, [["big", b"x" * 200_000, 0, None, None]])
    sock.sendall(_client_frame(codec.encode_frame(publish)))
    got = b""
    answers: list[frames.Frame] = []
    while len(answers) < 2:
        data = sock.recv(65536)
        assert data, f"closed after {answers}"
        got += data
        try:
            answers = [_decode(payload) for _, payload in _server_frames(got)]
        except (IndexError, struct.error):
            continue  # a frame not yet whole
    sock.close()
    assert isinstance(answers[0], frames.HelloOk), answers
    assert isinstance(answers[1], frames.PublishOk), answers


@contextmanager
def _held(sockets: list[socket.socket]) -> Iterator[list[socket.socket]]:
    try:
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def _get(address: str, path: str, source: str) -> bytes:
    sock = _connect(address, source)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    answer = _read_until_closed(sock)
    sock.close()
    return answer


def test_websockets_leave_a_quarter_of_the_http_slots_to_health_probes(
    broker_factory: object,
) -> None:
    # 8 HTTP connections at most, 2 per address: WebSockets may hold 6 of them.
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        env={"FUTUREQ_LIMITS_MAX_HTTP_CONNECTIONS": "8"}
    )
    with _held([]) as held:
        statuses: list[bytes] = []
        refusal = b""
        for host in range(4):  # four hosts each open the 2 connections they may
            for _ in range(2):
                sock, answer = _upgrade(broker.http_address, f"127.0.0.{10 + host}")
                held.append(sock)
                statuses.append(answer.split(b"\r\n", 1)[0])
                if not answer.startswith(b"HTTP/1.1 101"):
                    refusal = answer + _read_until_closed(sock)
        assert sum(status.startswith(b"HTTP/1.1 101") for status in statuses) == 6, statuses
        assert statuses[-2:] == [b"HTTP/1.1 503 "] * 2, statuses
        assert b"futureq-refused: websockets" in refusal, refusal
        assert b"6 WebSockets at once" in refusal and b"/healthz" in refusal, refusal

        # A fifth host's probe is served: the WebSockets left room.
        health = _get(broker.http_address, "/healthz", "127.0.0.20")
        assert health.startswith(b"HTTP/1.1 200"), health

        # Plain connections may take the rest; a 503 for lack of room then says so, and
        # that it is not the node's health.
        for _ in range(2):  # kept alive after one answer, which shows they were admitted
            sock = _connect(broker.http_address, "127.0.0.21")
            held.append(sock)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        full = _get(broker.http_address, "/healthz", "127.0.0.22")
        assert full.startswith(b"HTTP/1.1 503"), full
        assert b"futureq-refused: http-connections" in full, full
        assert b"says nothing about the node's health" in full, full


def test_refused_upgrades_make_few_short_log_lines(broker: BrokerProcess) -> None:
    """Found by a breaker: each upgrade refused for its 14 KB Origin logged the header
    whole, without the rate limit of the client port's lines (122 MB of log in 8 s)."""
    origin = "http://" + "o" * 14_000 + ".example"
    for _ in range(100):
        sock, answer = _upgrade(broker.http_address, extra=f"Origin: {origin}\r\n")
        sock.close()
        assert b" 403 " in answer.split(b"\r\n", 1)[0] or b"101" not in answer, answer[:80]
    lines = [line for line in broker.stderr_text().splitlines() if "Origin" in line]
    assert 1 <= len(lines) <= 60, len(lines)  # rate_limited_log.LOG_LINES_PER_MINUTE
    assert all(len(line) < 1300 for line in lines), max(map(len, lines))


def _greeted(address: str) -> socket.socket:
    """A WebSocket on ``/ws`` whose HELLO was answered."""
    sock, answer = _upgrade(address)
    assert answer.startswith(b"HTTP/1.1 101"), answer
    sock.sendall(_client_frame(codec.encode_frame(frames.Hello(1, (1,), "ws-trickle", None))))
    got = b""
    while True:
        data = sock.recv(65536)
        assert data, "closed before HELLO_OK"
        got += data
        try:
            hello_ok = _decode(_server_frames(got)[0][1])
        except (IndexError, struct.error):
            continue
        assert isinstance(hello_ok, frames.HelloOk), hello_ok
        return sock


@pytest.mark.parametrize("announced", [100_000, 64 * 1024 * 1024], ids=["frame", "oversized"])
def test_a_message_trickled_past_the_frame_deadline_is_refused_with_frame_timeout(
    broker_factory: object, announced: int
) -> None:
    """As a frame over TCP: ``limits.frame_deadline_ms`` after its first byte a message
    still not complete ends its WebSocket with FRAME_TIMEOUT. The old code waited for the
    keepalive (60 s by default here: 1 s interval, and the client kept sending) and then
    said the client "sent nothing", though it sent a byte every 100 ms."""
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        env={
            "FUTUREQ_LIMITS_FRAME_DEADLINE_MS": "1500",
            "FUTUREQ_LIMITS_KEEPALIVE_INTERVAL_MS": "30000",
            "FUTUREQ_LIMITS_KEEPALIVE_TIMEOUT_MS": "30000",
        }
    )
    sock = _greeted(broker.http_address)
    mask = os.urandom(4)
    head = bytes([0x82, 0x80 | 127]) + struct.pack(">Q", announced) + mask
    sock.sendall(head + bytes(b ^ mask[i % 4] for i, b in enumerate(b"\x00\x01\x86\xa0")))
    sock.setblocking(False)
    started = time.monotonic()
    got = b""
    closed = False
    while not closed and time.monotonic() - started < 10:
        try:
            sock.send(b"\x00")  # one more (masked) byte of the message
        except (BlockingIOError, BrokenPipeError, ConnectionResetError):
            pass
        time.sleep(0.1)
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            continue
        except ConnectionResetError:
            break
        closed = not data
        got += data
    elapsed = time.monotonic() - started
    sock.close()
    sent = _server_frames(got)
    assert [opcode for opcode, _ in sent] == [0x2, 0x8], (sent, elapsed)
    error = _decode(sent[0][1])
    assert isinstance(error, frames.Error), error
    assert error.code == ErrorCode.FRAME_TIMEOUT, error
    assert "not complete 1500 ms after its first byte" in error.message, error.message
    assert "limits.frame_deadline_ms" in error.message
    assert struct.unpack(">H", sent[1][1][:2])[0] == 1008
    assert 1.4 < elapsed < 8, elapsed
