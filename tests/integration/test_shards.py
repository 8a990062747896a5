"""A node of 2 shards, as real processes: ``futureq start --shards 2`` (issue 15).

The supervisor runs two shard brokers on the node's ports and the ports one stride
above; clients learn the slot map and send every topic to its shard.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from broker_process import BrokerProcess
from cluster_process import free_runs
from proc_table import alive, children, shard_index
from wire_client import WireClient

from futureq.client import Client, open_client
from futureq.client._batching import PublishItem
from futureq.errors import ErrorCode
from futureq.shards.slots import even_map
from futureq.wire import frames

STRIDE = 1
"""Shard K listens on the node's ports + K (node.shard_port_stride), so two free runs
of consecutive ports are all a node of 2 shards needs."""
TOPICS = [f"orders.{i}" for i in range(24)]


class ShardedNode(BrokerProcess):
    """A ``futureq start --shards N`` process on fixed ports."""

    def __init__(self, data_dir: Path, shards: int = 2, extra: list[str] | None = None) -> None:
        super().__init__(
            data_dir,
            ["--shards", str(shards), *(extra or [])],
            {"FUTUREQ_NODE_SHARD_PORT_STRIDE": str(STRIDE)},
        )
        client, http = free_runs(2, shards)
        self._port_args = ["--listen", f"127.0.0.1:{client}", "--http", f"127.0.0.1:{http}"]
        self.shards = shards
        self.shard_addresses = [f"127.0.0.1:{client + k * STRIDE}" for k in range(shards)]

    def pid_of_shard(self, shard: int) -> int | None:
        """PID of shard ``shard``'s process once it runs ``futureq start``, else None."""
        return next((pid for pid in self.shard_pids() if shard_index(pid) == shard), None)

    def shard_pids(self) -> list[int]:
        """PIDs of the supervisor's children (the shard processes), any order."""
        return children(self.pid)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[ShardedNode]:
    made = ShardedNode(tmp_path / "data")
    made.start()
    yield made
    if made.process is not None and made.process.poll() is None:
        made.terminate()
    made.kill()  # reaps it and closes its stdout pipe whether or not it still ran


def cli(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "futureq.cli.client_main", "--server", address, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_topics_spread_over_both_shards_and_all_come_back(node: ShardedNode) -> None:
    slot_map = even_map(node.shard_addresses)
    assert {slot_map.shard_of(t) for t in TOPICS} == {0, 1}

    async def main() -> dict[str, list[bytes]]:
        async with open_client(node.client_address) as client:
            for topic in TOPICS:
                await client.create_group(topic, "g")
            # One batch spanning both shards: ids come back in the batch's order.
            items = [PublishItem(t, f"{t}/batch".encode()) for t in TOPICS]
            ids = await client.publish_batch(items)
            assert len(ids) == len(TOPICS)
            for topic in TOPICS:
                await client.publish(topic, f"{topic}/single".encode())
            status = await client.status()
            assert sorted(t["topic"] for t in status["topics"]) == sorted(TOPICS)
            per_shard = {s["shard"]: s["topics"] for s in status["shards"]}
            assert per_shard == {k: sum(slot_map.shard_of(t) == k for t in TOPICS) for k in (0, 1)}
            got: dict[str, list[bytes]] = {}
            for topic in TOPICS:
                async with client.subscribe(topic, "g") as sub:
                    with trio.fail_after(20):
                        async for delivery in sub:
                            got.setdefault(topic, []).append(delivery.payload)
                            await delivery.ack()
                            if len(got[topic]) == 3:
                                break
            return got

    # The CLI publishes a third message to every topic, through the same routing.
    for topic in TOPICS:
        done = cli(node.client_address, "publish", topic, f"{topic}/cli")
        assert done.returncode == 0, done.stderr
    got = trio.run(main)
    for topic in TOPICS:
        assert sorted(got[topic]) == sorted(
            f"{topic}/{how}".encode() for how in ("batch", "single", "cli")
        )
    # The CLI's node-wide views list the topics of both shards.
    listed = cli(node.client_address, "topic", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert set(TOPICS) <= set(listed.stdout.replace('"', " ").split())
    for command in (["status"], ["group", "list"]):
        shown = cli(node.client_address, *command)
        assert shown.returncode == 0, shown.stderr
        assert all(topic in shown.stdout for topic in TOPICS), shown.stdout
    created = cli(node.client_address, "group", "create", TOPICS[1], "late")
    assert created.returncode == 0, created.stderr
    deleted = cli(node.client_address, "group", "delete", TOPICS[1], "late")
    assert deleted.returncode == 0, deleted.stderr
    one = TOPICS[0]
    consumed = cli(node.client_address, "consume", one, "--group", "g", "--idle-timeout", "300ms")
    assert consumed.returncode == 0, consumed.stderr


def test_a_request_for_another_shards_topic_is_told_where_to_go(node: ShardedNode) -> None:
    slot_map = even_map(node.shard_addresses)
    foreign = next(t for t in TOPICS if slot_map.shard_of(t) == 1)
    wire = WireClient(node.shard_addresses[0])
    answer = wire.request(frames.SlotMap(wire.next_id()))
    assert isinstance(answer, frames.SlotMapOk)
    assert answer.slot_map["shards"] == node.shard_addresses
    assert answer.slot_map["shard"] == 0
    ours = next(t for t in TOPICS if slot_map.shard_of(t) == 0)
    refused = wire.request(
        frames.Publish(
            wire.next_id(),
            frames.AckLevel.LEADER,
            [[ours, b"x", None, None, None], [foreign, b"y", None, None, None]],
        )
    )
    assert isinstance(refused, frames.Error)
    assert refused.code == ErrorCode.WRONG_SHARD
    assert refused.item_index == 1
    assert refused.leader_address == node.shard_addresses[1]
    assert "shard 1" in refused.message and foreign in refused.message
    for request in (
        frames.Subscribe(wire.next_id(), foreign, "g", 10),
        frames.GroupCreate(wire.next_id(), foreign, "g"),
        frames.Purge(wire.next_id(), foreign, None),
        frames.BrowseCounts(wire.next_id(), foreign, None, [60_000], True),
    ):
        answer = wire.request(request)
        assert isinstance(answer, frames.Error), request
        assert answer.code == ErrorCode.WRONG_SHARD
        assert answer.leader_address == node.shard_addresses[1]
    # The dead-letter topic lives with its topic.
    dlq = wire.request(frames.GroupCreate(wire.next_id(), f"{foreign}.dlq", "g"))
    assert isinstance(dlq, frames.Error) and dlq.code == ErrorCode.WRONG_SHARD
    # Nothing of the refused batch was stored.
    status = wire.request(frames.Status(wire.next_id()))
    assert isinstance(status, frames.StatusOk)
    assert status.status["topics"] == []


def test_a_killed_shard_is_restarted_and_loses_nothing_acknowledged(node: ShardedNode) -> None:
    slot_map = even_map(node.shard_addresses)
    on_0 = [t for t in TOPICS if slot_map.shard_of(t) == 0][:3]
    on_1 = [t for t in TOPICS if slot_map.shard_of(t) == 1][:3]
    pids = node.shard_pids()
    assert len(pids) == 2

    def shard_pid(shard: int) -> int:
        pid = node.pid_of_shard(shard)
        assert pid is not None, f"no process for shard {shard}"
        return pid

    async def main() -> None:
        async with open_client(node.client_address, request_timeout_s=30) as client:
            for topic in on_0 + on_1:
                await client.create_group(topic, "g")
            acked = {
                t: [await client.publish(t, f"{t}/{i}".encode()) for i in range(5)]
                for t in on_0 + on_1
            }
            assert all(len(ids) == 5 for ids in acked.values())
            victim = shard_pid(1)
            os.kill(victim, signal.SIGKILL)
            # Shard 0 keeps serving while shard 1 is down or restarting.
            for i in range(5, 10):
                for topic in on_0:
                    await client.publish(topic, f"{topic}/{i}".encode())
            # Shard 1 comes back (a new process) and takes publishes again.
            with trio.fail_after(30):
                while True:
                    await trio.sleep(0.1)
                    pids_now = node.shard_pids()
                    if victim not in pids_now and len(pids_now) == 2:
                        break
            for i in range(5, 10):
                for topic in on_1:
                    await client.publish(topic, f"{topic}/{i}".encode())
            for topic in on_0 + on_1:
                seen: set[bytes] = set()
                async with client.subscribe(topic, "g", prefetch=20) as sub:
                    with trio.fail_after(30):
                        async for delivery in sub:
                            seen.add(delivery.payload)
                            await delivery.ack()
                            if len(seen) == 10:
                                break
                assert seen == {f"{topic}/{i}".encode() for i in range(10)}

    trio.run(main)
    log = node.stderr_text()
    assert "shard 1 exited with code -9" in log and "restarting it" in log


def test_status_names_a_stopped_shard_without_waiting_the_request_timeout(
    node: ShardedNode,
) -> None:
    """A shard process stopped (SIGSTOP) accepts TCP connections and answers nothing:
    ``status`` and ``cluster_status`` return the other shard's part, naming the stopped
    one, ``connect_timeout_s`` after the first answer. Before, they waited the whole
    request timeout (``futureq-cli status``: 30 s) for it."""
    stopped = node.pid_of_shard(1)
    assert stopped is not None

    async def ask() -> tuple[dict[str, Any], dict[str, Any], float]:
        async with open_client(
            node.client_address, connect_timeout_s=2.0, request_timeout_s=40.0
        ) as client:
            await client.create_group(TOPICS[0], "g")  # the clients of both shards connect
            os.kill(stopped, signal.SIGSTOP)
            started = trio.current_time()
            status = await client.status()
            cluster = await client.cluster_status()
            return status, cluster, trio.current_time() - started

    try:
        status, cluster, took_s = trio.run(ask)
    finally:
        os.kill(stopped, signal.SIGCONT)
    assert took_s < 30, took_s  # 2 s each, not the 40 s request timeout
    for answer in (status, cluster):
        assert answer["missing_shards"] == [1], answer
        row = answer["shards"][1]
        assert "shard 1 did not answer: [TIMEOUT]" in row["error"], row
        assert answer["shards"][0].get("role") == "leader", answer


def test_publish_file_names_a_stopped_shard_without_asking_for_a_server(
    node: ShardedNode, tmp_path: Path
) -> None:
    """``publish --file`` with a line for a stopped shard's topic: the failed line names
    that shard, and the hint for a server that is not running (``start one with make
    run``) is not given, as it is not for one ``publish``: the node answered. Before,
    the hint asked whether a server ran at every shard's address."""
    slot_map = even_map(node.shard_addresses)
    topic = next(t for t in TOPICS if slot_map.shard_of(t) == 1)
    lines = tmp_path / "lines.jsonl"
    lines.write_text(json.dumps({"topic": topic, "payload": "x"}) + "\n")
    stopped = node.pid_of_shard(1)
    assert stopped is not None
    os.kill(stopped, signal.SIGSTOP)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FUTUREQ_")}
        done = subprocess.run(
            [sys.executable, "-m", "futureq.cli.client_main", "--server", node.client_address,
             "--request-timeout", "3s", "publish", "--file", str(lines)],
            capture_output=True, text=True, timeout=60, check=False, env=env,
        )  # fmt: skip
    finally:
        os.kill(stopped, signal.SIGCONT)
    assert done.returncode == 1, done.stderr
    assert "line 1: [CONNECTION_LOST] shard 1: " in done.stderr, done.stderr
    assert "is a FutureQ server running" not in done.stderr, done.stderr


def test_sigterm_stops_every_shard_process(node: ShardedNode) -> None:
    children = node.shard_pids()
    assert len(children) == 2
    assert node.terminate() == 0
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in children)
    assert "stopped; RocksDB closed" in node.stderr_text()


def _start_refused(
    data_dir: Path, args: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    # Runs as long as the most shards tried (4): with stride 1 a shorter client run
    # would reach the HTTP run, a layout the config check now refuses first.
    client, http = free_runs(2, 4)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "futureq.cli.server_main",
            "start",
            "--data-dir",
            str(data_dir),
            "--listen",
            f"127.0.0.1:{client}",
            "--http",
            f"127.0.0.1:{http}",
            *args,
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
        check=False,
    )


def test_another_shard_count_on_existing_data_is_refused(node: ShardedNode, tmp_path: Path) -> None:
    node.terminate()
    env = {"FUTUREQ_NODE_SHARD_PORT_STRIDE": str(STRIDE)}
    three = _start_refused(node.data_dir, ["--shards", "3"], env)
    assert three.returncode == 2
    assert "created with 2 shards; start it with --shards 2" in three.stderr
    one = _start_refused(node.data_dir, ["--shards", "1"], env)
    assert one.returncode == 2
    assert "created with 2 shards" in one.stderr
    # Without --shards (the default, auto) it starts with its 2: test_shards_default.py.
    # FUTUREQ_SHARDS says the same as --shards.
    by_env = _start_refused(node.data_dir, [], {**env, "FUTUREQ_SHARDS": "4"})
    assert by_env.returncode == 2 and "not 4" in by_env.stderr
    # A single node's data is not split by a later --shards either.
    single = BrokerProcess(tmp_path / "single")
    single.start()
    single.terminate()
    two = _start_refused(single.data_dir, ["--shards", "2"], env)
    assert two.returncode == 2
    assert "holds the data of a node with 1 shard" in two.stderr


def test_a_shard_that_cannot_start_takes_the_node_down(tmp_path: Path) -> None:
    """Never half-up: shard 1's client port is taken, so the node does not come up."""
    node = ShardedNode(tmp_path / "data")
    client_port = int(node.shard_addresses[1].rsplit(":", 1)[1])
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", client_port))
        blocker.listen()
        with pytest.raises(RuntimeError, match="broker did not start"):
            node.start()
    assert node.process is not None and node.process.returncode == 4
    log = node.stderr_text()
    assert "shard 1 exited with code 4 before it was ready" in log


def test_one_shard_is_the_node_as_before(tmp_path: Path) -> None:
    """--shards 1: no supervisor, no stamp, the data where it always was."""
    single = BrokerProcess(tmp_path / "data", ["--shards", "1"])
    single.start()
    try:
        assert not children(single.pid)
        wire = WireClient(single.client_address)
        answer = wire.request(frames.SlotMap(wire.next_id()))
        assert isinstance(answer, frames.SlotMapOk)
        assert answer.slot_map["shards"] == [single.client_address]
        assert answer.slot_map["ranges"] == [[0, 1024, 0]]
    finally:
        single.terminate()
    assert (tmp_path / "data" / "CURRENT").exists()
    assert not (tmp_path / "data" / "SHARDS").exists()
    assert json.dumps(sorted(p.name for p in (tmp_path / "data").iterdir())).count("shard-") == 0


def _sharded_cluster(root: Path) -> tuple[dict[int, Any], dict[int, tuple[int, int, int]]]:
    """Three nodes of two shards each (not started): nodes by id and their ports."""
    from cluster_process import ClusterNode

    from futureq.peer_credentials import generate_secret_file

    secret = root / "cluster.secret"
    generate_secret_file(str(secret))
    starts = free_runs(9, 2)
    ports = {n: (starts[3 * n - 3], starts[3 * n - 2], starts[3 * n - 1]) for n in (1, 2, 3)}
    peers = ",".join(f"{n}=127.0.0.1:{ports[n][1]}" for n in ports)
    env = {"FUTUREQ_NODE_SHARD_PORT_STRIDE": str(STRIDE)}
    nodes = {
        n: ClusterNode(
            n,
            root / f"node{n}",
            ports[n],
            ["--peers", peers, "--cluster-secret-file", str(secret), "--shards", "2"],
            env,
        )
        for n in ports
    }
    return nodes, ports


@pytest.mark.slow
@pytest.mark.parametrize("seeds", ["every node", "node 1 only"])
def test_three_nodes_of_two_shards_route_and_survive_a_stopped_node(
    tmp_path: Path, seeds: str
) -> None:
    """Shard K of every node forms one Raft group; the client follows each group's leader.

    Given node 1 alone, each shard's client still fails over when node 1 stops: the
    HELLO_OK of its shard named that shard's address on every node (protocol version 2).
    """
    nodes, ports = _sharded_cluster(tmp_path)
    try:
        for node in nodes.values():
            node.start()
        topics = TOPICS[:8]

        async def publish_and_consume(client: Client, tag: str) -> None:
            for topic in topics:
                await client.create_group(topic, "g")
            await client.publish_batch([PublishItem(t, f"{t}/{tag}".encode()) for t in topics])
            status = await client.status()
            assert {s["shard"] for s in status["shards"]} == {0, 1}
            for topic in topics:
                async with client.subscribe(topic, "g") as sub:
                    with trio.fail_after(60):
                        async for delivery in sub:
                            assert delivery.payload == f"{topic}/{tag}".encode()
                            await delivery.ack()
                            break

        async def main() -> None:
            # Seeds: every node's public port, node 1 first; the client learns the map
            # from node 1 and knows the same shard on nodes 2 and 3 too.
            servers = [f"127.0.0.1:{ports[n][0]}" for n in (1, 2, 3)]
            if seeds == "node 1 only":
                servers = servers[:1]
            async with open_client(servers, request_timeout_s=60) as client:
                await publish_and_consume(client, "first")
                # Node 1 leads every shard's group, so each shard's client is connected
                # to node 1; then node 1 stops, and each fails over to that shard on
                # another node.
                await client.transfer_leader(1)
                await publish_and_consume(client, "between")
                await trio.to_thread.run_sync(nodes[1].terminate)
                await publish_and_consume(client, "second")

        trio.run(main)
        for n in (2, 3):
            assert (tmp_path / f"node{n}" / "shard-1" / "CURRENT").exists()
    finally:
        for node in nodes.values():
            if node.alive():
                node.terminate()


def test_a_shard_failing_again_and_again_takes_the_node_down(node: ShardedNode) -> None:
    """Five fast failures in a row: the node stops with a sentence, not half up."""
    assert node.process is not None
    killed: set[int] = set()
    deadline = time.monotonic() + 60
    while node.process.poll() is None and time.monotonic() < deadline:
        pid = node.pid_of_shard(1)
        if pid is not None and pid not in killed:
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        time.sleep(0.02)
    assert node.process.wait(20) == 1
    assert len(killed) == 5
    log = node.stderr_text()
    assert "shard 1 failed 5 times in a row" in log
    assert "restarting it in" in log
    assert "stopped; RocksDB closed" in log  # shard 0 was stopped gracefully


def test_shards_outliving_a_killed_supervisor_stop_themselves(node: ShardedNode) -> None:
    children = node.shard_pids()
    assert len(children) == 2
    node.kill()  # SIGKILL: the supervisor cannot forward anything
    deadline = time.monotonic() + 20
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in children)
    assert node.stderr_text().count("of this shard is gone: shutting down") == 2


def test_the_sync_client_routes_too(node: ShardedNode) -> None:
    from futureq.client.sync import SyncClient

    slot_map = even_map(node.shard_addresses)
    pair = [next(t for t in TOPICS if slot_map.shard_of(t) == k) for k in (0, 1)]
    with SyncClient(node.client_address) as client:
        for topic in pair:
            client.create_group(topic, "g")
        ids = client.publish_batch([PublishItem(t, t.encode()) for t in pair])
        assert len(ids) == 2
        for topic in pair:
            got = client.consume(topic, "g", count=1, timeout_s=10)
            assert [d.payload for d in got] == [topic.encode()]
            got[0].ack()
        shards = client.status()["shards"]
        assert [s["topics"] for s in shards] == [1, 1]


def test_scheduled_messages_are_managed_on_the_shard_of_their_topic(node: ShardedNode) -> None:
    """Cancel, reschedule, browse, counts and purge reach the shard owning the topic,
    for a topic on each shard, without the caller naming shards."""
    slot_map = even_map(node.shard_addresses)
    pair = [next(t for t in TOPICS if slot_map.shard_of(t) == k) for k in (0, 1)]

    async def main() -> None:
        async with open_client(node.client_address) as client:
            for topic in pair:
                await client.create_group(topic, "g")
                ids = await client.publish_batch(
                    [PublishItem(topic, b"%d" % n, delay_ms=3_600_000) for n in range(4)]
                )
                assert await client.cancel(topic, ids[:1]) == [frames.ItemStatus.DONE]
                assert await client.reschedule(topic, ids[1:2], delay_ms=60_000) == [
                    frames.ItemStatus.DONE
                ]
                page = await client.browse(topic, "g")
                assert [m.id for m in page.messages] == ids[1:]
                counts = await client.browse_counts(
                    topic, "g", bounds_ms=[120_000, 7_200_000], relative=True
                )
                assert counts.complete and counts.counts == [1, 2] and counts.later == 0
                assert await client.purge(topic, group="g") == 3

    trio.run(main)


def test_health_asks_every_shard(node: ShardedNode) -> None:
    http_port = int(node.http_address.rsplit(":", 1)[1])
    args = [
        sys.executable, "-m", "futureq.cli.server_main", "health", "--ready", "--shards", "2",
        "--http", node.http_address, "--listen", node.client_address,
    ]  # fmt: skip
    env = {**os.environ, "FUTUREQ_NODE_SHARD_PORT_STRIDE": str(STRIDE)}
    healthy = subprocess.run(args, capture_output=True, text=True, timeout=30, env=env)
    assert healthy.returncode == 0, healthy.stderr
    for shard in (0, 1):
        assert f"127.0.0.1:{http_port + shard * STRIDE}/readyz: 200" in healthy.stdout
    # Shard 1 stopped (SIGSTOP: neither answering nor restarted): the node is not healthy.
    pid = node.pid_of_shard(1)
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        args[args.index("health") + 1 : args.index("health") + 1] = ["--timeout", "1"]
        sick = subprocess.run(args, capture_output=True, text=True, timeout=30, env=env)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert sick.returncode == 1
    assert f"127.0.0.1:{http_port + STRIDE}/readyz: no answer" in sick.stderr


@pytest.mark.slow
def test_health_of_stopped_shards_takes_one_timeout_not_one_per_shard(tmp_path: Path) -> None:
    """``futureq health --timeout T`` on a node of 3 shards, shards 1 and 2 stopped
    (SIGSTOP): every port is asked at once, so the check ends after about T, each
    stopped shard named. Before, the ports were asked one after another: 1 s for the
    node's port (its view's fetch deadline) and T for each stopped shard."""
    node = ShardedNode(tmp_path / "data", shards=3)
    node.start()
    stopped: list[int] = []
    try:
        http_port = int(node.http_address.rsplit(":", 1)[1])
        args = [
            sys.executable, "-m", "futureq.cli.server_main", "health", "--timeout", "4",
            "--shards", "3", "--http", node.http_address, "--listen", node.client_address,
        ]  # fmt: skip
        env = {**os.environ, "FUTUREQ_NODE_SHARD_PORT_STRIDE": str(STRIDE)}
        for shard in (1, 2):
            pid = node.pid_of_shard(shard)
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        started = time.monotonic()
        sick = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
        took_s = time.monotonic() - started
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        node.terminate()
    assert sick.returncode == 1, sick.stderr
    lines = sick.stderr.splitlines()
    assert lines[0].startswith(f"http://{node.http_address}/healthz: 503 "), sick.stderr
    for shard in (1, 2):
        address = f"127.0.0.1:{http_port + shard * STRIDE}"
        assert lines[shard] == f"http://{address}/healthz: no answer (timed out)", sick.stderr
    assert took_s < 7.5, took_s  # one 4 s timeout and the start-up, not 1 + 4 + 4 s


def _leaders(ports: dict[int, tuple[int, int, int]], alive: set[int]) -> dict[int, int | None]:
    """Shard -> the node id leading its group, as the first live node that answers sees it."""
    found: dict[int, int | None] = {}
    for shard in (0, 1):
        found[shard] = None
        for n in sorted(alive):
            try:
                wire = WireClient(f"127.0.0.1:{ports[n][0] + shard * STRIDE}", timeout_s=2)
                answer = wire.request(frames.ClusterStatus(wire.next_id()), timeout_s=2)
                wire.close()
            except (OSError, ConnectionError, TimeoutError):
                continue
            if isinstance(answer, frames.ClusterStatusOk) and answer.status.get("leader_id"):
                found[shard] = answer.status["leader_id"]
                break
    return found


def _wait_leaders(
    ports: dict[int, tuple[int, int, int]], alive: set[int], want: dict[int, set[int]]
) -> dict[int, int | None]:
    deadline = time.monotonic() + 60
    while True:
        leaders = _leaders(ports, alive)
        if all(leaders[shard] in allowed for shard, allowed in want.items()):
            return leaders
        assert time.monotonic() < deadline, f"leaders {leaders}, wanted {want}"
        time.sleep(0.2)


@pytest.mark.slow
def test_shard_leaders_spread_over_the_nodes_and_return_after_a_restart(tmp_path: Path) -> None:
    """Shard 0's group is led by node 1 and shard 1's by node 2 (the K-th voter by id);
    when node 2 stops its group elects another leader, and when node 2 is back the
    leadership returns to it."""
    nodes, ports = _sharded_cluster(tmp_path)
    try:
        for node in nodes.values():
            node.start()
        _wait_leaders(ports, {1, 2, 3}, {0: {1}, 1: {2}})
        nodes[2].terminate()
        _wait_leaders(ports, {1, 3}, {0: {1}, 1: {1, 3}})
        nodes[2].start()
        _wait_leaders(ports, {1, 2, 3}, {0: {1}, 1: {2}})
        log = "".join(node.stderr_text() for node in nodes.values())
        assert "handing leadership to node 2, its preferred leader" in log
    finally:
        for node in nodes.values():
            if node.alive():
                node.terminate()


@pytest.mark.slow
def test_a_balancing_transfer_counts_the_first_delivery_out(tmp_path: Path) -> None:
    """A first delivery out when the balancer hands its group's leadership back to the
    preferred node is redelivered by the new leader as attempt 2: the balancer records
    the attempts before it transfers, as ``cluster transfer-leader`` does. Before, it
    called the Raft transfer directly and the new leader delivered attempt 1 again."""
    nodes, ports = _sharded_cluster(tmp_path)
    topic = next(t for t in TOPICS if even_map(["a", "b"]).shard_of(t) == 1)
    try:
        for node in nodes.values():
            node.start()
        _wait_leaders(ports, {1, 2, 3}, {0: {1}, 1: {2}})  # a fresh group needs every voter
        nodes[2].terminate()  # shard 1's group is led by node 1 or 3 meanwhile
        leader = _wait_leaders(ports, {1, 3}, {1: {1, 3}})[1]
        assert leader is not None
        old = WireClient(f"127.0.0.1:{ports[leader][0] + STRIDE}")
        old.subscribe(topic, "g", prefetch=1)
        assert old.publish([[topic, b"m", 0, None, None]]).count == 1
        [first] = old.deliveries(1)
        assert first[5] == 1  # attempt 1, held (never acked) across the transfer
        nodes[2].start()
        _wait_leaders(ports, {1, 2, 3}, {1: {2}})
        new = WireClient(f"127.0.0.1:{ports[2][0] + STRIDE}")
        new.subscribe(topic, "g", prefetch=1)
        [again] = new.deliveries(1, timeout_s=30)
        assert again[1] == first[1] and again[5] == 2, again
        old.close()
        new.close()
    finally:
        for node in nodes.values():
            if node.alive():
                node.terminate()


def test_publish_file_counts_repeated_idempotency_keys_on_every_shard(
    node: ShardedNode, tmp_path: Path
) -> None:
    """The routing client reports which lines stored nothing (their idempotency key
    named an earlier message), whichever shard their topic lives on."""
    slot_map = even_map(node.shard_addresses)
    pair = [next(t for t in TOPICS if slot_map.shard_of(t) == k) for k in (0, 1)]
    batch = tmp_path / "keyed.jsonl"
    batch.write_text(
        "".join(
            f'{{"topic":"{t}","payload":"x","delay_ms":3600000,"idempotency_key":"k-{t}"}}\n'
            for t in pair
        )
        + f'{{"topic":"{pair[1]}","payload":"plain","delay_ms":3600000}}\n'
    )
    first = cli(node.client_address, "publish", "--file", str(batch))
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("published 3 message(s) in")
    again = cli(node.client_address, "publish", "--file", str(batch))
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(
        "published 1 message(s), 2 already published (same idempotency key) in"
    )


@pytest.mark.slow
def test_cluster_add_node_by_hand_joins_every_shards_group(tmp_path: Path) -> None:
    """``cluster remove-node 3``, node 3 started blank, ``cluster add-node 3 RAFT CLIENT``
    naming its public ports: shard K's group gets node 3's shard K at those ports plus
    K * stride, and node 3 becomes a voter of both groups; a second add-node is a no-op."""
    import shutil

    nodes, ports = _sharded_cluster(tmp_path)
    try:
        for node in nodes.values():
            node.start()
        seed = f"127.0.0.1:{ports[1][0]}"

        async def leaders() -> list[Any]:
            async with open_client(seed, request_timeout_s=60) as client:
                return [s.get("leader_id") for s in (await client.cluster_status())["shards"]]

        # A new cluster elects once every node answered (a new data directory votes only
        # then, docs/raft.md): stopping node 3 before that left no group able to elect.
        deadline = time.monotonic() + 60
        while None in (found := trio.run(leaders)):
            assert time.monotonic() < deadline, found
            time.sleep(0.5)
        nodes[3].terminate()
        done = cli(seed, "cluster", "remove-node", "3")
        assert done.returncode == 0, done.stderr
        shutil.rmtree(tmp_path / "node3")
        nodes[3].start()
        raft3, client3 = f"127.0.0.1:{ports[3][1]}", f"127.0.0.1:{ports[3][0]}"
        for attempt in range(2):  # the second time every group lists it: nothing to do
            done = cli(seed, "cluster", "add-node", "3", raft3, client3)
            assert done.returncode == 0, (attempt, done.stderr)

        async def members() -> list[dict[str, Any]]:
            async with open_client(seed, request_timeout_s=60) as client:
                return (await client.cluster_status())["shards"]

        deadline = time.monotonic() + 120
        while True:
            shards = trio.run(members)
            if all(3 in s.get("voters", []) for s in shards):
                break
            assert time.monotonic() < deadline, shards
            time.sleep(0.5)
        for shard, view in enumerate(shards):
            entry = next(n for n in view["nodes"] if n["node_id"] == 3)
            assert entry["raft_address"] == f"127.0.0.1:{ports[3][1] + shard * STRIDE}", view
        # Node 3's shard 1 holds shard 1's group: it caught up through that group.
        assert (tmp_path / "node3" / "shard-1" / "CURRENT").exists()
    finally:
        for node in nodes.values():
            if node.alive():
                node.terminate()


def _agreement_node(
    node_id: int, root: Path, base: tuple[int, ...], shards: int, args: list[str], name: str = ""
) -> Any:
    """A clustered node of ``shards`` shards (1: no --shards, as a node of any build)."""
    from cluster_process import ClusterNode

    count = ["--shards", str(shards)] if shards > 1 else []
    client, raft, http = base
    return ClusterNode(
        node_id,
        root / (name or f"node{node_id}"),
        (client, raft, http),
        [*args, *count, "--cluster-secret-file", str(root / "cluster.secret")],
        {"FUTUREQ_NODE_SHARD_PORT_STRIDE": str(STRIDE)},
    )


def _refused_start(node_id: int, root: Path, shards: int, args: list[str]) -> tuple[str, Path]:
    """Start a node and wait for it to stop with exit code 2 before its READY line
    (the join is refused before anything is written); its stderr and its data
    directory, which the refused start must leave as it was (missing). A port another
    process took since it was found free (exit 4: other tests share this machine) is not
    what is tested: the node is tried again on other ports and a new data directory."""
    for attempt in range(3):
        node = _agreement_node(
            node_id, root, tuple(free_runs(3, 3)), shards, args, f"node{node_id}.{attempt}"
        )
        with pytest.raises(RuntimeError, match="broker did not start"):
            node.start()
        assert node.process is not None
        try:
            code = node.process.wait(timeout=60)
        finally:
            node.kill()
        if code != 4:
            break
    assert code == 2, node.stderr_text()[-3000:]
    assert not node.data_dir.exists(), sorted(node.data_dir.rglob("*"))
    return str(node.stderr_text()), node.data_dir


@pytest.mark.slow
def test_joining_with_another_shard_count_is_refused(tmp_path: Path) -> None:
    """A node whose shard count differs from the cluster's stops at --join with exit 2
    and a sentence naming both counts, and is added to no group: shard K of every node
    is one Raft group, so it would route topics to other groups than the cluster does.
    A node that announces no count (1 shard, or an older build) counts as 1 shard; a
    node of the same count joins, each of its shards the group of that shard."""
    from futureq.peer_credentials import generate_secret_file

    generate_secret_file(str(tmp_path / "cluster.secret"))
    starts = free_runs(6, 2)  # the members' client, raft and HTTP runs, none overlapping
    runs = [tuple(starts[i : i + 3]) for i in range(0, 6, 3)]
    member = _agreement_node(1, tmp_path, runs[0], 2, ["--peers", f"1=127.0.0.1:{runs[0][1]}"])
    single = _agreement_node(5, tmp_path, runs[1], 1, ["--peers", f"5=127.0.0.1:{runs[1][1]}"])
    try:
        member.start()
        single.start()
        join = ["--join", member.client_address]
        log, refused_dir = _refused_start(2, tmp_path, 3, join)
        assert (
            "runs 2 shard(s) per node and this node was started with 3 (node.shards): every "
            "node of a cluster must run the same number of shards" in log
        )
        assert "start it again with --shards 2, or --shards auto" in log
        assert f"nothing was written to {refused_dir}" in log
        log, _ = _refused_start(3, tmp_path, 1, join)
        assert "runs 2 shard(s) per node and this node was started with 1 " in log
        log, _ = _refused_start(4, tmp_path, 2, ["--join", single.client_address])
        assert "runs 1 shard(s) per node and this node was started with 2 " in log

        async def members() -> list[dict[str, Any]]:
            async with open_client(member.client_address, request_timeout_s=30) as client:
                return list((await client.cluster_status())["shards"])

        for view in trio.run(members):
            assert view["voters"] == [1] and view["learners"] == [], view
        # The same count joins, on the data directory of the refused start (nothing to
        # delete first): node 6 becomes a voter of both groups.
        same = _agreement_node(6, tmp_path, tuple(free_runs(3, 2)), 2, join, refused_dir.name)
        same.start()
        deadline = time.monotonic() + 120
        while not all(6 in view.get("voters", []) for view in trio.run(members)):
            assert same.alive() and time.monotonic() < deadline, same.stderr_text()[-3000:]
            time.sleep(0.5)
        raft6 = int(same.raft_address.rsplit(":", 1)[1])
        for shard, view in enumerate(trio.run(members)):  # each shard joined its own group
            entry = next(n for n in view["nodes"] if n["node_id"] == 6)
            assert entry["raft_address"] == f"127.0.0.1:{raft6 + shard * STRIDE}", view
    finally:
        for started in (member, single):
            if started.process is not None:
                started.terminate()
        if "same" in locals() and same.alive():
            same.terminate()


@pytest.mark.slow
def test_peers_with_another_shard_count_refuse_each_other(tmp_path: Path) -> None:
    """Two nodes named by --peers, one of 2 shards and one of 3: every Raft link between
    them is refused in the handshake, both logs say why with both counts, and no group
    gets a leader (on the old code shards 0 and 1 formed groups across the two nodes)."""
    from futureq.peer_credentials import generate_secret_file

    generate_secret_file(str(tmp_path / "cluster.secret"))
    starts = free_runs(6, 3)
    runs = {1: tuple(starts[0:3]), 2: tuple(starts[3:6])}
    peers = ["--peers", ",".join(f"{n}=127.0.0.1:{runs[n][1]}" for n in runs)]
    nodes = {n: _agreement_node(n, tmp_path, runs[n], n + 1, peers) for n in runs}
    try:
        for node in nodes.values():
            node.start()
        wanted = {
            1: "node 2 runs 3 shards (shard 0, slot map version 1, port stride 1) and this "
            "node 2 shards (shard 0, slot map version 1, port stride 1): every node of a "
            "cluster must run the same number of shards (node.shards)",
            2: "node 1 runs 2 shards (shard 1, slot map version 1, port stride 1) and this "
            "node 3 shards (shard 1",
        }
        deadline = time.monotonic() + 60
        while not all(wanted[n] in nodes[n].stderr_text() for n in nodes):
            assert time.monotonic() < deadline, {n: nodes[n].stderr_text()[-2000:] for n in nodes}
            time.sleep(0.2)
        assert "ERROR" in next(
            line for line in nodes[1].stderr_text().splitlines() if wanted[1] in line
        )
        time.sleep(3)  # several election timeouts: two voters that never hear each other
        assert _leaders({n: runs[n] for n in runs}, {1, 2}) == {0: None, 1: None}
    finally:
        for node in nodes.values():
            if node.alive():
                node.terminate()
