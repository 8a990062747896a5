"""A stopping node ends its HTTP connections cleanly: an answer (503 "shutting down"
for one still queued), then a clean close, never a TCP reset.

Issue 15: a scraper, a load balancer's probe or a keep-alive client whose connection
was open or queued on the HTTP port when the node stopped could get ECONNRESET. Real
``futureq start`` processes on 127.0.0.1.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from pathlib import Path

from broker_process import BrokerProcess

HTTP_CLIENTS = 32


def _http_request(path: str, pad_bytes: int = 0) -> bytes:
    pad = f"x-pad: {'p' * pad_bytes}\r\n" if pad_bytes else ""
    return f"GET {path} HTTP/1.1\r\nhost: futureq\r\n{pad}\r\n".encode()


def _read_to_the_end(sock: socket.socket) -> bytes:
    """What ``sock`` receives up to its end; a reset raises ConnectionResetError."""
    received = bytearray()
    while data := sock.recv(1 << 20):
        received += data
    return bytes(received)


def test_an_http_connection_the_stop_finishes_ends_with_a_clean_close(tmp_path: Path) -> None:
    """A keep-alive HTTP client that pipelined requests without reading the answers
    (the node stopped reading them: its writes wait on the client). At the stop it
    reads the answers, then a clean end. Before: the node's HTTP server was cancelled
    with the rest and closed the socket with those requests unread, a reset."""
    node = BrokerProcess(tmp_path / "data", env={"FUTUREQ_LIMITS_SEND_TIMEOUT_MS": "60000"})
    sock: socket.socket | None = None
    try:
        node.start()
        host, port = node.http_address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=15)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        requests = _http_request("/metrics", 2000) * 32
        unsent = memoryview(b"")
        stalled_at = time.monotonic() + 1.0
        while time.monotonic() < stalled_at:
            unsent = unsent or memoryview(requests)
            try:
                unsent = unsent[sock.send(unsent) :]
                stalled_at = time.monotonic() + 1.0
            except BlockingIOError:
                time.sleep(0.01)
        assert node.process is not None
        node.process.send_signal(signal.SIGTERM)
        node.wait_logged("shutting down: no new connections")
        sock.setblocking(True)
        sock.settimeout(15)
        received = _read_to_the_end(sock)  # a reset raises ConnectionResetError
        assert received.startswith(b"HTTP/1.1 200"), received[:200]
        assert node.process.wait(30) == 0
    finally:
        if sock is not None:
            sock.close()
        node.kill()


def _shard_pids(node: BrokerProcess) -> list[int]:
    return [int(pid) for pid in re.findall(r"shard \d+ started \(pid (\d+)\)", node.stderr_text())]


def _exited(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_http_connections_queued_while_a_sharded_node_stops_get_503_not_a_reset(
    tmp_path: Path,
) -> None:
    """HTTP connections queued on the node's HTTP port, which the supervisor holds, while
    its shards stop (the supervisor paused meanwhile, SIGSTOP): each gets an answer (503
    "shutting down" or the supervisor's own) and a clean close. Before: the supervisor
    exited with them queued, a reset each."""
    node = BrokerProcess(
        tmp_path / "data",
        ["--shards", "2"],
        {"FUTUREQ_NODE_SHARD_PORT_STRIDE": "1"},
        shards=None,
    )
    node._port_args = ["--http", "127.0.0.1:0", "--listen", "127.0.0.1:0"]
    queued: list[socket.socket] = []
    try:
        node.start()
        assert node.process is not None
        shards = _shard_pids(node)
        assert len(shards) == 2, node.stderr_text()[-3000:]
        node.process.send_signal(signal.SIGTERM)
        node.wait_logged("shard=0 futureq.broker.server: shutting down")
        node.process.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 15
        while not all(_exited(pid) for pid in shards):
            assert time.monotonic() < deadline, node.stderr_text()[-3000:]
            time.sleep(0.02)
        host, port = node.http_address.rsplit(":", 1)
        for client in range(HTTP_CLIENTS):
            sock = socket.create_connection((host, int(port)), timeout=15)
            queued.append(sock)
            sock.sendall(_http_request("/readyz" if client % 2 else "/metrics"))
        node.process.send_signal(signal.SIGCONT)
        for sock in queued:
            answer = _read_to_the_end(sock)  # a reset raises ConnectionResetError
            assert answer.startswith(b"HTTP/1.1 "), answer[:200]
        assert node.process.wait(30) == 0
    finally:
        for sock in queued:
            sock.close()
        if node.process is not None and node.process.poll() is None:
            node.process.send_signal(signal.SIGCONT)
        node.kill()


def test_http_connections_queued_while_a_node_stops_are_answered_not_reset(
    tmp_path: Path,
) -> None:
    """A single node paused (SIGSTOP) while probes connect: they wait in the HTTP
    port's backlog, then it is stopped (SIGTERM, SIGCONT, as systemd does). Each ends
    cleanly, with an answer: ``/readyz``'s, or 503 "shutting down" for one still queued
    when the port closes or one the server took but had not read yet when it closed its
    idle connections. Before: the HTTP server was cancelled with the process, and the
    connections still queued or unread got a reset; then the unread ones got a clean
    end with no answer."""
    node = BrokerProcess(tmp_path / "data")
    queued: list[socket.socket] = []
    try:
        node.start()
        assert node.process is not None
        host, port = node.http_address.rsplit(":", 1)
        node.process.send_signal(signal.SIGSTOP)
        for _ in range(HTTP_CLIENTS * 2):
            sock = socket.create_connection((host, int(port)), timeout=15)
            queued.append(sock)
            sock.sendall(_http_request("/readyz"))
        node.process.send_signal(signal.SIGTERM)
        node.process.send_signal(signal.SIGCONT)
        for sock in queued:
            answer = _read_to_the_end(sock)  # a reset raises ConnectionResetError
            assert answer.startswith(b"HTTP/1.1 "), answer[:200]
        assert node.process.wait(30) == 0
    finally:
        for sock in queued:
            sock.close()
        if node.process is not None and node.process.poll() is None:
            node.process.send_signal(signal.SIGCONT)
        node.kill()
