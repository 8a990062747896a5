"""JSON fidelity of ``futureq-cli`` (futureq.cli.jsonl): payload bytes go out exactly as
written, values JSON cannot carry are refused with their line and column, and every
error points at the right column (issue 13's inputs, and their siblings)."""

from __future__ import annotations

import pytest

from futureq.cli.jsonl import (
    LineError,
    LineFailure,
    parse_jsonl,
    parse_jsonl_line,
    record_line,
    strict_loads,
)
from futureq.client import PublishItem


@pytest.mark.parametrize(
    "payload",
    [
        '{"amount":10.50}',
        '{"amount": 10.50, "currency": "EUR"}',
        "1.0",
        "-0",
        "1e2",
        "123456789012345678901234567890",
        '[1, 2.50, {"nested": [true, false, null]}]',
        '{"é": "\\u00e9", "emoji": "\\ud83d\\ude00"}',
        "null",
        "true",
    ],
)
def test_json_payloads_are_sent_exactly_as_written(payload: str) -> None:
    item = parse_jsonl_line(f'{{"topic": "t", "payload": {payload}, "ttl_ms": 5}}\n')
    assert item == PublishItem("t", payload.encode(), ttl_ms=5)


@pytest.mark.parametrize(
    ("line", "column", "reason"),
    [
        ('{"topic":"t","payload":{"v":1E400}}', 29, "1E400 is beyond the range of a 64-bit float"),
        ('{"topic":"t","payload":{"v":-1e999}}', 29, "beyond the range"),
        ('{"topic":"t","payload":{"v":NaN}}', 29, "NaN is not a JSON number"),
        ('{"topic":"t","payload":[Infinity]}', 25, "Infinity is not a JSON number"),
        ('{"topic":"t","payload":{"a":1,"a":2}}', 31, "the key 'a' appears twice"),
        ('{"topic":"t","payload":{"x":{"a":1,"a":2}}}', 36, "the key 'a' appears twice"),
        ('{"topic":"t","topic":"u","payload":1}', 14, "the key 'topic' appears twice"),
        ('{"topic":"t","payload":1,"delay_ms":NaN}', 37, "NaN is not a JSON number"),
    ],
)
def test_values_json_cannot_carry_are_refused_at_their_column(
    line: str, column: int, reason: str
) -> None:
    with pytest.raises(LineError) as refused:
        parse_jsonl_line(line)
    assert reason in refused.value.message
    assert refused.value.column == column, refused.value.message


@pytest.mark.parametrize(
    ("line", "column", "reason"),
    [
        # An error at the end of a line is at the end of that line, not "column 1".
        (
            '{"topic":"t"\n',
            13,
            "expected ',' or '}' after the value of 'topic' at the end of the line",
        ),
        ('{"topic":"t","payload":\n', 24, "Expecting value at the end of the line"),
        ('{"topic":"t","payload":"abc\n', 24, "Unterminated string starting"),
        ('{"topic":"t","payload":"a\tb"}', 26, "Invalid control character"),
        ('{"topic":"t","payload":1,}', 26, "expected a key in double quotes"),
        ('{"topic":"t" "payload":1}', 14, "expected ',' or '}'"),
        ('{"topic":"t","payload":1} {}', 27, "unexpected text after the object"),
        ('  {"topic":"é","payload":x}', 26, "Expecting value"),
        ('{"topic":"t","payload":1,"delay_ms":-1}', 37, "non-negative integer"),
        ('{"topic":"t","payload":1,"delay":5}', 26, "unknown field(s) delay"),
        ('{"topic":5,"payload":1}', 10, '"topic" must be a string'),
        (
            '{"topic":"t","payload":1,"payload_encoding":"hex"}',
            45,
            "payload_encoding must be one of",
        ),
        ('{"topic":"t","payload":"%%%","payload_encoding":"base64"}', 24, "not valid base64"),
        ('{"topic":"t","payload":1,"payload_encoding":"text"}', 24, "must be a string"),
        ('{"topic":"t","payload":1,"headers":"a=1"}', 36, '"headers" must be an object'),
        ('{"topic":"t","payload":1,"headers":["a"]}', 36, '"headers" must be an object'),
        (
            '{"topic":"t","payload":1,"headers":{"a":"1","n":2}}',
            49,
            "headers['n'] must be a string",
        ),
        ('{"topic":"t","payload":1,"headers":{"a": null}}', 42, "headers['a'] must be a string"),
        ('{"topic":"t","payload":1,"headers":{"a":{"b":"c"}}}', 41, "must be a string"),
        ('{"topic":"t","payload":1,"headers":{"a":"1","a":"2"}}', 45, "appears twice"),
        ('{"topic":"t","payload":1,"idempotency_key":17}', 44, '"idempotency_key" must be'),
        ('{"topic":"t","payload":1,"idempotency_key":""}', 44, "non-empty string"),
    ],
)
def test_errors_point_at_the_right_column(line: str, column: int, reason: str) -> None:
    with pytest.raises(LineError) as refused:
        parse_jsonl_line(line)
    assert reason in refused.value.message, refused.value.message
    assert refused.value.column == column, refused.value.message


def test_headers_and_idempotency_keys_are_read() -> None:
    line = (
        '{"topic":"t","payload":"x","headers":{"traceparent":"00-ab-01","é":""},'
        '"idempotency_key":"order-17"}'
    )
    assert parse_jsonl_line(line) == PublishItem(
        "t", b"x", headers={"traceparent": "00-ab-01", "é": ""}, idempotency_key="order-17"
    )
    nothing = '{"topic":"t","payload":"x","headers":null,"idempotency_key":null}'
    assert parse_jsonl_line(nothing) == PublishItem("t", b"x")
    assert parse_jsonl_line('{"topic":"t","payload":"x","headers":{}}') == PublishItem(
        "t", b"x", headers={}
    )


def test_errors_carry_their_line_number() -> None:
    lines = [
        '{"topic":"t","payload":{"amount":10.50}}\n',
        '{"topic":"t","payload":{"v":NaN}}\n',
        "\n",
        '{"topic":"t","payload":{"a":1,"a":2}}\n',
    ]
    items, failures = parse_jsonl(lines)
    assert [(i.line_number, i.item.payload) for i in items] == [(1, b'{"amount":10.50}')]
    assert [str(f) for f in failures] == [
        'line 2, column 29: the value of "payload": NaN is not a JSON number; '
        "send a finite number or a string",
        "line 4, column 31: the value of \"payload\": the key 'a' appears twice in one object",
    ]
    assert (
        str(LineFailure(7, "[PAYLOAD_TOO_LARGE] too big")) == "line 7: [PAYLOAD_TOO_LARGE] too big"
    )


@pytest.mark.parametrize(
    ("fields", "payload"),
    [
        ('"payload": "héllo"', "héllo".encode()),
        ('"payload": "héllo", "payload_encoding": "text"', "héllo".encode()),
        ('"payload": "héllo", "payload_encoding": "json"', '"héllo"'.encode()),
        ('"payload": {"a": 1}, "payload_encoding": "json"', b'{"a": 1}'),
        ('"payload": "/wD+AA==", "payload_encoding": "base64"', b"\xff\x00\xfe\x00"),
    ],
)
def test_payload_encodings(fields: str, payload: bytes) -> None:
    assert parse_jsonl_line(f'{{"topic": "t", {fields}}}') == PublishItem("t", payload)


@pytest.mark.parametrize(
    "payload",
    [
        b'{"amount":10.50}',
        b'{"v":NaN}',
        b'{"v":1E400}',
        b'{"a":1,"a":2}',
        b"\xff\xfe binary",
        b"line one\nline two",
        b"  padded  ",
        b"",
        '"quoted ✓"'.encode(),
    ],
)
def test_consume_records_are_strict_json_and_publish_back_to_the_same_bytes(
    payload: bytes,
) -> None:
    line = record_line({"id": 1, "topic": "t", "group": "g"}, payload, {"attempt": 1})
    assert "\n" not in line
    record = strict_loads(line)  # any strict parser takes it: no NaN, no Infinity
    assert list(record) == ["id", "topic", "group", "payload", "payload_encoding", "attempt"]
    # The record's payload and encoding, published again, give back the same bytes.
    republished = parse_jsonl_line(
        '{"topic": "t", ' + line[line.index('"payload":') : line.index(', "attempt"')] + "}"
    )
    assert republished is not None and republished.payload == payload


# -- lines that cannot be sent fail alone, with their column (tester's break A) -----


@pytest.mark.parametrize(
    ("line", "column", "says"),
    [
        # An integer msgpack cannot hold made the whole PUBLISH frame unencodable.
        (
            '{"topic":"t","payload":"x","delay_ms":123456789012345678901234567890}',
            39,
            "beyond the largest 64-bit millisecond value",
        ),
        ('{"topic":"t","payload":"x","ttl_ms":9223372036854775808}', 37, "beyond the largest"),
        # A lone surrogate cannot be UTF-8: the frame failed, or (payload) a traceback.
        ('{"topic":"t","payload":"x","headers":{"a":"\\ud800"}}', 44, "lone UTF-16 surrogate"),
        ('{"topic":"t","payload":"x","headers":{"\\udc00":"v"}}', 40, "lone UTF-16 surrogate"),
        ('{"topic":"t","payload":"\\ud800"}', 25, "lone UTF-16 surrogate (\\ud800)"),
        ('{"topic":"t","payload":"ok \\\\ud800 \\udbff"}', 36, "lone UTF-16 surrogate"),
        ('{"topic":"t","payload":"\\ud800\\ud800\\udc00"}', 25, "lone UTF-16 surrogate"),
        ('{"topic":"t\\ud800","payload":"x"}', 12, "lone UTF-16 surrogate"),
        ('{"topic":"t","payload":"x","idempotency_key":"\\udfff"}', 47, "lone UTF-16"),
        # 100,000 nested arrays: a RecursionError traceback before.
        ('{"topic":"t","payload":' + "[" * 100_000 + "]" * 100_000 + "}", 524, "more than 500"),
    ],
)
def test_lines_that_cannot_be_sent_are_refused_at_their_column(
    line: str, column: int, says: str
) -> None:
    with pytest.raises(LineError) as refused:
        parse_jsonl_line(line)
    assert says in refused.value.message
    assert refused.value.column == column, refused.value.message


def test_a_bad_line_leaves_its_neighbours_publishable() -> None:
    lines = [
        '{"topic":"t","payload":"good1"}',
        '{"topic":"t","payload":"x","delay_ms":123456789012345678901234567890}',
        '{"topic":"t","payload":"\\ud800"}',
        '{"topic":"t","payload":' + "[" * 5000 + "]" * 5000 + "}",
        '{"topic":"t","payload":"good2","headers":{"a":"\\ud83d\\ude00"}}',
    ]
    items, failures = parse_jsonl(lines)
    assert [(i.line_number, i.item.payload) for i in items] == [
        (1, b"good1"),
        (5, b"good2"),
    ]
    assert [f.line_number for f in failures] == [2, 3, 4]
    assert all(item.wire_bytes > 0 for item in items)  # measured for splitting by frame bytes


def test_deep_but_allowed_json_and_paired_surrogates_still_pass() -> None:
    deep = "[" * 500 + "]" * 500
    item = parse_jsonl_line(f'{{"topic":"t","payload":{deep}}}')
    assert item is not None and item.payload == deep.encode()
    item = parse_jsonl_line('{"topic":"t","payload":"\\ud83d\\ude00 \\\\ud800"}')
    assert item is not None and item.payload == "\U0001f600 \\ud800".encode()
    # As JSON text the escape is plain ASCII: sent exactly as written.
    item = parse_jsonl_line('{"topic":"t","payload":"\\ud800","payload_encoding":"json"}')
    assert item is not None and item.payload == b'"\\ud800"'


def test_a_consume_json_record_publishes_again() -> None:
    record = (
        '{"id": 549715968, "topic": "t", "group": "g", "payload": "1E400", '
        '"payload_encoding": "text", "due_ms": 1796567290623, "delivered_ms": '
        '1796567294524, "attempt": 1, "headers": {"h": "v"}}'
    )
    assert parse_jsonl_line(record) == PublishItem("t", b"1E400", headers={"h": "v"})


@pytest.mark.parametrize(
    "payload",
    [b'"\\ud800"', b'{"k":"\\udc00"}', b"[" * 600 + b"]" * 600, b"[" * 5000 + b"]" * 5000],
)
def test_payloads_strict_parsers_refuse_are_not_shown_as_json(payload: bytes) -> None:
    line = record_line({"topic": "t"}, payload, {})
    record = strict_loads(line)
    assert record["payload_encoding"] == "text"
    # ... and they publish again byte for byte.
    again = parse_jsonl_line(line)
    assert again is not None and again.payload == payload
