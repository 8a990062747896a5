"""RaftLog bookkeeping and quorum arithmetic, against naive twins (etcd quick_test.go)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from futureq.raft.log import RaftLog
from futureq.raft.messages import LogIndex, NodeId, Term
from futureq.raft.quorum import (
    MembershipHistory,
    VoteResult,
    apply_conf_change,
    committed_index,
    has_quorum,
    validate_conf_change,
    vote_result,
)
from futureq.raft.storage import CompactedError, MemoryStorage
from futureq.raft.values import (
    ConfChange,
    ConfChangeOp,
    Entry,
    Membership,
    Snapshot,
    SnapshotMetadata,
)


def _log(stable: list[int], unstable: list[int] = ()) -> RaftLog:  # type: ignore[assignment]
    storage = MemoryStorage(Membership(frozenset({NodeId(1)})))
    storage.append([Entry(Term(t), LogIndex(i + 1)) for i, t in enumerate(stable)])
    log = RaftLog(storage)
    first = len(stable) + 1
    log.append([Entry(Term(t), LogIndex(first + i)) for i, t in enumerate(unstable)])
    return log


def test_term_lookup_spans_stable_and_unstable_parts() -> None:
    log = _log([1, 1, 2], [3, 3])
    assert [log.term(LogIndex(i)) for i in range(0, 7)] == [0, 1, 1, 2, 3, 3, None]
    assert log.persisted_index() == 3 and log.last_index() == 5


def test_append_over_stable_suffix_hides_stale_stored_entries() -> None:
    """§5.3: a conflicting suffix is replaced even before the replacement is stored."""
    log = _log([1, 1, 1, 1])
    log.append([Entry(Term(2), LogIndex(2))])
    assert log.last_index() == 2 and log.term(LogIndex(3)) is None
    assert log.term(LogIndex(2)) == 2 and log.persisted_index() == 1


def test_stable_to_ignores_overwritten_entries() -> None:
    log = _log([], [1, 1])
    log.append([Entry(Term(2), LogIndex(2))])
    log.stable_to(LogIndex(2), Term(1))  # that Ready's entry 2 was overwritten since
    assert log.unstable_entries() == [Entry(Term(1), LogIndex(1)), Entry(Term(2), LogIndex(2))]


def test_slice_reads_across_both_parts_with_byte_limit() -> None:
    log = _log([1, 1], [2, 2])
    assert [e.index for e in log.slice(LogIndex(1), LogIndex(5))] == [1, 2, 3, 4]
    assert [e.index for e in log.slice(LogIndex(2), LogIndex(5), 1)] == [2]
    assert [e.index for e in log.slice(LogIndex(2), LogIndex(5), 40)] == [2, 3]


def test_compacted_reads_raise() -> None:
    storage = MemoryStorage(Membership(frozenset({NodeId(1)})))
    storage.append([Entry(Term(1), LogIndex(i)) for i in range(1, 6)])
    storage.compact(Snapshot(SnapshotMetadata(LogIndex(3), Term(1), Membership())))
    log = RaftLog(storage)
    assert log.term(LogIndex(3)) == 1 and log.term(LogIndex(2)) is None
    with pytest.raises(CompactedError):
        log.entries(LogIndex(3))


@pytest.mark.parametrize(
    ("index", "term", "expected"),
    [(7, 9, (7, 5)), (7, 4, (3, 4)), (7, 3, (2, 1)), (7, 0, (0, 0)), (2, 5, (2, 1))],
)
def test_find_conflict_by_term(index: int, term: int, expected: tuple[int, int]) -> None:
    """Thesis §5.3 back-off hint: largest index <= given index with term <= given term."""
    log = _log([1, 1, 4, 5, 5, 5, 5])
    assert log.find_conflict_by_term(LogIndex(index), Term(term)) == expected


def test_commit_only_current_term_by_count() -> None:
    """§5.4.2: maybe_commit refuses an index whose entry is from another term."""
    log = _log([1, 2])
    assert not log.maybe_commit(LogIndex(1), Term(2))
    assert log.maybe_commit(LogIndex(2), Term(2)) and log.committed == 2


def _naive_committed(voters: list[int], match: dict[int, int]) -> int:
    best = 0
    for candidate in sorted({0, *match.values()}):
        if sum(1 for v in voters if match.get(v, 0) >= candidate) * 2 > len(voters):
            best = max(best, candidate)
    return best


@given(
    st.lists(st.integers(1, 9), min_size=1, max_size=7, unique=True),
    st.dictionaries(st.integers(1, 9), st.integers(0, 50)),
)
def test_committed_index_matches_naive_majority(voters: list[int], match: dict[int, int]) -> None:
    assert committed_index([NodeId(v) for v in voters], match) == _naive_committed(voters, match)  # type: ignore[arg-type]


@given(
    st.lists(st.integers(1, 9), min_size=1, max_size=7, unique=True),
    st.dictionaries(st.integers(1, 12), st.booleans()),
)
def test_vote_result_matches_naive_count(voters: list[int], votes: dict[int, bool]) -> None:
    granted = sum(1 for v in voters if votes.get(v) is True)
    missing = sum(1 for v in voters if v not in votes)
    result = vote_result([NodeId(v) for v in voters], votes)  # type: ignore[arg-type]
    if granted * 2 > len(voters):
        assert result is VoteResult.WON
    elif (granted + missing) * 2 > len(voters):
        assert result is VoteResult.PENDING
    else:
        assert result is VoteResult.LOST
    assert has_quorum([NodeId(v) for v in voters], [NodeId(v) for v, g in votes.items() if g]) == (
        result is VoteResult.WON
    )


def test_conf_change_rules() -> None:
    """Thesis §4.1/§4.2.1: add as learner, promote learners, never remove the last voter."""
    m = Membership(frozenset({NodeId(1)}))
    add = ConfChange(ConfChangeOp.ADD_LEARNER, NodeId(2))
    promote = ConfChange(ConfChangeOp.PROMOTE_VOTER, NodeId(2))
    assert validate_conf_change(m, promote) is not None
    m = apply_conf_change(m, add)
    assert m == Membership(frozenset({NodeId(1)}), frozenset({NodeId(2)}))
    assert validate_conf_change(m, add) is not None
    m = apply_conf_change(m, promote)
    assert m.voters == {NodeId(1), NodeId(2)} and not m.learners
    last = ConfChange(ConfChangeOp.REMOVE_NODE, NodeId(1))
    assert validate_conf_change(Membership(frozenset({NodeId(1)})), last) is not None


def test_membership_history_at_truncate_reset() -> None:
    base = Membership(frozenset({NodeId(1)}))
    a = Membership(frozenset({NodeId(1)}), frozenset({NodeId(2)}))
    b = Membership(frozenset({NodeId(1), NodeId(2)}))
    history = MembershipHistory(LogIndex(0), base)
    history.record(LogIndex(3), a)
    history.record(LogIndex(7), b)
    assert [history.at(LogIndex(i)) for i in (2, 3, 6, 7, 9)] == [base, a, a, b, b]
    assert history.last_change_index() == 7
    history.truncate_from(LogIndex(5))
    assert history.current() == a and history.last_change_index() == 3
    history.reset(LogIndex(10), b)
    assert history.current() == b and history.last_change_index() == 10
