"""Status reads of one node: STATUS_OK, the per-group gauges, the cluster clock's view.

Plain functions over a :class:`~futureq.broker.broker.Broker`. Bounded work however
many topics and groups exist: STATUS lists at most ``limits.max_status_groups`` groups,
in at most half of ``limits.max_frame_bytes`` (:func:`status_budget_bytes`), and yields every :data:`STATUS_STEP_TOPICS` topics looked at; the gauges keep one row
per group within the series budget plus one ``_other`` row.

Source: ``docs/protocol.md``, "STATUS"; ``docs/operations.md``, "Status".
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Final

import msgpack
import trio

from futureq import __version__
from futureq.metrics import OTHER, GroupCounts

from .cluster_time import ClusterTime

if TYPE_CHECKING:
    from futureq.state.queue_state import GroupInfo

    from .broker import Broker
    from .hub import GroupRuntime

STATUS_STEP_TOPICS = 500
"""Topics a status looks at between two yields to the event loop."""
STATUS_LEADER_ONLY = ("due", "in_flight", "consumers")
"""STATUS group fields only the leader knows (``docs/protocol.md``, "STATUS_OK")."""
STATUS_MAX_SUBSCRIPTIONS_PER_GROUP: Final = 1000
"""Most subscriptions one group lists in a status; its ``consumers`` counts them all."""
_LARGEST_INT: Final = 2**64 - 1
SUBSCRIPTION_ROW_BYTES: Final = len(
    msgpack.packb(
        {
            "subscription_id": _LARGEST_INT,
            "prefetch": _LARGEST_INT,
            "credit": _LARGEST_INT,
            "in_flight": _LARGEST_INT,
        }
    )
)
"""The most bytes one subscription row of a status takes in msgpack."""


def status_budget_bytes(max_frame_bytes: int) -> int:
    """Bytes of msgpack the listed topics and deleted groups of a STATUS_OK may take
    together: half the frame limit (as BROWSE_OK's messages), so the answer with its
    other fields always fits in one frame (``docs/protocol.md``, "STATUS_OK")."""
    return max_frame_bytes // 2


def _packed_bytes(value: object) -> int:
    return len(msgpack.packb(value, use_bin_type=True))


def clock_status(broker: Broker) -> dict[str, Any] | None:
    """The work of :meth:`Broker.clock_status` (its docstring: arguments, result, errors)."""
    clock = broker.clock
    if not isinstance(clock, ClusterTime):
        return None
    status = clock.cluster_clock.status()
    offsets = {clock.cluster_clock.id: status.own_offset_us, **status.offsets_us}
    view: dict[str, Any] = {
        "cluster_time_ms": clock.wall_ms(),
        "synchronized": status.synchronized,
        "in_bound": status.in_bound,
        "max_clock_offset_ms": status.max_offset_us // 1000,
        "accuracy_ms": None if status.accuracy_us is None else status.accuracy_us / 1000,
        "offsets_ms": {str(node): round(us / 1000, 3) for node, us in sorted(offsets.items())},
    }
    can_dispatch = getattr(broker.log, "can_dispatch", None)
    if can_dispatch is not None:
        view["dispatching"] = bool(can_dispatch())
        view["lease_remaining_ms"] = round(broker.log.lease_remaining_s() * 1000, 1)  # type: ignore[attr-defined]
    return view


def group_counts(broker: Broker) -> list[GroupCounts]:
    """The work of :meth:`Broker.group_counts` (its docstring: arguments, result, errors)."""
    metrics = broker.metrics
    budget = metrics.series
    state = broker.state
    if budget.has_room():
        for candidate in list(state.groups.values()):
            if not budget.has_room():
                break
            budget.group(candidate.topic, candidate.name)
    now_ms = broker.clock.wall_ms()
    hub = broker.hub
    out: list[GroupCounts] = []
    pending = in_flight = consumers = 0
    for topic, name in sorted(budget.tracked_groups()):
        found = state.find_group(topic, name)
        if found is None:
            metrics.forget_group(topic, name)  # deleted: free its series
            continue
        row = group_row(broker, found, now_ms)
        pending += row.pending
        in_flight += row.in_flight
        consumers += row.consumers
        out.append(row)
    for topic in budget.tracked_topics():
        if not state.topic_groups_count(topic):
            metrics.forget_topic(topic)  # its last group was deleted: free its series
    if len(state.groups) > len(out):
        out.append(
            GroupCounts(
                OTHER,
                OTHER,
                state.total_pending - pending,
                None,
                len(hub.in_flight) - in_flight,
                len(hub.consumers) - consumers,
            )
        )
    return out


def group_row(broker: Broker, info: GroupInfo, now_ms: int) -> GroupCounts:
    runtime = broker.hub.groups.get(info.group_id)
    in_flight = runtime.in_flight_count if runtime else 0
    due = broker.dispatcher.due_count(info.group_id, now_ms) if broker.dispatcher.active else 0
    consumers = len(runtime.consumers) if runtime else 0
    oldest_due_ms = broker.dispatcher.oldest_due_ms(info.group_id, now_ms) if due else None
    age_s = None
    if runtime is not None:  # in memory only: a scrape never seeks the disk per group
        next_due_ms = runtime.index.next_due_ms()
        age_s = 0.0 if next_due_ms is None else max(0, now_ms - next_due_ms) / 1000
    return GroupCounts(
        info.topic,
        info.name,
        info.pending,
        due,
        in_flight,
        consumers,
        None if oldest_due_ms is None else (now_ms - oldest_due_ms) / 1000,
        age_s,
    )


def status(broker: Broker, visible: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """The work of :meth:`Broker.status` (its docstring: arguments, result, errors)."""
    steps = broker.status_steps(visible)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: dict[str, Any] = done.value
            return result


async def status_async(
    broker: Broker, visible: Callable[[str], bool] | None = None
) -> dict[str, Any]:
    """:func:`status`, yielding to the event loop every :data:`STATUS_STEP_TOPICS`
    topics looked at (a filtered status may look at every topic)."""
    steps = broker.status_steps(visible)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: dict[str, Any] = done.value
            return result
        await trio.lowlevel.checkpoint()


def due_fields(broker: Broker, group_id: int, now_ms: int) -> dict[str, Any]:
    """``next_due_ms`` (None: nothing deliverable), ``oldest_due_age_ms`` (how long
    the earliest due message has waited; 0 when nothing is due yet) and
    ``background`` (``"purging"``, ``"backfilling"`` or None) of one group."""
    runtime = broker.hub.groups.get(group_id)
    if runtime is not None:
        # The leader's in-memory due order: no disk seek (which would have to skip
        # the tombstones a big cancel or purge leaves at the start of the range).
        # Entries in flight are not in it: this is the oldest one waiting.
        next_due_ms = runtime.index.next_due_ms()
    else:
        next_due_ms = None
    if next_due_ms is None:  # no runtime, or nothing within its horizon
        next_due_ms = broker.dispatcher.next_due_ms(group_id)
    age_ms = 0 if next_due_ms is None else max(0, now_ms - next_due_ms)
    background = None
    if group_id in broker.state.purging:
        background = "purging"
    elif group_id in broker.state.backfilling:
        background = "backfilling"
    return {"next_due_ms": next_due_ms, "oldest_due_age_ms": age_ms, "background": background}


def status_steps(
    broker: Broker, visible: Callable[[str], bool] | None = None
) -> Generator[None, None, dict[str, Any]]:
    """:func:`status` as a generator that yields every few hundred topics looked at."""
    limit = broker.config.limits.max_status_groups
    # Without a byte budget a status of many subscriptions (or of long names with a
    # small frame limit) outgrew the frame and every STATUS was refused with a bare
    # "frame of N bytes exceeds the limit": the operator could see nothing.
    budget_bytes = status_budget_bytes(broker.config.limits.max_frame_bytes)
    listed = 0
    looked = 0
    truncated = False
    topics: list[dict[str, Any]] = []
    # The listed groups with subscriptions, whose rows are filled once every group is
    # listed: the groups come before the subscriptions of any one of them.
    with_consumers: list[tuple[list[dict[str, Any]], GroupRuntime]] = []
    after: str | None = None
    while not truncated:
        now_ms = broker.clock.wall_ms()
        batch = list(itertools.islice(broker.state.iter_topics(after), STATUS_STEP_TOPICS))
        if not batch:
            break
        after = batch[-1]
        for topic in batch:
            looked += 1
            if visible is not None and not visible(topic):
                continue
            if listed >= limit:
                truncated = True
                break
            groups = []
            budget_bytes -= _packed_bytes({"topic": topic, "groups": []})
            for info in broker.state.topic_groups(topic):
                c = group_row(broker, info, now_ms)
                runtime = broker.hub.groups.get(info.group_id)
                row: dict[str, Any] = {
                    "group": info.name,
                    "pending": c.pending,
                    "due": c.due,
                    "in_flight": c.in_flight,
                    "consumers": c.consumers,
                    "visibility_timeout_ms": info.visibility_timeout_ms,
                    "max_deliveries": info.max_deliveries,
                    "dead_letter_expired": info.dead_letter_expired,
                    # An operator sees a stuck group at a glance: its oldest
                    # due message has waited this long (issue 14).
                    **due_fields(broker, info.group_id, now_ms),
                    "subscriptions": [],
                }
                row_bytes = _packed_bytes(row)
                if row_bytes > budget_bytes:
                    truncated = True
                    break
                budget_bytes -= row_bytes
                listed += 1
                if runtime is not None and runtime.consumers:
                    with_consumers.append((row["subscriptions"], runtime))
                groups.append(row)
            if groups or not truncated:
                topics.append({"topic": topic, "groups": groups})
            if truncated:
                break
        if not truncated:
            yield
    deleting: list[dict[str, Any]] = []
    deleting_truncated = False
    for _, d in sorted(broker.state.deleting.items()):
        if visible is not None and not visible(d.topic):
            continue
        entry = {"topic": d.topic, "group": d.name, "pending": d.pending}
        entry_bytes = _packed_bytes(entry)
        if len(deleting) >= limit or entry_bytes > budget_bytes:
            deleting_truncated = True
            break
        budget_bytes -= entry_bytes
        deleting.append(entry)
    for subscriptions, runtime in with_consumers:
        # Each consumer's flow control (a stall shows as credit 0 with in_flight at the
        # prefetch), as many as the budget leaves room for; ``consumers`` counts all.
        room = min(STATUS_MAX_SUBSCRIPTIONS_PER_GROUP, budget_bytes // SUBSCRIPTION_ROW_BYTES)
        subscriptions.extend(
            {
                "subscription_id": consumer.subscription_id,
                "prefetch": consumer.prefetch,
                "credit": consumer.credit,
                "in_flight": len(consumer.in_flight),
            }
            for consumer in itertools.islice(runtime.consumers, room)
        )
        budget_bytes -= SUBSCRIPTION_ROW_BYTES * len(subscriptions)
    cluster = broker.cluster_status()
    role = cluster["role"]
    return {
        "deleting_groups": deleting,
        "deleting_truncated": deleting_truncated,
        "node_id": broker.node_id,
        "role": role,
        # On a follower the leader-only numbers are its own, mostly zero: say so.
        "view": "cluster" if role == "leader" else "local",
        "leader_only": [] if role == "leader" else list(STATUS_LEADER_ONLY),
        "leader_id": cluster.get("leader_id"),
        "leader_address": broker.log.leader_address(),
        "server_version": __version__,
        "commit_index": cluster.get("commit_index", broker.log.applied_index),
        "applied_index": broker.log.applied_index,
        "applied_digest": broker.state.applied_digest,
        "term": int(getattr(broker.log, "term", 0)),
        "uptime_s": round(broker.clock.monotonic_s() - broker.started_s, 3),
        "topic_count": broker.state.topic_count() if visible is None else len(topics),
        "group_count": len(broker.state.groups) if visible is None else listed,
        "truncated": truncated,
        "alarms": broker.alarms(),
        "topics": topics,
        **({"clock": clock} if (clock := broker.clock_status()) is not None else {}),
    }
