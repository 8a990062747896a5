#!/usr/bin/env python3
"""Two revisions of FutureQ and the peers in one interleaved run: before/after ratios.

Run from the repository root with the project's venv (``make install``)::

    .venv/bin/python -m bench.ab --base main~3 --systems fq3,rabbit3 --rounds 2

Absolute times on a shared machine drift by 2x from day to day, so a figure measured
yesterday is no baseline: this checks the base revision out (``git worktree add
--detach`` in a temporary directory, removed afterwards) and measures it and the working
tree round by round, each FutureQ server started with its revision's ``src`` first on
``PYTHONPATH`` (the benchmark's client is this tree's). Every system of
``bench.side_by_side`` is accepted; a FutureQ one (``fq1``, ``fq1s2``, ``fq3``,
``fq3s2``) is measured at both revisions, a peer once per round. A peer that is not
installed is skipped with a sentence.

Prints, per system and revision: one publish in flight p50/p99 (ms, pooled over the
rounds), the median batch-100 throughput (msgs/s), and the ratios new/base.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import side_by_side as sbs

ROOT = Path(__file__).resolve().parent.parent
FUTUREQ_SYSTEMS = ("fq1", "fq1s2", "fq3", "fq3s2")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the revision to compare with (git rev)")
    ap.add_argument("--systems", default="fq3,rabbit3", help="bench.side_by_side systems")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=5.0, help="throughput window (s)")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--lat-seconds", type=float, default=4.0, help="latency window (s)")
    ap.add_argument("--lat-warmup", type=float, default=0.5)
    ap.add_argument("--fq-window", type=int, default=None)
    ap.add_argument("--redis-window", type=int, default=32)
    ap.add_argument("--redis-multi-window", type=int, default=8)
    ap.add_argument("--rabbit-window", type=int, default=1000)
    ap.add_argument("--rabbit-erl-args", default="")
    return ap


def _imported_from(src: Path) -> str:
    """Where a server started with ``src`` first on PYTHONPATH imports futureq from."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, "-c", "import futureq; print(futureq.__file__)"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


@contextlib.contextmanager
def base_and_new_sources(base: str) -> Iterator[dict[str, Path]]:
    """``{"base": <a checkout of revision base>/src, "new": this tree's src}`` for the
    ``PYTHONPATH`` of servers; the checkout (``git worktree add --detach`` in a temporary
    directory) is removed afterwards.

    Raises:
        RuntimeError: a server given one of them on ``PYTHONPATH`` would import futureq
            from somewhere else (the two could not be told apart).
        subprocess.CalledProcessError: git could not check ``base`` out.
    """
    base_dir = Path(tempfile.mkdtemp(prefix="futureq-ab-"))
    checkout = base_dir / "base"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(checkout), base],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        sources = {"base": checkout / "src", "new": ROOT / "src"}
        for name, src in sources.items():
            found = _imported_from(src)
            if not found.startswith(str(src)):
                raise RuntimeError(
                    f"a server given PYTHONPATH={src} imports {found}: cannot tell {name} apart"
                )
        yield sources
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(checkout)],
            check=False, capture_output=True,
        )  # fmt: skip
        shutil.rmtree(base_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    systems, skipped = sbs.available_systems([s for s in args.systems.split(",") if s])
    for sentence in skipped:
        print(f"skipped: {sentence}")
    if not systems:
        print("nothing to measure")
        return 1
    try:
        with base_and_new_sources(args.base) as sources:
            _compare(args, systems, sources)
    except RuntimeError as exc:
        print(exc)
        return 1
    finally:
        os.environ.pop("PYTHONPATH", None)
    return 0


def _compare(args: argparse.Namespace, systems: list[str], sources: dict[str, Path]) -> None:
    runs = [
        (system, revision)
        for system in systems
        for revision in (("base", "new") if system in FUTUREQ_SYSTEMS else (None,))
    ]
    samples: dict[tuple[str, str | None], list[float]] = {run: [] for run in runs}
    rates: dict[tuple[str, str | None], list[float]] = {run: [] for run in runs}
    for round_ in range(args.rounds):
        for system, revision in runs:
            if revision is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = str(sources[revision])
            record: dict[str, Any] = sbs.measure(system, args)
            samples[(system, revision)] += record.get("_lat_samples", [])
            rates[(system, revision)].append(record["msgs_per_s"])
            lat = record.get("sync_latency", {})
            print(
                f"round {round_ + 1}: {system} {revision or ''}: p50 {lat.get('p50_ms')} "
                f"p99 {lat.get('p99_ms')} ms, {record['msgs_per_s']:,.0f} msgs/s",
                flush=True,
            )
    os.environ.pop("PYTHONPATH", None)
    print(f"\nbase {args.base}, new: the working tree; {args.rounds} round(s), interleaved")
    figures: dict[tuple[str, str | None], tuple[float, float, float]] = {}
    for run in runs:
        lat = sorted(samples[run])
        p50 = sbs.pct(lat, 50) if lat else float("nan")
        p99 = sbs.pct(lat, 99) if lat else float("nan")
        figures[run] = (p50, p99, statistics.median(rates[run]))
        system, revision = run
        print(
            f"{system:7} {revision or '':4}  p50 {p50:6.3f} ms  p99 {p99:6.3f} ms  "
            f"{figures[run][2]:>10,.0f} msgs/s"
        )
    for system in systems:
        if system in FUTUREQ_SYSTEMS:
            (b50, b99, brate), (n50, n99, nrate) = (
                figures[(system, "base")],
                figures[(system, "new")],
            )
            print(
                f"{system}: new/base p50 {n50 / b50:.2f}, p99 {n99 / b99:.2f}, "
                f"throughput {nrate / brate:.2f}"
            )


if __name__ == "__main__":
    sys.exit(main())
