"""The storage seam of :class:`~futureq.state.queue_state.QueueState`, and a memory twin.

:class:`futureq.storage.db.Database` implements :class:`StateStore` over RocksDB;
:class:`MemoryStore` implements it over sorted dicts for simulations and unit tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from sortedcontainers import SortedDict

Changes = dict[str, dict[bytes, bytes | None]]
"""family -> key -> new value, or None to delete."""


class StateStore(Protocol):
    """What QueueState reads and writes. One ``write`` is atomic across families."""

    def get(self, family: str, key: bytes) -> bytes | None:
        """The value of ``key`` in ``family``, or None."""
        ...

    def scan(
        self, family: str, start: bytes, stop: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs in key order within ``[start, stop)``."""
        ...

    def scan_keys(self, family: str, start: bytes, stop: bytes | None = None) -> Iterator[bytes]:
        """Keys in order within ``[start, stop)``."""
        ...

    def write(self, changes: Changes, *, sync: bool = False) -> None:
        """Apply puts and deletes atomically."""
        ...


class MemoryStore:
    """An in-memory :class:`StateStore` (sorted, atomic writes, nothing durable)."""

    def __init__(self) -> None:
        self._families: dict[str, SortedDict] = {}

    def _family(self, family: str) -> SortedDict:
        found = self._families.get(family)
        if found is None:
            found = self._families[family] = SortedDict()
        return found

    def get(self, family: str, key: bytes) -> bytes | None:
        """The value of ``key`` in ``family``, or None."""
        value: bytes | None = self._family(family).get(key)
        return value

    def scan(
        self, family: str, start: bytes, stop: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs in key order within ``[start, stop)`` (a snapshot).

        Like a RocksDB iterator, the scan sees the family as it was when iteration
        started: writes made while it runs (deletes included) do not show.
        """
        data = self._family(family)
        items = [(key, data[key]) for key in data.irange(start, stop, inclusive=(True, False))]
        yield from items

    def scan_keys(self, family: str, start: bytes, stop: bytes | None = None) -> Iterator[bytes]:
        """Keys in order within ``[start, stop)`` (a snapshot)."""
        yield from list(self._family(family).irange(start, stop, inclusive=(True, False)))

    def write(self, changes: Changes, *, sync: bool = False) -> None:
        """Apply puts and deletes; ``sync`` is meaningless in memory."""
        for family, items in changes.items():
            data = self._family(family)
            for key, value in items.items():
                if value is None:
                    data.pop(key, None)
                else:
                    data[key] = value
