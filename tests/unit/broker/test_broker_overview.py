"""ActivityHistory: per-second rates and lateness from the node's own counters, and the
percentiles the dashboard plots."""

from __future__ import annotations

from futureq.broker.overview import LATENESS_WINDOW_S, ActivityHistory
from futureq.metrics import Metrics


def test_rates_are_per_second_differences_of_the_counters() -> None:
    metrics = Metrics()
    history = ActivityHistory(metrics, window_s=5)
    history.sample(1_000)  # the first sample is only a baseline
    assert history.view()["published"] == []
    metrics.published_messages_total.labels("a").inc(7)
    metrics.published_messages_total.labels("b").inc(3)
    metrics.delivered_messages_total.labels("a", "g").inc(4)
    metrics.acked_messages_total.labels("a", "g").inc(2)
    history.sample(2_000)
    metrics.dead_lettered_messages_total.labels("a", "g").inc(1)
    history.sample(3_000)
    view = history.view()
    assert view["published"] == [10, 0]
    assert view["delivered"] == [4, 0]
    assert view["acked"] == [2, 0]
    assert view["dead_lettered"] == [0, 1]
    assert view["end_ms"] == 3_000
    for second in range(4, 12):
        metrics.published_messages_total.labels("a").inc(second)
        history.sample(second * 1000)
    assert history.view()["published"] == [7, 8, 9, 10, 11]  # only the window is kept


def test_lateness_counts_per_bucket_and_percentiles_per_window() -> None:
    metrics = Metrics()
    history = ActivityHistory(metrics)
    history.sample(0)
    for _ in range(98):
        metrics.due_to_delivery_seconds.observe(0.002)  # bucket <= 2.5 ms
    metrics.due_to_delivery_seconds.observe(0.3)  # <= 500 ms
    metrics.due_to_delivery_seconds.observe(42.0)  # beyond the last bound (+Inf)
    history.sample(1000)
    view = history.view()
    bounds = view["lateness_bounds_ms"]
    counts = dict(zip(bounds, view["lateness_counts"], strict=True))
    assert counts[2.5] == 98 and counts[500.0] == 1 and counts[None] == 1
    assert sum(view["lateness_counts"]) == 100
    assert view["lateness_p50_ms"] == [2.5]
    assert view["lateness_p99_ms"] == [500.0]
    # Quiet windows have no percentile; the last point is always the newest window.
    for second in range(2, 2 + LATENESS_WINDOW_S):
        history.sample(second * 1000)
    view = history.view()
    assert view["lateness_p99_ms"][-1] is None
    assert len(view["lateness_p50_ms"]) == 2
