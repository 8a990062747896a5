"""A client that pipelines requests with large answers, against a real node: it is served
within its outbox's bound, not closed as a slow client (found by pipelining BROWSEs)."""

from __future__ import annotations

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
