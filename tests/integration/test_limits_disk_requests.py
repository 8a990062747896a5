"""Every request that writes, on a full disk against a real ``futureq start``: each is
answered at once (``NO_SPACE``, 325, or its own refusal), none waits for space, and the
connection goes on serving (``docs/operations.md``, "Full disk")."""

from __future__ import annotations

import time

from broker_process import BrokerProcess
from test_limits_disk import fill_disk, free_disk, publish_until_refused, wait_ready
from wire_client import WireClient

from futureq.errors import ErrorCode
from futureq.wire import frames

ANSWER_WITHIN_S = 5.0
"""Far below the 10 s the client waits; a request waiting for space would take forever."""


def test_writes_on_a_full_disk_are_refused_at_once(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address)
    client.subscribe("full.t", "g", prefetch=10)
    for group in ("h", "doomed"):
        created = client.request(frames.GroupCreate(client.next_id(), "full.t", group))
        assert isinstance(created, frames.Ok), created
    published = client.publish([["full.t", b"m%d" % i, 0, None, None] for i in range(3)])
    later = client.publish([["full.t", b"later", 3_600_000, None, None]])
    assert isinstance(published, frames.PublishOk) and isinstance(later, frames.PublishOk)
    held = client.deliveries(3)
    tags = [d[0] for d in held]
    later_id = later.first_id

    fill_disk(broker.pid)
    assert publish_until_refused(client, "full.t").code == ErrorCode.NO_SPACE
    requests = {
        "GROUP_DELETE": frames.GroupDelete(client.next_id(), "full.t", "doomed"),
        "GROUP_CREATE": frames.GroupCreate(client.next_id(), "full.t", "new", None, None),
        "ACK": frames.Ack(client.next_id(), [tags[0]]),
        "NACK": frames.Nack(client.next_id(), [tags[1]], 0),
        "RELEASE": frames.Release(client.next_id(), [tags[2]]),
        "CANCEL": frames.Cancel(client.next_id(), "full.t", "h", [later_id]),
        "RESCHEDULE": frames.Reschedule(client.next_id(), "full.t", None, [later_id], None, 1000),
        "PURGE": frames.Purge(client.next_id(), "full.t", "h"),
    }
    answers = {}
    for name, request in requests.items():
        started = time.monotonic()
        answer = client.request(request)
        took = time.monotonic() - started
        answers[name] = (answer, round(took, 2))
    for name, (answer, took) in answers.items():
        assert took < ANSWER_WITHIN_S, (name, took)
        assert isinstance(answer, frames.Error), (name, answer)
        assert answer.code == ErrorCode.NO_SPACE, (name, answer)
    assert isinstance(client.request(frames.Ping(client.next_id())), frames.Pong)
    assert client.status()["alarms"] == ["NO_SPACE"]

    free_disk(broker.pid)
    wait_ready(broker.http_address)
    deleted = client.request(frames.GroupDelete(client.next_id(), "full.t", "doomed"))
    assert isinstance(deleted, frames.Ok), deleted
    # Nothing of the refused requests was half-applied: the tags are still held here.
    acked = client.request(frames.Ack(client.next_id(), tags))
    assert acked == frames.Ok(acked.request_id, 3), acked
    cancelled = client.request(frames.Cancel(client.next_id(), "full.t", "h", [later_id]))
    assert cancelled == frames.ItemResults(cancelled.request_id, [0]), cancelled
