"""Duplicates a leader change causes: issue 8's input 4, measured (not asserted).

A 3-node cluster (``tests/jepsen_like``: real processes, every Raft link through a
proxy). Each round: a consumer connected to the leader only (it never follows a
redirect) acks everything it gets; messages fall due continuously (published ahead
with delays spread over the next seconds); then the leader is cut off from every peer
for ``--hold`` seconds (``--fault partition``) or SIGSTOPped (``--fault pause``). After
the hold the links heal / the node resumes, another consumer drains the group from
whoever leads, acking everything. A delivery of a message the group already received is
a duplicate; each round is one leader change.

Run against the code in ``src`` (or any other tree with ``PYTHONPATH=OTHER/src``, the
nodes inherit it)::

    .venv/bin/python -m bench.lease_duplicates --fault partition --rounds 5
    .venv/bin/python -m bench.lease_duplicates --fault pause --hold 1.5 --rounds 5

Prints one JSON line per round and a summary. A round counts as a leader change when
the node that leads afterwards (highest term) is not the one hit by the fault.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from tests.jepsen_like.cluster import Cluster, open_cluster

from futureq.client import PublishItem, open_client
from futureq.wire import codec, frames


class RawConsumer:
    """One connection to one node: SUBSCRIBE, record every DELIVER, ack each batch."""

    def __init__(self, address: str, topic: str, group: str) -> None:
        self.address = address
        self.topic = topic
        self.group = group
        self.ids: list[int] = []
        self.last_delivered_ms = 0

    async def run(self) -> None:
        host, port = self.address.rsplit(":", 1)
        try:
            stream = await trio.open_tcp_stream(host, int(port))
        except OSError:
            return
        decoder = codec.FrameDecoder(64 << 20)
        next_id = 1

        async def send(frame: frames.Frame) -> None:
            await stream.send_all(codec.encode_frame(frame, 1 << 30))

        async with stream:
            try:
                await send(frames.Hello(next_id, (1,), "bench", None))
                await send(frames.Subscribe(next_id + 1, self.topic, self.group, 1000))
                next_id += 2
                while True:
                    event = decoder.next_frame()
                    if event is codec.NEED_DATA:
                        data = await stream.receive_some(1 << 20)
                        decoder.receive_data(data)
                        if not data:
                            return
                        continue
                    if event is codec.CLOSED:
                        return
                    if isinstance(event, frames.Deliver):
                        self.ids.extend(d[1] for d in event.deliveries)
                        self.last_delivered_ms = event.delivered_ms
                        next_id += 1
                        await send(frames.Ack(next_id, [d[0] for d in event.deliveries]))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return


async def leader_of(cluster: Cluster, exclude: int | None = None) -> int:
    """The node that says it leads in the highest term (a deposed leader that has not
    heard yet may still say it leads, in an older term)."""
    with trio.fail_after(30):
        while True:
            statuses = await cluster.statuses()
            claims = [
                (int(status.get("term") or 0), node_id)
                for node_id, status in statuses.items()
                if status.get("role") == "leader" and node_id != exclude
            ]
            if claims:
                return max(claims)[1]
            await trio.sleep(0.05)


async def drain(
    cluster: Cluster, topic: str, group: str, seen: set[int], total: int, seconds: float
) -> list[int]:
    """Ids delivered to ``group`` by whoever leads (redirects followed), until every one
    of ``total`` messages was seen once (with those in ``seen``) plus one second for
    stragglers, or ``seconds`` passed."""
    ids: list[int] = []
    async with open_client(cluster.servers, request_timeout_s=30) as client:
        with trio.move_on_after(seconds) as overall:
            async with client.subscribe(topic, group, prefetch=1000) as subscription:
                async for delivery in subscription:
                    ids.append(delivery.id)
                    await delivery.ack()
                    if len(seen | set(ids)) >= total:
                        overall.deadline = min(overall.deadline, trio.current_time() + 1.0)
    return ids


async def one_round(cluster: Cluster, number: int, fault: str, hold_s: float) -> dict[str, Any]:
    topic, group = f"dup{number}", "g"
    leader = await leader_of(cluster)
    async with open_client(cluster.servers, request_timeout_s=30) as client:
        await client.create_group(topic, group)
        # 60 messages fall due every second for the next 4 s.
        await client.publish_batch(
            [PublishItem(topic, b"m%d" % i, delay_ms=200 + 16 * i) for i in range(250)]
        )
    on_leader = RawConsumer(cluster.nodes[leader].client_address, topic, group)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(on_leader.run)
        await trio.sleep(1.0)
        fault_ms = time.time_ns() // 1_000_000
        if fault == "partition":
            cluster.links.isolate([leader], [n for n in cluster.nodes if n != leader])
        else:
            cluster.pause(leader)
        await trio.sleep(hold_s)
        cluster.links.heal()
        cluster.resume(leader)
        await trio.sleep(1.0)
        nursery.cancel_scope.cancel()
    new_leader = await leader_of(cluster)
    deliveries = on_leader.ids + await drain(cluster, topic, group, set(on_leader.ids), 250, 20.0)
    distinct = len(set(deliveries))
    return {
        "round": number,
        "fault": fault,
        "old_leader": leader,
        "new_leader": new_leader,
        "deliveries": len(deliveries),
        "distinct": distinct,
        "duplicates": len(deliveries) - distinct,
        "old_leader_pushed_after_fault_ms": max(0, on_leader.last_delivered_ms - fault_ms),
    }


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="lease-dup-") as root:
        async with open_cluster(Path(root), 3, rng=random.Random(args.seed)) as cluster:
            rounds = []
            for number in range(args.rounds):
                result = await one_round(cluster, number, args.fault, args.hold)
                print(json.dumps(result), flush=True)
                rounds.append(result)
                await cluster.wait_ready(timeout_s=30)
    changes = sum(1 for r in rounds if r["new_leader"] != r["old_leader"])
    duplicates = sum(r["duplicates"] for r in rounds)
    print(
        json.dumps(
            {
                "fault": args.fault,
                "hold_s": args.hold,
                "rounds": len(rounds),
                "leader_changes": changes,
                "deliveries": sum(r["deliveries"] for r in rounds),
                "duplicates": duplicates,
                "duplicates_per_leader_change": round(duplicates / max(1, changes), 1),
            }
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.lease_duplicates")
    parser.add_argument("--fault", choices=("partition", "pause"), default="partition")
    parser.add_argument("--hold", type=float, default=8.0, help="seconds the fault lasts")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    trio.run(main, parser.parse_args())
