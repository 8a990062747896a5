"""Real FutureQ clusters on 127.0.0.1: N ``futureq start`` processes and their link proxies.

Each node has its own data directory and fixed ports (client, HTTP, Raft) picked from
free ports once, so a restarted node comes back at the same addresses. With more than
one node, node ``i``'s ``--peers`` map points entry ``j`` at the proxy of link
``i -> j`` (``proxy.py``), so the harness can cut, delay or drop every directed link.
With one node there are no peers and no proxies. Peers authenticate with a cluster
secret generated in the run's directory (``cluster.secret``), as ``make cluster`` does.

Every process is started by :func:`open_cluster` and stopped (SIGKILL after SIGCONT, by
PID) when its block ends, whatever happened inside.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from tests.jepsen_like.history import History
from tests.jepsen_like.proxy import LinkProxy, LinkTable

from futureq.peer_credentials import generate_secret_file

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
HTTP_TIMEOUT_S = 1.0
CLUSTER_ID = "jepsen"


SHARD_PORT_STRIDE = 100
"""Shard ``K`` of a node listens on the node's ports plus ``K`` times this (the
server's default ``node.shard_port_stride``, ``docs/sharding.md``)."""


def free_ports(count: int, offsets: tuple[int, ...] = (0,)) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (bound to 0 together, then freed),
    each with ``port + offset`` free as well for every offset (the ports of a sharded
    node's further shards)."""
    sockets: list[socket.socket] = []
    ports: list[int] = []
    try:
        for _ in range(1000 * count):
            if len(ports) == count:
                break
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
            port = sock.getsockname()[1]
            shifted = []
            try:
                for offset in offsets:
                    if offset:
                        other = socket.socket()
                        shifted.append(other)
                        other.bind(("127.0.0.1", port + offset))
            except OSError:
                for other in shifted:
                    other.close()
                continue  # keep the port bound (not drawn again), but do not use it
            sockets.extend(shifted)
            ports.append(port)
        if len(ports) < count:
            raise RuntimeError(f"could not find {count} free port blocks {offsets}")
        return ports
    finally:
        for sock in sockets:
            sock.close()


async def http_get(port: int, path: str, timeout_s: float = HTTP_TIMEOUT_S) -> tuple[int, Any]:
    """GET ``http://127.0.0.1:port/path``.

    Returns:
        (status code, JSON body or the text if it is not JSON); (0, None) when the node
        did not answer within ``timeout_s`` (down, paused, or cut off).
    """
    with trio.move_on_after(timeout_s):
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                await stream.send_all(request.encode())
                data = bytearray()
                while chunk := await stream.receive_some(65536):
                    data += chunk
        except (OSError, trio.BrokenResourceError):
            return 0, None
        head, _, body = bytes(data).partition(b"\r\n\r\n")
        try:
            code = int(head.split(b" ", 2)[1])
        except (IndexError, ValueError):
            return 0, None
        if b"transfer-encoding: chunked" in head.lower():
            body = _unchunk(body)
        try:
            return code, json.loads(body)
        except ValueError:
            return code, body.decode(errors="replace")
    return 0, None


def _unchunk(body: bytes) -> bytes:
    out = bytearray()
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2 :]
    return bytes(out)


class Node:
    """One ``futureq start`` process (or its absence) with fixed ports and data.

    Attributes:
        node_id: Raft node id (1-based).
        data_dir: RocksDB directory, kept across restarts.
        client_port, http_port, raft_port: Its real listening ports on 127.0.0.1.
        process: The running process, or None while down.
        paused: True between SIGSTOP and SIGCONT.
        env: Extra environment for the next start (e.g. libfaketime).
        max_file_bytes: RLIMIT_FSIZE for the next start (the disk-full fault), or None.
    """

    def __init__(self, node_id: int, root: Path, ports: list[int], shards: int = 1) -> None:
        self.node_id = node_id
        self.shards = shards
        """Shard processes of the node (``--shards``); above 1 the process is the
        supervisor and each shard a child of it (``docs/sharding.md``)."""
        self.paused_shards: set[int] = set()
        self.data_dir = root / f"n{node_id}"
        self.client_port, self.http_port, self.raft_port = ports
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.env: dict[str, str] = {}
        self.base_env: dict[str, str] = {}
        """Environment of every start (``env``, a fault's, is added on top)."""
        self.max_file_bytes: int | None = None
        self.peers = ""
        self.secret_file: Path | None = None
        self.stdout_path = root / f"n{node_id}.stdout.log"
        self.stderr_path = root / f"n{node_id}.stderr.log"
        self.log_level = "info"
        self.starts = 0

    @property
    def client_address(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def alive(self) -> bool:
        """Running (possibly paused)."""
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def http_port_of(self, shard: int) -> int:
        """HTTP port of shard ``shard`` (the node's own for shard 0)."""
        return self.http_port + shard * SHARD_PORT_STRIDE

    def shard_pids(self) -> dict[int, int]:
        """PIDs of the running shard processes, by shard number (children of the
        supervisor, told apart by their ``--shard-index``); empty without shards."""
        if self.shards <= 1 or not self.alive:
            return {}
        assert self.process is not None
        found: dict[int, int] = {}
        task_dir = Path(f"/proc/{self.process.pid}/task")
        try:
            children = [
                int(pid)
                for task in task_dir.iterdir()
                for pid in (task / "children").read_text().split()
            ]
        except OSError:
            return {}
        for pid in children:
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"--shard-index" in argv:
                where = argv.index(b"--shard-index")
                if where + 1 < len(argv) and _alive_pid(pid):
                    found[int(argv[where + 1])] = pid
        return found

    def command(self) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "futureq.cli.server_main",
            "start",
            "--data-dir",
            str(self.data_dir),
            "--listen",
            self.client_address,
            "--http",
            f"127.0.0.1:{self.http_port}",
            "--node-id",
            str(self.node_id),
            "--raft-listen",
            f"127.0.0.1:{self.raft_port}",
            "--log-level",
            self.log_level,
        ]
        # Always given: futureq start's default (auto) would follow this machine's cores.
        args += ["--shards", str(self.shards)]
        if self.peers:
            args += ["--peers", self.peers, "--cluster-id", CLUSTER_ID]
            if self.secret_file is not None:
                args += ["--cluster-secret-file", str(self.secret_file)]
        return args

    def _preexec(self) -> Callable[[], None] | None:
        limit = self.max_file_bytes
        if limit is None:
            return None

        def set_limit() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
            # Past the limit write() fails with EFBIG instead of killing the process.
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

        return set_limit

    def _spawn(self) -> int:
        """Start the process; returns the stdout log size before it (where READY goes)."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(self.base_env)
        env.update(self.env)
        mark = self.stdout_path.stat().st_size if self.stdout_path.exists() else 0
        with open(self.stdout_path, "ab") as out, open(self.stderr_path, "ab") as err:
            err.write(f"--- start #{self.starts + 1}: {' '.join(self.command())}\n".encode())
            err.flush()
            self.process = subprocess.Popen(
                self.command(), stdout=out, stderr=err, env=env, preexec_fn=self._preexec()
            )
        self.starts += 1
        self.paused = False
        self.paused_shards.clear()
        return mark

    def _ready_line_seen(self, mark: int) -> bool:
        with open(self.stdout_path, "rb") as out:
            out.seek(mark)
            return b"READY " in out.read()

    async def start(self) -> None:
        """Start the process and wait for its ``READY`` line.

        Raises:
            RuntimeError: it exited or printed no READY line within START_TIMEOUT_S.
        """
        if self.alive:
            return
        mark = self._spawn()
        with trio.move_on_after(START_TIMEOUT_S):
            while self.alive and not self._ready_line_seen(mark):  # noqa: ASYNC110 - polls a file
                await trio.sleep(0.05)
            if self.alive:
                return
        assert self.process is not None
        code = self.process.poll()
        self.kill()
        raise RuntimeError(
            f"node {self.node_id} did not start (exit code {code}); stderr tail:\n"
            + self.stderr_path.read_text(errors="replace")[-3000:]
        )

    def kill(self) -> None:
        """SIGKILL (a crash), even when paused, and reap it.

        A sharded node is the supervisor and its shard processes: the supervisor is
        stopped first (so it restarts nothing and its shards do not see it go and
        stop gracefully), then every shard and the supervisor are SIGKILLed, and the
        call returns once the shards are gone (their ports are free again).
        """
        if self.process is not None:
            if self.process.poll() is None:
                shards = {}
                if self.shards > 1:
                    self.process.send_signal(signal.SIGSTOP)
                    shards = self.shard_pids()
                    for pid in shards.values():
                        _signal_pid(pid, signal.SIGKILL)
                self.process.send_signal(signal.SIGKILL)
                _wait_gone(list(shards.values()))
            self.process.wait(STOP_TIMEOUT_S)
        self.process = None
        self.paused = False
        self.paused_shards.clear()

    def kill_shard(self, shard: int) -> int | None:
        """SIGKILL one shard process alone (its supervisor restarts it); returns its
        PID, or None when it is not running."""
        pid = self.shard_pids().get(shard)
        if pid is not None:
            _signal_pid(pid, signal.SIGKILL)  # also ends a stopped process
            self.paused_shards.discard(shard)
        return pid

    def pause_shard(self, shard: int) -> int | None:
        """SIGSTOP one shard process alone; returns its PID, or None if not running."""
        pid = self.shard_pids().get(shard)
        if pid is not None and shard not in self.paused_shards:
            _signal_pid(pid, signal.SIGSTOP)
            self.paused_shards.add(shard)
        return pid

    def resume_shard(self, shard: int) -> None:
        """SIGCONT after :meth:`pause_shard`."""
        pid = self.shard_pids().get(shard)
        if pid is not None and shard in self.paused_shards:
            _signal_pid(pid, signal.SIGCONT)
        self.paused_shards.discard(shard)

    async def terminate(self) -> int | None:
        """SIGTERM (graceful), SIGKILL after STOP_TIMEOUT_S; returns the exit code."""
        process = self.process
        if process is None:
            return None
        self.resume()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            with trio.move_on_after(STOP_TIMEOUT_S):
                while process.poll() is None:  # noqa: ASYNC110 - no event for a child's exit
                    await trio.sleep(0.05)
        self.kill()
        return process.returncode

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets but does nothing (a sharded node:
        the supervisor and every shard process)."""
        if self.alive and not self.paused:
            assert self.process is not None
            self.process.send_signal(signal.SIGSTOP)
            for pid in self.shard_pids().values():
                _signal_pid(pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        """SIGCONT after :meth:`pause` (and of every shard paused alone)."""
        if self.alive and (self.paused or self.paused_shards):
            assert self.process is not None
            for pid in self.shard_pids().values():
                _signal_pid(pid, signal.SIGCONT)
            self.process.send_signal(signal.SIGCONT)
        self.paused = False
        self.paused_shards.clear()

    async def status(self, shard: int = 0) -> dict[str, Any] | None:
        """Shard ``shard``'s ``/api/status`` JSON, or None if it does not answer."""
        if not self.alive or self.paused or shard in self.paused_shards:
            return None
        code, body = await http_get(self.http_port_of(shard), "/api/status")
        return body if code == 200 and isinstance(body, dict) else None

    async def ready(self) -> bool:
        """``/readyz`` answers 200 on every shard (a leader is known and applied up to)."""
        if not self.alive or self.paused or self.paused_shards:
            return False
        for shard in range(self.shards):
            code, _ = await http_get(self.http_port_of(shard), "/readyz")
            if code != 200:
                return False
        return True


class Cluster:
    """The nodes and link proxies of one run (built by :func:`open_cluster`)."""

    def __init__(
        self,
        root: Path,
        size: int,
        rng: random.Random,
        history: History | None,
        shards: int = 1,
    ) -> None:
        self.shards = shards
        self.offsets = tuple(k * SHARD_PORT_STRIDE for k in range(shards))
        # Node ports, then one port per directed link's proxy (all with shard room).
        ports = free_ports(3 * size + size * (size - 1), self.offsets)
        self.proxy_ports = ports[3 * size :]
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.nodes = {
            i: Node(i, root, ports[3 * (i - 1) : 3 * i], shards) for i in range(1, size + 1)
        }
        self.secret_file = root / "cluster.secret"
        if not self.secret_file.exists():
            generate_secret_file(str(self.secret_file))
        for node in self.nodes.values():
            node.secret_file = self.secret_file
        self.links = LinkTable()
        self.rng = rng
        self.history = history

    @property
    def size(self) -> int:
        return len(self.nodes)

    @property
    def servers(self) -> list[str]:
        """Client addresses of every node, for ``open_client``."""
        return [node.client_address for node in self.nodes.values()]

    def record(self, phase: str, node_id: int, **fields: Any) -> None:
        if self.history is not None:
            self.history.record("node", phase=phase, node_id=node_id, **fields)

    async def start_node(self, node_id: int) -> None:
        """Start one node (no-op if it runs); records a ``node start`` event."""
        await self.nodes[node_id].start()
        self.record("start", node_id)

    def kill(self, node_id: int) -> None:
        """SIGKILL one node."""
        self.nodes[node_id].kill()
        self.record("kill", node_id)

    def pause(self, node_id: int) -> None:
        """SIGSTOP one node."""
        self.nodes[node_id].pause()
        self.record("pause", node_id)

    def resume(self, node_id: int) -> None:
        """SIGCONT one node."""
        self.nodes[node_id].resume()
        self.record("resume", node_id)

    async def restart(self, node_id: int, *, graceful: bool = False) -> None:
        """Stop (SIGTERM if ``graceful``, else SIGKILL) and start again, same ports/data."""
        if graceful:
            await self.nodes[node_id].terminate()
            self.record("stop", node_id)
        else:
            self.kill(node_id)
        await self.start_node(node_id)

    def kill_shard(self, node_id: int, shard: int) -> int | None:
        """SIGKILL one shard process of a node alone; records a ``node kill`` event
        with ``shard``. Returns the PID killed (None if the shard was not running)."""
        pid = self.nodes[node_id].kill_shard(shard)
        self.record("kill", node_id, shard=shard, pid=pid)
        return pid

    def pause_shard(self, node_id: int, shard: int) -> None:
        """SIGSTOP one shard process of a node alone."""
        pid = self.nodes[node_id].pause_shard(shard)
        self.record("pause", node_id, shard=shard, pid=pid)

    def resume_shard(self, node_id: int, shard: int) -> None:
        """SIGCONT one shard process paused alone."""
        self.nodes[node_id].resume_shard(shard)
        self.record("resume", node_id, shard=shard)

    async def statuses(self, shard: int = 0) -> dict[int, dict[str, Any]]:
        """Shard ``shard``'s ``/api/status`` on every node that answers, by node id
        (asked concurrently)."""
        found: dict[int, dict[str, Any]] = {}

        async def ask(node: Node) -> None:
            status = await node.status(shard)
            if status is not None:
                found[node.node_id] = status

        async with trio.open_nursery() as nursery:
            for node in self.nodes.values():
                nursery.start_soon(ask, node)
        return found

    async def leader(self, *, record: bool = True, shard: int = 0) -> int | None:
        """The node that says it leads shard ``shard``'s group (highest term if
        several); None if none.

        Records a ``leader`` observation event when ``record`` (with ``shard`` when the
        nodes are sharded: each shard's group has its own terms and leaders).
        """
        statuses = await self.statuses(shard)
        leaders = [
            (int(s.get("term") or 0), node_id)
            for node_id, s in statuses.items()
            if s.get("role") == "leader"
        ]
        leader = max(leaders)[1] if leaders else None
        if record and self.history is not None:
            term = statuses[leader].get("term") if leader is not None else None
            claimants = sorted(node_id for _, node_id in leaders)
            extra: dict[str, Any] = {"shard": shard} if self.shards > 1 else {}
            if leader is None:
                # Why nobody leads: each answering node's role, term and clock state.
                extra["nodes"] = {
                    str(node_id): {
                        "role": s.get("role"),
                        "term": s.get("term"),
                        "in_bound": (s.get("clock") or {}).get("in_bound"),
                        "synchronized": (s.get("clock") or {}).get("synchronized"),
                        "offsets_ms": (s.get("clock") or {}).get("offsets_ms"),
                    }
                    for node_id, s in sorted(statuses.items())
                }
            self.history.record(
                "leader", node_id=leader, term=term, observer=leader, claimants=claimants, **extra
            )
            # Every self-declared leader also goes in, so two leaders in one term show.
            for term_seen, node_id in leaders:
                if node_id != leader and statuses[node_id].get("term") is not None:
                    self.history.record(
                        "leader",
                        node_id=node_id,
                        term=term_seen,
                        observer=node_id,
                        **({"shard": shard} if self.shards > 1 else {}),
                    )
        return leader

    async def leaders(self, *, record: bool = True) -> dict[int, int | None]:
        """:meth:`leader` of every shard, by shard number."""
        return {k: await self.leader(record=record, shard=k) for k in range(self.shards)}

    async def wait_ready(self, timeout_s: float = 30.0) -> bool:
        """Wait until every running, unpaused node answers ``/readyz`` 200 and a
        leader is known; False at the deadline."""
        with trio.move_on_after(timeout_s):
            while True:
                nodes = [n for n in self.nodes.values() if n.alive and not n.paused]
                ready = [await n.ready() for n in nodes]
                if nodes and all(ready):
                    leaders = await self.leaders(record=False)
                    if all(leader is not None for leader in leaders.values()):
                        return True
                await trio.sleep(0.1)
        return False

    def stop_all(self) -> None:
        """SIGKILL every node process this cluster started (by PID)."""
        for node in self.nodes.values():
            node.kill()


def _signal_pid(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _alive_pid(pid: int) -> bool:
    """Running (not gone, not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _wait_gone(pids: list[int]) -> None:
    """Wait (at most STOP_TIMEOUT_S) until every process is gone or a zombie: its
    sockets are closed, so a restart can bind its ports."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while any(_alive_pid(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)


@asynccontextmanager
async def open_cluster(
    root: Path,
    size: int,
    *,
    rng: random.Random,
    history: History | None = None,
    log_level: str = "info",
    node_env: dict[int, dict[str, str]] | None = None,
    shards: int = 1,
) -> AsyncIterator[Cluster]:
    """Start a ``size``-node cluster under ``root`` and yield it once it has a leader.

    Args:
        root: Directory for data dirs and logs (``n<ID>/``, ``n<ID>.stderr.log``).
        size: Number of nodes; 1 runs a single node with no peers and no proxies.
        rng: Seeds the proxies' random losses.
        history: Receives ``node`` and ``leader`` events.
        log_level: ``--log-level`` of every node.
        node_env: Extra environment of a node for its whole life (e.g. libfaketime),
            by node id; kept across its restarts.
        shards: ``--shards`` of every node; shard ``K`` of a node uses its ports plus
            ``K * SHARD_PORT_STRIDE``, and every link proxy forwards every shard's Raft
            traffic (a fault on the link hits them all).

    Yields:
        The cluster. On exit every node is killed (SIGKILL, by PID) and the proxies stop.

    Raises:
        RuntimeError: a node did not start, or no leader was ready within 30 s.
    """
    cluster = Cluster(root, size, rng, history, shards)
    proxy_ports = iter(cluster.proxy_ports)
    try:
        async with trio.open_nursery() as nursery:
            if size > 1:
                for source in cluster.nodes.values():
                    for target in cluster.nodes.values():
                        if source is target:
                            continue
                        link = LinkProxy(
                            source.node_id,
                            target.node_id,
                            target.raft_port,
                            random.Random(rng.random()),
                            cluster.offsets,
                        )
                        link.port = next(proxy_ports)
                        await nursery.start(link.run)
                        cluster.links.links[(source.node_id, target.node_id)] = link
                for node in cluster.nodes.values():
                    node.peers = ",".join(
                        f"{other.node_id}=127.0.0.1:"
                        + str(
                            other.raft_port
                            if other is node
                            else cluster.links.links[(node.node_id, other.node_id)].port
                        )
                        for other in cluster.nodes.values()
                    )
            for node in cluster.nodes.values():
                node.log_level = log_level
                node.base_env = dict((node_env or {}).get(node.node_id, {}))
            async with trio.open_nursery() as starters:
                for node_id in cluster.nodes:
                    starters.start_soon(cluster.start_node, node_id)
            if not await cluster.wait_ready():
                raise RuntimeError(f"no ready leader in the {size}-node cluster at {root}")
            try:
                yield cluster
            finally:
                nursery.cancel_scope.cancel()
    finally:
        cluster.stop_all()
