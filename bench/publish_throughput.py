"""Publish throughput at ack level quorum for batch sizes 1, 10, 100, 1000.

For each batch size a fresh broker subprocess is started; several trio connections
send pre-encoded PUBLISH frames (100-byte payloads, delay 1 h so nothing is
dispatched) with a window of requests in flight each, and count PUBLISH_OK answers.
After a warm-up, acknowledged messages are counted over a fixed window; ``/metrics``
is scraped at both ends of the window for the fsync count and the group-commit size.

Quorum on a single node means: answered after the batch is fsynced on this node.

Usage::

    python -m bench.publish_throughput [--quick] [--compare] [--batches 1,10,100,1000]
        [--seconds 5] [--connections 4] [--profile py-spy]

Figures: msgs/s, requests/s, fsyncs/s, messages and requests per fsync (group-commit
size), PUBLISH_OK latency p50/p99 (pipelined, so it includes queueing), server CPU %, and
the CPU time of the server's main thread (the event loop, the limit at batch 100) in % and
in µs per acknowledged message: the figure that stays comparable on a shared machine.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import psutil  # type: ignore[import-untyped]
import trio

from bench._cluster import cpu_seconds
from bench._common import (
    LEADER_MOVED_CODES,
    PAYLOAD_BYTES,
    LeaderMoved,
    RawConnection,
    Server,
    add_common_args,
    finish,
    metric_sum,
    percentile,
    publish_frame,
    publish_items_bytes,
    start_py_spy,
)
from futureq.wire import frames

NAME = "publish_throughput"
DELAY_MS = 3_600_000
TARGET_BATCH_100 = 100_000


def _main_thread_cpu_s(process: psutil.Process) -> float:
    """CPU seconds (user + system) of the server's main thread, the event loop's."""
    for thread in process.threads():
        if thread.id == process.pid:
            return float(thread.user_time + thread.system_time)
    return math.nan


def window_for(batch: int) -> int:
    """PUBLISH requests in flight per connection for a batch size (enough to saturate)."""
    return max(4, min(200, 20_000 // batch))


async def _load(
    server: Server,
    batch: int,
    connections: int,
    warmup_s: float,
    seconds: float,
    window: int | None = None,
    targets: Sequence[tuple[str, str]] | None = None,
    processes: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Publish from ``connections`` raw connections for ``warmup_s`` + ``seconds``; the
    figures of the module doc over the ``seconds`` (process CPU and ``/metrics`` of
    ``server``).

    Args:
        targets: ``(client address, topic)`` per connection, taken in turn (connection
            ``i`` gets ``targets[i % len]``): a sharded node's shards or shard leaders
            each with a topic it owns. Default: every connection to ``server`` with
            topic ``bench``.
        processes: Name -> PID of the server processes whose CPU counts (a sharded
            node's supervisor and shards, every node of a cluster): their CPU seconds
            over the window in ``process_cpu_s`` and their sum in ``server_cpu_percent``.
            Default: ``server``'s process alone.

    Raises:
        LeaderMoved: a PUBLISH was answered NOT_LEADER (or a transfer is under way).
        RuntimeError: a PUBLISH was refused otherwise.
    """
    targets = targets or [(server.client_address, "bench")]
    items_of = {
        topic: publish_items_bytes(
            batch, topic=topic, payload=b"p" * PAYLOAD_BYTES, delay_ms=DELAY_MS
        )
        for _, topic in targets
    }
    window = window or window_for(batch)
    acked = 0
    requests = 0
    latencies: list[float] = []
    measuring = False
    process = psutil.Process(server.pid)
    procs = {name: psutil.Process(pid) for name, pid in (processes or {}).items()}
    me = psutil.Process()

    async def run_connection(conn: RawConnection, items: bytes) -> None:
        nonlocal acked, requests
        slots = trio.Semaphore(window)
        sent_at: dict[int, float] = {}

        async def sender() -> None:
            while True:
                await slots.acquire()
                taken = 1
                while taken < 32:
                    try:
                        slots.acquire_nowait()
                    except trio.WouldBlock:
                        break
                    taken += 1
                chunks = []
                now = time.perf_counter()
                for _ in range(taken):
                    rid = conn.next_id()
                    sent_at[rid] = now
                    chunks.append(publish_frame(rid, frames.AckLevel.QUORUM, items))
                await conn.send(b"".join(chunks))

        async def receiver() -> None:
            nonlocal acked, requests
            while True:
                answer = await conn.receive()
                if answer[0] == frames.FrameType.ERROR and answer[2] in LEADER_MOVED_CODES:
                    raise LeaderMoved(answer[3])
                if answer[0] != frames.FrameType.PUBLISH_OK:
                    raise RuntimeError(f"PUBLISH refused: {answer}")
                started = sent_at.pop(answer[1])
                slots.release()
                if measuring:
                    acked += answer[3]
                    requests += 1
                    latencies.append(time.perf_counter() - started)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender)
            nursery.start_soon(receiver)

    conns = []
    for i in range(connections):
        address, topic = targets[i % len(targets)]
        conns.append((await RawConnection.open(address), items_of[topic]))
    async with trio.open_nursery() as nursery:
        for conn, items in conns:
            nursery.start_soon(run_connection, conn, items)
        await trio.sleep(warmup_s)
        before = await trio.to_thread.run_sync(server.metrics)
        cpu_before = process.cpu_times()
        procs_before = {name: cpu_seconds(proc) for name, proc in procs.items()}
        load_before = os.getloadavg()[0]
        main_before = _main_thread_cpu_s(process)
        my_before = me.cpu_times()
        measuring = True
        started = time.perf_counter()
        await trio.sleep(seconds)
        measuring = False
        elapsed = time.perf_counter() - started
        cpu_after = process.cpu_times()
        procs_cpu_s = {name: cpu_seconds(proc) - procs_before[name] for name, proc in procs.items()}
        main_after = _main_thread_cpu_s(process)
        my_after = me.cpu_times()
        after = await trio.to_thread.run_sync(server.metrics)
        nursery.cancel_scope.cancel()
    for conn, _ in conns:
        await conn.aclose()

    fsyncs = metric_sum(after, "futureq_fsync_seconds_count") - metric_sum(
        before, "futureq_fsync_seconds_count"
    )
    fsync_s = metric_sum(after, "futureq_fsync_seconds_sum") - metric_sum(
        before, "futureq_fsync_seconds_sum"
    )
    commit_items = metric_sum(after, "futureq_group_commit_items_sum") - metric_sum(
        before, "futureq_group_commit_items_sum"
    )
    latencies.sort()
    cpu_s = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    if procs:
        cpu_s = sum(procs_cpu_s.values())
    my_cpu_s = (my_after.user + my_after.system) - (my_before.user + my_before.system)
    return {
        "batch": batch,
        "connections": connections,
        "window_per_connection": window,
        "seconds": round(elapsed, 3),
        "messages": acked,
        "msgs_per_s": round(acked / elapsed, 1),
        "requests_per_s": round(requests / elapsed, 1),
        "fsyncs": int(fsyncs),
        "fsyncs_per_s": round(fsyncs / elapsed, 1),
        "fsync_ms_mean": round(fsync_s / fsyncs * 1000, 3) if fsyncs else None,
        "requests_per_fsync": round(commit_items / fsyncs, 2) if fsyncs else None,
        "msgs_per_fsync": round(acked / fsyncs, 1) if fsyncs else None,
        "ack_latency_ms_p50": round(percentile(latencies, 50) * 1000, 2),
        "ack_latency_ms_p99": round(percentile(latencies, 99) * 1000, 2),
        "server_cpu_percent": round(cpu_s / elapsed * 100, 1),
        "server_main_thread_cpu_percent": round((main_after - main_before) / elapsed * 100, 1),
        "server_main_thread_us_per_msg": (
            round((main_after - main_before) / acked * 1e6, 2) if acked else None
        ),
        "loadgen_cpu_percent": round(my_cpu_s / elapsed * 100, 1),
        "loadgen_cpu_s": round(my_cpu_s, 3),
        "process_cpu_s": {name: round(v, 3) for name, v in procs_cpu_s.items()},
        "loadavg_1m": round(max(load_before, os.getloadavg()[0]), 2),
    }


def run_batch(
    batch: int,
    connections: int,
    warmup_s: float,
    seconds: float,
    profile: bool,
    window: int | None = None,
) -> dict[str, Any]:
    """One fresh server, one batch size: the figures of :func:`_load`."""
    with Server() as server:
        server.start()
        spy = (
            start_py_spy(server.pid, warmup_s + seconds, f"publish_batch{batch}")
            if profile
            else None
        )
        result = trio.run(_load, server, batch, connections, warmup_s, seconds, window)
        if spy is not None:
            spy.wait(60)
        result["data_dir_mb"] = round(server.data_bytes() / 1e6, 1)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the figures, save and compare; return the results."""
    parser = argparse.ArgumentParser(prog="python -m bench.publish_throughput")
    add_common_args(parser)
    parser.add_argument("--batches", default="1,10,100,1000", help="comma-separated batch sizes")
    parser.add_argument("--seconds", type=float, default=None, help="measured window per batch")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument(
        "--window",
        type=int,
        default=None,
        help="requests in flight per connection (default: by batch)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="py-spy record the server (raw stacks in results/)"
    )
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else (2.0 if args.quick else 5.0)
    rows = []
    print(
        f"{'batch':>6} {'msgs/s':>10} {'req/s':>9} {'fsync/s':>8} {'msgs/fsync':>10} "
        f"{'req/fsync':>9} {'p50 ms':>8} {'p99 ms':>8} {'srv cpu%':>8} {'main cpu%':>9} "
        f"{'main us/msg':>11} {'gen cpu%':>8}"
    )
    for batch in [int(b) for b in args.batches.split(",")]:
        row = run_batch(batch, args.connections, args.warmup, seconds, args.profile, args.window)
        rows.append(row)
        print(
            f"{row['batch']:>6} {row['msgs_per_s']:>10.0f} {row['requests_per_s']:>9.0f} "
            f"{row['fsyncs_per_s']:>8.0f} {row['msgs_per_fsync'] or 0:>10.1f} "
            f"{row['requests_per_fsync'] or 0:>9.2f} {row['ack_latency_ms_p50']:>8.2f} "
            f"{row['ack_latency_ms_p99']:>8.2f} {row['server_cpu_percent']:>8.1f} "
            f"{row['server_main_thread_cpu_percent']:>9.1f} "
            f"{row['server_main_thread_us_per_msg'] or math.nan:>11.2f} "
            f"{row['loadgen_cpu_percent']:>8.1f}",
            flush=True,
        )
    results: dict[str, Any] = {"by_batch": {str(r["batch"]): r for r in rows}}
    at_100 = results["by_batch"].get("100")
    if at_100 is not None:
        results["target_msgs_per_s_batch_100"] = TARGET_BATCH_100
        results["meets_target"] = at_100["msgs_per_s"] >= TARGET_BATCH_100
        print(
            f"batch 100: {at_100['msgs_per_s']:.0f} msgs/s (target >= {TARGET_BATCH_100}): "
            f"{'MET' if results['meets_target'] else 'NOT MET'}"
        )
    finish(NAME, results, args, argv)
    return results


if __name__ == "__main__":
    main()
