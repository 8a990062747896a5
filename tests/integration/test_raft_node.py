"""RaftNode clusters in one process over real TCP on 127.0.0.1 (STYLE.md §8).

Each member has its own RocksDB in ``tmp_path``, a :class:`Transport` on port 0 and a
:class:`ListMachine` (the applied commands, in order, with snapshots). All members
share one :class:`AddressBook`; a restarted member gets a new port and updates it.
Ticks are 10 ms and the election timeout 15 ticks so elections take ~0.2 s. Peers
authenticate with a cluster secret unless a test says otherwise.
"""

from __future__ import annotations

import random
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import msgpack
import pytest
import trio
import trustme

from futureq.errors import NotLeaderError, RequestError
from futureq.raft import peer_auth
from futureq.raft.message_codec import encode_message
from futureq.raft.messages import (
    AppendEntries,
    ClockPing,
    Heartbeat,
    LogIndex,
    Message,
    NodeId,
    Ready,
    Sender,
    Term,
)
from futureq.raft.node import RaftNode
from futureq.raft.node_config import RaftNodeConfig
from futureq.raft.rocks_storage import RocksStorage
from futureq.raft.roles import Role
from futureq.raft.transport import (
    DEFAULT_MAX_PENDING_HANDSHAKES,
    MAX_PENDING_HANDSHAKES_PER_HOST,
    AddressBook,
    Transport,
)
from futureq.raft.values import Entry
from futureq.storage.db import Database
from futureq.wire.codec import NEED_DATA, FrameDecoder, encode_value

WAIT_S = 10.0
SECRET = b"in-process test cluster secret, 40 bytes"


class ListSource:
    """Point-in-time copy of a :class:`ListMachine`."""

    def __init__(self, index: int, items: list[bytes]) -> None:
        self.index = index
        self._items = items

    def serialize(self) -> bytes:
        packed: bytes = msgpack.packb(self._items)
        return packed

    def close(self) -> None:
        self._items = []


class ListMachine:
    """The applied commands, in order; ``apply`` returns the list's new length."""

    def __init__(self) -> None:
        self.items: list[bytes] = []
        self._applied = 0
        self.restored_from: list[int] = []

    @property
    def applied_index(self) -> int:
        return self._applied

    def apply(self, index: int, data: bytes) -> Any:
        assert index == self._applied + 1, (index, self._applied)
        self.items.append(data)
        self._applied = index
        return len(self.items)

    def apply_other(self, index: int) -> None:
        assert index == self._applied + 1, (index, self._applied)
        self._applied = index

    def snapshot_source(self) -> ListSource:
        return ListSource(self._applied, list(self.items))

    def restore(self, data: bytes, index: int) -> None:
        self.items = list(msgpack.unpackb(data))
        self._applied = index
        self.restored_from.append(index)


class StepsMachine(ListMachine):
    """A :class:`ListMachine` applied in steps, which records what each apply was given
    besides the bytes (the proposer's own reading of them, or None)."""

    def __init__(self) -> None:
        super().__init__()
        self.given: list[Any] = []

    def apply_steps(self, index: int, data: bytes, decoded: Any = None) -> Any:
        self.given.append(decoded)
        if decoded is not None:
            assert decoded == data.decode(), (decoded, data)
        yield
        return self.apply(index, data)


class StalledDiskStorage(RocksStorage):
    """Real RocksDB whose synced writes wait while ``stall`` is set: a disk (or a host)
    so busy that an fsync takes seconds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stall = threading.Event()
        self.released = threading.Event()
        self.stalled = threading.Event()

    def persist(self, ready: Ready) -> None:
        if ready.must_sync and self.stall.is_set():
            self.stalled.set()
            assert self.released.wait(WAIT_S), "the test never released the stalled write"
        super().persist(ready)


@attrs.define
class Member:
    node_id: int
    path: Path
    node: RaftNode
    transport: Transport
    sm: ListMachine
    storage: StalledDiskStorage
    db: Database
    scope: trio.CancelScope
    stopped: trio.Event


class Cluster:
    """Start, crash and restart members inside the test's nursery."""

    def __init__(
        self,
        tmp_path: Path,
        nursery: trio.Nursery,
        *,
        tls: Callable[[int], tuple[ssl.SSLContext, ssl.SSLContext]] | None = None,
        secret: bytes | None = SECRET,
        machine: Callable[[], ListMachine] = ListMachine,
        **config: Any,
    ) -> None:
        self.tls = tls
        self.machine = machine
        self.secret = secret
        self.tmp_path = tmp_path
        self.nursery = nursery
        self.book = AddressBook()
        self.config = {"tick_ms": 10, "election_timeout_ticks": 15, **config}
        self.members: dict[int, Member] = {}

    async def start(
        self, node_id: int, voters: frozenset[int] = frozenset(), **config: Any
    ) -> Member:
        path = self.tmp_path / f"n{node_id}"
        db = Database(str(path / "db"))
        storage = StalledDiskStorage(db, str(path / "snapshots"))
        client_address = f"client-{node_id}:1"
        contexts = None if self.tls is None else self.tls(node_id)
        transport = Transport(
            node_id,
            "127.0.0.1:0",
            self.book,
            cluster_id="test",
            client_address=client_address,
            rng=random.Random(node_id),
            backoff_max_s=0.2,
            ssl_server=None if contexts is None else contexts[0],
            ssl_client=None if contexts is None else contexts[1],
            secret=self.secret,
        )
        sm = self.machine()
        node_config = RaftNodeConfig(
            node_id=node_id,
            bootstrap_voters=voters,
            client_address=client_address,
            # These clusters are brand new: a majority of blank voters may form one
            # (docs/raft.md, "Disk faults"); restarts are not affected.
            **{"new_cluster": True, **self.config, **config},
        )
        node = RaftNode(node_config, storage, transport, sm, rng=random.Random(100 + node_id))
        member = Member(
            node_id, path, node, transport, sm, storage, db, trio.CancelScope(), trio.Event()
        )
        self.members[node_id] = member
        await self.nursery.start(self._run_member, member, client_address)
        return member

    async def _run_member(
        self, member: Member, client_address: str, *, task_status: trio.TaskStatus[None]
    ) -> None:
        try:
            with member.scope:
                async with trio.open_nursery() as nursery:
                    address = await nursery.start(member.transport.run)
                    self.book.update({member.node_id: (address, client_address)})
                    await nursery.start(member.node.run)
                    task_status.started()
        finally:
            member.db.close()
            member.stopped.set()

    async def crash(self, node_id: int) -> Member:
        member = self.members.pop(node_id)
        member.scope.cancel()
        await member.stopped.wait()
        return member

    async def stop_all(self) -> None:
        for node_id in list(self.members):
            await self.crash(node_id)

    def running(self) -> list[Member]:
        return list(self.members.values())

    async def wait_for(
        self, condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S
    ) -> None:
        with trio.move_on_after(timeout_s):
            while not condition():  # noqa: ASYNC110 - polls state of several nodes, under a deadline
                await trio.sleep(0.005)
            return
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")

    async def wait_leader(self, among: list[int] | None = None) -> Member:
        ids = among if among is not None else list(self.members)

        def one_leader() -> bool:
            leaders = [i for i in ids if i in self.members and self.members[i].node.is_leader()]
            return len(leaders) == 1

        await self.wait_for(one_leader, "a single ready leader")
        return next(self.members[i] for i in ids if self.members[i].node.is_leader())

    async def wait_converged(self, count: int | None = None) -> list[bytes]:
        def same() -> bool:
            lists = [m.sm.items for m in self.members.values()]
            if count is not None and len(lists[0]) < count:
                return False
            return all(items == lists[0] for items in lists)

        await self.wait_for(same, "all members to apply the same commands")
        return next(iter(self.members.values())).sm.items


VOTERS3 = frozenset({1, 2, 3})


async def _start(cluster: Cluster, voters: frozenset[int], **config: Any) -> None:
    for node_id in sorted(voters):
        await cluster.start(node_id, voters, **config)


async def _propose_all(member: Member, commands: list[bytes]) -> list[Any]:
    results: dict[int, Any] = {}

    async def one(i: int, command: bytes) -> None:
        results[i] = await member.node.propose(command)

    async with trio.open_nursery() as nursery:
        for i, command in enumerate(commands):
            nursery.start_soon(one, i, command)
    return [results[i] for i in range(len(commands))]


@pytest.mark.timeout(30)
async def test_elect_replicate_crash_leader_and_restart(tmp_path: Path) -> None:
    """Raft §5.2-5.4: one leader; commands apply everywhere in one order; after the
    leader crashes a new one keeps every acknowledged command; a restarted node
    recovers term, vote and log from RocksDB and catches up."""
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        await _start(cluster, VOTERS3)
        leader = await cluster.wait_leader()
        first = [b"a%d" % i for i in range(30)]
        results = await _propose_all(leader, first)
        assert sorted(results) == list(range(1, 31))  # each applied once, in some order
        items = await cluster.wait_converged(30)
        assert sorted(items) == sorted(first)
        old_term = leader.node.term

        crashed = await cluster.crash(leader.node_id)
        new_leader = await cluster.wait_leader()
        assert new_leader.node_id != crashed.node_id and new_leader.node.term > old_term
        await _propose_all(new_leader, [b"b%d" % i for i in range(10)])
        items = await cluster.wait_converged(40)
        assert items[:30] == crashed.sm.items[:30]

        restarted = await cluster.start(crashed.node_id)
        core = restarted.node.core
        assert core.term >= old_term and core.log.last_index() >= 31
        await cluster.wait_converged(40)
        assert restarted.node.leader_address() == new_leader.node.config.client_address
        await cluster.stop_all()


@pytest.mark.timeout(30)
async def test_lagging_node_catches_up_through_install_snapshot(tmp_path: Path) -> None:
    """Paper §7: a follower whose next entry was compacted away receives the snapshot
    in chunks, installs it, and continues from the log."""
    async with trio.open_nursery() as nursery:
        cluster = Cluster(
            tmp_path,
            nursery,
            compact_every_entries=20,
            keep_entries_after_compaction=5,
            snapshot_chunk_bytes=64,
        )
        await _start(cluster, VOTERS3)
        leader = await cluster.wait_leader()
        lagging = next(i for i in VOTERS3 if i != leader.node_id)
        await cluster.crash(lagging)
        for batch in range(4):
            await _propose_all(leader, [b"c%d-%d" % (batch, i) for i in range(25)])
        await cluster.wait_for(
            lambda: leader.node.core.log.first_index() > 30, "the leader to compact its log"
        )
        member = await cluster.start(lagging)
        items = await cluster.wait_converged(100)
        assert len(items) == 100
        assert member.sm.restored_from, "the lagging node should have installed a snapshot"
        await _propose_all(leader, [b"after"])
        assert (await cluster.wait_converged(101))[-1] == b"after"
        await cluster.stop_all()


@pytest.mark.timeout(30)
async def test_restart_restores_state_machine_from_local_snapshot(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = Cluster(
            tmp_path, nursery, compact_every_entries=10, keep_entries_after_compaction=2
        )
        await _start(cluster, frozenset({1}))
        leader = await cluster.wait_leader()
        await _propose_all(leader, [b"s%d" % i for i in range(25)])
        await cluster.wait_for(
            lambda: leader.node._storage.snapshot_metadata().index > 0, "a local snapshot"
        )
        before = list(leader.sm.items)
        await cluster.crash(1)
        member = await cluster.start(1)
        await cluster.wait_leader()
        assert member.sm.restored_from and member.sm.items == before
        await cluster.stop_all()


@pytest.mark.timeout(30)
async def test_membership_learner_promote_remove_and_remove_leader(tmp_path: Path) -> None:
    """Thesis §4.1-4.2: a learner catches up, is promoted; removing a follower and then
    the leader itself leaves a working cluster."""
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        await _start(cluster, VOTERS3)
        leader = await cluster.wait_leader()
        await _propose_all(leader, [b"m%d" % i for i in range(20)])
        await leader.node.add_learner(4)  # not started yet: never heard from
        assert leader.node.progress()[4]["answered"] is False
        learner = await cluster.start(4)  # joins with an empty configuration
        assert leader.node.membership() == (VOTERS3, frozenset({4}))
        await cluster.wait_converged(20)
        assert learner.node.membership() == (VOTERS3, frozenset({4}))
        assert leader.node.progress()[4]["learner"] is True
        with pytest.raises(NotLeaderError):
            await learner.node.add_learner(5)
        # A node is promoted once it has heard from every voter after its start
        # (docs/raft.md, "Disk faults"); until then it would not count.
        await cluster.wait_for(
            lambda: leader.node.progress()[4]["recovering"] is False, "the learner's recovery"
        )
        assert leader.node.progress()[4]["answered"] is True
        await leader.node.promote(4)
        assert leader.node.membership()[0] == frozenset({1, 2, 3, 4})
        with pytest.raises(RequestError):
            await leader.node.promote(4)  # already a voter
        follower = next(i for i in VOTERS3 if i != leader.node_id)
        await leader.node.remove_node(follower)
        await cluster.crash(follower)
        await leader.node.remove_node(leader.node_id)  # thesis §4.2.2
        remaining = sorted({1, 2, 3, 4} - {follower, leader.node_id})
        await cluster.crash(leader.node_id)
        new_leader = await cluster.wait_leader(remaining)
        assert new_leader.node.membership()[0] == frozenset(remaining)
        await _propose_all(new_leader, [b"after"])
        assert (await cluster.wait_converged(21))[-1] == b"after"
        await cluster.stop_all()


class _LoopPasses(trio.abc.Instrument):
    """Counts the event loop's passes over its runnable tasks (one I/O poll each)."""

    def __init__(self) -> None:
        self.count = 0

    def before_io_wait(self, timeout: float) -> None:
        self.count += 1


@pytest.mark.timeout(30)
async def test_a_burst_from_a_peer_is_taken_in_without_a_loop_pass_per_message(
    tmp_path: Path,
) -> None:
    """Peer messages that have arrived are taken in together, not one per pass of the
    event loop. On a loaded machine a pass over every task is slow; a leader that took
    in one message per pass fell seconds behind its followers' answers (its lease lost,
    clock pongs too old to use, each membership step 2-4 s): the time branch's extra
    clock traffic tipped the membership test over on a busy host."""
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        await _start(cluster, VOTERS3)
        leader = await cluster.wait_leader()
        follower = next(m for m in cluster.running() if m is not leader)
        burst = 2000
        # Pings the follower will not take for its own when the answers come back.
        not_ours = 1 << 62
        passes = _LoopPasses()
        before = leader.transport.stats.received_messages

        def taken_in() -> bool:
            return (
                leader.transport.stats.received_messages >= before + burst
                and leader.transport.receive_channel.statistics().current_buffer_used == 0
            )

        trio.lowlevel.add_instrument(passes)
        try:
            for _ in range(burst):
                follower.transport.send(
                    ClockPing(Term(0), NodeId(follower.node_id), NodeId(leader.node_id), not_ours)
                )
            await cluster.wait_for(taken_in, "the leader to take in the burst")
        finally:
            trio.lowlevel.remove_instrument(passes)
        assert passes.count < burst // 4, passes.count
        await cluster.wait_leader()
        await cluster.stop_all()


async def test_clock_pings_are_answered_while_the_disk_write_stalls(tmp_path: Path) -> None:
    """A follower whose fsync takes seconds still answers clock pings at once: the round
    trips the leader measures stay those of the network. When the answer waited for the
    driver, every clock sample on a busy host came back too slow to use and restarted
    nodes stayed unsynchronized, unable to campaign, for over a minute (issue 15)."""
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        await _start(cluster, VOTERS3)
        leader = await cluster.wait_leader()
        follower = next(m for m in cluster.running() if m is not leader)
        follower.storage.stall.set()
        try:
            await leader.node.propose(b"x")  # the other follower makes the majority
            with trio.fail_after(WAIT_S):
                while not follower.storage.stalled.is_set():  # noqa: ASYNC110 - a thread's flag
                    await trio.sleep(0.01)
            await trio.sleep(1.0)  # the follower's driver waits for its write meanwhile
            heard_ms = leader.node.progress()[follower.node_id]["last_heard_ms"]
            round_trip_us = leader.node.timekeeper.clock.peer_round_trip_us(follower.node_id)
        finally:
            follower.storage.released.set()
        # Pings leave every 4 ticks (40 ms): answered, they keep the follower heard from.
        assert heard_ms is not None and heard_ms < 500, heard_ms
        assert round_trip_us is not None and round_trip_us < 500_000, round_trip_us
        await cluster.wait_converged(1)
        await cluster.stop_all()


@pytest.mark.timeout(30)
async def test_transfer_read_barrier_and_role_changes(tmp_path: Path) -> None:
    """Thesis §3.10 transfer to a chosen node; §6.4 ReadIndex on the leader;
    followers refuse with the leader's client address; role epochs report changes."""
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        await _start(cluster, VOTERS3)
        leader = await cluster.wait_leader()
        await _propose_all(leader, [b"r%d" % i for i in range(5)])
        await leader.node.read_barrier()
        assert leader.node.applied_index >= 6
        target = next(i for i in VOTERS3 if i != leader.node_id)
        follower = cluster.members[target]
        await cluster.wait_for(follower.node.ready_for_clients, "the follower to be ready")
        with pytest.raises(NotLeaderError) as caught:
            await follower.node.read_barrier()
        assert caught.value.leader_address == leader.node.config.client_address
        with pytest.raises(NotLeaderError):
            await follower.node.propose(b"x")

        epoch = follower.node.role_epoch
        new_id = await leader.node.transfer_leadership(target)
        assert new_id == target
        with trio.fail_after(WAIT_S):
            while not follower.node.is_leader():
                epoch = await follower.node.wait_role_change(epoch)
        assert leader.node.role is Role.FOLLOWER and not leader.node.is_leader()
        assert (await follower.node.propose(b"on-new-leader")) == 6
        await follower.node.read_barrier()
        # None picks the most up-to-date other voter.
        assert await follower.node.transfer_leadership() != target
        await cluster.wait_leader()
        await cluster.stop_all()


@pytest.mark.timeout(30)
async def test_the_leader_applies_its_own_reading_of_its_entries(tmp_path: Path) -> None:
    """A proposer's decoded command goes to its own node's apply with the entry it
    proposed (same index and term), so the leader does not decode what it encoded; the
    followers apply the bytes. Every node ends with the same commands (issue 11)."""
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery, machine=StepsMachine)
        await _start(cluster, VOTERS3)
        leader = await cluster.wait_leader()
        commands = [b"c%d" % i for i in range(20)]
        async with trio.open_nursery() as proposers:
            for command in commands:
                proposers.start_soon(leader.node.propose, command, command.decode())
        items = await cluster.wait_converged(20)
        assert sorted(items) == sorted(commands)
        for member in cluster.members.values():
            assert isinstance(member.sm, StepsMachine)
            given = [g for g in member.sm.given if g is not None]
            if member is leader:
                assert sorted(given) == sorted(c.decode() for c in commands)
            else:
                assert given == [] and len(member.sm.given) == 20
        await cluster.stop_all()


async def test_propose_durable_returns_the_index(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        await _start(cluster, VOTERS3)
        leader = await cluster.wait_leader()
        index = await leader.node.propose_durable(b"d")
        # The entry at that index is ours (the leader may append its own entries too,
        # e.g. the member registry, docs/raft.md "Disk faults").
        (entry,) = leader.node.core.log.slice(LogIndex(index), LogIndex(index + 1))
        assert entry.data == b"d" and entry.term == leader.node.term
        await cluster.wait_converged(1)
        await cluster.stop_all()


async def _frame(stream: trio.abc.Stream, decoder: FrameDecoder) -> object:
    while (value := decoder.next_frame()) is NEED_DATA:
        decoder.receive_data(bytes(await stream.receive_some(65536)))
    return value


async def _authenticate(
    stream: trio.abc.Stream, secret: bytes, from_id: int, to_id: int
) -> peer_auth.FrameSealer | None:
    """Run the connector side of the handshake as a peer holding ``secret`` would."""
    handshake = peer_auth.ConnectorHandshake(
        cluster_id="test",
        node_id=from_id,
        peer_id=to_id,
        raft_address="127.0.0.1:1",
        client_address=None,
        secret=secret,
        nonce=bytes(range(32)),
    )
    decoder = FrameDecoder(peer_auth.MAX_HANDSHAKE_FRAME_BYTES, parse=False)
    await stream.send_all(encode_value(handshake.hello.to_wire()))
    proof = handshake.receive_challenge(await _frame(stream, decoder))
    await stream.send_all(encode_value(proof.to_wire()))
    handshake.receive_verdict(await _frame(stream, decoder))
    return handshake.sealer


@pytest.mark.timeout(30)
async def test_garbage_on_the_raft_port_hurts_only_that_link(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        await _start(cluster, VOTERS3)
        leader = await cluster.wait_leader()
        address = leader.transport.bound_address
        assert address is not None
        host, port = address.rsplit(":", 1)
        heartbeat = encode_message(
            Heartbeat(Term(1), NodeId(2), NodeId(leader.node_id), LogIndex(0))
        )
        hello = peer_auth.Hello(
            "test", NodeId(9), NodeId(leader.node_id), "127.0.0.1:1", None, bytes(32)
        )
        attacks = [
            b"\x00\x00\x00\x05hello",  # not msgpack
            b"GET / HTTP/1.1\r\n\r\n",  # a huge length header
            encode_value(attrs.evolve(hello, cluster_id="other-cluster").to_wire()),
            # the unauthenticated version-1 handshake, then a message
            encode_value(["futureq-raft", 1, "test", 9, "127.0.0.1:1", None])
            + encode_value(heartbeat),
            # a HELLO, then garbage or a message where the proof belongs
            encode_value(hello.to_wire()) + encode_value([1, 2]),
            encode_value(hello.to_wire()) + encode_value(heartbeat),
            encode_value(hello.to_wire()) + encode_value(peer_auth.Proof(bytes(32)).to_wire()),
        ]
        for attack in attacks:
            with trio.fail_after(WAIT_S):
                stream = await trio.open_tcp_stream(host, int(port))
                async with stream:
                    await stream.send_all(attack)
                    with trio.move_on_after(1):
                        while await stream.receive_some(1024):
                            pass
        # Authenticated peers that misbehave after the handshake lose their link too.
        for after_handshake in ("garbage", "other sender", "unsealed"):
            with trio.fail_after(WAIT_S):
                stream = await trio.open_tcp_stream(host, int(port))
                async with stream:
                    sealer = await _authenticate(stream, SECRET, 8, leader.node_id)
                    assert sealer is not None
                    if after_handshake == "garbage":
                        frame = encode_value(sealer.seal(b"\xc1"))
                    elif after_handshake == "other sender":
                        frame = encode_value(sealer.seal(heartbeat))  # says node 2, not 8
                    else:
                        frame = encode_value(heartbeat)
                    await stream.send_all(frame)
                    with trio.move_on_after(1):
                        while await stream.receive_some(1024):
                            pass
        await cluster.wait_for(
            lambda: leader.transport.stats.inbound_protocol_errors >= len(attacks) + 3,
            "the bad connections to be refused",
        )
        # What an unauthenticated peer said about itself was not believed.
        assert 9 not in leader.transport._learned and 8 in leader.transport._learned
        assert leader.node.is_leader()
        await _propose_all(leader, [b"still-fine"])
        await cluster.wait_converged(1)
        await cluster.stop_all()


@pytest.mark.timeout(30)
async def test_unauthenticated_connections_cost_bounded_memory(tmp_path: Path) -> None:
    """Before the handshake a frame may hold at most 8 KiB, and at most
    ``max_pending_handshakes`` connections wait in their handshake, at most
    ``MAX_PENDING_HANDSHAKES_PER_HOST`` of them from one address; beyond that new ones
    are closed at once. The peers' own links keep working throughout."""
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        await _start(cluster, VOTERS3)
        leader = await cluster.wait_leader()
        assert leader.transport.bound_address is not None
        host, port = leader.transport.bound_address.rsplit(":", 1)
        with trio.fail_after(WAIT_S):
            big = await trio.open_tcp_stream(host, int(port))
            async with big:
                await big.send_all((peer_auth.MAX_HANDSHAKE_FRAME_BYTES + 1).to_bytes(4, "big"))
                while await big.receive_some(1024):  # refused at the header
                    pass
        idle: list[trio.SocketStream] = []
        per_host = MAX_PENDING_HANDSHAKES_PER_HOST
        hosts = [f"127.0.0.{2 + n}" for n in range(DEFAULT_MAX_PENDING_HANDSHAKES // per_host)]
        try:
            with trio.fail_after(WAIT_S):
                # One address gets its share of the slots, not more (found by a flood of
                # half handshakes from one host, which locked the real peers out)...
                for _ in range(per_host):
                    idle.append(await trio.open_tcp_stream(host, int(port), local_address=hosts[0]))
                await cluster.wait_for(
                    lambda: (
                        leader.transport._handshake_slots.value
                        == DEFAULT_MAX_PENDING_HANDSHAKES - per_host
                    ),
                    "one address's share of the handshake slots to be taken",
                )
                extra = await trio.open_tcp_stream(host, int(port), local_address=hosts[0])
                async with extra:
                    with trio.fail_after(1):  # at once, not after the 2 s handshake deadline
                        assert await extra.receive_some(1024) == b""
                # ...while a peer from another address still gets through.
                peer = await trio.open_tcp_stream(host, int(port))
                async with peer:
                    assert await _authenticate(peer, SECRET, 8, leader.node_id) is not None
                # Many addresses together still get no more than every slot.
                for other in hosts[1:]:
                    for _ in range(per_host):
                        idle.append(
                            await trio.open_tcp_stream(host, int(port), local_address=other)
                        )
                await cluster.wait_for(
                    lambda: leader.transport._handshake_slots.value == 0,
                    "every handshake slot to be taken by an idle connection",
                )
                extra = await trio.open_tcp_stream(host, int(port))
                async with extra:
                    assert await extra.receive_some(1024) == b""  # closed at once
            assert leader.transport.stats.inbound_refused_busy >= 2
            await _propose_all(leader, [b"during"])
        finally:
            for stream in idle:
                await stream.aclose()
        await cluster.wait_converged(1)
        await cluster.stop_all()


@pytest.mark.timeout(30)
async def test_a_node_with_another_secret_takes_no_part(tmp_path: Path) -> None:
    """A member started with the wrong secret is refused by every peer (and refuses
    them): the others elect a leader and commit without it; it never applies a thing."""
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        await cluster.start(1, VOTERS3)
        await cluster.start(2, VOTERS3)
        cluster.secret = b"another secret of thirty-two bytes or more"
        outsider = await cluster.start(3, VOTERS3)
        leader = await cluster.wait_leader(among=[1, 2])
        await _propose_all(leader, [b"x%d" % i for i in range(5)])
        await cluster.wait_for(
            lambda: (
                outsider.transport.stats.refusals.get("secret", 0) > 0
                and leader.transport.stats.refusals.get("secret", 0) > 0
            ),
            "both sides to refuse each other",
        )
        assert outsider.sm.items == [] and outsider.node.term <= leader.node.term
        assert outsider.transport.stats.received_messages == 0
        await cluster.stop_all()


@pytest.mark.timeout(30)
async def test_cluster_without_a_secret_still_runs(tmp_path: Path) -> None:
    """The insecure mode (no secret, no TLS) still forms a cluster: proofs are empty."""
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery, secret=None)
        await _start(cluster, VOTERS3)
        leader = await cluster.wait_leader()
        await _propose_all(leader, [b"p%d" % i for i in range(5)])
        await cluster.wait_converged(5)
        await cluster.stop_all()


@pytest.mark.timeout(40)
async def test_five_nodes_survive_two_crashes(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery)
        voters = frozenset({1, 2, 3, 4, 5})
        await _start(cluster, voters)
        leader = await cluster.wait_leader()
        await _propose_all(leader, [b"f%d" % i for i in range(20)])
        await cluster.wait_converged(20)
        other = next(i for i in voters if i != leader.node_id)
        await cluster.crash(leader.node_id)
        await cluster.crash(other)
        new_leader = await cluster.wait_leader()
        await _propose_all(new_leader, [b"g%d" % i for i in range(20)])
        items = await cluster.wait_converged(40)
        assert sorted(items[:20]) == sorted(b"f%d" % i for i in range(20))
        await cluster.stop_all()


def _node_tls(
    ca: trustme.CA, names: dict[int, str]
) -> Callable[[int], tuple[ssl.SSLContext, ssl.SSLContext]]:
    """Per node: a certificate naming ``names[node_id]`` (and 127.0.0.1), server side
    requiring client certificates."""

    def contexts(node_id: int) -> tuple[ssl.SSLContext, ssl.SSLContext]:
        cert = ca.issue_cert("127.0.0.1", names[node_id])
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.verify_mode = ssl.CERT_REQUIRED
        ca.configure_trust(server)
        cert.configure_cert(server)
        client = ssl.create_default_context()
        ca.configure_trust(client)
        cert.configure_cert(client)
        return server, client

    return contexts


@pytest.mark.timeout(30)
async def test_cluster_over_tls(tmp_path: Path) -> None:
    ca = trustme.CA()
    names = {n: peer_auth.node_dns_name("test", n) for n in VOTERS3}
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery, tls=_node_tls(ca, names), secret=None)
        await _start(cluster, VOTERS3)
        leader = await cluster.wait_leader()
        await _propose_all(leader, [b"t%d" % i for i in range(10)])
        await cluster.wait_converged(10)
        await cluster.stop_all()


@pytest.mark.timeout(30)
async def test_tls_certificate_of_another_node_is_refused(tmp_path: Path) -> None:
    """Node 3 holds a CA-signed certificate, but it names node 2: both directions of
    its links are refused, so it never speaks as node 3 (nor as 2)."""
    ca = trustme.CA()
    names = {1: peer_auth.node_dns_name("test", 1), 2: peer_auth.node_dns_name("test", 2)}
    names[3] = names[2]
    async with trio.open_nursery() as nursery:
        cluster = Cluster(tmp_path, nursery, tls=_node_tls(ca, names), secret=None)
        await _start(cluster, VOTERS3)
        leader = await cluster.wait_leader(among=[1, 2])
        await _propose_all(leader, [b"c%d" % i for i in range(3)])
        impostor = cluster.members[3]
        await cluster.wait_for(
            lambda: (
                impostor.transport.stats.refusals.get("refused", 0) > 0
                and leader.transport.stats.refusals.get("certificate", 0) > 0
            ),
            "the certificate naming node 2 to be refused as node 3",
        )
        assert impostor.sm.items == [] and impostor.transport.stats.received_messages == 0
        await cluster.stop_all()


async def _two_transports(nursery: trio.Nursery) -> tuple[Transport, Transport]:
    """Nodes 1 and 2's transports on 127.0.0.1, running in ``nursery``, each in the
    other's address book: ``(sender, receiver)``."""
    book = AddressBook()
    transports = {
        n: Transport(n, "127.0.0.1:0", book, cluster_id="test", secret=SECRET) for n in (1, 2)
    }
    for n, transport in transports.items():
        book.update({n: (await nursery.start(transport.run), None)})
    return transports[1], transports[2]


async def test_messages_written_at_once_and_queued_arrive_whole_and_in_order() -> None:
    """On a connected, idle link ``send`` writes at once (no pass of the loop); a frame
    larger than the socket takes is finished by the link's task before the messages
    queued behind it. Every message arrives whole, in order."""
    async with trio.open_nursery() as nursery:
        sender, receiver = await _two_transports(nursery)
        sender.send(Heartbeat(Term(1), NodeId(1), NodeId(2), LogIndex(0)))
        with trio.fail_after(WAIT_S):
            first = await receiver.receive_channel.receive()  # the link is up now
        assert isinstance(first, Heartbeat)
        big = tuple(
            Entry(Term(1), LogIndex(i), data=bytes([i % 251]) * 65536) for i in range(1, 65)
        )
        sent: list[Any] = []
        for round_ in range(3):
            message = AppendEntries(
                Term(1), NodeId(1), NodeId(2), LogIndex(0), Term(0), big, LogIndex(round_)
            )
            sender.send(message)  # 4 MiB: more than the socket takes at once
            sent.append(message)
            for i in range(50):
                beat = Heartbeat(Term(1), NodeId(1), NodeId(2), LogIndex(1000 * round_ + i))
                sender.send(beat)
                sent.append(beat)
            await trio.lowlevel.checkpoint()
        received: list[Any] = []
        with trio.fail_after(WAIT_S):
            while len(received) < len(sent):
                received.append(await receiver.receive_channel.receive())
        assert [encode_message(m) for m in received] == [encode_message(m) for m in sent]
        nursery.cancel_scope.cancel()


async def test_votes_and_clock_samples_overtake_queued_replication() -> None:
    """Behind a backlog of AppendEntries and heartbeats, a vote or a clock ping goes
    first: queued behind it on a slow link it arrived seconds late, after the election or
    the round trip it was for was over (issue 15)."""
    async with trio.open_nursery() as nursery:
        sender, receiver = await _two_transports(nursery)
        backlog = 3000
        for i in range(backlog):  # queued at once: the link is not connected yet
            sender.send(Heartbeat(Term(1), NodeId(1), NodeId(2), LogIndex(i)))
        sender.send(ClockPing(Term(1), NodeId(1), NodeId(2), 42))
        received = []
        with trio.fail_after(WAIT_S):
            while len(received) < backlog + 1:
                received.append(await receiver.receive_channel.receive())
        assert isinstance(received[0], ClockPing)
        assert [m.commit for m in received[1:]] == list(range(backlog))  # type: ignore[union-attr]
        nursery.cancel_scope.cancel()


async def test_a_twin_of_node_2_is_refused_both_ways_and_a_replaced_node_2_is_taken() -> None:
    """A second process running as node 2 with its own data directory (another
    incarnation) while node 2 runs: node 1 takes none of its messages (its votes and
    acknowledgements would count as node 2's: two leaders in one term, or a commit no
    majority holds), refuses it with a sentence (which the twin logs too), and does not
    talk to it when node 2's address leads there. Once node 2 is gone for the quiet
    time, the other incarnation (a replaced disk) is taken."""
    quiet_s = 0.3
    real_id, twin_id = 0xA2, 0xB2
    books = {name: AddressBook() for name in ("node1", "real", "twin")}
    transports = {
        name: Transport(
            1 if name == "node1" else 2,
            "127.0.0.1:0",
            books[name],
            cluster_id="test",
            secret=SECRET,
            incarnation={"node1": 0x11, "real": real_id, "twin": twin_id}[name],
            incarnation_quiet_s=quiet_s,
            backoff_max_s=0.1,
        )
        for name in books
    }
    node1, real, twin = transports["node1"], transports["real"], transports["twin"]
    received: list[Message] = []
    real_scope = trio.CancelScope()

    async def run_real(task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        with real_scope:
            await real.run(task_status=task_status)

    async def collect() -> None:
        async for message in node1.receive_channel:
            received.append(message)

    def beat(sender: int, to_id: int, incarnation: int) -> Heartbeat:
        return Heartbeat(
            Term(1), NodeId(sender), NodeId(to_id), LogIndex(0), sender=Sender(incarnation)
        )

    async def until(
        condition: Callable[[], bool], what: str, *sends: tuple[Transport, Heartbeat]
    ) -> None:
        """Send ``sends`` every 20 ms until ``condition`` holds (at most WAIT_S)."""
        with trio.move_on_after(WAIT_S):
            while not condition():
                for transport, message in sends:
                    transport.send(message)
                await trio.sleep(0.02)
        assert condition(), f"waited {WAIT_S} s for {what}"

    async with trio.open_nursery() as nursery:
        node1_address = await nursery.start(node1.run)
        real_address = await nursery.start(run_real)
        twin_address = await nursery.start(twin.run)
        nursery.start_soon(collect)
        books["real"].update({1: (node1_address, None)})
        books["node1"].update({2: (real_address, None)})
        await until(
            lambda: any(m.sender.incarnation == real_id for m in received),
            "node 2's heartbeat",
            (real, beat(2, 1, real_id)),
        )
        books["twin"].update({1: (node1_address, None)})  # started while node 2 runs
        # The twin dials node 1: refused, with the sentence, on both sides.
        await until(
            lambda: (
                node1.stats.refusals.get("twin", 0) > 0
                and twin.stats.refusals.get("refused", 0) > 0
            ),
            "the twin to be refused",
            (twin, beat(2, 1, twin_id)),
            (real, beat(2, 1, real_id)),
        )
        # Node 1 dials node 2's address and reaches the twin: refused too.
        inbound_refusals = node1.stats.refusals["twin"]
        books["node1"].update({2: (twin_address, None)})
        await until(
            lambda: (
                node1.stats.connect_failures > 0
                and node1.stats.refusals["twin"] > inbound_refusals + 1
            ),
            "node 1's link to the twin to be refused",
            (node1, beat(1, 2, 0x11)),
            (real, beat(2, 1, real_id)),
        )
        assert twin.stats.received_messages == 0
        assert not any(m.sender.incarnation == twin_id for m in received)
        # Node 2 stops for good (its disk is replaced): the other incarnation is taken.
        real_scope.cancel()
        await until(
            lambda: (
                any(m.sender.incarnation == twin_id for m in received)
                and twin.stats.received_messages > 0
            ),
            "the replaced node 2 to be taken both ways",
            (twin, beat(2, 1, twin_id)),
            (node1, beat(1, 2, 0x11)),
        )
        nursery.cancel_scope.cancel()


async def test_a_message_stamped_with_another_incarnation_than_announced_closes_the_link() -> None:
    """The admission was for the incarnation the handshake announced: a message stamped
    with another one is not taken (unstamped ones, such as clock samples, are)."""
    book = AddressBook()
    sender = Transport(2, "127.0.0.1:0", book, cluster_id="test", secret=SECRET, incarnation=0xA)
    receiver = Transport(1, "127.0.0.1:0", book, cluster_id="test", secret=SECRET, incarnation=1)
    async with trio.open_nursery() as nursery:
        for n, transport in ((2, sender), (1, receiver)):
            book.update({n: (await nursery.start(transport.run), None)})
        sender.send(ClockPing(Term(1), NodeId(2), NodeId(1), 7))  # unstamped
        with trio.fail_after(WAIT_S):
            assert isinstance(await receiver.receive_channel.receive(), ClockPing)
        sender.send(Heartbeat(Term(1), NodeId(2), NodeId(1), LogIndex(0), sender=Sender(0xC)))
        with trio.fail_after(WAIT_S):
            while receiver.stats.inbound_protocol_errors == 0:  # noqa: ASYNC110 - polls a counter, under a deadline
                await trio.sleep(0.01)
        assert receiver.receive_channel.statistics().current_buffer_used == 0
        nursery.cancel_scope.cancel()


@pytest.mark.timeout(30)
async def test_a_peer_with_mutual_tls_and_one_without_name_the_mismatch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Node 1 with peer mutual TLS, node 2 without (a secret only): node 1's link to
    node 2 failed at the TLS handshake, logged at DEBUG only, so node 2 looked merely
    down; node 1's listener dropped node 2's plaintext connections at DEBUG too, and
    node 2 logged "frame of 369295618 bytes exceeds the limit". Each side now names
    the mismatch (found by a tester)."""
    ca = trustme.CA()
    server, client = _node_tls(ca, {1: peer_auth.node_dns_name("test", 1)})(1)
    book = AddressBook()
    tls_node = Transport(
        1, "127.0.0.1:0", book, cluster_id="test", ssl_server=server, ssl_client=client
    )
    plain_node = Transport(2, "127.0.0.1:0", book, cluster_id="test", secret=SECRET)
    async with trio.open_nursery() as nursery:
        for n, transport in ((1, tls_node), (2, plain_node)):
            book.update({n: (await nursery.start(transport.run), None)})
        tls_node.send(Heartbeat(Term(1), NodeId(1), NodeId(2), LogIndex(0)))
        plain_node.send(Heartbeat(Term(1), NodeId(2), NodeId(1), LogIndex(0)))
        with trio.fail_after(WAIT_S):
            while 2 not in tls_node.link_refusals() or not any(  # noqa: ASYNC110 - polls a log and a link, under a deadline
                "a connection without TLS arrived" in r.getMessage() for r in caplog.records
            ):
                await trio.sleep(0.05)
        refusal = tls_node.link_refusals()[2]
        assert "node 2's Raft port at " in refusal and "answers without TLS" in refusal, refusal
        assert "give every node the same [tls] settings" in refusal
        assert any(
            "a TLS handshake arrived on this node's Raft port" in r.getMessage()
            for r in caplog.records
        )
        nursery.cancel_scope.cancel()
