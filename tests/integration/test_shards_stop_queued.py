"""A sharded node's final stop answers the client connections that arrive meanwhile.

Issue 15, fault 1: on SIGTERM a shard closed its client listener at once. With ports
chosen by the OS (``--listen 127.0.0.1:0``) the supervisor holds every shard's client
socket for the node's life, so connections kept being queued on it while the shards
stopped, unanswered, and got a TCP reset when the supervisor exited: an error for the
application instead of a "shutting down, retry elsewhere" it retries on. Real
``futureq start --shards 2`` processes on 127.0.0.1.
"""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

from broker_process import BrokerProcess

from futureq.broker import gateway
from futureq.errors import ErrorCode
from futureq.wire import codec, frames

CLIENTS = 8


def _hello(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=15)
    sock.sendall(codec.encode_frame(frames.Hello(1, (1,), "test", None), 2**31))
    return sock


def _answer(sock: socket.socket) -> object:
    """The first frame on ``sock`` (or ``codec.CLOSED``), read on to the connection's
    end. Raises ConnectionResetError when it ends with a reset, not a clean close."""
    decoder = codec.FrameDecoder(1 << 20)
    frame: object = codec.NEED_DATA
    while frame is codec.NEED_DATA:
        data = sock.recv(65536)
        decoder.receive_data(data)
        frame = decoder.next_frame()
    while sock.recv(65536):
        pass
    return frame


def _stall(address: str, request: frames.Frame | None = None) -> socket.socket:
    """A served connection that asks without reading until neither side's buffers take
    more: the node's graceful stop waits for it (``gateway.SHUTDOWN_DRAIN_S``), and its
    requests not read yet wait in the node's socket buffer."""
    sock = _hello(address)
    decoder = codec.FrameDecoder(1 << 20)
    while (frame := decoder.next_frame()) is codec.NEED_DATA:
        decoder.receive_data(sock.recv(65536))
    assert isinstance(frame, frames.HelloOk), frame
    sock.setblocking(False)
    requests = codec.encode_frame(request or frames.SlotMap(7), 2**31) * 64
    unsent = memoryview(b"")
    stalled_at = time.monotonic() + 1.0
    while time.monotonic() < stalled_at:
        # A send may take part of the bytes: the rest goes next, or the node would read
        # a frame cut short followed by the start of another (a malformed stream, which
        # it answers with an error and closes).
        unsent = unsent or memoryview(requests)
        try:
            unsent = unsent[sock.send(unsent) :]
            stalled_at = time.monotonic() + 1.0  # it still took some: not full yet
        except BlockingIOError:
            time.sleep(0.01)
    return sock


def test_connections_arriving_while_a_sharded_node_stops_are_told_not_reset(
    tmp_path: Path,
) -> None:
    """Before: each of these connections got a reset once the supervisor exited
    (ConnectionResetError here); now each is answered UNAVAILABLE and closed cleanly."""
    node = BrokerProcess(
        tmp_path / "data",
        ["--shards", "2"],
        {"FUTUREQ_NODE_SHARD_PORT_STRIDE": "1"},
        shards=None,
    )
    # Ports chosen by the OS, so the supervisor holds the shards' client sockets (not
    # ANY_PORTS itself, which $FUTUREQ_TEST_PORTS would turn into fixed ports).
    node._port_args = ["--http", "127.0.0.1:0", "--listen", "127.0.0.1:0"]
    stalled: socket.socket | None = None
    try:
        node.start()
        stalled = _stall(node.client_address)
        assert node.process is not None
        node.process.send_signal(signal.SIGTERM)
        node.wait_logged("shard=0 futureq.broker.server: shutting down")
        late = [_hello(node.client_address) for _ in range(CLIENTS)]
        for sock in late:
            with sock:
                frame = _answer(sock)  # a reset raises ConnectionResetError
            assert isinstance(frame, frames.Error), frame
            assert frame.code == ErrorCode.UNAVAILABLE
            assert "shutting down" in frame.message
        assert node.process.wait(30) == 0
    finally:
        if stalled is not None:
            stalled.close()
        node.kill()


def test_connections_queued_on_a_stopping_nodes_listener_are_answered_not_reset(
    tmp_path: Path,
) -> None:
    """A node whose process is paused (SIGSTOP) while clients connect: the connections
    wait in its listener's backlog, then it is stopped (SIGTERM, SIGCONT, as systemd
    does). Each is served (HELLO_OK, then closed cleanly by the stop) or told
    UNAVAILABLE; before, those still queued when the listener closed at the start of the
    stop got a reset. The same code serves a shard with its own ports."""
    answers = _stop_with_queued(tmp_path, CLIENTS * 8)
    for frame in answers:
        if isinstance(frame, frames.Error):
            assert frame.code == ErrorCode.UNAVAILABLE, frame
        else:
            assert isinstance(frame, frames.HelloOk), frame


def test_more_connections_queued_than_refused_at_once_are_all_told_not_reset(
    tmp_path: Path,
) -> None:
    """As above, with three times :data:`gateway.MAX_REFUSING` connections queued: those
    refused beyond the ones being refused at once are told UNAVAILABLE too, then closed
    cleanly. Before: closed with their HELLO unread, a reset each (136 of 200 in a
    first run)."""
    answers = _stop_with_queued(tmp_path, 3 * gateway.MAX_REFUSING)
    refused = [frame for frame in answers if isinstance(frame, frames.Error)]
    assert all(frame.code == ErrorCode.UNAVAILABLE for frame in refused), refused
    assert len(refused) > gateway.MAX_REFUSING
    served = [frame for frame in answers if not isinstance(frame, frames.Error)]
    assert all(isinstance(frame, frames.HelloOk) for frame in served), served


def _stop_with_queued(tmp_path: Path, count: int) -> list[object]:
    """Pause a node (SIGSTOP), queue ``count`` connections that each sent HELLO, stop
    it as systemd does (SIGTERM, SIGCONT) and return each connection's answer; checks
    the node exited 0. A reset raises ConnectionResetError."""
    node = BrokerProcess(tmp_path / "data")
    node.start()
    assert node.process is not None
    queued: list[socket.socket] = []
    try:
        node.process.send_signal(signal.SIGSTOP)
        queued = [_hello(node.client_address) for _ in range(count)]
        node.process.send_signal(signal.SIGTERM)
        node.process.send_signal(signal.SIGCONT)
        answers = [_answer(sock) for sock in queued]
        assert node.process.wait(30) == 0
        return answers
    finally:
        for sock in queued:
            sock.close()
        node.kill()


def test_a_connection_the_stop_finishes_ends_with_a_clean_close(tmp_path: Path) -> None:
    """A client that sent requests the node no longer reads once it stops (the node had
    stopped reading them: its answers were not read). It reads every answer, then the
    end of the connection: a clean close. Before, the node closed its socket with those
    requests unread, which sends a reset: ConnectionResetError after the last answer."""
    node = BrokerProcess(tmp_path / "data")
    stalled: socket.socket | None = None
    try:
        node.start()
        assert node.process is not None
        stalled = _stall(node.client_address, frames.Ping(7))
        node.process.send_signal(signal.SIGTERM)
        node.wait_logged("shutting down: no new connections")
        stalled.setblocking(True)
        stalled.settimeout(15)
        decoder = codec.FrameDecoder(1 << 20)
        pongs = 0
        while data := stalled.recv(1 << 20):  # a reset raises ConnectionResetError
            decoder.receive_data(data)
            while (frame := decoder.next_frame()) is not codec.NEED_DATA:
                assert isinstance(frame, frames.Pong), frame
                pongs += 1
        assert pongs > 0
        assert node.process.wait(30) == 0
    finally:
        if stalled is not None:
            stalled.close()
        node.kill()
