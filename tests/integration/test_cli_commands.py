"""``futureq-cli`` as a subprocess against a real ``futureq start`` process."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Protocol


class BrokerProcess(Protocol):
    """What these tests use of the ``broker`` fixture (tests/integration/conftest.py)."""

    client_address: str


CLI_TIMEOUT_S = 60.0


def cli(broker_address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "futureq.cli.client_main", "--server", broker_address, *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def test_publish_then_consume_json(broker: BrokerProcess) -> None:
    address = broker.client_address
    first = cli(address, "publish", "orders", '{"sku": 7}')
    assert first.returncode == 0, first.stderr
    second = cli(address, "publish", "orders", "plain text", "--delay", "10ms", "--ttl", "1h")
    assert second.returncode == 0, second.stderr
    ids = [int(first.stdout), int(second.stdout)]

    consumed = cli(address, "consume", "orders", "--group", "g", "--count", "2", "--json")
    assert consumed.returncode == 0, consumed.stderr
    records = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert [r["id"] for r in records] == ids
    assert records[0]["payload"] == {"sku": 7} and records[0]["payload_encoding"] == "json"
    assert records[1]["payload"] == "plain text" and records[1]["payload_encoding"] == "text"
    assert set(records[0]) == {
        "id",
        "topic",
        "group",
        "payload",
        "payload_encoding",
        "due_ms",
        "delivered_ms",
        "attempt",
    }
    assert all(r["attempt"] == 1 and r["group"] == "g" for r in records)

    # Acked: nothing is left, so --idle-timeout ends the command with exit 0.
    empty = cli(address, "consume", "orders", "--group", "g", "--idle-timeout", "300ms")
    assert empty.returncode == 0, empty.stderr
    assert empty.stdout == ""


def test_binary_payload_file_and_nack(broker: BrokerProcess, tmp_path: Path) -> None:
    address = broker.client_address
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"\xff\x00\xfe")
    published = cli(address, "publish", "bin", "--payload-file", str(blob))
    assert published.returncode == 0, published.stderr

    nacked = cli(address, "consume", "bin", "--group", "g", "--count", "1", "--json", "--nack")
    assert nacked.returncode == 0, nacked.stderr
    record = json.loads(nacked.stdout)
    assert record["payload_encoding"] == "base64" and record["payload"] == "/wD+"

    again = cli(address, "consume", "bin", "--group", "g", "--count", "1")
    assert again.returncode == 0, again.stderr
    assert "attempt=2" in again.stdout and "base64:/wD+" in again.stdout


def test_publish_file_reports_bad_lines_and_publishes_the_rest(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    address = broker.client_address
    batch = tmp_path / "batch.jsonl"
    batch.write_text(
        "\n".join(
            [
                '{"topic": "bulk", "payload": {"n": 1}}',
                "{not json",
                '{"topic": "bulk", "payload": "two", "delay_ms": 5}',
                '{"topic": "bulk.dlq", "payload": "refused by the server"}',
                "",
                '{"topic": "bulk", "payload": 3, "ttl_ms": 60000}',
            ]
        )
        + "\n"
    )
    result = cli(address, "publish", "--file", str(batch), "--batch-size", "10")
    assert result.returncode == 1
    assert "published 3 message(s)" in result.stdout
    assert "2 failed line(s)" in result.stdout
    assert "line 2, column 2: expected a key in double quotes" in result.stderr
    assert "line 4: [RESERVED_TOPIC]" in result.stderr

    consumed = cli(address, "consume", "bulk", "--group", "g", "--count", "3", "--json")
    assert consumed.returncode == 0, consumed.stderr
    payloads = [json.loads(line)["payload"] for line in consumed.stdout.splitlines()]
    # Delivered in due order, and "two" is 5 ms late: compare as a set.
    assert sorted(json.dumps(p) for p in payloads) == sorted(
        json.dumps(p) for p in [{"n": 1}, "two", 3]
    )


def test_status_and_group_commands(broker: BrokerProcess) -> None:
    address = broker.client_address
    created = cli(
        address,
        "group",
        "create",
        "jobs",
        "workers",
        "--visibility-timeout",
        "5s",
        "--max-deliveries",
        "4",
    )
    assert created.returncode == 0, created.stderr

    status = cli(address, "status", "--json")
    assert status.returncode == 0, status.stderr
    document = json.loads(status.stdout)
    assert {"node_id", "role", "leader_address", "topics"} <= set(document)

    groups = json.loads(cli(address, "group", "list", "--json").stdout)
    workers = next(g for g in groups if (g["topic"], g["group"]) == ("jobs", "workers"))
    assert workers["visibility_timeout_ms"] == 5_000 and workers["max_deliveries"] == 4

    topics = json.loads(cli(address, "topic", "list", "--json").stdout)
    assert any(t["topic"] == "jobs" and t["groups"] >= 1 for t in topics)

    node = json.loads(cli(address, "cluster", "status", "--json").stdout)
    assert node["role"] == "leader"

    table = cli(address, "status")
    assert table.returncode == 0 and "workers" in table.stdout

    deleted = cli(address, "group", "delete", "jobs", "workers")
    assert deleted.returncode == 0, deleted.stderr
    groups = json.loads(cli(address, "group", "list", "--json").stdout)
    assert all((g["topic"], g["group"]) != ("jobs", "workers") for g in groups)


def test_errors_are_one_line_with_exit_status() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{probe.getsockname()[1]}"
    probe.close()
    refused = cli(address, "--request-timeout", "1s", "status")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: [CONNECTION_LOST]")
    assert address in refused.stderr and "make run" in refused.stderr
    assert refused.stderr.count("\n") == 1

    usage = cli(address, "publish", "t", "p", "--delay", "soon")
    assert usage.returncode == 2
    assert "is not a duration" in usage.stderr


def test_server_refusal_names_the_code(broker: BrokerProcess) -> None:
    refused = cli(broker.client_address, "publish", "x.dlq", "payload")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: [RESERVED_TOPIC] ")


def test_start_refuses_a_membership_it_cannot_run_before_touching_the_data_dir(
    tmp_path: Path,
) -> None:
    """Found by trying check-config on bad combinations: it accepted a node id missing
    from --peers (start then failed after creating the data directory) and two peers on
    one address (the node started and could never reach one of them)."""
    data = tmp_path / "data"
    for peers in ("1=127.0.0.1:1,2=127.0.0.1:2", "3=127.0.0.1:1,2=127.0.0.1:1"):
        for command in ("check-config", "start"):
            done = subprocess.run(
                [sys.executable, "-m", "futureq.cli.server_main", command, "--node-id", "3",
                 "--peers", peers, "--insecure-peers", "--data-dir", str(data),
                 "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                 "--raft-listen", "127.0.0.1:0"],
                capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False,
            )  # fmt: skip
            assert done.returncode == 2, (command, done.stderr)
            assert "cluster.peers" in done.stderr, done.stderr
            assert not data.exists()
