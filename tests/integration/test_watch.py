"""WATCH over a plain TCP connection of a real node: the overview arrives at once and
then every interval, matches STATUS, follows traffic, is replaced by a second WATCH and
ends with UNWATCH; bad intervals are refused alone. (The dashboard test drives the same
frames over /ws from a browser.)"""

from __future__ import annotations

import time
from typing import Any

from broker_process import BrokerProcess
from wire_client import WireClient

from futureq.errors import ErrorCode
from futureq.wire import frames


def next_update(client: WireClient, timeout_s: float = 10.0) -> frames.WatchUpdate:
    while True:
        frame = client.receive(timeout_s)
        if isinstance(frame, frames.Deliver):
            client.pushed.append(frame)
            continue
        assert isinstance(frame, frames.WatchUpdate), frame
        return frame


def groups(overview: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(g["topic"], g["group"]): g for g in overview["groups"]}


def test_watch_updates_follow_the_node(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address)
    client.subscribe("w.jobs", "workers", prefetch=3)
    client.publish([["w.jobs", b"j", 0, None, None]] * 10 + [["w.jobs", b"k", 600_000, None, None]])
    client.deliveries(3)
    client.send(frames.Watch(50, 250))
    started = time.monotonic()
    first = next_update(client)
    assert first.request_id == 50
    overview = first.overview
    assert overview["node"]["view"] == "cluster" and overview["node"]["role"] == "leader"
    assert overview["node"]["clustered"] is False and overview["members"] == []
    jobs = groups(overview)[("w.jobs", "workers")]
    status = client.status()
    assert status["view"] == "cluster" and status["leader_only"] == []
    expected = status["topics"][0]["groups"][0]
    for field in ("pending", "due", "in_flight", "consumers"):
        assert jobs[field] == expected[field], field
    assert (jobs["pending"], jobs["due"], jobs["in_flight"]) == (11, 7, 3)
    assert jobs["oldest_due_age_ms"] is not None and jobs["dead_letter_topic"] == "w.jobs.dlq"
    # Pending by due time is recounted every second: an update within a few brings it.
    expected = {"due now": 7, "in 10 s": 0, "in 1 min": 0, "in 5 min": 0, "later": 1}
    buckets: dict[str, int] = {}
    for _ in range(40):
        buckets = {b["label"]: b["count"] for b in overview["due_buckets"] or []}
        if buckets == expected:
            break
        overview = next_update(client).overview
    assert buckets == expected
    # Updates keep coming every interval and follow traffic.
    client.publish([["w.other", b"o", 0, None, None]] * 4)
    for _ in range(40):
        overview = next_update(client).overview
        # The activity is sampled once a second: wait for the second that saw the 4.
        if ("w.other", "default") in groups(overview) and sum(
            overview["activity"]["published"]
        ) == 15:
            break
    assert groups(overview)[("w.other", "default")]["pending"] == 4
    assert sum(overview["activity"]["published"]) == 15
    assert sum(overview["activity"]["delivered"]) == 3
    assert time.monotonic() - started < 15
    # A second WATCH replaces the first; UNWATCH ends it.
    client.send(frames.Watch(60, 60_000))
    while next_update(client).request_id != 60:
        pass
    answer = client.request(frames.Unwatch(61))
    assert isinstance(answer, frames.Ok) and answer.request_id == 61
    client.expect_nothing(1.0)


def test_watch_interval_out_of_range_fails_alone(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address)
    for interval in (0, 249, 60_001, -5):
        answer = client.request(frames.Watch(client.next_id(), interval))
        assert isinstance(answer, frames.Error), answer
        assert answer.code == ErrorCode.INVALID_ARGUMENT and "250" in answer.message
    assert isinstance(client.request(frames.Ping(client.next_id())), frames.Pong)


def test_an_overview_larger_than_a_frame_lists_fewer_groups(broker_factory: Any) -> None:
    """With ``limits.max_frame_bytes`` at its 64 KiB minimum, 100 groups of long names
    made the overview larger than a frame and the watch ended with INVALID_ARGUMENT (the
    dashboard stopped updating). It now lists the largest groups that fit, and
    ``groups_total`` still counts them all."""
    small = {"MAX_FRAME_BYTES": "65536", "MAX_BATCH_ITEMS": "1000", "MAX_PAYLOAD_BYTES": "32768"}
    broker: BrokerProcess = broker_factory(
        env={f"FUTUREQ_LIMITS_{key}": value for key, value in small.items()}
    )
    client = WireClient(broker.client_address)
    topic = "t" * 249
    made = 100
    for i in range(made):
        group = f"{i:03d}" + "g" * 246
        answer = client.request(frames.GroupCreate(client.next_id(), topic, group))
        assert isinstance(answer, frames.Ok), answer
    # One group with a pending message: the largest, listed first whatever is cut.
    client.publish([["busy", b"x", 600_000, None, None]])
    client.send(frames.Watch(70, 250))
    for _ in range(3):
        update = next_update(client)
        assert update.request_id == 70
        overview = update.overview
        assert overview["groups_total"] == made + 1
        assert 0 < len(overview["groups"]) < made + 1
        assert overview["groups"][0]["topic"] == "busy"
    assert isinstance(client.request(frames.Ping(client.next_id())), frames.Pong)
