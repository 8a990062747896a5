"""Failover: SIGKILL the leader of a 3-node cluster under publish load; time until
publishes succeed again, and check that no acknowledged publish was lost.

One cluster (default timeouts: tick 50 ms, election timeout 10 ticks, randomised in
[0.5, 1.0) s) serves every trial. Each trial:

1. find the ready leader; create group ``g`` on a fresh topic ``failover-<trial>``;
2. start ``--publishers`` closed-loop publishers (one request in flight each, batches of
   ``--batch`` 100-byte messages, ack level quorum, delay 1 h so nothing is delivered).
   A publisher that gets NOT_LEADER follows the leader address in the answer (or tries
   the next node when there is none); one whose connection fails or whose request times
   out tries the next node; it waits ``RETRY_S`` before each retry;
3. after ``--load-s`` seconds, SIGKILL the leader (by PID);
4. **failover time** = from just before the SIGKILL to the first PUBLISH_OK received
   from any other node; the load goes on ``AFTER_S`` more, then every publisher finishes
   its request in flight and stops;
5. check: on the new leader, a quorum publish to another topic is acknowledged (so the
   leader has committed and applied everything before it), then STATUS gives ``pending``
   of (``failover-<trial>``, ``g``). With ``acked`` = messages in PUBLISH_OK answers and
   ``unknown`` = messages of requests that got no PUBLISH_OK (error, timeout or broken
   connection: they may or may not have been committed), a trial is consistent when
   ``acked <= pending <= acked + unknown``; **lost** = ``max(0, acked - pending)``.
   Nothing else publishes to the topic, and nothing is delivered (no subscriber, due in
   1 h), so pending counts exactly the committed publishes;
6. restart the killed node on its directory and ports and wait until it is ready and has
   applied up to the leader's applied index.

Usage::

    python -m bench.cluster_failover [--quick] [--compare] [--trials 20] [--publishers 4]
        [--batch 10] [--load-s 1.5]

Figures: failover time p50/p99/max over the trials (target p99 <= 1 s, issue 11), lost messages
(target 0), inconsistent trials, publish rate before the kill, restart catch-up time.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from typing import Any

import trio

from bench._cluster import ClusterNode, LocalCluster
from bench._common import (
    PAYLOAD_BYTES,
    RawConnection,
    add_common_args,
    finish,
    frame_bytes,
    median,
    percentile,
)
from futureq.errors import ErrorCode
from futureq.wire import frames

NAME = "cluster_failover"
TARGET_S = 1.0  # issue 11: SIGKILL of the leader -> next acknowledged publish, p99
RETRY_S = 0.02
CONNECT_TIMEOUT_S = 1.0
REQUEST_TIMEOUT_S = 5.0
AFTER_S = 0.5
RECOVERY_TIMEOUT_S = 30.0
DELAY_MS = 3_600_000
GROUP = "g"


class Load:
    """Counters shared by the publishers of one trial."""

    def __init__(self) -> None:
        self.acked = 0
        self.unknown = 0
        self.not_leader = 0
        self.retries = 0
        self.stop = False
        self.killed_at: float | None = None
        self.killed_address = ""
        self.first_success_after_kill: float | None = None
        self.recovered = trio.Event()
        self.measure_from = 0.0
        self.measured_acked = 0


async def _publisher(load: Load, addresses: list[str], start: str, topic: str, batch: int) -> None:
    items = [[topic, b"f" * PAYLOAD_BYTES, DELAY_MS, None, None]] * batch
    target = start
    conn: RawConnection | None = None

    def rotate(current: str) -> str:
        return (
            addresses[(addresses.index(current) + 1) % len(addresses)]
            if current in addresses
            else addresses[0]
        )

    while not load.stop:
        if conn is None:
            try:
                with trio.fail_after(CONNECT_TIMEOUT_S):
                    conn = await RawConnection.open(target, "failover")
            except (OSError, trio.TooSlowError, RuntimeError, ConnectionError):
                load.retries += 1
                target = rotate(target)
                await trio.sleep(RETRY_S)
                continue
        rid = conn.next_id()
        answer: list[Any] | None = None
        try:
            with trio.fail_after(REQUEST_TIMEOUT_S):
                await conn.send(
                    frame_bytes([frames.FrameType.PUBLISH, rid, frames.AckLevel.QUORUM, items])
                )
                answer = await conn.receive()
        except (OSError, trio.TooSlowError, ConnectionError, trio.BrokenResourceError):
            answer = None
        if answer is not None and answer[0] == frames.FrameType.PUBLISH_OK:
            now = time.monotonic()
            load.acked += answer[3]
            if now >= load.measure_from:
                load.measured_acked += answer[3]
            if (
                load.killed_at is not None
                and target != load.killed_address
                and load.first_success_after_kill is None
            ):
                load.first_success_after_kill = now
                load.recovered.set()
            continue
        load.unknown += batch
        load.retries += 1
        if answer is not None and answer[0] == frames.FrameType.ERROR:
            if answer[2] == ErrorCode.NOT_LEADER:
                load.not_leader += 1
            hint = answer[5] if len(answer) > 5 else None
            target = hint if hint and hint != target else rotate(target)
        else:
            target = rotate(target)
        try:
            await conn.aclose()
        except (OSError, trio.BrokenResourceError):
            pass
        conn = None
        await trio.sleep(RETRY_S)
    if conn is not None:
        await conn.aclose()


async def _request(address: str, value: list[Any]) -> list[Any]:
    conn = await RawConnection.open(address, "failover-admin")
    try:
        with trio.fail_after(REQUEST_TIMEOUT_S):
            return await conn.request(value)
    finally:
        await conn.aclose()


async def _trial(
    cluster: LocalCluster, leader: ClusterNode, topic: str, args: argparse.Namespace
) -> dict[str, Any]:
    answer = await _request(
        leader.client_address, [frames.FrameType.GROUP_CREATE, 2, topic, GROUP, None, None]
    )
    if answer[0] != frames.FrameType.OK:
        raise RuntimeError(f"GROUP_CREATE refused: {answer}")
    load = Load()
    addresses = cluster.addresses
    async with trio.open_nursery() as nursery:
        load.measure_from = time.monotonic() + 0.5
        for _ in range(args.publishers):
            nursery.start_soon(
                _publisher, load, addresses, leader.client_address, topic, args.batch
            )
        await trio.sleep(args.load_s)
        rate = load.measured_acked / max(1e-9, time.monotonic() - load.measure_from)
        load.killed_address = leader.client_address
        load.killed_at = time.monotonic()
        os.kill(leader.pid, signal.SIGKILL)
        with trio.move_on_after(RECOVERY_TIMEOUT_S):
            await load.recovered.wait()
        await trio.sleep(AFTER_S)
        load.stop = True
    await trio.to_thread.run_sync(leader.kill)  # reap it
    new_leader = await trio.to_thread.run_sync(
        lambda: cluster.leader(RECOVERY_TIMEOUT_S, exclude={leader.node_id})
    )
    barrier = [
        frames.FrameType.PUBLISH,
        3,
        frames.AckLevel.QUORUM,
        [["failover-barrier", b"b", DELAY_MS, None, None]],
    ]
    answer = await _request(new_leader.client_address, barrier)
    if answer[0] != frames.FrameType.PUBLISH_OK:
        raise RuntimeError(f"barrier publish refused: {answer}")
    status = (await _request(new_leader.client_address, [frames.FrameType.STATUS, 4]))[2]
    pending = next(
        g["pending"]
        for t in status["topics"]
        if t["topic"] == topic
        for g in t["groups"]
        if g["group"] == GROUP
    )
    failover_s = (
        None
        if load.first_success_after_kill is None
        else load.first_success_after_kill - load.killed_at
    )
    return {
        "killed_node": leader.node_id,
        "new_leader": new_leader.node_id,
        "failover_s": None if failover_s is None else round(failover_s, 3),
        "rate_before_kill_msgs_per_s": round(rate, 1),
        "acked": load.acked,
        "unknown": load.unknown,
        "pending": pending,
        "lost": max(0, load.acked - pending),
        "consistent": load.acked <= pending <= load.acked + load.unknown,
        "not_leader_answers": load.not_leader,
        "retries": load.retries,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the figures, save and compare; return the results."""
    parser = argparse.ArgumentParser(prog="python -m bench.cluster_failover")
    add_common_args(parser)
    parser.add_argument("--trials", type=int, default=None, help="default 20 (quick 5)")
    parser.add_argument("--publishers", type=int, default=4, help="closed-loop publishers")
    parser.add_argument("--batch", type=int, default=10, help="messages per PUBLISH")
    parser.add_argument("--load-s", type=float, default=1.5, help="load before the SIGKILL")
    args = parser.parse_args(argv)
    trials = args.trials if args.trials is not None else (5 if args.quick else 20)
    rows: list[dict[str, Any]] = []
    print(
        f"{'trial':>5} {'killed':>6} {'new':>4} {'failover s':>10} {'msgs/s before':>13} "
        f"{'acked':>7} {'pending':>7} {'unknown':>7} {'lost':>5} {'catch-up s':>10}"
    )
    started = time.monotonic()
    with LocalCluster(3) as cluster:
        cluster.start()
        for trial in range(trials):
            leader = cluster.leader()
            row = trio.run(_trial, cluster, leader, f"failover-{trial}", args)
            restart_started = time.monotonic()
            leader.spawn()
            leader.wait_ready_line()
            cluster.wait_caught_up(leader)
            row["restart_catch_up_s"] = round(time.monotonic() - restart_started, 3)
            rows.append(row)
            fo = row["failover_s"]
            print(
                f"{trial:>5} {row['killed_node']:>6} {row['new_leader']:>4} "
                f"{fo if fo is not None else float('nan'):>10.3f} "
                f"{row['rate_before_kill_msgs_per_s']:>13.0f} {row['acked']:>7} "
                f"{row['pending']:>7} {row['unknown']:>7} {row['lost']:>5} "
                f"{row['restart_catch_up_s']:>10.2f}",
                flush=True,
            )
    times = sorted(r["failover_s"] for r in rows if r["failover_s"] is not None)
    lost = sum(r["lost"] for r in rows)
    results: dict[str, Any] = {
        "trials": trials,
        "publishers": args.publishers,
        "batch": args.batch,
        "failover_s_p50": round(percentile(times, 50), 3),
        "failover_s_p99": round(percentile(times, 99), 3),
        "failover_s_max": round(times[-1], 3) if times else None,
        "failover_s_min": round(times[0], 3) if times else None,
        "not_recovered": trials - len(times),
        "lost_messages": lost,
        "inconsistent_trials": sum(1 for r in rows if not r["consistent"]),
        "acked_total": sum(r["acked"] for r in rows),
        "rate_before_kill_msgs_per_s_median": round(
            median([r["rate_before_kill_msgs_per_s"] for r in rows]), 1
        ),
        "restart_catch_up_s_median": round(median([r["restart_catch_up_s"] for r in rows]), 3),
        "wall_s": round(time.monotonic() - started, 1),
        "target_s": TARGET_S,
        "per_trial": rows,
    }
    results["meets_target"] = (
        results["not_recovered"] == 0
        and results["failover_s_p99"] < TARGET_S
        and lost == 0
        and results["inconsistent_trials"] == 0
    )
    print(
        f"failover p50 {results['failover_s_p50']:.3f} s, p99 {results['failover_s_p99']:.3f} s, "
        f"max {results['failover_s_max']} s over {len(times)}/{trials} trials; lost {lost} of "
        f"{results['acked_total']} acked; inconsistent trials {results['inconsistent_trials']} "
        f"(target p99 < {TARGET_S} s, 0 lost): {'MET' if results['meets_target'] else 'NOT MET'}"
    )
    finish(NAME, results, args, argv)
    return results


if __name__ == "__main__":
    main()
