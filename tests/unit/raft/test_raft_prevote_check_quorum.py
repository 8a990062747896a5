"""PreVote (thesis §9.6), CheckQuorum (thesis §6.2) and leader stickiness (§4.2.3)."""

from __future__ import annotations

from raft_helpers import ELECTION_TICKS, Network

from futureq.raft.messages import LogIndex, NodeId, RequestVote, RequestVoteResponse, Term
from futureq.raft.roles import Role


def test_prevote_does_not_increment_term_of_isolated_node() -> None:
    """Thesis §9.6: a server that cannot win does not increase its term, so it does
    not force the cluster into a new term when it comes back."""
    network = Network.of(3)
    network.elect(1)
    network.isolate(3)
    for _ in range(5):
        network.campaign(3)
    core3 = network.core(3)
    assert core3.role is Role.PRE_CANDIDATE and core3.term == network.core(1).term


def test_partitioned_node_rejoining_does_not_disrupt_leader_with_prevote() -> None:
    """Thesis §9.6: with PreVote a rejoining server does not depose a working leader."""
    network = Network.of(3)
    network.elect(1)
    term = network.core(1).term
    network.isolate(3)
    network.tick_all(5 * ELECTION_TICKS)
    network.heal()
    network.tick_all(3 * ELECTION_TICKS)
    assert network.leaders() == [NodeId(1)]
    assert network.core(1).term == term
    assert network.core(3).leader_id == 1


def test_without_prevote_rejoining_node_forces_a_new_term() -> None:
    """The problem PreVote solves (thesis §9.6): an isolated server inflates its term
    and, on return, makes the leader step down."""
    network = Network.of(3, pre_vote=False, check_quorum=False)
    network.elect(1)
    term = network.core(1).term
    network.isolate(3)
    for _ in range(3):
        network.campaign(3)
    network.heal()
    network.tick_all(3 * ELECTION_TICKS)
    assert network.core(1).term > term


def test_prevote_granted_without_changing_voter_state() -> None:
    """Thesis §9.6: a pre-vote grant changes neither the voter's term nor its vote."""
    network = Network.of(3)
    voter = network.core(2)
    voter.step(RequestVote(Term(5), NodeId(3), NodeId(2), LogIndex(0), Term(0), pre_vote=True))
    (response,) = network.nodes[NodeId(2)].handle_ready()
    assert isinstance(response, RequestVoteResponse) and response.granted and response.pre_vote
    assert response.term == 5
    assert voter.term == 0 and voter.vote is None


def test_prevote_rejected_when_candidate_log_is_behind() -> None:
    """Thesis §9.6 with §5.4.1: a pre-vote needs an up-to-date log, like a vote."""
    network = Network.of(3)
    network.elect(1)
    network.propose(1, b"x")
    follower = network.core(2)
    for _ in range(ELECTION_TICKS):
        follower.tick()  # leave the lease so only the log check decides
    network.nodes[NodeId(2)].handle_ready()
    follower.step(RequestVote(Term(9), NodeId(3), NodeId(2), LogIndex(1), Term(1), pre_vote=True))
    responses = [
        m for m in network.nodes[NodeId(2)].handle_ready() if isinstance(m, RequestVoteResponse)
    ]
    assert responses and not responses[-1].granted


def test_leader_steps_down_without_quorum_contact_for_an_election_timeout() -> None:
    """Thesis §6.2 (CheckQuorum): a leader that has not heard from a majority within
    an election timeout steps down."""
    network = Network.of(3)
    network.elect(1)
    network.isolate(1)
    network.tick(1, ELECTION_TICKS)  # first window: followers were active
    network.tick(1, ELECTION_TICKS)
    assert network.core(1).role is Role.FOLLOWER


def test_leader_with_quorum_contact_keeps_leading() -> None:
    """Thesis §6.2: with a majority reachable the leader stays."""
    network = Network.of(5)
    network.elect(1)
    network.isolate(4)
    network.isolate(5)
    network.tick_all(5 * ELECTION_TICKS)
    assert network.core(1).role is Role.LEADER


def test_follower_in_contact_with_leader_ignores_vote_requests() -> None:
    """Thesis §4.2.3 (leader stickiness): a server that heard from a leader within the
    minimum election timeout ignores RequestVote, even of a higher term."""
    network = Network.of(3)
    network.elect(1)
    follower = network.core(2)
    term = follower.term
    follower.step(RequestVote(Term(term + 5), NodeId(3), NodeId(2), LogIndex(99), Term(99)))
    assert follower.term == term and follower.vote == 1
    assert network.nodes[NodeId(2)].handle_ready() == []


def test_follower_out_of_contact_grants_vote() -> None:
    """Thesis §4.2.3: once the election timeout passed without a leader, vote normally."""
    network = Network.of(3)
    network.elect(1)
    follower = network.core(2)
    for _ in range(ELECTION_TICKS):
        follower.tick()
    network.nodes[NodeId(2)].handle_ready()
    term = follower.term
    follower.step(RequestVote(Term(term + 1), NodeId(3), NodeId(2), LogIndex(99), Term(99)))
    assert follower.term == term + 1 and follower.vote == 3


def test_stale_leader_in_minority_cannot_commit_and_steps_down() -> None:
    """§5.4 + thesis §6.2: a leader cut off from the majority commits nothing more and
    steps down; the majority elects a new leader that keeps committing."""
    network = Network.of(5)
    network.elect(1)
    network.cut(1, 3)
    network.cut(1, 4)
    network.cut(1, 5)
    network.cut(2, 3)
    network.cut(2, 4)
    network.cut(2, 5)
    old_commit = network.core(1).log.committed
    network.core(1).propose(b"lost")
    network.tick_all(4 * ELECTION_TICKS)
    assert network.core(1).log.committed == old_commit
    assert network.core(1).role is not Role.LEADER
    assert any(network.core(i).role is Role.LEADER for i in (3, 4, 5))


def _tick_until_pre_candidate(network: Network, node_id: int) -> None:
    """Tick ``node_id`` alone (nothing delivered) until it starts a PreVote round."""
    core = network.core(node_id)
    for _ in range(2 * core.config.election_timeout_ticks + 1):
        core.tick()
        if core.role is Role.PRE_CANDIDATE:
            return
    raise AssertionError(f"node {node_id} never timed out")


def test_crossing_prevotes_elect_one_leader_in_one_round() -> None:
    """Both followers time out together after the leader died: their PreVotes cross,
    each grants the other's. The one less placed to win (same log, higher id) gives up
    its pre-campaign, so one election of one term decides, instead of two candidates
    voting for themselves and splitting the vote for another whole timeout."""
    network = Network.of(3)
    network.elect(1)
    network.propose(1, b"x")
    term = network.core(1).term
    network.isolate(1)
    _tick_until_pre_candidate(network, 2)
    _tick_until_pre_candidate(network, 3)
    network.stabilize()
    assert network.role(2) is Role.LEADER
    assert network.role(3) is Role.FOLLOWER and network.core(3).leader_id == 2
    assert network.core(2).term == network.core(3).term == term + 1


def test_pre_candidate_does_not_yield_to_a_shorter_log() -> None:
    """The tie-break looks at the logs first: node 3 holds an entry node 2 lacks, so
    node 2's PreVote is refused and node 3 keeps its campaign and wins."""
    network = Network.of(3)
    network.elect(1)
    network.cut(1, 2)
    network.propose(1, b"only on 1 and 3")
    network.isolate(1)
    _tick_until_pre_candidate(network, 2)
    _tick_until_pre_candidate(network, 3)
    network.stabilize()
    assert network.role(3) is Role.LEADER
    assert network.core(2).leader_id == 3


def test_election_timeout_spread_bounds_the_timeout() -> None:
    """``election_timeout_spread_ticks`` = s: a follower that hears nothing times out
    after T to T + s - 1 ticks, whatever the seed."""
    seen = set()
    for seed in range(40):
        network = Network.of(3, election_timeout_spread_ticks=2, seed=seed)
        core = network.core(2)
        ticks = 0
        while core.role is Role.FOLLOWER:
            core.tick()
            ticks += 1
            assert ticks <= 2 * ELECTION_TICKS
        seen.add(ticks)
    assert seen == {ELECTION_TICKS, ELECTION_TICKS + 1}
