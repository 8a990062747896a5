"""Topic and group scale: a hot topic beside 10, 10,000 and 100,000 idle topics+groups.

For each level a fresh single node is started. Steps:

1. Create the idle topics: PUBLISH batches of ``--create-batch`` items (default 1,000;
   the largest a client may send is 10,000), each to a new topic (its implicit group
   holds one message due in an hour), so every idle topic has a group and a pending
   message on disk. Timed: ``create_s``.
2. Subscribe a consumer to ``hot`` (prefetch 1000, acks as it goes).
3. Publish ``--messages`` single messages to ``hot``, one in flight at a time (ack level
   quorum, due at once) and time, per message, PUBLISH -> PUBLISH_OK (``publish``) and
   PUBLISH -> DELIVER on the consumer's connection (``deliver``).
4. Throughout steps 1-3, a third connection sends a PING every 10 ms: ``ping`` during the
   creation and during the hot traffic (the node must stay responsive: p99 < 50 ms).
5. Scrape ``/metrics`` once: time and number of series (bounded by ``[metrics]``).

Flat hot-topic latency from 10 to 100,000 idle topics is the point (issue 10).

Usage::

    python -m bench.topic_scale [--quick] [--compare] [--levels 10,10000,100000]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import psutil
import trio

from bench._common import RawConnection, Server, add_common_args, finish, frame_bytes, percentile
from futureq.wire import frames

NAME = "topic_scale"
CREATE_BATCH = 1000
HOUR_MS = 3_600_000
TARGET_PING_P99_MS = 50.0


class Pinger:
    """PINGs every ``interval_s`` on its own connection; latencies per phase (ms)."""

    def __init__(self, address: str, interval_s: float = 0.01) -> None:
        self.address = address
        self.interval_s = interval_s
        self.phase = "idle"
        self.samples: dict[str, list[float]] = {}

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        conn = await RawConnection.open(self.address, "pinger")
        task_status.started()
        while True:
            started = time.perf_counter()
            answer = await conn.request([frames.FrameType.PING, conn.next_id()])
            if answer[0] != frames.FrameType.PONG:
                raise RuntimeError(f"PING answered {answer}")
            self.samples.setdefault(self.phase, []).append((time.perf_counter() - started) * 1000)
            await trio.sleep(self.interval_s)


def stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "count": len(ordered),
        "p50_ms": round(percentile(ordered, 50), 2),
        "p99_ms": round(percentile(ordered, 99), 2),
        "max_ms": round(ordered[-1], 2) if ordered else float("nan"),
    }


async def create_idle(address: str, count: int, batch: int) -> float:
    conn = await RawConnection.open(address, "creator")
    due_ms = int(time.time() * 1000) + HOUR_MS
    started = time.perf_counter()
    made = 0
    while made < count:
        size = min(batch, count - made)
        items = [[f"idle.{made + i}", b"i", None, due_ms, None] for i in range(size)]
        rid = conn.next_id()
        answer = await conn.request(
            [frames.FrameType.PUBLISH, rid, int(frames.AckLevel.QUORUM), items]
        )
        if answer[0] != frames.FrameType.PUBLISH_OK:
            raise RuntimeError(f"creating idle topics failed: {answer}")
        made += size
    elapsed = time.perf_counter() - started
    await conn.aclose()
    return elapsed


async def hot_traffic(address: str, messages: int) -> tuple[list[float], list[float]]:
    producer = await RawConnection.open(address, "producer")
    consumer = await RawConnection.open(address, "consumer")
    rid = consumer.next_id()
    await consumer.send(frame_bytes([frames.FrameType.SUBSCRIBE, rid, "hot", "g", 1000]))
    subscription = None
    while subscription is None:
        frame = await consumer.receive()
        if frame[0] == frames.FrameType.SUBSCRIBE_OK:
            subscription = frame[2]
    sent_at: dict[bytes, float] = {}
    delivered: list[float] = []
    published: list[float] = []
    all_in = trio.Event()

    async def consume() -> None:
        tags: list[bytes] = []
        while len(delivered) < messages:
            frame = await consumer.receive()
            if frame[0] != frames.FrameType.DELIVER:
                continue
            now = time.perf_counter()
            for tag, _mid, payload, *_ in frame[4]:
                delivered.append((now - sent_at.pop(payload)) * 1000)
                tags.append(tag)
            if len(tags) >= 50 or len(delivered) >= messages:
                await consumer.send(
                    frame_bytes([frames.FrameType.ACK, consumer.next_id(), tags])
                    + frame_bytes(
                        [frames.FrameType.CREDIT, consumer.next_id(), subscription, len(tags)]
                    )
                )
                tags = []
        all_in.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume)
        for number in range(messages):
            payload = f"hot-{number}".encode()
            started = time.perf_counter()
            sent_at[payload] = started
            answer = await producer.request(
                [
                    frames.FrameType.PUBLISH,
                    producer.next_id(),
                    int(frames.AckLevel.QUORUM),
                    [["hot", payload, 0, None, None]],
                ]
            )
            published.append((time.perf_counter() - started) * 1000)
            if answer[0] != frames.FrameType.PUBLISH_OK:
                raise RuntimeError(f"hot publish failed: {answer}")
        with trio.move_on_after(60):
            await all_in.wait()
        nursery.cancel_scope.cancel()
    await producer.aclose()
    await consumer.aclose()
    return published, delivered


async def measure_level(server: Server, idle: int, messages: int, batch: int) -> dict[str, Any]:
    pinger = Pinger(server.client_address)
    async with trio.open_nursery() as nursery:
        await nursery.start(pinger.run)
        pinger.phase = "create"
        create_s = await create_idle(server.client_address, idle, batch) if idle else 0.0
        pinger.phase = "settle"
        await trio.sleep(1.0)  # the dispatcher loads the new groups' horizons
        pinger.phase = "hot"
        published, delivered = await hot_traffic(server.client_address, messages)
        nursery.cancel_scope.cancel()
    started = time.perf_counter()
    _, body = await trio.to_thread.run_sync(server.http_get, "/metrics")
    scrape_ms = (time.perf_counter() - started) * 1000
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    rss_mb = psutil.Process(server.pid).memory_info().rss / 2**20
    return {
        "idle_topics": idle,
        "create_s": round(create_s, 2),
        "create_per_s": round(idle / create_s) if create_s else None,
        "publish": stats(published),
        "deliver": stats(delivered),
        "ping_during_create": stats(pinger.samples.get("create", [])),
        "ping_during_hot": stats(pinger.samples.get("hot", []) + pinger.samples.get("settle", [])),
        "metrics_scrape_ms": round(scrape_ms, 1),
        "metrics_series": series,
        "rss_mb": round(rss_mb, 1),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the figures, save and compare; return the results."""
    parser = argparse.ArgumentParser(prog="python -m bench.topic_scale")
    add_common_args(parser)
    parser.add_argument("--levels", default=None, help="idle topic counts, default 10,10000,100000")
    parser.add_argument("--messages", type=int, default=None, help="hot publishes per level")
    parser.add_argument(
        "--create-batch", type=int, default=CREATE_BATCH, help="new topics per PUBLISH"
    )
    args = parser.parse_args(argv)
    levels_text = args.levels or ("10,1000,10000" if args.quick else "10,10000,100000")
    levels = [int(part) for part in levels_text.split(",")]
    messages = args.messages or (300 if args.quick else 1000)
    results: dict[str, Any] = {
        "messages": messages,
        "create_batch": args.create_batch,
        "levels": {},
    }
    for idle in levels:
        with Server() as server:
            server.start()
            row = trio.run(measure_level, server, idle, messages, args.create_batch)
        results["levels"][str(idle)] = row
        print(
            f"{idle:>7} idle: create {row['create_s']:>6.2f} s | publish p50/p99 "
            f"{row['publish']['p50_ms']:.2f}/{row['publish']['p99_ms']:.2f} ms | deliver "
            f"p50/p99 {row['deliver']['p50_ms']:.2f}/{row['deliver']['p99_ms']:.2f} ms | PING "
            f"p99 create/hot {row['ping_during_create']['p99_ms']:.1f}/"
            f"{row['ping_during_hot']['p99_ms']:.1f} ms (max "
            f"{max(row['ping_during_create']['max_ms'], row['ping_during_hot']['max_ms']):.0f})"
            f" | /metrics {row['metrics_series']} series {row['metrics_scrape_ms']:.0f} ms | "
            f"RSS {row['rss_mb']:.0f} MB",
            flush=True,
        )
    pings = [
        row[phase]["p99_ms"]
        for row in results["levels"].values()
        for phase in ("ping_during_create", "ping_during_hot")
        if row[phase]["count"]
    ]
    results["target_ping_p99_ms"] = TARGET_PING_P99_MS
    results["meets_target"] = bool(pings) and max(pings) < TARGET_PING_P99_MS
    print(
        f"PING p99 at most {max(pings):.1f} ms (target < {TARGET_PING_P99_MS}): "
        f"{'MET' if results['meets_target'] else 'NOT MET'}"
    )
    finish(NAME, results, args, argv)
    return results


if __name__ == "__main__":
    main()
