"""Resident memory of the broker with 0, 1,000,000 and 5,000,000 pending messages.

One broker subprocess; messages (100-byte payloads) are published in batches of 1000
at ack level quorum with ``deliver_at_ms`` uniformly random over the next 24 h (seeded),
so they stay pending. At each level the server's RSS (psutil, by PID) is sampled
``--samples`` times, ``--settle-s`` apart, after publishing stops; the median is
reported. Nothing is forced (no compaction, no GC call). The publish rate between
levels and the data directory size are reported too.

Usage::

    python -m bench.memory [--quick] [--compare] [--levels 0,1000000,5000000]
        [--max-messages 5000000]

``--quick`` measures 0 / 100,000 / 1,000,000.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

import psutil  # type: ignore[import-untyped]
import trio

from bench._common import (
    PAYLOAD_BYTES,
    Server,
    add_common_args,
    finish,
    median,
    now_ms,
    publish_many,
)

NAME = "memory"
TARGET_GROWTH_MB = 100.0
DAY_MS = 24 * 3600 * 1000


def sample_rss(pid: int, samples: int, settle_s: float) -> dict[str, Any]:
    """Median RSS (MB) of ``samples`` readings ``settle_s`` apart, and the readings."""
    process = psutil.Process(pid)
    readings = []
    for _ in range(samples):
        time.sleep(settle_s)
        readings.append(process.memory_info().rss / 1e6)
    return {"rss_mb": round(median(readings), 1), "readings_mb": [round(r, 1) for r in readings]}


async def _publish(address: str, count: int, first: int, due: Callable[[int], int]) -> float:
    return await publish_many(
        address,
        count,
        batch=1000,
        topic="memory",
        due_ms=lambda i: due(first + i),
        connections=2,
        window=4,
        payload=b"m" * PAYLOAD_BYTES,
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the figures, save and compare; return the results."""
    parser = argparse.ArgumentParser(prog="python -m bench.memory")
    add_common_args(parser)
    parser.add_argument("--levels", default=None, help="pending counts to measure at")
    parser.add_argument("--max-messages", type=int, default=5_000_000, help="cap on the levels")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--settle-s", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if args.levels is None:
        args.levels = "0,100000,1000000" if args.quick else "0,1000000,5000000"
    levels = sorted({min(int(x), args.max_messages) for x in args.levels.split(",")})
    rng = random.Random(args.seed)
    base_ms = int(now_ms()) + 60_000
    offsets = [rng.randrange(DAY_MS) for _ in range(4096)]

    def due(i: int) -> int:
        # A cheap deterministic spread: a random offset table, perturbed by the index.
        return base_ms + (offsets[i % 4096] + i * 7919) % DAY_MS

    rows: list[dict[str, Any]] = []
    published = 0
    with Server() as server:
        server.start()
        print(
            f"{'pending':>10} {'rss MB':>8} {'growth MB':>10} {'publish msgs/s':>15} {'disk MB':>8}"
        )
        for level in levels:
            rate = None
            seconds = 0.0
            if level > published:
                count = level - published
                seconds = trio.run(_publish, server.client_address, count, published, due)
                rate = count / seconds
                published = level
            rss = sample_rss(server.pid, args.samples, args.settle_s)
            row: dict[str, Any] = {
                "pending": level,
                **rss,
                "publish_s": round(seconds, 2),
                "publish_msgs_per_s": round(rate, 1) if rate else None,
                "data_dir_mb": round(server.data_bytes() / 1e6, 1),
            }
            row["growth_mb"] = round(
                row["rss_mb"] - (rows[0]["rss_mb"] if rows else row["rss_mb"]), 1
            )
            rows.append(row)
            print(
                f"{level:>10} {row['rss_mb']:>8.1f} {row['growth_mb']:>10.1f} "
                f"{(rate or 0):>15.0f} {row['data_dir_mb']:>8.1f}",
                flush=True,
            )
    results: dict[str, Any] = {"levels": {str(r["pending"]): r for r in rows}}
    results["target_growth_mb"] = TARGET_GROWTH_MB
    results["meets_target"] = all(r["growth_mb"] < TARGET_GROWTH_MB for r in rows)
    print(
        f"largest growth {max(r['growth_mb'] for r in rows):.1f} MB (target < {TARGET_GROWTH_MB}"
        f" MB at every level): {'MET' if results['meets_target'] else 'NOT MET'}"
    )
    finish(NAME, results, args, argv)
    return results


if __name__ == "__main__":
    main()
