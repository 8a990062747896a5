"""TCP proxies in front of Raft links, one per directed link, controlled by the harness.

Node ``i`` reaches node ``j`` through the address its own ``--peers`` map gives for
``j``; the harness points that entry at the proxy of link ``i -> j``, so every directed
link has its own proxy and faults need no privileges (no iptables).

A proxy forwards both directions of every connection node ``i`` opens to node ``j``:
``forward`` is the bytes ``i`` sends, ``backward`` the bytes ``j`` answers on the same
connection. Raft peer traffic is length-prefixed frames (4-byte big-endian length, as
``docs/protocol.md`` "Framing"), so a proxy acts on whole frames: it drops them
(a cut direction, or random loss) or holds them (delay) without corrupting the stream.
A stream that does not look framed (a length over ``MAX_FRAME_BYTES``) is forwarded
raw; dropping on it closes the connection instead.

To cut "``i`` cannot send to ``j``" whatever connection the transport uses, cut
``forward`` on link ``i -> j`` and ``backward`` on link ``j -> i``
(:meth:`LinkTable.cut`).

The frames of the peer handshake (msgpack arrays that start with ``"futureq-raft"``,
``docs/raft.md`` "Peer handshake") pass whatever the faults: the faults stand for lost
Raft *messages*, and a frame cannot vanish from inside a TCP stream, so dropping a
handshake frame would model nothing real (it only stalls the connect until its
timeout). In particular a cut ``backward`` direction must still let ``j`` open its
connection to ``i``, or an asymmetric partition would become a full one. Raft frames
after the handshake are MACed with sequence numbers that may skip (``peer_auth``), so
dropping whole frames keeps the stream valid.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from functools import partial

import attrs
import trio

MAX_FRAME_BYTES = 64 * 1024 * 1024
DIRECTIONS = ("forward", "backward")
DELAY_QUEUE_FRAMES = 10_000
CONNECT_TIMEOUT_S = 2.0
HANDSHAKE_PREFIX = b"\xacfutureq-raft"
"""msgpack of the handshake magic, right after the frame's array header."""


def is_handshake_frame(piece: bytes) -> bool:
    """True for a length-prefixed frame holding a peer handshake message."""
    return len(piece) > 5 and piece[4] & 0xF0 == 0x90 and piece[5:].startswith(HANDSHAKE_PREFIX)


@attrs.define
class Direction:
    """Faults on one direction of a link.

    Attributes:
        cut: Drop every frame.
        loss: Probability in [0, 1] of dropping each frame.
        delay_ms: Hold each frame this long (order is kept).
    """

    cut: bool = False
    loss: float = 0.0
    delay_ms: float = 0.0

    def heal(self) -> None:
        """Clear every fault."""
        self.cut, self.loss, self.delay_ms = False, 0.0, 0.0


@attrs.define
class LinkStats:
    """Frames and bytes through a link since it started."""

    connections: int = 0
    frames_forwarded: int = 0
    frames_dropped: int = 0
    bytes_forwarded: int = 0


class LinkProxy:
    """The proxy of one directed link ``source -> target``.

    Args:
        source: Id of the node that connects through this proxy.
        target: Id of the node behind it.
        target_port: The target's real Raft port on 127.0.0.1.
        rng: Decides random losses (seeded by the harness).
        offsets: Port offsets of the shards of a sharded node (``docs/sharding.md``):
            the proxy also listens on ``port + offset`` and forwards it to
            ``target_port + offset``, so one link (one machine-to-machine path) carries
            every shard's Raft traffic and its faults hit every shard alike.
    """

    def __init__(
        self,
        source: int,
        target: int,
        target_port: int,
        rng: random.Random,
        offsets: tuple[int, ...] = (0,),
    ) -> None:
        self.source = source
        self.target = target
        self.target_port = target_port
        self.rng = rng
        self.port = 0
        self.offsets = offsets
        self.faults = {name: Direction() for name in DIRECTIONS}
        self.stats = LinkStats()
        self._connections: set[trio.CancelScope] = set()

    @property
    def name(self) -> str:
        return f"{self.source}->{self.target}"

    def heal(self) -> None:
        """Clear the faults of both directions."""
        for direction in self.faults.values():
            direction.heal()

    def reset_connections(self) -> None:
        """Close every open connection (both sides see the connection drop)."""
        for scope in list(self._connections):
            scope.cancel()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on 127.0.0.1 (a free port, or ``self.port`` if set; plus ``port +
        offset`` for every further shard offset) and serve for ever.

        ``task_status.started`` receives the bound port.
        """
        listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        extra = [
            (offset, await trio.open_tcp_listeners(self.port + offset, host="127.0.0.1"))
            for offset in self.offsets
            if offset
        ]
        task_status.started(self.port)
        async with trio.open_nursery() as nursery:
            for offset, shard_listeners in extra:
                nursery.start_soon(
                    trio.serve_listeners, partial(self._handle, offset=offset), shard_listeners
                )
            await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream, offset: int = 0) -> None:
        self.stats.connections += 1
        with trio.CancelScope() as scope:
            self._connections.add(scope)
            try:
                with trio.fail_after(CONNECT_TIMEOUT_S):
                    server = await trio.open_tcp_stream("127.0.0.1", self.target_port + offset)
            except (OSError, trio.TooSlowError):
                self._connections.discard(scope)
                await client.aclose()
                return
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump, client, server, "forward", nursery.cancel_scope)
                    nursery.start_soon(self._pump, server, client, "backward", nursery.cancel_scope)
            finally:
                self._connections.discard(scope)
                with trio.move_on_after(1, shield=True):
                    await client.aclose()
                    await server.aclose()

    async def _pump(
        self,
        source: trio.SocketStream,
        sink: trio.SocketStream,
        direction: str,
        connection: trio.CancelScope,
    ) -> None:
        """Copy frames from ``source`` to ``sink`` applying this direction's faults; the
        first end to close (or fail) ends the whole connection."""
        send, receive = trio.open_memory_channel[tuple[float, bytes]](DELAY_QUEUE_FRAMES)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer, receive, sink)
                await self._reader(source, send, direction)
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # either end went away: the connection is over
        finally:
            connection.cancel()

    async def _reader(
        self,
        source: trio.SocketStream,
        send: trio.MemorySendChannel[tuple[float, bytes]],
        direction: str,
    ) -> None:
        faults = self.faults[direction]
        buffer = bytearray()
        framed = True
        async with send:
            while True:
                chunk = await source.receive_some(65536)
                if not chunk:
                    return
                buffer += chunk
                pieces: list[bytes]
                if framed:
                    pieces, framed = _split_frames(buffer)
                if not framed:
                    pieces = [bytes(buffer)]
                    buffer.clear()
                for piece in pieces:
                    if framed and is_handshake_frame(piece):
                        pass  # never dropped (see the module docstring)
                    elif faults.cut or (faults.loss > 0 and self.rng.random() < faults.loss):
                        self.stats.frames_dropped += 1
                        if not framed:
                            return  # cannot drop part of a raw stream: break the connection
                        continue
                    await send.send((trio.current_time() + faults.delay_ms / 1000, piece))

    async def _writer(
        self, receive: trio.MemoryReceiveChannel[tuple[float, bytes]], sink: trio.SocketStream
    ) -> None:
        async with receive:
            async for release_at, piece in receive:
                await trio.sleep_until(release_at)
                await sink.send_all(piece)
                self.stats.frames_forwarded += 1
                self.stats.bytes_forwarded += len(piece)


def _split_frames(buffer: bytearray) -> tuple[list[bytes], bool]:
    """Take the complete length-prefixed frames off the front of ``buffer``.

    Returns:
        (frames, still_framed): ``still_framed`` is False when a header announces more
        than ``MAX_FRAME_BYTES``, i.e. the stream is not framed as expected; the
        buffer is then left untouched.
    """
    frames: list[bytes] = []
    offset = 0
    while len(buffer) - offset >= 4:
        length = int.from_bytes(buffer[offset : offset + 4], "big")
        if length > MAX_FRAME_BYTES:
            if offset:
                del buffer[:offset]
            return frames, False
        end = offset + 4 + length
        if end > len(buffer):
            break
        frames.append(bytes(buffer[offset:end]))
        offset = end
    del buffer[:offset]
    return frames, True


class LinkTable:
    """Every directed link of a cluster, by ``(source, target)``."""

    def __init__(self) -> None:
        self.links: dict[tuple[int, int], LinkProxy] = {}

    def __iter__(self) -> Iterator[LinkProxy]:
        return iter(self.links.values())

    def cut(self, source: int, target: int) -> None:
        """``source`` can no longer send to ``target`` (on any connection)."""
        if (source, target) in self.links:
            self.links[(source, target)].faults["forward"].cut = True
        if (target, source) in self.links:
            self.links[(target, source)].faults["backward"].cut = True

    def isolate(self, side_a: list[int], side_b: list[int]) -> None:
        """Cut both ways between every node of ``side_a`` and every node of ``side_b``."""
        for a in side_a:
            for b in side_b:
                if a != b:
                    self.cut(a, b)
                    self.cut(b, a)

    def set_all(self, *, loss: float | None = None, delay_ms: float | None = None) -> None:
        """Apply loss and/or delay to both directions of every link."""
        for link in self:
            for direction in link.faults.values():
                if loss is not None:
                    direction.loss = loss
                if delay_ms is not None:
                    direction.delay_ms = delay_ms

    def heal(self) -> None:
        """Clear every fault on every link."""
        for link in self:
            link.heal()

    def dropped(self) -> int:
        """Frames dropped on all links so far."""
        return sum(link.stats.frames_dropped for link in self)
