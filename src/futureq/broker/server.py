"""serve(config): the root nursery of a FutureQ node, its start-up and graceful shutdown.

Start-up: open RocksDB, load the state, replay log entries written but not applied,
start the command log, the dispatcher, the HTTP endpoints and the client listener,
then print one line to stdout, ``READY client=HOST:PORT http=HOST:PORT node_id=N``.

Shutdown on SIGTERM or SIGINT (STYLE.md §3, hypercorn's model): stop accepting
connections, refuse new proposals, let proposals already made finish and their
answers go out, stop the dispatcher, close RocksDB — all within
``server.shutdown_grace_ms``, then cancel what is left.
"""

from __future__ import annotations

import logging
import signal
import ssl
import sys

import trio

from futureq import __version__
from futureq.clock import Clock, SystemClock
from futureq.config import Config, split_host_port
from futureq.errors import StorageError
from futureq.metrics import Metrics
from futureq.state.queue_state import Defaults, QueueState
from futureq.storage.db import Database

from .broker import Broker
from .command_log import SingleNodeLog
from .dispatcher import Dispatcher
from .gateway import serve_clients
from .http import serve_http
from .hub import Hub

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_STORAGE = 3
EXIT_BIND = 4


def make_ssl_context(config: Config) -> ssl.SSLContext | None:
    """The client listener's TLS context, or None when TLS is off."""
    tls = config.tls
    if not tls.enabled:
        return None
    assert tls.cert_file is not None and tls.key_file is not None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.ca_file is not None:
        context.load_verify_locations(tls.ca_file)
    if tls.require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _bound_address(listener: trio.SocketListener) -> str:
    host, port = listener.socket.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def serve(
    config: Config,
    *,
    clock: Clock | None = None,
    shutdown: trio.Event | None = None,
    handle_signals: bool = True,
    task_status: trio.TaskStatus[tuple[str, str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one node until SIGTERM/SIGINT (or ``shutdown`` is set), then stop gracefully.

    Args:
        config: The node's configuration.
        clock: Wall clock (tests may pass a fake one); the system clock by default.
        shutdown: Set it to begin a graceful shutdown (in-process tests).
        handle_signals: Watch SIGTERM and SIGINT (main thread only).
        task_status: Receives ``(client_address, http_address)`` once serving.

    Raises:
        StorageError: RocksDB cannot be opened or fails while running.
        OSError: a listener address cannot be bound.
    """
    clock = clock or SystemClock()
    started_s = clock.monotonic_s()
    metrics = Metrics()
    db = Database(
        config.server.data_dir,
        write_buffer_mb=config.storage.write_buffer_mb,
        block_cache_mb=config.storage.block_cache_mb,
    )
    try:
        state = QueueState(
            db, Defaults(config.queue.visibility_timeout_ms, config.queue.max_deliveries)
        )
        host, port = split_host_port(config.server.listen)
        listeners = await trio.open_tcp_listeners(port, host=host)
        client_address = config.server.advertise or _bound_address(listeners[0])
        hub = Hub()
        command_log = SingleNodeLog(
            db,
            state,
            address=client_address,
            fsync=config.storage.fsync,
            max_batch_items=config.storage.group_commit_max_items,
            metrics=metrics,
            on_applied=lambda: metrics.applied_index.set(state.applied_index),
        )
        replayed = command_log.recover()
        dispatcher = Dispatcher(
            state,
            command_log,
            hub,
            clock,
            config.queue,
            metrics,
            max_deliver_bytes=max(64 * 1024, config.limits.max_frame_bytes // 2),
        )
        state.observer = dispatcher
        broker = Broker(config, state, command_log, hub, dispatcher, clock, metrics)
        metrics.is_leader.set(1)
        metrics.applied_index.set(state.applied_index)
        ssl_context = make_ssl_context(config)
        if shutdown is None:
            shutdown = trio.Event()
        async with trio.open_nursery() as root:
            await root.start(command_log.run)
            await root.start(dispatcher.run)
            root.start_soon(broker.run_background_publisher)
            http_address: str = await root.start(serve_http, config.server.http, metrics, broker)
            if handle_signals:
                root.start_soon(_watch_signals, shutdown, root.cancel_scope)
            async with trio.open_nursery() as connections:
                accepting = trio.CancelScope()

                async def accept() -> None:
                    with accepting:
                        await serve_clients(
                            broker, listeners, ssl_context=ssl_context, handler_nursery=connections
                        )

                connections.start_soon(accept)
                broker.ready = True
                log.info(
                    "node %d serving clients on %s%s, HTTP on %s, data in %s (%d log entries replayed, "
                    "%d groups, started in %.2f s)",
                    config.server.node_id,
                    client_address,
                    " (TLS)" if ssl_context else "",
                    http_address,
                    config.server.data_dir,
                    replayed,
                    len(state.groups),
                    clock.monotonic_s() - started_s,
                )
                print(
                    f"READY client={client_address} http={http_address} node_id={config.server.node_id}",
                    flush=True,
                )
                task_status.started((client_address, http_address))
                await shutdown.wait()
                log.info("shutting down: no new connections, finishing proposals in progress")
                broker.stopping = True
                accepting.cancel()
                command_log.begin_shutdown()
                with trio.move_on_after(config.server.shutdown_grace_ms / 1000) as grace:
                    await command_log.wait_idle()
                    await trio.sleep(0.05)  # let the last answers reach their sockets
                if grace.cancelled_caught:
                    log.warning("shutdown grace period ran out with proposals still in progress")
                connections.cancel_scope.cancel()
            root.cancel_scope.cancel()
    finally:
        db.close()
        log.info("stopped; RocksDB closed")


async def _watch_signals(shutdown: trio.Event, root: trio.CancelScope) -> None:
    """First SIGTERM/SIGINT: graceful shutdown. A second one: stop at once."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            name = signal.Signals(signum).name
            if not shutdown.is_set():
                log.info("received %s: shutting down gracefully (send it again to force)", name)
                shutdown.set()
            else:
                log.warning("received %s again: stopping now", name)
                root.cancel()
                return


def run(config: Config) -> int:
    """Run a node in this process until it is stopped; return the exit code.

    Returns:
        0 after a graceful shutdown, 3 on a storage failure, 4 when a listener cannot
        be bound.
    """
    try:
        trio.run(serve, config)
    except StorageError as exc:
        log.error("storage failure: %s", exc)
        return EXIT_STORAGE
    except OSError as exc:
        log.error("cannot listen: %s", exc)
        print(f"futureq: cannot listen: {exc}", file=sys.stderr)
        return EXIT_BIND
    return EXIT_OK


__all__ = ["run", "serve", "__version__"]
