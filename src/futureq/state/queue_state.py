"""QueueState: the deterministic state machine of FutureQ.

``apply(index, command)`` is called on every replica with the same commands in the same
order and leaves every replica in the same state. It never reads a clock, never draws
random numbers, never reads the node's configuration or environment (``DESIGN.md``,
"Apply reads nothing node-local": group defaults arrive resolved in the command), and
touches storage only through :class:`~futureq.state.store.StateStore`.

Families written (``DESIGN.md``, "Storage layout"):

* ``messages``: message id (8 bytes BE) -> ``[topic, payload, publish_ms, due_ms, open]``
  (then headers and TTL when it has them: :class:`~futureq.state.records.MessageRecord`)
  where ``open`` counts the group entries still scheduled;
* ``schedule``: ``group_id | due_ms | message_id`` (20 bytes BE) -> ``[attempt, expire_ms]``
  or longer (:class:`~futureq.state.records.EntryValue`). ``attempt`` is the number of
  the last delivery recorded (a redelivery's by DELIVERED before it is pushed, so it
  never goes backwards; NACK and RELEASE record theirs); ``released`` counts deliveries
  given back unprocessed (RELEASE), which do not count towards ``max_deliveries``, the
  last of them ``released_attempt``; then the first and last delivery times and the
  last NACK's reason, as far as the log knows. Keyed by group first so each group reads
  its own due order with one range scan (a group with no consumer keeps its backlog on
  disk);
* ``groups``: ``topic \\x00 group`` (UTF-8) -> ``[group_id, visibility_timeout_ms,
  max_deliveries, implicit]`` (then ``dead_letter_expired`` when true);
* ``meta``: applied index, applied digest, next group id, largest publish stamp,
  pending count per group, ``deleting:<group id>`` -> ``[topic, group, cursor]`` for a
  deleted group whose schedule entries PURGE_GROUP commands are still removing,
  ``purging:<group id>`` and ``backfill:<group id>`` for the background jobs of
  PURGE and CREATE_GROUP ``from_backlog`` (:mod:`futureq.state.manage_ops`);
* ``index``: secondary indexes of :mod:`futureq.state.manage_ops` (where an entry
  moved, idempotency keys, messages copied ahead by a backfill).

Every apply writes its changes and the new applied index in one batch, so a restart
replays exactly the log entries after it. The applied digest chains a CRC-32 over each
apply's index and the exact changes it wrote, so replicas whose states diverge (not
only their logs) show different digests.

This module holds the state, its reads, the apply loop that dispatches each command,
the write and the snapshots; the commands' rules are plain functions over the state:
:mod:`~futureq.state.publish` (PUBLISH), :mod:`~futureq.state.deliveries` (DELIVERED,
ACK, NACK, RELEASE, EXPIRE, DEAD_LETTER), :mod:`~futureq.state.group_changes` (group
creation, deletion, purging) and, still as a base class, :mod:`~futureq.state.manage_ops`
(CANCEL, RESCHEDULE, PURGE, REDRIVE, backfill). Keys and encodings they share are in
:mod:`~futureq.state.layout`.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Generator, Iterator, Sequence
from itertools import groupby
from typing import Any, Protocol

import attrs
from sortedcontainers import SortedDict

from futureq.errors import NoSpaceError, StorageError
from futureq.state import commands, deliveries, group_changes, publish, records, snapshot
from futureq.state.commands import CommandKind
from futureq.state.layout import (
    _APPLIED,
    _DELETING,
    _DIGEST,
    _KIND,
    _LAST_PUBLISH,
    _NEXT_GROUP,
    _NODE,
    _PENDING,
    _arg,
    _encode,
    _pack,
    _u64,
    _unpack,
)
from futureq.state.manage_ops import (
    BACKFILL_PREFIX,
    KEY_TIME,
    PURGING_PREFIX,
    ManageOps,
    command_stamp,
    moved_key,
)
from futureq.state.model import (
    APPLY_STEP_ITEMS,
    DEFAULT_GROUP,
    DLQ_SUFFIX,
    BackfillJob,
    DeletingGroup,
    GroupInfo,
    PurgeJob,
    Txn,
)
from futureq.state.records import EntryValue, MessageRecord
from futureq.state.snapshot import SnapshotSource
from futureq.state.store import Changes, SnapshotStore, StateStore

__all__ = [
    "APPLY_STEP_ITEMS",
    "DEFAULT_GROUP",
    "DLQ_SUFFIX",
    "DeletingGroup",
    "GroupInfo",
    "PublishResult",
    "QueueState",
    "ScheduleObserver",
]


@attrs.frozen
class PublishResult:
    """What a PUBLISH with idempotency keys returns when some items were duplicates.

    Attributes:
        first_id: The id item 0 has (or would have had): item ``i`` stored has id
            ``first_id + i``.
        duplicates: Position in the batch -> the id of the message stored earlier
            with the same idempotency key; nothing was stored for these positions.
    """

    first_id: int
    duplicates: dict[int, int]


class ScheduleObserver(Protocol):
    """Told of schedule changes after they are written (the dispatcher's due-index).

    Notifications of one command may be spread over several steps of
    :meth:`QueueState.apply_steps`, so an observer that reads the store in between may
    find an entry before it is told of it: ``on_scheduled`` must ignore an entry it
    already holds.
    """

    def on_scheduled(
        self,
        group_id: int,
        due_ms: int,
        mid: int,
        expire_ms: int | None,
        attempt: int,
        released: int = 0,
    ) -> None:
        """A schedule entry was added (``attempt``: last delivery number recorded)."""
        ...

    def on_scheduled_batch(self, entries: Sequence[tuple[Any, ...]]) -> None:
        """Schedule entries were added, in this order, with no removal between them:
        each ``("s", group_id, due_ms, mid, expire_ms, attempt)``, with ``released``
        appended when above zero. Must leave the observer as :meth:`on_scheduled` for
        each entry in turn would (a PUBLISH of 100 items makes one call, not 100)."""
        ...

    def on_unscheduled(
        self,
        group_id: int,
        due_ms: int,
        mid: int,
        reason: CommandKind,
        held: tuple[int, int] | None = None,
    ) -> None:
        """A schedule entry was removed by ACK, NACK, EXPIRE, DEAD_LETTER, RELEASE,
        PURGE_GROUP, CANCEL, RESCHEDULE or REDRIVE (NACK, RELEASE and RESCHEDULE
        schedule it again at once). ``held``: ``(stamp, until_ms)`` when the removed
        or moved entry was held for a delivery a leader handing over left out
        (:meth:`EntryValue.held <futureq.state.records.EntryValue.held>`; whether
        ``until_ms`` has passed is the observer's question), else None."""
        ...

    def on_group_changed(self, group_id: int) -> None:
        """One group was created, adopted, updated, deleted or purged (look it up in
        ``groups``; a deleted one may still be in ``deleting``), or a background job
        of it started or ended (``purging``, ``backfilling``).

        Called once per group a command touches, so that work per new group stays
        O(1) however many groups exist (issue 10, "New topics cost O(log n)").
        """
        ...

    def on_groups_changed(self) -> None:
        """Every group may have changed (a snapshot replaced the state)."""
        ...


@attrs.define
class _Unwritten:
    """One applied command whose write is pending (a retry after a full disk)."""

    index: int
    data: bytes
    changes: Changes
    effects: list[tuple[Any, ...]]
    result: Any
    digest: int


class QueueState(ManageOps):
    """The replicated queue state over a :class:`StateStore`.

    Args:
        store: Where the state lives (RocksDB, or memory in simulations). Nothing
            else: group defaults come resolved in the commands.

    Source: ``DESIGN.md``, "Message semantics" and "Storage layout".
    """

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.observer: ScheduleObserver | None = None
        self.on_nodes_changed: Callable[[], None] | None = None
        self.node_addresses: dict[int, tuple[str, str]] = {}
        """node id -> (raft address, client address), replicated through NODE_ADDRESS."""
        self.groups: dict[int, GroupInfo] = {}
        self.deleting: dict[int, DeletingGroup] = {}
        """Deleted groups whose entries PURGE_GROUP commands are still removing."""
        self.purging: dict[int, PurgeJob] = {}
        """Live groups a PURGE is emptying, by PURGE_GROUP chunks."""
        self.backfilling: dict[int, BackfillJob] = {}
        """Groups created ``from_backlog`` that BACKFILL_GROUP chunks are filling."""
        self._by_topic: SortedDict = SortedDict()
        """topic -> {group name -> group id}, in topic name order."""
        self.total_pending = 0
        """Sum of ``pending`` over every group (items), kept as groups change."""
        self.applied_index = 0
        self.applied_digest = 0
        """CRC-32 chained over every applied entry's index and the changes its apply
        wrote: replicas at the same applied index have the same digest unless their
        states diverged (a state machine safety check)."""
        self._next_group_id = 1
        self.last_publish_ms = 0
        self._unwritten: _Unwritten | None = None
        self.notifying = False
        """True while the observer is being told of the last applied command's changes
        (between steps of :meth:`apply_steps`): the store is then ahead of what the
        observer has been told. A reader that keeps a derived view in step with the
        observer (``futureq.broker.due_counts``) reads the store only while it is False.
        Node-local; apply never reads it."""
        self._load()

    def _load(self) -> None:
        """Read the in-memory indexes (groups, pending counts, node addresses, jobs)."""
        store = self.store
        self._unwritten = None
        self.key_time_floor = KEY_TIME  # the store may be another (a snapshot's)
        snapshot.check_not_restoring(store)
        self.groups.clear()
        self.deleting.clear()
        self.purging.clear()
        self.backfilling.clear()
        self._by_topic.clear()
        self.node_addresses.clear()
        self.total_pending = 0
        meta = store.get("meta", _APPLIED)
        self.applied_index = 0 if meta is None else int.from_bytes(meta, "big")
        found = store.get("meta", _DIGEST)
        self.applied_digest = 0 if found is None else int.from_bytes(found, "big")
        found = store.get("meta", _NEXT_GROUP)
        self._next_group_id = 1 if found is None else int.from_bytes(found, "big")
        found = store.get("meta", _LAST_PUBLISH)
        self.last_publish_ms = 0 if found is None else int.from_bytes(found, "big")
        for key, value in store.scan("meta", _NODE, _NODE + b"\xff"):
            raft_address, client_address = _unpack(value)
            self.node_addresses[int.from_bytes(key[len(_NODE) :], "big")] = (
                raft_address,
                client_address,
            )
        for key, value in store.scan("groups", b""):
            topic, _, name = key.decode("utf-8").partition("\x00")
            fields = _unpack(value)
            gid, visibility, max_deliveries, implicit = fields[:4]
            pending = store.get("meta", _PENDING + gid.to_bytes(4, "big"))
            info = GroupInfo(gid, topic, name, visibility, max_deliveries, implicit)
            info.dead_letter_expired = bool(fields[4]) if len(fields) > 4 else False
            info.pending = 0 if pending is None else int.from_bytes(pending, "big")
            self.total_pending += info.pending
            self.groups[gid] = info
            self._by_topic.setdefault(topic, {})[name] = gid
        for key, value in store.scan("meta", _DELETING, _DELETING + b"\xff"):
            gid = int.from_bytes(key[len(_DELETING) :], "big")
            topic, name, cursor = _unpack(value)
            pending = store.get("meta", _PENDING + gid.to_bytes(4, "big"))
            count = 0 if pending is None else int.from_bytes(pending, "big")
            self.deleting[gid] = DeletingGroup(gid, topic, name, count, cursor)
        for key, value in store.scan("meta", PURGING_PREFIX, PURGING_PREFIX + b"\xff"):
            gid = int.from_bytes(key[len(PURGING_PREFIX) :], "big")
            bound_id, cursor = _unpack(value)
            self.purging[gid] = PurgeJob(gid, bound_id, cursor)
        for key, value in store.scan("meta", BACKFILL_PREFIX, BACKFILL_PREFIX + b"\xff"):
            gid = int.from_bytes(key[len(BACKFILL_PREFIX) :], "big")
            bound_id, sources, source, cursor, *rest = _unpack(value)
            exact = len(rest) > 1 and rest[1] is True
            listed = rest[0] if rest else []
            # An exact job stored without its kind is kind 37's, as the build that
            # wrote kind 37 stored it (message-id cursor); kind 38 stores its kind.
            job_kind = rest[2] if exact and len(rest) > 2 else None
            if job_kind not in (None, CommandKind.CREATE_GROUP_FROM_BACKLOG_AS_HELD):
                raise StorageError(
                    f"the backfill job of group {gid} was stored by command kind "
                    f"{job_kind!r}, which this build does not know: run a build that "
                    "wrote it"
                )
            self.backfilling[gid] = BackfillJob(
                gid,
                bound_id,
                sources,
                source,
                cursor,
                set() if exact else set(listed),
                exact,
                {pair[0]: pair[1] for pair in listed} if exact else {},
                legacy_by_id=exact and job_kind is None,
            )

    # ------------------------------------------------------------------ reads

    def topic_groups(self, topic: str) -> list[GroupInfo]:
        """The groups of a topic, in creation order."""
        return [self.groups[gid] for gid in sorted(self._by_topic.get(topic, {}).values())]

    def topic_groups_count(self, topic: str) -> int:
        """How many groups ``topic`` has (0: the topic is unknown). O(log n)."""
        return len(self._by_topic.get(topic, ()))

    def find_group(self, topic: str, name: str) -> GroupInfo | None:
        """The group ``name`` of ``topic``, or None."""
        gid = self._by_topic.get(topic, {}).get(name)
        return None if gid is None else self.groups[gid]

    def topics(self) -> list[str]:
        """Every topic that has a group, sorted."""
        return list(self._by_topic)

    def iter_topics(self, after: str | None = None) -> Iterator[str]:
        """Topics that have a group, in name order, lazily (take what you need).

        Args:
            after: Start after this topic (None: from the first). Do not keep the
                iterator across applies: take a few, then ask again with ``after``.
        """
        if after is None:
            return iter(self._by_topic)
        return iter(self._by_topic.irange(minimum=after, inclusive=(False, True)))

    def topic_count(self) -> int:
        """How many topics have a group."""
        return len(self._by_topic)

    def get_message(self, mid: int) -> tuple[str, bytes, int, int, int] | None:
        """``(topic, payload, publish_ms, due_ms, open)`` of a stored message, or None."""
        data = self.store.get("messages", _u64(mid))
        if data is None:
            return None
        value = _unpack(data)
        return value[0], value[1], value[2], value[3], value[4]

    def get_record(self, mid: int) -> MessageRecord | None:
        """The stored message ``mid`` (headers and TTL included), or None."""
        data = self.store.get("messages", _u64(mid))
        return None if data is None else MessageRecord.decode(data)

    def get_schedule(self, key: bytes) -> tuple[int, int | None] | None:
        """``(attempt, expire_ms)`` of a schedule entry, or None when it is gone."""
        found = self.get_schedule_entry(key)
        return None if found is None else (found[0], found[1])

    def get_schedule_entry(self, key: bytes) -> tuple[int, int | None, int] | None:
        """``(attempt, expire_ms, released)`` of a schedule entry, or None when it is gone."""
        data = self.store.get("schedule", key)
        if data is None:
            return None
        entry = EntryValue.decode(data)
        return entry.attempt, entry.expire_ms, entry.released

    def get_entry(self, key: bytes) -> EntryValue | None:
        """The whole value of a schedule entry, or None when it is gone."""
        data = self.store.get("schedule", key)
        return None if data is None else EntryValue.decode(data)

    def purged_below(self, group_id: int) -> int:
        """Message ids below this one are gone from group ``group_id``: a PURGE that
        applied removes their entries by PURGE_GROUP chunks, and leader-side readers
        (the dispatcher, BROWSE, CANCEL, REDRIVE, counts, STATUS) treat those its
        chunks have not reached yet as removed already; 0 when no purge of the group
        runs. Applying commands never asks this (old and new builds apply alike)."""
        job = self.purging.get(group_id)
        return 0 if job is None else job.bound_id

    def entry_key(self, mid: int, group_id: int) -> bytes | None:
        """The schedule key of message ``mid`` in group ``group_id``, or None when the
        group does not hold it. O(log n): two or three point reads."""
        data = self.store.get("messages", _u64(mid))
        if data is None:
            return None
        moved = self.store.get("index", moved_key(mid, group_id))
        due_ms = int.from_bytes(moved, "big") if moved is not None else _unpack(data)[3]
        key = commands.schedule_key(group_id, due_ms, mid)
        return key if self.store.get("schedule", key) is not None else None

    def scan_schedule(
        self, group_id: int, start_due_ms: int, start_mid: int, limit: int
    ) -> Iterator[tuple[int, int, int, int | None]]:
        """Up to ``limit`` entries of one group from ``(start_due_ms, start_mid)`` on.

        Yields:
            ``(due_ms, message_id, attempt, expire_ms)`` in due order.
        """
        for due_ms, mid, attempt, expire_ms, _, _ in self.scan_schedule_entries(
            group_id, start_due_ms, start_mid, limit
        ):
            yield due_ms, mid, attempt, expire_ms

    def scan_schedule_entries(
        self, group_id: int, start_due_ms: int, start_mid: int, limit: int
    ) -> Iterator[tuple[int, int, int, int | None, int, tuple[int, int] | None]]:
        """As :meth:`scan_schedule`, with each entry's ``released`` count and hold.

        Yields:
            ``(due_ms, message_id, attempt, expire_ms, released, held)`` in due order;
            ``held``: ``(stamp, until_ms)`` of the delivery a leader handing over left
            out (HANDED_OUT, :meth:`EntryValue.held`), else None.
        """
        start = commands.schedule_key(group_id, start_due_ms, start_mid)
        stop = (group_id + 1).to_bytes(4, "big")
        for count, (key, value) in enumerate(self.store.scan("schedule", start, stop)):
            if count >= limit:
                return
            _, due_ms, mid = commands.parse_schedule_key(key)
            entry = _unpack(value)
            held = EntryValue.held_in(entry)
            yield due_ms, mid, entry[0], entry[1], entry[2] if len(entry) > 2 else 0, held

    # ------------------------------------------------------------------ apply

    def apply(self, index: int, data: bytes, command: list[Any] | None = None) -> Any:
        """Apply the command at log ``index`` in one go.

        Args:
            index: Log index; must be exactly ``applied_index + 1``.
            data: The command's msgpack bytes (:mod:`futureq.state.commands`).
            command: ``data`` already decoded, as :meth:`apply_steps` takes it (None:
                decode ``data``).

        Returns:
            PUBLISH: the first message id, or a :class:`PublishResult` when items with
            idempotency keys were duplicates; DEAD_LETTER: the first message id; ACK,
            ACK_FOLLOWING, NACK, NACK_FOLLOWING, EXPIRE, DELIVERED, RELEASE,
            RELEASE_FOLLOWING, RETURN_COUNTED, HANDED_OUT, PURGE_GROUP,
            BACKFILL_GROUP: how many entries were handled; PURGE: how many entries the groups held;
            CREATE_GROUP: the group id; DELETE_GROUP: True if it existed; CANCEL,
            RESCHEDULE, REDRIVE: one :class:`~futureq.state.commands.ItemStatus` per
            item; NOOP: None.

        Raises:
            StorageError: from the store; the node must stop.
        """
        steps = self.apply_steps(index, data, command)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def apply_steps(
        self, index: int, data: bytes, command: list[Any] | None = None
    ) -> Generator[None, None, Any]:
        """Apply the command at log ``index`` in bounded steps (a generator).

        Each ``next()`` does at most about :data:`APPLY_STEP_ITEMS` items of work, so
        an adapter can yield to its event loop between steps and a 10,000-item batch
        never holds the loop for long (``DESIGN.md``, "no request holds the event
        loop"). Nothing is written and no observer is called before the last step; the
        generator's return value is :meth:`apply`'s result. Between two steps the
        caller must not apply, restore or snapshot-restore anything else; reads are
        fine (they may see groups the command is creating).

        Args and Raises: as :meth:`apply`; ``command``: ``data`` already decoded, by the
        proposer that built it (:func:`~futureq.state.commands.publish_command`), so it is
        not decoded again; it must be what encoding gave ``data`` (tuples may stand for
        lists). None: ``data`` is decoded.
        """
        assert index == self.applied_index + 1, (index, self.applied_index)
        unwritten = self._unwritten
        if unwritten is not None:
            # A retry after a full disk: the changes were made in memory already.
            assert unwritten.index == index and unwritten.data == data, "retry of another entry"
            return (yield from self._write_and_notify(unwritten))
        if command is None:
            command = commands.decode(data)
        kind = command[0]
        txn = Txn(self.store)
        effects: list[tuple[Any, ...]] = []
        touched: set[int] = set()
        result: Any = None
        if self.backfilling:
            # The leader's stamp when the command carries one, even below an earlier
            # publish stamp: one far ahead was made on a wrong clock and left behind
            # (broker.publishing.stamp), and taken as "now" it expired a live backlog.
            # A stamp at most the bound behind copies a message that may just have
            # expired, which the dispatcher then expires: never a loss.
            self.backfill_now_ms = command_stamp(command) or self.last_publish_ms
        if kind == CommandKind.PUBLISH:
            settings = commands.GroupSettings.from_wire(_arg(command, 3))
            duplicates: dict[int, int] = {}
            result = yield from publish.publish(
                self,
                txn,
                index,
                command[1],
                command[2],
                effects,
                touched,
                settings,
                _arg(command, 4, 0),
                duplicates,
            )
            if duplicates:
                result = PublishResult(result, duplicates)
        elif kind == CommandKind.DELIVERED:
            result = yield from deliveries.delivered(self, txn, command[1], _arg(command, 2))
        elif kind == CommandKind.RELEASE or kind == CommandKind.RELEASE_FOLLOWING:
            result = yield from deliveries.release(
                self, txn, command[1], effects, following=kind == CommandKind.RELEASE_FOLLOWING
            )
        elif kind == CommandKind.RETURN_COUNTED:
            result = yield from deliveries.return_counted(self, txn, command[1])
        elif kind == CommandKind.HANDED_OUT:
            result = yield from deliveries.handed_out(self, txn, command[1])
        elif kind == CommandKind.ACK or kind == CommandKind.ACK_FOLLOWING:
            result = yield from deliveries.remove(
                self,
                txn,
                command[1],
                CommandKind.ACK,
                effects,
                touched,
                following=kind == CommandKind.ACK_FOLLOWING,
            )
        elif kind == CommandKind.EXPIRE or kind == CommandKind.EXPIRE_COUNTED:
            result = yield from deliveries.expire(
                self,
                txn,
                index,
                command[1],
                _arg(command, 2),
                commands.GroupSettings.from_wire(_arg(command, 3)),
                effects,
                touched,
                _arg(command, 4),
            )
        elif kind == CommandKind.NACK or kind == CommandKind.NACK_FOLLOWING:
            result = yield from deliveries.nack(self, txn, index, command, effects, touched)
        elif kind == CommandKind.DEAD_LETTER_PROVENANCE:
            settings = commands.GroupSettings.from_wire(_arg(command, 3))
            result = yield from deliveries.dead_letter(
                self, txn, index, command[1], command[2], effects, touched, settings
            )
        elif kind == CommandKind.DEAD_LETTER:
            settings = commands.GroupSettings.from_wire(_arg(command, 3))
            result = yield from deliveries.dead_letter_before_provenance(
                self, txn, index, command[1], command[2], effects, touched, settings
            )
        elif kind in (
            CommandKind.CREATE_GROUP,
            CommandKind.CREATE_GROUP_FROM_BACKLOG,
            CommandKind.CREATE_GROUP_FROM_BACKLOG_AS_HELD,
        ):
            settings = commands.GroupSettings.from_wire(_arg(command, 5))
            exact = kind != CommandKind.CREATE_GROUP
            result = group_changes.create_group(
                self,
                txn,
                index,
                command[1],
                command[2],
                command[3],
                command[4],
                settings,
                _arg(command, 6),
                exact or bool(_arg(command, 7, False)),
                effects,
                exact_backfill=exact,
                legacy_by_id=kind == CommandKind.CREATE_GROUP_FROM_BACKLOG,
            )
        elif kind == CommandKind.DELETE_GROUP:
            result = group_changes.delete_group(self, txn, command[1], command[2], effects, touched)
        elif kind == CommandKind.PURGE_GROUP:
            if command[1] in self.deleting:
                result = yield from group_changes.purge_group(
                    self, txn, command[1], command[2], effects, touched
                )
            else:
                result = yield from self._purge_chunk(txn, command[1], command[2], effects, touched)
        elif kind == CommandKind.NODE_ADDRESS:
            self._node_address(txn, command[1], command[2], command[3], effects)
        elif kind == CommandKind.CANCEL:
            result = yield from self._cancel(
                txn, command[1], command[2], command[3], effects, touched, _arg(command, 4)
            )
        elif kind == CommandKind.RESCHEDULE_COUNTED or kind == CommandKind.RESCHEDULE_BACKFILLING:
            result = yield from self._reschedule(
                txn,
                command[2],
                command[3],
                command[4],
                command[5],
                effects,
                touched,
                command[6],
                backfill_first=kind == CommandKind.RESCHEDULE_BACKFILLING,
            )
        elif kind == CommandKind.RESCHEDULE:
            # As builds before RESCHEDULE_COUNTED applied it (an old log replays alike).
            result = yield from self._reschedule(
                txn, command[2], command[3], command[4], command[5], effects, touched
            )
        elif kind == CommandKind.PURGE:
            result = self._purge(txn, index, command[1], effects)
        elif kind == CommandKind.BACKFILL_GROUP:
            result = yield from self._backfill_chunk(txn, command[1], command[2], effects, touched)
        elif kind == CommandKind.REDRIVE:
            result = yield from self._redrive(
                txn, index, command[1], command[2], command[3], command[4], effects, touched
            )
        else:
            assert kind == CommandKind.NOOP, f"unknown command kind {kind}"
        for gid in sorted(touched):
            deleting = self.deleting.get(gid)
            if deleting is not None and deleting.pending <= 0:
                # Its last entries went by another command (an EXPIRE or ACK that was
                # proposed before the delete): nothing is left to purge.
                group_changes.forget_deleted(self, txn, gid, effects)
                touched.discard(gid)
        meta = txn.changes["meta"]
        for gid in sorted(touched):
            info = self.groups.get(gid)
            pending = info.pending if info is not None else None
            if info is None and gid in self.deleting:
                pending = self.deleting[gid].pending
            if pending is not None:
                meta[_PENDING + gid.to_bytes(4, "big")] = _u64(pending)
        meta[_APPLIED] = _u64(index)
        # The digest covers what this apply wrote, not only the command: two replicas
        # that resolve the same command differently (a node-local default, a bug) show
        # different digests at the same index.
        changes = txn.changes
        if not changes["index"]:
            del changes["index"]  # so commands that never touch it digest as before
        digest = zlib.crc32(_encode(changes), zlib.crc32(_u64(index), self.applied_digest))
        meta[_DIGEST] = digest.to_bytes(4, "big")
        return (
            yield from self._write_and_notify(
                _Unwritten(index, data, changes, effects, result, digest)
            )
        )

    def _write_and_notify(self, done: _Unwritten) -> Generator[None, None, Any]:
        """Write one command's changes, then tell the observer.

        When the disk is full the changes are kept (they are already made in memory)
        and the error raised; the caller retries :meth:`apply_steps` with the same
        entry once there is room, and only the write is done again.
        """
        try:
            self.store.write(done.changes)
        except NoSpaceError:
            self._unwritten = done
            raise
        self._unwritten = None
        self.applied_index = done.index
        self.applied_digest = done.digest
        effects = done.effects
        result = done.result
        observer = self.observer
        if observer is not None:
            # In steps too: observers may see the store ahead of their notifications
            # (ScheduleObserver says they must cope), never behind. Each run of
            # consecutive additions is one call (the order of additions and removals
            # is kept: a NACK removes an entry, then schedules it again).
            on_scheduled_batch = observer.on_scheduled_batch
            self.notifying = True
            try:
                for start in range(0, len(effects), APPLY_STEP_ITEMS):
                    if start:
                        yield
                    for kind, run in groupby(effects[start : start + APPLY_STEP_ITEMS], _KIND):
                        if kind == "s":
                            on_scheduled_batch(list(run))
                        elif kind == "u":
                            for effect in run:
                                observer.on_unscheduled(*effect[1:])
                        elif kind == "g":
                            for effect in run:
                                observer.on_group_changed(effect[1])
            finally:
                self.notifying = False
        if self.on_nodes_changed is not None and any(effect[0] == "n" for effect in effects):
            self.on_nodes_changed()
        return result

    def apply_other(self, index: int) -> None:
        """Apply a log entry that is not a command (a Raft NOOP or CONFIG_CHANGE entry).

        Only advances the applied index, written in its own batch like :meth:`apply`,
        so a restart does not replay the entry.

        Args:
            index: Log index; must be exactly ``applied_index + 1``.

        Raises:
            StorageError: from the store; the node must stop.
        """
        assert index == self.applied_index + 1, (index, self.applied_index)
        digest = zlib.crc32(_u64(index), self.applied_digest)
        self.store.write({"meta": {_APPLIED: _u64(index), _DIGEST: digest.to_bytes(4, "big")}})
        self.applied_index = index
        self.applied_digest = digest

    # ------------------------------------------------------------------ snapshots

    def _snapshot_store(self) -> SnapshotStore:
        store = self.store
        if not isinstance(store, SnapshotStore):
            raise TypeError(f"{type(store).__name__} cannot take or restore snapshots")
        return store

    def snapshot_source(self) -> SnapshotSource:
        """A point-in-time view of the state at :attr:`applied_index`, to serialize.

        Cheap and synchronous: call it on the event loop, between applies. The
        source's ``serialize()`` reads only that view (it may run in a worker thread
        while applies go on); ``close()`` it when done.

        Raises:
            TypeError: the store cannot take snapshots.
            StorageError: the store is closed.

        Source: Raft paper §7 (log compaction); format in :mod:`futureq.state.snapshot`.
        """
        view = self._snapshot_store().snapshot_view(snapshot.FAMILIES)
        return SnapshotSource(view, self.applied_index)

    def restore(self, data: bytes, index: int) -> None:
        """Replace the whole state with a snapshot's and set the applied index to ``index``.

        The snapshot is checked before anything is written; then the state families
        are replaced (crash-safe: :func:`futureq.state.snapshot.restore_into`), the
        in-memory indexes are rebuilt, and the observer is told the groups changed
        (the dispatcher reloads from disk) and ``on_nodes_changed`` is called.

        Args:
            data: Bytes from :meth:`SnapshotSource.serialize`.
            index: The log index the snapshot covers (its recorded index).

        Raises:
            CorruptSnapshotError: (a StorageError) ``data`` is not a valid snapshot;
                the state is unchanged.
            StorageError: the store failed mid-way; the node must stop.
            TypeError: the store cannot restore snapshots.
        """
        snapshot.restore_into(self._snapshot_store(), data, index)
        self._load()
        assert self.applied_index == index, (self.applied_index, index)
        if self.observer is not None:
            self.observer.on_groups_changed()
        if self.on_nodes_changed is not None:
            self.on_nodes_changed()

    def _node_address(
        self,
        txn: Txn,
        node_id: int,
        raft_address: str | None,
        client_address: str | None,
        effects: list[tuple[Any, ...]],
    ) -> None:
        if type(node_id) is not int or not 1 <= node_id <= commands.MAX_NODE_ID:
            # Refused where it entered (CLUSTER_ADD_NODE); a committed one is ignored the
            # same way on every replica rather than stop them all, on every restart too.
            return
        key = _NODE + node_id.to_bytes(4, "big")
        if raft_address is None or client_address is None:
            self.node_addresses.pop(node_id, None)
            txn.put("meta", key, None)
        else:
            self.node_addresses[node_id] = (raft_address, client_address)
            txn.put("meta", key, _pack([raft_address, client_address]))
        effects.append(("n",))

    def _note_publish_ms(self, txn: Txn, publish_ms: int) -> None:
        """Remember the largest publish stamp committed (a new leader never stamps below)."""
        if publish_ms > self.last_publish_ms:
            self.last_publish_ms = publish_ms
            txn.put("meta", _LAST_PUBLISH, _u64(publish_ms))

    def _insert_message(
        self,
        txn: Txn,
        mid: int,
        topic: str,
        payload: bytes,
        publish_ms: int,
        due_ms: int,
        ttl_ms: int | None,
        headers: dict[str, str] | None,
        groups: list[GroupInfo],
        effects: list[tuple[Any, ...]],
        touched: set[int],
    ) -> None:
        """Store message ``mid`` with one fresh schedule entry per group of ``groups``."""
        expire_ms = None if ttl_ms is None else due_ms + ttl_ms
        txn.changes["messages"][_u64(mid)] = records.encode_message(
            topic, payload, publish_ms, due_ms, len(groups), headers or None, ttl_ms
        )
        value = _pack([0, expire_ms])
        schedule = txn.changes["schedule"]
        for info in groups:
            gid = info.group_id
            schedule[commands.schedule_key(gid, due_ms, mid)] = value
            info.pending += 1
            self.total_pending += 1
            touched.add(gid)
            effects.append(("s", gid, due_ms, mid, expire_ms, 0))

    def _drop_entry(
        self,
        txn: Txn,
        key: bytes,
        reason: CommandKind,
        effects: list[tuple[Any, ...]],
        touched: set[int],
        value: bytes | None = None,
        message: bytes | None = None,
    ) -> tuple[int, int, int, int | None] | None:
        """Delete one schedule entry and release its message; None if already gone.

        ``value``: the entry's stored value when the caller just read it; ``message``:
        its message's stored bytes, likewise (each read again if this apply changed it).
        """
        if value is None or key in txn.changes["schedule"]:
            value = txn.get("schedule", key)
        if value is None:
            return None
        gid, due_ms, mid = commands.parse_schedule_key(key)
        entry = _unpack(value)
        attempt, expire_ms = entry[0], entry[1]
        if self.backfilling:
            # Before the entry goes: a backfill that has not reached the message yet
            # copies it now (the message may go with this entry).
            self._backfill_leaving(
                txn, gid, mid, message, effects, touched, expiring=reason == CommandKind.EXPIRE
            )
        txn.put("schedule", key, None)
        info = self.groups.get(gid)
        if info is not None:
            info.pending -= 1
            self.total_pending -= 1
            touched.add(gid)
        elif gid in self.deleting:
            self.deleting[gid].pending -= 1
            touched.add(gid)
        deliveries.release_message(self, txn, mid, gid, due_ms, message)
        # A delivery an earlier leader handed over and left out (HANDED_OUT): the
        # leader must know its tag to answer a settlement of it after a CANCEL or
        # PURGE as for any delivery out (effects are not in the applied digest).
        held = EntryValue.held_in(entry)
        if held is None:
            effects.append(("u", gid, due_ms, mid, reason))
        else:
            effects.append(("u", gid, due_ms, mid, reason, held))
        return gid, mid, attempt, expire_ms

    def _move_entry(
        self,
        txn: Txn,
        key: bytes,
        gid: int,
        due_ms: int,
        mid: int,
        new_due: int,
        entry: EntryValue,
        reason: CommandKind,
        effects: list[tuple[Any, ...]],
        touched: set[int],
    ) -> None:
        """Write ``entry`` as the group's entry of ``mid``, due at ``new_due`` (it was due
        at ``due_ms`` under ``key``), and remember where it moved."""
        if self.backfilling and new_due != due_ms:
            # Before the entry moves: a backfill that has not reached the message yet
            # copies it now, due as it was (the group gets the time due at creation).
            self._backfill_leaving(txn, gid, mid, None, effects, touched, new_due=new_due)
        new_key = commands.schedule_key(gid, new_due, mid)
        held = entry.held()  # the leader must know the old tag moved (as for a removal)
        entry.unhold()  # a moved entry is due at its new time, not held for an old tag
        txn.put("schedule", key, None)
        txn.put("schedule", new_key, entry.encode())
        if new_due != due_ms:
            data = txn.get("messages", _u64(mid))
            assert data is not None, f"schedule entry without message {mid}"
            published_due = _unpack(data)[3]
            txn.put(
                "index", moved_key(mid, gid), None if new_due == published_due else _u64(new_due)
            )
        if held is None:
            effects.append(("u", gid, due_ms, mid, reason))
        else:
            effects.append(("u", gid, due_ms, mid, reason, held))
        if entry.released:
            effects.append(("s", gid, new_due, mid, entry.expire_ms, entry.attempt, entry.released))
        else:
            effects.append(("s", gid, new_due, mid, entry.expire_ms, entry.attempt))
