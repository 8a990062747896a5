"""The workload: producers and competing consumers through the real ``futureq.client``.

Every operation goes into the :class:`~tests.jepsen_like.history.History` with its
invocation and completion time (see ``history.py`` for the event shapes).

Topics and groups are fixed (:data:`TOPICS`) and every group is created **before** the
first publish, so every message targets all the groups of its topic. The groups of
``jobs`` have a short visibility timeout so the slow consumers let it expire. The group
``temp`` of topic ``churn`` is deleted and re-created every few seconds by the
*churner* (``group`` events); a message is not required of it once a delete of it was
invoked after the message's publish.

Producers (``producers`` of them, ``rate`` publishes per second in all) draw each
operation from the seeded rng:

* ``soon`` (45 %): delay 0..``max_delay_ms``;
* ``ttl-long`` (10 %): delay 0..``max_delay_ms``, TTL 10 min (must be delivered);
* ``ttl-short`` (10 %): delay 0..500 ms, TTL 1..20 ms (may expire undelivered, must
  never be delivered after it expired);
* ``far`` (10 %): delay 1 h (must not fire during the run);
* ``batch`` (25 %): ``publish_batch`` of 2..8 ``soon`` items.

Consumers, per group, each with its own connection: ``ack`` (acks everything), ``nack``
(nacks 30 % with a requeue delay of 0..500 ms, acks the rest), ``crash`` (after a few
deliveries drops its connection without settling them, then comes back), ``slow``
(works on 30 % of its deliveries for 1.5 visibility timeouts: half of those it keeps
with ``extend()`` while it works, the other half it lets time out, then acks),
``lease`` (prefetch 200 and 20 ms of work per message: what it buffers is kept alive
by the client's lease keeper), ``cancel`` (cancels 30 % of its acks and nacks, and
some receives, at a random point of their flight). Every deliver event records the
consumer's connection number (``conn``), so the checker can tell a duplicate after a
connection loss. While draining every consumer only acks, and nothing is cancelled.
"""

from __future__ import annotations

import json
import random
from typing import Any, Final

import attrs
import trio
from tests.jepsen_like.history import History

from futureq.client import PublishItem, open_client
from futureq.client._attempts import partly_stored
from futureq.client._publishing import _publish_frame
from futureq.errors import (
    ErrorCode,
    FutureQError,
    NotSentError,
    RequestError,
    SubscriptionEndedError,
)
from futureq.wire import frames

#: topic -> groups (created up front); the visibility timeout of each group (ms).
TOPICS: dict[str, list[str]] = {
    "jobs": ["workers", "audit"],
    "events": ["sink"],
    "churn": ["temp"],
}
SHARD_TOPICS: dict[str, list[str]] = {"tasks": ["crew", "ledger"]}
"""Added to :data:`TOPICS` when the nodes run several shards: all of ``TOPICS`` hash to
shard 1 of 2 (``docs/sharding.md``, "Slots"), ``tasks`` to shard 0, so both shards
carry publishes, deliveries, visibility timeouts and redeliveries."""
VISIBILITY_MS: dict[str, int] = {
    "workers": 2_000,
    "audit": 2_000,
    "sink": 5_000,
    "temp": 2_000,
    "crew": 2_000,
    "ledger": 5_000,
}
MAX_DELIVERIES = 1_000
FAR_DELAY_MS = 3_600_000
LONG_TTL_MS = 600_000
#: Consumer behaviours of each group, one consumer each.
BEHAVIOURS: dict[str, list[str]] = {
    "workers": ["ack", "nack", "crash", "slow", "lease", "cancel"],
    "audit": ["ack", "crash"],
    "sink": ["ack", "nack", "cancel"],
    "temp": ["ack", "cancel"],
    "crew": ["ack", "nack", "crash", "slow", "cancel"],
    "ledger": ["ack", "crash"],
}
CHURN: Final = ("churn", "temp")
"""The group the churner deletes and re-creates."""
CHURN_EVERY_S: Final = (3.0, 8.0)
"""Range of the churner's pauses between a re-create and the next delete (s)."""
CANCEL_RATE: Final = 0.3
"""Share of its settlements a ``cancel`` consumer cancels."""


def topics_for(shards: int) -> dict[str, list[str]]:
    """The run's topics and their groups: :data:`TOPICS`, plus :data:`SHARD_TOPICS`
    when the nodes run several shards."""
    return {**TOPICS, **SHARD_TOPICS} if shards > 1 else dict(TOPICS)


def connection_of(client: Any, topic: str) -> int:
    """Number of the connection ``client`` uses for ``topic`` (bumped by every
    reconnect): a sharded client's is that of the shard owning the topic."""
    shard_client = client.client_for(topic) if hasattr(client, "client_for") else client
    return int(shard_client._epoch)


@attrs.frozen
class WorkloadConfig:
    """Knobs of the workload.

    Attributes:
        rate: Publish operations per second, all producers together (a batch counts once).
        shards: ``--shards`` of the nodes (picks the topics, :func:`topics_for`).
        producers: Concurrent producer clients.
        max_delay_ms: Largest delay of ordinary messages (ms).
        ack_level: ``quorum``, ``leader`` or ``none`` (unsafe: answered before durable).
        request_timeout_s: Client deadline per call; a publish still unanswered then
            is recorded with outcome unknown.
    """

    rate: float = 20.0
    shards: int = 1
    producers: int = 3
    max_delay_ms: int = 3_000
    ack_level: str = "quorum"
    request_timeout_s: float = 10.0


def payload_for(key: str) -> bytes:
    """The payload that carries a publish's key."""
    return json.dumps({"k": key}).encode()


def key_of(payload: bytes) -> str | None:
    """The key in a payload written by :func:`payload_for`; None if it is not ours."""
    try:
        value = json.loads(payload)
    except ValueError:
        return None
    key = value.get("k") if isinstance(value, dict) else None
    return key if isinstance(key, str) else None


def outcome_of(error: FutureQError) -> str:
    """``fail`` when the server definitely refused (a 2xx code) or the client knows
    the request took no effect (:class:`NotSentError`), else ``info`` (unknown). So the
    checker holds the client to its "not sent": a delivery of such a message is
    ``unexpected``."""
    if isinstance(error, NotSentError):
        return "fail"
    if isinstance(error, RequestError) and 200 <= int(error.code) < 300:
        return "fail"
    return "info"


class Workload:
    """Producers and consumers of one run.

    Args:
        servers: Client addresses of every node.
        history: Where events go.
        rng: Seeded randomness (each client gets its own ``Random`` drawn from it).
        config: Knobs.
    """

    def __init__(
        self, servers: list[str], history: History, rng: random.Random, config: WorkloadConfig
    ) -> None:
        self.servers = servers
        self.history = history
        self.rng = rng
        self.config = config
        self.next_op = 0
        self.next_batch = 0
        self.draining = False
        self.stopped = trio.Event()
        self.subscriptions: dict[str, tuple[str, Any]] = {}
        """Live subscriptions: consumer name -> (group, subscription)."""
        self.topics = topics_for(config.shards)

    def client(self, rng: random.Random) -> Any:
        """An ``open_client`` context for this run."""
        level = "quorum" if self.config.ack_level == "none" else self.config.ack_level
        return open_client(
            self.servers,
            request_timeout_s=self.config.request_timeout_s,
            connect_timeout_s=self.config.request_timeout_s,
            ack_level=level,  # type: ignore[arg-type]
            rng=rng,
        )

    async def setup(self) -> None:
        """Create every group (before any publish, so every message targets them all)."""
        async with self.client(random.Random(self.rng.random())) as client:
            for topic, groups in self.topics.items():
                for group in groups:
                    await self._create(client, topic, group)

    @staticmethod
    async def _create(client: Any, topic: str, group: str) -> None:
        await client.create_group(
            topic,
            group,
            visibility_timeout_ms=VISIBILITY_MS[group],
            max_deliveries=MAX_DELIVERIES,
        )

    # ----------------------------------------------------------------- churner

    async def run_churner(self) -> None:
        """Delete and re-create the churn group until cancelled; each step is recorded."""
        rng = random.Random(self.rng.random())
        topic, group = CHURN
        async with self.client(random.Random(rng.random())) as client:
            while True:
                await trio.sleep(rng.uniform(*CHURN_EVERY_S))
                for action in ("delete", "create"):
                    await self._churn(client, action, topic, group)
                    await trio.sleep(rng.uniform(0.1, 1.0))

    async def _churn(self, client: Any, action: str, topic: str, group: str) -> None:
        self.history.record("group", phase="invoke", action=action, topic=topic, group=group)
        try:
            if action == "delete":
                await client.delete_group(topic, group)
            else:
                await self._create(client, topic, group)
        except FutureQError as error:
            self.history.record(
                "group", phase="fail", action=action, topic=topic, group=group, error=repr(error)
            )
            return
        self.history.record("group", phase="ok", action=action, topic=topic, group=group)

    async def restore_churned(self) -> None:
        """Make sure the churn group exists again (before the drain)."""
        async with self.client(random.Random(self.rng.random())) as client:
            await self._churn(client, "create", *CHURN)

    # ----------------------------------------------------------------- producers

    async def run_producers(self) -> None:
        """Run every producer until cancelled."""
        async with trio.open_nursery() as nursery:
            for producer in range(self.config.producers):
                nursery.start_soon(self.run_producer, producer, random.Random(self.rng.random()))

    def _item(self, rng: random.Random, kind: str) -> tuple[str, int, int | None]:
        """(topic, delay_ms, ttl_ms) of one message of ``kind``."""
        topic = rng.choice(list(self.topics))
        if kind == "far":
            return topic, FAR_DELAY_MS, None
        if kind == "ttl-short":
            return topic, rng.randint(0, 500), rng.randint(1, 20)
        ttl = LONG_TTL_MS if kind == "ttl-long" else None
        return topic, rng.randint(0, self.config.max_delay_ms), ttl

    def _invoke(self, producer: int, key: str, topic: str, delay: int, ttl: int | None) -> int:
        self.next_op += 1
        self.history.record(
            "publish",
            phase="invoke",
            op=self.next_op,
            key=key,
            producer=producer,
            topic=topic,
            groups=self.topics[topic],
            delay_ms=delay,
            deliver_at_ms=None,
            ttl_ms=ttl,
        )
        return self.next_op

    async def run_producer(self, producer: int, rng: random.Random) -> None:
        """Publish at ``rate / producers`` operations per second until cancelled."""
        period_s = self.config.producers / max(self.config.rate, 0.001)
        seq = 0
        async with self.client(random.Random(rng.random())) as client:
            async with trio.open_nursery() as nursery:
                while True:
                    kind = rng.choices(
                        ["soon", "ttl-long", "ttl-short", "far", "batch"], [45, 10, 10, 10, 25]
                    )[0]
                    count = rng.randint(2, 8) if kind == "batch" else 1
                    ops: list[tuple[int, str, str, int, int | None]] = []
                    for _ in range(count):
                        seq += 1
                        key = f"p{producer}-{seq}"
                        topic, delay, ttl = self._item(rng, "soon" if kind == "batch" else kind)
                        op = self._invoke(producer, key, topic, delay, ttl)
                        ops.append((op, key, topic, delay, ttl))
                    # Each call runs in its own task so a stalled cluster piles calls up
                    # (as real producers would) instead of silently lowering the rate.
                    # A batch is atomic per shard only (docs/sharding.md): on sharded
                    # nodes each shard's part is its own call with its own outcome.
                    for part in self._parts(client, ops):
                        nursery.start_soon(self._publish, client, part, kind == "batch")
                    await trio.sleep(rng.expovariate(1.0 / period_s))

    @staticmethod
    def _parts(
        client: Any, ops: list[tuple[int, str, str, int, int | None]]
    ) -> list[list[tuple[int, str, str, int, int | None]]]:
        """``ops`` split by the shard of their topic (one part on unsharded nodes)."""
        slot_map = getattr(client, "slot_map", None)
        if slot_map is None or len(ops) == 1:
            return [ops]
        parts: dict[int, list[tuple[int, str, str, int, int | None]]] = {}
        for op in ops:
            parts.setdefault(slot_map.shard_of(op[2]), []).append(op)
        return list(parts.values())

    async def _publish_unsafe(self, client: Any, items: list[PublishItem]) -> list[int | None]:
        """PUBLISH at ack level NONE: answered before the batch is durable, without ids.

        The public client offers only ``leader`` and ``quorum``; this deliberately unsafe
        mode (for showing that the checker sees losses) sends the frame itself.
        """
        parts: dict[int, tuple[Any, list[PublishItem]]] = {}
        for item in items:  # a sharded client: each shard's part to that shard
            target = client.client_for(item.topic) if hasattr(client, "client_for") else client
            parts.setdefault(id(target), (target, []))[1].append(item)
        done = 0
        for target, part in parts.values():
            frame = _publish_frame(frames.AckLevel.NONE, [item.to_wire() for item in part])
            try:
                answer = await target._call(frame, retry_unknown=False)
            except NotSentError as exc:
                # Not "not sent" for the whole batch when earlier parts were stored.
                raise partly_stored(exc, done, len(items))  # noqa: B904 - its own cause
            done += len(part)
            if not isinstance(answer, frames.PublishOk):
                raise RequestError(ErrorCode.INTERNAL_ERROR, f"unexpected answer {answer!r}")
        return [None] * len(items)

    async def _publish(
        self, client: Any, ops: list[tuple[int, str, str, int, int | None]], batch: bool
    ) -> None:
        batch_id = None
        if batch:
            self.next_batch += 1
            batch_id = self.next_batch
        items = [
            PublishItem(topic, payload_for(key), delay, None, ttl)
            for _, key, topic, delay, ttl in ops
        ]
        try:
            if self.config.ack_level == "none":
                ids: list[int | None] = await self._publish_unsafe(client, items)
            elif batch:
                ids = list(await client.publish_batch(items))
            else:
                item = items[0]
                ids = [
                    await client.publish(
                        item.topic, item.payload, delay_ms=item.delay_ms, ttl_ms=item.ttl_ms
                    )
                ]
        except FutureQError as error:
            outcome = outcome_of(error)
            for op, key, *_ in ops:
                self.history.record(
                    "publish", phase=outcome, op=op, key=key, error=repr(error), batch=batch_id
                )
            return
        for (op, key, *_), message_id in zip(ops, ids, strict=False):
            self.history.record(
                "publish", phase="ok", op=op, key=key, id=message_id, batch=batch_id
            )

    # ----------------------------------------------------------------- consumers

    async def run_consumers(self) -> None:
        """Run every consumer until :meth:`stop`."""
        async with trio.open_nursery() as nursery:
            for topic, groups in self.topics.items():
                for group in groups:
                    for number, behaviour in enumerate(BEHAVIOURS[group]):
                        name = f"{group}-{number}-{behaviour}"
                        rng = random.Random(self.rng.random())
                        nursery.start_soon(self.run_consumer, topic, group, name, behaviour, rng)

    def record_buffered(self) -> None:
        """One ``buffered`` event per live consumer: the deliveries its client holds
        (pushed by the server, kept alive by the lease keeper) and has not handed to
        the consumer yet. Reached a consumer of the group: not lost, not passed by."""
        for name, (group, sub) in sorted(self.subscriptions.items()):
            buffer = list(getattr(sub, "_buffer", ()))
            self.history.record(
                "buffered",
                consumer=name,
                group=group,
                ids=[delivery.id for delivery in buffer],
                keys=[key_of(delivery.payload) for delivery in buffer],
            )

    def stop(self) -> None:
        """Ask every consumer to leave."""
        self.stopped.set()

    async def run_consumer(
        self, topic: str, group: str, name: str, behaviour: str, rng: random.Random
    ) -> None:
        """One consumer: (re)connects until stopped; crashes reconnect after a pause."""
        while not self.stopped.is_set():
            try:
                async with self.client(random.Random(rng.random())) as client:
                    prefetch = {"slow": 1, "lease": 200}.get(behaviour, 10)
                    async with client.subscribe(topic, group, prefetch=prefetch) as sub:
                        self.subscriptions[name] = (group, sub)
                        try:
                            await self._consume(client, sub, group, name, behaviour, rng)
                        finally:
                            self.subscriptions.pop(name, None)
            except SubscriptionEndedError as error:
                # The churner deleted the group: subscribe again (which re-creates it).
                self.history.record("consumer", phase="ended", consumer=name, error=repr(error))
            except FutureQError as error:
                self.history.record("consumer", phase="error", consumer=name, error=repr(error))
            if not self.stopped.is_set():
                await trio.sleep(rng.uniform(0.2, 1.0))

    async def _consume(
        self, client: Any, sub: Any, group: str, name: str, behaviour: str, rng: random.Random
    ) -> None:
        crash_after = rng.randint(3, 30)
        received = 0
        while not self.stopped.is_set():
            delivery = None
            if behaviour == "cancel" and not self.draining and rng.random() < 0.1:
                with trio.move_on_after(rng.uniform(0, 0.005)):  # a receive given up
                    delivery = await sub.receive(timeout_s=0.5)
            else:
                delivery = await sub.receive(timeout_s=0.5)
            if delivery is None:
                continue
            received += 1
            self._delivered(client, delivery, name)
            if not self.draining:
                if behaviour == "crash" and received >= crash_after:
                    self.history.record("consumer", phase="crash", consumer=name)
                    return  # leaves the client block: the connection closes unsettled
                if behaviour == "slow" and rng.random() < 0.3:
                    await self._work(delivery, name, VISIBILITY_MS[group] * 1.5 / 1000, rng)
                if behaviour == "lease":
                    await trio.sleep(0.02)
                if behaviour == "nack" and rng.random() < 0.3:
                    await self._settle(delivery, name, "nack", rng.randint(0, 500), rng, behaviour)
                    continue
            await self._settle(delivery, name, "ack", 0, rng, behaviour)

    def _delivered(self, client: Any, delivery: Any, name: str) -> None:
        self.history.record(
            "deliver",
            id=delivery.id,
            key=key_of(delivery.payload),
            topic=delivery.topic,
            group=delivery.group,
            consumer=name,
            conn=connection_of(client, delivery.topic),
            attempt=delivery.attempt,
            delivered_ms=delivery.delivered_ms,
            due_ms=delivery.due_ms,
            publish_ms=delivery.publish_ms,
        )

    async def _work(self, delivery: Any, name: str, work_s: float, rng: random.Random) -> None:
        """Work ``work_s`` on a delivery; half the time keep it with ``extend()`` meanwhile."""
        if rng.random() < 0.5:
            await trio.sleep(work_s)  # let it time out: a duplicate by design
            return
        visibility_s = VISIBILITY_MS[delivery.group] / 1000
        deadline = trio.current_time() + work_s
        while trio.current_time() < deadline:
            await trio.sleep(min(visibility_s / 3, deadline - trio.current_time()))
            fields = {"id": delivery.id, "group": delivery.group, "consumer": name}
            try:
                await delivery.extend()
            except FutureQError as error:
                self.history.record("extend", phase="fail", error=repr(error), **fields)
                return
            self.history.record("extend", phase="ok", **fields)

    async def _settle(
        self,
        delivery: Any,
        name: str,
        how: str,
        requeue_delay_ms: int,
        rng: random.Random,
        behaviour: str,
    ) -> None:
        fields = {
            "id": delivery.id,
            "group": delivery.group,
            "consumer": name,
            "attempt": delivery.attempt,
        }
        self.history.record(how, phase="invoke", **fields)
        cancel_after = (
            rng.uniform(0, 0.01)
            if behaviour == "cancel" and not self.draining and rng.random() < CANCEL_RATE
            else float("inf")
        )
        with trio.move_on_after(cancel_after) as scope:
            try:
                if how == "ack":
                    await delivery.ack()
                else:
                    await delivery.nack(requeue_delay_ms=requeue_delay_ms)
            except FutureQError as error:
                self.history.record(how, phase="fail", error=repr(error), **fields)
                return
        if scope.cancelled_caught:
            # Given up at some point of its flight: it may or may not have been applied.
            self.history.record(how, phase="cancelled", **fields)
            return
        self.history.record(how, phase="ok", **fields)
