"""Seeded simulation runs with clocks: cluster time, the leader lease, clock faults.

Each seed runs one of :data:`harness.CLOCK_SCENARIOS`: Raft safety as in
``test_seeds.py``, plus after every step at most one node may dispatch and its cluster
time is within half of the bound of true time, while clocks are skewed, drift and step
forwards and back on a minority of the nodes (``docs/architecture.md``, "Time").
CI runs :data:`DEFAULT_CLOCK_SIM_RUNS` seeds; ``--sim-runs N`` runs more, ``--seed N``
replays one.
"""

from __future__ import annotations

import pytest
from harness import CLOCK_SCENARIOS, SimCluster, clock_scenario_for_seed

DEFAULT_CLOCK_SIM_RUNS = 240  # 80 seeds for each of the 3 clock scenarios


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "clock_seed" not in metafunc.fixturenames:
        return
    seed = metafunc.config.getoption("--seed", None)
    runs = metafunc.config.getoption("--sim-runs", None)
    seeds = [seed] if seed is not None else list(range(runs or DEFAULT_CLOCK_SIM_RUNS))
    metafunc.parametrize("clock_seed", seeds, ids=[str(s) for s in seeds])


def replay_command(seed: int) -> str:
    return f".venv/bin/python -m pytest tests/simulation/test_clock_seeds.py --seed {seed}"


def test_clock_seed(clock_seed: int) -> None:
    """Safety, the lease and the bound after every step; liveness after healing."""
    scenario = clock_scenario_for_seed(clock_seed)
    cluster = SimCluster(clock_seed, scenario)
    try:
        cluster.run()
    except Exception as exc:  # core asserts, invariant violations, anything: name the seed
        trace = "\n  ".join(cluster.trace[-25:])
        pytest.fail(
            f"clock simulation seed {clock_seed} (scenario {scenario.name}) failed at tick "
            f"{cluster.now}: {type(exc).__name__}: {exc}\n"
            f"replay with: {replay_command(clock_seed)}\n"
            f"last events:\n  {trace}",
            pytrace=True,
        )


def test_the_fixed_clock_seeds_exercise_clock_faults_and_dispatching() -> None:
    """The CI seeds must really step and skew clocks and still let leaders dispatch."""
    faults = dispatch_steps = 0
    for seed in range(2 * len(CLOCK_SCENARIOS)):
        cluster = SimCluster(seed, clock_scenario_for_seed(seed))
        cluster.run()
        faults += cluster.clock_faults
        dispatch_steps += cluster.dispatch_steps
    assert faults > 10
    assert dispatch_steps > 500


def test_a_clock_seed_replays_identically() -> None:
    def fingerprint(seed: int) -> tuple[object, ...]:
        cluster = SimCluster(seed, clock_scenario_for_seed(seed))
        cluster.run()
        return (
            tuple(cluster.trace),
            cluster.dispatch_steps,
            tuple(sorted(cluster.checker.digest_at.items())),
            tuple(
                (node_id, n.storage.hard_state(), n.keeper.clock.now_us(n.mono_us()))
                for node_id, n in sorted(cluster.nodes.items())
                if n.keeper is not None
            ),
        )

    for seed in range(len(CLOCK_SCENARIOS)):
        assert fingerprint(seed) == fingerprint(seed)
