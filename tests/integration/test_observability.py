"""Observability of a real node: process metrics, build info, data directory size,
lateness and oldest-due age per topic on /metrics; JSON log lines."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from broker_process import BrokerProcess
from prometheus_client.parser import text_string_to_metric_families
from wire_client import WireClient

Factory = Any


def scrape(http_address: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(f"http://{http_address}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def test_metrics_of_the_process_the_disk_and_each_topic(broker_factory: Factory) -> None:
    broker: BrokerProcess = broker_factory(extra_args=["--log-format", "json"])
    client = WireClient(broker.client_address)
    client.subscribe("obs.fast", "g", prefetch=10)
    client.publish([["obs.fast", b"f", 0, None, None]] * 3)
    client.deliveries(3)
    client.publish([["obs.stuck", b"s", 0, None, None]] * 2)  # no consumer: stays due
    time.sleep(0.3)
    samples = scrape(broker.http_address)
    assert samples["process_resident_memory_bytes"][()] > 10_000_000
    assert samples["process_open_fds"][()] > 5
    assert samples["process_cpu_seconds_total"][()] > 0
    [(labels, value)] = samples["futureq_build_info"].items()
    assert value == 1 and dict(labels)["version"] == "0.1.0"
    assert samples["futureq_data_dir_bytes"][()] > 10_000  # RocksDB files, measured at start
    fast = (("le", "+Inf"), ("topic", "obs.fast"))
    assert samples["futureq_topic_lateness_seconds_bucket"][fast] == 3
    ages = samples["futureq_topic_oldest_due_age_seconds"]
    assert ages[(("topic", "obs.stuck"),)] >= 0.3
    assert (("topic", "obs.fast"),) not in ages  # nothing of it is waiting

    # --log-format json: every line on stderr is one JSON object (a single node: no "node").
    broker.terminate()
    lines = [line for line in broker.stderr_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]
    assert any("serving clients" in r["message"] for r in records)
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    assert all("node" not in r for r in records)
