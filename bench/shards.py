"""One node with 1 shard against one node with 2 shards: publish throughput, batch 100.

Rounds alternate the two set-ups (1, 2, 1, 2, ...) so both see the same machine load.
Each round starts a fresh node (``--shards 1`` or ``--shards 2``), opens the same
number of raw connections in total (with 2 shards, half to each shard, each sending
a topic its shard owns), sends pre-encoded PUBLISH frames at ack level quorum
(100-byte payloads, delay 1 h so nothing is dispatched) with a window of requests in
flight per connection, and counts acknowledged messages over a fixed window. Server
CPU is the supervisor's and every shard's together.

Usage::

    python -m bench.shards [--rounds 3] [--seconds 5] [--connections 4] [--batch 100]

Prints one line per round and the ratio of the medians (2 shards / 1 shard).
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import statistics
import time
from typing import Any

import trio

from bench._common import PAYLOAD_BYTES, RawConnection, Server, publish_frame, publish_items_bytes
from futureq.shards.slots import even_map
from futureq.wire import frames

DELAY_MS = 3_600_000
STRIDE = 1


_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (from /proc)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / _TICKS


def _tree(pid: int) -> list[int]:
    """``pid`` and its children (every thread's), one level: a node and its shards."""
    children: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as found:
            children += [int(c) for c in found.read().split()]
    return [pid, *children]


def _free_run(length: int, taken: set[int]) -> int:
    rng = random.Random()
    while True:
        base = rng.randrange(20000, 60000)
        ports = set(range(base, base + length))
        if ports & taken:
            continue
        ok = True
        for port in ports:
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            taken |= ports
            return base


def _topic_on(shard: int, shards: int, addresses: list[str]) -> str:
    slot_map = even_map(addresses)
    return next(t for t in (f"bench.{i}" for i in range(1000)) if slot_map.shard_of(t) == shard)


async def _load(
    addresses: list[str],
    topics: list[str],
    batch: int,
    connections: int,
    seconds: float,
    warmup_s: float,
    processes: list[int],
) -> dict[str, Any]:
    window = max(4, min(200, 20_000 // batch))
    acked = 0
    measuring = False

    async def run_connection(conn: RawConnection, items: bytes) -> None:
        nonlocal acked
        slots = trio.Semaphore(window)

        async def sender() -> None:
            while True:
                await slots.acquire()
                await conn.send(publish_frame(conn.next_id(), frames.AckLevel.QUORUM, items))

        async def receiver() -> None:
            nonlocal acked
            while True:
                answer = await conn.receive()
                if answer[0] != frames.FrameType.PUBLISH_OK:
                    raise RuntimeError(f"PUBLISH refused: {answer}")
                slots.release()
                if measuring:
                    acked += answer[3]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender)
            nursery.start_soon(receiver)

    pairs = []
    for i in range(connections):
        shard = i % len(addresses)
        conn = await RawConnection.open(addresses[shard])
        items = publish_items_bytes(
            batch, topic=topics[shard], payload=b"p" * PAYLOAD_BYTES, delay_ms=DELAY_MS
        )
        pairs.append((conn, items))
    async with trio.open_nursery() as nursery:
        for conn, items in pairs:
            nursery.start_soon(run_connection, conn, items)
        await trio.sleep(warmup_s)
        cpu_before = _cpu_s(processes)
        measuring = True
        started = time.perf_counter()
        await trio.sleep(seconds)
        measuring = False
        elapsed = time.perf_counter() - started
        cpu_after = _cpu_s(processes)
        nursery.cancel_scope.cancel()
    for conn, _ in pairs:
        await conn.aclose()
    return {
        "msgs_per_s": round(acked / elapsed, 1),
        "server_cpu_percent": round((cpu_after - cpu_before) / elapsed * 100, 1),
    }


def run_round(shards: int, batch: int, connections: int, seconds: float) -> dict[str, Any]:
    """One fresh node of ``shards`` shards under load; its msgs/s and CPU."""
    taken: set[int] = set()
    client, http = _free_run(shards, taken), _free_run(shards, taken)
    os.environ["FUTUREQ_NODE_SHARD_PORT_STRIDE"] = str(STRIDE)
    args = ["--listen", f"127.0.0.1:{client}", "--http", f"127.0.0.1:{http}"]
    args += ["--shards", str(shards)]
    with Server(extra_args=args) as server:
        server.start()
        addresses = [f"127.0.0.1:{client + k * STRIDE}" for k in range(shards)]
        topics = [_topic_on(k, shards, addresses) for k in range(shards)]
        processes = _tree(server.pid)
        result = trio.run(_load, addresses, topics, batch, connections, seconds, 1.0, processes)
    return {"shards": shards, **result}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the interleaved rounds; print and return the figures."""
    parser = argparse.ArgumentParser(prog="python -m bench.shards")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args(argv)
    rounds: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        for shards in (1, 2):
            result = run_round(shards, args.batch, args.connections, args.seconds)
            print(result, flush=True)
            rounds.append(result)
    medians = {
        n: statistics.median(r["msgs_per_s"] for r in rounds if r["shards"] == n) for n in (1, 2)
    }
    summary = {
        "batch": args.batch,
        "connections": args.connections,
        "median_msgs_per_s": medians,
        "ratio_2_over_1": round(medians[2] / medians[1], 3),
        "rounds": rounds,
    }
    print(
        f"median msgs/s: 1 shard {medians[1]:.0f}, 2 shards {medians[2]:.0f}; "
        f"ratio {summary['ratio_2_over_1']}"
    )
    return summary


if __name__ == "__main__":
    main()
