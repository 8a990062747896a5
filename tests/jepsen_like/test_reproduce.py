"""The reproduce command a run prints rebuilds the same run options."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from tests.jepsen_like.__main__ import _parser
from tests.jepsen_like.runner import RunOptions


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
        drain_timeout_s=args.drain_timeout,
    )
    assert rebuilt == options


def test_a_bad_range_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "--hold", "5,3"])
    assert "MIN <= MAX" in capsys.readouterr().err
