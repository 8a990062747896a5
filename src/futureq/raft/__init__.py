"""FutureQ's own Raft: a sans-IO consensus core (``core``) and its value types.

See ``docs/raft.md`` for the Ready/Advance contract and what is implemented.

The names below are loaded on first use (PEP 562): importing a submodule such as
``futureq.raft.cluster_clock`` or ``futureq.raft.peer_auth``, which a single node
does, must not load the consensus core and its message classes, which only a
cluster runs (``docs/architecture.md``, "Start-up").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from futureq.raft.core import ProposalDroppedError, RaftConfig, RaftCore, RaftNotLeaderError
    from futureq.raft.message_codec import decode_message, encode_message
    from futureq.raft.messages import LogIndex, Message, NodeId, Ready, Term
    from futureq.raft.roles import Role
    from futureq.raft.storage import MemoryStorage, Storage
    from futureq.raft.values import (
        ConfChange,
        ConfChangeOp,
        Entry,
        EntryKind,
        HardState,
        Membership,
        ReadState,
        Snapshot,
        SnapshotMetadata,
    )

_SOURCES = {
    "ProposalDroppedError": "core",
    "RaftConfig": "core",
    "RaftCore": "core",
    "RaftNotLeaderError": "core",
    "Role": "roles",
    "ConfChange": "values",
    "ConfChangeOp": "values",
    "Entry": "values",
    "EntryKind": "values",
    "HardState": "values",
    "LogIndex": "messages",
    "Membership": "values",
    "Message": "messages",
    "NodeId": "messages",
    "ReadState": "values",
    "Ready": "messages",
    "Snapshot": "values",
    "SnapshotMetadata": "values",
    "Term": "messages",
    "decode_message": "message_codec",
    "encode_message": "message_codec",
    "MemoryStorage": "storage",
    "Storage": "storage",
}


def __getattr__(name: str) -> Any:
    """Load ``name`` from the submodule that defines it, on first use."""
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{source}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_SOURCES})


__all__ = [
    "ConfChange",
    "ConfChangeOp",
    "Entry",
    "EntryKind",
    "HardState",
    "LogIndex",
    "MemoryStorage",
    "Membership",
    "Message",
    "NodeId",
    "ProposalDroppedError",
    "RaftConfig",
    "RaftCore",
    "RaftNotLeaderError",
    "ReadState",
    "Ready",
    "Role",
    "Snapshot",
    "SnapshotMetadata",
    "Storage",
    "Term",
    "decode_message",
    "encode_message",
]
