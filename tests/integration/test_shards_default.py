"""The default shard count (issue 15): ``futureq start`` with no ``--shards`` is
``auto``, one shard per usable core for a new data directory, recorded there; a data
directory that already holds a node's data keeps its count, and one without a record
(a node of one process, as every build before sharding wrote it) stays one process.

Real ``futureq start`` processes on 127.0.0.1 with the README's command line (no
``--shards``, no ``--data-dir``: ``./data`` of the working directory), only the ports
moved off 7450-7452; the client library and ``futureq-cli`` against them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trio
from broker_process import BrokerProcess, clean_env
from cluster_process import Cluster, ClusterNode, free_ports, free_runs
from proc_table import children, shard_index
from wire_client import WireClient

from futureq.client import open_client
from futureq.shards.layout import usable_cores
from futureq.shards.slots import MAX_SHARDS, even_map
from futureq.wire import frames

CORES = min(usable_cores(), MAX_SHARDS)
"""What ``auto`` chooses for a new data directory on this machine."""
STRIDE = 100
"""``node.shard_port_stride``'s default: shard K listens on each port + 100 K."""
TOPICS = [f"orders.{i}" for i in range(8)]
START_TIMEOUT_S = 60.0


class ReadmeNode:
    """``futureq start --listen ... --http ...`` in ``cwd`` (data in ``cwd/data``)."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        # Runs reaching shard K's ports (+ 100 K) for every K, below the ephemeral range.
        client, http = free_runs(2, (CORES - 1) * STRIDE + 1)
        self.client_address = f"127.0.0.1:{client}"
        self.http_address = f"127.0.0.1:{http}"
        self.stderr_path = cwd / "node.stderr.log"
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> str:
        """Start it; return its READY line."""
        command = [
            sys.executable, "-m", "futureq.cli.server_main", "start",
            "--listen", self.client_address, "--http", self.http_address,
        ]  # fmt: skip
        with open(self.stderr_path, "a") as stderr:
            self.process = subprocess.Popen(
                command, cwd=self.cwd, stdout=subprocess.PIPE, stderr=stderr, text=True,
                env=clean_env(),
            )  # fmt: skip
        line: list[str] = []
        reader = threading.Thread(
            target=lambda: line.append(self.process.stdout.readline()),  # type: ignore[union-attr]
            daemon=True,
        )
        reader.start()
        reader.join(START_TIMEOUT_S)
        if not line or not line[0].startswith("READY "):
            self.stop(kill=True)
            raise RuntimeError(f"did not start; stderr:\n{self.stderr_path.read_text()[-4000:]}")
        return line[0].strip()

    def stop(self, kill: bool = False) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode


def shard_pid(supervisor: int, shard: int) -> int | None:
    """PID of the supervisor's child running ``--shard-index shard``, else None."""
    return next((pid for pid in children(supervisor) if shard_index(pid) == shard), None)


def cli(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "futureq.cli.client_main", "--server", address, *args],
        capture_output=True, text=True, timeout=60, check=False, env=clean_env(),
    )  # fmt: skip


def test_the_readme_start_runs_one_shard_per_core_and_keeps_the_count(tmp_path: Path) -> None:
    node = ReadmeNode(tmp_path)
    data = tmp_path / "data"
    try:
        ready = node.start()
        if CORES > 1:
            assert ready.endswith(f" shards={CORES}"), ready
            assert (data / "SHARDS").read_text().strip() == str(CORES)
            assert not (data / "SHARDS.first-start").exists(), "ready: not a failed start"
            assert sorted(p.name for p in data.glob("shard-*")) == [
                f"shard-{k}" for k in range(CORES)
            ]
            assert f"node.shards = auto: {CORES} shard(s)" in node.stderr_path.read_text()
        else:
            assert "shards=" not in ready and not (data / "SHARDS").exists(), ready

        async def publish_and_consume() -> dict[str, bytes]:
            got: dict[str, bytes] = {}
            async with open_client(node.client_address) as client:
                for topic in TOPICS:
                    await client.create_group(topic, "g")
                    await client.publish(topic, f"{topic}/client".encode())
                for topic in TOPICS:
                    async with client.subscribe(topic, "g") as sub:
                        with trio.fail_after(20):
                            async for delivery in sub:
                                got[topic] = delivery.payload
                                await delivery.ack()
                                break
            return got

        got = trio.run(publish_and_consume)
        assert got == {topic: f"{topic}/client".encode() for topic in TOPICS}
        # The CLI routes each topic to its shard as well (a topic of the last shard).
        shard_map = even_map([""] * CORES)
        last = max(TOPICS, key=shard_map.shard_of)
        for topic in {TOPICS[0], last}:
            done = cli(node.client_address, "publish", topic, f"{topic}/cli")
            assert done.returncode == 0, done.stderr
        status = cli(node.client_address, "status", "--json")
        assert status.returncode == 0, status.stderr
        shown = json.loads(status.stdout)
        assert sorted(t["topic"] for t in shown["topics"]) == sorted(TOPICS)
        if CORES > 1:
            per_shard = {s["shard"]: s["topics"] for s in shown["shards"]}
            assert per_shard == {
                k: sum(shard_map.shard_of(t) == k for t in TOPICS) for k in range(CORES)
            }
        assert node.stop() == 0

        # Started again as the README says: the count recorded at creation.
        again = node.start()
        assert again.endswith(f" shards={CORES}") if CORES > 1 else "shards=" not in again
        for topic in {TOPICS[0], last}:
            consumed = cli(
                node.client_address, "consume", topic, "--group", "g", "--idle-timeout", "300ms"
            )
            assert consumed.returncode == 0, consumed.stderr
            assert f"{topic}/cli" in consumed.stdout, consumed.stdout
        assert node.stop() == 0
    finally:
        node.stop(kill=True)


def test_data_without_a_shard_record_stays_one_process(tmp_path: Path) -> None:
    """A data directory written by one broker process (a build from before sharding
    wrote exactly this: RocksDB in DATA_DIR, no SHARDS record) is never re-sharded by the
    default: it starts as one process and keeps its messages."""
    single = BrokerProcess(tmp_path / "data")  # --shards 1, ports the OS chooses
    single.start()

    async def publish() -> None:
        async with open_client(single.client_address) as client:
            await client.create_group("orders", "g")
            await client.publish("orders", b"before")

    trio.run(publish)
    assert single.terminate() == 0
    assert not (single.data_dir / "SHARDS").exists()
    single.shards_arg = None  # now without --shards: the default, on the ports it had
    try:
        single.start()
        assert "node.shards = auto: 1 shard(s)" in single.stderr_text()
        assert not (single.data_dir / "SHARDS").exists()
        assert not list(single.data_dir.glob("shard-*"))
        consumed = cli(
            single.client_address, "consume", "orders", "--group", "g", "--idle-timeout", "300ms"
        )
        assert consumed.returncode == 0, consumed.stderr
        assert "before" in consumed.stdout, consumed.stdout
    finally:
        single.terminate()


def test_ports_the_os_chooses_with_the_default_run_every_shard(tmp_path: Path) -> None:
    """``--listen 127.0.0.1:0 --http 127.0.0.1:0`` and no ``--shards``: the supervisor
    binds every shard's ports (``P + 100 K``) and hands them down, the READY line names
    shard 0's, and clients reach every shard through the slot map; a shard that dies
    comes back on the same port (the supervisor keeps the socket)."""
    if CORES == 1:
        pytest.skip("one usable core: the default is one process")
    node = BrokerProcess(tmp_path / "data", shards=None)  # ports: 127.0.0.1:0
    try:
        node.start()
        assert (node.data_dir / "SHARDS").read_text().strip() == str(CORES)
        client_port = int(node.client_address.rsplit(":", 1)[1])
        http_port = int(node.http_address.rsplit(":", 1)[1])
        shard_map = even_map([""] * CORES)
        last = max(TOPICS, key=shard_map.shard_of)

        async def roundtrip(topics: list[str], tag: str) -> dict[str, object]:
            async with open_client(node.client_address) as client:
                for topic in topics:
                    await client.create_group(topic, "g")
                    await client.publish(topic, f"{topic}/{tag}".encode())
                    async with client.subscribe(topic, "g") as sub:
                        with trio.fail_after(20):
                            async for delivery in sub:
                                assert delivery.payload == f"{topic}/{tag}".encode()
                                await delivery.ack()
                                break
                return await client.status()

        status = trio.run(roundtrip, TOPICS, "a")
        addresses = {s["shard"]: s["address"] for s in status["shards"]}
        assert addresses == {k: f"127.0.0.1:{client_port + k * STRIDE}" for k in range(CORES)}
        # The node's HTTP port answers for every shard, each at its own port + 100 K.
        import urllib.request

        with urllib.request.urlopen(f"http://{node.http_address}/readyz", timeout=5) as ready:
            assert ready.status == 200
        for k in range(1, CORES):
            url = f"http://127.0.0.1:{http_port + k * STRIDE}/healthz"
            with urllib.request.urlopen(url, timeout=5) as health:
                assert health.status == 200
        # The last shard dies: the supervisor restarts it on the socket it kept.
        pid = shard_pid(node.pid, CORES - 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while shard_pid(node.pid, CORES - 1) in (None, pid):
            assert time.monotonic() < deadline, node.stderr_text()[-3000:]
            time.sleep(0.1)
        trio.run(roundtrip, [last], "b")
        assert f"shard {CORES - 1} exited" in node.stderr_text()
    finally:
        node.terminate()


def test_os_chosen_ports_in_a_cluster_are_refused_with_a_sentence(tmp_path: Path) -> None:
    """Peers and clients find shard K of a node by its port: a sharded node with peers
    needs fixed ports, and says so before touching its data directory."""
    if CORES == 1:
        pytest.skip("one usable core: the default is one process, which port 0 suits")
    data = tmp_path / "data"
    raft = free_ports(1)[0]
    done = subprocess.run(
        [sys.executable, "-m", "futureq.cli.server_main", "start", "--data-dir", str(data),
         "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--raft-listen",
         f"127.0.0.1:{raft}", "--peers", f"1=127.0.0.1:{raft}", "--insecure-peers"],
        capture_output=True, text=True, timeout=60, check=False, env=clean_env(),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"node.shards is auto (the default), which chose {CORES} shards" in done.stderr
    assert "server.listen = '127.0.0.1:0': must name a fixed port in a cluster" in done.stderr
    assert "--shards 1" in done.stderr
    assert not data.exists(), "refused before touching the data directory"


def test_a_node_joining_with_the_default_takes_the_clusters_count(tmp_path: Path) -> None:
    """A node that joins (``--join``) with a new data directory and no ``--shards`` runs
    the cluster's shard count, not its own cores': here a cluster of one-shard nodes,
    which on a machine of several cores would otherwise refuse it (another count)."""
    cluster = Cluster(tmp_path, 1)  # --shards 1 (BrokerProcess's)
    cluster.start()
    try:
        member = cluster.leader()
        joiner = ClusterNode(
            2,
            tmp_path / "node2",
            (free_ports(3)[0], free_ports(1)[0], free_ports(1)[0]),
            ["--join", member.client_address, *cluster.auth_args],
        )
        joiner.shards_arg = None  # the default: auto
        cluster.nodes[2] = joiner
        joiner.start()
        log = joiner.stderr_text()
        assert (
            f"node.shards = auto: 1 shard(s), the count of the cluster at {member.client_address}"
            in log
        )
        assert not (joiner.data_dir / "SHARDS").exists()
        deadline = time.monotonic() + 30
        while True:
            view = WireClient(member.client_address).request(frames.ClusterStatus(1)).status
            if 2 in view["voters"] or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert 2 in view["voters"], view
    finally:
        cluster.stop()


@pytest.mark.skipif(CORES < 2, reason="auto must choose two counts: needs two usable cores")
def test_peers_whose_default_counts_differ_are_told_to_give_every_node_the_same(
    tmp_path: Path,
) -> None:
    """``--peers`` with the default on machines of other core counts (node 2 started with
    an affinity of one core): each node says its count came from its machine's cores,
    and the refused Raft link says to give every node the same ``--shards``."""
    from futureq.peer_credentials import generate_secret_file

    secret = tmp_path / "cluster.secret"
    generate_secret_file(str(secret))
    starts = free_runs(6, CORES)  # stride 1: shard K on each port plus K
    ports = {n: (starts[3 * n - 3], starts[3 * n - 2], starts[3 * n - 1]) for n in (1, 2)}
    peers = ",".join(f"{n}=127.0.0.1:{ports[n][1]}" for n in ports)
    nodes = {
        n: ClusterNode(
            n,
            tmp_path / f"node{n}",
            ports[n],
            ["--peers", peers, "--cluster-secret-file", str(secret)],
            {"FUTUREQ_NODE_SHARD_PORT_STRIDE": "1"},
        )
        for n in ports
    }
    for node in nodes.values():
        node.shards_arg = None  # the default: auto
    mask = os.sched_getaffinity(0)
    try:
        nodes[1].start()
        os.sched_setaffinity(0, {min(mask)})  # node 2's processes inherit one core
        try:
            nodes[2].start()
        finally:
            os.sched_setaffinity(0, mask)
        wants = {1: f"{CORES} shard(s)", 2: "1 shard(s)"}
        for n, node in nodes.items():
            assert f"node.shards = auto: {wants[n]}, this machine's usable cores" in (
                node.stderr_text()
            )
        deadline = time.monotonic() + 30
        refusal = "on machines with other core counts give every node the same --shards"
        while not all(refusal in node.stderr_text() for node in nodes.values()):
            assert time.monotonic() < deadline, [n.stderr_text()[-2000:] for n in nodes.values()]
            time.sleep(0.1)
    finally:
        for node in nodes.values():
            if node.alive():
                node.kill()
