"""How publish throughput grows with shards and cores: a model from measured CPU costs.

Inputs are the JSON files of ``python -m bench.shards [--cluster] --json PATH``: every
round gives CPU microseconds per acknowledged message by role (``leader``: a shard
process leading its group; ``follower``: one follower replica; ``client``: the load
generator; the supervisor's is ~0). The model takes the medians over the rounds of
the sharded set-up. One Raft group has a ceiling of its own, ``T1 = busy / c_leader``:
a group's leader runs one serial loop (append, its own fsync awaited, replicate,
apply: ``docs/benchmarks.md``, "What bounds the cluster figures"), so it is on the CPU
only a fraction ``busy`` of the time even when a core is free: 0.98 for a single node
(issue 15: "98 % of one core"), 0.62 for the leader of a 3-node cluster (the leader's
CPU at batch 100 in "Cluster (3 nodes)"), both measured on a quiet machine and
overridable (``--busy-single``, ``--busy-cluster``); ``c_leader`` there is the
one-shard rounds' own.

* groups are independent: ``S`` groups pass at most ``S * T1``;
* a shard process is one Python thread: a group passes at most ``1 / c_leader``
  messages a second (``1 / c_follower`` on each follower);
* a machine of ``C`` cores passes at most ``C`` core-seconds a second, shared by the
  processes it runs (the load generator too, when it runs there);
* leaders are balanced: with ``S`` groups over ``N`` nodes a node leads at most
  ``ceil(S / N)`` groups and follows the others.

So, with ``R`` replicas (1 or 3) and the load spread evenly over the ``S`` groups::

    T(S) = min( S * T1,
                S / c_leader,  S / c_follower (R > 1),  1 / c_client,
                one machine:  C / (c_client + c_leader + (R - 1) c_follower)
                a machine per node:  C / ((L c_leader + (S - L) c_follower) / S),
                                     L = ceil(S / N), client elsewhere )

``c_route`` (the routing client's split, ``ShardedClient.publish_batch``) adds to
``c_client`` for a client that routes; the raw load generator of ``bench.shards``
sends each connection's batches straight to one shard, so it pays none.

Usage::

    python -m bench.shards_model SINGLE.json CLUSTER.json [--svg docs/img/shards_model.svg]

Prints the costs, the model's figures and the measured medians, and draws the plot of
``docs/benchmarks.md`` ("Shards") when matplotlib is installed (the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from typing import Any

MAX_SHARDS_PLOTTED = 8


def costs(run: dict[str, Any], shards: int) -> dict[str, float]:
    """Median CPU microseconds per message by role over the rounds of ``shards`` shards."""
    rounds = [r for r in run["rounds"] if r["shards"] == shards]
    roles = {role for r in rounds for role in r["us_per_msg"]}
    return {
        role: statistics.median(r["us_per_msg"][role] for r in rounds if role in r["us_per_msg"])
        for role in sorted(roles)
    }


def throughput(
    shards: int,
    *,
    cores: float,
    c: dict[str, float],
    group_max: float,
    nodes: int = 1,
    machines: int = 1,
    client_on_machine: bool = True,
    c_route: float = 0.0,
) -> float:
    """Model msgs/s (see the module doc).

    Args:
        shards: Raft groups (shards per node).
        cores: Cores of each machine.
        c: CPU microseconds per message: ``leader``, ``follower`` (per replica), ``client``.
        group_max: msgs/s one group passes at most (``T1``, measured).
        nodes: Replicas of each group (1 or 3), one node each.
        machines: 1 (every node on one machine) or ``nodes`` (one machine each).
        client_on_machine: The load generator runs on the (first) machine.
        c_route: Routing cost per message added to the client's.
    """
    us = 1e6
    leader, follower = c["leader"] / us, c.get("follower", 0.0) / us
    client = (c["client"] + c_route) / us
    limits = [shards * group_max, shards / leader, 1 / client]
    if nodes > 1:
        limits.append(shards / follower)
    here = client if client_on_machine else 0.0
    if machines == 1:
        limits.append(cores / (here + leader + (nodes - 1) * follower))
    else:
        led = math.ceil(shards / nodes)
        per_node = (led * leader + (shards - led) * follower) / shards
        limits.append(cores / (per_node + here))
    return min(limits)


def _medians(run: dict[str, Any]) -> dict[int, float]:
    return {int(k): float(v) for k, v in run["median_msgs_per_s"].items()}


def _cores_used(run: dict[str, Any], shards: int) -> float:
    """Median cores the set-up actually got (server + client CPU), of the machine's."""
    rounds = [r for r in run["rounds"] if r["shards"] == shards]
    return statistics.median(
        (r["server_cpu_percent"] + r["client_cpu_percent"]) / 100 for r in rounds
    )


BUSY_SINGLE = 0.98
BUSY_CLUSTER = 0.62


def model(
    single: dict[str, Any],
    cluster: dict[str, Any],
    busy_single: float = BUSY_SINGLE,
    busy_cluster: float = BUSY_CLUSTER,
) -> dict[str, Any]:
    """The costs, model lines (1 to 8 shards) and measured points of both runs."""
    c1 = costs(single, 2)
    c3 = costs(cluster, 2)
    g1 = busy_single / costs(single, 1)["leader"] * 1e6
    g3 = busy_cluster / costs(cluster, 1)["leader"] * 1e6
    xs = list(range(1, MAX_SHARDS_PLOTTED + 1))
    lines = {
        "1 node, 2 cores (client on it)": [throughput(s, cores=2, c=c1, group_max=g1) for s in xs],
        "1 node, 8 cores (client on it)": [throughput(s, cores=8, c=c1, group_max=g1) for s in xs],
        "3 nodes on one 2-core machine": [
            throughput(s, cores=2, c=c3, group_max=g3, nodes=3) for s in xs
        ],
        "3 machines x 2 cores (client elsewhere)": [
            throughput(s, cores=2, c=c3, group_max=g3, nodes=3, machines=3, client_on_machine=False)
            for s in xs
        ],
        "3 machines x 8 cores (client elsewhere)": [
            throughput(s, cores=8, c=c3, group_max=g3, nodes=3, machines=3, client_on_machine=False)
            for s in xs
        ],
    }
    return {
        "group_max_single": g1,
        "group_max_cluster": g3,
        "costs_single_node_us": c1,
        "costs_cluster_us": c3,
        "shards": xs,
        "lines": lines,
        "measured_single": _medians(single),
        "measured_cluster": _medians(cluster),
        "cores_used_single": {s: _cores_used(single, s) for s in (1, 2)},
        "cores_used_cluster": {s: _cores_used(cluster, s) for s in (1, 2)},
    }


def plot(result: dict[str, Any], path: str) -> None:
    """Draw the model lines and the measured points into ``path`` (SVG or PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text as text: a small, diffable file
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    xs = result["shards"]
    styles = ["-", "--", "-", "--", ":"]
    colors = ["tab:blue", "tab:blue", "tab:orange", "tab:orange", "tab:orange"]
    for (label, ys), style, color in zip(result["lines"].items(), styles, colors, strict=True):
        ax.plot(xs, [y / 1000 for y in ys], style, color=color, label=f"model: {label}")
    for key, color, label in (
        ("measured_single", "tab:blue", "measured: 1 node, this machine"),
        ("measured_cluster", "tab:orange", "measured: 3 nodes, this machine"),
    ):
        points = sorted(result[key].items())
        ax.plot(
            [s for s, _ in points],
            [v / 1000 for _, v in points],
            "o",
            color=color,
            markeredgecolor="black",
            label=label,
        )
    for key, used in (
        ("measured_single", "cores_used_single"),
        ("measured_cluster", "cores_used_cluster"),
    ):
        for shards, value in result[key].items():
            ax.annotate(
                f"{result[used][shards]:.2f} cores",
                (shards, value / 1000),
                textcoords="offset points",
                xytext=(6, -3),
                fontsize=6,
            )
    ax.set_xlabel("shards (Raft groups) per node")
    ax.set_ylabel("acknowledged msgs/s (thousands), batch 100, quorum")
    ax.set_xticks(xs)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None} if path.endswith(".svg") else None)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Print the model's figures; draw the plot with ``--svg``."""
    parser = argparse.ArgumentParser(prog="python -m bench.shards_model")
    parser.add_argument("single", help="JSON of python -m bench.shards --json")
    parser.add_argument("cluster", help="JSON of python -m bench.shards --cluster --json")
    parser.add_argument("--svg", default=None, help="write the plot here (.svg or .png)")
    parser.add_argument("--busy-single", type=float, default=BUSY_SINGLE)
    parser.add_argument("--busy-cluster", type=float, default=BUSY_CLUSTER)
    args = parser.parse_args(argv)
    with open(args.single) as f:
        single = json.load(f)
    with open(args.cluster) as f:
        cluster = json.load(f)
    result = model(single, cluster, args.busy_single, args.busy_cluster)
    print(
        f"one group's ceiling: single node {result['group_max_single']:.0f} msgs/s, "
        f"3-node cluster {result['group_max_cluster']:.0f} msgs/s"
    )
    print("CPU us per message (medians, sharded rounds):")
    print(f"  1 node x 2 shards:  {result['costs_single_node_us']}")
    print(f"  3 nodes x 2 shards: {result['costs_cluster_us']}")
    print(f"{'model (msgs/s)':<42}" + "".join(f"{s:>9}" for s in result["shards"]))
    for label, ys in result["lines"].items():
        print(f"{label:<42}" + "".join(f"{y:>9.0f}" for y in ys))
    for key in ("single", "cluster"):
        measured = result[f"measured_{key}"]
        used = result[f"cores_used_{key}"]
        print(
            f"measured {key}: "
            + ", ".join(
                f"{s} shard(s) {v:.0f} msgs/s on {used[s]:.2f} cores"
                for s, v in sorted(measured.items())
            )
        )
    if args.svg:
        plot(result, args.svg)
        print(f"plot: {args.svg}")
    return result


if __name__ == "__main__":
    main()
