"""HTTP endpoints of a real broker, and TLS on the client listener with trustme
certificates (a real handshake; bad TLS fails that connection alone)."""

from __future__ import annotations

import socket
import ssl
import urllib.request
from pathlib import Path

import pytest
import trustme
from broker_process import BrokerProcess
from wire_client import WireClient

from futureq.wire import codec, frames


def _get(http_address: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{http_address}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_health_readiness_metrics_and_dashboard(broker: BrokerProcess) -> None:
    assert _get(broker.http_address, "/healthz")[0] == 200
    assert _get(broker.http_address, "/readyz")[0] == 200
    client = WireClient(broker.client_address)
    client.subscribe("metered", "g")
    client.publish([["metered", b"x", 0, None, None]] * 3)
    client.deliveries(3)
    status, body = _get(broker.http_address, "/metrics")
    assert status == 200
    assert 'futureq_published_messages_total{topic="metered"} 3.0' in body
    assert 'futureq_delivered_messages_total{group="g",topic="metered"} 3.0' in body
    assert 'futureq_in_flight_deliveries{group="g",topic="metered"} 3.0' in body
    assert "futureq_fsync_seconds_count" in body
    status, body = _get(broker.http_address, "/api/status")
    assert status == 200 and '"metered"' in body
    status, body = _get(broker.http_address, "/")
    assert status == 200 and "<html" in body.lower()


def _tls_client(address: str, context: ssl.SSLContext) -> WireClient:
    client = WireClient.__new__(WireClient)
    host, port = address.rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=10)
    client.sock = context.wrap_socket(raw, server_hostname=host)
    client.decoder = codec.FrameDecoder(64 * 1024 * 1024)
    client.pushed = []
    client.notices = []
    client._next_id = 100
    client.send(frames.Hello(1, (1,), "tls-test", None))
    assert isinstance(client.receive(), frames.HelloOk)
    return client


def test_tls_listener(
    broker_factory: object, tls_files: dict[str, Path], tls_args: list[str]
) -> None:
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        extra_args=tls_args
    )
    trusted = ssl.create_default_context(cafile=str(tls_files["ca"]))
    client = _tls_client(broker.client_address, trusted)
    client.subscribe("secure", "g")
    assert isinstance(client.publish([["secure", b"over tls", 0, None, None]]), frames.PublishOk)
    (delivery,) = client.deliveries(1)
    assert delivery[2] == b"over tls"

    # A client that does not trust the server's CA fails its own handshake...
    other_ca = tls_files["ca"].parent / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other_ca))
    untrusting = ssl.create_default_context(cafile=str(other_ca))
    with pytest.raises(ssl.SSLError):
        _tls_client(broker.client_address, untrusting)
    # ...a plain-TCP client gets nothing it can use and is closed...
    host, port = broker.client_address.rsplit(":", 1)
    plain = socket.create_connection((host, int(port)), timeout=10)
    plain.sendall(codec.encode_frame(frames.Hello(1, (1,), "plain", None)))
    try:
        data = plain.recv(100)
    except ConnectionResetError:
        data = b""
    assert not data.startswith(b"\x00\x00\x00"), (
        "a plain-TCP client must not get a frame from a TLS listener"
    )
    plain.close()
    # ...and the server keeps serving TLS clients.
    again = _tls_client(broker.client_address, trusted)
    assert isinstance(again.publish([["secure", b"still", 0, None, None]]), frames.PublishOk)
    client.sock.close()
    again.sock.close()


def test_a_busy_port_is_named_and_exits_4(broker: BrokerProcess, tmp_path: Path) -> None:
    import subprocess
    import sys

    for flag, address in (("--http", broker.http_address), ("--listen", broker.client_address)):
        args = ["--shards", "1", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", flag, address]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "futureq.cli.server_main",
                "start",
                "--data-dir",
                str(tmp_path / flag),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 4, done.stderr
        assert "cannot listen for" in done.stderr and address in done.stderr and flag in done.stderr
