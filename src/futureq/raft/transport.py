"""Peer links for Raft: wire-codec frames over TCP (optionally TLS), with reconnects.

Each node listens on its raft address and opens one outbound connection per peer;
a pair of nodes therefore talks over two connections, each carrying messages one way.
Raft tolerates lost, duplicated and reordered messages, so the transport is simple:
:meth:`Transport.send` never blocks, each peer has a bounded queue that drops its
oldest message when full, and a broken connection drops what was queued. A message for
an idle, connected plain-TCP link is written to its non-blocking socket at once, without
waiting for a pass of the event loop (what the socket does not take is finished by the
link's task).

Frames use the client protocol's framing (``wire/codec.py``: 4-byte big-endian length,
then one msgpack value). Every connection starts with the authenticated handshake of
:mod:`futureq.raft.peer_auth` (HELLO, CHALLENGE, PROOF, ACCEPTED): nothing the peer sends
is read as a Raft message, and no address it announces is used, before it has proved
who it is (mutual TLS with node-id certificates and/or the cluster secret). Every later
frame is a msgpack ``bin`` holding ``encode_message`` bytes, sealed with a per-frame MAC
when the cluster secret is used without TLS. A peer that sends anything else (failed
handshake, other cluster, garbage, a bad MAC, a message claiming another sender) loses
that connection only (:class:`~futureq.errors.RemoteProtocolError`).

Source: docs/raft.md, "Transport" and "Peer handshake"; docs/security.md.
"""

from __future__ import annotations

import logging
import os
import random
import re
import secrets
import ssl
from collections import deque
from collections.abc import Callable, Mapping
from typing import Final

import attrs
import trio

from futureq.config import split_host_port
from futureq.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from futureq.raft import peer_auth
from futureq.raft.incarnations import IncarnationGuard, Ticket, TwinRefusalError
from futureq.raft.message_codec import decode_message, encode_message
from futureq.raft.messages import (
    ClockPing,
    ClockPong,
    Message,
    NodeId,
    RequestVote,
    RequestVoteResponse,
    TimeoutNow,
)
from futureq.raft.peer_auth import MAGIC, PROTOCOL_VERSION, PeerAuthError
from futureq.rate_limited_log import RateLimitedLog
from futureq.tls_handshake import NOT_TLS_REASONS
from futureq.wire import foreign
from futureq.wire.codec import CLOSED, NEED_DATA, FrameDecoder, encode_value

log = logging.getLogger(__name__)
conflict_log = RateLimitedLog(log, per_minute=10, about="conflicting peer handshakes")
"""Handshakes that contradict the address book: at most this many lines a minute."""

DEFAULT_MAX_FRAME_BYTES: Final = 16 << 20
"""Largest raft frame accepted (bytes): an AppendEntries batch or a snapshot chunk."""
DEFAULT_MAX_PENDING_HANDSHAKES: Final = 64
"""Inbound connections that may be in their handshake at once; more are closed at once."""
MAX_PENDING_HANDSHAKES_PER_HOST: Final = 8
"""Of those, how many may come from one address: a process that floods the Raft port
from one host cannot take the slots the real peers (other hosts) need to reconnect."""
REFUSAL_LOG_INTERVAL_S: Final = 10.0
"""The same refusal is logged as a warning at most once per this interval."""
PEER_CLOSE_S: Final = 0.5
"""Closing an inbound peer connection (plain TCP): longest the node waits, after its
half-close, for the peer to close its side, reading and dropping what still comes (s).
A socket closed with unread bytes sends a reset, which the peer saw as its link broken
(``Broken pipe``) on a planned stop or restart."""
MAX_PEER_CLOSE_BYTES: Final = 4 << 20
"""What an inbound peer connection may still send while it is closed (bytes) before it
is closed all the same."""
_VARIABLE_PARTS = re.compile(r"'[^']*'|\"[^\"]*\"|\d+")
"""Numbers and quoted text in a refusal sentence: left out of its log rate key."""


def split_address(address: str) -> tuple[str, int]:
    """Split ``"host:port"`` (``"[v6]:port"`` too) into host and port.

    Raises:
        ValueError: if there is no valid port (see :func:`futureq.config.split_host_port`).
    """
    return split_host_port(address)


class AddressBook:
    """Node id -> (raft address, client address), updatable at runtime.

    Static peers come from the configuration; later ones from replicated state
    (the broker's NODE_ADDRESS command). :class:`Transport` watches it and opens or
    re-targets links when it changes.

    Args:
        mapping: Initial entries; a client address may be None when unknown.
    """

    def __init__(self, mapping: Mapping[int, tuple[str, str | None]] | None = None) -> None:
        self._entries: dict[NodeId, tuple[str, str | None]] = {}
        self._changed = trio.Event()
        self.version = 0
        if mapping:
            self.update(mapping)

    def update(self, mapping: Mapping[int, tuple[str, str | None]]) -> None:
        """Add or replace entries (other entries are kept)."""
        changed = False
        for node_id, (raft_address, client_address) in mapping.items():
            split_address(raft_address)
            value = (raft_address, client_address)
            if self._entries.get(NodeId(node_id)) != value:
                self._entries[NodeId(node_id)] = value
                changed = True
        if changed:
            self._bump()

    def remove(self, node_id: int) -> None:
        """Forget ``node_id`` (its link is closed)."""
        if self._entries.pop(NodeId(node_id), None) is not None:
            self._bump()

    def get(self, node_id: int) -> tuple[str, str | None] | None:
        """``(raft_address, client_address)`` of ``node_id``, or None."""
        return self._entries.get(NodeId(node_id))

    def snapshot(self) -> dict[NodeId, tuple[str, str | None]]:
        """A copy of every entry."""
        return dict(self._entries)

    def _bump(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self, since_version: int) -> int:
        """Block until :attr:`version` differs from ``since_version``; return it."""
        while self.version == since_version:
            await self._changed.wait()
        return self.version


@attrs.define
class TransportStatistics:
    """Counters of a :class:`Transport` (monotonic, since start)."""

    sent_messages: int = 0
    received_messages: int = 0
    dropped_queue_full: int = 0
    dropped_unknown_peer: int = 0
    dropped_too_large: int = 0
    dropped_disconnected: int = 0
    connects: int = 0
    connect_failures: int = 0
    inbound_connections: int = 0
    inbound_protocol_errors: int = 0
    inbound_refused_busy: int = 0
    closed_by_peer: int = 0
    """Outbound links the peer closed cleanly (it stopped or restarted)."""
    refusals: dict[str, int] = attrs.field(factory=dict)
    """Handshakes and frames refused (ours of peers, and peers' of ours), by
    :class:`~futureq.raft.peer_auth.RefusalReason` value."""


@attrs.frozen
class Handshake:
    """What an authenticated peer said about itself in its handshake."""

    cluster_id: str
    node_id: NodeId
    raft_address: str
    client_address: str | None
    incarnation: int = 0
    """Its data directory's incarnation (0: it announced none, an older build)."""


class _PeerClosedLink(Exception):
    """The peer closed an outbound link cleanly (:meth:`Transport._watch_closed`)."""


async def _close_cleanly(tcp: trio.SocketStream) -> None:
    """Half-close an inbound peer connection, then read and drop what the peer still
    sends until it closes its side (a peer reads its link for this end and closes at
    once), at most :data:`PEER_CLOSE_S` and :data:`MAX_PEER_CLOSE_BYTES`: the close
    that follows is then a clean one, not the reset of a socket closed with unread
    bytes. Errors (the peer already gone) end it quietly."""
    dropped = 0
    with trio.move_on_after(PEER_CLOSE_S):
        try:
            await tcp.send_eof()
            while dropped < MAX_PEER_CLOSE_BYTES:
                chunk = await tcp.receive_some(65536)
                if not chunk:
                    return
                dropped += len(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return


URGENT_MESSAGES: Final = (RequestVote, RequestVoteResponse, TimeoutNow, ClockPing, ClockPong)
"""Small messages whose worth decays within an election timeout: they leave before the
queued replication traffic (see :meth:`Transport.send`)."""


class _PeerLink:
    __slots__ = (
        "address",
        "cancel_scope",
        "direct_fd",
        "last_error",
        "node_id",
        "queue",
        "ready",
        "sealer",
        "connected_s",
        "unsent",
        "urgent",
        "writing",
    )

    def __init__(self, node_id: NodeId, address: str) -> None:
        self.node_id = node_id
        self.address = address
        self.queue: deque[Message] = deque()
        self.urgent: deque[Message] = deque()
        """:data:`URGENT_MESSAGES`, sent before ``queue``; bounded like it."""
        self.ready = trio.Event()
        self.cancel_scope = trio.CancelScope()
        self.last_error = ""
        self.direct_fd = -1
        """The connected plain-TCP socket while the pump runs (-1: none, or TLS):
        :meth:`Transport.send` writes to it at once when nothing else is pending."""
        self.sealer: peer_auth.FrameSealer | None = None
        self.writing = False
        """The pump is inside a write: nothing else may write to the socket."""
        self.unsent = b""
        """The rest of a frame a direct write did not finish; the pump sends it first."""
        self.connected_s: float | None = None
        """When (trio time, s) the connection the pump runs on was made; None while none."""


ONE_WAY_AFTER_S = 5.0
"""A peer that takes this node's Raft connection but opens none back for this long (s)
is named in :meth:`Transport.link_refusals`: every node pings every member several
times a second, so a peer that can reach this node has connected long before."""


def _not_tls(error: BaseException) -> bool:
    """Whether a failed TLS handshake (trio's ``BrokenResourceError`` from an
    ``ssl.SSLError``) met bytes that are not TLS: the other side speaks plaintext."""
    cause = error.__cause__
    return isinstance(cause, ssl.SSLError) and cause.reason in NOT_TLS_REASONS


def tls_mismatch(seen: str, with_tls: str, without_tls: str) -> str:
    """The refusal of a Raft link whose two ends disagree about peer TLS: ``seen`` (what
    this node met), then which end uses it and which does not, and the one fix. Each
    direction (this node dialling, accepting, or without TLS itself) says it one way."""
    return (
        f"{seen}: {with_tls} uses peer mutual TLS (tls.ca_file) and {without_tls} does "
        "not; give every node the same [tls] settings"
    )


def foreign_protocol(start: bytes) -> str | None:
    """What the first bytes of an inbound Raft connection say about who connected, when
    they are no futureq frame (a sentence naming what to fix), else None.

    A TLS handshake, an HTTP request or an SSH client on the Raft port got only
    ``frame of 369295618 bytes exceeds the limit of 8192 bytes; send smaller batches or
    payloads`` (found by a tester): the first is a peer with peer mutual TLS dialling a
    node without it.
    """
    spoken = foreign.protocol_of(start)
    if spoken == "TLS":
        return tls_mismatch(
            "a TLS handshake arrived on this node's Raft port, which runs without TLS",
            "the connecting node",
            "this node",
        )
    if spoken == "HTTP":
        return (
            "an HTTP request arrived on the Raft port (cluster.raft_listen), which only "
            "cluster nodes use: point HTTP probes and browsers at server.http"
        )
    if spoken == "SSH":
        return "an SSH client connected to the Raft port (cluster.raft_listen), which only cluster nodes use"
    return None


class _Connected:
    """An outbound connection past its handshake."""

    __slots__ = ("sealer", "stream", "ticket")

    def __init__(
        self,
        stream: trio.abc.Stream,
        sealer: peer_auth.FrameSealer | None,
        ticket: Ticket | None,
    ) -> None:
        self.stream = stream
        self.sealer = sealer
        self.ticket = ticket


def _peer_host_of(stream: trio.abc.Stream) -> str:
    """The remote host of an accepted connection, TLS or not ("?" if unknown)."""
    if isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    return _peer_host(stream) if isinstance(stream, trio.SocketStream) else "?"


def _peer_host(stream: trio.SocketStream) -> str:
    """The remote host of an accepted connection ("?" if the socket cannot say)."""
    try:
        return str(stream.socket.getpeername()[0])
    except OSError:
        return "?"


class Transport:
    """Raft peer links over TCP.

    Peers authenticate in the handshake (:mod:`futureq.raft.peer_auth`) with mutual
    TLS, the cluster secret, or both; with neither, anyone who reaches the port can act
    as any node (the caller must have the operator's explicit consent for that).

    Args:
        node_id: Our id; messages to it are not sent.
        listen_address: ``HOST:PORT`` to bind (port 0 picks a free port).
        address_book: Where peers are; watched for changes.
        ssl_server: Wrap accepted connections in TLS with this context, or None. It
            must require client certificates (``CERT_REQUIRED``); each peer's
            certificate must name the node id it claims (``peer_auth.check_certificate``).
        ssl_client: Wrap outbound connections in TLS with this context, or None
            (``server_hostname`` is the peer's host); the peer's certificate must name
            the node id we dialled. Give both contexts or neither.
        secret: The cluster secret (at least ``peer_auth.MIN_SECRET_BYTES`` bytes), or
            None. Without TLS it also keys the per-frame MACs.
        cluster_id: Must equal the peers'; a mismatch refuses the connection.
        client_address: Our client listener, announced in the handshake (for
            NOT_LEADER redirects).
        advertise_address: Raft address announced in the handshake; defaults to the
            bound address.
        rng: Jitter for reconnect backoff; seed it in tests.
        max_queue_messages: Per-peer outbound queue; when full the oldest is dropped.
        inbound_buffer: Size of :attr:`receive_channel` (messages).
        max_frame_bytes: Largest frame sent or accepted (bytes).
        connect_timeout_s: Deadline for a TCP (+TLS) connect and the handshake.
        write_timeout_s: Deadline for one write; past it the link is reconnected.
        idle_timeout_s: An inbound connection silent for this long is closed.
        backoff_min_s: First reconnect delay (seconds); doubles per failure...
        backoff_max_s: ...up to this cap; each delay is jittered to 50-100 %.
        max_pending_handshakes: Inbound connections allowed in their handshake at once;
            beyond it new ones are closed at once (a flood of unauthenticated
            connections costs a bounded amount of memory).
        nonce_source: ``n -> n`` random bytes for handshake nonces (a CSPRNG).
        shard_layout: This process's place in a sharded node, announced in every
            handshake; a peer with another layout is refused both ways
            (``peer_auth.shard_disagreement``). Default: 1 shard.
        incarnation: Our data directory's incarnation, announced in every handshake;
            0: none (unstamped); None: not known yet, set later by
            :meth:`set_incarnation` (no link connects and no handshake is answered
            before).
        incarnation_quiet_s: How long a peer's incarnation keeps its node id after its
            last connection closed; meanwhile connections announcing another
            incarnation of that id are refused both ways
            (:class:`~futureq.raft.incarnations.IncarnationGuard`). Use the election
            timeout.

    Raises:
        ValueError: only one of the TLS contexts given, a server context that does not
            require certificates, or a secret that is too short.
    """

    def __init__(
        self,
        node_id: int,
        listen_address: str,
        address_book: AddressBook,
        *,
        ssl_server: ssl.SSLContext | None = None,
        ssl_client: ssl.SSLContext | None = None,
        cluster_id: str = "futureq",
        client_address: str | None = None,
        advertise_address: str | None = None,
        rng: random.Random | None = None,
        max_queue_messages: int = 4096,
        inbound_buffer: int = 1024,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        connect_timeout_s: float = 2.0,
        write_timeout_s: float = 5.0,
        idle_timeout_s: float = 30.0,
        backoff_min_s: float = 0.05,
        backoff_max_s: float = 2.0,
        secret: bytes | None = None,
        max_pending_handshakes: int = DEFAULT_MAX_PENDING_HANDSHAKES,
        nonce_source: Callable[[int], bytes] = secrets.token_bytes,
        shard_layout: peer_auth.ShardLayout | None = None,
        incarnation: int | None = 0,
        incarnation_quiet_s: float = 1.0,
    ) -> None:
        if (ssl_server is None) != (ssl_client is None):
            raise ValueError("give both TLS contexts (server and client) or neither")
        if ssl_server is not None and ssl_server.verify_mode != ssl.CERT_REQUIRED:
            raise ValueError("the server TLS context must require peer certificates")
        if secret is not None and len(secret) < peer_auth.MIN_SECRET_BYTES:
            raise ValueError(
                f"the cluster secret must be at least {peer_auth.MIN_SECRET_BYTES} bytes"
            )
        self.node_id = NodeId(node_id)
        self.listen_address = listen_address
        self.address_book = address_book
        self._ssl_server = ssl_server
        self._ssl_client = ssl_client
        self.cluster_id = cluster_id
        self.client_address = client_address
        self.advertise_address = advertise_address
        self._rng = rng or random.Random()
        self._max_queue = max_queue_messages
        self._max_frame_bytes = max_frame_bytes
        self._connect_timeout_s = connect_timeout_s
        self._write_timeout_s = write_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._backoff_min_s = backoff_min_s
        self._backoff_max_s = backoff_max_s
        self._secret = secret
        self._nonce_source = nonce_source
        self.shard_layout = shard_layout or peer_auth.ShardLayout()
        self.incarnation = incarnation
        self._incarnation_known = trio.Event()
        if incarnation is not None:
            self._incarnation_known.set()
        self._incarnations = IncarnationGuard(incarnation_quiet_s)
        self._handshake_slots = trio.Semaphore(max_pending_handshakes)
        self._handshakes_by_host: dict[str, int] = {}
        self._refusals_logged: dict[str, float] = {}
        self._link_refusals: dict[NodeId, str] = {}
        self._links: dict[NodeId, _PeerLink] = {}
        self._learned: dict[NodeId, Handshake] = {}
        self._inbound_open: dict[NodeId, int] = {}
        """Authenticated inbound connections open now, by peer."""
        self._announced_elsewhere: dict[NodeId, str] = {}
        """The Raft address a peer's last handshake gave where :meth:`_learn` kept the
        booked one (a twin, or the peer moved): :meth:`_note_wrong_address` names it."""
        self._links_changed = trio.Event()
        self._inbound_send, self.receive_channel = trio.open_memory_channel[Message](inbound_buffer)
        """Messages from peers, decoded and checked (sender matches the handshake)."""
        self.stats = TransportStatistics()
        self.bound_address: str | None = None

    # --- public API ---------------------------------------------------------------------

    def send(self, message: Message) -> None:
        """Send ``message`` to its ``to_id``: written at once when the link is connected
        and idle (:meth:`_write_now`), else queued; never blocks.

        Messages to ourselves and to peers with no known address are dropped (counted).
        Votes, TimeoutNow and clock samples (:data:`URGENT_MESSAGES`) go ahead of the
        AppendEntries and heartbeats queued for the same peer (Raft tolerates reordering):
        behind a backlog on a slow link they arrived seconds late, after the election or
        the round trip they were for was over (issue 15).
        """
        to_id = message.to_id
        if to_id == self.node_id:
            return
        link = self._links.get(to_id)
        if link is None:
            address = self._address_of(to_id)
            if address is None:
                self.stats.dropped_unknown_peer += 1
                return
            link = _PeerLink(to_id, address)
            self._links[to_id] = link
            self._links_changed.set()
        if (
            link.direct_fd >= 0
            and not (link.writing or link.unsent or link.queue or link.urgent)
            and self._write_now(link, message)
        ):
            return
        queue = link.urgent if isinstance(message, URGENT_MESSAGES) else link.queue
        if len(queue) >= self._max_queue:
            queue.popleft()
            self.stats.dropped_queue_full += 1
        queue.append(message)
        link.ready.set()

    def _write_now(self, link: _PeerLink, message: Message) -> bool:
        """Write ``message`` to an idle link's socket now; False if it must be queued.

        Waking the link's pump task costs a pass of the event loop, and on a leader the
        pass may come only after its own log write has started in a worker thread (the
        AppendEntries then left ~0.1-0.7 ms late), on a follower after its apply (its
        answer waited for it). The socket is non-blocking: what it does not take now
        stays in ``unsent`` for the pump, which sends it before anything else.
        """
        frame = self._frame(link, message)
        if frame is None:
            return True  # too large: dropped and counted, as the pump would
        try:
            sent = os.write(link.direct_fd, frame)
        except BlockingIOError:
            sent = 0
        except OSError:
            return False  # broken: the pump meets the error too, and reconnects
        if sent < len(frame):
            link.unsent = frame[sent:]
            link.ready.set()
        self.stats.sent_messages += 1
        return True

    def _frame(self, link: _PeerLink, message: Message) -> bytes | None:
        """``message`` encoded, sealed and framed for ``link``; None (counted, logged)
        when it is too large to send."""
        sealer = link.sealer
        try:
            body = encode_message(message)
            if sealer is not None:
                if len(body) + peer_auth.SEALED_OVERHEAD_BYTES > self._max_frame_bytes:
                    raise LocalProtocolError(
                        ErrorCode.FRAME_TOO_LARGE,
                        f"message of {len(body)} bytes exceeds the raft frame limit",
                    )
                body = sealer.seal(body)
            return encode_value(body, self._max_frame_bytes)
        except LocalProtocolError as exc:
            self.stats.dropped_too_large += 1
            log.warning("raft message to node %s not sent: %s", link.node_id, exc)
            return None

    def set_incarnation(self, incarnation: int) -> None:
        """Our data directory's incarnation, once the node read it (announced from now on).

        Raises:
            ValueError: ``incarnation`` < 0.
        """
        if incarnation < 0:
            raise ValueError(f"incarnation must be >= 0, got {incarnation}")
        self.incarnation = incarnation
        self._incarnation_known.set()

    def _admit(self, node_id: NodeId, incarnation: int, address: str) -> Ticket:
        """Let a connection of ``node_id``'s ``incarnation`` in, or refuse it because
        another incarnation of that id is connected (two processes run as the node).

        Raises:
            PeerAuthError: TWIN (another incarnation is connected) or REPLACED (it left
                less than the quiet period ago), with the sentence for the operator.
        """
        try:
            return self._incarnations.admit(node_id, incarnation, address, trio.current_time())
        except TwinRefusalError as exc:
            reason = (
                peer_auth.RefusalReason.TWIN
                if exc.refusal.gone_s is None
                else peer_auth.RefusalReason.REPLACED
            )
            raise PeerAuthError(reason, ErrorCode.AUTH_FAILED, exc.refusal.sentence()) from None

    def _release(self, ticket: Ticket | None) -> None:
        if ticket is not None:
            self._incarnations.close(ticket, trio.current_time())

    def _learn(self, handshake: Handshake) -> None:
        """Keep the addresses a peer announced in its handshake, unless they contradict
        the address book while an earlier handshake agreed with it.

        A second process started under a running node's id with a ``--peers`` of its own
        (so the duplicate check at start, which dials the id's address in *its* list,
        found nobody) announced another client address, and every node then sent
        clients to it, for good: NOT_LEADER named a dead address once it stopped
        (breaker runs). A handshake that agrees with the book (``--peers`` or the
        recorded addresses) is not replaced by one that does not; the conflict is
        logged, naming both addresses.
        """
        node_id = handshake.node_id
        entry = self.address_book.get(node_id)
        booked = None if entry is None else entry[0]
        known = self._learned.get(node_id)
        if (
            booked is not None
            and handshake.raft_address != booked
            and known is not None
            and known.raft_address == booked
        ):
            conflict_log.log(
                logging.WARNING,
                "a peer connection says it is node %d at raft address %s, but node %d is at "
                "%s (cluster.peers or its recorded address), where another connection of "
                "node %d came from: is another process running with node %d's id? its "
                "addresses are not used (if node %d moved to %s, correct its entry in this "
                "node's --peers and restart this node)",
                node_id,
                handshake.raft_address,
                node_id,
                booked,
                node_id,
                node_id,
                node_id,
                handshake.raft_address,
            )
            self._announced_elsewhere[node_id] = handshake.raft_address
            return
        self._announced_elsewhere.pop(node_id, None)
        self._learned[node_id] = handshake

    def peer_client_address(self, node_id: int) -> str | None:
        """Client address of ``node_id``: from its handshake, else the address book."""
        learned = self._learned.get(NodeId(node_id))
        if learned is not None and learned.client_address:
            return learned.client_address
        entry = self.address_book.get(node_id)
        return None if entry is None else entry[1]

    def link_refusals(self) -> dict[int, str]:
        """Why this node's Raft link to each peer is refused now, by node id: the
        sentence of the last handshake that failed on it (another cluster id, cluster
        secret, shard layout, or a twin of the node id), or that it dials an address
        where the peer is not while the peer connects to us from another (a wrong
        ``--peers`` entry); until a handshake succeeds again, or the peer stops
        answering at all. A peer that is merely
        down, or not yet dialled, is not listed: these are what an operator must fix,
        which a node that waits for a leader could not tell from a peer that is down
        (``/readyz``, the dashboard, ``cluster status``)."""
        return {int(node_id): sentence for node_id, sentence in self._link_refusals.items()}

    def one_way_links(self) -> dict[int, float]:
        """Peers that took this node's Raft connection at least :data:`ONE_WAY_AFTER_S`
        ago and have no connection of theirs open to this node, by node id: how long
        (s) this node's connection has stood. Such a peer dials another address for this
        node, or cannot reach it. Peers with a refusal in :meth:`link_refusals` are not
        listed."""
        now = trio.current_time()
        return {
            int(node_id): now - link.connected_s
            for node_id, link in self._links.items()
            if link.connected_s is not None
            and now - link.connected_s >= ONE_WAY_AFTER_S
            and node_id not in self._inbound_open
            and node_id not in self._link_refusals
        }

    def statistics(self) -> TransportStatistics:
        """A copy of the counters."""
        return attrs.evolve(self.stats, refusals=dict(self.stats.refusals))

    @property
    def authenticated(self) -> bool:
        """True when peers must prove who they are (mutual TLS or the cluster secret)."""
        return self._ssl_client is not None or self._secret is not None

    async def probe(self, node_id: int, address: str) -> None:
        """Open a connection to ``node_id`` at ``address``, run the handshake, close it.

        A node about to join checks with it that the cluster accepts its credentials.

        Raises:
            PeerAuthError: the peer refused us, or could not prove who it is.
            OSError, trio.TooSlowError, trio.BrokenResourceError, ssl.SSLError: the
                connection or the TLS handshake failed.
        """
        connected = await self._connect(NodeId(node_id), address, guard=False)
        with trio.move_on_after(0.5, shield=True):
            await connected.stream.aclose()

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen and keep one outbound link per peer until cancelled.

        Calls ``task_status.started(bound_address)`` once the listener is bound.

        Raises:
            OSError: the listen address cannot be bound.
        """
        host, port = split_address(self.listen_address)
        listeners = await trio.open_tcp_listeners(port, host=host or None)
        sockname = listeners[0].socket.getsockname()
        self.bound_address = f"{host or sockname[0]}:{sockname[1]}"
        if self.advertise_address is None:
            self.advertise_address = self.bound_address
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._serve, listeners)
            task_status.started(self.bound_address)
            version = -1
            running: dict[NodeId, _PeerLink] = {}
            while True:
                self._sync_links(version)
                version = self.address_book.version
                for node_id, link in list(running.items()):
                    if self._links.get(node_id) is not link:
                        link.cancel_scope.cancel()
                        del running[node_id]
                for node_id, link in self._links.items():
                    if node_id not in running:
                        running[node_id] = link
                        nursery.start_soon(self._run_link, link)
                self._links_changed = trio.Event()
                async with trio.open_nursery() as waiters:
                    waiters.start_soon(self._wait_book, version, waiters.cancel_scope)
                    waiters.start_soon(self._wait_links, waiters.cancel_scope)

    async def _wait_book(self, version: int, scope: trio.CancelScope) -> None:
        await self.address_book.wait_changed(version)
        scope.cancel()

    async def _wait_links(self, scope: trio.CancelScope) -> None:
        await self._links_changed.wait()
        scope.cancel()

    def _address_of(self, node_id: NodeId) -> str | None:
        entry = self.address_book.get(node_id)
        if entry is not None:
            return entry[0]
        learned = self._learned.get(node_id)
        return None if learned is None else learned.raft_address

    def _sync_links(self, since_version: int) -> None:
        """Make ``_links`` match the address book (new peers, moved peers)."""
        book = self.address_book.snapshot()
        for node_id in book:
            if node_id == self.node_id:
                continue
            address = book[node_id][0]
            link = self._links.get(node_id)
            if link is None or link.address != address:
                new = _PeerLink(node_id, address)
                self._link_refusals.pop(node_id, None)  # said of the old address
                if link is not None:
                    new.queue = link.queue
                    new.urgent = link.urgent
                    new.ready.set()
                self._links[node_id] = new
        for node_id in list(self._links):
            if node_id not in book and self._address_of(node_id) is None:
                del self._links[node_id]
                self._link_refusals.pop(node_id, None)

    # --- outbound -------------------------------------------------------------------------

    async def _run_link(self, link: _PeerLink) -> None:
        failures = 0
        with link.cancel_scope:
            await self._incarnation_known.wait()  # announced in the handshake
            while True:
                try:
                    connected = await self._connect(link.node_id, link.address)
                except PeerAuthError as exc:
                    self.stats.connect_failures += 1
                    self._count_refusal(exc)
                    self._log_refusal(f"raft link to node {link.node_id} at {link.address}", exc)
                    self._link_refusals[link.node_id] = exc.message
                except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                    self.stats.connect_failures += 1
                    log.debug("raft link to node %s at %s: %s", link.node_id, link.address, exc)
                    # Nothing answers now: a refusal heard before no longer says why.
                    self._link_refusals.pop(link.node_id, None)
                    self._note_wrong_address(link, exc)
                except RemoteProtocolError as exc:  # the peer's handshake frames were garbage
                    self.stats.connect_failures += 1
                    self._log_refusal(f"raft link to node {link.node_id} at {link.address}", exc)
                    self._link_refusals[link.node_id] = exc.message
                else:
                    self.stats.connects += 1
                    failures = 0
                    self._link_refusals.pop(link.node_id, None)
                    link.connected_s = trio.current_time()
                    try:
                        await self._pump(link, connected)
                    except* _PeerClosedLink:
                        # A planned stop or restart of the peer (or its host closing its
                        # sockets): not a fault, it reconnects as soon as the peer is back.
                        self.stats.closed_by_peer += 1
                        log.info(
                            "raft link to node %s at %s: that node closed it (stopping or "
                            "restarting); reconnecting",
                            link.node_id,
                            link.address,
                        )
                    except* (OSError, trio.TooSlowError, trio.BrokenResourceError) as group:
                        log.debug(
                            "raft link to node %s broke: %s", link.node_id, group.exceptions[0]
                        )
                    except* RemoteProtocolError as group:
                        error = group.exceptions[0]
                        assert isinstance(error, RemoteProtocolError)
                        self._log_refusal(f"raft link to node {link.node_id}", error)
                    finally:
                        link.connected_s = None
                        self._release(connected.ticket)
                        with trio.move_on_after(0.5, shield=True):
                            await connected.stream.aclose()
                # Whatever was queued is stale by the time we reconnect.
                self.stats.dropped_disconnected += len(link.queue) + len(link.urgent)
                link.queue.clear()
                link.urgent.clear()
                delay = min(self._backoff_max_s, self._backoff_min_s * (2**failures))
                failures = min(failures + 1, 30)
                await trio.sleep(delay * (0.5 + 0.5 * self._rng.random()))

    async def _connect(self, peer_id: NodeId, address: str, *, guard: bool = True) -> _Connected:
        """TCP (+TLS) connect and the handshake as connector, under one deadline.

        With ``guard``, the acceptor's incarnation must be admitted
        (:meth:`_admit`): the connection is closed, and PeerAuthError (TWIN) raised,
        when another incarnation of ``peer_id`` is connected.
        """
        host, port = split_address(address)
        with trio.fail_after(self._connect_timeout_s):
            tcp = await trio.open_tcp_stream(host, port)
            stream: trio.abc.Stream = tcp
            try:
                certificate = None
                if self._ssl_client is not None:
                    tls = trio.SSLStream(tcp, self._ssl_client, server_hostname=host)
                    try:
                        await tls.do_handshake()
                    except trio.BrokenResourceError as exc:
                        if not _not_tls(exc):
                            raise
                        # Logged at DEBUG only: the peer looked merely down (found by a
                        # tester).
                        raise RemoteProtocolError(
                            ErrorCode.AUTH_FAILED,
                            tls_mismatch(
                                f"node {peer_id}'s Raft port at {address} answers without TLS",
                                "this node",
                                "that node",
                            ),
                        ) from None
                    stream = tls
                    certificate = tls.getpeercert()
                handshake = peer_auth.ConnectorHandshake(
                    cluster_id=self.cluster_id,
                    node_id=self.node_id,
                    peer_id=peer_id,
                    raft_address=self.advertise_address or "",
                    client_address=self.client_address,
                    secret=self._secret,
                    nonce=self._nonce_source(peer_auth.NONCE_BYTES),
                    peer_certificate=certificate,
                    require_certificate=self._ssl_client is not None,
                    shards=self.shard_layout,
                    extensions=peer_auth.incarnation_extension(self.incarnation or 0),
                )
                decoder = FrameDecoder(peer_auth.MAX_HANDSHAKE_FRAME_BYTES, parse=False)
                await stream.send_all(encode_value(handshake.hello.to_wire()))
                proof = handshake.receive_challenge(await self._handshake_value(stream, decoder))
                assert handshake.challenge is not None
                theirs = peer_auth.incarnation_from_extensions(handshake.challenge.extensions)
                await stream.send_all(encode_value(proof.to_wire()))
                handshake.receive_verdict(await self._handshake_value(stream, decoder))
                # Only now is the acceptor proved and the link ours: we dialled node N's
                # address and may have reached a second process running as node N.
                ticket = self._admit(peer_id, theirs, address) if guard else None
            except BaseException:
                with trio.move_on_after(0.5, shield=True):
                    await stream.aclose()
                raise
        return _Connected(stream, handshake.sealer, ticket)

    async def _pump(self, link: _PeerLink, connected: _Connected) -> None:
        stream = connected.stream
        link.sealer = connected.sealer
        if isinstance(stream, trio.SocketStream):
            link.direct_fd = stream.socket.fileno()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_closed, stream)
                await self._pump_queued(link, stream)
        finally:
            link.direct_fd = -1
            link.unsent = b""
            link.writing = False

    @staticmethod
    async def _watch_closed(stream: trio.abc.Stream) -> None:
        """Read an outbound link, which the acceptor never writes to after the
        handshake, for its end: the peer closed it (a planned stop, :data:`PEER_CLOSE_S`).

        Raises:
            _PeerClosedLink: the peer closed its side (EOF, or TLS ``close_notify``).
            RemoteProtocolError: the peer sent bytes on it.
        """
        data = await stream.receive_some(4096)
        if not data:
            raise _PeerClosedLink
        raise RemoteProtocolError(
            ErrorCode.INVALID_FRAME, "the peer wrote to a raft link it should only read"
        )

    async def _pump_queued(self, link: _PeerLink, stream: trio.abc.Stream) -> None:
        while True:
            await link.ready.wait()
            link.ready = trio.Event()
            chunks: list[bytes] = [link.unsent] if link.unsent else []
            link.unsent = b""
            messages = 0
            size = 0
            while (link.urgent or link.queue) and size < (1 << 20):
                message = link.urgent.popleft() if link.urgent else link.queue.popleft()
                frame = self._frame(link, message)
                if frame is None:
                    continue
                chunks.append(frame)
                messages += 1
                size += len(frame)
            if link.queue or link.urgent:
                link.ready.set()
            if not chunks:
                continue
            link.writing = True
            with trio.fail_after(self._write_timeout_s):
                # A cancelled or failed write leaves a half frame: the link is dropped.
                await stream.send_all(b"".join(chunks))
            link.writing = False
            self.stats.sent_messages += messages

    # --- inbound --------------------------------------------------------------------------

    async def _serve(self, listeners: list[trio.SocketListener]) -> None:
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(self._accept_loop, listener, nursery)

    async def _accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:  # e.g. EMFILE: back off, as trio's serve_listeners
                    log.warning("raft listener accept failed: %s", exc)
                    await trio.sleep(0.1)
                    continue
                nursery.start_soon(self._handle_inbound, stream)

    async def _handle_inbound(self, tcp: trio.SocketStream) -> None:
        self.stats.inbound_connections += 1
        stream: trio.abc.Stream = tcp
        host = _peer_host(tcp)
        from_host = self._handshakes_by_host.get(host, 0)
        busy = from_host >= MAX_PENDING_HANDSHAKES_PER_HOST
        if not busy:
            try:
                self._handshake_slots.acquire_nowait()
            except trio.WouldBlock:
                busy = True
        if busy:
            self.stats.inbound_refused_busy += 1
            self._log_refusal(
                "raft listener",
                RemoteProtocolError(
                    ErrorCode.AUTH_FAILED,
                    "too many connections in their handshake at once (from one address, or "
                    "in all); closing new ones",
                ),
            )
            with trio.move_on_after(0.5, shield=True):
                await tcp.aclose()
            return
        self._handshakes_by_host[host] = from_host + 1
        peer: NodeId | None = None
        try:
            try:
                with trio.fail_after(self._connect_timeout_s):
                    certificate = None
                    if self._ssl_server is not None:
                        tls = trio.SSLStream(tcp, self._ssl_server, server_side=True)
                        try:
                            await tls.do_handshake()
                        except trio.BrokenResourceError as exc:
                            if not _not_tls(exc):
                                raise
                            raise RemoteProtocolError(
                                ErrorCode.AUTH_FAILED,
                                tls_mismatch(
                                    "a connection without TLS arrived on this node's Raft port",
                                    "this node",
                                    "the connecting side (a node without it, or a client "
                                    "or HTTP probe given the Raft port)",
                                ),
                            ) from None
                        stream = tls
                        certificate = tls.getpeercert()
                    decoder = FrameDecoder(peer_auth.MAX_HANDSHAKE_FRAME_BYTES, parse=False)
                    await self._incarnation_known.wait()  # announced in the challenge
                    handshake, opener, ticket = await self._accept_handshake(
                        stream, decoder, certificate
                    )
            finally:
                self._handshake_slots.release()
                left = self._handshakes_by_host[host] - 1
                if left:
                    self._handshakes_by_host[host] = left
                else:
                    del self._handshakes_by_host[host]
            if handshake is None:
                return
            peer = handshake.node_id
            self._inbound_open[peer] = self._inbound_open.get(peer, 0) + 1
            try:
                await self._read_peer(stream, decoder, handshake, opener)
            finally:
                left = self._inbound_open[peer] - 1
                if left:
                    self._inbound_open[peer] = left
                else:
                    del self._inbound_open[peer]
                self._release(ticket)
        except PeerAuthError as exc:
            self.stats.inbound_protocol_errors += 1
            self._count_refusal(exc)
            self._log_refusal("raft peer connection refused", exc)
        except RemoteProtocolError as exc:
            self.stats.inbound_protocol_errors += 1
            self._log_refusal("raft peer connection closed", exc)
        except (OSError, trio.TooSlowError, trio.BrokenResourceError, ssl.SSLError) as exc:
            log.debug("raft peer connection ended: %s", exc)
        finally:
            with trio.move_on_after(PEER_CLOSE_S + 0.5, shield=True):
                # Only a proved peer's connection is worth the wait: what an unknown
                # host opens is closed at once.
                if stream is tcp and peer is not None:
                    await _close_cleanly(tcp)
                await stream.aclose()

    async def _accept_handshake(
        self,
        stream: trio.abc.Stream,
        decoder: FrameDecoder,
        certificate: dict[str, object] | None,
    ) -> tuple[Handshake | None, peer_auth.FrameOpener | None, Ticket | None]:
        """Run the handshake as acceptor; a refusal is sent to the peer, then raised.

        A peer whose node id another incarnation holds (:meth:`_admit`) is refused
        once it proved who it is: its REFUSED frame tells it which processes run as
        its node id.

        Returns:
            The authenticated handshake, the frame opener (None without a frame MAC)
            and the admission to release when the connection ends, or
            ``(None, None, None)`` if the peer closed before saying anything.
        """
        handshake = peer_auth.AcceptorHandshake(
            cluster_id=self.cluster_id,
            node_id=self.node_id,
            secret=self._secret,
            nonce=self._nonce_source(peer_auth.NONCE_BYTES),
            peer_certificate=certificate,
            require_certificate=self._ssl_server is not None,
            shards=self.shard_layout,
            extensions=peer_auth.incarnation_extension(self.incarnation or 0),
        )
        try:
            try:
                first = await self._next_value(stream, decoder)
            except RemoteProtocolError as exc:
                spoken = foreign_protocol(decoder.pending(foreign.START_BYTES))
                if spoken is None:
                    raise
                raise RemoteProtocolError(exc.code, spoken) from None
            if first is CLOSED:
                return None, None, None
            await stream.send_all(encode_value(handshake.receive_hello(first).to_wire()))
            second = await self._next_value(stream, decoder)
            if second is CLOSED:
                return None, None, None  # the connector gave up (e.g. it did not trust our proof)
            hello = handshake.receive_proof(second)
            incarnation = peer_auth.incarnation_from_extensions(hello.extensions)
            address = hello.raft_address or _peer_host_of(stream)
            ticket = self._admit(hello.from_id, incarnation, address)
        except RemoteProtocolError as exc:
            # Tell the peer why (its log then says what to fix); it learns nothing it did
            # not send itself.
            with trio.move_on_after(0.5):
                try:
                    await stream.send_all(encode_value(peer_auth.Refused.from_error(exc).to_wire()))
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
            raise
        try:
            await stream.send_all(encode_value(peer_auth.Accepted().to_wire()))
        except BaseException:
            self._release(ticket)
            raise
        return (
            Handshake(
                hello.cluster_id,
                hello.from_id,
                hello.raft_address,
                hello.client_address,
                incarnation,
            ),
            handshake.opener,
            ticket,
        )

    async def _read_peer(
        self,
        stream: trio.abc.Stream,
        decoder: FrameDecoder,
        handshake: Handshake,
        opener: peer_auth.FrameOpener | None,
    ) -> None:
        # Only an authenticated peer gets the full frame size, and its addresses used.
        decoder.max_frame_bytes = self._max_frame_bytes
        self._learn(handshake)
        if self._address_of(handshake.node_id) is not None and handshake.node_id not in self._links:
            self._links_changed.set()
        while True:
            with trio.fail_after(self._idle_timeout_s):
                value = await self._next_value(stream, decoder)
            if value is CLOSED:
                return
            if type(value) is not bytes:
                raise RemoteProtocolError(ErrorCode.INVALID_FRAME, "raft frame must be binary")
            message = decode_message(value if opener is None else opener.open(value))
            if message.from_id != handshake.node_id:
                raise RemoteProtocolError(
                    ErrorCode.INVALID_FRAME,
                    f"node {handshake.node_id} sent a message from node {message.from_id}",
                )
            stamped = message.sender.incarnation
            if handshake.incarnation and stamped and stamped != handshake.incarnation:
                # The admission was for the incarnation the handshake announced (clock
                # samples and the driver's own answers carry no stamp: 0).
                raise RemoteProtocolError(
                    ErrorCode.INVALID_FRAME,
                    f"node {handshake.node_id} announced incarnation {handshake.incarnation:x} "
                    f"but sent a message from incarnation {stamped:x}",
                )
            if message.to_id != self.node_id:
                self.stats.dropped_unknown_peer += 1
                continue
            self.stats.received_messages += 1
            try:
                # Not a scheduling point per message: a link then delivers a whole read
                # at once instead of one message per pass of the event loop.
                self._inbound_send.send_nowait(message)
            except trio.WouldBlock:
                with trio.fail_after(self._idle_timeout_s):
                    await self._inbound_send.send(message)  # the node is behind: wait

    @classmethod
    async def _handshake_value(cls, stream: trio.abc.Stream, decoder: FrameDecoder) -> object:
        value = await cls._next_value(stream, decoder)
        if value is CLOSED:
            raise trio.BrokenResourceError("the peer closed the connection during the handshake")
        return value

    @staticmethod
    async def _next_value(stream: trio.abc.Stream, decoder: FrameDecoder) -> object:
        while True:
            value = decoder.next_frame()
            if value is not NEED_DATA:
                return value
            data = await stream.receive_some(65536)
            decoder.receive_data(bytes(data))

    # --- refusals -------------------------------------------------------------------------

    def _count_refusal(self, error: PeerAuthError) -> None:
        reason = error.reason.value
        self.stats.refusals[reason] = self.stats.refusals.get(reason, 0) + 1

    def _note_wrong_address(self, link: _PeerLink, error: BaseException) -> None:
        """A link that cannot connect while its peer connects to us, announcing another
        Raft address, is dialling a wrong address (a typo in ``--peers``): say so, in the
        log and in :meth:`link_refusals`. Found by starting node 1 with node 2's entry
        in ``--peers`` mistyped: node 1 got the leader's entries but its answers went
        nowhere, so it never became ready, and no line above DEBUG said why."""
        learned = self._learned.get(link.node_id)
        announced = self._announced_elsewhere.get(link.node_id)
        if announced is None and learned is not None:
            announced = learned.raft_address
        if not announced or announced == link.address:
            return
        # A node moved to another address (its own --peers corrected, ours not) was kept
        # at its old address, where nothing answers, as a possible twin: its leader
        # logged only "is another process running with node N's id?" and cluster status
        # showed it as a healthy voter whose match index stayed 0 (found by a tester).
        sentence = (
            f"cannot connect to node {link.node_id} at {link.address} (its address in "
            f"cluster.peers, --peers, or recorded by the cluster): "
            f"{str(error) or type(error).__name__}; yet node {link.node_id} connects to "
            f"this node and gives its Raft address as {announced}: correct "
            f"node {link.node_id}'s address in this node's --peers (if it joined with "
            f"--join, `futureq-cli cluster add-node {link.node_id} {announced} "
            "CLIENT_HOST:PORT` records its new addresses)"
        )
        self._link_refusals[link.node_id] = sentence
        self._log_line(f"raft link to node {link.node_id}: {sentence}", logging.WARNING)

    def _log_refusal(self, what: str, error: RemoteProtocolError) -> None:
        """Warn once per REFUSAL_LOG_INTERVAL_S per distinct sentence (a misconfigured
        peer retries several times a second); the repeats go to the debug log. A shard
        layout that differs is logged as an error: the link never carries Raft traffic."""
        # A link that never carries Raft traffic until the operator acts: another shard
        # layout, or two processes running as one node id.
        serious = error.code is ErrorCode.SHARD_LAYOUT_MISMATCH or (
            isinstance(error, PeerAuthError) and error.reason is peer_auth.RefusalReason.TWIN
        )
        # The sentence quotes what the peer sent (a frame length, a cluster id): keyed
        # by its wording with those left out, so that anyone who reaches the Raft port
        # cannot make every connection's line new. 200 connections of random bytes
        # logged 200 warnings in 0.1 s (found by a tester).
        key = f"{what}: {_VARIABLE_PARTS.sub('#', error.message)}"
        self._log_line(
            f"{what}: {error.message}", logging.ERROR if serious else logging.WARNING, key
        )

    def _log_line(self, line: str, level: int, key: str | None = None) -> None:
        """Log ``line`` at ``level`` once per REFUSAL_LOG_INTERVAL_S per ``key`` (default:
        the line itself); repeats go to the debug log."""
        key = line if key is None else key
        now = trio.current_time()
        last = self._refusals_logged.get(key)
        if last is not None and now - last < REFUSAL_LOG_INTERVAL_S:
            log.debug("%s", line)
            return
        if len(self._refusals_logged) > 256:
            self._refusals_logged.clear()
        self._refusals_logged[key] = now
        log.log(level, "%s", line)


__all__ = [
    "DEFAULT_MAX_PENDING_HANDSHAKES",
    "MAGIC",
    "PROTOCOL_VERSION",
    "AddressBook",
    "Handshake",
    "Transport",
    "TransportStatistics",
    "split_address",
]
