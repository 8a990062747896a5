"""Building and running the Raft side of a clustered node (``[cluster]`` config).

``build_raft_log`` turns the config into a :class:`~futureq.raft.node.RaftNode` over the
node's RocksDB, with a :class:`~futureq.raft.transport.Transport` whose address book
holds the static ``peers`` and, for nodes added later, the addresses replicated through
NODE_ADDRESS commands. ``follow_leadership`` tells the broker when this node starts or
stops leading; ``join_cluster`` asks an existing member to add this node.
"""

from __future__ import annotations

import logging
import os
import random
import ssl
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

import trio

from futureq.config import announced_raft_address, same_address, split_host_port
from futureq.errors import ConfigError, ErrorCode, FutureQError, RemoteProtocolError, RequestError
from futureq.peer_credentials import (
    CredentialError,
    check_own_certificate,
    raft_tls_contexts,
    read_secret_file,
)
from futureq.raft.node import RaftNode
from futureq.raft.node_config import RaftNodeConfig
from futureq.raft.peer_auth import PeerAuthError, ShardLayout
from futureq.raft.rocks_storage import RocksStorage
from futureq.raft.transport import AddressBook, Transport
from futureq.state import snapshot

from .cluster_time import export_clock_metrics

if TYPE_CHECKING:
    from futureq.client.client import Client
    from futureq.config import Config
    from futureq.metrics import Metrics
    from futureq.shards.layout import ShardRole
    from futureq.state.queue_state import QueueState
    from futureq.storage.db import Database
    from futureq.storage.space import SpaceAlarm

    from .broker import Broker

log = logging.getLogger(__name__)

JOIN_RETRY_MAX_S = 5.0
SELF_PROBE_TIMEOUT_S = 1.0
"""How long the start-up check waits to connect to this node's own peer address."""


async def refuse_if_node_already_runs(config: Config) -> None:
    """Refuse to start when another process already serves this node id.

    The Raft address ``cluster.peers`` gives for this node is where the other members
    send its messages. Before this node listens, nothing should answer there; if
    something does, another process runs this node id (with another data directory,
    or on another machine) and two would compete for one identity (``docs/raft.md``,
    "Disk faults"; etcd likewise refuses a member id that is already in use).

    Raises:
        ConfigError: something accepts connections on that address.
    """
    node_id = config.server.node_id
    address = config.cluster.peer_map().get(node_id)
    if address is None:
        return  # a joining node: join_cluster refuses an id that is already a member
    host, port = split_host_port(address)
    with trio.move_on_after(SELF_PROBE_TIMEOUT_S):
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError:
            return  # nobody there: the address is ours to take
        await stream.aclose()
        announced = announced_raft_address(config)
        # Said only "another process runs node 3" of a --peers that gave node 3 node
        # 2's address (the entries swapped): the fix was the list (found by a tester).
        mistyped = (
            ""
            if announced == address
            else f"; or, if --peers gives node {node_id} a wrong address, correct it: this "
            f"process announces its Raft address as {announced} (--advertise-raft, else "
            "--raft-listen), and whatever answers at the listed address is not this node"
        )
        raise ConfigError(
            f"node {node_id}'s Raft address {address} (from --peers) already accepts "
            f"connections: another process runs node {node_id}; stop it, or give this "
            f"process its own --node-id{mistyped}"
        )


def shard_layout(shard: ShardRole | None) -> ShardLayout:
    """What this process announces in the peer handshake: its node's shard count, its
    shard, the slot map's version and the port stride (1 shard when ``shard`` is None)."""
    if shard is None:
        return ShardLayout()
    return ShardLayout(
        shards=shard.slot_map.shard_count,
        shard=shard.index,
        slot_map=shard.slot_map.version,
        stride=shard.port_stride,
    )


def check_join_shards(
    config: Config, ours: ShardLayout, theirs: int, version: int, stride: int | None = None
) -> None:
    """Refuse to join a cluster whose nodes run another shard count, slot map or stride.

    Args:
        config: This node's configuration (``cluster.join`` names the member asked).
        ours: This process's layout (:func:`shard_layout`).
        theirs: The member's shard count (its HELLO_OK's ``shards``; 1 when absent,
            as from a node of 1 shard or of a build older than this check).
        version: The member's slot map version (1 without a map).
        stride: The member's ``node.shard_port_stride`` (SLOT_MAP_OK's ``port_stride``),
            None when unknown or with 1 shard (then not compared).

    Raises:
        ConfigError: the counts, versions or strides differ, with a sentence naming both.
    """
    if theirs != ours.shards:
        raise ConfigError(
            f"the cluster at {config.cluster.join} runs {theirs} shard(s) per node and this "
            f"node {ours.shards}: every node of a cluster must run the same number of "
            f"shards (shard K of every node is one Raft group); start this node with "
            f"--shards {theirs} (node.shards) on an empty data directory"
        )
    if version != ours.slot_map:
        raise ConfigError(
            f"the cluster at {config.cluster.join} uses slot map version {version} and "
            f"this node version {ours.slot_map}; every node must use the same slot map"
        )
    if stride is not None and ours.shards > 1 and stride != ours.stride:
        raise ConfigError(
            f"the cluster at {config.cluster.join} uses node.shard_port_stride {stride} and "
            f"this node {ours.stride}: shard K of every node listens on its ports plus K "
            f"times the same stride; start this node with shard_port_stride = {stride}"
        )


JOIN_ASK_MAX_DELAY_S = 5.0
"""Longest wait between two attempts to reach ``cluster.join`` for its shard count (s)."""


async def cluster_shard_count(config: Config, why: str = "node.shards = auto") -> int | None:
    """The shard count of the nodes of the cluster at ``cluster.join``: what
    ``node.shards = auto`` takes for a new data directory that joins a cluster, so that
    it runs the cluster's count rather than its own machine's cores (every node of a
    cluster must run the same, docs/sharding.md, "Agreement between nodes").

    Asks the member as a client (HELLO_OK's ``shards``: 1 when absent), with this node's
    TLS and token, retrying while it cannot be reached (the join itself could not go on
    either: the member may still be starting), every 0.2 s doubling to
    :data:`JOIN_ASK_MAX_DELAY_S`, until the caller's deadline or cancellation.
    ``why``: what the count is asked for, the start of each logged line (an explicit
    count is checked against it: ``node.shards = 3``).

    Returns:
        The member's shard count; None when the member answered with an error (a wrong
        token, say): the caller then resolves as without ``--join``, and the join itself
        stops the node with the precise sentence.
    """
    from futureq.client._routing import ShardedClient

    assert config.cluster.join is not None
    delay_s = 0.2
    while True:
        try:
            async with open_join_client(config, request_timeout_s=10.0) as client:
                if isinstance(client, ShardedClient):
                    return client.slot_map.shard_count
                return 1
        except (
            RequestError,
            RemoteProtocolError,
        ) as exc:  # an answer: asking again won't change it
            log.warning(
                "%s: %s refused to say its shard count (%s); going on as for a node without --join",
                why,
                config.cluster.join,
                exc,
            )
            return None
        except (OSError, FutureQError) as exc:
            log.warning(
                "%s: cannot reach %s to learn the cluster's shard count (%s); "
                "trying again in %.1f s",
                why,
                config.cluster.join,
                exc,
                delay_s,
            )
        await trio.sleep(delay_s)
        delay_s = min(JOIN_ASK_MAX_DELAY_S, delay_s * 2)


def finish_interrupted_restore(config: Config, db: Database) -> bool:
    """If the node died while installing a snapshot, install it again from the raft store.

    RaftNode persists a received snapshot before it restores the state from it, so the
    stored snapshot is the one the interrupted restore was writing.

    Returns:
        True when a restore was finished.
    """
    if db.get("meta", snapshot.RESTORING_KEY) is None:
        return False
    storage = RocksStorage(db, os.path.join(config.server.data_dir, "snapshots"))
    metadata = storage.snapshot_metadata()
    log.warning("finishing a snapshot install interrupted by a crash (index %d)", metadata.index)
    snapshot.restore_into(db, storage.snapshot().data, int(metadata.index))
    return True


def load_peer_credentials(
    config: Config,
) -> tuple[bytes | None, tuple[ssl.SSLContext, ssl.SSLContext] | None]:
    """The cluster secret and the mutual-TLS contexts of the Raft port, checked again at
    start (the loader checked them too; files may have changed since).

    A node with peers and neither credential must have ``cluster.insecure_peers``; it
    then logs a warning (every start).

    Returns:
        ``(secret or None, (server_context, client_context) or None)``.

    Raises:
        ConfigError: the secret file or certificate is unusable, or the node has
            peers, no credential and no ``insecure_peers``.
    """
    cluster = config.cluster
    secret: bytes | None = None
    if cluster.secret_file is not None:
        try:
            loaded = read_secret_file(cluster.secret_file)
        except CredentialError as exc:
            raise ConfigError(f"cluster.secret_file {cluster.secret_file}: {exc}") from None
        for warning in loaded.warnings:
            log.warning("%s", warning)
        secret = loaded.secret
    contexts = raft_tls_contexts(config)
    if contexts is not None:
        try:
            check_own_certificate(config)
        except CredentialError as exc:
            raise ConfigError(f"tls.cert_file {config.tls.cert_file}: {exc}") from None
    if secret is None and contexts is None:
        if not cluster.insecure_peers:
            raise ConfigError(
                "this node has peers but nothing authenticates them: give every node the "
                "same --cluster-secret-file, or mutual TLS (--tls-cert, --tls-key, --tls-ca), "
                "or pass --insecure-peers"
            )
        log.warning(
            "peers are NOT authenticated (cluster.insecure_peers): anyone who can reach the "
            "Raft port %s can act as a node and rewrite the replicated log; give every node "
            "the same --cluster-secret-file (docs/security.md)",
            cluster.raft_listen,
        )
    return secret, contexts


def check_new_cluster_directory(config: Config, storage: RocksStorage) -> None:
    """Refuse a directory laid out by ``futureq restore`` or ``convert-to-cluster`` (the
    one voter of a new cluster, never started) when the node is started into a cluster
    of others (``cluster.peers`` naming other nodes, or ``cluster.join``).

    Such a directory's membership is this node alone. An operator who replaced a member's
    disk and restored a backup into it started the node with the cluster's ``--peers``:
    it followed the leader (its snapshot matched the leader's log, so nothing replaced
    its membership), still counted itself the only voter, and once the leader was gone
    elected itself alone and acknowledged publishes no other node had, while the others
    could not elect (breaker run). Nothing in the Raft exchange can tell this apart from
    a real one-voter cluster, so it is refused here, before the node takes part: the
    restored node must start as what it is (``--peers`` naming only itself, the others
    joining it), or blank, to rejoin its cluster and catch up.

    Only a directory never started (no identity stamp yet) whose Raft state is exactly
    that layout (a snapshot or bootstrap of ``{node_id}``, no log after it) is refused;
    one started since is a running cluster's data (``docs/operations.md``, "Backup and
    restore").

    Raises:
        ConfigError: such a directory, started with other peers or ``--join``.
    """
    cluster = config.cluster
    node_id = config.server.node_id
    others = sorted(set(cluster.peer_map()) - {node_id})
    if not others and cluster.join is None:
        return
    if storage.identity() is not None or storage.is_pristine():
        return
    _, membership = storage.initial_state()
    if membership.voters != {node_id} or membership.learners:
        return
    if storage.last_index() != storage.snapshot_metadata().index:
        return
    how = f"with --peers naming nodes {others}" if others else f"with --join {cluster.join}"
    raise ConfigError(
        f"{config.server.data_dir} was restored or converted (futureq restore / "
        f"convert-to-cluster) as node {node_id}, the only voter of a new cluster, and is "
        f"started {how}: it would count itself the only voter and could acknowledge "
        "writes alone. To put this node back into its running cluster, start it with an "
        "empty data directory (it catches up from the others); to start the new cluster, "
        f"start it with --peers {node_id}=<its raft HOST:PORT> and let the others --join"
    )


def build_raft_log(
    config: Config,
    db: Database,
    state: QueueState,
    client_address: str,
    metrics: Metrics,
    space_alarm: SpaceAlarm | None = None,
    shard: ShardRole | None = None,
) -> tuple[RaftNode, Transport]:
    """The Raft node and its transport for this node (not started).

    Peers authenticate with the credentials :func:`load_peer_credentials` returns, and
    must run the same shard layout as this process (``shard``: which shard of a sharded
    node it is; None for a node of 1 shard): ``docs/sharding.md``, "Agreement between
    nodes".

    Raises:
        ConfigError: this node's id is missing from a non-empty ``cluster.peers``, or
            its peer credentials are unusable.
    """
    cluster = config.cluster
    node_id = config.server.node_id
    peers = cluster.peer_map()
    if peers and node_id not in peers:
        raise ConfigError(
            f"cluster.peers lists nodes {sorted(peers)} but not this node's id {node_id}; "
            "every node lists all initial voters, itself included"
        )
    book = AddressBook(
        {peer: (address, None) for peer, address in peers.items() if peer != node_id}
    )

    def replicated_addresses_changed() -> None:
        # Static peers win: a test harness may route them through proxies.
        for peer, (raft_address, peer_client) in state.node_addresses.items():
            if peer != node_id and peer not in peers:
                book.update({peer: (raft_address, peer_client)})

    state.on_nodes_changed = replicated_addresses_changed
    replicated_addresses_changed()
    secret, contexts = load_peer_credentials(config)
    ssl_server, ssl_client = contexts if contexts is not None else (None, None)
    transport = Transport(
        node_id,
        cluster.raft_listen,
        book,
        ssl_server=ssl_server,
        ssl_client=ssl_client,
        cluster_id=cluster.cluster_id,
        client_address=client_address,
        advertise_address=cluster.advertise_raft,  # None: the bound raft address
        secret=secret,
        rng=random.Random(),
        # Reconnect to a restarted peer well within one election timeout, or a leader
        # whose quorum needs that peer steps down (CheckQuorum) while it backs off.
        backoff_max_s=max(0.05, cluster.tick_ms * cluster.election_timeout_ticks / 2000),
        shard_layout=shard_layout(shard),
        # The node announces its data directory's incarnation once it read it; a peer
        # unheard of for an election timeout may be replaced by another incarnation.
        incarnation=None,
        incarnation_quiet_s=cluster.tick_ms * cluster.election_timeout_ticks / 1000,
    )
    storage = RocksStorage(db, os.path.join(config.server.data_dir, "snapshots"))
    check_new_cluster_directory(config, storage)
    node = RaftNode(
        RaftNodeConfig(
            node_id=node_id,
            tick_ms=cluster.tick_ms,
            election_timeout_ticks=cluster.election_timeout_ticks,
            election_timeout_spread_ticks=cluster.election_timeout_spread_ticks
            or (cluster.election_timeout_ticks + 1) // 2,
            heartbeat_ticks=cluster.heartbeat_ticks,
            snapshot_chunk_bytes=cluster.snapshot_chunk_bytes,
            compact_every_entries=cluster.compact_every_entries,
            # Keep a tail behind each snapshot so a briefly lagging follower catches up
            # from the log; a fifth of the compaction interval (10,000 by default).
            keep_entries_after_compaction=max(1, cluster.compact_every_entries // 5),
            bootstrap_voters=frozenset(peers),
            client_address=client_address,
            max_clock_offset_ms=cluster.max_clock_offset_ms,
            cluster_id=cluster.cluster_id,
            member_record_ticks=max(1, cluster.member_record_ms // cluster.tick_ms),
            new_cluster=cluster.initial_cluster_state == "new",
        ),
        storage,
        transport,
        state,
        rng=random.Random(),
        metrics=metrics,
        space_alarm=space_alarm,
    )
    return node, transport


async def follow_leadership(node: RaftNode, broker: Broker) -> None:
    """Start or stop the broker's dispatching whenever this node gains or loses leadership."""
    leading = False
    epoch = node.role_epoch
    while True:
        now_leading = node.is_leader()
        if now_leading != leading:
            leading = now_leading
            log.info(
                "node %d %s (term %d)",
                broker.node_id,
                "is now the leader" if leading else "is no longer the leader",
                node.term,
            )
            broker.leadership_changed(leading)
        broker.metrics.applied_index.set(node.applied_index)
        epoch = await node.wait_role_change(epoch)


CLOCK_HANDOVER_GRACE_S = 2.0
"""How long a leader whose clock left the bound waits for the deliveries out to be
recorded before it gives up leadership anyway (s); the recording normally takes a
commit, and at most ``HANDED_WAIT_S`` to ask version 4 clients what they were handed."""


async def record_before_clock_handover(node: RaftNode, broker: Broker) -> None:
    """Record the deliveries out before a leader whose clock left the bound gives up
    leadership, as a leadership transfer or a stop does. Never returns.

    A consumer holding a delivery while the leader's wall clock stepped an hour got it
    again from the next leader about 0.1 s later, with the same attempt number, long
    before its visibility timeout (breaker run): the timekeeper handed leadership over
    at once, with nothing recorded. Now it waits (``TimeKeeper.handover_wanted``, up to
    :data:`CLOCK_HANDOVER_GRACE_S`, dispatching nothing) while this task records them
    (HANDED_OUT: the next leader keeps each out until its deadline and honours its tag).
    """
    timekeeper = node.timekeeper
    timekeeper.handover_grace_us = int(CLOCK_HANDOVER_GRACE_S * 1_000_000)
    tick_s = node.config.tick_ms / 1000
    while True:
        term = timekeeper.handover_wanted
        if term is None or not node.is_leader():
            await trio.sleep(tick_s)
            continue
        epoch = node.role_epoch
        try:
            await broker.hold_and_record_deliveries()
        finally:
            timekeeper.handover_recorded(term)
        # The next tick hands over (or steps down); a transfer that does not complete
        # ends in a step-down after an election timeout. If the clock came back in
        # bound meanwhile, this node stays leader and hands out again.
        with trio.move_on_after(4 * node.config.election_timeout_ticks * tick_s):
            while node.role_epoch == epoch:
                if timekeeper.handover_wanted is None and timekeeper.clock.in_bound:
                    break  # back in bound before leadership went: polled, no event for it
                await trio.sleep(tick_s)
        broker.dispatcher.resume()


RAFT_METRICS_INTERVAL_S = 1.0


async def export_raft_metrics(node: RaftNode, transport: Transport, metrics: Metrics) -> None:
    """Copy the node's Raft and cluster clock figures into the gauges once a second."""
    roles = ("follower", "pre_candidate", "candidate", "leader")
    peers_seen: set[int] = set()
    clocks_seen: set[int] = set()
    elections = 0
    refusals: dict[str, int] = {}
    while True:
        clocks_seen = export_clock_metrics(node.timekeeper.clock, metrics, clocks_seen)
        metrics.leader_lease_remaining_seconds.set(node.lease_remaining_s())
        for reason, count in transport.statistics().refusals.items():
            if count > refusals.get(reason, 0):
                metrics.raft_peer_refusals_total.labels(reason).inc(count - refusals.get(reason, 0))
                refusals[reason] = count
        metrics.raft_term.set(node.term)
        metrics.raft_commit_index.set(node.commit_index)
        metrics.applied_index.set(node.applied_index)
        current = node.role.value
        for role in roles:
            metrics.raft_role.labels(role).set(1 if role == current else 0)
        if node.elections_won > elections:
            metrics.raft_elections_won_total.inc(node.elections_won - elections)
            elections = node.elections_won
        progress = {peer: view for peer, view in node.progress().items() if peer != node.id}
        for peer in peers_seen - set(progress):
            metrics.raft_replication_lag_entries.remove(str(peer))
        for peer, view in progress.items():
            metrics.raft_replication_lag_entries.labels(str(peer)).set(
                max(0, node.commit_index - view["match"])
            )
        peers_seen = set(progress)
        await trio.sleep(RAFT_METRICS_INTERVAL_S)


async def stop_when_removed(node: RaftNode, node_id: int, shutdown: trio.Event) -> None:
    """Shut this node down once it has applied its own removal from the membership, or
    a member told it that it was removed (it missed the removal while away).

    Raises:
        ConfigError: the cluster knows this node's data directory under another
            incarnation and this one holds a log (another cluster's directory with the
            same cluster id, or one replaced since): the node stops (exit 2) before it
            takes part (``docs/raft.md``, "Disk faults").
    """
    was_member = False
    epoch = node.role_epoch
    while True:
        foreign = node.foreign_directory()
        if foreign is not None:
            raise ConfigError(f"node {node_id}'s data directory is refused: {foreign}")
        removed_at = node.removed_at()
        if removed_at is not None:
            log.warning(
                "node %d was removed from the cluster at log index %d (a member told it; it "
                "missed its removal while away); shutting down",
                node_id,
                removed_at,
            )
            shutdown.set()
            return
        voters, learners = node.membership()
        member = node_id in voters or node_id in learners
        if member:
            was_member = True
        elif was_member and (voters or learners):
            log.warning("node %d was removed from the cluster; shutting down", node_id)
            shutdown.set()
            return
        with trio.move_on_after(RAFT_METRICS_INTERVAL_S):
            epoch = await node.wait_role_change(epoch)


def join_ssl_context(config: Config) -> ssl.SSLContext | None:
    """The TLS context a joining node uses to reach the member at ``cluster.join``.

    The members' client listeners are configured like ours: with TLS on, verify them with
    ``tls.ca_file`` (the system's CAs without one) and present our own certificate, which
    a listener with ``require_client_cert`` asks for.

    Returns:
        None when this node's client listener has no TLS.
    """
    tls = config.tls
    if not tls.enabled:
        return None
    assert tls.cert_file is not None and tls.key_file is not None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca_file)
    context.load_cert_chain(tls.cert_file, tls.key_file)
    return context


def open_join_client(
    config: Config, request_timeout_s: float
) -> AbstractAsyncContextManager[Client]:
    """A client of the member at ``cluster.join`` (``open_client``'s context manager):
    this node's TLS (:func:`join_ssl_context`) and ``server.auth_token``, connecting
    within 5 s, each request within ``request_timeout_s`` seconds."""
    from futureq.client import open_client  # the client library is only needed to join

    assert config.cluster.join is not None
    return open_client(
        config.cluster.join,
        ssl_context=join_ssl_context(config),
        token=config.server.auth_token,
        connect_timeout_s=5.0,
        request_timeout_s=request_timeout_s,
    )


def was_removed(node: RaftNode, node_id: int) -> bool:
    """True when this node's own data says it was removed from the cluster: the stored
    membership is non-empty and does not list ``node_id``."""
    voters, learners = node.membership()
    return bool(voters or learners) and node_id not in voters and node_id not in learners


async def _check_peer_credentials(
    config: Config, transport: Transport, view: dict[str, object]
) -> None:
    """Run the Raft handshake with the leader (else the member that answered ``view``).

    Raises:
        ConfigError: the member refused our credentials or could not prove its own.
        OSError: it could not be reached or the handshake broke off (the caller retries).
    """
    nodes = view.get("nodes")
    addresses = {
        entry.get("node_id"): entry.get("raft_address")
        for entry in (nodes if isinstance(nodes, list) else [])
        if isinstance(entry, dict)
    }
    for member in (view.get("leader_id"), view.get("node_id")):
        address = addresses.get(member)
        if isinstance(member, int) and isinstance(address, str) and address:
            break
    else:
        return  # no Raft address known yet; the leader's links will authenticate anyway
    try:
        await transport.probe(member, address)
    except PeerAuthError as exc:
        raise ConfigError(
            f"cannot join the cluster at {config.cluster.join}: {exc.message}"
        ) from None
    except (trio.BrokenResourceError, trio.TooSlowError, ssl.SSLError) as exc:
        raise OSError(f"Raft handshake with node {member} at {address} failed: {exc}") from exc


MOVED_ADDRESS_TIMEOUT_S = 300.0
"""Longest a member restarted on other addresses keeps asking the cluster to record
them (s); past it, the log says what to run."""


async def _record_moved_addresses(
    config: Config, transport: Transport, raft_address: str, client_address: str
) -> None:
    """A member restarted with ``cluster.join`` on other addresses than the cluster
    recorded for it asks the cluster (``CLUSTER_ADD_NODE``, which records a voter's new
    addresses) to record the new ones, retrying until it did or the cluster has them.

    A joined node moved to another Raft address reached nobody (its peers dialled the
    old one, and it knows theirs only from their connections): it waited for them for
    good, saying only that it was recovering (found by a tester).
    """
    node_id = config.server.node_id
    delay_s = 0.2
    while True:
        try:
            async with open_join_client(config, request_timeout_s=30.0) as client:
                from futureq.client._routing import ShardedClient

                group = (
                    client
                    if not isinstance(client, ShardedClient)
                    else client.shard_clients[transport.shard_layout.shard]
                )
                view = await group.cluster_status()
                recorded = next(
                    (m for m in view.get("nodes", []) if m.get("node_id") == node_id), None
                )
                known_raft = None if recorded is None else recorded.get("raft_address")
                known_client = None if recorded is None else recorded.get("client_address")
                if (
                    not isinstance(known_raft, str)
                    or not isinstance(known_client, str)
                    or (
                        same_address(known_raft, raft_address)
                        and same_address(known_client, client_address)
                    )
                ):
                    return  # the cluster has our addresses (or records none to correct)
                await group.add_node(node_id, raft_address, client_address)
                log.warning(
                    "node %d was recorded at raft %s, client %s; the cluster now records "
                    "raft %s, client %s",
                    node_id, known_raft, known_client, raft_address, client_address,
                )  # fmt: skip
                return
        except RequestError as exc:
            if exc.code is ErrorCode.INVALID_ARGUMENT:
                log.warning(
                    "node %d's addresses changed, and the cluster at %s does not record "
                    "them: %s",
                    node_id, config.cluster.join, exc.message,
                )  # fmt: skip
                return
            log.debug("recording node %d's addresses failed: %s; retrying", node_id, exc)
        except (FutureQError, OSError) as exc:
            log.debug("recording node %d's addresses failed: %s; retrying", node_id, exc)
        await trio.sleep(delay_s)
        delay_s = min(delay_s * 2, JOIN_RETRY_MAX_S)


async def join_cluster(
    config: Config,
    node: RaftNode,
    transport: Transport,
    client_address: str,
    raft_address: str,
    accepted: trio.Event | None = None,
) -> None:
    """Ask the member at ``cluster.join`` to add this node, retrying until it is a member.

    ``accepted`` is set once the cluster took this node (the leader added it, or it
    already was a member; or it was removed, and stops): the node prints READY only
    then, so a join the cluster refuses exits 2 without READY (``serve``).

    Before asking, this node runs the Raft handshake with the leader (or the member it
    asked), so a node whose secret or certificate the cluster would refuse stops with
    exit code 2 and a sentence instead of being added as a learner that can never
    catch up. Done when this node appears in the membership (as learner, then voter);
    the leader promotes it once it has caught up.

    Raises:
        ConfigError: the cluster has another cluster id, runs another shard count or
            slot map (:func:`check_join_shards`), already has this node id, or refuses
            this node's peer credentials.
    """
    assert config.cluster.join is not None
    node_id = config.server.node_id
    delay_s = 0.2
    asked = False  # the leader accepted our ADD_NODE: from then on our id is ours
    if was_removed(node, node_id):
        # A removed node shut itself down; restarted on the same data (a container
        # restart during a scale-down) it must not add itself back. `add-node` can.
        log.warning(
            "node %d was removed from the cluster (its data says so); not asking %s to add "
            "it again. Finish the scale-down (delete the node and its data), or add it back "
            "with `futureq-cli cluster add-node`",
            node_id,
            config.cluster.join,
        )
        if accepted is not None:
            accepted.set()
        return
    while True:
        voters, learners = node.membership()
        if node_id in voters or node_id in learners:
            log.info("node %d is a member of the cluster", node_id)
            if accepted is not None:
                accepted.set()
            with trio.move_on_after(MOVED_ADDRESS_TIMEOUT_S):
                await _record_moved_addresses(config, transport, raft_address, client_address)
            return
        try:
            async with open_join_client(config, request_timeout_s=30.0) as client:
                from futureq.client._routing import ShardedClient

                # Before anything else: a node of another shard count would join groups
                # whose topics it routes elsewhere (docs/sharding.md, "Agreement between nodes").
                sharded = client if isinstance(client, ShardedClient) else None
                check_join_shards(
                    config,
                    transport.shard_layout,
                    1 if sharded is None else sharded.slot_map.shard_count,
                    1 if sharded is None else sharded.slot_map.version,
                    None if sharded is None else sharded.port_stride,
                )
                # A shard joins its own group: shard K of the member, whose view and
                # ADD_NODE are that group's (the ShardedClient would add this shard's
                # addresses to every group, shifted by K * stride once more).
                group = (
                    client
                    if sharded is None
                    else sharded.shard_clients[transport.shard_layout.shard]
                )
                view = await group.cluster_status()
                theirs = view.get("cluster_id")
                if theirs is not None and theirs != config.cluster.cluster_id:
                    raise ConfigError(
                        f"{config.cluster.join} belongs to cluster {theirs!r}, this node to "
                        f"{config.cluster.cluster_id!r}; set --cluster-id to join it"
                    )
                listed = node_id in view.get("voters", []) or node_id in view.get("learners", [])
                ours = any(
                    member.get("node_id") == node_id and member.get("raft_address") == raft_address
                    for member in view.get("nodes", [])
                )
                if listed and (asked or ours):
                    # Added (by us now, or before a restart that came before our log
                    # reached the change): wait for the leader to replicate it to us.
                    log.info("the cluster lists node %d; waiting to apply it", node_id)
                    if accepted is not None:
                        accepted.set()
                    with trio.move_on_after(delay_s):
                        await node.wait_role_change(node.role_epoch)
                    continue
                if listed:
                    raise ConfigError(
                        f"node id {node_id} is already a member of the cluster at "
                        f"{config.cluster.join}; pick an unused --node-id (or remove the old "
                        f"node {node_id} first)"
                    )
                await _check_peer_credentials(config, transport, view)
                asked = True  # even if the answer is lost, a later view may show us added
                await group.add_node(node_id, raft_address, client_address)
            log.info(
                "asked %s to add node %d (raft %s)", config.cluster.join, node_id, raft_address
            )
            if accepted is not None:
                accepted.set()
        except ConfigError:
            raise  # this node cannot join that cluster: stop with exit code 2
        except RemoteProtocolError as exc:
            if exc.code is ErrorCode.AUTH_FAILED:  # asking again will not change the token
                raise ConfigError(
                    f"cannot join the cluster at {config.cluster.join}: it refused this node's "
                    f"token ({exc.message}); give this node the cluster's server.auth_token "
                    "(FUTUREQ_SERVER_AUTH_TOKEN)"
                ) from exc
            log.warning("joining through %s failed: %s; retrying", config.cluster.join, exc)
        except RequestError as exc:
            if exc.code is ErrorCode.INVALID_ARGUMENT:
                raise ConfigError(f"the cluster refused to add this node: {exc.message}") from exc
            if exc.code is ErrorCode.PERMISSION_DENIED:
                raise ConfigError(
                    f"cannot join the cluster at {config.cluster.join}: {exc.message}; give "
                    "this node the cluster's server.auth_token (it needs manage_cluster)"
                ) from exc
            log.warning("joining through %s failed: %s; retrying", config.cluster.join, exc)
        except (FutureQError, OSError) as exc:
            log.warning("joining through %s failed: %s; retrying", config.cluster.join, exc)
        with trio.move_on_after(delay_s):
            await node.wait_role_change(node.role_epoch)
        delay_s = min(delay_s * 2, JOIN_RETRY_MAX_S)
