"""One incarnation per peer node id at a time (``docs/raft.md``, "Same node id twice").

A second process running as node 2 (its own data directory: another incarnation) would
have its votes and acknowledgements counted as node 2's: two leaders in one term, or a
commit without a majority on disk. The guard lets in one incarnation at a time and a
replaced disk once the old process is gone.
"""

from __future__ import annotations

import pytest

from futureq.raft import peer_auth
from futureq.raft.incarnations import IncarnationGuard, TwinRefusalError

QUIET_S = 0.5


def test_a_second_incarnation_is_refused_while_the_first_is_connected() -> None:
    guard = IncarnationGuard(QUIET_S)
    guard.admit(2, 0xA, "10.0.0.2:7451", now_s=0.0)
    with pytest.raises(TwinRefusalError) as caught:
        guard.admit(2, 0xB, "10.0.0.9:7451", now_s=100.0)
    sentence = caught.value.refusal.sentence()
    assert "two processes run as node 2" in sentence
    assert "incarnation a (at 10.0.0.2:7451)" in sentence
    assert "incarnation b (at 10.0.0.9:7451)" in sentence
    assert "Stop the process that should not run as node 2" in sentence
    assert guard.holder(2) == 0xA


def test_the_holder_keeps_its_id_across_more_connections_and_other_ids_are_apart() -> None:
    guard = IncarnationGuard(QUIET_S)
    first = guard.admit(2, 0xA, "a", now_s=0.0)
    guard.admit(2, 0xA, "a", now_s=0.1)  # its second connection (the other direction)
    guard.admit(3, 0xB, "b", now_s=0.1)  # another node id: its own holder
    guard.close(first, now_s=1.0)
    with pytest.raises(TwinRefusalError):  # one of A's connections is still open
        guard.admit(2, 0xC, "c", now_s=10.0)


def test_a_replaced_disk_is_taken_once_the_old_incarnation_was_gone_for_quiet_s() -> None:
    guard = IncarnationGuard(QUIET_S)
    inbound = guard.admit(2, 0xA, "a", now_s=0.0)
    outbound = guard.admit(2, 0xA, "a", now_s=0.0)
    guard.close(inbound, now_s=5.0)
    guard.close(outbound, now_s=6.0)
    with pytest.raises(TwinRefusalError) as caught:  # gone, but not for long: a blip?
        guard.admit(2, 0xB, "a", now_s=6.0 + QUIET_S / 2)
    # Not "two processes run as node 2": the old one is gone, most likely a new disk.
    refusal = caught.value.refusal
    assert refusal.gone_s == pytest.approx(QUIET_S / 2)
    assert "two processes" not in refusal.sentence()
    assert "node 2's incarnation a closed its last connection 0.2 s ago" in refusal.sentence()
    assert "taken as node 2 once the old one has been gone 0.5 s" in refusal.sentence()
    guard.admit(2, 0xB, "a", now_s=6.0 + QUIET_S)
    assert guard.holder(2) == 0xB
    with pytest.raises(TwinRefusalError):  # and the old one is the stranger now
        guard.admit(2, 0xA, "a", now_s=100.0)


def test_the_same_incarnation_is_always_taken_again() -> None:
    """A restart keeps the directory (its incarnation): its new connections come in while
    the old ones have not closed yet on this side."""
    guard = IncarnationGuard(QUIET_S)
    guard.admit(2, 0xA, "a", now_s=0.0)
    guard.admit(2, 0xA, "a", now_s=0.0)
    assert guard.holder(2) == 0xA


def test_a_peer_that_announces_no_incarnation_is_neither_refused_nor_holds_its_id() -> None:
    guard = IncarnationGuard(QUIET_S)
    guard.admit(2, 0, "old-build", now_s=0.0)
    assert guard.holder(2) is None
    guard.admit(2, 0xA, "a", now_s=0.0)
    guard.admit(2, 0, "old-build", now_s=0.0)
    assert guard.holder(2) == 0xA


def test_closing_a_stale_ticket_of_a_former_holder_changes_nothing() -> None:
    guard = IncarnationGuard(0.0)
    old = guard.admit(2, 0xA, "a", now_s=0.0)
    guard.close(old, now_s=1.0)
    guard.admit(2, 0xB, "b", now_s=1.0)
    guard.close(old, now_s=2.0)  # closed twice: still B's
    with pytest.raises(TwinRefusalError):
        guard.admit(2, 0xA, "a", now_s=3.0)


def test_the_handshake_carries_the_incarnation_both_ways_under_the_proofs() -> None:
    secret = b"k" * 32
    connector = peer_auth.ConnectorHandshake(
        cluster_id="c",
        node_id=2,
        peer_id=1,
        raft_address="h:2",
        client_address=None,
        secret=secret,
        nonce=b"\x01" * 32,
        extensions=peer_auth.incarnation_extension(0xB),
    )
    acceptor = peer_auth.AcceptorHandshake(
        cluster_id="c",
        node_id=1,
        secret=secret,
        nonce=b"\x02" * 32,
        extensions=peer_auth.incarnation_extension(0xA),
    )
    challenge = acceptor.receive_hello(connector.hello.to_wire())
    proof = connector.receive_challenge(challenge.to_wire())
    hello = acceptor.receive_proof(proof.to_wire())
    assert peer_auth.incarnation_from_extensions(hello.extensions) == 0xB
    assert connector.challenge is not None
    assert peer_auth.incarnation_from_extensions(connector.challenge.extensions) == 0xA
    assert peer_auth.incarnation_extension(0) == {}
    assert peer_auth.incarnation_from_extensions({}) == 0


@pytest.mark.parametrize("value", [-1, "a", 1.5, None, True])
def test_a_malformed_incarnation_extension_is_refused(value: object) -> None:
    with pytest.raises(peer_auth.PeerAuthError) as caught:
        peer_auth.incarnation_from_extensions({peer_auth.INCARNATION_KEY: value})
    assert caught.value.reason is peer_auth.RefusalReason.PROTOCOL
