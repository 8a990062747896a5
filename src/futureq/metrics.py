"""Every Prometheus metric FutureQ exports, declared once: name, help, labels, unit.

Each :class:`Metrics` owns its own ``CollectorRegistry``, so several brokers can run in
one test process without their counters mixing. Components receive the ``Metrics`` of
their broker and update the attributes named after the metric without the
``futureq_`` prefix and the ``_total`` suffix kept, e.g.::

    metrics.published_messages_total.labels(topic=topic).inc(len(items))
    metrics.fsync_seconds.observe(elapsed_s)
    metrics.due_to_delivery_seconds.observe(max(0, delivered_ms - due_ms) / 1000)

Per-group queue state (pending, due, in-flight, consumers) is not pushed: it is read at
scrape time from a provider registered with :meth:`Metrics.set_group_counts_provider`;
the oldest-due age per topic is the largest of its groups' (``GroupCounts.oldest_due_age_s``).

Besides the FutureQ metrics, each registry carries prometheus-client's process collector
(``process_cpu_seconds_total``, ``process_resident_memory_bytes``, ``process_open_fds``...)
and ``futureq_build_info``.

Series are bounded (Prometheus practice: label values must not grow without limit). The
first ``max_topic_series`` topics and ``max_group_series`` (topic, group) pairs seen get
labels of their own; the rest are counted under ``topic="_other"`` (and
``group="_other"``), a value no topic or group name can take. See :class:`SeriesBudget`.

The reference table in ``docs/operations.md`` ("Metrics") lists the same metrics; a test
keeps the two in step.
"""

from __future__ import annotations

import logging
import platform
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar

import attrs
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from futureq import __version__

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from futureq.errors import ErrorCode

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

# The ``*_created`` timestamp series double the output and no dashboard reads them.
# (A process-wide switch of prometheus-client; FutureQ owns its process.)
disable_created_metrics()  # type: ignore[no-untyped-call]

PREFIX = "futureq_"
OTHER = "_other"
"""Label value standing for every topic or group past the series budget (names cannot
start with ``_``, ``docs/protocol.md``, "Names")."""

#: Latency buckets in seconds, 0.1 ms .. 10 s, roughly 1-2.5-5 per decade.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

#: Lateness buckets of the per-topic histogram, in seconds: fewer than the node-wide one,
#: as there is one series per bucket and topic.
TOPIC_LATENESS_BUCKETS_S: tuple[float, ...] = (0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)

#: Commands per synced write: powers of two, 1 .. 4096 (``storage.group_commit_max_items``).
GROUP_COMMIT_BUCKETS: tuple[float, ...] = tuple(float(2**power) for power in range(13))


@attrs.frozen
class MetricSpec:
    """The declaration of one metric.

    Attributes:
        name: Full exported name, e.g. ``futureq_published_messages_total``.
        kind: ``counter``, ``gauge`` or ``histogram``.
        help: One sentence for ``# HELP``.
        labels: Label names, in order.
        unit: What one unit of the value is (``messages``, ``seconds``, ...), for the docs;
            passed to prometheus-client only when the name ends with it (OpenMetrics rule).
        buckets: Histogram bucket upper bounds, else empty.
    """

    name: str
    kind: str
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""
    buckets: tuple[float, ...] = ()

    @property
    def attribute(self) -> str:
        """The :class:`Metrics` attribute holding this metric: the name minus ``futureq_``."""
        return self.name.removeprefix(PREFIX)


_TG = ("topic", "group")

#: Every metric FutureQ exports. The order is the order of ``docs/operations.md``.
METRIC_SPECS: tuple[MetricSpec, ...] = (
    # counters
    MetricSpec(
        "futureq_published_messages_total",
        "counter",
        "Messages accepted by PUBLISH and committed, by topic.",
        ("topic",),
        "messages",
    ),
    MetricSpec(
        "futureq_delivered_messages_total",
        "counter",
        "Deliveries pushed to consumers, first attempts and redeliveries.",
        _TG,
        "messages",
    ),
    MetricSpec(
        "futureq_redelivered_messages_total",
        "counter",
        "Deliveries that were a second or later attempt (visibility timeout, nack, failover).",
        _TG,
        "messages",
    ),
    MetricSpec(
        "futureq_acked_messages_total",
        "counter",
        "Deliveries acknowledged by consumers and committed.",
        _TG,
        "messages",
    ),
    MetricSpec(
        "futureq_nacked_messages_total",
        "counter",
        "Deliveries negatively acknowledged by consumers.",
        _TG,
        "messages",
    ),
    MetricSpec(
        "futureq_expired_messages_total",
        "counter",
        "Group copies removed undelivered because their TTL ran out after the due time.",
        _TG,
        "messages",
    ),
    MetricSpec(
        "futureq_dead_lettered_messages_total",
        "counter",
        "Group copies moved to the dead-letter topic after max_deliveries attempts.",
        _TG,
        "messages",
    ),
    MetricSpec(
        "futureq_request_errors_total",
        "counter",
        "Requests answered with an ERROR frame, by error code name.",
        ("code",),
        "errors",
    ),
    MetricSpec(
        "futureq_connections_accepted_total",
        "counter",
        "Client connections accepted since start.",
        (),
        "connections",
    ),
    MetricSpec(
        "futureq_connections_closed_total",
        "counter",
        "Client connections the server closed, by reason (an error code name in lower "
        "case: frame_timeout, keepalive_timeout, slow_client, auth_failed, invalid_frame...).",
        ("reason",),
        "connections",
    ),
    MetricSpec(
        "futureq_buffer_full_total",
        "counter",
        "Times deliveries were held back because a connection's buffer (scope connection) "
        "or the node's buffers together (scope node) were full.",
        ("scope",),
        "events",
    ),
    MetricSpec(
        "futureq_deliveries_held_back_total",
        "counter",
        "Dispatch passes that handed nothing out because the node had "
        "limits.max_deliveries_out deliveries out (handed to consumers, not yet settled).",
        (),
        "passes",
    ),
    MetricSpec(
        "futureq_no_space_errors_total",
        "counter",
        "Writes that failed for lack of disk space (the node raised its NO_SPACE alarm).",
        (),
        "errors",
    ),
    # gauges
    MetricSpec(
        "futureq_client_connections",
        "gauge",
        "Client connections open now.",
        (),
        "connections",
    ),
    MetricSpec(
        "futureq_subscriptions",
        "gauge",
        "Consumer subscriptions open now on this node.",
        (),
        "subscriptions",
    ),
    MetricSpec(
        "futureq_deliveries_out",
        "gauge",
        "Deliveries handed to consumers and not yet settled or taken back, on this node "
        "(leader only); at limits.max_deliveries_out nothing more is handed out.",
        (),
        "deliveries",
    ),
    MetricSpec(
        "futureq_connection_buffer_bytes",
        "gauge",
        "Bytes held in client connection buffers on this node: answers and deliveries "
        "not yet written (direction out), incomplete frames received (direction in), "
        "frames of requests read and being served (direction requests).",
        ("direction",),
        "bytes",
    ),
    MetricSpec(
        "futureq_storage_alarm",
        "gauge",
        "1 while the node's NO_SPACE alarm is raised (the disk is full: writes are refused), else 0.",
        ("alarm",),
        "",
    ),
    MetricSpec(
        "futureq_applied_index",
        "gauge",
        "Raft index of the last command applied to the queue state.",
        (),
        "index",
    ),
    MetricSpec(
        "futureq_is_leader",
        "gauge",
        "1 while this node is the Raft leader, else 0.",
        (),
        "",
    ),
    MetricSpec(
        "futureq_raft_term",
        "gauge",
        "This node's current Raft term (0 on a node that runs alone).",
        (),
        "term",
    ),
    MetricSpec(
        "futureq_raft_commit_index",
        "gauge",
        "Highest Raft log index this node knows to be committed.",
        (),
        "index",
    ),
    MetricSpec(
        "futureq_raft_role",
        "gauge",
        "1 for this node's current Raft role (follower, pre_candidate, candidate, leader), else 0.",
        ("role",),
        "",
    ),
    MetricSpec(
        "futureq_raft_replication_lag_entries",
        "gauge",
        "Leader only: committed entries a peer has not yet acknowledged.",
        ("peer",),
        "entries",
    ),
    MetricSpec(
        "futureq_raft_elections_won_total",
        "counter",
        "Elections this node won (leader changes it caused).",
        (),
        "elections",
    ),
    MetricSpec(
        "futureq_clock_offset_seconds",
        "gauge",
        "Each node's wall clock minus this node's cluster time (round-trip corrected; "
        "this node's own clock included).",
        ("node",),
        "seconds",
    ),
    MetricSpec(
        "futureq_clock_synchronized",
        "gauge",
        "1 while a majority of the voters' clocks agree on cluster time (always on a single node).",
        (),
        "",
    ),
    MetricSpec(
        "futureq_clock_in_bound",
        "gauge",
        "1 while this node's clock is synchronized and within half of max_clock_offset_ms "
        "(it may lead and dispatch), else 0.",
        (),
        "",
    ),
    MetricSpec(
        "futureq_leader_lease_remaining_seconds",
        "gauge",
        "Leader only: time left on the leader lease; it dispatches only while this is > 0.",
        (),
        "seconds",
    ),
    MetricSpec(
        "futureq_raft_peer_refusals_total",
        "counter",
        "Raft connections and frames refused: by this node (a peer failed the handshake or "
        "sent a frame with a bad MAC) or by a peer (reason refused).",
        ("reason",),
        "refusals",
    ),
    MetricSpec(
        "futureq_build_info",
        "gauge",
        "Always 1; the labels name the FutureQ version and the Python running it.",
        ("version", "python"),
        "",
    ),
    MetricSpec(
        "futureq_data_dir_bytes",
        "gauge",
        "Bytes of the node's data directory (RocksDB files), measured every 15 s.",
        (),
        "bytes",
    ),
    # state gauges, read at scrape time from the group counts provider
    MetricSpec(
        "futureq_pending_messages",
        "gauge",
        "Group copies stored and not yet acked, expired or dead-lettered (due or not).",
        _TG,
        "messages",
    ),
    MetricSpec(
        "futureq_due_messages",
        "gauge",
        "Group copies due now and waiting for a consumer (not in flight).",
        _TG,
        "messages",
    ),
    MetricSpec(
        "futureq_oldest_due_age_seconds",
        "gauge",
        "How long the group's earliest entry waiting for delivery has been due (0 when "
        "none is due yet); leader only, groups with a consumer. A growing age is a stuck group.",
        _TG,
        "seconds",
    ),
    MetricSpec(
        "futureq_in_flight_deliveries",
        "gauge",
        "Deliveries pushed and not yet acked, nacked or timed out (leader only).",
        _TG,
        "deliveries",
    ),
    MetricSpec(
        "futureq_group_consumers",
        "gauge",
        "Consumers subscribed to the group on this node.",
        _TG,
        "consumers",
    ),
    # histograms
    MetricSpec(
        "futureq_topic_oldest_due_age_seconds",
        "gauge",
        "Leader only: how long the earliest due, undelivered copy of any group of the "
        "topic has waited (absent while nothing is due). Read at scrape time.",
        ("topic",),
        "seconds",
    ),
    MetricSpec(
        "futureq_publish_commit_seconds",
        "histogram",
        "Time from receiving a PUBLISH to its batch being durable and applied.",
        (),
        "seconds",
        LATENCY_BUCKETS_S,
    ),
    MetricSpec(
        "futureq_due_to_delivery_seconds",
        "histogram",
        "Lateness of deliveries: delivered time minus due time (wall clock).",
        (),
        "seconds",
        LATENCY_BUCKETS_S,
    ),
    MetricSpec(
        "futureq_topic_lateness_seconds",
        "histogram",
        "Lateness of deliveries by topic: delivered time minus due time (wall clock).",
        ("topic",),
        "seconds",
        TOPIC_LATENESS_BUCKETS_S,
    ),
    MetricSpec(
        "futureq_fsync_seconds",
        "histogram",
        "Duration of one synced log write (one group commit).",
        (),
        "seconds",
        LATENCY_BUCKETS_S,
    ),
    MetricSpec(
        "futureq_group_commit_items",
        "histogram",
        "Commands written per synced log write.",
        (),
        "items",
        GROUP_COMMIT_BUCKETS,
    ),
    MetricSpec(
        "futureq_apply_seconds",
        "histogram",
        "Time to apply one committed command batch to the queue state.",
        (),
        "seconds",
        LATENCY_BUCKETS_S,
    ),
)

#: The state gauges served by the scrape-time collector, by GroupCounts field.
_GROUP_COUNT_GAUGES: dict[str, str] = {
    "pending": "futureq_pending_messages",
    "due": "futureq_due_messages",
    "in_flight": "futureq_in_flight_deliveries",
    "consumers": "futureq_group_consumers",
    "oldest_due_age_seconds": "futureq_oldest_due_age_seconds",
}


@attrs.frozen
class GroupCounts:
    """The current size of one consumer group's queue, for the state gauges.

    Attributes:
        topic: Topic name.
        group: Consumer group name.
        pending: Group copies stored and not yet acked, expired or dead-lettered.
        due: Of those, the ones due now and not in flight.
        in_flight: Deliveries pushed and not yet settled (leader only; 0 elsewhere).
        consumers: Consumers subscribed on this node.
        oldest_due_age_s: How long the earliest due copy not in flight has waited (s);
            None when nothing is due, on a follower, and for the ``_other`` row (the
            per-topic ``futureq_topic_oldest_due_age_seconds`` and the dashboard).
        oldest_due_age_seconds: How long its earliest waiting entry has been due (s; 0
            when none is due yet); None where the leader has no runtime for it (the
            per-group ``futureq_oldest_due_age_seconds``).

    ``due`` is None for the ``_other`` row (groups past the series budget): it is not
    computed for them, so a scrape costs the same however many groups exist.
    """

    topic: str
    group: str
    pending: int
    due: int | None
    in_flight: int
    consumers: int
    oldest_due_age_s: float | None = None
    oldest_due_age_seconds: float | None = None


GroupCountsProvider = Callable[[], Iterable[GroupCounts]]


class SeriesBudget:
    """Which topics and groups get label values of their own, first come first served.

    Args:
        max_topics: Distinct ``topic`` values (``metrics.max_topic_series``); 0: none.
        max_groups: Distinct ``(topic, group)`` pairs (``metrics.max_group_series``).

    A group keeps its label until :meth:`forget_group` (a deleted group), a topic until
    :meth:`forget_topic` (its last group deleted); then the slot goes to the next
    newcomer, so topics and groups created and deleted in a loop never use up the budget.
    Lookups are O(1).
    """

    def __init__(self, max_topics: int = 1000, max_groups: int = 1000) -> None:
        self.max_topics = max_topics
        self.max_groups = max_groups
        self._topics: set[str] = set()
        self._groups: set[tuple[str, str]] = set()

    def topic(self, topic: str) -> str:
        """The ``topic`` label value for ``topic``: itself, or :data:`OTHER`."""
        topics = self._topics
        if topic in topics:
            return topic
        if len(topics) < self.max_topics:
            topics.add(topic)
            return topic
        return OTHER

    def group(self, topic: str, group: str) -> tuple[str, str]:
        """The ``(topic, group)`` label values: themselves, or ``(OTHER, OTHER)``."""
        key = (topic, group)
        groups = self._groups
        if key in groups:
            return key
        if len(groups) < self.max_groups:
            groups.add(key)
            return key
        return (OTHER, OTHER)

    def has_room(self) -> bool:
        """True while a new (topic, group) pair would still get labels of its own."""
        return len(self._groups) < self.max_groups

    def tracked_groups(self) -> list[tuple[str, str]]:
        """The (topic, group) pairs that have labels of their own."""
        return list(self._groups)

    def forget_group(self, topic: str, group: str) -> bool:
        """Free a deleted group's slot; True when it had one."""
        key = (topic, group)
        if key in self._groups:
            self._groups.discard(key)
            return True
        return False

    def tracked_topics(self) -> list[str]:
        """The topics that have a label of their own."""
        return list(self._topics)

    def forget_topic(self, topic: str) -> bool:
        """Free the slot of a topic that has no group left; True when it had one."""
        if topic in self._topics:
            self._topics.discard(topic)
            return True
        return False


def _spec(name: str) -> MetricSpec:
    return next(spec for spec in METRIC_SPECS if spec.name == name)


def _prometheus_unit(spec: MetricSpec) -> str:
    base = spec.name.removesuffix("_total")
    return spec.unit if spec.unit and base.endswith("_" + spec.unit) else ""


_OLDEST_DUE = "futureq_topic_oldest_due_age_seconds"
"""Per topic: the largest ``oldest_due_age_s`` of its groups' rows."""


class _GroupCountsCollector(Collector):
    """Reads the per-group state gauges from the provider on every scrape."""

    def __init__(self) -> None:
        self.provider: GroupCountsProvider | None = None
        self.rows: list[GroupCounts] | None = None
        """Rows read beforehand (:meth:`Metrics.group_rows`), used instead of the provider."""

    def describe(self) -> Iterable[Metric]:
        return list(self._families().values())

    def read(self) -> list[GroupCounts]:
        provider = self.provider
        if provider is None:
            return []
        try:
            return list(provider())
        except Exception:
            # A broken provider must not break /metrics: the other metrics still
            # matter most when something is wrong.
            logger.exception("group counts provider failed; state gauges omitted")
            return []

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        rows = self.rows if self.rows is not None else self.read()
        oldest: dict[str, float] = {}
        for row in rows:
            for field, name in _GROUP_COUNT_GAUGES.items():
                value = getattr(row, field)
                if value is not None:
                    families[name].add_metric([row.topic, row.group], value)
            if row.oldest_due_age_s is not None:
                oldest[row.topic] = max(oldest.get(row.topic, 0.0), row.oldest_due_age_s)
        for topic, age_s in sorted(oldest.items()):
            families[_OLDEST_DUE].add_metric([topic], age_s)
        return list(families.values())

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily]:
        families = {}
        for name in (*_GROUP_COUNT_GAUGES.values(), _OLDEST_DUE):
            spec = _spec(name)
            families[name] = GaugeMetricFamily(
                name, spec.help, labels=list(spec.labels), unit=_prometheus_unit(spec)
            )
        return families


_SCRAPE_TIME_GAUGES = frozenset({*_GROUP_COUNT_GAUGES.values(), _OLDEST_DUE})


class Metrics:
    """The metrics of one broker, in a registry of its own.

    Attributes are named after :data:`METRIC_SPECS` without the ``futureq_`` prefix
    (``published_messages_total``, ``client_connections``, ``fsync_seconds``...), each a
    prometheus-client ``Counter``, ``Gauge`` or ``Histogram``. Label values are strings:
    topic and group names, or an :class:`~futureq.errors.ErrorCode` name for ``code``.
    """

    def __init__(self, max_topic_series: int = 1000, max_group_series: int = 1000) -> None:
        self.series = SeriesBudget(max_topic_series, max_group_series)
        self.registry = CollectorRegistry(auto_describe=True)
        made: dict[str, Counter | Gauge | Histogram] = {}
        for spec in METRIC_SPECS:
            if spec.name in _SCRAPE_TIME_GAUGES:
                continue
            unit = _prometheus_unit(spec)
            labels = list(spec.labels)
            if spec.kind == "counter":
                made[spec.attribute] = Counter(
                    spec.name, spec.help, labels, unit=unit, registry=self.registry
                )
            elif spec.kind == "gauge":
                made[spec.attribute] = Gauge(
                    spec.name, spec.help, labels, unit=unit, registry=self.registry
                )
            else:
                made[spec.attribute] = Histogram(
                    spec.name,
                    spec.help,
                    labels,
                    unit=unit,
                    buckets=spec.buckets,
                    registry=self.registry,
                )

        # Spelled out so type checkers and readers see every attribute.
        self.published_messages_total: Counter = _as(made["published_messages_total"], Counter)
        self.delivered_messages_total: Counter = _as(made["delivered_messages_total"], Counter)
        self.redelivered_messages_total: Counter = _as(made["redelivered_messages_total"], Counter)
        self.acked_messages_total: Counter = _as(made["acked_messages_total"], Counter)
        self.nacked_messages_total: Counter = _as(made["nacked_messages_total"], Counter)
        self.expired_messages_total: Counter = _as(made["expired_messages_total"], Counter)
        self.dead_lettered_messages_total: Counter = _as(
            made["dead_lettered_messages_total"], Counter
        )
        self.request_errors_total: Counter = _as(made["request_errors_total"], Counter)
        self.connections_accepted_total: Counter = _as(made["connections_accepted_total"], Counter)
        self.connections_closed_total: Counter = _as(made["connections_closed_total"], Counter)
        self.buffer_full_total: Counter = _as(made["buffer_full_total"], Counter)
        self.no_space_errors_total: Counter = _as(made["no_space_errors_total"], Counter)
        self.deliveries_held_back_total: Counter = _as(made["deliveries_held_back_total"], Counter)
        self.deliveries_out: Gauge = _as(made["deliveries_out"], Gauge)
        self.connection_buffer_bytes: Gauge = _as(made["connection_buffer_bytes"], Gauge)
        self.storage_alarm: Gauge = _as(made["storage_alarm"], Gauge)
        self.client_connections: Gauge = _as(made["client_connections"], Gauge)
        self.subscriptions: Gauge = _as(made["subscriptions"], Gauge)
        self.applied_index: Gauge = _as(made["applied_index"], Gauge)
        self.is_leader: Gauge = _as(made["is_leader"], Gauge)
        self.raft_term: Gauge = _as(made["raft_term"], Gauge)
        self.raft_commit_index: Gauge = _as(made["raft_commit_index"], Gauge)
        self.raft_role: Gauge = _as(made["raft_role"], Gauge)
        self.raft_replication_lag_entries: Gauge = _as(made["raft_replication_lag_entries"], Gauge)
        self.raft_elections_won_total: Counter = _as(made["raft_elections_won_total"], Counter)
        self.clock_offset_seconds: Gauge = _as(made["clock_offset_seconds"], Gauge)
        self.clock_synchronized: Gauge = _as(made["clock_synchronized"], Gauge)
        self.clock_in_bound: Gauge = _as(made["clock_in_bound"], Gauge)
        self.leader_lease_remaining_seconds: Gauge = _as(
            made["leader_lease_remaining_seconds"], Gauge
        )
        self.raft_peer_refusals_total: Counter = _as(made["raft_peer_refusals_total"], Counter)
        self.data_dir_bytes: Gauge = _as(made["data_dir_bytes"], Gauge)
        self.build_info: Gauge = _as(made["build_info"], Gauge)
        self.topic_lateness_seconds: Histogram = _as(made["topic_lateness_seconds"], Histogram)
        self.publish_commit_seconds: Histogram = _as(made["publish_commit_seconds"], Histogram)
        self.due_to_delivery_seconds: Histogram = _as(made["due_to_delivery_seconds"], Histogram)
        self.fsync_seconds: Histogram = _as(made["fsync_seconds"], Histogram)
        self.group_commit_items: Histogram = _as(made["group_commit_items"], Histogram)
        self.apply_seconds: Histogram = _as(made["apply_seconds"], Histogram)

        self._group_counts = _GroupCountsCollector()
        self.registry.register(self._group_counts)
        ProcessCollector(registry=self.registry)
        self.build_info.labels(__version__, platform.python_version()).set(1)
        self._render_lock = threading.Lock()

    def set_group_counts_provider(self, provider: GroupCountsProvider | None) -> None:
        """Read the per-group state gauges from ``provider`` on every scrape.

        Args:
            provider: Called on the event loop thread during ``render()``; returns one
                :class:`GroupCounts` per (topic, group). It must be quick and must not
                block. None removes the provider (the gauges then have no samples). If
                it raises, the error is logged and the state gauges are left out of that
                scrape.
        """
        self._group_counts.provider = provider

    def group_labels(self, topic: str, group: str) -> tuple[str, str]:
        """Label values of a group's series (bounded, see :class:`SeriesBudget`)."""
        return self.series.group(topic, group)

    def topic_label(self, topic: str) -> str:
        """Label value of a topic's series (bounded, see :class:`SeriesBudget`)."""
        return self.series.topic(topic)

    def forget_group(self, topic: str, group: str) -> None:
        """A group was deleted: drop its counter series and free its label slot."""
        if self.series.forget_group(topic, group):
            self._drop_series(_TG, _GROUP_COUNT_GAUGES.values(), topic, group)

    def forget_topic(self, topic: str) -> None:
        """A topic's last group was deleted: drop its series and free its label slot."""
        if self.series.forget_topic(topic):
            self._drop_series(("topic",), _SCRAPE_TIME_GAUGES, topic)

    def _drop_series(self, labels: tuple[str, ...], kept: Iterable[str], *values: str) -> None:
        """Remove the series ``values`` of every metric labelled ``labels``, but those
        named in ``kept`` (set at scrape time, not counted)."""
        kept = set(kept)
        for spec in METRIC_SPECS:
            if spec.labels == labels and spec.name not in kept:
                try:
                    getattr(self, spec.attribute).remove(*values)
                except KeyError:
                    pass  # never counted

    def count_request_error(self, code: ErrorCode) -> None:
        """Count one request answered with an ERROR frame carrying ``code``."""
        self.request_errors_total.labels(code=code.name).inc()

    def group_rows(self) -> list[GroupCounts]:
        """Read the per-group state gauges from the provider now (on the event loop)."""
        return self._group_counts.read()

    def render(self, rows: list[GroupCounts] | None = None) -> tuple[bytes, str]:
        """Render every metric in the Prometheus text format.

        Args:
            rows: Group counts read beforehand with :meth:`group_rows`; then this may
                run in a worker thread (prometheus-client's metrics are thread-safe),
                so formatting thousands of series does not hold the event loop. None:
                the provider is called here.

        Returns:
            ``(body, content_type)``: the exposition text (UTF-8) and its
            ``Content-Type`` header value (text format 0.0.4).
        """
        with self._render_lock:
            self._group_counts.rows = rows
            try:
                # 0.0.4 said outright (prometheus-client's "latest" is 1.0.0 since 0.22):
                # the text is that format, every Prometheus reads it, and a sharded
                # node's merged /metrics says the same.
                return generate_latest(self.registry), CONTENT_TYPE_PLAIN_0_0_4
            finally:
                self._group_counts.rows = None


def _as(metric: object, kind: type[_T]) -> _T:
    assert isinstance(metric, kind), (metric, kind)
    return metric


def spec_names() -> Iterator[str]:
    """Every exported metric name, in declaration order."""
    return (spec.name for spec in METRIC_SPECS)
