"""Run every benchmark (``make bench``) and print a summary table.

Usage::

    python -m bench.run_all [--quick] [--compare] [--only publish_throughput,lateness,...]

Each benchmark starts and stops its own broker subprocess and writes
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

from bench import lateness, memory, publish_throughput, restart

BENCHMARKS: dict[str, Callable[[list[str] | None], dict[str, Any]]] = {
    "publish_throughput": publish_throughput.main,
    "lateness": lateness.main,
    "restart": restart.main,
    "memory": memory.main,
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
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the selected benchmarks; print the summary; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m bench.run_all")
    parser.add_argument("--quick", action="store_true", help="smaller, faster variants")
    parser.add_argument("--compare", action="store_true", help="compare with previous results")
    parser.add_argument("--only", default=None, help="comma-separated benchmark names")
    args = parser.parse_args(argv)
    names = list(BENCHMARKS) if args.only is None else args.only.split(",")
    passed = [a for a in ("--quick", "--compare") if getattr(args, a[2:])]
    results: dict[str, dict[str, Any]] = {}
    failed: list[str] = []
    started = time.monotonic()
    for name in names:
        print(f"\n=== {name} {' '.join(passed)}", flush=True)
        try:
            results[name] = BENCHMARKS[name](passed)
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
