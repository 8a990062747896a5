"""The runner's pure parts: the reproduce command, the digest comparison."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from tests.jepsen_like.__main__ import _parser
from tests.jepsen_like.runner import RunOptions, compare_digests


@pytest.mark.parametrize(
    "options",
    [
        RunOptions(out=Path("/tmp/x"), nemesis=("pause",), seed=5),
        # As test_jepsen_ci.test_kill_leader_and_pause runs it: other fault timings.
        RunOptions(
            out=Path("/tmp/run 11"),
            time_s=25,
            nemesis=("kill-leader", "pause"),
            seed=11,
            rate=30,
            quiet_s=(1, 3),
            hold_s=(3, 5),
            nemesis_first=("clock-step",),
            drain_timeout_s=10,
            ack_level="none",
        ),
    ],
)
def test_the_reproduce_command_gives_the_same_options(options: RunOptions) -> None:
    argv = shlex.split(options.command())
    assert argv[1:4] == ["-m", "tests.jepsen_like", "run"]
    args = _parser().parse_args(argv[3:])
    rebuilt = RunOptions(
        out=args.out,
        nodes=args.nodes,
        time_s=args.time,
        nemesis=tuple(args.nemesis.split(",")),
        seed=args.seed,
        rate=args.rate,
        ack_level=args.ack_level,
        quiet_s=args.quiet,
        hold_s=args.hold,
        nemesis_first=tuple(n for n in args.nemesis_first.split(",") if n),
        drain_timeout_s=args.drain_timeout,
    )
    assert rebuilt == options


def test_a_bad_range_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "--hold", "5,3"])
    assert "MIN <= MAX" in capsys.readouterr().err


def test_digests_are_compared_only_at_the_same_applied_index() -> None:
    # One node applied one entry more (the others learn its commit with the next
    # heartbeat): nothing to compare it with, not a divergence.
    ahead = {1: {"applied_index": 808, "applied_digest": 7}, 2: {"applied_index": 808,
             "applied_digest": 7}, 3: {"applied_index": 809, "applied_digest": 9}}  # fmt: skip
    result = compare_digests(ahead)
    assert result["applied_digest_equal"] is True
    assert result["applied_digest_compared"] == "nodes at the same applied index only"
    # Two nodes at the same index with different digests diverged, whatever the third.
    ahead[2]["applied_digest"] = 8
    assert compare_digests(ahead)["applied_digest_equal"] is False
    same = {n: {"applied_index": 5, "applied_digest": 1} for n in (1, 2, 3)}
    assert compare_digests(same) == {
        "applied_digest": {"1": 1, "2": 1, "3": 1},
        "applied_digest_equal": True,
        "applied_digest_compared": "all nodes",
    }
    assert compare_digests({1: {"applied_index": 5}})["applied_digest"].startswith("not exposed")
