"""Wrong-typed fields from a client that is not the library, against a real server.

Every client request frame type is sent with each field replaced by a value of a wrong
type (and with a field missing or one too many). Each must fail alone: an ERROR
``INVALID_FIELD`` (200) on its request id naming the frame and the field, the connection
still serving (a PING after it answers), and a delivery the connection holds still held
(no REVOKE, no redelivery; its ACK succeeds at the end). Only bytes that are not a frame
(not msgpack, oversized, no request id to answer to) close the connection.

Source: ``docs/protocol.md``, "Frames" and "Error codes".
"""

from __future__ import annotations

from typing import Any

import msgpack
from broker_process import BrokerProcess
from wire_client import WireClient

from futureq.errors import ErrorCode
from futureq.wire import codec, frames
from futureq.wire.session import CLIENT_FRAME_TYPES

T = frames.FrameType

VALID_FIELDS: dict[T, list[Any]] = {
    T.PUBLISH: [2, [["bf.t", b"x", 0, None, None]]],
    T.SUBSCRIBE: ["bf.t", "g2", 10],
    T.ACK: [[b"tag"]],
    T.NACK: [[b"tag"], 0],
    T.CREDIT: [1, 1],
    T.STATUS: [],
    T.UNSUBSCRIBE: [1],
    T.PING: [],
    T.GROUP_CREATE: ["bf.t", "g3", None, None],
    T.GROUP_DELETE: ["bf.t", "g3"],
    T.CLUSTER_STATUS: [],
    T.CLUSTER_ADD_NODE: [2, "127.0.0.1:1", "127.0.0.1:2"],
    T.CLUSTER_REMOVE_NODE: [2],
    T.CLUSTER_TRANSFER_LEADER: [None],
    T.EXTEND: [[b"tag"], 1000],
    T.RELEASE: [[b"tag"]],
    T.WATCH: [1000],
    T.UNWATCH: [],
    T.CANCEL: ["bf.t", None, [1]],
    T.BROWSE: ["bf.t", None, None, None, None, 10, 0],
    T.REDRIVE: ["bf.t", None, [1], 0],
    T.RESCHEDULE: ["bf.t", None, [1], None, 1000],
    T.PURGE: ["bf.t", None],
    T.BROWSE_COUNTS: ["bf.t", None, [1], True],
    T.SLOT_MAP: [],
}
"""A well-formed field list (after type and request id) for every client request type."""


def _wrong_values(value: Any) -> list[Any]:
    """Values of a type the field does not take (msgpack cannot tell int from bool in
    Python only through ``type``; floats, strings and maps are what other clients send)."""
    if type(value) is bool:
        return [1, "true"]
    if type(value) is int:
        return ["1", 1.5, True, [1]]
    if type(value) is str:
        return [7, b"bytes", ["x"]]
    if type(value) is bytes:
        return ["x", 3]
    if type(value) is list:
        wrong: list[Any] = [{"a": 1}, "x", 1]
        if value and type(value[0]) is int:
            wrong += [["1"], [1.5], [True]]
        elif value and type(value[0]) is bytes:
            wrong += [["x"], [1]]
        elif value and type(value[0]) is list:
            wrong += [[5], [{"topic": "bf.t"}]]
            # The inner array's first field as an array and as a map (unhashable): a
            # PUBLISH item whose topic is one once raised TypeError in validation.
            first = value[0]
            wrong += [[[[first[0]], *first[1:]]], [[{"a": 1}, *first[1:]]]]
        if value:
            wrong += [[[value[0]]], [{"a": 1}]]  # an element as an array, as a map
        return wrong
    assert value is None, value
    return [1.5, {"a": 1}, [b"x"]]


def _cases() -> list[tuple[str, T, list[Any]]]:
    cases: list[tuple[str, T, list[Any]]] = []
    for frame_type, fields in VALID_FIELDS.items():
        for i, value in enumerate(fields):
            for wrong in _wrong_values(value):
                changed = [*fields[:i], wrong, *fields[i + 1 :]]
                cases.append((f"{frame_type.name}[{i}]={wrong!r}", frame_type, changed))
        if fields:
            cases.append((f"{frame_type.name} missing a field", frame_type, fields[:-1]))
        cases.append((f"{frame_type.name} one field too many", frame_type, [*fields, "extra"]))
    return cases


def _raw(value: list[Any]) -> bytes:
    body = msgpack.packb(value, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


def _answer(client: WireClient) -> Any:
    """The next answer; DELIVER and notice pushes are kept aside (they must stay empty)."""
    while True:
        frame = client.receive(10.0)
        if isinstance(frame, frames.Deliver):
            client.pushed.append(frame)
        elif isinstance(frame, frames.SubscriptionInfo | frames.Revoke | frames.SubscriptionEnd):
            client.notices.append(frame)
        else:
            return frame


def test_every_request_type_covered() -> None:
    requests = CLIENT_FRAME_TYPES - {T.HELLO, T.PONG}
    assert set(VALID_FIELDS) == requests, sorted(t.name for t in requests ^ set(VALID_FIELDS))


def test_each_wrong_field_fails_its_request_alone(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address)
    client.subscribe("bf.held", "g", prefetch=10)
    assert isinstance(client.publish([["bf.held", b"held", 0, None, None]]), frames.PublishOk)
    held = client.deliveries(1)
    tag = held[0][0]
    infos = [n for n in client.notices if isinstance(n, frames.SubscriptionInfo)]
    client.notices[:] = infos

    failures: list[str] = []
    cases = _cases()
    assert len(cases) > 150
    for name, frame_type, fields in cases:
        rid = client.next_id()
        client.send_raw(_raw([int(frame_type), rid, *fields]))
        answer = _answer(client)
        if answer is codec.CLOSED:
            failures.append(f"{name}: the server closed the connection")
            break
        if (
            not isinstance(answer, frames.Error)
            or answer.request_id != rid
            or answer.code != ErrorCode.INVALID_FIELD
            # A bad PUBLISH item is named by its item_index instead (validation.py).
            or (frame_type.name not in answer.message and answer.item_index is None)
        ):
            failures.append(f"{name}: {answer}")
            continue
        ping = client.next_id()
        client.send(frames.Ping(ping))
        pong = _answer(client)
        if pong != frames.Pong(ping):
            failures.append(f"{name}: PING after it got {pong}")
            break
    assert not failures, "\n".join(failures[:20])

    # The held delivery was neither taken back nor delivered again: the ACK settles it.
    assert not client.pushed, client.pushed
    assert not [n for n in client.notices if isinstance(n, frames.Revoke)], client.notices
    ack = client.request(frames.Ack(client.next_id(), [tag]))
    assert ack == frames.Ok(ack.request_id, 1), ack


def test_bytes_that_are_no_request_still_close(broker: BrokerProcess) -> None:
    """No request id to answer to: INVALID_FRAME, then the connection closes."""
    for value in ([int(T.CANCEL), "7", "t", None, [1]], [int(T.CANCEL), -1, "t", None, [1]]):
        client = WireClient(broker.client_address)
        client.send_raw(_raw(value))
        answer = client.receive()
        assert isinstance(answer, frames.Error) and answer.code == ErrorCode.INVALID_FRAME, answer
        assert answer.request_id == 0
        assert client.receive() is codec.CLOSED
