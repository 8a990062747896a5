"""RESCHEDULE and CANCEL of messages whose deliveries are out, against a real broker.

A first delivery goes out unrecorded (``docs/protocol.md``, "DELIVER"); RESCHEDULE
still keeps its attempt ("Attempts are kept"), CANCEL still says it was delivered, and
a parked dead letter rescheduled is delivered again. Source: ``docs/protocol.md``,
"RESCHEDULE", "CANCEL", "Dead letters".
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import pytest
from wire_client import WireClient

from futureq.errors import ErrorCode
from futureq.wire import codec, frames
from futureq.wire.frames import ItemStatus


class BrokerProcess(Protocol):
    client_address: str


def _items(client: WireClient, frame: frames.Frame) -> list[int]:
    answer = client.request(frame)
    assert isinstance(answer, frames.ItemResults), answer
    return list(answer.results)


def _group(
    client: WireClient, topic: str, group: str, max_deliveries: int, visibility_ms: int = 30_000
) -> None:
    answer = client.request(
        frames.GroupCreate(client.next_id(), topic, group, visibility_ms, max_deliveries)
    )
    assert isinstance(answer, frames.Ok), answer


def _browse(client: WireClient, topic: str) -> list[list[Any]]:
    answer = client.request(frames.Browse(client.next_id(), topic, None, None, None, None, 10, 0))
    assert isinstance(answer, frames.BrowseOk), answer
    return list(answer.messages)


def test_rescheduling_a_first_delivery_keeps_its_attempt(broker: BrokerProcess) -> None:
    """max_deliveries=1: delivered once, rescheduled while out, then dead-lettered
    instead of being delivered as attempt 1 again and again."""
    admin = WireClient(broker.client_address)
    consumer = WireClient(broker.client_address)
    _group(admin, "ra", "g", 1)
    mid = admin.publish([["ra", b"x", None, None, None]]).first_id
    consumer.subscribe("ra", "g", 5)
    [first] = consumer.deliveries(1)
    assert (first[1], first[5]) == (mid, 1)
    assert _items(admin, frames.Reschedule(admin.next_id(), "ra", "g", [mid], None, 0)) == [
        ItemStatus.DONE
    ]
    consumer.expect_nothing(1.0)
    assert consumer.revoked() == [first[0]]
    dead = WireClient(broker.client_address)
    dead.subscribe("ra.dlq", "default", 5)
    [letter] = dead.deliveries(1)
    assert letter[2] == b"x"
    assert _browse(admin, "ra") == []


def test_cancel_of_a_message_whose_first_delivery_is_out_answers_delivered(
    broker: BrokerProcess,
) -> None:
    admin = WireClient(broker.client_address)
    consumer = WireClient(broker.client_address)
    _group(admin, "ca", "g", 5)
    consumer.subscribe("ca", "g", 1)
    mid = admin.publish([["ca", b"a", None, None, None]]).first_id
    waiting = admin.publish([["ca", b"b", None, None, None]]).first_id
    [held] = consumer.deliveries(1)
    assert held[1] == mid
    assert _items(admin, frames.Cancel(admin.next_id(), "ca", None, [mid, waiting])) == [
        ItemStatus.DELIVERED,
        ItemStatus.DONE,
    ]


def test_a_parked_dead_letter_rescheduled_is_delivered_again(broker: BrokerProcess) -> None:
    admin = WireClient(broker.client_address)
    _group(admin, "pk", "g", 1)
    _group(admin, "pk.dlq", "default", 1)
    consumer = WireClient(broker.client_address)
    consumer.subscribe("pk", "g", 5)
    admin.publish([["pk", b"a", None, None, None]])
    [delivery] = consumer.deliveries(1)
    answer = consumer.request(frames.Nack(consumer.next_id(), [delivery[0]], 0, "bad", True))
    assert isinstance(answer, frames.Ok), answer
    dead = WireClient(broker.client_address)
    dead.subscribe("pk.dlq", "default", 5)
    [letter] = dead.deliveries(1)
    answer = dead.request(frames.Nack(dead.next_id(), [letter[0]], 0))
    assert isinstance(answer, frames.Ok), answer
    dead.expect_nothing(0.5)  # out of attempts on the dead-letter topic: parked
    [parked] = _browse(admin, "pk.dlq")
    assert parked[0] == letter[1] and parked[1] is None
    assert _items(
        admin, frames.Reschedule(admin.next_id(), "pk.dlq", None, [letter[1]], None, 200)
    ) == [ItemStatus.DONE]
    [again] = dead.deliveries(1, timeout_s=5.0)
    assert (again[1], again[5]) == (letter[1], 2)


class RestartableBroker(Protocol):
    client_address: str

    def terminate(self) -> int: ...

    def start(self) -> None: ...


@pytest.mark.parametrize("given_back_by", ["unsubscribe", "close", "shutdown"])
def test_a_first_delivery_given_back_counts_after_a_graceful_restart(
    broker: RestartableBroker, given_back_by: str
) -> None:
    """max_deliveries=2: delivered once, then given back (UNSUBSCRIBE, the connection
    closed, or still out when SIGTERM came); after a graceful restart it goes out as
    attempt 2 and is then dead-lettered with ``futureq-attempts: 2``. Two deliveries,
    not three (``docs/protocol.md``, UNSUBSCRIBE: "each counting as an attempt"). One
    still out at the SIGTERM stays out until its visibility deadline (2 s here,
    "Delivery tags across leaders")."""
    admin = WireClient(broker.client_address)
    consumer = WireClient(broker.client_address)
    _group(admin, "ua", "g", 2, 2_000 if given_back_by == "shutdown" else 30_000)
    mid = admin.publish([["ua", b"x", None, None, None]]).first_id
    subscription_id = consumer.subscribe("ua", "g", 1)
    [first] = consumer.deliveries(1)
    assert (first[1], first[5]) == (mid, 1)
    assert [m[2] for m in _browse(admin, "ua")] == [1]  # out: delivered once
    if given_back_by == "unsubscribe":
        answer = consumer.request(frames.Unsubscribe(consumer.next_id(), subscription_id))
        assert isinstance(answer, frames.Ok), answer
    elif given_back_by == "close":
        consumer.close()
    if given_back_by != "shutdown":
        assert [m[2] for m in _browse(admin, "ua")] == [1]  # back in the group, counted
    admin.close()
    assert broker.terminate() == 0
    consumer.close()
    broker.start()
    admin = WireClient(broker.client_address)
    assert [m[2] for m in _browse(admin, "ua")] == [1]
    consumer = WireClient(broker.client_address)
    subscription_id = consumer.subscribe("ua", "g", 1)
    [again] = consumer.deliveries(1, timeout_s=15.0)
    assert (again[1], again[5]) == (mid, 2)
    answer = consumer.request(frames.Nack(consumer.next_id(), [again[0]], 0))
    assert isinstance(answer, frames.Ok), answer
    consumer.send(frames.Credit(consumer.next_id(), subscription_id, 1))
    consumer.expect_nothing(1.0)
    [letter] = _browse(admin, "ua.dlq")
    assert letter[4]["futureq-attempts"] == "2"
    assert letter[4]["futureq-original-id"] == str(mid)


def test_a_dead_letter_says_when_its_first_delivery_went_out(broker: BrokerProcess) -> None:
    """Found by a breaker (2 of 2): max_deliveries=2, each delivery NACKed; the dead
    letter's ``futureq-first-delivery-ms`` was the *second* delivery's time, because the
    first (unrecorded) went out and was NACKed without the log learning when. The NACK
    now carries when the leader pushed it (``docs/protocol.md``, "Dead letters")."""
    admin = WireClient(broker.client_address)
    consumer = WireClient(broker.client_address)
    _group(admin, "fd", "g", 2)
    admin.publish([["fd", b"x", None, None, None]])
    subscription = consumer.subscribe("fd", "g", 1)
    pushed = []
    for attempt in (1, 2):
        [delivery] = consumer.deliveries(1)
        assert delivery[5] == attempt
        pushed.append(delivery[6])
        time.sleep(0.3)
        answer = consumer.request(frames.Nack(consumer.next_id(), [delivery[0]], 0))
        assert isinstance(answer, frames.Ok), answer
        consumer.send(frames.Credit(0, subscription, 1))  # settled: its credit back
    assert pushed[1] - pushed[0] >= 300
    deadline = time.monotonic() + 10
    while True:
        answer = admin.request(
            frames.Browse(admin.next_id(), "fd.dlq", None, None, None, None, 10, 0)
        )
        if isinstance(answer, frames.BrowseOk) and answer.messages:
            break
        assert time.monotonic() < deadline, answer  # not dead-lettered yet
        time.sleep(0.05)
    [letter] = answer.messages
    headers = letter[4]
    assert headers["futureq-attempts"] == "2"
    assert int(headers["futureq-first-delivery-ms"]) == pushed[0]
    assert int(headers["futureq-last-delivery-ms"]) == pushed[1]


def test_a_purge_hands_out_none_of_what_it_removes(broker: BrokerProcess) -> None:
    """PURGE of a group whose consumer holds deliveries: those are taken back (REVOKE
    reason 3) and nothing else the purge removes is delivered, though its chunks remove
    the entries from disk only bit by bit. Found by a tester: the credit the REVOKE gave
    back went at once to entries no chunk had removed yet, again and again, so 1,850 of
    5,000 purged messages were delivered after the PURGE was answered."""
    client = WireClient(broker.client_address)
    _group(client, "pq", "g", 5)
    for _ in range(3):
        client.publish([["pq", b"x", None, None, None]] * 1000)
    client.subscribe("pq", "g", 100)
    client.deliveries(100)
    answer = client.request(frames.Purge(client.next_id(), "pq", "g"))
    assert isinstance(answer, frames.Ok) and answer.result == 3000, answer
    client.expect_nothing(1.0)  # and none before the answer either (request keeps them)
    assert len(client.revoked()) == 100
    deadline = time.monotonic() + 30
    while client.group_pending("pq", "g") != 0:  # the chunks finish the purge
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_redrive_after_a_purge_of_the_dead_letters_brings_none_back(
    broker: BrokerProcess,
) -> None:
    """PURGE of a dead-letter topic's group, answered, then REDRIVE of some of the dead
    letters it removes: UNKNOWN, nothing comes back. Found by a tester: the purge's
    chunks had not reached them yet, so the REDRIVE answered DONE and resurrected them
    as new messages of the original topic."""
    client = WireClient(broker.client_address)
    _group(client, "rp", "g", 5)
    for _ in range(3):
        client.publish([["rp", b"x", None, None, None]] * 1000)
    subscription = client.subscribe("rp", "g", 1000)
    for round_ in range(3):
        tags = [d[0] for d in client.deliveries(1000)]
        answer = client.request(frames.Nack(client.next_id(), tags, 0, "bad", True))
        assert isinstance(answer, frames.Ok), answer
        if round_ < 2:
            # Not after the last round: the server may take a CREDIT sent right before
            # UNSUBSCRIBE after it, and refuse it (request id 0) where this client
            # waits for the next answer (a CI run).
            client.send(frames.Credit(0, subscription, 1000))
    client.request(frames.Unsubscribe(client.next_id(), subscription))
    letters: list[int] = []
    cursor = None
    while len(letters) < 3000:
        page = client.request(
            frames.Browse(client.next_id(), "rp.dlq", None, None, None, cursor, 1000, 0)
        )
        assert isinstance(page, frames.BrowseOk), page
        letters += [m[0] for m in page.messages]
        cursor = page.next_cursor
    answer = client.request(frames.Purge(client.next_id(), "rp.dlq", None))
    assert isinstance(answer, frames.Ok) and answer.result == 3000, answer
    # The last ones in due order: the purge's last chunk removes them.
    redriven = _items(client, frames.Redrive(client.next_id(), "rp", None, letters[-10:], 0))
    assert redriven == [ItemStatus.UNKNOWN] * 10
    assert client.group_pending("rp", "g") == 0


def _all_deliveries(client: WireClient) -> list[list[Any]]:
    """Every delivery that arrives until none came for half a second."""
    found: list[list[Any]] = []
    while more := client.poll_deliveries(0.5):
        found.extend(more)
    return found


@pytest.mark.parametrize("settle", ["ack", "release"])
def test_a_settlement_sent_with_a_reschedule_of_its_message_is_not_undone(
    broker: BrokerProcess, settle: str
) -> None:
    """Found by a tester: an ACK or RELEASE taken by the leader while a RESCHEDULE of
    its message was being committed was answered OK and applied to nothing: an acked
    message came again at its new time (3,000 acks under a rescheduling loop: 4,417
    deliveries after an OK), and a released one counted, so with ``max_deliveries`` 1
    it went to the dead-letter topic unprocessed. The two are sent in one write, so the
    RESCHEDULE is proposed first and the settlement taken before it commits; the
    settlement now applies to the entry where the RESCHEDULE moved it."""
    topic = f"rk{settle}"
    admin = WireClient(broker.client_address)
    consumer = WireClient(broker.client_address)
    _group(admin, topic, "g", 1)
    rounds = 5
    mids = [admin.publish([[topic, b"x", None, None, None]]).first_id for _ in range(rounds)]
    subscription = consumer.subscribe(topic, "g", rounds)
    held = {d[1]: d for d in consumer.deliveries(rounds)}
    settled = []
    for mid in mids:
        reschedule_id, settle_id = consumer.next_id(), consumer.next_id()
        tags = [held[mid][0]]
        request: frames.Frame = (
            frames.Ack(settle_id, tags) if settle == "ack" else frames.Release(settle_id, tags)
        )
        consumer.send_raw(
            codec.encode_frame(
                frames.Reschedule(reschedule_id, topic, "g", [mid], None, 300), 2**31
            )
            + codec.encode_frame(request, 2**31)
        )
        answers = {}
        while len(answers) < 2:
            answer = consumer.receive_answer()
            if isinstance(answer, frames.Deliver):
                consumer.pushed.append(answer)  # a redelivery already: kept for below
                continue
            answers[answer.request_id] = answer
        assert isinstance(answers[reschedule_id], frames.ItemResults), answers
        if isinstance(answers[settle_id], frames.Ok):
            settled.append(mid)
        else:  # the RESCHEDULE committed before the settlement was taken: the tag was void
            assert answers[settle_id].code == ErrorCode.UNKNOWN_DELIVERY_TAG, answers
    assert settled  # read with the RESCHEDULE, the settlement is taken before that commits
    consumer.send(frames.Credit(consumer.next_id(), subscription, rounds))  # room to redeliver
    time.sleep(0.6)  # past the new due time (300 ms): what comes again is out by now
    again = {d[1]: d[5] for d in _all_deliveries(consumer)}
    dead = WireClient(broker.client_address)
    dead.subscribe(f"{topic}.dlq", "default", rounds)
    letters = _all_deliveries(dead)
    # Those whose settlement was refused counted their one attempt: dead letters.
    assert len(letters) == rounds - len(settled)
    if settle == "ack":  # acknowledged: neither delivered again nor dead-lettered
        assert again == {}
        assert _browse(admin, topic) == []
    else:  # released: not counted, so delivered again (attempt 2) rather than dead-lettered
        assert again == {mid: 2 for mid in settled}
