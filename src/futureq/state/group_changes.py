"""Applying consumer group changes: creation (explicit or implicit), deletion, purging.

Plain functions over a :class:`~futureq.state.queue_state.QueueState`, called by its
``apply_steps`` and by :mod:`~futureq.state.publish`: a new group's id and record in the
``groups`` family, CREATE_GROUP and DELETE_GROUP, the PURGE_GROUP chunks that remove a
deleted group's entries, and forgetting a deleted group once none are left.

Source: ``DESIGN.md``, "Storage layout"; ``docs/protocol.md`` (GROUP_CREATE, GROUP_DELETE).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from futureq.state import commands
from futureq.state.commands import CommandKind
from futureq.state.layout import (
    _DELETING,
    _NEXT_GROUP,
    _PENDING,
    _pack,
)
from futureq.state.model import (
    APPLY_STEP_ITEMS,
    DeletingGroup,
    GroupInfo,
    Txn,
)

if TYPE_CHECKING:
    from futureq.state.queue_state import QueueState


def new_group(
    state: QueueState,
    txn: Txn,
    topic: str,
    name: str,
    visibility_timeout_ms: int,
    max_deliveries: int,
    implicit: bool,
    effects: list[tuple[Any, ...]],
    dead_letter_expired: bool = False,
) -> GroupInfo:
    gid = state._next_group_id
    state._next_group_id += 1
    txn.put("meta", _NEXT_GROUP, state._next_group_id.to_bytes(8, "big"))
    info = GroupInfo(
        gid,
        topic,
        name,
        visibility_timeout_ms,
        max_deliveries,
        implicit,
        dead_letter_expired=dead_letter_expired,
    )
    store_group(state, txn, info)
    state.groups[gid] = info
    state._by_topic.setdefault(topic, {})[name] = gid
    effects.append(("g", gid))
    return info


def group_key(topic: str, name: str) -> bytes:
    return f"{topic}\x00{name}".encode()


def store_group(state: QueueState, txn: Txn, info: GroupInfo) -> None:
    value: list[Any] = [
        info.group_id,
        info.visibility_timeout_ms,
        info.max_deliveries,
        info.implicit,
    ]
    if info.dead_letter_expired:
        value.append(True)
    txn.put("groups", group_key(info.topic, info.name), _pack(value))


def create_group(
    state: QueueState,
    txn: Txn,
    index: int,
    topic: str,
    name: str,
    visibility_timeout_ms: int | None,
    max_deliveries: int | None,
    settings: commands.GroupSettings,
    dead_letter_expired: bool | None,
    from_backlog: bool,
    effects: list[tuple[Any, ...]],
    *,
    exact_backfill: bool = False,
    legacy_by_id: bool = False,
) -> int:
    """Create, adopt or update a group.

    A None field keeps the value of an existing (or adopted implicit) group; a
    new group takes it from ``settings``, the defaults the leader resolved. A new
    group ``from_backlog`` starts a backfill job (:meth:`_start_backfill`; with
    ``exact_backfill``, CREATE_GROUP_FROM_BACKLOG_AS_HELD, one for exactly the
    messages pending at creation; with ``legacy_by_id`` too, kind 37's job, as the
    build that wrote it applied it).
    """
    existing = state.find_group(topic, name)
    if existing is None:
        groups = state.topic_groups(topic)
        if len(groups) == 1 and groups[0].implicit:
            # Adopt the implicit group: it holds what was published before any
            # consumer existed (DESIGN.md, "a message published before any
            # consumer ever connected is not lost").
            existing = groups[0]
            txn.put("groups", group_key(topic, existing.name), None)
            del state._by_topic[topic][existing.name]
            existing.name = name
            state._by_topic[topic][name] = existing.group_id
        else:
            info = new_group(
                state,
                txn,
                topic,
                name,
                settings.visibility_timeout_ms
                if visibility_timeout_ms is None
                else visibility_timeout_ms,
                settings.max_deliveries if max_deliveries is None else max_deliveries,
                False,
                effects,
                settings.dead_letter_expired
                if dead_letter_expired is None
                else dead_letter_expired,
            )
            if from_backlog and groups:
                state._start_backfill(
                    txn, index, info, groups, exact=exact_backfill, legacy_by_id=legacy_by_id
                )
            return info.group_id
    existing.implicit = False
    if visibility_timeout_ms is not None:
        existing.visibility_timeout_ms = visibility_timeout_ms
    if max_deliveries is not None:
        existing.max_deliveries = max_deliveries
    if dead_letter_expired is not None:
        existing.dead_letter_expired = dead_letter_expired
    store_group(state, txn, existing)
    effects.append(("g", existing.group_id))
    return existing.group_id


def delete_group(
    state: QueueState,
    txn: Txn,
    topic: str,
    name: str,
    effects: list[tuple[Any, ...]],
    touched: set[int],
) -> bool:
    """Delete a group at once; its schedule entries go later, by PURGE_GROUP chunks.

    The group disappears from :attr:`groups` (no delivery, no new entries, its name
    free for a new group); it waits in :attr:`deleting` until purged, so one
    command never has to remove an unbounded number of entries. A purge or
    backfill of it in progress ends.
    """
    info = state.find_group(topic, name)
    if info is None:
        return False
    gid = info.group_id
    txn.put("groups", group_key(topic, name), None)
    del state.groups[gid]
    del state._by_topic[topic][name]
    if not state._by_topic[topic]:
        del state._by_topic[topic]
    state.total_pending -= info.pending
    state._end_jobs(txn, gid)
    if info.pending > 0:
        state.deleting[gid] = DeletingGroup(gid, topic, name, info.pending)
        txn.put("meta", _DELETING + gid.to_bytes(4, "big"), _pack([topic, name, None]))
    else:
        txn.put("meta", _PENDING + gid.to_bytes(4, "big"), None)
        touched.discard(gid)
    effects.append(("g", gid))
    return True


def purge_group(
    state: QueueState,
    txn: Txn,
    gid: int,
    max_entries: int,
    effects: list[tuple[Any, ...]],
    touched: set[int],
) -> Generator[None, None, int]:
    """Remove up to ``max_entries`` (capped) schedule entries of a deleted group.

    The entries are the group's first in key order after the replicated cursor,
    the same on every replica (a deleted group's entries only ever move later: a
    NACK applied after the delete reschedules at or after the entry's due time).
    Once none is left the group is forgotten.
    """
    deleting = state.deleting.get(gid)
    if deleting is None:
        return 0
    limit = max(1, min(max_entries, commands.MAX_PURGE_ENTRIES))
    cursor = deleting.cursor
    start = gid.to_bytes(4, "big") if cursor is None else cursor + b"\x00"
    stop = (gid + 1).to_bytes(4, "big")
    done = 0
    last: bytes | None = None
    for position, (key, value) in enumerate(state.store.scan("schedule", start, stop)):
        if done >= limit:
            break
        if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
            yield
        dropped = state._drop_entry(txn, key, CommandKind.PURGE_GROUP, effects, touched, value)
        if dropped is not None:
            done += 1
            last = key
    if last is not None and deleting.pending > 0:
        deleting.cursor = last
        txn.put(
            "meta",
            _DELETING + gid.to_bytes(4, "big"),
            _pack([deleting.topic, deleting.name, last]),
        )
    if done < limit and deleting.pending > 0:
        # Nothing on disk, whatever the count says: the group is gone for good.
        deleting.pending = 0
        touched.add(gid)
    return done


def forget_deleted(state: QueueState, txn: Txn, gid: int, effects: list[tuple[Any, ...]]) -> None:
    """A deleted group has no entry left: forget it for good."""
    del state.deleting[gid]
    txn.put("meta", _DELETING + gid.to_bytes(4, "big"), None)
    txn.put("meta", _PENDING + gid.to_bytes(4, "big"), None)
    effects.append(("g", gid))
