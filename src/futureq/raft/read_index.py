"""ReadIndex reads on the leader (thesis §6.4).

Plain functions over a :class:`~futureq.raft.core.RaftCore`: a read waits until the
leader has committed an entry of its term, takes the commit index, and is released once
a quorum acknowledged a heartbeat round sent after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from futureq.raft import leader, replication
from futureq.raft.messages import NodeId, ReadIndexResponse
from futureq.raft.values import ReadState

if TYPE_CHECKING:
    from futureq.raft.core import RaftCore


def handle_read_request(core: RaftCore, request_ctx: bytes, origin: NodeId) -> None:
    if not leader.committed_in_current_term(core):
        # Until its no-op commits, the leader's commit index may be behind entries
        # committed by earlier leaders (thesis §6.4 step 1).
        core._reads_awaiting_commit.append((request_ctx, origin))
        return
    core._reads.add(request_ctx, origin, core.log.committed)
    # Thesis §6.4 step 3: confirm we are still leader with a heartbeat round.
    replication.broadcast_heartbeat(core)
    release_reads(core)


def heartbeat_rounds_acked(core: RaftCore) -> dict[NodeId, int]:
    return {
        node_id: (core._reads.seq if node_id == core.id else pr.read_seq_acked)
        for node_id, pr in core.progress.items()
    }


def release_reads(core: RaftCore) -> None:
    acked = heartbeat_rounds_acked(core)
    for read in core._reads.confirmed(core.membership.voters, acked):
        if read.origin == core.id:
            core._read_states.append(ReadState(read.index, read.request_ctx))
        else:
            core._send(
                ReadIndexResponse(
                    core.term,
                    core.id,
                    read.origin,
                    read.request_ctx,
                    read.index,
                    sender=core._sender,
                )
            )
