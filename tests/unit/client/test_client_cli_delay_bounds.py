"""futureq-cli: a delay no server can take is a usage error before anything is sent.

Found by a tester: ``consume --nack --requeue-delay 1000000d`` received and printed
messages, then every NACK was refused by the server (the messages stayed claimed until
their visibility timeout). ``--requeue-delay`` now takes the bounds and wording of
``publish --delay``, checked when the arguments are parsed (exit 2, no connection).
"""

from __future__ import annotations

import io

import pytest

from futureq.cli import client_main
from futureq.cli.durations import MAX_DELAY_MS, MIN_PLAUSIBLE_EPOCH_MS, delay_ms_arg
from futureq.config_checks import MAXIMA
from futureq.wire import validation

NOWHERE = ["--server", "127.0.0.1:1", "--request-timeout", "1s"]
"""No broker listens there: a command that connected would fail with exit 1."""


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = client_main.main([*NOWHERE, *argv], stdout=out, stderr=err)
    return code, err.getvalue() + capsys.readouterr().err  # argparse writes to sys.stderr


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("1000000d", "longer than any server takes: limits.max_delay_ms"),
        ("1700000000000", "looks like an absolute time in ms since the Unix epoch"),
        ("-5s", "is negative"),
        ("soon", "is not a duration"),
    ],
)
def test_a_bad_requeue_delay_is_refused_like_a_bad_publish_delay(
    value: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, consume_err = _run(
        ["consume", "t", "--group", "g", "--nack", "--requeue-delay", value], capsys
    )
    assert code == 2, consume_err
    assert f"argument --requeue-delay: '{value}' " in consume_err
    assert words in consume_err
    code, publish_err = _run(["publish", "t", "x", "--delay", value], capsys)
    assert code == 2, publish_err
    sentence = consume_err.split(f"'{value}' ", 1)[1]
    assert f"argument --delay: '{value}' {sentence}" in publish_err


def test_the_longest_delay_any_server_takes_is_accepted() -> None:
    assert delay_ms_arg("36600d") == MAX_DELAY_MS  # 100 years of 366 days
    assert delay_ms_arg("3d") == 259_200_000


def test_the_bounds_are_the_servers() -> None:
    assert MAX_DELAY_MS == MAXIMA["limits.max_delay_ms"][0] == MAXIMA["limits.max_ttl_ms"][0]
    assert MIN_PLAUSIBLE_EPOCH_MS == validation.MIN_PLAUSIBLE_EPOCH_MS
