"""Two Raft groups side by side on the same simulated nodes and network (issue 15:
"everything that holds for one group holds per shard"). A failure names its seed."""

from __future__ import annotations

from typing import Any

import pytest
from harness import InvariantViolation
from shards_harness import SHARD_SCENARIOS, ShardedSimCluster, shard_scenario_for_seed

SEEDS = range(12)


@pytest.mark.parametrize("seed", SEEDS)
def test_two_groups_side_by_side(seed: int) -> None:
    """Each group's safety after every step, liveness of both after healing, and every
    acknowledged proposal of each group kept, under one fault schedule."""
    scenario = shard_scenario_for_seed(seed)
    cluster = ShardedSimCluster(seed, scenario, groups=2)
    try:
        cluster.run()
    except Exception as exc:
        trace = "\n  ".join(cluster.trace[-15:])
        pytest.fail(
            f"side-by-side seed {seed} (scenario {scenario.name}) failed at tick "
            f"{cluster.now}: {type(exc).__name__}: {exc}\n"
            f"replay with: .venv/bin/python -m pytest "
            f"'tests/simulation/test_shard_groups.py::test_two_groups_side_by_side[{seed}]'\n"
            f"last faults:\n  {trace}"
        )
    # A heavy figure-8 schedule can keep one group from acknowledging anything (seed 8);
    # the run must still show something, and most seeds show both (test below).
    assert any(group.checker.acked for group in cluster.groups), "nothing acknowledged"


def test_faults_hit_groups_together_and_apart() -> None:
    """Over the seeds the schedule crashes whole nodes (every group's member) and single
    groups' members alone, and both groups elect and commit on the shared network."""
    node_crashes = shard_crashes = both_acked = 0
    for seed in SEEDS:
        cluster = ShardedSimCluster(seed, shard_scenario_for_seed(seed))
        cluster.run()
        node_crashes += cluster.node_crashes
        shard_crashes += cluster.shard_crashes
        for group in cluster.groups:
            assert group.checker.leader_of_term, "a group never elected a leader"
        both_acked += all(group.checker.acked for group in cluster.groups)
    assert node_crashes > 0 and shard_crashes > 0, (node_crashes, shard_crashes)
    assert both_acked >= len(SEEDS) - 1, both_acked


def test_same_seed_replays_identically() -> None:
    for number, scenario in enumerate(SHARD_SCENARIOS):
        runs = []
        for _ in range(2):
            cluster = ShardedSimCluster(500 + number, scenario)
            cluster.run()
            runs.append(
                (
                    tuple(cluster.trace),
                    tuple(tuple(g.trace) for g in cluster.groups),
                    tuple(tuple(sorted(g.checker.digest_at.items())) for g in cluster.groups),
                )
            )
        assert runs[0] == runs[1], scenario.name


def test_a_broken_group_is_caught_on_its_own() -> None:
    """Group 1's member on one node applies entries wrongly (its state machine skips
    entry 5, across restarts): group 1's checker fails (state machine safety) while
    group 0 on the same nodes is untouched."""
    cluster = ShardedSimCluster(3, SHARD_SCENARIOS[0])
    victim = cluster.groups[1].nodes[cluster.node_ids[0]]

    def break_it() -> None:
        sm = victim.sm
        original = sm.apply

        def apply(entry: Any) -> None:
            if entry.index == 5:
                sm.applied_index = entry.index  # applied, but its data left out
                return
            original(entry)

        sm.apply = apply  # type: ignore[method-assign]

    start = victim.start

    def start_broken(rng: Any) -> None:
        start(rng)
        break_it()

    victim.start = start_broken  # type: ignore[method-assign]
    break_it()
    with pytest.raises(InvariantViolation, match="state machine safety"):
        cluster.run()
    assert 5 in cluster.groups[1].checker.digest_at
