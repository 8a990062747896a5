"""Where one publish's time goes, stage by stage, on 1 node or across 3.

One publish of one message (ack level quorum) in flight at a time, as
``bench.side_by_side``'s latency figure, against a fresh single node or 3-node cluster
whose processes record a timestamp (``time.monotonic_ns``, one clock for every process
on the machine) when the request reaches a stage: decoded, proposed, AppendEntries sent,
the log write handed to its worker thread, started and finished there and taken back on
the loop, received and stepped on each follower, applied, answered. The stages are
entries to and returns from the broker's own functions, wrapped in the node processes
by a ``sitecustomize`` this bench puts on their ``PYTHONPATH`` (``bench._hooks``);
nothing in ``src`` knows about it, and a wrapped function that no longer exists stops
the node, whose error names it.

For each request (the first and last 50 left out) it takes, on every process, the first
time each stage was reached after the request was decoded on the leader, and prints the
median and p90 of those offsets in µs, in order, with the step from the stage before.
The thread hand-off shows as the gap between "log write handed to thread" and "log write
started in thread" (and back); the wrapping costs a few µs per stage, so the total is a
little above ``bench.side_by_side``'s.

Usage::

    python -m bench.hop_trace [--nodes 1|3] [--seconds 3]
"""

from __future__ import annotations

import argparse
import atexit
import bisect
import functools
import importlib
import inspect
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

TRACE_DIR_ENV = "FUTUREQ_BENCH_HOP_TRACE_DIR"
"""Set in a node's environment: the directory its process writes ``<pid>.txt`` into."""

SKIP = 50
"""Requests left out at each end (warm-up, and the stop)."""

# (module, qualified attribute, when, stage); ``when``: "enter", "exit" or "both"
# ("... started" / "... finished"). A stage with {type} or {to} is named by the message
# (the last argument, or the return value on "exit") and its destination.
HOOKS: list[tuple[str, str, str, str]] = [
    ("futureq.broker.connection", "Connection._handle", "enter", "request decoded"),
    ("futureq.broker.command_log", "SingleNodeLog.propose", "enter", "proposed"),
    ("futureq.raft.node_driver", "start_op", "enter", "proposed"),
    ("futureq.raft.transport", "Transport._write_now", "enter", "sent {type} to {to}"),
    ("futureq.broker.command_log", "run_sync_quick", "both", "log write handed to thread"),
    ("futureq.raft.node_ready", "run_sync_quick", "both", "log write handed to thread"),
    ("futureq.broker.command_log", "SingleNodeLog._write_entries", "both", "log write in thread"),
    ("futureq.raft.rocks_storage", "RocksStorage.persist", "both", "log write in thread"),
    ("futureq.raft.transport", "decode_message", "exit", "received {type}"),
    ("futureq.raft.core", "RaftCore.step", "enter", "stepped {type}"),
    ("futureq.broker.command_log", "SingleNodeLog._apply_batch", "enter", "apply started"),
    ("futureq.raft.node_ready", "apply", "enter", "apply started"),
    ("futureq.storage.db", "Database.write", "both", "state write"),
    ("futureq.broker.connection", "Connection._reply", "enter", "answer queued"),
    ("futureq.broker.buffers", "Outbox.take", "exit", "answer taken by the writer"),
]

_events: list[tuple[int, str]] = []


def _flush() -> None:
    directory = os.environ.get(TRACE_DIR_ENV)
    if directory and _events:
        # A worker thread may record while this writes: take what is there, and remove
        # only that (``clear`` after the write lost what came in meanwhile).
        taken = _events[:]
        del _events[: len(taken)]
        with open(Path(directory) / f"{os.getpid()}.txt", "a") as out:
            out.writelines(f"{ns} {stage}\n" for ns, stage in taken)


def _record(stage: str) -> None:
    _events.append((time.monotonic_ns(), stage))
    if len(_events) >= 50_000:
        _flush()


def _named(stage: str, message: Any) -> str:
    if "{" not in stage:
        return stage
    return stage.format(type=type(message).__name__, to=getattr(message, "to_id", "?"))


def _wrap(function: Any, when: str, stage: str) -> Any:
    """``function`` recording ``stage`` on entry, return or both (see :data:`HOOKS`)."""
    start = f"{stage} started" if when == "both" else stage
    end = f"{stage} finished" if when == "both" else stage
    thread_write = stage == "log write in thread"

    def enter(args: tuple[Any, ...]) -> bool:
        if thread_write and not getattr(args[-1], "must_sync", True):
            return False  # a Raft commit-index-only write: unsynced, on the loop
        if when in ("enter", "both"):
            _record(_named(start, args[-1] if args else None))
        return True

    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def traced_async(*args: Any, **kwargs: Any) -> Any:
            counted = enter(args)
            result = await function(*args, **kwargs)
            if counted and when in ("exit", "both"):
                _record(_named(end, result))
            return result

        return traced_async

    @functools.wraps(function)
    def traced(*args: Any, **kwargs: Any) -> Any:
        counted = enter(args)
        result = function(*args, **kwargs)
        if counted and when in ("exit", "both"):
            _record(_named(end, result))
        return result

    return traced


def install() -> None:
    """Wrap every :data:`HOOKS` function (in a node process, at start-up: ``bench._hooks``).

    Raises:
        AttributeError: a hooked function no longer exists (renamed: update HOOKS).
    """
    for module_name, qualified, when, stage in HOOKS:
        module = importlib.import_module(module_name)
        owner: Any = module
        *path, name = qualified.split(".")
        for part in path:
            owner = getattr(owner, part)
        function = getattr(owner, name)
        setattr(owner, name, _wrap(function, when, stage))
    atexit.register(_flush)


def _load(directory: Path) -> dict[int, dict[str, list[int]]]:
    """Per process id, per stage, its sorted timestamps (ns)."""
    traces: dict[int, dict[str, list[int]]] = {}
    for path in directory.glob("*.txt"):
        stages: dict[str, list[int]] = defaultdict(list)
        for line in path.read_text().splitlines():
            ns, stage = line.split(" ", 1)
            stages[stage].append(int(ns))
        for times in stages.values():
            times.sort()
        traces[int(path.stem)] = stages
    return traces


def _first_after(times: list[int], t: int, before: int) -> int | None:
    i = bisect.bisect_left(times, t)
    return times[i] if i < len(times) and times[i] < before else None


def breakdown(traces: dict[int, dict[str, list[int]]], roles: dict[int, str]) -> list[str]:
    """The table: per (process, stage), median and p90 µs after the request was decoded."""
    leader = next(pid for pid, stages in traces.items() if stages.get("request decoded"))
    requests = traces[leader]["request decoded"]
    offsets: dict[tuple[int, str], list[float]] = defaultdict(list)
    for k in range(SKIP, len(requests) - SKIP):
        t0, t1 = requests[k], requests[k + 1]
        offsets[(leader, "next request decoded")].append((t1 - t0) / 1000)
        for pid, stages in traces.items():
            for stage, times in stages.items():
                at = _first_after(times, t0, t1)
                if at is not None:
                    offsets[(pid, stage)].append((at - t0) / 1000)
    kept = {
        key: sorted(v) for key, v in offsets.items() if len(v) >= (len(requests) - 2 * SKIP) // 2
    }
    rows = sorted(kept.items(), key=lambda item: statistics.median(item[1]))
    lines = [f"{'process':<10} {'stage':<44} {'p50 us':>8} {'step':>7} {'p90 us':>8}"]
    previous = 0.0
    for (pid, stage), values in rows:
        p50 = statistics.median(values)
        p90 = values[int(len(values) * 0.9)]
        lines.append(
            f"{roles.get(pid, str(pid)):<10} {stage:<44} {p50:8.1f} {p50 - previous:7.1f} {p90:8.1f}"
        )
        previous = p50
    return lines


def main(argv: list[str] | None = None) -> None:
    """Run one traced latency window and print the table."""
    parser = argparse.ArgumentParser(prog="python -m bench.hop_trace")
    parser.add_argument("--nodes", type=int, choices=(1, 3), default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    from bench import _cluster, _common
    from bench._hooks import hooked_env
    from bench.side_by_side import FqSync

    with tempfile.TemporaryDirectory(prefix="futureq-hop-trace-") as tmp:
        directory = Path(tmp)
        traces_dir = directory / "traces"
        traces_dir.mkdir()
        env = hooked_env(directory / "hooks", "bench.hop_trace", {TRACE_DIR_ENV: str(traces_dir)})
        roles: dict[int, str] = {}
        if args.nodes == 1:
            with _common.Server(env=env) as server:
                server.start()
                roles[server.pid] = "node"
                latencies = FqSync(server.client_address).latency(0.5, args.seconds)
        else:
            with _cluster.LocalCluster(3, env=env) as cluster:
                cluster.start()
                leader = cluster.leader()
                for node in cluster.nodes.values():
                    is_leader = node.node_id == leader.node_id
                    roles[node.pid] = "leader" if is_leader else f"node {node.node_id}"
                latencies = FqSync(leader.client_address).latency(0.5, args.seconds)
        traces = _load(traces_dir)
    if not traces:
        sys.exit("no traces were written: did the nodes stop gracefully?")
    latencies.sort()
    print(
        f"{args.nodes} node(s), one publish in flight for {args.seconds:g} s: "
        f"{len(latencies)} publishes, client p50 {statistics.median(latencies) * 1000:.0f} us "
        f"(traced; untraced is a little lower)"
    )
    print("\n".join(breakdown(traces, roles)))


if __name__ == "__main__":
    main()
