"""FutureQ's own Raft: a sans-IO consensus core (``core``) and its value types.

See ``docs/raft.md`` for the Ready/Advance contract and what is implemented.
"""

from futureq.raft.core import (
    ProposalDroppedError,
    RaftConfig,
    RaftCore,
    RaftNotLeaderError,
    Role,
)
from futureq.raft.messages import (
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryKind,
    HardState,
    LogIndex,
    Membership,
    Message,
    NodeId,
    ReadState,
    Ready,
    Snapshot,
    SnapshotMetadata,
    Term,
    decode_message,
    encode_message,
)
from futureq.raft.storage import MemoryStorage, Storage

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
