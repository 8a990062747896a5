"""The core's part of the recovery exchange after a start (``docs/raft.md``, "Disk faults").

After a start the disk may have forgotten what this node told its peers (wiped, or
an older copy). Until every other voter has answered, the node neither votes nor
campaigns, and leaders do not count it (its messages say "recovering"). The answers
give the highest term in use, in which it then abstains, and a vote floor: the best
log they hold. The bookkeeping lives in :mod:`futureq.raft.recovery`; here are the
plain functions over a :class:`~futureq.raft.core.RaftCore` that tick, send and answer
it, tell a node that missed its removal it is not a member, and keep the member
registry records in the log.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from futureq.raft import leader, replication
from futureq.raft.messages import (
    LogIndex,
    NodeId,
    NotMember,
    RecoveryRequest,
    RecoveryResponse,
    Sender,
    Term,
)
from futureq.raft.payload_codec import encode_registry
from futureq.raft.recovery import Configurations
from futureq.raft.roles import Role
from futureq.raft.values import EntryKind, MemberRecord

if TYPE_CHECKING:
    from futureq.raft.core import RaftCore

log = logging.getLogger(__name__)


def start_recovery(core: RaftCore) -> None:
    set_recovering(core, True)
    begin_recovery_round(core)
    maybe_finish_recovery(core)


def set_recovering(core: RaftCore, recovering: bool) -> None:
    core.recovering = core._recovery.recovering = recovering
    core._sender = Sender(core.config.incarnation, core.config.boot_id, recovering)


def tick_recovery(core: RaftCore) -> None:
    """While recovering, or while a vote floor is set: keep asking.

    A floor may name entries that were never committed and are gone since; asking
    again every election timeout replaces it with what the voters hold now.
    """
    recovery = core._recovery
    if not core.recovering and recovery.vote_floor is None:
        return
    if core.recovering and not core._recovery_asked:
        send_recovery_requests(core)  # it has just learned who the voters are
        return
    core._recovery_elapsed += 1
    if not recovery.round_open:
        if core._recovery_elapsed >= core.config.election_timeout_ticks:
            begin_recovery_round(core)
        return
    # Ask again the voters that did not answer (lost, or down): every half election
    # timeout, so a node that is down for long costs little.
    if core._recovery_elapsed >= max(1, core.config.election_timeout_ticks // 2):
        core._recovery_elapsed = 0
        maybe_finish_recovery(core)  # the membership may have changed
        send_recovery_requests(core)


def begin_recovery_round(core: RaftCore) -> None:
    core._recovery.begin_round()
    core._recovery_elapsed = 0
    send_recovery_requests(core)


def recovery_configs(core: RaftCore) -> Configurations:
    own = (core._memberships.last_change_index(), core.membership.voters, core.log.committed)
    return core._recovery.configurations(own, core.id)


def recovery_required(core: RaftCore) -> frozenset[NodeId] | None:
    return recovery_configs(core).required


def send_recovery_requests(core: RaftCore) -> None:
    recovery = core._recovery
    required = recovery_required(core)
    if required is None or not recovery.round_open:
        return
    core._recovery_asked = True
    last_index, last_term = core.log.last_index(), core.log.last_term()
    for voter in recovery.missing(required):
        core._send(
            RecoveryRequest(
                core.term, core.id, voter, recovery.nonce, last_index, last_term,
                sender=core._sender,
            )
        )  # fmt: skip


def step_recovery(core: RaftCore, message: RecoveryRequest | RecoveryResponse | NotMember) -> None:
    if isinstance(message, RecoveryRequest):
        handle_recovery_request(core, message)
    elif isinstance(message, RecoveryResponse):
        if core._recovery.take(message):
            maybe_finish_recovery(core)
    else:
        handle_not_member(core, message)


def handle_recovery_request(core: RaftCore, message: RecoveryRequest) -> None:
    # Any node answers, from its durable state: at most one disk forgets at a time,
    # and the requester hears from every other voter.
    if tell_if_removed(core, message.from_id, message.last_log_index):
        return
    if core.role is Role.LEADER:
        pr = core.progress.get(message.from_id)
        next_index = LogIndex(core.log.last_index() + 1)
        if pr is not None and pr.observe(message.sender, next_index):
            replication.send_append(core, message.from_id)  # probe the restarted peer's log
    record = core.registry_at(core.log.committed).record(message.from_id)
    core._send(
        RecoveryResponse(
            core.term,
            core.id,
            message.from_id,
            message.nonce,
            core.log.last_index(),
            core.log.last_term(),
            core._memberships.last_change_index(),
            core.membership.voters,
            core.log.committed,
            record.incarnation if record is not None else 0,
            record.acked_term if record is not None else Term(0),
            record.acked_index if record is not None else LogIndex(0),
            sender=core._sender,
        )
    )


def maybe_finish_recovery(core: RaftCore) -> None:
    if core._recovery.foreign is not None and core.recovering:
        return  # another cluster's log: never take part (docs/raft.md, "Disk faults")
    result = core._recovery.complete(recovery_configs(core), new_cluster=core.config.new_cluster)
    if result is None:
        return
    own = (core.log.last_term(), core.log.last_index())
    if (
        core.recovering
        and recovery_required(core)
        and core._recovery.note_foreign(own, result.highest_term)
    ):
        return
    core._recovery.set_floor(result.floor, own)
    core._recovery_elapsed = 0
    if not core.recovering:
        return  # a refresh of the vote floor
    # Abstain in the highest term in use: this node may have voted in it before its
    # disk forgot (a durable vote of that term is kept: it is the one it gave).
    if result.highest_term > core.term:
        core._become_follower(result.highest_term, None)
        core.vote = core.id
    elif core.vote is None:
        core.vote = core.id
    set_recovering(core, False)
    core._election_elapsed = 0
    core._reset_randomized_election_timeout()


def tell_if_removed(core: RaftCore, node_id: NodeId, their_last_index: LogIndex) -> bool:
    """Answer a node that missed its own removal (committed here) with NotMember.

    Returns:
        True if it was told (and its message must be ignored).
    """
    if their_last_index == 0 or node_id in core.membership.members():
        # A blank node may be the same id about to be added back (the manual
        # remove, start blank, add-node procedure): it waits, recovering.
        return False
    removed_at = core.registry_at(core.log.committed).removed_at(node_id)
    if removed_at is None or their_last_index >= removed_at:
        return False
    core._send(NotMember(core.term, core.id, node_id, removed_at, sender=core._sender))
    return True


def handle_not_member(core: RaftCore, message: NotMember) -> None:
    if core.role is Role.LEADER or core.removed_at is not None:
        return
    if core.log.committed >= message.removed_at:
        return  # we hold its whole log up to there; our own membership says the truth
    core.removed_at = message.removed_at
    core._recovery.findings.append(
        f"node {message.from_id} says this node was removed from the cluster at log "
        f"index {message.removed_at}"
    )
    if core.role is not Role.FOLLOWER:
        core._become_follower(core.term, None)


def tick_member_records(core: RaftCore) -> None:
    """Leader: write the member registry when it changed (``docs/raft.md``).

    At once when a member's incarnation is new; otherwise at most every
    ``member_record_ticks`` when acknowledged positions advanced.
    """
    core._records_elapsed += 1
    due = core._records_elapsed >= core.config.member_record_ticks
    if not (due or core._records_check) or (
        not leader.committed_in_current_term(core)
        or core.lead_transferee is not None
        or core.id not in core.progress
        or core._registry.last_change_index() > core.log.committed
    ):
        return
    core._records_check = False
    if due:
        core._records_elapsed = 0
    current = core._registry.current()
    records: list[MemberRecord] = []
    new_incarnation = advanced = False
    for node_id in core.membership.members():
        old = current.record(node_id)
        pr = core.progress.get(node_id)
        new = old
        if node_id == core.id:
            new = MemberRecord(
                node_id, core.config.incarnation, core.term, core.log.persisted_index()
            )
        elif pr is not None and pr.peer_incarnation and not pr.peer_recovering and pr.match:
            new = MemberRecord(node_id, pr.peer_incarnation, core.term, pr.match)
        if new is None:
            continue
        if old is None or old.incarnation != new.incarnation:
            new_incarnation = True
        elif (new.acked_term, new.acked_index) > (old.acked_term, old.acked_index):
            advanced = True
        records.append(new)
    if not (new_incarnation or (advanced and due)):
        return
    core._records_elapsed = 0
    data = encode_registry(current.with_records(records))
    core._propose_entry(EntryKind.MEMBER_RECORDS, data)
