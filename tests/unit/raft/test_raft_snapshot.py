"""Log compaction and InstallSnapshot in chunks (paper §7, thesis §5)."""

from __future__ import annotations

from raft_helpers import ELECTION_TICKS, Network

from futureq.raft.messages import InstallSnapshot, InstallSnapshotResponse, LogIndex, NodeId
from futureq.raft.progress import ProgressState


def _compact(network: Network, node_id: int, data: bytes) -> None:
    node = network.nodes[NodeId(node_id)]
    snapshot = node.core.compact(node.core.log.applied, data)
    node.storage.compact(snapshot)


def _lagging_cluster(chunk_bytes: int = 4) -> Network:
    network = Network.of(3, snapshot_chunk_bytes=chunk_bytes)
    network.elect(1)
    network.isolate(3)
    for i in range(10):
        network.propose(1, b"v%d" % i)
    _compact(network, 1, b"state-through-11")
    network.heal()
    return network


def test_compaction_keeps_snapshot_metadata_and_later_entries() -> None:
    """Paper §7: the snapshot records last included index and term (and membership);
    the log keeps only later entries."""
    network = Network.of(3)
    network.elect(1)
    for i in range(5):
        network.propose(1, b"%d" % i)
    leader = network.core(1)
    snapshot = leader.compact(LogIndex(4), b"s")
    network.nodes[NodeId(1)].storage.compact(snapshot)
    assert snapshot.metadata.index == 4 and snapshot.metadata.term == leader.term
    assert snapshot.metadata.membership == leader.membership
    assert leader.log.first_index() == 5 and leader.log.last_index() == 6


def test_leader_sends_snapshot_in_chunks_to_follower_behind_compaction() -> None:
    """Paper §7: a follower whose next entry was discarded gets InstallSnapshot; the
    data travels in chunks of snapshot_chunk_bytes, with increasing offsets."""
    network = _lagging_cluster(chunk_bytes=4)
    network.tick_all(2)
    chunks = [m for m in network.delivered if isinstance(m, InstallSnapshot) and m.to_id == 3]
    data = b"state-through-11"
    assert [c.offset for c in chunks] == list(range(0, len(data), 4))
    assert b"".join(c.data for c in chunks) == data
    assert [c.done for c in chunks] == [False] * 3 + [True]
    follower = network.nodes[NodeId(3)]
    assert [s.data for s in follower.installed] == [data]
    assert follower.core.log.first_index() == 12


def test_follower_surfaces_snapshot_in_ready_and_replication_continues() -> None:
    """Paper §7: after installing the snapshot the follower's log resumes from it and
    later entries are replicated and applied normally."""
    network = _lagging_cluster()
    network.tick_all(2)
    network.propose(1, b"after")
    network.heartbeat(1)
    follower = network.nodes[NodeId(3)]
    assert follower.applied_data() == [b"after"]
    assert follower.core.log.committed == network.core(1).log.committed
    assert network.core(1).progress[NodeId(3)].state is ProgressState.REPLICATE
    assert follower.storage.snapshot().data == b"state-through-11"


def test_lost_snapshot_chunk_is_resent() -> None:
    """Paper §7 over a lossy network: a lost chunk is resent from the last offset the
    follower acknowledged."""
    network = _lagging_cluster()
    dropped: list[InstallSnapshot] = []

    def drop_first_offset_8(message: object) -> bool:
        if isinstance(message, InstallSnapshot) and message.offset == 8 and not dropped:
            dropped.append(message)
            return True
        return False

    network.drop = drop_first_offset_8
    network.tick_all(1)
    assert dropped
    network.tick_all(3)
    assert network.nodes[NodeId(3)].installed[-1].data == b"state-through-11"


def test_follower_that_lost_its_chunk_buffer_restarts_transfer() -> None:
    """A follower that answers a chunk with a smaller offset (it lost its buffer) makes
    the leader restart from that offset."""
    network = _lagging_cluster()
    leader = network.core(1)
    network.drop = lambda m: isinstance(m, InstallSnapshot | InstallSnapshotResponse)
    network.tick_all(1)  # probe rejected -> snapshot state, chunk 0 dropped
    pr = leader.progress[NodeId(3)]
    assert pr.state is ProgressState.SNAPSHOT
    pr.snapshot_offset = 8  # pretend the leader believes 8 bytes arrived
    network.heal()
    network.tick_all(3)
    assert network.nodes[NodeId(3)].installed[-1].data == b"state-through-11"


def test_snapshot_covering_committed_entries_is_not_reinstalled() -> None:
    """Paper §7: a snapshot whose last index the follower already committed is
    acknowledged without discarding the follower's log."""
    network = Network.of(3)
    network.elect(1)
    for i in range(3):
        network.propose(1, b"%d" % i)
    leader = network.core(1)
    snapshot = leader.compact(LogIndex(2), b"s")
    follower = network.core(2)
    follower.step(
        InstallSnapshot(
            leader.term, NodeId(1), NodeId(2), snapshot.metadata.index, snapshot.metadata.term,
            snapshot.metadata.membership, 0, b"s", True,
        )
    )  # fmt: skip
    out = network.nodes[NodeId(2)].handle_ready()
    (response,) = out
    assert isinstance(response, InstallSnapshotResponse) and response.done
    assert response.match_index == follower.log.committed
    assert network.nodes[NodeId(2)].installed == []


def test_restarted_node_recovers_from_snapshot_and_log() -> None:
    """Paper §7: on restart a server reloads its snapshot and replays later entries."""
    network = Network.of(3)
    network.elect(1)
    for i in range(4):
        network.propose(1, b"%d" % i)
    _compact(network, 2, b"snap")
    network.propose(1, b"tail")
    network.heartbeat(1)
    old = network.nodes[NodeId(2)]
    from raft_helpers import make_node

    fresh = make_node(2, [1, 2, 3], storage=old.storage)
    network.add(fresh)
    network.tick_all(ELECTION_TICKS // 2)
    assert fresh.core.log.first_index() == old.core.log.first_index()
    assert fresh.applied_data()[-1:] == [b"tail"]
