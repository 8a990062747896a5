"""The commands that go in the log, and their msgpack form (list form, first the kind).

Every state change of the queue is one of these, proposed by the leader and applied by
:meth:`futureq.state.queue_state.QueueState.apply` on every replica in log order. The
leader stamps wall-clock times into the command; apply never reads a clock.

Layouts (``DESIGN.md``, "Data flow"):

* ``[NOOP]``
* ``[PUBLISH, publish_ms, [item, ...], settings, idempotency_window_ms]``, an item
  ``[topic, payload, due_ms, ttl_ms | None]`` or ``[..., headers | None,
  idempotency_key | None]``
* ``[ACK, [schedule_key, ...]]``; ``[ACK_FOLLOWING, [schedule_key, ...]]`` (an ACK that
  follows an entry a RESCHEDULE moved while the ACK was being committed;
  RELEASE_FOLLOWING and NACK_FOLLOWING likewise, laid out as RELEASE and NACK)
* ``[NACK, now_ms, requeue_delay_ms, [[schedule_key, attempt, pushed_ms?], ...],
  reason | None, dead_letter, settings]``
* ``[EXPIRE, [schedule_key, ...], publish_ms, settings]``
* ``[EXPIRE_COUNTED, [schedule_key, ...], publish_ms, settings, out]`` (an EXPIRE that
  dead-letters entries whose deliveries the log did not record)
* ``[DEAD_LETTER_PROVENANCE, publish_ms, [[schedule_key, attempt, first_ms?], ...], settings]``
  (written since issue 14; ``[DEAD_LETTER, publish_ms, [[schedule_key, attempt], ...],
  settings]`` from earlier builds replays as they applied it)
* ``[CREATE_GROUP, topic, group, visibility_timeout_ms | None, max_deliveries | None,
  settings, dead_letter_expired | None, from_backlog]``; ``[CREATE_GROUP_FROM_BACKLOG_AS_HELD,
  topic, group, visibility_timeout_ms | None, max_deliveries | None, settings,
  dead_letter_expired | None]`` (written for ``from_backlog`` since the backfill is the set
  pending at creation, due as the source groups held it; ``[CREATE_GROUP_FROM_BACKLOG,
  ...]`` laid out alike, from the build before, replays as it applied)
* ``[DELETE_GROUP, topic, group]``
* ``[NODE_ADDRESS, node_id, raft_address | None, client_address | None]`` (None: forget)
* ``[DELIVERED, [[schedule_key, attempt, first_ms?], ...], now_ms]``
* ``[PURGE_GROUP, group_id, max_entries]``
* ``[RELEASE, [[schedule_key, attempt], ...]]``
* ``[RETURN_COUNTED, [[schedule_key, attempt, pushed_ms], ...]]`` (deliveries that went
  out unrecorded and count: their consumer left, or the leader is handing over)
* ``[HANDED_OUT, [[schedule_key, attempt, stamp, pushed_ms, deadline_ms], ...]]``
  (deliveries out when the leader hands over: they count, and stay out, settleable by
  their tag, until ``deadline_ms`` whoever leads)
* ``[CANCEL, topic, group_id | None, [message_id, ...], out?]``
* ``[RESCHEDULE_COUNTED, now_ms, topic, group_id | None, [message_id, ...], due_ms, out]``
  (written since RESCHEDULE keeps attempts the log did not record; ``[RESCHEDULE, now_ms, topic, group_id |
  None, [message_id, ...], due_ms]`` from earlier builds replays as they applied it);
  ``[RESCHEDULE_BACKFILLING, ...]`` laid out alike (written while a group of the topic
  is being filled from the backlog)
* ``[PURGE, [group_id, ...]]``
* ``[BACKFILL_GROUP, group_id, max_entries, now_ms?]`` (``now_ms``: the leader's cluster
  time, so a backfill of kind 38 leaves out what expired; earlier builds wrote none, and
  a job of kind 6 or 37 never reads it)
* ``[REDRIVE, publish_ms, group_id, [schedule_key, ...], due_ms]``

Fields after the first few were added later; a command written before a field existed
lacks it, and apply takes the field's default (None, False, :data:`BUILTIN_GROUP_SETTINGS`,
no idempotency window), so old log entries apply as they always did.

``out`` is ``[[schedule_key, attempt], ...]``: deliveries of the named messages the
*leader* knows went out that the log may not have recorded (a first delivery is pushed
unrecorded; one that timed out goes back to the leader's index with its attempt).
Apply raises each entry's attempt to at least that, so a command that rewrites or
removes an entry never forgets a delivery that is out (``DESIGN.md``, "Apply reads
nothing node-local": the leader resolves what only it knows into the command).

``settings`` is ``[visibility_timeout_ms, max_deliveries]`` (and ``dead_letter_expired``
when true): the group settings the *leader* resolved from its configuration
(``[queue]``) for any group the command creates without settings of its own (an
implicit ``default`` group of a new topic or dead-letter topic, or a CREATE_GROUP of a
new group with ``None`` fields). Apply never reads a node's configuration
(``DESIGN.md``, "Apply reads nothing node-local"), so every replica creates the group
with the same settings. The idempotency window is resolved the same way
(``queue.idempotency_window_ms`` of the leader).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from typing import Any, Final

import attrs
import msgpack
import msgspec


class CommandKind(enum.IntEnum):
    """First element of every command; numbers are stored in logs and never change."""

    NOOP = 0
    PUBLISH = 1
    ACK = 2
    NACK = 3
    EXPIRE = 4
    DEAD_LETTER = 5
    CREATE_GROUP = 6
    DELETE_GROUP = 7
    NODE_ADDRESS = 8
    # 9-14 belong to other work (trust, time); 15-19 to delivery state (issue 9).
    DELIVERED = 15
    PURGE_GROUP = 16
    RELEASE = 17
    # 20-24: limits and k8s work; 25-39: managing scheduled messages (issue 14).
    CANCEL = 25
    RESCHEDULE = 26
    PURGE = 27
    BACKFILL_GROUP = 28
    REDRIVE = 29
    DEAD_LETTER_PROVENANCE = 30
    """DEAD_LETTER as builds with issue 14 apply it: dead letters carry their provenance
    as headers, and an entry of a dead-letter topic is parked. Kind 5 (DEAD_LETTER) in
    a log replays exactly as earlier builds applied it (no headers; an entry of a
    dead-letter topic left in place), so an old log gives the state it gave before; a
    node of an earlier build refuses kind 30 instead of applying it differently."""
    RESCHEDULE_COUNTED = 31
    """RESCHEDULE as builds apply it since it counts unrecorded deliveries: the command carries
    the deliveries the leader knows are out (``out``), so attempts are kept even for a
    first delivery the log never recorded, and a *parked* dead letter rescheduled gets a
    fresh allowance of ``max_deliveries`` (its earlier deliveries stop counting, as
    released ones do) so it is delivered again. Kind 26 (RESCHEDULE) in a log replays
    exactly as earlier builds applied it; a node of an earlier build refuses kind 31."""
    EXPIRE_COUNTED = 32
    """EXPIRE that carries the deliveries the leader knows are out (``out``): an entry of a
    ``dead_letter_expired`` group whose only deliveries were never recorded (a first
    delivery that timed out, or whose consumer left) is dead-lettered with those
    attempts in its ``futureq-attempts`` header, not 0. Written only when there is such
    a delivery; kind 4 (EXPIRE) otherwise, so a node of an earlier build refuses kind 32
    only where it would have written different headers."""
    ACK_FOLLOWING = 33
    """ACK that also acknowledges an entry a RESCHEDULE moved after the leader took the
    ACK: a key not found is looked up by its message and group where the entry is now
    (the ``index`` family's moved key), and that entry is removed. Found by a tester: a
    RESCHEDULE committed between an ACK's claim and its commit moved the entry away
    from the key the ACK named, so the ACK removed nothing, the consumer was told OK,
    and the message was delivered again at its new time. Written only while a
    RESCHEDULE is being committed on the leader (kind 2 otherwise), so a node of an
    earlier build refuses kind 33 only where it would have applied it differently."""
    RELEASE_FOLLOWING = 34
    """RELEASE (kind 17) that follows an entry a RESCHEDULE moved meanwhile, as
    ACK_FOLLOWING does: the release is applied to the entry where it is now (its
    attempt not counted; due at once). Before, the release applied to nothing, was
    answered OK, and the delivery counted (with ``max_deliveries`` 1 the message went
    to the dead-letter topic unprocessed). Written only while a RESCHEDULE is being
    committed on the leader."""
    NACK_FOLLOWING = 35
    """NACK (kind 3, same layout) that follows an entry a RESCHEDULE moved meanwhile, as
    ACK_FOLLOWING does: the entry where it is now is due after the NACK's delay, or
    dead-lettered when the NACK says so (before, a NACK with ``dead_letter`` was
    answered OK and the message was delivered again at its new time). Written only
    while a RESCHEDULE is being committed on the leader."""
    RESCHEDULE_BACKFILLING = 36
    """RESCHEDULE_COUNTED (kind 31, same layout) written while a group of the topic is
    being filled from the backlog (CREATE_GROUP ``from_backlog``): before moving a
    message, apply first copies it to each such group that should get it and has not
    yet (as the backfill would), so the move can neither carry it behind the
    backfill's cursor, where it was never copied (found by a tester: the new group
    never got it), nor leave the new group a copy at the old time (a RESCHEDULE of
    every group, then the backfill copied it at its published due time: delivered
    before the time the RESCHEDULE gave). Written only while such a backfill runs, so
    a node of an earlier build refuses kind 36 only where it would apply it differently."""
    CREATE_GROUP_FROM_BACKLOG = 37
    """CREATE_GROUP (kind 6) with ``from_backlog``, same layout without the flag, whose
    backfill gives the new group exactly the set of messages pending in the topic when
    it was created, each once, at its published due time: the chunks walk the messages
    by id, and a message the chunks have not reached yet is copied ahead (and marked,
    so the chunks skip it) when a source group lets go of its entry (ACK, CANCEL,
    EXPIRE, dead-lettering, PURGE, a deleted group's purge) and before a CANCEL or
    RESCHEDULE names it. Found by a tester: under kind 6 a message acked or cancelled
    in the only source group before the chunks reached it never reached the new group,
    and one the new group had acked was copied again from a second source group (or
    from the same one after a NACK moved it ahead of the cursor) and delivered again.
    Written by the builds between kind 6 and kind 38 (main up to 53ca863); builds since
    write CREATE_GROUP_FROM_BACKLOG_AS_HELD (38) and replay kind 37, and the job it
    stored, as those builds applied them
    (:meth:`~futureq.state.manage_ops.ManageOps._legacy_backfill_chunk_by_id`). Kind 6
    with ``from_backlog`` in a log replays as it applied; a node of an earlier build
    refuses kind 37."""
    CREATE_GROUP_FROM_BACKLOG_AS_HELD = 38
    """CREATE_GROUP_FROM_BACKLOG (kind 37, same layout) whose backfill gives each message
    due as the source groups held it at creation, and reads only its topic: the chunks
    walk the source groups' schedules (kind 37's walk the messages by id, every topic's)
    and copy each message at the earliest due time among its live source entries, with
    that entry's expiry (kind 37: at its published due time, so a RESCHEDULE or NACK
    delay made before the group existed was lost), leaving out what expired by the
    cluster time its BACKFILL_GROUP carries. A message they have not handled yet is
    copied ahead (and marked while they must skip it) when a source group lets go of or
    moves its entry (ACK, CANCEL, EXPIRE, dead-lettering, PURGE, a deleted group's
    purge, NACK, RESCHEDULE, parking) and before a CANCEL or RESCHEDULE names it. Its
    job is stored with its kind (:mod:`futureq.state.manage_ops`), so a restart resumes
    it with these rules and a kind 37 job with its own. A node of an earlier build
    refuses kind 38."""
    RETURN_COUNTED = 40
    """Deliveries that went out and count, whose attempt the log never recorded (a first
    delivery is pushed unrecorded): the subscription ended (UNSUBSCRIBE, its connection
    closed, a slow consumer evicted), the visibility timeout passed, or the leader is
    shutting down or handing leadership over with them out. Apply raises each entry's
    attempt to at least the one given and records ``pushed_ms`` as a delivery time, so
    a restart or a new leader continues the count instead of delivering attempt 1
    again (``docs/protocol.md``, UNSUBSCRIBE: "each counting as an attempt"). Unlike
    RELEASE (kind 17), which records an attempt that does *not* count, it leaves
    ``released`` alone and moves nothing; a node of an earlier build refuses kind 40."""
    HANDED_OUT = 41
    """Deliveries out when the leader hands leadership over (a SIGTERM, TRANSFER_LEADER),
    each with its tag stamp and visibility deadline: apply records the attempt as
    RETURN_COUNTED does and *holds* the entry for that delivery (``EntryValue.held_*``),
    so the next leader keeps it out, invisible to the group, until the deadline, and
    honours an ACK, NACK, RELEASE or EXTEND carrying that tag from any connection
    meanwhile. Found by a tester: an application handed a delivery by the old leader
    that acked it on the new one was refused (the tag was known only to the old
    leader's memory), the message was delivered again at once, and with
    ``max_deliveries`` 1 the processed message went to the dead-letter topic. A node
    of an earlier build refuses kind 41."""


@attrs.frozen
class GroupSettings:
    """Settings of a consumer group: what a leader resolves defaults into.

    Attributes:
        visibility_timeout_ms: How long a delivery may stay unsettled before it is
            delivered again (ms, >= 1).
        max_deliveries: Counted attempts before a message is dead-lettered (>= 1).
        dead_letter_expired: An expired message goes to the dead-letter topic (on a
            dead-letter topic: is parked) instead of being dropped.
    """

    visibility_timeout_ms: int = 30_000
    max_deliveries: int = 16
    dead_letter_expired: bool = False

    def to_wire(self) -> list[Any]:
        """The ``settings`` element of a command."""
        if self.dead_letter_expired:
            return [self.visibility_timeout_ms, self.max_deliveries, True]
        return [self.visibility_timeout_ms, self.max_deliveries]

    @classmethod
    def from_wire(cls, value: Any) -> GroupSettings:
        """The settings of a command element (None: :data:`BUILTIN_GROUP_SETTINGS`)."""
        if value is None:
            return BUILTIN_GROUP_SETTINGS
        return cls(value[0], value[1], bool(value[2]) if len(value) > 2 else False)


BUILTIN_GROUP_SETTINGS: Final = GroupSettings()
"""What entries written before commands carried ``settings`` resolve to (30 s, 16)."""
MAX_PURGE_ENTRIES: Final = 10_000
"""Most schedule entries one PURGE_GROUP (or BACKFILL_GROUP) looks at, whatever the
command asks."""


_SCHEDULE = struct.Struct(">IQQ")
_TAG = struct.Struct(">IQQI")
SCHEDULE_KEY_BYTES: Final = _SCHEDULE.size  # 20
DELIVERY_TAG_BYTES: Final = _TAG.size  # 24
ID_BATCH_BITS: Final = 16
"""Message id = (log index << 16) | position in the batch (``DESIGN.md``)."""
MAX_BATCH_POSITIONS: Final = 1 << ID_BATCH_BITS


def message_id(index: int, position: int) -> int:
    """The id of the message at ``position`` of the batch applied at log ``index``."""
    assert 0 <= position < MAX_BATCH_POSITIONS
    return (index << ID_BATCH_BITS) | position


def schedule_key(group_id: int, due_ms: int, mid: int) -> bytes:
    """``schedule`` family key: group id (4 bytes), due time (8), message id (8), big-endian.

    Keys of one group sort by due time, then by id (publish order).
    """
    return _SCHEDULE.pack(group_id, due_ms, mid)


pack_schedule_key: Final = _SCHEDULE.pack
""":func:`schedule_key` without the call in between (hot paths): ``(group_id, due_ms,
mid) -> bytes``."""


def parse_schedule_key(key: bytes) -> tuple[int, int, int]:
    """``(group_id, due_ms, message_id)`` of a schedule key.

    Raises:
        struct.error: the key is not 20 bytes.
    """
    result: tuple[int, int, int] = _SCHEDULE.unpack(key)
    return result


def delivery_tag(key: bytes, attempt: int, salt: int = 0) -> bytes:
    """The 24-byte delivery tag: the schedule key, then the delivery's stamp (4 bytes):
    its attempt number plus the dispatching leader's ``salt``, modulo 2**32.

    The leader draws a new salt each time it starts dispatching (``Hub.tag_salt``), so
    a tag handed out before a leader change or a restart does not name the delivery
    that follows it, even one of the same attempt: a first delivery is not in the
    replicated state, so the next leader delivers it again as attempt 1, and its tag
    would otherwise be byte for byte the old one (``docs/protocol.md``, DELIVER: after
    a leader change an earlier tag is unknown).
    """
    return key + tag_stamp(attempt, salt).to_bytes(4, "big")


def tag_stamp(attempt: int, salt: int) -> int:
    """The last four bytes of a delivery tag, as a number: ``(attempt + salt) mod 2**32``."""
    return (attempt + salt) & 0xFFFFFFFF


def parse_delivery_tag(tag: bytes) -> tuple[bytes, int] | None:
    """``(schedule_key, stamp)`` of a tag (the stamp: see :func:`delivery_tag`), or None
    when it is not a well-formed tag."""
    if type(tag) is not bytes or len(tag) != DELIVERY_TAG_BYTES:
        return None
    return tag[:SCHEDULE_KEY_BYTES], int.from_bytes(tag[SCHEDULE_KEY_BYTES:], "big")


_encode: Final = msgspec.msgpack.Encoder().encode
"""msgspec's msgpack encoder: the bytes ``msgpack.Packer(use_bin_type=True)`` writes for
every type a command holds (IntEnum kinds as their numbers, str, bytes, int, None, bool,
lists, tuples, dicts; ``tests/unit/state/test_state_encoding.py``), in a third of the
time (a PUBLISH of 100 items: 3.3 against 10.6 us, ``bench.apply_cost``)."""


def encode(command: list[Any]) -> bytes:
    """msgpack bytes of a command list."""
    return _encode(command)


def decode(data: bytes) -> list[Any]:
    """The command list of msgpack bytes written by :func:`encode`."""
    value = msgpack.unpackb(data, raw=False, use_list=True)
    assert type(value) is list and value, "log entry is not a command"
    return value


PublishItem = (
    tuple[str, bytes, int, int | None]
    | tuple[str, bytes, int, int | None, dict[str, str] | None, str | None]
)
"""A validated item: ``(topic, payload, due_ms, ttl_ms)``, or with ``headers`` and
``idempotency_key`` after them."""


def publish(
    publish_ms: int,
    items: Sequence[PublishItem],
    settings: GroupSettings = BUILTIN_GROUP_SETTINGS,
    idempotency_window_ms: int = 0,
) -> bytes:
    """Encode a PUBLISH of validated items (:data:`PublishItem`).

    ``settings``: for the implicit group of a topic that has none (the leader's
    configured defaults). ``idempotency_window_ms``: how long after its publish an
    idempotency key still names its message once the message is gone (the leader's
    ``queue.idempotency_window_ms``).
    """
    return encode(publish_command(publish_ms, items, settings, idempotency_window_ms))


def publish_command(
    publish_ms: int,
    items: Sequence[PublishItem],
    settings: GroupSettings = BUILTIN_GROUP_SETTINGS,
    idempotency_window_ms: int = 0,
) -> list[Any]:
    """The PUBLISH command list :func:`publish` encodes (arguments as there).

    A proposer that keeps it can hand it to apply with the bytes, so the leader does not
    decode what it has just encoded (``QueueState.apply_steps``'s ``command``).
    """
    if idempotency_window_ms:
        return [CommandKind.PUBLISH, publish_ms, items, settings.to_wire(), idempotency_window_ms]
    return [CommandKind.PUBLISH, publish_ms, items, settings.to_wire()]


def ack(keys: list[bytes], following: bool = False) -> bytes:
    """Encode an ACK of schedule keys; with ``following``, an ACK_FOLLOWING (it also
    acknowledges an entry a RESCHEDULE moved from one of the keys meanwhile)."""
    return encode([CommandKind.ACK_FOLLOWING if following else CommandKind.ACK, keys])


def nack(
    now_ms: int,
    requeue_delay_ms: int,
    entries: list[tuple[bytes, int]] | list[tuple[bytes, int, int | None]],
    reason: str | None = None,
    dead_letter: bool = False,
    settings: GroupSettings = BUILTIN_GROUP_SETTINGS,
    following: bool = False,
) -> bytes:
    """Encode a NACK of ``(schedule_key, attempt[, pushed_ms])`` entries.

    Each is due again at now + delay; with ``dead_letter`` each goes to its dead-letter
    topic at once instead (reason ``rejected``). ``reason``: the consumer's text, kept
    with the entry and in the dead letter's headers. ``pushed_ms``: when the leader
    pushed that delivery (recorded as its delivery time). ``following``: a
    NACK_FOLLOWING (it also applies to an entry a RESCHEDULE moved meanwhile).
    """
    kind = CommandKind.NACK_FOLLOWING if following else CommandKind.NACK
    if reason is None and not dead_letter:
        return encode([kind, now_ms, requeue_delay_ms, entries])
    return encode(
        [
            kind,
            now_ms,
            requeue_delay_ms,
            entries,
            reason,
            dead_letter,
            settings.to_wire(),
        ]
    )


OutDeliveries = Sequence[tuple[bytes, int]] | Sequence[list[Any]]
"""``out`` of CANCEL, RESCHEDULE_COUNTED and EXPIRE_COUNTED: ``(schedule_key, attempt)`` of deliveries
the leader knows went out (see the module docstring)."""


def expire(
    keys: list[bytes],
    publish_ms: int | None = None,
    settings: GroupSettings = BUILTIN_GROUP_SETTINGS,
    out: OutDeliveries = (),
) -> bytes:
    """Encode an EXPIRE of schedule keys.

    ``publish_ms`` (the leader's stamp) and ``settings`` serve entries of groups that
    dead-letter what expires (``dead_letter_expired``). ``out``: deliveries of these
    entries the leader knows went out unrecorded; with any (and ``publish_ms``) the
    command is EXPIRE_COUNTED (kind 32), whose dead letters count them.
    """
    if publish_ms is None:
        return encode([CommandKind.EXPIRE, keys])
    if out:
        return encode(
            [
                CommandKind.EXPIRE_COUNTED,
                keys,
                publish_ms,
                settings.to_wire(),
                [list(item) for item in out],
            ]
        )
    return encode([CommandKind.EXPIRE, keys, publish_ms, settings.to_wire()])


def dead_letter(
    publish_ms: int,
    entries: list[tuple[bytes, int]] | list[tuple[bytes, int, int | None]],
    settings: GroupSettings = BUILTIN_GROUP_SETTINGS,
) -> bytes:
    """Encode a DEAD_LETTER of ``(schedule_key, attempt[, first_ms])`` entries.

    ``settings``: for the implicit group of a dead-letter topic that has none.
    ``first_ms``: when the leader pushed the entry's first delivery, if the log does
    not know it yet. An entry of a dead-letter topic is parked instead. Written as
    DEAD_LETTER_PROVENANCE (kind 30; see :class:`CommandKind`).
    """
    return encode([CommandKind.DEAD_LETTER_PROVENANCE, publish_ms, entries, settings.to_wire()])


def create_group(
    topic: str,
    group: str,
    visibility_timeout_ms: int | None,
    max_deliveries: int | None,
    settings: GroupSettings = BUILTIN_GROUP_SETTINGS,
    dead_letter_expired: bool | None = None,
    from_backlog: bool = False,
) -> bytes:
    """Encode a CREATE_GROUP (idempotent).

    A None field keeps an existing group's value; a new group takes it from
    ``settings`` (the leader's configured defaults). ``from_backlog``: a group this
    command creates gets every message of the topic pending in its other groups when
    it is created, once each, due as those groups held it (copied by BACKFILL_GROUP
    chunks); written as CREATE_GROUP_FROM_BACKLOG_AS_HELD (kind 38).
    """
    if from_backlog:
        return encode(
            [
                CommandKind.CREATE_GROUP_FROM_BACKLOG_AS_HELD,
                topic,
                group,
                visibility_timeout_ms,
                max_deliveries,
                settings.to_wire(),
                dead_letter_expired,
            ]
        )
    command: list[Any] = [
        CommandKind.CREATE_GROUP,
        topic,
        group,
        visibility_timeout_ms,
        max_deliveries,
        settings.to_wire(),
    ]
    if dead_letter_expired is not None:
        command += [dead_letter_expired, False]
    return encode(command)


def delete_group(topic: str, group: str) -> bytes:
    """Encode a DELETE_GROUP."""
    return encode([CommandKind.DELETE_GROUP, topic, group])


MAX_NODE_ID: Final = 2**31 - 1
"""Largest node id (its NODE_ADDRESS is stored under a 4-byte key). Ids are checked
against it where they enter (config, CLUSTER_ADD_NODE); apply ignores a NODE_ADDRESS
beyond it rather than fail on every replica."""


def node_address(node_id: int, raft_address: str | None, client_address: str | None) -> bytes:
    """Encode a NODE_ADDRESS: where a cluster member listens (None forgets the node)."""
    return encode([CommandKind.NODE_ADDRESS, node_id, raft_address, client_address])


def delivered(
    entries: list[tuple[bytes, int]] | list[tuple[bytes, int, int | None]],
    now_ms: int | None = None,
) -> bytes:
    """Encode a DELIVERED: ``(schedule_key, attempt[, first_ms])`` of deliveries about
    to be pushed, at ``now_ms`` (the leader's stamp, their delivery time).

    The leader commits it before it pushes them, so attempt counts survive leader
    changes and restarts and never go backwards. ``first_ms``: when the entry's first
    delivery (never recorded) was pushed, if the leader knows.
    """
    if now_ms is None:
        return encode([CommandKind.DELIVERED, entries])
    return encode([CommandKind.DELIVERED, entries, now_ms])


def purge_group(group_id: int, max_entries: int) -> bytes:
    """Encode a PURGE_GROUP: remove up to ``max_entries`` entries of a deleted group."""
    return encode([CommandKind.PURGE_GROUP, group_id, max_entries])


def release(entries: list[tuple[bytes, int]], following: bool = False) -> bytes:
    """Encode a RELEASE: ``(schedule_key, attempt)`` deliveries given back unprocessed.

    Each is due again at once and its attempt does not count towards
    ``max_deliveries``. ``following``: a RELEASE_FOLLOWING (it also applies to an entry
    a RESCHEDULE moved meanwhile).
    """
    kind = CommandKind.RELEASE_FOLLOWING if following else CommandKind.RELEASE
    return encode([kind, entries])


def return_counted(entries: Sequence[tuple[bytes, int, int]]) -> bytes:
    """Encode a RETURN_COUNTED: ``(schedule_key, attempt, pushed_ms)`` of deliveries that
    went out unrecorded and count (see :class:`CommandKind`). ``pushed_ms``: when the
    leader pushed that delivery (its first and last delivery time, as far as the log
    knows)."""
    return encode([CommandKind.RETURN_COUNTED, [list(item) for item in entries]])


def handed_out(entries: Sequence[tuple[bytes, int, int, int, int]]) -> bytes:
    """Encode a HANDED_OUT: ``(schedule_key, attempt, stamp, pushed_ms, deadline_ms)`` of
    deliveries out when the leader hands over (see :class:`CommandKind`). ``stamp``: the
    last four bytes of the delivery's tag as a number (:func:`tag_stamp`);
    ``pushed_ms``: when it went out; ``deadline_ms``: when its visibility timeout runs
    out (ms since the Unix epoch, the leader's clock, EXTENDs included)."""
    return encode([CommandKind.HANDED_OUT, [list(item) for item in entries]])


def cancel(topic: str, group_id: int | None, ids: list[int], out: OutDeliveries = ()) -> bytes:
    """Encode a CANCEL: remove messages of ``topic`` by id from one group (or every
    group, ``group_id`` None).

    ``out``: deliveries of them the leader knows went out, so an entry whose only
    delivery was never recorded is reported DELIVERED, not DONE. It changes only the
    answer, never the state, so a node of an earlier build that ignores it stays equal.
    """
    if out:
        return encode([CommandKind.CANCEL, topic, group_id, ids, [list(item) for item in out]])
    return encode([CommandKind.CANCEL, topic, group_id, ids])


def reschedule(
    now_ms: int,
    topic: str,
    group_id: int | None,
    ids: list[int],
    due_ms: int,
    out: OutDeliveries = (),
    backfilling: bool = False,
) -> bytes:
    """Encode a RESCHEDULE (as RESCHEDULE_COUNTED, kind 31): messages of ``topic`` by id
    get the new due time ``due_ms`` (in one group, or every group), stamped at
    ``now_ms``.

    ``out``: deliveries of them the leader knows went out; each entry's attempt is
    raised to at least that before it moves, so the delivery still counts.
    ``backfilling``: a group of ``topic`` is being filled from the backlog: written as
    RESCHEDULE_BACKFILLING (kind 36), which copies the messages there first.
    """
    return encode(
        [
            CommandKind.RESCHEDULE_BACKFILLING if backfilling else CommandKind.RESCHEDULE_COUNTED,
            now_ms,
            topic,
            group_id,
            ids,
            due_ms,
            [list(item) for item in out],
        ]
    )


def purge(group_ids: list[int]) -> bytes:
    """Encode a PURGE: every entry these groups hold now goes, by PURGE_GROUP chunks."""
    return encode([CommandKind.PURGE, group_ids])


def backfill_group(group_id: int, max_entries: int, now_ms: int | None = None) -> bytes:
    """Encode a BACKFILL_GROUP: copy the next chunk of the topic's backlog to a group
    created ``from_backlog``.

    ``now_ms``: the leader's cluster time (ms); a backfill of kind 38 does not copy a
    message whose entries expired by then (None: only what apply already knows expired,
    from the latest publish stamp). Earlier builds wrote no ``now_ms``; a job of kind 6
    or 37 applies its chunks as those builds did, whether it is given or not."""
    if now_ms is None:
        return encode([CommandKind.BACKFILL_GROUP, group_id, max_entries])
    return encode([CommandKind.BACKFILL_GROUP, group_id, max_entries, now_ms])


def redrive(publish_ms: int, group_id: int, keys: list[bytes], due_ms: int) -> bytes:
    """Encode a REDRIVE: dead letters (schedule keys of a dead-letter topic's group)
    go back to their original topic and group, due at ``due_ms``."""
    return encode([CommandKind.REDRIVE, publish_ms, group_id, keys, due_ms])


NOOP: Final = encode([CommandKind.NOOP])
