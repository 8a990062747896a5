"""Metrics: every declared metric is exported, registries are per broker, state gauges
come from the provider at scrape time."""

from __future__ import annotations

import pathlib

import pytest
from prometheus_client.parser import text_string_to_metric_families

from futureq.errors import ErrorCode
from futureq.metrics import METRIC_SPECS, GroupCounts, Metrics

DOCS = pathlib.Path(__file__).parents[3] / "docs" / "operations.md"


def scrape(metrics: Metrics) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Samples by sample name, then by sorted label pairs."""
    body, _ = metrics.render()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(body.decode("utf-8")):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[labels] = sample.value
    return samples


def test_render_names_every_declared_metric() -> None:
    body, content_type = Metrics().render()
    text = body.decode("utf-8")
    assert content_type.startswith("text/plain")
    for spec in METRIC_SPECS:
        assert (
            f"# TYPE {spec.name} " in text or f"# TYPE {spec.name.removesuffix('_total')} " in text
        ), spec.name
        assert f"# HELP {spec.name} " in text, spec.name


def test_every_spec_has_an_attribute_of_its_kind() -> None:
    metrics = Metrics()
    for spec in METRIC_SPECS:
        if spec.name in {
            "futureq_pending_messages",
            "futureq_due_messages",
            "futureq_in_flight_deliveries",
            "futureq_group_consumers",
            "futureq_oldest_due_age_seconds",
            "futureq_topic_oldest_due_age_seconds",
        }:
            continue
        metric = getattr(metrics, spec.attribute)
        assert type(metric).__name__.lower() == spec.kind, spec.name


def test_labels_units_and_names_are_consistent() -> None:
    names = [spec.name for spec in METRIC_SPECS]
    assert len(names) == len(set(names))
    for spec in METRIC_SPECS:
        assert spec.name.startswith("futureq_")
        assert spec.kind in {"counter", "gauge", "histogram"}
        assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
        if spec.kind == "histogram":
            assert spec.buckets and list(spec.buckets) == sorted(spec.buckets)
            assert spec.name.endswith("_" + spec.unit), spec.name


def test_counters_and_histograms_record_values() -> None:
    metrics = Metrics()
    metrics.published_messages_total.labels(topic="orders").inc(3)
    metrics.delivered_messages_total.labels(topic="orders", group="billing").inc()
    metrics.count_request_error(ErrorCode.NOT_LEADER)
    metrics.is_leader.set(1)
    metrics.group_commit_items.observe(100)
    metrics.fsync_seconds.observe(0.002)
    samples = scrape(metrics)
    assert samples["futureq_published_messages_total"][(("topic", "orders"),)] == 3
    assert (
        samples["futureq_delivered_messages_total"][(("group", "billing"), ("topic", "orders"))]
        == 1
    )
    assert samples["futureq_request_errors_total"][(("code", "NOT_LEADER"),)] == 1
    assert samples["futureq_is_leader"][()] == 1
    assert samples["futureq_group_commit_items_bucket"][(("le", "128.0"),)] == 1
    assert samples["futureq_group_commit_items_bucket"][(("le", "64.0"),)] == 0
    assert samples["futureq_fsync_seconds_count"][()] == 1
    # The bucket ranges asked for: 0.1 ms .. 10 s, and 1 .. 4096 commands.
    assert (("le", "0.0001"),) in samples["futureq_fsync_seconds_bucket"]
    assert (("le", "10.0"),) in samples["futureq_fsync_seconds_bucket"]
    assert (("le", "4096.0"),) in samples["futureq_group_commit_items_bucket"]


def test_two_brokers_in_one_process_do_not_share_counters() -> None:
    first, second = Metrics(), Metrics()
    first.published_messages_total.labels(topic="t").inc()
    assert (
        "futureq_published_messages_total" not in scrape(second)
        or not scrape(second)["futureq_published_messages_total"]
    )


def test_state_gauges_are_read_from_the_provider_at_scrape_time() -> None:
    metrics = Metrics()
    rows = [GroupCounts("orders", "billing", pending=10, due=2, in_flight=1, consumers=3)]
    metrics.set_group_counts_provider(lambda: rows)
    labels = (("group", "billing"), ("topic", "orders"))
    samples = scrape(metrics)
    assert samples["futureq_pending_messages"][labels] == 10
    assert samples["futureq_due_messages"][labels] == 2
    assert samples["futureq_in_flight_deliveries"][labels] == 1
    assert samples["futureq_group_consumers"][labels] == 3

    rows.append(GroupCounts("orders", "audit", pending=5, due=0, in_flight=0, consumers=0))
    rows[0] = GroupCounts("orders", "billing", pending=9, due=1, in_flight=1, consumers=3)
    samples = scrape(metrics)
    assert samples["futureq_pending_messages"][labels] == 9
    assert samples["futureq_pending_messages"][(("group", "audit"), ("topic", "orders"))] == 5


def test_a_failing_provider_leaves_out_only_the_state_gauges(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    metrics.is_leader.set(1)

    def broken() -> list[GroupCounts]:
        raise RuntimeError("boom")

    metrics.set_group_counts_provider(broken)
    samples = scrape(metrics)
    assert samples["futureq_is_leader"][()] == 1
    assert "futureq_pending_messages" not in samples
    assert "group counts provider failed" in caplog.text


def test_operations_doc_lists_every_metric() -> None:
    text = DOCS.read_text()
    for spec in METRIC_SPECS:
        assert f"`{spec.name}`" in text, spec.name


def test_process_build_info_topic_lateness_and_oldest_due_age() -> None:
    metrics = Metrics()
    metrics.topic_lateness_seconds.labels("orders").observe(0.02)
    rows = [
        GroupCounts("orders", "billing", 3, 2, 0, 0, 12.5),
        GroupCounts("orders", "audit", 3, 1, 0, 0, 4.0),
        GroupCounts("idle", "g", 3, 0, 0, 0, None),
    ]
    metrics.set_group_counts_provider(lambda: rows)
    samples = scrape(metrics)
    assert samples["process_resident_memory_bytes"][()] > 0
    assert samples["process_open_fds"][()] > 0
    assert samples["process_cpu_seconds_total"][()] >= 0
    [(labels, value)] = samples["futureq_build_info"].items()
    assert value == 1 and dict(labels)["version"] and dict(labels)["python"].count(".") == 2
    assert (
        samples["futureq_topic_lateness_seconds_bucket"][(("le", "0.05"), ("topic", "orders"))] == 1
    )
    assert (
        samples["futureq_topic_lateness_seconds_bucket"][(("le", "0.01"), ("topic", "orders"))] == 0
    )
    # Per topic: the longest wait among its groups; topics with nothing due are absent.
    assert samples["futureq_topic_oldest_due_age_seconds"] == {(("topic", "orders"),): 12.5}


def test_series_are_bounded_and_the_rest_is_other() -> None:
    from futureq.metrics import OTHER, SeriesBudget

    budget = SeriesBudget(max_topics=2, max_groups=2)
    assert [budget.topic(t) for t in ("a", "b", "c", "a")] == ["a", "b", OTHER, "a"]
    assert budget.group("a", "g") == ("a", "g")
    assert budget.group("b", "g") == ("b", "g")
    assert budget.group("c", "g") == (OTHER, OTHER)
    assert not budget.has_room()
    assert budget.forget_group("a", "g") and not budget.forget_group("c", "g")
    assert budget.group("c", "g") == ("c", "g")  # a freed slot goes to the next one
    assert SeriesBudget(0, 0).topic("a") == OTHER


def test_a_deleted_group_loses_its_counter_series() -> None:
    metrics = Metrics(max_group_series=1)
    labels = metrics.group_labels("t", "g")
    metrics.acked_messages_total.labels(*labels).inc()
    assert b'group="g"' in metrics.render()[0]
    metrics.forget_group("t", "g")
    assert b'group="g"' not in metrics.render()[0]
    assert metrics.group_labels("u", "h") == ("u", "h")
