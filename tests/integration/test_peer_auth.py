"""Issue 7, part 1: anyone who can reach a Raft port could write to the replicated log.

Real 3-node clusters of ``futureq start`` processes. A hostile process that knows the
addresses and node ids connects to a follower's Raft port, claims to be the leader and
sends one AppendEntries with term + 100 carrying a PUBLISH to topic ``injected``
(``peer_attacks.forged_append_entries``). It does so without the secret, with a wrong
one, by replaying, relaying or reflecting a real handshake, by injecting bytes into a
live link, and under mutual TLS without a certificate, with another CA's, with another
node's, and by replaying a TLS session. After each: the refusal is counted, the term did
not move, no node has the topic, and every node applied the same state at the same
index. The same input against a cluster run with ``--insecure-peers`` is applied, which
shows the input is the real attack. Also: the start-up refusal, the warning of
``--insecure-peers``, the port-mode log lines, and joins without the right secret.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import trustme
from cluster_process import Cluster, ClusterNode, free_ports
from peer_attacks import (
    INJECTED_TOPIC,
    RawPeer,
    Relay,
    converged,
    forged_append_entries,
    old_handshake,
    refusal_in,
    refusals,
    unchanged,
    wait_refused,
)
from wire_client import WireClient

from futureq.raft import peer_auth
from futureq.raft.messages import NodeId
from futureq.wire import frames
from futureq.wire.codec import encode_value

# Longer elections than the default so a loaded CI machine does not hold one by itself
# while a test checks that the term did not move.
QUIET_ENV = {"FUTUREQ_CLUSTER_ELECTION_TIMEOUT_TICKS": "20"}
WRONG_SECRET = b"a secret that is not the cluster's, 40 bytes"

pytestmark = pytest.mark.timeout(180)


def _roles(cluster: Cluster) -> tuple[ClusterNode, ClusterNode, ClusterNode]:
    """(leader, a follower to attack, the other follower)."""
    leader = cluster.leader()
    followers = [n for n in cluster.nodes.values() if n.node_id != leader.node_id]
    return leader, followers[0], followers[1]


def _hello(
    target: ClusterNode, claimed: ClusterNode, nonce: bytes | None = None
) -> peer_auth.Hello:
    return peer_auth.Hello(
        "futureq",
        NodeId(claimed.node_id),
        NodeId(target.node_id),
        claimed.raft_address,
        claimed.client_address,
        nonce or os.urandom(32),
    )


def _challenge(peer: RawPeer) -> peer_auth.Challenge:
    frame = peer_auth.parse_frame(peer.receive())
    assert isinstance(frame, peer_auth.Challenge), frame
    return frame


# --- a cluster with a secret, node 1 reaching node 2 through a relay -----------------------


@pytest.fixture(scope="module")
def secret_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Relay]]:
    relay = Relay(0)
    cluster = Cluster(
        tmp_path_factory.mktemp("secret"),
        3,
        env=QUIET_ENV,
        peer_addresses={1: {2: relay.address}},
    )
    relay.target_port = cluster.ports[2][1]
    try:
        cluster.start()
        cluster.leader()
        # Something in the log, and a recorded connection from node 1 to node 2.
        assert isinstance(
            WireClient(cluster.leader().client_address).publish([["real", b"x", 0, None, None]]),
            frames.PublishOk,
        )
        relay.wait_for(
            "connection", lambda: relay.connections and len(relay.connections[0].forward) > 200
        )
        yield cluster, relay
    finally:
        cluster.stop()
        relay.close()


def _forge(cluster: Cluster) -> tuple[ClusterNode, ClusterNode, bytes]:
    leader, target, _ = _roles(cluster)
    status = converged(cluster)[target.node_id]
    return leader, target, forged_append_entries(target, status, leader.node_id)


@pytest.mark.parametrize("attack", ["old handshake", "no proof", "wrong secret", "reflected proof"])
def test_forged_append_entries_without_the_secret_is_refused(
    secret_cluster: tuple[Cluster, Relay], attack: str
) -> None:
    cluster, _ = secret_cluster
    with unchanged(cluster):
        leader, target, message = _forge(cluster)
        before = refusals(target)
        peer = RawPeer(target.raft_address)
        if attack == "old handshake":
            peer.send(old_handshake("futureq", leader.node_id, leader.raft_address))
            peer.send(encode_value(message))
            reason = "protocol"
        else:
            hello = _hello(target, leader)
            peer.send(encode_value(hello.to_wire()))
            challenge = _challenge(peer)
            if attack == "no proof":
                proof, session = b"", None
            elif attack == "reflected proof":
                proof, session = challenge.proof, None  # the node's own proof, echoed
            else:
                transcript = peer_auth.transcript_hash(hello, challenge)
                proof = peer_auth.connector_proof(WRONG_SECRET, transcript)
                session = peer_auth.FrameSealer(peer_auth.session_key(WRONG_SECRET, transcript))
            peer.send(encode_value(peer_auth.Proof(proof).to_wire()))
            peer.send(encode_value(session.seal(message) if session else message))
            reason = "secret"
        answer = peer.wait_closed()
        wait_refused(target, reason, before)
        if attack != "old handshake":
            assert refusal_in(answer) is not None, answer
    assert "raft peer connection refused" in target.stderr_text()


def test_replayed_handshake_is_refused(secret_cluster: tuple[Cluster, Relay]) -> None:
    """The bytes node 1 sent node 2 on a real connection (HELLO, PROOF, sealed frames),
    replayed to node 2 with the forged message after them."""
    cluster, relay = secret_cluster
    recorded = bytes(relay.connections[0].forward)
    node2 = cluster.nodes[2]
    with unchanged(cluster):
        _, _, message = _forge(cluster)
        before = refusals(node2)
        peer = RawPeer(node2.raft_address)
        peer.send(recorded + encode_value(message))
        assert "failed the cluster secret challenge" in (refusal_in(peer.wait_closed()) or "")
        wait_refused(node2, "secret", before)


def test_handshake_relayed_to_another_node_is_refused(
    secret_cluster: tuple[Cluster, Relay],
) -> None:
    """A recording of node 1's connection to node 2 played to node 3; then the relay,
    live, hands node 1's connections for node 2 to node 3."""
    cluster, relay = secret_cluster
    node1, node3 = cluster.nodes[1], cluster.nodes[3]
    with unchanged(cluster):
        before = refusals(node3)
        peer = RawPeer(node3.raft_address)
        peer.send(bytes(relay.connections[0].forward))
        assert "addressed node 2 but this is node 3" in (refusal_in(peer.wait_closed()) or "")
        wait_refused(node3, "identity", before)

        before_1, before_3 = refusals(node1), refusals(node3)
        relay.target_port = cluster.ports[3][1]
        relay.reset()
        wait_refused(node3, "identity", before_3)
        wait_refused(node1, "refused", before_1)
        relay.target_port = cluster.ports[2][1]
        # Counted before the reset: node 1 may reconnect while `unchanged` checks the
        # cluster, and that reconnection is the one this waits for.
        count = len(relay.connections)
        relay.reset()
    relay.wait_for("reconnection to node 2", lambda: len(relay.connections) > count)


def test_bytes_injected_into_a_live_link_are_refused(secret_cluster: tuple[Cluster, Relay]) -> None:
    """A man in the middle lets node 1 and node 2 complete their handshake, then slips
    the forged AppendEntries into the stream (it cannot compute the frame MAC)."""
    cluster, relay = secret_cluster
    node2 = cluster.nodes[2]
    with unchanged(cluster) as statuses:
        message = forged_append_entries(node2, statuses[2], cluster.leader().node_id)
        before = refusals(node2)
        count = len(relay.connections)
        relay.inject = encode_value(bytes(8) + bytes(32) + message)
        relay.reset()  # node 1 reconnects through the relay
        relay.wait_for("injection", lambda: any(c.injected for c in relay.connections[count:]))
        wait_refused(node2, "frame", before)
    assert "MAC does not match" in node2.stderr_text()


def test_a_node_without_the_right_secret_cannot_join(
    secret_cluster: tuple[Cluster, Relay], tmp_path: Path
) -> None:
    cluster, _ = secret_cluster
    leader = cluster.leader()
    wrong = tmp_path / "wrong.secret"
    wrong.write_bytes(WRONG_SECRET)
    wrong.chmod(0o600)
    cases = [
        (["--cluster-secret-file", str(wrong)], "could not prove it holds our cluster secret"),
        (["--insecure-peers"], "requires a cluster secret and this node has none"),
    ]
    for number, (auth, sentence) in enumerate(cases):
        client_port, raft_port, http_port = free_ports(3)
        done = subprocess.run(
            [sys.executable, "-m", "futureq.cli.server_main", "start", "--shards", "1",
             "--node-id", str(7 + number),
             "--data-dir", str(tmp_path / f"join{number}"), "--listen", f"127.0.0.1:{client_port}",
             "--http", f"127.0.0.1:{http_port}", "--raft-listen", f"127.0.0.1:{raft_port}",
             "--join", leader.client_address, *auth],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr[-2000:]
        assert "futureq: cannot join the cluster at" in done.stderr
        assert sentence in done.stderr
    view = WireClient(leader.client_address).request(frames.ClusterStatus(1)).status
    assert view["learners"] == [] and sorted(view["voters"]) == [1, 2, 3]


def test_a_node_with_a_wrong_client_token_cannot_join(tmp_path: Path) -> None:
    """Found by joining a cluster that requires a token with the wrong one: the node
    retried for ever, logging the refusal every few seconds, while it looked started.
    It now stops with exit code 2 naming the setting, as for a wrong secret."""
    cluster = Cluster(tmp_path / "one", 1, env={"FUTUREQ_SERVER_AUTH_TOKEN": "the-right-token"})
    cluster.start()
    try:
        (member,) = cluster.nodes.values()
        client_port, raft_port, http_port = free_ports(3)
        done = subprocess.run(
            [sys.executable, "-m", "futureq.cli.server_main", "start", "--shards", "1",
             "--node-id", "2",
             "--data-dir", str(tmp_path / "joiner"), "--listen", f"127.0.0.1:{client_port}",
             "--http", f"127.0.0.1:{http_port}", "--raft-listen", f"127.0.0.1:{raft_port}",
             "--join", member.client_address, *cluster.auth_args],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "FUTUREQ_SERVER_AUTH_TOKEN": "a-wrong-token"},
        )  # fmt: skip
        assert done.returncode == 2, done.stderr[-2000:]
        assert "futureq: cannot join the cluster at" in done.stderr
        assert "server.auth_token" in done.stderr
    finally:
        cluster.stop()


def test_each_port_says_how_it_is_protected(secret_cluster: tuple[Cluster, Relay]) -> None:
    cluster, _ = secret_cluster
    text = cluster.nodes[3].stderr_text()
    assert "client port 127.0.0.1:" in text and "plaintext (no TLS), no auth token" in text
    assert f"raft port {cluster.nodes[3].raft_address}: cluster secret" in text
    assert "HTTP port 127.0.0.1:" in text and "no authentication" in text


# --- mutual TLS ----------------------------------------------------------------------------


def _write_cert(root: Path, name: str, cert: trustme.LeafCert) -> list[str]:
    cert_path, key_path = root / f"{name}.pem", root / f"{name}.key"
    for number, pem in enumerate(cert.cert_chain_pems):
        pem.write_to_path(str(cert_path), append=number > 0)
    cert.private_key_pem.write_to_path(str(key_path))
    return ["--tls-cert", str(cert_path), "--tls-key", str(key_path)]


@pytest.fixture(scope="module")
def tls_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Cluster, Relay, trustme.CA, dict[int, trustme.LeafCert]]]:
    root = tmp_path_factory.mktemp("mtls")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    certs = {
        n: ca.issue_cert("127.0.0.1", peer_auth.node_dns_name("futureq", n)) for n in (1, 2, 3)
    }
    relay = Relay(0)
    cluster = Cluster(
        root,
        3,
        env=QUIET_ENV,
        extra_args=["--tls-ca", str(root / "ca.pem")],
        node_args={n: _write_cert(root, f"node{n}", cert) for n, cert in certs.items()},
        secret=False,
        peer_addresses={1: {2: relay.address}},
    )
    relay.target_port = cluster.ports[2][1]
    try:
        cluster.start()
        cluster.leader()
        relay.wait_for(
            "connection", lambda: relay.connections and len(relay.connections[0].forward) > 2000
        )
        yield cluster, relay, ca, certs
    finally:
        cluster.stop()
        relay.close()


def _client_context(ca: trustme.CA | None, cert: trustme.LeafCert | None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if ca is not None:
        ca.configure_trust(context)
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert is not None:
        cert.configure_cert(context)
    return context


@pytest.mark.parametrize("attack", ["plain TCP", "no certificate", "another CA", "replayed TLS"])
def test_mtls_refuses_peers_without_a_valid_certificate(
    tls_cluster: tuple[Cluster, Relay, trustme.CA, dict[int, trustme.LeafCert]], attack: str
) -> None:
    cluster, relay, ca, _ = tls_cluster
    with unchanged(cluster):
        leader, target, message = _forge(cluster)
        attack_bytes = old_handshake("futureq", leader.node_id, leader.raft_address)
        attack_bytes += encode_value(_hello(target, leader).to_wire()) + encode_value(message)
        context = None
        if attack == "no certificate":
            context = _client_context(ca, None)
        elif attack == "another CA":
            other = trustme.CA()
            context = _client_context(
                None, other.issue_cert(peer_auth.node_dns_name("futureq", leader.node_id))
            )
        elif attack == "replayed TLS":
            target = cluster.nodes[2]  # the recording is of a connection to node 2
            attack_bytes = bytes(relay.connections[0].forward) + encode_value(message)
        try:
            peer = RawPeer(target.raft_address, context)
        except (ssl.SSLError, OSError):
            return  # refused during the TLS handshake itself
        peer.send(attack_bytes)
        assert refusal_in(peer.wait_closed()) is None  # nothing a peer could read came back


def test_mtls_certificate_of_another_node_is_refused(
    tls_cluster: tuple[Cluster, Relay, trustme.CA, dict[int, trustme.LeafCert]],
) -> None:
    """The other follower's real certificate, used to claim to be the leader."""
    cluster, _, ca, certs = tls_cluster
    with unchanged(cluster):
        leader, target, message = _forge(cluster)
        other = next(n for n in cluster.nodes if n not in (leader.node_id, target.node_id))
        before = refusals(target)
        peer = RawPeer(target.raft_address, _client_context(ca, certs[other]))
        peer.send(encode_value(_hello(target, leader).to_wire()))
        peer.send(encode_value(peer_auth.Proof(b"").to_wire()) + encode_value(message))
        refusal = refusal_in(peer.wait_closed()) or ""
        assert f"claims node {leader.node_id} but its certificate names nodes [{other}]" in refusal
        wait_refused(target, "certificate", before)


def test_mtls_certificate_of_the_same_node_id_in_another_cluster_is_refused(
    tls_cluster: tuple[Cluster, Relay, trustme.CA, dict[int, trustme.LeafCert]],
) -> None:
    """Tried as a node of another cluster signed by the same CA (a company CA serving
    staging and production): the right node id, but named for cluster ``staging``. It is
    refused whether its HELLO names its own cluster or this one."""
    cluster, _, ca, _ = tls_cluster
    with unchanged(cluster):
        leader, target, message = _forge(cluster)
        staging = ca.issue_cert("127.0.0.1", peer_auth.node_dns_name("staging", leader.node_id))
        for claimed_cluster, sentence in (
            ("staging", "peer belongs to cluster 'staging'"),
            ("futureq", f"claims node {leader.node_id} but its certificate names no node"),
        ):
            before = refusals(target)
            peer = RawPeer(target.raft_address, _client_context(ca, staging))
            hello = attrs.evolve(_hello(target, leader), cluster_id=claimed_cluster)
            peer.send(encode_value(hello.to_wire()))
            peer.send(encode_value(peer_auth.Proof(b"").to_wire()) + encode_value(message))
            refusal = refusal_in(peer.wait_closed()) or ""
            assert sentence in refusal, refusal
            wait_refused(
                target, "cluster" if claimed_cluster == "staging" else "certificate", before
            )


# --- the control: the same input against an unauthenticated cluster -------------------------


def test_insecure_peers_apply_the_forged_entry_and_warn_at_every_start(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 3, env=QUIET_ENV, extra_args=["--insecure-peers"], secret=False)
    try:
        cluster.start()
        # The forged entry goes right after the target's applied index, read a moment
        # before it arrives. If the real leader commits an entry in between, the target
        # answers "already committed" and ignores it, as Raft says it must: forge again
        # from a fresh status (the term only grows).
        for _ in range(3):
            leader, target, message = _forge(cluster)
            term = converged(cluster)[target.node_id]["term"]
            with contextlib.closing(RawPeer(target.raft_address)) as peer:
                peer.send(encode_value(_hello(target, leader).to_wire()))
                assert _challenge(peer).proof == b""
                peer.send(encode_value(peer_auth.Proof(b"").to_wire()) + encode_value(message))
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    status = target.http_json("/api/status")
                    if INJECTED_TOPIC in {t["topic"] for t in status["topics"]}:
                        break
                    time.sleep(0.05)
            if INJECTED_TOPIC in {t["topic"] for t in status["topics"]}:
                break
        else:
            raise AssertionError(
                f"the forged entry was not applied: {status}\n{target.stderr_text()[-3000:]}"
            )
        assert status["term"] >= term + 100
        target.restart()
        assert target.stderr_text().count("peers are NOT authenticated") == 2
        assert "UNAUTHENTICATED" in target.stderr_text()
    finally:
        cluster.stop()


# --- starting up ---------------------------------------------------------------------------


def _start(
    tmp_path: Path, *args: str, wait_ready: bool = False
) -> subprocess.CompletedProcess[str] | str:
    client_port, raft_port, http_port = free_ports(3)
    command = [
        sys.executable, "-m", "futureq.cli.server_main", "start", "--shards", "1",
        "--node-id", "1", "--data-dir", str(tmp_path / "data"), "--listen", f"127.0.0.1:{client_port}",
        "--http", f"127.0.0.1:{http_port}", "--raft-listen", f"127.0.0.1:{raft_port}",
        "--peers", f"1=127.0.0.1:{raft_port},2=127.0.0.1:{free_ports(1)[0]}", *args,
    ]  # fmt: skip
    if not wait_ready:
        return subprocess.run(command, capture_output=True, text=True, timeout=60)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("READY ")
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    return stderr


def test_a_node_with_peers_and_nothing_to_authenticate_them_refuses_to_start(
    tmp_path: Path,
) -> None:
    done = _start(tmp_path)
    assert isinstance(done, subprocess.CompletedProcess)
    assert done.returncode == 2
    assert "must authenticate them" in done.stderr
    for flag in (
        "--cluster-secret-file",
        "--tls-cert",
        "--tls-key",
        "--tls-ca",
        "--insecure-peers",
    ):
        assert flag in done.stderr
    assert not (tmp_path / "data").exists()  # refused before touching anything


def test_secret_files_that_leak_or_are_empty_refuse_to_start(tmp_path: Path) -> None:
    secret = tmp_path / "cluster.secret"
    for data, mode, sentence in [
        (b"x" * 64, 0o644, "can be read by every user (mode 0644); restrict it with `chmod 600"),
        (b"", 0o600, "is empty"),
    ]:
        secret.write_bytes(data)
        secret.chmod(mode)
        done = _start(tmp_path, "--cluster-secret-file", str(secret))
        assert isinstance(done, subprocess.CompletedProcess)
        assert done.returncode == 2 and sentence in done.stderr, done.stderr
    done = _start(tmp_path, "--cluster-secret-file", str(tmp_path / "missing"))
    assert isinstance(done, subprocess.CompletedProcess)
    assert done.returncode == 2 and "does not exist; create it with" in done.stderr


def test_client_tls_without_a_ca_does_not_leave_the_raft_port_silently_plain(
    tmp_path: Path,
) -> None:
    cert = trustme.CA().issue_cert("127.0.0.1")
    tls = _write_cert(tmp_path, "server", cert)
    done = _start(tmp_path, *tls)
    assert isinstance(done, subprocess.CompletedProcess)
    assert done.returncode == 2 and "must authenticate them" in done.stderr
    secret = tmp_path / "cluster.secret"
    assert subprocess.run(
        [sys.executable, "-m", "futureq.cli.server_main", "generate-secret", str(secret)],
        capture_output=True, timeout=30,
    ).returncode == 0  # fmt: skip
    stderr = _start(tmp_path, *tls, "--cluster-secret-file", str(secret), wait_ready=True)
    assert isinstance(stderr, str)
    assert "TLS, no client certificates, no auth token" in stderr
    assert (
        "cluster secret (HMAC-SHA-256 challenge-response, every frame MACed; not encrypted"
        in stderr
    )
