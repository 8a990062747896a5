"""A member whose peers refuse it (here: another cluster secret) is named as refused.

Found by restarting node 3 of a 3-node cluster with another ``--cluster-secret-file``:
every node logged the refusal, but ``/readyz`` on node 3 said only ``no leader is known
yet (this node is follower)``, the leader's dashboard alarm said ``node 3 does not answer
the leader``, and ``futureq-cli cluster status`` showed an empty row, as for a node that
is down. After a restart of nodes 1 and 2 too, they waited for node 3 to answer before
voting (``docs/raft.md``, "Disk faults") with the same bare ``/readyz`` reason. Each
place now names the refusal (and the recovery wait): what the operator must fix.
Real ``futureq start`` processes on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from cli_process import cli
from cluster_process import Cluster, ClusterNode, free_ports

from futureq.peer_credentials import generate_secret_file

pytestmark = pytest.mark.timeout(120)

SECRET_SENTENCE = "could not prove it holds our cluster secret"


def _readyz(node: ClusterNode) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://{node.http_address}/readyz", timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, json.loads(refused.read())


def _until(what: str, check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})")


def _not_ready_saying(node: ClusterNode, *parts: str) -> Callable[[], Any]:
    """A check: node's /readyz answer once its reason holds every part, else None."""

    def check() -> Any:
        code, answer = _readyz(node)
        reason = answer.get("reason", "")
        return (code, answer) if all(part in reason for part in parts) else None

    return check


def _restart_with(node: ClusterNode, secret: Path) -> None:
    node.terminate()
    args = node.extra_args
    position = len(args) - 1 - args[::-1].index("--cluster-secret-file")
    node.extra_args = [*args[: position + 1], str(secret), *args[position + 2 :]]
    node.start()


def test_a_member_refused_by_its_peers_is_named_as_refused(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "c", 3)
    cluster.start()
    try:
        node1, node2, node3 = (cluster.nodes[n] for n in (1, 2, 3))
        leader = cluster.leader()
        if leader.node_id == 3:  # node 3 is the one restarted wrong: the leader is another
            moved = cli(leader.client_address, "cluster", "transfer-leader", "1")
            assert moved.returncode == 0, moved.stderr
        leader = cluster.leader(exclude={3})
        assert cluster.secret_file is not None
        wrong = tmp_path / "wrong.secret"
        generate_secret_file(str(wrong))

        _restart_with(node3, wrong)
        # The leader: its alarm and cluster status say node 3 is refused, not just silent.
        alarm = _until(
            "the leader's MEMBER_UNREACHABLE alarm names the refusal",
            lambda: [
                a["text"]
                for a in leader.http_json("/api/overview")["alarms"]
                if a["name"] == "MEMBER_UNREACHABLE" and SECRET_SENTENCE in a["text"]
            ],
        )
        assert alarm[0].startswith("node 3 does not answer the leader"), alarm
        members = {m["node_id"]: m for m in leader.http_json("/api/overview")["members"]}
        assert SECRET_SENTENCE in members[3]["refused"]
        assert members[1]["refused"] is None
        shown = cli(leader.client_address, "cluster", "status")
        assert shown.returncode == 0, shown.stderr
        assert "node 3: Raft link FAILING" in shown.stdout and SECRET_SENTENCE in shown.stdout
        # The leader itself still serves.
        assert _readyz(leader)[0] == 200
        # Node 3: not ready, and /readyz says why (its peers refuse it, it waits for them).
        code, answer = _until(
            "node 3's /readyz names the refusal", _not_ready_saying(node3, "refused")
        )
        assert code == 503
        assert "node 1: " in answer["reason"] and SECRET_SENTENCE in answer["reason"]
        assert "until node(s) 1, 2 answer it" in answer["reason"], answer
        view = json.loads(cli(node3.client_address, "cluster", "status", "--json").stdout)
        assert view["recovering"] is True and view["recovery_waiting_for"] == [1, 2]

        # Nodes 1 and 2 restarted meanwhile wait for node 3: /readyz and the NO_LEADER
        # alarm say so, naming node 3 and its refusal.
        node1.terminate()
        node2.terminate()
        node1.start()
        node2.start()
        # (Until node 2 answers node 1, node 1 waits for both.)
        code, answer = _until(
            "node 1's /readyz names the recovery wait for node 3 and its refusal",
            _not_ready_saying(node1, "refused", "until node(s) 3 answer it"),
        )
        assert code == 503
        assert "recovering after its start" in answer["reason"], answer
        alarms = node1.http_json("/api/overview")["alarms"]
        assert any(
            a["name"] == "NO_LEADER" and "until node(s) 3 answer it" in a["text"] for a in alarms
        ), alarms

        # Node 3 stopped: it is down, no longer said to be refused.
        node3.terminate()
        _until(
            "node 1 no longer calls node 3 refused once it is down",
            lambda: (
                {m["node_id"]: m for m in node1.http_json("/api/overview")["members"]}[3]["refused"]
                is None
            ),
        )
        # Node 3 with the cluster's secret again: everything clears and the cluster serves.
        _restart_with(node3, cluster.secret_file)
        leader = cluster.leader(timeout_s=30)
        for node in (node1, node2, node3):
            _until(f"node {node.node_id} ready", lambda node=node: _readyz(node)[0] == 200)
        members = leader.http_json("/api/overview")["members"]
        assert all(m["refused"] is None for m in members), members
        shown = cli(leader.client_address, "cluster", "status")
        assert "FAILING" not in shown.stdout and "RECOVERING" not in shown.stdout, shown.stdout
    finally:
        cluster.stop()


def test_a_mistyped_peers_entry_is_named_with_the_address_the_peer_gives(
    tmp_path: Path,
) -> None:
    """Found by starting node 1 with node 2's port mistyped in ``--peers``: node 1 got
    node 2's messages but its answers went nowhere, so the nodes waited for each other
    (recovery) and no leader was elected, while node 1 logged nothing above DEBUG and
    ``/readyz`` said only ``no leader is known yet``. Node 1 now names the wrong
    address, the one node 2 gives, and the flag to correct; corrected, the cluster
    serves."""
    # Past the 9 ports the cluster takes: with $FUTUREQ_TEST_PORTS free ports are packed
    # from the first, and free_ports(1) was node 1's own client port.
    wrong_port = free_ports(10)[-1]
    cluster = Cluster(tmp_path / "c", 3, peer_addresses={1: {2: f"127.0.0.1:{wrong_port}"}})
    cluster.start()
    try:
        node1 = cluster.nodes[1]
        node2 = cluster.nodes[2]
        fix = f"yet node 2 connects to this node and gives its Raft address as {node2.raft_address}"
        code, answer = _until(
            "node 1's /readyz names the mistyped address",
            _not_ready_saying(node1, f"cannot connect to node 2 at 127.0.0.1:{wrong_port}", fix),
        )
        assert code == 503
        assert "correct node 2's address in this node's --peers" in answer["reason"]
        shown = cli(node1.client_address, "cluster", "status", "--local")
        assert f"node 2: Raft link FAILING: cannot connect to node 2 at 127.0.0.1:{wrong_port}" in (
            shown.stdout
        ), shown.stdout
        _until(
            "node 1 logs it as a warning",
            lambda: "WARNING" in node1.stderr_text() and fix in node1.stderr_text(),
        )

        node1.terminate()
        args = node1.extra_args
        position = args.index("--peers")
        node1.extra_args = [
            *args[: position + 1],
            args[position + 1].replace(f"127.0.0.1:{wrong_port}", node2.raft_address),
            *args[position + 2 :],
        ]
        node1.start()
        cluster.leader(timeout_s=30)
        for node in cluster.nodes.values():
            _until(f"node {node.node_id} ready", lambda node=node: _readyz(node)[0] == 200)
        assert all(m["refused"] is None for m in node1.http_json("/api/overview")["members"])
    finally:
        cluster.stop()


def test_a_peers_list_naming_another_node_at_this_nodes_address_says_so(
    tmp_path: Path,
) -> None:
    """Node 3 restarted with the entries of nodes 2 and 3 swapped in ``--peers`` was
    refused with only ``another process runs node 3`` (node 2 answered at the address
    listed for node 3): the sentence now also names the list as the possible mistake
    and the address this process announces."""
    cluster = Cluster(tmp_path / "c", 3)
    cluster.start()
    try:
        cluster.leader()
        node3 = cluster.nodes[3]
        node3.terminate()
        raft = {n: f"127.0.0.1:{cluster.ports[n][1]}" for n in cluster.ports}
        swapped = f"1={raft[1]},2={raft[3]},3={raft[2]}"
        client, _, http = cluster.ports[3]
        done = subprocess.run(
            [sys.executable, "-m", "futureq.cli.server_main", "start", "--shards", "1",
             "--node-id", "3", "--data-dir", str(node3.data_dir),
             "--listen", f"127.0.0.1:{client}", "--http", f"127.0.0.1:{http}",
             "--raft-listen", raft[3], "--peers", swapped, *cluster.auth_args],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr[-2000:]
        assert f"node 3's Raft address {raft[2]} (from --peers) already accepts" in done.stderr
        assert (
            "if --peers gives node 3 a wrong address, correct it: this process announces "
            f"its Raft address as {raft[3]}"
        ) in done.stderr, done.stderr[-2000:]
    finally:
        cluster.stop()


def test_a_node_that_may_lead_but_gets_no_votes_names_the_voters_it_waits_for(
    tmp_path: Path,
) -> None:
    """With nodes 1 and 2 of a 3-node cluster stopped, node 3 (recovered, in bound) said
    only ``no leader is known yet (this node is pre_candidate)`` on ``/readyz``, in the
    NO_LEADER alarm and in ``cluster status``: now each names the voters that do not
    answer its campaign."""
    cluster = Cluster(tmp_path / "c", 3)
    cluster.start()
    try:
        cluster.leader()
        node3 = cluster.nodes[3]
        cluster.nodes[1].terminate()
        cluster.nodes[2].terminate()
        code, answer = _until(
            "node 3's /readyz names the silent voters",
            _not_ready_saying(node3, "node(s) 1, 2 do not answer"),
        )
        assert code == 503
        assert "asks for votes" in answer["reason"] and "of the 2 it needs" in answer["reason"]
        alarms = node3.http_json("/api/overview")["alarms"]
        (text,) = [a["text"] for a in alarms if a["name"] == "NO_LEADER"]
        assert "node 3 asks for votes" in text and "node(s) 1, 2 do not answer" in text, text
        view = json.loads(cli(node3.client_address, "cluster", "status", "--json").stdout)
        assert view["last_campaign"]["silent"] == [1, 2], view
        assert view["last_campaign"]["granted"] == [3] and view["last_campaign"]["needed"] == 2
        shown = cli(node3.client_address, "cluster", "status")
        assert "NOT ANSWERING: 1, 2; REFUSING: none" in shown.stdout, shown.stdout
    finally:
        cluster.stop()


def test_a_node_moved_to_another_raft_address_is_named_by_the_leader(tmp_path: Path) -> None:
    """A follower restarted on another Raft port (its own ``--peers`` entry corrected,
    the others' not yet) connected to the leader, which kept its old address, as for a
    twin: the leader logged only "is another process running with node N's id?", its
    cluster status showed the node as a voter with match index 0 and no failing link,
    and it raised no alarm; the moved node's /readyz said only that it waited for its
    peers. Now the link, the alarm and the log name the address the node gives and what
    to correct, and the moved node names the peers that never connect back."""
    cluster = Cluster(tmp_path / "c", 3)
    cluster.start()
    try:
        leader = cluster.leader()
        moved = next(n for n in cluster.nodes.values() if n is not leader)
        (port,) = free_ports(1)
        old, new = moved.raft_address, f"127.0.0.1:{port}"
        moved.terminate()
        moved.raft_address = new
        moved._port_args = [new if arg == old else arg for arg in moved._port_args]
        entry = f"{moved.node_id}={old}"
        moved.extra_args = [
            arg.replace(entry, f"{moved.node_id}={new}") for arg in moved.extra_args
        ]
        moved.start()
        sentence = (
            f"cannot connect to node {moved.node_id} at {old} (its address in cluster.peers, "
            "--peers, or recorded by the cluster)"
        )
        gives = f"gives its Raft address as {new}: correct node {moved.node_id}'s address"
        (text,) = _until(
            "the leader's MEMBER_UNREACHABLE alarm names the moved node",
            lambda: [
                a["text"]
                for a in leader.http_json("/api/overview")["alarms"]
                if a["name"] == "MEMBER_UNREACHABLE" and gives in a["text"]
            ],
        )
        assert text.startswith(
            f"node {moved.node_id} does not answer the leader (it connects, but the leader "
            "cannot reach it); its Raft link is refused: "
        ), text
        assert sentence in text, text
        shown = cli(leader.client_address, "cluster", "status")
        assert f"node {moved.node_id}: Raft link FAILING: {sentence}" in shown.stdout, shown.stdout
        logged = leader.stderr_path.read_text()
        assert f"if node {moved.node_id} moved to {new}, correct its entry" in logged
        # The moved node: its peers take its connections but never connect back.
        code, answer = _until(
            "the moved node's /readyz says its peers do not connect back",
            _not_ready_saying(
                moved,
                f"node {leader.node_id}: node {leader.node_id} takes this node's Raft "
                "connection but has not connected back",
            ),
        )
        assert (
            f"this node's Raft address is {new}: correct this node's entry in node "
            f"{leader.node_id}'s --peers"
        ) in answer["reason"], answer
    finally:
        cluster.stop()


def test_a_joined_node_restarted_on_another_raft_address_is_recorded_there(
    tmp_path: Path,
) -> None:
    """Node 4, joined with ``--join``, restarted on another Raft port: its peers dialled
    the address the cluster recorded, it knew theirs only from their connections, so
    nobody reached anybody; it waited for good, and ``cluster add-node 4 NEW ...`` was
    refused (``node 4 is already a voter``). The node now asks the cluster to record its
    new addresses, and ``add-node`` records a voter's new addresses."""
    cluster = Cluster(tmp_path / "c", 3)
    cluster.start()
    try:
        leader = cluster.leader()
        client_port, raft_port, http_port = free_ports(3)
        joiner = ClusterNode(
            4,
            tmp_path / "node4",
            (client_port, raft_port, http_port),
            ["--join", leader.client_address, *cluster.auth_args],
        )
        cluster.nodes[4] = joiner
        joiner.start()

        def status() -> dict[str, Any]:
            shown = cli(leader.client_address, "cluster", "status", "--json")
            return json.loads(shown.stdout) if shown.returncode == 0 else {}

        def member_4() -> dict[str, Any]:
            return next((m for m in status().get("nodes", []) if m["node_id"] == 4), {})

        _until("node 4 is a voter", lambda: 4 in status().get("voters", []))
        (port,) = free_ports(1)
        old, new = joiner.raft_address, f"127.0.0.1:{port}"
        joiner.terminate()
        joiner.raft_address = new
        joiner._port_args = [new if arg == old else arg for arg in joiner._port_args]
        joiner.start()
        _until(
            "the leader reaches node 4 at its new address",
            lambda: member_4().get("raft_address") == new and member_4().get("lag") == 0,
        )
        assert "the cluster now records raft " + new in joiner.stderr_path.read_text()
        assert _until("node 4 is ready", lambda: _readyz(joiner)[0] == 200)

        # The operator's way: add-node on a voter records its new addresses.
        done = cli(leader.client_address, "cluster", "add-node", "4", old, joiner.client_address)
        assert done.returncode == 0, done.stderr
        _until(
            "node 4 is recorded at the address given", lambda: member_4().get("raft_address") == old
        )
        done = cli(leader.client_address, "cluster", "add-node", "4", old, joiner.client_address)
        assert "[INVALID_ARGUMENT] node 4 is already a voter" in done.stderr, done.stderr
        # A voter of --peers: its address is corrected there.
        raft_2, client_2 = (f"127.0.0.1:{p}" for p in free_ports(30)[-2:])  # none of the above
        done = cli(leader.client_address, "cluster", "add-node", "2", raft_2, client_2)
        assert done.returncode == 1
        assert "its Raft address comes from cluster.peers (--peers)" in done.stderr, done.stderr
    finally:
        cluster.stop()


def test_add_node_with_one_address_for_both_ports_is_refused(tmp_path: Path) -> None:
    """``cluster add-node 4 H:P H:P`` was accepted: node 4 became a learner booked with
    one address for its Raft and client ports, which no node can serve."""
    cluster = Cluster(tmp_path / "c", 1)
    cluster.start()
    try:
        leader = cluster.leader()
        (port,) = free_ports(1)
        address = f"127.0.0.1:{port}"
        done = cli(leader.client_address, "cluster", "add-node", "4", address, address)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "[INVALID_ARGUMENT] raft_address and client_address are both" in done.stderr
        view = json.loads(cli(leader.client_address, "cluster", "status", "--json").stdout)
        assert view["learners"] == [] and view["voters"] == [1]
    finally:
        cluster.stop()


def test_add_node_at_a_members_address_spelled_otherwise_is_refused(tmp_path: Path) -> None:
    """``cluster add-node 4 localhost:P ...`` with node 1 at ``127.0.0.1:P`` was accepted
    (addresses were compared as text): node 4 became a learner whose Raft address was
    node 1's own port. The same for a client address, and for one address given for
    both ports in two spellings."""
    cluster = Cluster(tmp_path / "c", 1)
    cluster.start()
    try:
        leader = cluster.leader()
        raft_port = leader.raft_address.rpartition(":")[2]
        client_port = leader.client_address.rpartition(":")[2]
        (free,) = free_ports(1)
        attempts = [
            (
                f"localhost:{raft_port}",
                f"127.0.0.1:{free}",
                f"node 1 already uses {leader.raft_address}, which localhost:{raft_port} also names",
            ),
            (
                f"127.0.0.1:{free}",
                f"[::ffff:127.0.0.1]:{client_port}",
                f"node 1 already uses {leader.client_address}",
            ),
            (f"localhost:{free}", f"127.0.0.1:{free}", "raft_address and client_address are both"),
        ]
        for raft, client, sentence in attempts:
            done = cli(leader.client_address, "cluster", "add-node", "4", raft, client)
            assert done.returncode == 1, done.stdout + done.stderr
            assert f"[INVALID_ARGUMENT] {sentence}" in done.stderr, done.stderr
        view = json.loads(cli(leader.client_address, "cluster", "status", "--json").stdout)
        assert view["learners"] == [] and view["voters"] == [1]
    finally:
        cluster.stop()


def test_transfer_leader_to_a_node_that_does_not_take_over_says_so(tmp_path: Path) -> None:
    """``cluster transfer-leader 3`` with node 3 stopped (SIGSTOP) printed ``leadership
    transferred`` and exited 0 while another node was elected instead; it now names the
    node that leads and exits 1. A transfer that works names the new leader."""
    cluster = Cluster(tmp_path / "c", 3)
    cluster.start()
    try:
        leader = cluster.leader()
        others = [n for n in cluster.nodes.values() if n is not leader]
        stopped, running = others
        done = cli(leader.client_address, "cluster", "transfer-leader", str(running.node_id))
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"node {running.node_id} leads now"
        leader = cluster.leader()
        assert leader is running
        os.kill(stopped.pid, signal.SIGSTOP)
        try:
            done = cli(leader.client_address, "cluster", "transfer-leader", str(stopped.node_id))
            assert done.returncode == 1, done.stdout + done.stderr
            assert f"not to node {stopped.node_id}: node {stopped.node_id} did not take over" in (
                done.stderr
            ), done.stderr
            assert "leadership moved to node" in done.stderr
            # The cluster serves meanwhile, led by one of the running nodes.
            assert cluster.leader(exclude={stopped.node_id}).node_id != stopped.node_id
        finally:
            os.kill(stopped.pid, signal.SIGCONT)
    finally:
        cluster.stop()


def test_garbage_on_the_raft_port_cannot_flood_the_log(tmp_path: Path) -> None:
    """Each connection of random bytes to the Raft port got a WARNING of its own (the
    sentence quoted its frame length, so the once-per-10 s limit never applied): 200
    connections logged 200 lines in 0.1 s. Lines that differ only in what the peer sent
    now count as one; the refusal is still logged, once."""
    cluster = Cluster(tmp_path / "c", 1)
    cluster.start()
    try:
        (node,) = cluster.nodes.values()
        cluster.leader()
        host, port = node.raft_address.split(":")
        rng = random.Random(7)
        for number in range(60):
            # A frame length that differs each time, and a handshake-sized junk body.
            data = (1_000_000 + number).to_bytes(4, "big") + rng.randbytes(40)
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.sendall(data)
                while sock.recv(65536):  # the node answers, logs, then closes
                    pass
        lines = [
            line
            for line in node.stderr_text().splitlines()
            if "WARNING" in line and "raft peer connection closed" in line
        ]
        assert 1 <= len(lines) <= 2, lines[:5]  # 2: a very slow run crossed the 10 s
        assert "exceeds the limit" in lines[0]
    finally:
        cluster.stop()


def test_tls_http_and_clients_on_the_raft_port_are_named(tmp_path: Path) -> None:
    """A TLS handshake (a peer with peer mutual TLS dialling a node without it), an HTTP
    request and an SSH client on the Raft port got ``frame of 369295618 bytes exceeds
    the limit of 8192 bytes; send smaller batches or payloads``, and a futureq client's
    HELLO ``the first raft frames must be the futureq-raft handshake``: the refusal and
    the log now say what connected and what to fix."""
    cluster = Cluster(tmp_path / "c", 1)
    cluster.start()
    try:
        (node,) = cluster.nodes.values()
        cluster.leader()
        host, port = node.raft_address.split(":")
        hello = msgpack.packb([1, 1, 3, None])
        probes = {
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64): (
                "a TLS handshake arrived on this node's Raft port, which runs without TLS"
            ),
            b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n": "point HTTP probes and browsers at server.http",
            b"SSH-2.0-OpenSSH_9.6\r\n": "an SSH client connected to the Raft port",
            len(hello).to_bytes(4, "big") + hello: (
                "a futureq client's frame arrived on the Raft port (cluster.raft_listen): "
                "clients connect to the client port (server.listen)"
            ),
        }
        for data, sentence in probes.items():
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.sendall(data)
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
            refused = msgpack.unpackb(answer[4:])
            assert refused[2] == "refused" and sentence in refused[4], refused
            _until(f"the log says {sentence!r}", lambda s=sentence: s in node.stderr_text())
    finally:
        cluster.stop()
