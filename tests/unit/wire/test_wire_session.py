"""ServerSession and ClientSession: HELLO first, version negotiation, auth, frame
direction, ERROR frames, and the fuzz invariant through the session.

Source: ``docs/protocol.md``, "Connection setup".
"""

from __future__ import annotations

from typing import Any, cast

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from futureq.errors import (
    ErrorCode,
    LocalProtocolError,
    NotLeaderError,
    RemoteProtocolError,
    RequestError,
    error_from_code,
)
from futureq.wire import codec, frames, session
from futureq.wire.session import ClientSession, ServerSession, SessionState

MAX_FRAME_BYTES = 4096
TOKEN = "s3cret"
TAG = bytes(range(24))


def server(
    versions: frozenset[int] = frames.SUPPORTED_VERSIONS, token: str | None = None
) -> ServerSession:
    return ServerSession(MAX_FRAME_BYTES, versions, token)


def state(s: ServerSession | ClientSession) -> SessionState:
    """The state, read through a call so mypy does not narrow it across calls."""
    return s.state


def next_frame(s: ServerSession | ClientSession) -> frames.Frame:
    event = s.next_event()
    assert event is not session.NEED_DATA and event is not session.CLOSED
    return event


def refused(s: ServerSession | ClientSession, code: ErrorCode) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as info:
        s.next_event()
    assert info.value.code is code
    assert info.value.message
    assert s.state is SessionState.ERROR
    return info.value


def decode_one(data: bytes) -> frames.Frame:
    decoder = codec.FrameDecoder()
    decoder.receive_data(data)
    frame = decoder.next_frame()
    assert decoder.next_frame() is codec.NEED_DATA
    assert isinstance(frame, tuple(frames.FRAME_CLASSES.values()))
    return cast(frames.Frame, frame)


def handshake(
    s: ServerSession | None = None, c: ClientSession | None = None
) -> tuple[ServerSession, ClientSession]:
    s = s or server()
    c = c or ClientSession()
    s.receive_data(c.hello())
    assert isinstance(next_frame(s), frames.Hello)
    c.receive_data(s.accept_hello(3, "10.0.0.3:7450", "0.1.0"))
    assert isinstance(next_frame(c), frames.HelloOk)
    assert s.state is SessionState.READY and c.state is SessionState.READY
    return s, c


def send_raw(s: ServerSession, frame: frames.Frame) -> None:
    s.receive_data(codec.encode_frame(frame))


# --- handshake ------------------------------------------------------------------------


def test_handshake_back_to_back() -> None:
    s, c = server(token=TOKEN), ClientSession(token=TOKEN, client_name="unit")
    assert state(s) is SessionState.AWAIT_HELLO and state(c) is SessionState.START
    s.receive_data(c.hello())
    assert state(c) is SessionState.AWAIT_HELLO_OK
    hello = next_frame(s)
    assert hello == frames.Hello(1, (6, 5, 4, 3, 2, 1), "unit", TOKEN)
    assert s.version == 6 and state(s) is SessionState.AWAIT_HELLO
    hello_ok = s.accept_hello(
        3, "10.0.0.3:7450", "0.1.0", members=["10.0.0.3:7450", "h:1"], max_prefetch=100
    )
    assert decode_one(hello_ok) == frames.HelloOk(
        1, 6, 3, "10.0.0.3:7450", MAX_FRAME_BYTES, "0.1.0", 1, ("10.0.0.3:7450", "h:1"), 100
    )
    c.receive_data(hello_ok)
    assert next_frame(c) == c.hello_ok
    assert c.version == 6 and state(c) is SessionState.READY
    assert state(s) is SessionState.READY


def test_max_prefetch_goes_only_to_a_version_5_client() -> None:
    """HELLO_OK names ``limits.max_prefetch`` from version 5 on; a client of version 4
    decodes no more than 7 fields after the request id, so it gets exactly those."""
    for versions, wire in (
        ((1, 2, 3, 4), [2, 1, 4, 3, None, MAX_FRAME_BYTES, "0.1.0", 1, ["h:1"]]),
        ((1, 2, 3, 4, 5), [2, 1, 5, 3, None, MAX_FRAME_BYTES, "0.1.0", 1, ["h:1"], 100]),
    ):
        s, c = server(), ClientSession(versions=versions)
        s.receive_data(c.hello())
        next_frame(s)
        hello_ok = s.accept_hello(3, None, "0.1.0", members=["h:1"], max_prefetch=100)
        assert msgpack.unpackb(hello_ok[codec.HEADER_BYTES :]) == wire
        c.receive_data(hello_ok)
        answer = next_frame(c)
        assert isinstance(answer, frames.HelloOk)
        assert answer.max_prefetch == (100 if max(versions) == 5 else None)


def test_a_version_1_client_gets_the_version_1_hello_ok() -> None:
    """The dashboard and clients built before version 2 offer only 1: their HELLO_OK
    keeps its version 1 shape (no members, no shards on a node of one shard)."""
    s, c = server(), ClientSession(versions=(1,))
    s.receive_data(c.hello())
    assert next_frame(s) == frames.Hello(1, (1,), "", None)
    hello_ok = s.accept_hello(3, None, "0.1.0", members=["10.0.0.3:7450"])
    assert msgpack.unpackb(hello_ok[codec.HEADER_BYTES :]) == [
        2, 1, 1, 3, None, MAX_FRAME_BYTES, "0.1.0"
    ]  # fmt: skip
    c.receive_data(hello_ok)
    assert next_frame(c) == frames.HelloOk(1, 1, 3, None, MAX_FRAME_BYTES, "0.1.0")


@pytest.mark.parametrize("version", [2, 3])
def test_version_2_hello_ok_names_the_members_and_always_the_shards(version: int) -> None:
    s, c = server(), ClientSession(versions={1, version})
    s.receive_data(c.hello())
    next_frame(s)
    members = [f"10.0.0.{n}:7450" for n in range(frames.MAX_MEMBERS + 5)]
    hello_ok = s.accept_hello(3, None, "0.1.0", members=members)
    wire = msgpack.unpackb(hello_ok[codec.HEADER_BYTES :])
    assert wire[:7] == [2, 1, version, 3, None, MAX_FRAME_BYTES, "0.1.0"]
    assert wire[7] == 1 and wire[8] == members[: frames.MAX_MEMBERS]
    c.receive_data(hello_ok)
    assert next_frame(c).members == tuple(members[: frames.MAX_MEMBERS])


@pytest.mark.parametrize(
    ("ours", "theirs", "chosen"),
    [({1}, (1,), 1), ({1, 2, 3}, (2, 3, 4), 3), ({1, 2}, (1,), 1), ({2, 5}, (5, 2, 9), 5)],
)
def test_highest_common_version_is_chosen(
    ours: set[int], theirs: tuple[int, ...], chosen: int
) -> None:
    s = server(frozenset(ours))
    send_raw(s, frames.Hello(7, theirs))
    assert next_frame(s) == frames.Hello(7, theirs)
    answer = decode_one(s.accept_hello(1, None, "0.1.0"))
    assert isinstance(answer, frames.HelloOk)
    assert answer.version == chosen == s.version
    assert answer.request_id == 7


def test_client_offers_its_versions_highest_first() -> None:
    hello = decode_one(ClientSession(versions={1, 3, 2}).hello())
    assert isinstance(hello, frames.Hello)
    assert hello.versions == (3, 2, 1)


@pytest.mark.parametrize("theirs", [(7,), (0, 7, 8), ()], ids=["newer", "disjoint", "none"])
def test_unsupported_version(theirs: tuple[int, ...]) -> None:
    s = server()
    send_raw(s, frames.Hello(5, theirs))
    error = refused(s, ErrorCode.UNSUPPORTED_VERSION)
    assert "[1, 2, 3, 4, 5, 6]" in error.message
    answer = decode_one(s.error_bytes(error))
    assert answer == frames.Error(5, int(ErrorCode.UNSUPPORTED_VERSION), error.message)


@pytest.mark.parametrize(
    "first",
    [
        frames.Ping(1),
        frames.Publish(1, frames.AckLevel.LEADER, []),
        frames.Pong(1),
        frames.Status(9),
    ],
    ids=["ping", "publish", "server-only-pong", "status"],
)
def test_hello_required_first(first: frames.Frame) -> None:
    s = server()
    send_raw(s, first)
    error = refused(s, ErrorCode.HELLO_REQUIRED)
    answer = decode_one(s.error_bytes(error))
    assert isinstance(answer, frames.Error)
    assert answer.code == ErrorCode.HELLO_REQUIRED
    assert answer.request_id == first.request_id


@pytest.mark.parametrize(
    ("token", "ok"),
    [
        (TOKEN, True),
        (None, False),
        ("", False),
        ("s3cret ", False),
        ("S3CRET", False),
        ("ünï", False),
    ],
)
def test_auth_token(token: str | None, ok: bool) -> None:
    s = server(token=TOKEN)
    send_raw(s, frames.Hello(1, (1,), "", token))
    if ok:
        assert isinstance(next_frame(s), frames.Hello)
    else:
        error = refused(s, ErrorCode.AUTH_FAILED)
        assert TOKEN not in error.message


def test_no_token_configured_accepts_any_token() -> None:
    for token in (None, "anything"):
        s = server(token=None)
        send_raw(s, frames.Hello(1, (1,), "", token))
        assert isinstance(next_frame(s), frames.Hello)


def test_version_is_checked_before_the_token() -> None:
    s = server(token=TOKEN)
    send_raw(s, frames.Hello(1, (9,), "", "wrong"))
    refused(s, ErrorCode.UNSUPPORTED_VERSION)


def test_second_hello_is_invalid() -> None:
    s, c = handshake()
    s.receive_data(codec.encode_frame(frames.Hello(2, (1,))))
    refused(s, ErrorCode.INVALID_FRAME)


SERVER_ONLY: list[frames.Frame] = [
    frames.HelloOk(2, 1, 1, None, 1024, "x"),
    frames.PublishOk(2, 1, 1),
    frames.SubscribeOk(2, 1),
    frames.Deliver(0, 1, 1, []),
    frames.StatusOk(2, {}),
    frames.Error(2, 200, "m"),
    frames.Ok(2),
    frames.ClusterStatusOk(2, {}),
    frames.Revoke(0, 1, [], 1),
    frames.SubscriptionEnd(0, 1, 225, "deleted"),
    frames.SubscriptionInfo(0, 1, 1000, 3),
    frames.Handover(0, 1),
    frames.GoAway(0, 3, 301, "shutting down", None),
    frames.WatchUpdate(2, {}),
    frames.ItemResults(2, [0]),
    frames.BrowseOk(2, "g", [], None),
    frames.BrowseCountsOk(2, "g", [1], [0], 0, True),
    frames.SlotMapOk(2, {}),
]


def test_server_only_list_is_exactly_the_server_frame_types() -> None:
    assert {f.TYPE for f in SERVER_ONLY} == session.SERVER_ONLY_FRAME_TYPES
    assert session.SERVER_FRAME_TYPES | session.CLIENT_FRAME_TYPES == set(frames.FrameType)
    # Only the keepalive pair travels both ways.
    assert session.SERVER_FRAME_TYPES & session.CLIENT_FRAME_TYPES == {
        frames.FrameType.PING,
        frames.FrameType.PONG,
    }


def test_server_ping_and_client_pong_pass_the_sessions() -> None:
    s, c = handshake()
    c.receive_data(s.send(frames.Ping(0)))
    assert c.next_event() == frames.Ping(0)
    s.receive_data(c.send(frames.Pong(0)))
    assert next_frame(s) == frames.Pong(0)


@pytest.mark.parametrize("frame", SERVER_ONLY, ids=lambda f: f.TYPE.name)
def test_client_may_not_send_server_only_frames(frame: frames.Frame) -> None:
    s, _ = handshake()
    send_raw(s, frame)
    error = refused(s, ErrorCode.INVALID_FRAME)
    assert frame.TYPE.name in error.message


@pytest.mark.parametrize(
    "value",
    [
        [int(frames.FrameType.GOAWAY), 0, -1, "a", 1, 2],
        [int(frames.FrameType.GOAWAY), 0, 5],
        [int(frames.FrameType.DELIVER), 0, 1, 1, b"", 1],
        [int(frames.FrameType.PUBLISH_OK), 3, "x", 1],
    ],
    ids=["goaway-bad-fields", "goaway-too-few", "deliver-too-many", "publish-ok-bad-field"],
)
def test_a_server_only_frame_with_wrong_fields_is_told_it_is_server_only(value: Any) -> None:
    """Before: the client was told which field to fix (``GOAWAY frame: field
    'last_request_id' must be >= 0``), when what to fix is sending the frame at all."""
    s, _ = handshake()
    s.receive_data(_raw(value))
    error = refused(s, ErrorCode.INVALID_FRAME)
    name = frames.FrameType(value[0]).name
    assert error.message == f"{name} is a server-only frame type; clients may not send it"


# --- requests after the handshake -----------------------------------------------------


def test_pipelined_requests_come_out_in_order() -> None:
    s, c = handshake()
    requests: list[frames.Frame] = [
        frames.Publish(c.next_request_id(), frames.AckLevel.QUORUM, [["t", b"p", 0, None, None]]),
        frames.Subscribe(c.next_request_id(), "t", "g", 10),
        frames.Credit(0, 1, 5),
        frames.Ack(c.next_request_id(), [TAG]),
        frames.Ping(c.next_request_id()),
    ]
    s.receive_data(b"".join(c.send(r) for r in requests))
    assert [next_frame(s) for _ in requests] == requests
    assert [r.request_id for r in requests] == [2, 3, 0, 4, 5]  # HELLO took 1
    assert s.next_event() is session.NEED_DATA


def test_answers_reach_the_client() -> None:
    s, c = handshake()
    answers: list[frames.Frame] = [
        frames.PublishOk(2, 1 << 16, 1),
        frames.Deliver(0, 1, 1_767_225_600_000, [[TAG, 1 << 16, b"p", 1, 1, 1]]),
        frames.Pong(5),
    ]
    c.receive_data(b"".join(s.send(a) for a in answers))
    assert [next_frame(c) for _ in answers] == answers


def test_eof_closes_and_answers_may_still_be_sent() -> None:
    s, c = handshake()
    s.receive_data(c.send(frames.Ping(9)))
    s.receive_data(b"")
    assert next_frame(s) == frames.Ping(9)
    assert s.next_event() is session.CLOSED
    assert s.state is SessionState.CLOSED
    assert s.next_event() is session.CLOSED
    assert decode_one(s.send(frames.Pong(9))) == frames.Pong(9)


def test_eof_mid_frame_is_truncated() -> None:
    s, c = handshake()
    s.receive_data(c.send(frames.Ping(9))[:-1])
    s.receive_data(b"")
    error = refused(s, ErrorCode.TRUNCATED_FRAME)
    assert decode_one(s.error_bytes(error)) == frames.Error(0, 106, error.message)


def test_codec_errors_put_the_session_in_error() -> None:
    s, _ = handshake()
    s.receive_data((MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
    error = refused(s, ErrorCode.FRAME_TOO_LARGE)
    # Bytes that never formed a frame: the ERROR answers request id 0.
    answer = decode_one(s.error_bytes(error))
    assert isinstance(answer, frames.Error) and answer.request_id == 0


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"\xc1", ErrorCode.MALFORMED_FRAME),
        (msgpack.packb([99, 1]), ErrorCode.UNKNOWN_FRAME_TYPE),
        (msgpack.packb([int(frames.FrameType.PING), 1]) + b"\x00", ErrorCode.MALFORMED_FRAME),
        (msgpack.packb([int(frames.FrameType.CREDIT), "7", 1, 2]), ErrorCode.INVALID_FRAME),
        (msgpack.packb([int(frames.FrameType.DELIVER), 7, 1, 2, "x"]), ErrorCode.INVALID_FRAME),
        (msgpack.packb([int(frames.FrameType.HELLO), 7, [1], 5, None]), ErrorCode.INVALID_FRAME),
    ],
    ids=[
        "malformed",
        "unknown-type",
        "trailing-bytes",
        "str-request-id",
        "bad-server-only",
        "bad-second-hello",
    ],
)
def test_bad_frames_after_the_handshake(body: bytes, code: ErrorCode) -> None:
    s, _ = handshake()
    s.receive_data(len(body).to_bytes(4, "big") + body)
    refused(s, code)


def _raw(value: Any) -> bytes:
    body = msgpack.packb(value, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


@pytest.mark.parametrize(
    "value",
    [
        [int(frames.FrameType.CREDIT), 7, 1, 2.0],
        [int(frames.FrameType.CANCEL), 7, "t", None, "12"],
        [int(frames.FrameType.CANCEL), 7, "t", None, [1.0]],
        [int(frames.FrameType.ACK), 7, ["tag"]],
        [int(frames.FrameType.PUBLISH), 7, 2, {"items": []}],
        [int(frames.FrameType.PUBLISH), 7, 9, []],
        [int(frames.FrameType.BROWSE), 7, "t", None, None, None, "cursor", 10, 0],
        [int(frames.FrameType.SUBSCRIBE), 7, "t"],
    ],
    ids=[
        "float-credit",
        "str-ids",
        "float-ids",
        "str-tags",
        "map-items",
        "ack-level-9",
        "str-cursor",
        "missing-fields",
    ],
)
def test_a_request_with_wrong_fields_is_refused_alone(value: list[Any]) -> None:
    s, _ = handshake()
    s.receive_data(_raw(value) + codec.encode_frame(frames.Ping(8)))
    event = s.next_event()
    assert isinstance(event, session.RefusedRequest), event
    assert event.request_id == 7 and event.frame_type == value[0]
    assert event.error.code is ErrorCode.INVALID_FIELD
    assert frames.FrameType(value[0]).name in event.error.message
    answer = decode_one(s.error_bytes(event.error, event.request_id))
    assert isinstance(answer, frames.Error) and answer.request_id == 7
    assert answer.code == ErrorCode.INVALID_FIELD
    # The stream is still in step: the next frame decodes, the session serves on.
    assert next_frame(s) == frames.Ping(8)
    assert s.state is SessionState.READY


def test_wrong_fields_before_the_handshake_or_from_a_server_still_close() -> None:
    s = server()
    s.receive_data(_raw([int(frames.FrameType.HELLO), 1, "1", "x", None]))
    refused(s, ErrorCode.INVALID_FRAME)
    _, c = handshake()
    c.receive_data(_raw([int(frames.FrameType.OK), 5, "one"]))
    refused(c, ErrorCode.INVALID_FRAME)


def test_session_refuses_use_after_an_error() -> None:
    s = server()
    send_raw(s, frames.Ping(1))
    refused(s, ErrorCode.HELLO_REQUIRED)
    with pytest.raises(RuntimeError):
        s.next_event()
    with pytest.raises(RuntimeError):
        s.receive_data(b"\x00")
    with pytest.raises(RuntimeError):
        s.send(frames.Pong(1))
    with pytest.raises(RuntimeError):
        s.accept_hello(1, None, "0.1.0")


def test_order_of_calls_is_enforced() -> None:
    s = server()
    with pytest.raises(RuntimeError):
        s.accept_hello(1, None, "0.1.0")
    with pytest.raises(RuntimeError):
        s.send(frames.Pong(1))
    send_raw(s, frames.Hello(1, (1,)))
    send_raw(s, frames.Ping(2))
    assert isinstance(next_frame(s), frames.Hello)
    with pytest.raises(RuntimeError):
        s.next_event()  # the HELLO must be answered first
    s.accept_hello(1, None, "0.1.0")
    with pytest.raises(RuntimeError):
        s.accept_hello(1, None, "0.1.0")
    assert next_frame(s) == frames.Ping(2)


def test_server_may_not_send_client_frames() -> None:
    s, _ = handshake()
    for frame in (
        frames.Status(1),
        frames.Hello(1, (1,)),
        frames.HelloOk(1, 1, 1, None, 1, ""),
        frames.Publish(1, frames.AckLevel.NONE, []),
    ):
        with pytest.raises(LocalProtocolError) as info:
            s.send(frame)
        assert info.value.code is ErrorCode.INVALID_FRAME
    assert s.state is SessionState.READY


def test_oversized_answer_is_a_local_error_and_leaves_the_session_usable() -> None:
    s, _ = handshake()
    big = frames.Deliver(0, 1, 1, [[TAG, 1, b"x" * MAX_FRAME_BYTES, 1, 1, 1]])
    with pytest.raises(LocalProtocolError) as info:
        s.send(big)
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE
    assert s.state is SessionState.READY
    assert decode_one(s.send(frames.Pong(1))) == frames.Pong(1)


# --- ERROR frames ---------------------------------------------------------------------


def test_request_error_fails_one_request_only() -> None:
    s, _ = handshake()
    exc = RequestError(ErrorCode.PAYLOAD_TOO_LARGE, "payload is 2000000 bytes", item_index=3)
    answer = decode_one(s.error_bytes(exc, 17))
    assert answer == frames.Error(17, 203, "payload is 2000000 bytes", 3, None)
    assert s.state is SessionState.READY
    rebuilt = error_from_code(203, "payload is 2000000 bytes", 3)
    assert isinstance(rebuilt, RequestError) and rebuilt.item_index == 3


@pytest.mark.parametrize("leader", ["10.0.0.2:7450", None])
def test_not_leader_carries_the_leader_address(leader: str | None) -> None:
    s, _ = handshake()
    answer = decode_one(s.error_bytes(NotLeaderError(leader), 4))
    assert isinstance(answer, frames.Error)
    assert (answer.request_id, answer.code, answer.item_index, answer.leader_address) == (
        4,
        300,
        None,
        leader,
    )
    rebuilt = error_from_code(answer.code, answer.message, answer.item_index, answer.leader_address)
    assert isinstance(rebuilt, NotLeaderError) and rebuilt.leader_address == leader
    assert s.state is SessionState.READY


def test_protocol_error_from_the_gateway_closes_the_session() -> None:
    s, _ = handshake()
    s.error_bytes(RemoteProtocolError(ErrorCode.INVALID_FRAME, "bad"), 3)
    assert s.state is SessionState.ERROR


def test_long_error_messages_are_cut_to_fit() -> None:
    s, _ = handshake()
    answer = decode_one(s.error_bytes(RequestError(ErrorCode.INVALID_ARGUMENT, "x" * 100_000), 1))
    assert isinstance(answer, frames.Error)
    assert len(answer.message) == session.MAX_ERROR_MESSAGE_CHARS
    assert answer.message.endswith("...")


# --- client side ----------------------------------------------------------------------


def test_client_order_of_calls() -> None:
    c = ClientSession()
    with pytest.raises(RuntimeError):
        c.next_event()
    with pytest.raises(RuntimeError):
        c.send(frames.Ping(1))
    c.hello()
    with pytest.raises(RuntimeError):
        c.hello()
    with pytest.raises(RuntimeError):
        c.send(frames.Ping(2))  # not before HELLO_OK
    assert c.next_event() is session.NEED_DATA


def test_client_sees_error_instead_of_hello_ok() -> None:
    s, c = server(token=TOKEN), ClientSession(token="wrong")
    s.receive_data(c.hello())
    error = refused(s, ErrorCode.AUTH_FAILED)
    c.receive_data(s.error_bytes(error))
    answer = next_frame(c)
    assert isinstance(answer, frames.Error) and answer.request_id == 1
    rebuilt = error_from_code(answer.code, answer.message)
    assert isinstance(rebuilt, RemoteProtocolError) and rebuilt.code is ErrorCode.AUTH_FAILED
    assert c.state is SessionState.AWAIT_HELLO_OK


def answer_client(c: ClientSession, frame: frames.Frame) -> None:
    c.receive_data(codec.encode_frame(frame))


def test_client_refuses_a_version_it_did_not_offer() -> None:
    c = ClientSession(versions={1})
    c.hello()
    answer_client(c, frames.HelloOk(1, 2, 1, None, 1024, "9.0"))
    refused(c, ErrorCode.UNSUPPORTED_VERSION)


def test_client_refuses_anything_but_hello_ok_or_error_first() -> None:
    c = ClientSession()
    c.hello()
    answer_client(c, frames.Pong(1))
    refused(c, ErrorCode.INVALID_FRAME)


def test_client_refuses_a_second_hello_ok() -> None:
    _, c = handshake()
    answer_client(c, frames.HelloOk(1, 1, 1, None, 1024, "0.1.0"))
    refused(c, ErrorCode.INVALID_FRAME)


@pytest.mark.parametrize(
    "frame",
    [frames.Hello(0, (1,)), frames.Status(0), frames.Ack(0, [TAG]), frames.Credit(0, 1, 1)],
    ids=lambda f: f.TYPE.name,
)
def test_client_refuses_client_only_frames_from_the_server(frame: frames.Frame) -> None:
    _, c = handshake()
    answer_client(c, frame)
    refused(c, ErrorCode.INVALID_FRAME)


def test_client_may_not_send_server_frames() -> None:
    _, c = handshake()
    for frame in [*SERVER_ONLY, frames.Hello(9, (1,))]:
        with pytest.raises(LocalProtocolError):
            c.send(frame)


def test_client_holds_its_frames_to_the_server_limit() -> None:
    s = ServerSession(100, {1}, None)
    s2, c = handshake(s, ClientSession(max_frame_bytes=10_000))
    assert c.hello_ok is not None and c.hello_ok.max_frame_bytes == 100
    with pytest.raises(LocalProtocolError) as info:
        c.send(frames.Ack(c.next_request_id(), [TAG] * 10))
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE
    assert c.state is SessionState.READY


def test_empty_version_sets_are_refused_at_construction() -> None:
    with pytest.raises(ValueError):
        ServerSession(1024, set(), None)
    with pytest.raises(ValueError):
        ClientSession(versions=())


def test_negotiate_version() -> None:
    assert session.negotiate_version({1, 2}, [2, 3]) == 2
    assert session.negotiate_version({1}, []) is None


# --- fuzz: any bytes through a session decode or raise RemoteProtocolError ------------


def drain(s: ServerSession | ClientSession) -> bool:
    """Read events until NEED_DATA/CLOSED; True once a RemoteProtocolError came out."""
    try:
        while True:
            event = s.next_event()
            if event is session.NEED_DATA or event is session.CLOSED:
                return False
            if isinstance(s, ServerSession) and isinstance(event, frames.Hello):
                s.accept_hello(1, None, "0.1.0")
    except RemoteProtocolError as exc:
        assert exc.code.closes_connection
        assert s.state is SessionState.ERROR
        if isinstance(s, ServerSession):
            s.error_bytes(exc)  # an ERROR frame can always be built
        return True


SAMPLE_FRAMES: list[frames.Frame] = [
    frames.Hello(1, (1,)),
    frames.Hello(1, (2,)),
    frames.Ping(2),
    frames.Pong(2),
    frames.Publish(3, frames.AckLevel.LEADER, [["t", b"p", 1, None, None]]),
    frames.HelloOk(1, 1, 1, None, 1024, ""),
    frames.Deliver(0, 1, 1, []),
    frames.Error(1, 107, "no"),
]
FRAME_BYTES = st.sampled_from([codec.encode_frame(f) for f in SAMPLE_FRAMES])
SESSION_STREAM = st.lists(
    st.one_of(
        FRAME_BYTES,
        st.binary(max_size=12),
        st.binary(max_size=20).map(lambda b: len(b).to_bytes(4, "big") + b),
    ),
    max_size=6,
).map(b"".join)


@settings(derandomize=True, database=None, deadline=None, max_examples=300)
@given(st.booleans(), SESSION_STREAM, st.integers(1, 16), st.booleans())
def test_any_bytes_through_a_session(
    client_side: bool, data: bytes, chunk_bytes: int, eof: bool
) -> None:
    s: Any
    if client_side:
        s = ClientSession()
        s.hello()
    else:
        s = server()
    for start in range(0, len(data), chunk_bytes):
        s.receive_data(data[start : start + chunk_bytes])
        if drain(s):
            return
    if eof:
        s.receive_data(b"")
        drain(s)


def _framed(value: object) -> bytes:
    body = msgpack.packb(value)
    return len(body).to_bytes(4, "big") + body


TOO_MANY_ARRAYS = [int(frames.FrameType.PUBLISH), 7, 2, [[]] * 11]
"""A PUBLISH of more arrays than a session bounded at 10 takes."""


def test_a_request_of_too_many_arrays_is_refused_alone() -> None:
    # A CANCEL of 100,000 ids closed the client's connection with MALFORMED_FRAME; the
    # frame was consumed whole, so only that request fails.
    s, _ = handshake(
        ServerSession(MAX_FRAME_BYTES, frames.SUPPORTED_VERSIONS, None, max_containers=10)
    )
    s.receive_data(_framed(TOO_MANY_ARRAYS) + codec.encode_frame(frames.Ping(8)))
    event = s.next_event()
    assert isinstance(event, session.RefusedRequest), event
    assert event.request_id == 7 and event.error.code is ErrorCode.BATCH_TOO_LARGE
    assert "split the request" in event.error.message
    assert s.state is SessionState.READY
    assert isinstance(next_frame(s), frames.Ping)


def test_too_many_arrays_before_hello_is_a_protocol_error() -> None:
    s = ServerSession(MAX_FRAME_BYTES, frames.SUPPORTED_VERSIONS, None, max_containers=10)
    s.receive_data(_framed(TOO_MANY_ARRAYS))
    refused(s, ErrorCode.MALFORMED_FRAME)
