"""One node with 1 shard against one node with 2 shards: publish throughput, batch 100.

Rounds alternate the two set-ups (1, 2, 1, 2, ...) so both see the same machine load.
Each round starts a fresh node (``--shards 1`` or ``--shards 2``), opens the same
number of raw connections in total (with 2 shards, half to each shard, each sending
a topic its shard owns), sends pre-encoded PUBLISH frames at ack level quorum
(100-byte payloads, delay 1 h so nothing is dispatched) with a window of requests in
flight per connection, and counts acknowledged messages over a fixed window (the load
generator of ``bench.publish_throughput``, as ``bench.side_by_side`` uses it). Server
CPU is the supervisor's and every shard's together.

``--cluster`` runs the same load against two local 3-node clusters instead
(``bench._cluster.LocalCluster``, peers authenticated with a cluster secret as in
``make cluster``), alternating: today's single-group cluster (``--shards 1``, every
connection to its leader) and 3 nodes x ``--shards N`` (default 2) once the shards'
leaders are balanced over the nodes (docs/sharding.md, "Leader balancing"), the
connections spread over the shards' leaders.

Every round also reports CPU seconds per acknowledged message of each kind of
process (from /proc): ``leader`` (the shard processes leading their group, summed),
``follower`` (per follower replica: the follower shard processes' CPU over the
messages times the followers per group), ``supervisor`` and ``client`` (this load
generator's own process). ``bench.shards_model`` turns them into the throughput
model of docs/benchmarks.md ("Shards").

Usage::

    python -m bench.shards [--rounds 3] [--seconds 5] [--connections 4] [--batch 100]
        [--cluster] [--shards 2] [--profile] [--no-fsync] [--json PATH]

Prints one line per round and the ratio of the medians (N shards / 1 shard).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import trio

from bench import publish_throughput
from bench._cluster import LocalCluster, free_port_run
from bench._common import Server, add_load_args, fsync_env, leader_moved, start_py_spy
from futureq.shards.balance import preferred_leader
from futureq.shards.slots import even_ranges, topic_slot

T = TypeVar("T")

STRIDE = 1
BALANCE_TIMEOUT_S = 90.0
ATTEMPTS = 3
"""Load windows tried on one cluster when a leader moves during one (a loaded machine)."""


def _load(
    server: Server,
    addresses: list[str],
    topics: list[str],
    batch: int,
    connections: int,
    seconds: float,
    processes: dict[str, int],
) -> dict[str, Any]:
    """``publish_throughput._load`` from ``connections`` raw connections (connection
    ``i`` to ``addresses[i % len]`` with ``topics[i % len]``) after 1 s of warm-up:
    acknowledged msgs/s and the CPU seconds of every process of ``processes`` and of
    this one over the window (``server``: whose ``/metrics`` it scrapes)."""
    targets = list(zip(addresses, topics, strict=True))
    found = trio.run(
        publish_throughput._load, server, batch, connections, 1.0, seconds, None, targets, processes
    )
    return {
        "msgs_per_s": found["msgs_per_s"],
        "acked": found["messages"],
        "elapsed_s": found["seconds"],
        "server_cpu_percent": found["server_cpu_percent"],
        "client_cpu_percent": found["loadgen_cpu_percent"],
        "process_cpu_s": found["process_cpu_s"],
        "client_cpu_s": found["loadgen_cpu_s"],
        "loadavg_1m": found["loadavg_1m"],
    }


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (every thread's): a node's shard processes."""
    children: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as found:
                children += [int(c) for c in found.read().split()]
        except OSError:
            continue  # that thread ended meanwhile
    return children


def _shard_index(pid: int) -> int:
    """The ``--shard-index`` of a shard process (from its command line)."""
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        args = cmdline.read().decode().split("\0")
    return int(args[args.index("--shard-index") + 1])


def node_processes(pid: int, shards: int) -> dict[str, int]:
    """``{"supervisor": pid, "shard0": ..., ...}``, or ``{"shard0": pid}`` unsharded."""
    if shards == 1:
        return {"shard0": pid}
    found = {f"shard{_shard_index(child)}": child for child in _children(pid)}
    if len(found) != shards:
        raise RuntimeError(f"node {pid} has shard processes {found}, expected {shards}")
    return {"supervisor": pid, **found}


def spread_topics(shards: int) -> list[str]:
    """One topic per shard of a ``--shards N`` node (the even slot map every node starts
    with): the first ``bench.<i>`` each shard owns, in shard order."""
    ranges = even_ranges(shards)
    found: dict[int, str] = {}
    for i in range(100_000):
        topic = f"bench.{i}"
        slot = topic_slot(topic)
        found.setdefault(next(k for start, end, k in ranges if start <= slot < end), topic)
        if len(found) == shards:
            return [found[k] for k in range(shards)]
    raise RuntimeError(f"no topic found for every one of {shards} shards")


def _per_message(result: dict[str, Any], roles: dict[str, str], followers: int) -> None:
    """Add ``us_per_msg``: CPU microseconds per acknowledged message by role (``leader``,
    ``follower`` per replica, ``supervisor``, ``client``) to ``result``."""
    acked = max(1, result["acked"])
    by_role: dict[str, float] = {}
    for name, seconds in result["process_cpu_s"].items():
        by_role[roles[name]] = by_role.get(roles[name], 0.0) + seconds
    us = {role: total / acked * 1e6 for role, total in by_role.items()}
    if "follower" in us and followers:
        us["follower"] /= followers
    us["client"] = result["client_cpu_s"] / acked * 1e6
    result["us_per_msg"] = {role: round(v, 2) for role, v in sorted(us.items())}


@contextmanager
def sharded_node(shards: int, fsync: bool = True) -> Iterator[tuple[Server, list[str]]]:
    """A fresh started node of ``shards`` shards (shard ``K``'s ports ``K`` above the
    node's, below the ephemeral range) and its shards' client addresses, in shard order;
    stopped by PID and its directory removed on exit."""
    taken: set[int] = set()
    client, http = free_port_run(shards, taken), free_port_run(shards, taken)
    args = ["--listen", f"127.0.0.1:{client}", "--http", f"127.0.0.1:{http}"]
    args += ["--shards", str(shards)]
    env = {"FUTUREQ_NODE_SHARD_PORT_STRIDE": str(STRIDE), **fsync_env(fsync)}
    with Server(extra_args=args, env=env) as server:
        server.start()
        yield server, [f"127.0.0.1:{client + k * STRIDE}" for k in range(shards)]


def run_round(
    shards: int,
    batch: int,
    connections: int,
    seconds: float,
    profile: bool = False,
    fsync: bool = True,
) -> dict[str, Any]:
    """One fresh node of ``shards`` shards under load; its msgs/s and CPU. ``profile``:
    py-spy records shard 0 (``bench/results/profile_shards_<N>_shard0.txt``)."""
    with sharded_node(shards, fsync) as (server, addresses):
        topics = spread_topics(shards)
        processes = node_processes(server.pid, shards)
        spy = (
            start_py_spy(processes["shard0"], seconds + 1.0, f"shards_{shards}_shard0")
            if profile
            else None
        )
        result = _load(server, addresses, topics, batch, connections, seconds, processes)
        if spy is not None:
            spy.wait(60)
    roles = {name: ("supervisor" if name == "supervisor" else "leader") for name in processes}
    _per_message(result, roles, 0)
    return {"shards": shards, **result}


def _shard_status(cluster: LocalCluster, node_id: int, shard: int) -> dict[str, Any] | None:
    """Shard ``shard`` of node ``node_id``'s own ``/api/status`` (None if no answer)."""
    node = cluster.nodes[node_id]
    host, port = node.http_address.rsplit(":", 1)
    address = f"{host}:{int(port) + shard * cluster.port_stride}"
    try:
        with urllib.request.urlopen(f"http://{address}/api/status?local=true", timeout=2) as got:
            loaded: dict[str, Any] = json.loads(got.read())
    except (OSError, ValueError):
        return None
    return loaded


def _shard_leaders(cluster: LocalCluster, shards: int) -> dict[int, int]:
    """``{shard: node id}`` of the shards whose leader says so and is ready."""
    leaders: dict[int, int] = {}
    for shard in range(shards):
        for node_id in cluster.nodes:
            status = _shard_status(cluster, node_id, shard)
            if status is not None and status.get("role") == "leader":
                leaders[shard] = node_id
    return leaders


def wait_balanced(
    cluster: LocalCluster, shards: int, timeout_s: float
) -> tuple[dict[int, int], float]:
    """Wait until every shard is led by its preferred voter (``balance.preferred_leader``:
    where the balancer keeps it, so no transfer happens under load; with one shard, any
    leader); return ``{shard: leader node id}`` and the seconds waited.

    Raises:
        TimeoutError: not balanced within ``timeout_s``.
    """
    started = time.monotonic()
    voters = frozenset(cluster.nodes)
    leaders: dict[int, int] = {}
    while time.monotonic() - started < timeout_s:
        leaders = _shard_leaders(cluster, shards)
        if len(leaders) == shards and (
            shards == 1 or all(leaders[k] == preferred_leader(voters, k) for k in range(shards))
        ):
            return leaders, time.monotonic() - started
        time.sleep(0.25)
    raise TimeoutError(f"shard leaders not balanced within {timeout_s} s: {leaders}")


def cluster_targets(
    cluster: LocalCluster, shards: int, leaders: dict[int, int]
) -> tuple[list[str], dict[str, int], dict[str, str]]:
    """Each shard leader's client address, every shard process by name, their roles."""
    stride = cluster.port_stride
    addresses = []
    for shard in range(shards):
        host, port = cluster.nodes[leaders[shard]].client_address.rsplit(":", 1)
        addresses.append(f"{host}:{int(port) + shard * stride}")
    processes: dict[str, int] = {}
    roles: dict[str, str] = {}
    for node_id, node in cluster.nodes.items():
        for name, pid in node_processes(node.pid, shards).items():
            key = f"n{node_id}.{name}"
            processes[key] = pid
            if name == "supervisor":
                roles[key] = "supervisor"
            else:
                led = leaders[int(name.removeprefix("shard"))] == node_id
                roles[key] = "leader" if led else "follower"
    return addresses, processes, roles


def when_balanced(
    cluster: LocalCluster,
    shards: int,
    load: Callable[[dict[int, int], list[str], dict[str, int]], T],
) -> tuple[T, dict[str, Any]]:
    """Wait for the shards' leaders to be balanced (:func:`wait_balanced`), then run
    ``load(leaders, leader_addresses, processes)`` (as :func:`cluster_targets` gives
    them); when a leader moves during it (:class:`~bench._common.LeaderMoved`, a loaded
    machine), wait again and run it again, up to ``ATTEMPTS`` times.

    Returns:
        ``load``'s result and ``{"leaders": {shard: node id}, "roles": {process: role},
        "leaders_changed": bool (after the load), "balance_wait_s",
        "windows_voided_by_leader_moves": [sentence, ...]}``.
    """
    waited = 0.0
    moved: list[str] = []
    for attempt in range(ATTEMPTS):
        leaders, balance_s = wait_balanced(cluster, shards, BALANCE_TIMEOUT_S)
        waited += balance_s
        addresses, processes, roles = cluster_targets(cluster, shards, leaders)
        try:
            result = load(leaders, addresses, processes)
        except BaseException as exc:  # noqa: BLE001 - a trio nursery wraps it
            found = leader_moved(exc)
            if found is None or attempt == ATTEMPTS - 1:
                raise
            moved.append(str(found))
            print(f"  (a leader moved during the window: {found}; measuring again)")
            continue
        break
    return result, {
        "leaders": leaders,
        "roles": roles,
        "leaders_changed": _shard_leaders(cluster, shards) != leaders,
        "balance_wait_s": round(waited, 1),
        "windows_voided_by_leader_moves": moved,
    }


def run_cluster_round(
    shards: int, batch: int, connections: int, seconds: float, fsync: bool = True
) -> dict[str, Any]:
    """A fresh local 3-node cluster of ``shards`` shards per node under load, once its
    leaders are balanced; msgs/s, CPU per process and per message by role."""
    topics = spread_topics(shards)
    with LocalCluster(3, env=fsync_env(fsync), shards=shards) as cluster:
        cluster.start()
        result, how = when_balanced(
            cluster,
            shards,
            lambda leaders, addresses, processes: _load(
                cluster.nodes[leaders[0]], addresses, topics, batch, connections, seconds, processes
            ),
        )
    _per_message(result, how["roles"], len(cluster.nodes) - 1)
    return {
        "nodes": 3,
        "shards": shards,
        "leaders": {str(k): v for k, v in how["leaders"].items()},
        "leaders_changed": how["leaders_changed"],
        "balance_wait_s": how["balance_wait_s"],
        "windows_voided_by_leader_moves": how["windows_voided_by_leader_moves"],
        **result,
    }


def _line(result: dict[str, Any]) -> str:
    where = f"{result.get('nodes', 1)}n x {result['shards']}s"
    us = " ".join(f"{k}={v}" for k, v in result["us_per_msg"].items())
    extra = " LEADERS CHANGED" if result.get("leaders_changed") else ""
    return (
        f"{where:<8} {result['msgs_per_s']:>10.0f} msgs/s  server {result['server_cpu_percent']:>5.0f}%"
        f"  client {result['client_cpu_percent']:>4.0f}%  load {result['loadavg_1m']:>5.2f}"
        f"  us/msg: {us}{extra}"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the interleaved rounds; print and return the figures."""
    parser = argparse.ArgumentParser(prog="python -m bench.shards")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--shards", type=int, default=2, help="shards of the sharded set-up")
    parser.add_argument(
        "--cluster", action="store_true", help="3-node clusters instead of single nodes"
    )
    add_load_args(parser, "py-spy shard 0 in the last round (single node)")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)
    rounds: list[dict[str, Any]] = []
    setups = (1, args.shards)
    for number in range(args.rounds):
        for shards in setups:
            if args.cluster:
                result = run_cluster_round(
                    shards, args.batch, args.connections, args.seconds, not args.no_fsync
                )
            else:
                last = args.profile and number == args.rounds - 1
                result = run_round(
                    shards, args.batch, args.connections, args.seconds, last, not args.no_fsync
                )
            print(_line(result), flush=True)
            rounds.append(result)
    medians = {
        n: statistics.median(r["msgs_per_s"] for r in rounds if r["shards"] == n) for n in setups
    }
    ratio = round(medians[args.shards] / medians[1], 3)
    summary = {
        "cluster": args.cluster,
        "batch": args.batch,
        "connections": args.connections,
        "seconds": args.seconds,
        "fsync": not args.no_fsync,
        "median_msgs_per_s": medians,
        f"ratio_{args.shards}_over_1": ratio,
        "rounds": rounds,
    }
    print(
        f"median msgs/s: 1 shard {medians[1]:.0f}, {args.shards} shards "
        f"{medians[args.shards]:.0f}; ratio {ratio}"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(summary, out, indent=1)
    return summary


if __name__ == "__main__":
    main()
