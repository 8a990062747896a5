"""futureq-cli: a word of the command line that is not UTF-8.

Found by a tester: ``publish t1 $'\\xff\\xfe'`` died with a UnicodeEncodeError traceback,
and ``--token $'\\xff'`` said ``[INVALID_FRAME] cannot encode frame`` without naming the
token. Python decodes argv with ``surrogateescape``, so such a byte arrives as a lone
surrogate (``'\\udcff'``). A payload is bytes: it is sent as the bytes the shell passed
(an integration test checks them on a real broker). Everything else that reaches the
wire is text: a usage error naming its flag (exit 2), before anything is sent.
"""

from __future__ import annotations

import io
import os

import pytest

from futureq.cli import client_main
from futureq.cli.argv_text import argv_bytes, not_text

NOWHERE = ["--server", "127.0.0.1:1", "--request-timeout", "1s"]
"""No broker listens there: a command that connected would fail with exit 1."""
FF = os.fsdecode(b"\xff")
"""What Python makes of the argv byte 0xff: ``'\\udcff'``."""


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = client_main.main(argv, stdout=out, stderr=err)
    return code, err.getvalue() + capsys.readouterr().err  # argparse writes to sys.stderr


def test_a_payload_word_is_the_bytes_the_shell_passed() -> None:
    assert argv_bytes(os.fsdecode(b"\xff\xfe")) == b"\xff\xfe"
    assert argv_bytes("héllo") == "héllo".encode()  # UTF-8 text stays its UTF-8
    assert not_text("héllo") is None
    assert not_text("k" + FF) == "is not UTF-8 text: byte 0xff at byte 2 of b'k\\xff'"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--token", FF, "status"], "--token: the token is not UTF-8 text: byte 0xff"),
        (["publish", "t", "x", "--header", f"a{FF}=1"], "argument --header: the name of"),
        (["publish", "t", "x", "--header", f"a={FF}"], "the value of 'a' is not UTF-8 text"),
        (
            ["publish", "t", "x", "--idempotency-key", f"k{FF}"],
            "argument --idempotency-key: the idempotency key is not UTF-8 text",
        ),
        (["cluster", "add-node", "5", f"h{FF}:1", "h:2"], "RAFT_HOST:PORT: the address is"),
        (["cluster", "add-node", "5", "h:1", "nonsense"], "'nonsense' is not HOST:PORT"),
        (["dlq", "redrive", "t", "--all", "--from-group", f"g{FF}"], "--from-group: group"),
        (["publish", "t", "\ud800"], "argument PAYLOAD: '\\ud800' at character 1"),
    ],
)
def test_a_word_the_wire_takes_as_text_is_a_usage_error_naming_its_flag(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run([*NOWHERE, *argv], capsys)
    assert code == 2, err
    assert says in err, err
    assert "Traceback" not in err and "INVALID_FRAME" not in err and "CONNECTION_LOST" not in err


def test_a_token_from_the_environment_is_named_as_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FUTUREQ_TOKEN", FF)
    code, err = _run([*NOWHERE, "status"], capsys)
    assert code == 2 and "$FUTUREQ_TOKEN: the token is not UTF-8 text" in err, err


@pytest.mark.parametrize(
    ("server", "says"),
    [
        (f"127.0.0.1{FF}:7450", "--server: the address is not UTF-8 text: byte 0xff at byte 10"),
        ("\u2603:7450", "--server: '\u2603:7450': '\u2603' is not a host name"),
    ],
)
def test_a_server_the_resolver_cannot_look_up_is_a_usage_error(
    server: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The old CLI crashed in the resolver's IDNA encoder with a traceback."""
    code, err = _run(["--server", server, "--request-timeout", "1s", "status"], capsys)
    assert code == 2, err
    assert says in err, err
    assert "Traceback" not in err
