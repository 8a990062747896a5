"""futureq.cli.durations: the duration spellings every CLI time flag accepts."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from futureq.cli.durations import MAX_DURATION_MS, duration_ms_arg, parse_duration_ms


@pytest.mark.parametrize(
    ("text", "expected_ms"),
    [
        ("250ms", 250),
        ("5s", 5_000),
        ("10m", 600_000),
        ("2h", 7_200_000),
        ("3d", 259_200_000),
        ("1500", 1_500),
        ("0", 0),
        ("0s", 0),
        ("1.5s", 1_500),
        ("0.1s", 100),
        (" 7S ", 7_000),
        ("2 h", 7_200_000),
        ("1h30m", 5_400_000),
        ("2m30s", 150_000),
        ("1d12h", 129_600_000),
        ("1m 30s", 90_000),
        ("1h0m5s250ms", 3_605_250),
        ("1.5h30s", 5_430_000),
    ],
)
def test_parses_every_unit(text: str, expected_ms: int) -> None:
    assert parse_duration_ms(text) == expected_ms


@pytest.mark.parametrize("text", ["", "s", "5x", "-5s", "5 s s", "1e3", "five", "1.0005s", "5.ms"])
def test_rejects_bad_text_with_a_sentence(text: str) -> None:
    with pytest.raises(ValueError, match="duration|milliseconds"):
        parse_duration_ms(text)


@pytest.mark.parametrize("text", ["30m1h", "1h1h", "5s2m", "1h30", "1h-30m", "h30m"])
def test_compound_durations_go_from_the_largest_unit_down(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration_ms(text)


@given(
    st.lists(st.integers(min_value=0, max_value=10**6), min_size=5, max_size=5),
    st.lists(st.booleans(), min_size=5, max_size=5),
)
def test_compound_durations_add_up(numbers: list[int], used: list[bool]) -> None:
    units = ["d", "h", "m", "s", "ms"]
    factors = [86_400_000, 3_600_000, 60_000, 1_000, 1]
    if not any(used):
        used = [False, False, False, False, True]
    text = "".join(f"{n}{u}" for n, u, keep in zip(numbers, units, used, strict=True) if keep)
    expected = sum(n * f for n, f, keep in zip(numbers, factors, used, strict=True) if keep)
    assert parse_duration_ms(text) == expected


def test_rejects_overflow() -> None:
    with pytest.raises(ValueError, match="largest duration"):
        parse_duration_ms(f"{MAX_DURATION_MS + 1}")


def test_argparse_adapter_reports_usage_error() -> None:
    parser = argparse.ArgumentParser(prog="t", exit_on_error=False)
    parser.add_argument("--delay", type=duration_ms_arg)
    assert parser.parse_args(["--delay", "5s"]).delay == 5_000
    with pytest.raises(argparse.ArgumentError, match="is not a duration"):
        parser.parse_args(["--delay", "5x"])


@given(st.integers(min_value=0, max_value=10**9), st.sampled_from(["ms", "s", "m", "h", "d"]))
def test_round_trips_whole_numbers(number: int, unit: str) -> None:
    factor = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}[unit]
    assert parse_duration_ms(f"{number}{unit}") == number * factor


@pytest.mark.parametrize("text", ["²", "5²", "١٢", "١h", "１s", "1.５s"])
def test_digits_other_than_ascii_are_not_a_duration(text: str) -> None:
    """``--delay ²`` said Python's "invalid literal for int() with base 10"; ``--delay
    ١٢`` (Arabic-Indic digits) was taken as 12 ms. Both get the sentence of the forms."""
    with pytest.raises(ValueError, match="is not a duration; use a number with a unit"):
        parse_duration_ms(text)
