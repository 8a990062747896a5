"""The Raft peer handshake and frame MACs (``raft/peer_auth.py``), driven directly.

Source: docs/security.md (threat model), docs/raft.md ("Peer handshake"). Each attack of
issue 7 part 1 has its sans-IO twin here: a missing or wrong secret, a replayed
handshake, a handshake relayed to another node, a proof reflected to its sender, bytes
injected after the handshake, a certificate of another node.
"""

from __future__ import annotations

import random
from typing import Any

import attrs
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from futureq.errors import ErrorCode, RemoteProtocolError
from futureq.raft import peer_auth
from futureq.raft.messages import NodeId
from futureq.raft.peer_auth import (
    AcceptorHandshake,
    ConnectorHandshake,
    FrameOpener,
    FrameSealer,
    PeerAuthError,
    RefusalReason,
)
from futureq.wire.codec import NEED_DATA, FrameDecoder, encode_value

SECRET = b"0123456789abcdef0123456789abcdef-cluster"
OTHER_SECRET = b"fedcba9876543210fedcba9876543210-cluster"


def _nonces(seed: int) -> Any:
    rng = random.Random(seed)
    while True:
        yield rng.randbytes(peer_auth.NONCE_BYTES)


NONCES = _nonces(7)


def connector(
    secret: bytes | None = SECRET, *, node_id: int = 1, peer_id: int = 2, **kw: Any
) -> ConnectorHandshake:
    return ConnectorHandshake(
        cluster_id=kw.pop("cluster_id", "prod"),
        node_id=node_id,
        peer_id=peer_id,
        raft_address=f"10.0.0.{node_id}:7451",
        client_address=f"10.0.0.{node_id}:7450",
        secret=secret,
        nonce=kw.pop("nonce", next(NONCES)),
        **kw,
    )


def acceptor(secret: bytes | None = SECRET, *, node_id: int = 2, **kw: Any) -> AcceptorHandshake:
    return AcceptorHandshake(
        cluster_id=kw.pop("cluster_id", "prod"),
        node_id=node_id,
        secret=secret,
        nonce=kw.pop("nonce", next(NONCES)),
        **kw,
    )


def wire(frame: Any) -> object:
    """What the other side's decoder returns for ``frame`` (encode, then decode)."""
    decoder = FrameDecoder(peer_auth.MAX_HANDSHAKE_FRAME_BYTES, parse=False)
    decoder.receive_data(encode_value(frame.to_wire()))
    return decoder.next_frame()


def run(c: ConnectorHandshake, a: AcceptorHandshake) -> peer_auth.Hello:
    challenge = a.receive_hello(wire(c.hello))
    proof = c.receive_challenge(wire(challenge))
    hello = a.receive_proof(wire(proof))
    c.receive_verdict(wire(peer_auth.Accepted()))
    return hello


def refused(reason: RefusalReason, match: str | None = None) -> Any:
    class _Check:
        def __enter__(self) -> None:
            self._raises = pytest.raises(PeerAuthError, match=match)
            self._info = self._raises.__enter__()

        def __exit__(self, *exc: object) -> bool:
            handled = self._raises.__exit__(*exc)  # type: ignore[arg-type]
            assert self._info.value.reason is reason, self._info.value
            return bool(handled)

    return _Check()


# --- the handshake succeeds --------------------------------------------------------------


def test_secret_handshake_authenticates_both_sides_and_keys_the_frames() -> None:
    c, a = connector(), acceptor()
    hello = run(c, a)
    assert (hello.from_id, hello.to_id, hello.raft_address) == (1, 2, "10.0.0.1:7451")
    assert c.accepted and c.sealer is not None and a.opener is not None
    for message in (b"", b"x", bytes(range(256)) * 40):
        assert a.opener.open(c.sealer.seal(message)) == message


def test_without_secret_proofs_are_empty_and_frames_unsealed() -> None:
    c, a = connector(None), acceptor(None)
    challenge = a.receive_hello(wire(c.hello))
    assert challenge.proof == b""
    proof = c.receive_challenge(wire(challenge))
    assert proof.proof == b""
    a.receive_proof(wire(proof))
    assert c.sealer is None and a.opener is None


def test_under_mutual_tls_frames_are_not_sealed_but_certificates_are_checked() -> None:
    cert_1 = {"subjectAltName": (("DNS", "node-1.prod.futureq"),)}
    cert_2 = {"subjectAltName": (("URI", "futureq://prod/node/2"),)}
    c = connector(peer_certificate=cert_2, require_certificate=True)
    a = acceptor(peer_certificate=cert_1, require_certificate=True)
    run(c, a)
    assert c.sealer is None and a.opener is None  # TLS protects the frames


def test_transcripts_agree_and_every_connection_has_its_own_session_key() -> None:
    keys = set()
    for _ in range(3):
        c, a = connector(), acceptor()
        run(c, a)
        assert c.challenge is not None
        transcript = peer_auth.transcript_hash(c.hello, c.challenge)
        keys.add(peer_auth.session_key(SECRET, transcript))
    assert len(keys) == 3


# --- the secret is missing or wrong --------------------------------------------------------


def test_wrong_secret_is_caught_by_the_connector_before_it_proves_anything() -> None:
    c, a = connector(OTHER_SECRET), acceptor(SECRET)
    challenge = a.receive_hello(wire(c.hello))
    with refused(RefusalReason.SECRET, "secret files differ"):
        c.receive_challenge(wire(challenge))


def test_wrong_secret_is_caught_by_the_acceptor() -> None:
    """A connector that ignores the acceptor's proof and answers with its own key."""
    c, a = connector(SECRET), acceptor(SECRET)
    challenge = a.receive_hello(wire(c.hello))
    transcript = peer_auth.transcript_hash(c.hello, challenge)
    forged = peer_auth.Proof(peer_auth.connector_proof(OTHER_SECRET, transcript))
    with refused(RefusalReason.SECRET, "failed the cluster secret challenge"):
        a.receive_proof(wire(forged))


@pytest.mark.parametrize("proof", [b"", bytes(32)])
def test_missing_or_zero_proof_is_refused(proof: bytes) -> None:
    c, a = connector(None), acceptor(SECRET)
    a.receive_hello(wire(c.hello))
    with refused(RefusalReason.SECRET):
        a.receive_proof(wire(peer_auth.Proof(proof)))


def test_a_node_without_secret_meets_one_with_it() -> None:
    c, a = connector(None), acceptor(SECRET)
    with refused(RefusalReason.SECRET, "requires a cluster secret and this node has none"):
        c.receive_challenge(wire(a.receive_hello(wire(c.hello))))
    c, a = connector(SECRET), acceptor(None)
    with refused(RefusalReason.SECRET, "runs without a cluster secret"):
        c.receive_challenge(wire(a.receive_hello(wire(c.hello))))
    c, a = connector(SECRET), acceptor(None)
    a.receive_hello(wire(c.hello))
    with refused(RefusalReason.SECRET, "this node has none"):
        a.receive_proof(wire(peer_auth.Proof(bytes(32))))


# --- replay, relay, reflection -------------------------------------------------------------


def test_replayed_handshake_fails_against_a_fresh_nonce() -> None:
    c, a = connector(), acceptor()
    hello = wire(c.hello)
    challenge = a.receive_hello(hello)
    proof = wire(c.receive_challenge(wire(challenge)))
    a.receive_proof(proof)
    # The recording, played to the same node later: it answers with a new nonce.
    later = acceptor()
    later.receive_hello(hello)
    with refused(RefusalReason.SECRET):
        later.receive_proof(proof)


def test_recorded_acceptor_answer_fails_against_a_fresh_connector_nonce() -> None:
    """The mirror image: a fake acceptor replays node 2's recorded CHALLENGE."""
    c, a = connector(), acceptor()
    recorded = wire(a.receive_hello(wire(c.hello)))
    with refused(RefusalReason.SECRET):
        connector().receive_challenge(recorded)


def test_handshake_relayed_to_another_node_is_refused() -> None:
    c = connector(peer_id=2)
    with refused(RefusalReason.IDENTITY, "addressed node 2 but this is node 3"):
        acceptor(node_id=3).receive_hello(wire(c.hello))
    # ...and the connector refuses a node other than the one it dialled.
    impostor = acceptor(node_id=3)
    forged = attrs.evolve(c.hello, to_id=NodeId(3))
    challenge = impostor.receive_hello(wire(forged))
    with refused(RefusalReason.IDENTITY, "is node 3, not node 2"):
        c.receive_challenge(wire(challenge))


def test_reflected_proof_is_refused() -> None:
    """An attacker posing as node 1 echoes node 2's own proof back to it."""
    c, a = connector(), acceptor()
    challenge = a.receive_hello(wire(c.hello))
    with refused(RefusalReason.SECRET):
        a.receive_proof(wire(peer_auth.Proof(challenge.proof)))


def test_parallel_session_reflection_is_refused() -> None:
    """The attacker opens a second connection to node 2 whose nonce is node 2's nonce
    from the first, hoping node 2's answer there is the proof the first one wants."""
    attacker = connector(None)
    first = acceptor()
    challenge_1 = first.receive_hello(wire(attacker.hello))
    second = acceptor()
    hello_2 = attrs.evolve(attacker.hello, nonce=challenge_1.nonce)
    challenge_2 = second.receive_hello(wire(hello_2))
    for stolen in (challenge_2.proof, challenge_1.proof):
        again = acceptor(nonce=challenge_1.nonce)
        again.receive_hello(wire(attacker.hello))
        with refused(RefusalReason.SECRET):
            again.receive_proof(wire(peer_auth.Proof(stolen)))


def test_echoed_nonce_is_refused() -> None:
    c = connector()
    challenge = peer_auth.Challenge(NodeId(2), c.hello.nonce, bytes(32))
    with refused(RefusalReason.PROTOCOL, "echoed our nonce"):
        c.receive_challenge(wire(challenge))


@pytest.mark.parametrize(
    "change",
    [
        {"raft_address": "10.9.9.9:7451"},
        {"client_address": "10.9.9.9:7450"},
        {"from_id": NodeId(3)},
        {"extensions": {"incarnation": 5}},
    ],
)
def test_hello_altered_in_transit_breaks_the_proofs(change: dict[str, Any]) -> None:
    c, a = connector(), acceptor()
    challenge = a.receive_hello(wire(attrs.evolve(c.hello, **change)))
    with refused(RefusalReason.SECRET):
        c.receive_challenge(wire(challenge))


def test_unknown_extensions_are_carried_and_covered() -> None:
    c, a = connector(extensions={"future": [1, "two", b"3"]}), acceptor(extensions={"x": 1})
    hello = run(c, a)
    assert hello.extensions == {"future": [1, "two", b"3"]}


# --- other refusals ------------------------------------------------------------------------


def test_other_cluster_own_id_and_old_protocol_are_refused() -> None:
    with refused(RefusalReason.CLUSTER, "cluster 'staging'"):
        acceptor().receive_hello(wire(connector(cluster_id="staging").hello))
    with refused(RefusalReason.IDENTITY, "our own node id"):
        acceptor(node_id=2).receive_hello(wire(connector(node_id=2, peer_id=2).hello))
    old = ["futureq-raft", 1, "prod", 1, "10.0.0.1:7451", None]
    with pytest.raises(PeerAuthError, match="version 1 peers are unauthenticated") as info:
        acceptor().receive_hello(old)
    assert info.value.code is ErrorCode.UNSUPPORTED_VERSION


def test_refusal_reaches_the_connector_with_its_sentence() -> None:
    c = connector()
    refusal = peer_auth.Refused(int(ErrorCode.AUTH_FAILED), "go away")
    with refused(RefusalReason.REFUSED, "node 2 refused the connection: go away"):
        c.receive_challenge(wire(refusal))
    c2, a = connector(), acceptor()
    c2.receive_challenge(wire(a.receive_hello(wire(c2.hello))))
    with refused(RefusalReason.REFUSED, "refused the connection: no"):
        c2.receive_verdict(wire(peer_auth.Refused(999, "no")))


def test_certificate_must_name_the_claimed_node() -> None:
    cert_of_2 = {"subjectAltName": (("DNS", "node-2.prod.futureq"), ("IP Address", "10.0.0.2"))}
    c = connector(node_id=1)
    with refused(
        RefusalReason.CERTIFICATE, "claims node 1 but its certificate names nodes \\[2\\]"
    ):
        acceptor(peer_certificate=cert_of_2, require_certificate=True).receive_hello(wire(c.hello))
    with refused(RefusalReason.CERTIFICATE, "names no node"):
        acceptor(peer_certificate={}, require_certificate=True).receive_hello(wire(c.hello))
    c = connector(peer_id=3, peer_certificate=cert_of_2, require_certificate=True)
    challenge = acceptor(node_id=3).receive_hello(wire(c.hello))
    with refused(RefusalReason.CERTIFICATE, "node-3.prod.futureq"):
        c.receive_challenge(wire(challenge))


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        ((("DNS", "node-1.prod.futureq"),), {1}),
        ((("DNS", "NODE-12.Prod.FutureQ"),), {12}),
        ((("URI", "futureq://prod/node/7"),), {7}),
        ((("DNS", "node-1.staging.futureq"), ("URI", "futureq://staging/node/2")), set()),
        ((("DNS", "*.prod.futureq"),), set()),
        ((("DNS", "node-01.prod.futureq"), ("DNS", "node-x.prod.futureq")), set()),
        ((("DNS", "node-.prod.futureq"), ("DNS", "node-1.prod.futureq.evil")), set()),
        ((("DNS", "node-1.prod.futureq"), ("DNS", "node-2.prod.futureq")), {1, 2}),
        ((("IP Address", "10.0.0.1"), ("email", "node-1.prod.futureq")), set()),
    ],
)
def test_certificate_node_ids(names: tuple[tuple[str, str], ...], expected: set[int]) -> None:
    assert peer_auth.certificate_node_ids({"subjectAltName": names}, "prod") == expected


# --- frames after the handshake ------------------------------------------------------------


def sealed_pair() -> tuple[FrameSealer, FrameOpener]:
    c, a = connector(), acceptor()
    run(c, a)
    assert c.sealer is not None and a.opener is not None
    return c.sealer, a.opener


def test_injected_or_altered_frames_are_refused() -> None:
    sealer, opener = sealed_pair()
    frame = sealer.seal(b"append entries")
    flipped = bytearray(frame)
    flipped[-1] ^= 1
    with refused(RefusalReason.FRAME, "MAC does not match"):
        opener.open(bytes(flipped))
    with refused(RefusalReason.FRAME, "too short"):
        opener.open(frame[:39])
    # A frame sealed for another connection (another session key) is refused too.
    other, _ = sealed_pair()
    with refused(RefusalReason.FRAME, "MAC does not match"):
        opener.open(other.seal(b"append entries"))


def test_frames_may_be_dropped_but_not_replayed_or_reordered() -> None:
    sealer, opener = sealed_pair()
    first, second, third = (sealer.seal(b"%d" % i) for i in range(3))
    assert opener.open(second) == b"1"  # the first was lost on the way: allowed
    with refused(RefusalReason.FRAME, "replayed or reordered"):
        opener.open(first)
    with refused(RefusalReason.FRAME, "replayed or reordered"):
        opener.open(second)
    assert opener.open(third) == b"2"


# --- fuzz: any input is a frame or a PeerAuthError, never anything else --------------------

msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=12) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
handshake_like = st.builds(
    lambda kind, fields: ["futureq-raft", 2, kind, *fields],
    st.sampled_from(["hello", "challenge", "proof", "accepted", "refused", "other"]),
    st.lists(
        st.one_of(
            msgpack_values,
            st.binary(min_size=32, max_size=32),
            st.integers(0, 10),
            st.just("10.0.0.1:7451"),
        ),
        max_size=10,
    ),
)


@settings(max_examples=500, deadline=None)
@given(st.one_of(msgpack_values, handshake_like))
def test_parse_frame_never_raises_anything_else(value: object) -> None:
    try:
        frame = peer_auth.parse_frame(value)
    except PeerAuthError:
        return
    assert peer_auth.parse_frame(msgpack.unpackb(msgpack.packb(frame.to_wire()))) == frame


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(msgpack_values, handshake_like), min_size=1, max_size=3))
def test_acceptor_fed_anything_refuses_cleanly(values: list[object]) -> None:
    a = acceptor()
    try:
        a.receive_hello(values[0])
        for value in values[1:]:
            a.receive_proof(value)
    except PeerAuthError:
        return
    raise AssertionError("an unauthenticated peer passed the handshake")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(1, 7))
def test_handshake_bytes_decode_or_fail_with_a_protocol_error(data: bytes, step: int) -> None:
    decoder = FrameDecoder(peer_auth.MAX_HANDSHAKE_FRAME_BYTES, parse=False)
    a = acceptor()
    try:
        for start in range(0, len(data), step):
            decoder.receive_data(data[start : start + step])
        decoder.receive_data(b"")
        value = decoder.next_frame()
        if value is not NEED_DATA:
            a.receive_hello(value)
    except RemoteProtocolError:
        return


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120))
def test_opener_refuses_any_forged_frame(data: bytes) -> None:
    _, opener = sealed_pair()
    with pytest.raises(PeerAuthError):
        opener.open(data)


# --- the shard layout both ends must share (docs/sharding.md, "Agreement") ----------------


def _layout(shards: int, shard: int = 0, **kw: int) -> peer_auth.ShardLayout:
    return peer_auth.ShardLayout(shards=shards, shard=shard, **kw)


def test_ends_of_the_same_shard_layout_connect_and_one_shard_announces_nothing() -> None:
    same = _layout(2, 1, stride=1)
    hello = run(connector(shards=same), acceptor(shards=same))
    assert hello.extensions == {"shards": 2, "shard": 1, "slot_map": 1, "stride": 1}
    # A node of 1 shard sends the HELLO an older build sent: no shard keys at all.
    one = connector(shards=_layout(1))
    assert one.hello.to_wire()[-1] == {} and connector().hello.to_wire()[-1] == {}
    assert acceptor(shards=_layout(1)).receive_hello(wire(one.hello)).extensions == {}
    run(one, acceptor())


def test_another_shard_count_is_refused_by_the_acceptor_naming_both_counts() -> None:
    c, a = connector(shards=_layout(3)), acceptor(shards=_layout(2))
    challenge = a.receive_hello(wire(c.hello))
    with refused(RefusalReason.SHARDS, r"node 2 runs 2 shards \(shard 0.*this node 3 shards"):
        c.receive_challenge(wire(challenge))
    # An acceptor that does not hear the connector's objection refuses it itself.
    c2, a2 = connector(shards=_layout(3)), acceptor(shards=_layout(2))
    challenge = a2.receive_hello(wire(c2.hello))
    proof = peer_auth.Proof(
        peer_auth.connector_proof(SECRET, peer_auth.transcript_hash(c2.hello, challenge))
    )
    with refused(RefusalReason.SHARDS, r"node 1 runs 3 shards .* this node 2 shards"):
        a2.receive_proof(wire(proof))
    error = peer_auth.shard_disagreement(_layout(2), _layout(3), 5)
    assert error is not None and error.code is ErrorCode.SHARD_LAYOUT_MISMATCH
    assert "same number of shards (node.shards)" in error.message


def test_a_peer_announcing_no_count_counts_as_one_shard() -> None:
    """A node of an older build (or of 1 shard) sends no shard keys: 1 shard."""
    with refused(RefusalReason.SHARDS, "node 2 runs 1 shard and this node 2 shards"):
        run(connector(shards=_layout(2)), acceptor())
    # An older connector does not look at the CHALLENGE's keys: the acceptor refuses it.
    c, a = connector(), acceptor(shards=_layout(2))
    challenge = a.receive_hello(wire(c.hello))
    transcript = peer_auth.transcript_hash(c.hello, challenge)
    with refused(RefusalReason.SHARDS, "node 1 runs 1 shard and this node 2 shards"):
        a.receive_proof(wire(peer_auth.Proof(peer_auth.connector_proof(SECRET, transcript))))


@pytest.mark.parametrize(
    ("theirs", "sentence"),
    [
        (_layout(2, 1), "shard 1, slot map version 1, port stride 100"),
        (_layout(2, 0, stride=200), "give every node the same stride"),
        (_layout(2, 0, slot_map=2), "the same slot map"),
    ],
)
def test_another_shard_slot_map_or_stride_is_refused(
    theirs: peer_auth.ShardLayout, sentence: str
) -> None:
    with refused(RefusalReason.SHARDS, sentence):
        run(connector(shards=_layout(2, 0)), acceptor(shards=theirs))


def test_the_shard_check_comes_after_the_secret_and_rejects_malformed_keys() -> None:
    with refused(RefusalReason.SECRET):
        run(connector(shards=_layout(2)), acceptor(OTHER_SECRET, shards=_layout(3)))
    for bad in ({"shards": "2"}, {"shards": 2, "shard": -1}, {"shards": 0}):
        c, a = connector(extensions=bad), acceptor(shards=_layout(2))
        transcript = peer_auth.transcript_hash(c.hello, a.receive_hello(wire(c.hello)))
        proof = peer_auth.Proof(peer_auth.connector_proof(SECRET, transcript))
        with refused(RefusalReason.PROTOCOL, "handshake extension"):
            a.receive_proof(wire(proof))
