"""Config checks of the security settings: the ``[tls]`` files and how peers authenticate.

``check_tls`` checks that the certificate, key and CA files exist and hold usable PEM
data; ``check_peer_authentication`` checks, across sections, that a cluster's peers
have a way to authenticate each other (a cluster secret or mutual TLS).

Source: ``docs/security.md``; STYLE.md §4.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterable

from futureq.config import (
    Config,
    TlsConfig,
)
from futureq.config_checks import Bad
from futureq.peer_credentials import (
    CredentialError,
    check_own_certificate,
    mutual_tls_configured,
)


def check_tls(tls: TlsConfig) -> Iterable[Bad]:
    if (tls.cert_file is None) != (tls.key_file is None):
        given, missing = (
            ("cert_file", "key_file") if tls.key_file is None else ("key_file", "cert_file")
        )
        yield Bad(
            (f"tls.{given}", f"tls.{missing}"),
            getattr(tls, given),
            f"tls.{missing} must be set too (set both to turn TLS on, or neither)",
        )
    absent = False
    for key in ("cert_file", "key_file", "ca_file"):
        value = getattr(tls, key)
        if value is not None and not os.path.isfile(value):
            absent = True
            yield Bad((f"tls.{key}",), value, "must be an existing PEM file")
    if not absent:
        yield from _check_tls_contents(tls)
    if tls.ca_file is not None and not tls.enabled:
        yield Bad(
            ("tls.ca_file",),
            tls.ca_file,
            "is only used with TLS on; set tls.cert_file and tls.key_file too, or unset it",
        )
    if tls.require_client_cert and tls.ca_file is None:
        yield Bad(
            ("tls.require_client_cert",),
            True,
            "needs tls.ca_file to verify client certificates",
        )
    if tls.http and not tls.enabled:
        yield Bad(
            ("tls.http",),
            True,
            "needs tls.cert_file and tls.key_file (the HTTP port uses the same certificate)",
        )


def _check_tls_contents(tls: TlsConfig) -> Iterable[Bad]:
    """Load the TLS files as the client listener does, so a file that exists but is not
    what its key says (a garbage certificate, certificate and key swapped, a key of
    another certificate, a CA file without certificates) is a configuration problem
    naming the key and file, not a bare OpenSSL error at bind time."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    if tls.cert_file is not None:
        try:  # the certificate alone: any PEM certificate in the file
            context.load_verify_locations(cafile=tls.cert_file)
        except (ssl.SSLError, OSError) as error:
            yield Bad(
                ("tls.cert_file",),
                tls.cert_file,
                f"holds no PEM certificate ({_ssl_reason(error)}); give this server's "
                "certificate chain (is it the key file?)",
            )
            return
        if tls.key_file is not None:
            try:
                context.load_cert_chain(tls.cert_file, tls.key_file)
            except (ssl.SSLError, OSError) as error:
                if getattr(error, "reason", None) == "KEY_VALUES_MISMATCH":
                    rule = (
                        f"is not the private key of tls.cert_file {tls.cert_file!r} (the key "
                        "values do not match); give the key the certificate was issued for"
                    )
                else:
                    rule = (
                        f"holds no usable PEM private key ({_ssl_reason(error)}); give the "
                        "unencrypted private key of tls.cert_file (is it the certificate?)"
                    )
                # tls.cert_file too: the peer check would report the same pair again.
                yield Bad(("tls.key_file", "tls.cert_file"), tls.key_file, rule)
    if tls.ca_file is not None:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cafile=tls.ca_file)
        except (ssl.SSLError, OSError) as error:
            yield Bad(
                ("tls.ca_file",),
                tls.ca_file,
                f"holds no PEM CA certificate ({_ssl_reason(error)}); give the bundle of CA "
                "certificates that sign client and peer certificates",
            )


def _ssl_reason(error: Exception) -> str:
    """OpenSSL's words for ``error`` without the ``(_ssl.c:NNNN)`` source location."""
    if isinstance(error, ssl.SSLError):
        if error.reason:
            return str(error.reason).replace("_", " ").lower()
        return "OpenSSL cannot read it as PEM"
    if isinstance(error, OSError):
        return error.strerror or str(error)
    return str(error)  # pragma: no cover - only the two above are caught


def check_peer_authentication(config: Config) -> Iterable[Bad]:
    """A node with peers authenticates them, or the operator said not to (docs/security.md)."""
    cluster = config.cluster
    if not cluster.clustered:
        return
    key, value = (
        ("cluster.peers", cluster.peers)
        if cluster.peers.strip()
        else (
            "cluster.join",
            cluster.join,
        )
    )
    if mutual_tls_configured(config):
        try:
            check_own_certificate(config)
        except CredentialError as error:
            yield Bad(
                ("tls.cert_file", "server.node_id", "cluster.cluster_id"),
                config.tls.cert_file,
                str(error),
            )
    elif cluster.secret_file is None and not cluster.insecure_peers:
        yield Bad(
            (key, "cluster.secret_file", "cluster.insecure_peers"),
            value,
            "a node with peers must authenticate them: give every node the same "
            "--cluster-secret-file (make one with `futureq generate-secret FILE`), or mutual "
            "TLS with --tls-cert, --tls-key and --tls-ca (certificates naming the node id), "
            "or pass --insecure-peers to let anyone who reaches the Raft port act as a node",
        )
