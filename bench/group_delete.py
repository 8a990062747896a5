"""Deleting a big consumer group on a 3-node cluster: PING latency and heartbeats meanwhile.

Steps: start a 3-node cluster; create group ``g`` of topic ``del`` and publish
``--entries`` messages to it (100-byte payloads, due in an hour, batches of 1000); then
PING the leader every 10 ms over one connection for ``--baseline-s`` seconds (the
baseline), send GROUP_DELETE, and keep pinging until no node lists the group under
``deleting_groups`` any more (its entries are purged in PURGE_GROUP chunks by the
leader). The term is read before and after: an election during the delete would show.

Usage::

    python -m bench.group_delete [--quick] [--compare] [--entries 100000]

Figures: PING p50/p99/max (ms) in the baseline and during the delete, the delete's
answer time and purge duration (s), and whether the term changed.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import trio

from bench._cluster import LocalCluster
from bench._common import (
    RawConnection,
    add_common_args,
    finish,
    frame_bytes,
    percentile,
    publish_many,
)
from futureq.wire import frames

NAME = "group_delete"
TOPIC = "del"
GROUP = "g"
PING_EVERY_S = 0.01


def _summary(pings: list[float]) -> dict[str, float]:
    ordered = sorted(pings)
    return {
        "pings": len(ordered),
        "p50_ms": percentile(ordered, 50) * 1000,
        "p99_ms": percentile(ordered, 99) * 1000,
        "max_ms": ordered[-1] * 1000,
    }


async def _measure(cluster: LocalCluster, entries: int, baseline_s: float) -> dict[str, Any]:
    leader = cluster.leader()
    address = leader.client_address
    admin = await RawConnection.open(address, "bench-admin")
    answer = await admin.request(
        [frames.FrameType.GROUP_CREATE, admin.next_id(), TOPIC, GROUP, 3_600_000, None]
    )
    assert answer[0] == frames.FrameType.OK, answer
    due_ms = int(time.time() * 1000) + 3_600_000
    publish_s = await publish_many(
        address, entries, batch=1000, topic=TOPIC, due_ms=lambda _index: due_ms
    )
    term_before = (leader.status() or {}).get("term")
    pinger = await RawConnection.open(address, "bench-ping")
    baseline: list[float] = []
    during: list[float] = []
    phase = baseline
    done = trio.Event()

    async def ping() -> None:
        while not done.is_set():
            started = time.perf_counter()
            answer = await pinger.request([frames.FrameType.PING, pinger.next_id()])
            assert answer[0] == frames.FrameType.PONG, answer
            phase.append(time.perf_counter() - started)
            await trio.sleep(PING_EVERY_S)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ping)
        await trio.sleep(baseline_s)
        phase = during
        started = time.perf_counter()
        await admin.send(
            frame_bytes([frames.FrameType.GROUP_DELETE, admin.next_id(), TOPIC, GROUP])
        )
        answer = await admin.receive()
        answered_s = time.perf_counter() - started
        assert answer[0] == frames.FrameType.OK, answer
        while True:
            statuses = [node.status() or {} for node in cluster.nodes.values()]
            if all(s.get("deleting_groups") == [] for s in statuses):
                break
            await trio.sleep(0.05)
        purged_s = time.perf_counter() - started
        done.set()
    term_after = (cluster.leader().status() or {}).get("term")
    await admin.aclose()
    await pinger.aclose()
    return {
        "entries": entries,
        "publish_s": round(publish_s, 2),
        "delete_answer_s": round(answered_s, 3),
        "purge_s": round(purged_s, 2),
        "ping_baseline": _summary(baseline),
        "ping_during_delete": _summary(during),
        "term_changed": term_before != term_after,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; print and save its figures."""
    parser = argparse.ArgumentParser(prog="python -m bench.group_delete")
    add_common_args(parser)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--baseline-s", type=float, default=3.0)
    args = parser.parse_args(argv)
    entries = 20_000 if args.quick else args.entries
    with LocalCluster(3) as cluster:
        cluster.start()
        results = trio.run(_measure, cluster, entries, args.baseline_s)
    base, during = results["ping_baseline"], results["ping_during_delete"]
    print(
        f"[{NAME}] {entries} entries: delete answered in {results['delete_answer_s']} s, "
        f"purged in {results['purge_s']} s; PING p50/p99/max ms baseline "
        f"{base['p50_ms']:.1f}/{base['p99_ms']:.1f}/{base['max_ms']:.1f}, during "
        f"{during['p50_ms']:.1f}/{during['p99_ms']:.1f}/{during['max_ms']:.1f}; "
        f"term changed: {results['term_changed']}"
    )
    finish(NAME, results, args, argv)
    return results


if __name__ == "__main__":
    main()
