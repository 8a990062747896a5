"""PUBLISH item validation and ACK/NACK batch checks: every rule with its exact code and
the index of the first bad item. Source: ``docs/protocol.md``, "PUBLISH", "Limits".
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from futureq.errors import ErrorCode, RequestError
from futureq.wire import validation
from futureq.wire.validation import INT64_MAX, Limits, validate_publish_items

NOW_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
LIMITS = Limits()
TEN_YEARS_MS = 10 * 366 * 24 * 3600 * 1000


def item(
    topic: Any = "orders",
    payload: Any = b"payload",
    delay_ms: Any = None,
    deliver_at_ms: Any = None,
    ttl_ms: Any = None,
) -> list[Any]:
    return [topic, payload, delay_ms, deliver_at_ms, ttl_ms]


GOOD = item(delay_ms=1_000, ttl_ms=60_000)


def refuse(items: list[Any], limits: Limits = LIMITS) -> RequestError:
    with pytest.raises(RequestError) as info:
        validate_publish_items(items, limits, NOW_MS)
    assert info.value.message
    return info.value


# --- accepted items and how their due time resolves ----------------------------------


def test_defaults() -> None:
    assert LIMITS.max_payload_bytes == 1024 * 1024
    assert LIMITS.max_delay_ms == TEN_YEARS_MS
    assert LIMITS.max_batch_items == 10_000


@pytest.mark.parametrize(
    ("given", "due_ms", "ttl_ms"),
    [
        (item(), NOW_MS, None),
        (item(delay_ms=0), NOW_MS, None),
        (item(delay_ms=1_500, ttl_ms=10), NOW_MS + 1_500, 10),
        (item(delay_ms=TEN_YEARS_MS), NOW_MS + TEN_YEARS_MS, None),
        (item(deliver_at_ms=NOW_MS + 5), NOW_MS + 5, None),
        (item(deliver_at_ms=NOW_MS + TEN_YEARS_MS), NOW_MS + TEN_YEARS_MS, None),
        (item(deliver_at_ms=NOW_MS), NOW_MS, None),
        # In the past: due at once, never before publish.
        (item(deliver_at_ms=NOW_MS - 60_000), NOW_MS, None),
        (item(deliver_at_ms=0, ttl_ms=1), NOW_MS, 1),
        (item(ttl_ms=LIMITS.max_ttl_ms), NOW_MS, LIMITS.max_ttl_ms),
    ],
    ids=[
        "no-delay",
        "zero-delay",
        "delay-and-ttl",
        "max-delay",
        "deliver-at",
        "deliver-at-max",
        "deliver-at-now",
        "deliver-at-past",
        "deliver-at-epoch",
        "max-ttl",
    ],
)
def test_accepted_item_resolves_due_time(given: list[Any], due_ms: int, ttl_ms: int | None) -> None:
    assert validate_publish_items([given], LIMITS, NOW_MS) == [(given[0], given[1], due_ms, ttl_ms)]


def test_edge_names_and_payloads_are_accepted() -> None:
    items = [
        item(topic="t" * 249),  # its dead-letter topic, 253 bytes, is a valid name too
        item(topic="orders.dlq.archive"),
        item(topic="dlq"),
        item(topic="0"),
        item(topic="A-z_9.b-c_d.E"),
        item(payload=b""),
        item(payload=b"x" * LIMITS.max_payload_bytes),
    ]
    assert len(validate_publish_items(items, LIMITS, NOW_MS)) == len(items)


def test_batch_of_exactly_max_items_is_accepted() -> None:
    limits = Limits(max_batch_items=3)
    assert len(validate_publish_items([GOOD] * 3, limits, NOW_MS)) == 3


# --- each bad item, alone and as the first bad one in a batch -------------------------

BAD_ITEMS: list[tuple[str, Any, ErrorCode]] = [
    ("not-an-array", "orders", ErrorCode.INVALID_FIELD),
    ("map-item", {"topic": "orders"}, ErrorCode.INVALID_FIELD),
    ("four-fields", ["orders", b"p", None, None], ErrorCode.INVALID_FIELD),
    ("six-fields", ["orders", b"p", None, None, None, None], ErrorCode.INVALID_FIELD),
    ("topic-not-string", item(topic=b"orders"), ErrorCode.INVALID_FIELD),
    ("topic-nil", item(topic=None), ErrorCode.INVALID_FIELD),
    ("topic-array", item(topic=["orders"]), ErrorCode.INVALID_FIELD),  # unhashable
    ("topic-map", item(topic={"orders": 1}), ErrorCode.INVALID_FIELD),
    ("empty-topic", item(topic=""), ErrorCode.INVALID_TOPIC),
    ("topic-250-bytes", item(topic="t" * 250), ErrorCode.INVALID_TOPIC),
    ("topic-255-bytes", item(topic="t" * 255), ErrorCode.INVALID_TOPIC),
    ("topic-256-bytes", item(topic="t" * 256), ErrorCode.INVALID_TOPIC),
    ("topic-non-ascii", item(topic="é" * 10), ErrorCode.INVALID_TOPIC),
    ("topic-space", item(topic="with space"), ErrorCode.INVALID_TOPIC),
    ("topic-only-space", item(topic=" "), ErrorCode.INVALID_TOPIC),
    ("topic-leading-dot", item(topic=".orders"), ErrorCode.INVALID_TOPIC),
    ("topic-trailing-dot", item(topic="orders."), ErrorCode.INVALID_TOPIC),
    ("topic-double-dot", item(topic="orders..eu"), ErrorCode.INVALID_TOPIC),
    ("topic-leading-underscore", item(topic="_other"), ErrorCode.INVALID_TOPIC),
    ("topic-wildcard-star", item(topic="orders.*"), ErrorCode.INVALID_TOPIC),
    ("topic-wildcard-gt", item(topic="orders.>"), ErrorCode.INVALID_TOPIC),
    ("topic-slash", item(topic="a/b"), ErrorCode.INVALID_TOPIC),
    ("topic-newline", item(topic="ord\ners"), ErrorCode.INVALID_TOPIC),
    ("topic-nul", item(topic="orders\x00"), ErrorCode.INVALID_TOPIC),
    ("topic-tab", item(topic="\torders"), ErrorCode.INVALID_TOPIC),
    ("topic-del", item(topic="orders\x7f"), ErrorCode.INVALID_TOPIC),
    ("topic-c1-control", item(topic="orders\x85"), ErrorCode.INVALID_TOPIC),
    ("topic-dlq", item(topic="orders.dlq"), ErrorCode.RESERVED_TOPIC),
    ("topic-bare-dlq", item(topic=".dlq"), ErrorCode.RESERVED_TOPIC),
    ("payload-string", item(payload="text"), ErrorCode.INVALID_FIELD),
    ("payload-nil", item(payload=None), ErrorCode.INVALID_FIELD),
    (
        "payload-over-max",
        item(payload=b"x" * (LIMITS.max_payload_bytes + 1)),
        ErrorCode.PAYLOAD_TOO_LARGE,
    ),
    ("negative-delay", item(delay_ms=-1), ErrorCode.INVALID_DELAY),
    ("float-delay", item(delay_ms=1.0), ErrorCode.INVALID_FIELD),
    ("string-delay", item(delay_ms="1000"), ErrorCode.INVALID_FIELD),
    ("bool-delay", item(delay_ms=True), ErrorCode.INVALID_FIELD),
    ("delay-over-max", item(delay_ms=TEN_YEARS_MS + 1), ErrorCode.DELAY_TOO_LARGE),
    ("delay-overflows-int64", item(delay_ms=INT64_MAX - NOW_MS + 1), ErrorCode.DUE_TIME_OVERFLOW),
    ("delay-int64-max", item(delay_ms=INT64_MAX), ErrorCode.DUE_TIME_OVERFLOW),
    ("delay-and-deliver-at", item(delay_ms=1, deliver_at_ms=NOW_MS), ErrorCode.INVALID_DELAY),
    ("negative-deliver-at", item(deliver_at_ms=-1), ErrorCode.INVALID_DELAY),
    ("float-deliver-at", item(deliver_at_ms=float(NOW_MS)), ErrorCode.INVALID_FIELD),
    ("string-deliver-at", item(deliver_at_ms=str(NOW_MS)), ErrorCode.INVALID_FIELD),
    ("bool-deliver-at", item(deliver_at_ms=False), ErrorCode.INVALID_FIELD),
    (
        "deliver-at-over-max",
        item(deliver_at_ms=NOW_MS + TEN_YEARS_MS + 1),
        ErrorCode.DELAY_TOO_LARGE,
    ),
    ("deliver-at-beyond-int64", item(deliver_at_ms=INT64_MAX + 1), ErrorCode.DUE_TIME_OVERFLOW),
    ("deliver-at-uint64-max", item(deliver_at_ms=2**64 - 1), ErrorCode.DUE_TIME_OVERFLOW),
    ("zero-ttl", item(ttl_ms=0), ErrorCode.INVALID_TTL),
    ("negative-ttl", item(ttl_ms=-5), ErrorCode.INVALID_TTL),
    ("ttl-over-max", item(ttl_ms=LIMITS.max_ttl_ms + 1), ErrorCode.INVALID_TTL),
    ("float-ttl", item(ttl_ms=1.5), ErrorCode.INVALID_FIELD),
    ("string-ttl", item(ttl_ms="60000"), ErrorCode.INVALID_FIELD),
    ("bool-ttl", item(ttl_ms=True), ErrorCode.INVALID_FIELD),
    ("eight-fields", [*item(), None, None, None], ErrorCode.INVALID_FIELD),
    ("headers-list", [*item(), ["a", "b"], None], ErrorCode.INVALID_HEADERS),
    ("header-value-int", [*item(), {"a": 1}], ErrorCode.INVALID_FIELD),  # six fields
    ("header-value-not-str", [*item(), {"a": 1}, None], ErrorCode.INVALID_HEADERS),
    ("header-name-empty", [*item(), {"": "x"}, None], ErrorCode.INVALID_HEADERS),
    ("header-reserved", [*item(), {"futureq-reason": "x"}, None], ErrorCode.INVALID_HEADERS),
    (
        "header-reserved-case",
        [*item(), {"FutureQ-Original-Id": "1"}, None],
        ErrorCode.INVALID_HEADERS,
    ),
    ("header-reserved-upper", [*item(), {"FUTUREQ-X": "1"}, None], ErrorCode.INVALID_HEADERS),
    (
        "headers-too-many",
        [*item(), {f"h{n}": "v" for n in range(validation.MAX_HEADERS + 1)}, None],
        ErrorCode.INVALID_HEADERS,
    ),
    (
        "headers-too-big",
        [*item(), {"h": "v" * validation.MAX_HEADER_BYTES}, None],
        ErrorCode.INVALID_HEADERS,
    ),
    ("key-empty", [*item(), None, ""], ErrorCode.INVALID_IDEMPOTENCY_KEY),
    ("key-int", [*item(), None, 17], ErrorCode.INVALID_IDEMPOTENCY_KEY),
    ("key-256-bytes", [*item(), None, "k" * 256], ErrorCode.INVALID_IDEMPOTENCY_KEY),
]


def test_headers_and_idempotency_keys_are_accepted_within_the_limits() -> None:
    headers = {f"h{n}": "v" for n in range(validation.MAX_HEADERS)}
    out = validate_publish_items(
        [
            [*item(delay_ms=5), headers, "k" * 255],
            [*item(), None, None],  # seven fields, both nil: the short form
            [*item(), {}, None],  # no headers at all
        ],
        LIMITS,
        NOW_MS,
    )
    assert out == [
        ("orders", b"payload", NOW_MS + 5, None, headers, "k" * 255),
        ("orders", b"payload", NOW_MS, None),
        ("orders", b"payload", NOW_MS, None, None, None),
    ]


@pytest.mark.parametrize(
    ("bad", "code"), [(b, c) for _, b, c in BAD_ITEMS], ids=[n for n, _, _ in BAD_ITEMS]
)
def test_bad_item_alone(bad: Any, code: ErrorCode) -> None:
    error = refuse([bad])
    assert error.code is code
    assert error.item_index == 0


@pytest.mark.parametrize(
    ("bad", "code"), [(b, c) for _, b, c in BAD_ITEMS], ids=[n for n, _, _ in BAD_ITEMS]
)
def test_first_bad_item_is_named_in_a_batch(bad: Any, code: ErrorCode) -> None:
    # Good items around it, and a later bad item of another kind: the first one counts.
    later_bad = item(topic="")
    error = refuse([GOOD, GOOD, bad, GOOD, later_bad, bad])
    assert error.code is code
    assert error.item_index == 2
    assert str(error).startswith("item 2: ")


def test_due_plus_ttl_overflowing_int64() -> None:
    limits = Limits(max_ttl_ms=INT64_MAX)
    error = refuse([GOOD, item(delay_ms=1_000, ttl_ms=INT64_MAX - NOW_MS - 999)], limits)
    assert error.code is ErrorCode.DUE_TIME_OVERFLOW
    assert error.item_index == 1
    assert "signed 64-bit" in error.message
    # One millisecond less fits exactly.
    ok = validate_publish_items(
        [item(delay_ms=1_000, ttl_ms=INT64_MAX - NOW_MS - 1_000)], limits, NOW_MS
    )
    assert ok[0][2] + (ok[0][3] or 0) == INT64_MAX


def test_a_deliver_at_past_int64_says_which_64_bits() -> None:
    """A breaker's 2**64 - 1 was told it "does not fit in 64 bits", which it does (as an
    unsigned integer): the sentence names the signed limit and the unit."""
    error = refuse([item(deliver_at_ms=2**64 - 1)])
    assert error.code is ErrorCode.DUE_TIME_OVERFLOW
    assert f"{INT64_MAX} ms" in error.message and "signed 64-bit" in error.message


def test_limits_come_from_config() -> None:
    limits = Limits(max_payload_bytes=10, max_delay_ms=1_000, max_ttl_ms=2_000)
    assert refuse([item(payload=b"x" * 11)], limits).code is ErrorCode.PAYLOAD_TOO_LARGE
    assert refuse([item(delay_ms=1_001)], limits).code is ErrorCode.DELAY_TOO_LARGE
    assert refuse([item(deliver_at_ms=NOW_MS + 1_001)], limits).code is ErrorCode.DELAY_TOO_LARGE
    assert refuse([item(ttl_ms=2_001)], limits).code is ErrorCode.INVALID_TTL
    assert (
        len(
            validate_publish_items(
                [item(payload=b"x" * 10, delay_ms=1_000, ttl_ms=2_000)], limits, NOW_MS
            )
        )
        == 1
    )


def test_error_messages_name_the_value_and_the_limit() -> None:
    error = refuse([item(payload=b"x" * (LIMITS.max_payload_bytes + 1))])
    assert str(LIMITS.max_payload_bytes + 1) in error.message
    assert str(LIMITS.max_payload_bytes) in error.message
    assert "orders.dlq" in refuse([item(topic="orders.dlq")]).message


# --- batch size -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (item(payload=None), "payload (item position 1) must be binary, got nil"),
        (item(payload="text"), "must be binary, got a string"),
        (item(topic=b"orders"), "topic must be a string, got binary"),
        (item(delay_ms=1.5), "delay_ms must be an integer number of milliseconds, got a float"),
        (item(ttl_ms=[1]), "ttl_ms must be an integer, got an array"),
        ([*item(), {"a": None}, None], "header 'a' has nil as its value; header values must"),
        ([*item(), {b"a": "x"}, None], "a header name is binary; header names must be msgpack"),
        (
            [*item(), ["a"], None],
            "must be a map of strings to strings, or nil for none, got an array",
        ),
        (
            [*item(), None, 7],
            "idempotency_key must be a string of 1 to 255 UTF-8 bytes or nil, got an integer",
        ),
    ],
)
def test_a_wrong_type_is_named_in_msgpack_terms(bad: list[Any], words: str) -> None:
    """Found by a breaker: sentences said ``got NoneType`` or ``str -> NoneType``
    (Python's names); a client speaks msgpack (nil, string, binary, integer)."""
    message = refuse([bad]).message
    assert words in message, message
    assert "NoneType" not in message and " -> " not in message
    assert not re.search(r"got (bytes|str|int|float|list|dict|bool)\b", message), message


def test_empty_batch() -> None:
    error = refuse([])
    assert error.code is ErrorCode.EMPTY_BATCH
    assert error.item_index is None


def test_oversized_batch() -> None:
    error = refuse([GOOD] * 4, Limits(max_batch_items=3))
    assert error.code is ErrorCode.BATCH_TOO_LARGE
    assert error.item_index is None
    assert "4" in error.message and "3" in error.message


def test_oversized_batch_at_the_default_limit() -> None:
    assert refuse([GOOD] * (LIMITS.max_batch_items + 1)).code is ErrorCode.BATCH_TOO_LARGE


def test_oversized_batch_is_refused_before_items_are_looked_at() -> None:
    assert refuse([item(topic="")] * 4, Limits(max_batch_items=3)).code is ErrorCode.BATCH_TOO_LARGE


def test_tags_batch_checks() -> None:
    validation.check_tags([b"t" * 24], LIMITS)
    with pytest.raises(RequestError) as info:
        validation.check_tags([], LIMITS)
    assert info.value.code is ErrorCode.EMPTY_BATCH
    with pytest.raises(RequestError) as info:
        validation.check_tags([b"t" * 24] * 4, Limits(max_batch_items=3))
    assert info.value.code is ErrorCode.BATCH_TOO_LARGE


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("billing", True),
        ("", False),
        (" ", False),
        ("g" * 256, False),
        ("g\n", False),
        ("g" * 250, False),
        ("g" * 249, True),
        ("eu.billing-2", True),
        ("bill ing", False),
    ],
)
def test_group_names(name: str, ok: bool) -> None:
    if ok:
        validation.check_name("group", name)
        return
    with pytest.raises(RequestError) as info:
        validation.check_name("group", name, 3)
    assert info.value.code is ErrorCode.INVALID_GROUP
    assert info.value.item_index == 3


# --- property: the reported item is the first that fails on its own ------------------

FIELD_VALUE = st.one_of(
    st.none(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.integers(min_value=-10, max_value=TEN_YEARS_MS + 10),
    st.floats(allow_nan=False),
    st.booleans(),
    st.text(max_size=5),
)
ANY_ITEM = st.one_of(
    st.tuples(
        st.sampled_from(["orders", "", "a.dlq", "x\x01", "t" * 256, ["orders"], {"t": 1}])
        | st.text(max_size=8),
        st.sampled_from([b"", b"p", "p", None]),
        FIELD_VALUE,
        FIELD_VALUE,
        FIELD_VALUE,
    ).map(list),
    st.just(GOOD),
    st.integers(),
)


@settings(derandomize=True, database=None, deadline=None, max_examples=300)
@given(st.lists(ANY_ITEM, min_size=1, max_size=8))
def test_reported_item_is_the_first_that_fails_alone(items: list[Any]) -> None:
    limits = Limits(max_payload_bytes=4)
    alone: list[RequestError | None] = []
    for one in items:
        try:
            validate_publish_items([one], limits, NOW_MS)
        except RequestError as exc:
            alone.append(exc)
        else:
            alone.append(None)
    first_bad = next((i for i, e in enumerate(alone) if e is not None), None)
    try:
        resolved = validate_publish_items(items, limits, NOW_MS)
    except RequestError as exc:
        assert first_bad is not None
        assert exc.item_index == first_bad
        reason_alone = alone[first_bad]
        assert reason_alone is not None
        assert exc.code is reason_alone.code
    else:
        assert first_bad is None
        assert len(resolved) == len(items)
        for _topic, _payload, due_ms, ttl_ms in resolved:
            assert NOW_MS <= due_ms <= NOW_MS + limits.max_delay_ms
            assert ttl_ms is None or 0 < ttl_ms <= limits.max_ttl_ms


def test_a_large_batch_is_checked_a_step_at_a_time_and_names_items_by_their_batch_index() -> None:
    """``validate_publish_items_in_steps`` yields between steps of VALIDATE_STEP_ITEMS
    items (so the reader's event loop runs between them), gives what the one-call check
    gives, and a bad item in a later step is named by its index in the whole batch."""
    step = validation.VALIDATE_STEP_ITEMS
    items = [item(topic=f"orders.{i % 3}", delay_ms=i) for i in range(2 * step + 3)]
    out: list[Any] = []
    yields = sum(1 for _ in validation.validate_publish_items_in_steps(items, LIMITS, NOW_MS, out))
    assert yields == 2
    assert out == validate_publish_items(items, LIMITS, NOW_MS)
    assert [due for _, _, due, _ in out] == [NOW_MS + i for i in range(2 * step + 3)]

    bad_at = step + 7
    items[bad_at] = item(payload="text")
    steps = validation.validate_publish_items_in_steps(items, LIMITS, NOW_MS, [])
    next(steps)  # the first step passes
    with pytest.raises(RequestError) as info:
        next(steps)
    assert info.value.code is ErrorCode.INVALID_FIELD
    assert info.value.item_index == bad_at
