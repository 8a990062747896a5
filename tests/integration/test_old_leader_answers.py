"""Requests that reach a leader after it handed the leadership over are answered
NOT_LEADER, naming the new leader, against a real 3-node cluster.

Left noted last stop: once the leadership moved, the old leader stopped reading each
connection at once and closed it after a grace period, so a request the client sent
meanwhile was never answered: the client waited out the grace (2 s) and then had to
report an at-most-once publish's outcome as unknown. Now the old leader answers what
arrives during the grace, so the client follows the new leader at once.
"""

from __future__ import annotations

import time

import trio
from cluster_process import Cluster
from wire_client import WireClient

from futureq.client import open_client
from futureq.errors import ErrorCode
from futureq.wire import codec, frames


def test_requests_after_a_handover_are_answered_not_leader_naming_the_new_one(
    cluster3: Cluster,
) -> None:
    old = cluster3.leader(30)
    wire = WireClient(old.client_address)
    sub_id = wire.next_id()
    wire.send(frames.Subscribe(sub_id, "moved", "g", 10))
    assert isinstance(wire.receive(), frames.SubscribeOk)
    seen = len(old.stderr_text())

    async def transfer() -> None:
        async with open_client(cluster3.servers) as client:
            await client.transfer_leader()

    trio.run(transfer)
    new = cluster3.leader(30, exclude={old.node_id})
    deadline = time.monotonic() + 10
    while "leadership changed; closing it" not in old.stderr_text()[seen:]:
        assert time.monotonic() < deadline, old.stderr_text()[-3000:]
        time.sleep(0.01)
    publish_id, ack_id, status_id = wire.next_id(), wire.next_id(), wire.next_id()
    wire.send(frames.Publish(publish_id, 1, [["moved", b"after", 0, None, None]]))
    wire.send(frames.Ack(ack_id, [b"\x00" * 16]))
    wire.send(frames.Status(status_id))
    answers: dict[int, frames.Frame] = {}
    while len(answers) < 3:
        frame = wire.receive(timeout_s=1.5)  # the grace is 2 s: before, nothing came
        assert frame is not codec.CLOSED, answers
        if isinstance(frame, frames.Error | frames.StatusOk):
            answers[frame.request_id] = frame
    for request_id in (publish_id, ack_id):
        error = answers[request_id]
        assert isinstance(error, frames.Error), error
        assert error.code == ErrorCode.NOT_LEADER, error
        assert error.leader_address == new.client_address, error
    assert isinstance(answers[status_id], frames.StatusOk)
    # The connection still ends, within the grace: the client must reconnect.
    deadline = time.monotonic() + 10
    while wire.receive(timeout_s=10) is not codec.CLOSED:
        assert time.monotonic() < deadline
