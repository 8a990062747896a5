"""Who may do what, against a real ``futureq start`` process: per-client tokens from a
credentials file (secrets stored hashed, reloaded on SIGHUP), checked on every frame type,
and the HTTP API, dashboard and /metrics behind a token (issue 10, "Who may do what" and
input 5)."""

from __future__ import annotations

import base64
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
from broker_process import BrokerProcess
from wire_client import WireClient

from futureq.broker.access import new_token
from futureq.errors import ErrorCode
from futureq.wire import codec, frames

ADMIN_TOKEN = "admin-token-for-tests"

CLIENTS: dict[str, dict[str, Any]] = {
    "pub": {"publish": ["orders.>"]},
    "con": {"consume": ["orders.*"]},
    "mgr": {"manage_groups": ["orders.>"]},
    "ops": {"manage_cluster": True},
    "mon": {"monitor": True},
    "none": {},
}


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(f'"{item}"' for item in value) + "]"
    return f'"{value}"'


def write_credentials(path: Path, clients: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Write a credentials file; return each client's token (never stored in the file)."""
    tokens: dict[str, str] = {}
    lines: list[str] = []
    for name, permissions in clients.items():
        token, secret_hash = new_token(name)
        tokens[name] = token
        lines += ["[[client]]", f'name = "{name}"', f'secret_hash = "{secret_hash}"']
        lines += [f"{key} = {_toml_value(value)}" for key, value in permissions.items()]
        lines.append("")
    path.write_text("\n".join(lines))
    return tokens


class Node:
    def __init__(self, broker: BrokerProcess, tokens: dict[str, str], credentials: Path) -> None:
        self.broker = broker
        self.tokens = tokens
        self.credentials = credentials

    def client(self, name: str) -> WireClient:
        token = ADMIN_TOKEN if name == "admin" else self.tokens[name]
        return connect(self.broker.client_address, token)


def connect(address: str, token: str | None) -> WireClient:
    client = WireClient(address, hello=False)
    client.send(frames.Hello(1, (1,), "test", token))
    answer = client.receive()
    assert isinstance(answer, frames.HelloOk), answer
    return client


def start(tmp: Path, env: dict[str, str] | None = None) -> Node:
    credentials = tmp / "clients.toml"
    tokens = write_credentials(credentials, CLIENTS)
    broker = BrokerProcess(
        tmp / "data",
        env={
            "FUTUREQ_SERVER_AUTH_TOKEN": ADMIN_TOKEN,
            "FUTUREQ_SERVER_CREDENTIALS_FILE": str(credentials),
            **(env or {}),
        },
    )
    broker.start()
    return Node(broker, tokens, credentials)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    started = start(tmp_path_factory.mktemp("access"))
    admin = started.client("admin")
    for topic in ("orders.eu", "billing.x"):
        assert isinstance(admin.publish([[topic, b"seed", 60_000, None, None]]), frames.PublishOk)
    admin.close()
    yield started
    started.broker.terminate()


def denied(answer: Any, *words: str) -> frames.Error:
    assert isinstance(answer, frames.Error), answer
    assert answer.code == ErrorCode.PERMISSION_DENIED, (ErrorCode(answer.code).name, answer.message)
    for word in words:
        assert word in answer.message, answer.message
    return answer


def not_denied(answer: Any) -> None:
    if isinstance(answer, frames.Error):
        assert answer.code != ErrorCode.PERMISSION_DENIED, answer.message


# --- HELLO ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "token", [None, "", "pub", "pub:wrong-secret", "nobody:secret", "admin-token"]
)
def test_hello_with_a_missing_or_wrong_token_fails(node: Node, token: str | None) -> None:
    client = WireClient(node.broker.client_address, hello=False)
    client.send(frames.Hello(1, (1,), "test", token))
    answer = client.receive()
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.AUTH_FAILED, answer
    assert client.receive() is codec.CLOSED


def test_secrets_are_stored_hashed(node: Node) -> None:
    text = node.credentials.read_text()
    for token in node.tokens.values():
        assert token.split(":", 1)[1] not in text
    assert text.count('secret_hash = "scrypt$') == len(CLIENTS)


# --- one test per frame type ----------------------------------------------------------


def test_publish(node: Node) -> None:
    pub = node.client("pub")
    assert isinstance(pub.publish([["orders.eu.late", b"x", 0, None, None]]), frames.PublishOk)
    error = denied(
        pub.publish([["orders.eu", b"x", 0, None, None], ["billing.x", b"y", 0, None, None]]),
        "pub",
        "billing.x",
    )
    assert error.item_index == 1
    denied(node.client("con").publish([["orders.eu", b"x", 0, None, None]]), "orders.eu")


def test_subscribe(node: Node) -> None:
    con = node.client("con")
    assert con.subscribe("orders.eu", "s1") > 0
    for topic in ("orders.eu.late", "billing.x"):  # '*' is one token only
        denied(con.request(frames.Subscribe(con.next_id(), topic, "s1", 1)), topic)
    pub = node.client("pub")
    denied(pub.request(frames.Subscribe(pub.next_id(), "orders.eu", "s1", 1)), "orders.eu")


@pytest.mark.parametrize(
    "build",
    [
        lambda rid: frames.Ack(rid, [b"t" * 24]),
        lambda rid: frames.Nack(rid, [b"t" * 24], 0),
        lambda rid: frames.Unsubscribe(rid, 1),
        lambda rid: frames.Credit(rid, 1, 1),
    ],
    ids=["ACK", "NACK", "UNSUBSCRIBE", "CREDIT"],
)
def test_subscription_frames_need_consume(node: Node, build: Callable[[int], Any]) -> None:
    pub = node.client("pub")
    frame = build(pub.next_id())
    denied(pub.request(frame), frame.TYPE.name)
    con = node.client("con")
    not_denied(con.request(build(con.next_id())))  # UNKNOWN_* rather than denied


def test_ack_and_nack_of_own_deliveries(node: Node) -> None:
    admin = node.client("admin")
    assert isinstance(admin.publish([["orders.ack", b"a", 0, None, None]] * 2), frames.PublishOk)
    con = node.client("con")
    con.subscribe("orders.ack", "acker")
    first, second = con.deliveries(2)
    assert isinstance(con.request(frames.Ack(con.next_id(), [first[0]])), frames.Ok)
    assert isinstance(con.request(frames.Nack(con.next_id(), [second[0]], 60_000)), frames.Ok)


@pytest.mark.parametrize("kind", ["GROUP_CREATE", "GROUP_DELETE"])
def test_group_management(node: Node, kind: str) -> None:
    def frame(client: WireClient, topic: str) -> Any:
        if kind == "GROUP_CREATE":
            return frames.GroupCreate(client.next_id(), topic, "managed", None, None)
        return frames.GroupDelete(client.next_id(), topic, "managed")

    mgr = node.client("mgr")
    if kind == "GROUP_DELETE":
        assert isinstance(
            mgr.request(frames.GroupCreate(mgr.next_id(), "orders.m", "managed")), frames.Ok
        )
    assert isinstance(mgr.request(frame(mgr, "orders.m")), frames.Ok)
    denied(mgr.request(frame(mgr, "billing.x")), "billing.x")
    con = node.client("con")
    denied(con.request(frame(con, "orders.m")), "orders.m")


def test_a_wildcard_does_not_give_away_the_dead_letters_of_a_topic_it_does_not_name(
    node: Node,
) -> None:
    """Found by trying a client allowed ``orders.*``: ``orders.dlq`` matches it, so it could
    subscribe to, or create a group on, the dead letters of topic ``orders``, a topic it
    may neither consume nor manage. A dead-letter topic is allowed only with its topic
    (or by a pattern naming ``dlq`` itself)."""
    admin = node.client("admin")
    created = admin.request(frames.GroupCreate(admin.next_id(), "orders", "strict", 200, 1))
    assert isinstance(created, frames.Ok), created
    assert isinstance(admin.publish([["orders", b"secret", 0, None, None]]), frames.PublishOk)
    admin.subscribe("orders", "strict")
    admin.deliveries(1)  # never acked: after 200 ms it moves to orders.dlq
    deadline = time.monotonic() + 10
    while not admin.group_pending("orders.dlq", "default"):
        assert time.monotonic() < deadline, admin.status()
        time.sleep(0.1)
    con = node.client("con")  # consume ["orders.*"]
    denied(con.request(frames.Subscribe(con.next_id(), "orders.dlq", "spy", 10)), "orders.dlq")
    assert "orders.dlq" not in {t["topic"] for t in con.status()["topics"]}
    mgr = node.client("mgr")  # manage_groups ["orders.>"]
    denied(
        mgr.request(frames.GroupCreate(mgr.next_id(), "orders.dlq", "spy", None, None)),
        "orders.dlq",
    )
    # ...while the dead letters of a topic the pattern does name stay allowed.
    ok = mgr.request(frames.GroupCreate(mgr.next_id(), "orders.eu.dlq", "ops", None, None))
    assert isinstance(ok, frames.Ok), ok
    assert con.subscribe("orders.eu", "s2") > 0


def test_status_lists_only_what_the_client_may_see(node: Node) -> None:
    con_topics = {t["topic"] for t in node.client("con").status()["topics"]}
    assert "orders.eu" in con_topics and "billing.x" not in con_topics
    assert all(topic.count(".") == 1 and topic.startswith("orders.") for topic in con_topics)
    mon_topics = {t["topic"] for t in node.client("mon").status()["topics"]}
    assert {"orders.eu", "billing.x"} <= mon_topics
    assert node.client("none").status()["topics"] == []


def test_ping_and_pong_need_nothing(node: Node) -> None:
    client = node.client("none")
    client.send(frames.Pong(0))  # unsolicited PONG: accepted, not answered
    assert isinstance(client.request(frames.Ping(client.next_id())), frames.Pong)


def test_cluster_status(node: Node) -> None:
    for name in ("mon", "ops", "admin"):
        client = node.client(name)
        assert isinstance(
            client.request(frames.ClusterStatus(client.next_id())), frames.ClusterStatusOk
        )
    con = node.client("con")
    denied(con.request(frames.ClusterStatus(con.next_id())), "CLUSTER_STATUS")


@pytest.mark.parametrize(
    "build",
    [
        lambda rid: frames.ClusterAddNode(rid, 9, "127.0.0.1:1", "127.0.0.1:2"),
        lambda rid: frames.ClusterRemoveNode(rid, 9),
        lambda rid: frames.ClusterTransferLeader(rid, 9),
    ],
    ids=["CLUSTER_ADD_NODE", "CLUSTER_REMOVE_NODE", "CLUSTER_TRANSFER_LEADER"],
)
def test_cluster_commands_need_manage_cluster(node: Node, build: Callable[[int], Any]) -> None:
    for name in ("con", "mon", "mgr"):
        client = node.client(name)
        frame = build(client.next_id())
        denied(client.request(frame), frame.TYPE.name)
    ops = node.client("ops")
    answer = ops.request(build(ops.next_id()))
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.INVALID_ARGUMENT, answer


def test_the_shared_auth_token_may_do_everything(node: Node) -> None:
    admin = node.client("admin")
    assert isinstance(admin.publish([["anything.at.all", b"x", 0, None, None]]), frames.PublishOk)
    admin.subscribe("anything.at.all", "g")
    assert isinstance(
        admin.request(frames.GroupDelete(admin.next_id(), "anything.at.all", "g")), frames.Ok
    )


def test_token_checks_are_shared_fairly_and_a_wrong_token_does_not_cost_the_cpu_again(
    node: Node,
) -> None:
    """Found by sending HELLOs with wrong secrets for a known client name: each cost the
    node ~50 ms of scrypt, and 50 such connections held up another client's first HELLO
    for 3.5 s (with enough of them, past its 10 s HELLO deadline). One address may now
    have one token check under way; more are told UNAVAILABLE (retry) at once."""
    host, port = node.broker.client_address.rsplit(":", 1)
    sprayers: list[socket.socket] = []
    for number in range(20):
        sprayer = socket.create_connection((host, int(port)), source_address=("127.0.0.2", 0))
        sprayer.sendall(codec.encode_frame(frames.Hello(1, (1,), "spray", f"pub:wrong-{number}")))
        sprayers.append(sprayer)
    # Meanwhile another address's new token is checked as usual.
    assert isinstance(connect(node.broker.client_address, node.tokens["mon"]), WireClient)
    codes = []
    for sprayer in sprayers:
        decoder = codec.FrameDecoder()
        sprayer.settimeout(10)
        while (answer := decoder.next_frame()) is codec.NEED_DATA:
            decoder.receive_data(sprayer.recv(65536))
        codes.append(answer.code)
        sprayer.close()
    assert set(codes) == {ErrorCode.AUTH_FAILED, ErrorCode.UNAVAILABLE}, codes
    assert codes.count(ErrorCode.AUTH_FAILED) < len(codes) / 2, codes


# --- SIGHUP reload --------------------------------------------------------------------


def test_credentials_are_reloaded_on_sighup(tmp_path: Path) -> None:
    started = start(tmp_path)
    try:
        con = started.client("con")
        con.subscribe("orders.eu", "g")
        pub = started.client("pub")
        # New file: pub may publish to billing.* now, con lost consume, ops was removed.
        clients = dict(CLIENTS)
        del clients["ops"]
        clients["pub"] = {"publish": ["billing.*"]}
        clients["con"] = {"publish": ["orders.*"]}
        fresh = write_credentials(started.credentials, clients)
        os.kill(started.broker.pid, signal.SIGHUP)
        # con's subscription is no longer allowed: its connection is closed.
        error = con.receive_answer(timeout_s=10)
        assert isinstance(error, frames.Error) and error.code == ErrorCode.AUTH_FAILED, error
        assert con.receive() is codec.CLOSED
        # pub's old secret was replaced: its connection is closed too, the new one works.
        assert pub.receive(timeout_s=10).code == ErrorCode.AUTH_FAILED
        started.tokens = fresh
        new_pub = started.client("pub")
        assert isinstance(new_pub.publish([["billing.x", b"x", 0, None, None]]), frames.PublishOk)
        denied(new_pub.publish([["orders.eu", b"x", 0, None, None]]), "orders.eu")
        client = WireClient(started.broker.client_address, hello=False)
        client.send(frames.Hello(1, (1,), "test", started.tokens.get("ops", "ops:old")))
        assert client.receive().code == ErrorCode.AUTH_FAILED
        assert "reloaded 5 client credentials" in started.broker.stderr_text()
        # The line names what changed: a file cut short while being written still
        # parses, and the clients it lost must be visible in the log.
        assert (
            "(removed: ops; new secret: con, mgr, mon, none, pub; permissions changed: con, pub)"
            in started.broker.stderr_text()
        )
        # A broken file keeps the old credentials.
        started.credentials.write_text("[[client]]\nname = 7\n")
        os.kill(started.broker.pid, signal.SIGHUP)
        time.sleep(0.5)
        assert isinstance(started.client("pub").publish([["billing.y", b"x", 0, None, None]]),
                          frames.PublishOk)  # fmt: skip
        assert "credentials not reloaded" in started.broker.stderr_text()
    finally:
        started.broker.terminate()


def test_a_credentials_file_that_is_not_utf8_keeps_the_old_ones_on_sighup(
    tmp_path: Path,
) -> None:
    """Found by saving the file in Latin-1: the SIGHUP that followed stopped the node
    with a UnicodeDecodeError traceback (tomllib decodes before it parses), where a
    file that is not valid TOML keeps the old credentials and logs why."""
    started = start(tmp_path)
    try:
        started.credentials.write_bytes(b'[[client]]\nname = "caf\xe9"\n')
        os.kill(started.broker.pid, signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "credentials not reloaded" not in started.broker.stderr_text():
            assert started.broker.process is not None
            assert started.broker.process.poll() is None, started.broker.stderr_text()
            assert time.monotonic() < deadline, started.broker.stderr_text()
            time.sleep(0.05)
        assert "byte 0xe9 on line 2 is not UTF-8" in started.broker.stderr_text()
        published = started.client("pub").publish([["orders.eu", b"x", 0, None, None]])
        assert isinstance(published, frames.PublishOk), published
    finally:
        started.broker.terminate()


def _catches(pid: int, signum: int) -> bool:
    """True once the process has a handler for ``signum`` (Linux: /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def test_a_sighup_while_the_node_starts_does_not_kill_it(tmp_path: Path) -> None:
    """Found by sending the reload too early: SIGHUP before the node served ended it
    (exit 129, no log line). Now it is remembered and acted on once the node serves."""
    credentials = tmp_path / "clients.toml"
    write_credentials(credentials, CLIENTS)
    env = {**os.environ, "FUTUREQ_SERVER_CREDENTIALS_FILE": str(credentials)}
    for attempt in range(3):
        data = tmp_path / f"data{attempt}"
        log_path = tmp_path / f"node{attempt}.log"
        with open(log_path, "w") as log_file:
            process = subprocess.Popen(
                [sys.executable, "-m", "futureq.cli.server_main", "start", "--data-dir",
                 str(data), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                 "--shards", "1"],
                stdout=subprocess.PIPE, stderr=log_file, text=True, env=env,
            )  # fmt: skip
        try:
            assert process.stdout is not None
            deadline = time.monotonic() + 20
            while not _catches(process.pid, signal.SIGHUP):
                assert process.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "SIGHUP never handled"
                time.sleep(0.002)
            process.send_signal(signal.SIGSTOP)
            started = select.select([process.stdout], [], [], 0)[0]
            process.send_signal(signal.SIGHUP)  # delivered when it runs again
            process.send_signal(signal.SIGCONT)
            if started:
                continue  # this machine was too slow to catch the start; try again
            line = process.stdout.readline()
            assert line.startswith("READY "), log_path.read_text()
            deadline = time.monotonic() + 10
            while "reloaded 6 client credentials" not in log_path.read_text():
                assert time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.05)
            assert process.poll() is None
            assert "SIGHUP arrived while the node was starting" in log_path.read_text()
            return
        finally:
            if process.poll() is None:
                process.terminate()
                process.wait(15)
            if process.stdout is not None:
                process.stdout.close()
    pytest.fail("the node was always serving before the test could send SIGHUP")


# --- HTTP (input 5) -------------------------------------------------------------------


def get(node: Node, path: str, authorization: str | None = None) -> tuple[int, Message]:
    request = urllib.request.Request(f"http://{node.broker.http_address}{path}")
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers
    except urllib.error.HTTPError as error:
        with error:  # closes the unread answer's socket now, not in a later gc pass
            return error.code, error.headers


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_the_http_api_and_dashboard_need_a_token(node: Node) -> None:
    for path in ("/api/status", "/", "/metrics"):
        status, headers = get(node, path)
        assert status == 401, path
        assert headers.get("WWW-Authenticate", "").startswith("Basic")
        assert get(node, path, "Bearer wrong")[0] == 401
        assert get(node, path, f"Bearer {ADMIN_TOKEN}")[0] == 200, path
        assert get(node, path, f"Bearer {node.tokens['mon']}")[0] == 200, path
        assert get(node, path, f"Bearer {node.tokens['con']}")[0] == 403, path
    # A browser asks once (HTTP Basic) and sends it with the dashboard's own requests.
    assert get(node, "/", basic("any", ADMIN_TOKEN))[0] == 200
    user, secret = node.tokens["mon"].split(":", 1)
    assert get(node, "/api/status", basic(user, secret))[0] == 200
    for path in ("/healthz", "/readyz"):
        assert get(node, path)[0] == 200


def test_metrics_protection_is_a_setting(tmp_path: Path) -> None:
    started = start(tmp_path, env={"FUTUREQ_METRICS_REQUIRE_AUTH": "false"})
    try:
        assert get(started, "/metrics")[0] == 200
        assert get(started, "/api/status")[0] == 401
    finally:
        started.broker.terminate()
