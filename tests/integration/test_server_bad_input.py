"""Bad input against a real server: each gets a stable error code and a sentence, fails
alone (no partial write), and the server keeps serving everyone else."""

from __future__ import annotations

import socket
from typing import Any

import msgpack
import pytest
from broker_process import BrokerProcess
from wire_client import WireClient

from futureq.broker.connection import HANDSHAKE_TIMEOUT_S
from futureq.errors import ErrorCode
from futureq.wire import codec, frames

TEN_YEARS_MS = 10 * 366 * 24 * 3600 * 1000


def _frame(value: Any) -> bytes:
    body = msgpack.packb(value, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


def _assert_still_serving(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address)
    answer = client.publish([["still.serving", b"ok", 0, None, None]])
    assert isinstance(answer, frames.PublishOk), answer
    client.close()


def _expect_error_then_close(client: WireClient, code: ErrorCode) -> frames.Error:
    answer = client.receive()
    assert isinstance(answer, frames.Error), answer
    assert answer.code == code, (ErrorCode(answer.code).name, answer.message)
    assert answer.message and answer.message[0].isalpha()
    assert client.receive() is codec.CLOSED
    return answer


PROTOCOL_CASES = [
    pytest.param(
        (5 * 1024 * 1024).to_bytes(4, "big") + b"\x90",
        ErrorCode.FRAME_TOO_LARGE,
        id="oversized-frame",
    ),
    pytest.param(b"\x00\x00\x00\x02\xc1\xc1", ErrorCode.MALFORMED_FRAME, id="malformed-msgpack"),
    pytest.param(_frame([99, 7]), ErrorCode.UNKNOWN_FRAME_TYPE, id="unknown-frame-type"),
    pytest.param(_frame({"type": 3}), ErrorCode.INVALID_FRAME, id="map-instead-of-array"),
    # A request with wrong fields but a request id fails alone: test_bad_fields.py.
    pytest.param(_frame([3, "7", 2, []]), ErrorCode.INVALID_FRAME, id="request-id-string"),
    pytest.param(_frame([1, 2, [1], "x", None]), ErrorCode.INVALID_FRAME, id="second-hello"),
    pytest.param(
        _frame([13, 7, 100, "x", None, None]), ErrorCode.INVALID_FRAME, id="server-only-frame"
    ),
]


@pytest.mark.parametrize(("data", "code"), PROTOCOL_CASES)
def test_protocol_error_closes_only_that_connection(
    broker: BrokerProcess, data: bytes, code: ErrorCode
) -> None:
    bystander = WireClient(broker.client_address)
    client = WireClient(broker.client_address)
    client.send_raw(data)
    _expect_error_then_close(client, code)
    assert isinstance(bystander.publish([["bystander", b"x", 0, None, None]]), frames.PublishOk)
    _assert_still_serving(broker)


@pytest.mark.parametrize(
    ("data", "named"),
    [
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "server.http", id="http"),
        pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "without TLS", id="tls"),
        pytest.param(b"SSH-2.0-OpenSSH_9.6\r\n", "SSH client", id="ssh"),
    ],
)
def test_another_protocol_on_the_client_port_is_named(
    broker: BrokerProcess, data: bytes, named: str
) -> None:
    # Each was told "frame of 1195725856 bytes exceeds the limit ... the first frame must
    # be a HELLO": a length read from the letters of "GET ", a TLS record or "SSH-".
    client = WireClient(broker.client_address, hello=False)
    client.send_raw(data)
    error = _expect_error_then_close(client, ErrorCode.FRAME_TOO_LARGE)
    assert named in error.message, error.message
    assert "bytes exceeds" not in error.message, error.message
    _assert_still_serving(broker)


def test_truncated_frame_then_eof(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address)
    client.send_raw(b"\x00\x00\x00\x10\x93\x01")
    client.sock.shutdown(socket.SHUT_WR)
    _expect_error_then_close(client, ErrorCode.TRUNCATED_FRAME)
    _assert_still_serving(broker)


def test_hello_must_come_first(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address, hello=False)
    client.send(frames.Status(3))
    _expect_error_then_close(client, ErrorCode.HELLO_REQUIRED)


def test_no_hello_in_time_is_told_before_the_close(broker: BrokerProcess) -> None:
    # The server closed such a connection without a word: the client could not tell it
    # from a crash. Now it gets HELLO_REQUIRED and a sentence, and only it is closed.
    client = WireClient(broker.client_address, hello=False)
    answer = client.receive(timeout_s=HANDSHAKE_TIMEOUT_S + 10)
    assert isinstance(answer, frames.Error), answer
    assert answer.code == ErrorCode.HELLO_REQUIRED, answer
    assert answer.request_id == 0
    assert "no HELLO within" in answer.message and "send HELLO" in answer.message
    assert client.receive() is codec.CLOSED
    _assert_still_serving(broker)


def test_hello_with_unsupported_version(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address, hello=False)
    client.send(frames.Hello(1, (7, 8), "future-client", None))
    error = _expect_error_then_close(client, ErrorCode.UNSUPPORTED_VERSION)
    assert "7" in error.message and "1" in error.message
    _assert_still_serving(broker)


def _item(
    topic: Any = "orders", payload: Any = b"p", delay: Any = 0, at: Any = None, ttl: Any = None
) -> list[Any]:
    return [topic, payload, delay, at, ttl]


ITEM_CASES = [
    pytest.param(_item(delay=-1), ErrorCode.INVALID_DELAY, id="negative-delay"),
    pytest.param(_item(ttl=0), ErrorCode.INVALID_TTL, id="zero-ttl"),
    pytest.param(_item(ttl=-5), ErrorCode.INVALID_TTL, id="negative-ttl"),
    pytest.param(_item(delay=TEN_YEARS_MS + 1), ErrorCode.DELAY_TOO_LARGE, id="delay-beyond-max"),
    pytest.param(_item(delay=2**63 - 1), ErrorCode.DUE_TIME_OVERFLOW, id="due-overflows-int64"),
    pytest.param(
        _item(delay=None, at=2**64 - 1),
        ErrorCode.DUE_TIME_OVERFLOW,
        id="deliver-at-overflows-int64",
    ),
    pytest.param(_item(delay=1.5), ErrorCode.INVALID_FIELD, id="float-delay"),
    pytest.param(_item(delay="5s"), ErrorCode.INVALID_FIELD, id="string-delay"),
    pytest.param(_item(ttl=2.5), ErrorCode.INVALID_FIELD, id="float-ttl"),
    pytest.param(_item(delay=True), ErrorCode.INVALID_FIELD, id="bool-delay"),
    pytest.param(_item(topic=""), ErrorCode.INVALID_TOPIC, id="empty-topic"),
    pytest.param(_item(topic="t" * 256), ErrorCode.INVALID_TOPIC, id="topic-over-255-bytes"),
    pytest.param(_item(topic="é" * 128), ErrorCode.INVALID_TOPIC, id="topic-over-255-utf8-bytes"),
    pytest.param(_item(topic="bad\ntopic"), ErrorCode.INVALID_TOPIC, id="topic-control-char"),
    pytest.param(_item(topic=5), ErrorCode.INVALID_FIELD, id="topic-not-string"),
    pytest.param(
        _item(payload=b"x" * (1024 * 1024 + 1)), ErrorCode.PAYLOAD_TOO_LARGE, id="payload-over-max"
    ),
    pytest.param(_item(payload="text"), ErrorCode.INVALID_FIELD, id="payload-not-binary"),
    pytest.param(_item(topic="orders.dlq"), ErrorCode.RESERVED_TOPIC, id="dead-letter-topic"),
    pytest.param(["orders", b"p"], ErrorCode.INVALID_FIELD, id="item-missing-fields"),
    pytest.param(_item(delay=5, at=1), ErrorCode.INVALID_DELAY, id="delay-and-deliver-at"),
]


@pytest.mark.parametrize(("bad", "code"), ITEM_CASES)
def test_bad_item_fails_whole_batch_with_its_index(
    broker: BrokerProcess, bad: list[Any], code: ErrorCode
) -> None:
    client = WireClient(broker.client_address)
    batch = [
        _item(topic="batch.topic"),
        _item(topic="batch.topic"),
        bad,
        _item(topic="batch.topic"),
    ]
    answer = client.publish(batch)
    assert isinstance(answer, frames.Error), answer
    assert answer.code == code, (ErrorCode(answer.code).name, answer.message)
    assert answer.item_index == 2
    assert answer.message
    # Nothing of the batch was written, and the same connection keeps working.
    assert client.group_pending("batch.topic", "default") is None
    assert isinstance(client.publish([_item(topic="batch.topic")]), frames.PublishOk)
    assert client.group_pending("batch.topic", "default") == 1


def test_empty_and_oversized_batches(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address)
    answer = client.publish([])
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.EMPTY_BATCH
    answer = client.publish([_item()] * 10_001)
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.BATCH_TOO_LARGE


def test_ack_of_unknown_and_foreign_tags(broker: BrokerProcess) -> None:
    owner = WireClient(broker.client_address)
    other = WireClient(broker.client_address)
    owner.subscribe("acks", "g", prefetch=10)
    assert isinstance(other.publish([["acks", b"m", 0, None, None]]), frames.PublishOk)
    (delivery,) = owner.deliveries(1)
    tag = delivery[0]

    answer = other.request(frames.Ack(other.next_id(), [tag]))
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.FOREIGN_DELIVERY_TAG
    assert answer.item_index == 0

    answer = owner.request(frames.Ack(owner.next_id(), [tag, b"\x00" * 24]))
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.UNKNOWN_DELIVERY_TAG
    assert answer.item_index == 1

    answer = owner.request(frames.Ack(owner.next_id(), [b"short"]))
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.UNKNOWN_DELIVERY_TAG

    # The same tag twice: the sentence says so (it said "already settled ... or never
    # delivered", which sent a careless client looking for the wrong fault).
    for request in (frames.Ack, frames.Release, lambda rid, tags: frames.Nack(rid, tags, 0)):
        answer = owner.request(request(owner.next_id(), [tag, tag]))
        assert isinstance(answer, frames.Error) and answer.code == ErrorCode.UNKNOWN_DELIVERY_TAG
        assert answer.item_index == 1
        assert "same delivery as tag 0" in answer.message, answer.message

    # The good tag was not consumed by the refused batches: it still acks.
    answer = owner.request(frames.Ack(owner.next_id(), [tag]))
    assert isinstance(answer, frames.Ok) and answer.result == 1
    answer = owner.request(frames.Ack(owner.next_id(), [tag]))
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.UNKNOWN_DELIVERY_TAG


def test_bad_subscribe_and_credit(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address)
    answer = client.request(frames.Subscribe(client.next_id(), "t", "g", 0))
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.INVALID_ARGUMENT
    answer = client.request(frames.Subscribe(client.next_id(), "t", "", 5))
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.INVALID_GROUP
    answer = client.request(frames.Unsubscribe(client.next_id(), 424242))
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.UNKNOWN_SUBSCRIPTION
    client.send(frames.Credit(client.next_id(), 424242, 5))
    answer = client.receive()
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.UNKNOWN_SUBSCRIPTION
    _assert_still_serving(broker)


def test_a_hello_with_thousands_of_versions_makes_short_answers_and_log_lines(
    broker: BrokerProcess,
) -> None:
    """Found by a breaker: the refusal's log line held the client's whole list of
    versions (a 63 KB line per HELLO, 3.8 MB of log in 10 s without a token); the ERROR
    frame was already cut at 1,000 characters."""
    versions = list(range(1000, 16_000))
    for _ in range(3):
        client = WireClient(broker.client_address, hello=False)
        client.send_raw(_frame([frames.FrameType.HELLO, 1, versions, "many", None]))
        answer = _expect_error_then_close(client, ErrorCode.UNSUPPORTED_VERSION)
        assert "(15000 versions)" in answer.message and len(answer.message) < 200, answer.message
        client.close()
    _assert_still_serving(broker)
    lines = [line for line in broker.stderr_text().splitlines() if "UNSUPPORTED_VERSION" in line]
    assert len(lines) == 3, lines
    assert all(len(line) < 1200 for line in lines), [len(line) for line in lines]
