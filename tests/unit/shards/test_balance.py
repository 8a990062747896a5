"""Which voter should lead each shard's group."""

from __future__ import annotations

import attrs

from futureq.shards.balance import (
    CHECK_S,
    MAX_RETRY_S,
    RETRY_S,
    SETTLE_S,
    Balancer,
    GroupView,
    preferred_leader,
)


def test_three_shards_on_three_nodes_get_one_leader_each() -> None:
    voters = frozenset({3, 1, 2})
    assert [preferred_leader(voters, k) for k in range(3)] == [1, 2, 3]


def test_more_shards_than_nodes_wrap_around() -> None:
    voters = frozenset({10, 20})
    assert [preferred_leader(voters, k) for k in range(5)] == [10, 20, 10, 20, 10]


def test_no_voters_no_preference() -> None:
    assert preferred_leader(frozenset(), 0) is None


# --- when the leader moves (Balancer: pure decisions) ------------------------------------

STABLE = GroupView(leading_term=7, target=1, target_healthy=True, group_stable=True)


def _first_transfer(balancer: Balancer, views: list[GroupView], start: float = 0.0) -> float | None:
    """Feed ``views`` one per CHECK_S from ``start``; the time of the first transfer."""
    for i, view in enumerate(views):
        now = start + i * CHECK_S
        if balancer.check(view, now) is not None:
            return now
    return None


def test_a_stable_group_moves_its_leader_after_settling() -> None:
    balancer = Balancer(shard=0, node_id=3)
    assert _first_transfer(balancer, [STABLE] * 40) == SETTLE_S


def test_a_fresh_leadership_is_not_moved_at_once() -> None:
    # The group looked stable all along, but this node leads term 8 only since 5 s.
    balancer = Balancer(shard=0, node_id=3)
    balancer.check(STABLE, 0.0)
    assert balancer.check(attrs.evolve(STABLE, leading_term=8), SETTLE_S) is None
    assert balancer.check(attrs.evolve(STABLE, leading_term=8), 2 * SETTLE_S) == 1


def test_no_move_while_the_group_or_the_target_is_unsteady() -> None:
    # Issue 15, seed 23: clock answers over 250 ms, a transfer 5 s after the election
    # failed and left the group leaderless. Any wobble restarts the settling time.
    for unsteady in (
        attrs.evolve(STABLE, group_stable=False),
        attrs.evolve(STABLE, target_healthy=False),
    ):
        balancer = Balancer(shard=0, node_id=3)
        views = ([STABLE] * 8 + [unsteady]) * 5
        assert _first_transfer(balancer, views) is None
        at = _first_transfer(balancer, [STABLE] * 20, start=len(views) * CHECK_S)
        assert at == len(views) * CHECK_S + SETTLE_S


def test_not_leading_or_already_preferred_never_moves() -> None:
    balancer = Balancer(shard=0, node_id=3)
    assert _first_transfer(balancer, [attrs.evolve(STABLE, leading_term=None)] * 40) is None
    assert _first_transfer(balancer, [attrs.evolve(STABLE, target=3)] * 40) is None


def test_failed_transfers_back_off_doubling_and_a_success_resets() -> None:
    balancer = Balancer(shard=0, node_id=2)
    pauses = [balancer.transfer_failed(100.0) for _ in range(6)]
    assert pauses == [RETRY_S, 2 * RETRY_S, 4 * RETRY_S, 8 * RETRY_S, MAX_RETRY_S, MAX_RETRY_S]
    assert MAX_RETRY_S == 16 * RETRY_S
    # Stable all along, yet nothing moves before the pause ends.
    now = 100.0
    assert balancer.check(STABLE, now) is None
    assert balancer.check(STABLE, now + SETTLE_S) is None
    assert balancer.check(STABLE, now + MAX_RETRY_S - CHECK_S) is None
    assert balancer.check(STABLE, now + MAX_RETRY_S) == 1
    balancer.transfer_done()
    assert balancer.transfer_failed(500.0) == RETRY_S
