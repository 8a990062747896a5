"""Authenticated clients holding half-sent frames, against a real ``futureq start``.

Found by trying it as a hostile client would: after HELLO, connections each sent a
header announcing a 4 MiB frame and most of its body, then went silent. Together they
filled the node's inbound budget (``limits.max_node_buffer_bytes``), and every other
client's large frame then waited for room until the silent ones hit the frame deadline
(30 s), renewed by reconnecting. Now a frame that gets no byte for
``limits.frame_stall_ms`` while the server reads is dropped (``FRAME_TIMEOUT``), so the
budget is back within that time; the wait for room does not count against the waiting
client; and a read takes at most what the budget has room for.
"""

from __future__ import annotations

import socket
import threading
import time

from broker_process import BrokerProcess, connection_buffer_bytes
from wire_client import WireClient

from futureq.errors import ErrorCode
from futureq.wire import codec, frames

NODE_INBOUND = 16 * 1024 * 1024
FRAME = 4 * 1024 * 1024
HOSTILE = 6
"""Half-sent 4 MiB frames: more than the node's 16 MiB inbound budget holds."""


def _hold_half_frame(client: WireClient, keep: int = 1) -> None:
    """Send a header announcing FRAME bytes and as much of the body as the server takes
    (all but ``keep`` bytes at most), without blocking on a server that stopped reading."""
    client.send_raw(FRAME.to_bytes(4, "big"))
    body = b"\x00" * (FRAME - keep)
    client.sock.settimeout(1.0)
    sent = 0
    try:
        while sent < len(body):
            sent += client.sock.send(body[sent : sent + 65536])
    except TimeoutError:
        pass  # the server holds reads back while its budget is full


def _inbound_bytes(http_address: str) -> float:
    return connection_buffer_bytes(http_address, "in")


def test_half_sent_frames_are_dropped_after_the_stall_deadline_and_others_get_room(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        env={
            "FUTUREQ_LIMITS_MAX_NODE_BUFFER_BYTES": str(NODE_INBOUND),
            "FUTUREQ_LIMITS_MAX_CONNECTION_BUFFER_BYTES": str(8 * 1024 * 1024),
            "FUTUREQ_LIMITS_FRAME_STALL_MS": "1500",
        }
    )
    hostile = [WireClient(broker.client_address) for _ in range(HOSTILE)]
    started = time.monotonic()
    for client in hostile:
        _hold_half_frame(client)
    # Per connection one frame, and all of them together the node's budget (plus at most
    # a small read per connection): never the 24 MiB sent.
    assert _inbound_bytes(broker.http_address) <= NODE_INBOUND + HOSTILE * 256 * 1024

    # Another client's large frame is served within the stall deadline's reach, not after
    # the 30 s frame deadline of the frames ahead of it.
    producer = WireClient(broker.client_address)
    sent = time.monotonic()
    answer = producer.publish([["half.t", b"p" * (1024 * 1024), 0, None, None]])
    assert isinstance(answer, frames.PublishOk), answer
    assert time.monotonic() - sent < 10, time.monotonic() - sent

    # Each silent half-frame was dropped with a sentence, well before the frame deadline.
    for client in hostile:
        client.sock.settimeout(15)
        answer = client.receive(15)
        assert isinstance(answer, frames.Error), answer
        assert answer.code == ErrorCode.FRAME_TIMEOUT, answer
        # Stalled, or dropped first for the producer's frame that waited for room.
        assert "limits.frame_stall_ms" in answer.message or "oldest incomplete" in answer.message
        assert client.receive(5) is codec.CLOSED
    assert time.monotonic() - started < 25
    deadline = time.monotonic() + 5
    while _inbound_bytes(broker.http_address) > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _inbound_bytes(broker.http_address) == 0


def test_trickled_half_frames_are_dropped_when_another_frame_needs_the_room(
    broker_factory: object,
) -> None:
    """Half-sent frames that keep trickling (a byte every 0.3 s: never stalled) hold the
    budget until their 30 s frame deadline, unless the oldest is dropped for a frame
    that waits for room."""
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        env={
            "FUTUREQ_LIMITS_MAX_NODE_BUFFER_BYTES": str(NODE_INBOUND),
            "FUTUREQ_LIMITS_MAX_CONNECTION_BUFFER_BYTES": str(8 * 1024 * 1024),
        }
    )
    hostile = [WireClient(broker.client_address) for _ in range(HOSTILE)]
    for client in hostile:
        _hold_half_frame(client, keep=64)
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.3):
            for client in hostile:
                try:
                    client.sock.send(b"\x00")
                except OSError:
                    pass  # dropped (or not read: its budget wait)

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        producer = WireClient(broker.client_address)
        sent = time.monotonic()
        answer = producer.publish([["half.t", b"p" * (1024 * 1024), 0, None, None]])
        took = time.monotonic() - sent
        assert isinstance(answer, frames.PublishOk), answer
        assert took < 10, took
    finally:
        stop.set()
        trickler.join(5)
    dropped = []
    for client in hostile:
        client.sock.settimeout(0.5)
        try:
            answer = client.receive(0.5)
        except (TimeoutError, OSError):
            continue
        if isinstance(answer, frames.Error):
            dropped.append(answer)
    assert dropped, "no trickled frame was dropped"
    assert all(a.code == ErrorCode.FRAME_TIMEOUT and "oldest incomplete" in a.message
               for a in dropped), dropped  # fmt: skip


def test_a_frame_that_keeps_coming_is_not_stalled(broker_factory: object) -> None:
    """A slow but steady sender is not cut: only a gap longer than frame_stall_ms is."""
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        env={"FUTUREQ_LIMITS_FRAME_STALL_MS": "1000"}
    )
    client = WireClient(broker.client_address)
    data = codec.encode_frame(
        frames.Publish(7, frames.AckLevel.QUORUM, [["steady", b"s", 0, None, None]])
    )
    for i in range(len(data)):  # one byte every 0.1 s: 2+ s in all, no gap of 1 s
        client.send_raw(data[i : i + 1])
        time.sleep(0.1)
    answer = client.receive()
    assert isinstance(answer, frames.PublishOk), answer
    sock = client.sock
    assert isinstance(sock, socket.socket)
