"""What each config section's values must mean: minima, :data:`MAXIMA`, addresses, and
the rules of each section.

One check per section (``check_server``, ``check_limits``, ...; TLS lives in
:mod:`futureq.config_security_checks`), run on whatever of the section structured; each
yields a :class:`Bad` for every value that structured but makes no sense, which the
loader turns into a sentence naming the key, the value, its origin and the rule.

Source: ``docs/operations.md``, the configuration table; STYLE.md §4.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

import attrs

from futureq.config import (
    AUTO_SHARDS,
    WAL_RECOVERY_MODES,
    ClusterSection,
    LimitsSection,
    MetricsSection,
    NodeSection,
    QueueSection,
    ServerSection,
    StorageSection,
    is_wildcard,
    parse_peers,
    split_host_port,
)
from futureq.logging_setup import LOG_FORMATS
from futureq.peer_credentials import (
    CredentialError,
    read_secret_file,
)
from futureq.state import commands
from futureq.wire.validation import (
    DELIVERY_ROOM_BYTES,
    MAX_VISIBILITY_TIMEOUT_MS,
    MIN_FRAME_BYTES,
    MIN_VISIBILITY_TIMEOUT_MS,
    PUBLISH_OK_DUPLICATE_BYTES,
    visibility_problem,
)

MAX_NODE_ID = commands.MAX_NODE_ID
MAX_CLUSTER_ID_BYTES = 255
"""Longest ``cluster.cluster_id`` (UTF-8 bytes): it travels in the peer handshake,
whose frames are at most 8 KiB before the peer is authenticated."""
MIN_CLOCK_OFFSET_MS = 10
"""A smaller cluster.max_clock_offset_ms is a unit mistake: no clocks agree that well."""
MAX_CLOCK_OFFSET_MS = 60_000
LOG_LEVELS = ("debug", "info", "warning", "error")

_HOUR_MS = 3_600_000
_DAY_MS = 24 * _HOUR_MS
_YEAR_MS = 366 * _DAY_MS
_MIB = 1024 * 1024

MAXIMA: dict[str, tuple[int, str]] = {
    # The largest value of each numeric setting that has no other upper bound, and why.
    # Values past these are unit mistakes or typos (a visibility timeout of 292 million
    # years, a 100 TB memtable) that would otherwise be stored on groups, overflow
    # RocksDB's options or make the node wait for ever (docs/operations.md, config table).
    "server.shutdown_grace_ms": (_HOUR_MS, "1 h: a stop that takes longer is a hung one"),
    "limits.max_frame_bytes": (64 * _MIB, "64 MiB: every frame is buffered whole"),
    "limits.max_delay_ms": (100 * _YEAR_MS, "100 years"),
    "limits.max_ttl_ms": (100 * _YEAR_MS, "100 years"),
    "limits.max_batch_items": (1_000_000, "1,000,000 items"),
    "limits.max_connections": (1_000_000, "1,000,000 connections"),
    "limits.max_subscriptions_per_connection": (1_000_000, "1,000,000 subscriptions"),
    "limits.max_subscriptions": (10_000_000, "10,000,000 subscriptions (~6 GB)"),
    "limits.max_prefetch_per_connection": (100_000_000, "100,000,000 deliveries (~50 GB)"),
    "limits.max_deliveries_out": (100_000_000, "100,000,000 deliveries (~50 GB of memory)"),
    "limits.max_connection_buffer_bytes": (1024 * _MIB, "1 GiB per connection"),
    "limits.max_node_buffer_bytes": (64 * 1024 * _MIB, "64 GiB of memory"),
    "limits.frame_deadline_ms": (_HOUR_MS, "1 h"),
    "limits.frame_stall_ms": (_HOUR_MS, "1 h"),
    "limits.keepalive_interval_ms": (_HOUR_MS, "1 h"),
    "limits.keepalive_timeout_ms": (_HOUR_MS, "1 h"),
    "limits.send_timeout_ms": (_HOUR_MS, "1 h"),
    "limits.max_http_connections": (100_000, "100,000 connections"),
    "limits.http_idle_timeout_ms": (_HOUR_MS, "1 h"),
    "limits.max_groups": (100_000_000, "100,000,000 groups"),
    "limits.max_status_groups": (1_000_000, "1,000,000 groups"),
    "queue.visibility_timeout_ms": (
        MAX_VISIBILITY_TIMEOUT_MS,
        "12 h, the protocol's longest visibility timeout, as for `group create "
        "--visibility-timeout`",
    ),
    "queue.max_deliveries": (1_000_000, "1,000,000 attempts, the protocol's largest"),
    "queue.horizon_ms": (7 * _DAY_MS, "7 days"),
    "queue.horizon_max_items": (100_000_000, "100,000,000 items"),
    "queue.horizon_max_node_items": (1_000_000_000, "1,000,000,000 items"),
    "queue.dispatch_batch_items": (100_000, "100,000 items"),
    "queue.idempotency_window_ms": (30 * _DAY_MS, "30 days"),
    "storage.group_commit_max_items": (1_000_000, "1,000,000 items"),
    "storage.write_buffer_mb": (4096, "4096 MiB per column family"),
    "storage.block_cache_mb": (1024 * 1024, "1 TiB"),
    "cluster.tick_ms": (10_000, "10 s"),
    "cluster.election_timeout_ticks": (10_000, "10,000 ticks"),
    "cluster.snapshot_chunk_bytes": (8 * _MIB, "8 MiB, half a Raft frame"),
    "cluster.compact_every_entries": (100_000_000, "100,000,000 entries"),
    "cluster.member_record_ms": (_HOUR_MS, "1 h"),
    "metrics.max_topic_series": (1_000_000, "1,000,000 series"),
    "metrics.max_group_series": (1_000_000, "1,000,000 series"),
    "node.shard_port_stride": (65_535, "65535 ports"),
}
"""Upper bound of each numeric setting without one of its own, dotted key -> (largest
allowed, the same in words with the reason)."""


@attrs.frozen
class Bad:
    """A value that structured but makes no sense: ``keys[0]`` holds ``value``."""

    keys: tuple[str, ...]
    value: object
    rule: str


def minimum(section: str, obj: object, key: str, least: int, unit: str) -> Iterable[Bad]:
    value = getattr(obj, key)
    if value < least:
        yield Bad((f"{section}.{key}",), value, f"must be at least {least}{unit}")


def address(section: str, key: str, value: str | None, *, port_zero: bool) -> Iterable[Bad]:
    if value is None:
        return
    dotted = f"{section}.{key}"
    try:
        _, port = split_host_port(value)
    except ValueError as error:
        yield Bad(
            (dotted,),
            value,
            f"must be HOST:PORT ([v6addr]:PORT for IPv6) with a port in 0..65535 ({error})",
        )
        return
    if port == 0 and not port_zero:
        yield Bad((dotted,), value, "must name a real port in 1..65535, not 0")


def maxima(section: str, obj: object) -> Iterable[Bad]:
    """The :data:`MAXIMA` of ``section``'s keys."""
    for dotted, (most, words) in MAXIMA.items():
        name, _, key = dotted.partition(".")
        if name != section:
            continue
        value = getattr(obj, key)
        if value > most:
            yield Bad((dotted,), value, f"must be at most {most} ({words})")


def check_server(server: ServerSection) -> Iterable[Bad]:
    yield from maxima("server", server)
    yield from minimum("server", server, "node_id", 1, "")
    if server.node_id > MAX_NODE_ID:
        yield Bad(("server.node_id",), server.node_id, f"must be at most {MAX_NODE_ID}")
    if not server.data_dir.strip():
        yield Bad(("server.data_dir",), server.data_dir, "must name a directory")
    yield from address("server", "listen", server.listen, port_zero=True)
    yield from address("server", "http", server.http, port_zero=True)
    yield from address("server", "advertise", server.advertise, port_zero=False)
    try:
        listen_address = split_host_port(server.listen)
        http_address = split_host_port(server.http)
    except ValueError:
        pass
    else:
        if listen_address == http_address and listen_address[1] != 0:
            yield Bad(
                ("server.http", "server.listen"),
                server.http,
                "must differ from server.listen (the client listener)",
            )
    if server.auth_token is not None and not server.auth_token:
        yield Bad(("server.auth_token",), "", "must be a non-empty string, or unset for no token")
    if server.credentials_file is not None and not os.path.isfile(server.credentials_file):
        yield Bad(
            ("server.credentials_file",),
            server.credentials_file,
            "must be an existing TOML file of client credentials (see docs/security.md)",
        )
    for origin in server.websocket_origins.split(","):
        origin = origin.strip()
        if not origin or origin == "*":
            continue
        parts = re.fullmatch(r"https?://(\[[0-9A-Fa-f:.]+\]|[^/\s:\[\]@]+)(?::([0-9]+))?", origin)
        if parts is None:
            yield Bad(
                ("server.websocket_origins",),
                server.websocket_origins,
                f"{origin!r} is not an origin: give scheme://host[:port] entries like "
                "https://app.example.com, separated by commas, or *",
            )
        elif parts[2] is not None and not 1 <= int(parts[2]) <= 65535:
            # Found by a tester: http://a.b:99999 was taken, an origin no browser sends.
            yield Bad(
                ("server.websocket_origins",),
                server.websocket_origins,
                f"{origin!r} has port {parts[2]}; a port is 1 to 65535",
            )
    yield from minimum("server", server, "shutdown_grace_ms", 0, " ms")
    if server.log_level not in LOG_LEVELS:
        yield Bad(
            ("server.log_level",), server.log_level, f"must be one of {', '.join(LOG_LEVELS)}"
        )
    if server.log_format not in LOG_FORMATS:
        yield Bad(
            ("server.log_format",), server.log_format, f"must be one of {', '.join(LOG_FORMATS)}"
        )


def check_limits(limits: LimitsSection) -> Iterable[Bad]:
    yield from maxima("limits", limits)
    # A frame limit of a few bytes was taken, and then every HELLO ended in a logged
    # traceback ("handler failed (a bug)"): HELLO_OK did not fit.
    yield from minimum(
        "limits",
        limits,
        "max_frame_bytes",
        MIN_FRAME_BYTES,
        " bytes (64 KiB: HELLO_OK, ERROR and STATUS_OK answers need room)",
    )
    yield from minimum("limits", limits, "max_payload_bytes", 1, " bytes")
    yield from minimum("limits", limits, "max_delay_ms", 0, " ms")
    yield from minimum("limits", limits, "max_ttl_ms", 0, " ms")
    yield from minimum("limits", limits, "max_batch_items", 1, " items")
    yield from minimum("limits", limits, "max_prefetch", 1, " items")
    if limits.max_prefetch > 1_000_000:
        yield Bad(("limits.max_prefetch",), limits.max_prefetch, "must be at most 1000000 items")
    yield from minimum("limits", limits, "max_connections", 1, " connections")
    yield from minimum("limits", limits, "max_subscriptions_per_connection", 1, " subscriptions")
    yield from minimum("limits", limits, "max_subscriptions", 1, " subscriptions")
    yield from minimum("limits", limits, "max_prefetch_per_connection", 1, " items")
    yield from minimum("limits", limits, "max_deliveries_out", 1, " items")
    if limits.max_prefetch_per_connection < limits.max_prefetch:
        yield Bad(
            ("limits.max_prefetch_per_connection", "limits.max_prefetch"),
            limits.max_prefetch_per_connection,
            f"must be at least limits.max_prefetch ({limits.max_prefetch}), "
            "else a SUBSCRIBE with the largest prefetch allowed is refused",
        )
    yield from minimum("limits", limits, "max_node_buffer_bytes", 1, " bytes")
    for key in (
        "frame_deadline_ms",
        "frame_stall_ms",
        "keepalive_interval_ms",
        "keepalive_timeout_ms",
    ):
        yield from minimum("limits", limits, key, 100, " ms")
    yield from minimum("limits", limits, "send_timeout_ms", 100, " ms")
    yield from minimum("limits", limits, "max_http_connections", 1, " connections")
    yield from minimum("limits", limits, "http_idle_timeout_ms", 100, " ms")
    yield from minimum("limits", limits, "max_groups", 1, " groups")
    yield from minimum("limits", limits, "max_status_groups", 1, " groups")
    if limits.max_connection_buffer_bytes < limits.max_frame_bytes:
        yield Bad(
            ("limits.max_connection_buffer_bytes", "limits.max_frame_bytes"),
            limits.max_connection_buffer_bytes,
            f"must be at least limits.max_frame_bytes ({limits.max_frame_bytes}) "
            "so that any one answer fits in a connection's buffer",
        )
    if (
        limits.max_node_buffer_bytes < limits.max_connection_buffer_bytes
        or limits.max_node_buffer_bytes <= limits.max_frame_bytes
    ):
        yield Bad(
            ("limits.max_node_buffer_bytes", "limits.max_connection_buffer_bytes"),
            limits.max_node_buffer_bytes,
            "must be at least limits.max_connection_buffer_bytes "
            f"({limits.max_connection_buffer_bytes}) and more than limits.max_frame_bytes "
            f"({limits.max_frame_bytes}): the node's buffers hold at least one connection's, "
            "else no large frame could ever be read whole",
        )
    # A PUBLISH_OK names each duplicate item ([position, id], at most 16 bytes): a frame
    # limit that could not hold max_batch_items of them answered a batch it had stored
    # with INVALID_ARGUMENT ("frame of N bytes exceeds the limit").
    largest_batch = (limits.max_frame_bytes - 64) // PUBLISH_OK_DUPLICATE_BYTES
    if limits.max_frame_bytes >= MIN_FRAME_BYTES and limits.max_batch_items > largest_batch:
        yield Bad(
            ("limits.max_batch_items", "limits.max_frame_bytes"),
            limits.max_batch_items,
            f"must be at most {largest_batch} with limits.max_frame_bytes "
            f"{limits.max_frame_bytes}: a PUBLISH_OK names every duplicate item of a batch "
            f"in up to {PUBLISH_OK_DUPLICATE_BYTES} bytes and must fit in a frame "
            "(lower max_batch_items or raise max_frame_bytes)",
        )
    # A payload just under the frame limit was taken, and its DELIVER (payload, headers,
    # tag) was larger than a frame: a client that holds the server to its limit could
    # never receive that message.
    largest_payload = limits.max_frame_bytes - DELIVERY_ROOM_BYTES
    if limits.max_frame_bytes >= MIN_FRAME_BYTES and limits.max_payload_bytes > largest_payload:
        yield Bad(
            ("limits.max_payload_bytes", "limits.max_frame_bytes"),
            limits.max_payload_bytes,
            f"must be at least {DELIVERY_ROOM_BYTES} bytes smaller than limits.max_frame_bytes "
            f"({limits.max_frame_bytes}), so at most {largest_payload}: a delivery carries "
            "the payload with its headers, tag and times in one frame",
        )


def check_queue(queue: QueueSection) -> Iterable[Bad]:
    yield from maxima("queue", queue)
    if queue.visibility_timeout_ms < 1:
        yield Bad(
            ("queue.visibility_timeout_ms",),
            queue.visibility_timeout_ms,
            f"must be at least {MIN_VISIBILITY_TIMEOUT_MS} ms",
        )
    elif queue.visibility_timeout_ms < MIN_VISIBILITY_TIMEOUT_MS:
        yield Bad(
            ("queue.visibility_timeout_ms",),
            queue.visibility_timeout_ms,
            visibility_problem(queue.visibility_timeout_ms),
        )
    yield from minimum("queue", queue, "max_deliveries", 1, " attempts")
    yield from minimum("queue", queue, "horizon_ms", 1, " ms")
    yield from minimum("queue", queue, "horizon_max_items", 1, " items")
    yield from minimum("queue", queue, "horizon_max_node_items", 1, " items")
    yield from minimum("queue", queue, "dispatch_batch_items", 1, " items")
    yield from minimum("queue", queue, "idempotency_window_ms", 0, " ms")


def check_storage(storage: StorageSection) -> Iterable[Bad]:
    yield from maxima("storage", storage)
    if storage.wal_recovery not in WAL_RECOVERY_MODES:
        yield Bad(
            ("storage.wal_recovery",),
            storage.wal_recovery,
            f"must be one of {', '.join(WAL_RECOVERY_MODES)}",
        )
    yield from minimum("storage", storage, "group_commit_max_items", 1, " items")
    yield from minimum("storage", storage, "write_buffer_mb", 1, " MiB")
    yield from minimum("storage", storage, "block_cache_mb", 1, " MiB")


def check_cluster(cluster: ClusterSection) -> Iterable[Bad]:
    yield from maxima("cluster", cluster)
    yield from address("cluster", "raft_listen", cluster.raft_listen, port_zero=True)
    yield from address("cluster", "advertise_raft", cluster.advertise_raft, port_zero=False)
    yield from address("cluster", "join", cluster.join, port_zero=False)
    try:
        peers = parse_peers(cluster.peers)
    except ValueError as error:
        yield Bad(
            ("cluster.peers",), cluster.peers, f"must be ID=HOST:PORT,ID=HOST:PORT,... ({error})"
        )
    else:
        wildcards = [f"{peer}={address}" for peer, address in peers.items() if is_wildcard(address)]
        if wildcards:
            yield Bad(
                ("cluster.peers",),
                cluster.peers,
                f"names wildcard addresses ({', '.join(wildcards)}) that no peer can dial; "
                "give each node's reachable HOST:PORT (its --advertise-raft)",
            )
    if cluster.peers.strip() and cluster.join is not None:
        yield Bad(
            ("cluster.join", "cluster.peers"),
            cluster.join,
            "give peers (a new cluster) or join (an existing one), not both",
        )
    if not cluster.cluster_id:
        yield Bad(("cluster.cluster_id",), cluster.cluster_id, "must be a non-empty name")
    elif (id_bytes := len(cluster.cluster_id.encode())) > MAX_CLUSTER_ID_BYTES or (
        not cluster.cluster_id.isprintable() or any(c.isspace() for c in cluster.cluster_id)
    ):
        # A 9,000-character id was taken, and the cluster never formed: every peer
        # refused the handshake that carries it ("frame of 9114 bytes exceeds the limit
        # of 8192 bytes; send smaller batches or payloads").
        shown = cluster.cluster_id if len(cluster.cluster_id) <= 40 else cluster.cluster_id[:37]
        yield Bad(
            ("cluster.cluster_id",),
            shown if shown == cluster.cluster_id else shown + "...",
            f"must be a name of 1 to {MAX_CLUSTER_ID_BYTES} bytes without spaces or control "
            "characters ("
            + (
                f"it is {id_bytes} bytes"
                if id_bytes > MAX_CLUSTER_ID_BYTES
                else "it holds a space or control character"
            )
            + "): every peer handshake carries it, and certificates name nodes "
            "node-N.<cluster_id>.futureq",
        )
    yield from minimum("cluster", cluster, "tick_ms", 1, " ms")
    yield from minimum("cluster", cluster, "election_timeout_ticks", 2, " ticks")
    yield from minimum("cluster", cluster, "heartbeat_ticks", 1, " ticks")
    if not 0 <= cluster.election_timeout_spread_ticks <= cluster.election_timeout_ticks:
        yield Bad(
            ("cluster.election_timeout_spread_ticks",),
            cluster.election_timeout_spread_ticks,
            "must be between 0 (half of cluster.election_timeout_ticks) and "
            "cluster.election_timeout_ticks",
        )
    if cluster.heartbeat_ticks >= cluster.election_timeout_ticks:
        yield Bad(
            ("cluster.heartbeat_ticks",),
            cluster.heartbeat_ticks,
            "must be smaller than cluster.election_timeout_ticks",
        )
    if cluster.clustered and cluster.election_timeout_ticks < 3:
        yield Bad(
            ("cluster.election_timeout_ticks",),
            cluster.election_timeout_ticks,
            "must be at least 3 ticks in a cluster (the leader lease lasts T - 2 ticks)",
        )
    if not MIN_CLOCK_OFFSET_MS <= cluster.max_clock_offset_ms <= MAX_CLOCK_OFFSET_MS:
        hint = (
            f" ({cluster.max_clock_offset_ms} s would be {cluster.max_clock_offset_ms * 1000} ms:"
            " it looks like seconds taken for milliseconds)"
            if 0 < cluster.max_clock_offset_ms < MIN_CLOCK_OFFSET_MS
            else ""
        )
        yield Bad(
            ("cluster.max_clock_offset_ms",),
            cluster.max_clock_offset_ms,
            f"must be between {MIN_CLOCK_OFFSET_MS} and {MAX_CLOCK_OFFSET_MS} ms{hint}",
        )
    yield from minimum("cluster", cluster, "snapshot_chunk_bytes", 1024, " bytes")
    yield from minimum("cluster", cluster, "compact_every_entries", 1, " entries")
    yield from minimum("cluster", cluster, "member_record_ms", 1, " ms")
    if cluster.initial_cluster_state not in ("new", "existing"):
        yield Bad(
            ("cluster.initial_cluster_state",),
            cluster.initial_cluster_state,
            'must be "new" (forming a brand-new cluster) or "existing"',
        )
    if cluster.secret_file is not None:
        try:
            read_secret_file(cluster.secret_file)
        except CredentialError as error:
            yield Bad(("cluster.secret_file",), cluster.secret_file, str(error))


def check_metrics(metrics: MetricsSection) -> Iterable[Bad]:
    yield from maxima("metrics", metrics)
    yield from minimum("metrics", metrics, "max_topic_series", 0, " series")
    yield from minimum("metrics", metrics, "max_group_series", 0, " series")


def check_node(node: NodeSection) -> Iterable[Bad]:
    from futureq.shards.slots import MAX_SHARDS

    yield from maxima("node", node)
    if not (node.shards == AUTO_SHARDS or 1 <= node.shards <= MAX_SHARDS):
        yield Bad(
            ("node.shards",),
            node.shards,
            f"must be 1 to {MAX_SHARDS} shard processes, or auto (the number of cores)",
        )
    yield from minimum("node", node, "shard_port_stride", 1, " ports")
