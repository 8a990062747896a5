"""The commitment rule (Raft paper §5.3, §5.4.2 and Figure 8)."""

from __future__ import annotations

from raft_helpers import Network, ids, make_node

from futureq.raft.messages import AppendEntries, LogIndex, NodeId, Term
from futureq.raft.roles import Role
from futureq.raft.storage import MemoryStorage
from futureq.raft.values import Entry, HardState, Membership


def _node(node_id: int, terms: list[int], current_term: int):  # type: ignore[no-untyped-def]
    storage = MemoryStorage(Membership(ids(1, 2, 3, 4, 5)))
    storage.append([Entry(Term(t), LogIndex(i + 1)) for i, t in enumerate(terms)])
    storage.set_hard_state(HardState(Term(current_term), None, LogIndex(1)))
    return make_node(node_id, range(1, 6), storage=storage, check_quorum=False, max_append_bytes=1)


def test_entry_is_committed_once_replicated_on_a_majority() -> None:
    """§5.3: an entry is committed once the leader replicated it on a majority."""
    network = Network.of(5)
    network.elect(1)
    network.isolate(4)
    network.isolate(5)
    index = network.propose(1, b"a")
    assert network.core(1).log.committed == index
    network.isolate(3)
    index2 = network.propose(1, b"b")
    assert network.core(1).log.committed == index  # 2 of 5 is not a majority
    assert index2 > index


def test_figure_8_leader_does_not_commit_old_term_entry_by_counting_replicas() -> None:
    """§5.4.2, Figure 8: a leader must not conclude that an entry from an earlier term
    is committed once it is stored on a majority; it may be overwritten later.

    State (c) of Figure 8: S1 (term 4) has replicated the term-2 entry at index 2 to
    S2 and S3 — a majority — but its own term-4 entry has not reached a majority.
    """
    network = Network(
        [
            _node(1, [1, 2], 3),
            _node(2, [1, 2], 3),
            _node(3, [1], 3),
            _node(4, [1], 3),
            _node(5, [1, 3], 3),
        ]
    )
    # S1 wins term 4 with votes from S2 and S3 (S4 unreachable; S5 would refuse).
    # Its own AppendEntries are held back so we can place entries by hand.
    network.drop = lambda m: (
        isinstance(m, AppendEntries) or 4 in (m.from_id, m.to_id) or 5 in (m.from_id, m.to_id)
    )
    network.campaign(1)
    leader = network.core(1)
    assert leader.role is Role.LEADER and leader.term == 4
    # S1 replicates the term-2 entry at index 2 to S3 (S2 has it already); the
    # acknowledgements from S2 and S3 reach S1. Its term-4 no-op reaches nobody.
    old = (Entry(Term(2), LogIndex(2)),)
    for node_id in (2, 3):
        follower = network.nodes[NodeId(node_id)]
        follower.core.step(
            AppendEntries(
                Term(4), NodeId(1), NodeId(node_id), LogIndex(1), Term(1), old, LogIndex(1)
            )
        )
        network.deliver(follower.handle_ready())
    assert network.core(3).log.term(LogIndex(2)) == 2  # on S1, S2, S3: a majority
    assert leader.progress[NodeId(2)].match == 2 and leader.progress[NodeId(3)].match == 2
    assert leader.log.committed == 1  # ... and still not committed (§5.4.2)

    # (d): S1 crashes; S5 (last term 3) wins term 5 with S2, S3, S4 and overwrites
    # index 2 on them — which would have lost a "committed" entry.
    network.isolate(1)
    network.drop = lambda m: m.from_id == 1 or m.to_id == 1
    for _ in range(3):  # first PreVote round only teaches S5 the current term
        if network.core(5).role is not Role.LEADER:
            network.campaign(5)
    assert network.core(5).role is Role.LEADER
    network.stabilize()
    for node_id in (2, 3, 4):
        assert network.core(node_id).log.term(LogIndex(2)) == 3


def test_figure_8_entry_committed_with_current_term_entry_is_safe() -> None:
    """§5.4.2, Figure 8 (e): once S1 replicates an entry of its own term to a
    majority, that entry and the earlier ones are committed, and S5 can no longer win."""
    network = Network(
        [
            _node(1, [1, 2], 3),
            _node(2, [1, 2], 3),
            _node(3, [1], 3),
            _node(4, [1], 3),
            _node(5, [1, 3], 3),
        ]
    )
    network.drop = lambda m: m.from_id == 5 or m.to_id == 5 or (m.from_id == 1 and m.to_id == 4)
    network.campaign(1)
    assert network.core(1).role is Role.LEADER
    network.stabilize()
    assert network.core(1).log.committed == 3  # no-op of term 4 plus index 2
    network.isolate(1)
    network.drop = lambda m: m.from_id == 1 or m.to_id == 1
    for _ in range(3):
        network.campaign(5)
        assert network.core(5).role is not Role.LEADER
    for node_id in (2, 3):
        assert network.core(node_id).log.term(LogIndex(2)) == 2


def test_follower_learns_commit_index_from_heartbeat() -> None:
    """§5.3: followers learn the commit index from later AppendEntries/heartbeats."""
    network = Network.of(3)
    network.elect(1)
    network.drop = lambda m: isinstance(m, AppendEntries) and m.to_id == 3 and not m.entries
    network.propose(1, b"x")
    network.heal()
    network.tick_all(1)
    assert network.core(3).log.committed == network.core(1).log.committed
    assert network.nodes[NodeId(3)].applied_data() == [b"x"]


def test_a_commit_alone_sends_caught_up_followers_nothing() -> None:
    """A commit sends no AppendEntries to followers that have every entry: they learn
    the commit index with the next AppendEntries (the next proposal) or heartbeat, so
    a commit does not wake every follower for an apply and an answer while the
    leader answers its client."""
    network = Network.of(3)
    network.elect(1)
    network.heartbeat(1)
    network.delivered.clear()
    index = network.propose(1, b"x")
    assert network.core(1).log.committed == index
    appends = [m for m in network.delivered if isinstance(m, AppendEntries)]
    assert appends and all(m.entries for m in appends)  # the entry, no commit-only message
    assert network.core(2).log.committed < index
    network.propose(1, b"y")  # the next AppendEntries carries the commit index
    assert network.nodes[NodeId(2)].applied_data() == [b"x"]
    network.heartbeat(1)
    assert network.nodes[NodeId(2)].applied_data() == [b"x", b"y"]
    assert network.core(3).log.committed == network.core(1).log.committed
