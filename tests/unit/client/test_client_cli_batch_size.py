"""futureq-cli publish --file: ``--batch-size`` is 1 to 1000, as docs/cli.md says.

Found by a tester: ``--batch-size 100000`` and ``1001`` ran with exit 0 (the client cut
them to its ``max_batch_items`` without a word). Refused when parsed, exit 2, with the
bound; ``--batch-size`` without ``--file`` (where it means nothing) is refused too.
"""

from __future__ import annotations

import io

import pytest

from futureq.cli import client_arguments, client_main
from futureq.cli.client_parser import build_parser

NOWHERE = ["--server", "127.0.0.1:1", "--request-timeout", "1s"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    err = io.StringIO()
    code = client_main.main([*NOWHERE, *argv], stdout=io.StringIO(), stderr=err)
    return code, err.getvalue() + capsys.readouterr().err  # argparse writes to sys.stderr


@pytest.mark.parametrize("size", ["1001", "100000", "0", "-1"])
def test_a_batch_size_out_of_bounds_is_a_usage_error_with_the_bound(
    size: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(["publish", "--file", "/dev/null", "--batch-size", size], capsys)
    assert code == 2, err
    assert "argument --batch-size" in err, err
    assert "at most 1000" in err or "must be >= 1" in err, err


def test_the_bounds_and_the_default_are_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    assert (client_arguments.MAX_BATCH_SIZE, client_arguments.DEFAULT_BATCH_SIZE) == (
        1000,
        500,
    )  # cli.md
    for size in ("1", "1000"):
        args = build_parser().parse_args(["publish", "--file", "f", "--batch-size", size])
        assert args.batch_size == int(size)
    code, err = _run(["publish", "--file", "/dev/null", "--batch-size", "1000"], capsys)
    assert code == 1 and "CONNECTION_LOST" in err, err  # parsed, then no broker


def test_a_batch_size_without_a_file_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(["publish", "t", "x", "--batch-size", "10"], capsys)
    assert code == 2 and "--batch-size: only with --file" in err, err
