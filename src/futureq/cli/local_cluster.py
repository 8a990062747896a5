"""``make cluster``: run a local cluster of 3 (or 5) ``futureq start`` processes.

Node ``n`` (1-based) listens for clients on ``7440 + 10 n``, for Raft on ``7441 + 10 n``
and for HTTP on ``7442 + 10 n`` (node 1: 7450, 7451, 7452; node 2: 7460, 7461, 7462...),
with its data in ``<data-dir>/node<n>`` (``--base-port`` moves every port). Every node
runs ``--shards`` shards (``make cluster SHARDS=N``), by default ``auto`` as
``futureq start``: the count recorded in the node's data directory, else one per usable
core for a new one (a directory made before sharding: 1); shard K of a node listens on
its ports plus ``100 K`` (``node.shard_port_stride``, docs/sharding.md). Peers
authenticate with a cluster secret kept in ``<data-dir>/cluster.secret`` (generated on
the first run, mode 0600).

Ctrl-C (or SIGTERM, or SIGHUP when the terminal closes) stops every node gracefully; a second one kills them. The nodes run
in a process group of their own, so the terminal's Ctrl-C reaches only this launcher,
which sends each node one SIGTERM (a node that got SIGINT from the terminal as well
would take the second signal for "stop now"). SIGINT or SIGHUP ignored when the
launcher starts (``make cluster &`` in a script, ``nohup``) stays ignored: SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from futureq import early_signals
from futureq.peer_credentials import generate_secret_file

BASE_PORT = 7440
SECRET_FILE = "cluster.secret"


def ports(node_id: int, base_port: int = BASE_PORT) -> tuple[int, int, int]:
    """``(client, raft, http)`` ports of node ``node_id``: ``base_port + 10 * node_id``
    and the two after it."""
    base = base_port + 10 * node_id
    return base, base + 1, base + 2


def ensure_secret(data_dir: str) -> str:
    """The path of the cluster's secret file in ``data_dir``, created if missing."""
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, SECRET_FILE)
    if not os.path.exists(path):
        generate_secret_file(path)
    return path


def node_command(
    node_id: int,
    nodes: int,
    data_dir: str,
    host: str,
    base_port: int = BASE_PORT,
    shards: str = "auto",
) -> list[str]:
    """The ``futureq start`` command line of one node of the local cluster; ``shards``
    is its ``--shards`` (a count, or ``auto``), always given: every node of a cluster
    must run the same count."""
    client, raft, http = ports(node_id, base_port)
    peers = ",".join(f"{n}={host}:{ports(n, base_port)[1]}" for n in range(1, nodes + 1))
    return [
        sys.executable, "-m", "futureq.cli.server_main", "start",
        "--node-id", str(node_id),
        "--data-dir", os.path.join(data_dir, f"node{node_id}"),
        "--listen", f"{host}:{client}",
        "--http", f"{host}:{http}",
        "--raft-listen", f"{host}:{raft}",
        "--peers", peers,
        "--cluster-secret-file", os.path.join(data_dir, SECRET_FILE),
        "--shards", shards,
    ]  # fmt: skip


def _shards(text: str) -> str:
    """``--shards``: ``auto`` or a whole number of at least 1, as ``futureq start`` takes it."""
    text = text.strip()
    if text != "auto" and not (text.isdigit() and int(text) >= 1):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of shards; give a whole number of at least 1, or auto"
        )
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Start the nodes, wait for a signal, stop them; return the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m futureq.cli.local_cluster", description=__doc__
    )
    parser.add_argument(
        "--nodes", type=int, default=3, choices=(3, 5), help="cluster size (default 3)"
    )
    parser.add_argument(
        "--data-dir", default="./data-cluster", help="parent of node<N> directories"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address every node binds")
    parser.add_argument(
        "--base-port",
        type=int,
        default=BASE_PORT,
        help=f"node N listens on BASE+10N (clients), +1 (Raft), +2 (HTTP); default {BASE_PORT}",
    )
    parser.add_argument(
        "--shards",
        type=_shards,
        default="auto",
        help="shard processes per node: a count, or auto (the default, as futureq start: "
        "the count recorded in each node's data directory, else one per usable core); "
        "see docs/sharding.md",
    )
    args = parser.parse_args(argv)
    ensure_secret(args.data_dir)
    base = args.base_port
    processes: list[subprocess.Popen[bytes]] = []
    for node_id in range(1, args.nodes + 1):
        processes.append(
            subprocess.Popen(
                node_command(node_id, args.nodes, args.data_dir, args.host, base, args.shards),
                process_group=0,  # the terminal's Ctrl-C is for us; we forward one SIGTERM
                # One forwarded while a node's Python still loads waits for its handler.
                preexec_fn=early_signals.block_start_signals_in_child,
            )
        )
    servers = ",".join(f"{args.host}:{ports(n, base)[0]}" for n in range(1, args.nodes + 1))
    print(
        f"started {args.nodes} nodes (PIDs {', '.join(str(p.pid) for p in processes)}); "
        f"clients: futureq-cli --server {servers} status; dashboards: "
        + ", ".join(f"http://{args.host}:{ports(n, base)[2]}/" for n in range(1, args.nodes + 1)),
        flush=True,
    )
    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        how = signal.SIGTERM if not stopping else signal.SIGKILL
        if not stopping:
            print("stopping the nodes gracefully (Ctrl-C again to kill them)", flush=True)
        stopping = True
        for process in processes:
            if process.poll() is None:
                process.send_signal(how)

    signal.signal(signal.SIGTERM, stop)
    # SIGHUP: the terminal went away, do not leave nodes behind. But a signal the
    # launcher began with ignored stays ignored, as POSIX asks and ``futureq start``
    # does (early_signals.stop_signals): a shell starts ``make cluster &`` in a script
    # with SIGINT ignored (the script's Ctrl-C is not for it), ``nohup`` with SIGHUP
    # ignored. The nodes inherit the ignored signal and are stopped with SIGTERM.
    for signum in (signal.SIGINT, signal.SIGHUP):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, stop)
    reported: set[int] = set()
    while any(process.poll() is None for process in processes):
        time.sleep(0.2)
        for number, process in enumerate(processes, start=1):
            if process.poll() is not None and number not in reported and not stopping:
                reported.add(number)
                print(
                    f"node {number} exited ({process.returncode}); the others keep running",
                    flush=True,
                )
    return max((process.returncode or 0) for process in processes)


if __name__ == "__main__":
    sys.exit(main())
