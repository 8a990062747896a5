"""The simulation must replay a seed exactly: same events, same states, same digests."""

from __future__ import annotations

from harness import SCENARIOS, SimCluster


def _fingerprint(cluster: SimCluster) -> tuple[object, ...]:
    return (
        tuple(cluster.trace),
        cluster.now,
        tuple(sorted(cluster.checker.leader_of_term.items())),
        tuple(sorted(cluster.checker.digest_at.items())),
        tuple(sorted(cluster.checker.acked.items())),
        tuple(
            (node_id, n.storage.hard_state(), n.storage.last_index(), n.sm.digest)
            for node_id, n in sorted(cluster.nodes.items())
        ),
    )


def test_same_seed_replays_identically_in_every_scenario() -> None:
    for number, scenario in enumerate(SCENARIOS):
        seed = 1000 + number
        first = SimCluster(seed, scenario)
        first.run()
        second = SimCluster(seed, scenario)
        second.run()
        assert _fingerprint(first) == _fingerprint(second), scenario.name


def test_different_seeds_take_different_paths() -> None:
    a = SimCluster(1, SCENARIOS[1])
    a.run()
    b = SimCluster(10, SCENARIOS[1])
    b.run()
    assert _fingerprint(a) != _fingerprint(b)
