"""RequestVote receiver rules (paper §5.2, §5.4.1; Figure 2)."""

from __future__ import annotations

import pytest
from raft_helpers import ids, make_node

from futureq.raft.messages import LogIndex, NodeId, RequestVote, RequestVoteResponse, Term
from futureq.raft.storage import MemoryStorage
from futureq.raft.values import Entry, HardState, Membership


def _voter_with_log(terms: list[int], current_term: int, vote: int | None = None):  # type: ignore[no-untyped-def]
    storage = MemoryStorage(Membership(ids(1, 2, 3)))
    storage.append([Entry(Term(t), LogIndex(i + 1)) for i, t in enumerate(terms)])
    storage.set_hard_state(
        HardState(Term(current_term), NodeId(vote) if vote else None, LogIndex(0))
    )
    return make_node(1, [1, 2, 3], storage=storage, pre_vote=False, check_quorum=False)


def _answer(node, message: RequestVote) -> RequestVoteResponse:  # type: ignore[no-untyped-def]
    node.core.step(message)
    out = node.handle_ready()
    (response,) = [m for m in out if isinstance(m, RequestVoteResponse)]
    return response


@pytest.mark.parametrize(
    ("our_log", "their_last_index", "their_last_term", "granted"),
    [
        # §5.4.1: higher last term wins regardless of length.
        ([1, 1, 2], 1, 3, True),
        # lower last term loses even with a longer log
        ([1, 1, 2], 5, 1, False),
        # equal last term: the longer (or equal) log wins
        ([1, 1, 2], 3, 2, True),
        ([1, 1, 2], 4, 2, True),
        ([1, 1, 2], 2, 2, False),
        # empty log: anyone is up to date
        ([], 0, 0, True),
    ],
)
def test_vote_granted_only_if_candidate_log_is_at_least_as_up_to_date(
    our_log: list[int], their_last_index: int, their_last_term: int, granted: bool
) -> None:
    """§5.4.1: a voter denies its vote if its own log is more up-to-date."""
    node = _voter_with_log(our_log, current_term=3)
    response = _answer(
        node,
        RequestVote(
            Term(4), NodeId(2), NodeId(1), LogIndex(their_last_index), Term(their_last_term)
        ),
    )
    assert response.granted is granted


def test_at_most_one_vote_per_term_first_come_first_served() -> None:
    """§5.2: each server votes for at most one candidate in a given term."""
    node = _voter_with_log([], current_term=0)
    first = _answer(node, RequestVote(Term(1), NodeId(2), NodeId(1), LogIndex(0), Term(0)))
    second = _answer(node, RequestVote(Term(1), NodeId(3), NodeId(1), LogIndex(0), Term(0)))
    again = _answer(node, RequestVote(Term(1), NodeId(2), NodeId(1), LogIndex(0), Term(0)))
    assert first.granted and not second.granted and again.granted  # a retry is re-granted
    assert node.core.vote == 2


def test_vote_is_persisted_before_the_response_is_sent() -> None:
    """Figure 2: votedFor is on stable storage before responding to the RPC."""
    node = _voter_with_log([], current_term=0)
    node.core.step(RequestVote(Term(1), NodeId(2), NodeId(1), LogIndex(0), Term(0)))
    ready = node.core.ready()
    assert ready.hard_state == HardState(Term(1), NodeId(2), LogIndex(0))
    assert ready.must_sync
    assert any(isinstance(m, RequestVoteResponse) and m.granted for m in ready.messages)
    node.core.advance(ready)


def test_restarted_node_remembers_its_vote() -> None:
    """Figure 2: votedFor survives a restart, so no second vote in the same term."""
    node = _voter_with_log([], current_term=1, vote=2)
    response = _answer(node, RequestVote(Term(1), NodeId(3), NodeId(1), LogIndex(0), Term(0)))
    assert not response.granted


def test_reject_carries_our_term_and_grant_carries_the_request_term() -> None:
    """Figure 2: the reply's term lets a stale candidate update itself."""
    node = _voter_with_log([1, 5], current_term=5)
    rejected = _answer(node, RequestVote(Term(6), NodeId(2), NodeId(1), LogIndex(1), Term(1)))
    assert not rejected.granted and rejected.term == 6  # we moved to term 6 first
    granted = _answer(node, RequestVote(Term(7), NodeId(3), NodeId(1), LogIndex(2), Term(5)))
    assert granted.granted and granted.term == 7


def test_grants_and_refusals_are_logged_at_debug_with_their_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Why a voter refused is in the debug log (a leaderless stretch under load could not
    tell a refusal from an answer that arrived after the candidate moved on)."""
    caplog.set_level("DEBUG", logger="futureq.raft.election")
    node = _voter_with_log([1, 1, 2], current_term=4, vote=3)
    _answer(node, RequestVote(Term(4), NodeId(2), NodeId(1), LogIndex(3), Term(2)))
    _answer(node, RequestVote(Term(5), NodeId(2), NodeId(1), LogIndex(1), Term(1)))
    _answer(node, RequestVote(Term(6), NodeId(3), NodeId(1), LogIndex(3), Term(2)))
    lines = [r.getMessage() for r in caplog.records]
    assert "node 1: vote for node 2 in term 4 refused: already voted for node 3 in term 4" in lines
    assert (
        "node 1: vote for node 2 in term 5 refused: its log (last term 1, index 1) is behind "
        "ours (last term 2, index 3)"
    ) in lines
    assert "node 1: vote for node 3 in term 6 granted" in lines
