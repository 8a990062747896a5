"""futureq-cli: a number flag too large for the protocol is a usage error naming the
flag (exit 2, nothing sent), never a request the encoder cannot build.

Found by testers: ``group create --max-deliveries 10**30`` printed ``[INVALID_FIELD]
GROUP_CREATE request not sent: cannot encode frame``, and ``consume --prefetch
10**30`` failed in the client library. The flags taking ids, times and durations
already had bounds; these are checked in the same place for every integer flag.
"""

from __future__ import annotations

import io

import pytest

from futureq.cli import client_main

NOWHERE = ["--server", "127.0.0.1:1", "--request-timeout", "1s"]
"""No broker listens there: a command that connected would fail with exit 1."""

WIDE = str(2**70)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = client_main.main([*NOWHERE, *argv], stdout=out, stderr=err)
    return code, err.getvalue() + capsys.readouterr().err  # argparse writes to sys.stderr


@pytest.mark.parametrize(
    ("argv", "flag", "words"),
    [
        (["group", "create", "t", "g", "--max-deliveries", WIDE], "--max-deliveries", "1 to 1,000,000"),
        (["group", "create", "t", "g", "--max-deliveries", "1000001"], "--max-deliveries", "1 to 1,000,000"),
        (["consume", "t", "--group", "g", "--prefetch", WIDE], "--prefetch", "1 to 1,000,000"),
        (["reschedule", "t", "1", "--delay", WIDE], "--delay", "longer than"),
        (["reschedule", "t", "1", "--at", WIDE], "--at", "longer than any server takes"),
        (["reschedule", "t", WIDE, "--delay", "1s"], "ID", "message ids are 0 to 2**64-1"),
        (["browse", "t", "--from", WIDE], "--from", "longer than any server takes"),
        (["browse", "t", "--preview", WIDE], "--preview", "the preview is 0 to"),
        (["dlq", "redrive", "t", WIDE], "ID", "message ids are 0 to 2**64-1"),
        (["cluster", "remove-node", WIDE], "NODE_ID", "node ids are 1 to 2147483647"),
        (["publish", "--batch-size", WIDE, "t", "x"], "--batch-size", "give 1 to"),
    ],
)  # fmt: skip
def test_a_number_flag_beyond_its_range_is_a_usage_error_naming_it(
    argv: list[str], flag: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(argv, capsys)
    assert code == 2, err
    assert f"argument {flag}: " in err and words in err, err
    assert "Traceback" not in err and "INVALID_FIELD" not in err
