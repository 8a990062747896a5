"""The leader writes its log while it replicates it (thesis §10.2.1).

``Ready.leader_messages`` (the leader's AppendEntries, heartbeats and snapshot chunks)
may leave before the leader's own write of the same entries is durable; everything
that acknowledges this node's disk (votes, AppendEntries responses) stays in
``Ready.messages``, sent after the write. The leader counts itself toward a quorum only
from ``advance`` on, so an entry is committed only once a majority has it on disk, with
or without the leader among them.
"""

from __future__ import annotations

from raft_helpers import Network, make_node

from futureq.raft.messages import (
    AppendEntries,
    AppendEntriesResponse,
    LogIndex,
    NodeId,
    RequestVote,
)
from futureq.raft.roles import Role
from futureq.raft.values import EntryKind


def test_leader_replicates_before_its_own_write() -> None:
    network = Network.of(3)
    network.elect(1)
    leader = network.core(1)
    index = leader.propose(b"x")
    ready = leader.ready()
    assert [e.index for e in ready.entries] == [index] and ready.must_sync
    early = [m for m in ready.leader_messages if isinstance(m, AppendEntries) and m.entries]
    assert sorted(m.to_id for m in early) == [2, 3]
    assert not any(isinstance(m, AppendEntries) for m in ready.messages)
    # Not counted before the write is done: match stays behind the new entry.
    assert leader.progress[NodeId(1)].match < index
    network.nodes[NodeId(1)].persist(ready)
    leader.advance(ready)
    assert leader.progress[NodeId(1)].match == index
    assert leader.log.committed < index  # 1 of 3 on disk is no quorum


def test_acknowledgements_wait_for_the_write() -> None:
    """A follower's AppendEntries response and a candidate's vote request promise what
    the write stores: they are never handed out early."""
    network = Network.of(3)
    network.elect(1)
    leader = network.core(1)
    leader.propose(b"x")
    ready = leader.ready()
    network.nodes[NodeId(1)].persist(ready)
    leader.advance(ready)
    follower = network.core(2)
    for message in ready.leader_messages:
        if message.to_id == 2:
            follower.step(message)
    answer = follower.ready()
    assert answer.entries and answer.must_sync and not answer.leader_messages
    assert any(isinstance(m, AppendEntriesResponse) and m.success for m in answer.messages)
    network.nodes[NodeId(2)].persist(answer)
    follower.advance(answer)

    candidate = make_node(1, [1, 2, 3]).core
    for _ in range(2 * candidate.config.election_timeout_ticks + 1):
        candidate.tick()
        if candidate.role is not Role.FOLLOWER:
            break
    campaign = candidate.ready()
    assert any(isinstance(m, RequestVote) for m in campaign.messages)
    assert not campaign.leader_messages
    candidate.advance(campaign)


def test_a_single_voter_commits_only_after_its_own_write() -> None:
    """With one voter the leader is the whole quorum: nothing is committed, applied or
    answered before ``advance`` reports its write done."""
    network = Network.of(1)
    network.elect(1)
    core = network.core(1)
    node = network.nodes[NodeId(1)]
    index = core.propose(b"x")
    ready = core.ready()
    assert [e.index for e in ready.entries] == [index]
    assert all(e.index < index for e in ready.committed_entries)
    assert core.log.committed < index
    node.persist(ready)
    core.advance(ready)
    assert core.log.committed == index
    after = core.ready()
    assert [e.data for e in after.committed_entries] == [b"x"]
    core.advance(after)


def test_two_followers_commit_what_the_leader_never_wrote() -> None:
    """The leader replicates an entry and dies before its own fsync finished: the two
    followers have it on disk, which is a majority of three; the next leader commits
    it and the old leader, restarted without it, receives it."""
    network = Network.of(3)
    network.elect(1)
    old = network.nodes[NodeId(1)]
    index = old.core.propose(b"x")
    ready = old.core.ready()
    early = ready.leader_messages
    # Node 1 crashes with its write in flight: nothing of this Ready is on its disk.
    restarted = make_node(1, [1, 2, 3], storage=old.storage)
    network.add(restarted)
    assert restarted.core.log.last_index() < index
    network.drop = lambda m: m.to_id == 1
    network.deliver(early)
    network.isolate(1)
    for node_id in (2, 3):
        assert network.core(node_id).log.term(index) == ready.entries[0].term
    for _ in range(60):
        network.tick_all()
        if network.leaders() and network.leaders() != [NodeId(1)]:
            break
    (new_leader,) = [n for n in network.leaders() if n != 1]
    network.propose(new_leader, b"y")
    assert network.core(new_leader).log.committed >= index + 1
    network.heal()
    network.tick_all(5)
    for node_id in (1, 2, 3):
        data = [
            e.data for e in network.nodes[NodeId(node_id)].applied if e.kind is EntryKind.NORMAL
        ]
        assert data[-2:] == [b"x", b"y"], (node_id, data)
    assert network.core(1).log.term(LogIndex(index)) == ready.entries[0].term
