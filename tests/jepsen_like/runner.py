"""One run: start a cluster, drive the workload under the nemesis, heal, drain, check.

Phases (each marked by a ``run`` event in the history):

1. ``start``: the cluster is up with a leader; every group is created.
2. workload + nemesis for ``time_s`` seconds; leader observations every 250 ms.
3. ``workload_end``: producers stop; every fault is healed (``healed``) and the cluster
   is ready again.
4. drain: consumers (now all acking) run until every required message has reached
   every target group, at least ``max_delay_ms`` + 1 s after the
   workload ended and at most ``drain_timeout_s``; then ``drain_end``.
5. Raft-level checks from every node's ``/api/status`` (applied index, and the
   ``applied_digest`` / ``term`` fields when the nodes expose them).
6. When a required delivery is still missing: the nodes are stopped and each one's
   RocksDB is read (``evidence.py``) for the missing schedule entries, one ``state``
   event per node, so the checker can tell lost from undelivered.
7. The checker's verdicts go to ``summary.json``, a table, and ``timeline.html``.
"""

from __future__ import annotations

import json
import random
import shlex
import sys
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio
from tests.jepsen_like import report
from tests.jepsen_like.checker import CheckConfig, CheckResult, Outstanding, check
from tests.jepsen_like.cluster import Cluster, open_cluster
from tests.jepsen_like.evidence import read_holdings
from tests.jepsen_like.history import History
from tests.jepsen_like.nemesis import CLOCK_FAULTS, MAX_SKEW_MS, Nemesis, steppable_clocks
from tests.jepsen_like.workload import Workload, WorkloadConfig

from futureq.shards.slots import SlotMap, even_map

LEADER_POLL_S = 0.25


def shard_of(topic: str, shards: int) -> int:
    """The shard owning ``topic`` on nodes of ``shards`` shards (the fixed even map)."""
    return _slot_map(shards).shard_of(topic)


def _slot_map(shards: int) -> SlotMap:
    return even_map([f"127.0.0.1:{k}" for k in range(shards)])


DRAIN_POLL_S = 1.0


@attrs.frozen
class RunOptions:
    """Everything that defines a run; with the same seed the schedule is the same.

    Attributes:
        out: Output directory (history.jsonl, summary.json, timeline.html, cluster/).
        nodes: Cluster size.
        time_s: Workload duration (s).
        nemesis: Fault names (empty: no faults).
        seed: Seed of every random choice of the harness.
        rate: Publish operations per second.
        ack_level: ``quorum`` (default), ``leader`` or ``none`` (unsafe).
        quiet_s, hold_s: Ranges of the nemesis gaps and fault durations (s).
        nemesis_first: Faults injected first, in order, before the drawn ones.
        drain_timeout_s: Longest drain (s).
        log_level: Nodes' ``--log-level``.
        shards: Nodes' ``--shards`` (shard processes per node, ``docs/sharding.md``).
    """

    out: Path
    nodes: int = 3
    time_s: float = 60.0
    nemesis: tuple[str, ...] = ()
    seed: int = 1
    rate: float = 20.0
    ack_level: str = "quorum"
    quiet_s: tuple[float, float] = (2.0, 5.0)
    hold_s: tuple[float, float] = (3.0, 8.0)
    nemesis_first: tuple[str, ...] = ()
    drain_timeout_s: float = 60.0
    log_level: str = "info"
    shards: int = 1

    def command(self) -> str:
        """The shell command that reproduces this run."""
        args = [
            sys.executable,
            "-m",
            "tests.jepsen_like",
            "run",
            "--nodes",
            str(self.nodes),
            *(["--shards", str(self.shards)] if self.shards > 1 else []),
            "--time",
            f"{self.time_s:g}",
            "--nemesis",
            ",".join(self.nemesis) or "none",
            "--seed",
            str(self.seed),
            "--rate",
            f"{self.rate:g}",
            "--out",
            str(self.out),
        ]
        if self.ack_level != "quorum":
            args += ["--ack-level", self.ack_level]
        defaults = RunOptions(out=self.out)
        if self.quiet_s != defaults.quiet_s:
            args += ["--quiet", ",".join(f"{s:g}" for s in self.quiet_s)]
        if self.hold_s != defaults.hold_s:
            args += ["--hold", ",".join(f"{s:g}" for s in self.hold_s)]
        if self.nemesis_first:
            args += ["--nemesis-first", ",".join(self.nemesis_first)]
        if self.drain_timeout_s != defaults.drain_timeout_s:
            args += ["--drain-timeout", f"{self.drain_timeout_s:g}"]
        return shlex.join(args)


@attrs.define
class RunOutcome:
    """What a run produced."""

    result: CheckResult
    summary: dict[str, Any]
    out: Path


async def _poll_leaders(cluster: Cluster) -> None:
    while True:
        await cluster.leaders()
        await trio.sleep(LEADER_POLL_S)


LOOP_WATCH_S = 0.1
"""How often the harness checks that its own event loop is not held up (s)."""
LOOP_STALL_MS = 250
"""A wake-up this late (ms) is recorded as a stall of the harness: the Raft link proxies
run on the same loop, so every link stalled as long (about half an election timeout)."""


async def _watch_loop(history: History, stalls: list[float]) -> None:
    """Record every stall of the harness's own event loop (``harness`` events).

    A node's election timeout is 500 ms; a harness too starved to forward frames for
    that long makes leaders lose their quorum, which is the harness's fault, not the
    cluster's. The summary reports how many stalls and the longest, so a run on a
    loaded machine can be told from a cluster that cannot keep a leader.
    """
    while True:
        before = trio.current_time()
        await trio.sleep(LOOP_WATCH_S)
        late_ms = (trio.current_time() - before - LOOP_WATCH_S) * 1000
        if late_ms >= LOOP_STALL_MS:
            stalls.append(late_ms)
            history.record("harness", stall_ms=round(late_ms, 1))


async def _raft_checks(cluster: Cluster) -> dict[str, Any]:
    """Compare what the nodes report about their own state once everything settled;
    on sharded nodes shard by shard (each shard's group separately), under
    ``"shards"``, with ``applied_index_equal`` / ``applied_digest_equal`` false when
    they are false for any shard."""
    if cluster.shards <= 1:
        return await _raft_checks_of(cluster, 0)
    per_shard = {str(k): await _raft_checks_of(cluster, k) for k in range(cluster.shards)}
    checks: dict[str, Any] = {"shards": per_shard}
    for name in ("applied_index_equal", "applied_digest_equal"):
        values = [c[name] for c in per_shard.values() if name in c]
        if values:
            checks[name] = all(values)
    return checks


async def _raft_checks_of(cluster: Cluster, shard: int) -> dict[str, Any]:
    with trio.move_on_after(20):
        while True:
            statuses = await cluster.statuses(shard)
            applied = {n: s.get("applied_index") for n, s in statuses.items()}
            if len(statuses) == cluster.size and len(set(applied.values())) == 1:
                break
            await trio.sleep(0.5)
    statuses = await cluster.statuses(shard)
    checks: dict[str, Any] = {
        "answered": sorted(statuses),
        "applied_index": {str(n): s.get("applied_index") for n, s in statuses.items()},
        "applied_index_equal": len({s.get("applied_index") for s in statuses.values()}) <= 1,
    }
    checks.update(compare_digests(statuses))
    return checks


def compare_digests(statuses: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """``applied_digest`` (per node), ``applied_digest_equal`` and what was compared.

    The digest chains every applied entry, so only nodes at the same applied index are
    compared: a node one entry ahead always differs (it may have applied an entry the
    others learn is committed with the next heartbeat).
    """
    digests = {str(n): s["applied_digest"] for n, s in statuses.items() if "applied_digest" in s}
    if not digests:
        return {"applied_digest": "not exposed by /api/status (skipped)"}
    by_index: dict[Any, set[int]] = {}
    for status in statuses.values():
        if "applied_digest" in status:
            by_index.setdefault(status.get("applied_index"), set()).add(status["applied_digest"])
    return {
        "applied_digest": digests,
        "applied_digest_equal": all(len(found) == 1 for found in by_index.values()),
        "applied_digest_compared": (
            "all nodes" if len(by_index) == 1 else "nodes at the same applied index only"
        ),
    }


async def _drain(workload: Workload, history: History, options: RunOptions) -> Outstanding:
    """Wait until no required delivery is missing, within the bounds.

    Returns:
        The tracker, up to date with the history at the end of the drain.
    """
    workload.draining = True
    outstanding = Outstanding()
    earliest = trio.current_time() + WorkloadConfig().max_delay_ms / 1000 + 1.0
    with trio.move_on_after(options.drain_timeout_s):
        while True:
            await trio.sleep(DRAIN_POLL_S)
            if trio.current_time() < earliest:
                continue
            # Incremental: this loop also runs every Raft link's proxy, so a poll must
            # stay short (a full check of a long history would stall every link).
            outstanding.update(history.events)
            # Not "unsettled": an ack applied whose answer was lost leaves a message
            # delivered, never acked ok, and rightly never redelivered.
            if not outstanding.missing(history.events[-1]["t"]):
                break
    outstanding.update(history.events)
    return outstanding


def _record_node_states(
    cluster: Cluster, history: History, missing: list[tuple[str, list[int], str, str]]
) -> None:
    """One ``state`` event per node: what its RocksDB holds of the missing deliveries.

    Called after every node process stopped (``evidence.py`` reads the directories).
    """
    wanted = [(mid, topic, group) for _key, ids, topic, group in missing for mid in ids]
    for node_id, node in sorted(cluster.nodes.items()):
        assert not node.alive, f"node {node_id} still runs; its data is read only once stopped"
        if cluster.shards <= 1:
            history.record("state", node_id=node_id, **read_holdings(node.data_dir, wanted))
            continue
        # Message ids are per shard: each shard's directory is asked for its topics only.
        for shard in range(cluster.shards):
            mine = [w for w in wanted if shard_of(w[1], cluster.shards) == shard]
            holdings = read_holdings(node.data_dir / f"shard-{shard}", mine)
            history.record("state", node_id=node_id, shard=shard, **holdings)


async def run(options: RunOptions) -> RunOutcome:
    """Do one run (see the module docstring) and write its files under ``options.out``.

    Returns:
        The checker's result, the summary dict (also in ``summary.json``) and the
        output directory.

    Raises:
        RuntimeError: the cluster did not start.
    """
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    history = History(out / "history.jsonl")
    rng = random.Random(options.seed)
    config = WorkloadConfig(rate=options.rate, ack_level=options.ack_level, shards=options.shards)
    raft: dict[str, Any] = {}
    missing: list[tuple[str, list[int], str, str]] = []
    started = trio.current_time()
    stalls: list[float] = []
    try:
        clocks = steppable_clocks(out / "cluster", options.nodes, list(options.nemesis))
        async with open_cluster(
            out / "cluster",
            options.nodes,
            rng=random.Random(rng.random()),
            history=history,
            log_level=options.log_level,
            node_env={node_id: clock.env() for node_id, clock in clocks.items()},
            shards=options.shards,
        ) as cluster:
            nemesis = Nemesis(
                cluster, history, random.Random(rng.random()), list(options.nemesis), clocks
            )
            workload = Workload(cluster.servers, history, random.Random(rng.random()), config)
            await workload.setup()
            history.record(
                "run",
                phase="start",
                topics=workload.topics,
                seed=options.seed,
                nodes=options.nodes,
                **(
                    {
                        "shards": options.shards,
                        "topic_shards": {t: shard_of(t, options.shards) for t in workload.topics},
                    }
                    if options.shards > 1
                    else {}
                ),
                nemesis=list(options.nemesis),
                rate=options.rate,
                ack_level=options.ack_level,
                command=options.command(),
            )
            async with trio.open_nursery() as background:
                background.start_soon(_poll_leaders, cluster)
                background.start_soon(_watch_loop, history, stalls)
                background.start_soon(workload.run_consumers)
                with trio.move_on_after(options.time_s):
                    async with trio.open_nursery() as phase:
                        phase.start_soon(workload.run_producers)
                        phase.start_soon(workload.run_churner)
                        if options.nemesis:
                            phase.start_soon(
                                partial(
                                    nemesis.run,
                                    quiet_s=options.quiet_s,
                                    hold_s=options.hold_s,
                                    first=options.nemesis_first,
                                )
                            )
                history.record("run", phase="workload_end")
                await nemesis.heal_all()
                await cluster.wait_ready(timeout_s=30)
                await workload.restore_churned()
                history.record("run", phase="healed")
                outstanding = await _drain(workload, history, options)
                drain_end = history.record("run", phase="drain_end")
                workload.record_buffered()
                missing = outstanding.missing(drain_end["t"])
                workload.stop()
                history.flush()
                raft = await _raft_checks(cluster)
                background.cancel_scope.cancel()
            if missing:
                cluster.stop_all()
                _record_node_states(cluster, history, missing)
    finally:
        history.close()
    # Cluster time keeps releases on true time whatever one node's clock says; the
    # allowance for clock faults is still the largest skew, far inside the stated bound.
    clock_faults = any(name in CLOCK_FAULTS for name in options.nemesis)
    allowed = 5.0 + (MAX_SKEW_MS if clock_faults else 0)
    result = check(history.events, CheckConfig(allowed_offset_ms=allowed))
    summary = result.summary()
    summary.update(
        seed=options.seed,
        nodes=options.nodes,
        shards=options.shards,
        time_s=options.time_s,
        nemesis=list(options.nemesis),
        rate=options.rate,
        ack_level=options.ack_level,
        raft=raft,
        reproduce=options.command(),
        wall_s=round(trio.current_time() - started, 1),
        harness_stalls=len(stalls),
        harness_stall_ms_max=round(max(stalls, default=0.0), 1),
        harness_stall_ms_total=round(sum(stalls), 1),
    )
    if raft.get("applied_digest_equal") is False:
        summary["failures"]["applied_digest_differs"] = 1
        summary["ok"] = False
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    report.write_timeline(history.events, summary, out / "timeline.html")
    return RunOutcome(result=result, summary=summary, out=out)
