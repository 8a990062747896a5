"""The node's HTTP listener: ``/metrics``, ``/healthz``, ``/readyz``, ``/api/status``, ``/``.

A small ASGI application served by hypercorn on trio. It reads the broker only through
two seams: the broker's :class:`~futureq.metrics.Metrics` and a :class:`StatusProvider`.

Endpoints (all ``GET``; ``HEAD`` too):

=================  ===========================================================
``/metrics``       Prometheus text exposition of every FutureQ metric.
``/healthz``       200 ``ok`` while the process serves; 503 once ``is_healthy()``
                   turns false (storage failure, shutting down).
``/readyz``        200 ``{"ready": true}`` when ``is_ready()``; else 503
                   ``{"ready": false, "reason": ...}``.
``/api/status``    JSON of ``status()`` (shape in :class:`StatusProvider`).
``/api/browse``    JSON of one BROWSE page: ``?topic=T[&group=G][&from_due_ms=][&to_due_ms=]
                   [&cursor=HEX][&limit=N][&preview_bytes=N]`` (read-only; leader only).
``/api/browse/counts`` JSON of one BROWSE_COUNTS: ``?topic=T[&group=G]&bounds_ms=B1,B2
                   [&relative=true]`` (read-only; leader only).
``/api/overview``  JSON of ``overview()``: what the dashboard shows (the map of
                   WATCH_UPDATE, ``docs/protocol.md``).
``/``              The dashboard: a static page (``broker/static/``) that opens ``/ws``
                   and receives WATCH_UPDATE frames; it never polls.
``/static/NAME``   The dashboard's script and style sheet.
``/ws``            WebSocket: FutureQ frames, one per binary message
                   (:mod:`futureq.broker.websocket`, ``docs/protocol.md``).
=================  ===========================================================

A request with a body (any method, a WebSocket upgrade too: :mod:`futureq.broker.http_protocol`)
is answered 405 and closed with its body unread; how
a connection's end frees its slot at once is :mod:`futureq.broker.http_connection`'s.

With a token configured (``server.auth_token`` or ``server.credentials_file``), every
endpoint but ``/healthz`` and ``/readyz`` needs an ``Authorization`` header of a client
with the ``monitor`` permission: ``Bearer <token>``, or HTTP Basic with the token as the
password (so a browser asks for it once and sends it with the dashboard's own requests).
``/metrics`` is protected too unless ``metrics.require_auth`` is false. Missing or wrong
token: 401 with ``WWW-Authenticate``; a token without ``monitor``: 403.

With ``tls.http`` the port serves HTTPS (and ``wss://``) with the client listener's
certificate, and requires client certificates when ``tls.require_client_cert`` does.

Source: DESIGN.md, "Processes and ports"; docs/operations.md, "Health endpoints".
"""

from __future__ import annotations

import base64
import binascii
import functools
import hmac
import json
import logging
import math
import pathlib
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.logging import Logger as HypercornLogger

from futureq.errors import ErrorCode, RemoteProtocolError
from futureq.rate_limited_log import RateLimitedLog
from futureq.wire import codec

from . import http_connection, http_protocol, websocket
from .connection import (
    LINGER_BYTES,
    LINGER_S,
    LingeringTransport,
    close_tls_cleanly,
    half_close_and_drain,
)
from .gateway import accept_retrying, refuse_without_waiting, stop_handshakes, take_backlog
from .overview import campaign_sentence, recovery_sentence

if TYPE_CHECKING:
    from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, Scope

    from futureq.config import TlsConfig
    from futureq.metrics import Metrics
    from futureq.shards.view import NodeView, Reply

    from .access import AccessControl

logger = logging.getLogger(__name__)

DEFAULT_MAX_HTTP_CONNECTIONS = 128
"""``limits.max_http_connections``'s default (see :func:`serve_http`)."""
DEFAULT_HTTP_IDLE_TIMEOUT_MS = 5_000
"""``limits.http_idle_timeout_ms``'s default (hypercorn's own keep-alive default)."""
DEFAULT_SEND_TIMEOUT_MS = 30_000
"""``limits.send_timeout_ms``'s default (see :func:`serve_http`)."""

#: How long a graceful HTTP shutdown (``shutdown_trigger``) waits for open requests (s).
GRACEFUL_TIMEOUT_S = 1.0

_TEXT = b"text/plain; charset=utf-8"
_JSON = b"application/json"
_HTML = b"text/html; charset=utf-8"


class StatusProvider(Protocol):
    """What the HTTP listener asks the broker. Every method is called on the event loop
    and must return quickly without blocking.

    ``status()`` returns a JSON-able dict of this shape (times in ms unless named)::

        {
          "node_id": 1, "role": "leader", "leader_address": "127.0.0.1:7450",
          "server_version": "0.1.0", "applied_index": 42, "uptime_s": 12.5,
          "topics": [
            {"topic": "orders", "groups": [
              {"group": "billing", "pending": 10, "due": 2, "in_flight": 1,
               "consumers": 3, "visibility_timeout_ms": 30000, "max_deliveries": 16}
            ]}
          ]
        }

    ``role`` is ``leader``, ``follower`` or ``candidate``; ``leader_address`` is the
    leader's client address or null while none is known.
    """

    def status(self) -> dict[str, Any]:
        """The node's status, in the shape above."""
        ...

    def overview(self) -> dict[str, Any]:
        """The dashboard's data (``docs/protocol.md``, "WATCH_UPDATE")."""
        ...

    def is_ready(self) -> bool:
        """True when the node serves clients: state loaded and a leader known."""
        ...

    def is_healthy(self) -> bool:
        """True while the process works (false after a storage failure or on shutdown)."""
        ...

    def alarms(self) -> list[str]:
        """Raised alarms (``["NO_SPACE"]`` while the disk is full); empty when all is well."""
        ...


class BrowseProvider(Protocol):
    """What ``/api/browse`` asks the broker (read-only; ``docs/protocol.md``, "BROWSE")."""

    async def browse_json(self, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """``(HTTP status, JSON body)`` of one BROWSE page for the query parameters."""
        ...

    async def browse_counts_json(self, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """``(HTTP status, JSON body)`` of one BROWSE_COUNTS for the query parameters."""
        ...


class _QuietHypercornLogger(HypercornLogger):
    """Hypercorn's logger, with its INFO lines ("Running on ...") demoted to DEBUG:
    we log our own "HTTP listening on" line with the real address."""

    async def info(self, message: str, *args: Any, **kwargs: Any) -> None:
        await self.debug(message, *args, **kwargs)


STATIC_FILES: dict[str, bytes] = {
    "dashboard.html": _HTML,
    "dashboard.js": b"text/javascript; charset=utf-8",
    "msgpack.js": b"text/javascript; charset=utf-8",
    "dashboard.css": b"text/css; charset=utf-8",
}
"""The files of ``broker/static/`` served, with their content types (nothing else is)."""


@functools.cache
def static_file(name: str) -> bytes:
    """A file of ``broker/static/`` (one of :data:`STATIC_FILES`), read once."""
    return (pathlib.Path(__file__).parent / "static" / name).read_bytes()


def dashboard_html() -> bytes:
    """The dashboard page (``broker/static/dashboard.html``)."""
    return static_file("dashboard.html")


class HttpApp:
    """The ASGI application behind :func:`serve_http`.

    Args:
        metrics: Rendered on ``/metrics``.
        provider: Answers ``/healthz``, ``/readyz``, ``/api/status``.
        access: Checks bearer tokens; None (or one with no token configured) leaves
            every endpoint open.
        metrics_require_auth: ``/metrics`` needs a token too (when tokens are configured).
        websocket_handler: Serves ``/ws`` connections (the gateway); None refuses them.
        websocket_origins: Browser origins allowed on ``/ws`` besides the page's own.
        browser: Answers ``/api/browse`` (pending messages, read-only); None: 404.
        node_view: On shard 0 of a sharded node: ``/healthz``, ``/readyz``,
            ``/api/status``, ``/api/overview`` and ``/metrics`` answer for every shard,
            ``/api/browse`` is answered by the topic's shard (:mod:`futureq.shards.view`);
            ``?local=true`` gives this shard's own answer. None: this process only.
        internal_token: The node's internal read token (a shard of a sharded node):
            accepted like a token with the ``monitor`` permission on every endpoint
            but ``/ws``.
        frame_deadline_ms: ``limits.frame_deadline_ms``: a ``/ws`` message not complete
            this long after its first byte closes its WebSocket with ``FRAME_TIMEOUT``
            (:class:`~futureq.broker.websocket.WebSocketStream`); None: no deadline.
    """

    def __init__(
        self,
        metrics: Metrics,
        provider: StatusProvider,
        access: AccessControl | None = None,
        metrics_require_auth: bool = True,
        websocket_handler: websocket.WebSocketHandler | None = None,
        websocket_origins: tuple[str, ...] = (),
        browser: BrowseProvider | None = None,
        node_view: NodeView | None = None,
        internal_token: str | None = None,
        frame_deadline_ms: int | None = None,
    ) -> None:
        self._node_view = node_view
        self._internal_token = internal_token
        self._frame_deadline_ms = frame_deadline_ms
        self._metrics = metrics
        self._provider = provider
        self._access = access
        self._metrics_require_auth = metrics_require_auth
        self._websocket_handler = websocket_handler
        self._websocket_origins = websocket_origins
        self._browser = browser

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        """ASGI entry point: ``lifespan`` and ``http`` scopes."""
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] == "websocket":
            if scope["path"] == websocket.PATH and self._websocket_handler is not None:
                await websocket.serve_websocket(
                    scope,
                    receive,
                    send,
                    self._websocket_handler,
                    allowed_origins=self._websocket_origins,
                    on_refused=self._metrics.count_request_error,
                    token=await self._valid_token(scope.get("headers", [])),
                    frame_deadline_ms=self._frame_deadline_ms,
                )
            else:
                await receive()  # websocket.connect
                await websocket.refuse_upgrade(
                    send,
                    403,
                    f"no WebSocket is served on {websocket.printable(scope['path'])}"
                    + (
                        f": open one on {websocket.PATH}\n"
                        if self._websocket_handler is not None
                        else " (this node serves no WebSocket)\n"
                    ),
                )
            return
        if scope["type"] != "http":
            return
        method = scope["method"]
        if http_protocol.has_body(scope.get("headers", [])):
            # Answered unread and closed (docs/security.md, "The HTTP port"): an unread
            # body must not stay between this request and the next, and hypercorn would
            # wait for ever to hand it to us once we returned.
            await _respond(
                send,
                405,
                b"only GET and HEAD without a request body are served; this connection "
                b"is closed with the body unread\n",
                _TEXT,
                head=method == "HEAD",
                extra=[(b"allow", b"GET, HEAD"), (b"connection", b"close")],
                end_connection=True,
            )
            return
        if method not in ("GET", "HEAD"):
            await _respond(
                send,
                405,
                b"only GET and HEAD are served\n",
                _TEXT,
                head=False,
                extra=[(b"allow", b"GET, HEAD")],
            )
            return
        head = method == "HEAD"
        if scope["path"] == websocket.PATH and self._websocket_handler is not None:
            # RFC 9110 §15.5.22: 426 names the protocol to switch to in Upgrade.
            await _respond(
                send,
                426,
                b"/ws speaks the FutureQ protocol over WebSocket: open it with a WebSocket "
                b"upgrade (Connection: Upgrade, Upgrade: websocket), not a plain GET\n",
                _TEXT,
                head=head,
                extra=[(b"upgrade", b"websocket"), (b"connection", b"Upgrade")],
            )
            return
        client = scope.get("client")
        peer = str(client[0]) if client else None
        refused = await self._refuse(scope["path"], scope.get("headers", []), peer)
        if refused is not None:
            status, body, extra = refused
            await _respond(send, status, body, _TEXT, head=head, extra=extra)
            return
        query_string = scope.get("query_string", b"").decode("latin-1")
        try:
            # Blank values kept: ``bounds_ms=`` is an empty value the answer quotes,
            # not a parameter left out.
            query = dict(urllib.parse.parse_qsl(query_string, keep_blank_values=True))
            status, body, content_type = await self._answer(scope["path"], query, query_string)
        except Exception:
            logger.exception("HTTP %s %s failed", method, scope["path"])
            status, body, content_type = 500, b"internal error; see the server log\n", _TEXT
        await _respond(send, status, body, content_type, head=head)

    async def _answer(
        self, path: str, query: dict[str, str], query_string: str
    ) -> tuple[int, bytes, bytes]:
        """``(status, body, content type)`` of an authorised ``GET path``."""
        view = self._node_view
        if query.get("local") != "true":
            if view is not None:
                return await self._node_answer(view, path, query, query_string)
            return await self._local_answer(path, query)
        # ``?local=true``: this process's own answer, the parameter itself no query
        # field (``/api/browse`` refused it as unknown, though docs/sharding.md says it
        # works on every endpoint).
        return await self._local_answer(path, {k: v for k, v in query.items() if k != "local"})

    async def _local_answer(self, path: str, query: dict[str, str]) -> tuple[int, bytes, bytes]:
        """This process's answer to ``GET path`` (the endpoints of the module doc)."""
        if path == "/metrics":
            # Read the broker on the loop (bounded), format in a thread: thousands
            # of series must not hold the event loop.
            rows = self._metrics.group_rows()
            body, text_type = await trio.to_thread.run_sync(self._metrics.render, rows)
            return 200, body, text_type.encode("ascii")
        if path == "/api/browse" and self._browser is not None:
            status, value = await self._browser.browse_json(query)
            return status, _json(value), _JSON
        if path == "/api/browse/counts" and self._browser is not None:
            status, value = await self._browser.browse_counts_json(query)
            return status, _json(value), _JSON
        if path == "/api/overview":
            local = getattr(self._provider, "local_overview", self._provider.overview)
            return 200, _json(local()), _JSON
        return self._route(path)

    async def _node_answer(
        self, view: NodeView, path: str, query: dict[str, str], query_string: str
    ) -> tuple[int, bytes, bytes]:
        """The answer for every shard of the node (``futureq.shards.view``)."""
        from futureq.shards import view as node_view

        target = path + (f"?{query_string}" if query_string else "")
        if path in node_view.ROUTED and self._browser is not None and query.get("topic"):
            owner = view.owner_of(query["topic"])
            if owner != 0:
                reply = await view.fetch_one(owner, target)
                if isinstance(reply, node_view.NoAnswer):
                    error = f"shard {owner}, which holds topic {query['topic']!r}, {reply.reason}"
                    return 503, _json({"error": error}), _JSON
                return reply.status, reply.body, reply.content_type.encode("latin-1")
        if path not in node_view.AGGREGATED:
            return await self._local_answer(path, query)
        local_task: list[tuple[int, bytes, bytes]] = []
        others: dict[int, node_view.Reply] = {}

        async def local() -> None:
            local_task.append(await self._local_answer(path, query))

        async def rest() -> None:
            others.update(await view.fetch_others(target))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(local)
            nursery.start_soon(rest)
        status, body, content_type = local_task[0]
        replies: list[node_view.Reply] = [
            node_view.Answer(status, body, content_type.decode("latin-1")),
            *(others[shard] for shard in range(1, view.shard_count)),
        ]
        node_answer = merged_node_answer(path, replies, view.addresses)
        if node_answer is not None:
            return node_answer
        if path == "/api/overview":
            return (
                200,
                _json(node_view.merge_overviews(json.loads(body), replies, view.addresses)),
                _JSON,
            )
        return 200, await merged_node_metrics(replies), content_type

    async def _refuse(
        self, path: str, headers: Iterable[tuple[bytes, bytes]], peer: str | None = None
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]]] | None:
        """None when the request may be served; else the 401/403 answer."""
        access = self._access
        if access is None or not access.enabled or path in ("/healthz", "/readyz"):
            return None
        if path == "/metrics" and not self._metrics_require_auth:
            return None
        challenge = [(b"www-authenticate", b'Basic realm="FutureQ", charset="UTF-8"')]
        tokens = _tokens(headers)
        internal = self._internal_token
        if internal is not None and any(
            hmac.compare_digest(token.encode(), internal.encode()) for token in tokens
        ):
            return None
        if not tokens:
            return 401, b"this endpoint needs a token: Authorization: Bearer <token>\n", challenge
        for token in tokens:
            try:
                principal = await access.authenticate(token, peer)
            except RemoteProtocolError as exc:
                if exc.code is ErrorCode.UNAVAILABLE:  # too many token checks at once
                    return 503, f"{exc.message}\n".encode(), [(b"retry-after", b"1")]
                continue
            if principal.permissions.monitor:
                return None
            return (
                403,
                f"client {principal.name!r} lacks the monitor permission\n".encode(),
                [],
            )
        return 401, b"wrong token\n", challenge

    async def _valid_token(self, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
        """The first token of the ``Authorization`` header that authenticates, or None."""
        access = self._access
        if access is None or not access.enabled:
            return None
        for token in _tokens(headers):
            try:
                await access.authenticate(token)
            except RemoteProtocolError:
                continue
            return token
        return None

    def _route(self, path: str) -> tuple[int, bytes, bytes]:
        if path == "/healthz":
            if self._provider.is_healthy():
                return 200, b"ok\n", _TEXT
            return 503, b"unhealthy\n", _TEXT
        if path == "/readyz":
            alarms = self._provider.alarms()
            if self._provider.is_ready() and not alarms:
                return 200, _json({"ready": True}), _JSON
            reason = self._not_ready_reason()
            if alarms:
                reason = (
                    "alarm NO_SPACE: the disk is full; writes are refused until space returns"
                    if "NO_SPACE" in alarms
                    else f"alarms raised: {', '.join(alarms)}"
                )
            return 503, _json({"ready": False, "reason": reason, "alarms": alarms}), _JSON
        if path == "/api/status":
            return 200, _json(self._provider.status()), _JSON
        if path == "/api/overview":
            return 200, _json(self._provider.overview()), _JSON
        if path in ("/", "/index.html"):
            return 200, dashboard_html(), _HTML
        if path.startswith("/static/") and path[len("/static/") :] in STATIC_FILES:
            name = path[len("/static/") :]
            return 200, static_file(name), STATIC_FILES[name]
        return (
            404,
            # Quoted and cut: the path is the client's, and a raw one put its control
            # characters (terminal escapes) and up to 64 KiB into the answer.
            f"no such page: {websocket.printable(path)}; try /metrics, /healthz, /readyz, "
            "/api/status, "
            "/api/overview, /api/browse, / (the dashboard)\n".encode(),
            _TEXT,
        )

    def _not_ready_reason(self) -> str:
        if not self._provider.is_healthy():
            return "the node is not healthy (storage failure or shutting down)"
        try:
            status = self._provider.status()
        except Exception:
            return "the node is starting"
        if status.get("leader_address") is None:
            reason = f"no leader is known yet (this node is {status.get('role', 'starting')})"
        else:
            reason = f"the node is not serving yet (role {status.get('role')})"
        overview = self._overview()
        waiting = overview.get("node", {}).get("recovery_waiting_for")
        if waiting:
            # Waiting for a member that is down or refused, not for a leader that is
            # late (found by a tester).
            reason += f"; {recovery_sentence('it', waiting)}"
        campaign = overview.get("node", {}).get("last_campaign")
        if campaign:
            reason += f"; {campaign_sentence('it', campaign)}"
        clock = overview.get("clock") or {}
        if status.get("leader_address") is None and clock.get("in_bound") is False:
            # Why it does not stand for election itself (it said nothing of it).
            reason += (
                "; this node may not lead: its wall clock is not within the cluster's "
                f"bound (max_clock_offset_ms {clock.get('max_clock_offset_ms')}): fix its "
                "time (NTP)"
            )
        refused = self._refused_links(overview)
        if refused:
            # Peers that answer but refuse this node (another cluster id, secret or
            # shard count) are what to fix, not a leader that is late.
            reason += "; Raft links to peers are refused or misaddressed: " + "; ".join(refused)
        return reason

    def _overview(self) -> dict[str, Any]:
        """The provider's overview, or {} when it cannot build one (still starting)."""
        try:
            overview = self._provider.overview()
        except Exception:
            return {}
        return overview if isinstance(overview, dict) else {}

    @staticmethod
    def _refused_links(overview: dict[str, Any]) -> list[str]:
        """``node N: sentence`` for each member whose Raft link is refused (the
        overview's ``members[].refused``)."""
        members = overview.get("members") or []
        return [
            f"node {member.get('node_id')}: {member['refused']}"
            for member in members
            if isinstance(member, dict) and member.get("refused")
        ]

    @staticmethod
    async def _lifespan(receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return


def _tokens(headers: Iterable[tuple[bytes, bytes]]) -> list[str]:
    """Tokens the request's Authorization header may carry: Bearer, or Basic where the
    token is the password, or ``user:password`` for a client of the credentials file."""
    for name, value in headers:
        if name.lower() != b"authorization":
            continue
        text = value.decode("latin-1").strip()
        kind, _, rest = text.partition(" ")
        rest = rest.strip()
        if kind.lower() == "bearer" and rest:
            return [rest]
        if kind.lower() == "basic" and rest:
            try:
                decoded = base64.b64decode(rest, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                return []
            user, _, password = decoded.partition(":")
            return [password, decoded] if user else [password]
    return []


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode("utf-8") + b"\n"


async def merged_node_metrics(replies: list[Reply]) -> bytes:
    """A sharded node's ``/metrics``: the shards' expositions that answered 200, each
    series labelled with its shard, plus ``futureq_node_view_shard_up`` for every shard
    (a worker thread: the relabelling is CPU work on up to N scrapes)."""
    from futureq.shards import view as node_view  # only sharded nodes load it

    texts = [
        (shard, reply.body.decode("utf-8", "replace"))
        for shard, reply in enumerate(replies)
        if isinstance(reply, node_view.Answer) and reply.status == 200
    ]
    merged, left_out = await trio.to_thread.run_sync(node_view.relabel_metrics, texts)
    return merged + node_view.shard_up_metric(replies, left_out).encode()


def merged_node_answer(
    path: str, replies: list[Reply], addresses: list[str]
) -> tuple[int, bytes, bytes] | None:
    """A sharded node's ``/healthz``, ``/readyz`` or ``/api/status`` answer from every
    shard's reply (index = shard), as ``(status, body, content type)``; None for another
    path. Shared by shard 0 and by the supervisor while shard 0 is down."""
    from futureq.shards import view as node_view  # only sharded nodes load it

    if path == "/healthz":
        status, body = node_view.merge_health(replies, addresses)
        return status, body, _TEXT
    if path == "/readyz":
        status, value = node_view.merge_ready(replies, addresses)
        return status, _json(value), _JSON
    if path == "/api/status":
        status, value = node_view.merge_status(replies, addresses)
        return status, _json(value), _JSON
    return None


async def _respond(
    send: ASGISendCallable,
    status: int,
    body: bytes,
    content_type: bytes,
    *,
    head: bool,
    extra: list[tuple[bytes, bytes]] | None = None,
    end_connection: bool = False,
) -> None:
    """Send one whole answer; ``end_connection``: the connection ends once it is written
    (:meth:`http_connection.ConnectionEnd.end_after_next_send`)."""
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode("ascii")),
        (b"cache-control", b"no-store"),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    connection_end = http_connection.CURRENT.get()
    if end_connection and connection_end is not None:
        connection_end.end_after_next_send()
    await send({"type": "http.response.body", "body": b"" if head else body, "more_body": False})


def _host_port(bind: str) -> str:
    """``http://127.0.0.1:54321`` (hypercorn's form) -> ``127.0.0.1:54321``."""
    return bind.split("://", 1)[-1]


async def serve_http(
    address: str,
    metrics: Metrics,
    provider: StatusProvider,
    *,
    access: AccessControl | None = None,
    metrics_require_auth: bool = True,
    websocket_handler: websocket.WebSocketHandler | None = None,
    websocket_origins: tuple[str, ...] = (),
    max_frame_bytes: int = codec.DEFAULT_MAX_FRAME_BYTES,
    tls: TlsConfig | None = None,
    browser: BrowseProvider | None = None,
    node_view: NodeView | None = None,
    internal_token: str | None = None,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    listen_fd: int | None = None,
    max_connections: int = DEFAULT_MAX_HTTP_CONNECTIONS,
    idle_timeout_ms: int = DEFAULT_HTTP_IDLE_TIMEOUT_MS,
    send_timeout_ms: int = DEFAULT_SEND_TIMEOUT_MS,
    frame_deadline_ms: int | None = None,
    graceful_timeout_s: float = GRACEFUL_TIMEOUT_S,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the HTTP endpoints on ``address`` until cancelled (or ``shutdown_trigger``).

    Start it with ``await nursery.start(serve_http, ...)``: it binds, then reports the
    bound address, so port 0 works.

    Args:
        address: ``HOST:PORT`` to bind (``[v6]:PORT`` for IPv6; port 0 picks a free port).
        metrics: The broker's metrics, rendered on ``/metrics``.
        provider: The broker's status seam.
        access: Token checks (see the module docstring), or None for open endpoints.
        metrics_require_auth: Whether ``/metrics`` needs a token when tokens are set.
        websocket_handler: Serves ``/ws`` (the gateway's ``serve_stream``); None: no ``/ws``.
        websocket_origins: Browser origins allowed on ``/ws`` besides the page's own.
        max_frame_bytes: ``limits.max_frame_bytes``: a ``/ws`` message may hold one frame
            of this body size plus its 4-byte header; larger ones are closed with 1009.
        tls: Serve HTTPS (and ``wss://``) with this certificate and key; client
            certificates are verified against ``ca_file`` (required with
            ``require_client_cert``). None or disabled: plain HTTP.
        browser: Serves ``/api/browse`` (read-only); None leaves it out.
        node_view: Shard 0 of a sharded node: answer for every shard (:class:`HttpApp`).
        internal_token: The node's internal read token (:class:`HttpApp`).
        shutdown_trigger: Optional; when this returns, stop accepting and let open
            requests finish for up to :data:`GRACEFUL_TIMEOUT_S`, then return. Without
            it, cancel the enclosing scope to stop (open requests are cut).
        listen_fd: Serve on this already listening socket (a file descriptor the
            process inherited, shard 0 of a sharded node: its supervisor holds the node's
            HTTP port, :mod:`futureq.shards.supervisor`) instead of binding ``address``;
            the descriptor is owned (closed) by the server from then on.
        max_connections: ``limits.max_http_connections`` (or what the open-file limit
            leaves room for, :mod:`futureq.fd_budget`): connections served at once; one
            more gets ``503`` and is closed at once.
        idle_timeout_ms: ``limits.http_idle_timeout_ms``: a connection without a
            complete request head this long after it opened or after its last answer is
            closed (keep-alive idleness and slowloris alike); also the TLS handshake's
            deadline.
        send_timeout_ms: ``limits.send_timeout_ms``: a write to a client blocked this
            long (it does not read its answer) closes the connection.
        frame_deadline_ms: ``limits.frame_deadline_ms``, for ``/ws`` messages
            (:class:`HttpApp`).
        graceful_timeout_s: How long open requests may take once ``shutdown_trigger``
            returned (s).
        task_status: Receives the bound ``"host:port"`` (``"[::1]:port"`` for IPv6)
            once the socket listens.

    Raises:
        OSError: the address cannot be bound (in use, not local).
    """
    app = HttpApp(
        metrics,
        provider,
        access,
        metrics_require_auth,
        websocket_handler,
        websocket_origins,
        browser=browser,
        node_view=node_view,
        internal_token=internal_token,
        frame_deadline_ms=frame_deadline_ms,
    )
    await serve_app(
        app,
        address,
        max_frame_bytes=max_frame_bytes,
        tls=tls,
        shutdown_trigger=shutdown_trigger,
        listen_fd=listen_fd,
        max_connections=max_connections,
        idle_timeout_ms=idle_timeout_ms,
        send_timeout_ms=send_timeout_ms,
        graceful_timeout_s=graceful_timeout_s,
        task_status=task_status,
    )


async def serve_app(
    app: HttpApp,
    address: str,
    *,
    max_frame_bytes: int = codec.DEFAULT_MAX_FRAME_BYTES,
    tls: TlsConfig | None = None,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    listen_fd: int | None = None,
    max_connections: int = DEFAULT_MAX_HTTP_CONNECTIONS,
    idle_timeout_ms: int = DEFAULT_HTTP_IDLE_TIMEOUT_MS,
    send_timeout_ms: int = DEFAULT_SEND_TIMEOUT_MS,
    announce: bool = True,
    graceful_timeout_s: float = GRACEFUL_TIMEOUT_S,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` with hypercorn on ``address`` (or ``listen_fd``); the arguments are
    :func:`serve_http`'s, ``announce`` False leaves out the "HTTP listening" line
    (a sharded node's supervisor, answering on a port shard 0 announced, logs its own),
    and ``graceful_timeout_s`` is how long requests under way may take to be answered
    once ``shutdown_trigger`` returned (an app whose answers may wait longer for
    something than :data:`GRACEFUL_TIMEOUT_S` gives more)."""
    config = HypercornConfig()
    config.bind = [address if listen_fd is None else f"fd://{listen_fd}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("futureq.broker.http.server")
    config.logger_class = _QuietHypercornLogger
    config.graceful_timeout = graceful_timeout_s
    config.include_server_header = False
    config.keep_alive_timeout = idle_timeout_ms / 1000
    config.ssl_handshake_timeout = idle_timeout_ms / 1000
    # One frame per /ws message: wsproto refuses bigger messages (close 1009) before
    # they are buffered whole; a small app queue keeps the reader waiting on us.
    config.websocket_max_message_size = max_frame_bytes + codec.HEADER_BYTES
    config.max_app_queue_size = 2
    # HTTP/1.1 only by ALPN: over HTTP/2 a browser would open /ws as a stream of the
    # page's connection (RFC 8441), where hypercorn buffers what is sent without bound
    # and the connection's buffer limit and send timeout cannot hold (websocket.py).
    config.alpn_protocols = ["http/1.1"]
    _configure_tls(config, tls)
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(
            functools.partial(
                _serve_capped,
                app,
                config,
                max_connections,
                send_timeout_s=send_timeout_ms / 1000,
                shutdown_trigger=shutdown_trigger,
                shared=listen_fd is not None,
            )
        )
        bound = _host_port(binds[0])
        if announce:
            logger.info(
                "HTTP listening on %s (/metrics, /healthz, /readyz, dashboard; at most %d "
                "connections at once)",
                bound,
                max_connections,
            )
        task_status.started(bound)


def _configure_tls(config: HypercornConfig, tls: TlsConfig | None) -> None:
    if tls is not None and tls.enabled:
        config.certfile = tls.cert_file
        config.keyfile = tls.key_file
        if tls.ca_file is not None:
            config.ca_certs = tls.ca_file
            config.verify_mode = ssl.CERT_REQUIRED if tls.require_client_cert else ssl.CERT_OPTIONAL


def http_ssl_context(tls: TlsConfig | None) -> ssl.SSLContext | None:
    """The server-side TLS context of the HTTP port (as :func:`serve_app` makes it), or
    None for plain HTTP (``tls`` None or disabled).

    Raises:
        OSError, ssl.SSLError: the certificate or key cannot be read.
    """
    config = HypercornConfig()
    config.alpn_protocols = ["http/1.1"]
    _configure_tls(config, tls)
    return config.create_ssl_context()


STOPPING_ANSWER_BODY = b"the node is shutting down; retry later or on another node\n"
STOPPING_ANSWER = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nretry-after: 1\r\nconnection: close\r\n\r\n%s"
    % (len(STOPPING_ANSWER_BODY), STOPPING_ANSWER_BODY)
)
"""The answer of an HTTP connection still queued on the port when the server stops."""
MAX_STOPPING_DRAIN_BYTES = 64 * 1024
"""A connection answered :data:`STOPPING_ANSWER`: what its client sent is read and
dropped, up to this many bytes, until it closes (a close with bytes unread resets)."""


async def refuse_stopping_http(
    stream: trio.SocketStream, ssl_context: ssl.SSLContext | None
) -> None:
    """Answer a connection queued on the HTTP port when the server stops with
    :data:`STOPPING_ANSWER` (503, ``connection: close``; over TLS after the handshake,
    then ``close_notify``), half-close it, read what the client sent until it closes,
    and close it: a clean answer and end, never a reset. At most :data:`REFUSE_GRACE_S`
    (then closed forcefully)."""
    with trio.move_on_after(REFUSE_GRACE_S):
        try:
            if ssl_context is None:
                await stream.send_all(STOPPING_ANSWER)
                await half_close_and_drain(stream, MAX_STOPPING_DRAIN_BYTES, 65536)
            else:
                tls = trio.SSLStream(LingeringTransport(stream), ssl_context, server_side=True)
                await tls.send_all(STOPPING_ANSWER)
                await close_tls_cleanly(tls)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
            pass
    await trio.aclose_forcefully(stream)


HTTP_ADDRESS_SHARE = 4
"""One client address may hold at most 1/HTTP_ADDRESS_SHARE of the HTTP connections, so a
host filling the port cannot shut out the health probes and dashboards of the others."""
MAX_HTTP_REFUSING = 16
"""HTTP connections over the cap being told why at once; beyond, plain HTTP ones are
told without waiting (``gateway.refuse_without_waiting``), HTTPS ones closed without a
word."""
REFUSE_GRACE_S = 1.0
"""How long a refused HTTP connection may take to receive its 503 (s)."""
REFUSE_DRAIN_S = 0.05
"""How long a refused HTTP connection's request is read before closing (s)."""
http_refused_log = RateLimitedLog(logger, about="refused HTTP connections")
http_failed_log = RateLimitedLog(logger, about="failed HTTP connections")
"""Lines about HTTP connections whose handling raised (a client chooses how many)."""


def _describe(failure: BaseException) -> str:
    """``Type: message`` of each error in ``failure`` (a group's, flattened), for one line."""
    if isinstance(failure, BaseExceptionGroup):
        return "; ".join(_describe(error) for error in failure.exceptions)
    return f"{type(failure).__name__}: {failure}"


def _refusal(why: str, limit: str) -> bytes:
    """A whole 503 answer refusing a connection for lack of room; ``limit`` is the
    :data:`websocket.REFUSED_HEADER` value (the body says it is no health answer)."""
    body = f"{why}; retry later (this refusal says nothing about the node's health)\n".encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nretry-after: 1\r\n"
        f"{websocket.REFUSED_HEADER.decode()}: {limit}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


async def _refuse_http(stream: trio.SocketStream, answer: bytes | None) -> None:
    """Answer 503 (plain HTTP) or nothing (HTTPS: no handshake is spent on it), then close;
    the whole refusal takes at most REFUSE_GRACE_S + REFUSE_DRAIN_S + 1 s."""
    try:
        if answer is not None:
            with trio.move_on_after(REFUSE_GRACE_S):
                await stream.send_all(answer)
                await stream.send_eof()
            # Read what the client already sent, so closing does not reset the answer away.
            with trio.move_on_after(REFUSE_DRAIN_S):
                while await stream.receive_some(65536):
                    pass
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    with trio.move_on_after(REFUSE_GRACE_S, shield=True):
        await trio.aclose_forcefully(stream)


async def _serve_capped(
    app: HttpApp,
    config: HypercornConfig,
    max_connections: int,
    *,
    send_timeout_s: float = math.inf,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    shared: bool = False,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Hypercorn's trio worker (``hypercorn.trio.run.worker_serve``) with admission.

    Once ``shutdown_trigger`` returns, the server stops gracefully and ends every
    connection cleanly, never with a reset: the connections still queued on the socket
    are answered :data:`STOPPING_ANSWER` (unless ``shared``: another process holds the
    socket and answers them, a sharded node's supervisor), idle ones are half-closed,
    requests under way are answered within ``config.graceful_timeout``, and each socket
    is drained before it closes (:attr:`http_connection.ConnectionEnd.lingers`).

    At most ``max_connections`` connections are served at once (each holds a file
    descriptor; ``/ws`` ones included), at most a :data:`HTTP_ADDRESS_SHARE`-th of them
    from one client address; one more is answered ``503`` with a sentence and a
    ``futureq-refused`` header (so a probe can tell it from an unhealthy ``/healthz``)
    and closed at once (HTTPS: closed before any TLS handshake), never left waiting
    with a descriptor. WebSockets, which live as long as their clients like, may hold
    at most :func:`websocket.max_websockets` of the connections (:data:`websocket.SLOTS`):
    the rest stays for short requests, so health probes find room. TLS is wrapped per admitted connection, so a refused one costs no
    handshake. Hypercorn's per-connection deadlines apply: ``keep_alive_timeout``
    closes a connection that has no complete request head that long after it opened or
    after its last answer (slowloris); ``ssl_handshake_timeout`` bounds the handshake.
    A connection's slot is given back, and its socket closed, as soon as it ends, however
    it ends (:mod:`futureq.broker.http_connection`).
    """
    from hypercorn.trio.worker_context import WorkerContext
    from hypercorn.typing import ConnectionState
    from hypercorn.utils import repr_socket_addr, wrap_app

    wrapped = wrap_app(app, config.wsgi_max_body_size, "asgi")
    sockets = config.create_sockets()
    ssl_context = config.create_ssl_context()
    listeners: list[trio.SocketListener] = []
    binds: list[str] = []
    for sock in [*sockets.secure_sockets, *sockets.insecure_sockets]:
        sock.listen(config.backlog)
        listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
        scheme = "https" if ssl_context is not None else "http"
        binds.append(f"{scheme}://{repr_socket_addr(sock.family, sock.getsockname())}")
    context = WorkerContext(None)
    admitted = trio.CapacityLimiter(max_connections)
    refusing = trio.CapacityLimiter(MAX_HTTP_REFUSING)
    per_address = max(1, max_connections // HTTP_ADDRESS_SHARE)
    refusal = _refusal(
        f"this node serves {max_connections} HTTP connections at once, its limit "
        "(limits.max_http_connections, or what the open-file limit leaves room for)",
        "http-connections",
    )
    address_refusal = _refusal(
        f"this address holds {per_address} HTTP connections, the most one address may "
        f"(1/{HTTP_ADDRESS_SHARE} of limits.max_http_connections)",
        "http-address",
    )
    websocket_slots = trio.CapacityLimiter(websocket.max_websockets(max_connections))
    by_address: dict[str, int] = {}

    async def refuse(stream: trio.SocketStream, answer: bytes, why: str) -> None:
        http_refused_log.log(logging.WARNING, "HTTP connection refused: %s", why)
        try:
            refusing.acquire_nowait()
        except trio.WouldBlock:
            if ssl_context is None:
                refuse_without_waiting(stream, answer)  # told, not reset
            await trio.aclose_forcefully(stream)
            return
        try:
            await _refuse_http(stream, None if ssl_context is not None else answer)
        finally:
            refusing.release()

    async def handle(stream: trio.SocketStream) -> None:
        try:
            host = str(stream.socket.getpeername()[0])
        except OSError:
            await trio.aclose_forcefully(stream)
            return
        if by_address.get(host, 0) >= per_address:
            await refuse(stream, address_refusal, f"{host} holds {per_address} connections")
            return
        try:
            admitted.acquire_nowait()
        except trio.WouldBlock:
            await refuse(stream, refusal, f"{max_connections} connections are open")
            return
        by_address[host] = by_address.get(host, 0) + 1
        try:
            # Whatever ends the connection cancels this scope (http_connection), so no
            # task of hypercorn's holds the slot past the connection's end.
            connection_end = http_connection.ConnectionEnd(
                answer_after_eof_s=config.keep_alive_timeout, server_stopping=stopping
            )
            with connection_end.cancel_scope:
                # A write hypercorn shields from cancellation ends with the connection.
                async with http_connection.writes_end_with_the_connection(stream, connection_end):
                    ending = http_connection.EndingStream(stream, connection_end, send_timeout_s)
                    served: trio.abc.Stream = ending
                    if ssl_context is not None:
                        # Its close_notify is the peer's EOF too (http_connection).
                        served = http_connection.EndingTLSStream(
                            trio.SSLStream(
                                ending, ssl_context, server_side=True, https_compatible=True
                            ),
                            connection_end,
                        )
                    # This task's context, inherited by hypercorn's tasks and the app's.
                    websocket.TRANSPORT.set(stream)
                    websocket.SLOTS.set(websocket_slots)
                    http_connection.CURRENT.set(connection_end)
                    await http_protocol.ScreeningTCPServer(
                        wrapped,
                        config,
                        context,
                        ConnectionState({}),
                        served,  # type: ignore[arg-type]
                    )
        except* Exception as failure:
            # This task runs in the server's nursery: an error leaving it would cancel
            # the server and stop the node (a WebSocket upgrade with a body did, through
            # h11). Whatever one connection's handling raises ends that connection only;
            # Cancelled (the server stopping) goes on. Bind errors are raised before any
            # connection is served, so they still stop the start.
            http_failed_log.log(
                logging.WARNING,
                "HTTP connection from %s failed and was closed: %s",
                host,
                _describe(failure),
            )
            logger.debug("HTTP connection from %s failed", host, exc_info=failure)
        finally:
            try:
                if stopping.is_set() and stream.socket.fileno() != -1:
                    # Half-closed, not closed (http_connection.ConnectionEnd.lingers):
                    # what the client still sends is read before the close, so the
                    # close is not a reset that could throw the last answer away.
                    with trio.move_on_after(LINGER_S, shield=True):
                        try:
                            await half_close_and_drain(stream, LINGER_BYTES, 65536)
                        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                            pass
                # Hypercorn's own close may have been cancelled half way.
                await trio.aclose_forcefully(stream)
            finally:
                admitted.release()
                left = by_address[host] - 1
                if left:
                    by_address[host] = left
                else:
                    del by_address[host]

    async def accept(listener: trio.SocketListener, handlers: trio.Nursery) -> None:
        async with trio.open_nursery() as refusals, listener:
            # The refusals' own nursery: the handlers' grace period does not cut them.

            async def refuse_queued(stream: trio.SocketStream) -> None:
                refusals.start_soon(refuse_stopping_http, stream, ssl_context)

            with trio.CancelScope() as accepting:
                scopes.append(accepting)
                while True:
                    stream = await accept_retrying(listener, logger, "HTTP accept failed")
                    handlers.start_soon(handle, stream)
            if stopping.is_set() and not shared:
                # Connections still queued get a 503 "shutting down", not a reset when
                # the socket closes. A shared socket (a shard's: the supervisor holds
                # it) stays open: its other holder answers what is queued.
                stop_handshakes(listener.socket)
                await take_backlog(listener, refuse_queued)

    scopes: list[trio.CancelScope] = []
    stopping = trio.Event()
    async with trio.open_nursery() as handlers:
        async with trio.open_nursery() as accepting:
            for listener in listeners:
                accepting.start_soon(accept, listener, handlers)
            task_status.started(binds)
            if shutdown_trigger is None:
                await trio.sleep_forever()
            await shutdown_trigger()
            # From now on a connection's end half-closes and drains before closing.
            stopping.set()
            for scope in scopes:
                scope.cancel()
            # As hypercorn: idle connections close now, open requests get the grace
            # period; meanwhile the queued ones are answered (at most
            # MAX_BACKLOG_DRAIN_S + REFUSE_GRACE_S).
            await context.terminated.set()
            handlers.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
