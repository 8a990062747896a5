"""Applying the commands that manage scheduled messages (issue 14), for QueueState.

:class:`ManageOps` is a base class of :class:`~futureq.state.queue_state.QueueState`:
the state machine's handling of CANCEL, RESCHEDULE, PURGE (with PURGE_GROUP chunks),
CREATE_GROUP ``from_backlog`` (with BACKFILL_GROUP chunks), REDRIVE, idempotency keys
and dead letters with provenance. Like the rest of apply it reads nothing node-local:
times come stamped in the commands.

It owns the ``index`` family (secondary indexes, one-byte prefixes):

* ``d | message id (8) | group id (4)`` -> due_ms (8): where a group's entry of a
  message is due when that differs from the due time the message was published with
  (after a NACK, a RESCHEDULE, parking, or a backfill copy). With the message record it finds any
  entry by id in O(log n), without an index entry per message;
* ``k | topic | 0x00 | idempotency key`` -> ``[message id, publish_ms]``: the message a
  key names;
* ``t | publish_ms (8) | message id (8)`` -> the ``k`` key: keys in publish order, so
  each PUBLISH forgets a bounded number of keys older than the window;
* ``b | group id (4) | message id (8)`` -> empty: a message an exact backfill
  (CREATE_GROUP_FROM_BACKLOG_AS_HELD) of the group handled ahead of its chunks (copied
  ahead, or its entry moved from behind the cursor to ahead of it) while every source
  entry of it lies ahead of the cursor, so the chunks skip it; removed when they pass
  such an entry, when no such entry is left, or with the job. For a job of kind 37: a
  message copied ahead that the chunks skip, removed when they pass its id;

and these ``meta`` keys: ``purging:<group id>`` -> ``[bound_id, cursor]``,
``backfill:<group id>`` -> ``[bound_id, sources, source, cursor]`` (then the messages
copied ahead, for a job of CREATE_GROUP kind 6), ``[bound_id, sources, source, cursor,
purged, true, 38]`` for an exact backfill (kind 38), or ``[bound_id, sources, 0, message
cursor, purged, true]`` for one of kind 37 (stored so by the build that wrote kind 37:
no kind), ``purged`` a list of ``[source group id, purge bound id]`` of the sources a
PURGE was emptying at creation.

BACKFILL (a group created ``from_backlog``, kind 38): the group gets exactly the
messages of its topic pending in the topic's other groups (its sources) when it was
created, each once, due as the sources held it then (the earliest live source entry's
due time and expiry, :meth:`ManageOps._copy_time`); what expired is not copied.
BACKFILL_GROUP chunks walk the source groups' schedules in turn (so they read only the
topic's entries, whatever other topics hold) and copy each message older than the
group that is not handled yet. A message is handled once copied or looked at; one the
chunks have not handled is copied ahead when a source group lets go of its entry (ACK,
CANCEL, EXPIRE, dead-lettering, PURGE, a deleted group's purge: the last one may
delete it) or moves it (NACK, RESCHEDULE, parking: so the copy keeps the due time of
creation), and before a CANCEL or RESCHEDULE names it (which then treats the new
group's copy as the others'). Whether the chunks must skip an entry they reach is
read from the sources (one the cursor passed holds the message) or, while no such
source does, from a ``b`` mark: so each message is handled once, however its entries
move. Kind 6 with ``from_backlog`` (earlier builds) keeps its job, which walks the
source groups' schedules without those rules, and replays as it applied.

Kind 37 (CREATE_GROUP_FROM_BACKLOG, written by the build before kind 38) keeps its
rules too, in the ``_legacy_..._by_id`` methods: its chunks walk the ``messages``
family in id order below the group's first id and copy each message of the topic a
source group holds, at its published due time; a message the cursor has not reached is
copied ahead, and marked, when a source entry of it goes (not when one moves) and
before a CANCEL or RESCHEDULE names it. So a log or a stored job of that build gives
the state it gave there, whatever the BACKFILL_GROUP command carries.

Source: ``docs/protocol.md`` (CANCEL, RESCHEDULE, PURGE, REDRIVE, idempotency keys,
dead letters); issue 14.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any, Final

from futureq.state import commands, records
from futureq.state.commands import CommandKind
from futureq.state.model import APPLY_STEP_ITEMS, BackfillJob, GroupInfo, PurgeJob, Txn
from futureq.state.records import PARKED_DUE_MS, EntryValue, MessageRecord
from futureq.wire.frames import ItemStatus

if TYPE_CHECKING:
    from futureq.state.model import DeletingGroup
    from futureq.state.store import StateStore

PURGING_PREFIX: Final = b"purging:"
BACKFILL_PREFIX: Final = b"backfill:"
MOVED: Final = b"d"
KEY: Final = b"k"
KEY_TIME: Final = b"t"
BACKFILLED: Final = b"b"
MAX_BACKFILL_READ_BYTES: Final = 4 * 1024 * 1024
"""Most stored message bytes one chunk of an exact backfill reads (the one record that
passes it is read whole): at the 1 MiB payload limit, a few records, not hundreds."""
PRUNE_MIN_KEYS: Final = 16
"""Idempotency keys older than the window one PUBLISH looks at, at least; more when
the batch itself brings keys, so forgetting keeps pace with remembering."""
_U64_MAX: Final = 2**64 - 1


def moved_key(mid: int, group_id: int) -> bytes:
    """``index`` key of where group ``group_id``'s entry of message ``mid`` moved."""
    return MOVED + mid.to_bytes(8, "big") + group_id.to_bytes(4, "big")


def backfilled_key(group_id: int, mid: int) -> bytes:
    """``index`` key marking message ``mid`` copied ahead to group ``group_id``, whose
    exact backfill has not reached it yet (:class:`~futureq.state.model.BackfillJob`)."""
    return BACKFILLED + group_id.to_bytes(4, "big") + mid.to_bytes(8, "big")


def idempotency_index_key(topic: str, key: str) -> bytes:
    """``index`` key naming the message published to ``topic`` with ``key``."""
    return KEY + topic.encode("utf-8") + b"\x00" + key.encode("utf-8")


def _u64(value: int) -> bytes:
    return value.to_bytes(8, "big")


def out_attempts(out_deliveries: Any) -> dict[bytes, int]:
    """Schedule key -> attempt of a command's ``out`` (None or malformed items: none).

    Items are committed as the leader built them; the checks only keep a damaged or
    hostile entry from stopping every replica the same way."""
    known: dict[bytes, int] = {}
    if type(out_deliveries) is not list:
        return known
    for item in out_deliveries:
        if (
            type(item) is list
            and len(item) >= 2
            and type(item[0]) is bytes
            and type(item[1]) is int
            and item[1] > known.get(item[0], 0)
        ):
            known[item[0]] = item[1]
    return known


_STAMP_POSITION: Final = {
    CommandKind.PUBLISH: 1,
    CommandKind.NACK: 1,
    CommandKind.NACK_FOLLOWING: 1,
    CommandKind.EXPIRE: 2,
    CommandKind.EXPIRE_COUNTED: 2,
    CommandKind.DEAD_LETTER: 1,
    CommandKind.DEAD_LETTER_PROVENANCE: 1,
    CommandKind.DELIVERED: 2,
    CommandKind.RESCHEDULE: 1,
    CommandKind.RESCHEDULE_COUNTED: 1,
    CommandKind.RESCHEDULE_BACKFILLING: 1,
    CommandKind.REDRIVE: 1,
    CommandKind.BACKFILL_GROUP: 3,
}


def command_stamp(command: list[Any]) -> int:
    """The cluster time (ms) the leader stamped into ``command``, or 0 for a kind
    without one (or a command of an earlier build that lacks it)."""
    position = _STAMP_POSITION.get(command[0])
    if position is None or len(command) <= position:
        return 0
    stamp = command[position]
    return stamp if type(stamp) is int and stamp > 0 else 0


def _published_copy(record: MessageRecord, source_value: bytes | None) -> tuple[int, int | None]:
    """``(due_ms, expire_ms)`` of a copy as the backfills of earlier builds (CREATE_GROUP
    kind 6 with ``from_backlog``, CREATE_GROUP_FROM_BACKLOG kind 37) make it: at the
    published due time, expiring as published (``source_value``: a source entry's
    stored value, whose expiry a record from before TTLs were stored falls back on;
    None: no fallback, such a record's copy never expires, as an exact backfill makes
    the copy of a message held only parked)."""
    ttl_ms = record.ttl_ms
    if ttl_ms is not None:
        return record.due_ms, record.due_ms + ttl_ms
    if source_value is None:  # no TTL (or one not stored), and no fallback
        return record.due_ms, None
    # No TTL, or a record from before TTLs were stored.
    return record.due_ms, EntryValue.decode(source_value).expire_ms


def _is_id(value: Any) -> bool:
    """A committed id that fits the stored layout (anything else names nothing)."""
    return type(value) is int and 0 <= value <= _U64_MAX


class ManageOps:
    """The management commands of :class:`~futureq.state.queue_state.QueueState`."""

    store: StateStore
    groups: dict[int, GroupInfo]
    deleting: dict[int, DeletingGroup]
    purging: dict[int, PurgeJob]
    backfilling: dict[int, BackfillJob]
    total_pending: int
    last_publish_ms: int
    backfill_now_ms: int = 0
    """Cluster time (ms) the command being applied shows has passed: the command's own
    stamp (:func:`command_stamp`), even below the latest publish stamp (one far ahead
    was made on a wrong clock and left behind); for a kind without a stamp, the latest
    publish stamp committed. An exact backfill copies no entry that expired by then. Derived from replicated
    state and the command only; set by ``apply_steps`` while a backfill runs."""
    key_time_floor: bytes = KEY_TIME
    """No ``t`` key of the store lies below this one (node-local, derived from the store;
    :meth:`_prune_idempotency_keys` starts its scan here). Raised past the keys a prune
    deleted, lowered by any ``t`` key put below it, reset to :data:`KEY_TIME` on load."""

    if TYPE_CHECKING:

        def topic_groups(self, topic: str) -> list[GroupInfo]: ...

        def find_group(self, topic: str, name: str) -> GroupInfo | None: ...

        def _note_publish_ms(self, txn: Txn, publish_ms: int) -> None: ...

        def _drop_entry(
            self,
            txn: Txn,
            key: bytes,
            reason: CommandKind,
            effects: list[tuple[Any, ...]],
            touched: set[int],
            value: bytes | None = None,
            message: bytes | None = None,
        ) -> tuple[int, int, int, int | None] | None: ...

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
        ) -> None: ...

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
        ) -> None: ...

    # ------------------------------------------------------------ finding entries

    def _record(self, txn: Txn, mid: int) -> MessageRecord | None:
        data = txn.get("messages", _u64(mid))
        return None if data is None else MessageRecord.decode(data)

    def _find_entry(
        self, txn: Txn, mid: int, gid: int, published_due_ms: int
    ) -> tuple[bytes, bytes] | None:
        """``(schedule key, value)`` of group ``gid``'s entry of ``mid``, or None."""
        moved = txn.get("index", moved_key(mid, gid))
        due_ms = published_due_ms if moved is None else int.from_bytes(moved, "big")
        key = commands.schedule_key(gid, due_ms, mid)
        value = txn.get("schedule", key)
        return None if value is None else (key, value)

    def _holding_groups(self, topic: str, group_id: int | None) -> list[GroupInfo]:
        """The groups to look in for a message of ``topic``: one, or all of the topic."""
        if group_id is None:
            return self.topic_groups(topic)
        info = self.groups.get(group_id) if type(group_id) is int else None
        return [info] if info is not None and info.topic == topic else []

    # ------------------------------------------------------------ reads

    def browse(
        self,
        group_id: int,
        from_due_ms: int,
        to_due_ms: int | None,
        after_key: bytes | None,
        limit: int,
        below_id: int = 0,
        max_skipped: int = 0,
    ) -> tuple[list[tuple[bytes, EntryValue, MessageRecord]], bytes | None]:
        """A page of one group's pending entries in due order, without claiming any.

        O(``limit``) reads whatever the backlog: one range scan of the ``schedule``
        family from ``max(from_due_ms, after_key)`` and one point read of each
        entry's message. Parked dead letters (due at
        :data:`~futureq.state.records.PARKED_DUE_MS`) come last, and only when
        ``to_due_ms`` is None. Entries of messages with an id below ``below_id`` (a
        running PURGE's, which its chunks have not removed yet) are left out without
        reading their message; past ``max_skipped`` of them the page ends early, with
        the last key looked at as its cursor (a read, so leader-local: apply never
        calls it).

        Args:
            group_id: The group (its schedule keys start with it).
            from_due_ms: Entries due at or after this (ms).
            to_due_ms: Entries due before this (ms); None: no bound.
            after_key: The cursor: the last schedule key of the previous page (the
                page starts after it); None: from ``from_due_ms``.
            limit: Most entries (>= 1).
            below_id: Leave out entries of messages with a smaller id (0: none).
            max_skipped: Most entries left out before the page ends (at least one
                is looked past, so a page always moves the cursor on).

        Returns:
            ``([(schedule key, entry, message), ...], next cursor or None)``: the
            cursor is None when the range holds nothing more.
        """
        start = commands.schedule_key(group_id, from_due_ms, 0)
        if after_key is not None and after_key >= start:
            start = after_key + b"\x00"
        if to_due_ms is None:
            stop = (group_id + 1).to_bytes(4, "big")
        else:
            stop = commands.schedule_key(group_id, to_due_ms, 0)
        page: list[tuple[bytes, EntryValue, MessageRecord]] = []
        skipped = 0
        last_key = None
        for key, value in self.store.scan("schedule", start, stop):
            if len(page) >= limit:
                return page, page[-1][0]
            mid = commands.parse_schedule_key(key)[2]
            if mid < below_id:
                if skipped >= max_skipped and last_key is not None:
                    return page, last_key
                skipped += 1
                last_key = key
                continue
            last_key = key
            data = self.store.get("messages", _u64(mid))
            assert data is not None, f"schedule entry {key.hex()} without its message"
            page.append((key, EntryValue.decode(value), MessageRecord.decode(data)))
        return page, None

    def count_entries(
        self, group_id: int, start: bytes, to_due_ms: int | None, limit: int, below_id: int = 0
    ) -> tuple[int, int, bytes | None]:
        """Count one group's schedule entries from key ``start`` (inclusive) to those
        due at ``to_due_ms`` (exclusive), reading at most ``limit`` keys (keys only).

        Used in chunks by BROWSE_COUNTS, so a large count yields between chunks.

        Args:
            group_id: The group (its schedule keys start with it).
            start: The first schedule key to count from (``schedule_key(group_id,
                from_due_ms, 0)``, or the resume key of the previous chunk).
            to_due_ms: Count entries due before this (ms); None: to the group's end,
                parked dead letters included.
            limit: Most keys to read (>= 1).
            below_id: Entries of messages with a smaller id are read but not counted
                (a running PURGE's, which its chunks have not removed yet); 0: none.

        Returns:
            ``(count, keys read, resume key or None)``: the resume key is where the
            next chunk starts; None when the range holds nothing more.
        """
        if to_due_ms is None:
            stop = (group_id + 1).to_bytes(4, "big")
        else:
            stop = commands.schedule_key(group_id, to_due_ms, 0)
        count = read = 0
        for key in self.store.scan_keys("schedule", start, stop):
            if read >= limit:
                return count, read, key
            read += 1
            if below_id and commands.parse_schedule_key(key)[2] < below_id:
                continue
            count += 1
        return count, read, None

    def next_due_ms(self, group_id: int) -> int | None:
        """When the group's earliest entry falls due (ms), or None when it holds none
        that can be delivered (parked dead letters do not count). One seek: O(log n)."""
        start = group_id.to_bytes(4, "big")
        stop = commands.schedule_key(group_id, PARKED_DUE_MS, 0)
        for key, _ in self.store.scan("schedule", start, stop):
            return commands.parse_schedule_key(key)[1]
        return None

    # ------------------------------------------------------------ CANCEL / RESCHEDULE

    def _cancel(
        self,
        txn: Txn,
        topic: str,
        group_id: int | None,
        ids: list[Any],
        effects: list[tuple[Any, ...]],
        touched: set[int],
        out_deliveries: Any = None,
    ) -> Generator[None, None, list[int]]:
        """Remove messages by id from one group or every group of ``topic``.

        ``out_deliveries``: the command's ``out`` (deliveries the leader knows went
        out; None in commands written before it existed).

        Returns:
            Per id: DONE (removed, never delivered as far as the log and the leader
            know), DELIVERED (removed, but delivered at least once before: recorded,
            released, or known out by the leader) or UNKNOWN (no entry of it there).
        """
        out: list[int] = []
        known = out_attempts(out_deliveries)
        # Once per batch, not per id: the groups to look in (a cancel changes none).
        holders = self._holding_groups(topic, group_id)
        for position, mid in enumerate(ids):
            if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
                yield
            data = txn.get("messages", _u64(mid)) if _is_id(mid) else None
            # The stored layout is [topic, payload, publish_ms, due_ms, open, ...]
            # (records.MessageRecord); only these three are needed here.
            fields = None if data is None else records.unpack(data)
            if fields is None or fields[0] != topic:
                out.append(ItemStatus.UNKNOWN)
                continue
            if data is not None and self._exact_backfill_below(mid):
                # A group being filled from the backlog gets its copy first, which the
                # command then removes (or keeps) as it does the other groups'.
                if self._backfill_ahead(txn, mid, MessageRecord.decode(data), effects, touched):
                    data = txn.get("messages", _u64(mid))
                    assert data is not None
                    fields = records.unpack(data)
            status = ItemStatus.UNKNOWN
            published_due, left = fields[3], fields[4]
            for info in holders:
                if left <= 0:
                    break
                found = self._find_entry(txn, mid, info.group_id, published_due)
                if found is None:
                    continue
                key, value = found
                entry = records.unpack(value)  # [attempt, expire_ms, released, ...]
                # The message bytes read above (read again once this apply changed them).
                self._drop_entry(txn, key, CommandKind.CANCEL, effects, touched, value, data)
                left -= 1
                if entry[0] or (len(entry) > 2 and entry[2]) or known.get(key, 0) > 0:
                    status = ItemStatus.DELIVERED
                elif status == ItemStatus.UNKNOWN:
                    status = ItemStatus.DONE
            out.append(status)
        return out

    def _reschedule(
        self,
        txn: Txn,
        topic: str,
        group_id: int | None,
        ids: list[Any],
        due_ms: int,
        effects: list[tuple[Any, ...]],
        touched: set[int],
        out_deliveries: Any = None,
        *,
        backfill_first: bool = False,
    ) -> Generator[None, None, list[int]]:
        """Give messages by id the due time ``due_ms`` in one group or every group.

        With ``backfill_first`` (RESCHEDULE_BACKFILLING), each message is first copied
        to every group being filled from the backlog that should get it and has not
        yet (:meth:`_backfill_one`), so the move neither hides it from the backfill nor
        leaves that group a copy at the old time.

        Attempts are kept, those of deliveries the leader knows went out included
        (``out_deliveries``, the command's ``out``: an entry's attempt is raised to at
        least its item's). The TTL counts from the new due time (an entry with a TTL
        expires at ``due_ms + ttl_ms``), as it does from a published due time. In a
        group a PURGE is emptying, an entry the purge will remove is removed now
        instead.

        A parked dead letter is delivered again: with ``out_deliveries`` given
        (RESCHEDULE_COUNTED) its deliveries so far stop counting towards
        ``max_deliveries`` (``released`` is raised to its attempt, as if each had been
        released), so it gets a fresh allowance; with None (kind RESCHEDULE, earlier
        builds) its attempts are kept as they were, and it is parked again on its next
        look, as those builds did.

        Returns:
            Per id: DONE or UNKNOWN (no entry of it there).
        """
        out: list[int] = []
        counted = out_deliveries is not None
        known = out_attempts(out_deliveries)
        valid_due = type(due_ms) is int and 0 <= due_ms < PARKED_DUE_MS
        holders = self._holding_groups(topic, group_id)  # once per batch: none changes
        for position, mid in enumerate(ids):
            if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
                yield
            record = self._record(txn, mid) if _is_id(mid) and valid_due else None
            if record is None or record.topic != topic:
                out.append(ItemStatus.UNKNOWN)
                continue
            if self.backfilling and (
                (
                    self._exact_backfill_below(mid)
                    and self._backfill_ahead(txn, mid, record, effects, touched)
                )
                | (backfill_first and self._backfill_one(txn, mid, record, effects, touched))
            ):
                record = self._record(txn, mid)
                assert record is not None
            status = ItemStatus.UNKNOWN
            left = record.open
            for info in holders:
                if left <= 0:
                    break
                gid = info.group_id
                found = self._find_entry(txn, mid, gid, record.due_ms)
                if found is None:
                    continue
                left -= 1
                key, value = found
                job = self.purging.get(gid)
                if job is not None and mid < job.bound_id:
                    self._drop_entry(txn, key, CommandKind.PURGE_GROUP, effects, touched, value)
                    continue
                entry = EntryValue.decode(value)
                entry.attempt = max(entry.attempt, known.get(key, 0))
                ttl_ms = record.ttl_ms
                if ttl_ms is None and entry.expire_ms is not None:
                    ttl_ms = max(1, entry.expire_ms - record.due_ms)  # a record without TTL
                entry.expire_ms = None if ttl_ms is None else due_ms + ttl_ms
                old_due = commands.parse_schedule_key(key)[1]
                if counted and old_due == PARKED_DUE_MS:
                    entry.released = entry.attempt  # a fresh allowance (docstring)
                self._move_entry(
                    txn,
                    key,
                    gid,
                    old_due,
                    mid,
                    due_ms,
                    entry,
                    CommandKind.RESCHEDULE,
                    effects,
                    touched,
                )
                status = ItemStatus.DONE
            out.append(status)
        return out

    # ------------------------------------------------------------ PURGE

    def _purge(
        self, txn: Txn, index: int, group_ids: list[Any], effects: list[tuple[Any, ...]]
    ) -> int:
        """Start emptying groups: every entry they hold now goes, by PURGE_GROUP chunks.

        Messages published after this command stay. A backfill of the group ends (all
        it would copy is older). Returns how many entries the groups hold now.
        """
        bound_id = commands.message_id(index, 0)
        total = 0
        for gid in group_ids:
            info = self.groups.get(gid) if type(gid) is int else None
            if info is None:
                continue
            total += info.pending
            self._end_jobs(txn, gid)
            job = PurgeJob(gid, bound_id)
            self.purging[gid] = job
            self._store_purge(txn, job)
            effects.append(("g", gid))
        return total

    def _store_purge(self, txn: Txn, job: PurgeJob) -> None:
        txn.put(
            "meta",
            PURGING_PREFIX + job.group_id.to_bytes(4, "big"),
            records.pack([job.bound_id, job.cursor]),
        )

    def _end_jobs(self, txn: Txn, gid: int) -> None:
        """Forget any purge or backfill of group ``gid`` (deleted, or purged anew)."""
        if self.purging.pop(gid, None) is not None:
            txn.put("meta", PURGING_PREFIX + gid.to_bytes(4, "big"), None)
        job = self.backfilling.pop(gid, None)
        if job is not None:
            txn.put("meta", BACKFILL_PREFIX + gid.to_bytes(4, "big"), None)
            if job.exact:
                # Marks of messages copied ahead that the chunks never reached: as
                # many as copies ahead were made, each by an earlier command.
                self._drop_marks(txn, gid)

    def _drop_marks(self, txn: Txn, gid: int) -> None:
        """Delete every mark (``b`` key) of group ``gid``'s exact backfill: those stored
        and those this apply wrote."""
        prefix = BACKFILLED + gid.to_bytes(4, "big")
        for key, _ in self.store.scan("index", prefix, prefix + b"\xff" * 8):
            txn.put("index", key, None)
        for key in [k for k in txn.changes["index"] if k.startswith(prefix)]:
            txn.put("index", key, None)

    def _purge_chunk(
        self,
        txn: Txn,
        gid: int,
        max_entries: int,
        effects: list[tuple[Any, ...]],
        touched: set[int],
    ) -> Generator[None, None, int]:
        """Look at up to ``max_entries`` (capped) entries of a group being purged, after
        the replicated cursor, and remove those of messages older than the purge.

        Entries only move later while a purge runs (a NACK requeues at or after the due
        time; RESCHEDULE removes what the purge would), so the cursor misses none. The
        job ends when a chunk finds fewer entries than it may look at.
        """
        job = self.purging.get(gid) if type(gid) is int else None
        if job is None:
            return 0
        limit = max(1, min(max_entries, commands.MAX_PURGE_ENTRIES))
        start = gid.to_bytes(4, "big") if job.cursor is None else job.cursor + b"\x00"
        stop = (gid + 1).to_bytes(4, "big")
        looked = done = 0
        for key, value in self.store.scan("schedule", start, stop):
            if looked >= limit:
                break
            looked += 1
            if looked % APPLY_STEP_ITEMS == 0:
                yield
            job.cursor = key
            if commands.parse_schedule_key(key)[2] < job.bound_id:
                if self._drop_entry(txn, key, CommandKind.PURGE_GROUP, effects, touched, value):
                    done += 1
        self._end_or_store_job(txn, job, looked < limit, effects)
        return done

    # ------------------------------------------------------------ BACKFILL

    def _start_backfill(
        self,
        txn: Txn,
        index: int,
        info: GroupInfo,
        others: list[GroupInfo],
        *,
        exact: bool = False,
        legacy_by_id: bool = False,
    ) -> None:
        """A new group gets the topic's backlog: what its other groups still hold
        (``exact``: exactly what they hold now; ``legacy_by_id``: as kind 37 did, see
        :class:`BackfillJob`)."""
        sources = sorted(other.group_id for other in others)
        job = BackfillJob(
            info.group_id,
            commands.message_id(index, 0),
            sources,
            exact=exact,
            legacy_by_id=exact and legacy_by_id,
        )
        if exact:
            # What these purges were removing is not pending now; a later PURGE or a
            # deletion of the source takes their place, so their bounds are kept.
            job.purged = {
                source: self.purging[source].bound_id
                for source in sources
                if source in self.purging
            }
        self.backfilling[info.group_id] = job
        self._store_backfill(txn, job)

    def _store_backfill(self, txn: Txn, job: BackfillJob) -> None:
        """Store ``job`` in ``meta`` (module docstring): a job of kind 37 exactly as the
        build that wrote kind 37 stored it (source 0, without a kind), one of kind 38
        with its kind, so a restart tells them apart."""
        value: list[Any]
        if job.exact:
            purged = [[source, bound] for source, bound in sorted(job.purged.items())]
            source = 0 if job.legacy_by_id else job.source
            value = [job.bound_id, job.sources, source, job.cursor, purged, True]
            if not job.legacy_by_id:
                value.append(CommandKind.CREATE_GROUP_FROM_BACKLOG_AS_HELD)
        elif job.copied:
            value = [job.bound_id, job.sources, job.source, job.cursor, sorted(job.copied)]
        else:
            value = [job.bound_id, job.sources, job.source, job.cursor]
        txn.put("meta", BACKFILL_PREFIX + job.group_id.to_bytes(4, "big"), records.pack(value))

    def _backfill_chunk(
        self,
        txn: Txn,
        gid: int,
        max_entries: int,
        effects: list[tuple[Any, ...]],
        touched: set[int],
    ) -> Generator[None, None, int]:
        """Copy the next chunk of the backlog to a group created ``from_backlog``.

        Reads up to ``max_entries`` (capped) entries of the source groups in turn,
        after the replicated cursor; each message older than the group that it does not
        hold yet gets an entry, due at its published due time (so at once if that has
        passed), never delivered, expiring as published. Returns how many were copied.
        """
        job = self.backfilling.get(gid) if type(gid) is int else None
        info = self.groups.get(gid) if job is not None else None
        if job is None or info is None:
            return 0
        limit = max(1, min(max_entries, commands.MAX_PURGE_ENTRIES))
        if job.legacy_by_id:
            return (
                yield from self._legacy_backfill_chunk_by_id(
                    txn, job, info, limit, effects, touched
                )
            )
        if job.exact:
            return (yield from self._backfill_chunk_exact(txn, job, info, limit, effects, touched))
        looked = copied = 0
        while job.source < len(job.sources) and looked < limit:
            source = job.sources[job.source]
            if source not in self.groups:
                job.source += 1
                job.cursor = None
                continue
            start = source.to_bytes(4, "big") if job.cursor is None else job.cursor + b"\x00"
            stop = (source + 1).to_bytes(4, "big")
            exhausted = True
            for key, value in self.store.scan("schedule", start, stop):
                if looked >= limit:
                    exhausted = False
                    break
                looked += 1
                if looked % APPLY_STEP_ITEMS == 0:
                    yield
                job.cursor = key
                mid = commands.parse_schedule_key(key)[2]
                if mid >= job.bound_id or mid in job.copied:
                    continue
                record = self._record(txn, mid)
                if record is None or self._find_entry(txn, mid, gid, record.due_ms) is not None:
                    continue
                due_ms, expire_ms = _published_copy(record, value)
                self._copy_backlog_entry(
                    txn, info, mid, record, due_ms, expire_ms, effects, touched
                )
                copied += 1
            if exhausted:
                job.source += 1
                job.cursor = None
        self._end_or_store_job(txn, job, job.source >= len(job.sources), effects)
        return copied

    def _backfill_chunk_exact(
        self,
        txn: Txn,
        job: BackfillJob,
        info: GroupInfo,
        limit: int,
        effects: list[tuple[Any, ...]],
        touched: set[int],
    ) -> Generator[None, None, int]:
        """A chunk of an exact backfill: read the source groups' schedules in turn
        (live or being deleted), after the cursor, and copy each message older than
        the group that the backfill has not handled yet (:meth:`_backfill_visit`). It
        stops after ``limit`` units of work or :data:`MAX_BACKFILL_READ_BYTES` of
        messages read, so it reads only its topic's entries, whatever other topics
        hold. An entry of a message older than the group costs one unit per source
        group (each is looked up in every source, for its due time), any other one
        unit: a topic of many groups gets fewer entries per chunk, never an unbounded
        chunk (one entry at least, so each chunk moves on).

        An entry that moves or goes before the cursor reaches it copies its message
        ahead first (:meth:`_backfill_ahead`), and one that moves from behind the
        cursor to ahead of it leaves a mark, so each message pending at creation is
        handled once. The job ends with the chunk that reads the last source's end.
        """
        gid = info.group_id
        looked = read_bytes = copied = stepped = 0
        cost = len(job.sources)
        while job.source < len(job.sources) and looked < limit:
            source = job.sources[job.source]
            start = source.to_bytes(4, "big") if job.cursor is None else job.cursor + b"\x00"
            stop = (source + 1).to_bytes(4, "big")
            exhausted = True
            for key, _ in self.store.scan("schedule", start, stop):
                if looked >= limit or read_bytes >= MAX_BACKFILL_READ_BYTES:
                    exhausted = False
                    break
                if looked - stepped >= APPLY_STEP_ITEMS:
                    stepped = looked
                    yield
                mid = commands.parse_schedule_key(key)[2]
                if mid < job.bound_id:
                    looked += cost
                    done, size = self._backfill_visit(txn, job, info, key, mid, effects, touched)
                    copied += done
                    read_bytes += size
                else:
                    looked += 1
                job.cursor = key
            if not exhausted:
                break
            job.source += 1
            job.cursor = None
        ended = job.source >= len(job.sources)
        if ended:
            # Every entry is behind the cursor now, so no mark is needed; none should
            # be left (each is removed when the cursor passes the entry it covers).
            # (This apply wrote none: the chunk's visits only delete marks.)
            self._drop_marks(txn, gid)
        self._end_or_store_job(txn, job, ended, effects)
        return copied

    def _legacy_backfill_chunk_by_id(
        self,
        txn: Txn,
        job: BackfillJob,
        info: GroupInfo,
        limit: int,
        effects: list[tuple[Any, ...]],
        touched: set[int],
    ) -> Generator[None, None, int]:
        """A chunk of a kind 37 backfill (CREATE_GROUP_FROM_BACKLOG, written by the build
        before kind 38, main up to 53ca863), applied exactly as that build applied it, so
        its log and its stored job (``job.cursor``: a message id) give the state they
        gave there: read the stored messages after the cursor, in id order below the
        bound, and copy each of the topic that a source group (live or being deleted)
        still holds, at its published due time, unless it was copied ahead. It stops
        after ``limit`` messages of the topic,
        :data:`~futureq.state.commands.MAX_PURGE_ENTRIES` messages of any topic or
        :data:`MAX_BACKFILL_READ_BYTES` of them (the messages of other topics below the
        bound are read too). The job ends with the chunk that reads up to the bound.
        Any ``now_ms`` of the BACKFILL_GROUP is not read (that build wrote none).
        """
        gid = info.group_id
        first_mid = 0 if job.cursor is None else int.from_bytes(job.cursor, "big") + 1
        looked = read = read_bytes = copied = 0
        ended = True
        for key, data in self.store.scan("messages", _u64(first_mid), _u64(job.bound_id)):
            if (
                looked >= limit
                or read >= commands.MAX_PURGE_ENTRIES
                or read_bytes >= MAX_BACKFILL_READ_BYTES
            ):
                ended = False
                break
            read += 1
            read_bytes += len(data)
            if read % APPLY_STEP_ITEMS == 0:
                yield
            job.cursor = key
            mid = int.from_bytes(key, "big")
            if records.unpack(data)[0] != info.topic:
                continue
            looked += 1
            if txn.get("index", backfilled_key(gid, mid)) is not None:
                continue  # copied ahead
            record = self._record(txn, mid)
            if record is None or self._find_entry(txn, mid, gid, record.due_ms) is not None:
                continue
            for source in job.sources:
                found = self._backlog_entry(txn, job, source, mid, record.due_ms)
                if found is not None:
                    due_ms, expire_ms = _published_copy(record, found[1])
                    self._copy_backlog_entry(
                        txn, info, mid, record, due_ms, expire_ms, effects, touched
                    )
                    copied += 1
                    break
        # The marks of what the cursor passed (or all, at the end) are not needed any
        # more: the cursor never comes back; a marked message deleted meanwhile (the
        # new group acked it, the sources too) left its mark for this to remove.
        last_mid = job.bound_id if ended else int.from_bytes(job.cursor or _u64(0), "big") + 1
        if last_mid > first_mid:
            stop = backfilled_key(gid, last_mid)
            for mark, _ in self.store.scan("index", backfilled_key(gid, first_mid), stop):
                txn.put("index", mark, None)
        self._end_or_store_job(txn, job, ended, effects)
        return copied

    def _backfill_visit(
        self,
        txn: Txn,
        job: BackfillJob,
        info: GroupInfo,
        key: bytes,
        mid: int,
        effects: list[tuple[Any, ...]],
        touched: set[int],
    ) -> tuple[int, int]:
        """The cursor of exact backfill ``job`` reaches schedule key ``key`` of its
        current source, an entry of message ``mid``: copy the message unless it is
        handled already (marked, or held by a source the cursor passed); the entry is
        behind the cursor from now on, so its mark goes. Returns (copied: 0 or 1,
        message bytes read)."""
        data = txn.get("messages", _u64(mid))
        if data is None:
            return 0, 0
        record = MessageRecord.decode(data)
        entries = self._source_entries(txn, job, mid, record.due_ms)
        if not any(position == job.source and found == key for position, found, _ in entries):
            return 0, len(data)  # not pending at creation (a purge started before it)
        mark = backfilled_key(info.group_id, mid)
        marked = txn.get("index", mark) is not None
        copied = 0
        if not marked and not any(
            self._reached(job, position, found) for position, found, _ in entries
        ):
            copied = int(self._copy_held(txn, info, mid, record, entries, effects, touched))
        if marked:
            txn.put("index", mark, None)
        return copied, len(data)

    def _copy_held(
        self,
        txn: Txn,
        info: GroupInfo,
        mid: int,
        record: MessageRecord,
        entries: list[tuple[int, bytes, bytes]],
        effects: list[tuple[Any, ...]],
        touched: set[int],
        skip: int | None = None,
    ) -> bool:
        """Copy message ``mid`` to group ``info`` of an exact backfill as its source
        ``entries`` hold it (:meth:`_copy_time`; ``skip``: as there), unless none is
        live or the group has an entry of it already. True if it copied."""
        copy = self._copy_time(entries, record, skip)
        if copy is None or self._find_entry(txn, mid, info.group_id, record.due_ms) is not None:
            return False
        self._copy_backlog_entry(txn, info, mid, record, *copy, effects, touched)
        return True

    def _end_or_store_job(
        self,
        txn: Txn,
        job: PurgeJob | BackfillJob,
        ended: bool,
        effects: list[tuple[Any, ...]],
    ) -> None:
        """After a PURGE_GROUP (of a live group) or BACKFILL_GROUP chunk: forget ``job``
        once ``ended`` (its stored key deleted, the group noted as changed), else
        store its cursor."""
        gid = job.group_id
        jobs: dict[int, Any]
        if isinstance(job, PurgeJob):
            jobs, prefix = self.purging, PURGING_PREFIX
        else:
            jobs, prefix = self.backfilling, BACKFILL_PREFIX
        if ended:
            del jobs[gid]
            txn.put("meta", prefix + gid.to_bytes(4, "big"), None)
            effects.append(("g", gid))
        elif isinstance(job, PurgeJob):
            self._store_purge(txn, job)
        else:
            self._store_backfill(txn, job)

    def _backfill_ahead(
        self,
        txn: Txn,
        mid: int,
        record: MessageRecord,
        effects: list[tuple[Any, ...]],
        touched: set[int],
        leaving: int | None = None,
        *,
        expiring: bool = False,
        new_due: int | None = None,
    ) -> bool:
        """Before a change of message ``mid``'s source entries, copy it ahead to each
        group an exact backfill fills that has not handled it yet, and keep a mark
        where the chunks must skip it. True if any copy was made.

        ``leaving``: a source group whose entry of ``mid`` is about to go (``new_due``
        None) or move to ``new_due`` (only the backfills reading that group look);
        None: before a CANCEL or RESCHEDULE names the message, each backfill copies it
        if a source group holds it (so the command then treats the new group's copy
        as it treats the others). The copy is due as :meth:`_copy_time` says, with
        the source entries as they are before the change. ``expiring``:
        ``leaving``'s entry goes because it expired, so it is not a source of the copy.

        A message is *handled* once copied or looked at by the chunks: it is then
        marked (``b`` key) exactly while every source entry of it that the backfill
        counts lies ahead of the cursor, so the chunks skip it when they get there;
        otherwise a source the cursor passed holds it, which tells them the same.

        A job of kind 37 follows its own rules
        (:meth:`_legacy_backfill_ahead_by_id`), in the same order of jobs.
        """
        copied = False
        for job in self.backfilling.values():
            if not job.exact or mid >= job.bound_id:
                continue
            if leaving is not None and leaving not in job.sources:
                continue
            if job.legacy_by_id:
                if new_due is None and self._legacy_backfill_ahead_by_id(
                    txn, job, mid, record, effects, touched, leaving
                ):
                    copied = True
                continue
            info = self.groups.get(job.group_id)
            if info is None or info.topic != record.topic:
                continue
            entries = self._source_entries(txn, job, mid, record.due_ms)
            after = [(position, found) for position, found, _ in entries]
            skip = None
            if leaving is not None:
                moving = job.sources.index(leaving)
                after = [item for item in after if item[0] != moving]
                if new_due is not None and any(item[0] == moving for item in entries):
                    after.append((moving, commands.schedule_key(leaving, new_due, mid)))
                if expiring:
                    skip = moving
            mark = backfilled_key(info.group_id, mid)
            marked = txn.get("index", mark) is not None
            handled = marked or any(self._reached(job, p, found) for p, found, _ in entries)
            if not handled and entries:
                if self._copy_held(txn, info, mid, record, entries, effects, touched, skip):
                    copied = True
                handled = True
            needed = handled and bool(after) and not any(self._reached(job, p, k) for p, k in after)
            if needed != marked:
                txn.put("index", mark, b"" if needed else None)
        return copied

    def _legacy_backfill_ahead_by_id(
        self,
        txn: Txn,
        job: BackfillJob,
        mid: int,
        record: MessageRecord,
        effects: list[tuple[Any, ...]],
        touched: set[int],
        leaving: int | None,
    ) -> bool:
        """:meth:`_backfill_ahead` for one job of kind 37 (``job.legacy_by_id``), exactly
        as the build that wrote kind 37 (main up to 53ca863) applied it: unless its
        cursor (a message id) passed ``mid``, the message is marked or the group holds
        it, copy it at its published due time from the first source that holds it
        (``leaving``: only from that group, whose entry is about to go), and mark it.
        That build looked only before an entry went, never before one moved: the
        caller does not call this for a move. True if it copied."""
        if job.cursor is not None and mid <= int.from_bytes(job.cursor, "big"):
            return False
        info = self.groups.get(job.group_id)
        if info is None or info.topic != record.topic:
            return False
        mark = backfilled_key(info.group_id, mid)
        if txn.get("index", mark) is not None:
            return False
        if self._find_entry(txn, mid, info.group_id, record.due_ms) is not None:
            return False
        found = None
        for source in job.sources if leaving is None else [leaving]:
            found = self._backlog_entry(txn, job, source, mid, record.due_ms)
            if found is not None:
                break
        if found is None:
            return False
        due_ms, expire_ms = _published_copy(record, found[1])
        self._copy_backlog_entry(txn, info, mid, record, due_ms, expire_ms, effects, touched)
        txn.put("index", mark, b"")
        return True

    @staticmethod
    def _reached(job: BackfillJob, position: int, key: bytes) -> bool:
        """True if the chunks of exact backfill ``job`` have read schedule key ``key``
        of its source at ``position`` in ``job.sources``."""
        if position != job.source:
            return position < job.source
        return job.cursor is not None and key <= job.cursor

    def _source_entries(
        self, txn: Txn, job: BackfillJob, mid: int, published_due_ms: int
    ) -> list[tuple[int, bytes, bytes]]:
        """``(position in job.sources, schedule key, value)`` of each source entry of
        ``mid`` that exact backfill ``job`` counts (:meth:`_backlog_entry`)."""
        out = []
        for position, source in enumerate(job.sources):
            found = self._backlog_entry(txn, job, source, mid, published_due_ms)
            if found is not None:
                out.append((position, found[0], found[1]))
        return out

    def _exact_backfill_below(self, mid: int) -> bool:
        """True if an exact backfill (kind 37 or 38) may owe ``mid`` to its
        group (it is older than the group): a cheap test before reading its record."""
        return any(job.exact and mid < job.bound_id for job in self.backfilling.values())

    def _backlog_entry(
        self, txn: Txn, job: BackfillJob, source: int, mid: int, published_due_ms: int
    ) -> tuple[bytes, bytes] | None:
        """Source group ``source``'s entry of ``mid`` if it was pending there when the
        group of exact backfill ``job`` was created: not one a PURGE started before
        then has yet to remove (those count as removed already, as the dispatcher
        and BROWSE treat them), even once a later PURGE or the source's deletion took
        that purge's place (``job.purged``)."""
        if mid < job.purged.get(source, 0):
            return None
        purge = self.purging.get(source)
        if purge is not None and mid < purge.bound_id < job.bound_id:
            return None
        return self._find_entry(txn, mid, source, published_due_ms)

    def _copy_time(
        self,
        entries: list[tuple[int, bytes, bytes]],
        record: MessageRecord,
        skip: int | None = None,
    ) -> tuple[int, int | None] | None:
        """``(due_ms, expire_ms)`` an exact backfill's group gets a message with, from
        its source ``entries`` (:meth:`_source_entries`), or None when none is live.

        The message as the source groups hold it: the earliest due time among their
        entries of it, with that entry's expiry (ties: the source with the lowest id). So a RESCHEDULE, a NACK's retry delay or a REDRIVE
        delay a source entry got before the group existed carries over (never the
        published due time instead); with several sources, the one that would deliver
        it first counts. An entry that expired by :attr:`backfill_now_ms`, or expires
        before it falls due (a NACK moved it past its TTL), is not pending; nor is
        the one at position ``skip`` (an entry being expired). A parked dead letter counts as held but
        sets no time: held only parked, the message comes at its published due time
        (the new group has never tried it), with its published expiry.
        """
        now_ms = self.backfill_now_ms
        best: tuple[int, int | None] | None = None
        parked = False
        for position, key, value in entries:
            if position == skip:
                continue
            due_ms = commands.parse_schedule_key(key)[1]
            expire_ms = records.unpack(value)[1]
            if due_ms == PARKED_DUE_MS:
                parked = True
            elif expire_ms is not None and expire_ms <= max(due_ms, now_ms):
                continue
            elif best is None or due_ms < best[0]:
                best = (due_ms, expire_ms)
        if best is None and parked:
            due_ms, expire_ms = _published_copy(record, None)
            if expire_ms is None or expire_ms > max(due_ms, now_ms):
                best = (due_ms, expire_ms)
        return best

    def _backfill_leaving(
        self,
        txn: Txn,
        gid: int,
        mid: int,
        message: bytes | None,
        effects: list[tuple[Any, ...]],
        touched: set[int],
        *,
        expiring: bool = False,
        new_due: int | None = None,
    ) -> None:
        """Group ``gid``'s entry of ``mid`` is about to go (ACK, CANCEL, EXPIRE,
        dead-lettering, PURGE, a deleted group's purge) or move to ``new_due`` (NACK,
        RESCHEDULE, parking): each exact backfill reading ``gid`` that has not handled
        ``mid`` copies it ahead (:meth:`_backfill_ahead`; ``expiring``: an EXPIRE). A
        job of kind 37 looks only when the entry goes (as its build did).
        ``message``: its stored bytes if the caller just read them."""
        if not any(
            job.exact
            and mid < job.bound_id
            and gid in job.sources
            and (new_due is None or not job.legacy_by_id)
            for job in self.backfilling.values()
        ):
            return
        mkey = _u64(mid)
        if message is None or mkey in txn.changes["messages"]:
            message = txn.get("messages", mkey)
        if message is not None:
            record = MessageRecord.decode(message)
            self._backfill_ahead(
                txn,
                mid,
                record,
                effects,
                touched,
                leaving=gid,
                expiring=expiring,
                new_due=new_due,
            )

    def _copy_backlog_entry(
        self,
        txn: Txn,
        info: GroupInfo,
        mid: int,
        record: MessageRecord,
        due_ms: int,
        expire_ms: int | None,
        effects: list[tuple[Any, ...]],
        touched: set[int],
    ) -> None:
        """Give group ``info`` (being filled from the backlog) an entry of message
        ``mid``, due at ``due_ms`` and expiring at ``expire_ms`` (ms; None: never),
        never delivered; where it is due is remembered when that is not the message's
        published due time (so it is found by id, as a moved entry is)."""
        gid = info.group_id
        txn.put("schedule", commands.schedule_key(gid, due_ms, mid), records.pack([0, expire_ms]))
        if due_ms != record.due_ms:
            txn.put("index", moved_key(mid, gid), _u64(due_ms))
        record.open += 1
        txn.put("messages", _u64(mid), record.encode())
        info.pending += 1
        self.total_pending += 1
        touched.add(gid)
        effects.append(("s", gid, due_ms, mid, expire_ms, 0))

    def _backfill_one(
        self,
        txn: Txn,
        mid: int,
        record: MessageRecord,
        effects: list[tuple[Any, ...]],
        touched: set[int],
    ) -> bool:
        """Copy message ``mid`` now to every group being filled from the backlog that
        the backfill would give it and that has no entry of it yet (it is older than
        the group and pending in one of the group's source groups). True if any was.

        Before a RESCHEDULE moves it: the backfill's cursor walks the source groups in
        due order, so an entry moved behind it was never copied (the new group never
        got the message), and one copied later came at its published due time, not at
        the time a RESCHEDULE of every group gave it.
        """
        copied = False
        for job in self.backfilling.values():
            info = self.groups.get(job.group_id)
            if job.exact or info is None or info.topic != record.topic or mid >= job.bound_id:
                continue
            if mid in job.copied:
                continue
            if self._find_entry(txn, mid, info.group_id, record.due_ms) is not None:
                continue
            for source in job.sources:
                if source not in self.groups:
                    continue
                found = self._find_entry(txn, mid, source, record.due_ms)
                if found is not None:
                    due_ms, expire_ms = _published_copy(record, found[1])
                    self._copy_backlog_entry(
                        txn, info, mid, record, due_ms, expire_ms, effects, touched
                    )
                    job.copied.add(mid)
                    self._store_backfill(txn, job)
                    copied = True
                    break
        return copied

    # ------------------------------------------------------------ REDRIVE

    def _redrive(
        self,
        txn: Txn,
        index: int,
        publish_ms: int,
        group_id: int,
        keys: list[Any],
        due_ms: int,
        effects: list[tuple[Any, ...]],
        touched: set[int],
    ) -> Generator[None, None, list[int]]:
        """Move dead letters of a dead-letter topic's group back where they died.

        Each becomes a new message (id ``message_id(index, position)``) of its original
        topic for its original group only, due at ``due_ms``, with its headers (the
        provenance included, plus ``futureq-redriven-from``); its dead letter is
        removed. Returns per key DONE, UNKNOWN (not a dead letter of that group any
        more) or NO_TARGET (its original group is gone: it stays).
        """
        out: list[int] = []
        first_id = commands.message_id(index, 0)
        info = self.groups.get(group_id) if type(group_id) is int else None
        self._note_publish_ms(txn, publish_ms)
        for position, key in enumerate(keys):
            if position % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
                yield
            if info is None or type(key) is not bytes or len(key) != commands.SCHEDULE_KEY_BYTES:
                out.append(ItemStatus.UNKNOWN)
                continue
            gid, _, mid = commands.parse_schedule_key(key)
            value = txn.get("schedule", key)
            record = self._record(txn, mid) if gid == group_id and value is not None else None
            if record is None:
                out.append(ItemStatus.UNKNOWN)
                continue
            headers = dict(record.headers or {})
            target = self.find_group(
                headers.get(records.HEADER_ORIGINAL_TOPIC, ""),
                headers.get(records.HEADER_ORIGINAL_GROUP, ""),
            )
            if target is None or target.dead_letter_topic != info.topic:
                out.append(ItemStatus.NO_TARGET)
                continue
            self._drop_entry(txn, key, CommandKind.REDRIVE, effects, touched, value)
            headers[records.HEADER_REDRIVEN_FROM] = str(mid)
            self._insert_message(
                txn,
                first_id + position,
                target.topic,
                record.payload,
                publish_ms,
                max(due_ms, publish_ms),
                None,
                headers,
                [target],
                effects,
                touched,
            )
            out.append(ItemStatus.DONE)
        return out

    # ------------------------------------------------------------ dead letters

    def _dead_letter_entry(
        self,
        txn: Txn,
        key: bytes,
        info: GroupInfo,
        entry: EntryValue,
        reason: str,
        reason_text: str | None,
        publish_ms: int,
        items: list[list[Any]],
        effects: list[tuple[Any, ...]],
        touched: set[int],
    ) -> bool:
        """Send one entry to its group's dead-letter topic (an item appended to
        ``items``, published by the caller) with its provenance as headers; on a
        dead-letter topic, park it instead. False when there is nothing to move."""
        _, due_ms, mid = commands.parse_schedule_key(key)
        record = self._record(txn, mid)
        if record is None:
            return False
        dead_letter_topic = info.dead_letter_topic
        if dead_letter_topic is None:
            self._park(txn, key, info.group_id, due_ms, mid, entry, effects, touched)
            return True
        if self._drop_entry(txn, key, CommandKind.DEAD_LETTER, effects, touched) is None:
            return False
        headers = records.provenance_headers(
            record.headers, mid, info.topic, info.name, entry, reason, reason_text, publish_ms
        )
        items.append([dead_letter_topic, record.payload, publish_ms, None, headers, None])
        return True

    def _park(
        self,
        txn: Txn,
        key: bytes,
        gid: int,
        due_ms: int,
        mid: int,
        entry: EntryValue,
        effects: list[tuple[Any, ...]],
        touched: set[int],
    ) -> None:
        """Keep an entry of a dead-letter topic but never deliver it again (due at
        :data:`~futureq.state.records.PARKED_DUE_MS`, no expiry) until it is redriven,
        rescheduled, cancelled or purged."""
        entry.expire_ms = None
        if due_ms == PARKED_DUE_MS:
            txn.put("schedule", key, entry.encode())
            return
        self._move_entry(
            txn,
            key,
            gid,
            due_ms,
            mid,
            PARKED_DUE_MS,
            entry,
            CommandKind.DEAD_LETTER,
            effects,
            touched,
        )

    # ------------------------------------------------------------ idempotency keys

    def _claim_idempotency_key(
        self, txn: Txn, topic: str, key: str, mid: int, publish_ms: int, window_ms: int
    ) -> int | None:
        """The id of the message ``key`` already names on ``topic``, or None after
        making it name ``mid``.

        A key names its message while that message is stored (pending in some group),
        and for ``window_ms`` after its publish stamp once it is not.
        """
        index_key = idempotency_index_key(topic, key)
        found = txn.get("index", index_key)
        if found is not None:
            original, original_ms = records.unpack(found)
            if txn.get("messages", _u64(original)) is not None or (
                publish_ms - original_ms < window_ms
            ):
                return int(original)
            txn.put("index", KEY_TIME + _u64(original_ms) + _u64(original), None)
        txn.put("index", index_key, records.pack([mid, publish_ms]))
        self._put_key_time(txn, KEY_TIME + _u64(publish_ms) + _u64(mid), index_key)
        return None

    def _put_key_time(self, txn: Txn, time_key: bytes, index_key: bytes) -> None:
        """Write a ``t`` key, keeping :attr:`key_time_floor` at or below it (stamps are
        not strictly in log order: a publish may be stamped before another that is
        proposed first)."""
        txn.put("index", time_key, index_key)
        if time_key < self.key_time_floor:
            self.key_time_floor = time_key

    def _prune_idempotency_keys(
        self, txn: Txn, publish_ms: int, window_ms: int
    ) -> Generator[None, None, None]:
        """Forget keys published more than ``window_ms`` ago whose message is gone;
        look again one window later at those whose message is still pending.

        Looks at a bounded number of keys (:data:`PRUNE_MIN_KEYS`, more for a batch
        that brought keys), oldest first.
        """
        budget = PRUNE_MIN_KEYS + 2 * sum(1 for key in txn.changes["index"] if key[:1] == KEY_TIME)
        stop = KEY_TIME + _u64(max(0, publish_ms - window_ms))
        # Every key a prune looks at is deleted (or moved to ``publish_ms``), so the
        # range's start holds the tombstones of all keys pruned since RocksDB last
        # compacted it: a scan from KEY_TIME stepped over each of them on every keyed
        # PUBLISH. It starts at the floor instead, past them; what it finds is the same.
        start = self.key_time_floor
        floor = stop
        for looked, (time_key, index_key) in enumerate(self.store.scan("index", start, stop)):
            if looked >= budget:
                floor = time_key  # the first key not looked at
                break
            if looked % APPLY_STEP_ITEMS == APPLY_STEP_ITEMS - 1:
                yield
            if time_key in txn.changes["index"]:
                continue  # replaced by this very command
            mid = int.from_bytes(time_key[9:17], "big")
            txn.put("index", time_key, None)
            if txn.get("messages", _u64(mid)) is not None:
                self._put_key_time(txn, KEY_TIME + _u64(publish_ms) + _u64(mid), index_key)
                continue
            current = txn.get("index", index_key)
            if current is not None and records.unpack(current)[0] == mid:
                txn.put("index", index_key, None)
        # Every key below ``floor`` was deleted by this command; the keys it puts are
        # stamped ``publish_ms``, above ``stop``. (``start`` already sits below any key an
        # earlier command put out of stamp order; it may lie above an empty range.)
        self.key_time_floor = max(floor, start)
