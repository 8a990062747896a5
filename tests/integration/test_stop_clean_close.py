"""A stopping node ends its TLS client connections cleanly: UNAVAILABLE or the last
answers, then ``close_notify`` and a clean TCP close.

Issue 15: the client protocol's plain TCP connections already got UNAVAILABLE and a
clean close at a stop (``test_shards_stop_queued.py``); TLS ones still ended without
``close_notify`` or with a reset. Real ``futureq start`` processes on 127.0.0.1, real
TLS with trustme certificates.
"""

from __future__ import annotations

import signal
import socket
import ssl
import time
from pathlib import Path

from broker_process import BrokerProcess

from futureq.errors import ErrorCode
from futureq.wire import codec, frames

CLIENTS = 8


def _tls_hello(address: str, ca: Path, receive_buffer_bytes: int = 0) -> ssl.SSLSocket:
    """A TLS client connection that sent HELLO (with a receive buffer this small, if
    given: the node's answers fill it soon). Its end must be the server's
    ``close_notify``: a bare TCP close raises ``ssl.SSLEOFError`` on reading (ragged
    EOFs are not suppressed), a reset ``ConnectionResetError``."""
    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(ca))
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer_bytes:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
    raw.settimeout(15)
    raw.connect((host, int(port)))
    sock = context.wrap_socket(raw, server_hostname=host, suppress_ragged_eofs=False)
    sock.sendall(codec.encode_frame(frames.Hello(1, (1,), "test", None), 2**31))
    return sock


def _frames_to_the_end(sock: socket.socket) -> list[object]:
    """Every frame on ``sock`` up to its clean end (EOF, or ``close_notify`` under TLS)."""
    decoder = codec.FrameDecoder(1 << 20)
    found: list[object] = []
    while data := sock.recv(1 << 20):
        decoder.receive_data(data)
        while (frame := decoder.next_frame()) is not codec.NEED_DATA:
            found.append(frame)
    return found


def _stall_tls(address: str, ca: Path) -> ssl.SSLSocket:
    """A served TLS connection that asks for the slot map (a large answer: the node's
    buffers fill soon) without reading until neither side's buffers take more (as
    ``test_shards_stop_queued._stall``)."""
    sock = _tls_hello(address, ca, receive_buffer_bytes=4096)
    decoder = codec.FrameDecoder(1 << 20)
    while (frame := decoder.next_frame()) is codec.NEED_DATA:
        decoder.receive_data(sock.recv(65536))
    assert isinstance(frame, frames.HelloOk), frame
    sock.setblocking(False)
    requests = codec.encode_frame(frames.SlotMap(7), 2**31) * 64
    unsent = memoryview(b"")
    stalled_at = time.monotonic() + 1.0
    while time.monotonic() < stalled_at:
        # A send may take part of the bytes (partial writes): the rest goes next; one
        # that would block is retried with the same bytes.
        unsent = unsent or memoryview(requests)
        try:
            unsent = unsent[sock.send(unsent) :]
            stalled_at = time.monotonic() + 1.0
        except (ssl.SSLWantWriteError, BlockingIOError):
            time.sleep(0.01)
    return sock


def test_a_tls_connection_the_stop_finishes_ends_with_close_notify(
    tmp_path: Path, tls_files: dict[str, Path], tls_args: list[str]
) -> None:
    """A TLS client whose requests the stopping node no longer reads reads every answer,
    then the node's close_notify and a clean end. Before: the node closed its socket
    with those requests unread, a reset (ConnectionResetError after some answers)."""
    node = BrokerProcess(tmp_path / "data", tls_args)
    stalled: ssl.SSLSocket | None = None
    try:
        node.start()
        assert node.process is not None
        stalled = _stall_tls(node.client_address, tls_files["ca"])
        node.process.send_signal(signal.SIGTERM)
        node.wait_logged("shutting down: no new connections")
        stalled.setblocking(True)
        stalled.settimeout(15)
        answers = _frames_to_the_end(stalled)  # a reset raises, a bare close too
        assert answers and not any(isinstance(frame, frames.Error) for frame in answers)
        assert node.process.wait(30) == 0
    finally:
        if stalled is not None:
            stalled.close()
        node.kill()


def test_tls_connections_arriving_while_a_sharded_node_stops_are_told_then_closed(
    tmp_path: Path, tls_files: dict[str, Path], tls_args: list[str]
) -> None:
    """TLS connections arriving while a sharded node stops are told UNAVAILABLE, then
    get close_notify and a clean close. Before: the refusal closed the TLS stream
    forcefully, with no close_notify (SSLEOFError) and the HELLO unread (a reset)."""
    node = BrokerProcess(
        tmp_path / "data",
        ["--shards", "2", *tls_args],
        {"FUTUREQ_NODE_SHARD_PORT_STRIDE": "1"},
        shards=None,
    )
    node._port_args = ["--http", "127.0.0.1:0", "--listen", "127.0.0.1:0"]
    stalled: ssl.SSLSocket | None = None
    try:
        node.start()
        stalled = _stall_tls(node.client_address, tls_files["ca"])
        assert node.process is not None
        node.process.send_signal(signal.SIGTERM)
        node.wait_logged("shard=0 futureq.broker.server: shutting down")
        late = [_tls_hello(node.client_address, tls_files["ca"]) for _ in range(CLIENTS)]
        for sock in late:
            with sock:
                answers = _frames_to_the_end(sock)  # a reset raises, a bare close too
            assert len(answers) == 1, answers
            frame = answers[0]
            assert isinstance(frame, frames.Error), frame
            assert frame.code == ErrorCode.UNAVAILABLE
            assert "shutting down" in frame.message
        assert node.process.wait(30) == 0
    finally:
        if stalled is not None:
            stalled.close()
        node.kill()
