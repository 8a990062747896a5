"""Leader election (Raft paper §5.2), named for the rule each test checks."""

from __future__ import annotations

from raft_helpers import ELECTION_TICKS, Network, make_node

from futureq.raft.election import CampaignStatus, campaign_status
from futureq.raft.messages import (
    AppendEntries,
    LogIndex,
    NodeId,
    RequestVote,
    RequestVoteResponse,
    Term,
)
from futureq.raft.roles import Role


def test_follower_starts_election_after_randomized_timeout_in_t_to_2t() -> None:
    """§5.2: a follower that hears nothing for an election timeout campaigns; the
    timeout is drawn from [T, 2T) so that split votes are rare."""
    for seed in range(20):
        node = make_node(1, [1, 2, 3], seed=seed, pre_vote=False)
        ticks = 0
        while node.core.role is Role.FOLLOWER:
            node.core.tick()
            ticks += 1
        assert ELECTION_TICKS <= ticks < 2 * ELECTION_TICKS
        assert node.core.role is Role.CANDIDATE


def test_randomized_timeouts_differ_between_nodes() -> None:
    """§5.2: randomized timeouts spread out the candidates."""
    timeouts = set()
    for node_id in range(1, 6):
        node = make_node(node_id, range(1, 6), pre_vote=False)
        ticks = 0
        while node.core.role is Role.FOLLOWER:
            node.core.tick()
            ticks += 1
        timeouts.add(ticks)
    assert len(timeouts) > 1


def test_candidate_increments_term_votes_for_itself_and_requests_votes() -> None:
    """§5.2: to begin an election a follower increments its term, votes for itself
    and issues RequestVote to every other server."""
    node = make_node(1, [1, 2, 3], pre_vote=False)
    for _ in range(2 * ELECTION_TICKS):
        node.core.tick()
    assert node.core.role is Role.CANDIDATE
    assert node.core.term == 1 and node.core.vote == 1
    ready = node.core.ready()
    assert ready.hard_state is not None and ready.hard_state.vote == 1
    assert ready.must_sync
    requests = [m for m in ready.messages if isinstance(m, RequestVote)]
    assert sorted(m.to_id for m in requests) == [2, 3]
    assert all(m.term == 1 and not m.pre_vote for m in requests)


def test_candidate_wins_with_majority_and_becomes_leader() -> None:
    """§5.2: a candidate that receives votes from a majority becomes leader."""
    network = Network.of(5, pre_vote=False)
    network.isolate(4)
    network.isolate(5)  # 3 of 5 is still a majority
    network.elect(1)
    assert network.core(1).role is Role.LEADER
    assert network.core(2).leader_id == 1 and network.core(3).leader_id == 1


def test_candidate_without_majority_stays_candidate_and_retries_in_new_term() -> None:
    """§5.2: if no one wins, candidates time out and start a new election (term + 1)."""
    network = Network.of(3, pre_vote=False)
    network.isolate(1)
    network.campaign(1)
    assert network.core(1).role is Role.CANDIDATE and network.core(1).term == 1
    network.campaign(1)
    assert network.core(1).role is Role.CANDIDATE and network.core(1).term == 2


def test_candidate_loses_when_majority_rejects() -> None:
    """§5.2: a candidate that can no longer reach a majority returns to follower."""
    node = make_node(1, [1, 2, 3], pre_vote=False)
    for _ in range(2 * ELECTION_TICKS):
        node.core.tick()
    node.handle_ready()
    term = node.core.term
    node.core.step(RequestVoteResponse(term, NodeId(2), NodeId(1), False))
    roles = [node.core.role]  # 1 grant, 1 reject, 1 pending
    node.core.step(RequestVoteResponse(term, NodeId(3), NodeId(1), False))
    roles.append(node.core.role)
    assert roles == [Role.CANDIDATE, Role.FOLLOWER] and node.core.term == term


def test_candidate_returns_to_follower_on_append_from_leader_of_same_term() -> None:
    """§5.2: a candidate receiving AppendEntries from a leader of its term steps down."""
    node = make_node(1, [1, 2, 3], pre_vote=False)
    for _ in range(2 * ELECTION_TICKS):
        node.core.tick()
    node.handle_ready()
    term = node.core.term
    node.core.step(AppendEntries(term, NodeId(2), NodeId(1), LogIndex(0), Term(0), (), LogIndex(0)))
    assert node.core.role is Role.FOLLOWER and node.core.leader_id == 2
    assert node.core.term == term


def test_higher_term_in_any_message_turns_leader_into_follower() -> None:
    """§5.1: a server that sees a larger term updates its term and becomes follower."""
    network = Network.of(3, pre_vote=False, check_quorum=False)
    network.elect(1)
    leader = network.core(1)
    leader.step(RequestVoteResponse(Term(7), NodeId(2), NodeId(1), False))
    assert leader.role is Role.FOLLOWER and leader.term == 7 and leader.vote is None


def test_stale_term_messages_are_ignored() -> None:
    """§5.1: a request with a stale term is rejected."""
    network = Network.of(3, pre_vote=False, check_quorum=False)
    network.elect(1)
    network.isolate(1)
    network.elect(2)
    follower = network.core(3)
    term_before = follower.term
    follower.step(RequestVote(Term(1), NodeId(1), NodeId(3), LogIndex(100), Term(1)))
    out = network.nodes[NodeId(3)].handle_ready()
    assert not any(isinstance(m, RequestVoteResponse) and m.granted for m in out)
    assert follower.term == term_before and follower.leader_id == 2


def test_single_node_cluster_elects_itself_and_commits() -> None:
    """§5.2 degenerate case: a single voter is its own majority."""
    network = Network.of(1)
    network.elect(1)
    index = network.propose(1, b"solo")
    assert network.core(1).log.committed == index
    assert network.nodes[NodeId(1)].applied_data() == [b"solo"]


def test_leader_sends_heartbeats_to_prevent_elections() -> None:
    """§5.2: leaders send periodic heartbeats to maintain their authority."""
    network = Network.of(3)
    network.elect(1)
    term = network.core(1).term
    network.tick_all(10 * ELECTION_TICKS)
    assert network.leaders() == [NodeId(1)] and network.core(1).term == term


def test_campaign_status_names_the_voters_that_do_not_answer_and_those_that_refuse() -> None:
    """A node that may lead but gets no leader said only "no leader is known yet" (found
    by a tester): :func:`campaign_status` keeps what its last campaign got, which voters
    granted, refused or did not answer, until it hears a leader again."""
    network = Network.of(3)
    network.elect(1)
    assert campaign_status(network.core(2)) is None  # never campaigned
    network.isolate(3)
    network.propose(1, b"x")  # node 3's log is now behind node 2's
    network.campaign(3)
    status = campaign_status(network.core(3))
    assert status == CampaignStatus(
        True, Term(network.core(1).term + 1), 2, (NodeId(3),), (), (NodeId(1), NodeId(2))
    )
    network.heal()
    network.isolate(1)  # the leader is gone; node 2 refuses node 3's shorter log
    network.core(2).campaign_allowed = False  # (its own campaign would win)
    network.tick(2, 2 * ELECTION_TICKS)  # past leader stickiness, which answers nothing
    network.campaign(3)
    status = campaign_status(network.core(3))
    assert status is not None
    assert (status.granted, status.refused, status.silent) == (
        (NodeId(3),),
        (NodeId(2),),
        (NodeId(1),),
    )
    network.heal()
    network.heartbeat(1)
    assert network.core(3).leader_id == 1
    assert campaign_status(network.core(3)) is None  # a leader is heard: no news
