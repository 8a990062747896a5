"""The follower's side of replication: AppendEntries, heartbeats, InstallSnapshot.

Plain functions over a :class:`~futureq.raft.core.RaftCore`: the consistency check and
conflict truncation with the fast back-off hint (paper §5.3, thesis §5.3), commit
index updates from the leader, and restoring a snapshot received in chunks (paper §7,
thesis §5).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from futureq.errors import (
    RemoteProtocolError,
)
from futureq.raft import election
from futureq.raft.messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    LogIndex,
    Message,
    ReadIndexResponse,
    TimeoutNow,
)
from futureq.raft.payload_codec import decode_config_change
from futureq.raft.roles import Campaign
from futureq.raft.values import EntryKind, ReadState, Snapshot

if TYPE_CHECKING:
    from futureq.raft.core import RaftCore


def step_follower(core: RaftCore, message: Message) -> None:
    if isinstance(message, AppendEntries | Heartbeat | InstallSnapshot):
        core._election_elapsed = 0
        core.leader_id = message.from_id
        core._failed_campaigns = 0  # a leader is heard: campaign_backoff is over
        core._last_campaign = None  # and what its campaigns got is no news
        if isinstance(message, AppendEntries):
            handle_append_entries(core, message)
        elif isinstance(message, Heartbeat):
            handle_heartbeat(core, message)
        else:
            handle_install_snapshot(core, message)
    elif isinstance(message, TimeoutNow):
        # Thesis §3.10: campaign at once, skipping PreVote and stickiness.
        if election.may_campaign(core):
            election.campaign(core, Campaign.TRANSFER)
    elif isinstance(message, ReadIndexResponse):
        core._read_states.append(ReadState(message.index, message.request_ctx))


def handle_append_entries(core: RaftCore, message: AppendEntries) -> None:
    """AppendEntries receiver (paper Figure 2 and §5.3)."""
    if not entries_well_formed(message):
        return
    if message.prev_log_index < core.log.committed:
        # Everything up to our commit index already matches the leader.
        core._leader_match = LogIndex(max(core._leader_match, core.log.committed))
        core._send(
            AppendEntriesResponse(
                core.term,
                core.id,
                message.from_id,
                True,
                core.log.committed,
                sender=core._sender,
            )
        )
        return
    result = core.log.maybe_append(
        message.prev_log_index, message.prev_log_term, message.leader_commit, message.entries
    )
    if result is not None:
        last_new, appended = result
        core._leader_match = LogIndex(max(core._leader_match, last_new))
        if appended:
            core._memberships.truncate_from(appended[0].index)
            core._memberships.record_entries(appended)
            core._registry.truncate_from(appended[0].index)
            core._registry.record_entries(appended)
        core._send(
            AppendEntriesResponse(
                core.term, core.id, message.from_id, True, last_new, sender=core._sender
            )
        )
        return
    # Thesis §5.3: tell the leader where our log might match so it can skip a
    # whole term of entries per round trip instead of one entry.
    hint_index = LogIndex(min(message.prev_log_index, core.log.last_index()))
    hint_index, hint_term = core.log.find_conflict_by_term(hint_index, message.prev_log_term)
    core._send(
        AppendEntriesResponse(
            core.term,
            core.id,
            message.from_id,
            False,
            message.prev_log_index,
            reject_hint=hint_index,
            log_term=hint_term,
            sender=core._sender,
        )
    )


def entries_well_formed(message: AppendEntries) -> bool:
    expected = message.prev_log_index + 1
    for entry in message.entries:
        if entry.index != expected or entry.term > message.term:
            return False
        if entry.kind is EntryKind.CONFIG_CHANGE:
            try:
                decode_config_change(entry.data)
            except RemoteProtocolError:
                return False
        expected += 1
    return True


def handle_heartbeat(core: RaftCore, message: Heartbeat) -> None:
    # The leader sends min(commit, our match). Its idea of our match may predate a
    # restart with a disk that forgot (docs/raft.md, "Disk faults"), so commit only
    # as far as this term's AppendEntries showed our log to match the leader's.
    core.log.commit_to(LogIndex(min(message.commit, core._leader_match)))
    core._send(
        HeartbeatResponse(
            core.term, core.id, message.from_id, message.read_seq, sender=core._sender
        )
    )


def handle_install_snapshot(core: RaftCore, message: InstallSnapshot) -> None:
    """InstallSnapshot receiver (paper §7, Figure 13), chunk by chunk."""
    if message.snapshot_index <= core.log.committed:
        # Already covered (e.g. our earlier "done" answer was lost): say so at once
        # instead of receiving the whole snapshot again.
        core._send(
            InstallSnapshotResponse(
                core.term, core.id, message.from_id, message.snapshot_index,
                message.offset, message.offset, done=True, match_index=core.log.committed,
                sender=core._sender,
            )
        )  # fmt: skip
        return
    next_offset, snapshot = core._snapshot_receiver.receive(
        message.term,
        message.snapshot_index,
        message.snapshot_term,
        message.membership,
        message.offset,
        message.data,
        message.done,
        message.registry,
    )
    if snapshot is None:
        core._send(
            InstallSnapshotResponse(
                core.term,
                core.id,
                message.from_id,
                message.snapshot_index,
                message.offset,
                next_offset,
                sender=core._sender,
            )
        )
        return
    match_index = restore(core, snapshot)
    core._leader_match = LogIndex(max(core._leader_match, match_index))
    core._send(
        InstallSnapshotResponse(
            core.term,
            core.id,
            message.from_id,
            message.snapshot_index,
            message.offset,
            next_offset,
            done=True,
            match_index=match_index,
            sender=core._sender,
        )
    )


def restore(core: RaftCore, snapshot: Snapshot) -> LogIndex:
    metadata = snapshot.metadata
    if metadata.index <= core.log.committed:
        return core.log.committed  # we already have (and may have applied) it all
    if core.log.match_term(metadata.index, metadata.term):
        # Paper §7: our log already contains the snapshot's last entry; keep the
        # entries after it and just learn that everything up to it is committed.
        core.log.commit_to(metadata.index)
        return metadata.index
    core.log.restore(snapshot)
    core._memberships.reset(metadata.index, metadata.membership)
    core._registry.reset(metadata.index, metadata.registry)
    return metadata.index
