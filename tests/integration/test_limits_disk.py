"""A full disk against real ``futureq start`` processes (issue 10, input 6).

The disk is "filled" the way the fault-injection harness does it, with RLIMIT_FSIZE, but
on the running process (``prlimit``): soft limit 1 byte, so every write that grows a file
fails with EFBIG, as on a full disk; lifting the limit is space coming back. Nothing
needs root or a special file system, so CI runs it.
"""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from broker_process import BrokerProcess
from cluster_process import Cluster
from wire_client import WireClient

from futureq.errors import ErrorCode
from futureq.wire import codec, frames

RECOVERY_TIMEOUT_S = 20.0


def fill_disk(pid: int) -> None:
    """Every later write that grows a file fails (EFBIG), as on a full disk."""
    _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (1, hard))


def free_disk(pid: int) -> None:
    _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (hard, hard))


def http(address: str, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as response:
            body = response.read()
            status = response.status
    except urllib.error.HTTPError as error:
        body = error.read()
        status = error.code
    text = body.decode()
    return status, json.loads(text) if text.startswith("{") else text


def wait_ready(address: str) -> dict[str, Any]:
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while True:
        status, body = http(address, "/readyz")
        if status == 200:
            return body  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, f"not ready again: {body}"
        time.sleep(0.2)


def publish_until_refused(client: WireClient, topic: str) -> frames.Error:
    for number in range(200):
        answer = client.publish([[topic, f"x{number}".encode() * 100, 0, None, None]])
        if isinstance(answer, frames.Error):
            return answer
    raise AssertionError("the node kept acknowledging writes with a full disk")


def test_a_full_disk_refuses_writes_keeps_serving_and_resumes_by_itself(
    broker: BrokerProcess,
) -> None:
    producer = WireClient(broker.client_address)
    consumer = WireClient(broker.client_address)
    sub = consumer.subscribe("disk.t", "g", prefetch=1000)
    before = producer.publish([["disk.t", f"early{i}".encode(), 0, None, None] for i in range(5)])
    due_later = producer.publish([["disk.t", b"due-during-the-alarm", 1500, None, None]])
    assert isinstance(before, frames.PublishOk) and isinstance(due_later, frames.PublishOk)
    got = consumer.deliveries(5)

    fill_disk(broker.pid)
    refused = publish_until_refused(producer, "disk.t")
    assert refused.code == ErrorCode.NO_SPACE, refused
    assert "disk is full" in refused.message
    # Writes are refused at once while the alarm is up; the connection stays open.
    again = producer.publish([["disk.t", b"refused", 0, None, None]])
    assert isinstance(again, frames.Error) and again.code == ErrorCode.NO_SPACE

    # Serving goes on: health, status, metrics, the alarm shown, and due messages.
    assert http(broker.http_address, "/healthz")[0] == 200
    code, body = http(broker.http_address, "/readyz")
    assert code == 503 and body["alarms"] == ["NO_SPACE"] and "NO_SPACE" in body["reason"]
    assert producer.status()["alarms"] == ["NO_SPACE"]
    metrics = http(broker.http_address, "/metrics")[1]
    assert 'futureq_storage_alarm{alarm="no_space"} 1.0' in metrics
    [late] = consumer.deliveries(1, timeout_s=10)
    assert late[2] == b"due-during-the-alarm"
    ack = consumer.request(frames.Ack(consumer.next_id(), [late[0]]))
    assert isinstance(ack, frames.Error) and ack.code == ErrorCode.NO_SPACE

    free_disk(broker.pid)
    wait_ready(broker.http_address)
    assert producer.status()["alarms"] == []
    after = producer.publish([["disk.t", b"after", 0, None, None]])
    assert isinstance(after, frames.PublishOk), after
    done = consumer.request(frames.Ack(consumer.next_id(), [d[0] for d in got + [late]]))
    assert isinstance(done, frames.Ok) and done.result == 6, done
    [last] = consumer.deliveries(1)
    assert last[2] == b"after"
    assert sub
    assert broker.process is not None and broker.process.poll() is None
    assert "Traceback" not in broker.stderr_text()
    assert "NO_SPACE alarm cleared" in broker.stderr_text()

    # Nothing acknowledged was lost, across a restart too.
    assert broker.terminate() == 0
    broker.start()
    client = WireClient(broker.client_address)
    assert client.group_pending("disk.t", "g") == 1  # only "after" is left (delivered, not acked)


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, 3)
    try:
        cluster.start()
        yield cluster
    finally:
        for node in cluster.nodes.values():
            if node.alive():
                free_disk(node.pid)
        cluster.stop()


def test_a_leader_with_a_full_disk_steps_down_and_the_cluster_goes_on(cluster3: Cluster) -> None:
    leader = cluster3.leader()
    client = WireClient(leader.client_address)
    acked: list[bytes] = []
    first = client.publish([["disk.c", b"before", 0, None, None]])
    assert isinstance(first, frames.PublishOk)
    acked.append(b"before")

    fill_disk(leader.pid)
    refused = client.publish([["disk.c", b"refused", 0, None, None]])
    # The node either refused the write or closed the connection as it stopped leading.
    assert refused is codec.CLOSED or isinstance(refused, frames.Error), refused

    new_leader = cluster3.leader(exclude={leader.node_id})
    assert new_leader.node_id != leader.node_id
    other = WireClient(new_leader.client_address)
    for number in range(20):
        answer = other.publish([["disk.c", f"during{number}".encode(), 0, None, None]])
        assert isinstance(answer, frames.PublishOk), answer
        acked.append(f"during{number}".encode())
    code, body = http(leader.http_address, "/readyz")
    assert code == 503 and body["alarms"] == ["NO_SPACE"]
    assert leader.alive()

    free_disk(leader.pid)
    status = wait_ready(leader.http_address)
    assert status == {"ready": True}
    # The old leader caught up as a follower; nothing acknowledged is missing.
    current = cluster3.leader()
    consumer = WireClient(current.client_address)
    consumer.subscribe("disk.c", "reader", prefetch=1000)
    payloads = {d[2] for d in consumer.deliveries(len(acked), timeout_s=20)}
    assert set(acked) <= payloads
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while True:
        applied = {n.http_json("/api/status")["applied_index"] for n in cluster3.nodes.values()}
        if len(applied) == 1:
            break
        assert time.monotonic() < deadline, applied
        time.sleep(0.2)
    assert "Traceback" not in leader.stderr_text()


def _start_waiting_for_space(
    broker: BrokerProcess,
) -> tuple[subprocess.Popen[str], list[str], threading.Thread]:
    """Start ``broker``'s node again on its data directory with a file-size limit of 1
    byte (a full disk, as RocksDB sees it at open) and wait for its NO_SPACE line.

    Returns:
        The process, the stderr lines read so far (a thread keeps reading them) and
        that thread.
    """

    def full_disk() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1, hard))

    process = subprocess.Popen(
        [sys.executable, "-m", "futureq.cli.server_main", "start", "--data-dir",
         str(broker.data_dir), "--listen", broker.client_address, "--http",
         broker.http_address],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=full_disk,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(
        target=lambda: lines.extend(iter(process.stderr.readline, "")),  # type: ignore[union-attr]
        daemon=True,
    )
    reader.start()
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while not any("NO_SPACE alarm at start" in line for line in lines):
        if process.poll() is not None or time.monotonic() >= deadline:
            process.kill()
            process.wait(15)
            raise AssertionError("".join(lines))
        time.sleep(0.1)
    return process, lines, reader


def test_a_node_restarted_on_a_full_disk_waits_for_space_instead_of_exiting(
    broker: BrokerProcess,
) -> None:
    """Found by restarting a node whose disk was full (a crash, a rescheduled pod):
    opening RocksDB writes (it flushes the log it recovers), so the node stopped at once
    with "storage failure ... No space left on device" (exit 3), and a supervisor would
    restart it in a loop. It now waits for space with one NO_SPACE line, then serves."""
    producer = WireClient(broker.client_address)
    for number in range(20):
        answer = producer.publish([["disk.r", f"m{number}".encode(), 0, None, None]])
        assert isinstance(answer, frames.PublishOk), answer
    producer.close()
    broker.kill()  # the log holds writes RocksDB must recover (and so write) at open

    process, lines, reader = _start_waiting_for_space(broker)
    try:
        time.sleep(1.5)  # a retry or two
        assert process.poll() is None, "".join(lines)
        free_disk(process.pid)
        assert process.stdout is not None
        assert process.stdout.readline().startswith("READY "), "".join(lines)
        consumer = WireClient(broker.client_address)
        assert consumer.group_pending("disk.r", "default") == 20
        assert sum("NO_SPACE alarm at start" in line for line in lines) == 1
        assert not any("Traceback" in line for line in lines)
    finally:
        process.terminate()
        process.wait(15)
        reader.join(5)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_while_waiting_for_space_at_start_stops_gracefully(
    broker: BrokerProcess, stop_signal: signal.Signals
) -> None:
    """Found by stopping a node that waited for disk space at start: the stop-signal
    watcher starts only once the node serves, so SIGTERM ended it with 143 and no word,
    and SIGINT with a KeyboardInterrupt traceback from ``_open_database``. Either now
    stops it gracefully: exit 0, a log line, no traceback."""
    producer = WireClient(broker.client_address)
    answer = producer.publish([["disk.s", b"m", 0, None, None]])
    assert isinstance(answer, frames.PublishOk), answer
    producer.close()
    broker.kill()  # the log holds a write RocksDB must recover (and so write) at open

    process, lines, reader = _start_waiting_for_space(broker)
    try:
        process.send_signal(stop_signal)
        assert process.wait(15) == 0, "".join(lines)
        reader.join(5)
        text = "".join(lines)
        assert f"received {stop_signal.name} while waiting for disk space" in text, text
        assert "stopped gracefully" in text, text
        assert "Traceback" not in text, text
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(15)
        reader.join(5)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
