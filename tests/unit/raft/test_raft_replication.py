"""Log replication (Raft paper §5.3, thesis §5.3 fast back-off, §10.2.2 pipelining)."""

from __future__ import annotations

from raft_helpers import Network, ids, make_node

from futureq.raft.messages import AppendEntries, AppendEntriesResponse, LogIndex, NodeId, Term
from futureq.raft.progress import ProgressState
from futureq.raft.roles import Role
from futureq.raft.storage import MemoryStorage
from futureq.raft.values import Entry, EntryKind, HardState, Membership


def _storage_with_log(voters: list[int], terms: list[int], current_term: int) -> MemoryStorage:
    storage = MemoryStorage(Membership(ids(*voters)))
    storage.append([Entry(Term(t), LogIndex(i + 1)) for i, t in enumerate(terms)])
    storage.set_hard_state(HardState(Term(current_term), None, LogIndex(0)))
    return storage


def _log_terms(network: Network, node_id: int) -> list[int]:
    core = network.core(node_id)
    return [core.log.term(LogIndex(i)) or 0 for i in range(1, core.log.last_index() + 1)]


def test_new_leader_appends_noop_entry_of_its_term() -> None:
    """Thesis §6.4: a leader commits a blank no-op entry at the start of its term."""
    network = Network.of(3)
    network.elect(1)
    leader = network.core(1)
    (noop,) = network.nodes[NodeId(1)].applied
    assert noop.kind is EntryKind.NOOP and noop.term == leader.term and noop.index == 1
    assert leader.log.committed == 1


def test_leader_replicates_entries_and_all_apply_them_in_order() -> None:
    """§5.3: the leader appends the command and replicates it; once committed every
    server applies it, in log order."""
    network = Network.of(5)
    network.elect(1)
    for i in range(10):
        network.propose(1, f"cmd{i}".encode())
    network.heartbeat(1)  # the followers learn the last commit index
    expected = [f"cmd{i}".encode() for i in range(10)]
    for node in network.nodes.values():
        assert node.applied_data() == expected


def test_entries_are_persisted_before_they_are_acknowledged() -> None:
    """Figure 2: a follower answers AppendEntries only after storing the entries,
    so the acknowledgement rides in the same Ready as the entries (must_sync)."""
    network = Network.of(3)
    network.elect(1)
    network.core(1).propose(b"x")
    (append,) = [m for m in network.pending() if isinstance(m, AppendEntries) and m.to_id == 2]
    follower = network.nodes[NodeId(2)]
    follower.core.step(append)
    ready = follower.core.ready()
    assert ready.entries and ready.must_sync
    assert any(isinstance(m, AppendEntriesResponse) and m.success for m in ready.messages)
    follower.core.advance(ready)


def test_follower_rejects_append_when_prev_entry_does_not_match() -> None:
    """§5.3 consistency check: reply false if the log has no entry at prevLogIndex
    whose term matches prevLogTerm."""
    node = make_node(2, [1, 2, 3], storage=_storage_with_log([1, 2, 3], [1, 1], 2))
    node.core.step(
        AppendEntries(Term(2), NodeId(1), NodeId(2), LogIndex(2), Term(2), (), LogIndex(0))
    )
    (response,) = node.handle_ready()
    assert isinstance(response, AppendEntriesResponse) and not response.success
    assert response.index == 2 and response.reject_hint == 2 and response.log_term == 1
    node.core.step(
        AppendEntries(Term(2), NodeId(1), NodeId(2), LogIndex(5), Term(2), (), LogIndex(0))
    )
    (response,) = node.handle_ready()
    assert not response.success and response.reject_hint == 2  # type: ignore[union-attr]


def test_follower_deletes_conflicting_entries_and_appends_the_leaders() -> None:
    """§5.3: if an existing entry conflicts with a new one (same index, different
    terms), delete it and all that follow, then append the new entries."""
    node = make_node(2, [1, 2, 3], storage=_storage_with_log([1, 2, 3], [1, 2, 2, 2], 3))
    new = (Entry(Term(3), LogIndex(3)), Entry(Term(3), LogIndex(4)))
    node.core.step(
        AppendEntries(Term(3), NodeId(1), NodeId(2), LogIndex(2), Term(2), new, LogIndex(0))
    )
    node.handle_ready()
    assert [node.storage.term(LogIndex(i)) for i in range(1, 5)] == [1, 2, 3, 3]


def test_append_with_already_present_entries_does_not_truncate() -> None:
    """§5.3: entries already present (same index and term) are kept; a stale, shorter
    AppendEntries must not cut off entries that follow them."""
    node = make_node(2, [1, 2, 3], storage=_storage_with_log([1, 2, 3], [1, 1, 1, 1], 1))
    old = (Entry(Term(1), LogIndex(2)),)
    node.core.step(
        AppendEntries(Term(1), NodeId(1), NodeId(2), LogIndex(1), Term(1), old, LogIndex(0))
    )
    node.handle_ready()
    assert node.core.log.last_index() == 4


def test_follower_commits_up_to_leader_commit_bounded_by_last_new_entry() -> None:
    """§5.3 / Figure 2 rule 5: commitIndex = min(leaderCommit, index of last new entry)."""
    node = make_node(2, [1, 2, 3], storage=_storage_with_log([1, 2, 3], [1, 1, 1, 1], 1))
    node.core.step(
        AppendEntries(Term(1), NodeId(1), NodeId(2), LogIndex(1), Term(1), (), LogIndex(4))
    )
    node.handle_ready()
    assert node.core.log.committed == 1


def test_leader_repairs_divergent_follower_logs_with_fast_backoff() -> None:
    """§5.3 + thesis §5.3: the leader backs nextIndex off to the point of agreement,
    skipping whole terms per round trip, and overwrites the follower's suffix."""
    leader_log = [1, 1, 1, 4, 4, 5, 5, 6, 6, 6]
    follower_logs = {
        2: [1, 1, 1, 4, 4, 5, 5, 6, 6],  # missing one
        3: [1, 1, 1, 4],  # missing many
        4: [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6],  # extra uncommitted entry
        5: [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7],  # extra entries of a later term
        6: [1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3],  # diverged from index 4
    }
    nodes = [make_node(1, range(1, 7), storage=_storage_with_log(list(range(1, 7)), leader_log, 7))]
    for node_id, log in follower_logs.items():
        nodes.append(
            make_node(node_id, range(1, 7), storage=_storage_with_log(list(range(1, 7)), log, 7))
        )
    network = Network(nodes)
    network.outlive_restart_quiet(2, 3, 4, 5, 6)
    # Node 1 can win: nodes 2, 3, 4 and 6 find its log up to date.
    network.elect(1)
    leader_terms = _log_terms(network, 1)
    rejections = 0
    for message in network.delivered:
        if isinstance(message, AppendEntriesResponse) and not message.success:
            rejections += 1
    for node_id in range(2, 7):
        assert _log_terms(network, node_id) == leader_terms, node_id
    # One round trip per conflicting term at most, not one per entry.
    assert rejections <= 8


def test_leader_pipelines_appends_up_to_the_inflight_cap() -> None:
    """Thesis §10.2.2: in REPLICATE state the leader sends further AppendEntries before
    earlier ones are answered, up to max_inflight_messages."""
    network = Network.of(3, max_inflight_messages=3, max_append_bytes=1)
    network.elect(1)
    leader = network.core(1)
    assert leader.progress[NodeId(2)].state is ProgressState.REPLICATE
    for i in range(5):
        leader.propose(bytes([i]))
    sent = [m for m in network.pending() if isinstance(m, AppendEntries) and m.to_id == 2]
    assert len(sent) == 3  # capped; the rest wait for acknowledgements
    assert leader.progress[NodeId(2)].is_paused()
    network.deliver(sent)
    network.stabilize()
    assert network.core(2).log.last_index() == leader.log.last_index()


def test_lost_append_is_recovered_via_heartbeat_response() -> None:
    """§5.3: the leader retries AppendEntries indefinitely; a lost one is resent."""
    network = Network.of(3)
    network.elect(1)
    network.drop = lambda m: isinstance(m, AppendEntries) and m.to_id == 3
    network.propose(1, b"a")
    network.heal()
    assert network.core(3).log.last_index() < network.core(1).log.last_index()
    network.tick_all(3)
    assert network.nodes[NodeId(3)].applied_data() == [b"a"]


def test_stale_leader_learns_new_term_from_append_rejection() -> None:
    """§5.1: a deposed leader that sends AppendEntries learns the newer term from the
    reply and becomes a follower."""
    network = Network.of(3, check_quorum=False)  # so node 1 does not step down alone
    network.elect(1)
    network.isolate(1)
    network.elect(2)
    network.heal()
    network.core(1).propose(b"stale")
    network.stabilize()
    assert network.core(1).role is Role.FOLLOWER
    assert network.core(1).term == network.core(2).term
    assert b"stale" not in network.nodes[NodeId(2)].applied_data()
