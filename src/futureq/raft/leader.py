"""The leader's rules: heartbeat timer, CheckQuorum, responses, commitment.

Plain functions over a :class:`~futureq.raft.core.RaftCore`: the heartbeat tick and
CheckQuorum (thesis §6.2), the check that a membership change keeps a quorum active
(thesis §4.2), appending the leader's own entries, handling AppendEntries, heartbeat and
InstallSnapshot responses per follower progress (paper §5.3), advancing the commit index
for current-term entries only (paper §5.4.2, Figure 8), and stepping down once the
leader's own removal is committed (thesis §4.2.2). Sending lives in
:mod:`futureq.raft.replication`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from futureq.errors import (
    ErrorCode,
    RequestError,
)
from futureq.raft import read_index, recovery_steps, replication
from futureq.raft.messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    LogIndex,
    Message,
    NodeId,
    ReadIndex,
    TimeoutNow,
)
from futureq.raft.progress import Progress, ProgressState
from futureq.raft.quorum import (
    apply_conf_change,
    committed_index,
    has_quorum,
    majority,
)
from futureq.raft.roles import Role
from futureq.raft.values import ConfChange, ConfChangeOp, Entry, EntryKind

if TYPE_CHECKING:
    from futureq.raft.core import RaftCore


def tick_heartbeat(core: RaftCore) -> None:
    core._heartbeat_elapsed += 1
    core._election_elapsed += 1
    if core._election_elapsed >= core.config.election_timeout_ticks:
        core._election_elapsed = 0
        if core.config.check_quorum and not quorum_recently_active(core):
            # Thesis §6.2: without a live quorum we may be deposed; step down so
            # clients look for the real leader.
            core._become_follower(core.term, None)
            return
        if core.lead_transferee is not None:
            core.lead_transferee = None  # thesis §3.10: abort after a timeout
    if core._heartbeat_elapsed >= core.config.heartbeat_interval_ticks:
        core._heartbeat_elapsed = 0
        replication.broadcast_heartbeat(core)
    if core.config.member_record_ticks:
        recovery_steps.tick_member_records(core)


def heard_from(core: RaftCore, *, previous_timeout_too: bool) -> set[NodeId]:
    """This leader and the members that answered it in the current election timeout
    (and, with ``previous_timeout_too``, in the one before), a recovering peer not
    counted (thesis §6.2: a leader steps down without such a quorum)."""
    return {
        node_id
        for node_id, pr in core.progress.items()
        if node_id == core.id
        or (
            (pr.recent_active or (previous_timeout_too and pr.was_active))
            and not pr.peer_recovering
        )
    }


def quorum_recently_active(core: RaftCore) -> bool:
    active = heard_from(core, previous_timeout_too=False)
    for node_id, pr in core.progress.items():
        if node_id != core.id:
            pr.was_active = pr.recent_active
            pr.recent_active = False
    return has_quorum(core.membership.voters, active)


def voters_after(core: RaftCore, change: ConfChange) -> frozenset[NodeId] | None:
    """The voters ``change`` would leave, or None when it leaves them as they are (a
    learner added or removed) or leaves none: the changes a quorum check looks at."""
    after = apply_conf_change(core.membership, change).voters
    return None if after == core.membership.voters or not after else after


def check_quorum_after(core: RaftCore, change: ConfChange) -> None:
    """Refuse a change whose voters would not hold a quorum of members this leader
    heard from in the last one or two election timeouts (as etcd's
    ``--strict-reconfig-check``): removing the leader, or a live voter, while
    another is down left the cluster without a leader until the down one came back.

    Raises:
        RequestError: QUORUM_AT_RISK, naming the voters not heard from.
    """
    after = voters_after(core, change)
    if after is None:
        return
    heard = heard_from(core, previous_timeout_too=True)
    if has_quorum(after, heard):
        return
    silent = sorted(int(n) for n in after - heard)
    action = "removing" if change.op is ConfChangeOp.REMOVE_NODE else "promoting"
    raise RequestError(
        ErrorCode.QUORUM_AT_RISK,
        f"{action} node {change.node_id} would leave voters "
        f"{sorted(int(n) for n in after)}, of which node(s) {silent} have not answered "
        f"this leader for an election timeout or more (down, partitioned or still "
        f"catching up): fewer than a majority ({majority(len(after))} of {len(after)}) "
        "would be left to elect and commit. Bring those nodes back first (or remove a "
        "node that is down instead)",
    )


def append_leader_entries(core: RaftCore, entries: list[Entry]) -> None:
    core.log.append(entries)
    if any(e.kind in (EntryKind.CONFIG_CHANGE, EntryKind.MEMBER_RECORDS) for e in entries):
        core._registry.record_entries(entries)
    if any(e.kind is EntryKind.CONFIG_CHANGE for e in entries):
        core._memberships.record_entries(entries)
        # Thesis §4.1: the new configuration is used as soon as it is appended.
        core._sync_progress()
        if maybe_commit(core):
            replication.broadcast_append(core)


def step_leader(core: RaftCore, message: Message) -> None:
    if isinstance(message, ReadIndex):
        read_index.handle_read_request(core, message.request_ctx, message.from_id)
        return
    assert not isinstance(message, AppendEntries | Heartbeat | InstallSnapshot), (
        f"two leaders in term {core.term}: {core.id} and {message.from_id}"
    )
    pr = core.progress.get(message.from_id)
    if pr is None:
        return
    sender = message.sender
    was_recovering = pr.peer_recovering
    if sender.incarnation != pr.peer_incarnation or sender.recovering != was_recovering:
        core._records_check = True  # a new incarnation to record, perhaps
    restarted = pr.observe(sender, LogIndex(core.log.last_index() + 1))
    if was_recovering and not pr.peer_recovering and maybe_commit(core):
        # Its acknowledgements count from now on (docs/raft.md, "Disk faults").
        replication.broadcast_append(core)
        if core.role is not Role.LEADER:
            return
    pr.recent_active = True
    if isinstance(message, AppendEntriesResponse):
        handle_append_response(core, message, pr)
    elif isinstance(message, HeartbeatResponse):
        handle_heartbeat_response(core, message, pr)
    elif isinstance(message, InstallSnapshotResponse):
        handle_snapshot_response(core, message, pr)
    if restarted and core.role is Role.LEADER and message.from_id in core.progress:
        replication.send_append(core, message.from_id)  # probe the restarted peer's log at once


def handle_append_response(core: RaftCore, message: AppendEntriesResponse, pr: Progress) -> None:
    peer = message.from_id
    if not message.success:
        # Thesis §5.3 fast back-off: jump to where the logs may match.
        match_hint = message.reject_hint
        if message.log_term > 0:
            match_hint, _ = core.log.find_conflict_by_term(message.reject_hint, message.log_term)
        if pr.maybe_decrease_to(message.index, match_hint):
            if pr.state is ProgressState.REPLICATE:
                pr.become_probe()
            replication.send_append(core, peer)
        return
    was_paused = pr.is_paused()
    if not pr.maybe_update(message.index):
        return
    if pr.state is ProgressState.PROBE:
        pr.become_replicate()
    elif pr.state is ProgressState.SNAPSHOT and pr.match + 1 >= core.log.first_index():
        pr.become_probe()
        pr.become_replicate()
    if maybe_commit(core):
        replication.send_pending_appends(core)
    elif was_paused:
        replication.send_append(core, peer)
    if core.role is not Role.LEADER:
        return  # committing removed us (thesis §4.2.2)
    while replication.send_append(core, peer, send_if_empty=False):
        pass
    if peer == core.lead_transferee and pr.match == core.log.last_index():
        # Thesis §3.10: the target is up to date; let it start an election now.
        core._send(TimeoutNow(core.term, core.id, peer, sender=core._sender))


def handle_heartbeat_response(core: RaftCore, message: HeartbeatResponse, pr: Progress) -> None:
    peer = message.from_id
    pr.probe_sent = False
    if pr.state is ProgressState.REPLICATE and pr.is_paused():
        pr.inflight.popleft()  # one may have been lost; let the pipeline move
    if pr.state is ProgressState.SNAPSHOT:
        if pr.snapshot_stalled():
            replication.send_snapshot_chunk(core, peer, pr)  # the chunk in flight was lost
    elif pr.match < core.log.last_index() or pr.state is ProgressState.PROBE:
        replication.send_append(core, peer)
    if message.read_seq > pr.read_seq_acked and not pr.peer_recovering:
        pr.read_seq_acked = message.read_seq
        read_index.release_reads(core)


def handle_snapshot_response(
    core: RaftCore, message: InstallSnapshotResponse, pr: Progress
) -> None:
    peer = message.from_id
    snapshot = pr.snapshot
    if pr.state is not ProgressState.SNAPSHOT or snapshot is None:
        return
    if snapshot.metadata.index != message.snapshot_index:
        return
    if message.done:
        pr.maybe_update(message.match_index)
        pr.become_probe()
        if pr.match + 1 >= core.log.first_index():
            pr.become_replicate()
        if maybe_commit(core):
            replication.broadcast_append(core)
        elif core.role is Role.LEADER:
            replication.send_append(core, peer)
        return
    if pr.snapshot_chunk_answered(message.chunk_offset, message.next_offset):
        replication.send_snapshot_chunk(core, peer, pr)


def maybe_commit(core: RaftCore) -> bool:
    """Advance the commit index by counting replicas (paper §5.3, §5.4.2)."""
    # A recovering peer's acknowledgements do not count (docs/raft.md, "Disk faults").
    match = {node_id: pr.match for node_id, pr in core.progress.items() if pr.counts}
    index = LogIndex(committed_index(core.membership.voters, match))
    # Paper §5.4.2 / Figure 8: only an entry of the current term is committed by
    # counting; earlier ones are committed with it by the log matching property.
    if not core.log.maybe_commit(index, core.term):
        return False
    if core._reads_awaiting_commit and committed_in_current_term(core):
        waiting, core._reads_awaiting_commit = core._reads_awaiting_commit, []
        for request_ctx, origin in waiting:
            read_index.handle_read_request(core, request_ctx, origin)
    if not core._promotable() and core.log.committed >= core._memberships.last_change_index():
        step_down_after_removal(core)
    return True


def step_down_after_removal(core: RaftCore) -> None:
    # Thesis §4.2.2: a leader removed from the configuration steps down once the
    # change is committed. Hand over to the most up-to-date voter at once (§3.10)
    # instead of leaving the cluster without a leader for an election timeout.
    best: NodeId | None = None
    for node_id in sorted(core.membership.voters):
        pr = core.progress.get(node_id)
        if pr is not None and pr.match == core.log.last_index() and not pr.peer_recovering:
            best = node_id
            break
    if best is not None:
        core._send(TimeoutNow(core.term, core.id, best, sender=core._sender))
    core._become_follower(core.term, None)


def committed_in_current_term(core: RaftCore) -> bool:
    return core.log.committed >= core._term_start_index and core.role is Role.LEADER
