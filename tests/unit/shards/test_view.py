"""The node view's fetches and merges (futureq.shards.view) over real loopback sockets."""

from __future__ import annotations

import json

import trio
from prometheus_client.parser import text_string_to_metric_families

from futureq.shards.view import (
    Answer,
    NoAnswer,
    http_get,
    merge_ready,
    merge_status,
    relabel_metrics,
    shard_http_address,
)


async def test_a_peer_that_accepts_but_never_answers_is_reported_within_the_deadline() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    held: list[trio.abc.Stream] = []

    async def hold(stream: trio.abc.Stream) -> None:
        held.append(stream)  # read nothing, answer nothing (like a SIGSTOPped shard)
        try:
            await trio.sleep_forever()
        finally:
            await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, hold, listeners)
        started = trio.current_time()
        reply = await http_get(f"127.0.0.1:{port}", "/readyz", deadline_s=0.3)
        assert reply == NoAnswer("did not answer within 0.3 s")
        assert trio.current_time() - started < 2
        nursery.cancel_scope.cancel()
    for listener in listeners:
        await listener.aclose()


async def test_a_closed_port_is_reported_as_unreachable() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()
    reply = await http_get(f"127.0.0.1:{port}", "/healthz", deadline_s=2)
    assert isinstance(reply, NoAnswer) and "cannot be reached" in reply.reason


async def test_an_answer_is_read_whole() -> None:
    body = b"x" * 300_000

    async def answer(stream: trio.abc.Stream) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            request += await stream.receive_some(4096)
        assert request.startswith(b"GET /metrics?x=1 HTTP/1.1\r\n")
        assert b"authorization: Bearer secret\r\n" in request
        head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
        )
        await stream.send_all(head + body)
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, answer, listeners)
        reply = await http_get(f"127.0.0.1:{port}", "/metrics?x=1", token="secret")
        assert reply == Answer(200, body, "text/plain")
        nursery.cancel_scope.cancel()
    for listener in listeners:
        await listener.aclose()


def test_shard_addresses_shift_by_the_stride_and_wildcards_go_to_loopback() -> None:
    assert shard_http_address("0.0.0.0:7452", 1, 100) == "127.0.0.1:7552"
    assert shard_http_address("[::]:7452", 2, 100) == "[::1]:7652"
    assert shard_http_address("10.0.0.5:9000", 0, 100) == "10.0.0.5:9000"


def test_ready_only_when_every_shard_is() -> None:
    addresses = ["a:1", "a:2", "a:3"]
    ok = Answer(200, b'{"ready":true}', "application/json")
    status, body = merge_ready([ok, ok, ok], addresses)
    assert status == 200 and body["ready"] is True
    alarm = Answer(503, b'{"ready":false,"reason":"alarm NO_SPACE","alarms":["NO_SPACE"]}', "")
    status, body = merge_ready([ok, alarm, NoAnswer("did not answer within 1 s")], addresses)
    assert status == 503
    assert body["reason"] == (
        "shard 1 is not ready: alarm NO_SPACE; shard 2 is not ready: did not answer within 1 s"
    )
    assert body["alarms"] == ["NO_SPACE"]
    assert [s["ready"] for s in body["shards"]] == [True, False, False]


def test_status_merges_topics_and_counts_and_names_a_missing_shard() -> None:
    def shard(topics: list[str], applied: int) -> Answer:
        value = {
            "role": "leader",
            "term": 3,
            "applied_index": applied,
            "topic_count": len(topics),
            "group_count": len(topics),
            "topics": [{"topic": t, "groups": []} for t in topics],
        }
        return Answer(200, json.dumps(value).encode(), "application/json")

    status, merged = merge_status(
        [shard(["b", "d"], 5), shard(["a"], 7), NoAnswer("cannot be reached")], ["x", "y", "z"]
    )
    assert status == 200
    assert [t["topic"] for t in merged["topics"]] == ["a", "b", "d"]
    assert (merged["topic_count"], merged["group_count"]) == (3, 3)
    assert [s.get("applied_index") for s in merged["shards"]] == [5, 7, None]
    assert merged["shards"][2]["error"] == "cannot be reached"
    assert merged["missing_shards"] == [2]
    assert merged["alarms"] == ["SHARD_UNAVAILABLE"]  # not [] as if all were well
    _, whole = merge_status([shard(["b"], 5), shard(["a"], 7)], ["x", "y"])
    assert whole["alarms"] == [] and whole["missing_shards"] == []


def test_metrics_of_shards_merge_into_one_family_each_with_a_shard_label() -> None:
    text = (
        "# HELP futureq_applied_index Applied.\n# TYPE futureq_applied_index gauge\n"
        "futureq_applied_index 4.0\n"
        "# HELP futureq_published_messages_total Published.\n"
        "# TYPE futureq_published_messages_total counter\n"
        'futureq_published_messages_total{topic="t"} 2.0\n'
    )
    exposition, left_out = relabel_metrics(
        [(0, text), (1, text.replace("4.0", "9.0")), (2, "futureq_x{ 1\n")]
    )
    assert left_out == [2]
    merged = exposition.decode()
    assert merged.count("# TYPE futureq_applied_index gauge") == 1
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    applied = {s.labels["shard"]: s.value for s in families["futureq_applied_index"].samples}
    assert applied == {"0": 4.0, "1": 9.0}
    published = families["futureq_published_messages"].samples
    assert {(s.labels["shard"], s.labels["topic"]) for s in published} == {("0", "t"), ("1", "t")}


async def test_probes_at_once_share_their_fetches_and_stay_within_one_address_share() -> None:
    """60 probes of the node's port at once, each asking shard 1 the same: before, each
    opened its own connection to shard 1, all from the node's own address, and past
    the 32 connections one address may hold there (limits.max_http_connections 128 / 4)
    shard 1 refused them, so the node called itself unhealthy. Now one fetch serves
    the probes asking the same at once, and different fetches to one shard open at most
    half of that share at once."""
    import attrs

    from futureq.config import Config
    from futureq.shards.layout import shard_role
    from futureq.shards.view import NodeView

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    open_now = [0]
    most = [0]

    async def answer(stream: trio.abc.Stream) -> None:
        open_now[0] += 1
        most[0] = max(most[0], open_now[0])
        try:
            request = b""
            while b"\r\n\r\n" not in request:
                request += await stream.receive_some(4096)
            await trio.sleep(0.05)  # a shard busy for a moment
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 3\r\n\r\nok\n"
            )
        finally:
            open_now[0] -= 1
            await stream.aclose()

    config = Config()
    config = attrs.evolve(
        config,
        server=attrs.evolve(config.server, http=f"127.0.0.1:{port - 1}"),
        node=attrs.evolve(config.node, shards=2, shard_port_stride=1),
    )
    view = NodeView(config, shard_role(config, 0), token=None)
    replies: list[Answer | NoAnswer] = []

    async def probe(target: str) -> None:
        replies.append((await view.fetch_others(target))[1])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, answer, listeners)
        async with trio.open_nursery() as probes:
            for _ in range(60):
                probes.start_soon(probe, "/healthz")
        assert most[0] == 1, most
        most[0] = 0
        async with trio.open_nursery() as probes:
            for n in range(60):
                probes.start_soon(probe, f"/healthz?n={n}")
        assert most[0] <= 16, most
        nursery.cancel_scope.cancel()
    for listener in listeners:
        await listener.aclose()
    assert replies == [Answer(200, b"ok\n", "text/plain")] * 120
