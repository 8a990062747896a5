"""Config checks across sections: membership, ports, shard port layout, announced
addresses, and the warnings of a valid configuration.

Run by the loader on a configuration that structured, after the per-section checks
(:mod:`futureq.config_checks`); :func:`shard_port_problems` is also asked when a node's
shard count is decided, and :func:`config_warnings` lists what is valid but probably a
mistake.

Source: ``docs/operations.md`` and ``docs/sharding.md``; STYLE.md §4.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from futureq.config import (
    WILDCARD_HOSTS,
    Config,
    announced_client_address,
    announced_raft_address,
    is_wildcard,
    parse_peers,
    same_address,
    split_host_port,
)
from futureq.config_checks import Bad


def check_whole(config: Config) -> Iterable[Bad]:
    """Checks that need more than one section (run once every section structured)."""
    yield from _check_announced(config)
    yield from _check_membership(config)
    yield from _check_ports(config)
    yield from _check_shard_ports(config)


def _check_membership(config: Config) -> Iterable[Bad]:
    """What ``start`` would refuse about ``cluster.peers``, said before it opens anything."""
    try:
        peers = parse_peers(config.cluster.peers)
    except ValueError:
        return  # reported by the section's own check
    node_id = config.server.node_id
    if peers and node_id not in peers:
        yield Bad(
            ("cluster.peers", "server.node_id"),
            config.cluster.peers,
            f"lists nodes {sorted(peers)} but not this node's id {node_id}; every node "
            "lists all initial voters, itself included (a node joining a cluster uses "
            "cluster.join instead)",
        )
    # Compared by host_keys, not text: 1=localhost:P,2=127.0.0.1:P passed (found by a tester).
    groups: list[list[int]] = []
    for peer, address in sorted(peers.items()):
        try:
            split_host_port(address)
        except ValueError:
            continue
        for ids in groups:
            if same_address(peers[ids[0]], address):
                ids.append(peer)
                break
        else:
            groups.append([peer])
    for ids in groups:
        if len(ids) > 1:
            host, port = split_host_port(peers[ids[0]])
            spellings = {peers[peer] for peer in ids}
            named = ", ".join(f"{peer}={peers[peer]}" for peer in ids)
            yield Bad(
                ("cluster.peers",),
                config.cluster.peers,
                f"gives nodes {ids} the same address {host.lower()}:{port}"
                + (f" ({named})" if len(spellings) > 1 else "")
                + "; each node needs its own Raft address",
            )


def _check_ports(config: Config) -> Iterable[Bad]:
    """A clustered node's Raft listener cannot share the client or HTTP listener's port."""
    if not config.cluster.clustered:
        return
    try:
        raft = split_host_port(config.cluster.raft_listen)
        others = {
            "server.listen": split_host_port(config.server.listen),
            "server.http": split_host_port(config.server.http),
        }
    except ValueError:
        return
    for key, address in others.items():
        if address == raft and raft[1] != 0:
            yield Bad(
                ("cluster.raft_listen", key),
                config.cluster.raft_listen,
                f"must differ from {key} (one port per listener)",
            )


def shard_port_problems(config: Config) -> list[str]:
    """Sentences saying why ``config``'s ports cannot hold its ``node.shards`` shards
    (a port 0, or no room below 65536); empty when they can. For a count chosen after
    loading (``node.shards = auto``)."""
    return [f"{bad.keys[0]} = {bad.value!r}: {bad.rule}" for bad in _check_shard_ports(config)]


def _check_shard_ports(config: Config) -> Iterable[Bad]:
    """Shard K listens on the node's ports + K * stride: they must fit below 65536, and
    in a cluster be fixed (peers name them). A node without peers may leave its client
    and HTTP ports to the OS: the supervisor binds every shard's (docs/sharding.md,
    "Port 0")."""
    shards = config.node.shards
    if shards <= 1:
        return
    keys = {"server.listen": config.server.listen, "server.http": config.server.http}
    if config.cluster.clustered:
        keys["cluster.raft_listen"] = config.cluster.raft_listen
    for key, address in keys.items():
        try:
            port = split_host_port(address)[1]
        except ValueError:
            continue
        if port == 0:
            if config.cluster.clustered:
                yield Bad(
                    (key, "node.shards"),
                    address,
                    f"must name a fixed port in a cluster with node.shards = {shards}: "
                    "shard K listens on it plus K * node.shard_port_stride, and peers and "
                    "clients find each shard of a node by that rule",
                )
        elif port + (shards - 1) * config.node.shard_port_stride > 65535:
            yield Bad(
                (key, "node.shards", "node.shard_port_stride"),
                address,
                f"leaves no room for {shards} shards {config.node.shard_port_stride} ports "
                "apart below 65536; lower the port or node.shard_port_stride",
            )
    yield from _check_shard_port_overlap(config, keys)


_PORT_NAMES = {"server.listen": "client", "server.http": "HTTP", "cluster.raft_listen": "Raft"}


def _check_shard_port_overlap(config: Config, keys: Mapping[str, str]) -> Iterable[Bad]:
    """No shard may listen on another shard's port: with a stride no larger than the
    spread of the node's ports (``node.shard_port_stride = 1``, client 7474, HTTP 7475),
    shard 1's client port is shard 0's HTTP port, and ``start`` failed with "Address
    already in use" as if another program held it. Only the first overlap is reported,
    with the smallest stride that avoids them all."""
    shards, stride = config.node.shards, config.node.shard_port_stride
    fixed: dict[str, tuple[str, int]] = {}
    for key, address in keys.items():
        try:
            host, port = split_host_port(address)
        except ValueError:
            continue
        if port != 0:  # the OS picks each shard's own
            fixed[key] = (host.lower(), port)
    if len(fixed) < 2 or stride < 1:
        return
    spread = max(port for _, port in fixed.values()) - min(port for _, port in fixed.values())
    for key, (host, port) in fixed.items():
        for other, (other_host, other_port) in fixed.items():
            if other == key:
                continue
            same_host = host == other_host or host in WILDCARD_HOSTS or other_host in WILDCARD_HOSTS
            gap = other_port - port  # shard K's `key` port meets shard J's `other` port
            if not same_host or gap <= 0 or gap % stride or gap // stride >= shards:
                continue
            shard = gap // stride
            yield Bad(
                ("node.shard_port_stride", key, other, "node.shards"),
                stride,
                f"puts shard {shard}'s {_PORT_NAMES[key]} port ({key} {port} + "
                f"{shard} * {stride} = {other_port}) on shard 0's {_PORT_NAMES[other]} port "
                f"({other} {other_port}) with node.shards = {shards}; the node's shards "
                f"would collide with each other: use a node.shard_port_stride above "
                f"{spread} (the spread of the node's ports) or spread the ports apart",
            )
            return


def _check_announced(config: Config) -> Iterable[Bad]:
    """A clustered node never announces a wildcard address (issue 12): peers would dial
    ``0.0.0.0:7451`` and clients would be redirected to ``0.0.0.0:7450``."""
    if not config.cluster.clustered:
        return
    for announced, key, listen_key, flag in (
        (
            announced_client_address(config),
            "server.advertise",
            "server.listen",
            "--advertise-client",
        ),
        (
            announced_raft_address(config),
            "cluster.advertise_raft",
            "cluster.raft_listen",
            "--advertise-raft",
        ),
    ):
        try:
            wildcard = is_wildcard(announced)
        except ValueError:
            continue  # reported by the section's own check
        if not wildcard:
            continue
        explicit = key if _value_of(config, key) is not None else listen_key
        yield Bad(
            (explicit,),
            announced,
            f"is a wildcard address, and a node of a cluster announces this address to its "
            f"peers and clients; set {key} ({flag}) to a HOST:PORT they can reach, such "
            f"as this node's DNS name",
        )


def _value_of(config: Config, dotted: str) -> object:
    section, key = dotted.split(".")
    return getattr(getattr(config, section), key)


def config_warnings(config: Config) -> list[str]:
    """Things in a valid configuration that are probably mistakes, one sentence each.

    ``futureq check-config`` prints them on stderr and ``futureq start`` logs them; they
    do not stop the node.
    """
    warnings: list[str] = []
    try:
        client_wildcard = is_wildcard(announced_client_address(config))
    except ValueError:
        client_wildcard = False
    if not config.cluster.clustered and client_wildcard:
        if config.server.advertise is not None:
            # Once said of a --advertise-client 0.0.0.0:7450 with --listen 127.0.0.1:7450
            # that the listen address was the wildcard and advertise unset.
            warnings.append(
                f"server.advertise = {config.server.advertise!r} is a wildcard address: "
                "clients are told this node is at it (in HELLO answers) and cannot reach "
                "it there; set server.advertise (--advertise-client) to the HOST:PORT "
                "clients reach it at"
            )
        else:
            warnings.append(
                f"server.listen = {config.server.listen!r} is a wildcard address and "
                "server.advertise is unset: clients are told this node is at "
                f"{announced_client_address(config)!r} (in HELLO answers); set "
                "server.advertise (--advertise-client) to the HOST:PORT clients reach it at"
            )
    return warnings
