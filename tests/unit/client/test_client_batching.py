"""Pure client bookkeeping: publish items, batch ids, refusal splitting, request ids, backoff."""

from __future__ import annotations

import random

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from futureq.client import PublishItem, parse_servers
from futureq.client._backoff import Backoff
from futureq.client._batching import (
    RequestTable,
    chunked,
    ids_from_publish_ok,
    refused_item,
    split_by_size,
    without_item,
)
from futureq.errors import ErrorCode, RemoteProtocolError, RequestError


def test_publish_item_wire_shape() -> None:
    item = PublishItem("t", bytearray(b"p"), delay_ms=5, ttl_ms=9)
    assert item.payload == b"p" and type(item.payload) is bytes
    assert item.to_wire() == ["t", b"p", 5, None, 9]


def test_publish_item_refuses_text_payload_and_double_delay() -> None:
    with pytest.raises(TypeError, match="encode"):
        PublishItem("t", "text")  # type: ignore[arg-type]
    with pytest.raises(RequestError) as info:
        PublishItem("t", b"", delay_ms=1, deliver_at_ms=2)
    assert info.value.code is ErrorCode.INVALID_DELAY


def test_ids_follow_first_id() -> None:
    assert ids_from_publish_ok(41, 3, 3) == [41, 42, 43]
    # Items whose idempotency key named an earlier message get that message's id.
    assert ids_from_publish_ok(41, 3, 3, [[1, 7]]) == [41, 7, 43]
    with pytest.raises(RemoteProtocolError):
        ids_from_publish_ok(41, 3, 3, [[3, 7]])


@pytest.mark.parametrize(("first_id", "count", "sent"), [(1, 2, 3), (None, 3, 3)])
def test_mismatched_publish_ok_is_a_protocol_error(
    first_id: int | None, count: int, sent: int
) -> None:
    with pytest.raises(RemoteProtocolError):
        ids_from_publish_ok(first_id, count, sent)


@pytest.mark.parametrize(
    ("item_index", "sent", "expected"), [(0, 3, 0), (2, 3, 2), (3, 3, None), (None, 3, None)]
)
def test_refused_item_only_trusts_indexes_in_range(
    item_index: int | None, sent: int, expected: int | None
) -> None:
    error = RequestError(ErrorCode.INVALID_TOPIC, "bad", item_index)
    assert refused_item(error, sent) == expected


def test_without_item_drops_batch_position() -> None:
    single = without_item(RequestError(ErrorCode.PAYLOAD_TOO_LARGE, "too big", 4))
    assert single.item_index is None
    assert single.code is ErrorCode.PAYLOAD_TOO_LARGE
    assert str(single) == "too big"


@given(st.lists(st.integers(), max_size=50), st.integers(min_value=1, max_value=10))
def test_chunked_covers_items_in_order(items: list[int], size: int) -> None:
    chunks = list(chunked(items, size))
    assert [x for _, chunk in chunks for x in chunk] == items
    assert all(len(chunk) <= size for _, chunk in chunks)
    assert [offset for offset, _ in chunks] == list(range(0, len(items), size))


def test_chunked_refuses_zero() -> None:
    with pytest.raises(ValueError):
        list(chunked([1], 0))


def test_request_ids_start_at_one_and_are_never_reused() -> None:
    table: RequestTable[str] = RequestTable()
    first = table.add("a")
    second = table.add("b")
    assert (first, second) == (1, 2)
    assert table.pop(first) == "a"
    assert table.pop(first) is None  # a late answer finds nothing
    assert table.add("c") == 3
    assert sorted(table.drain()) == ["b", "c"]
    assert len(table) == 0


def test_backoff_grows_jitters_and_caps() -> None:
    backoff = Backoff(random.Random(1), initial_s=0.1, max_s=1.0, multiplier=2.0)
    delays = [backoff.next_delay_s() for _ in range(10)]
    caps = [min(1.0, 0.1 * 2**i) for i in range(10)]
    assert all(cap / 2 <= d <= cap for d, cap in zip(delays, caps, strict=True))
    assert backoff.attempts == 10
    backoff.reset()
    assert backoff.next_delay_s() <= 0.1


def test_backoff_is_reproducible_with_a_seed() -> None:
    a = Backoff(random.Random(5))
    b = Backoff(random.Random(5))
    assert [a.next_delay_s() for _ in range(5)] == [b.next_delay_s() for _ in range(5)]


def test_backoff_survives_many_attempts() -> None:
    backoff = Backoff(random.Random(0), max_s=3.0)
    for _ in range(2000):
        assert backoff.next_delay_s() <= 3.0


def test_parse_servers() -> None:
    assert parse_servers("a:1, b:2,") == ["a:1", "b:2"]
    assert parse_servers(["a:1"]) == ["a:1"]
    with pytest.raises(ValueError):
        parse_servers(" , ")


@given(
    payload=st.binary(max_size=70_000),
    delay_ms=st.none() | st.integers(-(2**63), 2**63 - 1),
    ttl_ms=st.none() | st.integers(1, 2**63 - 1),
    headers=st.none() | st.dictionaries(st.text(min_size=1), st.text(), max_size=20),
    key=st.none() | st.text(min_size=1, max_size=300),
)
def test_publish_item_wire_bytes_is_its_msgpack_size(
    payload: bytes,
    delay_ms: int | None,
    ttl_ms: int | None,
    headers: dict[str, str] | None,
    key: str | None,
) -> None:
    headers = {n: v for n, v in (headers or {}).items() if not n.lower().startswith("futureq-")}
    item = PublishItem("topic", payload, delay_ms, None, ttl_ms, headers or None, key)
    assert item.wire_bytes == len(msgpack.packb(item.to_wire(), use_bin_type=True))


def test_publish_item_refuses_what_cannot_be_encoded_with_the_servers_code() -> None:
    cases = [
        ({"delay_ms": 2**64}, ErrorCode.DUE_TIME_OVERFLOW),
        ({"delay_ms": 2**63}, ErrorCode.DUE_TIME_OVERFLOW),
        ({"delay_ms": -(2**64)}, ErrorCode.INVALID_DELAY),
        ({"ttl_ms": 2**64}, ErrorCode.INVALID_TTL),
        ({"ttl_ms": -(2**70)}, ErrorCode.INVALID_TTL),
        ({"deliver_at_ms": 2**64}, ErrorCode.DUE_TIME_OVERFLOW),
        ({"headers": {"a": "\ud800"}}, ErrorCode.INVALID_HEADERS),
        ({"idempotency_key": "k\udfff"}, ErrorCode.INVALID_IDEMPOTENCY_KEY),
    ]
    for kwargs, code in cases:
        with pytest.raises(RequestError) as info:
            PublishItem("t", b"", **kwargs)
        assert info.value.code is code, kwargs
    with pytest.raises(RequestError) as topic_info:
        PublishItem("t\ud800", b"")
    assert topic_info.value.code is ErrorCode.INVALID_TOPIC
    assert "surrogate" in topic_info.value.message


def test_split_by_size_keeps_order_and_both_limits() -> None:
    items = [PublishItem("t", b"x" * n) for n in (10, 10, 10, 100, 10, 10)]
    sizes = [item.wire_bytes for item in items]
    cuts = []
    start = 0
    while start < len(items):
        end = split_by_size(items, start, 2, sizes[0] * 3)
        cuts.append((start, end))
        start = end
    assert cuts == [(0, 2), (2, 3), (3, 4), (4, 6)]  # the 100-byte item goes alone
    assert split_by_size(items, 0, 10, 1) == 1  # one item always, even over the limit
