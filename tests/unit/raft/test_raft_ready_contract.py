"""The Ready/Advance contract (etcd-io/raft rawnode.go; docs/raft.md)."""

from __future__ import annotations

import random

import pytest
from raft_helpers import Network, make_config, make_node

from futureq.raft.core import RaftCore
from futureq.raft.messages import AppendEntries, LogIndex, NodeId, Ready


def test_no_input_between_ready_and_advance() -> None:
    network = Network.of(3)
    network.elect(1)
    core = network.core(1)
    core.propose(b"x")
    ready = core.ready()
    with pytest.raises(RuntimeError):
        core.tick()
    with pytest.raises(RuntimeError):
        core.propose(b"y")
    with pytest.raises(RuntimeError):
        core.advance(Ready())
    core.advance(ready)


def test_messages_come_with_the_state_they_depend_on() -> None:
    """The leader's AppendEntries for a new entry are released in the same Ready as the
    entry itself, as ``leader_messages``: sent while the adapter persists it (thesis
    §10.2.1; test_raft_overlapped_write.py has the ordering rules)."""
    network = Network.of(3)
    network.elect(1)
    core = network.core(1)
    index = core.propose(b"x")
    ready = core.ready()
    assert [e.index for e in ready.entries] == [index] and ready.must_sync
    assert any(isinstance(m, AppendEntries) and m.entries for m in ready.leader_messages)
    network.nodes[NodeId(1)].persist(ready)
    core.advance(ready)


def test_commit_only_change_needs_no_sync() -> None:
    """A lost commit index is recovered from the leader, so no fsync is demanded."""
    network = Network.of(3)
    network.elect(1)
    follower = network.nodes[NodeId(2)]
    network.drop = lambda m: m.to_id == 2 and isinstance(m, AppendEntries) and not m.entries
    network.propose(1, b"x")
    network.heal()
    leader = network.core(1)
    follower.core.step(
        AppendEntries(
            leader.term, NodeId(1), NodeId(2), leader.log.last_index(),
            leader.log.last_term(), (), leader.log.committed,
        )
    )  # fmt: skip
    ready = follower.core.ready()
    assert ready.hard_state is not None and not ready.entries and not ready.must_sync
    follower.core.advance(ready)


def test_committed_entries_are_paged_by_bytes_and_applied_in_order() -> None:
    network = Network.of(1, max_committed_bytes_per_ready=40)
    network.elect(1)
    core = network.core(1)
    for i in range(5):
        core.propose(b"%d" % i)
    sizes = []
    node = network.nodes[NodeId(1)]
    while core.has_ready():
        ready = core.ready()
        node.persist(ready)
        sizes.append(len(ready.committed_entries))
        node.applied.extend(ready.committed_entries)
        core.advance(ready)
    assert max(sizes) <= 2
    assert [e.index for e in node.applied] == list(range(1, 7))


def test_restart_with_applied_index_skips_applied_entries() -> None:
    network = Network.of(1)
    network.elect(1)
    for i in range(3):
        network.propose(1, b"%d" % i)
    storage = network.nodes[NodeId(1)].storage
    restarted = RaftCore(make_config(1), storage, random.Random(0), applied=LogIndex(3))
    ready = restarted.ready()
    assert [e.index for e in ready.committed_entries] == [4]
    restarted.advance(ready)
    again = make_node(1, [1], storage=storage)  # default: from the snapshot (index 0)
    assert [e.index for e in again.core.ready().committed_entries] == [1, 2, 3, 4]
