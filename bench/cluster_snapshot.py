"""Snapshot install time for a follower N messages behind (default 1,000,000; quick
100,000).

Steps: start 3 nodes with ``FUTUREQ_CLUSTER_COMPACT_EVERY_ENTRIES`` = C (default
``min(1000, max(10, N / 1000 / 4))`` so the leader compacts several times while the
follower is away; the log keeps C/5 entries behind each snapshot) and ``--log-level
info``; create group ``g`` on topic ``snap`` (so every message is pending state that the
snapshot must carry); SIGTERM one follower; publish N messages (100-byte payloads, due in
1 h) to the leader in batches of 1000 at ack level quorum (2 connections x 4 requests in
flight); wait until the leader logs a snapshot taken at an index far enough past the
stopped follower's that the follower cannot catch up from the log, and close enough to
its applied index that no further compaction is due (a newer snapshot would replace the
install in progress); then restart the follower and time:

* spawn -> READY line, spawn -> ``/readyz`` 200;
* spawn -> caught up: its ``/api/status`` ``applied_index`` >= the leader's
  ``applied_index`` (nothing is published meanwhile, so that is the leader's commit);
* the follower's own log line "installed a snapshot from the leader at index I (B bytes)
  in X s" (X is the state restore only: checking the snapshot, rewriting the state
  families, rebuilding indexes), and the leader's "raft snapshot taken ..." sizes.

Usage::

    python -m bench.cluster_snapshot [--quick] [--compare] [--messages 1000000]
        [--compact-every C]
"""

from __future__ import annotations

import argparse
import re
import time
from typing import Any

import trio

from bench._cluster import ClusterNode, LocalCluster
from bench._common import (
    PAYLOAD_BYTES,
    RawConnection,
    add_common_args,
    finish,
    publish_many,
)
from futureq.wire import frames

NAME = "cluster_snapshot"
TOPIC = "snap"
GROUP = "g"
BATCH = 1000
DELAY_MS = 3_600_000
COMPACTION_WAIT_S = 300.0
CATCH_UP_TIMEOUT_S = 600.0
_TAKEN = re.compile(r"raft snapshot taken at index (\d+) \((\d+) bytes\)")


async def _publish(address: str, total: int) -> float:
    """Publish ``total`` messages due in an hour (batches of BATCH, quorum); return seconds."""
    due_ms = int(time.time() * 1000) + DELAY_MS
    return await publish_many(
        address,
        total,
        batch=BATCH,
        topic=TOPIC,
        due_ms=lambda _index: due_ms,
        connections=2,
        window=4,
        payload=b"s" * PAYLOAD_BYTES,
    )


async def _create_group(address: str) -> None:
    conn = await RawConnection.open(address, "snapshot-admin")
    answer = await conn.request([frames.FrameType.GROUP_CREATE, 2, TOPIC, GROUP, None, None])
    await conn.aclose()
    if answer[0] != frames.FrameType.OK:
        raise RuntimeError(f"GROUP_CREATE refused: {answer}")


def _snapshots_taken(node: ClusterNode) -> list[tuple[int, int]]:
    text = node.stderr_path.read_text() if node.stderr_path.exists() else ""
    return [(int(m[1]), int(m[2])) for m in _TAKEN.finditer(text)]


def run(messages: int, compact_every: int) -> dict[str, Any]:
    """The whole scenario on a fresh cluster; the figures."""
    keep = max(1, compact_every // 5)
    env = {"FUTUREQ_CLUSTER_COMPACT_EVERY_ENTRIES": str(compact_every)}
    with LocalCluster(3, env=env, log_level="info") as cluster:
        cluster.start()
        leader = cluster.leader()
        trio.run(_create_group, leader.client_address)
        follower = next(n for n in cluster.nodes.values() if n.node_id != leader.node_id)
        cluster.wait_caught_up(follower)
        behind_from = int((follower.status() or {})["applied_index"])
        follower.terminate()
        publish_s = trio.run(_publish, leader.client_address, messages)
        print(
            f"published {messages:,} in {publish_s:.1f} s ({messages / publish_s:,.0f} msgs/s) "
            f"with follower {follower.node_id} stopped at index {behind_from}",
            flush=True,
        )
        leader_applied = int((leader.status() or {})["applied_index"])
        waited = time.monotonic()
        deadline = waited + COMPACTION_WAIT_S
        while True:
            taken = _snapshots_taken(leader)
            # Past the follower's reach from the log, and no further compaction due
            # (else the install in progress would be replaced by a newer snapshot).
            if (
                taken
                and taken[-1][0] > behind_from + keep + 1
                and leader_applied - taken[-1][0] < compact_every
            ):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the leader took no snapshot past {behind_from + keep + 1}")
            time.sleep(0.1)
        compaction_wait_s = time.monotonic() - waited
        log_offset = follower.stderr_path.stat().st_size
        leader_applied = int((leader.status() or {})["applied_index"])

        follower.spawn()
        spawned = follower.started_s
        ready_line_s = follower.wait_ready_line()
        readyz_s: float | None = None
        caught_up_s: float | None = None
        deadline = spawned + CATCH_UP_TIMEOUT_S
        while time.monotonic() < deadline and caught_up_s is None:
            status = follower.status()
            now = time.monotonic() - spawned
            if readyz_s is None and follower.ready():
                readyz_s = now
            if status is not None and status.get("applied_index", -1) >= leader_applied:
                caught_up_s = now
            else:
                time.sleep(0.02)
        if caught_up_s is None:
            raise TimeoutError(f"follower did not catch up within {CATCH_UP_TIMEOUT_S} s")
        if readyz_s is None:
            readyz_s = time.monotonic() - spawned if follower.ready() else None
        text = follower.stderr_path.read_text()[log_offset:]
        installs = [
            {"index": int(m[1]), "bytes": int(m[2]), "restore_s": float(m[3])}
            for m in re.finditer(
                r"installed a snapshot from the leader at index (\d+) \((\d+) bytes\) in "
                r"([0-9.]+) s",
                text,
            )
        ]
        pending_on_follower = next(
            (
                g["pending"]
                for t in (follower.status() or {}).get("topics", [])
                if t["topic"] == TOPIC
                for g in t["groups"]
                if g["group"] == GROUP
            ),
            None,
        )
        taken = _snapshots_taken(leader)
        return {
            "messages": messages,
            "batch": BATCH,
            "compact_every_entries": compact_every,
            "keep_entries_after_compaction": keep,
            "publish_s": round(publish_s, 2),
            "publish_msgs_per_s": round(messages / publish_s, 1),
            "follower_stopped_at_index": behind_from,
            "leader_applied_index": leader_applied,
            "compaction_wait_s": round(compaction_wait_s, 2),
            "leader_snapshots_taken": len(taken),
            "leader_last_snapshot_index": taken[-1][0],
            "leader_last_snapshot_bytes": taken[-1][1],
            "spawn_to_ready_line_s": round(ready_line_s, 3),
            "spawn_to_readyz_s": None if readyz_s is None else round(readyz_s, 3),
            "spawn_to_caught_up_s": round(caught_up_s, 3),
            "installs": installs,
            "installed_bytes": installs[-1]["bytes"] if installs else None,
            "installed_restore_s": installs[-1]["restore_s"] if installs else None,
            "follower_pending": pending_on_follower,
            "follower_data_dir_mb": round(follower.data_bytes() / 1e6, 1),
        }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the figures, save and compare; return the results."""
    parser = argparse.ArgumentParser(prog="python -m bench.cluster_snapshot")
    add_common_args(parser)
    parser.add_argument("--messages", type=int, default=None, help="default 1000000 (quick 100000)")
    parser.add_argument(
        "--compact-every", type=int, default=None, help="FUTUREQ_CLUSTER_COMPACT_EVERY_ENTRIES"
    )
    args = parser.parse_args(argv)
    messages = (
        args.messages if args.messages is not None else (100_000 if args.quick else 1_000_000)
    )
    compact = args.compact_every or min(1000, max(10, messages // BATCH // 4))
    result = run(messages, compact)
    installs = result["installs"]
    print(
        f"follower {messages:,} messages behind: spawn -> READY {result['spawn_to_ready_line_s']:.2f} s, "
        f"-> /readyz {result['spawn_to_readyz_s']} s, -> caught up "
        f"{result['spawn_to_caught_up_s']:.2f} s; pending on it {result['follower_pending']}"
    )
    if installs:
        last = installs[-1]
        print(
            f"installed {len(installs)} snapshot(s); last at index {last['index']}: "
            f"{last['bytes']:,} bytes ({last['bytes'] / 1e6:.1f} MB), restore {last['restore_s']:.2f} s"
        )
    else:
        print("no snapshot installed (the follower caught up from the log)")
    finish(NAME, result, args, argv)
    return result


if __name__ == "__main__":
    main()
