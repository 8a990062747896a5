"""The Raft TLS refusals say one thing one way, from one helper: what this node met,
which end uses peer mutual TLS and which does not, and the one fix (a reviewer found two
sentences saying the same thing differently)."""

from __future__ import annotations

from futureq.raft.transport import foreign_protocol, tls_mismatch

FIX = "give every node the same [tls] settings"


def test_every_direction_names_the_end_with_tls_the_end_without_and_the_fix() -> None:
    dialled = tls_mismatch(
        "node 2's Raft port at h:1 answers without TLS", "this node", "that node"
    )
    assert dialled == (
        "node 2's Raft port at h:1 answers without TLS: this node uses peer mutual TLS "
        "(tls.ca_file) and that node does not; " + FIX
    )
    tls_client_hello = bytes([0x16, 0x03, 0x01, 0x00, 0x50, 0x01])
    met = foreign_protocol(tls_client_hello)
    assert met == tls_mismatch(
        "a TLS handshake arrived on this node's Raft port, which runs without TLS",
        "the connecting node",
        "this node",
    )
