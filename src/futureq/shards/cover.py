"""The node's HTTP port while shard 0 is not serving: the supervisor answers on it.

The supervisor of a sharded node binds the node's HTTP port (``server.http``) once, at
start, and hands the listening socket to every incarnation of shard 0 (inherited file
descriptor, :data:`futureq.shards.view.HTTP_FD_ENV`), which serves the whole node's view
on it (:mod:`futureq.shards.view`). While shard 0 serves, only shard 0 accepts on the
socket. While shard 0 is starting, has died, is being restarted, has stopped with
the node, or is alive but silent (stopped or hung: :mod:`futureq.shards.heartbeat`),
the supervisor accepts on the same socket and answers with what it knows,
so the port never refuses connections while the node process runs:

* ``/healthz``: 503 ``unhealthy: shard 0 (ADDRESS): is restarting: it exited with
  code -9 after 12.3 s`` plus one clause per other shard that is not healthy;
* ``/readyz``: 503, the ``/readyz`` shape of :func:`futureq.shards.view.merge_ready`
  (``shards``: every shard's readiness, shard 0's ``reason`` saying why);
* ``/api/status``: 503 with ``error`` naming shard 0 and the other shards' topics,
  counts and per-shard entries (:func:`futureq.shards.view.merge_status`);
* ``/metrics``: 200, the other shards' series with their ``shard`` label and
  ``futureq_node_view_shard_up{shard="0"} 0``;
* ``/api/browse`` of a topic another shard owns: answered by that shard;
* everything else (dashboard, ``/api/overview``, ``?local=true``): 503 with a sentence;
  ``/ws`` is closed (1008).

Tokens are checked as on shard 0 (``server.auth_token``, ``server.credentials_file``,
the node's internal read token); TLS (``tls.http``) is the same certificate.

Source: ``docs/sharding.md``, "One operator view".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from futureq.broker.http import (
    GRACEFUL_TIMEOUT_S,
    HttpApp,
    merged_node_answer,
    merged_node_metrics,
)
from futureq.shards import view as node_view

if TYPE_CHECKING:
    from futureq.broker.access import AccessControl
    from futureq.broker.http import StatusProvider
    from futureq.metrics import Metrics

_TEXT = b"text/plain; charset=utf-8"
_JSON = b"application/json"
_MERGED = ("/healthz", "/readyz", "/api/status", "/metrics")
"""Paths the supervisor still answers for the node, from the other shards."""
GRACE_S = node_view.FETCH_DEADLINE_S + GRACEFUL_TIMEOUT_S
"""How long the requests the supervisor is answering when shard 0 serves again may take
to be answered (s). Its answers ask the other shards, each within
:data:`futureq.shards.view.FETCH_DEADLINE_S`: with a shard stopped or hung, one takes
that long. With the HTTP server's usual 1 s, a probe that came just before shard 0 did
(or on a connection the supervisor had accepted, its request just after) was cut off
without an answer."""


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode("utf-8") + b"\n"


class ShardZeroDownApp(HttpApp):
    """The ASGI application the supervisor serves on the node's HTTP port while shard 0
    does not (see the module doc).

    Args:
        view: Fetches the other shards' endpoints (shard 0's :class:`NodeView`).
        why: Says what shard 0 is doing, after ``shard 0 (ADDRESS)``: ``"is
            restarting: it exited with code -9 after 1.2 s"``.
        access: Token checks, as on shard 0; None or disabled: open endpoints.
        metrics_require_auth: ``metrics.require_auth``.
        internal_token: The node's internal read token (accepted like ``monitor``).
    """

    def __init__(
        self,
        view: node_view.NodeView,
        why: Callable[[], str],
        access: AccessControl | None,
        metrics_require_auth: bool,
        internal_token: str | None,
    ) -> None:
        # The broker's metrics and status seams are only read by HttpApp._answer,
        # which this class replaces, and by /ws, which it does not serve.
        super().__init__(
            cast("Metrics", None),
            cast("StatusProvider", None),
            access,
            metrics_require_auth,
            internal_token=internal_token,
        )
        self._view = view
        self._why = why

    async def _answer(
        self, path: str, query: dict[str, str], query_string: str
    ) -> tuple[int, bytes, bytes]:
        view = self._view
        why = self._why()
        target = path + (f"?{query_string}" if query_string else "")
        topic = query.get("topic")
        if path in node_view.ROUTED and topic and view.owner_of(topic) != 0:
            owner = view.owner_of(topic)
            reply = await view.fetch_one(owner, target)
            if isinstance(reply, node_view.NoAnswer):
                error = f"shard {owner}, which holds topic {topic!r}, {reply.reason}"
                return 503, _json({"error": error}), _JSON
            return reply.status, reply.body, reply.content_type.encode("latin-1")
        if path in _MERGED and query.get("local") != "true":
            others = await view.fetch_others(target)
            replies: list[node_view.Reply] = [
                node_view.NoAnswer(why),
                *(others[shard] for shard in range(1, view.shard_count)),
            ]
            node_answer = merged_node_answer(path, replies, view.addresses)
            if node_answer is not None:
                return node_answer
            metrics = await merged_node_metrics(replies)
            return 200, metrics, b"text/plain; version=0.0.4; charset=utf-8"
        text = (
            f"shard 0 of this node ({view.addresses[0]}) {why}; {path} is served again once "
            "it is (/readyz and /api/status show every shard meanwhile)\n"
        )
        return 503, text.encode(), _TEXT


__all__ = ["GRACE_S", "ShardZeroDownApp"]
