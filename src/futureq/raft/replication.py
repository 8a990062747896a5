"""What the leader sends each follower, driven by its :class:`~futureq.raft.progress.Progress`.

Plain functions over a :class:`~futureq.raft.core.RaftCore`: AppendEntries by each
follower's next index, pipelined up to the in-flight cap (paper §5.3, thesis §10.2.2);
heartbeats, which also carry ReadIndex rounds (thesis §6.4); and InstallSnapshot in
chunks to a follower whose next entry was compacted away (paper §7, thesis §5).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from futureq.raft.messages import (
    AppendEntries,
    Heartbeat,
    InstallSnapshot,
    LogIndex,
    NodeId,
)
from futureq.raft.progress import Progress, ProgressState
from futureq.raft.storage import CompactedError

if TYPE_CHECKING:
    from futureq.raft.core import RaftCore


def broadcast_append(core: RaftCore) -> None:
    for node_id in sorted(core.progress):
        if node_id != core.id:
            send_append(core, node_id)


def send_pending_appends(core: RaftCore) -> None:
    """The commit index advanced: send AppendEntries only to followers that have
    entries to receive. The others learn the new commit index with the next
    AppendEntries or heartbeat (at most one heartbeat interval later): an
    AppendEntries carrying nothing but the commit index would cost every follower a
    wakeup, an apply and an answer, and the leader that answer, on the path of the
    next client request (the leader needs no follower's apply to answer)."""
    for node_id in sorted(core.progress):
        if node_id != core.id:
            send_append(core, node_id, send_if_empty=False)


def broadcast_heartbeat(core: RaftCore) -> None:
    # Every broadcast is a new round: ReadIndex confirmations and the leader lease
    # (thesis §6.4, §6.4.1) count the rounds a majority answered.
    round_number = core._reads.next_round()
    for node_id in sorted(core.progress):
        if node_id != core.id:
            pr = core.progress[node_id]
            commit = LogIndex(min(pr.match, core.log.committed))
            core._send(
                Heartbeat(core.term, core.id, node_id, commit, round_number, sender=core._sender)
            )


def send_append(core: RaftCore, peer: NodeId, *, send_if_empty: bool = True) -> bool:
    """Send AppendEntries from ``next`` (or a snapshot if compacted away).

    Returns:
        True if a message was sent.
    """
    pr = core.progress[peer]
    if pr.is_paused():
        return False
    prev_index = LogIndex(pr.next - 1)
    prev_term = core.log.term(prev_index)
    try:
        entries = core.log.entries(pr.next, core.config.max_append_bytes)
    except CompactedError:
        prev_term = None
    if prev_term is None:
        return send_snapshot(core, peer, pr)
    if not entries and not send_if_empty:
        return False
    core._send(
        AppendEntries(
            core.term,
            core.id,
            peer,
            prev_index,
            prev_term,
            tuple(entries),
            core.log.committed,
            sender=core._sender,
        )
    )
    if entries:
        pr.sent_entries(entries[-1].index)
    elif pr.state is ProgressState.PROBE:
        pr.probe_sent = True
    return True


def send_snapshot(core: RaftCore, peer: NodeId, pr: Progress) -> bool:
    if not pr.recent_active:
        return False  # it may be down; wait until it answers a probe or heartbeat
    pr.become_snapshot(core.log.snapshot())
    send_snapshot_chunk(core, peer, pr)
    return True


def send_snapshot_chunk(core: RaftCore, peer: NodeId, pr: Progress) -> None:
    assert pr.snapshot is not None
    metadata = pr.snapshot.metadata
    offset, data, done = pr.next_snapshot_chunk(core.config.snapshot_chunk_bytes)
    core._send(
        InstallSnapshot(
            core.term, core.id, peer, metadata.index, metadata.term, metadata.membership,
            offset, data, done, metadata.registry, sender=core._sender,
        )
    )  # fmt: skip
