"""CPU cost per published message of the broker's hot path, in-process (no server).

Every node of a cluster applies every PUBLISH batch, so what one message costs to
validate and apply bounds a node's throughput. This measures, on one thread:

* ``validate``: :func:`futureq.wire.validation.validate_publish_items_in_steps` of a
  batch of raw wire items (the leader only);
* ``encode``: :func:`futureq.state.commands.encode` of the validated batch (the leader);
* ``apply_list``: ``QueueState.apply_steps`` given the command list, as a single node
  applies what it proposed;
* ``apply_bytes``: the same given only the bytes (decoded inside), as a Raft node, leader
  or follower, applies a committed entry.

Both applies write to a real RocksDB in a temporary directory, with the broker's
:class:`~futureq.broker.dispatcher.Dispatcher` as schedule observer (no consumer
attached) unless ``--no-observer``. Items are ``--payload-bytes`` payloads to one topic
(``--topics`` topics round-robin), due in a minute, without TTL (``--ttl-ms`` to give
one). Each figure is CPU time of the measuring thread (``time.thread_time``), the median
over ``--rounds`` rounds of ``--batches`` batches.

Usage::

    python -m bench.apply_cost [--items 100] [--batches 500] [--rounds 5]

To compare with another checkout, run it with ``PYTHONPATH=<checkout>/src`` in between
(the machine is noisy: interleave the runs and compare medians).

Figures: CPU microseconds per message for each path, and per batch.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import futureq
from futureq.broker.dispatcher import Dispatcher
from futureq.broker.hub import Hub
from futureq.clock import SystemClock
from futureq.config import QueueSection
from futureq.state import commands
from futureq.state.queue_state import QueueState
from futureq.storage.db import Database
from futureq.wire import validation

PUBLISH_MS = 1_800_000_000_000
"""The leader's stamp of every batch (a fixed, plausible wall time in ms)."""
DELAY_MS = 60_000


def _raw_items(count: int, topics: int, payload_bytes: int, ttl_ms: int | None) -> list[Any]:
    """Wire items ``[topic, payload, delay_ms, deliver_at_ms, ttl_ms]`` as a client sends."""
    return [
        [f"bench.t{i % topics}", bytes([i % 256]) * payload_bytes, DELAY_MS, None, ttl_ms]
        for i in range(count)
    ]


def _time_rounds(run: Callable[[], None], batches: int, rounds: int) -> list[float]:
    """CPU seconds of this thread per batch, each round (RocksDB's background threads
    and other processes on the machine are left out)."""
    run()  # warm up (first batch creates the groups)
    out = []
    for _ in range(rounds):
        started = time.thread_time()
        for _ in range(batches):
            run()
        out.append((time.thread_time() - started) / batches)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--items", type=int, default=100, help="items per batch")
    parser.add_argument("--batches", type=int, default=500, help="batches per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--topics", type=int, default=1, help="distinct topics per batch")
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--ttl-ms", type=int, default=None)
    parser.add_argument("--no-observer", action="store_true", help="apply without a dispatcher")
    args = parser.parse_args()

    raw = _raw_items(args.items, args.topics, args.payload_bytes, args.ttl_ms)
    limits = validation.Limits()
    validated: list[validation.ValidItem] = []

    def validate() -> None:
        validated.clear()
        for _ in validation.validate_publish_items_in_steps(raw, limits, PUBLISH_MS, validated):
            pass

    validate()
    command = commands.publish_command(PUBLISH_MS, list(validated))
    data = commands.encode(command)

    def encode() -> None:
        commands.encode(commands.publish_command(PUBLISH_MS, validated))

    figures: dict[str, list[float]] = {
        "validate": _time_rounds(validate, args.batches, args.rounds),
        "encode": _time_rounds(encode, args.batches, args.rounds),
    }
    with tempfile.TemporaryDirectory(prefix="futureq-apply-cost-") as path:
        db = Database(path)
        try:
            state = QueueState(db)
            if not args.no_observer:
                dispatcher = Dispatcher(state, None, Hub(), SystemClock(), QueueSection())  # type: ignore[arg-type]
                state.observer = dispatcher

            def apply_list() -> None:
                state.apply(state.applied_index + 1, data, command)

            def apply_bytes() -> None:
                state.apply(state.applied_index + 1, data)

            figures["apply_list"] = _time_rounds(apply_list, args.batches, args.rounds)
            figures["apply_bytes"] = _time_rounds(apply_bytes, args.batches, args.rounds)
        finally:
            db.close()

    print(
        f"futureq {futureq.__version__} from {futureq.__file__}: {args.items} items of "
        f"{args.payload_bytes} B, {args.topics} topic(s), ttl {args.ttl_ms}, "
        f"observer {'off' if args.no_observer else 'dispatcher'}; "
        f"median of {args.rounds} rounds of {args.batches} batches"
    )
    for name, per_batch in figures.items():
        median = statistics.median(per_batch)
        spread = ", ".join(f"{value / args.items * 1e6:.2f}" for value in per_batch)
        print(
            f"{name:12s} {median / args.items * 1e6:7.2f} us/message"
            f"  {median * 1e6:8.1f} us/batch  (rounds: {spread})"
        )


if __name__ == "__main__":
    main()
