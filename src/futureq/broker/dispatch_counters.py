"""The dispatcher's per-group metrics: cached counter children and what a push counts.

Plain functions over a :class:`~futureq.broker.dispatcher.Dispatcher` with metrics
(``Dispatcher.metrics`` is not None): ``labels()`` is slow, so each group's runtime
caches its children; groups past the series budget share the ``_other`` child.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .dispatcher import Dispatcher
    from .hub import GroupRuntime, InFlight


def count(dispatcher: Dispatcher, name: str, topic: str, group: str, amount: int = 1) -> None:
    metrics = dispatcher.metrics
    assert metrics is not None
    getattr(metrics, name).labels(*metrics.group_labels(topic, group)).inc(amount)


def counter(dispatcher: Dispatcher, runtime: GroupRuntime, name: str) -> Any:
    """The (topic, group) child of a per-group counter, cached: labels() is slow.

    Groups past the series budget share the ``_other`` child.
    """
    key = (name, runtime.info.name)
    child = runtime.counters.get(key)
    if child is None:
        metrics = dispatcher.metrics
        assert metrics is not None
        labels = metrics.group_labels(runtime.info.topic, runtime.info.name)
        child = getattr(metrics, name).labels(*labels)
        runtime.counters[key] = child
    return child


def topic_lateness_histogram(dispatcher: Dispatcher, runtime: GroupRuntime) -> Any:
    """The topic's child of ``futureq_topic_lateness_seconds``, cached like counters."""
    key = ("topic_lateness_seconds", "")
    child = runtime.counters.get(key)
    if child is None:
        assert dispatcher.metrics is not None
        # Bounded series: past metrics.max_topic_series topics, "_other".
        label = dispatcher.metrics.topic_label(runtime.info.topic)
        child = dispatcher.metrics.topic_lateness_seconds.labels(label)
        runtime.counters[key] = child
    return child


def count_pushed(
    dispatcher: Dispatcher, runtime: GroupRuntime, flights: list[InFlight], now_ms: int
) -> None:
    metrics = dispatcher.metrics
    if metrics is None:
        return
    counter(dispatcher, runtime, "delivered_messages_total").inc(len(flights))
    redelivered = sum(1 for f in flights if f.attempt > 1)
    if redelivered:
        counter(dispatcher, runtime, "redelivered_messages_total").inc(redelivered)
    topic_lateness = topic_lateness_histogram(dispatcher, runtime)
    for flight in flights:
        lateness_s = max(0, now_ms - flight.due_ms) / 1000
        metrics.due_to_delivery_seconds.observe(lateness_s)
        topic_lateness.observe(lateness_s)
