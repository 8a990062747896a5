"""FrameDecoder and encode_frame: bad bytes, each with its exact ErrorCode, and the fuzz
invariant (h11's): any byte string decodes or raises RemoteProtocolError, nothing else.

Source: ``docs/protocol.md``, "Framing".
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from futureq.errors import ErrorCode, FrameFieldsError, LocalProtocolError, RemoteProtocolError
from futureq.wire import codec, frames

FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=500)

PING = codec.encode_frame(frames.Ping(1))


def framed(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def raises_code(decoder: codec.FrameDecoder, code: ErrorCode) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_frame()
    assert info.value.code is code
    assert info.value.message
    return info.value


def decoder_with(
    data: bytes, *, eof: bool = False, max_frame_bytes: int = 1024
) -> codec.FrameDecoder:
    decoder = codec.FrameDecoder(max_frame_bytes)
    decoder.receive_data(data)
    if eof:
        decoder.receive_data(b"")
    return decoder


# --- framing -----------------------------------------------------------------------------


def test_header_is_four_byte_big_endian_body_length() -> None:
    body = msgpack.packb([int(frames.FrameType.PING), 1])
    assert PING == b"\x00\x00\x00\x03" + body


def test_empty_stream_then_eof_is_closed() -> None:
    decoder = codec.FrameDecoder()
    assert decoder.next_frame() is codec.NEED_DATA
    decoder.receive_data(b"")
    assert decoder.next_frame() is codec.CLOSED
    assert decoder.next_frame() is codec.CLOSED
    decoder.receive_data(b"")  # a second EOF is harmless


def test_data_after_eof_is_refused() -> None:
    decoder = decoder_with(b"", eof=True)
    with pytest.raises(RuntimeError):
        decoder.receive_data(PING)


def test_frame_of_exactly_max_frame_bytes_is_accepted() -> None:
    frame = frames.Ack(1, [b"x" * 100])
    body = codec.encode_frame(frame)[4:]
    decoder = decoder_with(framed(body), max_frame_bytes=len(body))
    assert decoder.next_frame() == frame
    assert codec.encode_frame(frame, max_frame_bytes=len(body)) == framed(body)


def test_oversized_frame_is_refused_from_its_header_alone() -> None:
    # Only the header has arrived: the decoder refuses before any body is buffered.
    decoder = decoder_with((1025).to_bytes(4, "big"), max_frame_bytes=1024)
    error = raises_code(decoder, ErrorCode.FRAME_TOO_LARGE)
    assert "1025" in error.message and "1024" in error.message
    assert decoder.buffered_bytes == 4


def test_oversized_frame_after_good_frames() -> None:
    decoder = decoder_with(PING + PING + b"\xff\xff\xff\xff", max_frame_bytes=1024)
    assert decoder.next_frame() == frames.Ping(1)
    assert decoder.next_frame() == frames.Ping(1)
    raises_code(decoder, ErrorCode.FRAME_TOO_LARGE)


def test_default_limit_is_four_mebibytes() -> None:
    assert codec.FrameDecoder().max_frame_bytes == codec.DEFAULT_MAX_FRAME_BYTES == 4 * 1024 * 1024
    raises_code(
        decoder_with((4 * 1024 * 1024 + 1).to_bytes(4, "big"), max_frame_bytes=4 * 1024 * 1024),
        ErrorCode.FRAME_TOO_LARGE,
    )


def test_encoding_an_oversized_frame_is_a_local_error() -> None:
    with pytest.raises(LocalProtocolError) as info:
        codec.encode_frame(frames.Ack(1, [b"x" * 2000]), max_frame_bytes=1024)
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE


def test_encoding_an_unpackable_field_is_a_local_error() -> None:
    with pytest.raises(LocalProtocolError) as info:
        codec.encode_frame(frames.Publish(1, frames.AckLevel.LEADER, [object()]))
    assert info.value.code is ErrorCode.INVALID_FRAME


def test_zero_length_frame_is_malformed() -> None:
    raises_code(decoder_with(b"\x00\x00\x00\x00"), ErrorCode.MALFORMED_FRAME)


@pytest.mark.parametrize("cut", [1, 2, 3], ids=lambda c: f"{c}-header-bytes")
def test_eof_inside_the_header_is_truncated(cut: int) -> None:
    raises_code(decoder_with(PING[:cut], eof=True), ErrorCode.TRUNCATED_FRAME)


def test_eof_inside_the_body_is_truncated() -> None:
    frame = codec.encode_frame(frames.Subscribe(4, "orders", "billing", 10))
    decoder = decoder_with(PING + frame[:-1], eof=True)
    assert decoder.next_frame() == frames.Ping(1)
    error = raises_code(decoder, ErrorCode.TRUNCATED_FRAME)
    assert str(len(frame) - 1) in error.message


def test_partial_frame_without_eof_needs_data() -> None:
    assert decoder_with(PING[:-1]).next_frame() is codec.NEED_DATA


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # the one byte msgpack never uses
        b"\x92\x10",  # array of 2 with one element: the body ends inside the value
        b"\x92\x10\xa3ab",  # a string cut short
        b"\x93\x10\x01\xa2\xff\xfe",  # invalid UTF-8 in a str
        b"\x93\x10\x01\x81\x01\x02",  # map with an integer key
        b"\x93\x10\x01\x81\x90\x02",  # map with an array key
        b"\x93\x10\x01\xd4\xff\x00",  # timestamp extension of a bad length
        b"\x91" * 5000 + b"\xc0",  # nested deeper than msgpack's stack
        b"\x92\x10\xdd\xff\xff\xff\xff",  # array announcing 4 billion elements
    ],
    ids=[
        "reserved-byte",
        "short-array",
        "short-string",
        "bad-utf8",
        "int-map-key",
        "array-map-key",
        "bad-timestamp",
        "too-deep",
        "huge-array-header",
    ],
)
def test_malformed_msgpack(body: bytes) -> None:
    raises_code(decoder_with(framed(body), max_frame_bytes=10_000), ErrorCode.MALFORMED_FRAME)


def test_trailing_bytes_inside_a_frame_are_malformed() -> None:
    body = msgpack.packb([int(frames.FrameType.PING), 1]) + b"\xc0"
    error = raises_code(decoder_with(framed(body)), ErrorCode.MALFORMED_FRAME)
    assert "more than one" in error.message


def test_two_values_in_one_frame_are_malformed() -> None:
    body = msgpack.packb([int(frames.FrameType.PING), 1]) * 2
    raises_code(decoder_with(framed(body)), ErrorCode.MALFORMED_FRAME)


def test_unknown_frame_type() -> None:
    raises_code(decoder_with(framed(msgpack.packb([99, 1]))), ErrorCode.UNKNOWN_FRAME_TYPE)


def test_body_that_is_not_an_array() -> None:
    raises_code(decoder_with(framed(msgpack.packb({"type": 16}))), ErrorCode.INVALID_FRAME)


def test_wrong_field_type_through_the_decoder() -> None:
    body = msgpack.packb([int(frames.FrameType.SUBSCRIBE), 4, "orders", "billing", 10.0])
    raises_code(decoder_with(framed(body)), ErrorCode.INVALID_FRAME)


def test_decoder_refuses_use_after_an_error() -> None:
    decoder = decoder_with(b"\x00\x00\x00\x00" + PING)
    raises_code(decoder, ErrorCode.MALFORMED_FRAME)
    with pytest.raises(RuntimeError):
        decoder.next_frame()
    with pytest.raises(RuntimeError):
        decoder.receive_data(PING)


def test_raw_mode_returns_the_msgpack_value() -> None:
    decoder = codec.FrameDecoder(parse=False)
    decoder.receive_data(codec.encode_value({"term": 3, "entries": [b"x"]}) + PING)
    assert decoder.next_frame() == {"term": 3, "entries": [b"x"]}
    assert decoder.next_frame() == [int(frames.FrameType.PING), 1]


def test_max_frame_bytes_must_be_positive() -> None:
    with pytest.raises(ValueError):
        codec.FrameDecoder(0)


def test_many_small_frames_do_not_grow_the_buffer_without_bound() -> None:
    decoder = codec.FrameDecoder()
    for _ in range(5000):
        decoder.receive_data(PING)
        assert decoder.next_frame() == frames.Ping(1)
    assert decoder.buffered_bytes == 0
    assert len(decoder._buffer) <= 65536 + len(PING)


# --- fuzz invariant ------------------------------------------------------------------


def drain(decoder: codec.FrameDecoder) -> bool:
    """Read until NEED_DATA/CLOSED; only frames or RemoteProtocolError may come out.

    Returns:
        True if the decoder raised RemoteProtocolError (and is now unusable).
    """
    try:
        while True:
            event = decoder.next_frame()
            if event is codec.NEED_DATA or event is codec.CLOSED:
                return False
            assert isinstance(event, tuple(frames.FRAME_CLASSES.values()))
    except RemoteProtocolError as exc:
        assert isinstance(exc.code, ErrorCode)
        assert exc.code.closes_connection
        return True


MSGPACK_VALUE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=15,
)
# Bodies that get past the framing: packed msgpack values (often frame-shaped), raw bytes
# that start like a frame array, and plain noise.
PACKED = st.one_of(
    MSGPACK_VALUE.map(msgpack.packb),
    st.tuples(st.integers(0, 20), st.integers(0, 5), st.lists(MSGPACK_VALUE, max_size=5)).map(
        lambda t: msgpack.packb([t[0], t[1], *t[2]])
    ),
    st.tuples(st.integers(0x90, 0x97), st.integers(0, 20), st.binary(max_size=30)).map(
        lambda t: bytes([t[0], t[1]]) + t[2]
    ),
    st.binary(max_size=40),
)
STREAM = st.lists(
    st.one_of(PACKED.map(framed), st.binary(max_size=12), st.just(PING)), max_size=6
).map(b"".join)


@FUZZ
@given(STREAM, st.booleans(), st.integers(1, 8))
def test_any_bytes_decode_or_raise_remote_protocol_error(
    data: bytes, eof: bool, chunk_bytes: int
) -> None:
    # Fed whole.
    decoder = codec.FrameDecoder(256)
    decoder.receive_data(data)
    if eof:
        decoder.receive_data(b"")
    drain(decoder)
    # Fed in small chunks, draining after each.
    decoder = codec.FrameDecoder(256)
    for start in range(0, len(data), chunk_bytes):
        decoder.receive_data(data[start : start + chunk_bytes])
        if drain(decoder):
            return
    if eof:
        decoder.receive_data(b"")
        drain(decoder)


@FUZZ
@given(st.binary(max_size=200), st.sampled_from([None, 1, 4]))
def test_pure_noise_decodes_or_raises_remote_protocol_error(
    data: bytes, max_containers: int | None
) -> None:
    decoder = codec.FrameDecoder(64, max_containers=max_containers)
    decoder.receive_data(data)
    decoder.receive_data(b"")
    drain(decoder)


def bounded(body: bytes, max_containers: int) -> codec.FrameDecoder:
    decoder = codec.FrameDecoder(1 << 20, max_containers=max_containers)
    decoder.receive_data(framed(body))
    return decoder


def test_a_frame_of_more_arrays_and_maps_than_allowed_is_refused() -> None:
    # A 4 MiB frame of empty arrays once took a server from 60 MB to 390 MB as it was
    # decoded (one byte on the wire, some 60 bytes each in memory). A frame whose type
    # and request id come first is refused alone (BATCH_TOO_LARGE, its request id: the
    # stream is still in step); one without them is malformed.
    publish = [int(frames.FrameType.PUBLISH), 1, 2]
    within = msgpack.packb([*publish, [[]] * 8])  # the frame's own array and 9 more
    assert isinstance(bounded(within, 10).next_frame(), frames.Publish)
    too_many = msgpack.packb([*publish, [[]] * 9])
    error = raises_code(bounded(too_many, 10), ErrorCode.BATCH_TOO_LARGE)
    assert "more than 10 arrays and maps" in error.message
    assert isinstance(error, FrameFieldsError) and error.request_id == 1
    assert error.frame_type == frames.FrameType.PUBLISH
    maps = msgpack.packb([*publish, [{}] * 9])
    raises_code(bounded(maps, 10), ErrorCode.BATCH_TOO_LARGE)
    # One array longer than the bound is refused from its header, before its items.
    long_array = msgpack.packb([*publish, list(range(11))])
    raises_code(bounded(long_array, 10), ErrorCode.BATCH_TOO_LARGE)
    # The decoder goes on with the next frame.
    decoder = bounded(long_array, 10)
    decoder.receive_data(framed(within))
    raises_code(decoder, ErrorCode.BATCH_TOO_LARGE)
    assert isinstance(decoder.next_frame(), frames.Publish)
    # No frame type and request id to answer to: malformed, as before.
    for headless in (
        msgpack.packb([[[]] * 11]),
        msgpack.packb(["x", 1, [[]] * 11]),
        msgpack.packb([999, 1, [[]] * 11]),
        msgpack.packb([list(range(11))]),
    ):
        raises_code(bounded(headless, 10), ErrorCode.MALFORMED_FRAME)
    # Without a bound (a client's decoder, raft links) only the frame size counts.
    unbounded = codec.FrameDecoder(1 << 20)
    unbounded.receive_data(framed(too_many) + framed(long_array))
    assert unbounded.next_frame() is not codec.NEED_DATA


def test_a_bounded_decoder_keeps_msgpacks_own_sentences() -> None:
    error = raises_code(bounded(b"\xdd\xff\xff\xff\xff", 1 << 20), ErrorCode.MALFORMED_FRAME)
    assert "an array header says it holds 4294967295 items" in error.message
    raises_code(bounded(b"\x91" * 3000 + b"\x00", 1 << 20), ErrorCode.MALFORMED_FRAME)


def test_the_largest_publish_with_headers_fits_the_bound_for_its_batch_size() -> None:
    items = [["t", b"", None, None, None, {"h": "v"}, None]] * 100
    body = msgpack.packb([int(frames.FrameType.PUBLISH), 1, 2, items])
    frame = bounded(body, codec.request_containers(100)).next_frame()
    assert isinstance(frame, frames.Publish)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\xc1", "begins no msgpack value"),
        (b"\x91" * 3000 + b"\x00", "nested too deeply"),
        (b"\x81\xc0\x01", "a map key is nil"),
        (b"\x81\x01\x01", "a map key is an integer"),
        (b"\x81\x91\x01\x01", "a map key is an array"),
        (b"\xa2\xff\xfe", "not valid UTF-8 (byte 0xff)"),
        (b"\xdd\xff\xff\xff\xff", "an array header says it holds 4294967295 items"),
        (b"\x94\x03\x02\x01\xdf\xff\xff\xff\xff", "a map header says it holds 4294967295"),
        (b"\x93\x03\x02\xdb\xff\xff\xff\xff", "ends early"),
        (b"\x93\x03\x02\xc6\x00\x00\x00\x09ab", "ends early"),
    ],
)
def test_a_body_msgpack_refuses_is_named_in_words(body: bytes, reason: str) -> None:
    """Found by a breaker: a reserved byte or deep nesting gave "frame body is not valid
    msgpack: " with nothing after the colon, and a bad map key msgpack's own sentence
    about ``strict_map_key=True`` and Python's NoneType."""
    decoder = codec.FrameDecoder(1 << 20)
    decoder.receive_data(len(body).to_bytes(4, "big") + body)
    with pytest.raises(RemoteProtocolError) as refused:
        decoder.next_frame()
    assert refused.value.code == ErrorCode.MALFORMED_FRAME
    assert refused.value.message.startswith("frame body is not valid msgpack: ")
    assert reason in refused.value.message
    message = refused.value.message
    for internal in ("strict_map_key", "NoneType", "max_array_len", "max_map_len", "Unpack"):
        assert internal not in message


def test_the_incomplete_frame_is_measured_for_a_frame_timeout() -> None:
    """FRAME_TIMEOUT says how much of the frame arrived: bytes received (its length
    included) and its whole size once its 4-byte length is in."""
    decoder = codec.FrameDecoder()
    assert decoder.incomplete_frame() == (0, None)
    whole = codec.encode_frame(frames.Ping(7))
    decoder.receive_data(whole[:2])
    assert decoder.incomplete_frame() == (2, None)
    decoder.receive_data(whole[2:-1])
    assert decoder.incomplete_frame() == (len(whole) - 1, len(whole))
    decoder.receive_data(whole[-1:])
    assert decoder.next_frame() == frames.Ping(7)
    assert decoder.incomplete_frame() == (0, None)
