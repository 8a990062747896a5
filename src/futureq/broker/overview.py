"""The node overview: what the dashboard and WATCH_UPDATE frames show.

:class:`ActivityHistory` samples the node's counters once a second and keeps the last
:data:`HISTORY_S` seconds: messages published, delivered, acked and dead-lettered per
second, and the lateness of deliveries (delivered time minus due time) per second, as
counts per bucket of ``futureq_due_to_delivery_seconds``. :func:`build_overview` joins
that history with the node's state into one map (shape in ``docs/protocol.md``,
"WATCH_UPDATE"), computed on the event loop in time proportional to the number of
groups shown (at most ``max_groups``; the largest by pending are shown first).

Which numbers only the leader knows (``docs/operations.md``, "Leader-only numbers"):
due, in-flight, consumers, oldest-due age, pending by due time, deliveries, acks,
lateness and member progress. A follower reports them as its own (mostly zero) local
view and says so: ``node.view`` is ``"local"`` and ``node.leader_only`` names them.

Source: issue 13 ("Dashboard v2"); DESIGN.md, "Data flow" (only the leader dispatches).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import trio

from futureq import __version__
from futureq.metrics import LATENCY_BUCKETS_S

from . import publishing

if TYPE_CHECKING:
    from prometheus_client import Counter, Histogram

    from futureq.metrics import Metrics

    from .broker import Broker
    from .hub import GroupRuntime

HISTORY_S = 300
"""Seconds of per-second activity kept and shown (five minutes)."""
LATENESS_WINDOW_S = 10
"""Lateness percentiles are given per window of this many seconds."""
MAX_GROUPS = 100
"""Groups listed in one overview at most (largest pending first); the rest are counted."""
UNREACHABLE_AFTER_MS = 3_000
"""A member the leader has not heard from for this long is shown as unreachable (ms)."""
CLOCK_OFFSET_WARNING_FRACTION = 0.5
"""A member whose clock offset exceeds this fraction of the allowed bound raises an alarm."""

DUE_BUCKET_CHUNK = 500
"""Groups counted between two checkpoints of :class:`DueBuckets`."""
DUE_BUCKETS_MS: tuple[tuple[str, int], ...] = (
    ("due now", 0),
    ("in 10 s", 10_000),
    ("in 1 min", 60_000),
    ("in 5 min", 300_000),
)
"""Pending copies by due time: each bucket holds copies due after the previous bound and
at or before ``now + bound``; a last bucket ("later") holds the rest."""

LEADER_ONLY = (
    "due",
    "in_flight",
    "consumers",
    "oldest_due_age_ms",
    "due_buckets",
    "delivered",
    "acked",
    "lateness",
    "members.match_index",
    "members.lag",
    "members.last_heard_ms",
)
"""Overview fields only the leader knows; a follower's are its local (zero) view."""


def _counter_total(counter: Counter) -> float:
    """Sum of a (labelled) counter's ``_total`` samples."""
    return sum(
        sample.value
        for family in counter.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    )


def _histogram_buckets(histogram: Histogram) -> list[float]:
    """Cumulative counts of a histogram's buckets, in bound order (``+Inf`` last)."""
    buckets: list[tuple[float, float]] = []
    for family in histogram.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                buckets.append((float(sample.labels["le"]), sample.value))
    buckets.sort()
    return [value for _, value in buckets]


class ActivityHistory:
    """Per-second activity of the node over the last ``window_s`` seconds.

    Args:
        metrics: The node's metrics; its counters are read, never changed.
        window_s: Seconds kept.
    """

    COUNTERS = ("published", "delivered", "acked", "dead_lettered")

    def __init__(self, metrics: Metrics, window_s: int = HISTORY_S) -> None:
        self._metrics = metrics
        self.window_s = window_s
        self.bounds_ms: list[float | None] = [bound * 1000 for bound in LATENCY_BUCKETS_S]
        self.bounds_ms.append(None)  # +Inf
        self._previous: dict[str, float] | None = None
        self._previous_lateness: list[float] | None = None
        self.end_ms = 0
        self.rates: dict[str, deque[int]] = {name: deque(maxlen=window_s) for name in self.COUNTERS}
        self.lateness: deque[list[int]] = deque(maxlen=window_s)

    def _totals(self) -> dict[str, float]:
        m = self._metrics
        return {
            "published": _counter_total(m.published_messages_total),
            "delivered": _counter_total(m.delivered_messages_total),
            "acked": _counter_total(m.acked_messages_total),
            "dead_lettered": _counter_total(m.dead_lettered_messages_total),
        }

    def sample(self, wall_ms: int) -> None:
        """Record one second ending at ``wall_ms`` (ms since the epoch)."""
        totals = self._totals()
        cumulative = _histogram_buckets(self._metrics.due_to_delivery_seconds)
        if self._previous is not None and self._previous_lateness is not None:
            for name in self.COUNTERS:
                self.rates[name].append(max(0, round(totals[name] - self._previous[name])))
            per_bucket = [
                max(0, round((now - before) - (now_below - before_below)))
                for now, before, now_below, before_below in zip(
                    cumulative,
                    self._previous_lateness,
                    [0.0, *cumulative[:-1]],
                    [0.0, *self._previous_lateness[:-1]],
                    strict=True,
                )
            ]
            self.lateness.append(per_bucket)
        self._previous = totals
        self._previous_lateness = cumulative
        self.end_ms = wall_ms

    async def run(self, wall_ms: Any) -> None:
        """Sample once a second until cancelled.

        Args:
            wall_ms: A callable returning the wall clock in ms (the node's clock).
        """
        next_at = trio.current_time()
        while True:
            self.sample(int(wall_ms()))
            next_at += 1.0
            now = trio.current_time()
            if next_at < now:  # the loop was held up: skip rather than catch up
                next_at = now + 1.0
            await trio.sleep_until(next_at)

    def view(self) -> dict[str, Any]:
        """The history as sent in WATCH_UPDATE's ``activity`` (oldest second first)."""
        lateness = list(self.lateness)
        counts = [sum(column) for column in zip(*lateness, strict=True)] if lateness else []
        p50: list[float | None] = []
        p99: list[float | None] = []
        # Windows end at the newest second (the first may be shorter), so the last
        # point is always current.
        ends = range(len(lateness), 0, -LATENESS_WINDOW_S)
        for end in reversed(ends):
            window = lateness[max(0, end - LATENESS_WINDOW_S) : end]
            total = [sum(column) for column in zip(*window, strict=True)]
            p50.append(self._quantile(total, 0.5))
            p99.append(self._quantile(total, 0.99))
        return {
            "step_s": 1,
            "end_ms": self.end_ms,
            **{name: list(self.rates[name]) for name in self.COUNTERS},
            "lateness_bounds_ms": self.bounds_ms,
            "lateness_counts": counts or [0] * len(self.bounds_ms),
            "lateness_window_s": LATENESS_WINDOW_S,
            "lateness_p50_ms": p50,
            "lateness_p99_ms": p99,
        }

    def _quantile(self, counts: list[int], q: float) -> float | None:
        """Upper bound of the bucket holding quantile ``q`` (None without deliveries);
        past the last finite bound, that bound."""
        total = sum(counts)
        if total == 0:
            return None
        rank = math.ceil(q * total)
        seen = 0
        finite = [b for b in self.bounds_ms if b is not None]
        for count, bound in zip(counts, self.bounds_ms, strict=True):
            seen += count
            if seen >= rank:
                return bound if bound is not None else finite[-1]
        return finite[-1]


class DueBuckets:
    """Pending copies by due time over every group, recomputed every second in chunks.

    Exact within each group's loaded horizon; copies beyond it, and those of groups the
    dispatcher holds nothing of in memory (idle groups), count as "later". Leader only:
    :attr:`latest` is None elsewhere. The work grows with the groups the dispatcher holds
    in memory, so it runs in a task of its own, :data:`DUE_BUCKET_CHUNK` groups at a
    time between checkpoints, never in one long step on the event loop.
    """

    def __init__(self) -> None:
        self.latest: list[dict[str, Any]] | None = None
        """The last result (the WATCH_UPDATE ``due_buckets`` list), or None."""

    async def run(self, broker: Broker, interval_s: float = 1.0) -> None:
        """Recompute every ``interval_s`` seconds until cancelled."""
        while True:
            self.latest = await self.compute(broker)
            await trio.sleep(interval_s)

    async def compute(self, broker: Broker) -> list[dict[str, Any]] | None:
        """One pass over the dispatcher's groups (see the class docstring)."""
        if not broker.dispatcher.active:
            return None
        now_ms = broker.clock.wall_ms()
        counts = [0] * (len(DUE_BUCKETS_MS) + 1)
        loaded_pending = 0
        limits_ms = [now_ms + bound_ms for _, bound_ms in DUE_BUCKETS_MS]
        runtimes = list(broker.hub.groups.values())
        for position in range(0, len(runtimes), DUE_BUCKET_CHUNK):
            for runtime in runtimes[position : position + DUE_BUCKET_CHUNK]:
                loaded_pending += runtime.info.pending
                _count_runtime(runtime, limits_ms, counts)
            await trio.lowlevel.checkpoint()
        counts[-1] += max(0, broker.state.total_pending - loaded_pending)
        labels = [label for label, _ in DUE_BUCKETS_MS] + ["later"]
        return [
            {"label": label, "count": count} for label, count in zip(labels, counts, strict=True)
        ]


def _count_runtime(runtime: GroupRuntime, limits_ms: list[int], counts: list[int]) -> None:
    waiting = runtime.info.pending - runtime.in_flight_count
    index = runtime.index
    first = index.next_due_ms()
    if first is None or first > limits_ms[-1]:
        counts[-1] += max(0, waiting)  # nothing in memory falls in a bucket: one look
        return
    loaded_due_ms = runtime.loaded_until >> 64
    below = 0
    for position, limit_ms in enumerate(limits_ms):
        if runtime.loaded_until and limit_ms > loaded_due_ms:
            limit_ms = loaded_due_ms - 1  # beyond the horizon: not known here
        upto = index.count_due(limit_ms)
        counts[position] += max(0, upto - below)
        below = max(below, upto)
    counts[-1] += max(0, waiting - below)


def _groups(broker: Broker, now_ms: int, max_groups: int) -> tuple[list[dict[str, Any]], int]:
    """The ``max_groups`` groups with most pending (one pass over the groups' replicated
    counters; the rest of each row only for those shown), and the number of groups."""
    state = broker.state
    top = heapq.nlargest(max_groups, state.groups.values(), key=lambda info: info.pending)
    top.sort(key=lambda info: (-info.pending, info.topic, info.name))
    out = []
    for info in top:
        row = broker.group_row(info, now_ms)
        dead_letter_topic = info.dead_letter_topic
        dead_letters = (
            sum(group.pending for group in state.topic_groups(dead_letter_topic))
            if dead_letter_topic is not None
            else None
        )
        oldest_s = row.oldest_due_age_s
        out.append(
            {
                "topic": info.topic,
                "group": info.name,
                "pending": row.pending,
                "due": row.due,
                "in_flight": row.in_flight,
                "consumers": row.consumers,
                "oldest_due_age_ms": None if oldest_s is None else round(oldest_s * 1000),
                "dead_letter_topic": dead_letter_topic,
                "dead_letters": dead_letters,
            }
        )
    return out, len(state.groups)


def _members(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    leader_id = cluster.get("leader_id")
    members = []
    for node in cluster.get("nodes", []):
        heard = node.get("last_heard_ms")
        member = {
            "node_id": node["node_id"],
            "voter": node.get("role") != "learner",
            "leader": node["node_id"] == leader_id,
            "raft_address": node.get("raft_address"),
            "client_address": node.get("client_address"),
            "match_index": node.get("match_index"),
            "lag": node.get("lag"),
            "last_heard_ms": heard,
            "reachable": None
            if "match_index" not in node
            else (heard is not None and heard < UNREACHABLE_AFTER_MS),
            "clock_offset_ms": node.get("clock_offset_ms"),
            "recovering": node.get("recovering"),
            "refused": node.get("refused"),
        }
        members.append(member)
    return members


def recovery_sentence(subject: str, waiting_for: Iterable[int]) -> str:
    """Why a node that just started does not vote yet (``docs/raft.md``, "Disk faults"):
    ``subject`` (``node 3``, ``it``) is recovering until the nodes ``waiting_for``
    answer it. Said by the NO_LEADER alarm and by ``/readyz``."""
    nodes = ", ".join(str(n) for n in waiting_for)
    return (
        f"{subject} is recovering after its start: it neither votes nor counts "
        f"towards a quorum until node(s) {nodes} answer it"
    )


def campaign_sentence(subject: str, campaign: Mapping[str, Any]) -> str:
    """Why ``subject`` (``node 3``, ``it``), which may lead, has no leader: what its last
    campaign (``last_campaign`` of CLUSTER_STATUS_OK) got, naming the voters that did not
    answer and those that refused. Said by the NO_LEADER alarm and by ``/readyz``,
    which said only "no leader is known yet" (found by a tester)."""
    granted = list(campaign.get("granted") or [])
    kind = "pre-vote" if campaign.get("pre_vote") else "election"
    text = (
        f"{subject} asks for votes ({kind} for term {campaign.get('term')}) and has "
        f"{len(granted)} of the {campaign.get('needed')} it needs"
    )
    if granted:
        text += f" (node(s) {_ids(granted)})"
    silent = list(campaign.get("silent") or [])
    if silent:
        text += (
            f"; node(s) {_ids(silent)} do not answer: they are down, not reachable at "
            "their Raft addresses, or still hear a leader this node does not"
        )
    refused = list(campaign.get("refused") or [])
    if refused:
        text += (
            f"; node(s) {_ids(refused)} refuse: they hold a longer log, still hear a "
            "leader, are recovering, or measure this node's clock too far off (their "
            "debug log names which)"
        )
    return text


def _ids(nodes: Iterable[Any]) -> str:
    return ", ".join(str(n) for n in nodes)


def _alarms(
    broker: Broker,
    node: dict[str, Any],
    members: Iterable[dict[str, Any]],
    clock: dict[str, Any] | None,
) -> list[dict[str, str]]:
    alarms: list[dict[str, str]] = []
    raised = getattr(broker, "alarms", None)
    for name in raised() if callable(raised) else []:
        text = (
            "the disk is full: writes are refused until space returns"
            if name == "NO_SPACE"
            else f"alarm {name} is raised"
        )
        alarms.append({"name": str(name), "text": text})
    if node["leader_address"] is None:
        text = "no leader is known: publishes and deliveries wait"
        waiting = node.get("recovery_waiting_for")
        if waiting:
            text += "; " + recovery_sentence(f"node {node['node_id']}", waiting)
        campaign = node.get("last_campaign")
        if campaign:
            text += "; " + campaign_sentence(f"node {node['node_id']}", campaign)
        alarms.append({"name": "NO_LEADER", "text": text})
    hub = broker.hub
    if hub.held_back and hub.room_out() < 1:
        # Back-pressure, not a fault (no /readyz effect): said where operators look.
        alarms.append(
            {
                "name": "DELIVERIES_HELD_BACK",
                "text": f"{len(hub.in_flight)} deliveries are out, the node's limit "
                "(limits.max_deliveries_out): nothing more is handed out until consumers "
                "settle some or their visibility timeouts pass",
            }
        )
    for member in members:
        refused = member.get("refused")
        if member["reachable"] is False:
            heard = member["last_heard_ms"]
            since = "never answered" if heard is None else f"silent for {heard / 1000:.1f} s"
            text = f"node {member['node_id']} does not answer the leader ({since})"
            if refused:
                text += f"; its Raft link is refused: {refused}"
            alarms.append({"name": "MEMBER_UNREACHABLE", "text": text})
        elif refused and member["reachable"] is not None:
            # Heard from (it connects to the leader) but not reached: a node moved to
            # another Raft address raised no alarm while it never caught up (found by a
            # tester).
            alarms.append(
                {
                    "name": "MEMBER_UNREACHABLE",
                    "text": f"node {member['node_id']} does not answer the leader (it "
                    f"connects, but the leader cannot reach it); its Raft link is "
                    f"refused: {refused}",
                }
            )
    if clock is not None:
        bound = clock.get("max_clock_offset_ms")
        if clock.get("in_bound") is False or clock.get("synchronized") is False:
            alarms.append(
                {
                    "name": "CLOCK_OFFSET",
                    "text": "this node's clock is not within the cluster's bound: it may "
                    "neither lead nor dispatch",
                }
            )
        elif bound:
            for node_id, offset in (clock.get("offsets_ms") or {}).items():
                if offset is not None and abs(offset) > bound * CLOCK_OFFSET_WARNING_FRACTION:
                    alarms.append(
                        {
                            "name": "CLOCK_OFFSET",
                            "text": f"node {node_id}'s clock is {offset:+.0f} ms off "
                            f"(bound ±{bound} ms)",
                        }
                    )
    behind = _stamps_ahead_alarm(broker)
    if behind is not None:
        alarms.append(behind)
    return alarms


def _stamps_ahead_alarm(broker: Broker) -> dict[str, str] | None:
    """CLOCK_OFFSET while the latest publish stamp stored stands further ahead of
    cluster time than the bound (:func:`~futureq.broker.publishing.stamps_ahead_ms`).

    A single node restarted with its clock three hours behind (or a cluster whose every
    clock went back, a restored VM) stamps new publishes on that clock and leaves the
    earlier stamps behind: every message pending from before, even one due and
    delivered once, is held until the clock reaches its due time, three hours on. Only
    a log line said so, once, and the dashboard showed the clock in bound with no
    offset (a single node's only clock is its own; the stamps are its one second
    opinion)."""
    ahead_ms = publishing.stamps_ahead_ms(broker)
    if ahead_ms is None:
        return None
    return {
        "name": "CLOCK_OFFSET",
        "text": f"the latest publish stamp is {ahead_ms / 1000:.1f} s ahead of cluster time "
        f"(more than max_clock_offset_ms={broker._stamp_slack_ms}): either it was made on a "
        "clock that was ahead, or this node's clock is now that far behind; messages "
        "published before are due by their stamps, up to that much later than by this clock",
    }


def build_overview(
    broker: Broker,
    history: ActivityHistory,
    *,
    data_dir_bytes: int | None = None,
    max_groups: int = MAX_GROUPS,
) -> dict[str, Any]:
    """The node's overview (``docs/protocol.md``, "WATCH_UPDATE").

    Args:
        broker: The node.
        history: Its activity history.
        data_dir_bytes: Size of the data directory (bytes), if measured.
        max_groups: Most groups listed (largest pending first).

    Returns:
        A msgpack- and JSON-able map: ``time_ms``, ``node``, ``members``, ``clock``,
        ``groups``, ``groups_total``, ``pending_total``, ``in_flight_total``,
        ``due_buckets``, ``activity``, ``alarms``.
    """
    now_ms = broker.clock.wall_ms()
    cluster = broker.cluster_status()
    role = cluster["role"]
    clustered = cluster.get("mode") != "single"
    node = {
        "node_id": broker.node_id,
        "role": role,
        "clustered": clustered,
        "view": "cluster" if role == "leader" else "local",
        "leader_only": [] if role == "leader" else list(LEADER_ONLY),
        "term": cluster.get("term", 0),
        "leader_id": cluster.get("leader_id"),
        "leader_address": cluster.get("leader_address"),
        "commit_index": cluster.get("commit_index"),
        "applied_index": cluster.get("applied_index"),
        "server_version": __version__,
        "uptime_s": round(broker.clock.monotonic_s() - broker.started_s, 3),
        "data_dir_bytes": data_dir_bytes,
        "recovery_waiting_for": cluster.get("recovery_waiting_for") or [],
        "last_campaign": cluster.get("last_campaign"),
    }
    members = _members(cluster) if clustered else []
    clock = cluster.get("clock")
    groups, groups_total = _groups(broker, now_ms, max_groups)
    return {
        "time_ms": now_ms,
        "node": node,
        "members": members,
        "clock": clock,
        "groups": groups,
        "groups_total": groups_total,
        # Over every group, not only those listed: the dashboard's PENDING and IN
        # FLIGHT cards summed the listed 100, so with more groups they showed a
        # fraction of the node's backlog (found by a tester: 1,102 of 6,000 pending).
        "pending_total": broker.state.total_pending,
        "in_flight_total": len(broker.hub.in_flight),
        "due_buckets": broker.due_buckets.latest if role == "leader" else None,
        "activity": history.view(),
        "alarms": _alarms(broker, node, members, clock),
    }


__all__ = ["ActivityHistory", "DueBuckets", "LEADER_ONLY", "build_overview"]
