"""serve(config): the root nursery of a FutureQ node, its start-up and graceful shutdown.

Start-up: open RocksDB, load the state, replay log entries written but not applied,
start the command log, the dispatcher, the HTTP endpoints and the client listener,
then print one line to stdout, ``READY client=HOST:PORT http=HOST:PORT node_id=N``.

Shutdown on SIGTERM or SIGINT (STYLE.md §3, hypercorn's model): refuse new
connections with UNAVAILABLE (the listeners stay open until the end, then what they
still queue is refused too, never reset), refuse new proposals, let proposals already made finish, stop reading
requests and let every answer already owed reach its client (at most
``gateway.SHUTDOWN_DRAIN_S`` for one that does not read), stop the dispatcher, close
RocksDB — all within ``server.shutdown_grace_ms``, then cancel what is left.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import socket
import ssl
import sys
from typing import TYPE_CHECKING, Any

import trio

from futureq import __version__, early_signals, fd_budget
from futureq.clock import Clock, SystemClock
from futureq.config import Config, join_host_port, split_host_port, websocket_origins
from futureq.data_tools import check_data_fits_mode
from futureq.errors import (
    ConfigError,
    DataDirectoryInUseError,
    FutureQError,
    NoSpaceError,
    StorageError,
)
from futureq.metrics import Metrics
from futureq.peer_credentials import peer_mode
from futureq.shards import lifeline
from futureq.shards.heartbeat import heartbeat_fd, send_heartbeats
from futureq.shards.layout import ShardRole
from futureq.shards.view import (
    FETCH_DEADLINE_S,
    NodeView,
    inherited_client_fd,
    inherited_http_fd,
    node_token,
)
from futureq.state.queue_state import QueueState
from futureq.storage.db import Database
from futureq.storage.space import SpaceAlarm

from .access import AccessControl
from .broker import Broker
from .buffers import NodeBuffers
from .cluster_time import ClusterTime, run_standalone_clock
from .command_log import SingleNodeLog
from .data_dir_size import measure_data_dir
from .dispatcher import Dispatcher, deliver_bytes
from .gateway import SHUTDOWN_DRAIN_S, ClientGateway
from .gc_pacing import pace_gc
from .http import GRACEFUL_TIMEOUT_S, serve_http
from .hub import Hub
from .tombstones import compact_tombstones

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from futureq.raft.node import RaftNode
    from futureq.raft.transport import Transport

# A single node runs no Raft: the cluster modules (.cluster, futureq.raft.node and its
# core, transport and message classes, futureq.shards.balance) are imported in the
# clustered branches below, so that a single node's start does not load them.

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_STORAGE = 3
EXIT_BIND = 4
EXIT_CONFIG = 2
EXIT_FORCED = 5
"""A second stop signal, more than ``early_signals.REPEAT_SIGNAL_WINDOW_S`` after the
first, cut the graceful shutdown short (nothing acknowledged is lost: an acknowledgement
follows the synced write)."""


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


def listener_modes(
    config: Config, client_address: str, raft_address: str | None, http_address: str
) -> list[str]:
    """One sentence per listener saying what protects it (logged at every start).

    Source: docs/security.md, "What each port exposes".
    """
    tls = config.tls
    if tls.enabled:
        client = "TLS" + (
            ", client certificates required"
            if tls.require_client_cert
            else ", no client certificates"
        )
    else:
        client = "plaintext (no TLS)"
    token, credentials = config.server.auth_token, config.server.credentials_file
    if token and credentials:
        client += ", auth token and per-client credentials required"
    elif credentials:
        client += ", per-client credentials required"
    else:
        client += ", auth token required" if token else ", no auth token"
    modes = [f"client port {client_address}: {client}"]
    if raft_address is not None:
        modes.append(f"raft port {raft_address}: {peer_mode(config)}")
    http = "HTTPS (same certificate)" if tls.enabled and tls.http else "plain HTTP"
    if token or credentials:
        opened = "/healthz, /readyz" + ("" if config.metrics.require_auth else " and /metrics")
        modes.append(
            f"HTTP port {http_address}: {http}, a token with the monitor permission "
            f"required ({opened} open); /ws takes client connections with the client "
            "port's tokens and permissions"
        )
    else:
        modes.append(
            f"HTTP port {http_address}: {http}, no authentication (metrics, status and the "
            "dashboard are readable by anyone who reaches it); /ws takes client connections "
            "with the client port's rules"
        )
    return modes


def _cannot_listen(
    what: str, address: str, flag: str, exc: OSError, shard: ShardRole | None = None
) -> OSError:
    """An OSError whose message names the address and the flag that sets it.

    For shard ``K`` above 0 of a sharded node, ``address`` is not the one the user gave
    but ``flag``'s port plus ``K`` × ``node.shard_port_stride``: the message says so, so
    a port the user never typed is explained (``docs/sharding.md``, "Ports and data")."""
    reason = exc.strerror or str(exc)
    if shard is not None and shard.index > 0:
        how = (
            f"shard {shard.index}'s port: the port of {flag} plus {shard.index} x "
            f"node.shard_port_stride {shard.port_stride}; change {flag} or "
            "node.shard_port_stride, or free that port"
        )
    else:
        how = f"change it with {flag}"
    return OSError(exc.errno, f"cannot listen for {what} on {address}: {reason} ({how})")


def _bound_address(listener: trio.SocketListener) -> str:
    host, port = listener.socket.getsockname()[:2]
    return join_host_port(host, port)


async def serve(
    config: Config,
    *,
    clock: Clock | None = None,
    shutdown: trio.Event | None = None,
    handle_signals: bool = True,
    shard: ShardRole | None = None,
    task_status: trio.TaskStatus[tuple[str, str]] = trio.TASK_STATUS_IGNORED,
) -> bool:
    """Run one node until SIGTERM/SIGINT (or ``shutdown`` is set), then stop gracefully.

    Returns True when a second stop signal forced the stop (:data:`EXIT_FORCED`).

    Args:
        config: The node's configuration.
        clock: The clock stamps and due times are read from (tests may pass a fake
            one); by default cluster time (:class:`.cluster_time.ClusterTime`) over the
            system clocks.
        shutdown: Set it to begin a graceful shutdown (in-process tests).
        handle_signals: Watch SIGTERM and SIGINT (main thread only).
        shard: In a sharded node, which shard this process is: it then answers HELLO
            with the shard count, SLOT_MAP with the node's map, and refuses topics of
            other shards with WRONG_SHARD (``docs/sharding.md``).
        task_status: Receives ``(client_address, http_address)`` once serving.

    Raises:
        StorageError: RocksDB cannot be opened or fails while running.
        OSError: a listener address cannot be bound.
    """
    system_clock = SystemClock()
    started_s = system_clock.monotonic_s()
    metrics = Metrics(config.metrics.max_topic_series, config.metrics.max_group_series)
    descriptors = fd_budget.budget(
        config.limits.max_connections,
        fd_budget.open_file_limit(),
        config.limits.max_http_connections,
    )
    too_few = descriptors.warning()
    if too_few is not None:
        log.warning("%s", too_few)
    if shard is not None:  # before RocksDB creates it: a missing shard directory
        from futureq.shards.stamp import check_shard_present

        check_shard_present(
            os.path.dirname(config.server.data_dir),
            shard.index,
            clustered=config.cluster.clustered,
        )
    db = await _open_database(config, descriptors.storage_files, handle_signals=handle_signals)
    if db is None:  # stopped while waiting for disk space: nothing was opened
        log.info("stopped gracefully before RocksDB opened; nothing was written")
        return False
    space_alarm = SpaceAlarm(db, metrics)
    try:
        if shard is not None:  # before anything else is written: the right shard's data?
            from futureq.shards.stamp import check_shard_stamp

            check_shard_stamp(
                db,
                os.path.dirname(config.server.data_dir),
                shard.index,
                shard.slot_map.shard_count,
            )
        else:  # a node of one process: not a shard's directory (DATA_DIR/shard-K)?
            from futureq.shards.stamp import check_not_a_shard

            check_not_a_shard(db)
        if handle_signals and _stopped_while_starting("opening RocksDB"):
            return False
        check_data_fits_mode(db, clustered=config.cluster.clustered)
        if config.cluster.clustered:
            from . import cluster

            cluster.finish_interrupted_restore(config, db)
        state = QueueState(db)
        host, port = split_host_port(config.server.listen)
        inherited = inherited_client_fd() if shard is not None else None
        try:
            if inherited is not None:  # bound by the supervisor (docs/sharding.md, "Port 0")
                sock = trio.socket.from_stdlib_socket(socket.socket(fileno=inherited))
                listeners = [trio.SocketListener(sock)]
            else:
                listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            raise _cannot_listen("clients", config.server.listen, "--listen", exc, shard) from exc
        client_address = config.server.advertise or _bound_address(listeners[0])
        hub = Hub()
        clustered = config.cluster.clustered
        command_log: SingleNodeLog | RaftNode
        transport: Transport | None = None
        replayed = 0
        if clustered:
            from . import cluster

            command_log, transport = cluster.build_raft_log(
                config, db, state, client_address, metrics, space_alarm, shard
            )
        else:
            command_log = SingleNodeLog(
                db,
                state,
                address=client_address,
                fsync=config.storage.fsync,
                max_batch_items=config.storage.group_commit_max_items,
                metrics=metrics,
                on_applied=lambda: metrics.applied_index.set(state.applied_index),
                space_alarm=space_alarm,
            )
            replayed = command_log.recover()
        if handle_signals and _stopped_while_starting("loading the state"):
            return False
        cluster_time: ClusterTime | None = None
        if clock is None:
            if not isinstance(command_log, SingleNodeLog):
                cluster_time = ClusterTime(system_clock, command_log.timekeeper.clock)
            else:
                cluster_time = ClusterTime.standalone(
                    system_clock, config.server.node_id, config.cluster.max_clock_offset_ms
                )
            clock = cluster_time
        dispatcher = Dispatcher(
            state,
            command_log,
            hub,
            clock,
            config.queue,
            metrics,
            max_deliver_bytes=deliver_bytes(config.limits.max_frame_bytes),
            active=not clustered,
            dispatch_allowed=(
                None if isinstance(command_log, SingleNodeLog) else command_log.can_dispatch
            ),
            max_deliveries_out=config.limits.max_deliveries_out,
            max_out_per_connection=config.limits.max_prefetch_per_connection,
        )
        state.observer = dispatcher
        broker = Broker(
            config,
            state,
            command_log,
            hub,
            dispatcher,
            clock,
            metrics,
            space_alarm,
            check_can_stamp=None if cluster_time is None else cluster_time.check_can_stamp,
        )
        broker.shard = shard
        broker.client_address = client_address
        metrics.is_leader.set(0 if clustered else 1)
        metrics.applied_index.set(state.applied_index)
        ssl_context = make_ssl_context(config)
        access = AccessControl(config.server.auth_token, config.server.credentials_file)
        node_buffers = NodeBuffers(
            config.limits.max_node_buffer_bytes,
            on_room=broker.wake_all_consumers,
            on_full=metrics.buffer_full_total.labels("node").inc,
        )
        metrics.connection_buffer_bytes.labels("out").set_function(lambda: node_buffers.outbound)
        metrics.connection_buffer_bytes.labels("in").set_function(lambda: node_buffers.inbound)
        metrics.connection_buffer_bytes.labels("requests").set_function(
            lambda: node_buffers.requests
        )
        gateway = ClientGateway(
            broker,
            access=access,
            node_buffers=node_buffers,
            ssl_context=ssl_context,
            max_connections=descriptors.client_connections,
        )
        if shutdown is None:
            shutdown = trio.Event()
        forced = trio.Event()
        join_accepted: trio.Event | None = None
        async with trio.open_nursery() as root:
            root.start_soon(space_alarm.run)
            raft_address = ""
            if not isinstance(command_log, SingleNodeLog):
                from futureq.shards.balance import balance_leadership

                from . import cluster

                assert transport is not None
                await cluster.refuse_if_node_already_runs(config)
                try:
                    raft_address = await root.start(transport.run)
                except OSError as exc:
                    raise _cannot_listen(
                        "Raft peers", config.cluster.raft_listen, "--raft-listen", exc, shard
                    ) from exc
                await root.start(command_log.run)
                root.start_soon(cluster.follow_leadership, command_log, broker)
                root.start_soon(cluster.record_before_clock_handover, command_log, broker)
                root.start_soon(cluster.export_raft_metrics, command_log, transport, metrics)
                root.start_soon(
                    cluster.stop_when_removed, command_log, config.server.node_id, shutdown
                )
                root.start_soon(broker.run_promoter)
                if shard is not None:
                    root.start_soon(
                        balance_leadership, command_log, shard.index, broker.transfer_leadership
                    )
                if config.cluster.join is not None:
                    # Announce the advertised raft address (never the bound wildcard).
                    announced_raft = transport.advertise_address or raft_address
                    join_accepted = trio.Event()
                    root.start_soon(
                        cluster.join_cluster,
                        config,
                        command_log,
                        transport,
                        client_address,
                        announced_raft,
                        join_accepted,
                    )
            else:
                await root.start(command_log.run)
                if cluster_time is not None:
                    root.start_soon(run_standalone_clock, cluster_time, metrics)
            await root.start(dispatcher.run)
            root.start_soon(broker.run_background_publisher)
            root.start_soon(pace_gc, lambda: len(state.groups))
            root.start_soon(compact_tombstones, db)
            root.start_soon(broker.activity.run, clock.wall_ms)
            root.start_soon(broker.due_buckets.run, broker)
            root.start_soon(measure_data_dir, config.server.data_dir, broker.record_data_dir_bytes)
            node_view: NodeView | None = None
            if shard is not None and shard.index == 0 and shard.slot_map.shard_count > 1:
                node_view = NodeView(config, shard, node_token())
                broker.node_view = node_view
                root.start_soon(node_view.run)
            # The HTTP server stops gracefully at the end of the node's stop (below).
            http_stop = trio.Event()
            http_stopped = trio.Event()

            async def serve_http_until_stopped(*args: Any, **kwargs: Any) -> None:
                try:
                    await serve_http(*args, **kwargs)
                finally:
                    http_stopped.set()

            try:
                http_address: str = await root.start(
                    functools.partial(
                        serve_http_until_stopped,
                        config.server.http,
                        metrics,
                        broker,
                        access=access,
                        metrics_require_auth=config.metrics.require_auth,
                        websocket_handler=gateway.serve_stream,
                        websocket_origins=websocket_origins(config),
                        max_frame_bytes=config.limits.max_frame_bytes,
                        tls=config.tls if config.tls.http else None,
                        browser=broker,
                        node_view=node_view,
                        internal_token=node_token() if shard is not None else None,
                        listen_fd=inherited_http_fd() if shard is not None else None,
                        max_connections=descriptors.http_connections,
                        idle_timeout_ms=config.limits.http_idle_timeout_ms,
                        send_timeout_ms=config.limits.send_timeout_ms,
                        frame_deadline_ms=config.limits.frame_deadline_ms,
                        shutdown_trigger=http_stop.wait,
                        # Shard 0's answers may wait that long for another shard.
                        graceful_timeout_s=GRACEFUL_TIMEOUT_S
                        + (FETCH_DEADLINE_S if node_view is not None else 0.0),
                    )
                )
            except BaseException as exc:  # hypercorn reports a bind error inside a group
                found = _first(exc, OSError)
                if isinstance(found, OSError):
                    raise _cannot_listen(
                        "HTTP", config.server.http, "--http", found, shard
                    ) from exc
                raise
            heartbeats = trio.CancelScope()
            if shard is not None:
                # Its supervisor gone (SIGKILLed): stop as on SIGTERM (shards.lifeline).
                token, stop_event = trio.lowlevel.current_trio_token(), shutdown
                lifeline.on_supervisor_gone(lambda: token.run_sync_soon(stop_event.set))
                beat_fd = heartbeat_fd()
                if beat_fd is not None:  # the supervisor tells a hung shard by its silence

                    async def beat(fd: int) -> None:
                        with heartbeats:
                            await send_heartbeats(fd)

                    root.start_soon(beat, beat_fd)
            if handle_signals:
                # Started, not scheduled: the handlers are in place before READY, so a
                # SIGTERM sent as soon as READY is printed shuts down gracefully instead
                # of meeting Python's default action (exit -15 without a word).
                await root.start(_watch_signals, shutdown, root.cancel_scope, forced)
                await root.start(_reload_on_sighup, access)
            if shutdown.is_set():
                # A stop signal came while the node started (remembered, or since the
                # watcher was installed): it never serves and never says READY.
                log.info("stopping before serving: a stop signal came while starting")
                early_signals.note_stopped()
                with trio.move_on_after(config.server.shutdown_grace_ms / 1000):
                    await _stop_proposing(config, command_log)
                root.cancel_scope.cancel()
                return forced.is_set()
            async with trio.open_nursery() as connections:
                connections.start_soon(
                    functools.partial(
                        gateway.serve_tcp,
                        listeners,
                        handler_nursery=connections,
                        shared=inherited is not None,  # the supervisor keeps it too
                    )
                )
                if join_accepted is not None and not join_accepted.is_set():
                    # READY says the node is in: a join the cluster refuses (another
                    # cluster id, a member's id, a secret it does not accept) ends the node
                    # with exit 2 from join_cluster, without READY. (A sharded node's
                    # supervisor still stops a shard not ready within its start deadline.)
                    log.info(
                        "waiting for the cluster at %s to accept node %d before READY",
                        config.cluster.join,
                        config.server.node_id,
                    )
                    await _first_of(join_accepted, shutdown)
                    if not join_accepted.is_set():
                        log.info("stopped before the cluster accepted this node")
                        connections.cancel_scope.cancel()
                        root.cancel_scope.cancel()
                        return False
                broker.ready = True
                log.info(
                    "node %d serving clients on %s%s, HTTP on %s, %s, data in %s (%d log entries "
                    "replayed, %d groups, started in %.2f s)",
                    config.server.node_id,
                    client_address,
                    " (TLS)" if ssl_context else "",
                    http_address,
                    f"raft on {raft_address}" if clustered else "single node",
                    config.server.data_dir,
                    replayed,
                    len(state.groups),
                    system_clock.monotonic_s() - started_s,
                )
                for mode in listener_modes(
                    config, client_address, raft_address if clustered else None, http_address
                ):
                    log.info("%s", mode)
                raft_field = f" raft={raft_address}" if clustered else ""
                if shard is not None:
                    raft_field += f" shard={shard.index}"
                if not _say_ready(
                    f"READY client={client_address} http={http_address}{raft_field} "
                    f"node_id={config.server.node_id}"
                ):
                    shutdown.set()  # nobody reads it: a shard whose supervisor is gone
                task_status.started((client_address, http_address))
                await shutdown.wait()
                if handle_signals:
                    early_signals.note_stopped()  # one the watcher misses: the process exits
                log.info("shutting down: no new connections, finishing proposals in progress")
                broker.stopping = True
                # Connections that arrive now are told so (UNAVAILABLE: retry elsewhere
                # or later); the listeners close once the rest is done.
                gateway.refuse_new()
                grace_s = config.server.shutdown_grace_ms / 1000
                with trio.move_on_after(grace_s) as grace:
                    # First deliveries out (or given back) count: the log learns them
                    # before it stops taking proposals, or the next leader forgets them.
                    await broker.hold_and_record_deliveries()
                    await _stop_proposing(config, command_log)
                    # Every answer the clients are owed goes out before they are cut off.
                    gateway.stop_serving()
                    with trio.move_on_after(SHUTDOWN_DRAIN_S) as drain:
                        await gateway.wait_drained()
                    if drain.cancelled_caught:
                        log.warning(
                            "%d client connections did not take their last answers within "
                            "%g s; closing them",
                            gateway.connections_served,
                            SHUTDOWN_DRAIN_S,
                        )
                if grace.cancelled_caught:
                    log.warning(
                        "shutdown grace period ran out with proposals or answers still in progress"
                    )
                # What is still queued on the listeners is refused, not reset; the HTTP
                # port ends meanwhile (one after the other took too long under a
                # connection storm: a sharded node's supervisor nearly killed shards).
                async with trio.open_nursery() as closing:
                    closing.start_soon(_stop_http, heartbeats, http_stop, http_stopped)
                    await gateway.close_listeners()
                connections.cancel_scope.cancel()
            root.cancel_scope.cancel()
    finally:
        if shard is not None:
            lifeline.on_supervisor_gone(None)
        db.close()
        log.info("stopped; RocksDB closed")
        if handle_signals:
            early_signals.note_stopped()  # a stop signal from now on meets an exiting process
    return forced.is_set()


async def _stop_http(
    heartbeats: trio.CancelScope, http_stop: trio.Event, http_stopped: trio.Event
) -> None:
    """The end of a node's (or a shard's) stop, for its HTTP port: the requests under
    way are answered, and every connection ends cleanly, never with a reset
    (``http._serve_capped``: queued ones get a 503 "shutting down").

    Before, the HTTP server was cancelled with the rest of the process, so a probe it
    was answering (shard 0's answers wait up to ``FETCH_DEADLINE_S`` for the other
    shards) was closed without an answer, and a connection closed with a request unread
    or still queued on the socket got a reset. A shard's heartbeats end first (the
    pipe's end tells the supervisor this shard no longer serves, so it answers on the
    node's HTTP port from now on: shard 0's socket is its too), then the server stops
    accepting and answers what it took, within its grace.
    """
    heartbeats.cancel()
    http_stop.set()
    with trio.move_on_after(GRACEFUL_TIMEOUT_S + FETCH_DEADLINE_S + 1):  # its grace, bounded
        await http_stopped.wait()


def _say_ready(line: str) -> bool:
    """Print the READY line; False when standard output is a pipe whose reader is gone
    (a shard's supervisor, killed while the shard started: ``shards.lifeline`` stops
    it). Before, that ended the shard with ``ERROR Broken pipe``, not gracefully."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        log.warning("cannot say READY: standard output is closed (its reader is gone); stopping")
        # Python flushes stdout again at exit: point it at /dev/null, quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return False
    return True


def _stopped_while_starting(step: str) -> bool:
    """Whether a stop signal came while the node was starting
    (:func:`futureq.early_signals.defer_stop_signals`); if so, logs that the node stops
    after ``step`` without serving."""
    name = early_signals.deferred_stop()
    if name is None:
        return False
    log.info("received %s while %s: stopping before serving", name, step)
    return True


OPEN_RETRY_S = 1.0
"""How often a node that found its disk full at start tries to open RocksDB again (s)."""


async def _first_of(first: trio.Event, second: trio.Event) -> None:
    """Return once ``first`` or ``second`` is set."""
    async with trio.open_nursery() as nursery:

        async def wait(event: trio.Event) -> None:
            await event.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(wait, first)
        nursery.start_soon(wait, second)


async def _open_database(
    config: Config, max_open_files: int, *, handle_signals: bool = True
) -> Database | None:
    """Open RocksDB; on a full disk, wait for space instead of exiting.

    Opening may write (a memtable flush of the log being recovered, a new MANIFEST), so a
    node restarted while its disk is full (a crash, a rescheduled pod) used to stop with
    "storage failure ... No space left on device" (exit 3) and, under a supervisor,
    restart in a loop. It now logs the NO_SPACE alarm once and tries again every
    :data:`OPEN_RETRY_S` until there is room (docs/operations.md, "Full disk").

    While it waits, a SIGTERM or SIGINT (with ``handle_signals``) stops the node
    gracefully: nothing is open yet, so there is nothing to finish.

    Returns:
        The open database, or None when a stop signal came while waiting for space.

    Raises:
        StorageError: any failure other than a full disk.
    """
    waiting_since: float | None = None
    with contextlib.ExitStack() as stack:
        signals: AsyncIterator[int] | None = None
        while True:
            try:
                db = Database(
                    config.server.data_dir,
                    write_buffer_mb=config.storage.write_buffer_mb,
                    block_cache_mb=config.storage.block_cache_mb,
                    max_open_files=max_open_files,
                    strict_wal=not config.cluster.clustered
                    and config.storage.wal_recovery == "strict",  # its only copy
                )
            except NoSpaceError as exc:
                if waiting_since is None:
                    waiting_since = trio.current_time()
                    log.error(
                        "NO_SPACE alarm at start: %s. The node waits for space and tries "
                        "again every %g s (free space or grow the volume; nothing is lost)",
                        exc,
                        OPEN_RETRY_S,
                    )
                    if handle_signals:
                        if _stopped_while_starting("waiting for disk space"):
                            return None
                        # The stop-signal watcher starts only once the node serves;
                        # without this a SIGTERM here ended the process with -15 and no
                        # word, and a SIGINT with a KeyboardInterrupt traceback. What
                        # the receiver restores when it closes: stop signals during the
                        # rest of the start are remembered.
                        early_signals.defer_stop_signals()
                        signals = stack.enter_context(
                            trio.open_signal_receiver(*early_signals.stop_signals())
                        )
                if signals is None:
                    await trio.sleep(OPEN_RETRY_S)
                    continue
                with trio.move_on_after(OPEN_RETRY_S):
                    async for signum in signals:
                        log.info(
                            "received %s while waiting for disk space at start: stopping",
                            signal.Signals(signum).name,
                        )
                        early_signals.note_stop_signal()
                        return None
                continue
            if waiting_since is not None:
                log.warning(
                    "NO_SPACE alarm cleared: RocksDB opened after %.0f s of waiting for space",
                    trio.current_time() - waiting_since,
                )
            if not config.cluster.clustered and config.storage.wal_recovery != "strict":
                log.warning(
                    'storage.wal_recovery = "%s": the write-ahead log was opened ending at '
                    "its first damaged record, if any, and what followed it was dropped; "
                    'set it back to "strict" once the node runs',
                    config.storage.wal_recovery,
                )
            return db


async def _stop_proposing(config: Config, command_log: SingleNodeLog | RaftNode) -> None:
    """The log's part of a graceful shutdown: a Raft leader hands leadership over; a
    single node's log stops taking proposals and finishes those it holds."""
    if not isinstance(command_log, SingleNodeLog):
        await _hand_over_leadership(config, command_log)
    else:
        command_log.begin_shutdown()
        await command_log.wait_idle()


async def _hand_over_leadership(config: Config, node: RaftNode) -> None:
    """Graceful shutdown of a leader: transfer leadership so clients need not wait for
    an election timeout (thesis §3.10)."""
    voters, _ = node.membership()
    if (
        not node.is_leader()
        or not config.cluster.transfer_leadership_on_shutdown
        or len(voters) < 2
    ):
        return
    try:
        new_leader = await node.transfer_leadership(None)
        log.info("leadership handed to node %s before shutting down", new_leader)
    except FutureQError as exc:
        log.warning("could not hand over leadership before shutting down: %s", exc)


async def _watch_signals(
    shutdown: trio.Event,
    root: trio.CancelScope,
    forced: trio.Event,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """First SIGTERM/SIGINT: graceful shutdown. A second one: stop at once, unless it
    came within :data:`futureq.early_signals.REPEAT_SIGNAL_WINDOW_S` of the first (the
    same request delivered twice: logged and ignored; also once the shutdown is done,
    :func:`futureq.early_signals.stand_in_for_stop_signals`).

    Calls ``task_status.started()`` once the handlers are installed."""
    with early_signals.stop_signal_receiver() as signals:
        task_status.started()
        # One that came after the last check of the start (:func:`_stopped_while_starting`).
        if early_signals.deferred_stop() is not None and not shutdown.is_set():
            log.info(
                "received %s while starting: shutting down gracefully",
                early_signals.deferred_stop(),
            )
            shutdown.set()
        async for signum in signals:
            name = signal.Signals(signum).name
            if not shutdown.is_set():
                log.info("received %s: shutting down gracefully (send it again to force)", name)
                early_signals.note_stop_signal()
                shutdown.set()
            elif not early_signals.stop_signal_seen():
                # The shutdown had another cause (removed from the cluster): this is the
                # first stop signal, not a second one asking to force it.
                log.info(
                    "received %s while shutting down: still shutting down gracefully (send "
                    "it again to force)",
                    name,
                )
                early_signals.note_stop_signal()
            elif early_signals.repeats_first_stop():
                log.info(
                    "received %s again within %g s of the first: the same request, still "
                    "shutting down gracefully (send it again later to force)",
                    name,
                    early_signals.REPEAT_SIGNAL_WINDOW_S,
                )
            else:
                log.warning("received %s again: stopping now", name)
                forced.set()
                root.cancel()
                return


async def _reload_on_sighup(
    access: AccessControl, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """SIGHUP: read the credentials file again; connections that lost access close.

    A SIGHUP that arrived while the node was starting (remembered by
    :mod:`futureq.early_signals`) is acted on as soon as this handler is installed.
    Calls ``task_status.started()`` once it is.
    """
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        task_status.started()
        if early_signals.take_deferred_sighup():
            log.info("SIGHUP arrived while the node was starting; acting on it now")
            access.reload()
        async for _ in signals:
            access.reload()


def _first(error: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first ``kind`` exception in ``error`` or, for a group, among its leaves."""
    if isinstance(error, kind):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = _first(inner, kind)
            if found is not None:
                return found
    return None


def run(config: Config, *, shard: ShardRole | None = None) -> int:
    """Run a node (or, with ``shard``, one shard of a node) in this process until it is
    stopped; return the exit code.

    Returns:
        0 after a graceful shutdown, 2 for a configuration the node cannot run with
        (another process already runs this node id or uses this data directory
        included), 3 on a storage failure, 4 when a listener cannot be bound, 5 when a
        second stop signal cut the graceful shutdown short.
    """
    try:
        forced = trio.run(functools.partial(serve, config, shard=shard))
    except BaseException as error:  # sorted below; anything else propagates unchanged
        in_use = _first(error, DataDirectoryInUseError)
        if in_use is not None:
            print(f"futureq: {in_use}", file=sys.stderr)
            return EXIT_CONFIG
        storage = _first(error, StorageError)
        if storage is not None:
            log.error("storage failure: %s", storage)
            print(f"futureq: storage failure: {storage}", file=sys.stderr)
            return EXIT_STORAGE
        bad_config = _first(error, ConfigError)
        if bad_config is not None:
            print(f"futureq: {bad_config}", file=sys.stderr)
            return EXIT_CONFIG
        bind = _first(error, OSError)
        if isinstance(bind, OSError) and not isinstance(error, KeyboardInterrupt):
            log.error("%s", bind.strerror or bind)
            print(f"futureq: {bind.strerror or bind}", file=sys.stderr)
            return EXIT_BIND
        raise
    return EXIT_FORCED if forced else EXIT_OK


__all__ = ["run", "serve", "__version__"]
