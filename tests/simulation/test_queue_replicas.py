"""QueueState replicas under the Raft simulation: equal state at equal applied index,
no committed publish lost, ids unique and increasing, through loss, duplication,
reordering, partitions, crashes that lose unsynced writes, restarts and snapshot
installs (``DESIGN.md``, "Tests"). A failure names its seed and the replay command.

CI runs :data:`DEFAULT_QUEUE_SIM_RUNS` fixed seeds; ``--sim-runs N`` runs seeds
``0..N-1`` and ``--seed N`` replays one (options from ``tests/simulation/conftest.py``).
"""

from __future__ import annotations

import pytest
from queue_harness import (
    QUEUE_SCENARIOS,
    QueueSimCluster,
    queue_scenario_for_seed,
    run_queue_seed,
)

DEFAULT_QUEUE_SIM_RUNS = 300  # 50 seeds for each of the 6 scenario mixes


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "queue_seed" not in metafunc.fixturenames:
        return
    seed = metafunc.config.getoption("--seed", None)
    runs = metafunc.config.getoption("--sim-runs", None)
    seeds = [seed] if seed is not None else list(range(runs or DEFAULT_QUEUE_SIM_RUNS))
    metafunc.parametrize("queue_seed", seeds, ids=[str(s) for s in seeds])


def replay_command(seed: int) -> str:
    return f".venv/bin/python -m pytest tests/simulation/test_queue_replicas.py --seed {seed}"


def test_queue_seed(queue_seed: int) -> None:
    """Queue invariants after every step, liveness after healing, for one seed."""
    scenario = queue_scenario_for_seed(queue_seed)
    cluster = QueueSimCluster(queue_seed, scenario)
    try:
        cluster.run()
    except Exception as exc:  # asserts, invariant violations, anything: name the seed
        trace = "\n  ".join(cluster.trace[-25:])
        pytest.fail(
            f"queue simulation seed {queue_seed} (scenario {scenario.name}) failed at tick "
            f"{cluster.now}: {type(exc).__name__}: {exc}\n"
            f"replay with: {replay_command(queue_seed)}\n"
            f"last events:\n  {trace}",
            pytrace=True,
        )


def _fingerprint(cluster: QueueSimCluster) -> tuple[object, ...]:
    return (
        tuple(cluster.trace),
        tuple(sorted(cluster.checker.digest_at.items())),
        tuple(sorted(cluster.statistics().items())),
    )


def test_same_seed_replays_identically() -> None:
    for number in range(len(QUEUE_SCENARIOS)):
        assert _fingerprint(run_queue_seed(number)) == _fingerprint(run_queue_seed(number))


def test_the_fixed_seeds_exercise_every_fault() -> None:
    """The CI seeds must really install snapshots, lose writes and restart from them."""
    totals: dict[str, int] = {}
    for seed in range(2 * len(QUEUE_SCENARIOS)):
        for key, value in run_queue_seed(seed).statistics().items():
            totals[key] = totals.get(key, 0) + value
    assert totals["committed"] > 500
    assert totals["messages_published"] > 200
    assert totals["snapshot_installs"] > 0
    assert totals["restored_on_start"] > 0
    assert totals["crashes"] > 0
    assert totals["releases"] > 1000  # the dispatcher model released, and was checked
    assert totals["clock_faults"] > 5
    # Groups were created by leaders with different local defaults, and big deletes
    # went through PURGE_GROUP chunks: replicas agreed all the same.
    assert totals["group_settings_seen"] >= 3 * len(QUEUE_SCENARIOS)
    assert totals["purges"] > 0
    # Messages were cancelled and rescheduled by id (issue 14), replicas agreeing.
    assert totals["managed"] > 5
    # Groups created from the backlog were filled by BACKFILL_GROUP chunks (kinds 37, 38).
    assert totals["backfilled"] > 0, totals
    assert totals["backfill_chunks_by_id"] > 0, totals  # kind 37's too
