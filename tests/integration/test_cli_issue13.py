"""futureq-cli as a subprocess against a real node: --version, shell completion that
bash really uses, durations like 1h30m, ``publish TOPIC -`` from standard input, one
meaning per flag name, JSONL errors at the right column, and JSON fidelity end to end
(exact payload bytes; values JSON cannot carry refused with their line; ``consume
--json`` always strict JSON)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from broker_process import BrokerProcess
from wire_client import WireClient

from futureq import __version__
from futureq.cli.jsonl import strict_loads


def cli(address: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "futureq.cli.client_main", "--server", address, *args],
        input=None if stdin is None else stdin.decode("latin-1"),
        capture_output=True,
        text=True,
        encoding="latin-1" if stdin is not None else None,
        timeout=60,
        check=False,
    )


def consume_json(address: str, topic: str, count: int) -> list[tuple[str, dict[str, Any]]]:
    """``(line, record)`` of each delivery ``consume --json`` prints."""
    done = cli(address, "consume", topic, "--group", "g", "--count", str(count), "--json")
    assert done.returncode == 0, done.stderr
    # Strict: a parser that refuses NaN, Infinity and repeated keys takes every line.
    return [(line, strict_loads(line)) for line in done.stdout.splitlines()]


def test_version_and_completion() -> None:
    done = cli("127.0.0.1:1", "--version")
    assert done.returncode == 0 and done.stdout.strip() == f"futureq-cli {__version__}"
    script = cli("127.0.0.1:1", "completion", "bash")
    assert script.returncode == 0 and "complete" in script.stdout
    bash = shutil.which("bash")
    assert bash is not None
    probe = (
        f"source /dev/stdin <<'EOF'\n{script.stdout}\nEOF\n"
        'COMP_WORDS=(futureq-cli con); COMP_CWORD=1; _shtab_futureq_cli; echo "${COMPREPLY[@]}"\n'
        "COMP_WORDS=(futureq-cli consume t --idle); COMP_CWORD=3; _shtab_futureq_cli; "
        'echo "${COMPREPLY[@]}"\n'
    )
    answered = subprocess.run([bash, "-c", probe], capture_output=True, text=True, timeout=30)
    assert answered.stdout.split("\n")[:2] == ["consume", "--idle-timeout"], answered
    for shell in ("zsh", "tcsh"):
        assert cli("127.0.0.1:1", "completion", shell).returncode == 0
    assert cli("127.0.0.1:1", "completion", "fish").returncode == 2


def test_stdin_payload_durations_and_flag_names(broker: BrokerProcess) -> None:
    address = broker.client_address
    binary = bytes(range(256)) * 3
    done = cli(address, "publish", "cli.stdin", "-", stdin=binary)
    assert done.returncode == 0, done.stderr
    [(_, record)] = consume_json(address, "cli.stdin", 1)
    assert record["payload_encoding"] == "base64"
    assert base64.b64decode(record["payload"]) == binary

    done = cli(address, "publish", "cli.later", "x", "--delay", "1h30m", "--ttl", "1d12h")
    assert done.returncode == 0, done.stderr
    status = json.loads(cli(address, "status", "--json").stdout)
    [later] = [t for t in status["topics"] if t["topic"] == "cli.later"]
    assert (later["groups"][0]["pending"], later["groups"][0]["due"]) == (1, 0)
    bad = cli(address, "publish", "cli.later", "x", "--delay", "30m1h")
    assert bad.returncode == 2 and "from the largest to the smallest" in bad.stderr

    # consume --idle-timeout ends a quiet consume; the old --timeout still does, and warns.
    idle = cli(
        address,
        "--request-timeout",
        "5s",
        "consume",
        "cli.none",
        "--group",
        "g",
        "--idle-timeout",
        "200ms",
    )
    assert idle.returncode == 0 and idle.stderr == ""
    old = cli(address, "consume", "cli.none", "--group", "g", "--timeout", "200ms")
    assert old.returncode == 0
    assert old.stderr.strip() == (
        "warning: --timeout is deprecated: here it sets how long consume waits for a "
        "message; use --idle-timeout"
    )


def test_json_fidelity_end_to_end(broker: BrokerProcess, tmp_path: Path) -> None:
    address = broker.client_address
    lines = [
        '{"topic": "cli.json", "payload": {"amount":10.50}}',
        '{"topic": "cli.json", "payload": {"v":1E400}}',
        '{"topic": "cli.json", "payload": {"v":NaN}}',
        '{"topic": "cli.json", "payload": {"a":1,"a":2}}',
        '{"topic": "cli.json", "payload": "plain text"}',
        '{"topic": "cli.json", "payload": "/wA=", "payload_encoding": "base64"}',
        '{"topic": "cli.json", "payload": [1, 2.50]',
    ]
    batch = tmp_path / "batch.jsonl"
    batch.write_text("\n".join(lines) + "\n")
    done = cli(address, "publish", "--file", str(batch))
    assert done.returncode == 1  # some lines failed
    assert done.stdout.startswith("published 3 message(s)")
    assert done.stderr.splitlines() == [
        'line 2, column 39: the value of "payload": 1E400 is beyond the range of a 64-bit '
        "float; send it as a string",
        'line 3, column 39: the value of "payload": NaN is not a JSON number; send a finite '
        "number or a string",
        "line 4, column 41: the value of \"payload\": the key 'a' appears twice in one object",
        "line 7, column 43: expected ',' or '}' after the value of 'payload' at the end of the line",
    ]
    # Payloads other producers stored, which JSON cannot carry, still come out as strict JSON.
    other = WireClient(address)
    other.publish(
        [["cli.json", b'{"v":NaN}', 0, None, None], ["cli.json", b"1E400", 0, None, None]]
    )
    consumed = consume_json(address, "cli.json", 5)
    shown = [(r["payload_encoding"], r["payload"]) for _, r in consumed]
    assert shown == [
        ("json", {"amount": 10.5}),  # the parsed value; the raw line holds 10.50 exactly
        ("text", "plain text"),
        ("base64", "/wA="),
        ("text", '{"v":NaN}'),
        ("text", "1E400"),
    ]
    assert '"payload": {"amount":10.50}, "payload_encoding": "json"' in consumed[0][0]
