"""futureq-cli: a time too far ahead is refused as too far ahead, and a unit mistake
suggests only a time that would be accepted.

Found by a tester: ``--at 9999-01-01T00:00:00Z`` said the time "is before 2000-01-01;
give a time to come" (any time from about 5138 on did), and ``--at 253402300800000``
suggested "did you mean 253402300800 (1978-01-11)", which ``--at`` refuses in turn. A
time more than 100 years ahead (the ceiling of ``limits.max_delay_ms``) now gets the
sentence of such a delay (``durations.delay_ms_arg``).
"""

from __future__ import annotations

import argparse
import io
import re

import pytest

from futureq.cli import client_main
from futureq.cli.client_arguments import parse_at_ms
from futureq.cli.durations import MAX_DELAY_MS
from futureq.wire.validation import MIN_PLAUSIBLE_EPOCH_MS, implausible_epoch_ms

NOW_MS = 1_777_636_801_000  # 2026-05-01T12:00:01Z
TOO_FAR = "years from now"
BOUND = "longer than any server takes: limits.max_delay_ms (and max_ttl_ms) is at most"


def _refusal(text: str) -> str:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        parse_at_ms(text, now_ms=NOW_MS)
    return str(refused.value)


@pytest.mark.parametrize(
    "text",
    [
        "9999-01-01T00:00:00Z",
        "5138-12-01T00:00:00Z",
        "253402300800000",  # 10000-01-01 in ms: as microseconds it would be 1978
        str(NOW_MS + MAX_DELAY_MS + 1),
        "99999999999999999999999999",
    ],
)
def test_a_time_too_far_ahead_is_refused_as_too_far_ahead(text: str) -> None:
    said = _refusal(text)
    assert TOO_FAR in said and BOUND in said, said
    assert "before 2000" not in said and "did you mean" not in said


def test_the_last_time_a_server_can_take_is_accepted() -> None:
    assert parse_at_ms(str(NOW_MS + MAX_DELAY_MS), now_ms=NOW_MS) == NOW_MS + MAX_DELAY_MS
    assert parse_at_ms("2126-01-01T00:00:00Z", now_ms=NOW_MS) == 4_922_899_200_000


@pytest.mark.parametrize(
    "text",
    [
        "1777636801",  # seconds
        "1777636801000000",  # microseconds
        "1777636801000000000",  # nanoseconds
        "5000000000",  # seconds, but 5000000000000 ms is 2128: more than 100 years ahead
        "253402300800000",
        "100000000000001",  # just past 5138: as microseconds, 1973
    ],
)
def test_a_suggested_time_is_one_that_would_be_accepted(text: str) -> None:
    said = _refusal(text)
    for suggested in re.findall(r"did you mean (\d+)", said):
        assert parse_at_ms(suggested, now_ms=NOW_MS) == int(suggested), said


def test_the_shared_rule_never_suggests_a_time_it_refuses() -> None:
    """``wire.validation`` (server, client library, JSONL) suggested 1978 for year 10000."""
    said = implausible_epoch_ms("deliver_at_ms", 253_402_300_800_000)
    assert said is not None and "did you mean" not in said, said
    for value in (100_000_000_000_001, 946_684_799_999_999, 10**18, 10**21):
        said = implausible_epoch_ms("deliver_at_ms", value) or ""
        for suggested in re.findall(r"did you mean (\d+)", said):
            assert implausible_epoch_ms("deliver_at_ms", int(suggested)) is None, said
            assert int(suggested) >= MIN_PLAUSIBLE_EPOCH_MS


@pytest.mark.parametrize(
    "argv",
    [
        ["publish", "tat", "x", "--at", "9999-01-01T00:00:00Z"],
        ["reschedule", "tat", "1", "--at", "9999-01-01T00:00:00Z"],
        ["browse", "tat", "--from", "9999-01-01T00:00:00Z"],
    ],
)
def test_every_time_flag_says_too_far_ahead_before_connecting(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code = client_main.main(
        ["--server", "127.0.0.1:1", *argv], stdout=io.StringIO(), stderr=io.StringIO()
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert TOO_FAR in err and "before 2000" not in err, err


def test_a_leap_second_is_the_second_after_59_and_other_digits_are_refused() -> None:
    """RFC 3339 writes a leap second as ``23:59:60``: it was refused as "neither an RFC
    3339 / ISO 8601 time"; in ms since the epoch it is the second after ``:59``.
    Digits of other scripts (``١٧٩...``, full-width ``２０２６``) were read as numbers
    (or, for ``²``, failed with argparse's bare "invalid parse_at_ms value")."""
    now_ms = 1_800_000_000_000
    before = parse_at_ms("2026-12-31T23:59:59Z", now_ms=now_ms)
    assert parse_at_ms("2026-12-31T23:59:60Z", now_ms=now_ms) == before + 1000
    assert parse_at_ms("2026-12-31T23:59:60.500Z", now_ms=now_ms) == before + 1500
    for text in ("²", "١٧٩٦٦٣٣٢٧٧٦٩٣", "２０２６-12-07T10:00:00Z", "2026-12-07T１0:00:00Z"):
        with pytest.raises(argparse.ArgumentTypeError, match="neither an RFC 3339"):
            parse_at_ms(text, now_ms=now_ms)
