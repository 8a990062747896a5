"""The member registry at every log index (``docs/raft.md``, "Disk faults").

The registry is what the cluster remembers of each member's data directory: its
incarnation and the highest log position it acknowledged (:class:`MemberRecord`), and
which nodes were removed at which index. It lives in the log, like the membership
(thesis §4.1), so it is committed on a quorum and survives the loss of any one disk:

* a MEMBER_RECORDS entry replaces the whole registry (the leader writes the full table,
  as a CONFIG_CHANGE entry carries the full membership);
* a CONFIG_CHANGE entry that removes a node records the removal at its index, and one
  that adds a node again forgets it;
* a snapshot carries the registry in effect at its last index.

:class:`RegistryHistory` answers "the registry in effect at index i" the way
:class:`~futureq.raft.quorum.MembershipHistory` does for memberships; callers that act
on it (telling a node it was removed) ask at the commit index.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from futureq.raft.messages import LogIndex
from futureq.raft.payload_codec import decode_config_change, decode_registry
from futureq.raft.values import ConfChangeOp, Entry, EntryKind, Registry


class RegistryHistory:
    """Registry at each log index: a base (from the snapshot) plus later changes.

    Args:
        base_index: Index of the snapshot the base registry comes from.
        base: The snapshot's registry.
    """

    def __init__(self, base_index: LogIndex, base: Registry) -> None:
        self._base_index = base_index
        self._base = base
        self._indexes: list[LogIndex] = []
        self._registries: list[Registry] = []

    def reset(self, base_index: LogIndex, base: Registry) -> None:
        """Forget everything and start again from a snapshot's registry."""
        self._base_index = base_index
        self._base = base
        self._indexes.clear()
        self._registries.clear()

    def truncate_from(self, index: LogIndex) -> None:
        """Forget changes at ``index`` and later (their entries were overwritten)."""
        cut = bisect.bisect_left(self._indexes, index)
        del self._indexes[cut:]
        del self._registries[cut:]

    def record_entries(self, entries: Iterable[Entry]) -> None:
        """Record the changes made by ``entries`` (in index order).

        Raises:
            RemoteProtocolError: an entry's data does not decode (the caller checked
                CONFIG_CHANGE entries already; MEMBER_RECORDS come from a leader).
        """
        for entry in entries:
            if entry.kind is EntryKind.MEMBER_RECORDS:
                self._record(entry.index, decode_registry(entry.data))
            elif entry.kind is EntryKind.CONFIG_CHANGE:
                change, _membership = decode_config_change(entry.data)
                current = self.current()
                if change.op is ConfChangeOp.REMOVE_NODE:
                    self._record(entry.index, current.with_removal(change.node_id, entry.index))
                elif change.op is ConfChangeOp.ADD_LEARNER:
                    changed = current.without_removal(change.node_id)
                    if changed is not current:
                        self._record(entry.index, changed)

    def _record(self, index: LogIndex, registry: Registry) -> None:
        assert not self._indexes or index > self._indexes[-1], "registry changes in order"
        self._indexes.append(index)
        self._registries.append(registry)

    def current(self) -> Registry:
        """The registry after the last entry of the log."""
        return self._registries[-1] if self._registries else self._base

    def at(self, index: LogIndex) -> Registry:
        """The registry in effect at ``index`` (the latest change at or before it)."""
        position = bisect.bisect_right(self._indexes, index)
        return self._registries[position - 1] if position else self._base

    def last_change_index(self) -> LogIndex:
        """Index of the latest change, or of the base snapshot if none follows it."""
        return self._indexes[-1] if self._indexes else self._base_index


__all__ = ["RegistryHistory"]
