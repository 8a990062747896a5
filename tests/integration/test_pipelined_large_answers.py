"""A client that pipelines requests with large answers, against a real node: it is served
within its outbox's bound, not closed as a slow client (found by pipelining BROWSEs)."""

from __future__ import annotations

import time

from broker_process import BrokerProcess
from wire_client import WireClient

from futureq.wire import codec, frames

KIB = 1024
MIB = 1024 * KIB


def test_pipelined_browses_of_a_client_that_reads_are_all_answered(
    broker_factory: object,
) -> None:
    """Before: 40 BROWSEs of 1,000 messages (about 1 MiB each) sent at once were served
    at once, their answers overflowed twice the 8 MiB outbox limit in one go, and the
    client, which read as fast as it could, was closed SLOW_CLIENT with no answer."""
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        env={"FUTUREQ_LIMITS_MAX_CONNECTION_BUFFER_BYTES": str(4 * MIB)}
    )
    client = WireClient(broker.client_address, versions=(6,))
    for _ in range(10):
        answer = client.publish([["wide", b"z" * KIB, 3_600_000, None, None]] * 100)
        assert isinstance(answer, frames.PublishOk), answer
    ids = [client.next_id() for _ in range(40)]
    client.send_raw(
        b"".join(
            codec.encode_frame(frames.Browse(i, "wide", None, None, None, None, 1000, KIB), 2**31)
            for i in ids
        )
    )
    answered = []
    while len(answered) < len(ids):
        answer = client.receive(timeout_s=15)
        assert isinstance(answer, frames.BrowseOk), answer
        assert len(answer.messages) == 1000
        answered.append(answer.request_id)
    assert sorted(answered) == ids
    assert "SLOW_CLIENT" not in broker.stderr_text()


def test_a_frame_is_not_timed_while_the_node_serves_the_requests_before_it(
    broker_factory: object,
) -> None:
    """Before: a frame split across two reads, behind 300 pipelined BROWSEs, was closed
    FRAME_TIMEOUT once the node had spent more than ``frame_deadline_ms`` serving the
    BROWSEs (and waiting for the client to read their answers), though its rest had
    been in the socket all along."""
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        env={
            "FUTUREQ_LIMITS_MAX_CONNECTION_BUFFER_BYTES": str(MIB),
            "FUTUREQ_LIMITS_MAX_FRAME_BYTES": str(MIB),
            "FUTUREQ_LIMITS_MAX_PAYLOAD_BYTES": str(256 * KIB),
            "FUTUREQ_LIMITS_FRAME_DEADLINE_MS": "1000",
        }
    )
    client = WireClient(broker.client_address, versions=(6,))
    answer = client.publish([["wide", b"z" * KIB, 3_600_000, None, None]] * 100)
    assert isinstance(answer, frames.PublishOk), answer
    ids = [client.next_id() for _ in range(300)]
    browses = b"".join(
        codec.encode_frame(frames.Browse(i, "wide", None, None, None, None, 100, KIB), 2**31)
        for i in ids
    )
    last = client.next_id()
    publish = codec.encode_frame(
        frames.Publish(last, frames.AckLevel.LEADER, (("wide", b"last", None, None, None),)),
        2**31,
    )
    client.send_raw(browses + publish[:10])  # the node reads these in one go
    time.sleep(0.3)
    client.send_raw(publish[10:])
    time.sleep(2.5)  # the client reads nothing meanwhile: the node waits for it
    answered = set()
    while len(answered) < len(ids) + 1:
        answer = client.receive(timeout_s=15)
        assert isinstance(answer, (frames.BrowseOk, frames.PublishOk)), answer
        answered.add(answer.request_id)
    assert answered == {*ids, last}
    assert "FRAME_TIMEOUT" not in broker.stderr_text()
