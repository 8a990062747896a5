"""More requests pipelined on one connection than MAX_REQUESTS_IN_PROGRESS, connections
that vanish mid-request, and SIGTERM with proposals queued (gateway slot and proposal
queue taken without a scheduling point)."""

from __future__ import annotations

import time

from broker_process import BrokerProcess
from wire_client import WireClient

from futureq.broker.connection import MAX_REQUESTS_IN_PROGRESS
from futureq.errors import ErrorCode, RemoteProtocolError
from futureq.wire import codec, frames

N = MAX_REQUESTS_IN_PROGRESS * 8


def _frames_bytes(client: WireClient, count: int, tag: str) -> tuple[bytes, list[int]]:
    ids = [client.next_id() for _ in range(count)]
    data = b"".join(
        codec.encode_frame(
            frames.Publish(
                rid, frames.AckLevel.QUORUM, [["t", f"{tag}{rid}".encode(), None, None, None]]
            ),
            2**31,
        )
        for rid in ids
    )
    return data, ids


def _collect(client: WireClient, count: int) -> dict[int, int]:
    got: dict[int, int] = {}
    while len(got) < count:
        answer = client.receive(30)
        if answer is codec.CLOSED:
            break
        assert isinstance(answer, frames.PublishOk), answer
        got[answer.request_id] = answer.first_id
    return got


def test_pipelined_requests_beyond_the_limit_all_answered_and_vanishing_clients_harmless(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory()  # type: ignore[operator]
    addr = broker.client_address
    # Clients that send many requests and disconnect at once.
    for _ in range(5):
        gone = WireClient(addr)
        data, _ = _frames_bytes(gone, N, "gone")
        gone.send_raw(data)
        gone.close()
    main = WireClient(addr)
    data, ids = _frames_bytes(main, N, "main")
    main.send_raw(data)
    got = _collect(main, N)
    assert sorted(got) == sorted(ids)
    assert len(set(got.values())) == N
    # The node still serves, and its queue holds at least every publish it answered
    # (the vanished clients' may be there too). The topic's group is the one a publish
    # to a new topic makes.
    probe = WireClient(addr)
    answer = probe.publish([["t", b"probe", None, None, None]])
    assert isinstance(answer, frames.PublishOk), answer
    pending = probe.group_pending("t", "default")
    assert pending is not None and pending >= N + 1, pending


def test_sigterm_with_proposals_queued_keeps_every_acknowledged_publish(
    broker_factory: object,
) -> None:
    broker: BrokerProcess = broker_factory()  # type: ignore[operator]
    addr = broker.client_address
    sub = WireClient(addr)
    sub.subscribe("t", "g", prefetch=1)
    sub.close()
    clients = [WireClient(addr) for _ in range(4)]
    sent: list[list[int]] = []
    for client in clients:
        data, ids = _frames_bytes(client, N, "x")
        client.send_raw(data)
        sent.append(ids)
    time.sleep(0.05)
    code = broker.terminate()
    acked: set[int] = set()
    for client in clients:
        while True:
            try:
                answer = client.receive(5)
            except (TimeoutError, OSError):
                break
            except RemoteProtocolError as exc:
                # These clients read nothing until the node has exited: past the drain,
                # shutdown closes a connection whose writer is blocked on the full socket
                # buffer, so its last frame may be cut. A cut frame acknowledged nothing.
                assert exc.code is ErrorCode.TRUNCATED_FRAME, exc
                break
            if answer is codec.CLOSED:
                break
            if isinstance(answer, frames.PublishOk):
                acked.add(answer.first_id)
    assert code == 0, broker.stderr_text()[-3000:]
    broker.start()
    check = WireClient(broker.client_address)
    pending = check.group_pending("t", "g")
    assert pending is not None and pending >= len(acked), (pending, len(acked))
