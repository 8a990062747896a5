"""Managing scheduled messages on the leader (issue 14): the requests that cancel,
reschedule, browse, purge and redrive what is waiting.

Each function validates a request against the leader's state, resolves names to the
ids the log uses (a group name to its group id) and proposes one replicated command
(:mod:`futureq.state.commands`), so every replica applies the same change
(``DESIGN.md``, "Data flow"). Bad input fails the request alone with a stable error
code and a sentence (``docs/protocol.md``, "Error codes").

Source: ``docs/protocol.md``, "CANCEL".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from futureq.errors import ErrorCode, RequestError
from futureq.state import commands
from futureq.wire import frames

if TYPE_CHECKING:
    from futureq.broker.broker import Broker
    from futureq.state.model import GroupInfo


def check_ids(broker: Broker, request: str, ids: list[int]) -> None:
    """Refuse an empty or oversized batch of message ids, or one that is not an id.

    Raises:
        RequestError: EMPTY_BATCH, BATCH_TOO_LARGE, INVALID_MESSAGE_ID (with the item).
    """
    if not ids:
        raise RequestError(ErrorCode.EMPTY_BATCH, f"{request} names no message ids; send at least one")
    limit = broker.limits.max_batch_items
    if len(ids) > limit:
        raise RequestError(
            ErrorCode.BATCH_TOO_LARGE,
            f"{request} names {len(ids)} message ids; the limit is {limit} per request "
            "(limits.max_batch_items): split it",
        )
    for position, mid in enumerate(ids):
        if not 0 <= mid <= frames.MAX_MESSAGE_ID:
            raise RequestError(
                ErrorCode.INVALID_MESSAGE_ID,
                f"ids[{position}] = {mid} is not a message id (an integer in [0, 2**64-1], "
                "as PUBLISH_OK gives them)",
                item_index=position,
            )


def target_groups(broker: Broker, request: str, topic: str, group: str | None) -> GroupInfo | None:
    """The group a by-id request names (None: every group of ``topic``).

    Raises:
        RequestError: UNKNOWN_TOPIC (the topic has no group), UNKNOWN_GROUP.
    """
    state = broker.state
    if not state.topic_groups_count(topic):
        raise RequestError(
            ErrorCode.UNKNOWN_TOPIC,
            f"{request}: topic {topic!r} has no consumer group, so no message of it is pending",
        )
    if group is None:
        return None
    info = state.find_group(topic, group)
    if info is None:
        raise RequestError(
            ErrorCode.UNKNOWN_GROUP,
            f"{request}: topic {topic!r} has no group {group!r} (leave the group out to "
            "act on every group of the topic)",
        )
    return info


async def cancel(broker: Broker, topic: str, group: str | None, ids: list[int]) -> list[int]:
    """Cancel scheduled messages by id, in one group of ``topic`` or in all of them.

    O(log n) per id (the message record, then its entry, found through the ``index``
    family where it moved). A message in flight is cancelled too: its delivery's ACK
    then finds nothing.

    Returns:
        One :class:`~futureq.wire.frames.ItemStatus` number per id, in order: DONE,
        DELIVERED (removed, but delivered at least once) or UNKNOWN.

    Raises:
        RequestError: as :func:`check_ids` and :func:`target_groups`.
        NotLeaderError: this node is not the leader.
    """
    broker.require_leader()
    check_ids(broker, "CANCEL", ids)
    info = target_groups(broker, "CANCEL", topic, group)
    result = await broker.log.propose(
        commands.cancel(topic, None if info is None else info.group_id, ids)
    )
    return [int(status) for status in result]
