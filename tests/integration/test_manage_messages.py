"""Managing scheduled messages (issue 14) end to end: ``futureq-cli`` and the client
against real ``futureq start`` processes, one node and a 3-node cluster.

Source: ``docs/protocol.md``, "CANCEL", "BROWSE", "REDRIVE", "RESCHEDULE", "PURGE",
"Dead letters".
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import pytest
from cluster_process import Cluster

from futureq.client import PendingMessage, PublishItem
from futureq.client.sync import SyncClient
from futureq.errors import ErrorCode, RequestError
from futureq.wire.frames import GroupCreated, ItemStatus

CLI_TIMEOUT_S = 60.0


class BrokerProcess(Protocol):
    """What these tests use of the ``broker`` fixture (tests/integration/conftest.py)."""

    client_address: str
    http_address: str


def cli(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "futureq.cli.client_main", "--server", address, *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, 3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_cancel_from_the_cli_and_the_client_on_one_node(broker: BrokerProcess) -> None:
    address = broker.client_address
    with SyncClient(address, request_timeout_s=20.0) as client:
        client.create_group("reminders", "mail")
        client.create_group("reminders", "sms")
        ids = client.publish_batch(
            [PublishItem("reminders", b"order %d" % n, delay_ms=1500) for n in range(4)]
        )
        # One group's copy, from the CLI; an id nobody published is reported, not refused.
        cancelled = cli(
            address,
            "cancel",
            "reminders",
            str(ids[0]),
            str(ids[3] + 7),
            "--group",
            "mail",
            "--json",
        )
        assert cancelled.returncode == 0, cancelled.stderr
        assert json.loads(cancelled.stdout) == [
            {"id": ids[0], "status": "DONE"},
            {"id": ids[3] + 7, "status": "UNKNOWN"},
        ]
        # Every group's copy, from the client; a retry reports UNKNOWN.
        assert client.cancel("reminders", [ids[1]]) == [ItemStatus.DONE]
        assert client.cancel("reminders", [ids[1]]) == [ItemStatus.UNKNOWN]
        status = client.status()
        pending = {
            group["group"]: group["pending"]
            for topic in status["topics"]
            if topic["topic"] == "reminders"
            for group in topic["groups"]
        }
        assert pending == {"mail": 2, "sms": 3}

        # What was cancelled is never delivered, once due.
        mail = cli(address, "consume", "reminders", "--group", "mail", "--count", "2", "--json")
        assert mail.returncode == 0, mail.stderr
        assert sorted(json.loads(line)["id"] for line in mail.stdout.splitlines()) == ids[2:]
        sms = cli(address, "consume", "reminders", "--group", "sms", "--count", "3", "--json")
        assert sms.returncode == 0, sms.stderr
        got = sorted(json.loads(line)["id"] for line in sms.stdout.splitlines())
        assert got == [ids[0], ids[2], ids[3]]
        nothing = cli(address, "consume", "reminders", "--group", "mail", "--timeout", "300ms")
        assert nothing.returncode == 0 and nothing.stdout == ""


def test_cancel_refuses_bad_input_with_a_code_and_a_sentence(broker: BrokerProcess) -> None:
    address = broker.client_address
    with SyncClient(address, request_timeout_s=20.0) as client:
        first = client.publish("jobs", b"x", delay_ms=60_000)
        cases: list[tuple[str, list[int], str | None, ErrorCode, int | None]] = [
            ("nosuch", [first], None, ErrorCode.UNKNOWN_TOPIC, None),
            ("jobs", [first], "nosuch", ErrorCode.UNKNOWN_GROUP, None),
            # Names no topic or group can have (a breaker: UNKNOWN_TOPIC before).
            ("a..b", [first], None, ErrorCode.INVALID_TOPIC, None),
            ("jobs", [first], "no group", ErrorCode.INVALID_GROUP, None),
            ("nosuch", [first], "no group", ErrorCode.INVALID_GROUP, None),
            ("jobs", [], None, ErrorCode.EMPTY_BATCH, None),
            ("jobs", [first, -1], None, ErrorCode.INVALID_MESSAGE_ID, 1),
            ("jobs", [first] * 10_001, None, ErrorCode.BATCH_TOO_LARGE, None),
        ]
        for topic, ids, group, code, item in cases:
            with pytest.raises(RequestError) as info:
                client.cancel(topic, ids, group=group)
            assert info.value.code is code, (topic, group, info.value)
            assert info.value.item_index == item
            assert len(info.value.message) > 20
        # The connection and the message survived every refusal.
        assert client.cancel("jobs", [first]) == [ItemStatus.DONE]

    refused = cli(address, "cancel", "nosuch", "1")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: [UNKNOWN_TOPIC] ")
    usage = cli(address, "cancel", "jobs", "seven")
    assert usage.returncode == 2 and "is not a message id" in usage.stderr


def pending_by_node(cluster: Cluster, topic: str) -> dict[int, dict[str, int]]:
    """Every node's pending counts of ``topic``'s groups, once all applied the same index."""
    deadline = time.monotonic() + 20
    while True:
        statuses = {n: node.http_json("/api/status") for n, node in cluster.nodes.items()}
        if len({s["applied_index"] for s in statuses.values()}) == 1:
            return {
                n: {
                    group["group"]: group["pending"]
                    for entry in status["topics"]
                    if entry["topic"] == topic
                    for group in entry["groups"]
                }
                for n, status in statuses.items()
            }
        assert time.monotonic() < deadline, {n: s["applied_index"] for n, s in statuses.items()}
        time.sleep(0.05)


def test_a_cancel_and_a_purge_survive_a_leader_change_on_three_nodes(cluster3: Cluster) -> None:
    leader = cluster3.leader()
    addresses = ",".join(node.client_address for node in cluster3.nodes.values())
    with SyncClient(addresses, request_timeout_s=30.0) as client:
        client.create_group("t", "g")
        client.create_group("t", "bulk")
        ids = client.publish_batch(
            [PublishItem("t", b"%d" % n, delay_ms=3_600_000) for n in range(300)]
        )
        for start in range(0, 3000, 1000):
            client.publish_batch(
                [PublishItem("t", b"x", delay_ms=3_600_000) for _ in range(start, start + 1000)]
            )
        assert client.cancel("t", ids[:200], group="g") == [ItemStatus.DONE] * 200
        assert client.purge("t", group="bulk") == 3300
        # The purge goes on in chunks, under whichever node leads.
        transferred = cli(leader.client_address, "cluster", "transfer-leader")
        assert transferred.returncode == 0, transferred.stderr
        new_leader = cluster3.leader(exclude={leader.node_id})
        assert new_leader.node_id != leader.node_id
        # The new leader knows what was cancelled, and finds the rest by id.
        again = cli(
            addresses.split(",")[0],
            "cancel",
            "t",
            *map(str, ids[195:205]),
            "--group",
            "g",
            "--json",
        )
        assert again.returncode == 0, again.stderr
        assert [row["status"] for row in json.loads(again.stdout)] == ["UNKNOWN"] * 5 + ["DONE"] * 5
    deadline = time.monotonic() + 60
    while True:
        counts = pending_by_node(cluster3, "t")
        if all(c == {"g": 3095, "bulk": 0} for c in counts.values()):
            break
        assert time.monotonic() < deadline, counts
        time.sleep(0.2)


def test_browse_pages_what_is_due_without_claiming_it(broker: BrokerProcess) -> None:
    address = broker.client_address
    with SyncClient(address, request_timeout_s=20.0) as client:
        client.create_group("later", "g")
        now_ms = int(time.time() * 1000)
        ids = client.publish_batch(
            [
                PublishItem("later", b"m%d" % n, deliver_at_ms=now_ms + 600_000 + n)
                for n in range(25)
            ]
        )
        seen: list[int] = []
        cursor = None
        while True:
            page = client.browse("later", limit=10, cursor=cursor, preview_bytes=1)
            assert page.group == "g"
            seen += [m.id for m in page.messages]
            assert all(m.preview == b"m" and m.payload_bytes >= 2 for m in page.messages)
            cursor = page.next_cursor
            if cursor is None:
                break
        assert seen == ids
        (row,) = [
            g for t in client.status()["topics"] if t["topic"] == "later" for g in t["groups"]
        ]
        assert row["next_due_ms"] == now_ms + 600_000 and row["oldest_due_age_ms"] == 0
        assert row["background"] is None
        window = client.browse(
            "later", "g", from_due_ms=now_ms + 600_005, to_due_ms=now_ms + 600_010, limit=100
        )
        assert [m.id for m in window.messages] == ids[5:10]
        assert [m.due_ms for m in window.messages] == [now_ms + 600_000 + n for n in range(5, 10)]

        for bad, code in [
            ({"limit": 0}, ErrorCode.INVALID_ARGUMENT),
            ({"limit": 1001}, ErrorCode.INVALID_ARGUMENT),
            ({"preview_bytes": 5000}, ErrorCode.INVALID_ARGUMENT),
            ({"from_due_ms": now_ms + 10, "to_due_ms": now_ms + 5}, ErrorCode.INVALID_ARGUMENT),
            ({"from_due_ms": -1}, ErrorCode.INVALID_ARGUMENT),
            # Seconds, microseconds or nanoseconds taken for ms, as PUBLISH's deliver_at_ms.
            ({"from_due_ms": now_ms // 1000}, ErrorCode.IMPLAUSIBLE_TIME),
            ({"to_due_ms": now_ms // 1000 + 3600}, ErrorCode.IMPLAUSIBLE_TIME),
            ({"from_due_ms": now_ms, "to_due_ms": now_ms * 1000}, ErrorCode.IMPLAUSIBLE_TIME),
            ({"to_due_ms": now_ms * 1_000_000}, ErrorCode.IMPLAUSIBLE_TIME),
            ({"cursor": b"short"}, ErrorCode.INVALID_CURSOR),
        ]:
            with pytest.raises(RequestError) as info:
                client.browse("later", **bad)  # type: ignore[arg-type]
            assert info.value.code is code, (bad, info.value)
            if code is ErrorCode.IMPLAUSIBLE_TIME:
                assert "milliseconds" in info.value.message and "did you mean" in info.value.message
        client.create_group("later", "h")
        with pytest.raises(RequestError) as info:
            client.browse("later")
        assert info.value.code is ErrorCode.GROUP_REQUIRED and "'g'" in info.value.message
        with pytest.raises(RequestError) as info:
            client.browse("nothing.here")
        assert info.value.code is ErrorCode.UNKNOWN_TOPIC

    # The HTTP API serves the same pages, read-only.
    base = f"http://{broker.http_address}/api/browse"
    with urllib.request.urlopen(f"{base}?topic=later&group=g&limit=3&preview_bytes=2") as answer:
        page = json.loads(answer.read())
    assert [m["id"] for m in page["messages"]] == ids[:3] and page["next_cursor"]
    assert page["messages"][0]["preview_base64"] == "bTA="  # b"m0"
    cursor = page["next_cursor"]
    with urllib.request.urlopen(f"{base}?topic=later&group=g&limit=3&cursor={cursor}") as answer:
        assert [m["id"] for m in json.loads(answer.read())["messages"]] == ids[3:6]
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{base}?topic=later&group=g&limit=0")
    assert refused.value.code == 400
    assert json.loads(refused.value.read())["code"] == "INVALID_ARGUMENT"
    for topic in ("a..b", "%ff%fe"):  # names no topic can have (a breaker: UNKNOWN_TOPIC)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}?topic={topic}")
        assert refused.value.code == 400
        assert json.loads(refused.value.read())["code"] == "INVALID_TOPIC"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{base}?topic=later&group=g&from_due_ms={now_ms // 1000}")
    assert refused.value.code == 400
    assert json.loads(refused.value.read())["code"] == "IMPLAUSIBLE_TIME"

    shown = cli(address, "browse", "later", "--group", "g", "--within", "2h", "--json")
    assert shown.returncode == 0, shown.stderr
    assert [json.loads(line)["id"] for line in shown.stdout.splitlines()] == ids[:25]
    assert json.loads(shown.stdout.splitlines()[0])["attempt"] == 0  # nothing was claimed


def dead_letter_one(client: SyncClient, topic: str, group: str) -> tuple[int, PendingMessage]:
    """Publish a message, refuse it until it is dead-lettered; its id and dead letter."""
    client.create_group(topic, group, max_deliveries=1)
    original = client.publish(topic, b"poison")
    (delivery,) = client.consume(topic, group, 1, timeout_s=10)
    delivery.nack()
    deadline = time.monotonic() + 20
    while True:
        # Out of attempts, it is dead-lettered when next due to a consumer with credit.
        assert client.consume(topic, group, 1, timeout_s=0.2) == []
        try:
            page = client.browse(topic + ".dlq")
        except RequestError as error:  # no dead letter yet: the topic has no group
            assert error.code is ErrorCode.UNKNOWN_TOPIC, error
        else:
            found = [m for m in page.messages if m.headers["futureq-original-id"] == str(original)]
            if found:
                return original, found[0]
        assert time.monotonic() < deadline, "the poison message was never dead-lettered"
        time.sleep(0.05)


def test_dead_letters_are_listed_with_provenance_and_not_claimed(broker: BrokerProcess) -> None:
    """The issue's case: looking at dead letters must not take them from a later group."""
    address = broker.client_address
    with SyncClient(address, request_timeout_s=20.0) as client:
        original, dead = dead_letter_one(client, "jobs", "workers")
        assert dead.headers["futureq-original-id"] == str(original)
        assert dead.headers["futureq-original-topic"] == "jobs"
        assert dead.headers["futureq-original-group"] == "workers"
        assert dead.headers["futureq-reason"] == "max-deliveries"
        assert int(dead.headers["futureq-attempts"]) >= 1

    listed = cli(address, "dlq", "list", "jobs")
    assert listed.returncode == 0, listed.stderr
    assert f"original=#{original}" in listed.stdout and "from=jobs/workers" in listed.stdout
    assert "reason=max-deliveries" in listed.stdout
    again = cli(address, "dlq", "list", "jobs", "--json")
    assert json.loads(again.stdout)["id"] == dead.id  # still there: listing claimed nothing
    # A group that subscribes later still gets the dead letter.
    got = cli(address, "consume", "jobs.dlq", "--group", "triage", "--count", "1", "--json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["id"] == dead.id


def test_redrive_moves_dead_letters_back_to_the_group_they_died_in(broker: BrokerProcess) -> None:
    address = broker.client_address
    with SyncClient(address, request_timeout_s=20.0) as client:
        original, dead = dead_letter_one(client, "billing", "charge")
        client.create_group("billing", "audit")  # exists now; it must not get the replay
        client.create_group("billing", "charge", max_deliveries=5)
        with pytest.raises(RequestError) as info:
            client.redrive("billing.dlq", [dead.id])
        assert info.value.code is ErrorCode.RESERVED_TOPIC
        with pytest.raises(RequestError) as info:
            client.redrive("billing", [dead.id], delay_ms=-1)
        assert info.value.code is ErrorCode.INVALID_DELAY

        redriven = cli(address, "dlq", "redrive", "billing", "--all", "--reason", "max-deliveries")
        assert redriven.returncode == 0, redriven.stderr
        assert "redriven 1 of 1 to 'billing'" in redriven.stdout
        assert "redrive: 1/1" in redriven.stderr
        assert client.redrive("billing", [dead.id]) == [ItemStatus.UNKNOWN]

        back = client.browse("billing", "charge").messages
        assert len(back) == 1 and back[0].id != original
        assert back[0].headers["futureq-redriven-from"] == str(dead.id)
        assert back[0].headers["futureq-original-id"] == str(original)
        assert client.browse("billing", "audit").messages == []
        (again,) = client.consume("billing", "charge", 1, timeout_s=10)
        assert again.id == back[0].id and again.payload == b"poison"
        again.ack()

        # A dead letter whose group is gone stays where it is.
        _, orphan = dead_letter_one(client, "billing", "gone")
        client.delete_group("billing", "gone")
        assert client.redrive("billing", [orphan.id, 12345]) == [
            ItemStatus.NO_TARGET,
            ItemStatus.UNKNOWN,
        ]
        assert [m.id for m in client.browse("billing.dlq").messages] == [orphan.id]


def test_reschedule_moves_due_times_and_keeps_ttl_rules(broker: BrokerProcess) -> None:
    address = broker.client_address
    with SyncClient(address, request_timeout_s=20.0) as client:
        client.create_group("retries", "g")
        ids = client.publish_batch(
            [PublishItem("retries", b"r%d" % n, delay_ms=3_600_000, ttl_ms=5_000) for n in range(3)]
        )
        now_ms = int(time.time() * 1000)
        assert client.reschedule("retries", ids[1:], delay_ms=86_400_000) == [ItemStatus.DONE] * 2
        page = client.browse("retries", "g").messages
        assert [m.id for m in page] == ids  # ids[0] is due first now
        moved = {m.id: m for m in page}
        assert moved[ids[1]].due_ms is not None and moved[ids[1]].due_ms >= now_ms + 86_400_000
        assert moved[ids[1]].expire_ms == moved[ids[1]].due_ms + 5_000  # TTL from the new due

        for kwargs, code in [
            ({}, ErrorCode.INVALID_DELAY),
            ({"due_ms": now_ms, "delay_ms": 0}, ErrorCode.INVALID_DELAY),
            ({"delay_ms": -1}, ErrorCode.INVALID_DELAY),
            ({"delay_ms": 10**15}, ErrorCode.DELAY_TOO_LARGE),
            ({"due_ms": now_ms // 1000}, ErrorCode.IMPLAUSIBLE_TIME),
        ]:
            with pytest.raises(RequestError) as info:
                client.reschedule("retries", [ids[0]], **kwargs)  # type: ignore[arg-type]
            assert info.value.code is code, (kwargs, info.value)

    now = cli(address, "reschedule", "retries", str(ids[2]), "--delay", "0s", "--json")
    assert now.returncode == 0, now.stderr
    assert json.loads(now.stdout) == [{"id": ids[2], "status": "DONE"}]
    got = cli(address, "consume", "retries", "--group", "g", "--count", "1", "--json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["id"] == ids[2]


def test_purge_asks_first_and_keeps_what_comes_after(broker: BrokerProcess) -> None:
    address = broker.client_address
    with SyncClient(address, request_timeout_s=20.0) as client:
        client.create_group("bulk", "a")
        client.create_group("bulk", "b")
        for _ in range(2):
            client.publish_batch(
                [PublishItem("bulk", b"x", delay_ms=3_600_000) for _ in range(1000)]
            )
        refused = cli(address, "purge", "bulk", "--group", "a")
        assert refused.returncode == 2 and "--yes" in refused.stderr
        purged = cli(address, "purge", "bulk", "--group", "a", "--yes")
        assert purged.returncode == 0, purged.stderr
        assert "purging 2000 pending entries of group 'a'" in purged.stdout
        later = client.publish("bulk", b"later", delay_ms=3_600_000)
        deadline = time.monotonic() + 30
        while True:
            pending = {
                g["group"]: g["pending"]
                for t in client.status()["topics"]
                if t["topic"] == "bulk"
                for g in t["groups"]
            }
            if pending == {"a": 1, "b": 2001}:
                break
            assert time.monotonic() < deadline, pending
            time.sleep(0.1)
        assert [m.id for m in client.browse("bulk", "a").messages] == [later]
        with pytest.raises(RequestError) as info:
            client.purge("bulk", group="c")
        assert info.value.code is ErrorCode.UNKNOWN_GROUP


def test_headers_and_idempotent_publish(broker: BrokerProcess) -> None:
    address = broker.client_address
    with SyncClient(address, request_timeout_s=20.0) as client:
        client.create_group("orders", "g")
        headers = {"traceparent": "00-abc-def-01", "content-type": "application/json"}
        first = client.publish(
            "orders", b"{}", delay_ms=3_600_000, headers=headers, idempotency_key="order-17"
        )
        # A retry after a lost answer: same key, same id, nothing stored.
        again = client.publish(
            "orders", b"{}", delay_ms=3_600_000, headers=headers, idempotency_key="order-17"
        )
        assert again == first
        batch = client.publish_batch(
            [
                PublishItem("orders", b"a", delay_ms=3_600_000, idempotency_key="order-18"),
                PublishItem("orders", b"b", delay_ms=3_600_000, idempotency_key="order-18"),
                PublishItem("orders", b"c", delay_ms=3_600_000, idempotency_key="order-17"),
            ]
        )
        assert batch[1] == batch[0] and batch[2] == first
        (shown, other) = client.browse("orders", "g").messages
        assert shown.id == first and shown.headers == headers
        assert other.id == batch[0] and other.headers == {}

        for item, code in [
            (
                PublishItem("orders", b"x", headers={"futureq-reason": "x"}),
                ErrorCode.INVALID_HEADERS,
            ),
            (PublishItem("orders", b"x", headers={"h": "v" * 5000}), ErrorCode.INVALID_HEADERS),
            (PublishItem("orders", b"x", idempotency_key=""), ErrorCode.INVALID_IDEMPOTENCY_KEY),
        ]:
            with pytest.raises(RequestError) as info:
                client.publish_batch([PublishItem("orders", b"fine"), item])
            assert info.value.code is code and info.value.item_index == 1, info.value
        # Once acked, the key still names it for the window (5 minutes by default).
        client.reschedule("orders", [first], delay_ms=0, group="g")
        (delivery,) = client.consume("orders", "g", 1, timeout_s=10)
        assert delivery.id == first
        delivery.ack()
        assert client.publish("orders", b"{}", idempotency_key="order-17") == first

    cli_first = cli(address, "publish", "orders", "p", "--header", "a=1", "--idempotency-key", "k")
    assert cli_first.returncode == 0, cli_first.stderr
    cli_again = cli(address, "publish", "orders", "p", "--idempotency-key", "k")
    assert cli_again.stdout == cli_first.stdout


def test_a_group_created_from_the_backlog_gets_what_is_pending(broker: BrokerProcess) -> None:
    address = broker.client_address
    with SyncClient(address, request_timeout_s=20.0) as client:
        client.create_group("events", "first")
        ids = client.publish_batch([PublishItem("events", b"e%d" % n) for n in range(600)])
        client.cancel("events", ids[:100])  # gone from every group: not in the backlog
        plain = cli(address, "group", "create", "events", "plain")
        assert plain.returncode == 0, plain.stderr
        late = cli(address, "group", "create", "events", "late", "--from-backlog")
        assert late.returncode == 0, late.stderr
        newer = client.publish("events", b"newer")
        deadline = time.monotonic() + 30
        while True:
            pending = {
                g["group"]: g["pending"]
                for t in client.status()["topics"]
                if t["topic"] == "events"
                for g in t["groups"]
            }
            if pending == {"first": 501, "plain": 1, "late": 501}:
                break
            assert time.monotonic() < deadline, pending
            time.sleep(0.1)
        got = client.consume("events", "late", 501, timeout_s=20)
        assert sorted(d.id for d in got) == [*ids[100:], newer]


def test_group_create_says_whether_it_created_copied_or_found_the_group(
    broker: BrokerProcess,
) -> None:
    """Before, ``group create`` printed "group ... exists" whatever happened: run again
    with --from-backlog on a group that existed, it looked as if the backlog had been
    copied. Now the server answers what it did and the CLI says it."""
    address = broker.client_address
    with SyncClient(address, request_timeout_s=20.0) as client:
        client.publish("said", b"before any group")  # the implicit default group
        lines = []
        for args in (
            ["first"],
            ["late", "--from-backlog"],
            ["late", "--from-backlog"],
            ["late", "--max-deliveries", "3"],
        ):
            done = cli(address, "group", "create", "said", *args)
            assert done.returncode == 0, done.stderr
            lines.append(done.stdout.strip())
        assert lines == [
            "group 'first' of topic 'said' created from the topic's implicit default group,"
            " with its backlog",
            "group 'late' of topic 'said' created; the topic's pending messages are being"
            " copied to it in the background (status shows background: backfilling until"
            " done)",
            "group 'late' of topic 'said' already exists with these settings: unchanged;"
            " --from-backlog copies only into a group it creates: nothing was copied",
            "group 'late' of topic 'said' already exists: its settings were updated",
        ]
        assert client.create_group("alone", "g", from_backlog=True) == GroupCreated.CREATED
        assert client.create_group("alone", "g") == GroupCreated.UNCHANGED
        assert client.consume("said", "late", 1, timeout_s=10)[0].payload == b"before any group"


def test_a_group_from_the_backlog_keeps_what_the_other_group_cancels_meanwhile(
    broker: BrokerProcess,
) -> None:
    """Found by a tester: right after GROUP_CREATE ``from_backlog``, a CANCEL in the
    only other group of what the background copy had not reached yet (the newest
    messages) deleted them for good, and the new group ended with 6,000 of 10,000. Now
    it gets every message pending when it was created, whenever the CANCEL lands."""
    with SyncClient(broker.client_address, request_timeout_s=30.0) as client:
        client.create_group("backlog", "first")
        ids: list[int] = []
        for _ in range(2):
            batch = [PublishItem("backlog", b"x", delay_ms=3_600_000) for _ in range(5000)]
            ids += client.publish_batch(batch)
        client.create_group("backlog", "late", from_backlog=True)
        client.cancel("backlog", ids[-4000:], group="first")
        deadline = time.monotonic() + 30
        while True:
            groups = {
                g["group"]: (g["pending"], g["background"])
                for t in client.status()["topics"]
                if t["topic"] == "backlog"
                for g in t["groups"]
            }
            if groups["late"][1] is None:
                break
            assert time.monotonic() < deadline, groups
            time.sleep(0.1)
        assert groups == {"first": (6000, None), "late": (10_000, None)}
        assert client.cancel("backlog", ids[-1:], group="late") == [ItemStatus.DONE]


def test_a_group_from_the_backlog_of_two_groups_gets_each_message_once(
    broker: BrokerProcess,
) -> None:
    """Found by a tester: a group created ``from_backlog`` while two groups held the same
    3,000 messages, consumed and acked as they arrived, was delivered some of them again
    after their ACK (the background copy found them in the second group and copied them
    again). Each now arrives once (the visibility timeout is far longer than the test)."""
    with SyncClient(broker.client_address, request_timeout_s=30.0) as client:
        client.create_group("twice", "g1")
        client.create_group("twice", "g2")
        ids = client.publish_batch([PublishItem("twice", b"x") for _ in range(3000)])
        client.create_group("twice", "late", visibility_timeout_ms=600_000, from_backlog=True)
        seen: list[int] = []
        deadline = time.monotonic() + 30
        while len(seen) < len(ids):
            assert time.monotonic() < deadline, len(seen)
            for delivery in client.consume("twice", "late", 500, timeout_s=1.0):
                seen.append(delivery.id)
                delivery.ack()
        # Anything copied again would be due at once: wait until the copy has ended.
        while any(
            g["background"] is not None
            for t in client.status()["topics"]
            if t["topic"] == "twice"
            for g in t["groups"]
        ):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        seen += [d.id for d in client.consume("twice", "late", 500, timeout_s=0.5)]
        assert sorted(seen) == ids


def test_a_nack_can_reject_to_the_dead_letter_topic_with_a_reason(broker: BrokerProcess) -> None:
    with SyncClient(broker.client_address, request_timeout_s=20.0) as client:
        client.create_group("parse", "workers")
        original = client.publish("parse", b"{not json", headers={"content-type": "json"})
        (delivery,) = client.consume("parse", "workers", 1, timeout_s=10)
        with pytest.raises(RequestError) as info:
            delivery.nack(reason="x" * 300, dead_letter=True)
        assert info.value.code is ErrorCode.INVALID_ARGUMENT
        delivery.nack(reason="invalid JSON at byte 1", dead_letter=True)
        (dead,) = client.browse("parse.dlq").messages
        assert dead.headers["futureq-original-id"] == str(original)
        assert dead.headers["futureq-reason"] == "rejected"
        assert dead.headers["futureq-reason-text"] == "invalid JSON at byte 1"
        assert dead.headers["content-type"] == "json"  # its own headers are kept
        assert client.consume("parse", "workers", 1, timeout_s=0.3) == []


def test_consumers_receive_headers_and_dead_letter_provenance(broker: BrokerProcess) -> None:
    address = broker.client_address
    with SyncClient(address, request_timeout_s=20.0) as client:
        client.create_group("traced", "g", max_deliveries=1)
        first = client.publish("traced", b"a", headers={"traceparent": "00-1-2-01"})
        plain = client.publish("traced", b"b")
        got = {d.id: d for d in client.consume("traced", "g", 2, timeout_s=10)}
        assert got[first].headers == {"traceparent": "00-1-2-01"}
        assert got[plain].headers == {}
        got[plain].ack()
        got[first].nack(reason="boom", dead_letter=True)
        with urllib.request.urlopen(f"http://{broker.http_address}/metrics") as answer:
            text = answer.read().decode()
        assert 'futureq_oldest_due_age_seconds{group="g",topic="traced"} 0.0' in text
    shown = cli(address, "consume", "traced.dlq", "--group", "audit", "--count", "1", "--json")
    assert shown.returncode == 0, shown.stderr
    record = json.loads(shown.stdout)
    assert record["headers"]["traceparent"] == "00-1-2-01"
    assert record["headers"]["futureq-original-id"] == str(first)
    assert record["headers"]["futureq-reason-text"] == "boom"


def test_a_group_may_dead_letter_what_expires(broker: BrokerProcess) -> None:
    address = broker.client_address
    created = cli(address, "group", "create", "short", "g", "--dead-letter-expired")
    assert created.returncode == 0, created.stderr
    with SyncClient(address, request_timeout_s=20.0) as client:
        original = client.publish("short", b"late", ttl_ms=100, headers={"k": "v"})
        time.sleep(0.3)
        assert client.consume("short", "g", 1, timeout_s=0.5) == []  # expired, not delivered
        deadline = time.monotonic() + 20
        while True:
            try:
                dead = client.browse("short.dlq").messages
            except RequestError as error:
                assert error.code is ErrorCode.UNKNOWN_TOPIC, error
                dead = []
            if dead:
                break
            assert time.monotonic() < deadline, "the expired message never reached short.dlq"
            time.sleep(0.05)
        assert dead[0].headers["futureq-reason"] == "expired"
        assert dead[0].headers["futureq-original-id"] == str(original)
        assert dead[0].headers["k"] == "v"
        (row,) = [
            g for t in client.status()["topics"] if t["topic"] == "short" for g in t["groups"]
        ]
        assert row["dead_letter_expired"] is True


def test_counts_by_due_bucket_from_the_client_the_cli_and_http(broker: BrokerProcess) -> None:
    address = broker.client_address
    with SyncClient(address, request_timeout_s=20.0) as client:
        client.create_group("dash", "g")
        client.publish_batch([PublishItem("dash", b"now") for _ in range(2)])
        client.publish_batch([PublishItem("dash", b"soon", delay_ms=20_000) for _ in range(3)])
        client.publish_batch([PublishItem("dash", b"hour", delay_ms=600_000) for _ in range(4)])
        client.publish_batch([PublishItem("dash", b"week", delay_ms=7 * 86_400_000)])
        counts = client.browse_counts(
            "dash", bounds_ms=[60_000, 3_600_000, 86_400_000], relative=True
        )
        assert counts.group == "g" and counts.complete
        assert counts.counts == [5, 4, 0] and counts.later == 1
        start = counts.bounds_ms[0] - 60_000
        assert abs(start - time.time() * 1000) < 60_000  # relative to the leader's clock
        absolute = client.browse_counts("dash", "g", bounds_ms=[start + 300_000])
        assert (absolute.counts, absolute.later) == ([5], 5)
        # Nothing was claimed: the two due now are still there for a consumer.
        got = client.consume("dash", "g", 2, timeout_s=10)
        assert sorted(d.payload for d in got) == [b"now", b"now"]
        with pytest.raises(RequestError) as info:
            client.browse_counts("dash", bounds_ms=[5, 1])
        assert info.value.code is ErrorCode.INVALID_ARGUMENT and "increasing" in info.value.message

    shown = cli(address, "browse", "dash", "--counts")
    assert shown.returncode == 0, shown.stderr
    assert "within 1m: 5" in shown.stdout and "within 1h (after 1m): 4" in shown.stdout
    assert "within 1d (after 1h): 0" in shown.stdout and "later (or parked): 1" in shown.stdout
    as_json = cli(address, "browse", "dash", "--counts", "--buckets", "30s,2h", "--json")
    assert as_json.returncode == 0, as_json.stderr
    record = json.loads(as_json.stdout)
    assert (record["counts"], record["later"], record["complete"]) == ([5, 4], 1, True)
    refused = cli(address, "browse", "dash", "--counts", "--buckets", "1h,1m")
    assert refused.returncode == 2 and "must increase" in refused.stderr

    base = f"http://{broker.http_address}/api/browse/counts?topic=dash"
    with urllib.request.urlopen(f"{base}&bounds_ms=60000,3600000&relative=true") as answer:
        body = json.loads(answer.read())
    assert (body["group"], body["counts"], body["later"], body["complete"]) == (
        "g",
        [5, 4],
        1,
        True,
    )
    with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(f"{base}&bounds_ms=soon")
    assert bad.value.code == 400
    assert json.loads(bad.value.read())["code"] == "INVALID_ARGUMENT"


def test_browse_counts_over_http_quotes_what_was_sent(broker: BrokerProcess) -> None:
    """Found by a tester: ``bounds_ms=`` (empty) was "got None", and a relative bound too
    far away was reported with "now" added to it. Each refusal quotes the value sent and
    says what to send."""
    with SyncClient(broker.client_address, request_timeout_s=20.0) as client:
        client.create_group("quoted", "g")
    base = f"http://{broker.http_address}/api/browse/counts?topic=quoted"

    def refusal(query: str) -> str:
        with pytest.raises(urllib.error.HTTPError) as bad:
            urllib.request.urlopen(f"{base}&{query}")
        assert bad.value.code == 400
        body = json.loads(bad.value.read())
        assert body["code"] == "INVALID_ARGUMENT", body
        message: str = body["message"]
        return message

    empty = refusal("bounds_ms=")
    assert "bounds_ms is empty" in empty and "None" not in empty
    assert "comma-separated integers" in empty
    assert "is required" in refusal("relative=true")
    assert "item 1 ('')" in refusal("bounds_ms=1,,2")
    far = 9_223_372_036_854_775_000
    message = refusal(f"bounds_ms=60000,{far}&relative=true")
    assert f"bounds_ms[1] = {far} ms from now" in message and "send at most" in message
    assert "bounds_ms[0] = -5:" in refusal("bounds_ms=-5,7&relative=true")
    assert "bounds_ms[0] = -5 is not a time" in refusal("bounds_ms=-5,7")
    # /api/browse the same way.
    browse = f"http://{broker.http_address}/api/browse?topic=quoted"
    for query, quoted in (("cursor=zz", "cursor='zz' is not hex"), ("limit=", "limit=''")):
        with pytest.raises(urllib.error.HTTPError) as bad:
            urllib.request.urlopen(f"{browse}&{query}")
        assert quoted in json.loads(bad.value.read())["message"]


def test_publish_file_carries_headers_and_idempotency_keys(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    address = broker.client_address
    lines = [
        '{"topic":"jobs","payload":"a","delay_ms":3600000,"headers":{"traceparent":"00-1-01"},'
        '"idempotency_key":"job-1"}',
        '{"topic":"jobs","payload":"b","delay_ms":3600000,"idempotency_key":"job-2"}',
        '{"topic":"jobs","payload":"c","headers":{"n":7}}',
        '{"topic":"jobs","payload":"d","headers":{"futureq-reason":"x"}}',
    ]
    batch = tmp_path / "batch.jsonl"
    batch.write_text("\n".join(lines) + "\n")
    with SyncClient(address, request_timeout_s=20.0) as client:
        client.create_group("jobs", "g")
        # The same file twice: keyed lines are stored once, and the summary says so.
        again = "published 0 message(s), 2 already published (same idempotency key) in"
        for summary in ("published 2 message(s) in", again):
            sent = cli(address, "publish", "--file", str(batch))
            assert sent.returncode == 1, sent.stderr
            assert summary in sent.stdout
            assert "line 3, column 46: headers['n'] must be a string" in sent.stderr
            assert "line 4: [INVALID_HEADERS]" in sent.stderr
        shown = client.browse("jobs", "g").messages
        assert [m.headers for m in shown] == [{"traceparent": "00-1-01"}, {}]
        assert client.publish("jobs", b"a", idempotency_key="job-1") == shown[0].id


def test_settling_a_delivery_whose_message_was_cancelled_says_so(broker: BrokerProcess) -> None:
    with SyncClient(broker.client_address, request_timeout_s=20.0) as client:
        client.create_group("jobs", "g")
        ids = client.publish_batch([PublishItem("jobs", b"j%d" % n) for n in range(3)])
        held = {d.id: d for d in client.consume("jobs", "g", 3, timeout_s=10)}
        assert sorted(held) == ids
        # Their first deliveries are out (the leader knows, though the log has no
        # record of them), so CANCEL says a consumer may have processed them.
        assert client.cancel("jobs", [ids[0], ids[1]]) == [ItemStatus.DELIVERED] * 2
        for mid in ids[:2]:
            with pytest.raises(RequestError) as info:
                held[mid].ack() if mid == ids[0] else held[mid].nack()
            assert info.value.code is ErrorCode.DELIVERY_CANCELLED, info.value
            assert "cancelled" in info.value.message
        held[ids[2]].ack()  # the one not cancelled settles as usual
        assert client.consume("jobs", "g", 1, timeout_s=0.5) == []  # nothing comes back


def test_a_browse_page_of_large_headers_ends_by_bytes_and_all_pages_follow(
    broker: BrokerProcess,
) -> None:
    """1,000 messages with 4 KiB of headers each do not fit in one 4 MiB frame: a page
    ends by bytes with a cursor, and ``browse --all`` follows it to the end."""
    address = broker.client_address
    headers = {f"k{i:02d}": "v" * 125 for i in range(32)}  # 32 x 128: the 4,096 allowed
    with SyncClient(address, request_timeout_s=60.0) as client:
        client.create_group("fat", "g")
        ids: list[int] = []
        for _ in range(5):
            ids += client.publish_batch(
                [PublishItem("fat", b"x", delay_ms=3_600_000, headers=headers)] * 200
            )
        page = client.browse("fat", limit=1000)
        assert 0 < len(page.messages) < 1000 and page.next_cursor is not None
        assert page.messages[0].headers == headers
        rest = client.browse("fat", cursor=page.next_cursor, limit=1000)
        assert rest.messages[0].id == page.messages[-1].id + 1
    shown = cli(address, "browse", "fat", "--all", "--json")
    assert shown.returncode == 0, shown.stderr
    assert [json.loads(line)["id"] for line in shown.stdout.splitlines()] == ids


def test_a_wrong_argument_type_fails_alone_before_it_is_sent(broker: BrokerProcess) -> None:
    """A wrong-typed field would make the server close the connection (and redeliver
    what it held): the client refuses the call itself, and the held delivery acks."""
    with SyncClient(broker.client_address, request_timeout_s=20.0) as client:
        client.create_group("typed", "g")
        mid = client.publish("typed", b"work")
        (held,) = client.consume("typed", "g", 1, timeout_s=10)
        wrong: list[tuple[str, Callable[[], object]]] = [
            ("str id", lambda: client.cancel("typed", ["1"])),  # type: ignore[list-item]
            ("float id", lambda: client.cancel("typed", [1.0])),  # type: ignore[list-item]
            ("bool id", lambda: client.cancel("typed", [True])),
            ("float delay", lambda: client.reschedule("typed", [mid], delay_ms=1.5)),  # type: ignore[arg-type]
            ("str cursor", lambda: client.browse("typed", cursor="abc")),  # type: ignore[arg-type]
            ("float limit", lambda: client.browse("typed", limit=10.0)),  # type: ignore[arg-type]
            ("str bound", lambda: client.browse_counts("typed", bounds_ms=["1"])),  # type: ignore[list-item]
            ("int relative", lambda: client.browse_counts("typed", bounds_ms=[1], relative=1)),  # type: ignore[arg-type]
            ("int group", lambda: client.purge("typed", group=5)),  # type: ignore[arg-type]
            ("str redrive delay", lambda: client.redrive("typed", [mid], delay_ms="1")),  # type: ignore[arg-type]
            ("int header", lambda: client.publish("typed", b"x", headers={"a": 1})),  # type: ignore[dict-item]
            ("int key", lambda: client.publish("typed", b"x", idempotency_key=5)),  # type: ignore[arg-type]
        ]
        for what, call in wrong:
            try:
                call()
            except TypeError:
                continue
            pytest.fail(f"a call with a {what} was not refused")
        with pytest.raises(RequestError) as info:  # the right type: the server's to refuse
            client.cancel("typed", [-1])
        assert info.value.code is ErrorCode.INVALID_MESSAGE_ID
        held.ack()  # the connection held on: the delivery was not redelivered
        assert client.consume("typed", "g", 1, timeout_s=0.3) == []
        assert [m.id for m in client.browse("typed").messages] == []


def test_dlq_commands_read_the_default_group_or_the_one_named(broker: BrokerProcess) -> None:
    """A second group on TOPIC.dlq must not leave ``dlq list``/``redrive`` unusable:
    ``--group`` picks one, ``default`` is read when it exists, and otherwise the error
    names the choices; with no dead letter yet there is nothing to show."""
    address = broker.client_address
    empty = cli(address, "dlq", "list", "quiet")
    assert empty.returncode == 0, empty.stderr
    assert "0 dead letters" in empty.stdout
    with SyncClient(address, request_timeout_s=20.0) as client:
        original, dead = dead_letter_one(client, "mail", "send")
        client.create_group("mail.dlq", "triage")  # adopts the implicit group, dead letter and all
        client.create_group("mail.dlq", "audit")  # a second group, empty
    ambiguous = cli(address, "dlq", "list", "mail")
    assert ambiguous.returncode == 1
    assert "GROUP_REQUIRED" in ambiguous.stderr and "--group" in ambiguous.stderr
    assert "'triage'" in ambiguous.stderr and "'audit'" in ambiguous.stderr
    listed = cli(address, "dlq", "list", "mail", "--group", "triage")
    assert listed.returncode == 0, listed.stderr
    assert f"original=#{original}" in listed.stdout and "1 dead letters shown" in listed.stdout
    other = cli(address, "dlq", "list", "mail", "--group", "audit")
    assert other.returncode == 0 and "0 dead letters shown" in other.stdout, other.stderr
    with SyncClient(address, request_timeout_s=20.0) as client:
        client.create_group("mail.dlq", "default")
        client.publish("mail", b"bounce")
        (delivery,) = client.consume("mail", "send", 1, timeout_s=10)
        delivery.nack(reason="no such mailbox", dead_letter=True)
        (second,) = client.browse("mail.dlq", "default").messages
    by_default = cli(address, "dlq", "list", "mail", "--json")
    assert by_default.returncode == 0, by_default.stderr
    assert [json.loads(line)["id"] for line in by_default.stdout.splitlines()] == [second.id]
    redriven = cli(address, "dlq", "redrive", "mail", "--all", "--group", "triage")
    assert redriven.returncode == 0, redriven.stderr
    assert "redriven 2 of 2 to 'mail'" in redriven.stdout


def test_rescheduling_a_message_in_flight_takes_it_back_until_the_new_time(
    broker: BrokerProcess,
) -> None:
    """docs/cli.md, "reschedule": the old delivery is void, the message comes again."""
    with SyncClient(broker.client_address, request_timeout_s=20.0) as client:
        client.create_group("busy", "g")
        mid = client.publish("busy", b"work")
        (held,) = client.consume("busy", "g", 1, timeout_s=10)
        assert client.reschedule("busy", [mid], delay_ms=1500) == [ItemStatus.DONE]
        with pytest.raises(RequestError) as info:
            held.ack()
        assert info.value.code is ErrorCode.UNKNOWN_DELIVERY_TAG
        assert client.consume("busy", "g", 1, timeout_s=0.5) == []  # not before its time
        (again,) = client.consume("busy", "g", 1, timeout_s=10)
        assert again.id == mid and again.payload == b"work"
        again.ack()


def test_a_dead_letter_that_keeps_failing_is_parked_after_max_deliveries(
    broker: BrokerProcess,
) -> None:
    """docs/protocol.md, "Dead letters": on TOPIC.dlq max_deliveries parks a message
    (lapsed visibility timeouts count), it is not delivered for ever."""
    with SyncClient(broker.client_address, request_timeout_s=20.0) as client:
        client.create_group("loop", "w")
        client.publish("loop", b"v")
        (delivery,) = client.consume("loop", "w", 1, timeout_s=10)
        delivery.nack(reason="bad", dead_letter=True)
        client.create_group("loop.dlq", "default", max_deliveries=2, visibility_timeout_ms=100)
        attempts: list[int] = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # never settled: each one lapses after 100 ms
            attempts += [d.attempt for d in client.consume("loop.dlq", "default", 1, timeout_s=0.3)]
        assert attempts == [1, 2]
        (parked,) = client.browse("loop.dlq").messages
        assert parked.due_ms is None and parked.attempt == 2
        with pytest.raises(RequestError) as info:
            client.create_group("loop.dlq", "default", dead_letter_expired=True)
        assert info.value.code is ErrorCode.INVALID_ARGUMENT
        assert "no TTL" in info.value.message
