"""futureq-cli pure helpers: JSONL parsing with line numbers, payload rendering, errors."""

from __future__ import annotations

import argparse
import base64
import io
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from futureq.cli.client_arguments import parse_at_ms
from futureq.cli.client_main import main
from futureq.cli.client_parser import build_parser, deprecation_warnings
from futureq.cli.consume_command import DEFAULT_PREFETCH
from futureq.cli.jsonl import (
    LineError,
    LineFailure,
    parse_jsonl,
    parse_jsonl_line,
    render_payload,
    strict_loads,
)
from futureq.cli.output import error_line, format_ms
from futureq.client import PublishItem
from futureq.errors import ConnectionLostError, ErrorCode, RemoteProtocolError, RequestError


def test_jsonl_good_line_shapes() -> None:
    # A JSON payload is sent exactly as written (spaces, number spellings and all).
    assert parse_jsonl_line('{"topic": "t", "payload": {"a": [1, 2]}}') == PublishItem(
        "t", b'{"a": [1, 2]}'
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
        ("{oops", "expected a key"),
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
        (  # a Windows editor's UTF-8 BOM: invisible, the line shows a '{'
            '\ufeff{"topic": "t", "payload": 1}',
            "starts with a byte order mark .* save the file as UTF-8 without BOM",
        ),
    ],
)
def test_jsonl_bad_lines_say_why(line: str, reason: str) -> None:
    with pytest.raises(LineError, match=reason):
        parse_jsonl_line(line)


def test_jsonl_reports_line_numbers_and_skips_blanks() -> None:
    lines = ['{"topic":"a","payload":1}\n', "\n", "nope\n", '{"topic":"b","payload":"x"}\n']
    items, failures = parse_jsonl(lines)
    assert [item.line_number for item in items] == [1, 4]
    assert [item.item.topic for item in items] == ["a", "b"]
    assert [failure.line_number for failure in failures] == [3]
    assert isinstance(failures[0], LineFailure) and "expected a JSON object" in failures[0].reason
    assert str(failures[0]) == "line 3, column 1: expected a JSON object (a line starting with {)"


def test_string_payloads_are_sent_as_their_text() -> None:
    assert parse_jsonl_line('{"topic":"t","payload":"héllo"}') == PublishItem("t", "héllo".encode())
    assert parse_jsonl_line('{"topic":"t","payload":3}') == PublishItem("t", b"3")


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b'{"a": 1}', ('{"a": 1}', "json")),
        (b'{"amount":10.50}', ('{"amount":10.50}', "json")),
        (b"42", ("42", "json")),
        (b"hello world", ('"hello world"', "text")),
        (b"", ('""', "text")),
        (b" 42", ('" 42"', "text")),  # kept exactly: not JSON with the blank
        (b'{"v":NaN}', ('"{\\"v\\":NaN}"', "text")),
        (b'{"v":1E400}', ('"{\\"v\\":1E400}"', "text")),
        (b'{"a":1,"a":2}', ('"{\\"a\\":1,\\"a\\":2}"', "text")),
        (b'{"a":\n1}', ('"{\\"a\\":\\n1}"', "text")),
        (b"\xff\x00", ('"/wA="', "base64")),
    ],
)
def test_render_payload(payload: bytes, expected: tuple[str, str]) -> None:
    assert render_payload(payload) == expected


@given(st.binary(max_size=64) | st.text(max_size=32).map(str.encode))
def test_rendered_payloads_are_strict_json_and_give_back_the_bytes(payload: bytes) -> None:
    text, encoding = render_payload(payload)
    assert "\n" not in text and "\r" not in text
    value = strict_loads(text)
    if encoding == "json":
        assert text.encode() == payload
    elif encoding == "text":
        assert value.encode() == payload
    else:
        assert encoding == "base64" and base64.b64decode(value) == payload


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
    with pytest.raises(argparse.ArgumentTypeError, match=says) as refused:
        parse_at_ms(text)
    # --from and --to parse times too: the sentence must not name --at (argparse puts
    # "argument --to: " before it).
    assert "--at" not in str(refused.value)


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
        ["--request-timeout", "2s", "consume", "t", "--group", "g", "--idle-timeout", "500ms"]
    )
    assert args.server == "10.0.0.1:1,10.0.0.2:2"
    assert args.token == "tok"
    assert args.request_timeout_ms == 2_000
    assert args.idle_timeout_ms == 500
    # Not given: consume uses its default window, and can say so when a server refuses it.
    assert args.prefetch is None and DEFAULT_PREFETCH == 100 and args.count is None
    assert deprecation_warnings(args) == []
    assert build_parser().parse_args(["status"]).request_timeout_ms == 30_000


def test_timeout_has_one_meaning_per_name_and_the_old_spelling_warns() -> None:
    """``--timeout`` was both the request deadline (before the command) and consume's
    idle time; each meaning has its own name now, the old one still works and warns."""
    args = build_parser().parse_args(
        ["--timeout", "2s", "consume", "t", "--group", "g", "--timeout", "500ms"]
    )
    assert args.request_timeout_ms == 2_000
    assert args.idle_timeout_ms == 500
    assert deprecation_warnings(args) == [
        "warning: --timeout is deprecated: here it sets how long consume waits for a message; "
        "use --idle-timeout",
        "warning: --timeout is deprecated: here it sets the request deadline; "
        "use --request-timeout",
    ]
    stdout, stderr = io.StringIO(), io.StringIO()
    assert (
        main(["--timeout", "1s", "--server", "127.0.0.1:1", "status"], stdout=stdout, stderr=stderr)
        == 1
    )
    assert stderr.getvalue().splitlines()[0] == (
        "warning: --timeout is deprecated: here it sets the request deadline; use --request-timeout"
    )


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


def test_browse_lines_quote_header_text_that_could_split_or_forge_a_line() -> None:
    from futureq.cli.manage_commands import pending_line, shown_text
    from futureq.client import PendingMessage

    assert shown_text("text/plain") == "text/plain"
    assert shown_text("a b") == '"a b"' and shown_text("") == '""'
    assert shown_text('say "hi"\\') == '"say \\"hi\\"\\\\"'
    assert shown_text("é") == "é"
    forged = {"x\n#99 due=parked attempt=0": "v\x00w", "k": "rtl\u202eevil\u2028next"}
    message = PendingMessage(7, None, 0, 1, forged, None, None)
    line = pending_line(message, dead_letters=False)
    assert "\n" not in line and "\x00" not in line
    assert "\u202e" not in line and "\u2028" not in line
    assert '"x\\n#99 due=parked attempt=0"="v\\u0000w"' in line
    assert 'k="rtl\\u202eevil\\u2028next"' in line
    dead = {"futureq-original-topic": "t\r", "futureq-reason-text": "bad\nline"}
    dead_line = pending_line(PendingMessage(8, None, 0, 1, dead, None, None), dead_letters=True)
    assert "\n" not in dead_line and "\r" not in dead_line
    assert 'from="t\\r"/?' in dead_line and 'text="bad\\nline"' in dead_line


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["dlq", "redrive", "t", "--all", "--reason", "bogus"], "'max-deliveries', 'rejected'"),
        (["browse", "t", "--all", "--limit", "5"], "not allowed with argument --all"),
        (["dlq", "list", "t", "--limit", "5", "--all"], "not allowed with argument --limit"),
        (["browse", "t", "--limit", "0"], "must be >= 1"),
        (["browse", "t", "--preview", "1025"], "0 to 1024 bytes"),
        (["dlq", "list", "t", "--preview", "-1"], "0 to 1024 bytes"),
    ],
)
def test_browse_and_dlq_usage_mistakes_exit_2_with_a_sentence(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    assert words in capsys.readouterr().err


def test_browse_and_dlq_accept_the_edges() -> None:
    args = build_parser().parse_args(["browse", "t", "--limit", "1", "--preview", "1024"])
    assert (args.limit, args.preview, args.all) == (1, 1024, False)
    args = build_parser().parse_args(["dlq", "redrive", "t", "--all", "--reason", "expired"])
    assert args.reason == "expired" and args.group is None


def test_the_status_table_shows_the_oldest_due_age_and_the_next_due_time() -> None:
    from futureq.cli.admin_commands import _table, age_text, group_table_rows
    from futureq.cli.output import Output

    assert [age_text(ms) for ms in (0, 950, 90_000, 183_600_000)] == [
        "0s",
        "950ms",
        "1m30s",
        "2d3h",
    ]
    group = {"topic": "t", "group": "g", "pending": 3, "oldest_due_age_ms": 90_000}
    rows = group_table_rows(
        [{**group, "next_due_ms": 1_767_225_600_000}, {**group, "next_due_ms": None}]
    )
    assert (rows[0]["oldest_due_age"], rows[0]["next_due"]) == ("1m30s", "2026-01-01T00:00:00.000Z")
    assert rows[1]["next_due"] is None
    out = io.StringIO()
    from futureq.cli.admin_commands import _GROUP_COLUMNS

    _table("consumer groups", _GROUP_COLUMNS, rows, Output(out, io.StringIO()))
    text = out.getvalue()
    assert "oldest due age" in text and "next due" in text
    assert "1m30s" in text and "2026-01-01T00:00:00.000Z" in text


def test_a_payload_is_read_only_up_to_its_limit_and_one_byte_more() -> None:
    from futureq.cli.publish_commands import read_payload

    class Endless(io.RawIOBase):
        """Zeros for ever, counting what was read; short reads, like a pipe."""

        read_total = 0

        def readinto(self, buffer: Any) -> int:
            n = min(len(buffer), 7)
            buffer[:n] = b"\0" * n
            self.read_total += n
            return n

    source = Endless()
    with pytest.raises(RequestError) as refused:
        read_payload(source, 100, "standard input")
    assert refused.value.code is ErrorCode.PAYLOAD_TOO_LARGE
    assert "the payload from standard input is more than 100 bytes" in refused.value.message
    assert source.read_total == 101
    assert read_payload(io.BytesIO(b"x" * 100), 100, "f") == b"x" * 100


def test_browse_previews_escape_what_could_forge_a_line_or_drive_the_terminal() -> None:
    from futureq.cli.manage_commands import escape_controls, pending_line
    from futureq.client import PendingMessage

    forged = "one\n#99 due=parked attempt=0 bytes=1: forged\x1b[31mRED\r\u2028"
    line = pending_line(PendingMessage(7, None, 0, 1, {}, forged.encode(), None), False)
    assert line.endswith(": one\\n#99 due=parked attempt=0 bytes=1: forged\\u001b[31mRED\\r\\u2028")
    as_json = pending_line(
        PendingMessage(7, None, 0, 1, {}, '{"a":"\u2028"}'.encode(), None), False
    )
    assert as_json.endswith(': {"a": "\\u2028"}')
    assert escape_controls("plain é text") == "plain é text"


@pytest.mark.parametrize(
    ("argv", "env", "says"),
    [
        (["--server", "nonsense", "status"], None, "--server: 'nonsense' is not HOST:PORT"),
        (["status"], "bad:port", "$FUTUREQ_SERVER: 'bad:port': port 'port' is not a number"),
        (["--server", "a:1,", "--server", ",", "status"], None, "at least one server"),
        (["--request-timeout", "0", "status"], None, "'0' leaves no time for any request"),
        (["--timeout", "0ms", "status"], None, "leaves no time for any request"),
        (["publish", "t", "x", "--delay", "-5s"], None, "'-5s' is negative; durations cannot"),
        (["publish", "t", "x", "--ttl=-1h30m"], None, "durations cannot be negative"),
        (
            ["consume", "t", "--group", "g", "--requeue-delay", "5s"],
            None,
            "--requeue-delay: only with --nack",
        ),
        (
            ["consume", "t", "--group", "g", "--no-ack", "--requeue-delay", "0"],
            None,
            "--requeue-delay: only with --nack",
        ),
        # Digits other than 0-9 (int() takes them; the time flags do not).
        (["consume", "t", "--count", "\u0661\u0660"], None, "is not an integer (digits 0-9)"),
        (["consume", "t", "--prefetch", "1_000"], None, "is not an integer (digits 0-9)"),
        (["cluster", "remove-node", "\u0663"], None, "is not a node id"),
    ],
)
def test_flag_mistakes_are_usage_errors_with_a_sentence(
    argv: list[str],
    env: str | None,
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if env is None:
        monkeypatch.delenv("FUTUREQ_SERVER", raising=False)
    else:
        monkeypatch.setenv("FUTUREQ_SERVER", env)
    assert main(argv, stdout=io.StringIO(), stderr=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert says in err, err
    assert "expected one argument" not in err and "CONNECTION_LOST" not in err


def test_a_bad_server_variable_does_not_stop_completion(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUTUREQ_SERVER", "nonsense")
    assert main(["completion", "bash"], stdout=io.StringIO(), stderr=io.StringIO()) == 0


def test_a_refused_connection_says_so_and_names_the_address() -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    stderr = io.StringIO()
    assert main(["--server", address, "status"], stdout=io.StringIO(), stderr=stderr) == 1
    assert stderr.getvalue().startswith(
        f"error: [CONNECTION_LOST] could not connect to {address}: connection refused; "
        f"is a FutureQ server running at {address}?"
    ), stderr.getvalue()
    assert "All connection attempts failed" not in stderr.getvalue()


def test_a_local_view_asked_for_does_not_say_the_leader_could_not_be_asked() -> None:
    from futureq.cli.admin_commands import view_line

    follower = {
        "node_id": 2,
        "role": "follower",
        "view": "local",
        "leader_id": 1,
        "leader_address": "127.0.0.1:7450",
        "leader_only": ["due"],
    }
    asked = view_line(follower, local_asked=True)
    assert "could not be asked" not in asked
    assert asked.endswith(
        "--local asked for this node's own view (the leader is node 1 at 127.0.0.1:7450)"
    )
    assert view_line(follower).endswith(
        "the leader is node 1 at 127.0.0.1:7450, which could not be asked"
    )


def test_publish_file_batches_fit_the_frame_limit() -> None:
    from futureq.cli.jsonl import JsonlItem
    from futureq.cli.publish_commands import frame_batches

    def items(*sizes: int) -> list[JsonlItem]:
        return [JsonlItem(n, PublishItem("t", bytes(size))) for n, size in enumerate(sizes, 1)]

    four_mib = 4 * 1024 * 1024
    assert [len(b) for b in frame_batches(items(*[700_000] * 10), 500, four_mib)] == [5, 5]
    assert [len(b) for b in frame_batches(items(*[10] * 7), 3, four_mib)] == [3, 3, 1]
    # One too large for any frame goes alone (and fails alone).
    assert [len(b) for b in frame_batches(items(10, 5_000_000, 10), 500, four_mib)] == [1, 1, 1]


@pytest.mark.parametrize(
    ("server", "says"),
    [
        ("::1", "'::1' holds more than one ':': an IPv6 address must be in brackets"),
        ("::1:7450", "'::1:7450' holds more than one ':': an IPv6 address must be in brackets"),
        ("[::1]", "'[::1]' has no port: give [::1]:PORT"),
    ],
)
def test_an_unbracketed_or_portless_ipv6_server_is_a_usage_error(
    server: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a tester: ``--server '[::1]'`` said "port '1]' is not a number", and
    ``::1:7450`` was read as ``[::1]:7450``."""
    assert main(["--server", server, "status"], stdout=io.StringIO(), stderr=io.StringIO()) == 2
    assert f"--server: {says}" in capsys.readouterr().err
