"""The nemesis: faults by name, injected on a schedule drawn from the run's seed.

Each fault applies itself, holds for a drawn duration, then heals itself; the schedule
alternates quiet gaps and faults until the workload ends, and :meth:`Nemesis.heal_all`
undoes whatever is still in place (restart dead nodes, SIGCONT paused ones, clear link
faults, drop file-size limits and fake clocks). Every fault records ``nemesis`` start and
stop events (and the cluster records ``node`` events), so the checker and the timeline
can place leader changes and redeliveries next to the faults.

A fault that cannot run in this setting (too few nodes, libfaketime missing, no
``cluster remove-node`` command) is skipped with a ``nemesis skip`` event; in CI
(``FUTUREQ_REQUIRE_FAKETIME=1``) a missing libfaketime fails the run instead.

Clock faults (``docs/architecture.md``, "Time"): ``clock-skew`` restarts a node with its
wall clock off; ``clock-step`` steps the wall clock of a running node (often the leader)
forwards or back, from a small step inside the bound to an hour, through the
libfaketime control file every node was started with (:class:`SteppableClock`).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import trio
from tests.jepsen_like.cluster import Cluster
from tests.jepsen_like.faketime import SteppableClock, faketime_library, offset_env
from tests.jepsen_like.history import History

#: RLIMIT_FSIZE of the disk-full fault (bytes): RocksDB's next log/SST file growth fails.
DISK_FULL_BYTES = 256 * 1024
#: Largest clock skew of the clock-skew fault (ms); the checker's offset allowance.
MAX_SKEW_MS = 300
#: Steps of the clock-step fault (s): inside the bound, just outside it, an hour.
CLOCK_STEPS_S = (0.1, 0.2, 2.0, 30.0, 3600.0)
#: Faults that need libfaketime.
CLOCK_FAULTS = ("clock-skew", "clock-step")


class Skip(Exception):
    """This fault cannot run here; the message says why."""


def steppable_clocks(root: Path, nodes: int, names: list[str]) -> dict[int, SteppableClock]:
    """One control file per node (ids 1..``nodes``, under ``root``) when the run steps
    clocks (``clock-step`` in ``names``), to be each node's environment from its first
    start; else none.

    Raises:
        FaketimeMissing: libfaketime is missing in CI.
    """
    library = faketime_library() if "clock-step" in names else None
    if library is None:
        return {}
    root.mkdir(parents=True, exist_ok=True)
    return {n: SteppableClock(library, root / f"clock-n{n}.rc") for n in range(1, nodes + 1)}


@attrs.frozen
class Fault:
    """One named fault.

    Attributes:
        name: What ``--nemesis`` calls it.
        text: One line for ``--nemesis list`` and the docs.
        min_nodes: Smallest cluster it makes sense on.
        min_shards: Fewest shards per node it makes sense with (faults of one shard
            process alone need a sharded node).
        apply: ``apply(nemesis, hold_s)`` injects it, holds ``hold_s`` seconds, heals;
            returns a detail string for the history.
    """

    name: str
    text: str
    min_nodes: int
    apply: Callable[[Nemesis, float], Awaitable[str]]
    min_shards: int = 1


class Nemesis:
    """Injects faults into one cluster.

    Args:
        cluster: The cluster to hurt.
        history: Receives ``nemesis`` events.
        rng: The schedule's randomness (seeded by the run).
        names: Faults to draw from (see :data:`FAULTS`).
        clocks: The nodes' clock control files (:func:`steppable_clocks`), if any.
    """

    def __init__(
        self,
        cluster: Cluster,
        history: History,
        rng: random.Random,
        names: list[str],
        clocks: dict[int, SteppableClock] | None = None,
    ) -> None:
        unknown = [name for name in names if name not in FAULTS]
        if unknown:
            raise ValueError(f"unknown nemesis {unknown}; known: {sorted(FAULTS)}")
        self.cluster = cluster
        self.history = history
        self.rng = rng
        self.names = names
        self.clocks = clocks or {}
        self.skew_ms = 0

    # ------------------------------------------------------------------ helpers

    def aim_shard(self) -> int:
        """The shard whose leader a fault aims at: drawn from the seed when the nodes
        are sharded (each shard's group has its own leader), else 0 (no draw, so an
        unsharded run's schedule is unchanged)."""
        if self.cluster.shards <= 1:
            return 0
        return self.rng.randrange(self.cluster.shards)

    async def leader(self, shard: int | None = None) -> int | None:
        """The current leader of ``shard`` (default: :meth:`aim_shard`), waiting up to
        10 s for one."""
        if shard is None:
            shard = self.aim_shard()
        with trio.move_on_after(10):
            while True:
                leader = await self.cluster.leader(shard=shard)
                if leader is not None:
                    return leader
                await trio.sleep(0.2)
        return None

    async def leader_or_skip(self, shard: int | None = None) -> int:
        leader = await self.leader(shard)
        if leader is None:
            raise Skip("no leader to aim at")
        return leader

    def others(self, node_id: int) -> list[int]:
        return [n for n in self.cluster.nodes if n != node_id]

    async def restart_quietly(self, node_id: int) -> None:
        """Start a node; a node that fails to start is recorded, not fatal."""
        try:
            await self.cluster.start_node(node_id)
        except RuntimeError as error:
            self.history.record("nemesis", phase="error", name="start", detail=str(error)[-500:])

    # ----------------------------------------------------------------- schedule

    async def run(
        self,
        *,
        quiet_s: tuple[float, float],
        hold_s: tuple[float, float],
        first: tuple[str, ...] = (),
    ) -> None:
        """Alternate quiet gaps and faults (drawn in order from the seed) until cancelled.

        Args:
            quiet_s: Range of the gap before each fault (s).
            hold_s: Range of how long each fault lasts (s).
            first: Faults to inject first, in this order, before the drawn ones (a
                short run on a slow machine may otherwise never reach a given fault).
        """
        for name in first:
            await trio.sleep(self.rng.uniform(*quiet_s))
            await self.inject(name, self.rng.uniform(*hold_s))
        while True:
            await trio.sleep(self.rng.uniform(*quiet_s))
            name = self.rng.choice(self.names)
            await self.inject(name, self.rng.uniform(*hold_s))

    async def inject(self, name: str, hold_s: float) -> None:
        """Run one fault by name, recording start/stop (or skip) events."""
        fault = FAULTS[name]
        if self.cluster.size < fault.min_nodes:
            self.history.record(
                "nemesis", phase="skip", name=name, detail=f"needs {fault.min_nodes} nodes"
            )
            return
        if self.cluster.shards < fault.min_shards:
            self.history.record(
                "nemesis", phase="skip", name=name, detail=f"needs --shards {fault.min_shards}"
            )
            return
        self.history.record("nemesis", phase="start", name=name, detail=f"hold {hold_s:.1f}s")
        try:
            detail = await fault.apply(self, hold_s)
        except Skip as why:
            self.history.record("nemesis", phase="skip", name=name, detail=str(why))
            return
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(60):
                await self.heal_all()
        self.history.record("nemesis", phase="stop", name=name, detail=detail)

    async def heal_all(self) -> None:
        """Undo every fault: heal links, SIGCONT, drop limits and fake clocks, restart."""
        self.cluster.links.heal()
        for clock in self.clocks.values():
            if clock.offset_s:
                clock.set(0.0)
        for node in self.cluster.nodes.values():
            node.resume()
            needs_restart = bool(node.env) or node.max_file_bytes is not None
            node.env = {}
            node.max_file_bytes = None
            if needs_restart and node.alive:
                self.cluster.kill(node.node_id)
            if not node.alive:
                await self.restart_quietly(node.node_id)
        self.skew_ms = 0


# ---------------------------------------------------------------------- faults


async def kill_leader(nemesis: Nemesis, hold_s: float) -> str:
    leader = await nemesis.leader_or_skip()
    nemesis.cluster.kill(leader)
    await trio.sleep(hold_s)
    await nemesis.restart_quietly(leader)
    return f"killed leader {leader}"


async def kill_follower(nemesis: Nemesis, hold_s: float) -> str:
    leader = await nemesis.leader_or_skip()
    victim = nemesis.rng.choice(nemesis.others(leader))
    nemesis.cluster.kill(victim)
    await trio.sleep(hold_s)
    await nemesis.restart_quietly(victim)
    return f"killed follower {victim}"


async def kill_majority(nemesis: Nemesis, hold_s: float) -> str:
    nodes = list(nemesis.cluster.nodes)
    victims = sorted(nemesis.rng.sample(nodes, len(nodes) // 2 + 1))
    for victim in victims:
        nemesis.cluster.kill(victim)
    await trio.sleep(hold_s)
    async with trio.open_nursery() as nursery:
        for victim in victims:
            nursery.start_soon(nemesis.restart_quietly, victim)
    return f"killed {victims}"


async def pause(nemesis: Nemesis, hold_s: float) -> str:
    leader = await nemesis.leader()
    nodes = list(nemesis.cluster.nodes)
    victim = (
        leader if leader is not None and nemesis.rng.random() < 0.6 else nemesis.rng.choice(nodes)
    )
    hold_s = max(hold_s, 3.0)  # longer than the election timeout (at most ~1 s)
    nemesis.cluster.pause(victim)
    await trio.sleep(hold_s)
    nemesis.cluster.resume(victim)
    role = "leader" if victim == leader else "node"
    return f"paused {role} {victim} for {hold_s:.1f}s"


async def partition_majority(nemesis: Nemesis, hold_s: float) -> str:
    nodes = list(nemesis.cluster.nodes)
    nemesis.rng.shuffle(nodes)
    minority, majority = sorted(nodes[: len(nodes) // 2]), sorted(nodes[len(nodes) // 2 :])
    nemesis.cluster.links.isolate(minority, majority)
    await trio.sleep(hold_s)
    return f"{minority} | {majority}"


async def partition_leader(nemesis: Nemesis, hold_s: float) -> str:
    leader = await nemesis.leader_or_skip()
    nemesis.cluster.links.isolate([leader], nemesis.others(leader))
    await trio.sleep(hold_s)
    return f"isolated leader {leader}"


async def partition_bridge(nemesis: Nemesis, hold_s: float) -> str:
    nodes = list(nemesis.cluster.nodes)
    nemesis.rng.shuffle(nodes)
    bridge, rest = nodes[0], nodes[1:]
    side_a, side_b = sorted(rest[: len(rest) // 2]), sorted(rest[len(rest) // 2 :])
    nemesis.cluster.links.isolate(side_a, side_b)
    await trio.sleep(hold_s)
    return f"{side_a} | {side_b}, bridge {bridge}"


async def partition_asymmetric(nemesis: Nemesis, hold_s: float) -> str:
    leader = await nemesis.leader_or_skip()
    for other in nemesis.others(leader):
        nemesis.cluster.links.cut(leader, other)  # the leader hears them; they don't hear it
    await trio.sleep(hold_s)
    return f"leader {leader} cannot send"


async def link_delay(nemesis: Nemesis, hold_s: float) -> str:
    delay_ms = nemesis.rng.uniform(50, 300)
    nemesis.cluster.links.set_all(delay_ms=delay_ms)
    await trio.sleep(hold_s)
    return f"{delay_ms:.0f} ms on every link"


async def link_loss(nemesis: Nemesis, hold_s: float) -> str:
    loss = nemesis.rng.uniform(0.1, 0.4)
    nemesis.cluster.links.set_all(loss=loss)
    await trio.sleep(hold_s)
    return f"{loss:.0%} frame loss on every link"


async def clock_skew(nemesis: Nemesis, hold_s: float) -> str:
    library = faketime_library()
    if library is None:
        raise Skip("libfaketime is not installed (apt-get install faketime libfaketime)")
    victim = nemesis.rng.choice(list(nemesis.cluster.nodes))
    skew_ms = nemesis.rng.choice([-1, 1]) * nemesis.rng.randint(50, MAX_SKEW_MS)
    node = nemesis.cluster.nodes[victim]
    node.env = offset_env(library, skew_ms / 1000)
    nemesis.skew_ms = skew_ms
    await nemesis.cluster.restart(victim)
    await trio.sleep(hold_s)
    return f"node {victim} clock {skew_ms:+d} ms"


async def clock_step(nemesis: Nemesis, hold_s: float) -> str:
    """Step a running node's wall clock (the leader 60 % of the time) forwards or back,
    hold, then step it back to true time."""
    if not nemesis.clocks:
        raise Skip("libfaketime is not installed (apt-get install faketime libfaketime)")
    leader = await nemesis.leader()
    nodes = list(nemesis.cluster.nodes)
    victim = (
        leader if leader is not None and nemesis.rng.random() < 0.6 else nemesis.rng.choice(nodes)
    )
    step_s = nemesis.rng.choice([-1, 1]) * nemesis.rng.choice(CLOCK_STEPS_S)
    nemesis.clocks[victim].step(step_s)
    await trio.sleep(hold_s)
    nemesis.clocks[victim].set(0.0)
    role = "leader" if victim == leader else "node"
    return f"{role} {victim} clock stepped {step_s:+g} s for {hold_s:.1f}s"


async def kill_shard(nemesis: Nemesis, hold_s: float) -> str:
    """SIGKILL one shard process alone (the leader of its group 60 % of the time); its
    node's supervisor restarts it while the node's other shards keep serving."""
    shard = nemesis.rng.randrange(nemesis.cluster.shards)
    leader = await nemesis.leader(shard)
    nodes = list(nemesis.cluster.nodes)
    victim = (
        leader if leader is not None and nemesis.rng.random() < 0.6 else nemesis.rng.choice(nodes)
    )
    pid = nemesis.cluster.kill_shard(victim, shard)
    await trio.sleep(hold_s)
    role = "leader" if victim == leader else "node"
    return f"killed shard {shard} (pid {pid}) of {role} {victim}; its supervisor restarts it"


async def pause_shard(nemesis: Nemesis, hold_s: float) -> str:
    """SIGSTOP one shard process alone (often its group's leader) >= 3 s, then SIGCONT."""
    shard = nemesis.rng.randrange(nemesis.cluster.shards)
    leader = await nemesis.leader(shard)
    nodes = list(nemesis.cluster.nodes)
    victim = (
        leader if leader is not None and nemesis.rng.random() < 0.6 else nemesis.rng.choice(nodes)
    )
    hold_s = max(hold_s, 3.0)
    nemesis.cluster.pause_shard(victim, shard)
    await trio.sleep(hold_s)
    nemesis.cluster.resume_shard(victim, shard)
    role = "leader" if victim == leader else "node"
    return f"paused shard {shard} of {role} {victim} for {hold_s:.1f}s"


async def rolling_restart(nemesis: Nemesis, hold_s: float) -> str:
    for node_id in list(nemesis.cluster.nodes):
        await nemesis.cluster.restart(node_id, graceful=True)
        await nemesis.cluster.wait_ready(timeout_s=20)
    return "every node restarted (SIGTERM)"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "futureq.cli.client_main", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ),
    )


async def remove_readd_node(nemesis: Nemesis, hold_s: float) -> str:
    if nemesis.cluster.shards > 1:
        # cluster add-node is refused on sharded nodes (docs/sharding.md): the node
        # would stay removed for the rest of the run.
        raise Skip("cluster add-node by hand is not supported on sharded nodes yet")
    leader = await nemesis.leader_or_skip()
    victim = nemesis.rng.choice(nemesis.others(leader))
    servers = ",".join(nemesis.cluster.servers)
    removed = await trio.to_thread.run_sync(
        _cli, "--server", servers, "cluster", "remove-node", str(victim)
    )
    if removed.returncode != 0:
        raise Skip(f"cluster remove-node failed: {removed.stderr.strip()[-300:]}")
    await trio.sleep(hold_s)
    node = nemesis.cluster.nodes[victim]
    raft_address = f"127.0.0.1:{node.raft_port}"
    added = await trio.to_thread.run_sync(
        _cli,
        "--server",
        servers,
        "cluster",
        "add-node",
        str(victim),
        raft_address,
        node.client_address,
    )
    return f"removed {victim}; add-node exit {added.returncode} {added.stderr.strip()[-200:]}"


async def disk_full(nemesis: Nemesis, hold_s: float) -> str:
    leader = await nemesis.leader()
    candidates = nemesis.others(leader) if leader is not None else list(nemesis.cluster.nodes)
    victim = nemesis.rng.choice(candidates or list(nemesis.cluster.nodes))
    nemesis.cluster.nodes[victim].max_file_bytes = DISK_FULL_BYTES
    nemesis.cluster.kill(victim)
    await nemesis.restart_quietly(victim)
    await trio.sleep(hold_s)
    return f"node {victim} with RLIMIT_FSIZE {DISK_FULL_BYTES} B"


#: How long a disk fault waits for its node to catch up before the next fault may start.
DISK_HEAL_TIMEOUT_S = 60.0


async def _wait_caught_up(nemesis: Nemesis, node_id: int) -> str:
    """Wait until ``node_id`` answers ``/readyz`` 200: it finished its recovery and
    applied what the leader committed. Disk faults come one at a time (docs/raft.md,
    "Disk faults"): the next may only start once this node holds everything again."""
    node = nemesis.cluster.nodes[node_id]
    with trio.move_on_after(DISK_HEAL_TIMEOUT_S):
        while not await node.ready():  # noqa: ASYNC110 - polls another process
            await trio.sleep(0.2)
        return "caught up"
    return f"not caught up after {DISK_HEAL_TIMEOUT_S:.0f}s"


async def wipe_node(nemesis: Nemesis, hold_s: float) -> str:
    victim = nemesis.rng.choice(list(nemesis.cluster.nodes))
    node = nemesis.cluster.nodes[victim]
    nemesis.cluster.kill(victim)
    shutil.rmtree(node.data_dir, ignore_errors=True)
    await nemesis.restart_quietly(victim)  # same --node-id and --peers, empty directory
    await trio.sleep(hold_s)
    return f"wiped node {victim}'s data directory; {await _wait_caught_up(nemesis, victim)}"


async def restore_old_copy(nemesis: Nemesis, hold_s: float) -> str:
    leader = await nemesis.leader()
    candidates = nemesis.others(leader) if leader is not None else list(nemesis.cluster.nodes)
    victim = nemesis.rng.choice(candidates)
    node = nemesis.cluster.nodes[victim]
    copy = node.data_dir.parent / f"n{victim}.old-copy"
    nemesis.cluster.kill(victim)  # a consistent copy needs the process stopped
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(node.data_dir, copy)
    await nemesis.restart_quietly(victim)
    await trio.sleep(hold_s)  # it acknowledges more than the copy holds
    nemesis.cluster.kill(victim)
    shutil.rmtree(node.data_dir, ignore_errors=True)
    shutil.copytree(copy, node.data_dir)
    await nemesis.restart_quietly(victim)
    return (
        f"node {victim} restarted from a copy {hold_s:.1f}s old; "
        f"{await _wait_caught_up(nemesis, victim)}"
    )


FAULTS: dict[str, Fault] = {
    fault.name: fault
    for fault in [
        Fault("kill-leader", "SIGKILL the leader, restart it after the hold", 1, kill_leader),
        Fault("kill-follower", "SIGKILL one follower, restart it after the hold", 2, kill_follower),
        Fault("kill-majority", "SIGKILL a majority, restart them after the hold", 1, kill_majority),
        Fault("pause", "SIGSTOP a node (often the leader) >= 3 s, then SIGCONT", 1, pause),
        Fault("partition-majority", "split into a minority and a majority", 3, partition_majority),
        Fault("partition-leader", "isolate the leader from every other node", 2, partition_leader),
        Fault("partition-bridge", "two halves that only a bridge node sees", 3, partition_bridge),
        Fault(
            "partition-asymmetric",
            "the leader can receive but not send",
            2,
            partition_asymmetric,
        ),
        Fault("link-delay", "50-300 ms delay on every Raft link", 2, link_delay),
        Fault("link-loss", "10-40 % frame loss on every Raft link", 2, link_loss),
        Fault(
            "clock-skew",
            f"restart a node with its clock off by 50-{MAX_SKEW_MS} ms (libfaketime)",
            1,
            clock_skew,
        ),
        Fault(
            "clock-step",
            "step a running node's clock (often the leader's) forwards or back by "
            f"{min(CLOCK_STEPS_S):g} s to {max(CLOCK_STEPS_S):g} s, then back (libfaketime)",
            1,
            clock_step,
        ),
        Fault("rolling-restart", "SIGTERM and restart every node in turn", 1, rolling_restart),
        Fault(
            "kill-shard",
            "SIGKILL one shard process alone (often its leader); its supervisor restarts it",
            1,
            kill_shard,
            min_shards=2,
        ),
        Fault(
            "pause-shard",
            "SIGSTOP one shard process alone (often its leader) >= 3 s, then SIGCONT",
            1,
            pause_shard,
            min_shards=2,
        ),
        Fault(
            "remove-readd-node",
            "futureq-cli cluster remove-node a follower, then add-node it back",
            3,
            remove_readd_node,
        ),
        Fault(
            "disk-full",
            f"restart a follower with a {DISK_FULL_BYTES // 1024} KiB file-size limit",
            1,
            disk_full,
        ),
        Fault(
            "wipe-node",
            "SIGKILL a node, delete its data directory, start it again with the same id",
            3,
            wipe_node,
        ),
        Fault(
            "restore-old-copy",
            "copy a follower's data directory, let it acknowledge more, put the copy back",
            3,
            restore_old_copy,
        ),
    ]
}

#: The standard mixed run (``make jepsen``).
MIXED = [
    "kill-leader",
    "kill-follower",
    "kill-majority",
    "pause",
    "partition-majority",
    "partition-leader",
    "partition-bridge",
    "partition-asymmetric",
    "link-delay",
    "link-loss",
    "rolling-restart",
    "clock-skew",
    "clock-step",
    "wipe-node",
    "restore-old-copy",
]
#: ``mixed`` on sharded nodes (``--shards`` above 1): also one shard process alone.
MIXED_SHARDS = [*MIXED, "kill-shard", "pause-shard"]
