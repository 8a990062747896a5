"""Run every benchmark (``make bench``) and print a summary table.

Usage::

    python -m bench.run_all [--quick] [--compare] [--only publish_throughput,lateness,...]
    python -m bench.run_all --cluster [--quick]   # the 3-node cluster benchmarks instead
    python -m bench.run_all --all [--quick]       # both sets

Each benchmark starts and stops its own broker subprocess(es) and writes
``bench/results/<name>.json`` (the previous file kept as ``<name>.prev.json``).
A benchmark that fails is reported and the others still run; the exit code is 1 then.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from bench import (
    cluster_failover,
    cluster_latency,
    cluster_snapshot,
    cluster_throughput,
    lateness,
    memory,
    publish_throughput,
    restart,
    side_by_side,
    topic_scale,
)

BENCHMARKS: dict[str, Callable[[list[str] | None], dict[str, Any]]] = {
    "publish_throughput": publish_throughput.main,
    "lateness": lateness.main,
    "restart": restart.main,
    "memory": memory.main,
    "topic_scale": topic_scale.main,
    "side_by_side": side_by_side.bench_main,
}

CLUSTER_BENCHMARKS: dict[str, Callable[[list[str] | None], dict[str, Any]]] = {
    "cluster_throughput": cluster_throughput.main,
    "cluster_latency": cluster_latency.main,
    "cluster_failover": cluster_failover.main,
    "cluster_snapshot": cluster_snapshot.main,
}


def _summary(name: str, r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """``(benchmark, figure, value, target)`` rows of one result."""
    rows: list[tuple[str, str, str, str]] = []
    ok = "met" if r.get("meets_target") else "NOT met"
    if name == "publish_throughput":
        for batch, row in r["by_batch"].items():
            target = f">= 100000 ({ok})" if batch == "100" else ""
            rows.append(
                (
                    name,
                    f"batch {batch}: msgs/s (msgs/fsync)",
                    f"{row['msgs_per_s']:.0f} ({row['msgs_per_fsync'] or 0:.0f})",
                    target,
                )
            )
    elif name == "lateness":
        c, s = r["consumer"], r["server"]
        rows.append(
            (
                name,
                "consumer lateness p50/p99/max ms",
                f"{c['p50_ms']:.1f} / {c['p99_ms']:.1f} / {c['max_ms']:.1f}",
                f"p99 < 10 ({ok})",
            )
        )
        rows.append(
            (
                name,
                "server lateness p50/p99/max ms, early",
                f"{s['p50_ms']:.0f} / {s['p99_ms']:.0f} / {s['max_ms']:.0f}, {s['early']}",
                "early = 0",
            )
        )
    elif name == "memory":
        for level, row in r["levels"].items():
            rows.append(
                (
                    name,
                    f"RSS at {int(level):,} pending MB (growth)",
                    f"{row['rss_mb']:.0f} (+{row['growth_mb']:.0f})",
                    f"growth < 100 ({ok})" if level != "0" else "",
                )
            )
    elif name == "restart":
        rows.append(
            (
                name,
                f"to /readyz, {r['messages']:,} pending, after SIGKILL s",
                f"{r['after_sigkill']['to_readyz_s']:.2f}",
                f"< 3 ({ok})",
            )
        )
        rows.append(
            (
                name,
                f"to /readyz, {r['messages']:,} pending, after SIGTERM s",
                f"{r['after_sigterm']['to_readyz_s']:.2f}",
                "< 3",
            )
        )
        rows.append((name, "to /readyz, empty directory s", f"{r['empty']['to_readyz_s']:.2f}", ""))
    elif name == "topic_scale":
        for idle, row in r["levels"].items():
            rows.append(
                (
                    name,
                    f"{int(idle):,} idle topics: hot publish / deliver p99 ms, create s",
                    f"{row['publish']['p99_ms']:.1f} / {row['deliver']['p99_ms']:.1f}, "
                    f"{row['create_s']:.1f}",
                    "flat",
                )
            )
            rows.append(
                (
                    name,
                    f"{int(idle):,} idle topics: PING p99 ms while creating / hot",
                    f"{row['ping_during_create']['p99_ms']:.1f} / "
                    f"{row['ping_during_hot']['p99_ms']:.1f}",
                    f"< 50 ({ok})",
                )
            )
    elif name == "side_by_side":
        rows.extend(side_by_side.summary_rows(r))
    else:
        rows.extend(_cluster_summary(name, r, ok))
    return rows


def _cluster_summary(name: str, r: dict[str, Any], ok: str) -> list[tuple[str, str, str, str]]:
    """Summary rows of the cluster benchmarks."""
    rows: list[tuple[str, str, str, str]] = []
    if name == "cluster_throughput":
        for batch, row in r["by_batch"].items():
            rows.append((name, f"3 nodes, batch {batch}: msgs/s", f"{row['msgs_per_s']:.0f}", ""))
        if "ratio_batch_100" in r:
            single = r["single_node_batch_100"]["msgs_per_s"]
            rows.append(
                (
                    name,
                    "batch 100: 3 nodes / 1 node (same run)",
                    f"{r['ratio_batch_100']:.2f} (1 node {single:.0f} msgs/s)",
                    f">= 0.5 ({ok})",
                )
            )
    elif name == "cluster_latency":
        for workload, row in r["cluster"].items():
            rows.append(
                (
                    name,
                    f"3 nodes, {row['msgs_per_s']:.0f} msgs/s ({workload}) p50/p99 ms",
                    f"{row['p50_ms']:.1f} / {row['p99_ms']:.1f}",
                    "",
                )
            )
    elif name == "cluster_failover":
        rows.append(
            (
                name,
                f"leader SIGKILL -> publishes succeed, p50/p99 s ({r['trials']} trials)",
                f"{r['failover_s_p50']:.2f} / {r['failover_s_p99']:.2f}",
                f"p99 < 2 ({ok})",
            )
        )
        rows.append(
            (name, "acknowledged messages lost", f"{r['lost_messages']} of {r['acked_total']}", "0")
        )
    elif name == "cluster_snapshot":
        rows.append(
            (
                name,
                f"follower {r['messages']:,} behind: restart -> caught up s",
                f"{r['spawn_to_caught_up_s']:.2f}",
                "",
            )
        )
        if r.get("installed_bytes") is not None:
            rows.append(
                (
                    name,
                    "snapshot MB, restore s (follower log)",
                    f"{r['installed_bytes'] / 1e6:.1f}, {r['installed_restore_s']:.2f}",
                    "",
                )
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the selected benchmarks; print the summary; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m bench.run_all")
    parser.add_argument("--quick", action="store_true", help="smaller, faster variants")
    parser.add_argument("--compare", action="store_true", help="compare with previous results")
    parser.add_argument("--only", default=None, help="comma-separated benchmark names")
    parser.add_argument(
        "--cluster", action="store_true", help="run the 3-node cluster benchmarks instead"
    )
    parser.add_argument("--all", action="store_true", help="single-node and cluster benchmarks")
    args = parser.parse_args(argv)
    every = {**BENCHMARKS, **CLUSTER_BENCHMARKS}
    if args.only is not None:
        names = args.only.split(",")
    elif args.all:
        names = list(every)
    elif args.cluster:
        names = list(CLUSTER_BENCHMARKS)
    else:
        names = list(BENCHMARKS)
    passed = [a for a in ("--quick", "--compare") if getattr(args, a[2:])]
    results: dict[str, dict[str, Any]] = {}
    failed: list[str] = []
    started = time.monotonic()
    for name in names:
        print(f"\n=== {name} {' '.join(passed)}", flush=True)
        try:
            results[name] = every[name](passed)
        except Exception:
            traceback.print_exc()
            failed.append(name)
    rows = [row for name, r in results.items() for row in _summary(name, r)]
    print(f"\n=== summary ({time.monotonic() - started:.0f} s{', quick' if args.quick else ''})")
    widths = [max(len(row[i]) for row in rows) if rows else 10 for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)))
    for name in failed:
        print(f"{name}: FAILED (see the traceback above)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
