"""How Raft peers prove who they are: the cluster secret file and node-id certificates.

Used at start (``futureq start``, ``futureq check-config``) and by ``futureq
generate-secret``; the handshake that uses them is :mod:`futureq.raft.peer_auth`.

A node with peers (``cluster.peers`` or ``cluster.join``) authenticates them with

* **mutual TLS** when ``tls.cert_file``, ``tls.key_file`` and ``tls.ca_file`` are set:
  each node's certificate must be signed by the CA and name its node id
  (``node-N.<cluster_id>.futureq`` as a DNS SAN, or ``futureq://<cluster_id>/node/N`` as
  a URI SAN), and/or
* **the cluster secret**, a file every node holds (``cluster.secret_file``).

Neither is refused unless ``cluster.insecure_peers`` is set. Source: docs/security.md.
"""

from __future__ import annotations

import os
import secrets
import ssl
import stat
from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from futureq.config import Config

SECRET_HEX_BYTES = 32
"""Random bytes in a generated secret (written as 64 hex digits)."""


class CredentialError(ValueError):
    """A secret file or certificate that cannot authenticate this node; the message is
    the rest of a sentence that starts with the config key and value."""


@attrs.frozen
class SecretFile:
    """A cluster secret read from its file.

    Attributes:
        secret: The file's bytes with surrounding whitespace removed.
        warnings: Sentences to log (a group-readable file).
    """

    secret: bytes
    warnings: tuple[str, ...] = ()


def read_secret_file(path: str) -> SecretFile:
    """Read and check a cluster secret file.

    Refused: missing, not a regular file, unreadable, empty, shorter than
    ``peer_auth.MIN_SECRET_BYTES`` bytes, readable by every user, or writable by anyone
    but its owner. Allowed with a warning: readable by its group (a Kubernetes secret
    mounted with ``fsGroup`` needs mode 0440).

    Raises:
        CredentialError: saying what is wrong and how to fix it.
    """
    from futureq.raft import peer_auth  # the peer handshake: a single node never loads it

    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise CredentialError(
            f"does not exist; create it with `futureq generate-secret {path}` and give "
            "every node of the cluster a copy"
        ) from None
    except OSError as exc:
        raise CredentialError(f"cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise CredentialError("is not a regular file")
    mode = stat.S_IMODE(info.st_mode)
    if mode & stat.S_IROTH:
        raise CredentialError(
            f"can be read by every user (mode {mode:04o}); restrict it with `chmod 600 {path}`"
        )
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CredentialError(
            f"can be written by others (mode {mode:04o}); restrict it with `chmod 600 {path}`"
        )
    try:
        with open(path, "rb") as file:
            data = file.read(64 * 1024 + 1)
    except OSError as exc:
        raise CredentialError(f"cannot be read: {exc.strerror}") from None
    secret = data.strip()
    if not secret:
        raise CredentialError(
            f"is empty; write a secret into it with `futureq generate-secret {path}`"
        )
    if len(secret) < peer_auth.MIN_SECRET_BYTES:
        raise CredentialError(
            f"holds {len(secret)} bytes; a cluster secret needs at least "
            f"{peer_auth.MIN_SECRET_BYTES} (make one with `futureq generate-secret FILE`)"
        )
    if len(data) > 64 * 1024:
        raise CredentialError("is larger than 64 KiB; a cluster secret is a short random string")
    warnings: tuple[str, ...] = ()
    if mode & stat.S_IRGRP:
        warnings = (
            f"cluster secret file {path} is readable by its group (mode {mode:04o}); "
            f"`chmod 600 {path}` unless the group is this service's own",
        )
    return SecretFile(secret, warnings)


def generate_secret_file(path: str) -> None:
    """Write a new random secret (64 hex digits and a newline) to ``path``, mode 0600.

    Raises:
        FileExistsError: ``path`` exists (it is never overwritten).
        OSError: it cannot be created.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(secrets.token_hex(SECRET_HEX_BYTES) + "\n")
        file.flush()
        os.fsync(file.fileno())


def mutual_tls_configured(config: Config) -> bool:
    """True when the Raft port runs mutual TLS: certificate, key and CA are all set."""
    return config.tls.enabled and config.tls.ca_file is not None


def raft_tls_contexts(config: Config) -> tuple[ssl.SSLContext, ssl.SSLContext] | None:
    """Mutual TLS between peers: each node presents its certificate and accepts only
    peers whose certificate the CA signed (the node id binding is checked in the
    handshake).

    Returns:
        ``(server_context, client_context)``, or None without certificate, key and CA.
    """
    tls = config.tls
    if not mutual_tls_configured(config):
        return None
    assert tls.cert_file is not None and tls.key_file is not None
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=tls.ca_file)
    server.load_cert_chain(tls.cert_file, tls.key_file)
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca_file)
    client.load_cert_chain(tls.cert_file, tls.key_file)
    return server, client


def own_certificate(config: Config) -> Mapping[str, object]:
    """This node's certificate as a peer sees it, by a TLS handshake with itself in memory.

    The server side is exactly the Raft listener's context; the client side trusts the
    same CA and presents the same certificate (host names are not checked here).

    Returns:
        The ``getpeercert()`` dict of our certificate.

    Raises:
        CredentialError: the CA does not verify our certificate, or the files do not load.
    """
    tls = config.tls
    try:
        contexts = raft_tls_contexts(config)
        assert contexts is not None and tls.cert_file is not None and tls.key_file is not None
        server_context = contexts[0]
        client_context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca_file)
        client_context.check_hostname = False
        client_context.load_cert_chain(tls.cert_file, tls.key_file)
    except (ssl.SSLError, OSError) as exc:
        raise CredentialError(f"cannot be loaded: {exc}") from None
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    server = server_context.wrap_bio(to_server, to_client, server_side=True)
    client = client_context.wrap_bio(to_client, to_server, server_side=False)
    done = {"server": False, "client": False}
    try:
        for _ in range(20):
            for name, side in (("client", client), ("server", server)):
                if done[name]:
                    continue
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
            if all(done.values()):
                break
    except ssl.SSLError as exc:
        raise CredentialError(
            f"is not accepted by a peer trusting tls.ca_file {tls.ca_file}: {exc.reason or exc}"
        ) from None
    certificate = client.getpeercert()
    if not all(done.values()) or not certificate:  # pragma: no cover - cannot happen
        raise CredentialError("could not be read back from a TLS handshake")
    return certificate


def check_own_certificate(config: Config) -> None:
    """Raise unless peers would accept this node's certificate as its node id.

    Raises:
        CredentialError: the CA does not sign it, or it does not name the node.
    """
    from futureq.raft import peer_auth  # the peer handshake: a single node never loads it

    certificate = own_certificate(config)
    node_id, cluster_id = config.server.node_id, config.cluster.cluster_id
    named = peer_auth.certificate_node_ids(certificate, cluster_id)
    if node_id in named:
        return
    said = f"names nodes {sorted(named)}" if named else "names no node"
    raise CredentialError(
        f"{said} of cluster {cluster_id!r}, so peers would refuse this node {node_id}: "
        f"issue it a certificate with the DNS name "
        f"{peer_auth.node_dns_name(cluster_id, node_id)!r} or the URI "
        f"{peer_auth.node_uri(cluster_id, node_id)!r} (docs/security.md)"
    )


def peer_mode(config: Config) -> str:
    """How the Raft port authenticates peers, in words for the start-up log."""
    mtls = mutual_tls_configured(config)
    secret = config.cluster.secret_file is not None
    if mtls and secret:
        return "mutual TLS with node-id certificates, and the cluster secret"
    if mtls:
        return "mutual TLS with node-id certificates"
    if secret:
        return (
            "cluster secret (HMAC-SHA-256 challenge-response, every frame MACed; "
            "not encrypted: set tls.ca_file too for mutual TLS)"
        )
    return "UNAUTHENTICATED (cluster.insecure_peers): anyone who reaches it can rewrite the log"


__all__ = [
    "CredentialError",
    "SecretFile",
    "check_own_certificate",
    "generate_secret_file",
    "mutual_tls_configured",
    "own_certificate",
    "peer_mode",
    "raft_tls_contexts",
    "read_secret_file",
]
