"""SIGKILL a 3-node cluster's leader after >16 MiB of writes (WAL rolled, recycled), restart
it: acknowledged publishes all there once, acked ones not back, replicas agree."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_process import Cluster
from wire_client import WireClient

from futureq.wire import frames

PAYLOAD = b"p" * 4096
BATCH = 64


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, 3)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _publish(client: WireClient, count: int, ids: set[int]) -> None:
    for _ in range(count):
        answer = client.publish([["t", PAYLOAD, None, None, None] for _ in range(BATCH)])
        assert isinstance(answer, frames.PublishOk), answer
        ids.update(range(answer.first_id, answer.first_id + BATCH))


def _more(pub: WireClient, late: set[int], stop: threading.Event) -> None:
    try:
        while not stop.is_set():
            _publish(pub, 1, late)
    except Exception:  # noqa: BLE001 - the kill ends it
        pass


def test_leader_sigkill_after_wal_rolls(cluster3: Cluster) -> None:
    leader = cluster3.leader(30)
    pub = WireClient(leader.client_address)
    published: set[int] = set()
    _publish(pub, 70, published)
    con = WireClient(leader.client_address)
    con.subscribe("t", "g", prefetch=2000)
    got = con.deliveries(2000, timeout_s=60)
    acked = {d[1] for d in got}
    tags = [d[0] for d in got]
    for i in range(0, len(tags), 200):
        answer = con.request(frames.Ack(con.next_id(), tags[i : i + 200]))
        assert isinstance(answer, frames.Ok), answer
    _publish(pub, 70, published)
    late: set[int] = set()
    stop = threading.Event()
    thread = threading.Thread(target=_more, args=(pub, late, stop))
    thread.start()
    time.sleep(0.5)
    leader.kill()
    stop.set()
    thread.join(10)
    pub.close()
    con.close()
    leader.start()
    new = cluster3.leader(30)
    check = WireClient(new.client_address)
    sid = check.subscribe("t", "g", prefetch=10_000)
    seen: list[int] = []
    pending_tags: list[bytes] = []
    while True:
        try:
            batch = check.deliveries(1, timeout_s=5)
        except TimeoutError:
            break
        seen.extend(d[1] for d in batch)
        pending_tags.extend(d[0] for d in batch)
        if len(pending_tags) >= 5000:
            answer = check.request(frames.Ack(check.next_id(), pending_tags))
            assert isinstance(answer, frames.Ok), answer
            check.send(frames.Credit(check.next_id(), sid, len(pending_tags)))
            pending_tags = []
    seen_set = set(seen)
    assert len(seen) == len(seen_set), "duplicates"
    assert not (seen_set & acked), sorted(seen_set & acked)[:5]
    want = (published | late) - acked
    missing = want - seen_set
    assert not missing, f"{len(missing)} acknowledged publishes lost: {sorted(missing)[:5]}"
    deadline = time.monotonic() + 30
    while True:
        statuses = cluster3.statuses()
        if len(statuses) == 3 and len({s["applied_index"] for s in statuses.values()}) == 1:
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert len({s["applied_digest"] for s in statuses.values()}) == 1, statuses
