"""What CPython's cyclic garbage collector costs a single node under publish load.

A fresh single node per run, the load of ``bench.publish_throughput`` (``--batch`` items
per PUBLISH, ``--connections`` pipelined connections); inside the node a
``gc.callbacks`` hook (installed at start-up by ``bench._hooks``) times every
collection. For each young-generation threshold given (``--gen0``; the hook sets
``futureq.broker.gc_pacing.GEN0_THRESHOLD`` before the node starts pacing), rounds
interleaved, it prints msgs/s and, over the measured window only: the share of wall
time spent collecting, collections per generation, and the pauses longer than 5 ms.

Usage::

    python -m bench.gc_cost [--gen0 10000,100000] [--rounds 3] [--seconds 5]
        [--batch 100] [--connections 4]

Source: Python documentation, ``gc.callbacks`` and ``gc.set_threshold``.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from futureq.broker import gc_pacing

OUT_ENV = "FUTUREQ_BENCH_GC_OUT"
"""In the node: the file its collections are written to (JSON) when it exits."""
GEN0_ENV = "FUTUREQ_BENCH_GC_GEN0"
"""In the node: the young-generation threshold to pace with instead of the default."""
PAUSE_S = 0.005
"""Collections at least this long are listed one by one (s)."""

_collections: list[tuple[float, int, float]] = []
_started: dict[int, float] = {}


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    generation = info["generation"]
    now = time.monotonic()
    if phase == "start":
        _started[generation] = now
    elif generation in _started:
        begun = _started.pop(generation)
        _collections.append((begun, generation, now - begun))


def _write() -> None:
    with open(os.environ[OUT_ENV], "w") as out:
        json.dump(_collections, out)


def install() -> None:
    """In a node process (``bench._hooks``): time every collection; set the threshold."""
    gen0 = os.environ.get(GEN0_ENV)
    if gen0:
        gc_pacing.GEN0_THRESHOLD = int(gen0)
    gc.callbacks.append(_on_gc)
    atexit.register(_write)


def _run(gen0: int | None, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """One fresh node, one load window: its figures."""
    import trio

    from bench import publish_throughput
    from bench._common import Server
    from bench._hooks import hooked_env

    out = scratch / "collections.json"
    extra = {OUT_ENV: str(out)} | ({GEN0_ENV: str(gen0)} if gen0 is not None else {})
    with Server(env=hooked_env(scratch / "hooks", "bench.gc_cost", extra)) as server:
        server.start()
        began = time.monotonic()
        result = trio.run(
            publish_throughput._load, server, args.batch, args.connections, 1.0, args.seconds
        )
        ended = time.monotonic()
        window_start = ended - args.seconds  # _load returns right after its window
    collections = [c for c in json.loads(out.read_text()) if window_start <= c[0] < ended]
    assert began < window_start
    per_generation = [sum(1 for c in collections if c[1] == g) for g in range(3)]
    pauses = sorted((c[2] for c in collections if c[2] >= PAUSE_S), reverse=True)
    return {
        "msgs_per_s": result["msgs_per_s"],
        "gc_share": sum(c[2] for c in collections) / args.seconds,
        "collections": per_generation,
        "pauses_ms": [round(p * 1000, 1) for p in pauses],
    }


def main(argv: list[str] | None = None) -> None:
    """Run the rounds and print one line per run, then the medians."""
    parser = argparse.ArgumentParser(prog="python -m bench.gc_cost")
    parser.add_argument(
        "--gen0",
        default=f"10000,{gc_pacing.GEN0_THRESHOLD}",
        help="comma-separated thresholds (default: 10,000 and the one the broker ships)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--connections", type=int, default=4)
    args = parser.parse_args(argv)
    thresholds = [int(t) for t in args.gen0.split(",")]
    runs: dict[int, list[dict[str, Any]]] = {t: [] for t in thresholds}
    print(f"batch {args.batch}, {args.connections} connections, {args.seconds:g} s windows")
    for round_ in range(args.rounds):
        for threshold in thresholds:
            with tempfile.TemporaryDirectory(prefix="futureq-gc-cost-") as tmp:
                run = _run(threshold, args, Path(tmp))
            runs[threshold].append(run)
            pauses = run["pauses_ms"]
            print(
                f"round {round_ + 1} gen0 {threshold:>7}: {run['msgs_per_s']:>9,.0f} msgs/s, "
                f"GC {100 * run['gc_share']:5.1f} % of the window, collections "
                f"{'/'.join(map(str, run['collections']))} (gen 0/1/2), "
                f"{len(pauses)} pauses >= 5 ms (longest {max(pauses, default=0):.1f} ms)",
                flush=True,
            )
    for threshold, done in runs.items():
        print(
            f"median gen0 {threshold:>7}: "
            f"{statistics.median(r['msgs_per_s'] for r in done):>9,.0f} msgs/s, "
            f"GC {100 * statistics.median(r['gc_share'] for r in done):.1f} % of the window"
        )


if __name__ == "__main__":
    main()
