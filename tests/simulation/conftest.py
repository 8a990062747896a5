"""Options for the Raft simulation: ``--seed N`` replays one seed, ``--sim-runs N`` runs more."""

from __future__ import annotations

import pytest

DEFAULT_SIM_RUNS = 2016  # 224 seeds for each of the 9 scenario mixes


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("simulation", "Raft simulation")
    for name, help_text in (
        ("--seed", "replay a single simulation seed (tests/simulation/test_seeds.py)"),
        ("--sim-runs", f"number of simulation seeds to run, from 0 (default {DEFAULT_SIM_RUNS})"),
    ):
        try:
            group.addoption(name, type=int, default=None, help=help_text)
        except ValueError:
            pass  # already defined by a top-level conftest; use that definition


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sim_seed" not in metafunc.fixturenames:
        return
    seed = metafunc.config.getoption("--seed", None)
    runs = metafunc.config.getoption("--sim-runs", None)
    seeds = [seed] if seed is not None else list(range(runs or DEFAULT_SIM_RUNS))
    metafunc.parametrize("sim_seed", seeds, ids=[str(s) for s in seeds])
