"""DueIndex: one consumer group's in-memory due order, over SortedLists of packed ints.

An entry is ``(due_ms, message_id)`` packed into one int, ``due_ms << 64 | message_id``
(45 bytes an entry instead of 133 for tuples, ``MEASURED.md``), so the list sorts by due
time, then by publish order. Entries with a TTL, or with an attempt count above zero
(nacked before), also live in a small dict, and TTL'd ones in a second list ordered by
expiry, so expired entries can be found without reading storage.

The index is a cache of the ``schedule`` family: it holds only a horizon, the group's
earliest entries (``DESIGN.md``, "Storage layout"); the dispatcher decides what that is.
"""

from __future__ import annotations

from typing import Final

from sortedcontainers import SortedList

_SHIFT: Final = 64
_MASK: Final = (1 << 64) - 1


def pack(due_ms: int, mid: int) -> int:
    """``due_ms << 64 | mid``: one int that sorts by due time, then id."""
    return (due_ms << _SHIFT) | mid


def unpack(packed: int) -> tuple[int, int]:
    """``(due_ms, message_id)`` of a packed entry."""
    return packed >> _SHIFT, packed & _MASK


class DueIndex:
    """A group's scheduled entries in due order, with their expiry and attempt count."""

    __slots__ = ("_due", "_expiry", "_extra")

    def __init__(self) -> None:
        self._due = SortedList()
        self._expiry = SortedList()
        # mid -> (due_ms, expire_ms | None, attempt) for entries with a TTL or attempt > 0
        self._extra: dict[int, tuple[int, int | None, int]] = {}

    def __len__(self) -> int:
        return len(self._due)

    def __contains__(self, packed: object) -> bool:
        return packed in self._due

    def add(self, due_ms: int, mid: int, expire_ms: int | None = None, attempt: int = 0) -> None:
        """Insert an entry (it must not be present already)."""
        self._due.add((due_ms << _SHIFT) | mid)
        if expire_ms is not None or attempt:
            self._extra[mid] = (due_ms, expire_ms, attempt)
            if expire_ms is not None:
                self._expiry.add((expire_ms << _SHIFT) | mid)

    def attempted(self, mid: int) -> tuple[int, int] | None:
        """``(due_ms, attempt)`` of message ``mid``'s entry when the index holds it with
        an attempt above 0; None otherwise. O(1)."""
        extra = self._extra.get(mid)
        if extra is None or not extra[2]:
            return None
        return extra[0], extra[2]

    def discard(self, due_ms: int, mid: int) -> bool:
        """Remove an entry; False when it was not in the index."""
        packed = (due_ms << _SHIFT) | mid
        if packed not in self._due:
            return False
        self._due.remove(packed)
        self._forget_extra(mid)
        return True

    def _forget_extra(self, mid: int) -> tuple[int | None, int]:
        extra = self._extra.pop(mid, None)
        if extra is None:
            return None, 0
        _, expire_ms, attempt = extra
        if expire_ms is not None:
            self._expiry.discard((expire_ms << _SHIFT) | mid)
        return expire_ms, attempt

    def next_due_ms(self) -> int | None:
        """Due time of the earliest entry, or None when empty."""
        return self._due[0] >> _SHIFT if self._due else None

    def next_expire_ms(self) -> int | None:
        """Earliest expiry time among entries with a TTL, or None."""
        return self._expiry[0] >> _SHIFT if self._expiry else None

    def first(self) -> int | None:
        """The smallest packed entry, or None."""
        return self._due[0] if self._due else None

    def last(self) -> int | None:
        """The largest packed entry, or None."""
        return self._due[-1] if self._due else None

    def pop_due(self, now_ms: int, limit: int) -> list[tuple[int, int, int | None, int]]:
        """Remove and return entries due at or before ``now_ms``.

        Args:
            now_ms: Wall-clock time (ms since the Unix epoch).
            limit: Most entries to return; must be >= 1.

        Returns:
            Up to ``limit`` ``(due_ms, mid, expire_ms, attempt)`` tuples, earliest due
            first, ties in publish (id) order.

        Raises:
            ValueError: if ``limit`` < 1.

        Source: DESIGN.md, "Message semantics" (nothing is delivered before it is due).
        """
        if limit < 1:
            raise ValueError("limit must be >= 1")
        due = self._due
        bound = ((now_ms + 1) << _SHIFT) - 1
        count = min(due.bisect_right(bound), limit)
        if count == 0:
            return []
        taken = list(due.islice(0, count))
        del due[:count]
        out: list[tuple[int, int, int | None, int]] = []
        extra = self._extra
        for packed in taken:
            mid = packed & _MASK
            if extra and mid in extra:
                expire_ms, attempt = self._forget_extra(mid)
            else:
                expire_ms, attempt = None, 0
            out.append((packed >> _SHIFT, mid, expire_ms, attempt))
        return out

    def pop_expired(self, now_ms: int, limit: int) -> list[tuple[int, int, int, int]]:
        """Remove and return up to ``limit`` entries whose expiry is at or before ``now_ms``.

        Returns:
            ``(due_ms, mid, expire_ms, attempt)`` tuples, earliest expiry first, so a
            caller that must put one back restores it exactly.
        """
        out: list[tuple[int, int, int, int]] = []
        expiry = self._expiry
        while expiry and len(out) < limit and (expiry[0] >> _SHIFT) <= now_ms:
            mid = expiry[0] & _MASK
            due_ms, expire_ms, attempt = self._extra[mid]
            assert expire_ms is not None
            self.discard(due_ms, mid)
            out.append((due_ms, mid, expire_ms, attempt))
        return out

    def count_due(self, now_ms: int) -> int:
        """How many entries are due at or before ``now_ms``."""
        return int(self._due.bisect_right(((now_ms + 1) << _SHIFT) - 1))

    def pop_last(self) -> tuple[int, int]:
        """Remove and return the latest entry as ``(due_ms, mid)`` (horizon trimming).

        Raises:
            IndexError: the index is empty.
        """
        packed = self._due.pop()
        mid = packed & _MASK
        self._forget_extra(mid)
        return packed >> _SHIFT, mid

    def discard_ids_below(self, bound_id: int) -> list[int]:
        """Remove every entry of a message whose id is below ``bound_id`` (a PURGE's);
        O(n). Returns their ids."""
        kept: list[int] = []
        gone: list[int] = []
        for packed in self._due:
            (gone if packed & _MASK < bound_id else kept).append(packed)
        if gone:
            self._due = SortedList(kept)
            for packed in gone:
                self._forget_extra(packed & _MASK)
        return [packed & _MASK for packed in gone]

    def clear(self) -> None:
        """Remove every entry."""
        self._due.clear()
        self._expiry.clear()
        self._extra.clear()
