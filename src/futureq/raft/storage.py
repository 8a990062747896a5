"""The durable state the Raft core reads, as a Protocol, and an in-memory implementation.

The core only *reads* storage (etcd-io/raft ``storage.go`` is the model); the adapter
writes it while handling a :class:`~futureq.raft.messages.Ready`: ``append`` the
entries, ``set_hard_state``, ``apply_snapshot`` a snapshot received from the leader,
and ``compact`` the log behind a local snapshot. A storage always holds a snapshot;
a fresh one holds the "bootstrap" snapshot at index 0, term 0, whose membership is the
initial cluster configuration (empty for a server that will be added later).

Index ranges: entries ``first_index() .. last_index()`` are stored;
``term(first_index() - 1)`` is the snapshot's term, so ``term`` answers for
``first_index() - 1 .. last_index()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from futureq.errors import FutureQError
from futureq.raft.messages import LogIndex, Term
from futureq.raft.values import Entry, HardState, Membership, Snapshot, SnapshotMetadata


class CompactedError(FutureQError):
    """The requested index lies at or before the snapshot: the entry was compacted away."""


class UnavailableError(FutureQError):
    """The requested index lies after the last stored entry."""


class SnapshotOutOfDateError(FutureQError):
    """A snapshot to install or create is not newer than the one already stored."""


class Storage(Protocol):
    """What :class:`~futureq.raft.core.RaftCore` reads from stable storage."""

    def initial_state(self) -> tuple[HardState, Membership]:
        """Return the persisted hard state and the stored snapshot's membership.

        The core derives the current membership by scanning the stored log for
        CONFIG_CHANGE entries after the snapshot (thesis §4.1: a server uses the latest
        configuration in its log, committed or not).
        """
        ...

    def entries(self, lo: LogIndex, hi: LogIndex, max_bytes: int) -> list[Entry]:
        """Return entries ``[lo, hi)``, stopping before ``max_bytes`` (at least one).

        Raises:
            CompactedError: if ``lo < first_index()``.
            UnavailableError: if ``hi > last_index() + 1``.
        """
        ...

    def term(self, index: LogIndex) -> Term:
        """Term of the entry at ``index``, for ``first_index() - 1 <= index <= last_index()``.

        Raises:
            CompactedError: if ``index < first_index() - 1``.
            UnavailableError: if ``index > last_index()``.
        """
        ...

    def first_index(self) -> LogIndex:
        """Index of the first stored entry (snapshot index + 1)."""
        ...

    def last_index(self) -> LogIndex:
        """Index of the last stored entry, or the snapshot index if none is stored."""
        ...

    def snapshot(self) -> Snapshot:
        """The most recent snapshot (the bootstrap snapshot at index 0 if none was taken)."""
        ...


def check_appendable(entries: Sequence[Entry], last_index: int) -> None:
    """Check that ``entries`` are consecutive and start at most at ``last_index + 1``.

    Raises:
        ValueError: the entries are not consecutive, or would leave a gap in the log.
    """
    for before, after in zip(entries, entries[1:], strict=False):
        if after.index != before.index + 1:
            raise ValueError(f"entries are not consecutive at index {after.index}")
    first_new = entries[0].index
    if first_new > last_index + 1:
        raise ValueError(f"appending at {first_new} would leave a gap after {last_index}")


class MemoryStorage:
    """A :class:`Storage` in memory, with the write methods an adapter uses.

    Used by unit tests and the simulation. It has no notion of fsync: the simulation
    models lost unsynced writes itself.

    Args:
        membership: The initial configuration, stored in the bootstrap snapshot.
    """

    def __init__(self, membership: Membership | None = None) -> None:
        self._hard_state = HardState()
        self._snapshot = Snapshot(
            SnapshotMetadata(LogIndex(0), Term(0), membership or Membership()), b""
        )
        # _entries[k] has index snapshot.index + 1 + k.
        self._entries: list[Entry] = []

    # --- Storage protocol ---------------------------------------------------------

    def initial_state(self) -> tuple[HardState, Membership]:
        """See :meth:`Storage.initial_state`."""
        return self._hard_state, self._snapshot.metadata.membership

    def entries(self, lo: LogIndex, hi: LogIndex, max_bytes: int) -> list[Entry]:
        """See :meth:`Storage.entries`."""
        if lo < self.first_index():
            raise CompactedError(f"entry {lo} is compacted (first index {self.first_index()})")
        if hi > self.last_index() + 1:
            raise UnavailableError(f"entry {hi - 1} is past the last index {self.last_index()}")
        offset = self._snapshot.metadata.index + 1
        result: list[Entry] = []
        size = 0
        for entry in self._entries[lo - offset : hi - offset]:
            size += entry.size_bytes()
            if result and size > max_bytes:
                break
            result.append(entry)
        return result

    def term(self, index: LogIndex) -> Term:
        """See :meth:`Storage.term`."""
        snapshot_index = self._snapshot.metadata.index
        if index < snapshot_index:
            raise CompactedError(f"term of {index} is compacted (snapshot at {snapshot_index})")
        if index == snapshot_index:
            return self._snapshot.metadata.term
        if index > self.last_index():
            raise UnavailableError(f"entry {index} is past the last index {self.last_index()}")
        return self._entries[index - snapshot_index - 1].term

    def first_index(self) -> LogIndex:
        """See :meth:`Storage.first_index`."""
        return LogIndex(self._snapshot.metadata.index + 1)

    def last_index(self) -> LogIndex:
        """See :meth:`Storage.last_index`."""
        return LogIndex(self._snapshot.metadata.index + len(self._entries))

    def snapshot(self) -> Snapshot:
        """See :meth:`Storage.snapshot`."""
        return self._snapshot

    def clone(self) -> MemoryStorage:
        """An independent copy (what a copy of a data directory is to a real store)."""
        copy = MemoryStorage()
        copy._hard_state = self._hard_state
        copy._snapshot = self._snapshot
        copy._entries = list(self._entries)
        return copy

    # --- writes (adapter side) ------------------------------------------------------

    def hard_state(self) -> HardState:
        """The last hard state written."""
        return self._hard_state

    def set_hard_state(self, hard_state: HardState) -> None:
        """Persist ``hard_state`` (term, vote, commit)."""
        self._hard_state = hard_state

    def append(self, entries: tuple[Entry, ...] | list[Entry]) -> None:
        """Append ``entries``, first deleting any stored entries at or after the first one.

        Entries at or before the snapshot index are ignored (already covered).

        Raises:
            ValueError: if the entries are not consecutive or would leave a gap.
        """
        if not entries:
            return
        check_appendable(entries, self.last_index())
        offset = self._snapshot.metadata.index + 1
        kept = [e for e in entries if e.index >= offset]
        if not kept:
            return
        del self._entries[kept[0].index - offset :]
        self._entries.extend(kept)

    def apply_snapshot(self, snapshot: Snapshot) -> None:
        """Replace the whole log with ``snapshot`` (a follower installing the leader's).

        Raises:
            SnapshotOutOfDateError: if ``snapshot`` is not newer than the stored one.
        """
        if snapshot.metadata.index <= self._snapshot.metadata.index:
            raise SnapshotOutOfDateError(
                f"snapshot at {snapshot.metadata.index} is not newer than the stored one "
                f"at {self._snapshot.metadata.index}"
            )
        self._snapshot = snapshot
        self._entries = []

    def compact(self, snapshot: Snapshot) -> None:
        """Store a locally taken ``snapshot`` and drop the entries it covers.

        Entries after ``snapshot.metadata.index`` are kept.

        Raises:
            SnapshotOutOfDateError: if ``snapshot`` is not newer than the stored one.
            UnavailableError: if its index is past the last stored entry.
            ValueError: if its term disagrees with the stored entry at its index.
        """
        index = snapshot.metadata.index
        if index <= self._snapshot.metadata.index:
            raise SnapshotOutOfDateError(
                f"snapshot at {index} is not newer than the stored one "
                f"at {self._snapshot.metadata.index}"
            )
        if index > self.last_index():
            raise UnavailableError(f"cannot compact to {index} past last index {self.last_index()}")
        if self.term(index) != snapshot.metadata.term:
            raise ValueError(
                f"snapshot term {snapshot.metadata.term} differs from the log's "
                f"term {self.term(index)} at {index}"
            )
        offset = self._snapshot.metadata.index + 1
        del self._entries[: index - offset + 1]
        self._snapshot = snapshot
