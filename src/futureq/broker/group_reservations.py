"""Group reservations: the groups proposals in flight will create, against ``max_groups``.

Plain functions over a :class:`~futureq.broker.broker.Broker`. The leader checks
``limits.max_groups`` before it proposes; without counting the groups that proposals in
flight will create, every request pipelined behind the one that reaches the limit would
see the same count and pass too. A publish reserves the implicit groups of its new
topics (:func:`reserve_new_groups`), a SUBSCRIBE or CREATE_GROUP its named group or its
adoption of a topic's implicit group (:func:`reserve_group`); each is released once
proposed or refused.
"""

from __future__ import annotations

import itertools
from collections import Counter as Tally
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from futureq.errors import ErrorCode, RequestError
from futureq.wire import validation

if TYPE_CHECKING:
    from .broker import Broker

GroupKey = tuple[str, "str | None"]
"""A group a proposal in flight will create: ``(topic, None)`` for a topic's implicit
group, ``(topic, group)`` for a named one."""


def groups_coming(broker: Broker, extra: Iterable[GroupKey] = ()) -> int:
    """Most groups the proposals in flight (and ``extra``, keys about to be reserved)
    can create that the state does not hold yet, each group counted once.

    Counted per topic, as apply creates them (``futureq.state.group_changes.create_group``): a
    topic with no group gets one from its publishes *or* from the first name to
    commit, not both, so its implicit group counts only when no new name of it is in
    flight; a topic whose only group is implicit has it adopted by the first new
    name to commit (:attr:`_adopting` holds one such name; if none is there, one of
    the names reserved before the implicit group existed adopts it).
    """
    state = broker.state
    by_topic: dict[str, set[str | None]] = {}
    for topic, group in itertools.chain(broker._groups_reserved, extra):
        by_topic.setdefault(topic, set()).add(group)
    coming = 0
    for topic, names in by_topic.items():
        new_names = sum(
            1 for name in names if name is not None and state.find_group(topic, name) is None
        )
        held = state.topic_groups_count(topic)
        if not held:
            coming += max(new_names, 1 if None in names else 0)
        elif held == 1 and state.topic_groups(topic)[0].implicit and topic not in broker._adopting:
            coming += max(new_names - 1, 0)
        else:
            coming += new_names
    return coming


def too_many_groups(broker: Broker, what: str, position: int | None = None) -> RequestError:
    held = len(broker.state.groups)
    coming = groups_coming(broker)
    in_flight = f" and requests in flight are creating {coming} more" if coming else ""
    # On a sharded node the limit applies to each shard (docs/sharding.md).
    holder = "the cluster" if broker.shard is None else f"shard {broker.shard.index}"
    per = "" if broker.shard is None else " per shard"
    return RequestError(
        ErrorCode.TOO_MANY_GROUPS,
        f"{what}: {holder} holds {held} groups{in_flight}, and the limit is "
        f"limits.max_groups = {broker.config.limits.max_groups}{per}; delete unused groups "
        "first",
        position,
    )


def reserve_new_groups(
    broker: Broker, validated: list[validation.ValidItem], only: str | None
) -> list[GroupKey]:
    """Reserve the implicit groups a batch's new topics create; refuse the batch if
    they would take the group count past ``max_groups``. ``only``: the topic of
    every item, or None (:func:`~futureq.broker.publishing.only_topic`).

    Returns:
        The keys reserved (release them with :func:`release_groups` once the
        batch is proposed or refused); empty when every topic exists.

    Raises:
        RequestError: TOO_MANY_GROUPS with the index of the first new topic too many.
    """
    state = broker.state
    if only is not None and state.topic_groups_count(only):
        return []  # the common batch: one topic, known
    reserved = broker._groups_reserved
    limit = broker.config.limits.max_groups
    new: dict[str, int] = {}
    for position, item in enumerate(validated):
        topic = item[0]
        if topic not in new and not state.topic_groups_count(topic):
            new[topic] = position
    if not new:
        return []
    fresh = [topic for topic in new if (topic, None) not in reserved]
    # Each reserved key is at most one group: an upper bound, exact in the common case.
    room = limit - len(state.groups) - len(reserved)
    if len(fresh) > room:
        # A new topic that a name in flight already counts for adds no group: that
        # name or this batch makes it, not both (:func:`groups_coming`).
        coming_topics = {topic for topic, _ in reserved}
        adding = [topic for topic in fresh if topic not in coming_topics]
        room = limit - len(state.groups) - groups_coming(broker)
        if len(adding) > room:
            topic = adding[max(room, 0)]
            raise too_many_groups(
                broker,
                f"this batch has {len(adding)} new topics, each a new group (the first "
                f"one too many: {topic!r})",
                new[topic],
            )
    keys: list[GroupKey] = [(topic, None) for topic in new]
    reserved.update(keys)
    return keys


def reserve_group(broker: Broker, topic: str, group: str) -> tuple[Tally[Any], GroupKey] | None:
    """Reserve the group ``group`` of ``topic`` if creating it makes a new group, or
    its adoption of the topic's implicit group.

    Only the first name to commit adopts the implicit group; every other name in
    flight meanwhile makes a group of its own, so only one name per topic at a time
    is counted as adopting (a breaker's pipelined SUBSCRIBEs of 20 names per topic
    made 100 groups under a limit of 5 when each was taken for the adopter).

    Returns:
        ``(tally, key)`` to release with :func:`release_group` once proposed, or
        None when the group exists.

    Raises:
        RequestError: TOO_MANY_GROUPS.
    """
    state = broker.state
    if state.find_group(topic, group) is not None:
        return None
    key: GroupKey = (topic, group)
    groups = state.topic_groups(topic)
    if len(groups) == 1 and groups[0].implicit:
        names = broker._adopting.setdefault(topic, Tally())
        if not names or group in names and len(names) == 1:
            names[group] += 1  # released names are deleted: none is at 0
            return names, key  # adopts the implicit group: no new group
        # Another name adopts it: this one makes a group of its own.
    if key not in broker._groups_reserved:
        limit = broker.config.limits.max_groups
        if len(state.groups) + groups_coming(broker, [key]) > limit:
            raise too_many_groups(broker, f"group {group!r} of topic {topic!r} is new")
    broker._groups_reserved[key] += 1
    return broker._groups_reserved, key


def release_group(broker: Broker, reserved: tuple[Tally[Any], GroupKey]) -> None:
    tally, key = reserved
    if tally is broker._groups_reserved:
        release_groups(broker, [key])
        return
    topic, group = key
    tally[group] -= 1
    if tally[group] <= 0:
        del tally[group]
        if not tally:
            broker._adopting.pop(topic, None)


def release_groups(broker: Broker, keys: list[GroupKey]) -> None:
    reserved = broker._groups_reserved
    for key in keys:
        reserved[key] -= 1
        if reserved[key] <= 0:
            del reserved[key]
