"""3-node publish throughput at ack level quorum (batch 1, 100, 1000), and the ratio to
a single node measured in the same run at batch 100.

For each batch size a fresh 3-node cluster (``bench._cluster.LocalCluster``: three
``futureq start --peers ...`` processes on this machine) is started; the load generator
of :mod:`bench.publish_throughput` (pipelined pre-encoded PUBLISH frames, 100-byte
payloads, delay 1 h so nothing is dispatched, 4 connections) is pointed at the leader.
Quorum here means: answered once the batch is fsynced on a majority (the leader and at
least one follower) and applied on the leader. Then, sequentially (the cluster is
stopped first), a single node is measured at batch 100 with the same generator.

Usage::

    python -m bench.cluster_throughput [--quick] [--compare] [--batches 1,100,1000]
        [--seconds 5] [--connections 4] [--profile] [--no-single]
        [--peer-auth secret[,insecure]] [--no-fsync]

Figures per batch: msgs/s, requests/s, leader fsyncs/s and entries per fsync,
PUBLISH_OK latency p50/p99 (pipelined, so mostly queueing), CPU % of each node and of
the load generator; the ratio cluster/single at batch 100 (target >= 0.5).
``--peer-auth`` picks how peers authenticate (default ``secret``, as ``make cluster``);
with several modes each batch runs once per mode, back to back, and the ratio of each
mode to the first is printed (the cost of the per-frame MACs: ``secret,insecure``).
``--profile`` records the leader and one follower with py-spy at batch 100
(``bench/results/profile_cluster_{leader,follower}_batch100.txt``) and prints their top
functions.
"""

from __future__ import annotations

import argparse
from typing import Any

import trio

from bench import profile_stacks, publish_throughput
from bench._cluster import CpuMeter, LocalCluster
from bench._common import (
    RESULTS_DIR,
    add_common_args,
    add_load_args,
    finish,
    fsync_env,
    start_py_spy,
)

NAME = "cluster_throughput"
TARGET_RATIO = 0.5
PROFILE_LABEL = "cluster_leader_batch100"
FOLLOWER_PROFILE_LABEL = "cluster_follower_batch100"


def run_cluster_batch(
    batch: int,
    connections: int,
    warmup_s: float,
    seconds: float,
    profile: bool,
    peer_auth: str = "secret",
    fsync: bool = True,
) -> dict[str, Any]:
    """A fresh 3-node cluster, one batch size: the figures of ``publish_throughput._load``
    against the leader, plus every node's CPU over warm-up and measurement."""
    with LocalCluster(3, env=fsync_env(fsync), peer_auth=peer_auth) as cluster:
        cluster.start()
        leader = cluster.leader()
        meter = CpuMeter(
            {
                ("leader" if n.node_id == leader.node_id else f"follower{n.node_id}"): n.pid
                for n in cluster.nodes.values()
            }
        )
        follower = next(n for n in cluster.nodes.values() if n.node_id != leader.node_id)
        spies = (
            [
                start_py_spy(leader.pid, warmup_s + seconds, PROFILE_LABEL),
                start_py_spy(follower.pid, warmup_s + seconds, FOLLOWER_PROFILE_LABEL),
            ]
            if profile and batch == 100
            else []
        )
        meter.start()
        result = trio.run(
            publish_throughput._load, leader, batch, connections, warmup_s, seconds, None
        )
        result["node_cpu_percent"] = meter.stop()
        for spy in spies:
            if spy is not None:
                spy.wait(60)
        still_leader = cluster.leader(5.0)
        result["leader_changed"] = still_leader.node_id != leader.node_id
        result["leader_data_dir_mb"] = round(leader.data_bytes() / 1e6, 1)
    return result


def _row(label: str, row: dict[str, Any]) -> str:
    cpu = row.get("node_cpu_percent") or {"leader": row["server_cpu_percent"]}
    followers = "/".join(f"{v:.0f}" for k, v in sorted(cpu.items()) if k != "leader")
    return (
        f"{label:<9} {row['batch']:>6} {row['msgs_per_s']:>10.0f} {row['requests_per_s']:>9.0f} "
        f"{row['fsyncs_per_s']:>8.0f} {row['requests_per_fsync'] or 0:>9.1f} "
        f"{row['ack_latency_ms_p50']:>8.1f} {row['ack_latency_ms_p99']:>8.1f} "
        f"{cpu['leader']:>7.0f} {followers or '-':>9} {row['loadgen_cpu_percent']:>7.0f}"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the figures, save and compare; return the results."""
    parser = argparse.ArgumentParser(prog="python -m bench.cluster_throughput")
    add_common_args(parser)
    parser.add_argument("--batches", default="1,100,1000", help="comma-separated batch sizes")
    parser.add_argument("--seconds", type=float, default=None, help="measured window per batch")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring")
    add_load_args(parser, "py-spy record the leader at batch 100")
    parser.add_argument(
        "--no-single", action="store_true", help="skip the single-node run at batch 100"
    )
    parser.add_argument(
        "--peer-auth",
        default="secret",
        help="comma-separated peer authentication modes: secret, insecure",
    )
    args = parser.parse_args(argv)
    modes = args.peer_auth.split(",")
    seconds = args.seconds if args.seconds is not None else (2.0 if args.quick else 5.0)
    print(
        f"{'':<9} {'batch':>6} {'msgs/s':>10} {'req/s':>9} {'fsync/s':>8} {'ent/fsync':>9} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'lead%':>7} {'follow%':>9} {'gen%':>7}"
    )
    rows: dict[str, Any] = {}
    by_mode: dict[str, dict[str, Any]] = {mode: {} for mode in modes}
    for batch in [int(b) for b in args.batches.split(",")]:
        for mode in modes:
            row = run_cluster_batch(
                batch, args.connections, args.warmup, seconds, args.profile, mode, not args.no_fsync
            )
            row["peer_auth"] = mode
            by_mode[mode][str(batch)] = row
            if mode == modes[0]:
                rows[str(batch)] = row
            print(_row("3 nodes" if len(modes) == 1 else mode[:9], row), flush=True)
        for mode in modes[1:]:
            first = by_mode[modes[0]][str(batch)]["msgs_per_s"]
            print(
                f"batch {batch}: {modes[0]} / {mode} = "
                f"{first / by_mode[mode][str(batch)]['msgs_per_s']:.3f}",
                flush=True,
            )
    results: dict[str, Any] = {"by_batch": rows, "peer_auth": modes[0]}
    if len(modes) > 1:
        results["by_peer_auth"] = by_mode
    if not args.no_single:
        single = publish_throughput.run_batch(100, args.connections, args.warmup, seconds, False)
        results["single_node_batch_100"] = single
        print(_row("1 node", single), flush=True)
        if "100" in rows:
            ratio = rows["100"]["msgs_per_s"] / single["msgs_per_s"]
            results["ratio_batch_100"] = round(ratio, 3)
            results["target_ratio"] = TARGET_RATIO
            results["meets_target"] = ratio >= TARGET_RATIO
            print(
                f"batch 100: 3 nodes {rows['100']['msgs_per_s']:.0f} msgs/s vs 1 node "
                f"{single['msgs_per_s']:.0f} msgs/s = {ratio:.2f} "
                f"(target >= {TARGET_RATIO}): {'MET' if results['meets_target'] else 'NOT MET'}"
            )
    for label in (PROFILE_LABEL, FOLLOWER_PROFILE_LABEL):
        profile_path = RESULTS_DIR / f"profile_{label}.txt"
        if args.profile and profile_path.exists():
            print(f"--- {label}")
            print(profile_stacks.summarize(profile_path, 20, "_run_module_as_main"))
    finish(NAME, results, args, argv)
    return results


if __name__ == "__main__":
    main()
