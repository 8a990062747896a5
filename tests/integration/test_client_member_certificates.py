"""A TLS client given one seed checks every member it learns against that member's
own host name, not the name given for the seed.

The client given ``127.0.0.1:P1`` with ``server_hostname="localhost"`` (node 1's
certificate names only ``localhost``) learns nodes 2 and 3 from HELLO_OK as
``127.0.0.1:P2`` / ``127.0.0.1:P3``, whose certificates name only ``127.0.0.1``.
Before, it checked them against ``localhost`` too: once node 1 stopped (or named
another leader), every connection to a member failed verification and the client
was stuck (``docs/client.md``, "Servers it learns").
"""

from __future__ import annotations

import random
import ssl
from pathlib import Path

import anyio
import trustme
from cluster_process import Cluster

from futureq.client import open_client


def _cert_for(ca: trustme.CA, root: Path, name: str, *hosts: str) -> list[str]:
    cert = ca.issue_cert(*hosts)
    cert_path, key_path = root / f"{name}.pem", root / f"{name}.key"
    for number, pem in enumerate(cert.cert_chain_pems):
        pem.write_to_path(str(cert_path), append=number > 0)
    cert.private_key_pem.write_to_path(str(key_path))
    return ["--tls-cert", str(cert_path), "--tls-key", str(key_path)]


async def _publish_past_the_seed(cluster: Cluster, ca_path: Path) -> None:
    context = ssl.create_default_context(cafile=str(ca_path))
    seed = cluster.nodes[1]
    members = {cluster.nodes[2].client_address, cluster.nodes[3].client_address}
    async with open_client(
        seed.client_address,
        ssl_context=context,
        server_hostname="localhost",
        connect_timeout_s=5,
        request_timeout_s=15,
        rng=random.Random(4),
    ) as client:
        await client.publish("certs", b"through the seed")
        seed.kill()
        # Only the learned members are left; each must be checked against 127.0.0.1,
        # the host its certificate names (before: against "localhost", and refused).
        await client.publish("certs", b"after the seed stopped")
        assert client.connected_address in members


def test_learned_members_are_checked_against_their_own_host(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca_path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    node_args = {
        1: _cert_for(ca, tmp_path, "node1", "localhost"),
        2: _cert_for(ca, tmp_path, "node2", "127.0.0.1"),
        3: _cert_for(ca, tmp_path, "node3", "127.0.0.1"),
    }
    cluster = Cluster(tmp_path, 3, node_args=node_args)
    try:
        cluster.start()
        cluster.leader(30)
        anyio.run(_publish_past_the_seed, cluster, ca_path)
    finally:
        cluster.stop()
