"""``futureq-cli`` as a subprocess against a real node: payload text cannot forge an
output line or drive the terminal, a consume whose broker went away says so and exits
1, and mistakes in flags or addresses are usage errors with a sentence."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from broker_process import BrokerProcess
from cli_process import cli, pending


def test_payload_text_is_escaped_in_human_output_and_exact_in_json(
    broker: BrokerProcess,
) -> None:
    address = broker.client_address
    assert cli(address, "group", "create", "esc.t", "g").returncode == 0
    forged = "line1\n#999 esc.t/g attempt=1 due=2026-01-01T00:00:00.000Z: forged\x1b[31mRED"
    assert cli(address, "publish", "esc.t", forged).returncode == 0
    browsed = cli(address, "browse", "esc.t", "--group", "g", "--preview", "100")
    assert browsed.returncode == 0, browsed.stderr
    assert browsed.stdout.splitlines()[1:] == ["1 pending shown"]  # one message, one line
    assert "\x1b" not in browsed.stdout
    assert "line1\\n#999 esc.t/g" in browsed.stdout and "forged\\u001b[31mRED" in browsed.stdout
    consumed = cli(address, "consume", "esc.t", "--group", "g", "--count", "1", "--no-ack")
    assert consumed.returncode == 0, consumed.stderr
    assert len(consumed.stdout.splitlines()) == 1 and "\x1b" not in consumed.stdout
    assert consumed.stdout.rstrip("\n").endswith("forged\\u001b[31mRED")
    as_json = cli(address, "browse", "esc.t", "--group", "g", "--preview", "100", "--json")
    assert '"preview": "line1\\n#999' in as_json.stdout  # JSON escapes, parsers give it back


def test_consume_says_when_its_broker_went_away_instead_of_looking_idle(
    broker: BrokerProcess,
) -> None:
    command = [
        sys.executable,
        "-m",
        "futureq.cli.client_main",
        "--server",
        broker.client_address,
        "consume",
        "down.t",
        "--group",
        "g",
        "--idle-timeout",
        "4s",
    ]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as consume:
        time.sleep(1.5)
        broker.terminate()  # SIGTERM, and it stays down
        out, err = consume.communicate(timeout=60)
    assert consume.returncode == 1, (out, err)
    assert err.startswith(
        f"error: [CONNECTION_LOST] lost the connection to {broker.client_address} and could "
        "not reconnect"
    ), err


def test_a_payload_word_that_is_not_utf8_is_sent_as_the_bytes_the_shell_passed(
    broker: BrokerProcess,
) -> None:
    """``publish t $'\\xff\\xfe'`` died with a UnicodeEncodeError traceback: argv bytes
    that are not UTF-8 reach Python as lone surrogates. A payload is bytes."""
    address = broker.client_address
    published = subprocess.run(
        [sys.executable, "-m", "futureq.cli.client_main", "--server", address]
        + ["publish", "argv.b", b"\xff\xfe"],  # type: ignore[list-item]
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert published.returncode == 0, published.stderr
    assert cli(address, "publish", "argv.b", "héllo").returncode == 0
    consumed = cli(address, "consume", "argv.b", "--group", "g", "--count", "2", "--json")
    assert consumed.returncode == 0, consumed.stderr
    shown = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert [(r["payload"], r["payload_encoding"]) for r in shown] == [
        ("//4=", "base64"),  # b"\xff\xfe"
        ("héllo", "text"),
    ]


def test_browse_from_after_to_is_a_usage_error(broker: BrokerProcess) -> None:
    """Found by a tester: ``--from`` later than ``--to`` went to the server and came back
    INVALID_ARGUMENT (exit 1) naming the protocol's fields, not the flags."""
    address = broker.client_address
    assert cli(address, "group", "create", "range.t", "g").returncode == 0
    done = cli(
        address,
        "browse",
        "range.t",
        "--from",
        "2030-01-01T00:00:00Z",
        "--to",
        "2020-01-01T00:00:00Z",
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--from (2030-01-01T00:00:00.000Z) is not before --to (2020-01-01T00:00:00.000Z)" in (
        done.stderr
    )
    within = cli(address, "browse", "range.t", "--from", "2100-01-01T00:00:00Z", "--within", "1h")
    assert within.returncode == 2 and "is not before the end of --within" in within.stderr


def test_a_file_flag_naming_no_readable_file_is_a_usage_error_before_connecting(
    tmp_path: Path,
) -> None:
    """Found by a tester: ``publish --file /tmp`` printed ``[OS_ERROR] Is a directory``
    (exit 1) naming no flag, and only after connecting: with no server, the user saw
    CONNECTION_LOST instead. Checked first now (no server runs at this address)."""
    nowhere = "127.0.0.1:9"
    for flags, said in (
        (["--file", str(tmp_path)], "argument --file: " + str(tmp_path) + " is a directory"),
        (["--file", "/nonexistent/x.jsonl"], "argument --file: /nonexistent/x.jsonl: no such file"),
        (
            ["t", "--payload-file", "/nonexistent/p"],
            "argument --payload-file: /nonexistent/p: no such file",
        ),
    ):
        done = cli(nowhere, "publish", *flags)
        assert done.returncode == 2, done.stdout + done.stderr
        assert said in done.stderr, done.stderr
        assert "CONNECTION_LOST" not in done.stderr


def test_the_shortest_request_timeout_is_an_error_not_a_traceback(broker: BrokerProcess) -> None:
    """``--request-timeout 1ms`` (a deadline the parser takes) ended in a ValueError
    traceback from the client library: its default linger (1 ms) must be below the
    deadline. Now it runs, and a request that cannot be answered in time is an error
    line with exit status 1; a longer deadline works as ever."""
    for args in (["status"], ["publish", "short.deadline", "x"]):
        done = cli(broker.client_address, "--request-timeout", "1ms", *args)
        assert "Traceback" not in done.stderr, done.stderr
        assert done.returncode in (0, 1), done
        if done.returncode == 1:
            assert done.stderr.startswith("error: ["), done.stderr
    published = cli(broker.client_address, "--request-timeout", "3ms", "publish", "short.t", "x")
    assert "Traceback" not in published.stderr, published.stderr
    assert cli(broker.client_address, "--request-timeout", "10s", "status").returncode == 0


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_results_that_cannot_be_written_name_standard_output(broker: BrokerProcess) -> None:
    # Found by a tester: `consume ... > /dev/full` (a full disk) ended with `error:
    # [OS_ERROR] No space left on device`, naming nothing: which file, the broker's?
    address = broker.client_address
    assert cli(address, "publish", "full.t", "m1").returncode == 0
    command = [sys.executable, "-m", "futureq.cli.client_main", "--server", address]
    command += ["consume", "full.t", "--group", "g", "--count", "1", "--idle-timeout", "10s"]
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            command, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60, check=False
        )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == (
        "error: [OS_ERROR] No space left on device: writing to standard output"
    ), done.stderr
    assert pending(address, "full.t") == 1  # not printed, so not acked
