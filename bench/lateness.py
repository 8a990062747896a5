"""Due-to-delivery lateness: 100,000 messages due uniformly over 10 s, 4 consumers.

Steps: start a broker subprocess; create group ``lat`` of topic ``lateness`` (long
visibility timeout, so nothing is redelivered); publish every message first (batches
of 1000, ack level quorum) with ``deliver_at_ms`` spread evenly over ``--spread-s``
seconds starting ``--lead-s`` seconds after the publishing began (at least
``--gap-s`` after it ended is checked); then open 4 connections, each subscribing to
the group with prefetch 1000, acking in batches and granting the same CREDIT back.

Two lateness figures per message (ms):

* consumer: wall time when the DELIVER frame was decoded by the consumer - due_ms;
* server: ``delivered_ms`` stamped in the DELIVER frame - due_ms (the broker's wall
  clock, floored to ms). Early deliveries (negative) must be 0.

Usage::

    python -m bench.lateness [--quick] [--compare] [--messages 100000] [--spread-s 10]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import trio

from bench._common import (
    PAYLOAD_BYTES,
    RawConnection,
    Server,
    add_common_args,
    finish,
    frame_bytes,
    now_ms,
    percentile,
    publish_many,
    start_py_spy,
)
from futureq.wire import frames

NAME = "lateness"
TOPIC = "lateness"
GROUP = "lat"
TARGET_P99_MS = 10.0
ACK_EVERY = 200


async def _consume(
    address: str, total: int, consumers: int, prefetch: int, deadline_ms: float
) -> dict[str, Any]:
    consumer_late: list[float] = []
    server_late: list[int] = []
    per_consumer = [0] * consumers
    duplicates = 0
    seen: set[int] = set()
    done = trio.Event()
    last_receive = 0.0

    async def consumer(index: int) -> None:
        nonlocal duplicates, last_receive
        conn = await RawConnection.open(address, f"lateness-{index}")
        rid = conn.next_id()
        await conn.send(frame_bytes([frames.FrameType.SUBSCRIBE, rid, TOPIC, GROUP, prefetch]))
        sub_id = None
        pending_tags: list[bytes] = []
        while True:
            frame = await conn.receive()
            received = now_ms()
            kind = frame[0]
            if kind == frames.FrameType.SUBSCRIBE_OK:
                sub_id = frame[2]
                continue
            if kind in (frames.FrameType.OK, frames.FrameType.SUBSCRIPTION_INFO):
                continue
            if kind != frames.FrameType.DELIVER:
                raise RuntimeError(f"unexpected frame {frame[:4]}")
            delivered_ms = frame[3]
            for tag, mid, _payload, due_ms, _publish_ms, _attempt in frame[4]:
                consumer_late.append(received - due_ms)
                server_late.append(delivered_ms - due_ms)
                if mid in seen:
                    duplicates += 1
                seen.add(mid)
                pending_tags.append(tag)
            per_consumer[index] += len(frame[4])
            last_receive = received
            if len(pending_tags) >= ACK_EVERY or len(seen) >= total:
                ack = frame_bytes([frames.FrameType.ACK, conn.next_id(), pending_tags])
                credit = frame_bytes(
                    [frames.FrameType.CREDIT, conn.next_id(), sub_id, len(pending_tags)]
                )
                await conn.send(ack + credit)
                pending_tags = []
            if len(seen) >= total:
                done.set()

    async with trio.open_nursery() as nursery:
        for i in range(consumers):
            nursery.start_soon(consumer, i)
        with trio.move_on_at(trio.current_time() + max(1.0, (deadline_ms - now_ms()) / 1000)):
            await done.wait()
        nursery.cancel_scope.cancel()
    consumer_late.sort()
    server_late.sort()

    def stats(values: list[Any]) -> dict[str, Any]:
        return {
            "p50_ms": round(percentile(values, 50), 2),
            "p90_ms": round(percentile(values, 90), 2),
            "p99_ms": round(percentile(values, 99), 2),
            "p999_ms": round(percentile(values, 99.9), 2),
            "max_ms": round(values[-1], 2) if values else None,
            "min_ms": round(values[0], 2) if values else None,
            "early": sum(1 for v in values if v < 0),
        }

    return {
        "received": len(seen),
        "last_receive_ms": last_receive,
        "duplicates": duplicates,
        "per_consumer": per_consumer,
        "consumer": stats(consumer_late),
        "server": stats(server_late),
    }


async def _run(args: argparse.Namespace, server: Server) -> dict[str, Any]:
    total: int = args.messages
    conn = await RawConnection.open(server.client_address)
    answer = await conn.request(
        [frames.FrameType.GROUP_CREATE, conn.next_id(), TOPIC, GROUP, 600_000, None]
    )
    if answer[0] != frames.FrameType.OK:
        raise RuntimeError(f"GROUP_CREATE refused: {answer}")
    await conn.aclose()
    start_ms = now_ms()
    first_due = int(start_ms + args.lead_s * 1000)
    spread = int(args.spread_s * 1000)

    def due(i: int) -> int:
        return first_due + i * spread // total

    publish_s = await publish_many(
        server.client_address,
        total,
        batch=1000,
        topic=TOPIC,
        due_ms=due,
        connections=2,
        window=4,
        payload=b"d" * PAYLOAD_BYTES,
    )
    gap_s = (first_due - now_ms()) / 1000
    print(
        f"published {total} in {publish_s:.2f} s ({total / publish_s:.0f} msgs/s); "
        f"first due in {gap_s:.2f} s"
    )
    if gap_s < args.gap_s:
        print(f"warning: only {gap_s:.2f} s between publishing and the first due time")
    spy = None
    if args.profile:
        spy = start_py_spy(
            server.pid, max(1.0, (first_due - now_ms()) / 1000 + args.spread_s + 1), "dispatch"
        )
    result = await _consume(
        server.client_address,
        total,
        args.consumers,
        args.prefetch,
        first_due + spread + args.timeout_s * 1000,
    )
    if spy is not None:
        await trio.to_thread.run_sync(spy.wait, 120)
    result["delivery_msgs_per_s"] = round(
        result["received"] / max(0.001, (result.pop("last_receive_ms") - first_due) / 1000), 1
    )
    result.update(
        {
            "messages": total,
            "spread_s": args.spread_s,
            "consumers": args.consumers,
            "prefetch": args.prefetch,
            "publish_s": round(publish_s, 3),
            "publish_msgs_per_s": round(total / publish_s, 1),
            "gap_after_publish_s": round(gap_s, 3),
        }
    )
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the figures, save and compare; return the results."""
    parser = argparse.ArgumentParser(prog="python -m bench.lateness")
    add_common_args(parser)
    parser.add_argument("--messages", type=int, default=None, help="default 100000 (quick 20000)")
    parser.add_argument("--spread-s", type=float, default=10.0, help="due times spread over")
    parser.add_argument(
        "--lead-s", type=float, default=None, help="first due time after publish start"
    )
    parser.add_argument("--gap-s", type=float, default=3.0, help="wanted gap after publishing")
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--prefetch", type=int, default=1000)
    parser.add_argument(
        "--profile", action="store_true", help="py-spy record the server while it dispatches"
    )
    parser.add_argument("--timeout-s", type=float, default=30.0, help="wait after the last due")
    args = parser.parse_args(argv)
    if args.messages is None:
        args.messages = 20_000 if args.quick else 100_000
    if args.lead_s is None:
        args.lead_s = 5.0 if args.quick else 8.0
    with Server() as server:
        server.start()
        started = time.monotonic()
        result = trio.run(_run, args, server)
        result["wall_s"] = round(time.monotonic() - started, 1)
    c, s = result["consumer"], result["server"]
    print(
        f"received {result['received']}/{result['messages']} (duplicates "
        f"{result['duplicates']}), {result['delivery_msgs_per_s']:.0f} msgs/s from first due"
    )
    print(
        f"{'lateness ms':<12} {'p50':>7} {'p90':>7} {'p99':>7} {'p99.9':>7} {'max':>8} {'early':>6}"
    )
    for label, st in (("consumer", c), ("server", s)):
        print(
            f"{label:<12} {st['p50_ms']:>7.2f} {st['p90_ms']:>7.2f} {st['p99_ms']:>7.2f} "
            f"{st['p999_ms']:>7.2f} {st['max_ms']:>8.2f} {st['early']:>6}"
        )
    result["target_p99_ms"] = TARGET_P99_MS
    result["meets_target"] = (
        c["p99_ms"] < TARGET_P99_MS and s["early"] == 0 and result["received"] == result["messages"]
    )
    print(
        f"consumer p99 {c['p99_ms']:.2f} ms (target < {TARGET_P99_MS}), server early "
        f"{s['early']} (must be 0): {'MET' if result['meets_target'] else 'NOT MET'}"
    )
    finish(NAME, result, args, argv)
    return result


if __name__ == "__main__":
    main()
