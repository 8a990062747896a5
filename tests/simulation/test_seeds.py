"""Seeded simulation runs of the Raft core; a failure names its seed and replay command."""

from __future__ import annotations

import pytest
from harness import SimCluster, scenario_for_seed


def replay_command(seed: int) -> str:
    return f".venv/bin/python -m pytest tests/simulation/test_seeds.py --seed {seed}"


def test_seed(sim_seed: int) -> None:
    """Safety after every step and liveness after healing, for one seed."""
    scenario = scenario_for_seed(sim_seed)
    cluster = SimCluster(sim_seed, scenario)
    try:
        cluster.run()
    except Exception as exc:  # core asserts, invariant violations, anything: name the seed
        trace = "\n  ".join(cluster.trace[-25:])
        pytest.fail(
            f"simulation seed {sim_seed} (scenario {scenario.name}) failed at tick "
            f"{cluster.now}: {type(exc).__name__}: {exc}\n"
            f"replay with: {replay_command(sim_seed)}\n"
            f"last events:\n  {trace}",
            pytrace=True,
        )
