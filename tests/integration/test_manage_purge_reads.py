"""What a running PURGE removes is gone for every request, not only for the dispatcher.

A PURGE is answered at once; the leader then removes the group's entries by PURGE_GROUP
chunks. Requests served meanwhile treat the entries its chunks have not reached yet as
removed already. Source: ``docs/protocol.md``, "PURGE".

To keep the chunks away from the purged group while the requests run, the reaper is
first given a deleted group of another topic to empty (deleted groups go first).
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any, Protocol

from wire_client import WireClient

from futureq.errors import ErrorCode
from futureq.wire import frames
from futureq.wire.frames import ItemStatus


class BrokerProcess(Protocol):
    client_address: str
    http_address: str


def _ok(client: WireClient, frame: frames.Frame) -> Any:
    answer = client.request(frame)
    assert isinstance(answer, frames.Ok), answer
    return answer.result


def _items(client: WireClient, frame: frames.Frame) -> list[int]:
    answer = client.request(frame)
    assert isinstance(answer, frames.ItemResults), answer
    return list(answer.results)


def _purge_behind_a_deletion(client: WireClient, topic: str) -> list[int]:
    """Groups ``a`` and ``b`` of ``topic`` hold 2,000 messages; a group of another topic
    holding 20,000 is deleted, then ``topic`` purged (answered at once). Returns the
    purged ids."""
    for group in ("a", "b"):
        _ok(client, frames.GroupCreate(client.next_id(), topic, group, 30_000, 5))
    _ok(client, frames.GroupCreate(client.next_id(), "ballast", "g", 30_000, 5))
    for _ in range(20):
        client.publish([["ballast", b"x", 60_000, None, None]] * 1000)
    ids: list[int] = []
    for _ in range(2):
        first = client.publish([[topic, b"x", 60_000, None, None]] * 1000).first_id
        ids += range(first, first + 1000)
    _ok(client, frames.GroupDelete(client.next_id(), "ballast", "g"))
    assert _ok(client, frames.Purge(client.next_id(), topic, None)) == 4000
    return ids


def test_browse_cancel_reschedule_and_counts_see_no_purged_message(
    broker: BrokerProcess,
) -> None:
    """Found by a tester: BROWSE (and /api/browse, and counts) still listed messages a
    PURGE had removed, and CANCEL answered DONE for them instead of UNKNOWN."""
    client = WireClient(broker.client_address)
    purged = _purge_behind_a_deletion(client, "pr")
    kept = client.publish([["pr", b"y", 60_000, None, None]]).first_id

    page = client.request(frames.Browse(client.next_id(), "pr", "b", None, None, None, 10, 0))
    assert isinstance(page, frames.BrowseOk), page
    assert [m[0] for m in page.messages] == [kept]
    url = f"http://{broker.http_address}/api/browse?topic=pr&group=a&limit=10"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert [m["id"] for m in body["messages"]] == [kept]

    counts = client.request(
        frames.BrowseCounts(client.next_id(), "pr", "b", [30_000, 3_600_000], True)
    )
    assert isinstance(counts, frames.BrowseCountsOk), counts
    assert (counts.counts, counts.later, counts.complete) == ([0, 1], 0, True)

    # Every group of the topic, and one group: the purged ids are UNKNOWN.
    assert _items(client, frames.Cancel(client.next_id(), "pr", None, purged[-5:])) == (
        [ItemStatus.UNKNOWN] * 5
    )
    assert _items(client, frames.Cancel(client.next_id(), "pr", "b", purged[:5])) == (
        [ItemStatus.UNKNOWN] * 5
    )
    assert (
        _items(client, frames.Reschedule(client.next_id(), "pr", None, purged[5:10], None, 0))
        == [ItemStatus.UNKNOWN] * 5
    )
    # What the purge does not remove is still cancelled, from every group.
    assert _items(client, frames.Cancel(client.next_id(), "pr", None, [purged[10], kept])) == [
        ItemStatus.UNKNOWN,
        ItemStatus.DONE,
    ]
    page = client.request(frames.Browse(client.next_id(), "pr", "a", None, None, None, 10, 0))
    assert isinstance(page, frames.BrowseOk) and page.messages == [], page
    # The purge's chunks had not reached the group yet: the requests above saw its
    # entries still on disk.
    assert (client.group_pending("pr", "b") or 0) > 1000


def test_status_counts_nothing_a_running_purge_removes_as_due(broker: BrokerProcess) -> None:
    """Found with the faults above: right after a PURGE, STATUS still said its messages
    were due (``due``, ``next_due_ms``, ``oldest_due_age_ms``), from the leader's
    in-memory due order (group ``a``: a consumer had it loaded) and from disk (``b``)."""
    client = WireClient(broker.client_address)
    consumer = WireClient(broker.client_address)
    for group in ("a", "b"):
        _ok(client, frames.GroupCreate(client.next_id(), "ps", group, 30_000, 5))
    _ok(client, frames.GroupCreate(client.next_id(), "ballast", "g", 30_000, 5))
    for _ in range(20):
        client.publish([["ballast", b"x", 60_000, None, None]] * 1000)
    for _ in range(2):
        client.publish([["ps", b"x", None, None, None]] * 1000)
    consumer.subscribe("ps", "a", 1)
    consumer.deliveries(1)

    def groups() -> dict[str, dict[str, Any]]:
        [topic] = [t for t in client.status()["topics"] if t["topic"] == "ps"]
        return {g["group"]: g for g in topic["groups"]}

    assert all(g["due"] > 0 for g in groups().values())
    _ok(client, frames.GroupDelete(client.next_id(), "ballast", "g"))
    assert _ok(client, frames.Purge(client.next_id(), "ps", None)) == 4000
    for name, group in groups().items():
        assert group["background"] == "purging" and group["pending"] > 1000, (name, group)
        assert (group["due"], group["next_due_ms"], group["oldest_due_age_ms"]) == (0, None, 0), (
            name,
            group,
        )


def test_deliveries_out_when_a_purge_is_answered_are_cancelled_at_once(
    broker: BrokerProcess,
) -> None:
    """Found by a tester: deliveries out when a PURGE was answered stayed out until its
    chunks reached their group: a NACK with ``dead_letter`` sent a purged message to the
    dead-letter topic, an ACK settled one as if nothing had happened, and no REVOKE came.
    Now the PURGE takes them back as it applies (REVOKE reason CANCELLED) and settling
    one answers DELIVERY_CANCELLED."""
    client = WireClient(broker.client_address)
    consumer = WireClient(broker.client_address)
    _ok(client, frames.GroupCreate(client.next_id(), "pd", "g", 30_000, 5))
    _ok(client, frames.GroupCreate(client.next_id(), "ballast", "g", 30_000, 5))
    for _ in range(20):
        client.publish([["ballast", b"x", 60_000, None, None]] * 1000)
    client.publish([["pd", b"x", None, None, None]] * 3)
    consumer.subscribe("pd", "g", 3)
    tags = [delivery[0] for delivery in consumer.deliveries(3)]
    _ok(client, frames.GroupDelete(client.next_id(), "ballast", "g"))  # its chunks go first
    assert _ok(client, frames.Purge(client.next_id(), "pd", None)) == 3

    # Settled at once, while the chunks are still busy with the deleted group.
    for settle in (
        frames.Nack(consumer.next_id(), [tags[0]], 0, "poison", True),
        frames.Ack(consumer.next_id(), [tags[1]]),
        frames.Release(consumer.next_id(), [tags[2]]),
    ):
        answer = consumer.request(settle)
        assert isinstance(answer, frames.Error), answer  # before: OK
        assert answer.code == ErrorCode.DELIVERY_CANCELLED, answer
    revokes = [notice for notice in consumer.notices if isinstance(notice, frames.Revoke)]
    assert {revoke.reason for revoke in revokes} == {frames.RevokeReason.CANCELLED}
    assert sorted(consumer.revoked()) == sorted(tags)
    topics = {entry["topic"] for entry in client.status()["topics"]}
    assert "pd.dlq" not in topics, topics
    consumer.expect_nothing(0.3)
