"""Which voter should lead each shard's group."""

from __future__ import annotations

from futureq.shards.balance import preferred_leader


def test_three_shards_on_three_nodes_get_one_leader_each() -> None:
    voters = frozenset({3, 1, 2})
    assert [preferred_leader(voters, k) for k in range(3)] == [1, 2, 3]


def test_more_shards_than_nodes_wrap_around() -> None:
    voters = frozenset({10, 20})
    assert [preferred_leader(voters, k) for k in range(5)] == [10, 20, 10, 20, 10]


def test_no_voters_no_preference() -> None:
    assert preferred_leader(frozenset(), 0) is None
