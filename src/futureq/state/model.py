"""The in-memory pieces of the replicated state: groups, background jobs, a transaction.

Shared by :mod:`futureq.state.queue_state` (the state machine) and
:mod:`futureq.state.manage_ops` (its commands that manage scheduled messages); nothing
here reads a clock or the node's configuration.
"""

from __future__ import annotations

from typing import Final

import attrs

from futureq.state.store import Changes, StateStore

APPLY_STEP_ITEMS: Final = 128
"""Items (messages, tags, entries) handled per step of ``QueueState.apply_steps``."""
DEFAULT_GROUP: Final = "default"
DLQ_SUFFIX: Final = ".dlq"
FAMILIES: Final = ("messages", "schedule", "groups", "meta", "index")
"""The families one apply may write (``index``: secondary indexes, see
:mod:`futureq.state.manage_ops`)."""


@attrs.define
class GroupInfo:
    """A consumer group of a topic.

    Attributes:
        group_id: Assigned through the log, unique per cluster, never reused.
        topic: The topic it consumes.
        name: The group's name.
        visibility_timeout_ms: How long a delivery may stay unacked (ms).
        max_deliveries: Attempts before a message is dead-lettered (on a dead-letter
            topic: parked).
        implicit: Created for a topic that had no group; the first group that
            subscribes adopts it (renames it), so earlier messages are not lost.
        pending: Schedule entries the group still holds (items).
        dead_letter_expired: An expired message is dead-lettered (on a dead-letter
            topic: parked) instead of dropped.
    """

    group_id: int
    topic: str
    name: str
    visibility_timeout_ms: int
    max_deliveries: int
    implicit: bool
    pending: int = 0
    dead_letter_expired: bool = False

    @property
    def dead_letter_topic(self) -> str | None:
        """``<topic>.dlq``, or None for a topic that is itself a dead-letter topic."""
        return None if self.topic.endswith(DLQ_SUFFIX) else self.topic + DLQ_SUFFIX


@attrs.define
class DeletingGroup:
    """A deleted group whose schedule entries are still being purged, in bounded chunks.

    Attributes:
        group_id: The deleted group's id (never reused).
        topic: Its topic.
        name: Its name (a new group of the same name may exist meanwhile).
        pending: Schedule entries still to purge (items).
        cursor: The last schedule key purged: the next chunk starts after it, so no
            chunk walks over what earlier ones deleted (RocksDB keeps tombstones a
            while, and skipping them costs).
    """

    group_id: int
    topic: str
    name: str
    pending: int = 0
    cursor: bytes | None = None


@attrs.define
class PurgeJob:
    """A live group whose messages a PURGE is removing, by PURGE_GROUP chunks.

    Attributes:
        group_id: The group.
        bound_id: Entries of messages with a smaller id go (those pending when the
            PURGE applied); newer messages stay.
        cursor: The last schedule key looked at (None: from the start).
    """

    group_id: int
    bound_id: int
    cursor: bytes | None = None


@attrs.define
class BackfillJob:
    """A group created ``from_backlog`` that BACKFILL_GROUP chunks are filling.

    Attributes:
        group_id: The new group.
        bound_id: Messages with a smaller id (published before the group existed) are
            copied; newer ones reached it when they were published.
        sources: The topic's other groups when it was created, in id order.
        source: Index in ``sources`` of the group being read (unused when
            ``legacy_by_id``).
        cursor: The last schedule key read in that group (None: from its start); when
            ``legacy_by_id``, the last ``messages`` key (message id, 8 bytes) read.
        copied: Messages copied ahead of the chunks (by a RESCHEDULE_BACKFILLING); the
            chunks skip them, so one the group acknowledged meanwhile is not copied
            again. Unused when ``exact`` (marked in the ``index`` family instead).
        exact: Created by CREATE_GROUP_FROM_BACKLOG_AS_HELD (kind 38) or, with
            ``legacy_by_id``, CREATE_GROUP_FROM_BACKLOG (kind 37): the group gets
            exactly the messages pending at creation, once each. Kind 38: a message
            the chunks have not handled is copied ahead when a source group lets go of
            or moves its entry, and marked while the chunks must skip it, each due as
            the sources held it then (:mod:`futureq.state.manage_ops`, "BACKFILL").
        legacy_by_id: With ``exact``: a job of kind 37, as the build that wrote it
            (main up to 53ca863) stored and applied it: its chunks walk the stored
            messages by id (``cursor`` is a message id), copy each at its published
            due time, and a message is copied ahead only when a source entry of it
            goes (not when one moves). Stored without a kind, as that build stored it
            (:mod:`futureq.state.manage_ops`, "Kind 37").
        purged: When ``exact``: source group id -> bound id of the PURGE that was
            emptying it when the group was created. Its messages below that bound were
            not pending then, even once a later PURGE or the group's deletion takes
            that purge's place.
    """

    group_id: int
    bound_id: int
    sources: list[int]
    source: int = 0
    cursor: bytes | None = None
    copied: set[int] = attrs.field(factory=set)
    exact: bool = False
    purged: dict[int, int] = attrs.field(factory=dict)
    legacy_by_id: bool = False


class Txn:
    """Changes of one apply, with read-your-writes over the store."""

    __slots__ = ("changes", "store")

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.changes: Changes = {family: {} for family in FAMILIES}

    def get(self, family: str, key: bytes) -> bytes | None:
        """The value as this apply left it so far (None: absent or deleted)."""
        pending = self.changes[family]
        if key in pending:
            return pending[key]
        return self.store.get(family, key)

    def put(self, family: str, key: bytes, value: bytes | None) -> None:
        """Set (None: delete) a key when the apply is written."""
        self.changes[family][key] = value
