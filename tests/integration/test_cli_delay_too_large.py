"""A delay over the server's limit gets DELAY_TOO_LARGE, not IMPLAUSIBLE_TIME, unless
it really reads as an epoch time the server would take in its place
(``docs/protocol.md``, "Units").

Found by a tester: ``futureq-cli publish --delay 36599d`` (100 years: under the CLI's
bound, over the default 10-year ``limits.max_delay_ms``) was refused as "looks like an
absolute time (2070-03-16)"; sending that as ``--at`` would only be refused for its
own distance. A real node, the real CLI.
"""

from __future__ import annotations

import time

from broker_process import BrokerProcess
from cli_process import cli

from futureq.client.sync import SyncClient
from futureq.errors import ErrorCode, RequestError


def test_a_delay_over_the_limit_is_delay_too_large(broker: BrokerProcess) -> None:
    # 100 years (2070 as an epoch time), just over 10 years, and 73 years (2043).
    for flag in ("36599d", "3661d", "27000d"):
        published = cli(broker.client_address, "publish", "--delay", flag, "far.t", "x")
        assert published.returncode == 1, published
        assert "[DELAY_TOO_LARGE]" in published.stderr, (flag, published.stderr)
        assert "limits.max_delay_ms" in published.stderr
    ttl = cli(broker.client_address, "publish", "--ttl", "36599d", "far.t", "x")
    assert ttl.returncode == 1 and "[INVALID_TTL]" in ttl.stderr, ttl.stderr


def test_a_duration_in_days_that_reads_as_an_epoch_time_names_the_limit_first(
    broker: BrokerProcess,
) -> None:
    """``--delay 20000d`` (55 years, 2024 as an epoch time) was told it "looks like an
    absolute time (2024-10-04T00:00:00Z)" and to send it as ``deliver_at_ms``, the limit
    only at the end; ``--ttl 20000d`` never heard the limit at all. It stays
    IMPLAUSIBLE_TIME (the server cannot know it was typed in days) and now says the
    limit first, the other reading after it."""
    for flag, setting in (("--delay", "limits.max_delay_ms"), ("--ttl", "limits.max_ttl_ms")):
        published = cli(broker.client_address, "publish", flag, "20000d", "far.t", "x")
        assert published.returncode == 1, published
        assert published.stderr.startswith(
            f"error: [IMPLAUSIBLE_TIME] {flag[2:]}_ms is 1728000000000 ms (20,000 days); "
            f"the limit is 316224000000 ms (3,660 days, {setting})"
        ), published.stderr
        assert "looks like an absolute time (2024-10-04T00:00:00Z)" in published.stderr


def test_an_epoch_time_given_as_a_delay_is_still_implausible(broker: BrokerProcess) -> None:
    now_ms = int(time.time() * 1000)
    with SyncClient(broker.client_address) as client:
        for kwargs in ({"delay_ms": now_ms + 60_000}, {"ttl_ms": now_ms + 60_000}):
            try:
                client.publish("far.t", b"x", **kwargs)
            except RequestError as exc:
                assert exc.code is ErrorCode.IMPLAUSIBLE_TIME, (kwargs, exc)
                assert "looks like an absolute time" in exc.message
            else:
                raise AssertionError(f"{kwargs} was published")


def test_consume_nack_with_a_requeue_delay_over_the_limit_gives_the_message_back(
    broker: BrokerProcess,
) -> None:
    """``consume --nack --requeue-delay 3661d`` printed the message, the NACK was refused
    (over the server's 10-year ``limits.max_delay_ms``, which only the server knows) and
    the message left counted as the run ended: in a group of ``--max-deliveries 1`` it
    went to the dead-letter topic at its next delivery, never requeued. It is now given
    back uncounted, and the error says so."""
    address = broker.client_address
    assert cli(address, "group", "create", "nack.far", "g", "--max-deliveries", "1").returncode == 0
    with SyncClient(address) as client:
        message_id = client.publish("nack.far", b"keep me")
    refused = cli(
        address, "consume", "nack.far", "--group", "g", "--nack", "--requeue-delay", "3661d",
        "--count", "1",
    )  # fmt: skip
    again = cli(address, "consume", "nack.far", "--group", "g", "--count", "1",
                "--idle-timeout", "5s", "--json")  # fmt: skip
    assert again.returncode == 0, again
    assert f'"id": {message_id}' in again.stdout or f'"id":{message_id}' in again.stdout, again
    assert refused.returncode == 1, refused
    assert "[INVALID_DELAY] requeue_delay_ms is 316310400000 ms" in refused.stderr
    assert f"message {message_id} was given back uncounted" in refused.stderr


def test_every_delay_flag_refuses_an_epoch_time_before_sending(broker: BrokerProcess) -> None:
    """``reschedule --delay 1765000000000`` and ``dlq redrive --delay`` (an epoch time in
    ms typed where a duration goes) were sent and refused by the server (exit 1,
    DELAY_TOO_LARGE), while ``publish --delay`` refuses the same number locally (exit 2,
    "looks like an absolute time"). Every delay the server applies is now checked the
    same way, before anything is sent."""
    with SyncClient(broker.client_address) as client:
        message_id = client.publish("epoch.delay", b"x", delay_ms=3_600_000)
    epoch_ms = str(int(time.time() * 1000) + 60_000)
    for command in (
        ["publish", "epoch.delay", "x", "--delay", epoch_ms],
        ["reschedule", "epoch.delay", str(message_id), "--delay", epoch_ms],
        ["dlq", "redrive", "epoch.delay", "--all", "--delay", epoch_ms],
        ["consume", "epoch.delay", "--nack", "--requeue-delay", epoch_ms],
    ):
        refused = cli(broker.client_address, *command)
        assert refused.returncode == 2, (command, refused)
        assert "it looks like an absolute time in ms since the Unix epoch" in refused.stderr, (
            command,
            refused.stderr,
        )
        assert "--delay" in refused.stderr or "--requeue-delay" in refused.stderr
    # Over any server's limit (100 years) is refused locally too, as publish does.
    for command in (
        ["publish", "epoch.delay", "x", "--delay", "40000d"],
        ["reschedule", "epoch.delay", str(message_id), "--delay", "40000d"],
    ):
        refused = cli(broker.client_address, *command)
        assert refused.returncode == 2, (command, refused)
        assert "longer than any server takes" in refused.stderr, refused.stderr
    # The message was not moved: a duration still reschedules it.
    moved = cli(
        broker.client_address, "reschedule", "epoch.delay", str(message_id), "--delay", "2h"
    )
    assert moved.returncode == 0, moved
    assert "rescheduled 1 of 1" in moved.stdout, moved.stdout
