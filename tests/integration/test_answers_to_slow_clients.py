"""Answers to a client that does not read: what it reads is whole frames, ending with the
ERROR that says why the server closed; they count in the byte buffers until written; and
a node stops promptly meanwhile. (Kept from the breaker run against handlers writing
their own answers, issue 11, which measured no gain and was dropped.)"""

from __future__ import annotations

import socket
import ssl
import time
from pathlib import Path

import pytest
import trustme
from broker_process import BrokerProcess
from test_limits_connections import metric, wait_for
from wire_client import WireClient, non_reading_client

from futureq.errors import ErrorCode
from futureq.wire import codec, frames

STALL_FAST = {
    "FUTUREQ_LIMITS_FRAME_DEADLINE_MS": "60000",
    "FUTUREQ_LIMITS_FRAME_STALL_MS": "700",
    "FUTUREQ_LIMITS_SEND_TIMEOUT_MS": "8000",
}


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
def test_an_answer_being_written_when_the_connection_closes_is_whole_before_the_error(
    broker_factory: object, tmp_path: Path, tls: bool
) -> None:
    """A client asks for large answers without reading, then stalls in the middle of a
    frame: the server closes it with FRAME_TIMEOUT. The answer being written
    when that happened must not be cut off with the ERROR written after its first
    bytes (the client would read the ERROR as the rest of the answer)."""
    extra: list[str] = []
    context: ssl.SSLContext | None = None
    if tls:  # a cut write breaks a TLS stream outright
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1")
        cert_path, key_path = tmp_path / "node.pem", tmp_path / "node.key"
        cert.cert_chain_pems[0].write_to_path(str(cert_path))
        cert.private_key_pem.write_to_path(str(key_path))
        extra = ["--tls-cert", str(cert_path), "--tls-key", str(key_path)]
        context = ssl.create_default_context()
        ca.configure_trust(context)
    broker: BrokerProcess = broker_factory(extra, env=STALL_FAST)  # type: ignore[operator]
    producer = WireClient(broker.client_address, ssl_context=context)
    for _ in range(10):
        producer.publish([["cut.t", b"b" * 2048, 60_000, None, None] for _ in range(100)])
    stuck = WireClient(broker.client_address, ssl_context=context)
    stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # reads fast later
    asked = []
    for _ in range(6):  # ~1 MB each: more than the sockets hold, the write blocks
        asked.append(stuck.next_id())
        stuck.send(frames.Browse(asked[-1], "cut.t", None, None, None, None, 1000, 1024))
    stuck.send_raw((100).to_bytes(4, "big") + b"\x00")  # a frame started, then silence
    time.sleep(2.0)  # the frame stalls: the server closes the connection
    answers = []
    while (answer := stuck.receive(timeout_s=10)) is not codec.CLOSED:
        answers.append(answer)
    browsed = [a for a in answers if isinstance(a, frames.BrowseOk)]
    assert browsed and {a.request_id for a in browsed} <= set(asked)  # any order: pipelined
    assert all(len(a.messages) == 1000 for a in browsed)
    error = answers[-1]
    assert isinstance(error, frames.Error) and error.code == ErrorCode.FRAME_TIMEOUT, answers[-1:]


def test_a_node_stops_promptly_while_an_answer_is_written_to_a_client_that_does_not_read(
    broker_factory: object,
) -> None:
    """Stopping the node does not wait out the send timeout of a blocked write."""
    env = {"FUTUREQ_LIMITS_SEND_TIMEOUT_MS": "60000"}
    broker: BrokerProcess = broker_factory(env=env)  # type: ignore[operator]
    producer = WireClient(broker.client_address)
    for _ in range(10):
        producer.publish([["held.t", b"b" * 2048, 60_000, None, None] for _ in range(100)])
    stuck = non_reading_client(broker.client_address)
    for _ in range(4):
        stuck.send(frames.Browse(stuck.next_id(), "held.t", None, None, None, None, 1000, 1024))
    time.sleep(1.0)  # the answers fill the sockets; the write blocks
    started = time.monotonic()
    assert broker.terminate() == 0
    assert time.monotonic() - started < 5
    assert "Traceback" not in broker.stderr_text()


def test_an_answer_to_a_client_that_does_not_read_counts_in_the_buffers_until_written(
    broker_factory: object,
) -> None:
    """Answers count in the connection's and the node's outgoing bytes until written
    (the node's byte bounds and /metrics see them), and not after the client is gone."""
    broker: BrokerProcess = broker_factory()  # type: ignore[operator]
    producer = WireClient(broker.client_address)
    for _ in range(10):
        producer.publish([["counted.t", b"b" * 2048, 60_000, None, None] for _ in range(100)])
    stuck = non_reading_client(broker.client_address)
    stuck.send(frames.Browse(stuck.next_id(), "counted.t", None, None, None, None, 1000, 1024))
    wait_for(lambda: metric(broker, "futureq_connection_buffer_bytes", 'direction="out"') > 0)
    stuck.close()
    wait_for(lambda: metric(broker, "futureq_connection_buffer_bytes", 'direction="out"') == 0)
