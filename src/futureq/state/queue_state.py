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
  moved, idempotency keys).

Every apply writes its changes and the new applied index in one batch, so a restart
replays exactly the log entries after it. The applied digest chains a CRC-32 over each
apply's index and the exact changes it wrote, so replicas whose states diverge (not
only their logs) show different digests.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from itertools import groupby, repeat
from operator import add, itemgetter
from typing import Any, Final, Protocol

import attrs
import msgpack
import msgspec
from sortedcontainers import SortedDict

from futureq.errors import NoSpaceError
from futureq.state import commands, records, snapshot
from futureq.state.commands import CommandKind
from futureq.state.manage_ops import (
    BACKFILL_PREFIX,
    KEY_TIME,
    PURGING_PREFIX,
    ManageOps,
    moved_key,
    out_attempts,
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
    "NEW_TOPIC_WORK",
    "DeletingGroup",
    "GroupInfo",
    "PublishResult",
    "QueueState",
    "ScheduleObserver",
]

NEW_TOPIC_WORK: Final = 7
"""A topic first seen in a batch counts as this many items of work (its group lookup)."""

_APPLIED: Final = b"applied_index"
_DIGEST: Final = b"applied_digest"
_NEXT_GROUP: Final = b"next_group_id"
_LAST_PUBLISH: Final = b"last_publish_ms"
_PENDING: Final = b"pending:"
_NODE: Final = b"node:"
_DELETING: Final = b"deleting:"

_pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack
_encode: Final = msgspec.msgpack.Encoder().encode
"""msgpack of the publish path's records and of the digested changes: the same bytes as
``_pack`` for every type the state writes (str, bytes, int, None, lists, tuples, dicts
with bytes or str keys; ``tests/unit/state/test_state_encoding.py``), in about half
the time per call (msgspec's encoder; measured 0.45 against 0.94 µs per message record)."""
_NEW_ENTRY: Final = _pack([0, None])
"""The value of a fresh schedule entry without expiry (attempt 0), packed once."""


_TOPIC: Final = itemgetter(0)
_PAYLOAD: Final = itemgetter(1)
_DUE: Final = itemgetter(2)
_TTL: Final = itemgetter(3)
_ID_KEY: Final = int.to_bytes
"""``_ID_KEY(mid, 8)``: a message id's key (big-endian is ``to_bytes``' default)."""
_SCHEDULE_KEY: Final = commands.pack_schedule_key

_KIND: Final = itemgetter(0)
"""The kind of an effect tuple: ``"s"`` scheduled, ``"u"`` unscheduled, ``"g"`` group
changed, ``"n"`` node addresses changed."""


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, use_list=True)


def _u64(value: int) -> bytes:
    return value.to_bytes(8, "big")


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

    def on_unscheduled(self, group_id: int, due_ms: int, mid: int, reason: CommandKind) -> None:
        """A schedule entry was removed by ACK, NACK, EXPIRE, DEAD_LETTER, RELEASE,
        PURGE_GROUP, CANCEL, RESCHEDULE or REDRIVE (NACK, RELEASE and RESCHEDULE
        schedule it again at once)."""
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


def _arg(command: list[Any], position: int, default: Any = None) -> Any:
    """A command's element, or ``default`` for a command written before it existed."""
    return command[position] if len(command) > position else default


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
            bound_id, sources, source, cursor = _unpack(value)
            self.backfilling[gid] = BackfillJob(gid, bound_id, sources, source, cursor)

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
        for due_ms, mid, attempt, expire_ms, _ in self.scan_schedule_entries(
            group_id, start_due_ms, start_mid, limit
        ):
            yield due_ms, mid, attempt, expire_ms

    def scan_schedule_entries(
        self, group_id: int, start_due_ms: int, start_mid: int, limit: int
    ) -> Iterator[tuple[int, int, int, int | None, int]]:
        """As :meth:`scan_schedule`, with each entry's ``released`` count last.

        Yields:
            ``(due_ms, message_id, attempt, expire_ms, released)`` in due order.
        """
        start = commands.schedule_key(group_id, start_due_ms, start_mid)
        stop = (group_id + 1).to_bytes(4, "big")
        for count, (key, value) in enumerate(self.store.scan("schedule", start, stop)):
            if count >= limit:
                return
            _, due_ms, mid = commands.parse_schedule_key(key)
            entry = _unpack(value)
            yield due_ms, mid, entry[0], entry[1], entry[2] if len(entry) > 2 else 0

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
            NACK, EXPIRE, DELIVERED, RELEASE, RETURN_COUNTED, PURGE_GROUP,
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
        if kind == CommandKind.PUBLISH:
            settings = commands.GroupSettings.from_wire(_arg(command, 3))
            duplicates: dict[int, int] = {}
            result = yield from self._publish(
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
            result = yield from self._delivered(txn, command[1], _arg(command, 2))
        elif kind == CommandKind.RELEASE:
            result = yield from self._release(txn, command[1], effects)
        elif kind == CommandKind.RETURN_COUNTED:
            result = yield from self._return_counted(txn, command[1])
        elif kind == CommandKind.ACK:
            result = yield from self._remove(txn, command[1], CommandKind.ACK, effects, touched)
        elif kind == CommandKind.EXPIRE or kind == CommandKind.EXPIRE_COUNTED:
            result = yield from self._expire(
                txn,
                index,
                command[1],
                _arg(command, 2),
                commands.GroupSettings.from_wire(_arg(command, 3)),
                effects,
                touched,
                _arg(command, 4),
            )
        elif kind == CommandKind.NACK:
            result = yield from self._nack(txn, index, command, effects, touched)
        elif kind == CommandKind.DEAD_LETTER_PROVENANCE:
            settings = commands.GroupSettings.from_wire(_arg(command, 3))
            result = yield from self._dead_letter(
                txn, index, command[1], command[2], effects, touched, settings
            )
        elif kind == CommandKind.DEAD_LETTER:
            settings = commands.GroupSettings.from_wire(_arg(command, 3))
            result = yield from self._dead_letter_before_provenance(
                txn, index, command[1], command[2], effects, touched, settings
            )
        elif kind == CommandKind.CREATE_GROUP:
            settings = commands.GroupSettings.from_wire(_arg(command, 5))
            result = self._create_group(
                txn,
                index,
                command[1],
                command[2],
                command[3],
                command[4],
                settings,
                _arg(command, 6),
                bool(_arg(command, 7, False)),
                effects,
            )
        elif kind == CommandKind.DELETE_GROUP:
            result = self._delete_group(txn, command[1], command[2], effects, touched)
        elif kind == CommandKind.PURGE_GROUP:
            if command[1] in self.deleting:
                result = yield from self._purge_group(txn, command[1], command[2], effects, touched)
            else:
                result = yield from self._purge_chunk(txn, command[1], command[2], effects, touched)
        elif kind == CommandKind.NODE_ADDRESS:
            self._node_address(txn, command[1], command[2], command[3], effects)
        elif kind == CommandKind.CANCEL:
            result = yield from self._cancel(
                txn, command[1], command[2], command[3], effects, touched, _arg(command, 4)
            )
        elif kind == CommandKind.RESCHEDULE_COUNTED:
            result = yield from self._reschedule(
                txn, command[2], command[3], command[4], command[5], effects, touched, command[6]
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
                self._forget_deleted(txn, gid, effects)
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

    def _publish(
        self,
        txn: Txn,
        index: int,
        publish_ms: int,
        items: list[list[Any]],
        effects: list[tuple[Any, ...]],
        touched: set[int],
        settings: commands.GroupSettings,
        window_ms: int = 0,
        duplicates: dict[int, int] | None = None,
    ) -> Generator[None, None, int]:
        """Store a batch of items (``[topic, payload, due_ms, ttl_ms, headers?, key?]``)
        as messages ``message_id(index, position)``, each for every group of its topic.

        An item whose idempotency key still names a message is not stored; its
        position maps to that message's id in ``duplicates``.
        """
        assert len(items) <= commands.MAX_BATCH_POSITIONS
        self._note_publish_ms(txn, publish_ms)
        first_id = commands.message_id(index, 0)
        if max(map(len, items), default=0) == 4:
            plain = self._plain_targets(items)
            if plain is not None:
                yield from self._publish_plain(
                    txn, first_id, publish_ms, items, plain, effects, touched
                )
                if window_ms:
                    yield from self._prune_idempotency_keys(txn, publish_ms, window_ms)
                return first_id
        targets: dict[str, list[GroupInfo]] = {}
        # Every other batch (new topics, fan-out, headers, keys, dead letters): one pass,
        # every per-message cost inlined (the record, the entry keys, the effects),
        # group counters added once per batch.
        messages = txn.changes["messages"]
        schedule = txn.changes["schedule"]
        schedule_key = commands.pack_schedule_key
        encode_message = records.encode_message
        append = effects.append
        stored: dict[int, int] = {}
        work = 0
        for position, item in enumerate(items):
            work += 1
            if work >= APPLY_STEP_ITEMS:
                work = 0
                yield
            topic = item[0]
            mid = first_id + position
            extra = len(item) > 4
            if extra and len(item) > 5 and item[5] is not None:
                original = self._claim_idempotency_key(
                    txn, topic, item[5], mid, publish_ms, window_ms
                )
                if original is not None:
                    if duplicates is not None:
                        duplicates[position] = original
                    continue
            groups = targets.get(topic)
            if groups is None:
                groups = targets[topic] = self._targets(txn, topic, settings, effects)
                for info in groups:
                    stored.setdefault(info.group_id, 0)
                work += NEW_TOPIC_WORK
            due_ms = item[2]
            ttl_ms = item[3]
            if ttl_ms is None:
                expire_ms = None
                value = _NEW_ENTRY
            else:
                expire_ms = due_ms + ttl_ms
                value = _encode([0, expire_ms])
            headers = item[4] if extra else None
            if headers or ttl_ms is not None:
                record = encode_message(
                    topic, item[1], publish_ms, due_ms, len(groups), headers or None, ttl_ms
                )
            else:  # records.encode_message's short form, without the call
                record = _encode([topic, item[1], publish_ms, due_ms, len(groups)])
            messages[mid.to_bytes(8, "big")] = record
            for info in groups:
                gid = info.group_id
                schedule[schedule_key(gid, due_ms, mid)] = value
                stored[gid] += 1
                append(("s", gid, due_ms, mid, expire_ms, 0))
        for groups in targets.values():
            for info in groups:
                count = stored[info.group_id]
                if count:
                    info.pending += count
                    self.total_pending += count
                    touched.add(info.group_id)
        if window_ms:
            yield from self._prune_idempotency_keys(txn, publish_ms, window_ms)
        return first_id

    def _plain_targets(self, items: list[list[Any]]) -> dict[str, GroupInfo] | None:
        """The one group of each topic of ``items``, or None when a topic has no group
        (it is created mid-batch) or several (fan-out), or the batch has so many topics
        that looking them all up would be more than a step's work: :meth:`_publish_plain`
        serves only batches whose items each make one schedule entry in a known group.
        """
        topics = set(map(_TOPIC, items))
        if len(topics) * NEW_TOPIC_WORK >= APPLY_STEP_ITEMS - 1:
            return None
        by_topic = self._by_topic
        groups = self.groups
        plain: dict[str, GroupInfo] = {}
        for topic in topics:
            names = by_topic.get(topic)
            if names is None or len(names) != 1:
                return None
            for gid in names.values():
                plain[topic] = groups[gid]
        return plain

    def _publish_plain(
        self,
        txn: Txn,
        first_id: int,
        publish_ms: int,
        items: list[list[Any]],
        plain: dict[str, GroupInfo],
        effects: list[tuple[Any, ...]],
        touched: set[int],
    ) -> Generator[None, None, None]:
        """:meth:`_publish` of the common batch: items ``[topic, payload, due_ms,
        ttl_ms]`` (no headers, no idempotency key) whose topics each have one group.

        The same changes, in the same order, and the same effects as the item loop of
        :meth:`_publish` (so the same stored bytes and digest), but built a step's worth
        of items at a time by ``map`` and ``zip`` over C functions, without a Python
        statement per message (the loop was most of the apply's own time: bench.apply_cost).
        msgspec encodes the tuples ``zip`` makes as the lists the loop encodes. Steps
        end where the loop's would when every topic shows up in its first step (the
        loop counts :data:`NEW_TOPIC_WORK` for each topic's lookup, done here first).
        """
        messages = txn.changes["messages"]
        schedule = txn.changes["schedule"]
        gid_of = {topic: info.group_id for topic, info in plain.items()}
        only = next(iter(plain)) if len(plain) == 1 else None
        count = len(items)
        start = 0
        stop = max(1, APPLY_STEP_ITEMS - 1 - NEW_TOPIC_WORK * len(plain))
        while True:
            chunk = items[start:stop]
            topics: Iterable[str]
            gids: Iterable[int]
            if only is None:
                topics = list(map(_TOPIC, chunk))
                gids = list(map(gid_of.__getitem__, topics))
            else:  # one topic: no column of it to build (zip and map stop at the others')
                topics = repeat(only)
                gids = repeat(gid_of[only])
            dues = list(map(_DUE, chunk))
            ttls = list(map(_TTL, chunk))
            ids = range(first_id + start, first_id + start + len(chunk))
            payloads = map(_PAYLOAD, chunk)
            records: Iterable[tuple[Any, ...]]
            values: Iterable[bytes]
            expires: Iterable[int | None]
            without_ttl = ttls.count(None)
            if without_ttl == len(chunk):
                records = zip(topics, payloads, repeat(publish_ms), dues, repeat(1), strict=False)
                values = repeat(_NEW_ENTRY)
                expires = repeat(None)
            elif without_ttl == 0:  # records.encode_message's layout with a TTL
                records = zip(
                    topics,
                    payloads,
                    repeat(publish_ms),
                    dues,
                    repeat(1),
                    repeat(None),
                    ttls,
                    strict=False,
                )
                expires = list(map(add, dues, ttls))
                values = map(_encode, zip(repeat(0), expires, strict=False))
            else:  # some items with a TTL: per item, as the loop does
                expires = [
                    None if ttl is None else due + ttl for due, ttl in zip(dues, ttls, strict=True)
                ]
                records = [
                    (topic, payload, publish_ms, due, 1)
                    if ttl is None
                    else (topic, payload, publish_ms, due, 1, None, ttl)
                    for topic, payload, due, ttl in zip(topics, payloads, dues, ttls, strict=False)
                ]
                values = [_NEW_ENTRY if at is None else _encode([0, at]) for at in expires]
            messages.update(zip(map(_ID_KEY, ids, repeat(8)), map(_encode, records), strict=False))
            schedule.update(zip(map(_SCHEDULE_KEY, gids, dues, ids), values, strict=False))
            effects.extend(zip(repeat("s"), gids, dues, ids, expires, repeat(0), strict=False))
            if stop >= count:
                break
            yield
            start = stop
            stop += APPLY_STEP_ITEMS
        counts = dict.fromkeys(plain, count) if len(plain) == 1 else Counter(map(_TOPIC, items))
        for topic, stored in counts.items():
            info = plain[topic]
            info.pending += stored
            self.total_pending += stored
            touched.add(info.group_id)

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

    def _targets(
        self,
        txn: Txn,
        topic: str,
        settings: commands.GroupSettings,
        effects: list[tuple[Any, ...]],
    ) -> list[GroupInfo]:
        groups = self.topic_groups(topic)
        if not groups:
            groups = [
                self._new_group(
                    txn,
                    topic,
                    DEFAULT_GROUP,
                    settings.visibility_timeout_ms,
                    settings.max_deliveries,
                    True,
                    effects,
                    settings.dead_letter_expired,
                )
            ]
        return groups

    def _new_group(
        self,
        txn: Txn,
        topic: str,
        name: str,
        visibility_timeout_ms: int,
        max_deliveries: int,
        implicit: bool,
        effects: list[tuple[Any, ...]],
        dead_letter_expired: bool = False,
    ) -> GroupInfo:
        gid = self._next_group_id
        self._next_group_id += 1
        txn.put("meta", _NEXT_GROUP, self._next_group_id.to_bytes(8, "big"))
        info = GroupInfo(
            gid,
            topic,
            name,
            visibility_timeout_ms,
            max_deliveries,
            implicit,
            dead_letter_expired=dead_letter_expired,
        )
        self._store_group(txn, info)
        self.groups[gid] = info
        self._by_topic.setdefault(topic, {})[name] = gid
        effects.append(("g", gid))
        return info

    @staticmethod
    def _group_key(topic: str, name: str) -> bytes:
        return f"{topic}\x00{name}".encode()

    def _store_group(self, txn: Txn, info: GroupInfo) -> None:
        value: list[Any] = [
            info.group_id,
            info.visibility_timeout_ms,
            info.max_deliveries,
            info.implicit,
        ]
        if info.dead_letter_expired:
            value.append(True)
        txn.put("groups", self._group_key(info.topic, info.name), _pack(value))

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
        txn.put("schedule", key, None)
        info = self.groups.get(gid)
        if info is not None:
            info.pending -= 1
            self.total_pending -= 1
            touched.add(gid)
        elif gid in self.deleting:
            self.deleting[gid].pending -= 1
            touched.add(gid)
        self._release_message(txn, mid, gid, due_ms, message)
        effects.append(("u", gid, due_ms, mid, reason))
        return gid, mid, attempt, expire_ms

    def _release_message(
        self, txn: Txn, mid: int, gid: int, due_ms: int, data: bytes | None = None
    ) -> None:
        """One entry of ``mid`` (in group ``gid``, due at ``due_ms``) is gone: count it
        out, forget where it moved, and delete the message with its last entry.
        ``data``: the message's stored bytes if the caller just read them."""
        mkey = _u64(mid)
        if data is None or mkey in txn.changes["messages"]:
            data = txn.get("messages", mkey)
        assert data is not None, f"schedule entry without message {mid}"
        record = _unpack(data)
        record[4] -= 1
        if due_ms != record[3]:
            txn.put("index", moved_key(mid, gid), None)
        txn.put("messages", mkey, None if record[4] <= 0 else _pack(record))

    def _remove(
        self,
        txn: Txn,
        keys: list[bytes],
        reason: CommandKind,
        effects: list[tuple[Any, ...]],
        touched: set[int],
    ) -> Generator[None, None, int]:
        done = 0
        for position, key in enumerate(keys):
            if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
                yield
            if self._drop_entry(txn, key, reason, effects, touched) is not None:
                done += 1
        return done

    def _expire(
        self,
        txn: Txn,
        index: int,
        keys: list[bytes],
        publish_ms: int | None,
        settings: commands.GroupSettings,
        effects: list[tuple[Any, ...]],
        touched: set[int],
        out_deliveries: Any = None,
    ) -> Generator[None, None, int]:
        """Remove expired entries; those of a ``dead_letter_expired`` group go to its
        dead-letter topic (reason ``expired``), or are parked on a dead-letter topic,
        their attempt raised to what ``out_deliveries`` (EXPIRE_COUNTED) says went out."""
        done = 0
        dead: list[list[Any]] = []
        known = out_attempts(out_deliveries)
        for position, key in enumerate(keys):
            if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
                yield
            info = self.groups.get(commands.parse_schedule_key(key)[0])
            if publish_ms is not None and info is not None and info.dead_letter_expired:
                value = txn.get("schedule", key)
                if value is None:
                    continue
                entry = EntryValue.decode(value)
                entry.attempt = max(entry.attempt, known.get(key, 0))
                if self._dead_letter_entry(
                    txn,
                    key,
                    info,
                    entry,
                    records.REASON_EXPIRED,
                    None,
                    publish_ms,
                    dead,
                    effects,
                    touched,
                ):
                    done += 1
            elif self._drop_entry(txn, key, CommandKind.EXPIRE, effects, touched) is not None:
                done += 1
        if dead:
            assert publish_ms is not None
            yield from self._publish(txn, index, publish_ms, dead, effects, touched, settings)
        return done

    def _delivered(
        self, txn: Txn, entries: list[list[Any]], now_ms: int | None
    ) -> Generator[None, None, int]:
        """Record the attempt number (and time) of redeliveries about to be pushed; an
        attempt is never lowered."""
        done = 0
        for position, item in enumerate(entries):
            if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
                yield
            key, attempt = item[0], item[1]
            value = txn.get("schedule", key)
            if value is None:
                continue  # acked, expired or deleted meanwhile
            entry = EntryValue.decode(value)
            if attempt > entry.attempt:
                entry.attempt = attempt
                if now_ms is not None:
                    entry.record_delivery(item[2] if len(item) > 2 else None, now_ms)
                txn.put("schedule", key, entry.encode())
                done += 1
        return done

    def _return_counted(self, txn: Txn, entries: list[list[Any]]) -> Generator[None, None, int]:
        """Record deliveries that went out unrecorded and count (RETURN_COUNTED): the
        attempt is raised, never lowered, and ``pushed_ms`` becomes a delivery time; the
        entry stays where it is (the leader's index already has it due again)."""
        done = 0
        for position, item in enumerate(entries):
            if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
                yield
            key, attempt, pushed_ms = item[0], item[1], item[2]
            value = txn.get("schedule", key)
            if value is None:
                continue  # acked, expired, moved or deleted meanwhile
            entry = EntryValue.decode(value)
            if attempt > entry.attempt:
                entry.attempt = attempt
                entry.record_delivery(pushed_ms, pushed_ms)
                txn.put("schedule", key, entry.encode())
                done += 1
        return done

    def _release(
        self, txn: Txn, entries: list[list[Any]], effects: list[tuple[Any, ...]]
    ) -> Generator[None, None, int]:
        """Give deliveries back unprocessed: due again at once, the attempt not counted.

        The release records the attempt (a first delivery is not recorded before it
        goes out); an attempt older than the one recorded, or released already, names
        a delivery that is no longer out and changes nothing.
        """
        done = 0
        for position, (key, attempt) in enumerate(entries):
            if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
                yield
            value = txn.get("schedule", key)
            if value is None:
                continue
            entry = EntryValue.decode(value)
            if attempt < max(entry.attempt, 1) or entry.released_attempt == attempt:
                continue
            gid, due_ms, mid = commands.parse_schedule_key(key)
            entry.attempt = attempt
            entry.released += 1
            entry.released_attempt = attempt
            txn.put("schedule", key, entry.encode())
            effects.append(("u", gid, due_ms, mid, CommandKind.RELEASE))
            effects.append(("s", gid, due_ms, mid, entry.expire_ms, attempt, entry.released))
            done += 1
        return done

    def _nack(
        self,
        txn: Txn,
        index: int,
        command: list[Any],
        effects: list[tuple[Any, ...]],
        touched: set[int],
    ) -> Generator[None, None, int]:
        """Refused deliveries: due again after the delay, or dead-lettered at once
        (``dead_letter``: reason ``rejected``), the consumer's reason text kept."""
        now_ms, requeue_delay_ms, entries = command[1], command[2], command[3]
        reason: str | None = _arg(command, 4)
        to_dead_letter = bool(_arg(command, 5, False))
        settings = commands.GroupSettings.from_wire(_arg(command, 6))
        done = 0
        dead: list[list[Any]] = []
        for position, item in enumerate(entries):
            if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
                yield
            key, attempt = item[0], item[1]
            pushed_ms = item[2] if len(item) > 2 else None
            value = txn.get("schedule", key)
            if value is None:
                continue
            gid, due_ms, mid = commands.parse_schedule_key(key)
            entry = EntryValue.decode(value)
            entry.attempt = max(attempt, entry.attempt)
            if pushed_ms is not None:
                entry.record_delivery(pushed_ms, pushed_ms)
            if reason is not None:
                entry.reason = reason
            info = self.groups.get(gid)
            if to_dead_letter and info is not None:
                if self._dead_letter_entry(
                    txn,
                    key,
                    info,
                    entry,
                    records.REASON_REJECTED,
                    reason,
                    now_ms,
                    dead,
                    effects,
                    touched,
                ):
                    done += 1
                continue
            new_due = max(now_ms + requeue_delay_ms, due_ms)
            self._move_entry(txn, key, gid, due_ms, mid, new_due, entry, CommandKind.NACK, effects)
            done += 1
        if dead:
            yield from self._publish(txn, index, now_ms, dead, effects, touched, settings)
        return done

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
    ) -> None:
        """Write ``entry`` as the group's entry of ``mid``, due at ``new_due`` (it was due
        at ``due_ms`` under ``key``), and remember where it moved."""
        new_key = commands.schedule_key(gid, new_due, mid)
        txn.put("schedule", key, None)
        txn.put("schedule", new_key, entry.encode())
        if new_due != due_ms:
            data = txn.get("messages", _u64(mid))
            assert data is not None, f"schedule entry without message {mid}"
            published_due = _unpack(data)[3]
            txn.put(
                "index", moved_key(mid, gid), None if new_due == published_due else _u64(new_due)
            )
        effects.append(("u", gid, due_ms, mid, reason))
        if entry.released:
            effects.append(("s", gid, new_due, mid, entry.expire_ms, entry.attempt, entry.released))
        else:
            effects.append(("s", gid, new_due, mid, entry.expire_ms, entry.attempt))

    def _dead_letter(
        self,
        txn: Txn,
        index: int,
        publish_ms: int,
        entries: list[list[Any]],
        effects: list[tuple[Any, ...]],
        touched: set[int],
        settings: commands.GroupSettings,
    ) -> Generator[None, None, int]:
        """Entries out of attempts go to their dead-letter topic with their provenance
        in headers (reason ``max-deliveries``); those of a dead-letter topic are parked."""
        items: list[list[Any]] = []
        for position, item in enumerate(entries):
            if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
                yield
            key, attempt = item[0], item[1]
            first_ms = item[2] if len(item) > 2 else None
            info = self.groups.get(commands.parse_schedule_key(key)[0])
            value = txn.get("schedule", key)
            if info is None or value is None:
                continue
            entry = EntryValue.decode(value)
            entry.attempt = max(attempt, entry.attempt)
            entry.record_delivery(first_ms, first_ms if entry.last_delivery_ms is None else None)
            self._dead_letter_entry(
                txn,
                key,
                info,
                entry,
                records.REASON_MAX_DELIVERIES,
                None,
                publish_ms,
                items,
                effects,
                touched,
            )
        if not items:
            return commands.message_id(index, 0)
        return (yield from self._publish(txn, index, publish_ms, items, effects, touched, settings))

    def _dead_letter_before_provenance(
        self,
        txn: Txn,
        index: int,
        publish_ms: int,
        entries: list[list[Any]],
        effects: list[tuple[Any, ...]],
        touched: set[int],
        settings: commands.GroupSettings,
    ) -> Generator[None, None, int]:
        """DEAD_LETTER (kind 5) exactly as builds before issue 14 applied it, so their
        logs replay to the same state: each entry goes to its dead-letter topic as a
        plain message (no headers, attempts not recorded); an entry of a group without
        a dead-letter topic (one of a dead-letter topic) is left as it is."""
        items: list[list[Any]] = []
        for position, item in enumerate(entries):
            if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
                yield
            key = item[0]
            gid, _, mid = commands.parse_schedule_key(key)
            record = self._record(txn, mid)
            info = self.groups.get(gid)
            if record is None or info is None or info.dead_letter_topic is None:
                continue
            if self._drop_entry(txn, key, CommandKind.DEAD_LETTER, effects, touched) is None:
                continue
            items.append([info.dead_letter_topic, record.payload, publish_ms, None])
        if not items:
            return commands.message_id(index, 0)
        return (yield from self._publish(txn, index, publish_ms, items, effects, touched, settings))

    def _create_group(
        self,
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
    ) -> int:
        """Create, adopt or update a group.

        A None field keeps the value of an existing (or adopted implicit) group; a
        new group takes it from ``settings``, the defaults the leader resolved. A new
        group ``from_backlog`` starts a backfill job (:meth:`_start_backfill`).
        """
        existing = self.find_group(topic, name)
        if existing is None:
            groups = self.topic_groups(topic)
            if len(groups) == 1 and groups[0].implicit:
                # Adopt the implicit group: it holds what was published before any
                # consumer existed (DESIGN.md, "a message published before any
                # consumer ever connected is not lost").
                existing = groups[0]
                txn.put("groups", self._group_key(topic, existing.name), None)
                del self._by_topic[topic][existing.name]
                existing.name = name
                self._by_topic[topic][name] = existing.group_id
            else:
                info = self._new_group(
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
                    self._start_backfill(txn, index, info, groups)
                return info.group_id
        existing.implicit = False
        if visibility_timeout_ms is not None:
            existing.visibility_timeout_ms = visibility_timeout_ms
        if max_deliveries is not None:
            existing.max_deliveries = max_deliveries
        if dead_letter_expired is not None:
            existing.dead_letter_expired = dead_letter_expired
        self._store_group(txn, existing)
        effects.append(("g", existing.group_id))
        return existing.group_id

    def _delete_group(
        self, txn: Txn, topic: str, name: str, effects: list[tuple[Any, ...]], touched: set[int]
    ) -> bool:
        """Delete a group at once; its schedule entries go later, by PURGE_GROUP chunks.

        The group disappears from :attr:`groups` (no delivery, no new entries, its name
        free for a new group); it waits in :attr:`deleting` until purged, so one
        command never has to remove an unbounded number of entries. A purge or
        backfill of it in progress ends.
        """
        info = self.find_group(topic, name)
        if info is None:
            return False
        gid = info.group_id
        txn.put("groups", self._group_key(topic, name), None)
        del self.groups[gid]
        del self._by_topic[topic][name]
        if not self._by_topic[topic]:
            del self._by_topic[topic]
        self.total_pending -= info.pending
        self._end_jobs(txn, gid)
        if info.pending > 0:
            self.deleting[gid] = DeletingGroup(gid, topic, name, info.pending)
            txn.put("meta", _DELETING + gid.to_bytes(4, "big"), _pack([topic, name, None]))
        else:
            txn.put("meta", _PENDING + gid.to_bytes(4, "big"), None)
            touched.discard(gid)
        effects.append(("g", gid))
        return True

    def _purge_group(
        self,
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
        deleting = self.deleting.get(gid)
        if deleting is None:
            return 0
        limit = max(1, min(max_entries, commands.MAX_PURGE_ENTRIES))
        cursor = deleting.cursor
        start = gid.to_bytes(4, "big") if cursor is None else cursor + b"\x00"
        stop = (gid + 1).to_bytes(4, "big")
        done = 0
        last: bytes | None = None
        for position, (key, value) in enumerate(self.store.scan("schedule", start, stop)):
            if done >= limit:
                break
            if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
                yield
            dropped = self._drop_entry(txn, key, CommandKind.PURGE_GROUP, effects, touched, value)
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

    def _forget_deleted(self, txn: Txn, gid: int, effects: list[tuple[Any, ...]]) -> None:
        """A deleted group has no entry left: forget it for good."""
        del self.deleting[gid]
        txn.put("meta", _DELETING + gid.to_bytes(4, "big"), None)
        txn.put("meta", _PENDING + gid.to_bytes(4, "big"), None)
        effects.append(("g", gid))
