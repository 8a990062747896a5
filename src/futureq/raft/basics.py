"""The smallest Raft vocabulary: id and index types and the majority rule.

Kept apart from :mod:`futureq.raft.values` and :mod:`futureq.raft.messages` (about
thirty attrs classes) so that a single node, which uses the cluster clock and
peer-credential checks but runs no Raft, loads no more than this
(``docs/architecture.md``, "Start-up").
"""

from __future__ import annotations

from typing import NewType

NodeId = NewType("NodeId", int)
"""A server's id; ids are >= 1 and never reused for a different server."""
Term = NewType("Term", int)
"""A Raft term (paper §5.1); 0 before any election."""
LogIndex = NewType("LogIndex", int)
"""A log position; the first entry has index 1, index 0 stands for "before the log"."""


def majority(voter_count: int) -> int:
    """Smallest number of voters that forms a majority of ``voter_count`` (paper §5.2)."""
    return voter_count // 2 + 1


__all__ = ["LogIndex", "NodeId", "Term", "majority"]
