"""Publish commit latency at a moderate fixed rate against a 3-node cluster.

Open loop: PUBLISH requests (ack level quorum, 100-byte payloads, delay 1 h) are sent to
the leader on a fixed schedule, whatever the answers do, over one pipelined connection;
latency is from the *scheduled* send time to the PUBLISH_OK being decoded, so a stalled
sender counts against the figure (no coordinated omission). Two workloads, each on a
fresh cluster: 200 requests/s of 10 messages (2,000 msgs/s) and 200 requests/s of one
message. For reference the same two workloads run against a single node afterwards
(sequentially; ``--no-single`` skips it).

Usage::

    python -m bench.cluster_latency [--quick] [--compare] [--seconds 10] [--rate 200]
        [--no-single]

Figures: latency p50/p90/p99/p99.9/max in ms, achieved request rate, errors.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import trio

from bench._cluster import CpuMeter, LocalCluster
from bench._common import (
    PAYLOAD_BYTES,
    RawConnection,
    Server,
    add_common_args,
    finish,
    percentile,
    publish_frame,
    publish_items_bytes,
)
from futureq.wire import frames

NAME = "cluster_latency"
DELAY_MS = 3_600_000
WORKLOADS = (("batch10", 10), ("single", 1))


async def _paced(
    address: str, batch: int, rate: float, warmup_s: float, seconds: float
) -> dict[str, Any]:
    """Send ``rate`` PUBLISH/s of ``batch`` items for ``warmup_s + seconds``; latencies of
    the requests scheduled after the warm-up."""
    items = publish_items_bytes(
        batch, topic="latency", payload=b"l" * PAYLOAD_BYTES, delay_ms=DELAY_MS
    )
    conn = await RawConnection.open(address)
    scheduled: dict[int, tuple[float, bool]] = {}
    latencies: list[float] = []
    errors = 0
    sent = 0
    interval = 1.0 / rate
    total = int((warmup_s + seconds) * rate)
    warm = int(warmup_s * rate)
    all_sent = False
    done = trio.Event()

    async def receiver() -> None:
        nonlocal errors
        while True:
            answer = await conn.receive()
            at, measured = scheduled.pop(answer[1])
            if answer[0] != frames.FrameType.PUBLISH_OK:
                errors += 1
            elif measured:
                latencies.append(time.perf_counter() - at)
            if all_sent and not scheduled:
                done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver)
        start = time.perf_counter()
        trio_start = trio.current_time()
        for i in range(total):
            await trio.sleep_until(trio_start + i * interval)
            rid = conn.next_id()
            scheduled[rid] = (start + i * interval, i >= warm)
            await conn.send(publish_frame(rid, frames.AckLevel.QUORUM, items))
            sent += 1
        all_sent = True
        with trio.move_on_after(30):
            if scheduled:
                await done.wait()
        elapsed = time.perf_counter() - start
        nursery.cancel_scope.cancel()
    await conn.aclose()
    latencies.sort()
    ms = [v * 1000 for v in latencies]
    return {
        "batch": batch,
        "rate_requests_per_s": rate,
        "msgs_per_s": rate * batch,
        "achieved_requests_per_s": round(sent / elapsed, 1),
        "measured": len(ms),
        "unanswered": len(scheduled),
        "errors": errors,
        "p50_ms": round(percentile(ms, 50), 2),
        "p90_ms": round(percentile(ms, 90), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "p999_ms": round(percentile(ms, 99.9), 2),
        "max_ms": round(ms[-1], 2) if ms else None,
    }


def run_cluster(batch: int, rate: float, warmup_s: float, seconds: float) -> dict[str, Any]:
    """One workload on a fresh 3-node cluster, sent to the leader."""
    with LocalCluster(3) as cluster:
        cluster.start()
        leader = cluster.leader()
        meter = CpuMeter(
            {
                ("leader" if n.node_id == leader.node_id else f"follower{n.node_id}"): n.pid
                for n in cluster.nodes.values()
            }
        )
        meter.start()
        result = trio.run(_paced, leader.client_address, batch, rate, warmup_s, seconds)
        result["node_cpu_percent"] = meter.stop()
    return result


def run_single(batch: int, rate: float, warmup_s: float, seconds: float) -> dict[str, Any]:
    """One workload on a fresh single node."""
    with Server() as server:
        server.start()
        meter = CpuMeter({"leader": server.pid})
        meter.start()
        result = trio.run(_paced, server.client_address, batch, rate, warmup_s, seconds)
        result["node_cpu_percent"] = meter.stop()
    return result


def _print(label: str, row: dict[str, Any]) -> None:
    print(
        f"{label:<18} {row['msgs_per_s']:>7.0f} {row['achieved_requests_per_s']:>7.0f} "
        f"{row['p50_ms']:>7.2f} {row['p90_ms']:>7.2f} {row['p99_ms']:>7.2f} "
        f"{row['p999_ms']:>7.2f} {row['max_ms'] or 0:>8.2f} {row['errors']:>4} "
        f"{row['node_cpu_percent']['leader']:>6.0f}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the figures, save and compare; return the results."""
    parser = argparse.ArgumentParser(prog="python -m bench.cluster_latency")
    add_common_args(parser)
    parser.add_argument("--seconds", type=float, default=None, help="measured window")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds not measured")
    parser.add_argument("--rate", type=float, default=200.0, help="PUBLISH requests per second")
    parser.add_argument("--no-single", action="store_true", help="skip the single-node runs")
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else (3.0 if args.quick else 10.0)
    print(
        f"{'':<18} {'msgs/s':>7} {'req/s':>7} {'p50':>7} {'p90':>7} {'p99':>7} "
        f"{'p99.9':>7} {'max':>8} {'err':>4} {'lead%':>6}   (latency in ms)"
    )
    results: dict[str, Any] = {"cluster": {}, "single_node": {}}
    for name, batch in WORKLOADS:
        row = run_cluster(batch, args.rate, args.warmup, seconds)
        results["cluster"][name] = row
        _print(f"3 nodes, {name}", row)
    if not args.no_single:
        for name, batch in WORKLOADS:
            row = run_single(batch, args.rate, args.warmup, seconds)
            results["single_node"][name] = row
            _print(f"1 node, {name}", row)
    finish(NAME, results, args, argv)
    return results


if __name__ == "__main__":
    main()
