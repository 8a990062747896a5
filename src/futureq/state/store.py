"""The storage seam of :class:`~futureq.state.queue_state.QueueState`, and a memory twin.

:class:`futureq.storage.db.Database` implements :class:`StateStore` over RocksDB;
:class:`MemoryStore` implements it over sorted dicts for simulations and unit tests.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

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


class StoreView(Protocol):
    """A read-only, point-in-time view of some families (for state snapshots).

    It sees the families as they were when the view was taken, whatever is written
    afterwards, and may be read from another thread while the store is written.
    """

    def scan(
        self, family: str, start: bytes, stop: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs in key order within ``[start, stop)``, as of the view."""
        ...

    def close(self) -> None:
        """Release the view (RocksDB keeps the data it pins until then); idempotent."""
        ...


@runtime_checkable
class SnapshotStore(StateStore, Protocol):
    """A :class:`StateStore` that can also take point-in-time views and clear families.

    What :mod:`futureq.state.snapshot` needs to serialize and restore a state.
    """

    def snapshot_view(self, families: Sequence[str]) -> StoreView:
        """A point-in-time view of ``families``; cheap, call it on the event loop."""
        ...

    def clear(self, family: str) -> None:
        """Delete every key of ``family`` (one write, as durable as ``write``)."""
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

    def snapshot_view(self, families: Sequence[str]) -> MemoryStoreView:
        """A copy of ``families`` (O(keys) time and memory: for simulations and tests)."""
        return MemoryStoreView({family: self._family(family).copy() for family in families})

    def clear(self, family: str) -> None:
        """Delete every key of ``family``."""
        self._family(family).clear()


class MemoryStoreView:
    """A :class:`StoreView` over copied families of a :class:`MemoryStore`."""

    def __init__(self, families: dict[str, SortedDict]) -> None:
        self._families: dict[str, SortedDict] | None = families

    def scan(
        self, family: str, start: bytes, stop: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs in key order within ``[start, stop)``, as copied.

        Raises:
            ValueError: the view is closed.
            KeyError: ``family`` was not part of the view.
        """
        if self._families is None:
            raise ValueError("the store view is closed")
        data = self._families[family]
        for key in data.irange(start, stop, inclusive=(True, False)):
            yield key, data[key]

    def close(self) -> None:
        """Drop the copy; idempotent."""
        self._families = None
