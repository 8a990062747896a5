"""futureq-cli pure helpers: JSONL parsing with line numbers, payload rendering, errors."""

from __future__ import annotations

import argparse
import io
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from futureq.cli.client_main import (
    LineFailure,
    build_parser,
    error_line,
    format_ms,
    main,
    parse_at_ms,
    parse_jsonl,
    parse_jsonl_line,
    payload_from_json,
    render_payload,
)
from futureq.client import PublishItem
from futureq.errors import ConnectionLostError, ErrorCode, RemoteProtocolError, RequestError


def test_jsonl_good_line_shapes() -> None:
    assert parse_jsonl_line('{"topic": "t", "payload": {"a": [1, 2]}}') == PublishItem(
        "t", b'{"a":[1,2]}'
    )
    assert parse_jsonl_line('{"topic": "t", "payload": "text", "delay_ms": 5}') == PublishItem(
        "t", b"text", delay_ms=5
    )
    assert parse_jsonl_line(
        '{"topic": "t", "payload": null, "deliver_at_ms": 1777636801000, "ttl_ms": 3}'
    ) == PublishItem("t", b"null", deliver_at_ms=1_777_636_801_000, ttl_ms=3)
    assert parse_jsonl_line("   \n") is None


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{oops", "invalid JSON"),
        ("[1]", "expected a JSON object"),
        ('{"payload": 1}', '"topic" must be a string'),
        ('{"topic": "t"}', '"payload" is missing'),
        ('{"topic": "t", "payload": 1, "delay": 5}', "unknown field"),
        ('{"topic": "t", "payload": 1, "delay_ms": -1}', "non-negative integer"),
        (  # issue 8, input 5: epoch seconds in deliver_at_ms
            '{"topic": "t", "payload": 1, "deliver_at_ms": 1777636801}',
            "looks like seconds since the Unix epoch; deliver_at_ms is in milliseconds",
        ),
        ('{"topic": "t", "payload": 1, "delay_ms": 1.5}', "non-negative integer"),
        ('{"topic": "t", "payload": 1, "delay_ms": 1, "deliver_at_ms": 2}', "not both"),
    ],
)
def test_jsonl_bad_lines_say_why(line: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_jsonl_line(line)


def test_jsonl_reports_line_numbers_and_skips_blanks() -> None:
    lines = ['{"topic":"a","payload":1}\n', "\n", "nope\n", '{"topic":"b","payload":"x"}\n']
    items, failures = parse_jsonl(lines)
    assert [item.line_number for item in items] == [1, 4]
    assert [item.item.topic for item in items] == ["a", "b"]
    assert [failure.line_number for failure in failures] == [3]
    assert isinstance(failures[0], LineFailure) and "invalid JSON" in failures[0].reason


def test_payload_from_json_keeps_strings_as_text() -> None:
    assert payload_from_json("héllo") == "héllo".encode()
    assert payload_from_json({"b": 1, "a": "é"}) == '{"b":1,"a":"é"}'.encode()
    assert payload_from_json(3) == b"3"


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b'{"a": 1}', ({"a": 1}, "json")),
        (b"42", (42, "json")),
        (b"hello world", ("hello world", "text")),
        (b"", ("", "text")),
        (b"\xff\x00", ("/wA=", "base64")),
    ],
)
def test_render_payload(payload: bytes, expected: tuple[object, str]) -> None:
    assert render_payload(payload) == expected


@given(st.binary(max_size=64))
def test_render_payload_is_always_json_serialisable(payload: bytes) -> None:
    value, encoding = render_payload(payload)
    assert encoding in {"json", "text", "base64"}
    json.dumps(value)


def test_parse_at_ms() -> None:
    assert parse_at_ms("1700000000000") == 1_700_000_000_000
    assert parse_at_ms("0") == 0  # "at once"
    assert parse_at_ms("2026-05-01T12:00:01Z") == 1_777_636_801_000
    assert parse_at_ms("2026-05-01T12:00:01") == 1_777_636_801_000  # no zone: UTC
    assert parse_at_ms("2026-05-01T14:00:01+02:00") == 1_777_636_801_000
    with pytest.raises(argparse.ArgumentTypeError, match="ISO 8601"):
        parse_at_ms("tomorrow")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-05-01t12:00:01.25z", 1_777_636_801_250),  # RFC 3339 allows t and z
        ("2026-05-01 12:00:01.123456789Z", 1_777_636_801_123),  # extra digits are cut
        ("2026-05-01T11:00:01-01:00", 1_777_636_801_000),
        ("2026-05-01T12:00Z", 1_777_636_800_000),
    ],
)
def test_parse_at_ms_accepts_rfc3339(text: str, expected: int) -> None:
    assert parse_at_ms(text) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("1777636801", "looks like seconds since the Unix epoch"),  # issue 8, input 5
        ("1777636801000000", "looks like microseconds"),
        ("1777636801000000000", "looks like nanoseconds"),
        ("1970-01-01T00:00:01Z", "before 2000-01-01"),
    ],
)
def test_parse_at_ms_refuses_unit_mistakes(text: str, says: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        parse_at_ms(text)


def test_format_ms() -> None:
    assert format_ms(1_000) == "1970-01-01T00:00:01.000Z"
    assert format_ms(1_700_000_000_123) == "2023-11-14T22:13:20.123Z"


def test_error_lines() -> None:
    assert (
        error_line(RequestError(ErrorCode.INVALID_TOPIC, "topic name is empty"), "s")
        == "error: [INVALID_TOPIC] topic name is empty"
    )
    assert error_line(RemoteProtocolError(ErrorCode.AUTH_FAILED, "bad token"), "s") == (
        "error: [AUTH_FAILED] bad token"
    )
    refused = error_line(
        ConnectionLostError("could not connect to 127.0.0.1:1: connection refused"), "127.0.0.1:1"
    )
    assert refused.startswith("error: [CONNECTION_LOST] could not connect to 127.0.0.1:1")
    assert "make run" in refused
    assert "\n" not in refused


def test_parser_defaults_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUTUREQ_SERVER", "10.0.0.1:1,10.0.0.2:2")
    monkeypatch.setenv("FUTUREQ_TOKEN", "tok")
    args = build_parser().parse_args(
        ["--timeout", "2s", "consume", "t", "--group", "g", "--timeout", "500ms"]
    )
    assert args.server == "10.0.0.1:1,10.0.0.2:2"
    assert args.token == "tok"
    assert args.request_timeout_ms == 2_000
    assert args.idle_timeout_ms == 500
    assert args.prefetch == 100 and args.count is None


@pytest.mark.parametrize(
    "argv",
    [
        ["publish"],
        ["publish", "t"],
        ["publish", "t", "p", "--payload-file", "f"],
        ["publish", "--file", "f", "t"],
        ["publish", "t", "p", "--delay", "1s", "--at", "5"],
        ["consume", "t"],
        ["consume", "t", "--group", "g", "--no-ack", "--nack"],
        ["consume", "t", "--group", "g", "--count", "0"],
        ["group"],
        ["bogus"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv, stdout=io.StringIO(), stderr=io.StringIO()) == 2
    assert "usage:" in capsys.readouterr().err
