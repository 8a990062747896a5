"""Consumer group requests: name checks, creating, adopting, updating and deleting groups.

Plain functions over a :class:`~futureq.broker.broker.Broker`. A new group gets this
node's configured defaults, resolved by the leader into the command (``DESIGN.md``,
"Apply reads nothing node-local"); its creation is reserved against ``max_groups``
first (:mod:`futureq.broker.group_reservations`).

Source: ``docs/protocol.md``, "CREATE_GROUP" and "DELETE_GROUP".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from futureq.errors import ErrorCode, RequestError
from futureq.state import commands
from futureq.wire import validation
from futureq.wire.frames import GroupCreated

from . import group_reservations

if TYPE_CHECKING:
    from futureq.state.queue_state import GroupInfo

    from .broker import Broker


def check_names(broker: Broker, topic: str, group: str) -> None:
    """Names a client consumes from or manages: the grammar for anything new; names
    stored before the grammar existed stay usable where they exist.

    Raises:
        RequestError: INVALID_TOPIC, INVALID_GROUP.
    """
    state = broker.state
    if state.find_group(topic, group) is not None:
        validation.check_legacy_name("topic", topic)
        validation.check_legacy_name("group", group)
        return
    if state.topic_groups_count(topic) or state.topic_groups_count(
        topic.removesuffix(validation.DLQ_SUFFIX)
    ):
        validation.check_legacy_name("topic", topic)  # an existing (or its dlq) topic
    else:
        validation.check_consumable_topic(topic)
    validation.check_name("group", group)


async def ensure_group(
    broker: Broker,
    topic: str,
    group: str,
    visibility_timeout_ms: int | None = None,
    max_deliveries: int | None = None,
    from_backlog: bool = False,
    dead_letter_expired: bool | None = None,
) -> tuple[GroupInfo, GroupCreated]:
    """The work of :meth:`Broker.ensure_group` (its docstring: arguments, result,
    errors), and what it did (the answer of a GROUP_CREATE)."""
    broker._require_leader()
    # Even where a group of it exists (an earlier build created one): it can never
    # receive anything. GROUP_DELETE still takes it, so such a group can go.
    validation.check_not_dead_letters_of_dead_letters(topic)
    check_names(broker, topic, group)
    if visibility_timeout_ms is not None:
        # 1-99 first: IMPLAUSIBLE_TIME says what was probably meant (seconds).
        validation.check_visibility_timeout_ms(visibility_timeout_ms)
        if not (
            validation.MIN_VISIBILITY_TIMEOUT_MS
            <= visibility_timeout_ms
            <= validation.MAX_VISIBILITY_TIMEOUT_MS
        ):
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT,
                f"visibility_timeout_ms must be between {validation.MIN_VISIBILITY_TIMEOUT_MS}"
                f" and {validation.MAX_VISIBILITY_TIMEOUT_MS} ms (12 h), got "
                f"{visibility_timeout_ms}; leave it unset to keep the group's (or the server's default)",
            )
    if max_deliveries is not None and not 1 <= max_deliveries <= 1_000_000:
        raise RequestError(
            ErrorCode.INVALID_ARGUMENT,
            f"max_deliveries must be between 1 and 1000000, got {max_deliveries}",
        )
    if dead_letter_expired and topic.endswith(validation.DLQ_SUFFIX):
        raise RequestError(
            ErrorCode.INVALID_ARGUMENT,
            f"dead_letter_expired does nothing on the dead-letter topic {topic!r}: dead "
            "letters have no TTL, so none expires (one out of attempts is parked); "
            "leave it unset",
        )
    reserved = group_reservations.reserve_group(broker, topic, group)
    try:
        return await create_or_update_group(
            broker,
            topic,
            group,
            visibility_timeout_ms,
            max_deliveries,
            from_backlog,
            dead_letter_expired,
        )
    finally:
        if reserved is not None:
            group_reservations.release_group(broker, reserved)


async def create_or_update_group(
    broker: Broker,
    topic: str,
    group: str,
    visibility_timeout_ms: int | None,
    max_deliveries: int | None,
    from_backlog: bool,
    dead_letter_expired: bool | None,
) -> tuple[GroupInfo, GroupCreated]:
    """The proposal of :func:`ensure_group`, once its new group (if any) is reserved,
    and what it did.

    Group ids are never reused, so the group the command left is new if its id is
    none of those the topic had before; it fills from the backlog if it is being
    backfilled or older groups of the topic exist (a backfill may end before this
    coroutine runs again).
    """
    state = broker.state
    info = state.find_group(topic, group)
    if (
        info is None
        or info.implicit
        or (
            visibility_timeout_ms is not None
            and visibility_timeout_ms != info.visibility_timeout_ms
        )
        or (max_deliveries is not None and max_deliveries != info.max_deliveries)
        or (dead_letter_expired is not None and dead_letter_expired != info.dead_letter_expired)
    ):
        broker._require_space()
        before = {other.group_id for other in state.topic_groups(topic)}
        await broker.log.propose(
            commands.create_group(
                topic,
                group,
                visibility_timeout_ms,
                max_deliveries,
                broker.group_settings,
                dead_letter_expired=dead_letter_expired,
                from_backlog=from_backlog and info is None,
            )
        )
        changed = state.find_group(topic, group)
        assert changed is not None
        if info is not None:
            return changed, GroupCreated.UPDATED
        gid = changed.group_id
        if gid in before:
            return changed, GroupCreated.ADOPTED
        if from_backlog and (
            gid in state.backfilling
            or any(other.group_id < gid for other in state.topic_groups(topic))
        ):
            return changed, GroupCreated.CREATED_FROM_BACKLOG
        return changed, GroupCreated.CREATED
    return info, GroupCreated.UNCHANGED


async def delete_group(broker: Broker, topic: str, group: str) -> None:
    """The work of :meth:`Broker.delete_group` (its docstring: arguments, result, errors)."""
    broker._require_leader()
    check_names(broker, topic, group)
    if broker.state.find_group(topic, group) is None:
        raise RequestError(ErrorCode.UNKNOWN_GROUP, f"topic {topic!r} has no group {group!r}")
    await broker.log.propose(commands.delete_group(topic, group))
