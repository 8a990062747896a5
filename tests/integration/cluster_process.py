"""Real clusters of ``futureq start`` processes on 127.0.0.1 for integration tests."""

from __future__ import annotations

import http.client
import json
import os
import random
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from broker_process import BrokerProcess

from futureq.peer_credentials import generate_secret_file


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that were free a moment ago on 127.0.0.1, below the
    ephemeral range (see :func:`free_runs`: a port the OS hands out for ``:0`` may be
    any outgoing connection's local port, or another process's listener, by the time
    a node binds it)."""
    return free_runs(count, 1)


def port_free(port: int, *, reuse: bool = False) -> bool:
    """Whether ``port`` can be bound on 127.0.0.1 now; ``reuse``: as a node binds it
    (SO_REUSEADDR), so the TIME-WAIT connections of a node just stopped do not count."""
    with socket.socket() as sock:
        if reuse:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (outgoing connections' local
    ports), 32768 when it cannot be read."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_runs(runs: int, length: int) -> list[int]:
    """First ports of ``runs`` runs of ``length`` consecutive ports free a moment ago,
    below the ephemeral range (a port free when checked could otherwise become the local
    port of any outgoing connection before the node binds it: seen in CI) and none in
    the coordinator's 7450-7482). ``$FUTUREQ_TEST_PORTS`` (``FIRST-LAST``) confines
    them to that range instead, for a machine whose ports are shared out."""
    found: list[int] = []
    confined = os.environ.get("FUTUREQ_TEST_PORTS")
    if confined:
        # Packed from the first port up (a small range fits no random layout).
        first, last = (int(port) for port in confined.split("-"))
        base = first
        while len(found) < runs:
            if base + length - 1 > last:
                raise RuntimeError(f"no {runs} free runs of {length} ports in {confined}")
            # A range of 20 ports has no room to skip those of the test before.
            if all(port_free(p, reuse=True) for p in range(base, base + length)):
                found.append(base)
                base += length
            else:
                base += 1
        return found
    rng = random.Random()
    high = max(_ephemeral_low(), 12000) - length
    while len(found) < runs:
        base = rng.randrange(10000, high)
        ports = range(base, base + length)
        if any(p in range(b, b + length) for b in found for p in ports):
            continue
        if all(port_free(p) for p in ports):
            found.append(base)
    return found


class ClusterNode(BrokerProcess):
    """One node of a test cluster, on fixed ports (so peers can name it)."""

    def __init__(
        self,
        node_id: int,
        data_dir: Path,
        ports: tuple[int, int, int],
        cluster_args: list[str],
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(data_dir, ["--node-id", str(node_id), *cluster_args], env)
        self.node_id = node_id
        client, raft, http = ports
        self.raft_address = f"127.0.0.1:{raft}"
        self._port_args = [
            "--listen",
            f"127.0.0.1:{client}",
            "--http",
            f"127.0.0.1:{http}",
            "--raft-listen",
            self.raft_address,
        ]

    def start(self) -> None:
        super().start()
        # BrokerProcess pins --listen/--http for restarts; keep the raft port too.
        self._port_args = [*self._port_args, "--raft-listen", self.raft_address]

    def http_json(self, path: str) -> Any:
        try:
            with urllib.request.urlopen(f"http://{self.http_address}{path}", timeout=5) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as refused:
            refused.close()  # a 503's socket now, not in a gc pass of a later test
            raise

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def ready_leader(nodes: list[ClusterNode], timeout_s: float = 20.0) -> ClusterNode:
    """The node among ``nodes`` that says it leads and is ready (``/readyz``: the no-op of
    its term applied; until then a new leader answers leader-only requests such as
    SUBSCRIBE with NOT_LEADER), once one does.

    Raises:
        TimeoutError: none did within ``timeout_s``; the message ends with the nodes'
            log tails.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for node in nodes:
            if not node.alive():
                continue
            # A node that exits while answering (one removed from the cluster shuts
            # itself down) cuts its answer short: that is a node not answering.
            try:
                status = node.http_json("/api/status")
            except (OSError, http.client.HTTPException):
                continue
            if status.get("role") == "leader":
                try:
                    node.http_json("/readyz")
                except (OSError, http.client.HTTPException):
                    continue
                return node
        time.sleep(0.05)
    tails = "".join(
        f"\nnode {node.node_id}'s log ends with:\n"
        + node.stderr_path.read_text(errors="replace")[-4000:]
        for node in nodes
        if node.stderr_path.exists()
    )
    raise TimeoutError(f"no leader within the deadline{tails}")


class Cluster:
    """``size`` nodes started with ``--peers`` naming all of them.

    Peers authenticate with a cluster secret generated in ``root`` (as ``make cluster``
    does) unless ``secret`` is False.

    Args:
        root: Parent directory of the nodes' data directories.
        size: 3 or 5 voters.
        env: Extra environment for every node (e.g. FUTUREQ_CLUSTER_* tuning).
        extra_args: Extra ``futureq start`` flags for every node (e.g. TLS).
        node_args: Extra flags per node id (e.g. each node's own certificate).
        secret: Generate ``root/cluster.secret`` and pass ``--cluster-secret-file``.
        peer_addresses: Per node id, raft addresses to put in its ``--peers`` instead of
            the real ones (``{1: {2: relay}}`` makes node 1 reach node 2 through a relay).
    """

    def __init__(
        self,
        root: Path,
        size: int,
        env: dict[str, str] | None = None,
        extra_args: list[str] | None = None,
        *,
        node_args: dict[int, list[str]] | None = None,
        secret: bool = True,
        peer_addresses: dict[int, dict[int, str]] | None = None,
    ) -> None:
        ports = free_ports(3 * size)
        self.ports = {
            n: (ports[3 * (n - 1)], ports[3 * (n - 1) + 1], ports[3 * (n - 1) + 2])
            for n in range(1, size + 1)
        }
        self.root = root
        self.env = env
        self.secret_file: Path | None = None
        self.auth_args: list[str] = []
        """The flags a node needs to be accepted as a peer (for nodes that join later)."""
        if secret:
            root.mkdir(parents=True, exist_ok=True)
            self.secret_file = root / "cluster.secret"
            generate_secret_file(str(self.secret_file))
            self.auth_args = ["--cluster-secret-file", str(self.secret_file)]
        self.nodes: dict[int, ClusterNode] = {}
        for n in self.ports:
            addresses = {m: f"127.0.0.1:{self.ports[m][1]}" for m in self.ports}
            addresses.update((peer_addresses or {}).get(n, {}))
            peers = ",".join(f"{m}={address}" for m, address in addresses.items())
            args = ["--peers", peers, *self.auth_args, *(extra_args or [])]
            self.nodes[n] = ClusterNode(
                n, root / f"node{n}", self.ports[n], [*args, *(node_args or {}).get(n, [])], env
            )

    def start(self) -> None:
        """Start every node; if one fails, kill those already started and re-raise (a
        fixture whose set-up fails is not torn down: they would outlive the test)."""
        try:
            for node in self.nodes.values():
                node.start()
        except BaseException:
            for node in self.nodes.values():
                if node.alive():
                    node.kill()
            raise

    @property
    def servers(self) -> list[str]:
        """Every node's client address."""
        return [f"127.0.0.1:{ports[0]}" for ports in self.ports.values()]

    def leader(self, timeout_s: float = 20.0, exclude: set[int] | None = None) -> ClusterNode:
        """The node that says it leads and is ready, once one does (:func:`ready_leader`)."""
        candidates = [n for n in self.nodes.values() if not (exclude and n.node_id in exclude)]
        return ready_leader(candidates, timeout_s)

    def stop(self) -> None:
        for node in self.nodes.values():
            if node.alive():
                node.terminate()
            else:
                node.kill()

    def statuses(self) -> dict[int, Any]:
        """``/api/status`` of every running node that answers."""
        found = {}
        for node in self.nodes.values():
            if node.alive():
                try:
                    found[node.node_id] = node.http_json("/api/status")
                except OSError:
                    continue
        return found
