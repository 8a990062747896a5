"""One operator view of a sharded node: shard 0's HTTP port answers for every shard.

In a node started with ``--shards N`` (N > 1), shard ``K``'s HTTP endpoints describe
shard ``K`` only (its port is the node's HTTP port plus ``K * node.shard_port_stride``).
Shard 0's port is the node's public HTTP port, so shard 0 aggregates: for ``/healthz``,
``/readyz``, ``/api/status``, ``/api/overview`` and ``/metrics`` it computes its own
answer, asks every other shard's HTTP port for the same path (real HTTP/1.1 with
``h11`` over trio, each fetch within :data:`FETCH_DEADLINE_S`), and merges:

* ``/healthz``, ``/readyz``: 200 only when every shard answers 200; else 503 naming
  each shard that did not, and why (its own reason, or "did not answer within 2 s").
* ``/api/status``: every shard's topics (sorted) and deleting groups, summed
  ``topic_count``/``group_count``, and ``shards``: per shard its role, term, leader,
  commit and applied index and topic count, or the error that kept it out.
* ``/metrics``: every shard's series with a ``shard`` label added (families merged, so
  each ``# HELP``/``# TYPE`` appears once); a shard that does not answer is left out
  and ``futureq_node_view_shard_up{shard="K"}`` is 0 for it.
* ``/api/overview`` and WATCH_UPDATE (the dashboard): groups of every shard, summed
  due buckets and activity, alarms of every shard named by shard, and ``shards``.
* ``/api/browse?topic=T`` (and ``/api/browse/counts``): answered by ``T``'s shard.

Shards trust each other's fetches through a per-node token the supervisor draws at
start and hands its shards in :data:`TOKEN_ENV` (accepted on the HTTP port for reads,
as a client with the ``monitor`` permission would be); no operator token is needed.

Source: ``docs/sharding.md``, "One operator view".
"""

from __future__ import annotations

import json
import logging
import os
import ssl
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import h11
import trio

from futureq.config import join_host_port, split_host_port
from futureq.shards.layout import shift_address

if TYPE_CHECKING:
    from futureq.config import Config
    from futureq.shards.layout import ShardRole

log = logging.getLogger(__name__)

FETCH_DEADLINE_S = 1.0
"""Longest shard 0 waits for another shard's answer (connect, TLS, request, body) (s):
below the probes' 2 s timeout (k8s/statefulset.yaml), so a probe gets the 503 naming the
shard rather than timing out itself."""
MAX_BODY_BYTES = 256 * 1024 * 1024
"""Largest answer read from a shard (a ``/metrics`` of many groups is the big one)."""
TOKEN_ENV = "FQ_SHARD_VIEW_TOKEN"
"""Environment variable carrying the node's internal read token to its shards (not
``FUTUREQ_*``: those are configuration keys)."""
HTTP_FD_ENV = "FQ_SHARD_HTTP_FD"
"""Environment variable naming the file descriptor of the shard's listening HTTP socket,
which the supervisor binds once and hands to every incarnation of the shard: shard 0's
(the node's HTTP port) always, every shard's when the node's ports were left to the OS."""
CLIENT_FD_ENV = "FQ_SHARD_CLIENT_FD"
"""Environment variable naming the file descriptor of the shard's listening client
socket, handed down by the supervisor when the node's ports were left to the OS (port 0:
it binds every shard's ports, ``docs/sharding.md``, "Port 0")."""
OVERVIEW_POLL_S = 1.0
"""How often the other shards' overviews are fetched while someone watches (s)."""
OVERVIEW_FRESH_S = 3 * OVERVIEW_POLL_S + FETCH_DEADLINE_S
"""An overview older than this is not shown (the shard is "being fetched") (s)."""
OVERVIEW_IDLE_S = 10.0
"""Overviews stop being fetched when nobody asked for one for this long (s)."""
AGGREGATED = ("/healthz", "/readyz", "/api/status", "/api/overview", "/metrics")
"""Paths shard 0 merges over every shard."""
ROUTED = ("/api/browse", "/api/browse/counts")
"""Paths shard 0 hands to the shard owning the ``topic`` parameter."""
_WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")


@attrs.define
class _SharedFetch:
    """One fetch under way, whose reply every request asking the same waits for."""

    done: trio.Event = attrs.Factory(trio.Event)
    reply: Reply | None = None
    """None once done: the fetch was cancelled (its own request ended)."""


@attrs.frozen
class Answer:
    """One shard's HTTP answer: status, body, ``Content-Type``."""

    status: int
    body: bytes
    content_type: str


@attrs.frozen
class NoAnswer:
    """A shard that did not answer; ``reason`` is a sentence (timeout, refused, ...)."""

    reason: str


Reply = Answer | NoAnswer

NOT_FETCHED = NoAnswer("is being fetched")
"""A shard whose overview shard 0 has not fetched recently (no alarm: not a fault)."""


def node_token() -> str | None:
    """The node's internal read token, when this process is a shard of a sharded node."""
    return os.environ.get(TOKEN_ENV) or None


def inherited_http_fd() -> int | None:
    """The shard's listening HTTP socket, inherited from the supervisor
    (:data:`HTTP_FD_ENV`), or None: bind ``server.http`` itself."""
    value = os.environ.get(HTTP_FD_ENV)
    return int(value) if value else None


def inherited_client_fd() -> int | None:
    """The shard's listening client socket, inherited from the supervisor
    (:data:`CLIENT_FD_ENV`), or None: bind ``server.listen`` itself."""
    value = os.environ.get(CLIENT_FD_ENV)
    return int(value) if value else None


def shard_http_address(http: str, shard: int, stride: int) -> str:
    """Where shard ``shard``'s HTTP port is reached from its node: ``http`` (shard 0's
    bind address) shifted by ``shard * stride``, a wildcard host asked over loopback."""
    host, port = split_host_port(http)
    if host in _WILDCARD_HOSTS:
        host = "::1" if ":" in host else "127.0.0.1"
    return shift_address(join_host_port(host, port), shard * stride)


def client_ssl_context(config: Config) -> ssl.SSLContext | None:
    """TLS for fetches from a sibling shard (None without ``tls.http``).

    The sibling presents the node's own certificate, so exactly that certificate is
    trusted (partial chain: the leaf itself is the anchor) and the name is not checked
    (the address is the node's own loopback or bind address). With
    ``tls.require_client_cert`` the node's certificate is presented as the client's.
    """
    tls = config.tls
    if not (tls.enabled and tls.http):
        return None
    assert tls.cert_file is not None and tls.key_file is not None
    context = ssl.create_default_context(cafile=tls.cert_file)
    if tls.ca_file is not None:
        context.load_verify_locations(tls.ca_file)
    context.check_hostname = False
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    if tls.require_client_cert:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    return context


async def http_get(
    address: str,
    target: str,
    *,
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    deadline_s: float = FETCH_DEADLINE_S,
) -> Reply:
    """``GET target`` from ``address`` (``HOST:PORT``) within ``deadline_s``.

    Returns:
        :class:`Answer`, or :class:`NoAnswer` saying why (never raises for a shard that
        is down, stopped, slow or answers garbage).
    """
    host, port = split_host_port(address)
    try:
        with trio.fail_after(deadline_s):
            return await _get(host, port, address, target, token, ssl_context)
    except trio.TooSlowError:
        return NoAnswer(f"did not answer within {deadline_s:g} s")
    except (OSError, trio.BrokenResourceError) as exc:
        return NoAnswer(
            f"cannot be reached ({exc.strerror or exc})"
            if isinstance(exc, OSError)
            else "closed the connection"
        )
    except (h11.ProtocolError, ValueError) as exc:
        return NoAnswer(f"answered something that is not HTTP ({exc})")


async def _get(
    host: str,
    port: int,
    address: str,
    target: str,
    token: str | None,
    ssl_context: ssl.SSLContext | None,
) -> Answer:
    stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
    if ssl_context is not None:
        stream = trio.SSLStream(stream, ssl_context, server_hostname=None)
    async with stream:
        connection = h11.Connection(h11.CLIENT)
        headers = [("host", address), ("connection", "close")]
        if token is not None:
            headers.append(("authorization", f"Bearer {token}"))
        request = h11.Request(method="GET", target=target, headers=headers)
        await stream.send_all(
            connection.send(request) + (connection.send(h11.EndOfMessage()) or b"")
        )
        status = 0
        content_type = ""
        body = bytearray()
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(bytes(await stream.receive_some(65536)))
            elif isinstance(event, h11.Response):
                status = event.status_code
                for name, value in event.headers:
                    if name == b"content-type":
                        content_type = value.decode("latin-1")
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY_BYTES:
                    raise ValueError(f"an answer larger than {MAX_BODY_BYTES} bytes")
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return Answer(status, bytes(body), content_type)


class NodeView:
    """Shard 0's view of every shard of its node (see the module doc).

    Args:
        config: Shard 0's configuration (its ``server.http`` is the node's HTTP port).
        role: Shard 0's :class:`ShardRole` (shard count, port stride, slot map).
        token: The node's internal read token (:func:`node_token`).
        deadline_s: Deadline of each fetch from another shard (s).
    """

    def __init__(
        self,
        config: Config,
        role: ShardRole,
        token: str | None,
        deadline_s: float = FETCH_DEADLINE_S,
    ) -> None:
        self.role = role
        self.token = token
        self.deadline_s = deadline_s
        self.addresses = [
            shard_http_address(config.server.http, shard, role.port_stride)
            for shard in range(role.slot_map.shard_count)
        ]
        self.ssl_context = client_ssl_context(config)
        from futureq.broker.http import HTTP_ADDRESS_SHARE

        share = max(1, config.limits.max_http_connections // HTTP_ADDRESS_SHARE)
        self._connections = [
            trio.CapacityLimiter(max(1, share // 2)) for _ in range(role.slot_map.shard_count)
        ]
        """Connections to shard ``K`` open at once: half of what one address may hold
        there (the rest stays for ``futureq health --shards``, other local clients)."""
        self._under_way: dict[tuple[int, str], _SharedFetch] = {}
        self.overviews: dict[int, tuple[float, Reply]] = {}
        """The other shards' last ``/api/overview`` replies and when they came (trio
        time, s); WATCH merges those younger than :data:`OVERVIEW_FRESH_S`."""
        self._overview_asked = trio.Event()
        self._overview_asked_at = -1e9

    @property
    def shard_count(self) -> int:
        return len(self.addresses)

    async def fetch_others(self, target: str) -> dict[int, Reply]:
        """``GET target`` from every shard but 0 at once; each within the deadline."""
        replies: dict[int, Reply] = {}

        async def one(shard: int) -> None:
            replies[shard] = await self.fetch_one(shard, target)

        async with trio.open_nursery() as nursery:
            for shard in range(1, self.shard_count):
                nursery.start_soon(one, shard)
        return replies

    def owner_of(self, topic: str) -> int:
        """The shard owning ``topic``."""
        return self.role.slot_map.shard_of(topic)

    async def fetch_one(self, shard: int, target: str) -> Reply:
        """``GET target`` from shard ``shard`` within the deadline.

        Requests asking the same of the same shard at once share one fetch, and at most
        half of what one address may hold on that shard's port (its
        ``limits.max_http_connections`` / ``HTTP_ADDRESS_SHARE``) is open at once. Every
        fetch comes from this node's own address: before, each probe of the node's
        port opened its own connection to every other shard, so 33 probes at once
        (from several hosts, each within its own share) took more than the node's
        address may hold on shard 1's port, and the node answered ``unhealthy: shard 1
        ...: answered 503 this address holds 32 HTTP connections`` about itself.
        """
        key = (shard, target)
        while (shared := self._under_way.get(key)) is not None:
            await shared.done.wait()
            if shared.reply is not None:
                return shared.reply
        shared = self._under_way[key] = _SharedFetch()
        try:
            reply: Reply = NoAnswer(f"did not answer within {self.deadline_s:g} s")
            deadline = trio.current_time() + self.deadline_s
            with trio.move_on_at(deadline):
                async with self._connections[shard]:
                    reply = await http_get(
                        self.addresses[shard],
                        target,
                        token=self.token,
                        ssl_context=self.ssl_context,
                        deadline_s=self.deadline_s,  # the scope above ends it in time
                    )
            shared.reply = reply
            return reply
        finally:
            del self._under_way[key]
            shared.done.set()

    # --- the dashboard's overview (WATCH_UPDATE is built synchronously) --------------

    def merged_overview(self, local: dict[str, Any]) -> dict[str, Any]:
        """``local`` (shard 0's overview) merged with the others' last fetched ones;
        asking wakes the poller (:meth:`run`)."""
        self._overview_asked_at = trio.current_time()
        self._overview_asked.set()
        now = trio.current_time()
        replies: list[Reply] = [Answer(200, b"", "")]
        for shard in range(1, self.shard_count):
            at, reply = self.overviews.get(shard, (-1e9, NOT_FETCHED))
            replies.append(reply if now - at <= OVERVIEW_FRESH_S else NOT_FETCHED)
        return merge_overviews(local, replies, self.addresses)

    async def run(self) -> None:
        """Fetch the other shards' overviews every :data:`OVERVIEW_POLL_S` while
        someone asked for one within :data:`OVERVIEW_IDLE_S`; until cancelled."""
        while True:
            if trio.current_time() - self._overview_asked_at > OVERVIEW_IDLE_S:
                self._overview_asked = trio.Event()
                await self._overview_asked.wait()
            replies = await self.fetch_others("/api/overview")
            now = trio.current_time()
            self.overviews.update({shard: (now, reply) for shard, reply in replies.items()})
            await trio.sleep(OVERVIEW_POLL_S)


# --- merging ---------------------------------------------------------------------------


def _json_of(reply: Reply) -> dict[str, Any] | None:
    if not isinstance(reply, Answer):
        return None
    try:
        value = json.loads(reply.body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _why(reply: Reply) -> str:
    if isinstance(reply, NoAnswer):
        return reply.reason
    value = _json_of(reply)
    if value is not None and value.get("reason"):
        return str(value["reason"])
    text = reply.body.decode("utf-8", "replace").strip()
    return f"answered {reply.status}" + (f" {text}" if text else "")


def merge_health(replies: Sequence[Reply], addresses: Sequence[str]) -> tuple[int, bytes]:
    """``/healthz`` of the node: ``(200, "ok")`` when every shard says 200, else 503
    and one line per shard that did not (index = shard number)."""
    bad = [
        f"shard {shard} ({addresses[shard]}): {_why(reply)}"
        for shard, reply in enumerate(replies)
        if not (isinstance(reply, Answer) and reply.status == 200)
    ]
    if not bad:
        return 200, b"ok\n"
    return 503, ("unhealthy: " + "; ".join(bad) + "\n").encode()


def merge_ready(replies: Sequence[Reply], addresses: Sequence[str]) -> tuple[int, dict[str, Any]]:
    """``/readyz`` of the node: ready only when every shard is; the 503's ``reason``
    names each shard that is not; ``shards`` gives every shard's readiness."""
    shards: list[dict[str, Any]] = []
    bad: list[str] = []
    alarms: list[str] = []
    for shard, reply in enumerate(replies):
        ready = isinstance(reply, Answer) and reply.status == 200
        entry: dict[str, Any] = {"shard": shard, "address": addresses[shard], "ready": ready}
        if not ready:
            entry["reason"] = _why(reply)
            bad.append(f"shard {shard} is not ready: {entry['reason']}")
        value = _json_of(reply)
        for alarm in (value or {}).get("alarms") or []:
            if alarm not in alarms:
                alarms.append(alarm)
        shards.append(entry)
    if not bad:
        return 200, {"ready": True, "shards": shards}
    return 503, {"ready": False, "reason": "; ".join(bad), "alarms": alarms, "shards": shards}


_SHARD_FIELDS = (
    "role",
    "view",
    "term",
    "leader_id",
    "leader_address",
    "commit_index",
    "applied_index",
)


def merge_status(replies: Sequence[Reply], addresses: Sequence[str]) -> tuple[int, dict[str, Any]]:
    """``/api/status`` of the node (see the module doc). 200 when shard 0 answered
    (its fields head the map); a shard without an answer is named in ``shards`` with
    its ``error`` and in ``missing_shards``. Without shard 0: 503 with ``error``
    naming it and the other shards' part of the map (topics, counts, ``shards``)."""
    answers = [
        _json_of(reply) if isinstance(reply, Answer) and reply.status == 200 else None
        for reply in replies
    ]
    first = answers[0]
    merged: dict[str, Any] = (
        {"error": f"shard 0: {_why(replies[0])}"} if first is None else dict(first)
    )
    topics: list[Any] = []
    deleting: list[Any] = []
    deleting_truncated = False
    shards: list[dict[str, Any]] = []
    missing: list[int] = []
    alarms: list[str] = []
    for shard, (answer, reply) in enumerate(zip(answers, replies, strict=True)):
        entry: dict[str, Any] = {"shard": shard, "http_address": addresses[shard]}
        if answer is None:
            entry["error"] = _why(reply)
            missing.append(shard)
        else:
            topics.extend(answer.get("topics") or [])
            deleting.extend(answer.get("deleting_groups") or [])
            deleting_truncated = deleting_truncated or bool(answer.get("deleting_truncated"))
            for alarm in answer.get("alarms") or []:
                if alarm not in alarms:
                    alarms.append(alarm)
            entry.update({name: answer.get(name) for name in _SHARD_FIELDS})
            entry["topic_count"] = answer.get("topic_count", len(answer.get("topics") or []))
            entry["group_count"] = answer.get("group_count")
            entry["truncated"] = answer.get("truncated", False)
        shards.append(entry)
    merged["topics"] = sorted(topics, key=lambda entry: str(entry.get("topic", "")))
    merged["deleting_groups"] = deleting
    merged["deleting_truncated"] = deleting_truncated
    merged["topic_count"] = sum(int(s.get("topic_count") or 0) for s in shards)
    merged["group_count"] = sum(int(s.get("group_count") or 0) for s in shards)
    merged["truncated"] = any(bool(s.get("truncated")) for s in shards)
    if missing and "SHARD_UNAVAILABLE" not in alarms:
        # As the dashboard raises it: a monitor reading only ``alarms`` sees that some
        # topics and counts are missing from this answer.
        alarms.append("SHARD_UNAVAILABLE")
    merged["alarms"] = alarms
    merged["shards"] = shards
    merged["missing_shards"] = missing
    return (200 if first is not None else 503), merged


def _add_end_aligned(total: list[Any], values: Sequence[Any], combine: Any) -> list[Any]:
    """Combine two per-second series aligned at their newest point."""
    if len(values) > len(total):
        total = [None] * (len(values) - len(total)) + total
    offset = len(total) - len(values)
    out = list(total)
    for position, value in enumerate(values):
        out[offset + position] = combine(out[offset + position], value)
    return out


def _sum(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _max(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def merge_overviews(
    local: dict[str, Any], replies: Sequence[Reply], addresses: Sequence[str]
) -> dict[str, Any]:
    """The node's overview: shard 0's (``local``; ``replies[0]`` is ignored) with every
    other shard's groups, due buckets, activity and alarms added (see the module doc).

    Lateness percentiles of the merged activity are the worst shard's per window (an
    upper bound: the shards' per-second buckets are not sent)."""
    merged = dict(local)
    overviews: list[dict[str, Any] | None] = [local]
    overviews += [_json_of(reply) for reply in replies[1:]]
    groups: list[dict[str, Any]] = []
    groups_total = 0
    totals = {"pending_total": 0, "in_flight_total": 0}
    due: dict[str, int] | None = None
    activity = dict(local.get("activity") or {})
    alarms: list[dict[str, str]] = []
    shards: list[dict[str, Any]] = []
    for shard, overview in enumerate(overviews):
        entry: dict[str, Any] = {"shard": shard, "http_address": addresses[shard]}
        if overview is None:
            reason = _why(replies[shard])
            entry["error"] = reason
            if replies[shard] is not NOT_FETCHED:
                alarms.append(
                    {"name": "SHARD_UNAVAILABLE", "text": f"shard {shard} is not shown: {reason}"}
                )
            shards.append(entry)
            continue
        node = overview.get("node") or {}
        entry.update({name: node.get(name) for name in _SHARD_FIELDS})
        entry["groups_total"] = overview.get("groups_total", 0)
        entry["data_dir_bytes"] = node.get("data_dir_bytes")
        shards.append(entry)
        for group in overview.get("groups") or []:
            groups.append({**group, "shard": shard})
        groups_total += int(overview.get("groups_total") or 0)
        for name in totals:
            totals[name] += int(overview.get(name) or 0)
        for bucket in overview.get("due_buckets") or []:
            due = {} if due is None else due
            due[bucket["label"]] = due.get(bucket["label"], 0) + int(bucket["count"])
        for alarm in overview.get("alarms") or []:
            prefix = f"shard {shard}: "
            alarms.append({**alarm, "text": prefix + str(alarm.get("text", ""))})
        if shard > 0:
            theirs = overview.get("activity") or {}
            for name in ("published", "delivered", "acked", "dead_lettered"):
                activity[name] = _add_end_aligned(
                    list(activity.get(name) or []), theirs.get(name) or [], _sum
                )
            for name in ("lateness_p50_ms", "lateness_p99_ms"):
                activity[name] = _add_end_aligned(
                    list(activity.get(name) or []), theirs.get(name) or [], _max
                )
            counts = theirs.get("lateness_counts")
            if counts and len(counts) == len(activity.get("lateness_counts") or []):
                activity["lateness_counts"] = [
                    a + b for a, b in zip(activity["lateness_counts"], counts, strict=True)
                ]
            activity["end_ms"] = max(
                int(activity.get("end_ms") or 0), int(theirs.get("end_ms") or 0)
            )
    from futureq.broker.overview import MAX_GROUPS

    groups.sort(
        key=lambda g: (-int(g.get("pending") or 0), str(g.get("topic")), str(g.get("group")))
    )
    merged["groups"] = groups[:MAX_GROUPS]
    merged["groups_total"] = groups_total
    merged.update(totals)  # of the shards shown (one not answering raises an alarm)
    if due is not None:
        merged["due_buckets"] = [{"label": label, "count": count} for label, count in due.items()]
    merged["activity"] = activity
    merged["alarms"] = alarms
    merged["shards"] = shards
    sizes = [s.get("data_dir_bytes") for s in shards]
    if all(isinstance(size, int) for size in sizes):
        merged["node"] = {**(local.get("node") or {}), "data_dir_bytes": sum(sizes)}
    return merged


def relabel_metrics(texts: Sequence[tuple[int, str]]) -> tuple[bytes, list[int]]:
    """One Prometheus text exposition from several shards' (``(shard, text)``): every
    sample gets a ``shard`` label, each family appears once.

    Returns:
        ``(exposition, shards left out)``: a text that is not the Prometheus text
        format leaves that shard out (logged) rather than failing the scrape.
    """
    from prometheus_client.exposition import generate_latest
    from prometheus_client.metrics_core import Metric
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.samples import Sample

    families: dict[str, Metric] = {}
    left_out: list[int] = []
    for shard, text in texts:
        try:
            parsed = list(text_string_to_metric_families(text))
        except ValueError as exc:
            log.warning("shard %d's /metrics is not the Prometheus text format: %s", shard, exc)
            left_out.append(shard)
            continue
        for family in parsed:
            merged = families.get(family.name)
            if merged is None:
                merged = Metric(family.name, family.documentation, family.type, family.unit)
                families[family.name] = merged
            for sample in family.samples:
                labels = {**sample.labels, "shard": str(shard)}
                merged.samples.append(
                    Sample(sample.name, labels, sample.value, sample.timestamp, sample.exemplar)
                )

    class _Families:
        def collect(self) -> list[Metric]:
            return list(families.values())

    return generate_latest(_Families()), left_out


def shard_up_metric(replies: Sequence[Reply], left_out: Sequence[int] = ()) -> str:
    """``futureq_node_view_shard_up``: 1 per shard whose ``/metrics`` is in this scrape,
    else 0 (no answer, not 200, or ``left_out``)."""
    lines = [
        "# HELP futureq_node_view_shard_up Whether the shard answered the node's /metrics "
        "fetch (1) or not (0)",
        "# TYPE futureq_node_view_shard_up gauge",
    ]
    for shard, reply in enumerate(replies):
        up = isinstance(reply, Answer) and reply.status == 200 and shard not in left_out
        lines.append(f'futureq_node_view_shard_up{{shard="{shard}"}} {1 if up else 0}')
    return "\n".join(lines) + "\n"


__all__ = [
    "AGGREGATED",
    "Answer",
    "FETCH_DEADLINE_S",
    "NoAnswer",
    "NodeView",
    "ROUTED",
    "CLIENT_FD_ENV",
    "HTTP_FD_ENV",
    "TOKEN_ENV",
    "http_get",
    "merge_health",
    "merge_overviews",
    "merge_ready",
    "merge_status",
    "node_token",
    "relabel_metrics",
    "shard_up_metric",
]
