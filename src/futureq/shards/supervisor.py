"""The node process of a sharded node: start N shard processes, keep them up, stop them.

``futureq start --shards N`` (N > 1) runs :func:`supervise`: it starts shard ``K`` as
``futureq start <the same arguments> --shard-index K`` (its data, ports and Raft group
derived by :mod:`futureq.shards.layout`), and

* binds the node's HTTP port (``server.http``) before any shard starts and keeps the
  listening socket for its whole life: shard 0 inherits it and serves the node's view
  on it, and the supervisor answers on it whenever shard 0 is not serving (starting,
  dead, restarting, stopped, or alive but silent: :mod:`futureq.shards.heartbeat`;
  :mod:`futureq.shards.cover`), so the port never refuses or hangs;
* with ``server.listen`` or ``server.http`` on port 0 (a node without peers), binds
  every shard's port of that kind first (:func:`fix_os_chosen_ports`: ``P + K * stride``,
  the OS choosing ``P``), runs the shards with those ports fixed and hands each its
  listening sockets, kept for the node's life (a restarted shard gets them again);
* prints its own ``READY client=... http=... node_id=N shards=N`` line only once every
  shard printed its READY line (never half-up); a shard that exits before it is ready
  takes the node down at start, with the shard's exit code;
* stops the node with exit code 2 when a shard exits with 2 (its configuration cannot
  run, e.g. ``--join`` of a cluster of another shard count): no restart;
* restarts a shard that exits later, after a back-off (0.2 s doubling to 5 s), logging
  why; a shard that fails :data:`MAX_FAST_FAILURES` times in a row, each within
  :data:`FAST_FAILURE_S` of its start, takes the node down (exit 1) with a sentence;
* forwards SIGTERM/SIGINT as one SIGTERM to every shard and waits for them for
  ``server.shutdown_grace_ms`` plus :data:`EXTRA_STOP_S`, then SIGKILLs what is left;
  forwards SIGHUP (credentials reload) to every shard that is ready, and to a shard
  still starting once it is (:meth:`Supervisor._forward_sighup`), and reloads the
  credentials it checks on the node's HTTP port itself. A second SIGTERM/SIGINT
  SIGKILLs the shards.

Shards run in their own process group (a terminal's Ctrl-C reaches the supervisor
only, which sends one SIGTERM); a shard whose supervisor dies notices that it was
reparented and shuts down gracefully (:mod:`futureq.shards.lifeline`), so shards are never
left running alone, also when it dies while they start.

Source: ``docs/sharding.md``, "Supervision".
"""

from __future__ import annotations

import fcntl
import functools
import logging
import math
import os
import secrets
import signal
import socket
import ssl
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import attrs
import trio

from futureq.config import Config, join_host_port, split_host_port
from futureq.early_signals import (
    REPEAT_SIGNAL_WINDOW_S,
    block_start_signals_in_child,
    deferred_stop,
    note_stop_signal,
    note_stopped,
    repeats_first_stop,
    stop_signal_receiver,
    stop_signal_seen,
)
from futureq.rate_limited_log import RateLimitedLog
from futureq.shards.heartbeat import HEARTBEAT_FD_ENV, HEARTBEAT_S, SILENT_AFTER_S
from futureq.shards.layout import note_first_start_ready, shard_data_dir
from futureq.shards.lifeline import SUPERVISOR_PID_ENV
from futureq.shards.view import CLIENT_FD_ENV, HTTP_FD_ENV, TOKEN_ENV

if TYPE_CHECKING:
    from futureq.broker.access import AccessControl

log = logging.getLogger(__name__)

START_DEADLINE_S = 300.0
"""Longest a shard may take from its start to its READY line (s); then the node stops."""
FAST_FAILURE_S = 30.0
"""A shard that exits sooner than this after starting counts as a fast failure (s)."""
MAX_FAST_FAILURES = 5
"""Fast failures in a row after which the node stops instead of restarting the shard."""
FIRST_BACKOFF_S = 0.2
MAX_BACKOFF_S = 5.0
EXTRA_STOP_S = 5.0
"""Added to ``server.shutdown_grace_ms`` before stopping shards are SIGKILLed (s)."""
EXIT_SHARD_FAILED = 1
EXIT_CONFIG = 2
"""A shard that exits with this code (``futureq.cli.server_main``'s configuration
error: another cluster's shard count at --join, a removed node...) cannot run as
configured: the node stops with it instead of restarting the shard."""
EXIT_BIND = 4
"""The exit code of a node that cannot bind a port (``futureq.broker.server``'s)."""
EXIT_FORCED = 5
"""A second stop signal cut the graceful stop short (``futureq.broker.server``'s), or a
shard did not stop within the grace period and was killed."""
EXIT_AFTER_EOF_S = 0.2
"""How long the end of a shard's heartbeat pipe is taken for its death (it was killed)
before it is taken for a shard stopping gracefully, which closes it first (s)."""
HEARTBEAT_LINES_PER_MINUTE = 12
"""Lines a minute about shards falling silent and giving signs of life again."""
PREVIOUS_RUN_MARGIN_S = 3.0
"""Added to ``server.shutdown_grace_ms`` + :data:`EXTRA_STOP_S` for the longest wait
for the previous run's shards to stop (:func:`wait_for_previous_shards`): they notice
their supervisor is gone within ``futureq.shards.lifeline.CHECK_S`` (s)."""
PREVIOUS_RUN_POLL_S = 0.1
HTTP_BACKLOG = 100
"""Listen backlog of the node's HTTP socket (hypercorn's default)."""
CLIENT_BACKLOG = socket.SOMAXCONN
"""Listen backlog of a client socket the supervisor binds for a shard (port 0)."""
COVER_STOP_S = 4.0
"""At the node's end, longest the supervisor's answers on the HTTP port may take to end
(their grace, ``futureq.shards.cover.GRACE_S``, and each connection's clean close) (s)."""
BIND_RUN_ATTEMPTS = 200
"""Ports the OS chooses before giving up finding ``P + K * stride`` free for every K."""


def fast_failures_after(fast_failures: int, lived_s: float) -> int:
    """The count of fast failures in a row once a shard that ran ``lived_s`` seconds
    failed: one more if it failed within :data:`FAST_FAILURE_S` of its start, else 0
    (a shard that had run that long starts the count again; counting it as the first
    stopped the node after four fast failures, not five)."""
    return fast_failures + 1 if lived_s < FAST_FAILURE_S else 0


class _Shard:
    def __init__(self, index: int) -> None:
        self.index = index
        self.process: trio.Process | None = None
        self.ready = trio.Event()
        """Set at the shard's first READY line (never cleared)."""
        self.ready_fields: dict[str, str] = {}
        self.exit_code: int | None = None
        """The exit code of the shard's last process, once it exited."""
        self.serving = False
        """True from a READY line of the shard's current process until that process exits."""
        self.state = "is starting"
        """What the shard is doing, after "shard K": "is restarting: it exited ..."
        (:meth:`describe` adds silence)."""
        self.ready_pid: int | None = None
        """The pid of the process that printed the last READY line."""
        self.silent_since: float | None = None
        """Trio time of the current process's last heartbeat while it is silent
        (stopped or hung: :mod:`futureq.shards.heartbeat`), else None."""
        self.reload_due = False
        """A SIGHUP came while the current process was starting: it is sent one once it
        prints READY (:meth:`Supervisor._forward_sighup`)."""
        self._changed = trio.Event()

    def describe(self) -> str:
        """What the shard is doing, after "shard K" (:attr:`state`, or that its
        process gives no sign of life)."""
        if self.silent_since is None or not self.running:
            return self.state
        assert self.process is not None
        silent_s = trio.current_time() - self.silent_since
        return (
            f"is not answering: its process (pid {self.process.pid}) has given no sign of "
            f"life for {silent_s:.1f} s (stopped, or its event loop is blocked)"
        )

    def set_state(self, serving: bool, state: str) -> None:
        self.serving, self.state = serving, state
        self._changed.set()
        self._changed = trio.Event()

    async def wait_serving(self, serving: bool = True) -> None:
        """Return once :attr:`serving` is ``serving``."""
        while self.serving != serving:
            await self._changed.wait()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None


class Supervisor:
    """Keeps a node's shard processes running (see the module doc).

    Args:
        config: The node's configuration (``node.shards > 1``).
        shard_command: The command line of shard ``K`` (``argv`` of ``futureq start``).
        http_socket: The node's listening HTTP socket (:func:`bind_http`): handed to
            shard 0, and served by the supervisor while shard 0 does not
            (:mod:`futureq.shards.cover`). None: shard 0 binds ``server.http`` itself.
        shard_sockets: Listening sockets the supervisor bound for shard ``K`` (port 0,
            :func:`bind_ports`), handed to every incarnation of it:
            ``{K: {"client": sock, "http": sock}}``; a shard or kind not named binds
            its own port (shard 0's HTTP socket is ``http_socket``).
    """

    def __init__(
        self,
        config: Config,
        shard_command: Sequence[str],
        http_socket: socket.socket | None = None,
        shard_sockets: dict[int, dict[str, socket.socket]] | None = None,
    ) -> None:
        self.config = config
        self.http_socket = http_socket
        self.shard_sockets = shard_sockets or {}
        self.command = list(shard_command)
        self.shards = [_Shard(k) for k in range(config.node.shards)]
        self.stopping = False
        self._final = trio.Event()
        """Set once every shard exited: the supervisor's answers on the HTTP port end."""
        self._covers_done = trio.Event()
        self._covers_done.set()  # no answers on the HTTP port yet
        self.exit_code = 0
        self._outer: trio.Nursery | None = None
        self._cover_access: AccessControl | None = None
        """The token checks of the supervisor's answers on the node's HTTP port
        (:meth:`_cover_http`), reloaded on SIGHUP as the shards reload theirs."""
        # A shard stalling over and over (starved of CPU, long pauses) would log two
        # lines a stall: bounded, the rest summed up.
        self._life_log = RateLimitedLog(log, HEARTBEAT_LINES_PER_MINUTE, "shards' signs of life")
        # The node's internal read token: shard 0 reads the other shards' HTTP
        # endpoints with it (docs/sharding.md, "One operator view"). New every start.
        # Each shard stops once this pid is no longer its parent (shards.lifeline).
        self.env = {
            **os.environ,
            TOKEN_ENV: secrets.token_urlsafe(32),
            SUPERVISOR_PID_ENV: str(os.getpid()),
        }

    def _stop(self, code: int, reason: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        note_stopped()  # a stop signal its receiver misses meets an exiting process
        self.exit_code = code
        if code:
            log.error("%s", reason)
            print(f"futureq: {reason}", file=sys.stderr, flush=True)
        else:
            log.info("%s", reason)
        for shard in self.shards:
            if shard.running:
                assert shard.process is not None
                shard.process.send_signal(signal.SIGTERM)
                # A stopped (SIGSTOP) shard acts on the SIGTERM only once continued (as
                # systemd does); before, it was SIGKILLed after the grace period.
                shard.process.send_signal(signal.SIGCONT)
        assert self._outer is not None
        self._outer.start_soon(self._kill_after_grace)

    async def _kill_after_grace(self) -> None:
        await trio.sleep(self.config.server.shutdown_grace_ms / 1000 + EXTRA_STOP_S)
        if self.exit_code == 0 and any(shard.running for shard in self.shards):
            # Not a graceful stop: said as a second signal's is (it said 0 before).
            self.exit_code = EXIT_FORCED
        self._kill_all("did not stop within the shutdown grace period")

    def _kill_all(self, why: str) -> None:
        for shard in self.shards:
            if shard.running:
                assert shard.process is not None
                log.warning("shard %d (pid %d) %s: killing it", shard.index, shard.process.pid, why)
                shard.process.kill()

    async def run(self) -> int:
        """Run until stopped; return the node's exit code (0 after SIGTERM)."""
        try:
            with stop_signal_receiver(signal.SIGHUP) as sigs:
                async with trio.open_nursery() as outer:
                    self._outer = outer
                    stop = deferred_stop()  # one that came before the receiver
                    if stop is not None:
                        self._stop(0, f"received {stop} while starting: stopping the node")
                    outer.start_soon(self._watch_signals, sigs)
                    outer.start_soon(self._announce_when_ready)
                    if self.http_socket is not None:
                        outer.start_soon(self._cover_http, self.http_socket)
                    async with trio.open_nursery() as shards:
                        for shard in self.shards:
                            shards.start_soon(self._keep, shard)
                    # The node's HTTP port: the supervisor's answers there end
                    # gracefully while what is queued is answered "shutting down".
                    self._final.set()
                    await self._refuse_queued()
                    with trio.move_on_after(COVER_STOP_S):
                        await self._covers_done.wait()
                    outer.cancel_scope.cancel()
        finally:
            self._kill_all("outlived its supervisor")  # only on a bug: never leave one behind
            note_stopped()  # a stop signal from now on meets an exiting process
        codes = ", ".join(
            f"{'never started' if s.exit_code is None else s.exit_code} (shard {s.index})"
            for s in self.shards
        )
        log.info(
            "node %d stopped with exit code %d; its shards exited with %s",
            self.config.server.node_id,
            self.exit_code,
            codes,
        )
        return self.exit_code

    async def _refuse_queued(self) -> None:
        """Once every shard exited: tell each connection queued on a socket the
        supervisor holds that the node is shutting down, then close it cleanly: a client
        socket (port 0) answers UNAVAILABLE, an HTTP one (the node's port, and the
        shards' with port 0) 503 "shutting down". Before, they waited on the socket
        while the node stopped and got a reset at its exit, which clients (and scrapers,
        load balancers) reported as an error instead of retrying elsewhere."""
        from futureq.broker.gateway import (
            MAX_BACKLOG_DRAIN_S,
            REFUSE_GRACE_S,
        )
        from futureq.broker.http import http_ssl_context
        from futureq.broker.server import make_ssl_context

        held: list[tuple[socket.socket, str]] = [
            (sock, kind)
            for kinds in self.shard_sockets.values()
            for kind, sock in kinds.items()
            if kind in ("client", "http")
        ]
        if self.http_socket is not None:
            held.append((self.http_socket, "http"))
        if not held:
            return
        contexts: dict[str, ssl.SSLContext | None] = {}
        try:
            contexts["client"] = make_ssl_context(self.config)
            contexts["http"] = http_ssl_context(self.config.tls if self.config.tls.http else None)
        except (OSError, ssl.SSLError) as exc:  # its files changed since the start
            log.warning("cannot answer the queued connections over TLS: %s", exc)
            return
        with trio.move_on_after(MAX_BACKLOG_DRAIN_S + 2 * REFUSE_GRACE_S):
            async with trio.open_nursery() as refusals:
                for sock, kind in held:
                    refusals.start_soon(self._refuse_backlog, sock, kind, contexts[kind])

    async def _refuse_backlog(
        self, sock: socket.socket, kind: str, ssl_context: ssl.SSLContext | None
    ) -> None:
        from futureq.broker.gateway import refuse_stopping, stop_handshakes, take_backlog
        from futureq.broker.http import refuse_stopping_http

        answer = refuse_stopping if kind == "client" else refuse_stopping_http
        async with trio.open_nursery() as refusals:

            async def refuse(stream: trio.SocketStream) -> None:
                refusals.start_soon(answer, stream, ssl_context)

            # A copy: the original is closed with the others when supervise() ends.
            listener = trio.SocketListener(
                trio.socket.from_stdlib_socket(socket.socket(fileno=os.dup(sock.fileno())))
            )
            async with listener:
                stop_handshakes(listener.socket)
                taken = await take_backlog(listener, refuse)
            if taken:
                log.info(
                    "told %d %s connections queued on %s that the node is shutting down",
                    taken,
                    "client" if kind == "client" else "HTTP",
                    join_host_port(*sock.getsockname()[:2]),
                )

    async def _watch_signals(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            if signum == signal.SIGHUP:
                self._forward_sighup()
                continue
            name = signal.Signals(signum).name
            if not self.stopping:
                note_stop_signal()
                self._stop(0, f"received {name}: stopping the {len(self.shards)} shards")
            elif not stop_signal_seen():
                # Stopping for another cause (a shard failed): the first stop signal, not
                # a second one asking to force the stop.
                note_stop_signal()
                log.info("received %s while stopping: still stopping the shards gracefully", name)
            elif repeats_first_stop():
                log.info(
                    "received %s again within %g s of the first: the same request, still "
                    "stopping the shards gracefully (send it again later to force)",
                    name,
                    REPEAT_SIGNAL_WINDOW_S,
                )
            else:
                if self.exit_code == 0 and any(shard.running for shard in self.shards):
                    self.exit_code = EXIT_FORCED
                self._kill_all(f"is still running after a second {name}")

    def _forward_sighup(self) -> None:
        """SIGHUP (credentials reload): reload the credentials the supervisor checks on
        the node's HTTP port while shard 0 does not serve, and send SIGHUP to every shard.

        A shard process that has not printed READY yet gets it once it has: until
        ``futureq start`` has installed its SIGHUP handling, first thing once Python has
        loaded it, the signal's default action ends the process. Before, a reload sent
        while a shard started (``systemctl reload`` right after ``start``) killed it:
        before its first READY that stopped the node, later it cost a restart. (Its READY
        comes after it read the credentials file, so the SIGHUP sent then reloads what
        may have changed since.) The supervisor kept the file it read at start: a client
        added since got 401 from it, and one removed still read the node's status.
        """
        if self._cover_access is not None:
            self._cover_access.reload()
        for shard in self.shards:
            if not shard.running:
                continue  # the next process reads the file when it starts
            assert shard.process is not None
            if shard.ready_pid == shard.process.pid:
                shard.process.send_signal(signal.SIGHUP)
            else:
                shard.reload_due = True

    async def _announce_when_ready(self) -> None:
        with trio.move_on_after(START_DEADLINE_S) as waiting:
            for shard in self.shards:
                await shard.ready.wait()
        if waiting.cancelled_caught:
            late = [s.index for s in self.shards if not s.ready.is_set()]
            self._stop(
                EXIT_SHARD_FAILED,
                f"shards {late} did not get ready within {START_DEADLINE_S:g} s; stopping the node",
            )
            return
        try:
            note_first_start_ready(self.config.server.data_dir)
        except OSError as exc:  # only a wording of a later refusal depends on it
            log.warning("cannot remove the first-start marker in the data directory: %s", exc)
        first = self.shards[0].ready_fields
        extra = f" raft={first['raft']}" if "raft" in first else ""
        log.info(
            "node %d serving with %d shards: %s",
            self.config.server.node_id,
            len(self.shards),
            ", ".join(f"shard {s.index} on {s.ready_fields.get('client')}" for s in self.shards),
        )
        print(
            f"READY client={first.get('client')} http={first.get('http')}{extra} "
            f"node_id={self.config.server.node_id} shards={len(self.shards)}",
            flush=True,
        )

    async def _keep(self, shard: _Shard) -> None:
        """Run shard ``shard`` until the node stops, restarting it when it dies."""
        fast_failures = 0
        backoff_s = FIRST_BACKOFF_S
        while not self.stopping:
            started = trio.current_time()
            was_ready = shard.ready.is_set()
            code: int | None
            try:
                code = await self._run_once(shard)
            except OSError as exc:
                # No process to start (out of descriptors or processes, the interpreter
                # gone): a clear sentence, and the other shards stop gracefully. Before,
                # it ended the supervisor with a traceback, SIGKILLing the others.
                reason = (
                    f"cannot start a process for shard {shard.index}: {exc.strerror or exc} "
                    f"({sys.executable}; check the open-file and process limits)"
                )
                if not shard.ready.is_set():
                    self._stop(EXIT_SHARD_FAILED, f"{reason}; stopping the node")
                    return
                code = None
                log.error("%s", reason)
            if self.stopping:
                return
            lived_s = trio.current_time() - started
            if not shard.ready.is_set() and not was_ready:
                self._stop(
                    code or EXIT_SHARD_FAILED,
                    f"shard {shard.index} exited with code {code} before it was ready "
                    f"(its log is above); stopping the node",
                )
                return
            if code == EXIT_CONFIG:
                self._stop(
                    EXIT_CONFIG,
                    f"shard {shard.index} refused its configuration (exit code {code}; its log "
                    "above says why); stopping the node: a restart would be refused again",
                )
                return
            fast_failures = fast_failures_after(fast_failures, lived_s)
            if fast_failures == 0:
                backoff_s = FIRST_BACKOFF_S
            if fast_failures >= MAX_FAST_FAILURES:
                self._stop(
                    EXIT_SHARD_FAILED,
                    f"shard {shard.index} failed {fast_failures} times in a row, each within "
                    f"{FAST_FAILURE_S:g} s of its start (last exit code {code}); stopping the "
                    "node rather than leaving it half up",
                )
                return
            log.warning(
                "shard %d exited with code %s after %.1f s; restarting it in %.1f s (%s)",
                shard.index,
                code,
                lived_s,
                backoff_s,
                f"fast failure {fast_failures} of {MAX_FAST_FAILURES} in a row"
                if fast_failures
                else f"it had run {FAST_FAILURE_S:g} s or more: not counted as a fast failure",
            )
            await trio.sleep(backoff_s)
            backoff_s = min(MAX_BACKOFF_S, backoff_s * 2)

    async def _run_once(self, shard: _Shard) -> int:
        command = [*self.command, "--shard-index", str(shard.index)]
        env: dict[str, str] = dict(self.env)
        handed = dict(self.shard_sockets.get(shard.index, {}))
        if shard.index == 0 and self.http_socket is not None:
            handed["http"] = self.http_socket
        for kind, name in (("client", CLIENT_FD_ENV), ("http", HTTP_FD_ENV)):
            if kind in handed:
                env[name] = str(handed[kind].fileno())
        pass_fds = tuple(sock.fileno() for sock in handed.values())
        beat_read, beat_write = os.pipe()
        env[HEARTBEAT_FD_ENV] = str(beat_write)
        try:
            process = await trio.lowlevel.open_process(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                process_group=0,
                env=env,
                pass_fds=(*pass_fds, beat_write),
                # A SIGTERM forwarded while its interpreter starts waits, pending, for
                # its handler (early_signals.defer_from_the_start): before, a stop
                # right after the start found the shards there and they died of it
                # (-15).
                preexec_fn=block_start_signals_in_child,
            )
        except BaseException:
            os.close(beat_read)
            raise
        finally:
            os.close(beat_write)
        shard.process = process
        shard.silent_since = None
        shard.reload_due = False  # this process reads the credentials file as it starts
        started = trio.current_time()
        shard.set_state(False, f"is starting (pid {process.pid})")
        log.info("shard %d started (pid %d)", shard.index, process.pid)
        if self.stopping:  # the stop began while it was being spawned
            process.send_signal(signal.SIGTERM)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_stdout, shard, process)
            watching = trio.CancelScope()
            nursery.start_soon(self._watch_heartbeats, shard, process, beat_read, watching)
            code = await process.wait()
            watching.cancel()
        shard.silent_since = None
        shard.exit_code = code
        lived_s = trio.current_time() - started
        shard.set_state(
            False,
            "is stopped: the node is shutting down"
            if self.stopping
            else f"is restarting: it exited with code {code} after {lived_s:.1f} s",
        )
        return code

    async def _cover_http(self, http_socket: socket.socket) -> None:
        """Serve the node's HTTP port whenever shard 0 does not (module doc)."""
        from futureq.broker.access import AccessControl
        from futureq.broker.http import serve_app
        from futureq.shards.cover import GRACE_S as COVER_GRACE_S
        from futureq.shards.cover import ShardZeroDownApp
        from futureq.shards.layout import shard_config, shard_role
        from futureq.shards.view import NodeView

        config = shard_config(self.config, 0)
        token = self.env[TOKEN_ENV]
        view = NodeView(config, shard_role(self.config, 0), token)
        shard0 = self.shards[0]
        self._cover_access = AccessControl(config.server.auth_token, config.server.credentials_file)
        app = ShardZeroDownApp(
            view, shard0.describe, self._cover_access, config.metrics.require_auth, token
        )
        tls = config.tls if config.tls.http else None
        serve = functools.partial(
            serve_app,
            app,
            config.server.http,
            max_frame_bytes=config.limits.max_frame_bytes,
            tls=tls,
            max_connections=config.limits.max_http_connections,
            idle_timeout_ms=config.limits.http_idle_timeout_ms,
            send_timeout_ms=config.limits.send_timeout_ms,
            announce=False,  # the line below says it; shard 0 announced the port
            graceful_timeout_s=COVER_GRACE_S,
        )
        final = self._final

        async def until_served_or_final() -> None:
            await _first_of(functools.partial(shard0.wait_serving, True), final.wait)

        serve = functools.partial(serve, shutdown_trigger=until_served_or_final)
        self._covers_done = trio.Event()
        try:
            async with trio.open_nursery() as covers:
                while not final.is_set():
                    await _first_of(functools.partial(shard0.wait_serving, False), final.wait)
                    if final.is_set() or self.stopping:
                        # Stopping, shard 0 gone: what queues on the port now is answered
                        # 503 "shutting down" once every shard exited (_refuse_queued). A
                        # cover started now took queued connections and closed them
                        # unread at the node's end (a clean end, no answer).
                        break
                    log.info(
                        "shard 0 %s: the supervisor answers on the node's HTTP port",
                        shard0.describe(),
                    )
                    # hypercorn owns (and closes) the socket object it serves: give it a
                    # copy. Each time its own server: the one before may still be
                    # answering the requests it took (for up to COVER_GRACE_S) while this
                    # one accepts, so a shard 0 silent again at once never leaves the
                    # port unserved. At the node's end it stops gracefully too (its
                    # connections end cleanly, _refuse_queued answers what is queued).
                    try:
                        copy = os.dup(http_socket.fileno())
                    except OSError as exc:  # out of descriptors: the queue waits
                        log.error("cannot answer on the node's HTTP port: %s", exc)
                    else:
                        covers.start_soon(functools.partial(serve, listen_fd=copy))
                    await until_served_or_final()
        finally:
            self._covers_done.set()

    async def _watch_heartbeats(
        self, shard: _Shard, process: trio.Process, fd: int, scope: trio.CancelScope
    ) -> None:
        """Tell when the shard's process stops giving signs of life and when it gives
        them again (:mod:`futureq.shards.heartbeat`): logged; shard 0 silent is not
        serving, so the supervisor answers on the node's HTTP port meanwhile."""
        with scope:
            async with trio.lowlevel.FdStream(fd) as stream:
                heard_at = math.inf  # nothing is awaited before the shard's first byte
                while True:
                    data: bytes | None = None
                    with trio.move_on_after(
                        max(heard_at + SILENT_AFTER_S - trio.current_time(), 0)
                    ):
                        data = await stream.receive_some(4096)
                    if data is None:
                        # Timed out; a byte may still be waiting (this loop, not the shard,
                        # may have been late): only an empty pipe is silence.
                        data = _read_waiting(stream.fileno())
                    if data == b"":
                        # The process closed it: it is exiting, its HTTP server stopping
                        # (futureq.broker.server._stop_http). Shard 0's port is answered
                        # here from now on rather than once the process has exited: new
                        # connections would wait for it meanwhile.
                        # A killed process closes it as it dies: then its exit, seen
                        # at once, says what happened.
                        with trio.move_on_after(EXIT_AFTER_EOF_S):
                            await process.wait()
                        if shard.serving and shard.running:
                            shard.set_state(
                                False,
                                f"is stopping: its process (pid {process.pid}) is shutting down",
                            )
                        return
                    if data is not None:
                        heard_at = trio.current_time()
                        if shard.silent_since is not None:
                            self._note_alive(shard, process)
                        continue
                    if trio.current_time() - (heard_at + SILENT_AFTER_S) > HEARTBEAT_S:
                        # This loop woke well after its deadline: the supervisor itself
                        # was stopped or starved (a whole node paused), not only the shard,
                        # which gets a whole window from now.
                        heard_at = trio.current_time()
                        continue
                    if shard.silent_since is None and not self.stopping:
                        self._note_silent(shard, process, heard_at)
                    heard_at = math.inf  # wait for the next byte, however long

    def _note_silent(self, shard: _Shard, process: trio.Process, last_s: float) -> None:
        shard.silent_since = last_s
        self._life_log.log(
            logging.WARNING,
            "shard %d (pid %d) has given no sign of life for %g s: it is stopped (SIGSTOP) "
            "or its event loop is blocked; it is not restarted while its process lives%s",
            shard.index,
            process.pid,
            SILENT_AFTER_S,
            "; the supervisor answers on the node's HTTP port meanwhile"
            if shard.index == 0 and self.http_socket is not None
            else "",
        )
        if shard.serving:
            shard.set_state(False, shard.state)

    def _note_alive(self, shard: _Shard, process: trio.Process) -> None:
        assert shard.silent_since is not None
        self._life_log.log(
            logging.WARNING,
            "shard %d (pid %d) gives signs of life again after %.1f s of silence",
            shard.index,
            process.pid,
            trio.current_time() - shard.silent_since,
        )
        shard.silent_since = None
        if self.stopping:  # continued by the stop (SIGTERM + SIGCONT): not serving again
            shard.set_state(False, "is stopping: the node is shutting down")
        elif shard.ready_pid == process.pid and not shard.serving:
            shard.set_state(True, f"is serving (pid {process.pid})")

    async def _read_stdout(self, shard: _Shard, process: trio.Process) -> None:
        """Catch the shard's READY line; pass every other line on to our stdout."""
        assert process.stdout is not None
        pending = b""
        async with process.stdout:
            while True:
                chunk = await process.stdout.receive_some(65536)
                if not chunk:
                    return
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    line = raw.decode("utf-8", "replace")
                    if line.startswith("READY "):
                        fields = dict(p.split("=", 1) for p in line.split()[1:] if "=" in p)
                        if shard.ready.is_set():
                            log.info("shard %d is serving again (pid %d)", shard.index, process.pid)
                        shard.ready_fields = fields
                        shard.ready_pid = process.pid
                        shard.ready.set()
                        shard.set_state(True, f"is serving (pid {process.pid})")
                        if shard.reload_due:  # its SIGHUP handling is in place now
                            shard.reload_due = False
                            process.send_signal(signal.SIGHUP)
                    else:
                        print(line, flush=True)


async def _first_of(*waits: Callable[[], Awaitable[object]]) -> None:
    """Return once the first of ``waits`` returned (the others are cancelled)."""
    async with trio.open_nursery() as racing:
        for wait in waits:

            async def run(wait: Callable[[], Awaitable[object]] = wait) -> None:
                await wait()
                racing.cancel_scope.cancel()

            racing.start_soon(run)


def _read_waiting(fd: int) -> bytes | None:
    """What a non-blocking pipe holds now: bytes, ``b""`` at its end, None if empty."""
    try:
        return os.read(fd, 4096)
    except BlockingIOError:
        return None


def bind_http(address: str, backlog: int = HTTP_BACKLOG) -> socket.socket:
    """A socket listening on ``address`` (``HOST:PORT``, ``[v6]:PORT``), bound as
    hypercorn and trio bind theirs (``SO_REUSEADDR``; IPv6 when the host has a colon).

    Raises:
        OSError: the address cannot be bound (in use, not local).
    """
    host, port = split_host_port(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except (OSError, OverflowError):
        sock.close()
        raise
    return sock


def bind_ports(address: str, shards: int, stride: int, backlog: int) -> list[socket.socket]:
    """Listening sockets on ``HOST:P + K * stride`` for every shard ``K``, where ``address``
    is ``HOST:0``: the OS chooses ``P`` (shard 0's), and the others are bound at once;
    when one of them is taken, all are closed and the OS chooses again. Bound here and
    kept for the node's life, they are handed to the shards, so no other process can
    take a port between its choice and its shard's start (the kernel gives free ports
    to outgoing connections too).

    Raises:
        OSError: no such run of free ports after :data:`BIND_RUN_ATTEMPTS` choices, or
            ``HOST`` cannot be bound at all.
    """
    host, _ = split_host_port(address)
    for _ in range(BIND_RUN_ATTEMPTS):
        first = bind_http(join_host_port(host, 0), backlog)
        base = first.getsockname()[1]
        run = [first]
        try:
            for shard in range(1, shards):
                run.append(bind_http(join_host_port(host, base + shard * stride), backlog))
        except (OSError, OverflowError):
            for sock in run:
                sock.close()
            continue
        return run
    raise OSError(
        f"found no {shards} free ports {stride} apart on {host} in {BIND_RUN_ATTEMPTS} tries"
    )


def fix_os_chosen_ports(
    config: Config, shard_command: Sequence[str]
) -> tuple[Config, list[str], dict[int, dict[str, socket.socket]]]:
    """Bind every shard's client and HTTP ports of a node whose ``server.listen`` or
    ``server.http`` names port 0 (``docs/sharding.md``, "Port 0"), and fix the
    configuration and the shards' command line to the ports chosen (``P + K * stride``
    for shard ``K``), so that the slot map, the node view and clients find each shard as
    with fixed ports. A node with peers needs fixed ports (refused when loading).

    Returns:
        ``(config, shard_command, {K: {"client": sock, "http": sock}})``; unchanged and
        ``{}`` when no port is 0.

    Raises:
        OSError: the ports cannot be bound (:func:`bind_ports`).
    """
    shards, stride = config.node.shards, config.node.shard_port_stride
    sockets: dict[int, dict[str, socket.socket]] = {k: {} for k in range(shards)}
    server, command = config.server, list(shard_command)
    try:
        for kind, flag, backlog in (
            ("client", "--listen", CLIENT_BACKLOG),
            ("http", "--http", HTTP_BACKLOG),
        ):
            address = server.listen if kind == "client" else server.http
            host, port = split_host_port(address)
            if port != 0:
                continue
            run = bind_ports(address, shards, stride, backlog)
            for shard, sock in enumerate(run):
                sockets[shard][kind] = sock
            fixed = join_host_port(host, run[0].getsockname()[1])
            if kind == "client":
                server = attrs.evolve(server, listen=fixed)
            else:
                server = attrs.evolve(server, http=fixed)
            command += [flag, fixed]  # the last flag wins: every shard uses the fixed port
    except BaseException:
        for held in sockets.values():
            for sock in held.values():
                sock.close()
        raise
    return attrs.evolve(config, server=server), command, {k: v for k, v in sockets.items() if v}


_FLOCK = "hhqqi"
"""``struct flock`` (Linux, 64-bit ``off_t``): type, whence, start, len, pid."""


def lock_holder(path: str) -> int | None:
    """The PID of the process holding the POSIX lock RocksDB takes on its ``LOCK`` file
    at ``path`` (``fcntl(F_GETLK)``: asks without taking it), or None when no process
    holds it or it cannot be asked (no such file)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        query += bytes(32 - len(query))  # the C struct's tail padding
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
    except OSError:
        return None
    finally:
        os.close(fd)
    kind, _, _, _, pid = struct.unpack_from(_FLOCK, answer)
    return pid if kind != fcntl.F_UNLCK and pid > 0 else None


def _exited(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # reparented to an init that is slow to reap: exited all the same
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _orphaned(pid: int) -> bool:
    """True unless ``pid``'s parent is a running futureq process: a shard whose
    supervisor was killed is reparented (to init, or a subreaper), while a running
    node's shards keep their supervisor. Without ``/proc`` it cannot be told: True."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        if parent <= 1:
            return True
        with open(f"/proc/{parent}/cmdline", "rb") as cmdline:
            return b"futureq" not in cmdline.read()
    except (OSError, IndexError, ValueError):
        return True


def previous_shards(config: Config) -> dict[int, int]:
    """``{K: pid}`` of the processes still holding shard ``K``'s RocksDB of this data
    directory: the previous run's shards (its supervisor killed, they stop themselves,
    holding the node's ports until they exit), or another node on this directory."""
    holders: dict[int, int] = {}
    for shard in range(config.node.shards):
        path = os.path.join(shard_data_dir(config.server.data_dir, shard), "LOCK")
        pid = lock_holder(path)
        if pid is not None and pid != os.getpid():
            holders[shard] = pid
    return holders


def wait_for_previous_shards(config: Config) -> str | None:
    """Wait while the previous run's shards of this data directory still run.

    A supervisor that was SIGKILLed leaves its shards to notice and stop gracefully;
    until they exit, shard 0 holds the node's HTTP socket and every shard its ports and
    RocksDB, so a start right after (a process manager with a short restart delay)
    failed with "Address already in use". The sign is precise: a shard's RocksDB
    ``LOCK`` is held (:func:`lock_holder`) by a process whose supervisor is gone
    (:func:`_orphaned`); shards whose supervisor runs are another node, refused at once,
    and a port held by any other process is no reason to wait. The wait is bounded by their stop (``server.shutdown_grace_ms`` +
    :data:`EXTRA_STOP_S` + :data:`PREVIOUS_RUN_MARGIN_S`).

    Returns:
        None once none runs (at once, usually); else the sentence to stop with.
    """
    holders = previous_shards(config)
    if not holders:
        return None
    running = {k: pid for k, pid in holders.items() if not _orphaned(pid)}
    if running:
        named = ", ".join(f"shard {k} pid {pid}" for k, pid in running.items())
        return (
            f"another node is running on {config.server.data_dir} (its shards {named} "
            "hold the data, their supervisor alive); stop it first, or give this node "
            "its own --data-dir"
        )
    limit_s = config.server.shutdown_grace_ms / 1000 + EXTRA_STOP_S + PREVIOUS_RUN_MARGIN_S
    named = ", ".join(f"shard {k} pid {pid}" for k, pid in holders.items())
    log.warning(
        "the previous run's shard processes of %s are still running (%s: they hold the "
        "shards' RocksDB; stopping after their supervisor was killed, most likely): "
        "waiting up to %g s for them to exit before starting",
        config.server.data_dir,
        named,
        limit_s,
    )
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        time.sleep(PREVIOUS_RUN_POLL_S)
        if deferred_stop() is not None:
            return None  # asked to stop meanwhile: the supervisor stops at once
        if all(_exited(pid) for pid in holders.values()) and not previous_shards(config):
            log.info("the previous run's shard processes exited: starting")
            return None
    still = previous_shards(config)
    if not still:
        return None
    named = ", ".join(f"shard {k} pid {pid}" for k, pid in still.items())
    return (
        f"the shards of {config.server.data_dir} are still held by other processes "
        f"({named}) after {limit_s:g} s: another node is running on this data directory; "
        "stop it (or wait for it to stop), then start again"
    )


def supervise(config: Config, shard_command: Sequence[str]) -> int:
    """Run a sharded node's supervisor until it stops; return its exit code
    (:data:`EXIT_BIND` when the node's ports cannot be bound, :data:`EXIT_SHARD_FAILED`
    when another node still runs on its data directory)."""
    busy = wait_for_previous_shards(config)
    if busy is not None:
        print(f"futureq: {busy}", file=sys.stderr)
        return EXIT_SHARD_FAILED
    try:
        config, shard_command, shard_sockets = fix_os_chosen_ports(config, shard_command)
    except OSError as exc:
        print(
            f"futureq: cannot bind the shards' ports: {exc.strerror or exc} (give fixed "
            "ports with --listen and --http)",
            file=sys.stderr,
        )
        return EXIT_BIND
    http_socket = shard_sockets.get(0, {}).pop("http", None)
    try:
        if http_socket is None:
            try:
                http_socket = bind_http(config.server.http)
            except OSError as exc:
                print(
                    f"futureq: cannot listen for HTTP on {config.server.http}: "
                    f"{exc.strerror or exc} (change it with --http)",
                    file=sys.stderr,
                )
                return EXIT_BIND
        return trio.run(Supervisor(config, shard_command, http_socket, shard_sockets).run)
    finally:
        if http_socket is not None:
            http_socket.close()
        for held in shard_sockets.values():
            for sock in held.values():
                sock.close()
