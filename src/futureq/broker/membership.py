"""Cluster membership requests: status, adding and removing nodes, leadership transfer.

Plain functions over a :class:`~futureq.broker.broker.Broker` whose command log is a Raft
node (a single node refuses with INVALID_ARGUMENT): the CLUSTER_STATUS_OK view, ADD_NODE
(addresses recorded, a learner added, promoted by the promoter task once caught up,
thesis §4.2.1), REMOVE_NODE, and leadership transfer, before which the first deliveries
out are recorded (:func:`hold_and_record_deliveries`).

Source: ``docs/protocol.md``, the cluster requests; ``docs/raft.md``, "Membership".
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

from futureq.config import WILDCARD_HOSTS, host_keys, same_address, split_host_port
from futureq.errors import ErrorCode, FutureQError, NotLeaderError, RequestError
from futureq.raft.cluster_clock import describe_offset
from futureq.rate_limited_log import RateLimitedLog
from futureq.state import commands

from . import handover_handed

if TYPE_CHECKING:
    from .broker import Broker

log = logging.getLogger(__name__)
clock_log = RateLimitedLog(log, per_minute=2, about="learners kept back by their clocks")
"""A learner kept back by its clock is checked ten times a second: logged twice a minute."""

PROMOTE_TIMEOUT_S = 600
RECORD_BEFORE_HANDOVER_S = 5.0
"""Longest a leader handing over (shutdown, transfer, balancing) waits to record the
attempts of its first deliveries out (s): a log that cannot commit (no quorum) fails
its proposals within an election timeout or two (check-quorum), so this bounds only
what should not happen; past it the handover goes on without them."""
PROMOTE_LAG_ENTRIES = 64
"""A learner this close to the commit index is promoted to voter (entries)."""


def cluster_log(broker: Broker) -> Any:
    if not hasattr(broker.log, "add_learner"):
        raise RequestError(
            ErrorCode.INVALID_ARGUMENT,
            "this node runs alone (no --peers or --join); start nodes as a cluster to change membership",
        )
    return broker.log


def cluster_status(broker: Broker) -> dict[str, Any]:
    """The CLUSTER_STATUS_OK map: this node's view of membership, term and progress."""
    node = broker.log
    if not hasattr(node, "membership"):
        view: dict[str, Any] = dict(node.cluster_status())  # type: ignore[attr-defined]
    else:
        voters, learners = node.membership()
        progress = node.progress()  # type: ignore[attr-defined]  # leader only
        commit_index = int(node.commit_index)  # type: ignore[attr-defined]
        role = node.role.value  # type: ignore[attr-defined]
        if broker.node_id in learners:
            role = "learner"
        refusals = node.link_refusals()  # type: ignore[attr-defined]
        members = []
        for member in sorted(voters | learners):
            raft_address, client_address = node.member_addresses(member)  # type: ignore[attr-defined]
            entry: dict[str, Any] = {
                "node_id": member,
                "role": "learner" if member in learners else "voter",
            }
            if raft_address:
                entry["raft_address"] = raft_address
            if client_address:
                entry["client_address"] = client_address
            if member in progress:
                entry["match_index"] = progress[member]["match"]
                entry["lag"] = max(0, commit_index - progress[member]["match"])
                entry["last_heard_ms"] = progress[member].get("last_heard_ms")
                entry["recovering"] = progress[member]["recovering"]
            if member in refusals:
                # A node that answers but is refused (another cluster id, secret, shard
                # layout) looked merely down or silent (found by a tester).
                entry["refused"] = refusals[member]
            members.append(entry)
        view = {
            "role": role,
            "term": int(node.term),  # type: ignore[attr-defined]
            "leader_id": node.leader_id(),  # type: ignore[attr-defined]
            "leader_address": node.leader_address(),
            "commit_index": commit_index,
            "applied_index": node.applied_index,
            "voters": sorted(voters),
            "learners": sorted(learners),
            "nodes": members,
            "recovering": node.recovering(),  # type: ignore[attr-defined]
            "recovery_waiting_for": node.recovery_waiting_for(),  # type: ignore[attr-defined]
            "last_campaign": node.last_campaign(),  # type: ignore[attr-defined]
        }
    view["node_id"] = broker.node_id
    view["cluster_id"] = broker.config.cluster.cluster_id
    clock = broker.clock_status()
    if clock is not None:
        view["clock"] = clock
        offsets = clock["offsets_ms"]
        for member in view.get("nodes", []):
            offset = offsets.get(str(member["node_id"]))
            if offset is not None:
                member["clock_offset_ms"] = offset
    addresses = broker.state.node_addresses
    for node in view.get("nodes", []):
        known = addresses.get(node["node_id"])
        if known is not None:
            node.setdefault("raft_address", known[0])
            node.setdefault("client_address", known[1])
    return view


def member_client_addresses(broker: Broker) -> list[str]:
    """Client addresses (``host:port``) of the voters of this node's Raft group, by
    node id, this node's included, for HELLO_OK's ``members`` (protocol version 2): a
    client keeps them as servers to try when those it was given fail. A voter whose
    client address this node does not know yet, or knows only as a wildcard or port 0,
    is left out; a single node lists itself."""
    node = broker.log
    if not hasattr(node, "membership"):
        candidates = [node.leader_address()]
    else:
        voters, _ = node.membership()
        known = broker.state.node_addresses
        candidates = []
        for member in sorted(voters):
            client_address = node.member_addresses(member)[1]  # type: ignore[attr-defined]
            if client_address is None and member in known:
                client_address = known[member][1]
            candidates.append(client_address)
    members: list[str] = []
    for address in candidates:
        if address is None or address in members:
            continue
        try:
            host, port = split_host_port(address)
        except ValueError:
            continue
        if host not in WILDCARD_HOSTS and port != 0:
            members.append(address)
    return members


async def add_node(broker: Broker, node_id: int, raft_address: str, client_address: str) -> None:
    """The work of :meth:`Broker.add_node` (its docstring: arguments, result, errors)."""
    cluster = cluster_log(broker)
    broker._require_leader()
    if not 1 <= node_id <= commands.MAX_NODE_ID:
        raise RequestError(
            ErrorCode.INVALID_ARGUMENT,
            f"node_id must be between 1 and {commands.MAX_NODE_ID}, got {node_id}",
        )
    for name, address in (("raft_address", raft_address), ("client_address", client_address)):
        try:
            host, port = split_host_port(address)
        except ValueError as exc:
            raise RequestError(ErrorCode.INVALID_ARGUMENT, f"{name}: {exc}") from None
        if host in WILDCARD_HOSTS:
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT,
                f"{name} {address!r} is a wildcard address that peers and clients cannot "
                "reach; give the node's own HOST:PORT (its --advertise-raft or "
                "--advertise-client)",
            )
        if port == 0:
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT, f"{name} {address!r} must name a real port, not 0"
            )
    if same_address(raft_address, client_address):
        # Accepted before, and the node was added with an address it cannot serve on
        # both ports (found by a tester).
        raise RequestError(
            ErrorCode.INVALID_ARGUMENT,
            f"raft_address and client_address are both {raft_address!r}; give the node's "
            "Raft address (its --advertise-raft or --raft-listen) and its client address "
            "(--advertise-client or --listen), which are two ports",
        )
    voters, learners = cluster.membership()
    # By the machine each address names, not its text: `localhost:P` was taken for
    # another node than a member at `127.0.0.1:P`, and the "new" node was that member
    # (found by a tester).
    resolved = _AddressResolver()
    for member in sorted(voters | learners):
        if member == node_id:
            continue
        for theirs in cluster.member_addresses(member):
            if theirs is None:
                continue
            for ours in (raft_address, client_address):
                if await resolved.same(ours, theirs):
                    raise RequestError(
                        ErrorCode.INVALID_ARGUMENT,
                        f"node {member} already uses {theirs}"
                        + ("" if ours == theirs else f", which {ours} also names")
                        + "; give the new node its own addresses",
                    )
    if node_id in voters:
        recorded = broker.state.node_addresses.get(node_id)
        if recorded is None:
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT,
                f"node {node_id} is already a voter; its Raft address comes from "
                "cluster.peers (--peers): to move it, correct its entry there on every node",
            )
        if same_address(raft_address, recorded[0]) and same_address(client_address, recorded[1]):
            raise RequestError(ErrorCode.INVALID_ARGUMENT, f"node {node_id} is already a voter")
        # A voter the cluster recorded (it joined) moved to other addresses: nothing
        # could tell the cluster, and its peers dialled the old one for good (found by
        # a tester). Its new addresses are recorded; its links follow them.
        await broker.log.propose(commands.node_address(node_id, raft_address, client_address))
        log.info(
            "node %d's addresses are now raft %s, client %s (were %s, %s)",
            node_id, raft_address, client_address, recorded[0], recorded[1],
        )  # fmt: skip
        return
    await broker.log.propose(commands.node_address(node_id, raft_address, client_address))
    if node_id not in learners:
        await cluster.add_learner(node_id)
    try:
        broker._promote_send.send_nowait(node_id)
    except trio.WouldBlock:
        raise RequestError(
            ErrorCode.UNAVAILABLE, "too many nodes waiting for promotion; retry"
        ) from None


RESOLVE_TIMEOUT_S = 2.0
"""Longest ``add_node`` waits for DNS to say what one host name resolves to (s); a name
not resolved by then is compared by its text alone."""


class _AddressResolver:
    """Tells whether two ``HOST:PORT`` addresses name one port of one machine: by
    :func:`~futureq.config.host_keys`, and by what their host names resolve to (each
    name asked once, within :data:`RESOLVE_TIMEOUT_S`; a name that does not resolve
    keeps only its text)."""

    def __init__(self) -> None:
        self._keys: dict[str, frozenset[str]] = {}

    async def same(self, first: str, second: str) -> bool:
        """Whether ``first`` and ``second`` share their port and a host form."""
        if same_address(first, second):
            return True
        try:
            first_host, first_port = split_host_port(first)
            second_host, second_port = split_host_port(second)
        except ValueError:
            return False
        if first_port != second_port:
            return False
        return not (await self._host_keys(first_host)).isdisjoint(
            await self._host_keys(second_host)
        )

    async def _host_keys(self, host: str) -> frozenset[str]:
        keys = self._keys.get(host)
        if keys is None:
            keys = host_keys(host)
            with trio.move_on_after(RESOLVE_TIMEOUT_S):
                try:
                    found = await trio.socket.getaddrinfo(host, None, type=trio.socket.SOCK_STREAM)
                except OSError:
                    found = []
                for entry in found:
                    keys |= host_keys(str(entry[4][0]))
            self._keys[host] = keys
        return keys


async def remove_node(broker: Broker, node_id: int) -> None:
    """The work of :meth:`Broker.remove_node` (its docstring: arguments, result, errors)."""
    cluster = cluster_log(broker)
    broker._require_leader()
    voters, learners = cluster.membership()
    if node_id not in voters and node_id not in learners:
        raise RequestError(ErrorCode.INVALID_ARGUMENT, f"node {node_id} is not a member")
    await cluster.remove_node(node_id)
    try:
        await broker.log.propose(commands.node_address(node_id, None, None))
    except NotLeaderError:
        pass  # we removed ourselves; the next leader keeps the stale address harmlessly


async def transfer_leadership(broker: Broker, node_id: int | None) -> None:
    """The work of :meth:`Broker.transfer_leadership` (its docstring: arguments, result, errors)."""
    cluster = cluster_log(broker)
    broker._require_leader()
    if node_id == broker.node_id:
        return  # already the leader
    voters, _learners = cluster.membership()
    if node_id is not None and node_id not in voters:
        # Refused before the handover starts: it asks every subscription what was
        # handed (HANDOVER), and they all leave and subscribe again for nothing.
        raise RequestError(
            ErrorCode.INVALID_ARGUMENT, f"node {node_id} is not a voter; cannot transfer to it"
        )
    try:
        # Inside the try: a request cancelled while the records commit (its connection
        # went away) left the dispatcher held, and a node that stayed leader handed
        # nothing out for good (found by a tester).
        await broker.hold_and_record_deliveries()
        await cluster.transfer_leadership(node_id)
    finally:
        broker.dispatcher.resume()  # a follower now (nothing to resume), or still leader


async def hold_and_record_deliveries(broker: Broker) -> None:
    """The work of :meth:`Broker.hold_and_record_deliveries` (its docstring: arguments, result, errors)."""
    recorded = 0
    with trio.move_on_after(RECORD_BEFORE_HANDOVER_S) as waited:
        # First the subscriptions say what their applications were handed: the rest
        # goes back uncounted (docs/protocol.md, HANDOVER), bounded by HANDED_WAIT_S.
        await handover_handed.ask_handed(broker)
        try:
            recorded = await broker.dispatcher.hold_and_record()
        except FutureQError as exc:
            log.warning("could not record the first deliveries out before handing over: %s", exc)
            return
    if waited.cancelled_caught:
        log.warning(
            "the first deliveries out were not recorded within %g s (the log did not "
            "commit); handing over without them: their next delivery may repeat an "
            "attempt number",
            RECORD_BEFORE_HANDOVER_S,
        )
        return
    if recorded:
        log.info(
            "recorded %d deliveries given back or still out before handing over (those "
            "out stay out, settleable by their tags, until their visibility deadlines)",
            recorded,
        )


def learner_clock_refusal(cluster: Any, node_id: int) -> str | None:
    """Why learner ``node_id`` may not become a voter because of its clock (a sentence),
    or None if its clock is within the bound, or not sampled yet (:func:`_clock_holds_promotion`
    waits for a sample).

    A voter's clock is one of the clocks a majority must agree on (``docs/architecture.md``,
    "Time"). A single node grown into a cluster (``docs/operations.md``) promoted its
    first joiner although that node's wall clock was 5 minutes fast: the two voters'
    clocks never agreed, and once the last agreement ran out (250 s with the default
    bound) the leader stepped down and no node could lead again until the joiner's
    clock was fixed, so the third node could not join either (breaker run). A learner
    whose clock is further than half the bound from cluster time (less the uncertainty of
    the sample) stays a learner, as it may not lead either.
    """
    clock = cluster.timekeeper.clock
    if not clock.peer_clock_off(node_id):
        return None
    offset_us = clock.peer_offset_us(node_id)
    max_offset_us = clock.config.max_offset_us
    return (
        f"node {node_id} caught up, but its wall clock is {describe_offset(offset_us)} "
        f"cluster time, more than half of max_clock_offset_ms={max_offset_us // 1000}: it "
        "stays a learner until its clock is fixed (NTP), as a voter's clock counts in the "
        "agreement on cluster time"
    )


def _clock_holds_promotion(cluster: Any, node_id: int) -> bool:
    """Whether the promoter waits: the learner's clock was not sampled yet (the leader
    pings learners every four ticks), is out of bound (logged), or the learner does not
    say yet that it is in bound (it synchronizes within an election timeout of joining;
    ``RaftNode.promote`` refuses a promotion that leaves no majority of clocks in bound).
    """
    clock = cluster.timekeeper.clock
    if clock.peer_offset_range_us(node_id) is None:
        return True
    refusal = learner_clock_refusal(cluster, node_id)
    if refusal is not None:
        clock_log.log(logging.WARNING, "%s", refusal)
        return True
    return clock.peer_in_bound(node_id) is not True


async def run_promoter(broker: Broker) -> None:
    """Promote learners to voters once they have caught up (thesis §4.2.1)."""
    async with broker._promote_receive:
        async for node_id in broker._promote_receive:
            cluster = broker.log
            with trio.move_on_after(PROMOTE_TIMEOUT_S) as waited:
                while True:
                    if not broker.log.is_leader():
                        break
                    voters, learners = cluster.membership()  # type: ignore[attr-defined]
                    if node_id not in learners:
                        break
                    progress = cluster.progress().get(node_id)  # type: ignore[attr-defined]
                    commit = cluster.commit_index  # type: ignore[attr-defined]
                    if (
                        progress is not None
                        # Not before it answered: a learner never heard from has
                        # match 0, which a young log's commit index is within
                        # PROMOTE_LAG_ENTRIES of, and may still be recovering; as a
                        # voter it would leave a two-node cluster without a quorum.
                        and progress.get("answered", True)
                        and not progress.get("recovering", False)
                        and progress["match"] + PROMOTE_LAG_ENTRIES >= commit
                        and not _clock_holds_promotion(cluster, node_id)
                    ):
                        try:
                            await cluster.promote(node_id)  # type: ignore[attr-defined]
                            log.info("node %d caught up and is now a voter", node_id)
                        except FutureQError as exc:
                            log.warning("could not promote node %d: %s", node_id, exc)
                            await trio.sleep(0.5)
                            continue
                        break
                    await trio.sleep(0.1)
            if waited.cancelled_caught:
                log.warning(
                    "node %d did not catch up within %d s; it stays a learner",
                    node_id,
                    PROMOTE_TIMEOUT_S,
                )
