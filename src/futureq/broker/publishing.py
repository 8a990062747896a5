"""Publishing: the leader's stamp, a batch's validation and proposal, ack levels.

Plain functions over a :class:`~futureq.broker.broker.Broker`. Publishing stamps the
leader's cluster time (``docs/architecture.md``, "Time"; never below the largest stamp
committed, so it is monotonic across leaders too), validates the batch, reserves the
groups its new topics create (:mod:`futureq.broker.group_reservations`), and proposes
one PUBLISH command; ack levels decide when it answers. Ack-level-NONE publishes are
proposed by the background publisher task, in arrival order.

Source: ``DESIGN.md``, "Data flow"; ``docs/protocol.md``, "PUBLISH".
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import trio

from futureq import request_order
from futureq.errors import ErrorCode, FutureQError, RequestError
from futureq.state import commands
from futureq.state.queue_state import PublishResult
from futureq.wire import frames, validation

from . import group_reservations
from .command_log import SingleNodeLog

if TYPE_CHECKING:
    from .broker import Broker
    from .group_reservations import GroupKey

log = logging.getLogger(__name__)

BACKGROUND_QUEUE_BYTES = 64 * 1024 * 1024
"""Most bytes of ack-level-NONE publishes waiting to be proposed (and at most 1,024 of
them); past either, such a publish is refused UNAVAILABLE. One command is always taken
when none waits, whatever its size (up to ``limits.max_frame_bytes``)."""

_TOPIC = itemgetter(0)


def only_topic(validated: list[validation.ValidItem]) -> str | None:
    """The topic every item of a (non-empty) batch names, or None when it names several
    (once per PUBLISH: the group reservation and the published count both ask)."""
    first: str = validated[0][0]
    if len(validated) == 1 or first == validated[-1][0] and len(set(map(_TOPIC, validated))) == 1:
        return first
    return None


def stamp(broker: Broker) -> int:
    """The publish time: cluster time, never below an earlier stamp (ms), unless that
    stamp is further ahead of cluster time than its bound (``max_clock_offset_ms``).

    Nodes in bound are within the bound of each other, so a new leader's cluster
    time can be behind its predecessor's stamps by that much, and is lifted to them.
    A stamp further ahead was made on a wrong clock (a single node restarted to
    adopt a corrected clock, as its step notice says; a node that stamped on its own
    bad clock): kept as the floor, it delayed every later publish by the old error
    for good. It is then logged once and left behind: nothing is released earlier
    by it (a due time is the stamp plus the delay, released by cluster time).

    Raises:
        RequestError: CLOCK_NOT_SYNCHRONIZED when this node's clock is not in
            agreement with the cluster (TigerBeetle's rule: never stamp with a time
            the replicas do not agree on).
    """
    if broker._check_can_stamp is not None:
        broker._check_can_stamp()
    now_ms = broker.clock.wall_ms()
    floor = max(broker._last_stamp_ms, broker.state.last_publish_ms)
    if floor > now_ms:
        if floor - now_ms <= broker._stamp_slack_ms:
            now_ms = floor
        elif floor != broker._floor_warned:
            broker._floor_warned = floor
            log.warning(
                "an earlier publish stamp (%d) is %.3f s ahead of cluster time, more "
                "than cluster.max_clock_offset_ms=%d: it was made on a wrong clock; "
                "new publishes are stamped on cluster time (messages stamped then "
                "stay due as stamped)",
                floor,
                (floor - now_ms) / 1000,
                broker._stamp_slack_ms,
            )
    broker._last_stamp_ms = now_ms
    return now_ms


def stamps_ahead_ms(broker: Broker) -> int | None:
    """How far the latest publish stamp stored stands ahead of cluster time (ms), when
    further than the bound (``max_clock_offset_ms``: the stamps :func:`stamp` leaves
    behind); else None. Until cluster time reaches it, messages published before are
    held that much longer than this node's clock says (the dashboard's CLOCK_OFFSET)."""
    ahead_ms = broker.state.last_publish_ms - broker.clock.wall_ms()
    return ahead_ms if ahead_ms > broker._stamp_slack_ms else None


async def publish(
    broker: Broker, items: list[Any], ack_level: frames.AckLevel
) -> tuple[int | None, int, dict[int, int] | None]:
    """The work of :meth:`Broker.publish` (its docstring: arguments, result, errors)."""
    broker._require_leader()
    broker._require_space()
    started = trio.current_time()
    publish_ms = stamp(broker)
    validated: list[validation.ValidItem] = []
    for _ in validation.validate_publish_items_in_steps(
        items, broker.limits, publish_ms, validated
    ):
        await trio.lowlevel.checkpoint()  # a 10,000-item batch must not hold the loop
    only = only_topic(validated)
    reserved = group_reservations.reserve_new_groups(broker, validated, only)
    try:
        return await publish_validated(
            broker, validated, only, ack_level, publish_ms, started, reserved
        )
    finally:
        if reserved:
            group_reservations.release_groups(broker, reserved)


def publish_command(
    broker: Broker, validated: list[validation.ValidItem], publish_ms: int
) -> tuple[list[Any], bytes, bool]:
    """The PUBLISH command of a valid batch: ``(command list, its bytes, keyed)``;
    ``keyed``: some item has an idempotency key (its answer needs the apply result)."""
    # Only items with headers or a key have more than 4 fields: one C-speed pass
    # decides for the common batch.
    keyed = max(map(len, validated)) > 4 and any(
        len(item) > 5 and item[5] is not None for item in validated
    )
    command_list = commands.publish_command(
        publish_ms,
        validated,
        broker.group_settings,
        broker.config.queue.idempotency_window_ms if keyed else 0,
    )
    return command_list, commands.encode(command_list), keyed


async def publish_validated(
    broker: Broker,
    validated: list[validation.ValidItem],
    only: str | None,
    ack_level: frames.AckLevel,
    publish_ms: int,
    started: float,
    reserved: list[GroupKey],
) -> tuple[int | None, int, dict[int, int] | None]:
    """The rest of :func:`publish`, once the batch is valid and its new groups are
    reserved (``reserved``; an ack-level-NONE batch takes them into the background
    publisher, which releases them once it has proposed). ``only``: the topic of
    every item, or None (:func:`only_topic`)."""
    command_list, command, keyed = publish_command(broker, validated, publish_ms)
    # This node applies the list it was given (no decode of what was just encoded);
    # Raft followers decode the bytes.
    single = broker.log if isinstance(broker.log, SingleNodeLog) else None
    if ack_level == frames.AckLevel.LEADER and not keyed:
        with request_order.effect():
            if single is not None:
                index = await single.propose_durable(command, command_list)
            else:
                index = await broker.log.propose_durable(command)
        broker.metrics.publish_commit_seconds.observe(trio.current_time() - started)
        count_published(broker, validated, only)
        return commands.message_id(index, 0), len(validated), None
    if ack_level == frames.AckLevel.NONE:
        turn = request_order.current()

        def queue() -> None:
            queued = broker._background_bytes
            if queued and queued + len(command) > BACKGROUND_QUEUE_BYTES:
                raise trio.WouldBlock
            place = request_order.Turn(None)
            broker._background_send.send_nowait((command, reserved[:], place))
            broker._background_bytes = queued + len(command)
            reserved.clear()  # the background publisher releases them once proposed
            request_order.queued_in_background(turn, place)

        with request_order.effect():
            # In its connection's order, not behind the earlier ack-level-NONE ones:
            # the background publisher takes them in order.
            await request_order.in_turn(
                queue,
                full=RequestError(
                    ErrorCode.UNAVAILABLE,
                    "too many unacknowledged publishes are queued; use ack level leader or "
                    "quorum, or retry",
                ),
                behind_background=False,
            )
        count_published(broker, validated, only)
        return None, len(validated), None
    # Idempotency keys need the apply result (which items were duplicates), so a
    # keyed batch at ack level LEADER waits for its commit like QUORUM.
    with request_order.effect():
        result = await broker.log.propose(command, command_list)
    broker.metrics.publish_commit_seconds.observe(trio.current_time() - started)
    count_published(broker, validated, only)
    if isinstance(result, PublishResult):
        return result.first_id, len(validated), result.duplicates
    return int(result), len(validated), None


def count_published(
    broker: Broker, validated: list[validation.ValidItem], only: str | None
) -> None:
    # One label lookup per distinct topic; topics past the series budget share one.
    metrics = broker.metrics
    if only is not None:
        label = metrics.topic_label(only)
        metrics.published_messages_total.labels(label).inc(len(validated))
        return
    counts: Tally[str] = Tally()
    for topic, count in Tally(item[0] for item in validated).items():
        counts[metrics.topic_label(topic)] += count
    for label, count in counts.items():
        metrics.published_messages_total.labels(label).inc(count)


async def run_background_publisher(broker: Broker) -> None:
    """Commit ack-level-NONE publishes in the background, in arrival order.

    Each publish's place (:func:`futureq.request_order.queued_in_background`) is passed
    on once it is queued in the log, or given up (so no later request of its
    connection waits for it for good, even when this task ends with some queued)."""
    receive = broker._background_receive
    try:
        async for command, reserved, place in receive:
            try:
                with request_order.serving(place), request_order.effect():
                    await broker.log.propose(command)
            except FutureQError as exc:
                log.warning("an unacknowledged publish (ack level none) was lost: %s", exc)
            finally:
                place.pass_on()
                broker._background_bytes -= len(command)
                if reserved:
                    group_reservations.release_groups(broker, reserved)
    finally:
        while True:
            try:
                _command, _reserved, place = receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            place.pass_on()
        receive.close()
