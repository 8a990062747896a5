"""The client listener: one task per connection driving a sans-IO ``ServerSession``.

Each connection has a reader (decodes frames, starts request handlers) and a writer
(drains a bounded outbox). Requests pipeline: each PUBLISH, SUBSCRIBE, ACK, NACK,
STATUS or group request runs in its own task of the connection's nursery, bounded by
``MAX_REQUESTS_IN_PROGRESS`` per connection, and its answer echoes the request id.
A refused request (2xx, 3xx) fails alone; a protocol error (1xx) gets an ERROR frame,
then the connection closes. Nothing a client sends can stop the server.

Source: ``docs/protocol.md``.
"""

from __future__ import annotations

import itertools
import logging
import ssl
from typing import TYPE_CHECKING

import trio

from futureq import __version__
from futureq.errors import (
    ErrorCode,
    LocalProtocolError,
    RemoteProtocolError,
    RequestError,
    StorageError,
)
from futureq.wire import frames
from futureq.wire.session import CLOSED, NEED_DATA, ServerSession, SessionState

if TYPE_CHECKING:
    from .broker import Broker
    from .hub import Consumer

log = logging.getLogger(__name__)

MAX_REQUESTS_IN_PROGRESS = 256
"""Requests of one connection being served at once; the reader waits beyond that."""
OUTBOX_FRAMES = 4096
"""Frames queued for one connection's writer before it counts as stuck."""
HANDSHAKE_TIMEOUT_S = 10.0
LEADERSHIP_CLOSE_GRACE_S = 2.0
"""After a leadership change, how long in-progress requests may finish before closing."""
WRITE_TIMEOUT_S = 30.0
RECEIVE_BYTES = 256 * 1024

_connection_ids = itertools.count(1)


class _Outbox:
    """Bounded queue of encoded frames for one connection's writer."""

    def __init__(self, send: trio.MemorySendChannel[bytes]) -> None:
        self._send = send

    def send_nowait(self, data: bytes) -> bool:
        try:
            self._send.send_nowait(data)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        return True


class Connection:
    """One client connection: its session, outbox and subscriptions."""

    def __init__(self, broker: Broker, stream: trio.abc.Stream) -> None:
        self.id = next(_connection_ids)
        self.broker = broker
        self.stream = stream
        config = broker.config
        self.session = ServerSession(
            config.limits.max_frame_bytes, frames.SUPPORTED_VERSIONS, config.server.auth_token
        )
        self._outbox_send, self._outbox_receive = trio.open_memory_channel[bytes](OUTBOX_FRAMES)
        self.outbox = _Outbox(self._outbox_send)
        self.subscriptions: dict[int, Consumer] = {}
        self._limit = trio.Semaphore(MAX_REQUESTS_IN_PROGRESS)
        self._reading = trio.CancelScope()

    def _queue(self, data: bytes) -> None:
        if not self.outbox.send_nowait(data):
            raise trio.BrokenResourceError("connection outbox is full or closed")

    async def serve(self) -> None:
        """Serve until the client closes, breaks the protocol, or the server stops."""
        try:
            async with trio.open_nursery() as connection:
                connection.start_soon(self._close_on_leadership_change, connection.cancel_scope)
                async with trio.open_nursery() as io:
                    io.start_soon(self._writer)
                    try:
                        # Requests run in their own nursery: at EOF (a client may
                        # half-close) every answer is queued before the outbox closes.
                        async with trio.open_nursery() as requests:
                            with self._reading:
                                await self._reader(requests)
                    finally:
                        self._outbox_send.close()
                connection.cancel_scope.cancel()
        except* (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
            pass
        finally:
            for consumer in list(self.subscriptions.values()):
                self.broker.unsubscribe(consumer)
            self.subscriptions.clear()
            with trio.move_on_after(1, shield=True):
                await self.stream.aclose()

    async def _close_on_leadership_change(self, scope: trio.CancelScope) -> None:
        """Leadership moved: close, so the client reconnects and follows the new leader."""
        await self.broker.wait_leadership_change(self.broker.leader_epoch)
        log.info("connection %d: leadership changed; closing it", self.id)
        # Stop reading; requests in progress (a TRANSFER_LEADER's own OK, NOT_LEADER
        # errors) are answered and the outbox drains as at EOF. Past the grace period,
        # close regardless.
        self._reading.cancel()
        await trio.sleep(LEADERSHIP_CLOSE_GRACE_S)
        scope.cancel()

    async def _writer(self) -> None:
        async with self._outbox_receive:
            async for data in self._outbox_receive:
                chunks = [data]
                while len(chunks) < 64:
                    try:
                        chunks.append(self._outbox_receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                with trio.fail_after(WRITE_TIMEOUT_S):
                    await self.stream.send_all(b"".join(chunks) if len(chunks) > 1 else data)

    async def _reader(self, nursery: trio.Nursery) -> None:
        session = self.session
        with trio.move_on_after(HANDSHAKE_TIMEOUT_S) as handshake:
            while session.state is not SessionState.READY:
                if not await self._pump_one(nursery, handshake=True):
                    return
        if handshake.cancelled_caught:
            log.info("connection %d: no HELLO within %.0f s; closing", self.id, HANDSHAKE_TIMEOUT_S)
            return
        while await self._pump_one(nursery):
            pass

    async def _pump_one(self, nursery: trio.Nursery, *, handshake: bool = False) -> bool:
        """Handle every complete frame, then read more; False when the connection ends.

        With ``handshake``, return right after answering HELLO (without reading), so
        the handshake deadline does not cover the rest of the connection.
        """
        session = self.session
        while True:
            try:
                event = session.next_event()
            except RemoteProtocolError as exc:
                self.broker.metrics.count_request_error(exc.code)
                log.info(
                    "connection %d: protocol error %s: %s", self.id, exc.code.name, exc.message
                )
                self._queue(session.error_bytes(exc))
                return False
            if event is NEED_DATA:
                break
            if event is CLOSED:
                return False
            if isinstance(event, frames.Hello):
                leader = self.broker.log.leader_address()
                self._queue(session.accept_hello(self.broker.node_id, leader, __version__))
                if handshake:
                    return True
                continue
            assert not isinstance(event, type(NEED_DATA))
            await self._limit.acquire()
            nursery.start_soon(self._handle, event)
        data = await self.stream.receive_some(RECEIVE_BYTES)
        session.receive_data(data if type(data) is bytes else bytes(data))
        return True

    async def _handle(self, frame: frames.Frame) -> None:
        try:
            answer = await self._answer(frame)
            if answer is not None:
                try:
                    self._queue(self.session.send(answer))
                except LocalProtocolError as exc:
                    self._queue(
                        self.session.error_bytes(
                            RequestError(ErrorCode.INVALID_ARGUMENT, exc.message), frame.request_id
                        )
                    )
        except (RequestError, RemoteProtocolError) as exc:
            code = exc.code
            self.broker.metrics.count_request_error(code)
            self._queue(self.session.error_bytes(exc, frame.request_id))
            if code.closes_connection:
                self._outbox_send.close()
                raise trio.BrokenResourceError("protocol error") from exc
        except StorageError:
            raise
        finally:
            self._limit.release()

    async def _answer(self, frame: frames.Frame) -> frames.Frame | None:
        broker = self.broker
        match frame:
            case frames.Publish():
                first_id, count = await broker.publish(frame.items, frame.ack_level)
                return frames.PublishOk(frame.request_id, first_id, count)
            case frames.Ack():
                return frames.Ok(frame.request_id, await broker.ack(self.id, frame.tags))
            case frames.Nack():
                done = await broker.nack(self.id, frame.tags, frame.requeue_delay_ms)
                return frames.Ok(frame.request_id, done)
            case frames.Credit():
                try:
                    broker.grant_credit(self.id, frame.subscription_id, frame.credit)
                except RequestError as exc:
                    self._queue(self.session.error_bytes(exc, frame.request_id))
                return None
            case frames.Subscribe():
                consumer = await broker.subscribe(
                    self.id, self.outbox, frame.topic, frame.group, frame.prefetch
                )
                self.subscriptions[consumer.subscription_id] = consumer
                # The answer must precede the first DELIVER, so queue it here, in order.
                self._queue(
                    self.session.send(
                        frames.SubscribeOk(frame.request_id, consumer.subscription_id)
                    )
                )
                broker.announce_settings(consumer)
                return None
            case frames.Extend():
                return frames.Ok(
                    frame.request_id, broker.extend(self.id, frame.tags, frame.visibility_ms)
                )
            case frames.Release():
                return frames.Ok(frame.request_id, await broker.release(self.id, frame.tags))
            case frames.Unsubscribe():
                found = self.subscriptions.pop(frame.subscription_id, None)
                if found is None:
                    raise RequestError(
                        ErrorCode.UNKNOWN_SUBSCRIPTION,
                        f"no subscription {frame.subscription_id} on this connection",
                    )
                broker.unsubscribe(found)
                return frames.Ok(frame.request_id, None)
            case frames.Status():
                return frames.StatusOk(frame.request_id, broker.status())
            case frames.Ping():
                return frames.Pong(frame.request_id)
            case frames.GroupCreate():
                await broker.ensure_group(
                    frame.topic, frame.group, frame.visibility_timeout_ms, frame.max_deliveries
                )
                return frames.Ok(frame.request_id, None)
            case frames.GroupDelete():
                await broker.delete_group(frame.topic, frame.group)
                return frames.Ok(frame.request_id, None)
            case frames.ClusterStatus():
                return frames.ClusterStatusOk(frame.request_id, broker.cluster_status())
            case frames.ClusterAddNode():
                await broker.add_node(frame.node_id, frame.raft_address, frame.client_address)
                return frames.Ok(frame.request_id, None)
            case frames.ClusterRemoveNode():
                await broker.remove_node(frame.node_id)
                return frames.Ok(frame.request_id, None)
            case frames.ClusterTransferLeader():
                await broker.transfer_leadership(frame.node_id)
                return frames.Ok(frame.request_id, None)
        raise RemoteProtocolError(ErrorCode.INVALID_FRAME, f"{frame.TYPE.name} is not a request")


async def serve_clients(
    broker: Broker,
    listeners: list[trio.SocketListener],
    *,
    ssl_context: ssl.SSLContext | None = None,
    handler_nursery: trio.Nursery | None = None,
) -> None:
    """Accept connections on ``listeners`` until cancelled; one task per connection."""
    limit = trio.CapacityLimiter(broker.config.limits.max_connections)

    async def handler(stream: trio.abc.Stream) -> None:
        async with limit:
            if ssl_context is not None:
                stream = trio.SSLStream(stream, ssl_context, server_side=True)
                try:
                    with trio.fail_after(HANDSHAKE_TIMEOUT_S):
                        await stream.do_handshake()
                except (trio.TooSlowError, trio.BrokenResourceError, ssl.SSLError, OSError) as exc:
                    log.info("TLS handshake failed: %s", exc)
                    with trio.move_on_after(1, shield=True):
                        await stream.aclose()
                    return
            broker.metrics.connections_accepted_total.inc()
            broker.metrics.client_connections.inc()
            try:
                await Connection(broker, stream).serve()
            except* StorageError:
                raise  # the node cannot go on without its disk
            except* Exception as group:
                # A bug in one connection's handling must not take the server down.
                log.error("connection handler failed; connection closed", exc_info=group)
            finally:
                broker.metrics.client_connections.dec()

    await trio.serve_listeners(handler, listeners, handler_nursery=handler_nursery)
