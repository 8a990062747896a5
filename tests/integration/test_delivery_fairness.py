"""Round-robin within a group (GroupRuntime.ready): consumers split work,
including ones that ran out of credit and got it back, and a resubscribed one."""

from __future__ import annotations

import time

from broker_process import BrokerProcess
from wire_client import WireClient

from futureq.wire import frames


def _subscribed(
    addr: str, count: int, topic: str, prefetch: int
) -> tuple[list[WireClient], list[int]]:
    """``count`` consumers of group ``g`` of ``topic``, each on its own connection, and
    their subscription ids."""
    consumers = [WireClient(addr) for _ in range(count)]
    return consumers, [c.subscribe(topic, "g", prefetch=prefetch) for c in consumers]


def _drain(clients: list[WireClient], total: int, timeout_s: float = 20) -> list[list]:
    per: list[list] = [[] for _ in clients]
    deadline = time.monotonic() + timeout_s
    while sum(map(len, per)) < total and time.monotonic() < deadline:
        for i, c in enumerate(clients):
            per[i].extend(c.poll_deliveries(0.02))
            while c.pushed:
                per[i].extend(c.poll_deliveries(0.02))
    return per


def test_consumers_split_single_publishes_evenly(broker: BrokerProcess) -> None:
    addr = broker.client_address
    consumers, _ = _subscribed(addr, 20, "t", prefetch=1000)
    pub = WireClient(addr)
    for i in range(400):
        answer = pub.publish([["t", b"%d" % i, None, None, None]])
        assert isinstance(answer, frames.PublishOk)
    per = _drain(consumers, 400)
    counts = [len(p) for p in per]
    assert sum(counts) == 400, counts
    assert min(counts) >= 10, counts


def test_credit_one_consumers_keep_receiving_after_credit_returns(broker: BrokerProcess) -> None:
    addr = broker.client_address
    consumers, sids = _subscribed(addr, 5, "t", prefetch=1)
    pub = WireClient(addr)
    total = 300
    for i in range(0, total, 10):
        answer = pub.publish([["t", b"%d" % j, None, None, None] for j in range(i, i + 10)])
        assert isinstance(answer, frames.PublishOk)
    got = [0] * 5
    deadline = time.monotonic() + 60
    while sum(got) < total:
        assert time.monotonic() < deadline, got
        for i, c in enumerate(consumers):
            ds = c.poll_deliveries()
            if not ds:
                continue
            got[i] += len(ds)
            c.send(frames.Ack(c.next_id(), [d[0] for d in ds]))
            c.send(frames.Credit(c.next_id(), sids[i], len(ds)))
            # the ack's OK is read as a non-DELIVER frame below
            ok = c.receive_answer(10)
            assert isinstance(ok, frames.Ok), ok
        if sum(got) == 150:
            # one resubscribes mid-way
            consumers[0].close()
            consumers[0] = WireClient(addr)
            sids[0] = consumers[0].subscribe("t", "g", prefetch=1)
    assert min(got) >= 20, got


def test_redeliveries_after_visibility_timeouts_reach_credit_one_consumers(
    broker: BrokerProcess,
) -> None:
    addr = broker.client_address
    admin = WireClient(addr)
    answer = admin.request(frames.GroupCreate(admin.next_id(), "v", "g", 300, 50))
    assert isinstance(answer, frames.Ok), answer
    consumers, _ = _subscribed(addr, 3, "v", prefetch=1)
    answer = admin.publish([["v", b"m%d" % i, None, None, None] for i in range(3)])
    assert isinstance(answer, frames.PublishOk)
    # Nobody acks: each timeout revokes (credit back) and the entry goes out again.
    attempts: dict[int, int] = {}
    deadline = time.monotonic() + 20
    while min(attempts.values(), default=0) < 6 or len(attempts) < 3:
        assert time.monotonic() < deadline, attempts
        for c in consumers:
            for d in c.poll_deliveries():
                attempts[d[1]] = max(attempts.get(d[1], 0), d[5])


def test_group_delete_and_recreate_then_consumers_receive(broker: BrokerProcess) -> None:
    addr = broker.client_address
    admin = WireClient(addr)
    for cycle in range(5):
        consumers, _ = _subscribed(addr, 3, "d", prefetch=2)
        answer = admin.publish([["d", b"%d" % i, None, None, None] for i in range(12)])
        assert isinstance(answer, frames.PublishOk)
        got = 0
        deadline = time.monotonic() + 10
        while got < 6:  # each consumer's prefetch of 2
            assert time.monotonic() < deadline, (cycle, got)
            for c in consumers:
                got += len(c.poll_deliveries())
        answer = admin.request(frames.GroupDelete(admin.next_id(), "d", "g"))
        assert isinstance(answer, frames.Ok), answer
        for c in consumers:
            c.wait_notice(frames.SubscriptionEnd)
            c.close()
