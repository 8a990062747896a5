"""futureq-cli publish: a header given twice is a usage error naming it.

Found by a tester: ``publish hd1 x --header a=1 --header a=2`` stored only ``a=2``
(the flags went into a dict, the last one won) and said nothing. A message has one
value per header name (``docs/cli.md``, "publish"): refused before anything is sent,
exit 2. And ``publish --file`` takes headers and keys from each line: a ``--header`` or
``--idempotency-key`` beside it was dropped without a word, and is refused too.
"""

from __future__ import annotations

import io

import pytest

from futureq.cli import client_main

NOWHERE = ["--server", "127.0.0.1:1", "--request-timeout", "1s"]
"""No broker listens there: a command that connected would fail with exit 1."""


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    err = io.StringIO()
    code = client_main.main([*NOWHERE, *argv], stdout=io.StringIO(), stderr=err)
    return code, err.getvalue() + capsys.readouterr().err  # argparse writes to sys.stderr


def test_a_header_given_twice_is_refused_with_its_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, err = _run(["publish", "hd1", "x", "--header", "a=1", "--header", "a=2"], capsys)
    assert code == 2, err
    assert "argument --header: 'a' is given twice (a=1, a=2)" in err, err


def test_header_names_differing_in_case_are_two_headers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, err = _run(["publish", "hd1", "x", "--header", "a=1", "--header", "A=2"], capsys)
    assert code == 1 and "CONNECTION_LOST" in err, err  # parsed, then no broker


@pytest.mark.parametrize("flag", [["--header", "a=1"], ["--idempotency-key", "k"]])
def test_publish_file_refuses_the_flags_each_line_gives(
    flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(["publish", "--file", "/dev/null", *flag], capsys)
    assert code == 2, err
    assert f"drop {flag[0]}" in err, err
