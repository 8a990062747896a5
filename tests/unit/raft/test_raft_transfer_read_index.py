"""Leadership transfer (thesis §3.10) and ReadIndex reads (thesis §6.4)."""

from __future__ import annotations

import pytest
from raft_helpers import ELECTION_TICKS, Network

from futureq.raft.core import ProposalDroppedError, RaftNotLeaderError
from futureq.raft.messages import AppendEntries, Heartbeat, NodeId, TimeoutNow
from futureq.raft.roles import Role
from futureq.raft.values import ReadState


def test_transfer_to_up_to_date_follower_makes_it_leader() -> None:
    """Thesis §3.10: the leader sends TimeoutNow; the target campaigns at once and,
    being up to date, wins (followers' stickiness does not block it)."""
    network = Network.of(3)
    network.elect(1)
    term = network.core(1).term
    network.core(1).transfer_leadership(NodeId(2))
    network.stabilize()
    assert network.leaders() == [NodeId(2)]
    assert network.core(2).term == term + 1
    assert network.core(1).role is Role.FOLLOWER


def test_transfer_first_brings_target_up_to_date() -> None:
    """Thesis §3.10 step 1: the leader replicates the missing entries to the target
    before sending TimeoutNow."""
    network = Network.of(3)
    network.elect(1)
    network.drop = lambda m: isinstance(m, AppendEntries) and m.to_id == 3
    network.propose(1, b"a")
    network.heal()
    leader = network.core(1)
    assert leader.progress[NodeId(3)].match < leader.log.last_index()
    leader.transfer_leadership(NodeId(3))
    sent = network.pending()
    assert not any(isinstance(m, TimeoutNow) for m in sent)
    network.deliver(sent)
    assert network.leaders() == [NodeId(3)]
    assert network.nodes[NodeId(3)].applied_data() == [b"a"]


def test_leader_refuses_proposals_during_transfer() -> None:
    """Thesis §3.10: during a transfer the leader stops accepting client requests."""
    network = Network.of(3)
    network.elect(1)
    network.isolate(2)
    network.core(1).transfer_leadership(NodeId(2))
    with pytest.raises(ProposalDroppedError):
        network.core(1).propose(b"x")


def test_transfer_aborts_after_an_election_timeout() -> None:
    """Thesis §3.10: if the transfer does not complete within an election timeout the
    leader aborts it and resumes accepting requests."""
    network = Network.of(3)
    network.elect(1)
    network.drop = lambda m: isinstance(m, TimeoutNow)
    leader = network.core(1)
    leader.transfer_leadership(NodeId(2))
    network.stabilize()
    network.tick_all(ELECTION_TICKS)
    assert leader.role is Role.LEADER and leader.lead_transferee is None
    network.propose(1, b"after abort")
    network.heartbeat(1)
    assert network.nodes[NodeId(2)].applied_data() == [b"after abort"]


def test_transfer_on_follower_raises_not_leader_with_hint() -> None:
    network = Network.of(3)
    network.elect(1)
    with pytest.raises(RaftNotLeaderError) as info:
        network.core(2).transfer_leadership(NodeId(3))
    assert info.value.leader_id == 1


def test_propose_on_follower_raises_not_leader_with_leader_id() -> None:
    """Paper §5.1/§8: a follower redirects clients to the leader it knows."""
    network = Network.of(3)
    network.elect(1)
    with pytest.raises(RaftNotLeaderError) as info:
        network.core(2).propose(b"x")
    assert info.value.leader_id == 1 and info.value.leader_address is None


def test_read_index_on_leader_waits_for_heartbeat_quorum() -> None:
    """Thesis §6.4 steps 2-4: record the commit index, confirm leadership with a round
    of heartbeats acknowledged by a majority, then release the read."""
    network = Network.of(3)
    network.elect(1)
    network.propose(1, b"x")
    leader_node = network.nodes[NodeId(1)]
    leader_node.core.read_index(b"r1")
    sent = network.pending()
    assert any(isinstance(m, Heartbeat) and m.read_seq == 1 for m in sent)
    assert leader_node.read_states == []
    network.deliver(sent)
    assert leader_node.read_states == [ReadState(leader_node.core.log.committed, b"r1")]


def test_read_index_not_served_by_leader_cut_off_from_majority() -> None:
    """Thesis §6.4: a deposed leader must not serve stale reads."""
    network = Network.of(3)
    network.elect(1)
    network.isolate(1)
    network.core(1).read_index(b"r")
    network.stabilize()
    assert network.nodes[NodeId(1)].read_states == []


def test_read_index_waits_for_commit_in_current_term() -> None:
    """Thesis §6.4 step 1: a new leader serves reads only after its no-op commits, so
    its commit index covers everything committed by earlier leaders."""
    network = Network.of(3)
    network.drop = lambda m: isinstance(m, AppendEntries) and m.from_id == 1
    network.campaign(1)
    leader_node = network.nodes[NodeId(1)]
    assert leader_node.core.role is Role.LEADER
    leader_node.core.read_index(b"early")
    network.tick_all(2)
    assert leader_node.read_states == []
    network.heal()
    network.tick_all(2)
    assert leader_node.read_states == [ReadState(leader_node.core.log.committed, b"early")]


def test_follower_forwards_read_index_to_leader() -> None:
    """Thesis §6.4: a follower asks the leader for the read index and serves the read
    once it has applied that far."""
    network = Network.of(3)
    network.elect(1)
    network.propose(1, b"x")
    follower = network.nodes[NodeId(2)]
    follower.core.read_index(b"f1")
    network.stabilize()
    assert follower.read_states == [ReadState(network.core(1).log.committed, b"f1")]
    assert follower.core.log.applied >= follower.read_states[0].index


def test_read_index_without_known_leader_raises() -> None:
    network = Network.of(3)
    with pytest.raises(RaftNotLeaderError):
        network.core(2).read_index(b"x")


def test_single_node_read_index_is_immediate() -> None:
    network = Network.of(1)
    network.elect(1)
    network.core(1).read_index(b"solo")
    network.stabilize()
    assert network.nodes[NodeId(1)].read_states == [
        ReadState(network.core(1).log.committed, b"solo")
    ]
