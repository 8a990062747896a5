"""Frames: every type round-trips; bad shapes and field types give INVALID_FRAME.

Also the h11 ``test_io`` check: a stream of frames fed whole, one byte at a time and in
random splits decodes to the same frames. Source: ``docs/protocol.md``, "Frames".
"""

from __future__ import annotations

import gc
import random
from typing import Any, cast

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from futureq.errors import ErrorCode, RemoteProtocolError
from futureq.wire import codec, frames

FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=300)

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
UINT63 = st.integers(min_value=0, max_value=2**63 - 1)
RID = st.integers(min_value=0, max_value=frames.MAX_REQUEST_ID)
TEXT = st.text(max_size=20)
OPT_TEXT = st.none() | TEXT
TAG = st.binary(min_size=24, max_size=24)
PUBLISH_ITEM = st.tuples(
    TEXT, st.binary(max_size=20), st.none() | INT64, st.none() | INT64, st.none() | INT64
).map(list)
DELIVERY = st.tuples(TAG, UINT63, st.binary(max_size=20), UINT63, UINT63, UINT63).map(list)
STATUS_VALUE = st.recursive(
    st.none() | st.booleans() | INT64 | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=10,
)

FRAME_STRATEGY: st.SearchStrategy[frames.Frame] = st.one_of(
    st.builds(frames.Hello, RID, st.lists(UINT63, max_size=4).map(tuple), TEXT, OPT_TEXT),
    st.builds(frames.HelloOk, RID, INT64, INT64, OPT_TEXT, st.integers(1, 2**32), TEXT),
    st.builds(
        frames.Publish, RID, st.sampled_from(frames.AckLevel), st.lists(PUBLISH_ITEM, max_size=4)
    ),
    st.builds(frames.PublishOk, RID, st.none() | UINT63, UINT63),
    st.builds(
        frames.PublishOk,
        RID,
        st.none() | UINT63,
        UINT63,
        st.lists(st.tuples(UINT63, UINT63).map(list), min_size=1, max_size=3),
    ),
    st.builds(frames.Subscribe, RID, TEXT, TEXT, INT64),
    st.builds(frames.SubscribeOk, RID, UINT63),
    st.builds(frames.Deliver, RID, INT64, INT64, st.lists(DELIVERY, max_size=4)),
    st.builds(frames.Ack, RID, st.lists(TAG, max_size=4)),
    st.builds(frames.Nack, RID, st.lists(TAG, max_size=4), INT64),
    st.builds(frames.Credit, RID, INT64, INT64),
    st.builds(frames.Status, RID),
    st.builds(frames.StatusOk, RID, st.dictionaries(TEXT, STATUS_VALUE, max_size=4)),
    st.builds(frames.Error, RID, INT64, TEXT, st.none() | UINT63, OPT_TEXT),
    st.builds(frames.Ok, RID, st.none() | INT64),
    st.builds(frames.Unsubscribe, RID, INT64),
    st.builds(frames.Ping, RID),
    st.builds(frames.Pong, RID),
    st.builds(frames.GroupCreate, RID, TEXT, TEXT, st.none() | INT64, st.none() | INT64),
    st.builds(frames.GroupDelete, RID, TEXT, TEXT),
    st.builds(frames.ClusterStatus, RID),
    st.builds(frames.ClusterStatusOk, RID, st.dictionaries(TEXT, INT64, max_size=3)),
    st.builds(frames.ClusterAddNode, RID, st.integers(1, 2**31), TEXT, TEXT),
    st.builds(frames.ClusterRemoveNode, RID, st.integers(1, 2**31)),
    st.builds(frames.ClusterTransferLeader, RID, st.none() | st.integers(1, 2**31)),
    st.builds(frames.Revoke, RID, INT64, st.lists(TAG, max_size=4), INT64),
    st.builds(frames.SubscriptionEnd, RID, INT64, INT64, TEXT),
    st.builds(frames.Extend, RID, st.lists(TAG, max_size=4), INT64),
    st.builds(frames.Release, RID, st.lists(TAG, max_size=4)),
    st.builds(frames.SubscriptionInfo, RID, INT64, st.integers(1, 2**40), st.integers(1, 2**40)),
    st.builds(frames.Watch, RID, INT64),
    st.builds(frames.WatchUpdate, RID, st.dictionaries(TEXT, INT64, max_size=3)),
    st.builds(frames.Unwatch, RID),
    st.builds(frames.Cancel, RID, TEXT, OPT_TEXT, st.lists(INT64, max_size=4)),
    st.builds(frames.ItemResults, RID, st.lists(st.integers(0, 3), max_size=4)),
    st.builds(
        frames.Browse,
        RID,
        TEXT,
        OPT_TEXT,
        st.none() | INT64,
        st.none() | INT64,
        st.none() | st.binary(max_size=20),
        INT64,
        INT64,
    ),
    st.builds(
        frames.BrowseOk,
        RID,
        TEXT,
        st.lists(
            st.tuples(
                UINT63,
                st.none() | INT64,
                INT64,
                INT64,
                st.none() | st.dictionaries(TEXT, TEXT, max_size=2),
                st.none() | st.binary(max_size=8),
                st.none() | INT64,
            ).map(list),
            max_size=3,
        ),
        st.none() | st.binary(max_size=20),
    ),
    st.builds(frames.BrowseCounts, RID, TEXT, OPT_TEXT, st.lists(INT64, max_size=4), st.booleans()),
    st.lists(INT64, max_size=4).flatmap(
        lambda bounds: st.builds(
            frames.BrowseCountsOk,
            RID,
            TEXT,
            st.just(bounds),
            st.lists(st.none() | INT64, min_size=len(bounds), max_size=len(bounds)),
            st.none() | INT64,
            st.booleans(),
        )
    ),
    st.builds(frames.Redrive, RID, TEXT, OPT_TEXT, st.lists(INT64, max_size=4), INT64),
    st.builds(
        frames.Reschedule,
        RID,
        TEXT,
        OPT_TEXT,
        st.lists(INT64, max_size=4),
        st.none() | INT64,
        st.none() | INT64,
    ),
    st.builds(frames.Purge, RID, TEXT, OPT_TEXT),
)

TAG_A = bytes(range(24))
TAG_B = bytes(range(24, 48))

# One hand-written example of every frame type, with realistic values.
EXAMPLES: list[frames.Frame] = [
    frames.Hello(1, (1,), "orders-service", "s3cret"),
    frames.Hello(1, (2, 1), "", None),
    frames.HelloOk(1, 1, 3, "10.0.0.3:7450", 4 * 1024 * 1024, "0.1.0"),
    frames.HelloOk(1, 1, 3, None, 1024, "0.1.0"),
    frames.Publish(
        2,
        frames.AckLevel.QUORUM,
        [
            ["orders", b"\x00payload", 60_000, None, 3_600_000],
            ["orders", b"", None, 1_767_225_600_000, None],
            ["audit", b"x", None, None, None],
        ],
    ),
    frames.Publish(3, frames.AckLevel.NONE, [["t", b"p", 0, None, None]]),
    frames.PublishOk(2, 1 << 16, 3),
    frames.PublishOk(3, None, 1),
    frames.Subscribe(4, "orders", "billing", 100),
    frames.SubscribeOk(4, 7),
    frames.Deliver(
        0,
        7,
        1_767_225_600_123,
        [[TAG_A, 65536, b"payload", 1_767_225_600_000, 1_767_225_540_000, 1]],
    ),
    frames.Ack(5, [TAG_A, TAG_B]),
    frames.Nack(6, [TAG_A], 5_000),
    frames.Credit(0, 7, 50),
    frames.Status(8),
    frames.StatusOk(
        8,
        {
            "node_id": 1,
            "role": "leader",
            "leader_address": "127.0.0.1:7450",
            "server_version": "0.1.0",
            "applied_index": 42,
            "uptime_s": 12.5,
            "topics": [
                {
                    "topic": "orders",
                    "groups": [
                        {
                            "group": "billing",
                            "pending": 3,
                            "due": 1,
                            "in_flight": 2,
                            "consumers": 1,
                            "visibility_timeout_ms": 30_000,
                            "max_deliveries": 16,
                        }
                    ],
                }
            ],
        },
    ),
    frames.Error(2, int(ErrorCode.PAYLOAD_TOO_LARGE), "payload is too large", 1, None),
    frames.Error(2, int(ErrorCode.NOT_LEADER), "not the leader", None, "10.0.0.2:7450"),
    frames.Ok(5, 2),
    frames.Ok(9, None),
    frames.Unsubscribe(9, 7),
    frames.Ping(10),
    frames.Pong(10),
    frames.GroupCreate(11, "orders", "billing", 30_000, 16),
    frames.GroupCreate(11, "orders", "billing"),
    frames.GroupDelete(12, "orders", "billing"),
    frames.ClusterStatus(13),
    frames.ClusterStatusOk(13, {"leader_id": 2, "term": 7}),
    frames.ClusterAddNode(14, 4, "127.0.0.1:7481", "127.0.0.1:7480"),
    frames.ClusterRemoveNode(15, 4),
    frames.ClusterTransferLeader(16, None),
    frames.Revoke(0, 7, [TAG_A, TAG_B], int(frames.RevokeReason.VISIBILITY_TIMEOUT)),
    frames.SubscriptionEnd(0, 7, int(ErrorCode.GROUP_DELETED), "group billing was deleted"),
    frames.Handover(0, 7),
    frames.GoAway(0, 41, 300, "the leadership moved to 127.0.0.1:7002", "127.0.0.1:7002"),
    frames.GoAway(0, 0, 301, "the node is shutting down", None),
    frames.Extend(17, [TAG_A], 60_000),
    frames.Release(18, [TAG_A, TAG_B]),
    frames.SubscriptionInfo(0, 7, 30_000, 16),
    frames.Watch(17, 1000),
    frames.WatchUpdate(17, {"node": {"node_id": 1, "role": "leader"}, "groups": []}),
    frames.Unwatch(18),
    frames.Cancel(19, "orders", "billing", [65536, 65537]),
    frames.Cancel(19, "orders", None, [2**64 - 1]),
    frames.ItemResults(19, [0, 1, 2]),
    frames.Browse(20, "orders", None, None, None, None, 100, 0),
    frames.Browse(20, "orders", "billing", 1_000, 2_000, b"k" * 20, 10, 64),
    frames.BrowseOk(
        20,
        "billing",
        [
            [65536, 1_500, 0, 3, None, None, None],
            [65537, None, 16, 3, {"futureq-reason": "max-deliveries"}, b"abc", 9_000],
        ],
        b"k" * 20,
    ),
    frames.BrowseOk(20, "default", [], None),
    frames.BrowseCounts(24, "jobs", None, [60_000, 3_600_000, 86_400_000], True),
    frames.BrowseCounts(24, "jobs", "g", [1_800_000_000_000], False),
    frames.BrowseCountsOk(24, "g", [1_000, 2_000], [5, 0], 12, True),
    frames.BrowseCountsOk(24, "g", [1_000, 2_000], [200_000, None], None, False),
    frames.Redrive(21, "jobs", None, [65536], 0),
    frames.Redrive(21, "jobs", "default", [1, 2], 60_000),
    frames.Reschedule(22, "jobs", None, [65536], 1_800_000_000_000, None),
    frames.Reschedule(22, "jobs", "g", [1, 2], None, 60_000),
    frames.Purge(23, "jobs", None),
    frames.Purge(23, "jobs", "g"),
    frames.SlotMap(24),
    frames.SlotMapOk(
        24, {"version": 1, "slots": 1024, "ranges": [[0, 1024, 0]], "shards": ["h:1"]}
    ),
]


def test_examples_cover_every_frame_type() -> None:
    assert {f.TYPE for f in EXAMPLES} == set(frames.FrameType)
    assert set(frames.FRAME_CLASSES) == set(frames.FrameType)


def decode_all(data: bytes, chunks: list[bytes] | None = None) -> list[frames.Frame]:
    """Feed ``chunks`` (or ``data`` whole), then EOF; return the frames up to CLOSED."""
    decoder = codec.FrameDecoder()
    out: list[frames.Frame] = []
    for chunk in [data] if chunks is None else chunks:
        decoder.receive_data(chunk)
        while (event := decoder.next_frame()) is not codec.NEED_DATA:
            assert event is not codec.CLOSED
            assert isinstance(event, tuple(frames.FRAME_CLASSES.values()))
            out.append(cast(frames.Frame, event))
    decoder.receive_data(b"")
    assert decoder.next_frame() is codec.CLOSED
    assert decoder.buffered_bytes == 0
    return out


@pytest.mark.parametrize("frame", EXAMPLES, ids=lambda f: type(f).__name__)
def test_example_round_trips(frame: frames.Frame) -> None:
    data = codec.encode_frame(frame)
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    assert decode_all(data) == [frame]
    assert frames.frame_from_wire(msgpack.unpackb(data[4:])) == frame


@FUZZ
@given(FRAME_STRATEGY)
def test_any_frame_round_trips(frame: frames.Frame) -> None:
    assert decode_all(codec.encode_frame(frame)) == [frame]


def test_wire_form_is_a_list_type_then_request_id() -> None:
    body = codec.encode_frame(frames.Subscribe(4, "orders", "billing", 100))[4:]
    assert msgpack.unpackb(body) == [int(frames.FrameType.SUBSCRIBE), 4, "orders", "billing", 100]


def random_splits(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, rng.randrange(1, 20))))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def test_whole_byte_at_a_time_and_random_splits_agree() -> None:
    stream = b"".join(codec.encode_frame(f) for f in EXAMPLES)
    whole = decode_all(stream)
    assert whole == EXAMPLES
    assert decode_all(stream, [stream[i : i + 1] for i in range(len(stream))]) == whole
    rng = random.Random(20260101)
    for _ in range(50):
        assert decode_all(stream, random_splits(stream, rng)) == whole


@FUZZ
@given(st.lists(FRAME_STRATEGY, min_size=1, max_size=6), st.randoms(use_true_random=False))
def test_any_stream_decodes_the_same_however_split(
    stream_frames: list[frames.Frame], rng: random.Random
) -> None:
    stream = b"".join(codec.encode_frame(f) for f in stream_frames)
    assert decode_all(stream) == stream_frames
    assert decode_all(stream, random_splits(stream, rng)) == stream_frames


def test_frames_then_trailing_partial_frame_then_need_data() -> None:
    # A complete frame followed by the first bytes of the next: the first comes out,
    # then NEED_DATA, and nothing is lost once the rest arrives.
    first = codec.encode_frame(frames.Ping(1))
    second = codec.encode_frame(frames.Status(2))
    decoder = codec.FrameDecoder()
    decoder.receive_data(first + second[:3])
    assert decoder.next_frame() == frames.Ping(1)
    assert decoder.next_frame() is codec.NEED_DATA
    assert decoder.buffered_bytes == 3
    decoder.receive_data(second[3:])
    assert decoder.next_frame() == frames.Status(2)
    assert decoder.next_frame() is codec.NEED_DATA


# --- frame_from_wire: shape and field types --------------------------------------------


def assert_code(value: Any, code: ErrorCode) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as info:
        frames.frame_from_wire(value)
    assert info.value.code is code
    assert info.value.message
    return info.value


def wire(frame: frames.Frame) -> list[Any]:
    """The frame as msgpack decodes it (to_wire() leaves the type as a FrameType)."""
    value: list[Any] = msgpack.unpackb(codec.encode_frame(frame)[4:])
    return value


@pytest.mark.parametrize(
    "value",
    [None, 16, "PING", b"\x10", {"type": 16}, [], [16], (16, 1)],
    ids=["nil", "int", "str", "bin", "map", "empty", "no-request-id", "tuple"],
)
def test_not_an_array_of_type_and_request_id(value: Any) -> None:
    assert_code(value, ErrorCode.INVALID_FRAME)


@pytest.mark.parametrize("frame_type", [0, 127, 99, -1, 2**64 - 1])
def test_unknown_frame_type(frame_type: int) -> None:
    error = assert_code([frame_type, 1], ErrorCode.UNKNOWN_FRAME_TYPE)
    assert str(frame_type) in error.message


@pytest.mark.parametrize("frame_type", [16.0, "16", True, None, b"\x10"])
def test_frame_type_must_be_an_integer(frame_type: Any) -> None:
    assert_code([frame_type, 1], ErrorCode.INVALID_FRAME)


@pytest.mark.parametrize("rid", [-1, 2**63, 1.0, "1", True, None, [1]])
def test_request_id_must_be_an_int64_at_least_zero(rid: Any) -> None:
    assert_code([int(frames.FrameType.PING), rid], ErrorCode.INVALID_FRAME)


def test_bad_request_id_value_is_not_echoed() -> None:
    huge = b"x" * 100_000
    error = assert_code([int(frames.FrameType.PING), huge], ErrorCode.INVALID_FRAME)
    assert len(error.message) < 200


def test_subscribe_asks_for_headers_and_deliver_items_may_carry_them() -> None:
    asking = frames.Subscribe(4, "orders", "billing", 10, True)
    assert wire(asking)[-1] is True and frames.frame_from_wire(wire(asking)) == asking
    assert len(wire(frames.Subscribe(4, "orders", "billing", 10))) == 5
    deliver = frames.Deliver(0, 7, 1, [[TAG_A, 1, b"p", 1, 1, 1, {"a": "b"}]])
    assert frames.frame_from_wire(wire(deliver)) == deliver
    with pytest.raises(RemoteProtocolError):
        frames.frame_from_wire(wire(frames.Deliver(0, 7, 1, [[TAG_A, 1, b"p", 1, 1, 1, 5]])))
    with pytest.raises(RemoteProtocolError):
        frames.frame_from_wire([*wire(frames.Subscribe(4, "o", "b", 10)), 1])


def test_nack_sends_reason_and_dead_letter_only_when_set() -> None:
    rejected = frames.Nack(6, [TAG_A], 0, "invalid json", True)
    assert wire(rejected)[-2:] == ["invalid json", True]
    assert frames.frame_from_wire(wire(rejected)) == rejected
    assert len(wire(frames.Nack(6, [TAG_A], 0))) == 4
    with pytest.raises(RemoteProtocolError):
        frames.frame_from_wire([*wire(frames.Nack(6, [TAG_A], 0)), "reason only"])


def test_group_create_sends_from_backlog_only_when_true() -> None:
    backlog = frames.GroupCreate(11, "orders", "billing", None, None, True)
    assert wire(backlog)[-1] is True
    assert frames.frame_from_wire(wire(backlog)) == backlog
    assert len(wire(frames.GroupCreate(11, "orders", "billing"))) == 6
    expiring = frames.GroupCreate(11, "orders", "billing", None, None, False, True)
    assert wire(expiring)[-2:] == [False, True]
    assert frames.frame_from_wire(wire(expiring)) == expiring
    with pytest.raises(RemoteProtocolError):
        frames.frame_from_wire([*wire(expiring)[:-1], "yes"])


def test_hello_ok_names_the_shard_count_only_above_one() -> None:
    # An optional trailing field (so not in EXAMPLES): a node of one shard answers
    # HELLO exactly as before sharding existed.
    sharded = frames.HelloOk(1, 1, 3, "h:1", 1024, "0.1.0", 2)
    assert wire(sharded)[-1] == 2
    assert frames.frame_from_wire(wire(sharded)) == sharded
    assert len(wire(frames.HelloOk(1, 1, 3, "h:1", 1024, "0.1.0"))) == 7
    assert_code([*wire(sharded), 0], ErrorCode.INVALID_FRAME)


def test_hello_ok_of_version_2_names_the_shards_and_the_members() -> None:
    with_members = frames.HelloOk(1, 2, 3, "h:1", 1024, "0.1.0", 1, ("h:1", "h:2"))
    assert wire(with_members)[-2:] == [1, ["h:1", "h:2"]]
    assert frames.frame_from_wire(wire(with_members)) == with_members
    none_known = frames.HelloOk(1, 2, 3, None, 1024, "0.1.0", 2, ())
    assert wire(none_known)[-2:] == [2, []]
    assert frames.frame_from_wire(wire(none_known)) == none_known
    assert_code([*wire(with_members), 0], ErrorCode.INVALID_FRAME)


def test_publish_ok_carries_duplicates_only_when_there_are_some() -> None:
    # An optional trailing field: a version-1 client that never sends idempotency keys
    # never sees it (so it is not in EXAMPLES, whose last field is always required).
    with_duplicates = frames.PublishOk(4, 1 << 16, 3, [[0, 65536], [2, 7]])
    assert wire(with_duplicates)[-1] == [[0, 65536], [2, 7]]
    assert frames.frame_from_wire(wire(with_duplicates)) == with_duplicates
    assert len(wire(frames.PublishOk(4, 1 << 16, 3, None))) == 4
    assert len(wire(frames.PublishOk(4, 1 << 16, 3, []))) == 4


@pytest.mark.parametrize("frame", EXAMPLES, ids=lambda f: type(f).__name__)
def test_missing_field(frame: frames.Frame) -> None:
    value = wire(frame)
    assert_code(value[:-1] if len(value) > 2 else value + [None], ErrorCode.INVALID_FRAME)


@pytest.mark.parametrize("frame", EXAMPLES, ids=lambda f: type(f).__name__)
def test_extra_field(frame: frames.Frame) -> None:
    assert_code([*wire(frame), 0], ErrorCode.INVALID_FRAME)


# (frame, index in the wire list, bad value): a float, string or bool where an
# integer belongs, or another wrong type, each alone in an otherwise valid frame.
WRONG_FIELDS: list[tuple[frames.Frame, int, Any]] = [
    (frames.Subscribe(4, "orders", "billing", 100), 4, 100.0),
    (frames.Subscribe(4, "orders", "billing", 100), 4, "100"),
    (frames.Subscribe(4, "orders", "billing", 100), 4, True),
    (frames.Subscribe(4, "orders", "billing", 100), 4, None),
    (frames.Subscribe(4, "orders", "billing", 100), 2, b"orders"),
    (frames.Subscribe(4, "orders", "billing", 100), 3, 7),
    (frames.Credit(0, 7, 50), 3, 50.5),
    (frames.Credit(0, 7, 50), 3, "50"),
    (frames.Credit(0, 7, 50), 2, False),
    (frames.Nack(6, [TAG_A], 5_000), 3, 5.0),
    (frames.Nack(6, [TAG_A], 5_000), 3, True),
    (frames.Nack(6, [TAG_A], 5_000), 2, [TAG_A, "tag"]),
    (frames.Nack(6, [TAG_A], 5_000), 2, TAG_A),
    (frames.Nack(6, [TAG_A], 5_000, "bad", True), 4, 7),
    (frames.Nack(6, [TAG_A], 5_000, "bad", True), 5, 1),
    (frames.Nack(6, [TAG_A], 5_000, "bad", True), 5, None),
    (frames.Ack(5, [TAG_A]), 2, [TAG_A, 1]),
    (frames.Ack(5, [TAG_A]), 2, None),
    (frames.Ack(5, [TAG_A]), 2, {"t": TAG_A}),
    (frames.Unsubscribe(9, 7), 2, "7"),
    (frames.Unsubscribe(9, 7), 2, 7.0),
    (frames.Hello(1, (1,), "", None), 2, 1),
    (frames.Hello(1, (1,), "", None), 2, [1.0]),
    (frames.Hello(1, (1,), "", None), 2, [True]),
    (frames.Hello(1, (1,), "", None), 2, [-1]),
    (frames.Hello(1, (1,), "", None), 3, None),
    (frames.Hello(1, (1,), "", None), 4, b"token"),
    (frames.Publish(2, frames.AckLevel.LEADER, []), 2, 3),
    (frames.Publish(2, frames.AckLevel.LEADER, []), 2, 1.0),
    (frames.Publish(2, frames.AckLevel.LEADER, []), 2, True),
    (frames.Publish(2, frames.AckLevel.LEADER, []), 2, -1),
    (frames.Publish(2, frames.AckLevel.LEADER, []), 3, {"items": []}),
    (frames.Publish(2, frames.AckLevel.LEADER, []), 3, None),
    (frames.GroupCreate(11, "orders", "billing"), 4, 1.5),
    (frames.GroupCreate(11, "orders", "billing"), 5, "16"),
    (frames.GroupCreate(11, "orders", "billing", None, None, True), 6, 1),
    (frames.GroupCreate(11, "orders", "billing", None, None, True), 6, None),
    (frames.GroupDelete(12, "orders", "billing"), 3, None),
    (frames.Cancel(19, "orders", None, [1]), 2, None),
    (frames.Cancel(19, "orders", None, [1]), 3, 7),
    (frames.Cancel(19, "orders", None, [1]), 4, 1),
    (frames.Cancel(19, "orders", None, [1]), 4, [1, "2"]),
    (frames.Cancel(19, "orders", None, [1]), 4, [1.0]),
    (frames.Cancel(19, "orders", None, [1]), 4, [True]),
    (frames.ItemResults(19, [0]), 2, [0, None]),
    (frames.Browse(20, "t", None, None, None, None, 1, 0), 6, "cursor"),
    (frames.Browse(20, "t", None, None, None, None, 1, 0), 7, None),
    (frames.Browse(20, "t", None, None, None, None, 1, 0), 4, 1.5),
    (frames.BrowseOk(20, "g", [], None), 3, [[1, 2, 3]]),
    (frames.BrowseCounts(24, "t", None, [1], False), 4, [1.5]),
    (frames.BrowseCounts(24, "t", None, [1], False), 4, None),
    (frames.BrowseCounts(24, "t", None, [1], False), 5, 1),
    (frames.BrowseCountsOk(24, "g", [1], [1], 0, True), 4, [1, 2]),
    (frames.BrowseCountsOk(24, "g", [1], [1], 0, True), 4, ["1"]),
    (frames.BrowseCountsOk(24, "g", [1], [1], 0, True), 6, None),
    (frames.Redrive(21, "t", None, [1], 0), 4, [None]),
    (frames.Redrive(21, "t", None, [1], 0), 5, None),
    (frames.Reschedule(22, "t", None, [1], 5, None), 5, "5"),
    (frames.Reschedule(22, "t", None, [1], None, 5), 6, 5.0),
    (frames.Purge(23, "t", None), 3, 1),
    (frames.HelloOk(1, 1, 3, None, 1024, "0.1.0", 2), 7, 0),
    (frames.HelloOk(1, 1, 3, None, 1024, "0.1.0", 2), 7, "2"),
    (frames.HelloOk(1, 2, 3, None, 1024, "0.1.0", 1, ()), 8, "h:1"),
    (frames.HelloOk(1, 2, 3, None, 1024, "0.1.0", 1, ()), 8, [7450]),
    (frames.HelloOk(1, 2, 3, None, 1024, "0.1.0", 1, ()), 8, [b"h:1"]),
    (frames.HelloOk(1, 2, 3, None, 1024, "0.1.0", 1, ()), 8, ["h:1"] * 65),
    (frames.SlotMapOk(24, {}), 2, [[0, 1024, 0]]),
    (frames.BrowseOk(20, "g", [], None), 3, [[1, 2, 3, 4, "h", None, None]]),
    (frames.ClusterAddNode(14, 4, "h:1", "h:2"), 2, 0),
    (frames.ClusterAddNode(14, 4, "h:1", "h:2"), 3, 7481),
    (frames.ClusterRemoveNode(15, 4), 2, "4"),
    (frames.ClusterTransferLeader(16, 2), 2, 2.0),
    (frames.HelloOk(1, 1, 3, None, 1024, "0.1.0"), 5, 0),
    (frames.HelloOk(1, 1, 3, None, 1024, "0.1.0"), 4, 7450),
    (frames.PublishOk(2, 65536, 3), 2, -1),
    (frames.PublishOk(2, 65536, 3), 3, 3.0),
    (frames.PublishOk(2, 65536, 3, [[0, 1]]), 4, [[0, -1]]),
    (frames.PublishOk(2, 65536, 3, [[0, 1]]), 4, [[0]]),
    (frames.PublishOk(2, 65536, 3, [[0, 1]]), 4, {"0": 1}),
    (frames.SubscribeOk(4, 7), 2, -7),
    (frames.Deliver(0, 7, 1, []), 4, [[TAG_A, 1, b"p", 1, 1]]),
    (frames.Deliver(0, 7, 1, []), 4, [[TAG_A, 1.0, b"p", 1, 1, 1]]),
    (frames.Deliver(0, 7, 1, []), 4, [["tag", 1, b"p", 1, 1, 1]]),
    (frames.Deliver(0, 7, 1, []), 4, [[TAG_A, 1, "p", 1, 1, 1]]),
    (frames.Deliver(0, 7, 1, []), 4, [[TAG_A, 1, b"p", 1, 1, True]]),
    (frames.Deliver(0, 7, 1, []), 4, [(TAG_A, 1, b"p", 1, 1, 1)]),
    (frames.Deliver(0, 7, 1, []), 3, 1.5),
    (frames.StatusOk(8, {}), 2, [["node_id", 1]]),
    (frames.Error(2, 200, "m"), 2, "200"),
    (frames.Error(2, 200, "m"), 3, None),
    (frames.Error(2, 200, "m"), 4, -1),
    (frames.Error(2, 200, "m"), 5, 7450),
    (frames.Ok(5, 2), 2, 2.0),
    (frames.Watch(17, 1000), 2, 1.0),
    (frames.Watch(17, 1000), 2, None),
    (frames.WatchUpdate(17, {}), 2, [1]),
]


@pytest.mark.parametrize(
    ("frame", "index", "bad"),
    WRONG_FIELDS,
    ids=[f"{type(f).__name__}[{i}]={bad!r}"[:60] for f, i, bad in WRONG_FIELDS],
)
def test_wrong_field_type(frame: frames.Frame, index: int, bad: Any) -> None:
    value = wire(frame)
    frames.frame_from_wire(list(value))  # the untouched frame is fine
    value[index] = bad
    assert_code(value, ErrorCode.INVALID_FRAME)


def test_publish_items_are_not_checked_by_the_frame() -> None:
    # Bad items fail their request alone (validation.py), not the connection.
    value = [int(frames.FrameType.PUBLISH), 2, 1, [1.5, None, ["x"]]]
    frame = frames.frame_from_wire(value)
    assert isinstance(frame, frames.Publish)
    assert frame.items == [1.5, None, ("x",)]


def test_publish_items_are_kept_as_tuples_that_the_collector_stops_tracking() -> None:
    # An in-flight list item is walked by every collection; a tuple of atoms is
    # untracked by the first one (frames.Publish).
    items = [["orders", b"p", 1000, None, None], ["orders", b"q", None, 5, 60]]
    frame = frames.frame_from_wire([int(frames.FrameType.PUBLISH), 2, 1, items])
    assert isinstance(frame, frames.Publish)
    assert frame.items == [tuple(item) for item in items]
    assert frame == frames.Publish(2, frames.AckLevel.LEADER, items)
    assert frame.to_wire() == frames.Publish(2, frames.AckLevel.LEADER, items).to_wire()
    assert codec.encode_frame(frame) == codec.encode_frame(
        frames.Publish(2, frames.AckLevel.LEADER, [list(item) for item in frame.items])
    )
    gc.collect()
    assert not any(gc.is_tracked(item) for item in frame.items)


# --- fuzz: arbitrary msgpack values never crash frame_from_wire -------------------------

MSGPACK_SCALAR = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=10)
    | st.binary(max_size=30)
)
MSGPACK_VALUE = st.recursive(
    MSGPACK_SCALAR,
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.dictionaries(st.text(max_size=5) | st.binary(max_size=5), inner, max_size=4)
    ),
    max_leaves=20,
)
FRAME_TYPE_NUMBER = st.sampled_from([int(t) for t in frames.FrameType]) | st.integers(-2, 25)
# Plausible frames: a known type, a valid request id, then random fields.
FRAME_LIKE = st.tuples(FRAME_TYPE_NUMBER, RID, st.lists(MSGPACK_VALUE, max_size=6)).map(
    lambda t: [t[0], t[1], *t[2]]
)


@st.composite
def mutated_frames(draw: st.DrawFn) -> list[Any]:
    """A valid frame with one field (or one element of a list field) replaced."""
    value = wire(draw(FRAME_STRATEGY))
    index = draw(st.integers(0, len(value) - 1))
    target = value[index]
    if type(target) is list and target and draw(st.booleans()):
        target[draw(st.integers(0, len(target) - 1))] = draw(MSGPACK_VALUE)
    else:
        value[index] = draw(MSGPACK_VALUE)
    return value


def accepts_or_refuses(value: Any) -> None:
    try:
        frame = frames.frame_from_wire(value)
    except RemoteProtocolError as exc:
        assert exc.code in (ErrorCode.INVALID_FRAME, ErrorCode.UNKNOWN_FRAME_TYPE)
    else:
        assert frame.TYPE in frames.FrameType
        # Whatever is accepted can be sent back out unchanged (compared as bytes: NaN).
        body = msgpack.packb(frame.to_wire())
        again = frames.frame_from_wire(msgpack.unpackb(body))
        assert msgpack.packb(again.to_wire()) == body


@FUZZ
@given(MSGPACK_VALUE | FRAME_LIKE)
def test_any_msgpack_value_is_a_frame_or_a_remote_protocol_error(value: Any) -> None:
    accepts_or_refuses(value)


@FUZZ
@given(mutated_frames())
def test_any_mutated_frame_is_a_frame_or_a_remote_protocol_error(value: list[Any]) -> None:
    accepts_or_refuses(value)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ([10, 1, "7", 1], "field 'subscription_id' must be an integer, got a string"),
        ([10, 1, 7, None], "field 'credit' must be an integer, got nil"),
        ([28, 1, [b"t", 5]], "tags[1] must be binary, got an integer"),
        ([15, b"1", 7], "request_id must be an integer in [0, 2**63-1], got binary"),
    ],
)
def test_a_wrong_field_type_is_named_in_msgpack_terms(value: list[Any], words: str) -> None:
    """Found by a breaker: the sentence named Python's type (``str``, ``NoneType``)."""
    with pytest.raises(RemoteProtocolError) as refused:
        frames.frame_from_wire(value)
    assert words in refused.value.message
