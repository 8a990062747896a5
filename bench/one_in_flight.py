"""One publish in flight on a fresh 3-node cluster, with each node's fsync and apply time.

The figure the leader's overlapped write (thesis §10.2.1) changes: PUBLISH of one message
at ack level quorum, one request in flight on one connection, for ``SECONDS`` after a
0.5 s warm-up. Also prints, from each node's ``/metrics`` over the same window, the mean
synced-write ("fsync") and apply time, so that a run on a busy disk can be read as
"p50 = k fsyncs" (L marks the leader).

Usage::

    python -m bench.one_in_flight [SECONDS]

To compare two checkouts on a shared machine, alternate them with ``PYTHONPATH``
(``PYTHONPATH=OTHER/src:OTHER python -m bench.one_in_flight 5``) several times.
"""

from __future__ import annotations

import json
import sys

from bench import _cluster
from bench._common import metric_sum
from bench.side_by_side import FqSync


def _mean_ms(after: dict[str, float], before: dict[str, float], name: str) -> str:
    total = metric_sum(after, f"{name}_sum") - metric_sum(before, f"{name}_sum")
    count = metric_sum(after, f"{name}_count") - metric_sum(before, f"{name}_count")
    return f"{1000 * total / max(count, 1):.2f} ms x{count:.0f}"


def main(argv: list[str] | None = None) -> dict[str, object]:
    """Measure and print one JSON line; returns it."""
    args = sys.argv[1:] if argv is None else argv
    seconds = float(args[0]) if args else 5.0
    with _cluster.LocalCluster(3) as cluster:
        cluster.start()
        leader = cluster.leader()
        before = {n.node_id: n.metrics() for n in cluster.nodes.values()}
        latencies = FqSync(leader.client_address).latency(0.5, seconds)
        after = {n.node_id: n.metrics() for n in cluster.nodes.values()}
    latencies.sort()
    out: dict[str, object] = {
        "p50_ms": round(latencies[len(latencies) // 2], 2),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)], 2),
        "samples": len(latencies),
    }
    for node_id, node in cluster.nodes.items():
        mark = "L" if node is leader else ""
        out[f"node{node_id}{mark}"] = (
            f"fsync {_mean_ms(after[node_id], before[node_id], 'futureq_fsync_seconds')}, "
            f"apply {_mean_ms(after[node_id], before[node_id], 'futureq_apply_seconds')}"
        )
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
