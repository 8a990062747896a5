"""The StatefulSet of ``k8s/``, run for real on loopback (issue 12).

``k8s_render`` reads the manifests and renders, for pods 0, 1, 2 (and 3), exactly the
command, arguments, environment and mounted files the kubelet would give them; this
test starts those as real processes, with real TLS between peers and towards clients
(certificates from ``trustme`` standing in for the ``futureq-tls`` Secret), and judges
them by the probes the manifest declares. It checks what an operator relies on:

* all pods started at once (``podManagementPolicy: Parallel``) form a cluster, and
  each announces its pod DNS name;
* all pods deleted at once (killed, then restarted together) lose nothing acknowledged;
* a rolling restart, one pod at a time in reverse ordinal order, each waiting for its
  readiness probe before the next, never leaves clients without a leader for longer
  than one election;
* pod 3 rendered from the same template joins as a learner and is promoted; the
  scale-down runbook (remove the member, then the pod) leaves it out for good.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import ssl
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from k8s_render import PodProcess, StatefulSetRenderer, expand, load_manifests, wait_until
from wire_client import WireClient

from futureq.config_loader import load_config
from futureq.errors import ErrorCode
from futureq.wire import codec, frames

BIN_DIR = Path(sys.executable).parent
READY_TIMEOUT_S = 60.0
TOPIC = "k8s"
AUTH_TOKEN = secrets.token_urlsafe(24)
"""The client token of the ``futureq-auth`` Secret (k8s/README.md, "First deploy")."""


@pytest.fixture
def certificates() -> trustme.CA:
    return trustme.CA()


def _secrets(ca: trustme.CA, node_ids: range) -> dict[str, dict[str, bytes]]:
    """The Secrets the StatefulSet mounts, as k8s/README.md says to create them: the CA,
    and for each node id a certificate naming ``node-N.<cluster_id>.futureq`` (what peers
    check), the pod's DNS name and the client service's names; the loopback IP the pod's
    name resolves to here is added."""
    tls: dict[str, bytes] = {"ca.crt": ca.cert_pem.bytes()}
    for node_id in node_ids:
        ordinal = node_id - 1
        cert = ca.issue_cert(
            f"node-{node_id}.futureq.futureq",
            f"futureq-{ordinal}.futureq-headless.futureq.svc.cluster.local",
            "futureq.futureq.svc.cluster.local",
            "futureq.futureq.svc",
            f"127.0.0.{ordinal + 1}",
        )
        tls[f"node-{node_id}.crt"] = b"".join(blob.bytes() for blob in cert.cert_chain_pems)
        tls[f"node-{node_id}.key"] = cert.private_key_pem.bytes()
    return {
        "futureq-tls": tls,
        "futureq-cluster-secret": {"cluster-secret": secrets.token_hex(32).encode()},
        "futureq-auth": {"token": AUTH_TOKEN.encode() + b"\n"},
    }


class K8sCluster:
    """The StatefulSet's pods as processes, plus a client's view of them."""

    def __init__(self, root: Path, ca: trustme.CA) -> None:
        self.renderer = StatefulSetRenderer(root / "pods", _secrets(ca, range(1, 6)), BIN_DIR)
        self.client_ssl = ssl.create_default_context(cafile=None)
        ca.configure_trust(self.client_ssl)
        self.ca_file = root / "ca.pem"
        self.ca_file.write_bytes(ca.cert_pem.bytes())
        self.logs = root / "logs"
        self.logs.mkdir()
        self.pods: dict[int, PodProcess] = {}

    def pod(self, ordinal: int) -> PodProcess:
        if ordinal not in self.pods:
            self.pods[ordinal] = PodProcess(self.renderer.render(ordinal), self.logs)
        return self.pods[ordinal]

    def client_address(self, ordinal: int) -> str:
        return f"{self.renderer.network.pod_ip(ordinal)}:{self.renderer.network.ports[7450]}"

    def dns_address(self, ordinal: int, container_port: int) -> str:
        """What pod ``ordinal``'s DNS name and ``container_port`` map to here."""
        name = f"futureq-{ordinal}.futureq-headless.futureq.svc.cluster.local"
        ip = self.renderer.network.hosts()[name]
        return f"{ip}:{self.renderer.network.ports[container_port]}"

    def connect(self, ordinal_or_address: int | str) -> WireClient:
        address = (
            self.client_address(ordinal_or_address)
            if isinstance(ordinal_or_address, int)
            else ordinal_or_address
        )
        return WireClient(address, ssl_context=self.client_ssl, token=AUTH_TOKEN)

    def start_all(self, ordinals: list[int]) -> None:
        """Start the pods together, then wait for each one's startup and readiness
        probes (the client service routes to ready pods only)."""
        for ordinal in ordinals:
            self.pod(ordinal).start()
        for ordinal in ordinals:
            self.pod(ordinal).wait_probe("startupProbe")
        for ordinal in ordinals:
            self.pod(ordinal).wait_probe("readinessProbe", timeout_s=READY_TIMEOUT_S)

    def cluster_status(self, ordinal: int) -> dict[str, object]:
        client = self.connect(ordinal)
        try:
            answer = client.request(frames.ClusterStatus(client.next_id()))
            assert isinstance(answer, frames.ClusterStatusOk), answer
            return answer.status
        finally:
            client.close()

    def stop(self) -> None:
        for pod in self.pods.values():
            pod.kill()


@pytest.fixture
def k8s(tmp_path: Path, certificates: trustme.CA) -> Iterator[K8sCluster]:
    cluster = K8sCluster(tmp_path, certificates)
    try:
        yield cluster
    finally:
        cluster.stop()


class Producer(threading.Thread):
    """Publishes small batches through whichever pod it reaches, following NOT_LEADER
    redirects to the advertised address; records every acknowledged id and when."""

    def __init__(self, k8s: K8sCluster, ordinals: list[int]) -> None:
        super().__init__(daemon=True)
        self.k8s = k8s
        self.addresses = [k8s.client_address(ordinal) for ordinal in ordinals]
        self.acked: list[int] = []
        self.acked_at: list[float] = []
        self.redirects: list[str] = []
        self.stop_event = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by wait_for / finish
            self.failure = exc

    def _run(self) -> None:
        client: WireClient | None = None
        target: str | None = None
        turn = 0
        number = 0
        while not self.stop_event.is_set():
            try:
                if client is None:
                    if target is None:
                        target = self.addresses[turn % len(self.addresses)]
                        turn += 1
                    client = WireClient(
                        target, ssl_context=self.k8s.client_ssl, timeout_s=2.0, token=AUTH_TOKEN
                    )
                number += 1
                items = [[TOPIC, f"{number}:{i}".encode(), 0, None, None] for i in range(10)]
                answer = client.publish(items)
                if isinstance(answer, frames.PublishOk):
                    now = time.monotonic()
                    self.acked.extend(answer.first_id + i for i in range(answer.count))
                    self.acked_at.append(now)
                    continue
                if isinstance(answer, frames.Error) and answer.code == ErrorCode.NOT_LEADER:
                    client.close()
                    client = None
                    target = answer.leader_address
                    if target is not None:
                        self.redirects.append(target)
                    else:
                        time.sleep(0.02)
                    continue
                if isinstance(answer, frames.Error) and ErrorCode(answer.code).retryable:
                    time.sleep(0.02)
                    continue
                if answer is codec.CLOSED:
                    raise ConnectionError("closed")
                raise AssertionError(f"unexpected answer {answer}")
            except (OSError, TimeoutError, ConnectionError, ssl.SSLError):
                if client is not None:
                    client.close()
                client = None
                target = None
                time.sleep(0.02)
        if client is not None:
            client.close()

    def wait_for(self, count: int, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.acked) < count:
            assert self.failure is None, self.failure
            assert time.monotonic() < deadline, f"only {len(self.acked)} of {count} acknowledged"
            time.sleep(0.01)

    def finish(self) -> None:
        self.stop_event.set()
        self.join(30)
        assert self.failure is None, self.failure

    def longest_gap_s(self, since: float, until: float) -> float:
        """Longest time without an acknowledged publish within ``[since, until]``."""
        times = [since, *(t for t in self.acked_at if since <= t <= until), until]
        return max(later - earlier for earlier, later in zip(times, times[1:], strict=False))


def consume_all(
    k8s: K8sCluster, leader_ordinal: int, want: set[int], timeout_s: float = 60.0
) -> set[int]:
    """Consume and ack from the leader until every id in ``want`` was seen."""
    client = k8s.connect(leader_ordinal)
    client.subscribe(TOPIC, "verify", prefetch=1000)
    seen: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while not want <= seen and time.monotonic() < deadline:
        try:
            batch = client.deliveries(1, timeout_s=1.0)
        except TimeoutError:
            continue
        seen.update(delivery[1] for delivery in batch)
        answer = client.request(frames.Ack(client.next_id(), [d[0] for d in batch]))
        assert isinstance(answer, frames.Ok), answer
        client.send(frames.Credit(0, 1, len(batch)))
    client.close()
    return seen


def leader_ordinal(k8s: K8sCluster, ordinals: list[int], timeout_s: float = 20.0) -> int:
    found: list[int] = []

    def one_leads() -> bool:
        for ordinal in ordinals:
            if not k8s.pod(ordinal).alive():
                continue
            try:
                client = k8s.connect(ordinal)
            except OSError:
                continue
            try:
                if client.status().get("role") == "leader":
                    found.append(ordinal)
                    return True
            finally:
                client.close()
        return False

    wait_until(one_leads, timeout_s, "a leader")
    return found[-1]


def one_election_s(k8s: K8sCluster) -> float:
    """The longest election timeout of the ConfigMap's config: [T, 2T) ticks."""
    configmap = k8s.renderer.manifests[("ConfigMap", "futureq-config")]
    cluster = tomllib.loads(configmap["data"]["futureq.toml"]).get("cluster", {})
    tick_ms = cluster.get("tick_ms", 50)
    ticks = cluster.get("election_timeout_ticks", 10)
    return 2 * tick_ms * ticks / 1000


def test_pods_form_a_cluster_survive_all_deleted_at_once_and_a_rolling_restart(
    k8s: K8sCluster,
) -> None:
    replicas = k8s.renderer.replicas
    assert replicas == 3
    ordinals = list(range(replicas))
    k8s.start_all(ordinals)

    # One cluster of three voters; every pod announces its pod DNS name.
    status = k8s.cluster_status(0)
    assert sorted(status["voters"]) == [1, 2, 3] and status["learners"] == []  # type: ignore[call-overload]
    for member in status["nodes"]:  # type: ignore[attr-defined]
        ordinal = member["node_id"] - 1
        assert member["client_address"] == k8s.dns_address(ordinal, 7450), member
        assert member["raft_address"] == k8s.dns_address(ordinal, 7451), member
    # Found by connecting as any pod of the cluster could: the client port answered
    # without a token, so anyone could publish, delete groups and remove nodes.
    stranger = WireClient(k8s.client_address(0), hello=False, ssl_context=k8s.client_ssl)
    stranger.send(frames.Hello(1, (1,), "stranger", None))
    refused = stranger.receive()
    assert isinstance(refused, frames.Error) and refused.code == ErrorCode.AUTH_FAILED, refused
    stranger.close()

    producer = Producer(k8s, ordinals)
    producer.start()
    producer.wait_for(300)

    # All pods deleted at once: every process dies, then all come back together.
    for ordinal in ordinals:
        k8s.pod(ordinal).kill()
    acked_before = len(producer.acked)
    k8s.start_all(ordinals)
    producer.wait_for(acked_before + 300)

    # Rolling restart, as the StatefulSet controller does it.
    rolling_from = time.monotonic()
    for ordinal in reversed(ordinals):
        pod = k8s.pod(ordinal)
        assert pod.terminate() == 0, pod.log_tail()
        pod.start()
        pod.wait_probe("startupProbe")
        pod.wait_probe("readinessProbe", timeout_s=READY_TIMEOUT_S)
        producer.wait_for(len(producer.acked) + 50)
    rolling_until = time.monotonic()
    producer.wait_for(len(producer.acked) + 100)
    producer.finish()

    gap_s = producer.longest_gap_s(rolling_from, rolling_until)
    # One election at most, plus a second for the client to notice and reconnect.
    bound_s = one_election_s(k8s) + 1.0
    assert gap_s <= bound_s, f"no publish acknowledged for {gap_s:.2f} s during the rolling restart"
    # Redirects carry the advertised (pod DNS) addresses: the producer's, if its
    # reconnections met a follower (they need not: a connection to a node that becomes
    # the leader is kept), and always one a follower is asked for here.
    leader = leader_ordinal(k8s, ordinals)
    follower = k8s.connect(next(o for o in ordinals if o != leader))
    try:
        answer = follower.publish([[TOPIC, b"to a follower", 0, None, None]])
    finally:
        follower.close()
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.NOT_LEADER, answer
    redirects = [*producer.redirects, answer.leader_address]
    advertised = {k8s.dns_address(ordinal, 7450) for ordinal in ordinals}
    assert set(redirects) <= advertised, redirects

    acked = set(producer.acked)
    seen = consume_all(k8s, leader_ordinal(k8s, ordinals), acked)
    missing = acked - seen
    assert not missing, f"{len(missing)} acknowledged messages lost"


def test_a_pod_beyond_the_initial_voters_joins_is_promoted_and_scales_down(
    k8s: K8sCluster,
) -> None:
    initial = list(range(k8s.renderer.replicas))
    k8s.start_all(initial)

    # kubectl scale statefulset futureq --replicas=4: pod 3 from the same template.
    k8s.renderer.network.service_backend = leader_ordinal(k8s, initial)
    k8s.start_all([3])
    wait_until(lambda: 4 in k8s.cluster_status(0)["voters"], 30, "node 4 promoted to voter")  # type: ignore[operator]
    status = k8s.cluster_status(3)
    assert sorted(status["voters"]) == [1, 2, 3, 4] and status["learners"] == []  # type: ignore[call-overload]
    members = {member["node_id"]: member for member in status["nodes"]}  # type: ignore[attr-defined]
    assert members[4]["raft_address"] == k8s.dns_address(3, 7451)
    assert members[4]["client_address"] == k8s.dns_address(3, 7450)

    # Scale down (k8s/README.md, "Scale"): remove the member first ...
    pod3 = k8s.pod(3)
    removed = subprocess.run(
        [str(BIN_DIR / "futureq-cli"), "--server", k8s.client_address(0),
         "--tls-ca", str(k8s.ca_file), f"--token={AUTH_TOKEN}", "cluster", "remove-node", "4"],
        capture_output=True, text=True, timeout=60, env=dict(os.environ),
    )  # fmt: skip
    assert removed.returncode == 0, removed.stderr
    status = k8s.cluster_status(0)
    assert sorted(status["voters"]) == [1, 2, 3] and status["learners"] == []  # type: ignore[call-overload]
    # ... the removed pod hears from no leader any more, so it turns not ready and the
    # client service stops sending clients to it ...
    wait_until(lambda: not pod3.probe("readinessProbe"), 30, "the removed pod not ready")
    # ... and a container restart before the scale-down reaches it does not add it back:
    # a member tells it that it was removed and it stops by itself (exit 0), or, when its
    # log holds its own removal, it runs on, not ready. Which of the two depends on
    # whether the removal entry reached it before the leader stopped replicating to it.
    assert pod3.terminate() == 0, pod3.log_tail()
    pod3.start()
    wait_until(
        lambda: not pod3.alive() or pod3.probe("startupProbe"),
        30,
        "the removed pod started or stopped by itself",
    )
    if not pod3.alive():
        assert pod3.terminate() == 0, pod3.log_tail()
        assert "was removed from the cluster" in pod3.log_tail(), pod3.log_tail()
    status = k8s.cluster_status(0)
    assert sorted(status["voters"]) == [1, 2, 3] and status["learners"] == []  # type: ignore[call-overload]
    assert not pod3.probe("readinessProbe")
    # Then the pod goes (and, with whenScaled: Delete, its volume); the rest serve on.
    assert pod3.terminate() == 0, pod3.log_tail()
    client = k8s.connect(leader_ordinal(k8s, initial))
    answer = client.publish([[TOPIC, b"after scale-down", 0, None, None]])
    assert isinstance(answer, frames.PublishOk), answer
    client.close()


def _same_state(k8s: K8sCluster, ordinal: int, leader: int) -> bool:
    mine = k8s.connect(ordinal)
    theirs = k8s.connect(leader)
    try:
        a, b = mine.status(), theirs.status()
    finally:
        mine.close()
        theirs.close()
    return a["applied_index"] == b["applied_index"] and a["applied_digest"] == b["applied_digest"]


def test_a_pod_whose_volume_was_lost_recovers_under_its_old_id(k8s: K8sCluster) -> None:
    """k8s/README.md, "A lost volume": nothing to do; the blank pod recovers by itself
    (docs/raft.md, "Disk faults")."""
    ordinals = list(range(k8s.renderer.replicas))
    k8s.start_all(ordinals)
    leader = leader_ordinal(k8s, ordinals)
    client = k8s.connect(leader)
    for start in range(0, 100, 50):
        items = [[TOPIC, f"blank-{n}".encode(), 0, None, None] for n in range(start, start + 50)]
        assert isinstance(client.publish(items), frames.PublishOk)
    client.close()
    victim = next(ordinal for ordinal in ordinals if ordinal != leader)
    pod = k8s.pod(victim)
    pod.kill()
    shutil.rmtree(pod.pod.mounts["/var/lib/futureq"])
    pod.start()
    pod.wait_probe("readinessProbe", timeout_s=READY_TIMEOUT_S)
    assert sorted(k8s.cluster_status(leader)["voters"]) == [1, 2, 3]  # type: ignore[call-overload]
    wait_until(lambda: _same_state(k8s, victim, leader), 30, "the blank pod to catch up")


def test_a_pod_whose_volume_was_lost_rejoins_through_the_runbook(k8s: K8sCluster) -> None:
    ordinals = list(range(k8s.renderer.replicas))
    k8s.start_all(ordinals)
    leader = leader_ordinal(k8s, ordinals)
    client = k8s.connect(leader)
    for start in range(0, 200, 50):
        items = [[TOPIC, f"lost-{n}".encode(), 0, None, None] for n in range(start, start + 50)]
        assert isinstance(client.publish(items), frames.PublishOk)
    client.close()

    # The volume of a follower is lost; k8s/README.md, "A lost volume": remove the node
    # id, let the pod come back blank under the same id, add it back as a learner.
    victim = next(ordinal for ordinal in ordinals if ordinal != leader)
    node_id = victim + 1
    pod = k8s.pod(victim)
    pod.kill()
    shutil.rmtree(pod.pod.mounts["/var/lib/futureq"])
    cli = [str(BIN_DIR / "futureq-cli"), "--server", k8s.client_address(leader),
           "--tls-ca", str(k8s.ca_file), f"--token={AUTH_TOKEN}", "cluster"]  # fmt: skip
    done = subprocess.run(
        [*cli, "remove-node", str(node_id)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    pod.start()
    pod.wait_probe("startupProbe")
    add = ["add-node", str(node_id), k8s.dns_address(victim, 7451), k8s.dns_address(victim, 7450)]
    done = subprocess.run([*cli, *add], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    wait_until(
        lambda: sorted(k8s.cluster_status(leader)["voters"]) == [1, 2, 3],  # type: ignore[call-overload]
        30,
        f"node {node_id} promoted again",
    )
    pod.wait_probe("readinessProbe", timeout_s=READY_TIMEOUT_S)

    # It holds the same state as the leader: same applied index, same digest.
    def same_state() -> bool:
        mine = k8s.connect(victim)
        theirs = k8s.connect(leader)
        try:
            a, b = mine.status(), theirs.status()
        finally:
            mine.close()
            theirs.close()
        return (
            a["applied_index"] == b["applied_index"] and a["applied_digest"] == b["applied_digest"]
        )

    wait_until(same_state, 30, "the rebuilt node to hold the leader's state")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(POD_NAME).svc:7450", "futureq-1.svc:7450"),
        ("$(UNDEFINED)-x", "$(UNDEFINED)-x"),  # kept as written
        ("$$(POD_NAME)", "$(POD_NAME)"),  # escaped
        (
            'node_id=$((ordinal + 1)) "${POD_NAME##*-}"',
            'node_id=$((ordinal + 1)) "${POD_NAME##*-}"',
        ),
        ("cost $5 and $(", "cost $5 and $("),
    ],
)
def test_the_renderer_expands_variables_as_kubernetes_does(text: str, expected: str) -> None:
    assert expand(text, {"POD_NAME": "futureq-1"}) == expected


def test_the_manifests_pin_the_shard_count_and_open_every_shards_ports() -> None:
    """``futureq start``'s default shard count (auto) follows the machine's cores, which
    differ from pod to pod and ignore a CPU limit, and shard K listens on every port
    plus 100 K (docs/sharding.md): the ConfigMap must name the count, and the pods,
    both Services and the NetworkPolicy must open each shard's ports."""
    manifests = load_manifests()
    configmap = manifests[("ConfigMap", "futureq-config")]
    node = tomllib.loads(configmap["data"]["futureq.toml"]).get("node", {})
    shards = node.get("shards")
    assert type(shards) is int and shards >= 1, f"node.shards must be a fixed count: {shards!r}"
    stride = node.get("shard_port_stride", 100)
    (container,) = manifests[("StatefulSet", "futureq")]["spec"]["template"]["spec"]["containers"]
    container_ports = {port["containerPort"] for port in container["ports"]}
    headless = {p["port"] for p in manifests[("Service", "futureq-headless")]["spec"]["ports"]}
    clients = {p["port"] for p in manifests[("Service", "futureq")]["spec"]["ports"]}
    policy = {
        port["port"]
        for rule in manifests[("NetworkPolicy", "futureq")]["spec"]["ingress"]
        for port in rule["ports"]
    }
    for shard in range(shards):
        client, raft, http = (port + shard * stride for port in (7450, 7451, 7452))
        assert {client, raft, http} <= container_ports, f"shard {shard}: containerPorts"
        assert {client, raft, http} <= headless, f"shard {shard}: futureq-headless ports"
        assert {client, http} <= clients, f"shard {shard}: futureq service ports"
        assert {client, raft, http} <= policy, f"shard {shard}: NetworkPolicy ports"


_MIB = 1024 * 1024
_COST_BYTES = {
    # What one unit of each bound costs in memory, as measured (docs/operations.md):
    "max_connections": 50 * 1024,  # an idle TLS connection: 48.5 KiB
    "max_deliveries_out": 500,  # limits.max_deliveries_out's row
    "max_subscriptions": 600,  # limits.max_subscriptions's docstring
    "max_groups": 1024,  # 10,000 groups created: +10 MiB
}
_BASE_BYTES = 256 * _MIB
"""Interpreter, RocksDB memtables and caches, and everything not bounded above."""


def test_the_configured_limits_fit_the_pods_memory(tmp_path: Path) -> None:
    """The limits the ConfigMap sets (or the defaults it leaves) allow no more memory,
    at the measured cost of each, than the pod's memory request: with the defaults
    (10,000 connections, 3 x 256 MiB of node buffers, 500,000 deliveries out, 1,000,000
    groups, a 5,000,000-entry due-index) a node could be driven to ~2.7 GiB and
    OOM-killed at its 2Gi limit, then reload the same state and crash-loop. The file is
    also a configuration the broker accepts."""
    manifests = load_manifests()
    text = manifests[("ConfigMap", "futureq-config")]["data"]["futureq.toml"]
    assert "[tls]" in text
    # Its files are the Secret's, mounted only in a pod: the rest is checked as is.
    without_tls = re.sub(r"\[tls\][^\[]*", "", text)
    (tmp_path / "futureq.toml").write_text(without_tls)
    config = load_config(str(tmp_path / "futureq.toml"), env={})
    limits = config.limits
    allowed = _BASE_BYTES + 3 * limits.max_node_buffer_bytes  # out, in, being served
    allowed += sum(getattr(limits, name) * cost for name, cost in _COST_BYTES.items())
    allowed += 40 * config.queue.horizon_max_node_items  # the leader's due-index
    (container,) = manifests[("StatefulSet", "futureq")]["spec"]["template"]["spec"]["containers"]
    request = container["resources"]["requests"]["memory"]
    assert request.endswith("Gi"), request
    request_bytes = int(request.removesuffix("Gi")) * 1024 * _MIB
    assert allowed <= request_bytes, (
        f"the ConfigMap's limits allow ~{allowed / _MIB:,.0f} MiB, more than the pod's "
        f"memory request {request}: lower them (configmap.yaml) or raise the request"
    )
