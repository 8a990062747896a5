"""Who is on the other end of a Raft link: the peer handshake and per-frame MACs, sans-IO.

Every Raft connection starts with this handshake, before any Raft message is read
(``docs/security.md``; the byte layout is in ``docs/raft.md``, "Peer handshake"). The
node that opens the connection is the *connector*, the one that accepted it the
*acceptor*; Raft messages then flow from the connector to the acceptor only.

::

    connector                                              acceptor
      HELLO [magic, 2, "hello", cluster_id, from_id, to_id,
             raft_address, client_address, nonce_c, ext]  ──▶
                                                          ◀──  CHALLENGE [magic, 2, "challenge",
                                                                 node_id, nonce_a, proof_a, ext]
      PROOF [magic, 2, "proof", proof_c]                  ──▶
                                                          ◀──  ACCEPTED [magic, 2, "accepted"]
                                                               (or REFUSED [magic, 2, "refused",
                                                                code, message] at any step)

With a shared cluster secret ``K`` (``[cluster] secret_file``), both nonces are 32
fresh random bytes, ``T = SHA-256(msgpack([magic, 2, hello, [node_id, nonce_a, ext_a]]))``
is the transcript hash, and

* ``proof_a = HMAC-SHA-256(K, "futureq-raft/2 acceptor proof" 0x00 || T)``,
* ``proof_c = HMAC-SHA-256(K, "futureq-raft/2 connector proof" 0x00 || T)``,
* ``session = HMAC-SHA-256(K, "futureq-raft/2 frames connector->acceptor" 0x00 || T)``.

Both proofs cover the cluster id, both node ids, both nonces, the connector's
addresses and both extension maps, and the labels differ per direction: a recorded
handshake fails against a fresh nonce (replay), one relayed to another node fails on
its node id (relay), and a proof echoed back to its sender fails on its label
(reflection). Proofs are compared with :func:`hmac.compare_digest`. Each Raft frame the
connector then sends is ``seq (8 bytes, big-endian) || HMAC-SHA-256(session, seq ||
message) || message``; the acceptor requires a valid tag and a sequence number above
the last one, so bytes injected into the TCP stream after the handshake, or frames
replayed or reordered, close the connection. Gaps are allowed: dropping frames is
what any network can do and Raft tolerates it (Raft paper §5.1, "messages may be lost").

Under mutual TLS the certificates must name the node id (:func:`certificate_node_ids`):
each side checks the other's certificate names the id claimed in the handshake.
TLS protects the frames, so no frame MAC is added; with a secret too, the proofs are
checked as well. Without secret or TLS (``--insecure-peers``) the proofs are empty and
the handshake only checks cluster and node ids.

Pure: no sockets, clocks or randomness (nonces are passed in), so every step can be
driven and fuzzed directly (``tests/unit/raft/test_raft_peer_auth.py``).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Mapping
from typing import Final

import attrs
import msgpack

from futureq.config import split_host_port
from futureq.errors import ErrorCode, RemoteProtocolError
from futureq.raft.basics import NodeId

MAGIC: Final = "futureq-raft"
PROTOCOL_VERSION: Final = 2
"""Version of the peer protocol (handshake and frame layout). Version 1 had no
authentication and is refused."""
NONCE_BYTES: Final = 32
MAC_BYTES: Final = 32
SEQ_BYTES: Final = 8
SEALED_OVERHEAD_BYTES: Final = SEQ_BYTES + MAC_BYTES
"""Bytes a sealed frame adds to a Raft message: sequence number and tag."""
MIN_SECRET_BYTES: Final = 32
"""Shortest cluster secret accepted (bytes, surrounding whitespace stripped)."""
MAX_HANDSHAKE_FRAME_BYTES: Final = 8192
"""Largest handshake frame read before the peer is authenticated (bytes)."""
MAX_REFUSAL_CHARS: Final = 300
MAX_EXTENSIONS: Final = 32

_ACCEPTOR_PROOF: Final = b"futureq-raft/2 acceptor proof\x00"
_CONNECTOR_PROOF: Final = b"futureq-raft/2 connector proof\x00"
_SESSION_KEY: Final = b"futureq-raft/2 frames connector->acceptor\x00"

NODE_DNS_SUFFIX: Final = "futureq"
"""Certificates name node ``N`` of cluster ``C`` as the DNS SAN ``node-N.C.futureq``..."""
NODE_URI_SCHEME: Final = "futureq"
"""...or as the URI SAN ``futureq://C/node/N``."""


class RefusalReason(enum.Enum):
    """Why a handshake or a frame was refused (the ``reason`` label of the metric)."""

    PROTOCOL = "protocol"
    """Not the handshake, wrong version, malformed fields, or a frame before the handshake."""
    CLUSTER = "cluster"
    """The peer belongs to another cluster."""
    IDENTITY = "identity"
    """A node id that does not fit: ours, not the one we dialled, not the one addressed."""
    SECRET = "secret"
    """A missing or wrong proof of the cluster secret."""
    CERTIFICATE = "certificate"
    """Under mutual TLS, the peer certificate does not name the node id it claims."""
    FRAME = "frame"
    """After the handshake: a frame whose MAC or sequence number is wrong."""
    REFUSED = "refused"
    """The node we connected to refused us (its REFUSED frame says why)."""
    SHARDS = "shards"
    """The peer runs another shard count, slot map version, shard or port stride."""
    TWIN = "twin"
    """Another incarnation of the peer's node id is connected (two processes run as
    that node: :mod:`futureq.raft.incarnations`)."""
    REPLACED = "replaced"
    """Another incarnation of the peer's node id left moments ago (its disk was most
    likely replaced): the new one is taken once the old one has been gone the quiet
    period (:mod:`futureq.raft.incarnations`)."""


class PeerAuthError(RemoteProtocolError):
    """The peer failed the handshake or sent a frame that is not authentic.

    Attributes:
        reason: Which check failed.
    """

    def __init__(self, reason: RefusalReason, code: ErrorCode, message: str) -> None:
        super().__init__(code, message)
        self.reason = reason


def _refuse(
    reason: RefusalReason, message: str, code: ErrorCode = ErrorCode.AUTH_FAILED
) -> PeerAuthError:
    return PeerAuthError(reason, code, message)


def _malformed(message: str) -> PeerAuthError:
    return PeerAuthError(RefusalReason.PROTOCOL, ErrorCode.INVALID_FRAME, message)


# --- the shard layout both ends must share ---------------------------------------------


@attrs.frozen
class ShardLayout:
    """Where a Raft link's end sits in a sharded node (``docs/sharding.md``, "Agreement between nodes").

    Carried in the HELLO's and the CHALLENGE's extensions (keys ``shards``, ``shard``,
    ``slot_map``, ``stride``) only when ``shards`` is above 1, so the handshake of a
    single-shard node is the same bytes as before; an end that sends no ``shards`` (a
    single-shard node, or a build older than this check) counts as 1 shard.

    Attributes:
        shards: The node's shard count (``node.shards``), 1 to 64.
        shard: Which shard this process is (0-based): shard ``K`` of every node is one
            Raft group, so both ends of a link must be the same ``K``.
        slot_map: Version of the node's slot map (1 for today's fixed maps).
        stride: ``node.shard_port_stride``: shard ``K`` listens on the node's ports
            plus ``K * stride`` on every node.
    """

    shards: int = 1
    shard: int = 0
    slot_map: int = 1
    stride: int = 100

    def to_extensions(self) -> dict[str, object]:
        """The extension keys announcing this layout (none for a single shard)."""
        if self.shards == 1:
            return {}
        return {
            "shards": self.shards,
            "shard": self.shard,
            "slot_map": self.slot_map,
            "stride": self.stride,
        }

    @classmethod
    def from_extensions(cls, extensions: Mapping[str, object]) -> ShardLayout:
        """The layout a peer announced; 1 shard when it announced none.

        Raises:
            PeerAuthError: PROTOCOL when a key is not a positive integer (shard >= 0).
        """
        if "shards" not in extensions:
            return cls()
        values: dict[str, int] = {}
        for key, least in (("shards", 1), ("shard", 0), ("slot_map", 1), ("stride", 1)):
            value = extensions.get(key)
            if type(value) is not int or value < least:
                raise _malformed(f"handshake extension {key!r} must be an integer >= {least}")
            values[key] = value
        return cls(**values)

    def describe(self) -> str:
        """``"3 shards (shard 1, slot map version 1, port stride 100)"`` or ``"1 shard"``."""
        if self.shards == 1:
            return "1 shard"
        return (
            f"{self.shards} shards (shard {self.shard}, slot map version {self.slot_map}, "
            f"port stride {self.stride})"
        )


def shard_disagreement(ours: ShardLayout, theirs: ShardLayout, peer: int) -> PeerAuthError | None:
    """The refusal of a link between ends whose shard layouts differ, or None.

    Args:
        ours: This process's layout.
        theirs: What the peer announced (:meth:`ShardLayout.from_extensions`).
        peer: The peer's node id (named in the sentence).
    """
    if ours == theirs or (ours.shards == theirs.shards == 1):
        return None
    if ours.shards != theirs.shards:
        fix = (
            "every node of a cluster must run the same number of shards (node.shards); "
            "start the node that differs with the cluster's count on an empty data "
            "directory (a node of an older build counts as 1 shard); node.shards = auto, "
            "the default, gives a new node its machine's cores: on machines with other "
            "core counts give every node the same --shards"
        )
    elif ours.slot_map != theirs.slot_map:
        fix = "every node of a cluster must use the same slot map"
    else:
        fix = (
            "shard K of every node must listen on its node's ports plus K times the same "
            "node.shard_port_stride; give every node the same stride"
        )
    return PeerAuthError(
        RefusalReason.SHARDS,
        ErrorCode.SHARD_LAYOUT_MISMATCH,
        f"node {peer} runs {theirs.describe()} and this node {ours.describe()}: {fix}",
    )


# --- the data-directory incarnation ------------------------------------------------------

INCARNATION_KEY: Final = "incarnation"
"""Extension key of the HELLO and the CHALLENGE: the sender's data-directory incarnation."""


def incarnation_extension(incarnation: int) -> dict[str, object]:
    """The extension announcing ``incarnation`` (none for 0, an unstamped directory)."""
    return {INCARNATION_KEY: incarnation} if incarnation else {}


def incarnation_from_extensions(extensions: Mapping[str, object]) -> int:
    """The incarnation a peer announced; 0 when it announced none (an older build).

    Raises:
        PeerAuthError: PROTOCOL when the value is not an integer >= 0.
    """
    value = extensions.get(INCARNATION_KEY, 0)
    if type(value) is not int or value < 0:
        raise _malformed(f"handshake extension {INCARNATION_KEY!r} must be an integer >= 0")
    return value


# --- frames -----------------------------------------------------------------------------


@attrs.frozen
class Hello:
    """The connector's first frame: who it is, whom it wants, its nonce.

    Attributes:
        cluster_id: The connector's cluster id.
        from_id: The connector's node id.
        to_id: The node id the connector means to reach.
        raft_address: The connector's Raft address (``HOST:PORT``) or ``""``.
        client_address: The connector's client address, or None.
        nonce: ``NONCE_BYTES`` random bytes.
        extensions: Later additions, covered by the proofs; unknown keys are ignored.
    """

    cluster_id: str
    from_id: NodeId
    to_id: NodeId
    raft_address: str
    client_address: str | None
    nonce: bytes
    extensions: Mapping[str, object] = attrs.field(factory=dict, eq=False, hash=False)

    def to_wire(self) -> list[object]:
        """The msgpack-ready array of this frame."""
        return [
            MAGIC,
            PROTOCOL_VERSION,
            "hello",
            self.cluster_id,
            self.from_id,
            self.to_id,
            self.raft_address,
            self.client_address,
            self.nonce,
            dict(self.extensions),
        ]


@attrs.frozen
class Challenge:
    """The acceptor's answer: its id, its nonce, its proof (empty without a secret)."""

    node_id: NodeId
    nonce: bytes
    proof: bytes
    extensions: Mapping[str, object] = attrs.field(factory=dict, eq=False, hash=False)

    def to_wire(self) -> list[object]:
        """The msgpack-ready array of this frame."""
        return [
            MAGIC,
            PROTOCOL_VERSION,
            "challenge",
            self.node_id,
            self.nonce,
            self.proof,
            dict(self.extensions),
        ]


@attrs.frozen
class Proof:
    """The connector's proof (empty without a secret)."""

    proof: bytes

    def to_wire(self) -> list[object]:
        """The msgpack-ready array of this frame."""
        return [MAGIC, PROTOCOL_VERSION, "proof", self.proof]


@attrs.frozen
class Accepted:
    """The acceptor took the connection: Raft frames may follow."""

    def to_wire(self) -> list[object]:
        """The msgpack-ready array of this frame."""
        return [MAGIC, PROTOCOL_VERSION, "accepted"]


@attrs.frozen
class Refused:
    """The acceptor refused the connection and closes it.

    Attributes:
        code: An :class:`~futureq.errors.ErrorCode` number.
        message: A sentence for the connector's log (at most ``MAX_REFUSAL_CHARS``).
    """

    code: int
    message: str

    def to_wire(self) -> list[object]:
        """The msgpack-ready array of this frame."""
        return [MAGIC, PROTOCOL_VERSION, "refused", self.code, self.message[:MAX_REFUSAL_CHARS]]

    @classmethod
    def from_error(cls, error: RemoteProtocolError) -> Refused:
        """The refusal that tells the connector why."""
        return cls(int(error.code), error.message[:MAX_REFUSAL_CHARS])


HandshakeFrame = Hello | Challenge | Proof | Accepted | Refused

_ARITY = {"hello": 10, "challenge": 7, "proof": 4, "accepted": 3, "refused": 5}


def parse_frame(value: object) -> HandshakeFrame:
    """Check one decoded msgpack value and build the handshake frame it is.

    Args:
        value: What :class:`~futureq.wire.codec.FrameDecoder` (``parse=False``) returned.

    Returns:
        A :class:`Hello`, :class:`Challenge`, :class:`Proof`, :class:`Accepted` or
        :class:`Refused`.

    Raises:
        PeerAuthError: ``HELLO_REQUIRED`` when it is not a handshake frame at all,
            ``UNSUPPORTED_VERSION`` for another protocol version (version 1 had no
            authentication), ``INVALID_FRAME`` for a wrong field. Nothing else escapes.
    """
    if not isinstance(value, list) or len(value) < 2 or value[0] != MAGIC:
        client = isinstance(value, list) and value and type(value[0]) is int
        raise _refuse(
            RefusalReason.PROTOCOL,
            # A client given the Raft port heard only the first sentence (found by a tester).
            "a futureq client's frame arrived on the Raft port (cluster.raft_listen): "
            "clients connect to the client port (server.listen)"
            if client
            else "the first raft frames must be the futureq-raft handshake (docs/raft.md)",
            ErrorCode.HELLO_REQUIRED,
        )
    version = value[1]
    if type(version) is not int or version != PROTOCOL_VERSION:
        hint = (
            "; version 1 peers are unauthenticated: upgrade every node (docs/security.md)"
            if version == 1
            else ""
        )
        raise _refuse(
            RefusalReason.PROTOCOL,
            f"raft protocol version {version!r:.20} is not supported (we speak "
            f"{PROTOCOL_VERSION}){hint}",
            ErrorCode.UNSUPPORTED_VERSION,
        )
    kind = value[2] if len(value) > 2 else None
    if not isinstance(kind, str) or kind not in _ARITY:
        raise _malformed(f"unknown handshake frame kind {kind!r:.30}")
    if len(value) != _ARITY[kind]:
        raise _malformed(f"handshake frame {kind!r} must have {_ARITY[kind]} fields")
    fields = value[3:]
    match kind:
        case "hello":
            cluster_id, from_id, to_id, raft_address, client_address, nonce, extensions = fields
            if not isinstance(cluster_id, str) or not cluster_id:
                raise _malformed("handshake cluster id must be non-empty text")
            if not isinstance(raft_address, str) or not (
                client_address is None or isinstance(client_address, str)
            ):
                raise _malformed("handshake addresses must be text")
            for address in (raft_address, client_address):
                if address:
                    try:
                        split_host_port(address)
                    except ValueError as exc:
                        raise _malformed(f"handshake address: {exc}") from None
            return Hello(
                cluster_id,
                _node_id(from_id, "from"),
                _node_id(to_id, "to"),
                raft_address,
                client_address or None,
                _nonce(nonce),
                _extensions(extensions),
            )
        case "challenge":
            node_id, nonce, proof, extensions = fields
            return Challenge(
                _node_id(node_id, "acceptor"), _nonce(nonce), _proof(proof), _extensions(extensions)
            )
        case "proof":
            return Proof(_proof(fields[0]))
        case "accepted":
            return Accepted()
        case _:  # "refused"
            code, message = fields
            if type(code) is not int or not isinstance(message, str):
                raise _malformed("a refusal is [code, message]")
            return Refused(code, message[:MAX_REFUSAL_CHARS])


def _node_id(value: object, which: str) -> NodeId:
    if type(value) is not int or not 1 <= value < 2**63:
        raise _malformed(f"handshake {which} node id {value!r:.20} is not an id >= 1")
    return NodeId(value)


def _nonce(value: object) -> bytes:
    if type(value) is not bytes or len(value) != NONCE_BYTES:
        raise _malformed(f"a handshake nonce must be {NONCE_BYTES} bytes")
    return value


def _proof(value: object) -> bytes:
    if type(value) is not bytes or len(value) not in (0, MAC_BYTES):
        raise _malformed(f"a handshake proof must be empty or {MAC_BYTES} bytes")
    return value


def _extensions(value: object) -> dict[str, object]:
    if not isinstance(value, dict) or len(value) > MAX_EXTENSIONS:
        raise _malformed(f"handshake extensions must be a map of at most {MAX_EXTENSIONS} keys")
    if not all(isinstance(key, str) for key in value):
        raise _malformed("handshake extension keys must be text")
    return value


# --- the MACs ---------------------------------------------------------------------------


def transcript_hash(hello: Hello, challenge: Challenge) -> bytes:
    """SHA-256 of everything both sides said, in a form both compute alike.

    The proofs leave themselves out (the challenge's proof is not part of it).
    """
    packed: bytes = msgpack.packb(
        [
            MAGIC,
            PROTOCOL_VERSION,
            hello.to_wire(),
            [challenge.node_id, challenge.nonce, dict(challenge.extensions)],
        ],
        use_bin_type=True,
    )
    return hashlib.sha256(packed).digest()


def acceptor_proof(secret: bytes, transcript: bytes) -> bytes:
    """``HMAC-SHA-256(secret, "futureq-raft/2 acceptor proof" 0x00 || transcript)``."""
    return hmac.digest(secret, _ACCEPTOR_PROOF + transcript, "sha256")


def connector_proof(secret: bytes, transcript: bytes) -> bytes:
    """``HMAC-SHA-256(secret, "futureq-raft/2 connector proof" 0x00 || transcript)``."""
    return hmac.digest(secret, _CONNECTOR_PROOF + transcript, "sha256")


def session_key(secret: bytes, transcript: bytes) -> bytes:
    """Key of the frame MACs on this connection (connector to acceptor)."""
    return hmac.digest(secret, _SESSION_KEY + transcript, "sha256")


class FrameSealer:
    """Seals the connector's Raft frames: ``seq || HMAC(session, seq || message) || message``.

    Args:
        key: :func:`session_key` of the connection.
    """

    def __init__(self, key: bytes) -> None:
        self._mac = hmac.new(key, digestmod=hashlib.sha256)
        self._seq = 0

    def seal(self, message: bytes) -> bytes:
        """The sealed form of one Raft message (``SEALED_OVERHEAD_BYTES`` longer)."""
        self._seq += 1
        header = self._seq.to_bytes(SEQ_BYTES, "big")
        mac = self._mac.copy()
        mac.update(header)
        mac.update(message)
        return header + mac.digest() + message


class FrameOpener:
    """Checks the acceptor's incoming frames; the twin of :class:`FrameSealer`."""

    def __init__(self, key: bytes) -> None:
        self._mac = hmac.new(key, digestmod=hashlib.sha256)
        self._last_seq = 0

    def open(self, sealed: bytes) -> bytes:
        """Return the message inside ``sealed``.

        Raises:
            PeerAuthError: FRAME when the frame is too short, its tag is wrong, or its
                sequence number is not above the previous frame's. The connection must
                be closed.
        """
        if len(sealed) < SEALED_OVERHEAD_BYTES:
            raise _refuse(RefusalReason.FRAME, "raft frame too short to carry its MAC")
        header = sealed[:SEQ_BYTES]
        mac = self._mac.copy()
        mac.update(header)
        mac.update(memoryview(sealed)[SEALED_OVERHEAD_BYTES:])
        if not hmac.compare_digest(mac.digest(), sealed[SEQ_BYTES:SEALED_OVERHEAD_BYTES]):
            raise _refuse(
                RefusalReason.FRAME,
                "raft frame MAC does not match: bytes were injected or altered on the link",
            )
        seq = int.from_bytes(header, "big")
        if seq <= self._last_seq:
            raise _refuse(
                RefusalReason.FRAME,
                f"raft frame {seq} came after frame {self._last_seq}: replayed or reordered",
            )
        self._last_seq = seq
        return sealed[SEALED_OVERHEAD_BYTES:]


# --- certificates -----------------------------------------------------------------------


def node_dns_name(cluster_id: str, node_id: int) -> str:
    """The DNS SAN that names ``node_id`` of ``cluster_id``: ``node-N.CLUSTER.futureq``."""
    return f"node-{node_id}.{cluster_id}.{NODE_DNS_SUFFIX}".lower()


def node_uri(cluster_id: str, node_id: int) -> str:
    """The URI SAN that names ``node_id`` of ``cluster_id``: ``futureq://CLUSTER/node/N``."""
    return f"{NODE_URI_SCHEME}://{cluster_id}/node/{node_id}"


def certificate_node_ids(certificate: Mapping[str, object], cluster_id: str) -> frozenset[int]:
    """The node ids of ``cluster_id`` a peer certificate names.

    Args:
        certificate: :meth:`ssl.SSLSocket.getpeercert` of a verified peer (the dict form).
        cluster_id: Our cluster id; names of other clusters do not count.

    Returns:
        Every ``N`` with a DNS SAN ``node-N.<cluster_id>.futureq`` (case-insensitive)
        or a URI SAN ``futureq://<cluster_id>/node/N``. Wildcards name nothing.
    """
    dns_suffix = f".{cluster_id}.{NODE_DNS_SUFFIX}".lower()
    uri_prefix = f"{NODE_URI_SCHEME}://{cluster_id}/node/"
    found: set[int] = set()
    names = certificate.get("subjectAltName", ())
    if not isinstance(names, tuple | list):
        return frozenset()
    for entry in names:
        if not isinstance(entry, tuple | list) or len(entry) != 2:
            continue
        kind, name = entry
        if not isinstance(name, str):
            continue
        digits = ""
        if kind == "DNS":
            lowered = name.lower()
            if lowered.startswith("node-") and lowered.endswith(dns_suffix):
                digits = lowered[len("node-") : -len(dns_suffix)]
        elif kind == "URI" and name.startswith(uri_prefix):
            digits = name[len(uri_prefix) :]
        if digits.isascii() and digits.isdigit() and not digits.startswith("0"):
            found.add(int(digits))
    return frozenset(found)


def check_certificate(
    certificate: Mapping[str, object] | None, cluster_id: str, node_id: int, whose: str
) -> None:
    """Raise unless ``certificate`` names ``node_id`` of ``cluster_id`` (mutual TLS).

    Args:
        whose: Who presented it, for the message ("the peer", "node 2 at HOST:PORT").

    Raises:
        PeerAuthError: CERTIFICATE, with the names it should carry.
    """
    named = frozenset() if not certificate else certificate_node_ids(certificate, cluster_id)
    if node_id in named:
        return
    said = f"names nodes {sorted(named)}" if named else "names no node of this cluster"
    raise _refuse(
        RefusalReason.CERTIFICATE,
        f"{whose} claims node {node_id} but its certificate {said}; a node's certificate "
        f"needs the DNS name {node_dns_name(cluster_id, node_id)!r} or the URI "
        f"{node_uri(cluster_id, node_id)!r} (docs/security.md)",
    )


# --- the two sides ----------------------------------------------------------------------


class ConnectorHandshake:
    """The side that opened the connection: HELLO, then CHALLENGE in, PROOF out, verdict in.

    Args:
        cluster_id: Ours.
        node_id: Ours.
        peer_id: The node we dialled; the acceptor must be it.
        raft_address: Ours, announced to the peer (``""`` if unknown).
        client_address: Ours, announced to the peer, or None.
        secret: The cluster secret, or None without one.
        nonce: ``NONCE_BYTES`` fresh random bytes (a CSPRNG's, never reused).
        peer_certificate: The acceptor's certificate under mutual TLS, else None.
        require_certificate: Mutual TLS: the acceptor's certificate must name ``peer_id``.
        extensions: Extra fields for the HELLO (covered by the proofs).
        shards: This process's shard layout, announced in the HELLO; the acceptor's
            must be the same (:func:`shard_disagreement`). Default: 1 shard.
    """

    def __init__(
        self,
        *,
        cluster_id: str,
        node_id: int,
        peer_id: int,
        raft_address: str,
        client_address: str | None,
        secret: bytes | None,
        nonce: bytes,
        peer_certificate: Mapping[str, object] | None = None,
        require_certificate: bool = False,
        extensions: Mapping[str, object] | None = None,
        shards: ShardLayout | None = None,
    ) -> None:
        if len(nonce) != NONCE_BYTES:
            raise ValueError(f"nonce must be {NONCE_BYTES} bytes")
        self._shards = shards or ShardLayout()
        self.hello = Hello(
            cluster_id,
            NodeId(node_id),
            NodeId(peer_id),
            raft_address,
            client_address,
            nonce,
            {**(extensions or {}), **self._shards.to_extensions()},
        )
        self._secret = secret
        self._peer_certificate = peer_certificate
        self._require_certificate = require_certificate
        self.sealer: FrameSealer | None = None
        """Seals Raft frames once the handshake is done; None when no secret is used."""
        self.challenge: Challenge | None = None
        self.accepted = False

    def receive_challenge(self, value: object) -> Proof:
        """Check the acceptor's answer to our HELLO; return the PROOF to send.

        Raises:
            PeerAuthError: the acceptor refused us, is not the node we dialled, its
                certificate does not name it, it cannot prove it holds our secret, or
                (SHARDS) it runs another shard layout.
        """
        frame = parse_frame(value)
        peer = self.hello.to_id
        if isinstance(frame, Refused):
            raise _refused_by(frame, peer)
        if not isinstance(frame, Challenge):
            raise _malformed(f"expected the handshake challenge, got {type(frame).__name__}")
        if frame.node_id != peer:
            raise _refuse(
                RefusalReason.IDENTITY,
                f"the node at this address is node {frame.node_id}, not node {peer}; "
                "check the peer addresses (--peers)",
            )
        if self._require_certificate:
            check_certificate(
                self._peer_certificate, self.hello.cluster_id, peer, "the node at this address"
            )
        if frame.nonce == self.hello.nonce:
            raise _refuse(RefusalReason.PROTOCOL, f"node {peer} echoed our nonce back")
        transcript = transcript_hash(self.hello, frame)
        if self._secret is None:
            if frame.proof:
                raise _refuse(
                    RefusalReason.SECRET,
                    f"node {peer} requires a cluster secret and this node has none; give it "
                    "the cluster's --cluster-secret-file",
                )
            proof = b""
        else:
            if not frame.proof:
                raise _refuse(
                    RefusalReason.SECRET,
                    f"node {peer} runs without a cluster secret and this node has one; give "
                    "every node the same --cluster-secret-file",
                )
            if not hmac.compare_digest(frame.proof, acceptor_proof(self._secret, transcript)):
                raise _refuse(
                    RefusalReason.SECRET,
                    f"node {peer} could not prove it holds our cluster secret: the cluster "
                    "secret files differ",
                )
            proof = connector_proof(self._secret, transcript)
            if not self._require_certificate:
                self.sealer = FrameSealer(session_key(self._secret, transcript))
        # Checked once the acceptor proved who it is, so the sentence can be trusted; an
        # acceptor of an older build announces nothing and counts as 1 shard.
        disagreement = shard_disagreement(
            self._shards, ShardLayout.from_extensions(frame.extensions), peer
        )
        if disagreement is not None:
            raise disagreement
        self.challenge = frame
        return Proof(proof)

    def receive_verdict(self, value: object) -> None:
        """Check the acceptor's last frame: ACCEPTED, or raise its refusal.

        Raises:
            PeerAuthError: it refused, or sent something else.
        """
        frame = parse_frame(value)
        if isinstance(frame, Refused):
            raise _refused_by(frame, self.hello.to_id)
        if not isinstance(frame, Accepted):
            raise _malformed(f"expected the handshake verdict, got {type(frame).__name__}")
        self.accepted = True


def _refused_by(frame: Refused, peer: int) -> PeerAuthError:
    try:
        code = ErrorCode(frame.code)
    except ValueError:
        code = ErrorCode.AUTH_FAILED
    return PeerAuthError(
        RefusalReason.REFUSED, code, f"node {peer} refused the connection: {frame.message}"
    )


class AcceptorHandshake:
    """The side that accepted the connection: HELLO in, CHALLENGE out, PROOF in, verdict out.

    Args:
        cluster_id: Ours; the connector must share it.
        node_id: Ours; the connector must address it.
        secret: The cluster secret, or None without one.
        nonce: ``NONCE_BYTES`` fresh random bytes (a CSPRNG's, never reused).
        peer_certificate: The connector's certificate under mutual TLS, else None.
        require_certificate: Mutual TLS: the certificate must name the HELLO's node id.
        extensions: Extra fields for the CHALLENGE (covered by the proofs).
        shards: This process's shard layout, announced in the CHALLENGE; the
            connector's must be the same (:func:`shard_disagreement`). Default: 1 shard.
    """

    def __init__(
        self,
        *,
        cluster_id: str,
        node_id: int,
        secret: bytes | None,
        nonce: bytes,
        peer_certificate: Mapping[str, object] | None = None,
        require_certificate: bool = False,
        extensions: Mapping[str, object] | None = None,
        shards: ShardLayout | None = None,
    ) -> None:
        if len(nonce) != NONCE_BYTES:
            raise ValueError(f"nonce must be {NONCE_BYTES} bytes")
        self._shards = shards or ShardLayout()
        self.cluster_id = cluster_id
        self.node_id = NodeId(node_id)
        self._secret = secret
        self._nonce = nonce
        self._peer_certificate = peer_certificate
        self._require_certificate = require_certificate
        self._extensions = {**(extensions or {}), **self._shards.to_extensions()}
        self._hello: Hello | None = None
        self._transcript = b""
        self.opener: FrameOpener | None = None
        """Opens sealed Raft frames once the handshake is done; None without a secret."""

    def receive_hello(self, value: object) -> Challenge:
        """Check the connector's HELLO; return the CHALLENGE to send.

        Raises:
            PeerAuthError: not a v2 HELLO, another cluster, a node id that is ours or
                is not addressed to us, or (mutual TLS) a certificate that does not
                name the claimed node.
        """
        frame = parse_frame(value)
        if not isinstance(frame, Hello):
            raise _refuse(
                RefusalReason.PROTOCOL,
                "the first raft frame must be the handshake HELLO",
                ErrorCode.HELLO_REQUIRED,
            )
        if frame.cluster_id != self.cluster_id:
            raise _refuse(
                RefusalReason.CLUSTER,
                f"peer belongs to cluster {frame.cluster_id!r:.60}, we are {self.cluster_id!r}",
            )
        if frame.from_id == self.node_id:
            raise _refuse(RefusalReason.IDENTITY, f"peer claims our own node id {self.node_id}")
        if frame.to_id != self.node_id:
            raise _refuse(
                RefusalReason.IDENTITY,
                f"peer addressed node {frame.to_id} but this is node {self.node_id}; "
                "check the peer addresses (--peers)",
            )
        if self._require_certificate:
            check_certificate(self._peer_certificate, self.cluster_id, frame.from_id, "the peer")
        proof = b""
        challenge = Challenge(self.node_id, self._nonce, b"", self._extensions)
        self._transcript = transcript_hash(frame, challenge)
        if self._secret is not None:
            proof = acceptor_proof(self._secret, self._transcript)
        self._hello = frame
        return attrs.evolve(challenge, proof=proof)

    def receive_proof(self, value: object) -> Hello:
        """Check the connector's PROOF; return its (now authenticated) HELLO.

        Send :class:`Accepted` after this returns.

        Raises:
            PeerAuthError: SECRET when the proof is missing or wrong (or present while
                we have no secret); PROTOCOL for another frame; SHARDS when the
                connector runs another shard layout (a connector that announces none
                counts as 1 shard).
            RuntimeError: called before :meth:`receive_hello` succeeded.
        """
        if self._hello is None:
            raise RuntimeError("receive_proof before receive_hello")
        frame = parse_frame(value)
        if not isinstance(frame, Proof):
            raise _malformed(f"expected the handshake proof, got {type(frame).__name__}")
        peer = self._hello.from_id
        if self._secret is None:
            if frame.proof:
                raise _refuse(
                    RefusalReason.SECRET,
                    f"node {peer} proves a cluster secret but this node has none; give every "
                    "node the same --cluster-secret-file",
                )
        else:
            if not frame.proof:
                raise _refuse(
                    RefusalReason.SECRET,
                    f"node {peer} sent no proof of the cluster secret; it needs the "
                    "cluster's --cluster-secret-file",
                )
            expected = connector_proof(self._secret, self._transcript)
            if not hmac.compare_digest(frame.proof, expected):
                raise _refuse(
                    RefusalReason.SECRET,
                    f"node {peer} failed the cluster secret challenge: wrong secret, or a "
                    "replayed or relayed handshake",
                )
            if not self._require_certificate:
                self.opener = FrameOpener(session_key(self._secret, self._transcript))
        disagreement = shard_disagreement(
            self._shards, ShardLayout.from_extensions(self._hello.extensions), peer
        )
        if disagreement is not None:
            raise disagreement
        return self._hello


__all__ = [
    "MAC_BYTES",
    "MAGIC",
    "MAX_HANDSHAKE_FRAME_BYTES",
    "MIN_SECRET_BYTES",
    "NONCE_BYTES",
    "PROTOCOL_VERSION",
    "SEALED_OVERHEAD_BYTES",
    "ShardLayout",
    "Accepted",
    "AcceptorHandshake",
    "Challenge",
    "ConnectorHandshake",
    "FrameOpener",
    "FrameSealer",
    "INCARNATION_KEY",
    "Hello",
    "PeerAuthError",
    "Proof",
    "RefusalReason",
    "Refused",
    "acceptor_proof",
    "certificate_node_ids",
    "check_certificate",
    "connector_proof",
    "incarnation_extension",
    "incarnation_from_extensions",
    "node_dns_name",
    "node_uri",
    "parse_frame",
    "session_key",
    "shard_disagreement",
    "transcript_hash",
]
