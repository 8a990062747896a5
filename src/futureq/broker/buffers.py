"""Bytes held for client connections: the node-wide account and each connection's outbox.

:class:`NodeBuffers` bounds what all connections together hold (outgoing bytes plus
incomplete incoming frames, ``limits.max_node_buffer_bytes``); :class:`Outbox` bounds one
connection's outgoing frames (``limits.max_connection_buffer_bytes``; twice that closes it,
``SLOW_CLIENT``). Past either limit deliveries stop going to the connection (they stay
with the group's other consumers) and are resumed once there is room again. A frame
that has waited :data:`EVICT_AFTER_S` for inbound room drops the oldest incomplete frame
begun before it, so trickled half-frames cannot hold the budget until their deadline.

Source: ``docs/operations.md``, "Limits" (issue 10).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from futureq.quick_thread import tasks_runnable

if TYPE_CHECKING:
    pass

EVICT_AFTER_S = 1.0
"""A frame waiting this long for inbound room drops the oldest incomplete frame whose
client is slow (``NodeBuffers.wait_room``)."""
WRITE_COALESCE_BYTES = 256 * 1024
"""The writer joins queued frames into one ``send_all`` up to this size (bytes)."""
ROOM_AGAIN_FRACTION = 0.5
"""A full buffer counts as having room again once below this fraction of its limit."""


HELD_FRAME_BYTES = 256
"""Memory of one decoded request frame beyond its wire bytes (its object, list, ints)."""
HELD_ITEM_BYTES = 160
"""Memory of one decoded PUBLISH item beyond its wire bytes (its tuple, and str, bytes
and int objects of 28 to 60 bytes each for 1 to 9 on the wire): measured 80 bytes for
``["t", b"", nil, nil, nil]``, 240 for one with a long topic, a TTL and a key."""
HELD_HEADER_MAP_BYTES = 232
"""Memory of the headers map of one decoded PUBLISH item (an empty dict's size)."""
HELD_HEADER_BYTES = 40
"""Memory of one more header in that map (its slots; msgpack shares equal keys)."""
HELD_ELEMENT_BYTES = 48
"""Memory of one decoded tag or message id beyond its wire bytes (a bytes or int object
and its list slot)."""


def held_bytes(frame: object, wire_bytes: int) -> int:
    """What a request frame holds in memory once decoded, estimated (bytes).

    A request being served was counted by its wire bytes alone, against
    ``limits.max_connection_buffer_bytes`` and ``limits.max_node_buffer_bytes``; decoded,
    a PUBLISH of 10,000 small items takes 11 to 20 times its wire bytes (one byte of
    msgpack becomes a Python object of 28 to 60), so a connection within its 8 MiB could
    hold over 100 MB. The estimate counts each item, headers map, tag and id, within a
    factor of two of what was measured; a frame of large payloads stays close to its
    wire bytes.

    Args:
        frame: A decoded request frame (``futureq.wire.frames``).
        wire_bytes: Its size on the wire, header included.

    Returns:
        ``wire_bytes`` plus the estimated memory of its decoded objects.
    """
    held = wire_bytes + HELD_FRAME_BYTES
    items = getattr(frame, "items", None)
    if isinstance(items, list | tuple):
        held += HELD_ITEM_BYTES * len(items)
        try:
            # Items without headers have 5 fields: one C-level pass tells whether any
            # has more (a loop over every item cost about as much as validating it).
            plain = not items or max(map(len, items)) <= 5
        except TypeError:
            plain = False  # an item without a length: validation refuses it later
        if not plain:
            held += _headers_held(items)
    for name in ("tags", "ids", "handed"):
        elements = getattr(frame, name, None)
        if isinstance(elements, list | tuple):
            held += HELD_ELEMENT_BYTES * len(elements)
    return held


def _headers_held(items: list[Any] | tuple[Any, ...]) -> int:
    """The estimated memory (bytes) of the headers maps of raw PUBLISH items."""
    held = 0
    for item in items:
        # Raw wire items, not validated yet: any shape (validation refuses it later).
        if isinstance(item, list | tuple) and len(item) > 5 and isinstance(item[5], dict):
            held += HELD_HEADER_MAP_BYTES + HELD_HEADER_BYTES * len(item[5])
    return held


class NodeBuffers:
    """Bytes held in every client connection's buffers on this node, both directions.

    Each direction is bounded by ``limit_bytes`` on its own: past it no more deliveries
    are queued (outgoing), or incomplete frames wait for the rest of theirs to be read
    (incoming; the frame deadline still runs). Separately, so that clients who do not
    read can never stop the others' requests from being read.

    Args:
        limit_bytes: ``limits.max_node_buffer_bytes``.
        on_room: Called once the buffers are below half the limit again after it was
            reached (the dispatcher then looks at every group with consumers).
        on_full: Called each time the limit is reached and deliveries are held back.

    Each connection refused room because the node was full is also told, by its
    :meth:`Outbox.room_again`, as soon as the node is below the limit again: a
    consumer the dispatcher set aside then (``GroupRuntime.ready``) must not wait for
    half the limit, which a few slow readers can keep from coming for as long as
    they read.
    """

    def __init__(
        self,
        limit_bytes: int,
        on_room: Callable[[], None] | None = None,
        on_full: Callable[[], None] | None = None,
    ) -> None:
        self.limit_bytes = limit_bytes
        self.on_room = on_room
        self.on_full = on_full
        self.outbound = 0
        self.inbound = 0
        self.requests = 0
        """Bytes of the frames of requests read and being served, on every connection:
        at most ``limit_bytes`` (:meth:`wait_request_room`), and each connection's own at
        most ``limits.max_connection_buffer_bytes``."""
        self._request_room = trio.Event()
        self._request_waiting = False
        self._was_full = False
        self._refused: dict[Outbox, None] = {}
        """Outboxes refused room because the node was full, told when it is not."""
        self._room = trio.Event()
        self.full_count = 0
        """Times the node's buffers were found full (deliveries held back)."""
        self._incomplete: dict[int, tuple[float, Callable[[], None]]] = {}
        self.evicted_count = 0
        """Incomplete frames dropped to make room for others (:meth:`wait_room`)."""

    @property
    def total(self) -> int:
        """Bytes held now."""
        return self.outbound + self.inbound

    def has_room(self, asking: Outbox | None = None) -> bool:
        """True while the node may buffer more deliveries; a refused ``asking`` outbox
        is told when it may again (:meth:`Outbox.room_again`)."""
        if self.outbound < self.limit_bytes:
            return True
        if asking is not None:
            self._refused[asking] = None
        if not self._was_full:
            self._was_full = True
            self.full_count += 1
            if self.on_full is not None:
                self.on_full()
        return False

    def change(self, outbound: int = 0, inbound: int = 0) -> None:
        """Account for bytes added (positive) or released (negative)."""
        self.outbound += outbound
        self.inbound += inbound
        if inbound < 0 and self.inbound < self.limit_bytes:
            self._room.set()
            self._room = trio.Event()
        if outbound < 0 and self._refused and self.outbound < self.limit_bytes:
            refused, self._refused = self._refused, {}
            for outbox in refused:
                outbox.room_again()
        if (
            outbound < 0
            and self._was_full
            and self.outbound < self.limit_bytes * ROOM_AGAIN_FRACTION
        ):
            self._was_full = False
            if self.on_room is not None:
                self.on_room()

    async def wait_room(self, key: int | None = None, frame_started: float = 0.0) -> None:
        """Block until incomplete incoming frames hold less than the limit.

        Each :data:`EVICT_AFTER_S` spent waiting, the oldest incomplete frame begun
        before the waiter's own (``frame_started``, trio time) is dropped
        (:meth:`incomplete`), so clients holding or trickling half-sent frames cannot
        keep the budget from everyone else until their frame deadline. Only frames
        older than the waiter's are candidates: the one dropped has had the longest to
        arrive (frames of well-behaved clients complete in moments, so it is rarely
        theirs).
        """
        while self.inbound >= self.limit_bytes:
            room = self._room
            with trio.move_on_after(EVICT_AFTER_S) as waited:
                await room.wait()
            if not waited.cancelled_caught:
                continue
            older = [
                (started, other)
                for other, (started, _) in self._incomplete.items()
                if other != key and started < frame_started
            ]
            if older:
                _, victim = min(older)
                _, evict = self._incomplete.pop(victim)
                self.evicted_count += 1
                evict()

    async def wait_request_room(self, size: int) -> None:
        """Block until the requests in progress on every connection hold few enough
        bytes to take one of ``size`` more (one is always taken when none is in
        progress on the node, whatever its size).

        The waiting frame is still counted in ``inbound`` (its connection counts what
        it read only once it has served every whole frame read), so frames waiting here
        stay within that budget, and their connections read nothing more meanwhile.
        """
        while self.requests and self.requests + size > self.limit_bytes:
            self._request_waiting = True
            await self._request_room.wait()

    def request_started(self, size: int) -> None:
        """A request of ``size`` bytes is being served (after :meth:`wait_request_room`)."""
        self.requests += size

    def request_ended(self, size: int) -> None:
        """A request of ``size`` bytes was answered (or failed)."""
        self.requests -= size
        if self._request_waiting:
            self._request_waiting = False
            self._request_room.set()
            self._request_room = trio.Event()

    def incomplete(self, key: int, frame_started: float, evict: Callable[[], None]) -> None:
        """Connection ``key`` waits for more of a frame begun at ``frame_started`` (trio
        time); ``evict`` drops it if the budget is needed (:meth:`wait_room`)."""
        self._incomplete[key] = (frame_started, evict)

    def forget(self, outbox: Outbox) -> None:
        """A closed outbox is not told about room any more."""
        self._refused.pop(outbox, None)

    def done_waiting(self, key: int) -> None:
        """Connection ``key`` got bytes (or ended): no longer a candidate for eviction."""
        self._incomplete.pop(key, None)


class Outbox:
    """One connection's outgoing frames, bounded in bytes (never blocks a sender).

    Args:
        limit_bytes: ``limits.max_connection_buffer_bytes``: no more deliveries at this
            size; :attr:`overflowed` at twice this.
        node: The node-wide account.
        on_room: Called when the outbox drained after deliveries were held back.
        on_full: Called each time the outbox is found full and deliveries are held back.

    With :attr:`direct_fd` set (a plain TCP connection), bytes sent while nothing is
    queued, the writer is not writing and no other task is ready to run go to the
    socket at once (non-blocking); only what the socket does not take is queued for the
    writer task. Waking the writer cost a pass of the event loop on the way to every
    answer of a quiet connection (as the Raft transport found for AppendEntries:
    ``Transport._write_now``). With other tasks ready (a group commit answering many
    requests) the writer joins what they queue into one send: writing each answer at
    once cost 5-10 % of the throughput at batch 100 (``bench.ab``).
    """

    def __init__(
        self,
        limit_bytes: int,
        node: NodeBuffers,
        on_room: Callable[[], None] | None = None,
        on_full: Callable[[], None] | None = None,
    ) -> None:
        self.limit_bytes = limit_bytes
        self.node = node
        self.on_room = on_room
        self.on_full = on_full
        self.buffered_bytes = 0
        self.closed = False
        self._frames: deque[bytes] = deque()
        self._ready = trio.Event()
        self._room = trio.Event()
        self._held = False
        self.full_count = 0
        """Times this outbox was found full (deliveries held back)."""
        self.direct_fd = -1
        """The connection's socket, non-blocking, for writes at once; -1: never."""
        self._writing = False
        """The writer holds bytes taken by :meth:`take` not yet :meth:`written`."""

    def send_nowait(self, data: bytes) -> bool:
        """Queue encoded frame bytes (or write them at once, see the class docstring);
        False once the connection is closing."""
        if self.closed:
            return False
        if self.direct_fd >= 0 and not self._writing and not self._frames and not tasks_runnable():
            try:
                sent = os.write(self.direct_fd, data)
            except OSError:  # full (BlockingIOError) or broken: the writer meets it
                sent = 0
            if sent == len(data):
                return True
            data = data[sent:]
        self._frames.append(data)
        self.buffered_bytes += len(data)
        self.node.change(outbound=len(data))
        self._ready.set()
        return True

    def has_room(self) -> bool:
        """True while deliveries may be pushed (this buffer and the node's have room)."""
        if self.closed:
            return False
        if self.buffered_bytes >= self.limit_bytes:
            if not self._held:
                self._held = True
                self.full_count += 1
                if self.on_full is not None:
                    self.on_full()
            return False
        if not self.node.has_room(self):
            self._held = True
            return False
        return True

    def room_again(self) -> None:
        """The node, which refused this outbox room, has room again (NodeBuffers)."""
        if not self.closed and self.on_room is not None:
            self.on_room()

    @property
    def overflowed(self) -> bool:
        """True past twice the limit: the client does not read its answers."""
        return self.buffered_bytes > 2 * self.limit_bytes

    async def take(self) -> bytes | None:
        """The next bytes to write (frames joined up to a size), or None once closed
        and drained."""
        while not self._frames:
            if self.closed:
                return None
            await self._ready.wait()
            self._ready = trio.Event()
        chunks = [self._frames.popleft()]
        size = len(chunks[0])
        while self._frames and size + len(self._frames[0]) <= WRITE_COALESCE_BYTES:
            chunks.append(self._frames.popleft())
            size += len(chunks[-1])
        self._writing = True
        return b"".join(chunks) if len(chunks) > 1 else chunks[0]

    def written(self, size: int) -> None:
        """``size`` bytes handed out by :meth:`take` reached the socket."""
        self._writing = False
        self.buffered_bytes -= size
        self.node.change(outbound=-size)
        if self.buffered_bytes < self.limit_bytes:
            self._room.set()
            self._room = trio.Event()
        if self._held and self.buffered_bytes < self.limit_bytes * ROOM_AGAIN_FRACTION:
            self._held = False
            if self.on_room is not None:
                self.on_room()

    async def wait_room(self) -> None:
        """Block until the outbox holds less than its limit (the reader's back-pressure)."""
        while self.buffered_bytes >= self.limit_bytes and not self.closed:
            await self._room.wait()

    def close(self) -> None:
        """No more frames; :meth:`take` drains what is queued, then returns None."""
        self.closed = True
        self.node.forget(self)
        self._ready.set()
        self._room.set()

    def discard(self) -> None:
        """Drop whatever was not written (the connection is gone)."""
        self.close()
        dropped = self.buffered_bytes
        self._frames.clear()
        self.buffered_bytes = 0
        if dropped:
            self.node.change(outbound=-dropped)
