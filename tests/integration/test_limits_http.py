"""The HTTP port against a real ``futureq start``: its connections are capped and its
slow ones closed, so it cannot spend the descriptors RocksDB needs.

Found by trying it as a hostile client would: the client port refused connections past
its open-file budget (``test_limits_descriptors.py``), but the HTTP port accepted every
connection, so a few hundred half-open HTTP connections took the descriptors a memtable
flush needs. Now ``limits.max_http_connections`` (and the open-file budget) caps them:
one more is answered 503 with a sentence and closed at once; a connection without a
complete request head is closed after ``limits.http_idle_timeout_ms``.
"""

from __future__ import annotations

import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

from broker_process import BrokerProcess
from wire_client import WireClient

from futureq.broker import http
from futureq.wire import frames

OPEN_FILES = 256
"""The node's open-file limit here: 16 HTTP connections, 144 client ones (fd_budget)."""
HALF_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
"""A request head that never ends (slowloris)."""


def _connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _read_all(sock: socket.socket, within_s: float) -> bytes | None:
    """What the server sent until it closed, or None if it was still open after ``within_s``."""
    sock.settimeout(within_s)
    got = b""
    deadline = time.monotonic() + within_s
    try:
        while time.monotonic() < deadline:
            data = sock.recv(65536)
            if not data:
                return got
            got += data
    except TimeoutError:
        return None
    except ConnectionResetError:
        return got
    return None


def test_http_connections_past_the_budget_get_503_and_the_node_keeps_its_disk(
    tmp_path: Path,
) -> None:
    broker = BrokerProcess(
        tmp_path / "data",
        env={"FUTUREQ_STORAGE_WRITE_BUFFER_MB": "1"},  # a flush (a new file) every MiB
        open_files=OPEN_FILES,
    )
    broker.start()
    held: list[socket.socket] = []
    try:
        producer = WireClient(broker.client_address)
        for _ in range(OPEN_FILES + 50):
            sock = _connect(broker.http_address)
            sock.sendall(HALF_REQUEST)
            held.append(sock)
        answers = [_read_all(sock, 0.05) for sock in held]
        refused = [a for a in answers if a is not None]
        # The first 4 (a quarter of 16 from one address) are served (waiting for the rest
        # of their head); every other one
        # was told why and closed,
        # without waiting for its request.
        assert len(refused) >= len(held) - 16, (len(refused), len(held))
        told = [a for a in refused if a]
        assert all(a.startswith(b"HTTP/1.1 503") for a in told), told[:3]
        assert len(told) >= 16, (len(told), len(refused))
        assert b"limits.max_http_connections" in told[0], told[0]
        # One address holds at most a quarter of the slots: another host's health probe
        # is still served while this one fills its share.
        host, port = broker.http_address.rsplit(":", 1)
        probe = socket.create_connection(
            (host, int(port)), timeout=10, source_address=("127.0.0.2", 0)
        )
        probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = _read_all(probe, 5.0)
        probe.close()
        assert answer is not None and answer.startswith(b"HTTP/1.1 200"), answer

        # With the HTTP slots taken, RocksDB still opens its files: 6 MiB of publishes
        # is several memtable flushes.
        for number in range(60):
            answer = producer.publish([[f"t{number % 4}", b"x" * 100_000, 0, None, None]])
            assert isinstance(answer, frames.PublishOk), answer
        assert broker.process is not None and broker.process.poll() is None
        assert "Too many open files" not in broker.stderr_text()
    finally:
        for sock in held:
            sock.close()
    # The slots come back: a fresh request is served.
    deadline = time.monotonic() + 10
    while True:
        try:
            with urllib.request.urlopen(f"http://{broker.http_address}/healthz", timeout=5) as ok:
                assert ok.status == 200
                break
        except OSError as refused:
            if isinstance(refused, urllib.error.HTTPError):
                refused.close()  # a 503's socket, else closed by a gc pass of a later test
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    broker.terminate()


def test_slow_and_idle_http_connections_are_closed_after_the_idle_timeout(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        env={"FUTUREQ_LIMITS_HTTP_IDLE_TIMEOUT_MS": "1000"}
    )
    idle = _connect(broker.http_address)
    slow = _connect(broker.http_address)
    slow.sendall(HALF_REQUEST)
    started = time.monotonic()
    closed_after: float | None = None
    for step in range(40):  # a header line every 0.2 s: the head never completes
        try:
            slow.sendall(b"X-%d: y\r\n" % step)
        except OSError:
            closed_after = time.monotonic() - started
            break
        slow.settimeout(0.2)
        try:
            if slow.recv(1024) == b"":
                closed_after = time.monotonic() - started
                break
        except TimeoutError:
            pass
        except ConnectionResetError:
            closed_after = time.monotonic() - started
            break
    assert closed_after is not None, "a head trickled for 8 s and was never closed"
    assert closed_after < 4.0, closed_after
    assert _read_all(idle, 4.0) == b""  # idle: closed without a word
    slow.close()
    idle.close()
    # A prompt request on a fresh connection is still served.
    with urllib.request.urlopen(f"http://{broker.http_address}/healthz", timeout=5) as ok:
        assert ok.status == 200


def test_bytes_that_are_not_an_http_request_get_a_sentence(broker: BrokerProcess) -> None:
    # Hypercorn's 400 and 431 had empty bodies: a client saw a bare status code.
    for raw, status, words in (
        (b"GARBAGE\r\n\r\n", b"400", b"not valid HTTP/1.1"),
        (b"GET /healthz HTTP/1.1\r\nContent-Length: -1\r\n\r\n", b"400", b"not valid HTTP/1.1"),
        (b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 100_000 + b"\r\n\r\n", b"431", b"too large"),
    ):
        sock = _connect(broker.http_address)
        try:
            sock.sendall(raw)
            answer = _read_all(sock, 10)
        finally:
            sock.close()
        assert answer is not None and answer.startswith(b"HTTP/1.1 " + status), answer
        head, _, body = answer.partition(b"\r\n\r\n")
        assert words in body and b"text/plain" in head, answer
    with urllib.request.urlopen(f"http://{broker.http_address}/healthz", timeout=10) as response:
        assert response.status == 200


def test_more_http_connections_refused_at_once_than_told_at_once_are_all_answered(
    tmp_path: Path,
) -> None:
    """Connections queued while the node is paused (SIGSTOP), three times
    ``http.MAX_HTTP_REFUSING`` past ``limits.max_http_connections``: each ends cleanly
    with an answer (``/healthz``'s, or 503 saying which limit), none with a reset.
    Before: past 16 refusals at once, closed with the request unread, a reset each."""
    broker = BrokerProcess(tmp_path / "data", env={"FUTUREQ_LIMITS_MAX_HTTP_CONNECTIONS": "4"})
    broker.start()
    assert broker.process is not None
    held: list[socket.socket] = []
    try:
        broker.process.send_signal(signal.SIGSTOP)
        for _ in range(4 + 3 * http.MAX_HTTP_REFUSING):
            sock = _connect(broker.http_address)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            held.append(sock)
        broker.process.send_signal(signal.SIGCONT)
        for sock in held:
            answer = b""
            while data := sock.recv(65536):  # a reset raises ConnectionResetError
                answer += data
            assert answer.startswith((b"HTTP/1.1 200", b"HTTP/1.1 503")), answer[:200]
    finally:
        for sock in held:
            sock.close()
        if broker.process.poll() is None:
            broker.process.send_signal(signal.SIGCONT)
        broker.kill()
