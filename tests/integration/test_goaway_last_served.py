"""GOAWAY's ``last_request_id`` is a promise: no request with a larger id is served
after it, not even one the reader had decoded and was waiting to start (its slot among
MAX_REQUESTS_IN_PROGRESS, or room) when the node stopped reading."""

from __future__ import annotations

import signal
import threading

from broker_process import BrokerProcess
from wire_client import WireClient

from futureq.broker.connection import MAX_REQUESTS_IN_PROGRESS
from futureq.wire import codec, frames

COUNT = MAX_REQUESTS_IN_PROGRESS * 80
"""Far more than the node serves at once: its reader waits for a slot at the SIGTERM."""


def test_no_request_above_goaway_is_answered_through_a_sigterm(broker_factory: object) -> None:
    broker: BrokerProcess = broker_factory()  # type: ignore[operator]
    client = WireClient(broker.client_address, versions=(6,), timeout_s=30)
    ids = [client.next_id() for _ in range(COUNT)]
    data = b"".join(
        codec.encode_frame(
            frames.Publish(rid, frames.AckLevel.QUORUM, [["t", b"m%d" % rid, None, None, None]]),
            2**31,
        )
        for rid in ids
    )

    def send() -> None:
        try:
            client.sock.sendall(data)
        except OSError:
            pass  # the node closed the connection before taking it all

    sender = threading.Thread(target=send)
    sender.start()
    try:
        answered = []
        while len(answered) < MAX_REQUESTS_IN_PROGRESS * 2:  # the node serves the pipeline
            frame = client.receive(20)
            assert isinstance(frame, frames.PublishOk), frame
            answered.append(frame.request_id)
        assert broker.process is not None
        broker.process.send_signal(signal.SIGTERM)
        goaway: frames.GoAway | None = None
        while (frame := client.receive(20)) is not codec.CLOSED:
            if isinstance(frame, frames.GoAway):
                goaway = frame
            else:
                answered.append(frame.request_id)
    finally:
        sender.join(20)
    assert goaway is not None
    assert goaway.last_request_id < ids[-1]  # the pipeline was cut short
    served_after = [rid for rid in answered if rid > goaway.last_request_id]
    assert served_after == [], (goaway, served_after)
    # Every request it served was answered (none left with an unknown outcome).
    assert sorted(answered) == [rid for rid in ids if rid <= goaway.last_request_id]
