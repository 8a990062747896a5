"""Answers and pushes fit in one frame, against a real ``futureq start`` process.

Before, STATUS_OK listed every subscription of every listed group and every group up to
``limits.max_status_groups`` whatever their names' length: two connections of 1,024
subscriptions with a 64 KiB frame limit (or some 75,000 subscriptions at the default
4 MiB, within ``limits.max_subscriptions``) made an answer larger than a frame, and
every STATUS (``futureq-cli status`` included) got only ``INVALID_ARGUMENT: frame of
100956 bytes exceeds the limit of 65536 bytes``. Now the groups and their subscriptions
fill at most half a frame (``docs/protocol.md``, "STATUS_OK").
"""

from __future__ import annotations

import re
from typing import Any

from broker_process import BrokerProcess
from cli_process import cli
from wire_client import WireClient

from futureq.wire import codec, frames

FRAME_BYTES = 64 * 1024
SMALL_FRAMES = {
    "FUTUREQ_LIMITS_MAX_FRAME_BYTES": str(FRAME_BYTES),
    "FUTUREQ_LIMITS_MAX_PAYLOAD_BYTES": "1000",
    "FUTUREQ_LIMITS_MAX_BATCH_ITEMS": "4000",
}


def status_frame(client: WireClient) -> tuple[dict[str, Any], int]:
    """STATUS_OK's map and the size of its frame body (bytes)."""
    answer = client.request(frames.Status(client.next_id()))
    assert isinstance(answer, frames.StatusOk), answer
    return answer.status, len(codec.encode_frame(answer, 2**31)) - codec.HEADER_BYTES


def subscribe_many(client: WireClient, topic: str, group: str, count: int) -> None:
    """``count`` SUBSCRIBEs pipelined, then their answers."""
    for _ in range(count):
        client.send(frames.Subscribe(client.next_id(), topic, group, 1))
    for _ in range(count):
        answer = client.receive_answer()
        assert isinstance(answer, frames.SubscribeOk), answer


def test_a_status_of_more_subscriptions_than_a_frame_holds_lists_what_fits(
    broker_factory: Any,
) -> None:
    broker: BrokerProcess = broker_factory(env=SMALL_FRAMES)
    consumers = [WireClient(broker.client_address) for _ in range(2)]
    for client in consumers:
        subscribe_many(client, "status.many", "workers", 1024)
    asker = WireClient(broker.client_address)
    assert isinstance(asker.publish([["status.later", b"x", None, None, None]]), frames.PublishOk)

    status, body_bytes = status_frame(asker)

    assert body_bytes <= FRAME_BYTES
    groups = {(t["topic"], g["group"]): g for t in status["topics"] for g in t["groups"]}
    # Every group is listed before the subscriptions of any one of them.
    assert set(groups) == {("status.many", "workers"), ("status.later", "default")}
    assert status["truncated"] is False
    workers = groups[("status.many", "workers")]
    assert workers["consumers"] == 2048
    assert 100 < len(workers["subscriptions"]) < 2048
    # The connections holding the subscriptions are served as before.
    for client in consumers:
        assert isinstance(client.request(frames.Ping(client.next_id())), frames.Pong)
    shown = cli(broker.client_address, "status")
    assert shown.returncode == 0, shown.stderr
    said = re.search(r"(\d+) more subscriptions not listed", shown.stdout)
    assert said is not None and 0 < int(said[1]) < 2048, shown.stdout


def test_a_status_of_long_names_past_a_small_frame_is_cut_and_says_so(
    broker_factory: Any,
) -> None:
    broker: BrokerProcess = broker_factory(env=SMALL_FRAMES)
    client = WireClient(broker.client_address)
    names = [f"t{i:03d}." + "n" * 240 for i in range(300)]
    for start in range(0, len(names), 100):
        batch = [[name, b"", None, None, None] for name in names[start : start + 100]]
        assert isinstance(client.publish(batch), frames.PublishOk)

    status, body_bytes = status_frame(client)

    assert body_bytes <= FRAME_BYTES
    assert status["group_count"] == 300
    assert status["truncated"] is True
    listed = [t["topic"] for t in status["topics"]]
    assert 0 < len(listed) < 300
    assert listed == names[: len(listed)]
    shown = cli(broker.client_address, "status")
    assert shown.returncode == 0, shown.stderr
    said = re.search(r"(\d+) of 300 groups listed", shown.stdout)
    assert said is not None and 0 < int(said[1]) < 300, shown.stdout
    assert "limits.max_frame_bytes" in shown.stdout


def test_deliveries_of_payloads_near_the_limit_come_in_frames_within_the_limit(
    broker_factory: Any,
) -> None:
    # Before, a DELIVER was closed only once it already held half a frame: a delivery
    # of 120 KiB then one of 200 KiB made a 320 KiB frame under a 256 KiB limit, which
    # a client holding the server to HELLO_OK's max_frame_bytes refused (FRAME_TOO_LARGE)
    # again at every redelivery.
    frame_bytes = 256 * 1024
    broker: BrokerProcess = broker_factory(
        env={
            "FUTUREQ_LIMITS_MAX_FRAME_BYTES": str(frame_bytes),
            "FUTUREQ_LIMITS_MAX_PAYLOAD_BYTES": str(frame_bytes - 8192),
        }
    )
    client = WireClient(broker.client_address)
    headers = {f"h{i:02d}": "v" * 120 for i in range(32)}
    payloads = [b"a" * (120 * 1024), b"b" * (frame_bytes - 8192), b"c" * 10]
    items = [["near.limit", payload, None, None, None, headers, None] for payload in payloads]
    for item in items:  # one PUBLISH each: together they would pass the frame limit
        assert isinstance(client.publish([item]), frames.PublishOk)
    client.decoder = codec.FrameDecoder(frame_bytes)  # as strict as HELLO_OK allows
    answer = client.request(frames.Subscribe(client.next_id(), "near.limit", "g", 10, True))
    assert isinstance(answer, frames.SubscribeOk), answer

    got = client.deliveries(3)

    assert [delivery[2] for delivery in got] == payloads
    assert all(delivery[6] == headers for delivery in got)


def test_a_revoke_of_more_tags_than_a_frame_holds_comes_in_several_frames(
    broker_factory: Any,
) -> None:
    # Before, every delivery a subscription lost at once was named in one REVOKE: 3,000
    # deliveries out past their visibility timeout made a 78 KB frame under 64 KiB.
    broker: BrokerProcess = broker_factory(env=SMALL_FRAMES)
    client = WireClient(broker.client_address)
    answer = client.request(frames.GroupCreate(client.next_id(), "revoke.many", "g", 100, None))
    assert isinstance(answer, frames.Ok), answer
    items = [["revoke.many", b"", None, None, None] for _ in range(3000)]
    assert isinstance(client.publish(items), frames.PublishOk)
    client.decoder = codec.FrameDecoder(FRAME_BYTES)  # as strict as HELLO_OK allows
    subscription_id = client.subscribe("revoke.many", "g", prefetch=3000)
    delivered = {delivery[0] for delivery in client.deliveries(3000)}

    revoked: set[bytes] = set()
    while revoked != delivered:
        frame = client.notices.pop(0) if client.notices else client.receive()
        if isinstance(frame, frames.Deliver):
            continue  # delivered again after the timeout: not asked about here
        assert isinstance(frame, frames.Revoke | frames.SubscriptionInfo), frame
        if isinstance(frame, frames.Revoke):
            assert frame.subscription_id == subscription_id
            revoked.update(tag for tag in frame.tags if tag in delivered)
