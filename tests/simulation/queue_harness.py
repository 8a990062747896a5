"""The Raft simulation with the real replicated state machine: QueueState replicas.

``DESIGN.md`` ("Tests", simulation): RaftCore + QueueState replicas in one process,
under the seeded network, crashes and snapshots of :mod:`harness`. What changes here:

* :class:`JournalStore` — each replica's QueueState runs on a MemoryStore that keeps
  an undo journal of the writes since the last sync and an incremental digest of its
  contents. A crash keeps a random *prefix* of the unsynced writes (state writes and
  hard-state writes interleaved, as RocksDB's WAL recovers them) and loses the rest.
* :class:`QueueMachine` — stands where the harness's hash-chain state machine stood:
  NORMAL entries are real commands (:mod:`futureq.state.commands`) applied with
  ``QueueState.apply``; NOOP and CONFIG_CHANGE entries go to ``apply_other``;
  compaction serializes ``snapshot_source()``; installs call ``restore``.
* :class:`QueueSimNode` — restarts rebuild QueueState from its store; a state behind
  the stored Raft snapshot (unsynced writes lost, or an interrupted install that left
  the ``restoring`` marker) installs that snapshot again before the core starts.
* :class:`Workload` — a seeded generator acting as "the leader": publish, ack, nack,
  expire, dead-letter, create/delete/purge group, delivered, release, node addresses,
  with times stamped from the simulated clock, targets read from the proposing node's
  own state, and group defaults resolved from the proposing node's own *local
  configuration*: every node runs with different ``[queue]`` defaults
  (:data:`LOCAL_SETTINGS`), as a misconfigured cluster would, and replicas must still
  hold identical states (``DESIGN.md``, "Apply reads nothing node-local").
* Cluster time and dispatch: every node has clocks and a timekeeper (``harness``'s
  clock model); the workload stamps with the proposing node's cluster time, and a
  model of the dispatcher runs after every step on the node that may dispatch (it
  leads, holds the lease, its clock is in bound, the no-op of its term is applied):
  it releases what is due by its cluster time and not expired. Every release is
  checked against true time: never earlier than the stamped due time minus half of
  the bound, never earlier than the producer's intended due time (true time of the
  publish plus its delay) minus the bound, never past the expiry plus half the bound.
  Scenarios with ``clock_faults`` skew, drift and step clocks meanwhile.
* :class:`Oracle` — one more QueueState that applies every committed entry exactly
  once, in order, without faults. Its digest at each index anchors state machine
  safety (every replica at that applied index must hold the identical store), and it
  checks the queue invariants as it goes: message ids unique and increasing, no
  committed publish lost unless a later committed command named it (ACK, EXPIRE,
  DEAD_LETTER) or deleted a group of its topic, and the families consistent with each
  other (open counts, pending counts, schedule entries with messages).

Everything random comes from the seed; a failing seed replays exactly.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import attrs
from harness import EPOCH_US, TICK_US, InvariantViolation, Scenario, SimCluster, SimNode

from futureq.errors import StorageError
from futureq.raft.core import ProposalDroppedError, RaftConfig, RaftCore, RaftNotLeaderError
from futureq.raft.messages import LogIndex, NodeId, Ready
from futureq.raft.roles import Role
from futureq.raft.values import Entry, EntryKind, Membership
from futureq.state import commands, snapshot
from futureq.state.commands import CommandKind, GroupSettings
from futureq.state.queue_state import QueueState
from futureq.state.store import Changes, MemoryStore
from futureq.wire.frames import ItemStatus

TICK_MS = 10
"""Simulated wall-clock milliseconds per tick (the leader stamps ``now * TICK_MS``)."""
LIVENESS_MARKER = b"liveness-marker"
"""What :meth:`harness.SimCluster.check_liveness` proposes: applied like a Raft NOOP."""
TOPICS = ("orders", "mail", "logs")
GROUP_NAMES = ("default", "billing", "audit")
FULL_CHECK_EVERY = 16
"""The oracle compares whole families (not just counts) every this many applies."""
LOCAL_SETTINGS: tuple[GroupSettings, ...] = (
    GroupSettings(3000, 16),
    GroupSettings(9000, 3),
    GroupSettings(3000, 16),
    GroupSettings(45_000, 7),
    GroupSettings(1, 1_000_000),
    GroupSettings(250, 2),
)
"""Each node's configured group defaults (node ``n`` takes entry ``n % 6``): they differ,
and only the node that proposes a command may use its own."""


def local_settings(node_id: int) -> GroupSettings:
    """The ``[queue]`` defaults node ``node_id`` runs with in the simulation."""
    return LOCAL_SETTINGS[node_id % len(LOCAL_SETTINGS)]


QUEUE_SCENARIOS: tuple[Scenario, ...] = (
    Scenario("q_lossy3", drop_rate=0.08, duplicate_rate=0.05, max_delay_ticks=4, crashes=True,
             fault_rate=0.05, straggler_rate=0.01, compaction_every=12,
             snapshot_chunk_bytes=700, max_append_bytes=2048, propose_rate=0.4,
             clocks=True, clock_faults=True, disk_faults=True),
    Scenario("q_partition5", voters=5, partitions=True, crashes=True, max_crashed=2,
             drop_rate=0.02, compaction_every=16, snapshot_chunk_bytes=1500,
             max_append_bytes=4096, propose_rate=0.4, clocks=True, clock_faults=True),
    Scenario("q_snapshot3", compaction_every=5, crashes=True, partitions=True, drop_rate=0.03,
             wire_roundtrip=True, snapshot_chunk_bytes=400, max_append_bytes=1024,
             fault_rate=0.1, propose_rate=0.5, clocks=True, disk_faults=True),
    Scenario("q_membership", voters=3, spares=2, membership_changes=True, crashes=True,
             partitions=True, compaction_every=10, fault_rate=0.1, snapshot_chunk_bytes=1000,
             max_append_bytes=2048, propose_rate=0.4, clocks=True, disk_faults=True),
    Scenario("q_chaos5", voters=5, spares=1, partitions=True, crashes=True, max_crashed=2,
             membership_changes=True, compaction_every=8, transfers=True, drop_rate=0.04,
             duplicate_rate=0.03, max_delay_ticks=4, fault_rate=0.12, straggler_rate=0.005,
             tick_skip_rate=0.05, snapshot_chunk_bytes=600, max_append_bytes=1024,
             propose_rate=0.4, clocks=True),
    Scenario("q_crashy3", crashes=True, leader_faults=True, fault_rate=0.15, drop_rate=0.05,
             max_delay_ticks=5, compaction_every=6, snapshot_chunk_bytes=900,
             max_append_bytes=512, propose_rate=0.6, clocks=True, clock_faults=True,
             transfers=True, disk_faults=True),
)  # fmt: skip


def queue_scenario_for_seed(seed: int) -> Scenario:
    """The scenario a seed runs: seeds cycle through :data:`QUEUE_SCENARIOS`."""
    return QUEUE_SCENARIOS[seed % len(QUEUE_SCENARIOS)]


class SimulatedCrash(Exception):
    """Raised by an armed :class:`JournalStore` to kill its node between two writes."""


def _record_hash(family: str, key: bytes, value: bytes) -> int:
    h = hashlib.blake2b(family.encode(), digest_size=16)
    h.update(b"\x00%d\x00" % len(key))
    h.update(key)
    h.update(value)
    return int.from_bytes(h.digest(), "big")


class JournalStore(MemoryStore):
    """A MemoryStore that can lose its unsynced writes and digests its contents.

    Args:
        journal: The node's journal of unsynced writes, shared with its hard-state
            writes so a crash can keep an interleaved prefix of both. Each store entry
            is ``("state", [(family, key, old value or None), ...])``.
    """

    def __init__(self, journal: list[tuple[str, Any]]) -> None:
        super().__init__()
        self.journal = journal
        self._digest = 0
        self.crash_after_writes: int | None = None
        """Raise :class:`SimulatedCrash` instead of the write after this many more."""
        self.crash_during_restore: int | None = None
        """Armed by a fault: ``crash_after_writes`` for the next snapshot install."""

    def _maybe_crash(self) -> None:
        if self.crash_after_writes is not None:
            if self.crash_after_writes <= 0:
                self.crash_after_writes = None
                raise SimulatedCrash("the process died in the middle of a write sequence")
            self.crash_after_writes -= 1

    def _set(self, family: str, key: bytes, value: bytes | None) -> bytes | None:
        data = self._family(family)
        old: bytes | None = data.get(key)
        if old is not None:
            self._digest ^= _record_hash(family, key, old)
            del data[key]
        if value is not None:
            self._digest ^= _record_hash(family, key, value)
            data[key] = value
        return old

    def write(self, changes: Changes, *, sync: bool = False) -> None:
        """Apply atomically; journal the old values; ``sync`` makes all earlier writes durable."""
        self._maybe_crash()
        undo = [
            (family, key, self._set(family, key, value))
            for family, items in changes.items()
            for key, value in items.items()
        ]
        if sync:
            self.journal.clear()
        else:
            self.journal.append(("state", undo))

    def clear(self, family: str) -> None:
        """Delete every key of ``family`` (journaled like a write)."""
        self._maybe_crash()
        undo = [(family, key, self._set(family, key, None)) for key in list(self._family(family))]
        self.journal.append(("state", undo))

    def undo(self, records: list[tuple[str, bytes, bytes | None]]) -> None:
        """Put back the old values of one journaled write."""
        for family, key, old in reversed(records):
            self._set(family, key, old)

    def durable_copy(self, journal: list[tuple[str, Any]] | None = None) -> JournalStore:
        """A copy holding only what is durable: every unsynced write undone.

        Args:
            journal: The journal the copy writes to (a new one if None).
        """
        copy = JournalStore([] if journal is None else journal)
        for family, data in sorted(self._families.items()):
            for key, value in data.items():
                copy._set(family, key, value)
        for kind, record in reversed(self.journal):
            if kind == "state":
                copy.undo(record)
        return copy

    def digest(self) -> bytes:
        """A digest of every (family, key, value): equal contents, equal digests."""
        return self._digest.to_bytes(16, "big")

    def full_digest(self) -> bytes:
        """The same digest recomputed from scratch (keeps :meth:`digest` honest)."""
        total = 0
        for family in snapshot.FAMILIES:
            for key, value in self.scan(family, b""):
                total ^= _record_hash(family, key, value)
        return total.to_bytes(16, "big")

    def count(self, family: str) -> int:
        """Number of keys in ``family``."""
        return len(self._family(family))


def _message_key(mid: int) -> bytes:
    return mid.to_bytes(8, "big")


class Oracle:
    """A fault-free QueueState fed every committed entry once, in log order.

    Args:
        cluster: The cluster whose checker records the digest at each index.
    """

    def __init__(self, cluster: QueueSimCluster) -> None:
        self.cluster = cluster
        self.store = JournalStore([])
        self.state = QueueState(self.store)
        self.live: dict[int, str] = {}
        """Message id -> topic, for every message the committed commands keep alive."""
        self.max_mid = -1
        self.applies = 0
        self.published = 0
        self.installs = 0
        self.settings_seen: set[tuple[int, int]] = set()
        """Settings of every group seen, to show the nodes' local defaults all took part."""
        self.purges = 0
        self.managed = 0
        self.backfilled = 0
        """Entries a CANCEL or RESCHEDULE found (issue 14)."""
        self.chunks_by_id = 0
        """BACKFILL_GROUP chunks applied to a group of kind 37 (the message-id walk)."""

    def feed(self, entry: Entry) -> None:
        """Apply ``entry`` if it is the next index; entries already applied are skipped."""
        applied = self.state.applied_index
        if entry.index <= applied:
            return
        if entry.index != applied + 1:
            raise InvariantViolation(
                f"entry {entry.index} applied somewhere before entry {applied + 1} was"
            )
        self.store.journal.clear()
        if entry.kind is EntryKind.NORMAL and entry.data != LIVENESS_MARKER:
            self._apply_command(entry)
        else:
            self.state.apply_other(entry.index)
        self.applies += 1
        self.cluster.checker.applied(NodeId(0), entry.index, self.store.digest())
        self._check_counts()
        if self.applies % FULL_CHECK_EVERY == 0:
            self.check_all()

    def _apply_command(self, entry: Entry) -> None:
        command = commands.decode(entry.data)
        kind = command[0]
        index = entry.index
        named: set[int] = set()
        if kind in (CommandKind.ACK, CommandKind.EXPIRE):
            named = {commands.parse_schedule_key(key)[2] for key in command[1]}
        elif kind in (CommandKind.DEAD_LETTER, CommandKind.DEAD_LETTER_PROVENANCE):
            named = {commands.parse_schedule_key(item[0])[2] for item in command[2]}
        elif kind == CommandKind.CANCEL:
            named = {mid for mid in command[3] if type(mid) is int}
        elif kind == CommandKind.RESCHEDULE:
            named = {mid for mid in command[4] if type(mid) is int}  # a purging group drops it
        elif kind == CommandKind.PURGE_GROUP:
            gid = command[1]
            start, stop = gid.to_bytes(4, "big"), (gid + 1).to_bytes(4, "big")
            named = {
                commands.parse_schedule_key(key)[2]
                for key in self.store.scan_keys("schedule", start, stop)
            }
        job = self.state.backfilling.get(command[1]) if kind == CommandKind.BACKFILL_GROUP else None
        by_id = job is not None and job.legacy_by_id
        result = self.state.apply(index, entry.data)
        if kind in (
            CommandKind.PUBLISH,
            CommandKind.DEAD_LETTER,
            CommandKind.DEAD_LETTER_PROVENANCE,
            CommandKind.CREATE_GROUP,
            CommandKind.CREATE_GROUP_FROM_BACKLOG,
            CommandKind.CREATE_GROUP_FROM_BACKLOG_AS_HELD,
        ):
            for info in self.state.groups.values():
                self.settings_seen.add((info.visibility_timeout_ms, info.max_deliveries))
        if kind == CommandKind.PURGE_GROUP and result:
            self.purges += 1
        if kind == CommandKind.BACKFILL_GROUP and result:
            self.backfilled += result
        self.chunks_by_id += by_id
        if kind in (CommandKind.CANCEL, CommandKind.RESCHEDULE):
            self.managed += sum(status != ItemStatus.UNKNOWN for status in result)
        first = commands.message_id(index, 0)
        if kind in (
            CommandKind.PUBLISH,
            CommandKind.DEAD_LETTER,
            CommandKind.DEAD_LETTER_PROVENANCE,
        ):
            if result != first:
                raise InvariantViolation(
                    f"{kind.name} at {index} returned id {result}, not {first}"
                )
            stop = _message_key(commands.message_id(index + 1, 0))
            created = list(self.store.scan("messages", _message_key(first), stop))
            if kind == CommandKind.PUBLISH and len(created) != len(command[2]):
                raise InvariantViolation(
                    f"publish at {index} stored {len(created)} of {len(command[2])} messages"
                )
            for key, value in created:
                mid = int.from_bytes(key, "big")
                if mid <= self.max_mid:
                    raise InvariantViolation(f"message id {mid} not above {self.max_mid}")
                self.max_mid = mid
                self.live[mid] = commands.decode(value)[0]
                self.published += 1
        for mid in sorted(named):
            if mid in self.live and self.store.get("messages", _message_key(mid)) is None:
                del self.live[mid]

    def _check_counts(self) -> None:
        if self.store.count("messages") != len(self.live):
            missing = [
                m for m in sorted(self.live) if self.store.get("messages", _message_key(m)) is None
            ]
            raise InvariantViolation(
                f"at index {self.state.applied_index}: {self.store.count('messages')} messages "
                f"stored, {len(self.live)} committed and not removed; lost without a command "
                f"naming them: {missing[:10]}"
            )

    def check_all(self) -> None:
        """Whole-state checks: live set, open and pending counts, digest honesty."""
        stored = {int.from_bytes(key, "big") for key, _ in self.store.scan("messages", b"")}
        if stored != set(self.live):
            raise InvariantViolation(
                f"at index {self.state.applied_index}: stored messages differ from the "
                f"committed ones: lost {sorted(set(self.live) - stored)[:10]}, "
                f"unexpected {sorted(stored - set(self.live))[:10]}"
            )
        check_consistent(self.state)
        if self.store.digest() != self.store.full_digest():
            raise InvariantViolation("incremental digest drifted from the contents")


def check_consistent(state: QueueState) -> None:
    """The families agree with each other and with QueueState's in-memory indexes.

    Raises:
        InvariantViolation: an open count, pending count or orphan entry is wrong.
    """
    store = state.store
    per_message: dict[int, int] = {}
    per_group: dict[int, int] = {}
    for key, _ in store.scan("schedule", b""):
        gid, _, mid = commands.parse_schedule_key(key)
        per_message[mid] = per_message.get(mid, 0) + 1
        per_group[gid] = per_group.get(gid, 0) + 1
        if gid not in state.groups and gid not in state.deleting:
            raise InvariantViolation(f"schedule entry of unknown group {gid}")
    for key, value in store.scan("messages", b""):
        mid = int.from_bytes(key, "big")
        open_entries = commands.decode(value)[4]
        if per_message.pop(mid, 0) != open_entries:
            raise InvariantViolation(f"message {mid} counts {open_entries} open entries")
    if per_message:
        raise InvariantViolation(f"schedule entries without a message: {sorted(per_message)}")
    pending = {gid: info.pending for gid, info in state.groups.items()}
    pending.update({gid: deleting.pending for gid, deleting in state.deleting.items()})
    for gid, count in sorted(pending.items()):
        if count != per_group.get(gid, 0):
            raise InvariantViolation(
                f"group {gid} pending {count}, {per_group.get(gid, 0)} entries stored"
            )
    for gid, deleting in sorted(state.deleting.items()):
        if deleting.pending <= 0 or gid in state.groups:
            raise InvariantViolation(f"deleted group {gid} lingers: {deleting}")


class QueueMachine:
    """The state machine the harness drives, over a real QueueState.

    Args:
        state: The replica's QueueState.
        oracle: Fed every entry before the replica applies it.
    """

    def __init__(self, state: QueueState, oracle: Oracle) -> None:
        self.state = state
        self.oracle = oracle

    @property
    def store(self) -> JournalStore:
        """The replica's store."""
        store = self.state.store
        assert isinstance(store, JournalStore)
        return store

    @property
    def applied_index(self) -> LogIndex:
        """QueueState's applied index."""
        return LogIndex(self.state.applied_index)

    @property
    def digest(self) -> bytes:
        """Digest of the replica's whole store."""
        return self.store.digest()

    def apply(self, entry: Entry) -> None:
        """A committed entry: a command, or a NOOP/CONFIG_CHANGE (``apply_other``)."""
        self.oracle.feed(entry)
        if entry.kind is EntryKind.NORMAL and entry.data != LIVENESS_MARKER:
            self.state.apply(entry.index, entry.data)
        else:
            self.state.apply_other(entry.index)

    def snapshot_data(self) -> bytes:
        """``snapshot_source().serialize()`` at the applied index."""
        with self.state.snapshot_source() as source:
            return source.serialize()

    def restore(self, data: bytes) -> None:
        """Install a snapshot the leader sent (its recorded index is the Raft index)."""
        self.oracle.installs += 1
        store = self.store
        store.crash_after_writes, store.crash_during_restore = store.crash_during_restore, None
        self.state.restore(data, snapshot.snapshot_index(data))
        store.crash_after_writes = None


class QueueSimNode(SimNode):
    """A SimNode whose state machine is a QueueState on a :class:`JournalStore`."""

    def __init__(
        self,
        node_id: NodeId,
        config: RaftConfig,
        membership: Membership,
        oracle: Oracle,
        rng: random.Random,
        incarnation: int = 1,
    ) -> None:
        super().__init__(node_id, config, membership, incarnation)
        self.oracle = oracle
        self.crash_rng = rng
        self.journal: list[tuple[str, Any]] = []
        self.store = JournalStore(self.journal)
        self.restored_on_start = 0
        self.interrupted_restores = 0

    def start(self, rng: random.Random) -> None:
        """Rebuild QueueState from the store; install the stored snapshot if behind it."""
        assert self.core is None
        stored = self.storage.snapshot()
        marker = self.store.get("meta", snapshot.RESTORING_KEY)
        if marker is not None:
            # An install was interrupted: QueueState must refuse the half-replaced
            # state; finish it from the stored snapshot, which is at least as new as the
            # one being installed (Raft storage took it before the state restore began).
            try:
                QueueState(self.store)
            except StorageError:
                pass
            else:
                raise InvariantViolation(f"node {self.id} started on a half-restored state")
            assert int.from_bytes(marker, "big") <= stored.metadata.index
            self.interrupted_restores += 1
            snapshot.restore_into(self.store, stored.data, stored.metadata.index)
        state = QueueState(self.store)
        if state.applied_index < stored.metadata.index:
            self.restored_on_start += 1
            state.restore(stored.data, stored.metadata.index)
        machine = QueueMachine(state, self.oracle)
        self.sm = machine  # type: ignore[assignment]
        self.oracle.cluster.checker.applied(self.id, machine.applied_index, machine.digest)
        self.core = RaftCore(
            self._start_config(rng), self.storage, rng, applied=machine.applied_index
        )
        self.last_committed_seen = self.core.log.committed
        self.start_keeper()

    def crash(self) -> None:
        """Lose the process and a random suffix of the unsynced writes."""
        self.core = None
        self.keeper = None
        self.crash_after_persist = False
        keep = self.crash_rng.randint(0, len(self.journal))
        for kind, record in reversed(self.journal[keep:]):
            if kind == "hard_state":
                self.storage.set_hard_state(record)
            else:
                self.store.undo(record)
        self.journal.clear()

    def persist(self, ready: Ready) -> None:
        """Write the Ready; hard-state writes are journaled until a sync."""
        if ready.snapshot is not None:
            self.storage.apply_snapshot(ready.snapshot)
        self.storage.append(ready.entries)
        if ready.hard_state is not None:
            self.journal.append(("hard_state", self.storage.hard_state()))
            self.storage.set_hard_state(ready.hard_state)
        if ready.must_sync:
            self.journal.clear()
            self.synced_hard_state = self.storage.hard_state()

    def durable_copy(self) -> Any:
        """Raft storage and QueueState store as a crash now would leave them (no
        unsynced write kept: the journal of both is undone, as :meth:`crash` does)."""
        storage = self.storage.clone()
        for kind, record in reversed(self.journal):
            if kind == "hard_state":
                storage.set_hard_state(record)
        return ((self.incarnation, storage), self.store.durable_copy())

    def restore_copy(self, copy: Any) -> None:
        """Put back an earlier :meth:`durable_copy` of both stores (node down)."""
        raft_copy, store = copy
        super().restore_copy(raft_copy)
        self.journal = []
        self.store = store.durable_copy(self.journal)

    def wipe(self, incarnation: int) -> None:
        """An empty data directory: empty Raft storage and an empty store (node down)."""
        super().wipe(incarnation)
        self.journal = []
        self.store = JournalStore(self.journal)

    @property
    def queue(self) -> QueueState:
        """The live QueueState (the node must be up)."""
        assert isinstance(self.sm, QueueMachine)
        return self.sm.state


@attrs.define
class Workload:
    """A seeded client + dispatcher stand-in that builds the commands a leader proposes.

    It reads the proposing node's own state (as the real leader's dispatcher does), so
    most acks and nacks hit entries that exist; stale ones must be ignored by apply.
    """

    rng: random.Random
    counter: int = 0
    published: list[tuple[bytes, int]] = attrs.Factory(list)
    """``(payload, delay_ms)`` of the items of the last command built (if a PUBLISH)."""

    def command(self, state: QueueState, now_ms: int, settings: GroupSettings) -> bytes:
        """One encoded command stamped at ``now_ms`` (never below the largest stamp).

        ``settings`` are the proposing node's local defaults, resolved into commands
        that may create groups, as the real leader does.
        """
        stamp = max(now_ms, state.last_publish_ms)
        self.published = []
        entries = self._entries(state)
        roll = self.rng.random()
        if roll < 0.34 or not entries:
            return self._publish(stamp, settings)
        if state.deleting and roll < 0.38:
            gid = self.rng.choice(sorted(state.deleting))
            return commands.purge_group(gid, self.rng.choice((1, 2, 5, 100)))
        if state.purging and roll < 0.41:
            gid = self.rng.choice(sorted(state.purging))
            return commands.purge_group(gid, self.rng.choice((1, 2, 5, 100)))
        if state.backfilling and roll < 0.44:
            gid = self.rng.choice(sorted(state.backfilling))
            return commands.backfill_group(gid, self.rng.choice((1, 2, 5, 100)), stamp)
        if roll < 0.44:
            picked = self._pick(entries)
            return commands.delivered([(k, a + self.rng.randint(0, 2)) for k, a, _ in picked])
        if roll < 0.47:
            picked = self._pick(entries)
            return commands.release([(k, a) for k, a, _ in picked])
        if roll < 0.57:
            return commands.ack([key for key, _, _ in self._pick(entries)])
        if roll < 0.65:
            picked = self._pick(entries)
            return commands.nack(
                stamp, self.rng.choice((0, 50, 500)), [(k, a + 1) for k, a, _ in picked]
            )
        if roll < 0.73:
            expired = [
                key
                for key, _, expire_ms in entries
                if expire_ms is not None and expire_ms <= now_ms
            ]
            return commands.expire(expired[:4] or [key for key, _, _ in self._pick(entries)])
        if roll < 0.80:
            picked = self._pick(entries)
            return commands.dead_letter(stamp, [(k, a + 1) for k, a, _ in picked], settings)
        if roll < 0.90:
            created = commands.create_group(
                self.rng.choice(TOPICS),
                self.rng.choice(GROUP_NAMES),
                self.rng.choice((None, None, 1000, 5000)),
                self.rng.choice((None, None, 2, 3)),
                settings,
                from_backlog=roll >= 0.87,
            )
            if state.applied_index % 2:
                return created
            # Kind 37, as a leader of the build before kind 38 wrote it (same layout):
            # its backfill walks the messages by id; replicas must agree on it too.
            fields = commands.decode(created)
            if fields[0] == CommandKind.CREATE_GROUP_FROM_BACKLOG_AS_HELD:
                fields[0] = CommandKind.CREATE_GROUP_FROM_BACKLOG
            return commands.encode(fields)
        if roll < 0.95:
            topic = self.rng.choice(TOPICS + ("orders.dlq",))
            groups = state.topic_groups(topic)
            name = self.rng.choice(groups).name if groups else self.rng.choice(GROUP_NAMES)
            return commands.delete_group(topic, name)
        if roll < 0.965:
            return self._manage(state, stamp, entries)
        node = self.rng.randint(1, 5)
        if self.rng.random() < 0.2:
            return commands.node_address(node, None, None)
        return commands.node_address(node, f"10.0.0.{node}:7451", f"10.0.0.{node}:{self.counter}")

    def _manage(
        self, state: QueueState, stamp: int, entries: list[tuple[bytes, int, int | None]]
    ) -> bytes:
        """A CANCEL, RESCHEDULE or PURGE of what the proposing node sees (issue 14)."""
        picked = self._pick(entries)
        ids = [commands.parse_schedule_key(key)[2] for key, _, _ in picked]
        gid, _, _ = commands.parse_schedule_key(picked[0][0])
        info = state.groups.get(gid)
        topic = info.topic if info is not None else self.rng.choice(TOPICS)
        group_id = gid if self.rng.random() < 0.5 else None
        which = self.rng.random()
        if which < 0.45:
            return commands.cancel(topic, group_id, ids)
        if which < 0.9:
            # Never before the producer's intended due time (the checker holds the
            # dispatcher to it): publishes are due at most 20 s after their stamp.
            due_ms = stamp + self.rng.choice((20_000, 20_100, 25_000))
            return commands.reschedule(stamp, topic, group_id, ids, due_ms)
        return commands.purge([gid])

    def _publish(self, stamp: int, settings: GroupSettings) -> bytes:
        items: list[tuple[str, bytes, int, int | None]] = []
        for _ in range(self.rng.randint(1, 4)):
            self.counter += 1
            ttl = self.rng.choice((None, None, 0, 300, 3000))
            delay = self.rng.choice((0, 0, 100, 1000, 20_000))
            items.append((self.rng.choice(TOPICS), b"m%d" % self.counter, stamp + delay, ttl))
            self.published.append((b"m%d" % self.counter, delay))
        return commands.publish(stamp, items, settings)

    def _entries(self, state: QueueState) -> list[tuple[bytes, int, int | None]]:
        out: list[tuple[bytes, int, int | None]] = []
        for gid in sorted(state.groups):
            for due_ms, mid, attempt, expire_ms in state.scan_schedule(gid, 0, 0, 6):
                out.append((commands.schedule_key(gid, due_ms, mid), attempt, expire_ms))
        return out

    def _pick(
        self, entries: list[tuple[bytes, int, int | None]]
    ) -> list[tuple[bytes, int, int | None]]:
        picked = self.rng.sample(entries, min(len(entries), self.rng.randint(1, 3)))
        if self.rng.random() < 0.1:
            picked.append((commands.schedule_key(999, 1, 1), 1, None))  # unknown entry
        return picked


class QueueSimCluster(SimCluster):
    """:class:`harness.SimCluster` with QueueState replicas and a command workload."""

    def __init__(self, seed: int, scenario: Scenario) -> None:
        self.oracle = Oracle(self)
        self.workload = Workload(random.Random(seed * 7919 + 1))
        self.intents: dict[tuple[int, bytes], int] = {}
        """(message id, payload) -> the producer's intended due time: true time of the
        publish plus its delay (ms since the Unix epoch). The payload tells the proposed
        message from another that won its log index (and from dead-letter copies)."""
        self.releases = 0
        super().__init__(seed, scenario)

    def _add_node(self, node_id: NodeId, membership: Membership) -> SimNode:
        node = QueueSimNode(
            node_id,
            self._config(node_id),
            membership,
            self.oracle,
            random.Random(self.rng.getrandbits(64)),
            self._new_incarnation(),
        )
        self.equip(node)
        self.nodes[node_id] = node
        node.start(random.Random(self.rng.getrandbits(64)))
        return node

    def process(self, node: SimNode) -> None:
        """The harness's adapter loop; a :class:`SimulatedCrash` inside it kills the node."""
        try:
            super().process(node)
        except SimulatedCrash:
            self._log(f"crash {node.id} in the middle of installing a snapshot")
            self.crash_count += 1
            node.crash()

    def inject_fault(self) -> None:
        """The harness's faults, plus: arm a crash in the middle of a snapshot install."""
        s = self.scenario
        if s.crashes and s.compaction_every and self.rng.random() < 0.25:
            live = [n for _, n in sorted(self.nodes.items()) if n.core is not None]
            if live:
                node = self.rng.choice(live)
                assert isinstance(node, QueueSimNode)
                node.store.crash_during_restore = self.rng.randint(0, 5)
                self._log(f"crash {node.id} during its next snapshot install")
            return
        super().inject_fault()

    def compact(self) -> None:
        """The harness's compaction; sometimes a node crashes right after it compacted,
        before its latest applies were synced, and must restart from the snapshot."""
        before = {i: n.storage.snapshot().metadata.index for i, n in sorted(self.nodes.items())}
        super().compact()
        if not self.scenario.crashes:
            return
        for node_id in sorted(self.nodes):
            node = self.nodes[node_id]
            down = sum(1 for n in self.nodes.values() if n.core is None)
            compacted = node.storage.snapshot().metadata.index > before.get(node_id, 0)
            if node.core is None or not compacted or down >= self.scenario.max_crashed:
                continue
            if self.rng.random() < 0.15:
                self.crash_count += 1
                node.crash()
                self._log(f"crash {node_id} right after compacting")

    def check_liveness(self, budget_ticks: int = 300) -> None:
        """The harness's liveness phase, with every armed crash disarmed first."""
        for node_id in sorted(self.nodes):
            node = self.nodes[node_id]
            if isinstance(node, QueueSimNode):
                node.store.crash_during_restore = None
        super().check_liveness(budget_ticks)

    def propose(self) -> None:
        """The workload proposes a real command through a leader (or, misdirected, anyone)."""
        live = [n for _, n in sorted(self.nodes.items()) if n.core is not None]
        if not live:
            return
        leaders = [n for n in live if n.core is not None and n.core.role is Role.LEADER]
        node = self.rng.choice(leaders or live)
        assert node.core is not None and isinstance(node, QueueSimNode)
        now_ms = self.now * TICK_MS
        if node.keeper is not None:
            if not node.keeper.clock.in_bound:
                return  # the broker refuses to stamp (CLOCK_NOT_SYNCHRONIZED)
            now_ms = node.keeper.clock.now_ms(node.mono_us())
        payload = self.workload.command(node.queue, now_ms, local_settings(node.id))
        try:
            index = node.core.propose(payload)
        except (RaftNotLeaderError, ProposalDroppedError):
            return
        true_ms = (EPOCH_US + self.now * TICK_US) // 1000
        for position, (message, delay_ms) in enumerate(self.workload.published):
            self.intents[(commands.message_id(index, position), message)] = true_ms + delay_ms
        self.pending_proposals[(node.id, index)] = payload
        self.process(node)

    def step(self) -> None:
        """The harness's step, then the dispatcher model on whoever may dispatch."""
        super().step()
        if self.scenario.clocks:
            self.dispatch()

    def dispatch(self) -> None:
        """Release what is due by the dispatching node's cluster time; check each release
        against true time (see the module docstring)."""
        true_ms = (EPOCH_US + self.now * TICK_US) // 1000
        for node_id in sorted(self.nodes):
            node = self.nodes[node_id]
            core = node.core
            if core is None or node.keeper is None or not isinstance(node, QueueSimNode):
                continue
            mono = node.mono_us()
            if not node.keeper.can_dispatch(core, mono):
                continue
            if core.log.term(core.log.applied) != core.term:
                continue  # RaftNode.is_leader: the no-op of its term is not applied yet
            now_ms = node.keeper.clock.now_ms(mono)
            state = node.queue
            for gid in sorted(state.groups):
                for due_ms, mid, attempt, expire_ms in state.scan_schedule(gid, 0, 0, 4):
                    if due_ms > now_ms:
                        break
                    if expire_ms is not None and expire_ms <= now_ms:
                        continue
                    self._check_release(node_id, state, due_ms, mid, attempt, expire_ms, true_ms)

    def _check_release(
        self,
        node_id: NodeId,
        state: QueueState,
        due_ms: int,
        mid: int,
        attempt: int,
        expire_ms: int | None,
        true_ms: int,
    ) -> None:
        bound_ms = self.scenario.max_clock_offset_ms
        self.releases += 1
        where = f"node {node_id} released message {mid} at true time {true_ms}"
        if true_ms < due_ms - bound_ms // 2:
            raise InvariantViolation(f"{where}, {due_ms - true_ms} ms before its due time {due_ms}")
        if expire_ms is not None and true_ms > expire_ms + bound_ms // 2:
            raise InvariantViolation(f"{where}, {true_ms - expire_ms} ms after it expired")
        message = state.get_message(mid)
        intent = None if message is None else self.intents.get((mid, message[1]))
        if intent is not None and attempt == 0 and true_ms < intent - bound_ms:
            raise InvariantViolation(
                f"{where}, {intent - true_ms} ms before the producer's intended due time"
            )

    def run(self) -> None:
        """Run the scenario and the liveness phase, then the whole-state checks."""
        super().run()
        self.oracle.check_all()
        for node_id in sorted(self.nodes):
            node = self.nodes[node_id]
            if node.core is None or not isinstance(node, QueueSimNode):
                continue
            check_consistent(node.queue)
            if node.store.digest() != node.store.full_digest():
                raise InvariantViolation(f"node {node_id}: incremental digest drifted")
            if node.store.digest() != self.checker.digest_at[node.sm.applied_index]:
                raise InvariantViolation(f"node {node_id} differs at its applied index")

    def statistics(self) -> dict[str, int]:
        """Counts that show a run exercised what it should."""
        nodes = [n for n in self.nodes.values() if isinstance(n, QueueSimNode)]
        return {
            "committed": self.oracle.state.applied_index,
            "messages_published": self.oracle.published,
            "snapshot_installs": self.oracle.installs,
            "restored_on_start": sum(n.restored_on_start for n in nodes),
            "interrupted_restores": sum(n.interrupted_restores for n in nodes),
            "crashes": self.crash_count,
            "releases": self.releases,
            "clock_faults": self.clock_faults,
            "group_settings_seen": len(self.oracle.settings_seen),
            "purges": self.oracle.purges,
            "managed": self.oracle.managed,
            "backfilled": self.oracle.backfilled,
            "backfill_chunks_by_id": self.oracle.chunks_by_id,
        }


def run_queue_seed(seed: int) -> QueueSimCluster:
    """Run one seed end to end; raises :class:`InvariantViolation` on failure."""
    cluster = QueueSimCluster(seed, queue_scenario_for_seed(seed))
    cluster.run()
    return cluster
