"""Scripted scenarios on the simulated cluster: named situations with fixed outcomes."""

from __future__ import annotations

from harness import Scenario, SimCluster

from futureq.raft.messages import NodeId
from futureq.raft.roles import Role

QUIET = Scenario("scripted", voters=5, fault_rate=0.0, propose_rate=0.0, max_delay_ticks=1)


def _run(cluster: SimCluster, ticks: int, propose_every: int = 0) -> None:
    for tick in range(ticks):
        if propose_every and tick % propose_every == 0:
            cluster.propose()
        cluster.step()


def _settled(scenario: Scenario = QUIET) -> tuple[SimCluster, NodeId]:
    cluster = SimCluster(seed=42, scenario=scenario)
    _run(cluster, 60)
    leader = cluster.leader()
    assert leader is not None
    return cluster, leader.id


def test_rejoining_partitioned_follower_does_not_disrupt_leader_with_prevote() -> None:
    """Thesis §9.6: a follower cut off for many election timeouts comes back without
    raising the term or deposing the leader."""
    cluster, leader_id = _settled()
    leader = cluster.nodes[leader_id].core
    assert leader is not None
    term = leader.term
    follower = next(i for i in sorted(cluster.nodes) if i != leader_id)
    others = [i for i in sorted(cluster.nodes) if i != follower]
    cluster.network.partition([[follower], others])
    _run(cluster, 200, propose_every=5)
    cluster.network.heal()
    _run(cluster, 60, propose_every=5)
    assert cluster.leader() is cluster.nodes[leader_id]
    assert leader.term == term
    rejoined = cluster.nodes[follower].core
    assert rejoined is not None and rejoined.term == term
    assert rejoined.log.committed == leader.log.committed
    cluster.check_liveness()


def test_leader_in_minority_steps_down_and_majority_elects_new_leader() -> None:
    """Paper §5.2 + thesis §6.2: the majority side elects a leader and keeps
    committing; the old leader steps down (CheckQuorum) and later follows."""
    cluster, old_id = _settled()
    minority = [old_id, next(i for i in sorted(cluster.nodes) if i != old_id)]
    majority = [i for i in sorted(cluster.nodes) if i not in minority]
    cluster.network.partition([minority, majority])
    _run(cluster, 120, propose_every=4)
    old = cluster.nodes[old_id].core
    assert old is not None and old.role is not Role.LEADER
    new = cluster.leader()
    assert new is not None and new.id in majority
    acked_before_heal = dict(cluster.checker.acked)
    assert acked_before_heal
    cluster.network.heal()
    _run(cluster, 60, propose_every=4)
    assert old.leader_id == cluster.leader().id  # type: ignore[union-attr]
    cluster.check_liveness()


def test_asymmetric_partition_leader_can_send_but_not_hear() -> None:
    """Thesis §6.2: a leader whose inbound links are cut hears no acknowledgements and
    steps down; the followers, still hearing heartbeats, stay loyal until it does."""
    cluster, leader_id = _settled()
    for other in sorted(cluster.nodes):
        if other != leader_id:
            cluster.network.cut_one_way(other, leader_id)
    _run(cluster, 150, propose_every=5)
    old = cluster.nodes[leader_id].core
    assert old is not None and old.role is not Role.LEADER
    cluster.check_liveness()


def test_bridge_partition_keeps_a_leader() -> None:
    """Paper §5.2: with one node bridging two halves a leader with a majority exists."""
    cluster, _ = _settled()
    ids = sorted(cluster.nodes)
    bridge, left, right = ids[0], ids[1:3], ids[3:]
    cluster.network.partition([left, right])
    for other in ids:
        cluster.network.blocked.discard((bridge, other))
        cluster.network.blocked.discard((other, bridge))
    _run(cluster, 200, propose_every=3)
    assert cluster.leader() is not None
    before = cluster.checker.max_committed
    _run(cluster, 60, propose_every=3)
    assert cluster.checker.max_committed > before


def test_crash_and_restart_of_every_node_loses_no_acknowledged_entry() -> None:
    """Figure 2 durability: acknowledged entries survive crashes of all servers."""
    cluster, _ = _settled(Scenario("scripted3", voters=3, fault_rate=0.0, propose_rate=0.0))
    _run(cluster, 40, propose_every=2)
    acked = dict(cluster.checker.acked)
    assert acked
    for node in cluster.nodes.values():
        node.crash()
    cluster.check_liveness()
    leader = cluster.leader()
    assert leader is not None and leader.core is not None
    for payload, index in acked.items():
        assert leader.core.log.committed >= index, payload
