"""One operator view of a node of 2 shards, as real processes (issue 15).

The node's HTTP port (shard 0's) answers ``/readyz``, ``/healthz``, ``/api/status``,
``/api/overview`` and ``/metrics`` for both shards; a stopped or killed shard is named,
never waited on past the fetch deadline.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import trio
from test_shards import TOPICS, ShardedNode
from test_shards import node as node  # the fixture: one sharded node

from futureq.client import open_client
from futureq.shards.heartbeat import SILENT_AFTER_S
from futureq.shards.slots import even_map
from futureq.shards.view import FETCH_DEADLINE_S

HTTP_TIMEOUT_S = 15.0
"""Longest the test waits for one answer of the node's port (it must answer well before)."""


def get(node: ShardedNode, path: str) -> tuple[int, bytes, float]:
    """``(status, body, seconds taken)`` of ``GET path`` on the node's HTTP port."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(
            f"http://{node.http_address}{path}", timeout=HTTP_TIMEOUT_S
        ) as answer:
            return answer.status, answer.read(), time.monotonic() - started
    except urllib.error.HTTPError as error:
        return error.code, error.read(), time.monotonic() - started


def wait_status(node: ShardedNode, path: str, wanted: int, within_s: float = 60.0) -> bytes:
    deadline = time.monotonic() + within_s
    while True:
        status, body, _ = get(node, path)
        if status == wanted:
            return body
        assert time.monotonic() < deadline, f"{path} still {status} {body!r}"
        time.sleep(0.2)


def shard_pid(node: ShardedNode, shard: int) -> int:
    pid = node.pid_of_shard(shard)
    assert pid is not None, f"no process for shard {shard}"
    return pid


def test_status_and_metrics_of_the_node_cover_both_shards(node: ShardedNode) -> None:
    slot_map = even_map(node.shard_addresses)
    assert {slot_map.shard_of(t) for t in TOPICS} == {0, 1}

    async def main() -> None:
        async with open_client(node.client_address) as client:
            for topic in TOPICS:
                await client.create_group(topic, "g")
                await client.publish(topic, b"x")
            # The client's node-wide status (futureq-cli status) sums and breaks down too.
            merged = await client.status()
            assert (merged["topic_count"], merged["group_count"]) == (len(TOPICS), len(TOPICS))
            assert [(s["shard"], s["role"]) for s in merged["shards"]] == [
                (0, "leader"),
                (1, "leader"),
            ]
            assert all(s["term"] is not None and s["applied_index"] > 0 for s in merged["shards"])

    trio.run(main)
    status, body, _ = get(node, "/api/status")
    assert status == 200, body
    merged = json.loads(body)
    assert [t["topic"] for t in merged["topics"]] == sorted(TOPICS)
    assert merged["topic_count"] == len(TOPICS)
    assert merged["group_count"] == len(TOPICS)
    assert merged["missing_shards"] == []
    shards = {s["shard"]: s for s in merged["shards"]}
    assert set(shards) == {0, 1}
    for k, entry in shards.items():
        assert entry["role"] == "leader"
        assert entry["topic_count"] == sum(slot_map.shard_of(t) == k for t in TOPICS)
        assert entry["applied_index"] > 0 and "term" in entry and entry["leader_address"]
    # ?local=true: shard 0's own answer.
    _, own, _ = get(node, "/api/status?local=true")
    assert "shards" not in json.loads(own)
    assert {t["topic"] for t in json.loads(own)["topics"]} == {
        t for t in TOPICS if slot_map.shard_of(t) == 0
    }

    status, body, _ = get(node, "/metrics")
    assert status == 200
    text = body.decode()
    for k in (0, 1):
        assert f'futureq_applied_index{{shard="{k}"}}' in text
        assert f'futureq_node_view_shard_up{{shard="{k}"}} 1' in text
    assert text.count("# TYPE futureq_applied_index gauge") == 1
    # Per-topic series come from the shard owning the topic.
    for topic in TOPICS[:4]:
        owner = slot_map.shard_of(topic)
        lines = [line for line in text.splitlines() if f'topic="{topic}"' in line]
        assert lines and all(f'shard="{owner}"' in line for line in lines), lines

    status, body, _ = get(node, "/api/overview")
    assert status == 200
    overview = json.loads(body)
    assert overview["groups_total"] == len(TOPICS)
    assert {g["topic"] for g in overview["groups"]} == set(TOPICS)
    assert [s["shard"] for s in overview["shards"]] == [0, 1]
    assert overview["alarms"] == []

    # /api/browse of a topic on shard 1 is answered by shard 1.
    on_1 = next(t for t in TOPICS if slot_map.shard_of(t) == 1)
    status, body, _ = get(node, f"/api/browse?topic={on_1}&group=g")
    assert status == 200, body
    assert len(json.loads(body)["messages"]) == 1


def test_readyz_and_healthz_name_a_stopped_or_killed_shard(node: ShardedNode) -> None:
    for path in ("/readyz", "/healthz"):
        status, body, _ = get(node, path)
        assert status == 200, body
    assert [s["ready"] for s in json.loads(get(node, "/readyz")[1])["shards"]] == [True, True]

    stopped = shard_pid(node, 1)
    os.kill(stopped, signal.SIGSTOP)
    try:
        status, body, took_s = get(node, "/readyz")
        assert status == 503, body
        answer = json.loads(body)
        assert answer["ready"] is False
        assert "shard 1" in answer["reason"] and "did not answer" in answer["reason"]
        assert [s["ready"] for s in answer["shards"]] == [True, False]
        assert took_s < FETCH_DEADLINE_S + 5  # the deadline, not the stopped shard, ends it
        status, body, _ = get(node, "/healthz")
        assert status == 503 and b"shard 1" in body, body
        status, body, _ = get(node, "/api/status")
        assert status == 200
        assert json.loads(body)["missing_shards"] == [1]
        status, body, _ = get(node, "/metrics")
        assert status == 200 and b'futureq_node_view_shard_up{shard="1"} 0' in body
    finally:
        os.kill(stopped, signal.SIGCONT)
    wait_status(node, "/readyz", 200)

    killed = shard_pid(node, 1)
    os.kill(killed, signal.SIGKILL)
    status, body, _ = get(node, "/readyz")
    assert status == 503 and b"shard 1" in body, body
    wait_status(node, "/readyz", 200)
    wait_status(node, "/healthz", 200)
    assert node.pid_of_shard(1) not in (None, killed)


def test_the_dashboard_shows_every_shard(node: ShardedNode) -> None:
    """The dashboard on the node's port (WATCH over /ws on shard 0) lists the groups of
    both shards, one row per shard, and a stopped shard as not answering."""
    from playwright.sync_api import expect, sync_playwright
    from test_dashboard_browser import (
        WAIT_MS,
        browser_context,
        expect_groups_match_status,
        open_dashboard,
        screenshot,
    )

    async def main() -> None:
        async with open_client(node.client_address) as client:
            for topic in TOPICS:
                await client.create_group(topic, "g")
                await client.publish(topic, b"x")

    trio.run(main)
    with sync_playwright() as playwright, browser_context(playwright, None) as browser:
        page, errors = open_dashboard(browser, node.http_address)
        status = expect_groups_match_status(page, node.http_address)
        assert len(status["topics"]) == len(TOPICS)
        expect(page.locator("#groups tbody tr")).to_have_count(len(TOPICS), timeout=WAIT_MS)
        expect(page.locator("#shards tbody tr")).to_have_count(2, timeout=WAIT_MS)
        expect(page.locator("#node-title")).to_contain_text("2 shards")
        for k in (0, 1):
            expect(
                page.locator(f'#shards tr[data-shard="{k}"] td[data-field="state"]')
            ).to_have_text("ok", timeout=WAIT_MS)
        screenshot(page, "dashboard-two-shards.png")
        stopped = shard_pid(node, 1)
        os.kill(stopped, signal.SIGSTOP)
        try:
            expect(
                page.locator('#shards tr[data-shard="1"] td[data-field="state"]')
            ).to_contain_text("did not answer", timeout=WAIT_MS)
            expect(page.locator('#alarms [data-alarm="SHARD_UNAVAILABLE"]')).to_be_visible(
                timeout=WAIT_MS
            )
        finally:
            os.kill(stopped, signal.SIGCONT)
        expect(page.locator('#shards tr[data-shard="1"] td[data-field="state"]')).to_have_text(
            "ok", timeout=WAIT_MS
        )
        assert errors == []


def test_the_node_view_behind_a_token_and_https(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an auth token and HTTPS on the HTTP port, the operator's token is checked by
    shard 0 and the fetches from shard 1 go over TLS with the node's internal token."""
    import base64
    import ssl

    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file = tmp_path / "server.pem", tmp_path / "server.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(str(cert_file), append=True)
    cert.private_key_pem.write_to_path(str(key_file))
    token = "operator-" + base64.b32encode(os.urandom(10)).decode()
    monkeypatch.setenv("FUTUREQ_SERVER_AUTH_TOKEN", token)
    made = ShardedNode(
        tmp_path / "data",
        extra=["--tls-cert", str(cert_file), "--tls-key", str(key_file), "--http-tls"],
    )
    made.start()
    try:
        client_tls = ssl.create_default_context()
        ca.configure_trust(client_tls)

        async def main() -> None:
            async with open_client(made.client_address, token=token, ssl_context=client_tls) as c:
                for topic in TOPICS:
                    await c.create_group(topic, "g")

        trio.run(main)

        def https(path: str, bearer: str | None, port_offset: int = 0) -> tuple[int, bytes]:
            host, port = made.http_address.rsplit(":", 1)
            request = urllib.request.Request(f"https://{host}:{int(port) + port_offset}{path}")
            if bearer is not None:
                request.add_header("Authorization", f"Bearer {bearer}")
            try:
                with urllib.request.urlopen(
                    request, timeout=HTTP_TIMEOUT_S, context=client_tls
                ) as answer:
                    return answer.status, answer.read()
            except urllib.error.HTTPError as error:
                return error.code, error.read()

        status, body = https("/readyz", None)
        assert status == 200, body
        assert [s["ready"] for s in json.loads(body)["shards"]] == [True, True]
        assert https("/api/status", None)[0] == 401
        assert https("/api/status", "wrong")[0] == 401
        status, body = https("/api/status", token)
        assert status == 200, body
        merged = json.loads(body)
        assert [t["topic"] for t in merged["topics"]] == sorted(TOPICS)
        assert merged["missing_shards"] == []
        status, body = https("/metrics", token)
        assert status == 200 and b'futureq_node_view_shard_up{shard="1"} 1' in body
        # Shard 1's own port still wants a token from anyone else.
        assert https("/api/status", None, port_offset=1)[0] == 401
    finally:
        made.terminate()
        made.kill()


def test_the_nodes_port_answers_while_shard_0_is_down_and_recovers(node: ShardedNode) -> None:
    """Shard 0 serves the node's HTTP port; SIGKILLed, its supervisor answers on the same
    socket with the degraded view (shard 0 named as restarting, shard 1's part kept)
    until the restarted shard 0 serves again; no request is refused meanwhile."""
    slot_map = even_map(node.shard_addresses)

    async def setup() -> None:
        async with open_client(node.client_address) as client:
            for topic in TOPICS:
                await client.create_group(topic, "g")

    trio.run(setup)
    wait_status(node, "/readyz", 200)
    killed = shard_pid(node, 0)
    os.kill(killed, signal.SIGKILL)
    # The restart waits a back-off and takes a start: the first requests meet the
    # supervisor. (A refused connection would raise URLError here and fail the test.)
    status, body, _ = get(node, "/readyz")
    assert status == 503, body
    answer = json.loads(body)
    assert answer["ready"] is False
    assert [s["ready"] for s in answer["shards"]] == [False, True]
    assert "shard 0 is not ready: is " in answer["reason"], answer
    assert answer["shards"][0]["reason"].startswith(
        ("is restarting: it exited with code -9", "is starting")
    ), answer

    status, body, _ = get(node, "/healthz")
    assert status == 503 and body.startswith(b"unhealthy: shard 0 ("), body
    assert b"shard 1" not in body  # shard 1 is healthy
    status, body, _ = get(node, "/api/status")
    assert status == 503, body
    degraded = json.loads(body)
    assert degraded["error"].startswith("shard 0: is "), degraded
    assert degraded["missing_shards"] == [0]
    assert sorted(t["topic"] for t in degraded["topics"]) == sorted(
        t for t in TOPICS if slot_map.shard_of(t) == 1
    )
    assert degraded["shards"][1]["role"] == "leader"
    status, body, _ = get(node, "/metrics")
    assert status == 200, body
    text = body.decode()
    assert 'futureq_node_view_shard_up{shard="0"} 0' in text
    assert 'futureq_node_view_shard_up{shard="1"} 1' in text
    assert 'futureq_applied_index{shard="1"}' in text
    assert 'shard="0"' not in text.replace('futureq_node_view_shard_up{shard="0"} 0', "")
    status, body, _ = get(node, "/")
    assert status == 503 and b"shard 0 of this node" in body, body

    # Shard 0 comes back and serves the port again: every shard is in the view.
    wait_status(node, "/readyz", 200)
    status, body, _ = get(node, "/api/status")
    assert status == 200 and json.loads(body)["missing_shards"] == [], body
    assert node.pid_of_shard(0) not in (None, killed)
    status, body, _ = get(node, "/")
    assert status == 200 and b"<html" in body.lower()


def test_the_nodes_port_answers_while_shard_0_is_stopped_and_recovers(node: ShardedNode) -> None:
    """Shard 0 alive but stopped (SIGSTOP) holds the node's HTTP port without answering:
    its supervisor notices the silence of its heartbeats within SILENT_AFTER_S and
    answers on the port, naming shard 0 and its pid; once shard 0 runs again it serves
    the port again. Before, every request waited in vain (a probe timed out)."""
    wait_status(node, "/readyz", 200)
    stopped = shard_pid(node, 0)
    os.kill(stopped, signal.SIGSTOP)
    try:
        status, body, took_s = get(node, "/healthz")
        assert status == 503, body
        assert body.startswith(b"unhealthy: shard 0 (") and b"is not answering" in body, body
        assert f"pid {stopped}".encode() in body, body
        assert b"shard 1" not in body  # shard 1 is healthy
        assert took_s < SILENT_AFTER_S + FETCH_DEADLINE_S + 3, took_s
        status, body, _ = get(node, "/readyz")
        answer = json.loads(body)
        assert status == 503 and [s["ready"] for s in answer["shards"]] == [False, True]
        assert "shard 0 is not ready: is not answering" in answer["reason"], answer
        status, body, _ = get(node, "/api/status")
        assert status == 503 and json.loads(body)["missing_shards"] == [0], body
        status, body, _ = get(node, "/metrics")
        assert status == 200 and b'futureq_node_view_shard_up{shard="0"} 0' in body
    finally:
        os.kill(stopped, signal.SIGCONT)
    wait_status(node, "/readyz", 200)
    assert node.pid_of_shard(0) == stopped  # not restarted: it was alive all along
    status, body, _ = get(node, "/")
    assert status == 200 and b"<html" in body.lower()  # shard 0 serves the port again


def test_a_request_the_supervisor_took_as_shard_0_returned_is_answered(
    node: ShardedNode,
) -> None:
    """A connection the supervisor accepted while shard 0 was stopped, whose request
    comes just after shard 0 gives signs of life again, is answered by the supervisor
    even when its answer waits FETCH_DEADLINE_S for a stopped shard 1. Before, the
    supervisor gave its requests 1 s once shard 0 was back, no more than such an answer
    takes: the probe's connection was closed without an answer."""
    import socket

    wait_status(node, "/readyz", 200)
    zero, one = shard_pid(node, 0), shard_pid(node, 1)
    os.kill(one, signal.SIGSTOP)  # every /healthz now waits FETCH_DEADLINE_S for shard 1
    try:
        os.kill(zero, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 60
            while b"is not answering" not in get(node, "/healthz")[1]:
                assert time.monotonic() < deadline, "the supervisor never answered for shard 0"
            host, port = node.http_address.rsplit(":", 1)
            probe = socket.create_connection((host, int(port)), timeout=HTTP_TIMEOUT_S)
            time.sleep(0.3)  # accepted by the supervisor: shard 0 is stopped
            alive = f"shard 0 (pid {zero}) gives signs of life again"
            seen = node.stderr_text().count(alive)
        finally:
            os.kill(zero, signal.SIGCONT)
        with probe:
            deadline = time.monotonic() + 30
            while node.stderr_text().count(alive) == seen:  # the supervisor stops accepting
                assert time.monotonic() < deadline, node.stderr_text()[-4000:]
                time.sleep(0.005)
            probe.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            answer = b""
            while chunk := probe.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"shard 1 (" in answer and b"did not answer within" in answer, answer
    finally:
        os.kill(one, signal.SIGCONT)
    wait_status(node, "/readyz", 200)


def test_a_request_shard_0_is_answering_when_it_is_stopped_gracefully_is_answered(
    node: ShardedNode,
) -> None:
    """SIGTERM to shard 0 alone (it stops gracefully and the supervisor restarts it) while
    it answers a probe that waits FETCH_DEADLINE_S for a stopped shard 1: the probe gets
    its answer. Before, shard 0's graceful stop ended with its HTTP server cut off, and
    the probe's connection was closed without an answer."""
    import socket
    import threading

    wait_status(node, "/readyz", 200)
    zero, one = shard_pid(node, 0), shard_pid(node, 1)
    host, port = node.http_address.rsplit(":", 1)
    os.kill(one, signal.SIGSTOP)  # every /healthz now waits FETCH_DEADLINE_S for shard 1
    try:
        probe = socket.create_connection((host, int(port)), timeout=HTTP_TIMEOUT_S)
        with probe:
            probe.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            answer: list[bytes] = []

            def read() -> None:
                data = b""
                try:
                    while chunk := probe.recv(65536):
                        data += chunk
                except OSError as error:
                    data += repr(error).encode()
                answer.append(data)

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            time.sleep(0.3)  # shard 0 took the request and waits for shard 1
            assert not answer, answer
            os.kill(zero, signal.SIGTERM)
            reader.join(HTTP_TIMEOUT_S)
        assert answer and answer[0].startswith(b"HTTP/1.1 503"), answer
        assert b"shard 1 (" in answer[0], answer
    finally:
        os.kill(one, signal.SIGCONT)
    wait_status(node, "/readyz", 200)
    assert node.pid_of_shard(0) != zero  # restarted


def test_a_whole_node_paused_is_not_taken_for_a_silent_shard(node: ShardedNode) -> None:
    """The supervisor and its shards stopped together (a whole node paused, as the fault
    harness's ``pause`` does) and continued, the supervisor first: its heartbeat deadline
    passed while it was stopped itself, so it gives the shards a new window instead of
    reporting them silent (and covering shard 0's port) for the moment it ran before
    them."""
    wait_status(node, "/readyz", 200)
    shards = [shard_pid(node, 0), shard_pid(node, 1)]
    for pid in [node.pid, *shards]:
        os.kill(pid, signal.SIGSTOP)
    time.sleep(SILENT_AFTER_S + 1)
    os.kill(node.pid, signal.SIGCONT)
    time.sleep(0.3)  # the supervisor runs alone, its deadlines long past
    for pid in shards:
        os.kill(pid, signal.SIGCONT)
    wait_status(node, "/readyz", 200)
    time.sleep(SILENT_AFTER_S + 0.5)  # a silence reported late would be logged by now
    node.terminate()
    assert "no sign of life" not in node.stderr_text()


def test_the_nodes_http_port_taken_stops_the_node_with_a_sentence(tmp_path: Path) -> None:
    import socket

    made = ShardedNode(tmp_path / "data")
    port = int(made._port_args[3].rsplit(":", 1)[1])
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", port))
        blocker.listen()
        with pytest.raises(RuntimeError, match="broker did not start"):
            made.start()
    assert made.process is not None and made.process.returncode == 4
    assert f"cannot listen for HTTP on 127.0.0.1:{port}" in made.stderr_text()
    assert "--http" in made.stderr_text()
