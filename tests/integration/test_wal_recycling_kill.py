"""SIGKILL after more than 16 MiB of synced writes, so that RocksDB's WAL rolled and its
files were recycled (storage.db.WAL_RECYCLE_FILES), on a single node and on a 3-node
cluster's leader. Every acknowledged PUBLISH comes back exactly once; every acknowledged
ACK stays acked (nothing resurrected from a recycled file's stale records); the
cluster's replicas agree on the applied digest.
"""

from __future__ import annotations

import threading
import time

from broker_process import BrokerProcess
from cluster_process import Cluster
from peer_attacks import converged
from wire_client import WireClient

from futureq.wire import frames

PAYLOAD = b"p" * 4096
BATCH = 64


def _publish(client: WireClient, count: int, ids: set[int]) -> None:
    for _ in range(count):
        answer = client.publish([["t", PAYLOAD, None, None, None] for _ in range(BATCH)])
        assert isinstance(answer, frames.PublishOk), answer
        ids.update(range(answer.first_id, answer.first_id + BATCH))


def _load_then_kill(address: str, batches: int, kill: object) -> tuple[set[int], set[int]]:
    """Publish ``batches`` batches, consume and ack 2,000, publish as many again, then
    ``kill()`` while a publisher still runs. Returns (acknowledged publishes, acked)."""
    pub = WireClient(address)
    published: set[int] = set()
    _publish(pub, batches, published)
    con = WireClient(address)
    con.subscribe("t", "g", prefetch=2000)
    got = con.deliveries(2000, timeout_s=60)
    tags = [d[0] for d in got]
    for i in range(0, len(tags), 200):
        answer = con.request(frames.Ack(con.next_id(), tags[i : i + 200]))
        assert isinstance(answer, frames.Ok), answer
    _publish(pub, batches, published)  # the acks' WAL rolls too
    stop = threading.Event()

    def more() -> None:
        try:
            while not stop.is_set():
                _publish(pub, 1, published)
        except Exception:  # noqa: BLE001 - the kill ends it
            pass

    thread = threading.Thread(target=more)
    thread.start()
    time.sleep(0.6)
    kill()  # type: ignore[operator]
    stop.set()
    thread.join(10)
    pub.close()
    con.close()
    return published, {d[1] for d in got}


def _consume_all(address: str) -> list[int]:
    """Every message id delivered until 5 s pass without one; each acked."""
    check = WireClient(address)
    sid = check.subscribe("t", "g", prefetch=10_000)
    seen: list[int] = []
    tags: list[bytes] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        batch = check.poll_deliveries(5)
        if not batch:
            break
        seen.extend(d[1] for d in batch)
        tags.extend(d[0] for d in batch)
        if len(tags) >= 5000:
            answer = check.request(frames.Ack(check.next_id(), tags))
            assert isinstance(answer, frames.Ok), answer
            check.send(frames.Credit(check.next_id(), sid, len(tags)))
            tags = []
    if tags:
        answer = check.request(frames.Ack(check.next_id(), tags))
        assert isinstance(answer, frames.Ok), answer
    check.close()
    return seen


def _check(seen: list[int], published: set[int], acked: set[int]) -> None:
    seen_set = set(seen)
    assert len(seen) == len(seen_set), "duplicates after the restart"
    assert not (seen_set & acked), f"acked came back: {sorted(seen_set & acked)[:5]}"
    missing = published - acked - seen_set
    assert not missing, f"{len(missing)} acknowledged publishes lost: {sorted(missing)[:5]}"


def test_a_single_node_killed_after_the_wal_rolled_loses_and_revives_nothing(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory()  # type: ignore[operator]
    gone: set[int] = set()  # acked in an earlier round: must stay gone too
    for _round in range(2):  # the second round writes over files the first recycled
        published, acked = _load_then_kill(broker.client_address, 80, broker.kill)
        broker.start()
        seen = _consume_all(broker.client_address)
        _check(seen, published, acked | gone)
        gone |= acked | set(seen)


def test_a_leader_killed_after_the_wal_rolled_loses_nothing_and_replicas_agree(
    cluster3: Cluster,
) -> None:
    leader = cluster3.leader(30)
    published, acked = _load_then_kill(leader.client_address, 70, leader.kill)
    leader.start()
    _check(_consume_all(cluster3.leader(30).client_address), published, acked)
    converged(cluster3, 30)  # one applied index everywhere, with one digest
