"""``futureq-cli`` mistakes that need no broker, found by a tester.

* ``--request-timeout 2d`` passed the parser and died in ``open_client`` with a
  ``ValueError`` traceback (the client takes deadlines of at most a day): now a usage
  error, exit 2, with the bound.
* Ctrl-C at ``purge``'s confirmation prompt printed a ``KeyboardInterrupt`` traceback:
  now exit 130, nothing purged; a ``purge`` started with stdin closed is refused like
  one without a terminal, not an ``AttributeError`` traceback.
* ``group create --visibility-timeout 0`` went to the server, refused there with advice
  in wire terms: now a usage error naming the range.
"""

from __future__ import annotations

import io
import os
import pty
import select
import signal
import subprocess
import sys

import pytest

from futureq.cli import client_main

NOWHERE = ["--server", "127.0.0.1:1"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    err = io.StringIO()
    code = client_main.main([*NOWHERE, *argv], stdout=io.StringIO(), stderr=err)
    return code, err.getvalue() + capsys.readouterr().err  # argparse writes to sys.stderr


@pytest.mark.parametrize("deadline", ["2d", "86400001", "1000000000d"])
def test_a_request_timeout_over_a_day_is_a_usage_error(
    deadline: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(["--request-timeout", deadline, "status"], capsys)
    assert code == 2, err
    assert "argument --request-timeout" in err and "at most 1d" in err, err
    assert "Traceback" not in err


def test_a_request_timeout_of_a_day_is_taken(capsys: pytest.CaptureFixture[str]) -> None:
    # Parsed and used: no broker at 127.0.0.1:1, so the connection error (not a usage one).
    code, err = _run(["--request-timeout", "1d", "status"], capsys)
    assert code == 1 and "CONNECTION_LOST" in err, err


@pytest.mark.parametrize("timeout", ["0", "50ms", "13h"])
def test_a_group_visibility_timeout_out_of_range_is_a_usage_error(
    timeout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # It went to the server, which refused it with advice in wire terms ("send nil").
    code, err = _run(["group", "create", "t", "g", "--visibility-timeout", timeout], capsys)
    assert code == 2, err
    assert "argument --visibility-timeout" in err and "100ms to 12h" in err, err
    assert "leave --visibility-timeout out" in err and "nil" not in err, err


@pytest.mark.parametrize("timeout", ["100ms", "12h"])
def test_a_group_visibility_timeout_at_its_bounds_is_taken(
    timeout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(["group", "create", "t", "g", "--visibility-timeout", timeout], capsys)
    assert code == 1 and "CONNECTION_LOST" in err, err


def _cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "futureq.cli.client_main", *NOWHERE, *args]


def test_ctrl_c_at_the_purge_prompt_is_no_traceback() -> None:
    main_end, terminal = pty.openpty()
    try:
        with subprocess.Popen(
            _cli_command("purge", "brk.t"),
            stdin=terminal,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # SIGINT as a terminal gives it (a background CI shell ignores it).
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        ) as process:
            try:
                assert process.stderr is not None
                ready, _, _ = select.select([process.stderr], [], [], 30)
                assert ready, "no prompt within 30 s"
                prompt = process.stderr.readline()
                assert "Type 'yes'" in prompt, prompt
                process.send_signal(signal.SIGINT)
                out, err = process.communicate(timeout=20)
            finally:
                process.kill()
    finally:
        os.close(main_end)
        os.close(terminal)
    assert process.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_purge_with_stdin_closed_is_refused_like_without_a_terminal() -> None:
    done = subprocess.run(
        _cli_command("purge", "brk.t"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        preexec_fn=lambda: os.close(0),
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: purge removes every message"), done.stderr
