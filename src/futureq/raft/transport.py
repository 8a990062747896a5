"""Peer links for Raft: wire-codec frames over TCP (optionally TLS), with reconnects.

Each node listens on its raft address and opens one outbound connection per peer;
a pair of nodes therefore talks over two connections, each carrying messages one way.
Raft tolerates lost, duplicated and reordered messages, so the transport is simple:
:meth:`Transport.send` never blocks, each peer has a bounded queue that drops its
oldest message when full, and a broken connection drops what was queued.

Frames use the client protocol's framing (``wire/codec.py``: 4-byte big-endian length,
then one msgpack value). The first frame on a connection is the handshake
``["futureq-raft", 1, cluster_id, from_node_id, from_raft_address, from_client_address]``;
every later frame is a msgpack ``bin`` holding ``encode_message`` bytes. A peer that
sends anything else (bad handshake, other cluster, garbage, a message claiming another
sender) loses that connection only (:class:`~futureq.errors.RemoteProtocolError`).
"""

from __future__ import annotations

import logging
import random
import ssl
from collections import deque
from collections.abc import Mapping
from typing import Final

import attrs
import trio

from futureq.config import split_host_port
from futureq.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from futureq.raft.messages import Message, NodeId, decode_message, encode_message
from futureq.wire.codec import CLOSED, NEED_DATA, FrameDecoder, encode_value

log = logging.getLogger(__name__)

MAGIC: Final = "futureq-raft"
PROTOCOL_VERSION: Final = 1
DEFAULT_MAX_FRAME_BYTES: Final = 16 << 20
"""Largest raft frame accepted (bytes): an AppendEntries batch or a snapshot chunk."""


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


@attrs.frozen
class Handshake:
    """What the first frame of a connection says about its sender."""

    cluster_id: str
    node_id: NodeId
    raft_address: str
    client_address: str | None


class _PeerLink:
    __slots__ = ("address", "cancel_scope", "node_id", "queue", "ready")

    def __init__(self, node_id: NodeId, address: str) -> None:
        self.node_id = node_id
        self.address = address
        self.queue: deque[Message] = deque()
        self.ready = trio.Event()
        self.cancel_scope = trio.CancelScope()


class Transport:
    """Raft peer links over TCP.

    Args:
        node_id: Our id; messages to it are not sent.
        listen_address: ``HOST:PORT`` to bind (port 0 picks a free port).
        address_book: Where peers are; watched for changes.
        ssl_server: Wrap accepted connections in TLS with this context, or None.
        ssl_client: Wrap outbound connections in TLS with this context, or None
            (``server_hostname`` is the peer's host).
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
    ) -> None:
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
        self._links: dict[NodeId, _PeerLink] = {}
        self._learned: dict[NodeId, Handshake] = {}
        self._links_changed = trio.Event()
        self._inbound_send, self.receive_channel = trio.open_memory_channel[Message](inbound_buffer)
        """Messages from peers, decoded and checked (sender matches the handshake)."""
        self.stats = TransportStatistics()
        self.bound_address: str | None = None

    # --- public API ---------------------------------------------------------------------

    def send(self, message: Message) -> None:
        """Queue ``message`` for its ``to_id``; never blocks.

        Messages to ourselves and to peers with no known address are dropped (counted).
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
        if len(link.queue) >= self._max_queue:
            link.queue.popleft()
            self.stats.dropped_queue_full += 1
        link.queue.append(message)
        link.ready.set()

    def peer_client_address(self, node_id: int) -> str | None:
        """Client address of ``node_id``: from its handshake, else the address book."""
        learned = self._learned.get(NodeId(node_id))
        if learned is not None and learned.client_address:
            return learned.client_address
        entry = self.address_book.get(node_id)
        return None if entry is None else entry[1]

    def statistics(self) -> TransportStatistics:
        """A copy of the counters."""
        return attrs.evolve(self.stats)

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
                if link is not None:
                    new.queue = link.queue
                    new.ready.set()
                self._links[node_id] = new
        for node_id in list(self._links):
            if node_id not in book and self._address_of(node_id) is None:
                del self._links[node_id]

    # --- outbound -------------------------------------------------------------------------

    def _handshake_frame(self) -> bytes:
        return encode_value(
            [
                MAGIC,
                PROTOCOL_VERSION,
                self.cluster_id,
                self.node_id,
                self.advertise_address or "",
                self.client_address,
            ]
        )

    async def _run_link(self, link: _PeerLink) -> None:
        failures = 0
        with link.cancel_scope:
            while True:
                try:
                    stream = await self._connect(link.address)
                except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                    self.stats.connect_failures += 1
                    log.debug("raft link to node %s at %s: %s", link.node_id, link.address, exc)
                else:
                    self.stats.connects += 1
                    failures = 0
                    try:
                        await self._pump(link, stream)
                    except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                        log.debug("raft link to node %s broke: %s", link.node_id, exc)
                    finally:
                        with trio.move_on_after(0.5, shield=True):
                            await stream.aclose()
                # Whatever was queued is stale by the time we reconnect.
                self.stats.dropped_disconnected += len(link.queue)
                link.queue.clear()
                delay = min(self._backoff_max_s, self._backoff_min_s * (2**failures))
                failures = min(failures + 1, 30)
                await trio.sleep(delay * (0.5 + 0.5 * self._rng.random()))

    async def _connect(self, address: str) -> trio.abc.Stream:
        host, port = split_address(address)
        with trio.fail_after(self._connect_timeout_s):
            tcp = await trio.open_tcp_stream(host, port)
            stream: trio.abc.Stream = tcp
            try:
                if self._ssl_client is not None:
                    tls = trio.SSLStream(tcp, self._ssl_client, server_hostname=host)
                    await tls.do_handshake()
                    stream = tls
                await stream.send_all(self._handshake_frame())
            except BaseException:
                with trio.move_on_after(0.5, shield=True):
                    await tcp.aclose()
                raise
        return stream

    async def _pump(self, link: _PeerLink, stream: trio.abc.Stream) -> None:
        while True:
            await link.ready.wait()
            link.ready = trio.Event()
            chunks: list[bytes] = []
            size = 0
            while link.queue and size < (1 << 20):
                message = link.queue.popleft()
                try:
                    frame = encode_value(encode_message(message), self._max_frame_bytes)
                except LocalProtocolError as exc:
                    self.stats.dropped_too_large += 1
                    log.warning("raft message to node %s not sent: %s", link.node_id, exc)
                    continue
                chunks.append(frame)
                size += len(frame)
            if link.queue:
                link.ready.set()
            if not chunks:
                continue
            with trio.fail_after(self._write_timeout_s):
                # A cancelled or failed write leaves a half frame: the link is dropped.
                await stream.send_all(b"".join(chunks))
            self.stats.sent_messages += len(chunks)

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
        try:
            if self._ssl_server is not None:
                tls = trio.SSLStream(tcp, self._ssl_server, server_side=True)
                with trio.fail_after(self._connect_timeout_s):
                    await tls.do_handshake()
                stream = tls
            await self._read_peer(stream)
        except RemoteProtocolError as exc:
            self.stats.inbound_protocol_errors += 1
            log.warning("raft peer connection closed: %s", exc)
        except (OSError, trio.TooSlowError, trio.BrokenResourceError, ssl.SSLError) as exc:
            log.debug("raft peer connection ended: %s", exc)
        finally:
            with trio.move_on_after(0.5, shield=True):
                await stream.aclose()

    async def _read_peer(self, stream: trio.abc.Stream) -> None:
        decoder = FrameDecoder(self._max_frame_bytes, parse=False)
        with trio.fail_after(self._connect_timeout_s):
            first = await self._next_value(stream, decoder)
        if first is CLOSED:
            return
        handshake = self._check_handshake(first)
        self._learned[handshake.node_id] = handshake
        if self._address_of(handshake.node_id) is not None and handshake.node_id not in self._links:
            self._links_changed.set()
        while True:
            with trio.fail_after(self._idle_timeout_s):
                value = await self._next_value(stream, decoder)
            if value is CLOSED:
                return
            if type(value) is not bytes:
                raise RemoteProtocolError(ErrorCode.INVALID_FRAME, "raft frame must be binary")
            message = decode_message(value)
            if message.from_id != handshake.node_id:
                raise RemoteProtocolError(
                    ErrorCode.INVALID_FRAME,
                    f"node {handshake.node_id} sent a message from node {message.from_id}",
                )
            if message.to_id != self.node_id:
                self.stats.dropped_unknown_peer += 1
                continue
            self.stats.received_messages += 1
            with trio.fail_after(self._idle_timeout_s):
                await self._inbound_send.send(message)

    @staticmethod
    async def _next_value(stream: trio.abc.Stream, decoder: FrameDecoder) -> object:
        while True:
            value = decoder.next_frame()
            if value is not NEED_DATA:
                return value
            data = await stream.receive_some(65536)
            decoder.receive_data(bytes(data))

    def _check_handshake(self, value: object) -> Handshake:
        if not isinstance(value, list) or len(value) != 6 or value[0] != MAGIC:
            raise RemoteProtocolError(
                ErrorCode.HELLO_REQUIRED, "the first raft frame must be the futureq-raft handshake"
            )
        _magic, version, cluster_id, node_id, raft_address, client_address = value
        if version != PROTOCOL_VERSION:
            raise RemoteProtocolError(
                ErrorCode.UNSUPPORTED_VERSION,
                f"raft protocol version {version!r:.20} is not supported (we speak "
                f"{PROTOCOL_VERSION})",
            )
        if cluster_id != self.cluster_id:
            raise RemoteProtocolError(
                ErrorCode.AUTH_FAILED,
                f"peer belongs to cluster {cluster_id!r:.60}, we are {self.cluster_id!r}",
            )
        if type(node_id) is not int or node_id < 1 or node_id == self.node_id:
            raise RemoteProtocolError(
                ErrorCode.INVALID_FRAME, f"handshake node id {node_id!r:.20} is invalid"
            )
        if not isinstance(raft_address, str) or not (
            client_address is None or isinstance(client_address, str)
        ):
            raise RemoteProtocolError(ErrorCode.INVALID_FRAME, "handshake addresses must be text")
        if raft_address:
            try:
                split_address(raft_address)
            except ValueError as exc:
                raise RemoteProtocolError(ErrorCode.INVALID_FRAME, str(exc)) from None
        return Handshake(cluster_id, NodeId(node_id), raft_address, client_address or None)


__all__ = [
    "MAGIC",
    "PROTOCOL_VERSION",
    "AddressBook",
    "Handshake",
    "Transport",
    "TransportStatistics",
    "split_address",
]
