"""The async client against a small in-process fake broker on 127.0.0.1.

The fake speaks the real wire protocol (``futureq.wire``) but keeps messages in
memory and delivers them at once, which is enough to pin the client's own logic:
batching, refusal splitting, credit, NOT_LEADER redirects, reconnects, HELLO errors.
The real broker is exercised in ``tests/integration/test_client_*.py``.
"""

from __future__ import annotations

import collections
import math
import random
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import pytest
from tests.backends import on_both_backends

from futureq.client import PublishItem, _connection, open_client
from futureq.client._base import CONNECT_STAGGER_S
from futureq.client.subscription import DeliveryState
from futureq.errors import (
    ConnectionLostError,
    ErrorCode,
    RemoteProtocolError,
    RequestError,
)
from futureq.wire import codec, frames
from futureq.wire.validation import Limits, validate_publish_items


class FakeConnection:
    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.lock = anyio.Lock()
        self.subs: dict[int, dict[str, Any]] = {}

    async def send(self, frame: frames.Frame) -> None:
        async with self.lock:
            await self.stream.send(codec.encode_frame(frame))


class FakeBroker:
    """One fake node. ``redirect_to`` makes it a follower answering NOT_LEADER."""

    def __init__(
        self,
        *,
        redirect_to: str | None = None,
        token: str | None = None,
        max_batch: int = 10_000,
        leaderless: bool = False,
        members: tuple[str, ...] | None = None,
        cut_credit_at: int | None = None,
    ) -> None:
        self.redirect_to = redirect_to
        self.cut_credit_at = cut_credit_at
        """As a server older than protocol version 5 with this ``limits.max_prefetch``:
        it refuses a SUBSCRIBE window past it, and cuts credit held to it without a
        word (it does not name it in HELLO_OK)."""
        self.leaderless = leaderless
        self.members = members  # None: answer HELLO as a protocol version 1 server
        self.token = token
        self.limits = Limits(max_batch_items=max_batch)
        self.address = ""
        self.next_id = 1
        self.next_sub = 1
        self.publish_sizes: list[int] = []
        self.queues: dict[tuple[str, str], collections.deque[tuple[int, bytes, int]]] = {}
        self.in_flight: dict[bytes, tuple[tuple[str, str], int, bytes, int, FakeConnection]] = {}
        self.max_outstanding = 0
        self.acked: list[int] = []
        self.connections: list[FakeConnection] = []
        self.topic_groups: dict[str, list[str]] = collections.defaultdict(list)
        self.unavailable_acks = 0  # answer this many ACKs UNAVAILABLE (a transfer)
        self.hello_version: int | None = None  # HELLO_OK's version, if not the usual
        self.silent: set[type[frames.Frame]] = set()  # frame types it never answers
        self.settling: list[frames.Frame] = []  # RELEASE and UNSUBSCRIBE frames, in order
        self.stepping_down_to: str | None = None
        """A leader losing its leadership to this address: PUBLISH frames are taken
        but their answers owed (:attr:`owed`, sent by :meth:`answer_owed`); any other
        request is answered NOT_LEADER naming it."""
        self.owed: list[tuple[FakeConnection, frames.Publish]] = []
        self.owing = anyio.Event()  # set when the first answer is owed
        self._owed_more = anyio.Event()  # set (and replaced) each time one more is owed

    async def serve(
        self, task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        self.address = f"127.0.0.1:{port}"
        task_status.started(self.address)
        async with listener:
            await listener.serve(self.handle)

    async def drop_connections(self) -> None:
        for conn in list(self.connections):
            await anyio.aclose_forcefully(conn.stream)

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        conn = FakeConnection(stream)
        self.connections.append(conn)
        decoder = codec.FrameDecoder()
        try:
            while True:
                frame = decoder.next_frame()
                if frame is codec.NEED_DATA:
                    decoder.receive_data(await _receive(stream))
                    continue
                if frame is codec.CLOSED:
                    return
                await self.on_frame(conn, frame)  # type: ignore[arg-type]
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return
        finally:
            self.connections.remove(conn)
            for tag, entry in list(self.in_flight.items()):
                if entry[4] is conn:
                    del self.in_flight[tag]
                    self.queues[entry[0]].appendleft((entry[1], entry[2], entry[3] + 1))
            await anyio.aclose_forcefully(stream)
            await self.dispatch()

    async def on_frame(self, conn: FakeConnection, frame: frames.Frame) -> None:
        rid = frame.request_id
        if isinstance(frame, frames.Hello):
            if self.token is not None and frame.token != self.token:
                await conn.send(frames.Error(rid, ErrorCode.AUTH_FAILED, "bad token"))
                await conn.stream.aclose()
                return
            version = 1 if self.members is None else 2
            if self.hello_version is not None:
                version = self.hello_version
            await conn.send(
                frames.HelloOk(
                    rid, version, 1, self.redirect_to, 4 * 1024 * 1024, "fake", 1, self.members
                )
            )
            return
        if type(frame) in self.silent:
            return
        if self.stepping_down_to is not None and not isinstance(frame, frames.Ping):
            if isinstance(frame, frames.Publish):
                self.owed.append((conn, frame))
                self.owing.set()
                self._owed_more.set()
                self._owed_more = anyio.Event()
            else:
                await conn.send(
                    frames.Error(
                        rid, ErrorCode.NOT_LEADER, "not leader", None, self.stepping_down_to
                    )
                )
            return
        if (self.redirect_to is not None or self.leaderless) and not isinstance(frame, frames.Ping):
            await conn.send(
                frames.Error(rid, ErrorCode.NOT_LEADER, "not leader", None, self.redirect_to)
            )
            return
        if isinstance(frame, frames.Publish):
            try:
                valid = validate_publish_items(frame.items, self.limits, 0)
            except RequestError as exc:
                await conn.send(frames.Error(rid, exc.code, exc.message, exc.item_index))
                return
            self.publish_sizes.append(len(valid))
            first = self.next_id
            for topic, payload, _due, _ttl in valid:
                groups = self.topic_groups[topic] or ["default"]
                for group in groups:
                    self.queues.setdefault((topic, group), collections.deque()).append(
                        (self.next_id, payload, 1)
                    )
                self.next_id += 1
            await conn.send(frames.PublishOk(rid, first, len(valid)))
            await self.dispatch()
        elif isinstance(frame, frames.Subscribe):
            if self.cut_credit_at is not None and frame.prefetch > self.cut_credit_at:
                message = f"prefetch must be between 1 and {self.cut_credit_at}"
                await conn.send(frames.Error(rid, ErrorCode.INVALID_ARGUMENT, message))
                return
            sub_id = self.next_sub
            self.next_sub += 1
            if frame.group not in self.topic_groups[frame.topic]:
                self.topic_groups[frame.topic].append(frame.group)
                default = self.queues.pop((frame.topic, "default"), None)
                self.queues.setdefault((frame.topic, frame.group), default or collections.deque())
            conn.subs[sub_id] = {
                "key": (frame.topic, frame.group),
                "credit": frame.prefetch,
                "outstanding": 0,
            }
            await conn.send(frames.SubscribeOk(rid, sub_id))
            await self.dispatch()
        elif isinstance(frame, frames.Credit):
            sub = conn.subs[frame.subscription_id]
            sub["credit"] += frame.credit
            if self.cut_credit_at is not None:
                sub["credit"] = min(sub["credit"], self.cut_credit_at)
            await self.dispatch()
        elif isinstance(frame, frames.Ack) and self.unavailable_acks > 0:
            self.unavailable_acks -= 1
            await conn.send(
                frames.Error(rid, ErrorCode.UNAVAILABLE, "leadership is being transferred")
            )
        elif isinstance(frame, frames.Ack | frames.Nack):
            count = 0
            for tag in frame.tags:
                entry = self.in_flight.pop(tag, None)
                if entry is None:
                    await conn.send(
                        frames.Error(rid, ErrorCode.UNKNOWN_DELIVERY_TAG, "unknown tag")
                    )
                    return
                count += 1
                for sub in entry[4].subs.values():
                    if sub["key"] == entry[0]:
                        sub["outstanding"] -= 1
                        break
                if isinstance(frame, frames.Nack):
                    self.queues[entry[0]].append((entry[1], entry[2], entry[3] + 1))
                else:
                    self.acked.append(entry[1])
            await conn.send(frames.Ok(rid, count))
            await self.dispatch()
        elif isinstance(frame, frames.Unsubscribe):
            self.settling.append(frame)
            conn.subs.pop(frame.subscription_id, None)
            await conn.send(frames.Ok(rid, None))
        elif isinstance(frame, frames.Release):
            self.settling.append(frame)
            await conn.send(frames.Ok(rid, len(frame.tags)))
        elif isinstance(frame, frames.Status):
            await conn.send(frames.StatusOk(rid, {"node_id": 1, "role": "leader", "topics": []}))
        elif isinstance(frame, frames.Ping):
            await conn.send(frames.Pong(rid))
        elif isinstance(frame, frames.GroupCreate | frames.GroupDelete):
            await conn.send(frames.Ok(rid, None))

    async def answer_owed(self) -> None:
        """Answer the PUBLISH frames held while stepping down (they were applied),
        on the connections they came on, if still open."""
        owed, self.owed = self.owed, []
        for conn, frame in owed:
            self.publish_sizes.append(len(frame.items))
            first = self.next_id
            self.next_id += len(frame.items)
            try:
                await conn.send(frames.PublishOk(frame.request_id, first, len(frame.items)))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass

    async def wait_owed(self, count: int) -> None:
        """Block until ``count`` PUBLISH answers are owed (:attr:`stepping_down_to`)."""
        while len(self.owed) < count:
            await self._owed_more.wait()

    async def go_away(self, last_request_id: int) -> None:
        """Stepping down (protocol version 6): send GOAWAY naming ``last_request_id``,
        answer the owed PUBLISH frames up to it (applied), serve none after it, and
        close each connection."""
        owed, self.owed = self.owed, []
        for conn in list(self.connections):
            goaway = frames.GoAway(
                0, last_request_id, ErrorCode.NOT_LEADER, "moved", self.stepping_down_to
            )
            await conn.send(goaway)
            for owed_conn, frame in owed:
                if owed_conn is conn and frame.request_id <= last_request_id:
                    self.owed.append((conn, frame))
            await self.answer_owed()
            await conn.stream.aclose()

    async def dispatch(self) -> None:
        for conn in list(self.connections):
            for sub_id, sub in list(conn.subs.items()):
                queue = self.queues.get(sub["key"])
                batch = []
                while queue and sub["credit"] > 0:
                    message_id, payload, attempt = queue.popleft()
                    tag = f"{message_id}:{attempt}:{sub_id}".encode()
                    self.in_flight[tag] = (sub["key"], message_id, payload, attempt, conn)
                    sub["credit"] -= 1
                    sub["outstanding"] += 1
                    self.max_outstanding = max(self.max_outstanding, sub["outstanding"])
                    batch.append([tag, message_id, payload, 5, 1, attempt])
                if batch:
                    try:
                        await conn.send(frames.Deliver(0, sub_id, 7, batch))
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        pass


async def _receive(stream: anyio.abc.SocketStream) -> bytes:
    try:
        return bytes(await stream.receive(65536))
    except anyio.EndOfStream:
        return b""


@asynccontextmanager
async def task_group() -> AsyncIterator[anyio.abc.TaskGroup]:
    """A task group whose tasks (fake servers) are cancelled when the block ends."""
    async with anyio.create_task_group() as group:
        yield group
        group.cancel_scope.cancel()


@asynccontextmanager
async def serving(**kwargs: Any) -> AsyncIterator[FakeBroker]:
    """One fake broker listening on 127.0.0.1 for the block."""
    async with task_group() as group:
        fake = FakeBroker(**kwargs)
        await group.start(fake.serve)
        yield fake


def _client(*servers: str, **kwargs: Any) -> Any:
    kwargs.setdefault("rng", random.Random(7))
    kwargs.setdefault("request_timeout_s", 10.0)
    return open_client(list(servers), **kwargs)


@on_both_backends
async def test_publish_then_consume_and_ack() -> None:
    async with serving() as broker:
        async with _client(broker.address) as client:
            ids = [await client.publish("jobs", f"m{i}".encode()) for i in range(3)]
            assert ids == [1, 2, 3]
            async with client.subscribe("jobs", "workers", prefetch=10) as sub:
                got = []
                async for delivery in sub:
                    got.append(delivery)
                    await delivery.ack()
                    if len(got) == 3:
                        break
            assert [d.payload for d in got] == [b"m0", b"m1", b"m2"]
            assert [d.id for d in got] == ids
            assert got[0].topic == "jobs" and got[0].group == "workers" and got[0].attempt == 1
            assert got[0].delivered_ms == 7 and got[0].due_ms == 5
            assert sorted(broker.acked) == ids


@on_both_backends
async def test_concurrent_publishes_are_batched() -> None:
    async with serving() as broker:
        results: list[int] = []
        async with _client(broker.address, linger_ms=5) as client:

            async def one(i: int) -> None:
                results.append(await client.publish("t", str(i).encode()))

            async with anyio.create_task_group() as nursery:
                for i in range(300):
                    nursery.start_soon(one, i)
        assert sorted(results) == list(range(1, 301))
        assert sum(broker.publish_sizes) == 300
        assert len(broker.publish_sizes) < 300
        assert max(broker.publish_sizes) <= 1000


@on_both_backends
async def test_max_batch_items_caps_frames() -> None:
    async with serving() as broker:
        async with _client(broker.address, max_batch_items=7, linger_ms=5) as client:
            async with anyio.create_task_group() as nursery:
                for i in range(50):
                    nursery.start_soon(client.publish, "t", str(i).encode())
        assert sum(broker.publish_sizes) == 50
        assert max(broker.publish_sizes) <= 7


@on_both_backends
async def test_bad_item_fails_alone_in_a_shared_batch() -> None:
    async with serving() as broker:
        outcomes: dict[str, Any] = {}
        async with _client(broker.address, linger_ms=20) as client:

            async def one(topic: str) -> None:
                try:
                    outcomes[topic] = await client.publish(topic, b"x")
                except RequestError as exc:
                    outcomes[topic] = exc

            async with anyio.create_task_group() as nursery:
                for topic in ["a", "b", "bad.dlq", "c", "d"]:
                    nursery.start_soon(one, topic)
        error = outcomes.pop("bad.dlq")
        assert isinstance(error, RequestError)
        assert error.code is ErrorCode.RESERVED_TOPIC
        assert error.item_index is None
        assert all(isinstance(v, int) for v in outcomes.values())
        assert sorted(outcomes.values()) == [1, 2, 3, 4]


@on_both_backends
async def test_publish_batch_reports_index_in_the_whole_list() -> None:
    async with serving() as broker:
        items = [PublishItem("t", b"x") for _ in range(5)] + [PublishItem("", b"x")]
        async with _client(broker.address, max_batch_items=4) as client:
            with pytest.raises(RequestError) as info:
                await client.publish_batch(items)
            assert info.value.code is ErrorCode.INVALID_TOPIC
            assert info.value.item_index == 5
            assert await client.publish_batch(items[:5]) == [5, 6, 7, 8, 9]


@on_both_backends
async def test_server_batch_limit_is_split() -> None:
    async with task_group() as nursery:
        fake = FakeBroker(max_batch=3)
        await nursery.start(fake.serve)
        async with _client(fake.address, linger_ms=20) as client:
            async with anyio.create_task_group() as inner:
                for i in range(10):
                    inner.start_soon(client.publish, "t", str(i).encode())
        assert sum(fake.publish_sizes) == 10
        assert max(fake.publish_sizes) <= 3


@on_both_backends
async def test_credit_keeps_window_at_prefetch() -> None:
    async with serving() as broker:
        async with _client(broker.address) as client:
            await client.publish_batch([PublishItem("t", str(i).encode()) for i in range(20)])
            async with client.subscribe("t", "g", prefetch=3) as sub:
                seen = []
                async for delivery in sub:
                    seen.append(delivery.id)
                    await delivery.ack()
                    if len(seen) == 20:
                        break
        assert sorted(seen) == list(range(1, 21))
        assert broker.max_outstanding <= 3


@on_both_backends
async def test_batch_ack_and_nack_redelivers_with_next_attempt() -> None:
    async with serving() as broker:
        async with _client(broker.address) as client:
            await client.publish_batch([PublishItem("t", b"a"), PublishItem("t", b"b")])
            async with client.subscribe("t", "g", prefetch=5) as sub:
                first = [await sub.__anext__(), await sub.__anext__()]
                await sub.nack(first, requeue_delay_ms=0)
                again = [await sub.__anext__(), await sub.__anext__()]
                assert sorted(d.id for d in again) == [1, 2]
                assert {d.attempt for d in again} == {2}
                await sub.ack(again)
        assert sorted(broker.acked) == [1, 2]


@on_both_backends
async def test_not_leader_redirect_is_followed() -> None:
    async with task_group() as nursery:
        leader = FakeBroker()
        await nursery.start(leader.serve)
        follower = FakeBroker(redirect_to=leader.address)
        await nursery.start(follower.serve)
        async with _client(follower.address) as client:
            assert client.connected_address == follower.address
            assert await client.publish("t", b"x") == 1
            assert client.connected_address == leader.address
        assert leader.publish_sizes == [1]
        assert follower.publish_sizes == []


@on_both_backends
async def test_answers_owed_on_a_connection_left_on_not_leader_still_arrive() -> None:
    """A leader stepping down answers one request NOT_LEADER while the answers of
    others sent on the same connection are still on the way: the client sends new
    requests to the new leader but keeps the old connection open for those answers
    (it drains), so an at-most-once publish learns its outcome instead of
    ConnectionLostError."""
    async with task_group() as nursery:
        old = FakeBroker()
        await nursery.start(old.serve)
        new = FakeBroker()
        await nursery.start(new.serve)
        async with _client(old.address, retry_unknown_outcome=False, linger_ms=0) as client:
            assert client.connected_address == old.address
            old.stepping_down_to = new.address
            results: list[object] = []

            async def publish() -> None:
                try:
                    results.append(await client.publish("t", b"owed"))
                except ConnectionLostError as exc:
                    results.append(exc)

            async with anyio.create_task_group() as group:
                group.start_soon(publish)
                with anyio.fail_after(5):
                    await old.owing.wait()
                # Answered NOT_LEADER by the old leader, sent again to the new one.
                await client.create_group("t", "g")
                assert client.connected_address == new.address
                # Only now does the old leader answer the publish it applied.
                await old.answer_owed()
            assert results == [1], results
            assert old.publish_sizes == [1]
            assert new.publish_sizes == []
            # New requests go to the new leader.
            assert await client.publish("t", b"next") == 1
            assert new.publish_sizes == [1]


@on_both_backends
async def test_requests_a_goaway_says_were_not_served_go_to_the_new_leader() -> None:
    """GOAWAY (protocol version 6) names the last request the old leader served: the
    at-most-once publish sent after it took no effect and is sent to the new leader at
    once, the one before it gets its answer from the old leader. Before, the client
    knew no GOAWAY: the connection was lost with both in flight (outcome unknown)."""
    async with task_group() as nursery:
        old = FakeBroker()
        await nursery.start(old.serve)
        new = FakeBroker()
        await nursery.start(new.serve)
        async with _client(old.address, retry_unknown_outcome=False, linger_ms=0) as client:
            old.stepping_down_to = new.address
            results: dict[bytes, object] = {}

            async def publish(payload: bytes) -> None:
                try:
                    results[payload] = await client.publish("t", payload)
                except ConnectionLostError as exc:
                    results[payload] = exc

            async with anyio.create_task_group() as group:
                group.start_soon(publish, b"served")
                with anyio.fail_after(5):
                    await old.wait_owed(1)
                group.start_soon(publish, b"not served")
                with anyio.fail_after(5):
                    await old.wait_owed(2)
                await old.go_away(old.owed[0][1].request_id)
            assert results == {b"served": 1, b"not served": 1}, results
            assert old.publish_sizes == [1]
            assert new.publish_sizes == [1]
            assert client.connected_address == new.address


@on_both_backends
async def test_a_node_that_knows_no_leader_sends_the_client_to_the_next_server() -> None:
    async with task_group() as nursery:
        cut_off = FakeBroker(leaderless=True)
        await nursery.start(cut_off.serve)
        leader = FakeBroker()
        await nursery.start(leader.serve)
        async with open_client([cut_off.address, leader.address], request_timeout_s=10.0) as client:
            assert client.connected_address == cut_off.address
            assert await client.publish("t", b"x") == 1
            assert client.connected_address == leader.address
        assert leader.publish_sizes == [1]


@on_both_backends
async def test_an_ack_refused_unavailable_is_sent_again_until_it_is_applied() -> None:
    # A leader transferring its leadership answers UNAVAILABLE ("retry shortly"):
    # like every 3xx refusal, retried with backoff until the deadline.
    async with serving() as broker:
        async with _client(broker.address) as client:
            assert await client.publish("t", b"x") == 1
            async with client.subscribe("t", "g", prefetch=5) as sub:
                held = await sub.__anext__()
                broker.unavailable_acks = 2
                await held.ack()
                assert held.settled
        assert broker.acked == [1] and broker.unavailable_acks == 0


@pytest.mark.parametrize("how", ["ack", "nack", "release", "extend"])
@on_both_backends
async def test_settling_on_a_node_that_lost_its_leadership_is_connection_lost(how: str) -> None:
    # A leader being stopped (SIGTERM) steps down and answers NOT_LEADER, knowing no
    # leader during the election, to an ACK of a delivery it handed out: its tags died
    # with its leadership, so no node can settle it. Not NotLeaderError (that is only
    # for following the leader failing until the deadline): ConnectionLostError, as
    # for a lost connection, and the client moves on to where it is delivered again.
    async with task_group() as nursery:
        old = FakeBroker()
        await nursery.start(old.serve)
        new = FakeBroker()
        await nursery.start(new.serve)
        new.queues[("t", "g")] = collections.deque([(1, b"x", 2)])  # redelivered there
        async with open_client([old.address, new.address], request_timeout_s=10.0) as client:
            assert await client.publish("t", b"x") == 1
            async with client.subscribe("t", "g", prefetch=5) as sub:
                held = await sub.__anext__()
                old.leaderless = True  # stepped down; an election is under way
                with pytest.raises(ConnectionLostError, match="no longer the leader"):
                    if how == "extend":
                        await held.extend(10_000)  # the fake sends no SUBSCRIPTION_INFO
                    else:
                        await getattr(held, how)()
                assert held.state is DeliveryState.VOID
                again = await sub.__anext__()
                assert (again.id, again.attempt) == (1, 2)
                await again.ack()
                assert client.connected_address == new.address
        assert new.acked == [1]


@on_both_backends
async def test_a_bad_nack_or_extend_argument_raises_at_the_call_and_sends_nothing() -> None:
    # docs/client.md, "Argument ranges": a bool, float or str went out to the server
    # (or failed on ``<``); now the call raises and the delivery is still held.
    async with serving() as broker:
        async with _client(broker.address) as client:
            await client.publish("t", b"x")
            async with client.subscribe("t", "g", prefetch=5) as sub:
                held = await sub.__anext__()
                for value in (True, 1.5, "5", math.nan):
                    with pytest.raises(TypeError, match="requeue_delay_ms"):
                        await held.nack(value)
                    with pytest.raises(TypeError, match="visibility_ms"):
                        await held.extend(value)
                with pytest.raises(ValueError, match="visibility_ms"):
                    await held.extend(10**20)
                assert held.state is DeliveryState.HELD
                await held.ack()
        assert broker.acked == [1]  # not nacked (that would have delivered it again)


@on_both_backends
async def test_a_client_given_one_node_tries_the_members_its_hello_ok_named() -> None:
    """A node cut off from its leader, given alone: the client moves on to the members
    HELLO_OK named (protocol version 2), skipping an address it cannot use."""
    async with task_group() as nursery:
        leader = FakeBroker()
        await nursery.start(leader.serve)
        cut_off = FakeBroker(leaderless=True)
        cut_off.members = ("nonsense", "[::1", leader.address)
        await nursery.start(cut_off.serve)
        async with open_client(cut_off.address, request_timeout_s=10.0) as client:
            assert client.connected_address == cut_off.address
            assert client._known_servers() == [cut_off.address, leader.address]
            assert await client.publish("t", b"x") == 1
            assert client.connected_address == leader.address
            assert client.servers == [cut_off.address]  # what was given stays as given
        assert leader.publish_sizes == [1]


@on_both_backends
async def test_a_server_that_never_answers_hello_costs_the_stagger_not_the_timeout() -> None:
    """A listening socket nobody accepts on (a stopped or hung node: the kernel still
    completes TCP handshakes) given first: the client tries the next server
    CONNECT_STAGGER_S later instead of waiting connect_timeout_s (before: 5 s every
    time the client connected, for every CLI command)."""
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)
    hung_address = f"127.0.0.1:{hung.getsockname()[1]}"
    try:
        async with task_group() as nursery:
            leader = FakeBroker()
            await nursery.start(leader.serve)
            started = anyio.current_time()
            async with open_client(
                [hung_address, leader.address], connect_timeout_s=5.0, request_timeout_s=10.0
            ) as client:
                took = anyio.current_time() - started
                assert client.connected_address == leader.address
                assert await client.publish("t", b"x") == 1
            assert CONNECT_STAGGER_S <= took < CONNECT_STAGGER_S + 2.0, took
    finally:
        hung.close()


@on_both_backends
async def test_a_connection_discarded_unrun_leaves_nothing_open() -> None:
    """The loser of a staggered connect, or a winner the client stopped connecting for,
    is never run: discarding it closes its socket and its write queue (found by the CI
    fault-injection run: an unclosed socket and memory streams when a client closed
    while a server had just answered)."""
    async with serving() as broker:
        conn = await _connection.connect(
            broker.address,
            epoch=1,
            on_push=lambda conn, frame: None,
            ssl_context=None,
            server_hostname=None,
            token=None,
            timeout_s=5.0,
        )
        await conn.discard("the client stopped connecting")
        assert conn.is_lost and "stopped connecting" in str(conn.lost_reason)
        with pytest.raises(anyio.ClosedResourceError):
            conn._write_send.send_nowait(b"x")
        with pytest.raises(anyio.ClosedResourceError):
            conn._write_receive.receive_nowait()
        with pytest.raises((anyio.ClosedResourceError, OSError)):
            await conn._stream.send(b"x")


@on_both_backends
async def test_reconnect_resubscribes_and_voids_old_deliveries() -> None:
    async with serving() as broker:
        async with _client(broker.address) as client:
            await client.publish("t", b"one")
            async with client.subscribe("t", "g", prefetch=5) as sub:
                old = await sub.__anext__()
                await broker.drop_connections()
                # The fake requeues the unacked message; the client reconnects and
                # re-subscribes when iterated, and gets it again.
                again = await sub.__anext__()
                assert again.id == old.id and again.attempt == 2
                with pytest.raises(ConnectionLostError, match="deliver them again"):
                    await old.ack()
                await again.ack()
                assert await client.publish("t", b"two") == 2
                assert (await sub.__anext__()).payload == b"two"


@on_both_backends
async def test_publish_survives_a_dropped_connection() -> None:
    async with serving() as broker:
        async with _client(broker.address) as client:
            assert await client.publish("t", b"1") == 1
            await broker.drop_connections()
            assert await client.publish("t", b"2") == 2
            assert await client.status() == {"node_id": 1, "role": "leader", "topics": []}
            assert await client.ping() >= 0


@on_both_backends
async def test_connection_refused_names_the_address() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    with pytest.raises(ConnectionLostError, match=f"127.0.0.1:{port}"):
        async with _client(f"127.0.0.1:{port}", connect_timeout_s=0.3):
            pass  # pragma: no cover


@on_both_backends
async def test_auth_failure_is_not_retried() -> None:
    async with task_group() as nursery:
        fake = FakeBroker(token="secret")
        await nursery.start(fake.serve)
        with pytest.raises(RemoteProtocolError) as info:
            async with _client(fake.address, token="wrong"):
                pass  # pragma: no cover
        assert info.value.code is ErrorCode.AUTH_FAILED
        async with _client(fake.address, token="secret") as client:
            assert await client.publish("t", b"x") == 1


@on_both_backends
async def test_a_hello_ok_naming_a_version_not_offered_is_refused() -> None:
    """HELLO_OK must name a version the client offered (docs/protocol.md, "Connection
    setup"); before, the client took version 3 and read on as if it were 1 or 2."""
    async with serving(members=()) as fake:
        fake.hello_version = max(frames.SUPPORTED_VERSIONS) + 1
        with pytest.raises(RemoteProtocolError) as info:
            async with _client(fake.address):
                pass  # pragma: no cover
        assert info.value.code is ErrorCode.UNSUPPORTED_VERSION
        assert f"version {fake.hello_version}" in info.value.message


@pytest.mark.parametrize("version", [2, 3])
@on_both_backends
async def test_leaving_a_subscription_says_what_the_application_was_handed(version: int) -> None:
    """Protocol version 3: the UNSUBSCRIBE names the deliveries handed to the
    application (only they count); to an older server the client releases the
    buffered ones first and sends a plain UNSUBSCRIBE (``docs/client.md``)."""
    async with serving(members=()) as fake:
        fake.hello_version = version
        async with _client(fake.address) as client:
            await client.publish_batch([PublishItem("t", b"%d" % i) for i in range(3)])
            async with client.subscribe("t", "g", prefetch=3) as sub:
                handed = await sub.__anext__()
                with anyio.fail_after(5):
                    while sub.buffered < 2:  # noqa: ASYNC110 - no event says "buffered", under a deadline
                        await anyio.sleep(0.005)
                buffered = [d.tag for d in sub._buffer]
            [*releases, unsubscribe] = fake.settling
            assert isinstance(unsubscribe, frames.Unsubscribe)
            if version == 3:
                assert releases == []
                assert unsubscribe.handed == [handed.tag]
            else:
                assert [r.tags for r in releases] == [buffered]  # type: ignore[attr-defined]
                assert unsubscribe.handed is None


@on_both_backends
async def test_members_in_a_version_1_hello_ok_are_not_learned() -> None:
    """``members`` is a version 2 field: a version 1 answer carrying it is not used."""
    async with serving(members=("127.0.0.1:1",)) as fake:
        fake.hello_version = 1
        async with _client(fake.address) as client:
            assert client._known_servers() == [fake.address]
            assert await client.publish("t", b"x") == 1


@pytest.mark.parametrize("pings", [True, False], ids=["slow", "hung"])
@on_both_backends
async def test_a_request_timing_out_on_a_silent_connection_pings_the_server(
    pings: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that times out with not a byte heard since it was sent makes the
    client PING: a server that answers (only slow) keeps the connection; one that
    answers nothing (stopped, hung) loses it, so the next call reconnects."""
    monkeypatch.setattr(_connection, "SILENT_SERVER_S", 0.2)
    monkeypatch.setattr(_connection, "PING_PROBE_S", 0.3)
    async with serving() as fake:
        fake.silent = {frames.Publish} if pings else {frames.Publish, frames.Ping}
        async with _client(fake.address, request_timeout_s=0.5) as client:
            conn = client._conn
            with pytest.raises(RequestError) as timed_out:
                await client.publish("t", b"x")
            assert timed_out.value.code is ErrorCode.TIMEOUT
            await anyio.sleep(0.6)
            assert conn is not None
            if pings:
                assert not conn.is_lost
            else:
                assert conn.is_lost and "not even a PING" in str(conn.lost_reason)


@on_both_backends
async def test_errors_in_the_body_are_not_wrapped() -> None:
    async with serving() as broker:
        with pytest.raises(KeyError):
            async with _client(broker.address):
                raise KeyError("mine")


@on_both_backends
async def test_publish_items_reports_refused_lines_and_keeps_good_ones() -> None:
    async with serving() as broker:
        from futureq.cli.jsonl import parse_jsonl
        from futureq.cli.publish_commands import publish_items

        lines = [
            '{"topic": "t", "payload": 1}',
            '{"topic": "t.dlq", "payload": 2}',
            '{"topic": "t", "payload": 3}',
            '{"topic": "", "payload": 4}',
            '{"topic": "t", "payload": 5}',
        ]
        items, failures = parse_jsonl(lines)
        assert failures == []
        progress: list[int] = []
        async with _client(broker.address) as client:
            summary = await publish_items(client, items, batch_size=10, on_progress=progress.append)
        assert summary.published == 3
        assert [(f.line_number, f.reason.split("]")[0]) for f in summary.failures] == [
            (2, "[RESERVED_TOPIC"),
            (4, "[INVALID_TOPIC"),
        ]
        assert sum(progress) == 5
        assert sum(broker.publish_sizes) == 3


@on_both_backends
async def test_pause_stops_granting_credit() -> None:
    async with serving() as broker:
        async with _client(broker.address) as client:
            await client.publish_batch([PublishItem("t", str(i).encode()) for i in range(3)])
            async with client.subscribe("t", "g", prefetch=1) as sub:
                first = await sub.__anext__()
                sub.pause()
                await first.ack()
                assert await sub.receive(0.2) is None  # no credit: nothing more is pushed
        assert broker.acked == [1]


class _CountingRandom(random.Random):
    """Counts the backoff delays drawn (``Backoff`` draws each with ``uniform``)."""

    def __init__(self) -> None:
        super().__init__(7)
        self.delays = 0

    def uniform(self, a: float, b: float) -> float:
        self.delays += 1
        return super().uniform(a, b)


@on_both_backends
async def test_a_redirect_to_a_named_leader_is_followed_without_a_backoff_pause() -> None:
    """NOT_LEADER naming the leader is no failure: the request goes to the leader as
    soon as the client is connected to it, without drawing a backoff delay (which
    grows to seconds after a few refusals during an election)."""
    async with task_group() as nursery:
        leader = FakeBroker()
        await nursery.start(leader.serve)
        follower = FakeBroker(redirect_to=leader.address)
        await nursery.start(follower.serve)
        rng = _CountingRandom()
        async with _client(follower.address, rng=rng) as client:
            assert await client.publish("t", b"x") == 1
            assert client.connected_address == leader.address
        assert rng.delays == 0
        assert leader.publish_sizes == [1]


@on_both_backends
async def test_a_leader_handing_over_is_told_what_the_application_was_handed() -> None:
    """Protocol version 4: HANDOVER is answered at once with an UNSUBSCRIBE naming
    the deliveries handed to the application (only they count); the buffered ones
    are never handed out (the server releases them, uncounted, and they come again),
    and the subscription subscribes again (``docs/protocol.md``, HANDOVER)."""
    async with serving(members=()) as fake:
        fake.hello_version = 4
        async with _client(fake.address) as client:
            await client.publish_batch([PublishItem("t", b"%d" % i) for i in range(3)])
            async with client.subscribe("t", "g", prefetch=3) as sub:
                handed = await sub.__anext__()
                with anyio.fail_after(5):
                    while sub.buffered < 2:  # noqa: ASYNC110 - no event says "buffered", under a deadline
                        await anyio.sleep(0.005)
                buffered = list(sub._buffer)
                asked = sub.subscription_id
                assert asked is not None
                [conn] = fake.connections
                await conn.send(frames.Handover(0, asked))
                with anyio.fail_after(5):
                    while not fake.settling:  # noqa: ASYNC110 - the fake records frames, under a deadline
                        await anyio.sleep(0.005)
                [unsubscribe] = fake.settling
                assert unsubscribe == frames.Unsubscribe(
                    unsubscribe.request_id, asked, [handed.tag]
                )
                assert [d.state for d in buffered] == [DeliveryState.VOID] * 2
                assert handed.state is DeliveryState.HELD
                assert sub.buffered == 0
                # The server released the unread ones: they come again, on a new
                # subscription of the same connection.
                for delivery in buffered:
                    fake.in_flight.pop(delivery.tag)
                    fake.queues["t", "g"].append((delivery.id, delivery.payload, 2))
                with anyio.fail_after(5):
                    again = [await sub.__anext__() for _ in range(2)]
                assert sorted(d.payload for d in again) == sorted(d.payload for d in buffered)
                assert sub.subscription_id not in (None, asked)
                # The handed one is still the application's to settle, and it holds
                # it: the new subscription's window leaves room for it (prefetch 3
                # less 1), and settling it gives that room back as one credit.
                assert sub.window == 2
                credit = sub._credit
                await handed.ack()
                assert handed.state is DeliveryState.SETTLED
                assert sub._credit == credit + 1
                fake.settling.clear()
            # Leaving names what the application still holds.
            [unsubscribe] = fake.settling
            assert unsubscribe.handed is not None
            assert set(unsubscribe.handed) == {d.tag for d in again}


@on_both_backends
async def test_pull_fetches_on_an_older_server_with_a_low_limit_never_stall() -> None:
    """A server older than protocol version 5 does not name its ``limits.max_prefetch``,
    refuses a SUBSCRIBE window past it and cuts credit held past it without a word.
    Before: the client subscribed with 1, granted 499 for ``fetch(500)``, the server
    kept 99 of it, and the client, believing 400 credits out, asked for nothing more:
    every later fetch of up to 400 returned nothing while messages waited. Now a
    refused window falls back to 1 and a fetch keeps no more than the window out."""
    async with serving(members=("fake:1",), cut_credit_at=100) as broker:
        broker.hello_version = 4
        async with _client(broker.address) as client:
            await client.publish_batch([PublishItem("t", f"m{n}".encode()) for n in range(300)])
            # Before: the window of 500 was refused (RequestError INVALID_ARGUMENT).
            async with client.subscribe("t", "g", prefetch=500, pull=True) as sub:
                assert sub.window == 1
                seen = []
                for count in (150, 50, 100):
                    got = await sub.fetch(count, timeout_s=5)
                    assert len(got) == count, (count, len(got))
                    await sub.ack(got)
                    seen.extend(d.id for d in got)
            assert len(set(seen)) == 300
