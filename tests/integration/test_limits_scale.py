"""Many topics and groups against a real ``futureq start`` process (issue 10, inputs 1, 2).

Speed is measured in ``bench/topic_scale.py``; here the node must stay live: every PING
and every ``/api/status`` on other connections is answered (each within the wire
client's usual 10 s deadline) while batches of 10,000 new topics go in, which took the
node down for minutes before, and ``/metrics`` keeps a bounded number of series.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from typing import Any

import pytest
from broker_process import BrokerProcess
from wire_client import WireClient

from futureq.errors import ErrorCode
from futureq.wire import codec, frames


class Pinger(threading.Thread):
    """PINGs on its own connection and reads /api/status until stopped; keeps failures."""

    def __init__(self, broker: BrokerProcess) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.stop = threading.Event()
        self.answered = 0
        self.failures: list[BaseException] = []

    def run(self) -> None:
        client = WireClient(self.broker.client_address)
        try:
            while not self.stop.is_set():
                answer = client.request(frames.Ping(client.next_id()))
                assert isinstance(answer, frames.Pong), answer
                url = f"http://{self.broker.http_address}/api/status"
                with urllib.request.urlopen(url, timeout=10) as response:
                    assert response.status == 200
                self.answered += 1
                time.sleep(0.01)
        except BaseException as exc:  # reported by the test
            self.failures.append(exc)


def publish_new_topics(broker: BrokerProcess, batches: int) -> None:
    pinger = Pinger(broker)
    pinger.start()
    client = WireClient(broker.client_address)
    try:
        for batch in range(batches):
            items = [[f"new.b{batch}.t{i}", b"x", 60_000, None, None] for i in range(10_000)]
            answer = client.publish(items)
            assert isinstance(answer, frames.PublishOk), answer
            assert not pinger.failures, pinger.failures
    finally:
        pinger.stop.set()
        pinger.join(30)
    assert not pinger.failures, pinger.failures
    assert pinger.answered > 0
    status = client.status()
    assert status["topic_count"] == 10_000 * batches
    assert status["group_count"] == 10_000 * batches
    assert status["truncated"] is True
    assert sum(len(topic["groups"]) for topic in status["topics"]) == 1000


def test_batches_of_new_topics_keep_the_node_answering(broker: BrokerProcess) -> None:
    publish_new_topics(broker, batches=2)


@pytest.mark.slow
def test_ten_batches_of_ten_thousand_new_topics_keep_the_node_answering(
    broker: BrokerProcess,
) -> None:
    publish_new_topics(broker, batches=10)  # the reported input


def series(broker: BrokerProcess, name: str) -> list[str]:
    with urllib.request.urlopen(f"http://{broker.http_address}/metrics", timeout=10) as response:
        text = response.read().decode()
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def value(line: str) -> float:
    return float(line.rsplit(" ", 1)[1])


def test_metric_series_are_bounded_and_the_rest_is_counted_as_other(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address)
    for _ in range(100):
        assert isinstance(client.publish([["hot", b"x", 0, None, None]]), frames.PublishOk)
    # The reported input: 2,000 idle groups, created with pipelined GROUP_CREATEs.
    first = client.next_id()
    for number in range(2000):
        client.send(frames.GroupCreate(first + number, f"idle.{number}", "g", None, None))
    client._next_id = first + 2000
    answers = [client.receive() for _ in range(2000)]
    assert all(isinstance(answer, frames.Ok) for answer in answers)
    for number in range(0, 2000, 100):  # some idle groups hold a message
        answer = client.publish([[f"idle.{number}", b"x", 0, None, None]])
        assert isinstance(answer, frames.PublishOk), answer

    pending = series(broker, "futureq_pending_messages")
    assert len(pending) == 1001  # the default metrics.max_group_series, and _other
    other = [line for line in pending if 'topic="_other"' in line]
    assert len(other) == 1 and 'group="_other"' in other[0]
    assert sum(value(line) for line in pending) == 100 + 20  # nothing lost in the sum
    published = series(broker, "futureq_published_messages_total")
    assert len(published) <= 1001
    assert sum(value(line) for line in published) == 100 + 20
    # due is not computed for the groups past the budget (so a scrape stays cheap).
    assert all('topic="_other"' not in line for line in series(broker, "futureq_due_messages"))


def test_per_group_series_can_be_turned_off(broker_factory: object) -> None:
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        env={"FUTUREQ_METRICS_MAX_GROUP_SERIES": "0", "FUTUREQ_METRICS_MAX_TOPIC_SERIES": "0"}
    )
    client = WireClient(broker.client_address)
    for number in range(20):
        assert isinstance(client.publish([[f"t{number}", b"x", 0, None, None]]), frames.PublishOk)
    assert [re.sub(r" .*", "", line) for line in series(broker, "futureq_pending_messages")] == [
        'futureq_pending_messages{group="_other",topic="_other"}'
    ]
    [published] = series(broker, "futureq_published_messages_total")
    assert 'topic="_other"' in published and value(published) == 20


def test_the_number_of_groups_is_bounded(broker_factory: object) -> None:
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        env={"FUTUREQ_LIMITS_MAX_GROUPS": "3", "FUTUREQ_QUEUE_MAX_DELIVERIES": "1"}
    )
    client = WireClient(broker.client_address)
    assert isinstance(client.publish([["g.a", b"x", 0, None, None]]), frames.PublishOk)
    assert isinstance(client.publish([["g.b", b"x", 0, None, None]]), frames.PublishOk)
    refused = client.publish(
        [["g.a", b"x", 0, None, None], ["g.c", b"x", 0, None, None], ["g.d", b"x", 0, None, None]]
    )
    assert isinstance(refused, frames.Error), refused
    assert refused.code == 237 and refused.item_index == 2 and "max_groups" in refused.message
    assert isinstance(client.publish([["g.c", b"x", 0, None, None]]), frames.PublishOk)
    # Naming the implicit group adopts it: no new group, allowed.
    adopted = client.request(frames.GroupCreate(client.next_id(), "g.b", "first", None, None))
    assert isinstance(adopted, frames.Ok), adopted
    for frame in (
        frames.Subscribe(client.next_id(), "g.d", "g", 1),
        frames.GroupCreate(client.next_id(), "g.b", "second", None, None),
    ):
        answer = client.request(frame)
        assert isinstance(answer, frames.Error) and answer.code == 237, answer
    # Existing groups are still usable, and derived dead-letter topics are created past it.
    sub = client.subscribe("g.a", "default")  # adopts nothing new: the implicit group
    assert sub
    [first] = client.deliveries(1)
    assert isinstance(client.request(frames.Nack(client.next_id(), [first[0]], 0)), frames.Ok)
    dlq = WireClient(broker.client_address)
    deadline = time.monotonic() + 10
    while dlq.group_pending("g.a.dlq", "default") != 1:
        assert time.monotonic() < deadline, dlq.status()
        time.sleep(0.1)
    assert dlq.status()["group_count"] == 4


def _pipelined(client: WireClient, requests: list[frames.Frame]) -> list[Any]:
    """Send every request before reading any answer; the answers, by request id."""
    client.send_raw(b"".join(codec.encode_frame(frame, 2**31) for frame in requests))
    answers: dict[int, Any] = {}
    while len(answers) < len(requests):
        answer = client.receive_answer()
        answers[answer.request_id] = answer
    return [answers[frame.request_id] for frame in requests]  # type: ignore[attr-defined]


def test_pipelined_requests_cannot_pass_the_group_limit_together(broker_factory: object) -> None:
    """Found by a breaker: the limit was checked before the proposal and counted after
    its commit, so every request pipelined in between saw the same count; 20 of 20
    GROUP_CREATEs and 516 groups from single-item PUBLISHes passed a limit of 5."""
    broker: BrokerProcess = broker_factory(env={"FUTUREQ_LIMITS_MAX_GROUPS": "5"})  # type: ignore[operator]
    client = WireClient(broker.client_address)
    creates = [
        frames.GroupCreate(client.next_id(), f"race.c{number}", "g", None, None)
        for number in range(20)
    ]
    answers = _pipelined(client, creates)
    created = [answer for answer in answers if isinstance(answer, frames.Ok)]
    refused = [answer for answer in answers if isinstance(answer, frames.Error)]
    assert len(created) == 5 and len(refused) == 15, answers
    assert all(answer.code == ErrorCode.TOO_MANY_GROUPS for answer in refused), refused
    assert "limits.max_groups = 5" in refused[0].message, refused[0].message

    second = WireClient(broker.client_address)
    publishes = [
        frames.Publish(
            second.next_id(), frames.AckLevel.QUORUM, [[f"race.p{n}", b"x", 0, None, None]]
        )
        for n in range(40)
    ]
    answers = _pipelined(second, publishes)
    assert all(isinstance(a, frames.Error) and a.code == ErrorCode.TOO_MANY_GROUPS for a in answers)
    status = client.request(frames.Status(client.next_id()))
    assert isinstance(status, frames.StatusOk)
    groups = [group for topic in status.status["topics"] for group in topic["groups"]]
    assert len(groups) == 5, status.status["topics"]


def test_only_one_new_name_per_topic_adopts_its_implicit_group(broker_factory: object) -> None:
    """Found by a breaker: every name in flight for a topic whose only group was implicit
    was taken for the one that adopts it, but only the first to commit adopts; the
    others made groups of their own (100 under a limit of 5 from pipelined SUBSCRIBEs)."""
    broker: BrokerProcess = broker_factory(env={"FUTUREQ_LIMITS_MAX_GROUPS": "5"})  # type: ignore[operator]
    client = WireClient(broker.client_address)
    for number in range(5):  # five implicit groups: the limit
        assert isinstance(
            client.publish([[f"adopt.t{number}", b"x", 0, None, None]]), frames.PublishOk
        )
    creates: list[frames.Frame] = [
        frames.GroupCreate(client.next_id(), f"adopt.t{number}", name, None, None)
        for number in range(5)
        for name in ("first", "second")
    ]
    subscribes: list[frames.Frame] = [
        frames.Subscribe(client.next_id(), f"adopt.t{number}", f"s{k}", 1)
        for number in range(5)
        for k in range(4)
    ]
    answers = _pipelined(client, creates + subscribes)
    made = [a for a in answers if isinstance(a, frames.Ok | frames.SubscribeOk)]
    refused = [a for a in answers if isinstance(a, frames.Error)]
    assert all(a.code == ErrorCode.TOO_MANY_GROUPS for a in refused), refused
    assert len(made) == 5, answers  # one adopter per topic, nothing past the limit
    status = client.request(frames.Status(client.next_id()))
    groups = [group for topic in status.status["topics"] for group in topic["groups"]]
    assert len(groups) == 5, status.status["topics"]


def test_a_deleted_topic_frees_its_series_for_the_next_one(broker_factory: object) -> None:
    # The reported input: with room for 2 topic series, topics a and b were created,
    # published to and deleted; the only live topic d was then counted as "_other" while
    # a and b kept their series until a restart (topics created and deleted in a loop
    # used up the budget for good).
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        env={"FUTUREQ_METRICS_MAX_TOPIC_SERIES": "2", "FUTUREQ_METRICS_MAX_GROUP_SERIES": "2"}
    )
    client = WireClient(broker.client_address)
    for topic in ("a", "b"):
        assert isinstance(
            client.request(frames.GroupCreate(client.next_id(), topic, "g", None, None)), frames.Ok
        )
        assert isinstance(client.publish([[topic, b"x", 0, None, None]]), frames.PublishOk)
        answer = client.request(frames.GroupDelete(client.next_id(), topic, "g"))
        assert isinstance(answer, frames.Ok), answer
    assert client.status()["topic_count"] == 0
    for topic in ("d", "e"):
        assert isinstance(
            client.request(frames.GroupCreate(client.next_id(), topic, "g", None, None)), frames.Ok
        )
        assert isinstance(client.publish([[topic, b"x", 0, None, None]]), frames.PublishOk)
    published = {
        re.sub(r" .*", "", line): value(line)
        for line in series(broker, "futureq_published_messages_total")
    }
    assert published == {
        'futureq_published_messages_total{topic="d"}': 1.0,
        'futureq_published_messages_total{topic="e"}': 1.0,
    }
    pending = [re.sub(r" .*", "", line) for line in series(broker, "futureq_pending_messages")]
    assert sorted(pending) == [
        'futureq_pending_messages{group="g",topic="d"}',
        'futureq_pending_messages{group="g",topic="e"}',
    ]
