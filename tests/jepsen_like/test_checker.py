"""The checker catches each kind of violation in small hand-made histories.

Each test builds a clean history, breaks it in one way, and asserts that exactly that
verdict moves. No cluster, no sockets, no clock.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.jepsen_like.checker import (
    MUST_BE_ZERO,
    CheckConfig,
    Outstanding,
    check,
    merge_intervals,
    percentile,
)
from tests.jepsen_like.history import Event, History, read_history

T0 = 1_700_000_000_000.0
TOPICS = {"jobs": ["a", "b"]}


class Builder:
    """Writes events of a small run: topic ``jobs`` with groups ``a`` and ``b``."""

    def __init__(self) -> None:
        self.events: list[Event] = [
            {"t": T0, "type": "run", "phase": "start", "topics": TOPICS, "seed": 1}
        ]
        self.op = 0

    def add(self, t: float, type_: str, **fields: Any) -> None:
        self.events.append({"t": T0 + t, "type": type_, **fields})

    def publish(
        self,
        t: float,
        *,
        message_id: int,
        delay_ms: int = 0,
        ttl_ms: int | None = None,
        outcome: str = "ok",
        took_ms: float = 5.0,
        groups: list[str] | None = None,
    ) -> str:
        self.op += 1
        key = f"p0-{self.op}"
        self.add(
            t,
            "publish",
            phase="invoke",
            op=self.op,
            key=key,
            producer=0,
            topic="jobs",
            groups=groups if groups is not None else TOPICS["jobs"],
            delay_ms=delay_ms,
            deliver_at_ms=None,
            ttl_ms=ttl_ms,
        )
        fields: dict[str, Any] = {"id": message_id} if outcome == "ok" else {"error": "x"}
        self.add(t + took_ms, "publish", phase=outcome, op=self.op, key=key, **fields)
        return key

    def deliver(
        self,
        t: float,
        key: str | None,
        *,
        message_id: int,
        group: str,
        due: float,
        attempt: int = 1,
        delivered: float | None = None,
        ack: bool = True,
        topic: str = "jobs",
        conn: int = 1,
        settle: str = "ack",
    ) -> None:
        delivered_t = t - 1 if delivered is None else delivered
        self.add(
            t,
            "deliver",
            id=message_id,
            key=key,
            topic=topic,
            group=group,
            consumer=f"{group}-0",
            conn=conn,
            attempt=attempt,
            delivered_ms=T0 + delivered_t,
            due_ms=T0 + due,
            publish_ms=T0,
        )
        if ack:
            kind = "nack" if settle == "nack" else "ack"
            phase = "cancelled" if settle == "cancelled" else "ok"
            self.add(t + 1, kind, phase="invoke", id=message_id, group=group, attempt=attempt)
            self.add(t + 3, kind, phase=phase, id=message_id, group=group, attempt=attempt)

    def both(self, t: float, key: str, *, message_id: int, due: float, **kw: Any) -> None:
        for group in TOPICS["jobs"]:
            self.deliver(t, key, message_id=message_id, group=group, due=due, **kw)

    def finish(self, t: float) -> list[Event]:
        self.add(t, "run", phase="drain_end")
        return self.events


def clean() -> Builder:
    """Three messages: at once, delayed 1 s, short TTL expired unseen; one far future."""
    b = Builder()
    k1 = b.publish(0, message_id=1)
    b.both(20, k1, message_id=1, due=2)
    k2 = b.publish(100, message_id=2, delay_ms=1000)
    b.both(1110, k2, message_id=2, due=1102)
    b.publish(200, message_id=3, delay_ms=100, ttl_ms=50)  # expires before anyone takes it
    b.publish(300, message_id=4, delay_ms=3_600_000)  # far future: never due in the run
    return b


def assert_only(counts: dict[str, int], **expected: int) -> None:
    for name in MUST_BE_ZERO:
        assert counts[name] == expected.get(name, 0), (name, counts)


def test_clean_history_passes() -> None:
    result = check(clean().finish(5_000))
    assert result.ok
    assert_only(result.counts)
    assert result.counts["acked_publishes"] == 4
    assert result.counts["required_publishes"] == 2
    assert result.counts["deliveries"] == 4
    assert result.counts["duplicates"] == 0
    assert result.counts["acked_then_redelivered"] == 0
    assert result.counts["unsettled"] == 0
    assert result.lateness_ms == {"p50": 8.0, "p99": 18.0, "max": 18.0}
    assert result.summary()["ok"] is True


def test_lost_message_is_caught_per_group() -> None:
    b = clean()
    k = b.publish(400, message_id=5, delay_ms=100)
    b.deliver(520, k, message_id=5, group="a", due=502)  # never reaches group b
    result = check(b.finish(5_000))
    assert_only(result.counts, lost=1)
    assert result.counts["lost_group_entries"] == 1
    assert result.examples["lost"][0]["missing_groups"] == ["b"]
    assert not result.ok and result.failures == {"lost": 1}


def test_unacknowledged_or_not_yet_due_publish_is_not_lost() -> None:
    b = clean()
    b.publish(400, message_id=5, outcome="info")  # unknown outcome, never delivered
    b.publish(400, message_id=6, outcome="fail")
    b.publish(4_900, message_id=7, delay_ms=500)  # due after the drain ended
    result = check(b.finish(5_000))
    assert_only(result.counts)
    assert result.counts["unknown_publishes"] == 1
    assert result.counts["failed_publishes"] == 1


def test_long_ttl_message_not_delivered_is_lost() -> None:
    b = clean()
    b.publish(400, message_id=5, ttl_ms=60_000)  # could not have expired by the end
    assert_only(check(b.finish(5_000)).counts, lost=1)


def test_early_delivery_by_harness_clock() -> None:
    b = clean()
    k = b.publish(400, message_id=5, delay_ms=1000)
    # The server claims due 410 and delivers at 420: 980 ms before invoke + delay.
    b.both(421, k, message_id=5, due=410)
    result = check(b.finish(5_000))
    assert_only(result.counts, early=2)
    assert result.examples["early"][0]["early_by_ms"] == pytest.approx(979.0)


def test_early_delivery_by_server_own_stamps() -> None:
    b = clean()
    k = b.publish(400, message_id=5)
    b.both(450, k, message_id=5, due=440, delivered=430)
    assert_only(check(b.finish(5_000)).counts, early=2)


def test_delivery_within_allowed_offset_is_not_early() -> None:
    b = clean()
    k = b.publish(400, message_id=5, delay_ms=1000)
    b.both(1397, k, message_id=5, due=1396, delivered=1396)
    assert check(b.finish(5_000), CheckConfig(allowed_offset_ms=5)).ok
    assert_only(check(b.finish(5_000), CheckConfig(allowed_offset_ms=1)).counts, early=2)


def test_expired_delivery_is_caught() -> None:
    b = clean()
    k = b.publish(400, message_id=5, delay_ms=100, ttl_ms=200)
    b.deliver(560, k, message_id=5, group="a", due=502)  # within the TTL
    b.deliver(760, k, message_id=5, group="b", due=502)  # 258 ms after due: expired
    result = check(b.finish(5_000))
    assert_only(result.counts, expired_delivered=1)
    assert result.examples["expired_delivered"][0]["group"] == "b"


def test_expired_delivery_caught_by_harness_bound_when_server_due_is_wrong() -> None:
    b = clean()
    k = b.publish(400, message_id=5, delay_ms=100, ttl_ms=200, took_ms=5)
    # The server says due 3000 (wrong); the harness knows due <= 505, expiry <= 705.
    b.deliver(3010, k, message_id=5, group="a", due=3000)
    b.deliver(560, k, message_id=5, group="b", due=502)
    assert_only(check(b.finish(5_000)).counts, expired_delivered=1)


def test_unexpected_deliveries() -> None:
    b = clean()
    b.deliver(500, "p9-999", message_id=77, group="a", due=400)  # never published
    b.deliver(500, None, message_id=78, group="a", due=400)  # not our payload
    k = b.publish(400, message_id=5, groups=["a"])  # published before group b existed
    b.deliver(450, k, message_id=5, group="a", due=402)
    b.deliver(450, k, message_id=5, group="b", due=402)
    kf = b.publish(600, message_id=6, outcome="fail")
    b.deliver(650, kf, message_id=6, group="a", due=602)
    ko = b.publish(700, message_id=7, groups=["a"])
    b.deliver(750, ko, message_id=7, group="a", due=702, topic="other")
    result = check(b.finish(5_000))
    assert_only(result.counts, unexpected=5, lost=1)  # message 7 never reached "a" on "jobs"
    reasons = sorted(e["reason"] for e in result.examples["unexpected"])
    assert reasons == [
        "never published",
        "never published",
        "publish failed definitely",
        "wrong topic or group",
        "wrong topic or group",
    ]


def test_acked_then_redelivered_is_counted_with_windows() -> None:
    b = clean()
    k = b.publish(400, message_id=5)
    b.both(450, k, message_id=5, due=402)  # acked ok at 453
    b.deliver(3000, k, message_id=5, group="a", due=402, attempt=2)
    b.deliver(3500, k, message_id=5, group="b", due=402, attempt=2)
    b.deliver(30_000, k, message_id=5, group="a", due=402, attempt=3)
    b.add(2_900, "leader", node_id=2, term=3, observer=1)
    b.add(1_000, "leader", node_id=1, term=2, observer=1)
    result = check(b.finish(40_000))
    assert result.ok  # reported, not failing
    assert result.counts["acked_then_redelivered"] == 3
    assert result.counts["duplicates"] == 3
    assert result.duplicates_ratio == pytest.approx(3 / 6)
    windows = result.redelivery_windows
    assert [(w["count"], w["near_leader_change"]) for w in windows] == [(2, True), (1, False)]


def test_redelivery_of_unacked_message_is_a_duplicate_only() -> None:
    b = clean()
    k = b.publish(400, message_id=5)
    b.deliver(450, k, message_id=5, group="a", due=402, ack=False)  # consumer crashed
    b.deliver(1450, k, message_id=5, group="a", due=402, attempt=2)
    b.deliver(450, k, message_id=5, group="b", due=402)
    result = check(b.finish(5_000))
    assert result.ok
    assert result.counts["acked_then_redelivered"] == 0
    assert result.counts["duplicates"] == 1


def test_delivered_but_never_acked_is_unsettled() -> None:
    b = clean()
    k = b.publish(400, message_id=5)
    b.both(450, k, message_id=5, due=402, ack=False)
    result = check(b.finish(5_000))
    assert result.ok
    assert result.counts["unsettled"] == 2


def test_publish_stored_twice_is_counted() -> None:
    b = clean()
    k = b.publish(400, message_id=5)
    b.both(450, k, message_id=5, due=402)
    b.deliver(460, k, message_id=6, group="a", due=402)  # the same key under another id
    result = check(b.finish(5_000))
    assert result.ok
    assert result.counts["publish_duplicates"] == 1


def test_leader_changes_and_two_leaders_in_one_term() -> None:
    b = clean()
    for t, node, term in [(10, 1, 1), (20, 1, 1), (30, None, None), (40, 2, 2), (50, 1, 1)]:
        b.add(t, "leader", node_id=node, term=term, observer=1)
    b.add(60, "leader", node_id=3, term=2, observer=3)
    result = check(b.finish(5_000))
    assert result.counts["leader_changes"] == 2  # 1 -> 2 (term 2) -> 3 (same term!)
    assert_only(result.counts, multiple_leaders_per_term=1)
    assert result.examples["multiple_leaders_per_term"] == [{"term": 2, "leaders": [2, 3]}]


def test_leader_changes_without_terms_count_node_switches() -> None:
    b = clean()
    for t, node in [(10, 1), (20, None), (30, 1), (40, 2), (50, 2), (60, 1)]:
        b.add(t, "leader", node_id=node, term=None, observer=1)
    assert check(b.finish(5_000)).counts["leader_changes"] == 2


def test_unavailability_windows_merge_failed_and_slow_publishes() -> None:
    b = clean()
    b.publish(1_000, message_id=5, outcome="info", took_ms=500, delay_ms=3_600_000)
    b.publish(1_200, message_id=6, outcome="fail", took_ms=600)
    b.publish(3_000, message_id=7, took_ms=2_500, delay_ms=3_600_000)  # slow but ok
    result = check(b.finish(10_000), CheckConfig(stall_ms=2_000))
    assert result.ok
    windows = [(w["start"] - T0, w["end"] - T0) for w in result.unavailability_windows]
    assert windows == [(1_000, 1_800), (3_000, 5_500)]
    assert result.summary()["unavailable_ms"] == pytest.approx(3_300)


def test_summary_is_json_and_history_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    history = History(path)
    for event in clean().finish(5_000):
        history.record(event.pop("type"), **event)
    history.close()
    with open(path, "a") as file:
        file.write('{"t": 1, "type": "deliv')  # a run killed mid-line
    events = list(read_history(path))
    assert len(events) == len(history.events)
    summary = check(events).summary()
    assert json.loads(json.dumps(summary))["lost"] == 0


def test_helpers() -> None:
    assert percentile([], 0.5) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.99) == 4.0
    assert merge_intervals([(5, 6), (1, 3), (2, 4)]) == [(1, 4), (5, 6)]


# ------------------------------------------------- what the nodes still held at the end


def state(node_id: int, held: list[list[Any]], applied_index: int = 100) -> Event:
    """A ``state`` event as the runner records it (``evidence.read_holdings``)."""
    return {
        "t": T0 + 20_000,
        "type": "state",
        "node_id": node_id,
        "applied_index": applied_index,
        "groups": {"jobs/a": 1, "jobs/b": 2},
        "held": held,
        "messages": sorted({entry[0] for entry in held}),
    }


def backlog() -> tuple[Builder, str]:
    """Group ``b`` works through a backlog in due order until the drain ends at 30 s:
    message ``100 + n`` is due at 0.5 s + 0.5 s * n and received at 2 s + 2.5 s * n
    (n = 0..10). Message 9, due at 6 s, reached group ``a`` but never ``b``."""
    b = clean()
    k = b.publish(400, message_id=9, delay_ms=5_600)
    b.deliver(6_020, k, message_id=9, group="a", due=6_002)
    for n in range(11):
        due = 500 + 500 * n
        key = b.publish(300 + 10 * n, message_id=100 + n, groups=["b"], delay_ms=due - 300 - 10 * n)
        b.deliver(2_000 + 2_500 * n, key, message_id=100 + n, group="b", due=due)
    return b, k


def test_missing_delivery_held_by_every_node_is_undelivered_not_lost() -> None:
    b, k = backlog()
    events = b.finish(30_000)
    held = [[9, "jobs", "b", T0 + 6_002, 0]]
    result = check([*events, state(1, held), state(2, held), state(3, held)])
    assert_only(result.counts)
    assert result.ok
    assert result.counts["undelivered"] == 1 and result.warnings == {"undelivered": 1}
    example = result.examples["undelivered"][0]
    assert example["key"] == k and example["group"] == "b" and example["held_by"] == [1, 2, 3]
    assert result.summary()["warnings"] == {"undelivered": 1}


def test_missing_delivery_without_node_state_is_lost() -> None:
    b, _ = backlog()
    result = check(b.finish(30_000))  # an old history, or nothing could be read
    assert_only(result.counts, lost=1)
    assert result.examples["lost"][0]["nodes"] == "no node state recorded"


def test_missing_delivery_gone_from_the_up_to_date_nodes_is_lost() -> None:
    b, _ = backlog()
    events = b.finish(30_000)
    old = [[9, "jobs", "b", T0 + 6_002, 0]]
    # Node 3 still has it but is behind; the two up-to-date nodes dropped it.
    states = [state(1, [], 120), state(2, [], 120), state(3, old, 90)]
    result = check([*events, *states])
    assert_only(result.counts, lost=1)
    assert result.counts["undelivered"] == 0
    # A node that could not be read proves nothing either way.
    unreadable = {"t": T0 + 20_000, "type": "state", "node_id": 1, "error": "cannot open"}
    assert_only(check([*events, unreadable]).counts, lost=1)


def test_held_entry_behind_the_group_frontier_is_stranded() -> None:
    b, _ = backlog()
    events = b.finish(30_000)
    # Due at 1 s, yet group b went on to deliver entries due up to 3.5 s and then
    # kept delivering for 10 s more: the dispatcher passed it by.
    held = [[9, "jobs", "b", T0 + 1_000, 0]]
    result = check([*events, state(1, held), state(2, held)])
    assert_only(result.counts, stranded=1)
    assert result.examples["stranded"][0]["group_frontier_due_ms"] == T0 + 3_500
    # Due at 4 s (after the frontier): the drain ended before its turn.
    later = [[9, "jobs", "b", T0 + 4_000, 0]]
    assert_only(check([*events, state(1, later), state(2, later)]).counts)
    # With a slack longer than the whole backlog there is no frontier yet.
    assert_only(check([*events, state(1, held)], CheckConfig(frontier_slack_ms=30_000)).counts)


def test_entry_stored_after_the_later_deliveries_is_not_stranded() -> None:
    """A slow publish (acknowledged after 17 s, as under a loaded machine) stores an
    entry due at 1 s after group b delivered everything due before 3.5 s that settles
    its frontier: the dispatcher never had the chance to pass it by."""
    b = Builder()
    b.add(0, "run", phase="start", topics=TOPICS)
    b.publish(400, message_id=9, delay_ms=600, took_ms=17_000, groups=["b"])
    for n in range(11):
        due = 500 + 500 * n
        key = b.publish(300 + 10 * n, message_id=100 + n, groups=["b"], delay_ms=due - 300 - 10 * n)
        b.deliver(2_000 + 2_500 * n, key, message_id=100 + n, group="b", due=due)
    events = b.finish(30_000)
    held = [[9, "jobs", "b", T0 + 1_000, 0]]
    result = check([*events, state(1, held), state(2, held)])
    assert_only(result.counts)
    assert result.counts["undelivered"] == 1
    # Acknowledged at 5 s instead, it existed while entries due up to 3.5 s went out.
    b2, _ = backlog()
    events = b2.finish(30_000)
    assert_only(check([*events, state(1, held), state(2, held)]).counts, stranded=1)


def test_missing_delivery_in_a_consumer_buffer_is_buffered() -> None:
    """Pushed to a consumer of the group whose client had not handed it out when the
    drain ended (prefetch 200, one ack at a time on a loaded machine): neither passed by
    nor stalled, whatever its due time."""
    b, k = backlog()
    b.add(29_000, "buffered", consumer="b-4-lease", group="b", ids=[9], keys=[k])
    b.add(29_000, "buffered", consumer="a-4-lease", group="a", ids=[], keys=[])
    events = b.finish(30_000)
    held = [[9, "jobs", "b", T0 + 1_000, 0]]  # due before the frontier: stranded otherwise
    result = check([*events, state(1, held), state(2, held)])
    assert_only(result.counts)
    assert result.counts["buffered"] == 1 and result.warnings == {"buffered": 1}
    assert result.examples["buffered"][0]["group"] == "b"
    # In another group's buffer it proves nothing for this one.
    b, k = backlog()
    b.add(29_000, "buffered", consumer="a-4-lease", group="a", ids=[9], keys=[k])
    events = b.finish(30_000)
    assert_only(check([*events, state(1, held), state(2, held)]).counts, stranded=1)


def test_group_that_delivered_nothing_late_in_the_drain_stalled() -> None:
    b = clean()
    k = b.publish(400, message_id=9, delay_ms=100)
    b.deliver(520, k, message_id=9, group="a", due=502)
    events = b.finish(30_000)  # group b's last delivery came at 1.1 s
    held = [[9, "jobs", "b", T0 + 502, 0]]
    result = check([*events, state(1, held), state(2, held)])
    assert_only(result.counts, drain_stalled=1)
    assert result.examples["drain_stalled"][0]["group"] == "b"
    assert result.counts["undelivered"] == 1


def test_leader_changes_after_the_heal_are_counted() -> None:
    b = clean()
    b.add(1_000, "leader", node_id=1, term=1, observer=1)
    b.add(2_000, "run", phase="healed")
    for t, node, term in [(3_000, 2, 2), (4_000, 3, 3)]:
        b.add(t, "leader", node_id=node, term=term, observer=node)
    result = check(b.finish(5_000))
    assert result.counts["leader_changes"] == 2
    assert result.counts["leader_changes_after_heal"] == 2


# ------------------------------------------------- the drain's incremental tracker


def every_prefix_agrees(events: list[Event]) -> None:
    outstanding = Outstanding()
    for n in range(1, len(events) + 1):
        prefix = events[:n]
        outstanding.update(prefix)
        end = prefix[-1]["t"]
        provisional = [*prefix, {"t": end, "type": "run", "phase": "drain_end"}]
        result = check(provisional)
        missing = outstanding.missing(end)
        assert len({key for key, *_ in missing}) == result.counts["lost"], n
        assert len(missing) == result.counts["lost_group_entries"], n


def test_outstanding_agrees_with_the_checker_on_every_prefix() -> None:
    b, _ = backlog()
    k = b.publish(12_000, message_id=20)
    b.add(12_100, "deliver", id=20, key=k, topic="other", group="a", due_ms=T0, delivered_ms=T0)
    b.deliver(12_200, k, message_id=20, group="a", due=12_000)
    k = b.publish(12_300, message_id=21, ttl_ms=60_000, took_ms=400)
    b.deliver(12_350, k, message_id=21, group="b", due=12_300)  # before the publish's ok
    b.publish(12_400, message_id=22, outcome="info")
    b.publish(12_500, message_id=23, delay_ms=200, ttl_ms=5)
    every_prefix_agrees(b.finish(14_000))


def test_outstanding_waives_a_deleted_group_like_the_checker() -> None:
    b = clean()
    b.publish(1_000, message_id=40)
    b.add(1_100, "group", phase="invoke", action="delete", topic="jobs", group="a")
    b.publish(1_120, message_id=41)  # concurrent with the delete
    b.add(1_150, "group", phase="ok", action="delete", topic="jobs", group="a")
    b.publish(1_200, message_id=42)  # after it: required again
    b.add(1_300, "group", phase="invoke", action="delete", topic="jobs", group="b")
    every_prefix_agrees(b.finish(5_000))  # the second delete never answered


def test_outstanding_reads_each_event_once() -> None:
    """A drain poll costs the events since the last poll, not the whole history
    (a full check of a 10-minute history stalled every Raft link for ~1 s)."""
    b, _ = backlog()
    events = b.finish(30_000)
    outstanding = Outstanding()
    assert outstanding.update(events[:-10]) == len(events) - 10
    assert outstanding.update(events) == 10
    assert outstanding.update(events) == 0
    assert [(key, ids, group) for key, ids, _, group in outstanding.missing(events[-1]["t"])] == [
        ("p0-5", [9], "b")
    ]


def test_duplicates_are_counted_by_cause() -> None:
    b = clean()
    # nack by design, then acked
    k = b.publish(1000, message_id=10, groups=["a"])
    b.deliver(1010, k, message_id=10, group="a", due=1002, settle="nack")
    b.deliver(1600, k, message_id=10, group="a", due=1002, attempt=2)
    # a slow consumer that never settled: its visibility timeout passed
    k = b.publish(2000, message_id=11, groups=["a"])
    b.deliver(2010, k, message_id=11, group="a", due=2002, ack=False)
    b.deliver(5000, k, message_id=11, group="a", due=2002, attempt=2)
    # held when its consumer's connection was lost
    k = b.publish(6000, message_id=12, groups=["a"])
    other = b.publish(6001, message_id=13, groups=["a"])
    b.deliver(6010, k, message_id=12, group="a", due=6002, ack=False)
    b.deliver(6500, other, message_id=13, group="a", due=6002, conn=2)  # it reconnected
    b.deliver(7000, k, message_id=12, group="a", due=6002, attempt=2, conn=2)
    # its ack was cancelled on the way
    k = b.publish(8000, message_id=14, groups=["a"])
    b.deliver(8010, k, message_id=14, group="a", due=8002, settle="cancelled", conn=2)
    b.deliver(11000, k, message_id=14, group="a", due=8002, attempt=2, conn=2)
    # a leader change between the two
    k = b.publish(12000, message_id=15, groups=["a"])
    b.deliver(12010, k, message_id=15, group="a", due=12002, ack=False, conn=2)
    b.add(12100, "leader", node_id=1, term=1)
    b.add(12200, "leader", node_id=2, term=2)
    b.deliver(15000, k, message_id=15, group="a", due=12002, attempt=2, conn=2)
    counts = check(b.finish(20_000))
    assert_only(counts.counts)
    assert counts.duplicates_by_cause == {
        "nack": 1,
        "leader_change": 1,
        "connection_loss": 1,
        "cancelled": 1,
        "consumer_timeout": 1,
        "publish_retry": 0,
        "after_ack": 0,
    }
    assert counts.counts["duplicates"] == 5
    assert check(b.events).summary()["duplicates_by_cause"]["nack"] == 1


def test_a_publish_stored_twice_is_a_publish_retry_duplicate() -> None:
    b = clean()
    k = b.publish(1000, message_id=20, groups=["a"])
    b.deliver(1010, k, message_id=20, group="a", due=1002)
    b.deliver(1020, k, message_id=21, group="a", due=1002)
    result = check(b.finish(5000))
    assert result.duplicates_by_cause["publish_retry"] == 1


def test_attempts_that_repeat_or_go_back_are_caught() -> None:
    b = clean()
    k = b.publish(1000, message_id=30, groups=["a"])
    b.deliver(1010, k, message_id=30, group="a", due=1002, attempt=2, ack=False)
    b.deliver(4000, k, message_id=30, group="a", due=1002, attempt=2, ack=False)  # repeat
    b.deliver(7000, k, message_id=30, group="a", due=1002, attempt=1)  # pushed later, lower
    result = check(b.finish(10_000))
    assert_only(result.counts, attempt_not_increasing=3)


def test_attempts_are_ordered_by_push_time_not_by_receipt() -> None:
    """A delivery buffered on a deposed leader's connection may be handed out after the
    new leader's redelivery: its push (``delivered_ms``) was earlier."""
    b = clean()
    k = b.publish(1000, message_id=31, groups=["a"])
    b.deliver(3000, k, message_id=31, group="a", due=1002, attempt=2, delivered=2500)
    b.deliver(3500, k, message_id=31, group="a", due=1002, attempt=1, delivered=1100, ack=False)
    assert_only(check(b.finish(10_000)).counts)


def test_a_first_attempt_seen_twice_is_reported_not_failed() -> None:
    b = clean()
    k = b.publish(1000, message_id=32, groups=["a"])
    b.deliver(1010, k, message_id=32, group="a", due=1002, ack=False)
    b.add(1100, "leader", node_id=1, term=1)
    b.add(1200, "leader", node_id=2, term=2)
    b.deliver(3000, k, message_id=32, group="a", due=1002)
    result = check(b.finish(10_000))
    assert_only(result.counts)
    assert result.counts["first_attempt_repeated"] == 1


def test_a_deleted_group_is_not_required_after_the_delete() -> None:
    b = clean()
    k = b.publish(1000, message_id=40)
    b.deliver(1010, k, message_id=40, group="b", due=1002)
    b.add(1100, "group", phase="invoke", action="delete", topic="jobs", group="a")
    b.add(1150, "group", phase="ok", action="delete", topic="jobs", group="a")
    later = b.publish(1200, message_id=41)  # published after the delete: required again
    result = check(b.finish(5000))
    assert_only(result.counts, lost=1)
    assert result.examples["lost"][0]["key"] == later
    assert result.counts["waived_group_entries"] == 3  # every group "a" entry published before


def test_a_delete_concurrent_with_a_publish_waives_it() -> None:
    """Invoked just before the publish, answered after: the log may hold the delete
    after the publish, which then removed the message with the group."""
    b = clean()
    b.add(999, "group", phase="invoke", action="delete", topic="jobs", group="a")
    k = b.publish(1000, message_id=50)  # answered 5 ms later
    b.add(1100, "group", phase="ok", action="delete", topic="jobs", group="a")
    b.deliver(1200, k, message_id=50, group="b", due=1002)
    result = check(b.finish(5000))
    assert_only(result.counts)
    # An earlier delete, answered before the publish was invoked, waives nothing.
    b = clean()
    b.add(500, "group", phase="invoke", action="delete", topic="jobs", group="a")
    b.add(600, "group", phase="ok", action="delete", topic="jobs", group="a")
    k = b.publish(1000, message_id=50)
    b.deliver(1200, k, message_id=50, group="b", due=1002)
    assert_only(check(b.finish(5000)).counts, lost=1)


def test_leaders_are_checked_per_shard() -> None:
    """Each shard's Raft group has its own terms: two shards led by different nodes in
    the same term is normal; two leaders of one shard in one term is a violation."""
    b = clean()
    for t, node, shard in [(10, 1, 0), (10, 2, 1), (20, 1, 0), (20, 2, 1)]:
        b.add(t, "leader", node_id=node, term=3, observer=node, shard=shard)
    assert_only(check(b.finish(5_000)).counts)
    b.add(30, "leader", node_id=3, term=3, observer=3, shard=1)
    result = check(b.finish(5_000))
    assert_only(result.counts, multiple_leaders_per_term=1)
    assert result.examples["multiple_leaders_per_term"] == [
        {"term": 3, "leaders": [2, 3], "shard": 1}
    ]
    assert result.counts["leader_changes"] == 1  # shard 1: 2 -> 3; shard 0 never changed


def test_held_entries_are_judged_per_shard() -> None:
    """Sharded nodes: one state event per node and shard, each shard at its own applied
    index. An entry held by every up-to-date member of its shard is undelivered, even
    when another shard's applied index is higher; gone from them, it is lost."""
    b, _ = backlog()
    events = b.finish(30_000)
    held = [[9, "jobs", "b", T0 + 6_002, 0]]
    states = [{**state(n, held, 50), "shard": 1} for n in (1, 2, 3)] + [
        {**state(n, [], 400), "shard": 0} for n in (1, 2, 3)
    ]
    result = check([*events, *states])
    assert_only(result.counts)
    assert result.counts["undelivered"] == 1
    gone = [
        {**state(1, [], 60), "shard": 1},
        {**state(2, [], 60), "shard": 1},
        {**state(3, held, 50), "shard": 1},
        *[{**state(n, [], 400), "shard": 0} for n in (1, 2, 3)],
    ]
    assert_only(check([*events, *gone]).counts, lost=1)
