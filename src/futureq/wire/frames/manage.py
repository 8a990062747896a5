"""Frames managing scheduled messages: CANCEL, REDRIVE, RESCHEDULE and PURGE (answered
with ITEM_RESULTS or OK), BROWSE and BROWSE_COUNTS.

Source: ``docs/protocol.md``, "CANCEL" through "BROWSE_COUNTS".
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from futureq.wire.frames.constants import FrameType
from futureq.wire.frames.fields import (
    _arity,
    _bad,
    _int,
    _int_list,
    _list,
    _opt_bytes,
    _opt_int,
    _opt_str,
    _str,
)
from futureq.wire.msgpack_names import describe


@attrs.frozen
class Cancel:
    """Remove scheduled messages by id from one group of a topic, or from every group.

    ``group`` None: every group of ``topic``. ``ids``: message ids (as PUBLISH_OK gave
    them), at most ``max_batch_items``. Answered with ITEM_RESULTS, one
    :class:`ItemStatus` per id, once committed.
    """

    TYPE: ClassVar[FrameType] = FrameType.CANCEL
    request_id: int
    topic: str
    group: str | None
    ids: list[int]

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.topic, self.group, self.ids]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Cancel:
        _arity("CANCEL", f, 3)
        return cls(
            rid,
            _str("CANCEL", "topic", f[0]),
            _opt_str("CANCEL", "group", f[1]),
            _int_list("CANCEL", "ids", f[2]),
        )


@attrs.frozen
class ItemResults:
    """Answer to CANCEL: one :class:`ItemStatus` number per item, in request order."""

    TYPE: ClassVar[FrameType] = FrameType.ITEM_RESULTS
    request_id: int
    results: list[int]

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.results]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> ItemResults:
        _arity("ITEM_RESULTS", f, 1)
        return cls(rid, _int_list("ITEM_RESULTS", "results", f[0]))


@attrs.frozen
class Browse:
    """Read a page of one group's pending messages in due order, claiming none.

    ``group`` None: the topic's only group. ``from_due_ms`` / ``to_due_ms``: due at or
    after / before (ms; None: unbounded). ``cursor``: BROWSE_OK's ``next_cursor`` for
    the next page (None: the first). ``limit``: messages per page (1 to 1000).
    ``preview_bytes``: payload bytes to include per message (0 to 1024). Answered
    with BROWSE_OK.
    """

    TYPE: ClassVar[FrameType] = FrameType.BROWSE
    request_id: int
    topic: str
    group: str | None
    from_due_ms: int | None
    to_due_ms: int | None
    cursor: bytes | None
    limit: int
    preview_bytes: int

    def to_wire(self) -> list[Any]:
        return [
            self.TYPE,
            self.request_id,
            self.topic,
            self.group,
            self.from_due_ms,
            self.to_due_ms,
            self.cursor,
            self.limit,
            self.preview_bytes,
        ]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Browse:
        _arity("BROWSE", f, 7)
        return cls(
            rid,
            _str("BROWSE", "topic", f[0]),
            _opt_str("BROWSE", "group", f[1]),
            _opt_int("BROWSE", "from_due_ms", f[2]),
            _opt_int("BROWSE", "to_due_ms", f[3]),
            _opt_bytes("BROWSE", "cursor", f[4]),
            _int("BROWSE", "limit", f[5]),
            _int("BROWSE", "preview_bytes", f[6]),
        )


@attrs.frozen
class BrowseOk:
    """Answer to BROWSE: ``group`` (the one browsed), ``messages`` and ``next_cursor``.

    A message is ``[id, due_ms | nil (parked), attempt, payload_bytes, headers | nil,
    preview | nil, expire_ms | nil]`` (``docs/protocol.md``, "BROWSE_OK");
    ``next_cursor`` None: nothing more in the range.
    """

    TYPE: ClassVar[FrameType] = FrameType.BROWSE_OK
    request_id: int
    group: str
    messages: list[list[Any]]
    next_cursor: bytes | None

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.group, self.messages, self.next_cursor]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> BrowseOk:
        _arity("BROWSE_OK", f, 3)
        messages = _list("BROWSE_OK", "messages", f[1])
        for i, m in enumerate(messages):
            if (
                type(m) is not list
                or len(m) != 7
                or type(m[0]) is not int
                or (m[1] is not None and type(m[1]) is not int)
                or type(m[2]) is not int
                or type(m[3]) is not int
                or (m[4] is not None and type(m[4]) is not dict)
                or (m[5] is not None and type(m[5]) is not bytes)
                or (m[6] is not None and type(m[6]) is not int)
            ):
                raise _bad(
                    "BROWSE_OK",
                    f"messages[{i}] must be [id, due_ms, attempt, "
                    "payload_bytes, headers, preview, expire_ms]",
                )
        return cls(
            rid,
            _str("BROWSE_OK", "group", f[0]),
            messages,
            _opt_bytes("BROWSE_OK", "next_cursor", f[2]),
        )


@attrs.frozen
class BrowseCounts:
    """Count one group's pending messages by due-time bucket, claiming none.

    ``group`` None: the topic's only group. ``bounds_ms``: 1 to 32 strictly increasing
    bucket bounds (ms since the Unix epoch; with ``relative`` true, ms from the leader's
    cluster time instead, each >= 0). Answered with BROWSE_COUNTS_OK
    (``docs/protocol.md``, "BROWSE_COUNTS").
    """

    TYPE: ClassVar[FrameType] = FrameType.BROWSE_COUNTS
    request_id: int
    topic: str
    group: str | None
    bounds_ms: list[int]
    relative: bool

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.topic, self.group, self.bounds_ms, self.relative]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> BrowseCounts:
        _arity("BROWSE_COUNTS", f, 4)
        if type(f[3]) is not bool:
            raise _bad("BROWSE_COUNTS", f"field 'relative' must be a boolean, got {describe(f[3])}")
        return cls(
            rid,
            _str("BROWSE_COUNTS", "topic", f[0]),
            _opt_str("BROWSE_COUNTS", "group", f[1]),
            _int_list("BROWSE_COUNTS", "bounds_ms", f[2]),
            f[3],
        )


@attrs.frozen
class BrowseCountsOk:
    """Answer to BROWSE_COUNTS.

    ``group``: the group counted. ``bounds_ms``: the bounds, absolute (ms since the
    epoch). ``counts[i]``: entries due before ``bounds_ms[0]`` (i = 0; overdue ones
    included) or in ``[bounds_ms[i-1], bounds_ms[i])``. ``later``: the rest of the
    group's pending entries (due at or after the last bound, parked dead letters
    included). ``complete`` false: the count stopped at the per-request read limit; the
    first bucket it stopped in holds a lower bound, later buckets and ``later`` are nil.
    """

    TYPE: ClassVar[FrameType] = FrameType.BROWSE_COUNTS_OK
    request_id: int
    group: str
    bounds_ms: list[int]
    counts: list[int | None]
    later: int | None
    complete: bool

    def to_wire(self) -> list[Any]:
        return [
            self.TYPE,
            self.request_id,
            self.group,
            self.bounds_ms,
            self.counts,
            self.later,
            self.complete,
        ]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> BrowseCountsOk:
        _arity("BROWSE_COUNTS_OK", f, 5)
        bounds = _int_list("BROWSE_COUNTS_OK", "bounds_ms", f[1])
        counts = _list("BROWSE_COUNTS_OK", "counts", f[2])
        if len(counts) != len(bounds) or any(c is not None and type(c) is not int for c in counts):
            raise _bad("BROWSE_COUNTS_OK", "counts must be one integer or nil per bound")
        if type(f[4]) is not bool:
            raise _bad("BROWSE_COUNTS_OK", "field 'complete' must be a boolean")
        return cls(
            rid,
            _str("BROWSE_COUNTS_OK", "group", f[0]),
            bounds,
            counts,
            _opt_int("BROWSE_COUNTS_OK", "later", f[3]),
            f[4],
        )


@attrs.frozen
class Redrive:
    """Move dead letters of ``topic`` (held in ``topic.dlq``) back to the topic and the
    group they died in, by dead-letter message id, due after ``delay_ms`` (>= 0).

    ``group``: the dead-letter topic's group holding them; None: its only group.
    Answered with ITEM_RESULTS: DONE, UNKNOWN or NO_TARGET per id.
    """

    TYPE: ClassVar[FrameType] = FrameType.REDRIVE
    request_id: int
    topic: str
    group: str | None
    ids: list[int]
    delay_ms: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.topic, self.group, self.ids, self.delay_ms]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Redrive:
        _arity("REDRIVE", f, 4)
        return cls(
            rid,
            _str("REDRIVE", "topic", f[0]),
            _opt_str("REDRIVE", "group", f[1]),
            _int_list("REDRIVE", "ids", f[2]),
            _int("REDRIVE", "delay_ms", f[3]),
        )


@attrs.frozen
class Reschedule:
    """Give pending messages of ``topic`` a new due time, by id, in one group or all.

    Exactly one of ``due_ms`` (absolute, ms since the Unix epoch) and ``delay_ms``
    (from the leader's stamp, ms). Attempts are kept; a TTL counts from the new due
    time. Answered with ITEM_RESULTS: DONE or UNKNOWN per id.
    """

    TYPE: ClassVar[FrameType] = FrameType.RESCHEDULE
    request_id: int
    topic: str
    group: str | None
    ids: list[int]
    due_ms: int | None
    delay_ms: int | None

    def to_wire(self) -> list[Any]:
        return [
            self.TYPE,
            self.request_id,
            self.topic,
            self.group,
            self.ids,
            self.due_ms,
            self.delay_ms,
        ]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Reschedule:
        _arity("RESCHEDULE", f, 5)
        return cls(
            rid,
            _str("RESCHEDULE", "topic", f[0]),
            _opt_str("RESCHEDULE", "group", f[1]),
            _int_list("RESCHEDULE", "ids", f[2]),
            _opt_int("RESCHEDULE", "due_ms", f[3]),
            _opt_int("RESCHEDULE", "delay_ms", f[4]),
        )


@attrs.frozen
class Purge:
    """Remove every message pending now in one group of ``topic`` (or all its groups).

    Answered with OK (``result`` = entries to remove) once the purge has started; the
    leader removes them in bounded chunks in the background. Messages published after
    it stay.
    """

    TYPE: ClassVar[FrameType] = FrameType.PURGE
    request_id: int
    topic: str
    group: str | None

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.topic, self.group]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Purge:
        _arity("PURGE", f, 2)
        return cls(rid, _str("PURGE", "topic", f[0]), _opt_str("PURGE", "group", f[1]))
