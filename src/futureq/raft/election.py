"""Elections: the election timer, campaigns, PreVote and answering RequestVote.

Plain functions over a :class:`~futureq.raft.core.RaftCore` (its state stays there):

* randomized election timeouts and campaigns (paper §5.2), lengthened after votes
  that arrived too late (:data:`MAX_CAMPAIGN_BACKOFF`);
* PreVote, a round that changes neither term nor vote (thesis §9.6);
* the vote rules: one vote per term, the up-to-date check (paper §5.4.1), the vote
  floor of a node recovering after a start (``docs/raft.md``, "Disk faults"), no vote
  for a candidate whose clock this node measures too far off to lead
  (``docs/architecture.md``, "Time");
* counting votes as a candidate or pre-candidate (:mod:`futureq.raft.quorum`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import attrs

from futureq.raft import follower
from futureq.raft.messages import (
    AppendEntries,
    Heartbeat,
    InstallSnapshot,
    LogIndex,
    Message,
    NodeId,
    RequestVote,
    RequestVoteResponse,
    Term,
)
from futureq.raft.quorum import (
    VoteResult,
    majority,
    vote_result,
)
from futureq.raft.roles import Campaign, Role

if TYPE_CHECKING:
    from futureq.raft.core import RaftCore

log = logging.getLogger(__name__)

MAX_CAMPAIGN_BACKOFF = 4
"""Largest factor by which failed campaigns stretch the election timeout (a power of
two; :attr:`RaftCore.campaign_backoff`): with T = 500 ms a starved node waits at most
2-4 s between campaigns, and goes back to 0.5-1 s once it hears a leader."""


def note_late_vote(core: RaftCore, message: RequestVoteResponse) -> None:
    """An answer to an election this node already gave up (its timer fired first):
    messages take longer than the election timeout, so wait longer next time."""
    term = message.term
    if term == core._timed_out_term and term > core._late_vote_term:
        core._late_vote_term = term
        core._failed_campaigns = min(
            core._failed_campaigns + 1, MAX_CAMPAIGN_BACKOFF.bit_length() - 1
        )
        log.info(
            "node %d: the vote of node %d for term %d came after that election timed "
            "out; waiting up to %d times the election timeout before campaigning",
            core.id, message.from_id, term, core.campaign_backoff,
        )  # fmt: skip


def tick_election(core: RaftCore) -> None:
    core._election_elapsed += 1
    # A node that may not lead lets its timer run on (so it stops ignoring vote
    # requests, leader stickiness) instead of restarting it with a campaign.
    if (
        may_campaign(core)
        and core.campaign_allowed
        and core._election_elapsed >= core._randomized_election_timeout
    ):
        core._election_elapsed = 0
        if core.role is Role.CANDIDATE:
            core._timed_out_term = core.term  # a vote for it now comes too late
        campaign(core, Campaign.PRE_VOTE if core.config.pre_vote else Campaign.ELECTION)


def may_campaign(core: RaftCore) -> bool:
    """A voter that finished recovery, was not told it was removed, and whose own
    log reached its vote floor (``docs/raft.md``, "Disk faults")."""
    if not core._promotable() or core.recovering or core.removed_at is not None:
        return False
    return not below_vote_floor(core, core.log.last_term(), core.log.last_index())


def below_vote_floor(core: RaftCore, last_term: Term, last_index: LogIndex) -> bool:
    """Whether a log ending at ``(last_term, last_index)`` is behind the vote floor
    (the k-th best log the voters held when this node last asked them)."""
    if core._recovery.vote_floor is None:
        return False
    own = (core.log.last_term(), core.log.last_index())
    return core._recovery.below_floor((last_term, last_index), own)


def campaign(core: RaftCore, kind: Campaign) -> None:
    if not may_campaign(core) or not core.campaign_allowed:
        return
    if kind is Campaign.PRE_VOTE:
        core._become_pre_candidate()
        vote_term = Term(core.term + 1)
    else:
        core._become_candidate()
        vote_term = core.term
    core._votes[core.id] = True
    core._last_campaign = (
        kind is Campaign.PRE_VOTE,
        vote_term,
        frozenset(core.membership.voters),
        core._votes,
    )
    if poll(core) is VoteResult.WON:  # a single-voter cluster
        if kind is Campaign.PRE_VOTE:
            campaign(core, Campaign.ELECTION)
        else:
            core._become_leader()
        return
    last_index = core.log.last_index()
    last_term = core.log.last_term()
    log.debug(
        "node %d: campaigns (%s) for term %d with last term %d, index %d",
        core.id, kind.name.lower(), vote_term, last_term, last_index,
    )  # fmt: skip
    for voter in sorted(core.membership.voters):
        if voter != core.id:
            core._send(
                RequestVote(
                    vote_term,
                    core.id,
                    voter,
                    last_index,
                    last_term,
                    pre_vote=kind is Campaign.PRE_VOTE,
                    leadership_transfer=kind is Campaign.TRANSFER,
                    sender=core._sender,
                )
            )


@attrs.frozen
class CampaignStatus:
    """What this node's last campaign got, since it last heard a leader.

    Attributes:
        pre_vote: True for a PreVote round (thesis §9.6), False for a real election.
        term: The term it asked votes for.
        needed: Votes that win it (a majority of the voters, its own included).
        granted: Voters that granted their vote, this node included (ascending ids).
        refused: Voters that refused it (ascending ids).
        silent: Voters that did not answer (ascending ids): down, unreachable, or
            answering after the campaign ended.
    """

    pre_vote: bool
    term: Term
    needed: int
    granted: tuple[NodeId, ...]
    refused: tuple[NodeId, ...]
    silent: tuple[NodeId, ...]


def campaign_status(core: RaftCore) -> CampaignStatus | None:
    """What :func:`campaign` last got: None when this node has not campaigned since it
    last heard a leader (or led). Says why a node that may lead gets no leader: which
    voters do not answer, which refuse (a node said only "no leader is known yet",
    found by a tester)."""
    if core._last_campaign is None:
        return None
    pre_vote, term, voters, votes = core._last_campaign
    return CampaignStatus(
        pre_vote,
        term,
        majority(len(voters)),
        tuple(sorted(v for v in voters if votes.get(v) is True)),
        tuple(sorted(v for v in voters if votes.get(v) is False)),
        tuple(sorted(v for v in voters if v not in votes)),
    )


def poll(core: RaftCore) -> VoteResult:
    return vote_result(core.membership.voters, core._votes)


def handle_request_vote(core: RaftCore, message: RequestVote) -> None:
    # Paper §5.2: at most one vote per term, first come first served; thesis §9.6:
    # a pre-vote is granted to any up-to-date candidate of a higher term.
    can_vote = (
        core.vote == message.from_id
        or (core.vote is None and core.leader_id is None)
        or (message.pre_vote and message.term > core.term)
    ) and (
        # docs/raft.md, "Disk faults": a node whose disk may have forgotten what it
        # acknowledged votes for no one, and then only for logs it knows are safe.
        not core.recovering
        and core.removed_at is None
        and not below_vote_floor(core, message.last_log_term, message.last_log_index)
        # docs/architecture.md, "Time": not for a candidate whose clock this node
        # measures too far off to lead, whatever the candidate says of it.
        and message.from_id not in core.votes_refused
    )
    # Paper §5.4.1: only for a candidate whose log is at least as up-to-date.
    up_to_date = core.log.is_up_to_date(message.last_log_index, message.last_log_term)
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "node %d: %s for node %d in term %d %s",
            core.id, vote_kind(message), message.from_id, message.term,
            "granted" if can_vote and up_to_date
            else "refused: " + vote_refusal(core, message, up_to_date),
        )  # fmt: skip
    if can_vote and up_to_date:
        core._send(
            RequestVoteResponse(
                message.term,
                core.id,
                message.from_id,
                True,
                message.pre_vote,
                sender=core._sender,
            )
        )
        if not message.pre_vote:
            core._election_elapsed = 0
            core.vote = message.from_id
        elif core.role is Role.PRE_CANDIDATE and yields_to(core, message):
            # Two pre-candidates that time out together would grant each other's
            # PreVote, both campaign, vote for themselves and split the election
            # (another whole timeout). The one less placed to win gives up its
            # own campaign: a PreVote changed nothing, so it is as if it had not
            # timed out yet, and it can now vote for the other (thesis §9.6).
            log.debug(
                "node %d: gives up its pre-campaign for node %d's", core.id,
                message.from_id,
            )  # fmt: skip
            core._become_follower(core.term, None)
    else:
        core._send(
            RequestVoteResponse(
                core.term,
                core.id,
                message.from_id,
                False,
                message.pre_vote,
                sender=core._sender,
            )
        )


def yields_to(core: RaftCore, message: RequestVote) -> bool:
    """Whether the candidate of ``message`` goes first: a longer log (last term, then
    last index), or the same log and a lower node id."""
    theirs = (message.last_log_term, message.last_log_index, -int(message.from_id))
    ours = (core.log.last_term(), core.log.last_index(), -int(core.id))
    return theirs > ours


def vote_refusal(core: RaftCore, message: RequestVote, up_to_date: bool) -> str:
    """Why :func:`handle_request_vote` refuses ``message`` (for the debug log)."""
    if core.recovering:
        return "this node is recovering after its start"
    if core.removed_at is not None:
        return f"this node was removed at index {core.removed_at}"
    if below_vote_floor(core, message.last_log_term, message.last_log_index):
        return "its log is below this node's vote floor"
    if message.from_id in core.votes_refused:
        return "its wall clock, by this node's measure, is too far from cluster time to lead"
    if not (message.pre_vote and message.term > core.term):
        if core.vote is not None and core.vote != message.from_id:
            return f"already voted for node {core.vote} in term {core.term}"
        if core.vote is None and core.leader_id is not None:
            return f"node {core.leader_id} leads term {core.term}"
    if not up_to_date:
        return (
            f"its log (last term {message.last_log_term}, index "
            f"{message.last_log_index}) is behind ours (last term "
            f"{core.log.last_term()}, index {core.log.last_index()})"
        )
    return "not eligible"


def step_candidate(core: RaftCore, message: Message) -> None:
    if isinstance(message, AppendEntries | Heartbeat | InstallSnapshot):
        # Paper §5.2: a leader of our term exists; return to follower.
        core._become_follower(core.term, message.from_id)
        follower.step_follower(core, message)
    elif isinstance(message, RequestVoteResponse):
        if message.pre_vote != (core.role is Role.PRE_CANDIDATE):
            return
        core._votes.setdefault(message.from_id, message.granted)
        result = poll(core)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "node %d: %s of node %d in term %d: %s; votes %s: %s",
                core.id, "pre-vote" if message.pre_vote else "vote", message.from_id,
                message.term, "granted" if message.granted else "refused",
                dict(sorted(core._votes.items())), result.name,
            )  # fmt: skip
        if result is VoteResult.WON:
            if core.role is Role.PRE_CANDIDATE:
                campaign(core, Campaign.ELECTION)
            else:
                core._become_leader()
        elif result is VoteResult.LOST:
            core._become_follower(core.term, None)


def vote_kind(message: RequestVote) -> str:
    return "pre-vote" if message.pre_vote else "vote"
