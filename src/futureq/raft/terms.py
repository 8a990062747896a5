"""What a message's term decides before its kind is looked at (paper §5.1, Figure 2).

Plain functions over a :class:`~futureq.raft.core.RaftCore`, called by
:meth:`~futureq.raft.core.RaftCore.step`: a vote request of a higher term that leader
stickiness ignores (thesis §4.2.3), and what a message of a lower term is answered with
(a stale leader learns it was deposed; a stale pre-vote is refused).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from futureq.raft import election
from futureq.raft.messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    LogIndex,
    Message,
    RequestVote,
    RequestVoteResponse,
)

if TYPE_CHECKING:
    from futureq.raft.core import RaftCore

log = logging.getLogger(__name__)


def ignores_vote_request(core: RaftCore, message: RequestVote) -> bool:
    """True if ``message``, a vote request of a higher term, is ignored (leader
    stickiness); a node that just started answers it with a refusal."""
    # Leader stickiness (thesis §4.2.3): ignore a vote request while we
    # hear from a leader, unless the leader itself asked for it (§3.10).
    # A node that just started may have answered a leader's heartbeat
    # before it crashed, so it keeps the same quiet period: the leader's
    # lease counts on it (thesis §6.4.1, raft/timekeeper.py).
    in_lease = (
        core.config.check_quorum
        and (core.leader_id is not None or core._recently_started())
        and core._election_elapsed < core.config.election_timeout_ticks
    )
    if not in_lease or message.leadership_transfer:
        return False
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "node %d: %s request of node %d for term %d ignored: %s "
            "(%d of %d ticks since; leader stickiness)",
            core.id, election.vote_kind(message), message.from_id, message.term,
            "just started" if core.leader_id is None
            else f"heard from leader {core.leader_id} in term {core.term}",
            core._election_elapsed, core.config.election_timeout_ticks,
        )  # fmt: skip
    if core.leader_id is None:
        # Restarted: refuse without taking the term (the candidate sees
        # a refusal, e.g. that we are recovering, docs/raft.md).
        core._send(
            RequestVoteResponse(
                core.term, core.id, message.from_id, False, message.pre_vote,
                sender=core._sender,
            )
        )  # fmt: skip
    return True


def answer_stale_term(core: RaftCore, message: Message) -> None:
    """Answer ``message``, whose term is below ours; the caller then drops it (paper
    §5.1: stale-term requests are rejected)."""
    if (core.config.check_quorum or core.config.pre_vote) and isinstance(
        message, AppendEntries | Heartbeat
    ):
        # A stale leader whose term we passed (e.g. after a failed election it
        # never saw) would otherwise never learn it is deposed (as in etcd raft.go).
        core._send(
            AppendEntriesResponse(
                core.term,
                core.id,
                message.from_id,
                False,
                LogIndex(0),
                sender=core._sender,
            )
        )
    elif isinstance(message, RequestVote) and message.pre_vote:
        log.debug(
            "node %d: pre-vote for node %d refused: its term %d is behind ours (%d)",
            core.id, message.from_id, message.term, core.term,
        )  # fmt: skip
        core._send(
            RequestVoteResponse(
                core.term, core.id, message.from_id, False, True, sender=core._sender
            )
        )
    elif isinstance(message, RequestVote | RequestVoteResponse):
        log.debug(
            "node %d: stale %s of node %d for term %d dropped (we are in term %d)",
            core.id, type(message).__name__, message.from_id, message.term, core.term,
        )  # fmt: skip
