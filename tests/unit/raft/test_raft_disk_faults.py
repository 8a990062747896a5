"""Disk faults: recovery after a start, the member registry, missed removals
(``docs/raft.md``, "Disk faults"; Viewstamped Replication Revisited §4.3)."""

from __future__ import annotations

import random
from typing import TypeVar

from raft_helpers import Network, TestNode, ids, make_config, make_node

from futureq.raft.core import RaftCore
from futureq.raft.messages import (
    AppendEntries,
    Heartbeat,
    LogIndex,
    NodeId,
    NotMember,
    RecoveryRequest,
    RecoveryResponse,
    RequestVote,
    RequestVoteResponse,
    Sender,
    Term,
)
from futureq.raft.payload_codec import decode_registry
from futureq.raft.roles import Role
from futureq.raft.storage import MemoryStorage
from futureq.raft.values import (
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryKind,
    HardState,
    MemberRecord,
    Membership,
    Registry,
)

VOTERS = (1, 2, 3)
T = TypeVar("T")


def recovering_node(
    node_id: int = 1,
    voters: tuple[int, ...] = VOTERS,
    terms: tuple[int, ...] = (),
    term: int = 0,
    vote: int | None = None,
    incarnation: int = 11,
) -> TestNode:
    storage = MemoryStorage(Membership(ids(*voters)))
    storage.append([Entry(Term(t), LogIndex(i + 1)) for i, t in enumerate(terms)])
    storage.set_hard_state(HardState(Term(term), None if vote is None else NodeId(vote)))
    return make_node(
        node_id, voters, storage=storage, recovery=True, boot_id=77, incarnation=incarnation
    )


def sent(node: TestNode, kind: type[T]) -> list[T]:
    return [m for m in node.handle_ready() if isinstance(m, kind)]


def answer(
    node: TestNode,
    from_id: int,
    term: int,
    log_term: int,
    log_index: int,
    voters: tuple[int, ...] = VOTERS,
    **record: int,
) -> None:
    core: RaftCore = node.core
    node.core.step(
        RecoveryResponse(
            Term(term), NodeId(from_id), core.id, core._recovery.nonce,
            LogIndex(log_index), Term(log_term), LogIndex(0), ids(*voters), LogIndex(0),
            record.get("incarnation", 0), Term(record.get("acked_term", 0)),
            LogIndex(record.get("acked_index", 0)),
        )
    )  # fmt: skip


def vote_request(to: int, from_id: int, term: int, last_term: int, last_index: int) -> RequestVote:
    return RequestVote(
        Term(term), NodeId(from_id), NodeId(to), LogIndex(last_index), Term(last_term)
    )


def test_a_restarted_node_asks_every_other_voter_and_grants_no_vote_meanwhile() -> None:
    node = recovering_node(terms=(1, 1, 2), term=2)
    requests = sent(node, RecoveryRequest)
    assert sorted(r.to_id for r in requests) == [2, 3]
    assert all(
        (r.term, r.last_log_index, r.last_log_term) == (2, 3, 2) and r.sender.recovering
        for r in requests
    )
    assert node.core.recovering
    node.core.step(vote_request(1, 2, 5, 2, 3))
    (response,) = sent(node, RequestVoteResponse)
    assert not response.granted and response.sender.recovering
    for _ in range(3 * node.core.config.election_timeout_ticks):
        node.core.tick()
    assert node.core.role is Role.FOLLOWER  # never campaigns while recovering
    assert not [m for m in node.handle_ready() if isinstance(m, RequestVote)]


def test_recovery_ends_when_every_other_voter_answered_and_abstains_in_the_highest_term() -> None:
    node = recovering_node(terms=(1, 1, 2), term=2)
    sent(node, RecoveryRequest)
    answer(node, 2, term=7, log_term=2, log_index=3)
    assert node.core.recovering  # node 3 has not answered
    answer(node, 3, term=5, log_term=2, log_index=3)
    assert not node.core.recovering
    core = node.core
    assert (core.term, core.vote) == (7, core.id)  # it may have voted in 7 before
    node.handle_ready()
    assert node.storage.hard_state().term == 7 and node.storage.hard_state().vote == 1
    # A restarted node also keeps leader stickiness for one election timeout after its
    # start (a leader's lease counts on every voter that answered it, and this one may
    # have: raft/timekeeper.py, LeaderLease): let that pass first.
    for _ in range(core.config.election_timeout_ticks):
        core.tick()
    node.handle_ready()
    core.step(vote_request(1, 2, 7, 2, 3))
    assert not sent(node, RequestVoteResponse)[0].granted
    core.step(vote_request(1, 2, 8, 2, 3))
    assert sent(node, RequestVoteResponse)[0].granted


def test_a_durable_vote_in_the_highest_term_is_kept() -> None:
    node = recovering_node(terms=(1,), term=4, vote=3)
    answer(node, 2, term=4, log_term=1, log_index=1)
    answer(node, 3, term=4, log_term=1, log_index=1)
    assert (node.core.term, node.core.vote) == (4, 3)


def test_after_recovery_it_votes_only_for_logs_at_least_as_good_as_the_best_heard() -> None:
    """A wiped node (empty log) must not let a candidate that lacks what the others hold
    win: its vote floor is the best log of the 2 others (k = 1 of 3 voters)."""
    node = recovering_node()
    answer(node, 2, term=3, log_term=2, log_index=10)
    answer(node, 3, term=3, log_term=2, log_index=4)
    assert node.core.recovery_status().vote_floor == (2, 10)
    node.core.step(vote_request(1, 3, 4, 2, 9))
    assert not sent(node, RequestVoteResponse)[0].granted
    node.core.step(vote_request(1, 2, 4, 2, 10))
    assert sent(node, RequestVoteResponse)[0].granted
    for _ in range(3 * node.core.config.election_timeout_ticks):
        node.core.tick()
    assert not [m for m in node.handle_ready() if isinstance(m, RequestVote)]  # no campaign


def test_the_floor_is_the_kth_best_log_so_one_uncommitted_tail_does_not_set_it() -> None:
    """5 voters: a committed entry is on 3, so on at least 2 of the 4 others."""
    voters = (1, 2, 3, 4, 5)
    node = recovering_node(voters=voters)
    for peer, position in ((2, (3, 20)), (3, (3, 10)), (4, (3, 10)), (5, (1, 2))):
        answer(node, peer, 3, position[0], position[1], voters)
    assert node.core.recovery_status().vote_floor == (3, 10)


def test_voters_of_an_uncommitted_configuration_are_waited_for_too() -> None:
    """An answer whose newer configuration is not known to be committed adds its voters;
    it does not remove the voters of the committed one."""
    node = recovering_node()
    core: RaftCore = node.core
    core.step(
        RecoveryResponse(
            Term(2), NodeId(2), core.id, core._recovery.nonce, LogIndex(9), Term(2),
            LogIndex(8), ids(1, 3, 4), LogIndex(5),
        )
    )  # fmt: skip
    answer(node, 3, term=2, log_term=2, log_index=9)
    assert core.recovering and core.recovery_status().waiting_for == (4,)
    answer(node, 4, term=2, log_term=2, log_index=9, voters=(1, 3, 4))
    assert not core.recovering


def test_a_single_voter_needs_no_answer() -> None:
    node = recovering_node(voters=(1,), terms=(1,), term=1)
    assert not node.core.recovering
    assert not sent(node, RecoveryRequest)


def test_findings_name_a_replaced_directory_and_an_older_copy() -> None:
    wiped = recovering_node(incarnation=5)
    answer(wiped, 2, term=3, log_term=3, log_index=9, incarnation=4, acked_term=3, acked_index=9)
    assert "it was wiped or replaced" in wiped.core.recovery_status().findings[0]
    older = recovering_node(terms=(1, 1), term=1, incarnation=4)
    answer(older, 2, term=3, log_term=3, log_index=9, incarnation=4, acked_term=3, acked_index=9)
    assert "older copy of itself" in older.core.recovery_status().findings[0]
    intact = recovering_node(terms=(3,) * 9, term=3, incarnation=4)
    answer(intact, 2, term=3, log_term=3, log_index=9, incarnation=4, acked_term=3, acked_index=9)
    assert intact.core.recovery_status().findings == ()


def test_another_directory_that_holds_a_log_never_takes_part() -> None:
    """Node 3's directory replaced by node 3's of another cluster with the same cluster
    id: its log (term 17) outranked the cluster's (term 3), it finished recovery, won an
    election and overwrote every node's log (breaker runs, 2 of 2). The cluster's registry
    knows node 3 under another incarnation, and its log holds a term no voter reached,
    which no log of this cluster can: it stays recovering (no vote, no campaign) and says
    why, for the broker to stop it. A wiped directory (no log), and one that caught up
    from this cluster before it restarted (its new incarnation not yet recorded: the
    simulation's seed 379), recover as before."""
    foreign = recovering_node(terms=(17,) * 12, term=17, incarnation=5)
    for peer in (2, 3):
        answer(foreign, peer, term=3, log_term=3, log_index=30, incarnation=4)
    status = foreign.core.recovery_status()
    assert status.recovering
    assert status.foreign is not None and "log holds term 17 (index 12)" in status.foreign
    assert "no voter of this cluster has reached a term above 3" in status.foreign
    assert "it was wiped or replaced" in status.foreign
    assert "start this node with an empty data directory" in status.foreign
    for _ in range(50):
        foreign.core.tick()
    assert not sent(foreign, RequestVote)
    foreign.core.step(vote_request(1, 2, term=18, last_term=3, last_index=30))
    assert not [m for m in sent(foreign, RequestVoteResponse) if m.granted]

    wiped = recovering_node(incarnation=5)
    for peer in (2, 3):
        answer(wiped, peer, term=3, log_term=3, log_index=30, incarnation=4)
    assert wiped.core.recovery_status().foreign is None
    assert not wiped.core.recovering
    caught_up = recovering_node(terms=(2, 3, 3), term=3, incarnation=5)
    for peer in (2, 3):
        answer(caught_up, peer, term=3, log_term=3, log_index=30, incarnation=4)
    assert caught_up.core.recovery_status().foreign is None
    assert not caught_up.core.recovering


def test_the_reproduction_of_issue_7_cannot_elect_a_leader_without_the_quorums_entries() -> None:
    """L and F acknowledge entries while B is down; F is wiped; L is down; B and the
    blank F must not elect B (it lacks the entries) — they wait for L."""
    net = Network.of(3)
    net.elect(1)
    net.cut(1, 3)
    for i in range(5):
        net.propose(1, b"x%d" % i)
    committed = net.core(1).log.committed
    assert committed >= 6 and net.core(3).log.last_index() < committed
    wiped = make_node(2, VOTERS, recovery=True, boot_id=5, incarnation=9)
    net.add(wiped)
    net.isolate(1)  # L is down
    net.nodes.pop(NodeId(1))
    net.heal()
    net.tick_all(6 * 10)
    assert not net.leaders()
    assert net.core(2).recovering  # it waits for L's answer


def test_recovering_followers_do_not_count_towards_commit_or_check_quorum() -> None:
    net = Network.of(3)
    net.elect(1)
    leader = net.core(1)
    # Node 3 goes away; node 2 restarts and is recovering (its answer from 3 is missing).
    net.isolate(3)
    restarted = make_node(2, VOTERS, storage=net.nodes[NodeId(2)].storage, recovery=True, boot_id=8)
    net.add(restarted)
    net.tick_all(2)
    assert restarted.core.recovering
    index = leader.propose(b"only-two")
    net.stabilize()
    assert restarted.core.log.last_index() >= index  # it replicates like a learner ...
    assert leader.log.committed < index  # ... but does not count
    assert leader.progress[NodeId(2)].peer_recovering
    net.tick_all(2 * 10 + 1)
    assert leader.role is not Role.LEADER  # CheckQuorum: no live quorum


def test_the_leader_probes_a_peer_that_restarted_with_a_shorter_log() -> None:
    net = Network.of(3)
    net.elect(1)
    for i in range(4):
        net.propose(1, b"p%d" % i)
    leader = net.core(1)
    assert leader.progress[NodeId(3)].match == leader.log.last_index()
    # Node 3 comes back from an older copy of its directory: an empty log.
    net.nodes[NodeId(3)] = make_node(3, VOTERS, recovery=True, boot_id=99, incarnation=3)
    net.tick_all(6)
    assert not net.core(3).recovering
    assert net.core(3).log.last_index() == leader.log.last_index()
    assert leader.progress[NodeId(3)].match == leader.log.last_index()


def test_heartbeats_commit_only_what_append_entries_showed_to_match() -> None:
    """A leader's idea of our match may predate a restart from an older copy."""
    node = make_node(2, VOTERS)
    node.core.step(
        AppendEntries(
            Term(2), NodeId(1), NodeId(2), LogIndex(0), Term(0),
            (Entry(Term(1), LogIndex(1)), Entry(Term(2), LogIndex(2))), LogIndex(0),
        )
    )  # fmt: skip
    node.handle_ready()
    node.core.step(Heartbeat(Term(2), NodeId(1), NodeId(2), LogIndex(10)))
    node.handle_ready()
    assert node.core.log.committed == 2


def _removal_cluster() -> Network:
    net = Network.of(3)
    net.elect(1)
    net.isolate(3)
    net.core(1).propose_conf_change(ConfChange(ConfChangeOp.REMOVE_NODE, NodeId(3)))
    net.stabilize()
    net.propose(1, b"after")  # commits the removal
    net.heal()
    return net


def test_a_member_tells_a_node_that_missed_its_removal() -> None:
    net = _removal_cluster()
    removed_at = net.core(1).registry_at(net.core(1).log.committed).removed_at(NodeId(3))
    assert removed_at is not None and net.core(3).log.last_index() < removed_at
    net.nodes[NodeId(3)] = make_node(
        3, VOTERS, storage=net.nodes[NodeId(3)].storage, recovery=True, boot_id=4
    )
    net.tick_all(3)
    assert net.core(3).removed_at == removed_at
    assert "removed from the cluster" in net.core(3).recovery_status().findings[-1]
    net.tick_all(40)
    assert net.core(3).role is Role.FOLLOWER and net.core(3).term == net.core(1).term


def test_a_removed_node_is_told_when_it_campaigns() -> None:
    net = _removal_cluster()
    term = net.core(3).term
    net.core(2).step(vote_request(2, 3, term + 5, 1, 1))
    told = [m for m in net.nodes[NodeId(2)].handle_ready() if isinstance(m, NotMember)]
    assert told and told[0].to_id == 3
    assert net.core(2).term < term + 5  # its vote request changed nothing here


def test_a_blank_node_under_a_removed_id_is_not_told_it_may_be_added_back() -> None:
    net = _removal_cluster()
    blank = make_node(3, VOTERS, recovery=True, boot_id=6, incarnation=66)
    net.nodes[NodeId(3)] = blank
    net.tick_all(20)
    assert blank.core.removed_at is None
    net.core(1).propose_conf_change(ConfChange(ConfChangeOp.ADD_LEARNER, NodeId(3)))
    net.stabilize()
    net.tick_all(5)
    assert blank.core.log.last_index() == net.core(1).log.last_index()
    assert net.core(1).registry_at(net.core(1).log.committed).removed_at(NodeId(3)) is None


def test_the_leader_records_incarnations_and_acknowledgements_in_the_log() -> None:
    voters = range(1, 4)
    net = Network(make_node(i, voters, incarnation=100 + i, member_record_ticks=3) for i in voters)
    net.elect(1)
    net.tick_all(1)
    leader = net.core(1)
    records = [e for e in net.nodes[NodeId(1)].applied if e.kind is EntryKind.MEMBER_RECORDS]
    assert records
    registry = decode_registry(records[-1].data)
    assert [r.incarnation for r in registry.records] == [101, 102, 103]
    for i in range(3):
        net.propose(1, b"r%d" % i)
    net.tick_all(4)
    registry = leader.registry_at(leader.log.committed)
    assert all(r.acked_index >= 4 for r in registry.records), registry
    snapshot = leader.compact(leader.log.applied, b"state")
    assert snapshot.metadata.registry == registry


def test_a_restarted_peer_with_a_new_incarnation_is_recorded_at_once() -> None:
    voters = range(1, 4)
    net = Network(
        make_node(i, voters, incarnation=100 + i, member_record_ticks=1000) for i in voters
    )
    net.elect(1)
    net.tick_all(1)
    net.nodes[NodeId(2)] = make_node(2, voters, recovery=True, boot_id=3, incarnation=555)
    net.tick_all(12)
    leader = net.core(1)
    record = leader.registry_at(leader.log.committed).record(NodeId(2))
    assert record is not None
    assert record == MemberRecord(NodeId(2), 555, leader.term, record.acked_index)


def test_messages_carry_the_senders_stamp() -> None:
    core = RaftCore(
        make_config(1, incarnation=12, boot_id=34, recovery=True),
        MemoryStorage(Membership(ids(*VOTERS))),
        random.Random(0),
    )
    ready = core.ready()
    stamps = {m.sender for m in ready.messages}
    assert stamps == {Sender(12, 34, True)}


def test_registry_history_follows_removals_and_readds() -> None:
    from futureq.raft.payload_codec import encode_config_change
    from futureq.raft.registry import RegistryHistory

    history = RegistryHistory(LogIndex(0), Registry())
    remove = ConfChange(ConfChangeOp.REMOVE_NODE, NodeId(3))
    add = ConfChange(ConfChangeOp.ADD_LEARNER, NodeId(3))
    history.record_entries(
        [
            Entry(Term(1), LogIndex(4), EntryKind.CONFIG_CHANGE,
                  encode_config_change(remove, Membership(ids(1, 2)))),
            Entry(Term(1), LogIndex(9), EntryKind.CONFIG_CHANGE,
                  encode_config_change(add, Membership(ids(1, 2), ids(3)))),
        ]
    )  # fmt: skip
    assert history.at(LogIndex(5)).removed_at(NodeId(3)) == 4
    assert history.at(LogIndex(9)).removed_at(NodeId(3)) is None
    history.truncate_from(LogIndex(9))
    assert history.current().removed_at(NodeId(3)) == 4


def test_a_new_cluster_may_form_with_a_majority_of_blank_voters() -> None:
    """--initial-cluster-state new: a majority that answered with empty logs suffices."""
    storage = MemoryStorage(Membership(ids(*VOTERS)))
    node = make_node(1, VOTERS, storage=storage, recovery=True, boot_id=7, new_cluster=True)
    answer(node, 2, term=0, log_term=0, log_index=0)
    assert not node.core.recovering


def test_a_declared_new_cluster_that_holds_a_log_waits_for_every_voter() -> None:
    storage = MemoryStorage(Membership(ids(*VOTERS)))
    node = make_node(1, VOTERS, storage=storage, recovery=True, boot_id=7, new_cluster=True)
    answer(node, 2, term=2, log_term=2, log_index=5)
    assert node.core.recovering  # it exists already: node 3 must answer too
    answer(node, 3, term=2, log_term=0, log_index=0)
    assert not node.core.recovering
    assert node.core.recovery_status().vote_floor == (2, 5)
