"""RaftLog: the durable prefix held by :class:`Storage` plus an unstable suffix in memory.

Entries the core has accepted but the adapter has not yet persisted live in the
unstable suffix (and a snapshot received from the leader lives there until persisted),
as in etcd-io/raft's ``log.go``/``log_unstable.go``. ``RaftLog`` answers term lookups
across both, performs the log-matching consistency check and conflict resolution of
the AppendEntries receiver (paper §5.3), and tracks the commit and applied indexes.

Invariants (asserted): ``applied <= committed <= last_index()``; committed entries are
never overwritten (paper §5.4, Leader Completeness / State Machine Safety).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from futureq.raft.messages import LogIndex, Term
from futureq.raft.storage import CompactedError, UnavailableError
from futureq.raft.values import Entry, Snapshot

if TYPE_CHECKING:
    from futureq.raft.storage import Storage

_NO_LIMIT = 1 << 62


class RaftLog:
    """A node's log (paper Figure 2, ``log[]``, ``commitIndex``, ``lastApplied``).

    Args:
        storage: The persisted state; read only.
        applied: Index the state machine has already applied (e.g. recorded with the
            state machine's own writes); defaults to the stored snapshot's index.
    """

    def __init__(self, storage: Storage, applied: LogIndex | None = None) -> None:
        self.storage = storage
        snapshot_index = storage.snapshot().metadata.index
        self.committed: LogIndex = snapshot_index
        self.applied: LogIndex = snapshot_index if applied is None else applied
        # Unstable part: a pending snapshot and entries starting at self._offset.
        self.unstable_snapshot: Snapshot | None = None
        self._unstable: list[Entry] = []
        self._offset: LogIndex = LogIndex(storage.last_index() + 1)

    # --- bounds and lookups -----------------------------------------------------------

    def first_index(self) -> LogIndex:
        """Index of the first entry held (after any snapshot)."""
        if self.unstable_snapshot is not None:
            return LogIndex(self.unstable_snapshot.metadata.index + 1)
        return self.storage.first_index()

    def last_index(self) -> LogIndex:
        """Index of the last entry (or of the snapshot if the log is empty after it)."""
        if self._unstable:
            return LogIndex(self._offset + len(self._unstable) - 1)
        if self.unstable_snapshot is not None:
            return self.unstable_snapshot.metadata.index
        return self.storage.last_index()

    def persisted_index(self) -> LogIndex:
        """Last index known to be on stable storage (everything before the unstable part)."""
        if self._unstable:
            return LogIndex(self._offset - 1)
        return self.last_index()

    def term(self, index: LogIndex) -> Term | None:
        """Term of the entry at ``index``, or None if compacted away or past the end.

        ``term(first_index() - 1)`` is the snapshot's term; ``term(0)`` is 0.
        """
        if self._unstable and self._offset <= index <= self.last_index():
            return self._unstable[index - self._offset].term
        snapshot = self.unstable_snapshot
        if snapshot is not None:
            if index == snapshot.metadata.index:
                return snapshot.metadata.term
            return None
        if index > self.last_index():
            return None
        try:
            return self.storage.term(index)
        except (CompactedError, UnavailableError):
            return None

    def last_term(self) -> Term:
        """Term of the last entry (paper §5.4.1 "lastLogTerm")."""
        term = self.term(self.last_index())
        assert term is not None, "the last entry's term is always known"
        return term

    def match_term(self, index: LogIndex, term: Term) -> bool:
        """Whether the entry at ``index`` has ``term`` (log matching, paper §5.3)."""
        return self.term(index) == term

    def is_up_to_date(self, last_index: LogIndex, last_term: Term) -> bool:
        """Whether a candidate's log is at least as up-to-date as ours (paper §5.4.1).

        Compare the last entries' terms; on equal terms the longer log wins.
        """
        our_term = self.last_term()
        return last_term > our_term or (last_term == our_term and last_index >= self.last_index())

    def entries(self, lo: LogIndex, max_bytes: int = _NO_LIMIT) -> list[Entry]:
        """Entries from ``lo`` to the end, at most ``max_bytes`` (but at least one).

        Raises:
            CompactedError: if ``lo < first_index()``.
        """
        return self.slice(lo, LogIndex(self.last_index() + 1), max_bytes)

    def slice(self, lo: LogIndex, hi: LogIndex, max_bytes: int = _NO_LIMIT) -> list[Entry]:
        """Entries ``[lo, hi)`` capped at ``max_bytes`` (at least one when ``lo < hi``).

        Raises:
            CompactedError: if ``lo < first_index()``.
        """
        if lo >= hi:
            return []
        if lo < self.first_index():
            raise CompactedError(f"entry {lo} is compacted (first index {self.first_index()})")
        assert hi <= self.last_index() + 1, f"slice end {hi} past last index {self.last_index()}"
        result: list[Entry] = []
        if lo < self._offset:
            stored_hi = LogIndex(min(hi, self._offset))
            result = self.storage.entries(lo, stored_hi, max_bytes)
            if len(result) < stored_hi - lo:
                return result  # size limit reached inside storage
        if hi > self._offset:
            start = max(lo, self._offset) - self._offset
            size = sum(e.size_bytes() for e in result)
            for entry in self._unstable[start : hi - self._offset]:
                size += entry.size_bytes()
                if result and size > max_bytes:
                    break
                result.append(entry)
        return result

    # --- the AppendEntries receiver (paper §5.3) -----------------------------------

    def find_conflict(self, entries: tuple[Entry, ...]) -> LogIndex:
        """First index among ``entries`` whose term differs from ours or that we lack.

        Returns:
            That index, or 0 if every entry is already in the log.
        """
        for entry in entries:
            if not self.match_term(entry.index, entry.term):
                return entry.index
        return LogIndex(0)

    def find_conflict_by_term(self, index: LogIndex, term: Term) -> tuple[LogIndex, Term]:
        """Largest ``i <= index`` whose entry term is ``<= term`` (fast back-off hint).

        Thesis §5.3 suggests the follower report the conflicting term so the leader
        can skip a whole term per round trip; this is etcd's refinement, usable by
        both sides. If the term at some index is unknown (compacted), that index is
        returned with term 0.

        Returns:
            ``(i, term(i))``.
        """
        while index > 0:
            found = self.term(index)
            if found is None:
                return index, Term(0)
            if found <= term:
                return index, found
            index = LogIndex(index - 1)
        return LogIndex(0), Term(0)

    def maybe_append(
        self,
        prev_log_index: LogIndex,
        prev_log_term: Term,
        leader_commit: LogIndex,
        entries: tuple[Entry, ...],
    ) -> tuple[LogIndex, tuple[Entry, ...]] | None:
        """Apply AppendEntries receiver rules 2-5 (paper Figure 2).

        Returns:
            None when the consistency check fails (the caller rejects); else the index
            of the last new entry (``prev_log_index + len(entries)``) and the entries
            actually written (empty if all were already present).
        """
        if not self.match_term(prev_log_index, prev_log_term):
            return None
        last_new = LogIndex(prev_log_index + len(entries))
        conflict = self.find_conflict(entries)
        appended: tuple[Entry, ...] = ()
        if conflict:
            # Rule 3: delete the conflicting entry and all that follow. A committed
            # entry can never conflict (paper §5.4.3, Leader Completeness).
            assert conflict > self.committed, (
                f"entry {conflict} conflicts but is committed ({self.committed})"
            )
            appended = entries[conflict - prev_log_index - 1 :]
            self.append(appended)
        # Rule 5: commitIndex = min(leaderCommit, index of last new entry).
        self.commit_to(LogIndex(min(leader_commit, last_new)))
        return last_new, appended

    def append(self, entries: tuple[Entry, ...] | list[Entry]) -> LogIndex:
        """Append to the unstable part, truncating whatever follows ``entries[0].index``.

        Returns:
            The new last index.
        """
        if not entries:
            return self.last_index()
        first = entries[0].index
        assert first > self.committed, f"appending at {first} would overwrite a committed entry"
        assert first <= self.last_index() + 1, f"appending at {first} would leave a gap"
        if first == self._offset + len(self._unstable):
            self._unstable.extend(entries)
        elif first <= self._offset:
            # Replaces (part of) the stable log; storage truncates when persisted.
            self._offset = first
            self._unstable = list(entries)
        else:
            del self._unstable[first - self._offset :]
            self._unstable.extend(entries)
        return self.last_index()

    # --- commit and apply ----------------------------------------------------------------

    def commit_to(self, index: LogIndex) -> None:
        """Raise the commit index to ``index`` (never lowers it)."""
        if index > self.committed:
            assert index <= self.last_index(), (
                f"commit {index} is past the last index {self.last_index()}"
            )
            self.committed = index

    def maybe_commit(self, index: LogIndex, term: Term) -> bool:
        """Commit up to ``index`` if that entry is from ``term`` (paper §5.4.2).

        A leader only commits entries of its current term by counting replicas;
        earlier entries are committed indirectly (Figure 8).
        """
        if index > self.committed and self.term(index) == term:
            self.commit_to(index)
            return True
        return False

    def has_next_committed_entries(self) -> bool:
        """Whether entries are committed but not yet handed out for applying."""
        return self.unstable_snapshot is None and self.committed > self.applied

    def next_committed_entries(self, max_bytes: int) -> list[Entry]:
        """Committed entries after ``applied``, at most ``max_bytes`` (at least one).

        Empty while a received snapshot waits to be installed.
        """
        if not self.has_next_committed_entries():
            return []
        return self.slice(LogIndex(self.applied + 1), LogIndex(self.committed + 1), max_bytes)

    def applied_to(self, index: LogIndex) -> None:
        """Record that the state machine applied everything up to ``index``."""
        assert self.applied <= index <= self.committed, (
            f"applied {index} out of range (applied {self.applied}, committed {self.committed})"
        )
        self.applied = index

    # --- unstable bookkeeping --------------------------------------------------------------

    def unstable_entries(self) -> list[Entry]:
        """Entries not yet persisted, in index order."""
        return list(self._unstable)

    def stable_to(self, index: LogIndex, term: Term) -> None:
        """The adapter persisted entries up to ``index`` (whose term was ``term``)."""
        if not self._unstable or index < self._offset:
            return
        if self.term(index) != term:
            return  # overwritten since that Ready was produced
        del self._unstable[: index - self._offset + 1]
        self._offset = LogIndex(index + 1)

    def stable_snapshot_to(self, index: LogIndex) -> None:
        """The adapter persisted the pending snapshot at ``index``."""
        if self.unstable_snapshot is not None and self.unstable_snapshot.metadata.index == index:
            self.unstable_snapshot = None

    def restore(self, snapshot: Snapshot) -> None:
        """Replace the log with ``snapshot`` received from the leader (paper §7).

        The snapshot stays pending (unstable) until the adapter persists it.
        """
        index = snapshot.metadata.index
        assert index > self.committed, "only a snapshot past the commit index is installed"
        self.committed = index
        self.unstable_snapshot = snapshot
        self._unstable = []
        self._offset = LogIndex(index + 1)

    def snapshot(self) -> Snapshot:
        """The pending snapshot if any, else the stored one."""
        if self.unstable_snapshot is not None:
            return self.unstable_snapshot
        return self.storage.snapshot()
