"""``python -m tests.jepsen_like``: run the harness, or re-check a saved history.

::

    python -m tests.jepsen_like run --nodes 3 --time 60 --nemesis kill-leader,pause \\
        --seed 7 --rate 20 --out /tmp/jepsen-7
    python -m tests.jepsen_like run --nemesis list
    python -m tests.jepsen_like check /tmp/jepsen-7

Exit codes: 0 every must-be-zero count is zero; 1 a violation was found; 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import trio
from tests.jepsen_like import report
from tests.jepsen_like.checker import check
from tests.jepsen_like.faketime import faketime_library
from tests.jepsen_like.history import read_history
from tests.jepsen_like.nemesis import CLOCK_FAULTS, FAULTS, MIXED, MIXED_SHARDS
from tests.jepsen_like.runner import RunOptions, run


def _seconds_range(text: str) -> tuple[float, float]:
    """``MIN,MAX`` seconds (``--quiet``, ``--hold``)."""
    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not MIN,MAX in seconds, e.g. 3,8") from None
    if not 0 <= low <= high:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 <= MIN <= MAX")
    return (low, high)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.jepsen_like")
    commands = parser.add_subparsers(dest="command", required=True)
    run_cmd = commands.add_parser("run", help="run a cluster under a workload and a nemesis")
    run_cmd.add_argument("--nodes", type=int, default=3, help="cluster size (default 3)")
    run_cmd.add_argument(
        "--shards",
        type=int,
        default=1,
        help="shard processes per node (futureq start --shards); 'mixed' then also kills "
        "and pauses single shard processes. Default 1, not futureq start's auto (one per "
        "core): a seed must replay the same run on any machine, and CI's jepsen-ci "
        "selection (3 nodes on 2 cores) must stay within its time; give --shards 2 for "
        "sharded nodes",
    )
    run_cmd.add_argument("--time", type=float, default=60.0, help="workload seconds (default 60)")
    run_cmd.add_argument(
        "--nemesis",
        default="mixed",
        help="comma-separated faults, 'mixed' (default), 'none', or 'list' to name them",
    )
    run_cmd.add_argument("--seed", type=int, default=None, help="seed (default: random)")
    run_cmd.add_argument("--rate", type=float, default=20.0, help="publish ops/s (default 20)")
    run_cmd.add_argument("--out", type=Path, default=None, help="output dir (default: a temp dir)")
    run_cmd.add_argument(
        "--ack-level",
        choices=("quorum", "leader", "none"),
        default="quorum",
        help="publish ack level; 'none' and 'leader' are unsafe settings for checking the checker",
    )
    run_cmd.add_argument(
        "--quiet",
        type=_seconds_range,
        default=(2.0, 5.0),
        metavar="MIN,MAX",
        help="seconds between two faults, drawn from this range (default 2,5)",
    )
    run_cmd.add_argument(
        "--hold",
        type=_seconds_range,
        default=(3.0, 8.0),
        metavar="MIN,MAX",
        help="seconds each fault is held, drawn from this range (default 3,8)",
    )
    run_cmd.add_argument(
        "--nemesis-first",
        default="",
        metavar="NAME[,NAME...]",
        help="faults to inject first, in this order, before the drawn ones",
    )
    run_cmd.add_argument("--drain-timeout", type=float, default=60.0, help="longest drain (s)")
    run_cmd.add_argument("--log-level", default="info", help="nodes' --log-level")
    check_cmd = commands.add_parser("check", help="check a saved run directory again")
    check_cmd.add_argument("dir", type=Path)
    return parser


def _list_faults() -> None:
    for fault in FAULTS.values():
        note = ""
        if fault.name in CLOCK_FAULTS and faketime_library() is None:
            note = "  [skipped here: libfaketime not installed]"
        if fault.min_shards > 1:
            note += f"  [needs --shards {fault.min_shards}]"
        print(f"{fault.name:22} (>= {fault.min_nodes} nodes)  {fault.text}{note}")
    print(f"{'mixed':22} {','.join(MIXED)}")
    print(f"{'mixed (--shards > 1)':22} {','.join(MIXED_SHARDS)}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = _parser().parse_args(argv)
    if args.command == "check":
        events = list(read_history(args.dir / "history.jsonl"))
        summary = check(events).summary()
        report.print_table(summary)
        return 0 if summary["ok"] else 1
    if args.nemesis == "list":
        _list_faults()
        return 0
    if args.shards < 1:
        print("--shards must be 1 or more", file=sys.stderr)
        return 2
    mixed = MIXED_SHARDS if args.shards > 1 else MIXED
    names = {"mixed": list(mixed), "none": []}.get(args.nemesis)
    if names is None:
        names = [name.strip() for name in args.nemesis.split(",") if name.strip()]
    first = [name.strip() for name in args.nemesis_first.split(",") if name.strip()]
    unknown = [name for name in [*names, *first] if name not in FAULTS]
    if unknown:
        print(f"unknown nemesis {unknown}; try --nemesis list", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(3))
    out = args.out or Path(tempfile.mkdtemp(prefix=f"jepsen-{seed}-"))
    options = RunOptions(
        out=out,
        nodes=args.nodes,
        shards=args.shards,
        time_s=args.time,
        nemesis=tuple(names),
        seed=seed,
        rate=args.rate,
        ack_level=args.ack_level,
        quiet_s=args.quiet,
        hold_s=args.hold,
        nemesis_first=tuple(first),
        drain_timeout_s=args.drain_timeout,
        log_level=args.log_level,
    )
    print(f"seed {seed}; output in {out}", flush=True)
    print(f"reproduce: {options.command()}", flush=True)
    outcome = trio.run(run, options)
    report.print_table(outcome.summary)
    if outcome.summary["failures"]:
        print("FAILURES: " + json.dumps(outcome.summary["failures"]))
        for name in outcome.summary["failures"]:
            for example in outcome.summary["examples"].get(name, [])[:3]:
                print(f"  {name}: {json.dumps(example)}")
    for name, value in outcome.summary.get("warnings", {}).items():
        print(f"WARNING: {name} {value} (not lost: every up-to-date node still held them)")
        for example in outcome.summary["examples"].get(name, [])[:3]:
            print(f"  {name}: {json.dumps(example)}")
    print(
        f"history: {out / 'history.jsonl'}  summary: {out / 'summary.json'}  timeline: {out / 'timeline.html'}"
    )
    print(f"seed {seed}; reproduce: {options.command()}")
    return 0 if outcome.summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
