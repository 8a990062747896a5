"""Server configuration: attrs classes, structured from TOML and ``FUTUREQ_*`` variables.

Units end every name (``_ms``, ``_bytes``, ``_mb``). Every field has a default, so a
broker starts with no config at all: one node, client port 7450 and HTTP port 7452 on
127.0.0.1, data in ``./data``.

Loading (TOML file, environment overrides, command-line flags, validation) lives in
:mod:`futureq.config_loader`; this module only declares the shape.
"""

from __future__ import annotations

import ipaddress
from typing import Final

import attrs

from futureq.state.commands import GroupSettings
from futureq.wire.validation import Limits

DEFAULT_CLIENT_PORT = 7450
DEFAULT_RAFT_PORT = 7451
DEFAULT_HTTP_PORT = 7452


@attrs.frozen
class TlsConfig:
    """TLS for the client listener. Both files set turns TLS on; with ``ca_file`` too,
    Raft peers use mutual TLS (the certificate must then name the node id,
    docs/security.md).

    Attributes:
        cert_file: PEM certificate chain of this server.
        key_file: PEM private key of ``cert_file``.
        ca_file: PEM CA bundle to verify client and peer certificates, or None.
        require_client_cert: Refuse clients without a certificate signed by ``ca_file``.
        http: Serve the HTTP port (dashboard, ``/metrics``, ``/ws``) over HTTPS with the
            same certificate (and the same client-certificate rule).
    """

    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None
    require_client_cert: bool = False
    http: bool = False

    @property
    def enabled(self) -> bool:
        """True when a certificate and key are configured."""
        return self.cert_file is not None and self.key_file is not None


@attrs.frozen
class ServerSection:
    """Where the node listens and keeps its data.

    Attributes:
        node_id: This node's id in the cluster (>= 1).
        data_dir: Directory of the embedded RocksDB (created if missing).
        listen: ``HOST:PORT`` of the client listener.
        http: ``HOST:PORT`` of ``/metrics``, ``/healthz``, ``/readyz`` and the dashboard.
        advertise: Client address this node announces (``--advertise-client``): in
            NOT_LEADER redirects, HELLO answers, cluster status and NODE_ADDRESS.
            Defaults to ``listen``; must be set when ``listen`` is a wildcard
            (``0.0.0.0``, ``::``) and the node runs in a cluster.
        auth_token: If set, HELLO must carry this token (or a token of
            ``credentials_file``); it holds every permission. The HTTP API, the
            dashboard and (with ``metrics.require_auth``) ``/metrics`` then require a
            token too.
        credentials_file: TOML file of per-client tokens (stored hashed) and what each
            may do (``docs/security.md``, "Client access"); reloaded on SIGHUP.
        websocket_origins: Comma-separated browser origins (``https://app.example.com``)
            allowed to open ``/ws`` besides the dashboard's own, or ``*`` for any; empty
            means only pages served by this node (``docs/protocol.md``, "WebSocket").
        shutdown_grace_ms: Longest a graceful shutdown may take before it is forced (ms).
        log_level: ``debug``, ``info``, ``warning`` or ``error``.
        log_format: ``text`` (one readable line per record) or ``json`` (one JSON object
            per line); in a cluster every record names the node.
    """

    node_id: int = 1
    data_dir: str = "./data"
    listen: str = f"127.0.0.1:{DEFAULT_CLIENT_PORT}"
    http: str = f"127.0.0.1:{DEFAULT_HTTP_PORT}"
    advertise: str | None = None
    auth_token: str | None = None
    credentials_file: str | None = None
    websocket_origins: str = ""
    shutdown_grace_ms: int = 10_000
    log_level: str = "info"
    log_format: str = "text"


@attrs.frozen
class LimitsSection:
    """Request limits (``docs/protocol.md``, "Limits").

    Attributes:
        max_frame_bytes: Largest frame body a client may send (bytes).
        max_payload_bytes: Largest message payload (bytes).
        max_delay_ms: Largest delay or distance of ``deliver_at_ms`` from now (ms); 10 years.
        max_ttl_ms: Largest time-to-live (ms).
        max_batch_items: Most items in one PUBLISH, ACK or NACK.
        max_prefetch: Most deliveries one subscription has out at once (items),
            whatever credit it holds, and the largest ``prefetch`` (window) of one
            SUBSCRIBE of protocol version 5 (HELLO_OK names it; an older client's larger
            window is taken as credit). CREDIT is kept whole, up to the protocol's
            1,000,000 held.
        max_connections: Most concurrent client connections.
        max_subscriptions_per_connection: Most subscriptions one connection may hold.
        max_subscriptions: Most subscriptions all connections of the node hold together
            (each costs ~600 bytes; without it 10,000 connections of 1,024 would be ~6 GiB).
        max_prefetch_per_connection: Most prefetch (items) the subscriptions of one
            connection may ask for together; a SUBSCRIBE past it is refused. Also the
            most deliveries out on one connection, whatever CREDIT it sent. So one
            connection cannot claim the node's whole :attr:`max_deliveries_out`.
        max_deliveries_out: Most deliveries handed to consumers and not yet settled on
            the node (items, ~500 bytes of leader memory each); at it the dispatcher
            hands out nothing more until settlements or timeouts free room.
        max_connection_buffer_bytes: Bytes queued for one connection beyond which no
            more deliveries are pushed to it and the server stops reading its requests;
            twice this closes the connection (a client that does not read).
        max_node_buffer_bytes: Bytes queued for all connections together, and bytes of
            incomplete frames received from them, beyond which no more deliveries are
            pushed and incomplete frames wait (the node's memory for connection buffers).
        frame_deadline_ms: Longest a frame may take from its first byte to its last (ms).
        frame_stall_ms: Longest a client may send nothing in the middle of a frame while
            the server reads (ms); a half-sent frame is dropped then, not held.
        keepalive_interval_ms: Silence from a client after which the server sends PING (ms).
        keepalive_timeout_ms: Time after that PING within which the client must send
            something (a PONG) before the connection is closed (ms).
        send_timeout_ms: Longest one write to a client may block (ms).
        max_http_connections: Most connections the HTTP port serves at once (``/ws``
            included; fewer if the open-file limit leaves no room); one more is answered
            503 and closed at once.
        http_idle_timeout_ms: An HTTP connection without a complete request head this
            long after it opened or after its last answer is closed (keep-alive idleness
            and slowloris alike); also the TLS handshake's deadline there (ms).
        max_groups: Most consumer groups (so topics) the cluster holds; dead-letter
            topics are created past it.
        max_status_groups: Most groups listed in one STATUS answer or ``/api/status``.
    """

    max_frame_bytes: int = 4 * 1024 * 1024
    max_payload_bytes: int = 1024 * 1024
    max_delay_ms: int = 10 * 366 * 24 * 3600 * 1000
    max_ttl_ms: int = 10 * 366 * 24 * 3600 * 1000
    max_batch_items: int = 10_000
    max_prefetch: int = 10_000
    max_connections: int = 10_000
    max_subscriptions_per_connection: int = 1024
    max_subscriptions: int = 100_000
    max_prefetch_per_connection: int = 100_000
    max_deliveries_out: int = 500_000
    max_connection_buffer_bytes: int = 8 * 1024 * 1024
    max_node_buffer_bytes: int = 256 * 1024 * 1024
    frame_deadline_ms: int = 30_000
    frame_stall_ms: int = 10_000
    keepalive_interval_ms: int = 30_000
    keepalive_timeout_ms: int = 30_000
    send_timeout_ms: int = 30_000
    max_http_connections: int = 128
    http_idle_timeout_ms: int = 5_000
    max_groups: int = 1_000_000
    max_status_groups: int = 1000

    def request_limits(self) -> Limits:
        """The subset the wire validation uses."""
        return Limits(
            max_payload_bytes=self.max_payload_bytes,
            max_delay_ms=self.max_delay_ms,
            max_ttl_ms=self.max_ttl_ms,
            max_batch_items=self.max_batch_items,
        )


@attrs.frozen
class QueueSection:
    """Queue semantics.

    Attributes:
        visibility_timeout_ms: Default time a delivery may stay unacked before it is
            delivered again (ms), for groups created without their own. The leader
            resolves it into the command that creates a group; changing it later
            does not change existing groups.
        max_deliveries: Default attempts before a message goes to ``<topic>.dlq``
            (resolved the same way).
        horizon_ms: How far ahead of now the in-memory due-index reaches (ms).
        horizon_max_items: Most schedule entries one group keeps in memory (items).
        horizon_max_node_items: Most schedule entries all groups of the node keep in
            memory together (items, ~40 bytes each): each group keeps at most this
            divided by the groups the leader holds in memory (published to or consumed
            since it leads), but never less than ``dispatch_batch_items``, and at most
            ``horizon_max_items``. Without it, 1,000 groups of one topic with 100,000
            messages due soon would hold 100,000,000 entries (~4 GiB).
        dispatch_batch_items: Most deliveries put in one DELIVER frame (items).
        idempotency_window_ms: How long after its publish an idempotency key still
            names its message once the message is gone (acked, expired, ...): a
            publish with that key in this window stores nothing and answers the
            original id (ms, >= 0). While the message is pending, the key names it
            whatever the window. The leader resolves it into each PUBLISH.
    """

    visibility_timeout_ms: int = 30_000
    max_deliveries: int = 16
    horizon_ms: int = 300_000
    horizon_max_items: int = 100_000
    horizon_max_node_items: int = 5_000_000
    dispatch_batch_items: int = 256
    idempotency_window_ms: int = 300_000

    def group_settings(self) -> GroupSettings:
        """The defaults this node, when it leads, resolves into commands that create groups.

        Replicas never read them (``DESIGN.md``, "Apply reads nothing node-local"): a
        group's settings are fixed when the leader creates it.
        """
        return GroupSettings(self.visibility_timeout_ms, self.max_deliveries)


@attrs.frozen
class StorageSection:
    """RocksDB tuning.

    Attributes:
        fsync: Sync the log on every group commit. Turning it off risks acknowledged
            messages on power loss (never on a process crash).
        group_commit_max_items: Most commands written in one synced batch (items).
        write_buffer_mb: Memtable size per column family (MiB).
        block_cache_mb: Shared block cache (MiB).
        wal_recovery: How a single node opens a write-ahead log damaged before its end
            (:data:`WAL_RECOVERY_MODES`): ``strict`` refuses (a storage failure, exit 3),
            ``point-in-time`` ends the log at the damage and drops what follows (the
            operator's choice, once, to start after a power loss damaged its last
            write). Cluster nodes always end the log at the damage: their peers hold
            the rest (``docs/raft.md``, "Disk faults").
    """

    fsync: bool = True
    group_commit_max_items: int = 4096
    write_buffer_mb: int = 16
    block_cache_mb: int = 32
    wal_recovery: str = "strict"


WAL_RECOVERY_MODES: Final = ("strict", "point-in-time")
"""Values of ``storage.wal_recovery``."""


@attrs.frozen
class ClusterSection:
    """Raft replication. With no ``peers`` and no ``join`` the node runs alone.

    Attributes:
        raft_listen: ``HOST:PORT`` where peers connect for Raft traffic.
        advertise_raft: Raft address this node announces to peers
            (``--advertise-raft``): in the peer handshake, cluster status and the
            NODE_ADDRESS a joining node sends. Defaults to ``raft_listen``; must be set
            when ``raft_listen`` is a wildcard (``0.0.0.0``, ``::``).
        peers: The initial voters, ``"1=HOST:RAFTPORT,2=HOST:RAFTPORT,3=HOST:RAFTPORT"``,
            this node included; empty for a single node or a node that joins.
        join: Client address (``HOST:PORT``) of a cluster member to ask to add this
            node (it joins as a learner, catches up, and is promoted to voter).
        cluster_id: Name every node of one cluster shares; peers with another are refused.
        secret_file: File holding the cluster secret every node shares (at least 32
            bytes; ``futureq generate-secret FILE``); peers prove they hold it in the Raft
            handshake (docs/security.md). None without one.
        insecure_peers: Run a node with peers although neither mutual TLS nor a secret
            authenticates them (anyone who reaches the Raft port can rewrite the log).
        tick_ms: Length of one Raft tick (ms).
        election_timeout_ticks: Election timeout T in ticks (randomised in
            [T, T + election_timeout_spread_ticks)).
        election_timeout_spread_ticks: Width of the random part of the election timeout
            (ticks); 0: half of T, rounded up. The worst failover without a split vote is
            about T + spread; PreVote's tie-break keeps split votes rare at this width.
        heartbeat_ticks: Leader heartbeat interval in ticks.
        snapshot_chunk_bytes: Size of one InstallSnapshot chunk (bytes).
        compact_every_entries: Applied entries after which the log is compacted
            behind a snapshot (entries).
        transfer_leadership_on_shutdown: On SIGTERM, hand leadership to another node
            first, so clients do not wait for an election timeout.
        max_clock_offset_ms: The stated bound of cluster time (``docs/architecture.md``,
            "Time"): nothing is delivered earlier than its due time minus this; a node
            whose wall clock is more than half of it from cluster time does not lead or
            dispatch (ms).
        member_record_ms: How often (at most) the leader records in the log how far each
            member acknowledged, so a member whose disk was replaced by an older copy is
            told so (ms); an incarnation change is recorded at once.
        initial_cluster_state: ``"existing"`` (default): a node takes part only once every
            other voter answered it after its start, whether or not the cluster already
            exists (so a new cluster forms once all its voters run). ``"new"``: the
            operator declares a brand-new cluster; a node whose data directory is new may
            help form it once a majority of the voters answered with empty logs. Never
            use ``new`` to restart a node (docs/raft.md, "Disk faults").
    """

    raft_listen: str = f"127.0.0.1:{DEFAULT_RAFT_PORT}"
    advertise_raft: str | None = None
    peers: str = ""
    join: str | None = None
    cluster_id: str = "futureq"
    secret_file: str | None = None
    insecure_peers: bool = False
    tick_ms: int = 50
    election_timeout_ticks: int = 10
    election_timeout_spread_ticks: int = 0
    heartbeat_ticks: int = 1
    snapshot_chunk_bytes: int = 1024 * 1024
    compact_every_entries: int = 50_000
    transfer_leadership_on_shutdown: bool = True
    max_clock_offset_ms: int = 500
    member_record_ms: int = 5000
    initial_cluster_state: str = "existing"

    @property
    def clustered(self) -> bool:
        """True when this node runs Raft with peers (static ``peers`` or ``join``)."""
        return bool(self.peers.strip()) or self.join is not None

    def peer_map(self) -> dict[int, str]:
        """``peers`` parsed: node id -> raft address.

        Raises:
            ValueError: an entry is not ``ID=HOST:PORT`` with ID >= 1, or an id repeats.
        """
        return parse_peers(self.peers)


@attrs.frozen
class MetricsSection:
    """What ``/metrics`` exports and who may read it (``docs/operations.md``, "Metrics").

    Attributes:
        max_topic_series: Distinct ``topic`` label values per metric; further topics
            are counted under ``topic="_other"``. 0: every topic under ``_other``.
        max_group_series: Distinct ``(topic, group)`` label pairs per metric; further
            groups are counted under ``topic="_other", group="_other"``. 0: all there.
        require_auth: With ``server.auth_token`` or ``server.credentials_file`` set,
            ``/metrics`` needs a bearer token too (one with the ``monitor`` permission).
    """

    max_topic_series: int = 1000
    max_group_series: int = 1000
    require_auth: bool = True


AUTO_SHARDS = 0
"""``node.shards = auto``: the data directory's recorded count, else the number of cores."""


@attrs.frozen
class NodeSection:
    """How a node splits its work into shards (``docs/sharding.md``).

    Attributes:
        shards: Shard processes this node runs, each with its own RocksDB
            (``DATA_DIR/shard-K``) and its own Raft group; fixed when the data directory
            is created. :data:`AUTO_SHARDS` (0, written ``auto``; the default): the count
            recorded in the data directory, 1 for a directory holding a single node's
            data (no record), or for a new one the number of cores this process may use
            (:func:`futureq.shards.layout.resolve_shard_count`). 1: no supervisor, the
            node is one broker process with its data in ``DATA_DIR`` itself, as before
            sharding existed.
        shard_port_stride: Shard ``K`` listens on every port of the node (client,
            HTTP, Raft, and the ports named in ``advertise``, ``peers`` and ``join``)
            plus ``K * shard_port_stride``; shard 0 uses the node's own ports.
    """

    shards: int = AUTO_SHARDS
    shard_port_stride: int = 100


@attrs.frozen
class Config:
    """The whole server configuration; TOML tables ``[server]``, ``[limits]``,
    ``[queue]``, ``[storage]``, ``[tls]``, ``[cluster]``, ``[metrics]``, ``[node]`` map to
    its sections."""

    server: ServerSection = attrs.Factory(ServerSection)
    limits: LimitsSection = attrs.Factory(LimitsSection)
    queue: QueueSection = attrs.Factory(QueueSection)
    storage: StorageSection = attrs.Factory(StorageSection)
    tls: TlsConfig = attrs.Factory(TlsConfig)
    cluster: ClusterSection = attrs.Factory(ClusterSection)
    metrics: MetricsSection = attrs.Factory(MetricsSection)
    node: NodeSection = attrs.Factory(NodeSection)


WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "*", ""})
"""Hosts that mean "every interface" when bound and reach nothing when announced."""


def is_wildcard(address: str) -> bool:
    """True when ``address`` (``HOST:PORT``) names a wildcard host such as ``0.0.0.0``.

    Raises:
        ValueError: ``address`` is not ``HOST:PORT``.
    """
    host, _ = split_host_port(address)
    return host in WILDCARD_HOSTS


def announced_client_address(config: Config) -> str:
    """The client address this node hands to peers and clients: ``server.advertise``,
    else ``server.listen`` (port 0 there is replaced by the bound port at start)."""
    return config.server.advertise or config.server.listen


def announced_raft_address(config: Config) -> str:
    """The Raft address this node announces to peers: ``cluster.advertise_raft``, else
    ``cluster.raft_listen`` (port 0 there is replaced by the bound port at start)."""
    return config.cluster.advertise_raft or config.cluster.raft_listen


def websocket_origins(config: Config) -> tuple[str, ...]:
    """``server.websocket_origins`` as a tuple of origins (empty entries dropped)."""
    return tuple(
        entry.strip() for entry in config.server.websocket_origins.split(",") if entry.strip()
    )


def split_host_port(address: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[v6]:PORT`` for IPv6) into its parts.

    Raises:
        ValueError: when there is no port or it is not an integer in 0..65535.
    """
    host, sep, port_text = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{address!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"{address!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{address!r}: port {port} is outside 0..65535")
    return host, port


def join_host_port(host: str, port: int) -> str:
    """``HOST:PORT``, an IPv6 host in brackets (``[v6]:PORT``): the inverse of
    :func:`split_host_port`."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
"""Host names that mean this machine's loopback addresses without asking DNS."""


def host_keys(host: str) -> frozenset[str]:
    """The forms under which ``host`` (as :func:`split_host_port` gives it) names a
    machine, for telling whether two addresses are one: an IP address in its one
    canonical text (``127.000.0.1`` -> ``127.0.0.1``, ``::ffff:127.0.0.1`` ->
    ``127.0.0.1``, ``0:0::1`` -> ``::1``), a name lower-cased without its trailing dot,
    and ``localhost`` also as ``127.0.0.1`` and ``::1``. No DNS is asked (see
    :func:`futureq.broker.membership.add_node`, which adds what names resolve to).

    Source: ``cluster add-node`` compared address text, so ``localhost:P`` was taken
    for another node than a member at ``127.0.0.1:P`` (found by a tester).
    """
    text = host.strip().rstrip(".").lower()
    try:
        ip = ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        if text in LOOPBACK_NAMES or text.endswith(".localhost"):
            return frozenset({text, "127.0.0.1", "::1"})
        return frozenset({text})
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return frozenset({str(ip)})


def same_address(first: str, second: str) -> bool:
    """Whether ``HOST:PORT`` addresses ``first`` and ``second`` name one port of one
    machine as far as their text tells (:func:`host_keys`): same port, and a host form
    in common. An address that is not ``HOST:PORT`` is compared as text.
    """
    try:
        first_host, first_port = split_host_port(first)
        second_host, second_port = split_host_port(second)
    except ValueError:
        return first == second
    return first_port == second_port and not host_keys(first_host).isdisjoint(
        host_keys(second_host)
    )


def parse_peers(text: str) -> dict[int, str]:
    """Parse ``"1=HOST:PORT,2=HOST:PORT"`` into ``{1: "HOST:PORT", 2: ...}``.

    Raises:
        ValueError: with a sentence naming the bad entry.
    """
    peers: dict[int, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        node_text, sep, address = part.partition("=")
        if not sep:
            raise ValueError(f"peer {part!r} is not ID=HOST:PORT")
        try:
            node_id = int(node_text)
        except ValueError:
            raise ValueError(f"peer {part!r}: node id {node_text!r} is not a number") from None
        if node_id < 1:
            raise ValueError(f"peer {part!r}: node ids start at 1")
        if node_id in peers:
            raise ValueError(f"peer id {node_id} is listed twice")
        split_host_port(address)
        peers[node_id] = address.strip()
    return peers
