"""Several Raft groups side by side on the same simulated nodes and network (issue 15).

A sharded FutureQ node runs one Raft group per shard, all with the same members, and
the shards of two nodes talk over the same machines' network (``docs/sharding.md``).
:class:`ShardedSimCluster` simulates that: ``groups`` :class:`~harness.SimCluster`
instances, each with its own cores, storage, state machines, proposals and
:class:`~harness.Checker`, over **one** :class:`~harness.SimNetwork` whose messages are
tagged with their group, and under **one** fault schedule:

* network faults (partitions, one-way cuts, bridges, heal) cut a link for every group;
* a node crash or restart is the whole machine: every group's member on it;
* a *shard crash* stops one group's member on a node alone (a shard process killed on
  its own; its supervisor restarts it later with a ``restart``);
* leader isolation aims at the leader of a group drawn from the seed.

Each group's safety properties are checked after every step by its own checker, and
after the run the network heals, every member restarts and every group must commit a
proposal on all its members (liveness), then keep every acknowledged proposal.
Everything random comes from the seed, so a seed replays exactly.
"""

from __future__ import annotations

import random

import attrs
from harness import InvariantViolation, Scenario, SimCluster, SimNetwork, SimNode

from futureq.raft.core import ProposalDroppedError, RaftNotLeaderError
from futureq.raft.messages import LogIndex, Message, NodeId, Term


@attrs.frozen
class Tagged:
    """A message of group ``group`` on the shared network (``from_id``/``to_id`` are the
    nodes, so link faults apply to every group alike)."""

    group: int
    message: Message

    @property
    def from_id(self) -> NodeId:
        return self.message.from_id

    @property
    def to_id(self) -> NodeId:
        return self.message.to_id


class GroupPort:
    """What one group's :class:`SimCluster` sees as its network: sends go onto the shared
    network tagged with the group; faults are applied by :class:`ShardedSimCluster`."""

    def __init__(self, shared: SimNetwork, group: int) -> None:
        self.shared = shared
        self.group = group

    def send(self, message: Message, now: int) -> None:
        self.shared.send(Tagged(self.group, message), now)  # type: ignore[arg-type]


SHARD_SCENARIOS: tuple[Scenario, ...] = (
    Scenario("shards_lossy3", drop_rate=0.05, duplicate_rate=0.03, max_delay_ticks=4,
             partitions=True, crashes=True, fault_rate=0.08, steps=300),
    Scenario("shards_crash5", voters=5, crashes=True, max_crashed=2, partitions=True,
             drop_rate=0.03, fault_rate=0.1, compaction_every=8, transfers=True, steps=300),
    Scenario("shards_figure8_5", voters=5, crashes=True, max_crashed=2, leader_faults=True,
             max_append_bytes=1, max_inflight=2, drop_rate=0.05, max_delay_ticks=5,
             fault_rate=0.15, propose_rate=0.5, steps=300),
)  # fmt: skip
"""Scenarios of the side-by-side runs (no clocks and no membership changes: the
groups of a sharded node have the same members, changed together)."""


class ShardedSimCluster:
    """``groups`` Raft groups over the same nodes and network (see the module doc).

    Args:
        seed: Seeds everything (the network, the fault schedule, each group's rng).
        scenario: The knobs; membership changes, clocks and disk faults are not used.
        groups: Number of groups side by side (a node's shard count).
    """

    def __init__(self, seed: int, scenario: Scenario, groups: int = 2) -> None:
        self.seed = seed
        self.scenario = scenario
        self.rng = random.Random(seed)
        self.now = 0
        self.network = SimNetwork(
            random.Random(self.rng.getrandbits(64)),
            scenario.drop_rate,
            scenario.duplicate_rate,
            scenario.max_delay_ticks,
            scenario.straggler_rate,
        )
        self.groups: list[SimCluster] = []
        for number in range(groups):
            group = SimCluster(self.rng.getrandbits(64), scenario)
            group.network = GroupPort(self.network, number)  # type: ignore[assignment]
            self.groups.append(group)
        self.trace: list[str] = []
        self.node_crashes = 0
        self.shard_crashes = 0

    @property
    def node_ids(self) -> list[NodeId]:
        return sorted(self.groups[0].nodes)

    def _log(self, text: str) -> None:
        self.trace.append(f"t={self.now} {text}")

    # --- time -------------------------------------------------------------------------

    def step(self) -> None:
        """One tick of every group's nodes, then every message due is delivered to its
        group's target node."""
        self.now += 1
        for group in self.groups:
            group.tick_nodes()
            assert group.now == self.now
        for tagged in self.network.due(self.now):
            self.groups[tagged.group].deliver(tagged.message)  # type: ignore[attr-defined]

    # --- faults -----------------------------------------------------------------------

    def _down(self, group: SimCluster) -> int:
        return sum(1 for n in group.nodes.values() if n.core is None)

    def inject_fault(self) -> None:
        """One fault from the scenario's kinds, acting on nodes and links (all groups)
        or on one group's member alone (``crash_shard``)."""
        s = self.scenario
        choices: list[str] = []
        if s.partitions:
            choices += ["partition", "one_way", "bridge", "isolate_leader", "heal", "heal"]
        if s.crashes:
            choices += ["crash_node", "crash_shard", "crash_shard", "restart", "restart"]
        if s.leader_faults:
            choices += ["crash_leader_shard", "crash_leader_node", "isolate_leader", "heal"]
        if s.transfers:
            choices += ["transfer"]
        if not choices:
            return
        kind = self.rng.choice(choices)
        getattr(self, f"_fault_{kind}")()

    def _fault_partition(self) -> None:
        ids = self.node_ids
        self.rng.shuffle(ids)
        cut = self.rng.randint(1, len(ids) - 1)
        self.network.heal()
        self.network.partition([ids[:cut], ids[cut:]])
        self._log(f"partition {sorted(ids[:cut])} | {sorted(ids[cut:])}")

    def _fault_one_way(self) -> None:
        a, b = self.rng.sample(self.node_ids, 2)
        self.network.cut_one_way(a, b)
        self._log(f"cut {a} -> {b}")

    def _fault_bridge(self) -> None:
        ids = self.node_ids
        if len(ids) < 3:
            return
        self.rng.shuffle(ids)
        bridge, rest = ids[0], ids[1:]
        cut = self.rng.randint(1, len(rest) - 1)
        self.network.heal()
        self.network.partition([rest[:cut], rest[cut:]])
        for other in ids:
            self.network.blocked.discard((bridge, other))
            self.network.blocked.discard((other, bridge))
        self._log(f"bridge {bridge} between {sorted(rest[:cut])} and {sorted(rest[cut:])}")

    def _aim(self) -> tuple[int, SimNode | None]:
        number = self.rng.randrange(len(self.groups))
        return number, self.groups[number].leader()

    def _fault_isolate_leader(self) -> None:
        number, leader = self._aim()
        if leader is None:
            return
        others = [i for i in self.node_ids if i != leader.id]
        self.network.partition([[leader.id], others])
        self._log(f"isolate node {leader.id} (leader of group {number})")

    def _fault_heal(self) -> None:
        self.network.heal()
        self._log("heal")

    def _crash_node(self, node_id: NodeId, why: str) -> None:
        """Crash ``node_id`` in every group (the machine), within ``max_crashed``."""
        for group in self.groups:
            node = group.nodes[node_id]
            if node.core is not None and self._down(group) >= self.scenario.max_crashed:
                return
        for group in self.groups:
            if group.nodes[node_id].core is not None:
                group.nodes[node_id].crash()
        self.node_crashes += 1
        self._log(f"crash node {node_id} ({why}): every group's member")

    def _crash_shard(self, number: int, node_id: NodeId, why: str) -> None:
        group = self.groups[number]
        node = group.nodes[node_id]
        if node.core is None or self._down(group) >= self.scenario.max_crashed:
            return
        node.crash()
        self.shard_crashes += 1
        self._log(f"crash group {number}'s member on node {node_id} alone ({why})")

    def _fault_crash_node(self) -> None:
        self._crash_node(self.rng.choice(self.node_ids), "any")

    def _fault_crash_shard(self) -> None:
        number = self.rng.randrange(len(self.groups))
        self._crash_shard(number, self.rng.choice(self.node_ids), "any")

    def _fault_crash_leader_shard(self) -> None:
        number, leader = self._aim()
        if leader is not None:
            self._crash_shard(number, leader.id, "its leader")

    def _fault_crash_leader_node(self) -> None:
        number, leader = self._aim()
        if leader is not None:
            self._crash_node(leader.id, f"leader of group {number}")

    def _fault_restart(self) -> None:
        """Restart one node: every group's member on it that is down."""
        down = [
            node_id
            for node_id in self.node_ids
            if any(g.nodes[node_id].core is None for g in self.groups)
        ]
        if not down:
            return
        node_id = self.rng.choice(down)
        for group in self.groups:
            node = group.nodes[node_id]
            if node.core is None:
                node.start(random.Random(self.rng.getrandbits(64)))
                group.process(node)
        self._log(f"restart node {node_id}")

    def _fault_transfer(self) -> None:
        number = self.rng.randrange(len(self.groups))
        self.groups[number]._fault_transfer()

    # --- the run ----------------------------------------------------------------------

    def run(self) -> None:
        """The scenario (faults, each group's proposals and reads), then liveness and
        the acknowledged-kept check, group by group."""
        s = self.scenario
        for _ in range(s.steps):
            if self.rng.random() < s.fault_rate:
                self.inject_fault()
            for group in self.groups:
                if group.rng.random() < s.propose_rate:
                    group.propose()
                if s.compaction_every:
                    group.compact()
            self.step()
        self.check_liveness()
        for group in self.groups:
            group.check_acknowledged_kept()

    def check_liveness(self, budget_ticks: int = 400) -> None:
        """Heal the network, start every member, and require every group to commit a
        proposal on all its members (paper §5.2), side by side."""
        self.network.heal()
        self.network.drop_rate = 0.0
        self.network.duplicate_rate = 0.0
        self.network.max_delay_ticks = 1
        self.network.straggler_rate = 0.0
        for group in self.groups:
            for node_id in sorted(group.nodes):
                node = group.nodes[node_id]
                node.crash_after_persist = False
                node.crash_mid_write = False
                if node.core is None:
                    node.start(random.Random(self.rng.getrandbits(64)))
                    group.process(node)
        self._log("liveness phase: healed, every member of every group up")
        marker = b"liveness-marker"
        proposed: dict[int, tuple[NodeId, LogIndex, Term]] = {}
        done: set[int] = set()
        for _ in range(budget_ticks):
            self.step()
            for number, group in enumerate(self.groups):
                if number in done:
                    continue
                leader = group.leader()
                if leader is None or leader.core is None:
                    continue
                core = leader.core
                at = proposed.get(number)
                if at is None or at[2] != core.term:
                    try:
                        index = core.propose(marker)
                    except (RaftNotLeaderError, ProposalDroppedError):
                        continue
                    proposed[number] = (leader.id, index, core.term)
                    group.process(leader)
                    continue
                index = at[1]
                if core.log.term(index) == at[2] and all(
                    group.nodes[m].core is not None and group.nodes[m].sm.applied_index >= index
                    for m in core.membership.members()
                    if m in group.nodes
                ):
                    done.add(number)
            if len(done) == len(self.groups):
                return
        states = {
            number: {
                node_id: (
                    (n.core.role.value, n.core.term, n.core.log.committed, n.sm.applied_index)
                    if n.core
                    else "down"
                )
                for node_id, n in sorted(group.nodes.items())
            }
            for number, group in enumerate(self.groups)
            if number not in done
        }
        raise InvariantViolation(
            f"liveness: groups {sorted(states)} committed no proposal on all members within "
            f"{budget_ticks} ticks after healing; (role, term, commit, applied): {states}"
        )


def shard_scenario_for_seed(seed: int) -> Scenario:
    """The scenario a side-by-side seed runs: seeds cycle through :data:`SHARD_SCENARIOS`."""
    return SHARD_SCENARIOS[seed % len(SHARD_SCENARIOS)]
