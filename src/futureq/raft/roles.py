"""A Raft server's role, and the kinds of campaign that change it.

Kept apart from :mod:`futureq.raft.core` so the modules the core's rules live in
(:mod:`~futureq.raft.election`, :mod:`~futureq.raft.leader`, ...) and the driver's helpers
(:mod:`~futureq.raft.timekeeper`) can name roles without importing the core.
"""

from __future__ import annotations

import enum


class Role(enum.Enum):
    """A server's role (paper §5.1, plus the PreVote pre-candidate of thesis §9.6)."""

    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


class Campaign(enum.Enum):
    """Why a node asks for votes: a PreVote round (thesis §9.6), a real election (paper
    §5.2), or one a leader asked for by TimeoutNow (thesis §3.10)."""

    PRE_VOTE = "pre_vote"
    ELECTION = "election"
    TRANSFER = "transfer"
