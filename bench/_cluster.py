"""Shared pieces of the cluster benchmarks: a local cluster of ``futureq start``
processes on fixed 127.0.0.1 ports, leader discovery, catch-up waits, CPU sampling.

Every node is its own process (``python -m futureq.cli.server_main start --node-id N
--listen ... --http ... --raft-listen ... --peers 1=...,2=...,3=...``), as in
``tests/integration/cluster_process.py``; each keeps its ports across restarts so peers
and clients can find it again. Processes are stopped by PID (SIGTERM, SIGKILL
fallback) and the temporary directory is removed by :meth:`LocalCluster.cleanup`.
Peers authenticate with a cluster secret by default, as ``make cluster`` does
(``peer_auth="insecure"`` runs without, to measure what the MACs cost).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

from bench._common import Server

LEADER_TIMEOUT_S = 30.0

_INSTALLED = re.compile(
    r"installed a snapshot from the leader at index (\d+) \((\d+) bytes\) in ([0-9.]+) s"
)


def free_port_run(length: int, taken: set[int] | None = None) -> int:
    """The first of ``length`` consecutive TCP ports that were free a moment ago on
    127.0.0.1, below the ephemeral range (sharded nodes need each shard's ports at a
    fixed stride). ``taken``: ports already handed out (skipped; the run is added).

    Raises:
        RuntimeError: no such run found in 1000 draws.
    """
    rng = random.Random()
    taken = taken if taken is not None else set()
    for _ in range(1000):
        base = rng.randrange(10000, 32000 - length)  # below the ephemeral range
        if taken & set(range(base, base + length)):
            continue
        sockets: list[socket.socket] = []
        try:
            for port in range(base, base + length):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        taken.update(range(base, base + length))
        return base
    raise RuntimeError(f"no run of {length} free ports found")


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that were free a moment ago on 127.0.0.1."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class ClusterNode(Server):
    """One node of a local cluster on fixed ports (a :class:`~bench._common.Server`).

    Args:
        node_id: Raft node id (>= 1).
        data_dir: The node's RocksDB directory (kept across restarts).
        ports: ``(client, raft, http)`` ports on 127.0.0.1.
        peers: The ``--peers`` value naming every initial voter.
        env: Extra environment (``FUTUREQ_CLUSTER_*`` tuning).
        log_level: ``--log-level`` of the node (``info`` to get the snapshot log lines).

    Attributes:
        stderr_path: ``<root>/node<N>.stderr.log``, appended to across restarts.
    """

    def __init__(
        self,
        node_id: int,
        data_dir: Path,
        ports: tuple[int, int, int],
        peers: str,
        env: dict[str, str] | None = None,
        log_level: str = "warning",
        auth_args: list[str] | None = None,
    ) -> None:
        client, raft, http = ports
        super().__init__(
            data_dir,
            [
                "--node-id", str(node_id),
                "--listen", f"127.0.0.1:{client}",
                "--http", f"127.0.0.1:{http}",
                "--raft-listen", f"127.0.0.1:{raft}",
                "--peers", peers,
                "--log-level", log_level,
                *(auth_args or []),
            ],
            env,
        )  # fmt: skip
        self.node_id = node_id
        self.client_address = f"127.0.0.1:{client}"
        self.http_address = f"127.0.0.1:{http}"
        self.stderr_path = data_dir.parent / f"node{node_id}.stderr.log"

    def spawn(self) -> None:
        """Start the process (later flags override the base class's ``:0`` ports)."""
        args = [sys.executable, "-m", "futureq.cli.server_main", "start"]
        args += ["--data-dir", str(self.data_dir), *self.extra_args]
        env = {**os.environ, **self.env}
        stderr = open(self.stderr_path, "a")  # noqa: SIM115 - handed to the child
        self.started_s = time.monotonic()
        self.process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env
        )
        stderr.close()

    def alive(self) -> bool:
        """True while the process runs."""
        return self.process is not None and self.process.poll() is None

    def http_json(self, path: str, timeout_s: float = 5.0) -> Any:
        """GET ``path`` and decode the JSON body.

        Raises:
            OSError: the node does not answer (or answers non-200).
        """
        status, body = self.http_get(path, timeout_s)
        if status != 200:
            raise OSError(f"{path} answered {status}")
        return json.loads(body)

    def status(self) -> dict[str, Any] | None:
        """``/api/status``, or None when the node does not answer."""
        try:
            loaded: dict[str, Any] = self.http_json("/api/status", 2.0)
        except (OSError, ValueError):
            return None
        return loaded

    def ready(self) -> bool:
        """``/readyz`` answers 200."""
        try:
            return self.http_get("/readyz", 2.0)[0] == 200
        except OSError:
            return False

    def installed_snapshots(self) -> list[dict[str, float]]:
        """Every "installed a snapshot from the leader" line in the node's stderr:
        ``[{"index", "bytes", "seconds"}]`` (needs ``log_level="info"``)."""
        text = self.stderr_path.read_text() if self.stderr_path.exists() else ""
        return [
            {"index": int(m[1]), "bytes": int(m[2]), "seconds": float(m[3])}
            for m in _INSTALLED.finditer(text)
        ]


PEER_AUTH_MODES = ("secret", "insecure")


def _auth_args(root: Path, mode: str, node_ids: list[int]) -> dict[int, list[str]]:
    """Per node, the flags of peer authentication ``mode`` (files written under ``root``)."""
    if mode == "insecure":
        return {n: ["--insecure-peers"] for n in node_ids}
    if mode == "secret":
        from futureq.peer_credentials import generate_secret_file

        secret = root / "cluster.secret"
        generate_secret_file(str(secret))
        return {n: ["--cluster-secret-file", str(secret)] for n in node_ids}
    raise ValueError(f"peer_auth must be one of {', '.join(PEER_AUTH_MODES)}")


class LocalCluster:
    """``size`` nodes started with ``--peers`` naming all of them, in a temporary dir.

    Args:
        size: Number of voters (3 or 5).
        env: Extra environment for every node.
        log_level: ``--log-level`` of every node.
        peer_auth: ``secret`` (a generated cluster secret) or ``insecure``
            (``--insecure-peers``).
        shards: ``--shards`` of every node. Above 1, node ``n``'s ports are three
            consecutive ones of a free run and shard ``K``'s are ``K * 3 * size`` above
            them (``node.shard_port_stride``, set in every node's environment).

    Attributes:
        port_stride: The shard port stride (``3 * size``; 0 with one shard).
    """

    def __init__(
        self,
        size: int = 3,
        env: dict[str, str] | None = None,
        log_level: str = "warning",
        peer_auth: str = "secret",
        shards: int = 1,
    ) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="futureq-bench-cluster-"))
        self.shards = shards
        self.port_stride = 0
        if shards > 1:
            self.port_stride = 3 * size
            base = free_port_run(self.port_stride * shards)
            ports = list(range(base, base + 3 * size))
            env = {**(env or {}), "FUTUREQ_NODE_SHARD_PORT_STRIDE": str(self.port_stride)}
        else:
            ports = free_ports(3 * size)
        by_node = {
            n: (ports[3 * (n - 1)], ports[3 * (n - 1) + 1], ports[3 * (n - 1) + 2])
            for n in range(1, size + 1)
        }
        peers = ",".join(f"{n}=127.0.0.1:{p[1]}" for n, p in by_node.items())
        auth = _auth_args(self.root, peer_auth, list(by_node))
        # Always given: futureq start's default (auto) would follow this machine's cores.
        auth = {n: [*flags, "--shards", str(shards)] for n, flags in auth.items()}
        self.nodes = {
            n: ClusterNode(n, self.root / f"node{n}", p, peers, env, log_level, auth[n])
            for n, p in by_node.items()
        }

    def start(self) -> float:
        """Spawn every node, wait for their READY lines and a ready leader; return seconds."""
        started = time.monotonic()
        for node in self.nodes.values():
            node.spawn()
        for node in self.nodes.values():
            node.wait_ready_line()
        self.leader()
        return time.monotonic() - started

    @property
    def addresses(self) -> list[str]:
        """Every node's client address (node id order)."""
        return [node.client_address for node in self.nodes.values()]

    @property
    def pids(self) -> list[int]:
        """PIDs of the running nodes."""
        return [node.pid for node in self.nodes.values() if node.alive()]

    def leader(
        self, timeout_s: float = LEADER_TIMEOUT_S, exclude: set[int] | None = None
    ) -> ClusterNode:
        """The live node that says it leads and answers ``/readyz`` 200, once one does.

        Raises:
            TimeoutError: none within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for node in self.nodes.values():
                if not node.alive() or (exclude and node.node_id in exclude):
                    continue
                status = node.status()
                if status is not None and status.get("role") == "leader" and node.ready():
                    return node
            time.sleep(0.02)
        raise TimeoutError(f"no ready leader within {timeout_s} s")

    def wait_caught_up(
        self, node: ClusterNode, timeout_s: float = 120.0, poll_s: float = 0.05
    ) -> float:
        """Wait until ``node`` answers ``/readyz`` and its applied index reaches the
        leader's applied index read at the start of each poll; return seconds waited.

        Raises:
            TimeoutError: not caught up within ``timeout_s``.
        """
        started = time.monotonic()
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            leader = self.leader(max(1.0, deadline - time.monotonic()))
            target = (leader.status() or {}).get("applied_index")
            mine = node.status()
            if (
                target is not None
                and mine is not None
                and mine.get("applied_index", -1) >= target
                and node.ready()
            ):
                return time.monotonic() - started
            time.sleep(poll_s)
        raise TimeoutError(f"node {node.node_id} did not catch up within {timeout_s} s")

    def cleanup(self) -> None:
        """Stop every node by PID (SIGTERM, SIGKILL after the deadline), remove the dir."""
        try:
            for node in self.nodes.values():
                node.terminate(10.0)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def cpu_seconds(process: Any) -> float:
    """User + system CPU seconds of a ``psutil.Process`` so far (0 once it is gone)."""
    try:
        times = process.cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return float(times.user + times.system)


class CpuMeter:
    """CPU seconds used by a set of processes between :meth:`start` and :meth:`stop`.

    Args:
        pids: Name -> PID of the processes to watch.
    """

    def __init__(self, pids: dict[str, int]) -> None:
        self._procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self._before: dict[str, float] = {}
        self._started = 0.0

    def start(self) -> None:
        """Record the starting CPU times."""
        self._started = time.monotonic()
        self._before = {name: cpu_seconds(p) for name, p in self._procs.items()}

    def stop(self) -> dict[str, float]:
        """``{name: percent of one core}`` since :meth:`start`."""
        elapsed = max(1e-9, time.monotonic() - self._started)
        return {
            name: round((cpu_seconds(p) - self._before[name]) / elapsed * 100, 1)
            for name, p in self._procs.items()
        }
