"""Single-server membership changes with learners (thesis §4.1, §4.2)."""

from __future__ import annotations

import pytest
from raft_helpers import ELECTION_TICKS, Network, ids, make_node

from futureq.errors import ErrorCode, RequestError
from futureq.raft.core import ProposalDroppedError
from futureq.raft.messages import LogIndex, NodeId, RequestVote, TimeoutNow
from futureq.raft.roles import Role
from futureq.raft.values import ConfChange, ConfChangeOp, EntryKind, Membership


def _change(op: ConfChangeOp, node_id: int) -> ConfChange:
    return ConfChange(op, NodeId(node_id))


def _with_learner(learner: int = 4) -> Network:
    network = Network.of(3)
    network.elect(1)
    network.add(make_node(learner, [], []))  # joins with an empty configuration
    network.core(1).propose_conf_change(_change(ConfChangeOp.ADD_LEARNER, learner))
    network.stabilize()
    network.heartbeat(1)
    return network


def test_learner_receives_the_log_but_does_not_vote_or_count() -> None:
    """Thesis §4.2.1: a new server joins as a non-voting member and catches up; it does
    not count toward commitment."""
    network = _with_learner()
    leader = network.core(1)
    assert leader.membership == Membership(ids(1, 2, 3), ids(4))
    network.propose(1, b"x")
    network.heartbeat(1)
    assert network.nodes[NodeId(4)].applied_data() == [b"x"]
    assert network.core(4).membership == leader.membership  # learned from the log
    # With two voters down the learner's acknowledgement does not make a majority.
    network.isolate(2)
    network.isolate(3)
    before = leader.log.committed
    network.propose(1, b"y")
    assert leader.log.committed == before


def test_learner_never_campaigns() -> None:
    """Thesis §4.2.1: non-voting members do not start elections."""
    network = _with_learner()
    network.isolate(4)
    network.tick(4, 10 * ELECTION_TICKS)
    assert network.core(4).role is Role.FOLLOWER
    assert not any(isinstance(m, RequestVote) for m in network.pending())


def test_config_change_takes_effect_when_appended_not_when_committed() -> None:
    """Thesis §4.1: a server uses the latest configuration in its log, committed or not."""
    network = _with_learner()
    network.isolate(2)
    network.isolate(3)
    leader = network.core(1)
    leader.propose_conf_change(_change(ConfChangeOp.PROMOTE_VOTER, 4))
    network.stabilize()
    assert leader.membership.voters == ids(1, 2, 3, 4)  # uncommitted but in use
    assert network.core(4).membership.voters == ids(1, 2, 3, 4)
    assert leader.log.committed < leader.log.last_index()


def test_promoted_learner_counts_toward_commitment() -> None:
    """Thesis §4.1: after promotion the new voter is part of every majority."""
    network = _with_learner()
    network.core(1).propose_conf_change(_change(ConfChangeOp.PROMOTE_VOTER, 4))
    network.stabilize()
    assert network.core(1).membership.voters == ids(1, 2, 3, 4)
    network.isolate(3)
    index = network.propose(1, b"with-4")  # 1, 2, 4 are a majority of 4
    assert network.core(1).log.committed == index
    network.isolate(2)
    network.propose(1, b"too-few")  # 1 and 4 are not
    assert network.core(1).log.committed == index


def test_only_one_membership_change_at_a_time() -> None:
    """Thesis §4.1: a leader starts a change only after the previous one committed."""
    network = _with_learner()
    network.isolate(2)
    network.isolate(3)
    leader = network.core(1)
    leader.propose_conf_change(_change(ConfChangeOp.PROMOTE_VOTER, 4))
    with pytest.raises(ProposalDroppedError):
        leader.propose_conf_change(_change(ConfChangeOp.REMOVE_NODE, 3))


def test_no_membership_change_before_leader_commits_in_its_term() -> None:
    """Thesis §4.1 errata (raft-dev 2015): wait for an entry of the current term to
    commit before changing membership."""
    network = Network.of(3)
    network.isolate(1)
    network.campaign(1)
    network.heal()
    network.drop = lambda m: m.from_id == 1 and not isinstance(m, RequestVote)
    network.campaign(1)
    leader = network.core(1)
    assert leader.role is Role.LEADER and leader.log.committed < leader.log.last_index()
    with pytest.raises(ProposalDroppedError):
        leader.propose_conf_change(_change(ConfChangeOp.REMOVE_NODE, 3))


def test_invalid_change_is_refused() -> None:
    """Thesis §4.2.1: a voter is added as a learner first; promote only learners."""
    network = Network.of(3)
    network.elect(1)
    with pytest.raises(RequestError):
        network.core(1).propose_conf_change(_change(ConfChangeOp.PROMOTE_VOTER, 9))
    with pytest.raises(RequestError):
        network.core(1).propose_conf_change(_change(ConfChangeOp.ADD_LEARNER, 2))


def test_removed_follower_stops_receiving_and_quorum_shrinks() -> None:
    """Thesis §4.1: after removal the majority is computed over the new voters."""
    network = Network.of(3)
    network.elect(1)
    network.core(1).propose_conf_change(_change(ConfChangeOp.REMOVE_NODE, 3))
    network.stabilize()
    assert network.core(1).membership.voters == ids(1, 2)
    assert NodeId(3) not in network.core(1).progress
    network.isolate(3)
    index = network.propose(1, b"two-voters")
    assert network.core(1).log.committed == index


def test_removed_leader_steps_down_after_committing_its_removal() -> None:
    """Thesis §4.2.2: a leader removed from the configuration keeps managing the
    cluster (without counting itself) until the change commits, then steps down and
    hands over (§3.10)."""
    network = Network.of(3)
    network.elect(1)
    leader = network.core(1)
    leader.propose_conf_change(_change(ConfChangeOp.REMOVE_NODE, 1))
    assert network.role(1) is Role.LEADER  # not yet committed
    with pytest.raises(ProposalDroppedError):
        leader.propose(b"from a leaving leader")
    network.stabilize()
    assert network.role(1) is Role.FOLLOWER
    assert any(isinstance(m, TimeoutNow) for m in network.delivered)
    new_leaders = network.leaders()
    assert len(new_leaders) == 1 and new_leaders[0] in (2, 3)
    assert network.core(new_leaders[0]).membership.voters == ids(2, 3)
    # The removed server does not campaign any more.
    network.tick(1, 10 * ELECTION_TICKS)
    assert leader.role is Role.FOLLOWER


def test_membership_survives_restart_through_log_and_snapshot() -> None:
    """Thesis §4.1/§5.1: membership lives in log entries and in snapshot metadata."""
    network = _with_learner()
    node = network.nodes[NodeId(2)]
    restarted = make_node(2, [], storage=node.storage)
    assert restarted.core.membership == Membership(ids(1, 2, 3), ids(4))
    snapshot = node.core.compact(node.core.log.applied, b"")
    node.storage.compact(snapshot)
    assert snapshot.metadata.membership == Membership(ids(1, 2, 3), ids(4))
    restarted = make_node(2, [], storage=node.storage)
    assert restarted.core.membership == Membership(ids(1, 2, 3), ids(4))
    kinds = [e.kind for e in network.nodes[NodeId(1)].applied]
    assert EntryKind.CONFIG_CHANGE in kinds


def test_follower_truncating_a_config_entry_reverts_membership() -> None:
    """Thesis §4.1: if a config entry is removed by log conflict, the server falls back
    to the previous configuration in its log."""
    network = _with_learner()
    network.isolate(1)
    leader = network.core(1)
    leader.propose_conf_change(_change(ConfChangeOp.PROMOTE_VOTER, 4))
    assert leader.membership.voters == ids(1, 2, 3, 4)
    network.tick(3, ELECTION_TICKS)  # leave the leader lease (thesis §4.2.3)
    network.elect(2)
    network.propose(2, b"new-term")
    network.heal()
    network.tick_all(2 * ELECTION_TICKS)
    assert leader.role is Role.FOLLOWER
    assert leader.membership == Membership(ids(1, 2, 3), ids(4))
    assert leader.membership_at(LogIndex(1)) == Membership(ids(1, 2, 3))


def _silence(network: Network, node_id: int, leader: int = 1) -> None:
    """Isolate ``node_id`` and run the leader's heartbeats for three election timeouts:
    the leader has not heard from it for more than two CheckQuorum windows."""
    network.isolate(node_id)
    for _ in range(3 * ELECTION_TICKS // network.core(leader).config.heartbeat_interval_ticks):
        network.heartbeat(leader)
    assert network.role(leader) is Role.LEADER


@pytest.mark.parametrize("removed", [1, 2])
def test_a_removal_that_would_leave_no_quorum_heard_from_is_refused(removed: int) -> None:
    """Found by a breaker (2 of 2, real nodes): with node 3 down, removing the leader
    (or node 2) committed, left voters {2, 3} (or {1, 3}) with one of them down, and no
    leader until node 3 came back. Refused now (QUORUM_AT_RISK), as etcd's
    ``--strict-reconfig-check`` does, saying which voters are silent."""
    network = Network.of(3)
    network.elect(1)
    _silence(network, 3)
    with pytest.raises(RequestError) as refused:
        network.core(1).propose_conf_change(_change(ConfChangeOp.REMOVE_NODE, removed))
    assert refused.value.code is ErrorCode.QUORUM_AT_RISK
    assert "node(s) [3] have not answered" in refused.value.message
    assert network.core(1).membership.voters == ids(1, 2, 3)


def test_removing_the_silent_node_itself_is_taken() -> None:
    """The usual reason to remove a node: it died. The voters left all answer."""
    network = Network.of(3)
    network.elect(1)
    _silence(network, 3)
    network.core(1).propose_conf_change(_change(ConfChangeOp.REMOVE_NODE, 3))
    network.stabilize()
    assert network.core(1).membership.voters == ids(1, 2)


def test_a_node_heard_from_in_the_window_before_still_counts() -> None:
    """CheckQuorum clears ``recent_active`` every election timeout; a change proposed
    just after that must not take every follower for silent."""
    network = Network.of(3)
    network.elect(1)
    network.tick(1, ELECTION_TICKS)  # a CheckQuorum window ends: recent_active cleared
    network.core(1).propose_conf_change(_change(ConfChangeOp.REMOVE_NODE, 1))
    network.stabilize()
    assert network.core(2).membership.voters == ids(2, 3)
