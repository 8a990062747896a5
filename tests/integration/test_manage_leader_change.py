"""Managing scheduled messages (issue 14) across a leader change, on a 3-node cluster of
real ``futureq start`` processes: reschedule, browse cursors, dead-letter redrive,
idempotent publish and headers, each begun under one leader and finished under the
next (the leader is killed or hands over mid-way).

Source: ``docs/protocol.md``, "BROWSE", "REDRIVE", "RESCHEDULE", "Idempotency keys",
"Headers"; issue 14 ("survives leader changes").
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_process import Cluster, ClusterNode

from futureq.client import PendingMessage, PublishItem
from futureq.client.sync import SyncClient
from futureq.errors import ErrorCode, RequestError
from futureq.wire.frames import ItemStatus

REQUEST_TIMEOUT_S = 30.0


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, 3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def addresses(cluster: Cluster) -> str:
    return ",".join(node.client_address for node in cluster.nodes.values())


def transfer_leadership(cluster: Cluster) -> tuple[ClusterNode, ClusterNode]:
    """Hand leadership away from the current leader; ``(old, new)`` once the new one is ready."""
    old = cluster.leader()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "futureq.cli.client_main",
            "--server",
            old.client_address,
            "cluster",
            "transfer-leader",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    new = cluster.leader(exclude={old.node_id})
    return old, new


def kill_leader(cluster: Cluster) -> tuple[ClusterNode, ClusterNode]:
    """Kill the leader (SIGKILL); ``(old, new)`` once another node leads and is ready."""
    old = cluster.leader()
    old.kill()
    return old, cluster.leader(exclude={old.node_id})


def pending_of(client: SyncClient, topic: str) -> dict[str, int]:
    return {
        group["group"]: group["pending"]
        for entry in client.status()["topics"]
        if entry["topic"] == topic
        for group in entry["groups"]
    }


def wait_dead_letter(client: SyncClient, topic: str, group: str, original: int) -> PendingMessage:
    """Refuse ``original`` (already nacked once, out of attempts) until its dead letter
    is on ``topic.dlq``; that dead letter."""
    deadline = time.monotonic() + 30
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
                return found[0]
        assert time.monotonic() < deadline, f"message {original} was never dead-lettered"
        time.sleep(0.05)


def test_a_browse_cursor_from_the_old_leader_pages_on_under_the_new_one(cluster3: Cluster) -> None:
    with SyncClient(addresses(cluster3), request_timeout_s=REQUEST_TIMEOUT_S) as client:
        client.create_group("later", "g")
        now_ms = int(time.time() * 1000)
        # Ties in due time too: the cursor orders by (due, id), not by due alone.
        ids = client.publish_batch(
            [
                PublishItem("later", b"m%d" % n, deliver_at_ms=now_ms + 3_600_000 + n // 3)
                for n in range(70)
            ]
        )
        first = client.browse("later", "g", limit=25)
        second = client.browse("later", "g", limit=25, cursor=first.next_cursor)
        assert second.next_cursor is not None
        old, new = kill_leader(cluster3)
        seen = [m.id for m in first.messages + second.messages]
        cursor: bytes | None = second.next_cursor
        pages = 0
        while cursor is not None:
            page = client.browse("later", "g", limit=25, cursor=cursor)
            seen += [m.id for m in page.messages]
            cursor = page.next_cursor
            pages += 1
            assert pages < 10, "the cursor never ran out"
        assert seen == ids, "pages skipped or repeated entries across the leader change"
        assert old.node_id != new.node_id


def test_an_idempotent_retry_after_the_leader_died_returns_the_original_id(
    cluster3: Cluster,
) -> None:
    headers = {"traceparent": "00-4bf92f3577b34da6-00f067aa0ba902b7-01", "content-type": "json"}
    with SyncClient(addresses(cluster3), request_timeout_s=REQUEST_TIMEOUT_S) as client:
        client.create_group("orders", "g")
        first = client.publish(
            "orders", b"{}", delay_ms=3_600_000, headers=headers, idempotency_key="order-17"
        )
        batch = client.publish_batch(
            [PublishItem("orders", b"a", delay_ms=3_600_000, idempotency_key="order-18")]
        )
        kill_leader(cluster3)
        # The retry a producer makes after a lost answer, now to the new leader.
        again = client.publish(
            "orders", b"{}", delay_ms=3_600_000, headers=headers, idempotency_key="order-17"
        )
        assert again == first
        retried = client.publish_batch(
            [
                PublishItem("orders", b"a", delay_ms=3_600_000, idempotency_key="order-18"),
                PublishItem("orders", b"b", delay_ms=3_600_000, idempotency_key="order-19"),
            ]
        )
        assert retried[0] == batch[0] and retried[1] > batch[0]
        assert pending_of(client, "orders") == {"g": 3}  # nothing stored twice
        shown = {m.id: m for m in client.browse("orders", "g").messages}
        assert sorted(shown) == [first, batch[0], retried[1]]
        assert shown[first].headers == headers


def test_headers_survive_a_leader_change_and_a_redelivery(cluster3: Cluster) -> None:
    headers = {"traceparent": "00-1-2-01", "tenant": "acme"}
    with SyncClient(addresses(cluster3), request_timeout_s=REQUEST_TIMEOUT_S) as client:
        client.create_group("traced", "g", visibility_timeout_ms=1_000)
        mid = client.publish("traced", b"job", headers=headers)
        (delivery,) = client.consume("traced", "g", 1, timeout_s=10)
        assert delivery.id == mid and delivery.headers == headers and delivery.attempt == 1
        delivery.nack()
        # A redelivery's attempt is committed before it is pushed (docs/protocol.md).
        (again,) = client.consume("traced", "g", 1, timeout_s=10)
        assert again.id == mid and again.headers == headers and again.attempt == 2
        # Not acked: the leader dies holding it in flight; the new leader redelivers it.
        kill_leader(cluster3)
        got = client.consume("traced", "g", 1, timeout_s=20)
        assert [d.id for d in got] == [mid]
        assert got[0].headers == headers
        assert got[0].attempt >= 2  # never backwards
        got[0].ack()
        assert client.consume("traced", "g", 1, timeout_s=0.5) == []


def test_reschedule_and_redrive_carry_over_a_leader_change(cluster3: Cluster) -> None:
    with SyncClient(addresses(cluster3), request_timeout_s=REQUEST_TIMEOUT_S) as client:
        client.create_group("retries", "g")
        ids = client.publish_batch(
            [PublishItem("retries", b"r%d" % n, delay_ms=3_600_000) for n in range(4)]
        )
        # Moved under the old leader: one to tomorrow, one to fall due right after the
        # handover (the new leader must find it where it moved, not where it was published).
        now_ms = int(time.time() * 1000)
        assert client.reschedule("retries", [ids[0]], delay_ms=86_400_000) == [ItemStatus.DONE]
        assert client.reschedule("retries", [ids[1]], due_ms=now_ms + 1_500) == [ItemStatus.DONE]

        client.create_group("billing", "charge", max_deliveries=1)
        originals = client.publish_batch(
            [PublishItem("billing", b"poison", headers={"k": f"v{n}"}) for n in range(2)]
        )
        for delivery in client.consume("billing", "charge", 2, timeout_s=10):
            delivery.nack()
        dead = [wait_dead_letter(client, "billing", "charge", o) for o in originals]

        old, new = transfer_leadership(cluster3)
        assert old.node_id != new.node_id

        (due,) = client.consume("retries", "g", 1, timeout_s=20)
        assert due.id == ids[1] and due.attempt == 1
        due.ack()
        page = {m.id: m for m in client.browse("retries", "g").messages}
        assert sorted(page) == [ids[0], *ids[2:]]
        # A day from the old leader's stamp: cluster time, which may trail this clock a little.
        assert page[ids[0]].due_ms is not None
        assert abs(page[ids[0]].due_ms - (now_ms + 86_400_000)) < 5_000
        # And moved again under the new leader.
        assert client.reschedule("retries", ids[2:], delay_ms=0) == [ItemStatus.DONE] * 2
        got = client.consume("retries", "g", 2, timeout_s=20)
        assert sorted(d.id for d in got) == ids[2:]

        # Dead-lettered under the old leader, redriven under the new one.
        client.create_group("billing", "charge", max_deliveries=5)
        assert client.redrive("billing", [d.id for d in dead]) == [ItemStatus.DONE] * 2
        assert client.redrive("billing", [dead[0].id]) == [ItemStatus.UNKNOWN]
        assert client.browse("billing.dlq").messages == []
        back = client.consume("billing", "charge", 2, timeout_s=20)
        by_original = {int(d.headers["futureq-original-id"]): d for d in back}
        assert sorted(by_original) == originals
        for n, original in enumerate(originals):
            delivery = by_original[original]
            assert delivery.payload == b"poison" and delivery.headers["k"] == f"v{n}"
            assert delivery.headers["futureq-redriven-from"] == str(dead[n].id)
            delivery.ack()
