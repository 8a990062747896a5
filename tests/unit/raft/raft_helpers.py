"""An in-memory cluster for Raft unit tests (etcd-io/raft ``network`` in raft_test.go).

Messages travel through a FIFO queue; tests can cut links, isolate nodes, or drop
messages with a predicate. Every Ready is handled as the adapter contract says:
persist, then send, then apply, then advance.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from futureq.raft.core import RaftConfig, RaftCore
from futureq.raft.messages import LogIndex, Message, NodeId, Ready
from futureq.raft.roles import Role
from futureq.raft.storage import MemoryStorage
from futureq.raft.timekeeper import TimeKeeper
from futureq.raft.values import Entry, EntryKind, Membership, ReadState, Snapshot

ELECTION_TICKS = 10


def ids(*numbers: int) -> frozenset[NodeId]:
    """A frozenset of NodeIds."""
    return frozenset(NodeId(n) for n in numbers)


def make_config(node_id: int, **overrides: Any) -> RaftConfig:
    """A RaftConfig with test-friendly defaults (T=10 ticks, heartbeat 1 tick)."""
    fields: dict[str, Any] = {
        "node_id": NodeId(node_id),
        "election_timeout_ticks": ELECTION_TICKS,
        "heartbeat_interval_ticks": 1,
    }
    fields.update(overrides)
    return RaftConfig(**fields)


class TestNode:
    """A core plus its storage and a trivial state machine (list of applied entries)."""

    __test__ = False

    def __init__(self, core: RaftCore, storage: MemoryStorage) -> None:
        self.core = core
        self.storage = storage
        self.applied: list[Entry] = []
        self.read_states: list[ReadState] = []
        self.installed: list[Snapshot] = []

    def handle_ready(self) -> list[Message]:
        """Persist, apply and advance every pending Ready; return messages to send."""
        out: list[Message] = []
        while self.core.has_ready():
            ready = self.core.ready()
            out.extend(ready.leader_messages)
            self.persist(ready)
            out.extend(ready.messages)
            if ready.snapshot is not None:
                self.installed.append(ready.snapshot)
            self.applied.extend(ready.committed_entries)
            self.read_states.extend(ready.read_states)
            self.core.advance(ready)
        return out

    def persist(self, ready: Ready) -> None:
        if ready.snapshot is not None:
            self.storage.apply_snapshot(ready.snapshot)
        self.storage.append(ready.entries)
        if ready.hard_state is not None:
            self.storage.set_hard_state(ready.hard_state)

    def applied_data(self) -> list[bytes]:
        """Payloads of applied NORMAL entries, in order."""
        return [e.data for e in self.applied if e.kind is EntryKind.NORMAL]


def make_node(
    node_id: int,
    voters: Iterable[int],
    learners: Iterable[int] = (),
    *,
    seed: int = 0,
    storage: MemoryStorage | None = None,
    **config: Any,
) -> TestNode:
    """A fresh node whose storage holds the bootstrap membership."""
    if storage is None:
        storage = MemoryStorage(Membership(ids(*voters), ids(*learners)))
    core = RaftCore(make_config(node_id, **config), storage, random.Random(seed * 1000 + node_id))
    return TestNode(core, storage)


class Network:
    """Nodes connected by an in-order, lossless-unless-told queue."""

    def __init__(self, nodes: Iterable[TestNode]) -> None:
        self.nodes: dict[NodeId, TestNode] = {n.core.id: n for n in nodes}
        self.cut_links: set[tuple[NodeId, NodeId]] = set()
        self.drop: Callable[[Message], bool] = lambda m: False
        self.delivered: list[Message] = []

    @classmethod
    def of(cls, count: int, **config: Any) -> Network:
        """``count`` voters with ids 1..count."""
        voters = range(1, count + 1)
        return cls(make_node(i, voters, **config) for i in voters)

    def role(self, node_id: int) -> Role:
        """Current role of ``node_id`` (a call, so type checkers do not narrow it)."""
        return self.core(node_id).role

    def core(self, node_id: int) -> RaftCore:
        return self.nodes[NodeId(node_id)].core

    def add(self, node: TestNode) -> None:
        self.nodes[node.core.id] = node

    def cut(self, a: int, b: int) -> None:
        """Drop messages both ways between ``a`` and ``b``."""
        self.cut_links |= {(NodeId(a), NodeId(b)), (NodeId(b), NodeId(a))}

    def isolate(self, node_id: int) -> None:
        for other in self.nodes:
            if other != node_id:
                self.cut(node_id, other)

    def heal(self) -> None:
        self.cut_links.clear()
        self.drop = lambda m: False

    def _blocked(self, message: Message) -> bool:
        return (
            (message.from_id, message.to_id) in self.cut_links
            or message.to_id not in self.nodes
            or self.drop(message)
        )

    def deliver(self, messages: Iterable[Message]) -> None:
        """Deliver ``messages`` and everything they cause, until quiet."""
        queue: deque[Message] = deque(messages)
        for node in self.nodes.values():
            queue.extend(node.handle_ready())
        while queue:
            message = queue.popleft()
            if self._blocked(message):
                continue
            self.delivered.append(message)
            node = self.nodes[message.to_id]
            node.core.step(message)
            queue.extend(node.handle_ready())

    def outlive_restart_quiet(self, *node_ids: int) -> None:
        """Tick restarted nodes through their first election timeout, alone.

        A node restarted with a stored term ignores vote requests for one election
        timeout (it may have answered a leader whose lease still runs, thesis §6.4.1);
        tests that elect a leader among restarted nodes without ticking the others call
        this first. What the nodes send meanwhile is dropped.
        """
        for node_id in node_ids:
            core = self.core(node_id)
            for _ in range(core.config.election_timeout_ticks):
                core.tick()
            self.nodes[NodeId(node_id)].handle_ready()

    def stabilize(self) -> None:
        """Deliver everything pending."""
        self.deliver([])

    def pending(self) -> list[Message]:
        """Collect (without delivering) what every node wants to send."""
        out: list[Message] = []
        for node in self.nodes.values():
            out.extend(node.handle_ready())
        return out

    def tick(self, node_id: int, count: int = 1) -> None:
        for _ in range(count):
            self.core(node_id).tick()

    def heartbeat(self, leader_id: int) -> None:
        """Tick the leader to its next heartbeat and deliver: the followers learn the
        commit index (a commit alone sends them nothing; it rides on the next
        AppendEntries or heartbeat)."""
        self.tick(leader_id, self.core(leader_id).config.heartbeat_interval_ticks)
        self.stabilize()

    def tick_all(self, count: int = 1) -> None:
        """Tick every node ``count`` times, delivering after each round."""
        for _ in range(count):
            for node in self.nodes.values():
                node.core.tick()
            self.stabilize()

    def campaign(self, node_id: int) -> None:
        """Tick ``node_id`` until its election timer fires, then deliver."""
        core = self.core(node_id)
        before = (core.role, core.term)
        for _ in range(2 * core.config.election_timeout_ticks + 1):
            core.tick()
            if (core.role, core.term) != before and core.role is not Role.FOLLOWER:
                break
        self.stabilize()

    def elect(self, node_id: int) -> None:
        """Make ``node_id`` leader (its log must be up to date) and settle."""
        self.campaign(node_id)
        assert self.core(node_id).role is Role.LEADER, self.core(node_id).role
        self.stabilize()

    def propose(self, node_id: int, data: bytes) -> LogIndex:
        index = self.core(node_id).propose(data)
        self.stabilize()
        return index

    def leaders(self) -> list[NodeId]:
        return [i for i, n in self.nodes.items() if n.core.role is Role.LEADER]


def drain_timed(
    core: RaftCore, keeper: TimeKeeper, storage: MemoryStorage, mono_us: int
) -> list[Message]:
    """Every pending Ready of a core driven with a :class:`TimeKeeper`: the keeper sees
    each at ``mono_us``, entries and hard state are stored, and the messages to send are
    returned (the leader's before the rest, as a node sends them)."""
    out: list[Message] = []
    while core.has_ready():
        ready = core.ready()
        keeper.on_ready(ready, mono_us)
        out.extend(ready.leader_messages)
        storage.append(ready.entries)
        if ready.hard_state is not None:
            storage.set_hard_state(ready.hard_state)
        out.extend(ready.messages)
        core.advance(ready)
    return out
