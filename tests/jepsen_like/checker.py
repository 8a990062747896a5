"""The checker: verdicts on a recorded history (``history.py`` describes the events).

Only the history is consulted, never the cluster, so a saved ``history.jsonl`` can be
checked again offline (``python -m tests.jepsen_like check DIR``).

Time bounds. The harness does not know the leader's ``publish_ms`` when it invokes a
publish, but it knows two instants around it: the leader stamps the message after the
invocation and before the acknowledgement. So, on the harness clock and allowing
``allowed_offset_ms`` for the nodes' clock offset and rounding:

* ``due_lower = invoke + delay_ms`` (or ``max(deliver_at_ms, invoke)``),
* ``due_upper = ok + delay_ms`` (or ``max(deliver_at_ms, ok)``), known only for ``ok``,
* the expiry is ``due + ttl_ms``: TTL counts from the due time (DESIGN.md, "Message
  semantics").

Verdicts (the first seven must be zero):

``lost``
    An acknowledged publish that is required — it fell due before the drain ended
    (``due_upper <= drain_end``) and could not have expired by then (no TTL, or
    ``due_lower + ttl_ms > drain_end``) — never delivered to one of its target groups,
    and gone from the nodes: no ``state`` event shows the group's schedule entry still
    held (``evidence.py``). Without ``state`` events every missing delivery is lost.
``stranded``
    A missing delivery (group entry) the nodes still hold, due before its group's
    delivery frontier: after its publish was acknowledged (so the entry was stored),
    the group delivered entries due later than it, at least ``frontier_slack_ms``
    before its last delivery (a group is dispatched in due order, and a delivery lost
    with its connection comes again within a visibility timeout), so the dispatcher
    passed it by.
``drain_stalled``
    A group that held missing deliveries and delivered nothing in the last
    ``drain_stall_ms`` of the drain, with every fault healed: an availability failure.
``early``
    A delivery received before ``due_lower - allowed_offset_ms``, or pushed before the
    server's own ``due_ms`` (``delivered_ms < due_ms``).
``expired_delivered``
    A delivery pushed after the expiry: ``delivered_ms > due_ms + ttl_ms`` by the
    server's own stamps, or ``delivered_ms > due_upper + ttl_ms + allowed_offset_ms``.
``unexpected``
    A delivery whose payload names no publish, of a publish that definitely failed, on
    another topic, or to a group the publish did not target.
``multiple_leaders_per_term``
    Two different leaders observed for the same term.
``attempt_not_increasing``
    Two deliveries of a message to a group where the one pushed later (by the servers'
    ``delivered_ms``, beyond the clock allowance) has a lower attempt, or two with the
    same attempt above 1: a redelivery's attempt is committed before it goes out, so
    attempts never go backwards. (A first delivery goes out unrecorded, so attempt 1
    may be seen twice across a leader change: counted as ``first_attempt_repeated``.)

A message is not required of a group (``lost``) when a delete of that group may have
been applied after the message was stored: a delete that had not completed when the
publish was invoked (``group`` events of the churner; a delete invoked just before the
publish may still be ordered after it in the log).

Reported, not failing: ``buffered`` (missing group entries found in a live consumer's
client buffer when the drain ended: pushed to the group, not yet handed to the consumer;
``buffered`` events), ``undelivered`` (missing group entries the nodes still hold,
not behind the frontier, their group still delivering when the drain ended: the drain
was too short for the backlog, nothing is lost; the table marks it WARN and the
summary lists it under ``warnings``), ``acked_then_redelivered`` (a delivery pushed after an ack of the
same message and group was acknowledged, with time windows and whether a leader change
or fault happened near each), ``duplicates`` and their ratio, ``duplicates_by_cause``
(for each delivery after the first of a message to a group, why the one before did not
end it, in this order: ``nack``; ``leader_change`` between the two; ``connection_loss``
of the consumer that had it; ``cancelled`` settlement; ``consumer_timeout`` (never
settled: the visibility timeout passed, by design of the slow consumers);
``publish_retry`` (another id: the publish was stored twice); ``after_ack`` (acked, yet
delivered again)), ``lateness_ms``
(first delivery per message and group, received minus ``due_ms``), unavailability
windows (publishes that failed, were left unknown, or took longer than ``stall_ms``),
``leader_changes`` (and ``leader_changes_after_heal``: with every fault healed there
should be none), ``unsettled`` (required, delivered, never acked).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import attrs
from tests.jepsen_like.history import Event

MUST_BE_ZERO = (
    "lost",
    "stranded",
    "drain_stalled",
    "early",
    "expired_delivered",
    "unexpected",
    "multiple_leaders_per_term",
    "attempt_not_increasing",
)
#: Reported with a warning: not a violation, but the run could not show it delivered.
WARNINGS = ("undelivered", "buffered")
DUPLICATE_CAUSES = (
    "nack",
    "leader_change",
    "connection_loss",
    "cancelled",
    "consumer_timeout",
    "publish_retry",
    "after_ack",
)
MAX_EXAMPLES = 20


class _Frontier:
    """A group's settled deliveries ``(received t, due_ms)``: the largest ``due_ms``
    among those received at or after a given time, in O(log n) per question."""

    def __init__(self, pairs: list[tuple[float, float]]) -> None:
        pairs = sorted(pairs)
        self._times = [t for t, _ in pairs]
        self._max_due_from: list[float] = [0.0] * len(pairs)
        running = -math.inf
        for i in range(len(pairs) - 1, -1, -1):
            running = max(running, pairs[i][1])
            self._max_due_from[i] = running

    def after(self, t: float) -> float | None:
        """The largest ``due_ms`` delivered at or after ``t``, or None."""
        i = bisect.bisect_left(self._times, t)
        return self._max_due_from[i] if i < len(self._times) else None


@attrs.frozen
class CheckConfig:
    """Tolerances of the checker.

    Attributes:
        allowed_offset_ms: Clock offset between the harness and the nodes plus rounding
            (ms); raise it by the skew when the clock-skew fault runs.
        stall_ms: A publish slower than this counts towards unavailability (ms).
        window_gap_ms: Redeliveries further apart than this start a new window (ms).
        near_ms: A redelivery window is "near" a leader change or fault within this (ms).
        frontier_slack_ms: Deliveries received this long before a group's last delivery
            set its frontier (longer than any visibility timeout, so a delivery lost on
            a broken connection has been redelivered by then) (ms).
        drain_stall_ms: A group with missing deliveries that delivered nothing for this
            long before the drain ended stalled (ms).
    """

    allowed_offset_ms: float = 5.0
    stall_ms: float = 2_000.0
    window_gap_ms: float = 2_000.0
    near_ms: float = 10_000.0
    frontier_slack_ms: float = 10_000.0
    drain_stall_ms: float = 10_000.0


@attrs.define
class _Publish:
    op: int
    key: str
    topic: str
    groups: list[str]
    delay_ms: int | None
    deliver_at_ms: int | None
    ttl_ms: int | None
    invoke_t: float
    outcome: str = "pending"  # ok | fail | info | pending (never completed)
    complete_t: float | None = None
    ids: list[int] = attrs.Factory(list)

    @classmethod
    def invoked(cls, event: Event, topics: dict[str, list[str]]) -> _Publish:
        """The publish an ``invoke`` event starts (groups default to the topic's)."""
        topic = str(event["topic"])
        groups = event.get("groups")
        return cls(
            op=int(event["op"]),
            key=str(event["key"]),
            topic=topic,
            groups=list(groups if groups is not None else topics.get(topic, [])),
            delay_ms=event.get("delay_ms"),
            deliver_at_ms=event.get("deliver_at_ms"),
            ttl_ms=event.get("ttl_ms"),
            invoke_t=float(event["t"]),
        )

    def complete(self, event: Event) -> None:
        """Take an ``ok`` / ``fail`` / ``info`` completion event."""
        self.outcome = str(event["phase"])
        self.complete_t = float(event["t"])
        if self.outcome == "ok" and event.get("id") is not None:
            self.ids.append(int(event["id"]))

    def due_bound(self, t: float) -> float:
        if self.deliver_at_ms is not None:
            return max(float(self.deliver_at_ms), t)
        return t + (self.delay_ms or 0)

    @property
    def due_lower(self) -> float:
        return self.due_bound(self.invoke_t)

    @property
    def due_upper(self) -> float | None:
        if self.outcome != "ok" or self.complete_t is None:
            return None
        return self.due_bound(self.complete_t)

    def required_by(self, end: float) -> bool:
        """Acknowledged, due by ``end`` and unable to have expired by then: it must have
        reached every target group by ``end``."""
        due_upper = self.due_upper
        if due_upper is None or due_upper > end:
            return False
        return self.ttl_ms is None or self.due_lower + self.ttl_ms > end


@attrs.define
class CheckResult:
    """Counts and examples; :meth:`summary` is the ``summary.json`` shape."""

    counts: dict[str, int] = attrs.Factory(dict)
    examples: dict[str, list[dict[str, Any]]] = attrs.Factory(dict)
    lateness_ms: dict[str, float | None] = attrs.Factory(dict)
    duplicates_ratio: float = 0.0
    duplicates_by_cause: dict[str, int] = attrs.Factory(dict)
    redelivery_windows: list[dict[str, Any]] = attrs.Factory(list)
    unavailability_windows: list[dict[str, float]] = attrs.Factory(list)

    @property
    def failures(self) -> dict[str, int]:
        """The must-be-zero counts that are not zero."""
        return {name: self.counts[name] for name in MUST_BE_ZERO if self.counts.get(name, 0)}

    @property
    def ok(self) -> bool:
        """True when every must-be-zero count is zero."""
        return not self.failures

    @property
    def warnings(self) -> dict[str, int]:
        """The reported-with-a-warning counts that are not zero."""
        return {name: self.counts[name] for name in WARNINGS if self.counts.get(name, 0)}

    def summary(self) -> dict[str, Any]:
        """A JSON-able dict: every count, ratios, lateness, windows, examples."""
        unavailable_ms = sum(w["end"] - w["start"] for w in self.unavailability_windows)
        return {
            **self.counts,
            "ok": self.ok,
            "failures": self.failures,
            "warnings": self.warnings,
            "duplicates_ratio": self.duplicates_ratio,
            "duplicates_by_cause": self.duplicates_by_cause,
            "lateness_ms": self.lateness_ms,
            "acked_then_redelivered_windows": self.redelivery_windows,
            "unavailability_windows": self.unavailability_windows,
            "unavailable_ms": unavailable_ms,
            "examples": self.examples,
        }


def percentile(sorted_values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile of an ascending list; None when it is empty."""
    if not sorted_values:
        return None
    rank = max(1, min(len(sorted_values), round(fraction * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of closed intervals, ascending and disjoint."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


class _Checker:
    def __init__(self, events: list[Event], config: CheckConfig) -> None:
        self.events = sorted(events, key=lambda e: float(e["t"]))
        self.config = config
        self.result = CheckResult()
        self.publishes: dict[int, _Publish] = {}
        self.by_key: dict[str, _Publish] = {}
        self.deliveries: list[Event] = []
        self.ack_ok: dict[tuple[int, str], float] = {}
        self.settles: dict[tuple[int, str, int], str] = {}
        """(id, group, attempt) -> how it ended: ack, nack, cancelled (last word wins)."""
        self.deleted_groups: dict[tuple[str, str], list[float]] = defaultdict(list)
        """(topic, group) -> when each delete completed (inf: never answered)."""
        self._deletes_open: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.consumer_losses: dict[str, list[float]] = defaultdict(list)
        self._deliveries_of: dict[str, list[tuple[float, Any]]] | None = None
        self.topics: dict[str, list[str]] = {}
        self.topic_shards: dict[str, int] = {}
        """Topic -> shard, on sharded nodes (the run's start event)."""
        self.end_t = self.events[-1]["t"] if self.events else 0.0
        self.drain_end: float | None = None
        self.healed: float | None = None
        self.leaders: list[Event] = []
        self.faults: list[Event] = []
        self.states: list[Event] = []
        self.buffered: dict[str, set[int]] = defaultdict(set)
        """Group -> ids held in a live consumer's client buffer when the drain ended."""

    def example(self, kind: str, **fields: Any) -> None:
        found = self.result.examples.setdefault(kind, [])
        if len(found) < MAX_EXAMPLES:
            found.append(fields)

    def count(self, kind: str, amount: int = 1) -> None:
        self.result.counts[kind] = self.result.counts.get(kind, 0) + amount

    def read(self) -> None:
        for event in self.events:
            kind = event["type"]
            if kind == "publish":
                self.read_publish(event)
            elif kind == "deliver":
                self.deliveries.append(event)
            elif kind in ("ack", "nack"):
                phase = event.get("phase")
                if kind == "ack" and phase == "ok":
                    key = (int(event["id"]), str(event["group"]))
                    self.ack_ok.setdefault(key, float(event["t"]))
                if phase in ("ok", "cancelled") and event.get("attempt") is not None:
                    settle = (int(event["id"]), str(event["group"]), int(event["attempt"]))
                    self.settles[settle] = kind if phase == "ok" else "cancelled"
            elif kind == "group" and event.get("action") == "delete":
                where = (str(event["topic"]), str(event["group"]))
                if event.get("phase") == "invoke":
                    self._deletes_open[where].append(float(event["t"]))
                elif self._deletes_open[where]:
                    self._deletes_open[where].pop(0)
                    self.deleted_groups[where].append(float(event["t"]))
            elif kind == "consumer" and event.get("phase") in ("crash", "error", "ended"):
                self.consumer_losses[str(event["consumer"])].append(float(event["t"]))
            elif kind == "run":
                if event.get("phase") == "start":
                    self.topics = {k: list(v) for k, v in (event.get("topics") or {}).items()}
                    self.topic_shards = {
                        str(k): int(v) for k, v in (event.get("topic_shards") or {}).items()
                    }
                elif event.get("phase") == "drain_end":
                    self.drain_end = float(event["t"])
                elif event.get("phase") == "healed":
                    self.healed = float(event["t"])
            elif kind == "leader":
                self.leaders.append(event)
            elif kind in ("nemesis", "node"):
                self.faults.append(event)
            elif kind == "state":
                self.states.append(event)
            elif kind == "buffered":
                self.buffered[str(event["group"])].update(int(i) for i in event.get("ids", []))

    def read_publish(self, event: Event) -> None:
        if event["phase"] == "invoke":
            publish = _Publish.invoked(event, self.topics)
            self.publishes[publish.op] = publish
            self.by_key[publish.key] = publish
            return
        invoked = self.publishes.get(int(event["op"]))
        if invoked is None:
            self.example("malformed", reason="completion without invoke", event=event)
            return
        invoked.complete(event)

    def run(self) -> CheckResult:
        self.read()
        counts = self.result.counts
        for name in (
            *MUST_BE_ZERO,
            "acked_then_redelivered",
            "duplicates",
            "deliveries",
            "acked_publishes",
            "publishes",
            "failed_publishes",
            "unknown_publishes",
            "required_publishes",
            "lost_group_entries",
            "undelivered",
            "buffered",
            "unsettled",
            "publish_duplicates",
            "leader_changes",
            "leader_changes_after_heal",
            "waived_group_entries",
            "first_attempt_repeated",
        ):
            counts.setdefault(name, 0)
        counts["publishes"] = len(self.publishes)
        for publish in self.publishes.values():
            if publish.outcome == "ok":
                counts["acked_publishes"] += 1
            elif publish.outcome == "fail":
                counts["failed_publishes"] += 1
            else:
                counts["unknown_publishes"] += 1
        counts["deliveries"] = len(self.deliveries)
        self.check_deliveries()
        self.check_lost()
        self.check_leaders()
        self.check_unavailability()
        return self.result

    def check_deliveries(self) -> None:
        offset = self.config.allowed_offset_ms
        seen: dict[tuple[str, str], list[Event]] = defaultdict(list)
        ids_by_key: dict[str, set[int]] = defaultdict(set)
        redelivered_at: list[tuple[float, Event]] = []
        for d in self.deliveries:
            t = float(d["t"])
            key = d.get("key")
            group = str(d["group"])
            publish = self.by_key.get(key) if key is not None else None
            where = {"id": d["id"], "key": key, "group": group, "attempt": d.get("attempt"), "t": t}
            if publish is None:
                self.count("unexpected")
                self.example("unexpected", reason="never published", **where)
                continue
            if publish.outcome == "fail":
                self.count("unexpected")
                self.example("unexpected", reason="publish failed definitely", **where)
                continue
            if d.get("topic") != publish.topic or group not in publish.groups:
                self.count("unexpected")
                self.example(
                    "unexpected",
                    reason="wrong topic or group",
                    topic=d.get("topic"),
                    targets=publish.groups,
                    **where,
                )
                continue
            seen[(publish.key, group)].append(d)
            ids_by_key[publish.key].add(int(d["id"]))
            delivered_ms = float(d["delivered_ms"])
            due_ms = float(d["due_ms"])
            if t < publish.due_lower - offset or delivered_ms < due_ms:
                self.count("early")
                self.example(
                    "early",
                    due_lower=publish.due_lower,
                    due_ms=due_ms,
                    delivered_ms=delivered_ms,
                    early_by_ms=max(publish.due_lower - t, due_ms - delivered_ms),
                    **where,
                )
            if publish.ttl_ms is not None:
                expiry = due_ms + publish.ttl_ms
                due_upper = publish.due_upper
                late_bound = None if due_upper is None else due_upper + publish.ttl_ms + offset
                if delivered_ms > expiry or (late_bound is not None and delivered_ms > late_bound):
                    self.count("expired_delivered")
                    self.example(
                        "expired_delivered",
                        expiry_ms=expiry,
                        delivered_ms=delivered_ms,
                        ttl_ms=publish.ttl_ms,
                        **where,
                    )
            acked = self.ack_ok.get((int(d["id"]), group))
            if acked is not None and delivered_ms > acked + offset:
                self.count("acked_then_redelivered")
                self.example("acked_then_redelivered", acked_t=acked, **where)
                redelivered_at.append((delivered_ms, d))
        distinct = len(seen)
        self.check_attempts_and_causes(seen)
        self.count("duplicates", len(self.deliveries) - self.result.counts["unexpected"] - distinct)
        self.result.duplicates_ratio = (
            self.result.counts["duplicates"] / distinct if distinct else 0.0
        )
        self.count("publish_duplicates", sum(len(ids) - 1 for ids in ids_by_key.values()))
        lateness = sorted(
            float(min(ds, key=lambda e: float(e["t"]))["t"])
            - float(min(ds, key=lambda e: float(e["t"]))["due_ms"])
            for ds in seen.values()
        )
        self.result.lateness_ms = {
            "p50": percentile(lateness, 0.50),
            "p99": percentile(lateness, 0.99),
            "max": lateness[-1] if lateness else None,
        }
        self.seen = seen
        self.result.redelivery_windows = self.windows(redelivered_at)

    def windows(self, times: list[tuple[float, Event]]) -> list[dict[str, Any]]:
        windows: list[dict[str, Any]] = []
        for t, _event in sorted(times, key=lambda pair: pair[0]):
            if windows and t - windows[-1]["end"] <= self.config.window_gap_ms:
                windows[-1]["end"] = t
                windows[-1]["count"] += 1
            else:
                windows.append({"start": t, "end": t, "count": 1})
        changes = self.leader_change_times()
        fault_times = [float(e["t"]) for e in self.faults]
        near = self.config.near_ms
        for window in windows:
            window["near_leader_change"] = any(
                window["start"] - near <= c <= window["end"] + near for c in changes
            )
            window["near_fault"] = any(
                window["start"] - near <= c <= window["end"] + near for c in fault_times
            )
        return windows

    def check_attempts_and_causes(self, seen: dict[tuple[str, str], list[Event]]) -> None:
        """Attempts only increase in push order; each duplicate gets a cause."""
        causes = dict.fromkeys(DUPLICATE_CAUSES, 0)
        every_change = self.leader_change_times()
        changes_of = {shard: self.leader_change_times(shard) for shard in self.shards()}
        offset = self.config.allowed_offset_ms
        for (key, group), deliveries in seen.items():
            ordered = sorted(deliveries, key=lambda e: float(e["t"]))
            shard = self.shard_of_group(group)
            changes = changes_of[shard] if shard in changes_of else every_change
            for previous, current in zip(ordered, ordered[1:], strict=False):
                causes[self.cause(previous, current, group, changes)] += 1
            by_id: dict[int, list[Event]] = defaultdict(list)
            for delivery in ordered:
                if delivery.get("attempt") is not None:
                    by_id[int(delivery["id"])].append(delivery)
            for mid, pushes in by_id.items():
                for i, one in enumerate(pushes):
                    for other in pushes[i + 1 :]:
                        a, b = int(one["attempt"]), int(other["attempt"])
                        if a == b == 1:
                            self.count("first_attempt_repeated")
                            continue
                        earlier, later = sorted(
                            (one, other), key=lambda e: float(e["delivered_ms"])
                        )
                        gap = float(later["delivered_ms"]) - float(earlier["delivered_ms"])
                        if a == b or (
                            gap > offset and int(later["attempt"]) < int(earlier["attempt"])
                        ):
                            self.count("attempt_not_increasing")
                            self.example(
                                "attempt_not_increasing",
                                key=key,
                                group=group,
                                id=mid,
                                attempts=[a, b],
                                delivered_ms=[one["delivered_ms"], other["delivered_ms"]],
                            )
        self.result.duplicates_by_cause = causes

    def cause(self, previous: Event, current: Event, group: str, changes: list[float]) -> str:
        """Why ``previous`` did not end the message for the group (see the module doc)."""
        if previous["id"] != current["id"]:
            return "publish_retry"
        start, end = float(previous["t"]), float(current["t"])
        settled = self.settles.get((int(previous["id"]), group, int(previous.get("attempt") or 0)))
        if settled == "nack":
            return "nack"
        if any(start <= t <= end for t in changes):
            return "leader_change"
        losses = self.consumer_losses.get(str(previous.get("consumer")), [])
        later = [
            e
            for e in self.deliveries_of.get(str(previous.get("consumer")), [])
            if start < e[0] < end
        ]
        if any(start <= t <= end for t in losses) or any(
            conn != previous.get("conn") for _, conn in later
        ):
            return "connection_loss"
        if settled == "cancelled":
            return "cancelled"
        if settled is None:
            return "consumer_timeout"
        return "after_ack"

    @property
    def deliveries_of(self) -> dict[str, list[tuple[float, Any]]]:
        """Consumer -> ``(t, conn)`` of its deliveries, in time order (cached)."""
        cached = self._deliveries_of
        if cached is None:
            cached = defaultdict(list)
            for event in self.deliveries:
                cached[str(event.get("consumer"))].append((float(event["t"]), event.get("conn")))
            self._deliveries_of = cached
        return cached

    def waived(self, publish: _Publish, group: str) -> bool:
        """A delete of the group completed after the publish was invoked, or never
        completed: it may have removed the message, so it is not required of the group."""
        where = (publish.topic, group)
        if self._deletes_open.get(where):
            return True  # a delete that never answered may have happened any time after
        return any(t >= publish.invoke_t for t in self.deleted_groups.get(where, []))

    def check_lost(self) -> None:
        """Lost, stranded, undelivered and stalled: every required delivery not seen,
        classified by what the nodes still held (``state`` events) when the run ended."""
        end = self.drain_end if self.drain_end is not None else self.end_t
        held = self.held_entries()
        frontiers, last_delivery = self.group_progress(end)
        missing_per_group: dict[str, int] = defaultdict(int)
        for publish in self.publishes.values():
            if not publish.required_by(end):
                continue
            waived = [g for g in publish.groups if self.waived(publish, g)]
            self.count("waived_group_entries", len(waived))
            if len(waived) == len(publish.groups):
                continue
            self.count("required_publishes")
            missing = [
                g for g in publish.groups if (publish.key, g) not in self.seen and g not in waived
            ]
            gone: list[str] = []
            for group in missing:
                if any(mid in self.buffered.get(group, ()) for mid in publish.ids):
                    # Pushed to a consumer of the group whose client had not handed it
                    # out yet (a prefetch buffer, kept alive by its lease keeper).
                    self.count("buffered")
                    self.example("buffered", key=publish.key, ids=publish.ids, group=group)
                    continue
                found = None
                if held is not None:
                    found = next(
                        (
                            held[k]
                            for mid in publish.ids
                            if (k := (mid, publish.topic, group)) in held
                        ),
                        None,
                    )
                if found is None:
                    gone.append(group)
                    continue
                missing_per_group[group] += 1
                due_ms, holders = found
                # Only deliveries made once this entry was stored (its publish was
                # acknowledged) show the dispatcher passing it by; a slow publish can
                # store an entry already due later than what the group delivered.
                found_frontier = frontiers.get(group)
                frontier = (
                    None
                    if found_frontier is None or publish.complete_t is None
                    else found_frontier.after(publish.complete_t)
                )
                kind = "stranded" if frontier is not None and due_ms < frontier else "undelivered"
                self.count(kind)
                self.example(
                    kind,
                    key=publish.key,
                    ids=publish.ids,
                    group=group,
                    due_ms=due_ms,
                    group_frontier_due_ms=frontier,
                    held_by=holders,
                    ok_t=publish.complete_t,
                )
            if gone:
                self.count("lost")
                self.count("lost_group_entries", len(gone))
                self.example(
                    "lost",
                    key=publish.key,
                    ids=publish.ids,
                    missing_groups=gone,
                    due_upper=publish.due_upper,
                    ok_t=publish.complete_t,
                    nodes=(
                        "no node state recorded"
                        if held is None
                        else "no up-to-date node holds its schedule entry"
                    ),
                )
            for group in publish.groups:
                if group in waived:
                    continue
                deliveries = self.seen.get((publish.key, group), [])
                if deliveries and not any((int(d["id"]), group) in self.ack_ok for d in deliveries):
                    self.count("unsettled")
                    self.example("unsettled", key=publish.key, group=group)
        for group, entries in sorted(missing_per_group.items()):
            last = last_delivery.get(group)
            if last is None or end - last > self.config.drain_stall_ms:
                self.count("drain_stalled")
                self.example(
                    "drain_stalled",
                    group=group,
                    missing_entries=entries,
                    last_delivery_t=last,
                    idle_ms=None if last is None else end - last,
                )

    def held_entries(self) -> dict[tuple[int, str, str], tuple[int, list[int]]] | None:
        """``(message id, topic, group) -> (due_ms, node ids)`` of the schedule entries
        held by every node with the highest applied index among those read; None when
        no node's state was read (nothing can be shown held)."""
        readable = [e for e in self.states if "error" not in e]
        if not readable:
            return None
        # Sharded nodes: one state event per node and shard; each shard's group has
        # its own applied index, so "up to date" is judged shard by shard.
        by_shard: dict[Any, list[Event]] = defaultdict(list)
        for event in readable:
            by_shard[event.get("shard")].append(event)
        found: dict[tuple[int, str, str], tuple[int, list[int]]] = {}
        for events in by_shard.values():
            top = max(int(e.get("applied_index") or 0) for e in events)
            current = [e for e in events if int(e.get("applied_index") or 0) == top]
            holders: dict[tuple[int, str, str], dict[int, int]] = defaultdict(dict)
            for event in current:
                for mid, topic, group, due_ms, _attempt in event.get("held", []):
                    key = (int(mid), str(topic), str(group))
                    holders[key][int(event["node_id"])] = int(due_ms)
            found.update(
                (key, (min(by_node.values()), sorted(by_node)))
                for key, by_node in holders.items()
                if len(by_node) == len(current)
            )
        return found

    def group_progress(self, end: float) -> tuple[dict[str, _Frontier], dict[str, float]]:
        """Per group: when its last delivery by ``end`` came, and what its frontier is
        built from: its deliveries at least ``frontier_slack_ms`` before that last one
        (so an entry whose delivery was lost with its connection had time to come again
        while the group was still being delivered to)."""
        last: dict[str, float] = {}
        for (_key, group), deliveries in self.seen.items():
            for d in deliveries:
                t = float(d["t"])
                if t <= end and t > last.get(group, -math.inf):
                    last[group] = t
        settled: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for (_key, group), deliveries in self.seen.items():
            cutoff = last.get(group, -math.inf) - self.config.frontier_slack_ms
            for d in deliveries:
                if float(d["t"]) <= cutoff:
                    settled[group].append((float(d["t"]), float(d["due_ms"])))
        return {group: _Frontier(pairs) for group, pairs in settled.items()}, last

    def shards(self) -> list[int | None]:
        """Shards whose leaders were observed (``[None]`` for unsharded nodes)."""
        found = {event.get("shard") for event in self.leaders}
        return sorted(found, key=lambda s: -1 if s is None else int(s)) or [None]

    def shard_of_group(self, group: str) -> int | None:
        """The shard holding ``group`` (by its topic, ``topic_shards`` of the run's
        start event), or None when the run was not sharded."""
        for topic, groups in self.topics.items():
            if group in groups and topic in self.topic_shards:
                return self.topic_shards[topic]
        return None

    def leader_change_times(self, shard: int | None | str = "all") -> list[float]:
        """When the observed leader changed: another node, or a higher term.

        Each shard's group has its own leader and terms, so changes are found per
        shard; ``shard="all"`` (default) gives every shard's, merged in time order.
        Observations of an older term than the last one seen (a lagging node) are
        ignored; observations without a leader are gaps, not changes.
        """
        if shard == "all":
            return sorted(t for k in self.shards() for t in self.leader_change_times(k))
        times: list[float] = []
        node_before: int | None = None
        term_before: int | None = None
        for event in self.leaders:
            if event.get("shard") != shard:
                continue
            node, term = event.get("node_id"), event.get("term")
            if node is None or (
                term is not None and term_before is not None and term < term_before
            ):
                continue
            newer_term = term is not None and term_before is not None and term > term_before
            if node_before is not None and (node != node_before or newer_term):
                times.append(float(event["t"]))
            node_before = int(node)
            term_before = term if term is not None else term_before
        return times

    def check_leaders(self) -> None:
        changes = self.leader_change_times()
        self.result.counts["leader_changes"] = len(changes)
        if self.healed is not None:
            healed = self.healed
            self.result.counts["leader_changes_after_heal"] = sum(1 for t in changes if t > healed)
        # Per shard: each shard's Raft group numbers its own terms.
        by_term: dict[tuple[int, int], set[int]] = defaultdict(set)
        for event in self.leaders:
            if event.get("term") is not None and event.get("node_id") is not None:
                shard = event.get("shard")
                by_term[(-1 if shard is None else int(shard), int(event["term"]))].add(
                    int(event["node_id"])
                )
        for (shard, term), nodes in sorted(by_term.items()):
            if len(nodes) > 1:
                self.count("multiple_leaders_per_term")
                where = {} if shard < 0 else {"shard": shard}
                self.example("multiple_leaders_per_term", term=term, leaders=sorted(nodes), **where)

    def check_unavailability(self) -> None:
        bad: list[tuple[float, float]] = []
        for publish in self.publishes.values():
            end = publish.complete_t if publish.complete_t is not None else self.end_t
            if publish.outcome != "ok" or end - publish.invoke_t > self.config.stall_ms:
                bad.append((publish.invoke_t, end))
        self.result.unavailability_windows = [
            {"start": start, "end": end} for start, end in merge_intervals(bad)
        ]


class Outstanding:
    """Required deliveries not seen yet, kept up to date from each call's new events.

    The drain asks "is anything still missing?" every second while the cluster's Raft
    traffic flows through proxies on the same event loop; a full :func:`check` of a
    10-minute history takes about a second of CPU, which stalls every link longer than
    an election timeout (leaders then lose their quorum about a second after each
    election). This reads each event once, so a poll costs what arrived since the last.

    ``missing(end)`` agrees with ``check(events + [drain_end at end])``: the same
    deliveries count (ours, of a publish that did not fail, on its topic, to one of its
    groups) and :meth:`_Publish.required_by` decides what is required.
    """

    def __init__(self) -> None:
        self._read = 0
        self._topics: dict[str, list[str]] = {}
        self._invoked: dict[int, _Publish] = {}
        self._by_key: dict[str, _Publish] = {}
        self._seen: dict[str, set[str]] = defaultdict(set)
        self._open: dict[str, _Publish] = {}
        """Acknowledged publishes with a target group not seen yet, by key."""
        self._deletes_open: dict[tuple[str, str], list[float]] = defaultdict(list)
        self._deleted: dict[tuple[str, str], list[float]] = defaultdict(list)

    def update(self, events: list[Event]) -> int:
        """Read the events appended since the last call; returns how many were read.

        Args:
            events: The whole history so far, in the order it was recorded (only
                ``events[previous length:]`` is looked at).
        """
        fresh = events[self._read :]
        self._read = len(events)
        for event in fresh:
            kind = event["type"]
            if kind == "publish":
                self._publish(event)
            elif kind == "deliver":
                self._deliver(event)
            elif kind == "run" and event.get("phase") == "start":
                self._topics = {k: list(v) for k, v in (event.get("topics") or {}).items()}
            elif kind == "group" and event.get("action") == "delete":
                where = (str(event["topic"]), str(event["group"]))
                if event.get("phase") == "invoke":
                    self._deletes_open[where].append(float(event["t"]))
                elif self._deletes_open[where]:
                    self._deletes_open[where].pop(0)
                    self._deleted[where].append(float(event["t"]))
        return len(fresh)

    def _waived(self, publish: _Publish, group: str) -> bool:
        """As :meth:`_Checker.waived`: a delete of the group may have removed it."""
        where = (publish.topic, group)
        if self._deletes_open.get(where):
            return True
        return any(t >= publish.invoke_t for t in self._deleted.get(where, []))

    def _publish(self, event: Event) -> None:
        if event["phase"] == "invoke":
            invoked = _Publish.invoked(event, self._topics)
            self._invoked[invoked.op] = invoked
            self._by_key[invoked.key] = invoked
            return
        publish = self._invoked.get(int(event["op"]))
        if publish is None:
            return
        publish.complete(event)
        if publish.outcome == "ok" and not set(publish.groups) <= self._seen[publish.key]:
            self._open[publish.key] = publish
        else:
            self._open.pop(publish.key, None)

    def _deliver(self, event: Event) -> None:
        key = event.get("key")
        publish = self._by_key.get(key) if key is not None else None
        group = str(event["group"])
        if (
            publish is None
            or publish.outcome == "fail"
            or event.get("topic") != publish.topic
            or group not in publish.groups
        ):
            return  # unexpected: the checker counts it, it reaches no group
        seen = self._seen[publish.key]
        seen.add(group)
        if publish.key in self._open and set(publish.groups) <= seen:
            del self._open[publish.key]

    def missing(self, end: float) -> list[tuple[str, list[int], str, str]]:
        """Every required delivery not seen yet.

        Args:
            end: The end of the drain so far (ms, the history's clock).

        Returns:
            ``(key, message ids, topic, group)`` per acknowledged publish and group it
            has not reached (a publish retried after an unknown outcome may have
            several ids; one acknowledged at ack level ``none`` has none); empty when
            nothing required is missing.
        """
        return [
            (publish.key, list(publish.ids), publish.topic, group)
            for publish in self._open.values()
            if publish.required_by(end)
            for group in publish.groups
            if group not in self._seen[publish.key] and not self._waived(publish, group)
        ]


def check(events: Iterable[Event], config: CheckConfig | None = None) -> CheckResult:
    """Check a history and return the verdicts.

    Args:
        events: History events (any order; they are sorted by ``t``).
        config: Tolerances; defaults to :class:`CheckConfig`.

    Returns:
        The counts (``MUST_BE_ZERO`` among them), examples of each violation (up to
        ``MAX_EXAMPLES``), lateness percentiles and windows.

    Raises:
        KeyError, ValueError: an event lacks a required field or has a bad value.
    """
    return _Checker(list(events), config or CheckConfig()).run()
