"""``futureq-cli`` status and administration: ``status``, ``group``, ``topic`` and
``cluster``, and the tables they print.

A follower's answer is its local view: the commands say so on stderr
(:func:`view_line`); a sharded node's answer that misses a shard says which, and the
command exits 1 (``docs/sharding.md``). Each command collects its lines in a
:class:`~futureq.cli.output.Report`, written from a worker thread once it has them.
"""

from __future__ import annotations

import argparse
import io as io_module
import json
from collections.abc import Sequence
from typing import Any, Final

from futureq.cli.output import EXIT_ERROR, EXIT_OK, Output, Report, format_ms, reported
from futureq.client import Client
from futureq.errors import FutureQError
from futureq.wire.frames import GroupCreated


def _groups(status: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for topic in status.get("topics", []):
        for group in topic.get("groups", []):
            rows.append({"topic": topic.get("topic"), **group})
    return rows


def _topics(status: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for topic in status.get("topics", []):
        groups = topic.get("groups", [])
        rows.append(
            {
                "topic": topic.get("topic"),
                "groups": len(groups),
                "pending": sum(g.get("pending", 0) for g in groups),
                "due": sum(g.get("due", 0) for g in groups),
                "in_flight": sum(g.get("in_flight", 0) for g in groups),
                "consumers": sum(g.get("consumers", 0) for g in groups),
            }
        )
    return rows


_NODE_KEYS: Final = (
    "node_id",
    "role",
    "leader_address",
    "server_version",
    "applied_index",
    "uptime_s",
)
_GROUP_COLUMNS: Final = (
    "topic",
    "group",
    "pending",
    "due",
    "in_flight",
    "consumers",
    "oldest_due_age",
    "next_due",
    "visibility_timeout_ms",
    "max_deliveries",
)


def age_text(ms: int) -> str:
    """``0s``, ``950ms``, ``1m30s``, ``2d3h``: a duration as a person reads it (the two
    largest units)."""
    if ms < 1000:
        return f"{ms}ms" if ms > 0 else "0s"
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size:
            parts.append(f"{ms // size}{unit}")
            ms %= size
    return "".join(parts[:2])


def group_table_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the ``consumer groups`` table: each STATUS group with its
    ``oldest_due_age`` (how long the earliest due message has waited, from
    ``oldest_due_age_ms``) and ``next_due`` (when its earliest waiting entry falls due,
    from ``next_due_ms``, UTC; blank: none)."""
    shown = []
    for row in rows:
        age, due = row.get("oldest_due_age_ms"), row.get("next_due_ms")
        shown.append(
            {
                **row,
                "oldest_due_age": None if age is None else age_text(int(age)),
                "next_due": None if due is None else format_ms(int(due)),
            }
        )
    return shown


def _table(
    title: str, columns: Sequence[str], rows: Sequence[dict[str, Any]], io: Output | Report
) -> None:
    """Print a table of ``rows`` (as :meth:`Output.out` does: rendered first, so that a
    :class:`Report` writes it from its worker thread with the rest)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        numeric = column not in ("topic", "group")
        table.add_column(column.replace("_", " "), justify="right" if numeric else "left")
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in columns))
    # Rendered into a buffer as it would be onto io.stdout (its width, whether it is a
    # terminal and its colours read from a console on it that writes nothing): rich
    # wrote to the stream itself, on the event loop.
    shape = Console(file=io.stdout, width=None if io.is_terminal else 160)
    buffer = io_module.StringIO()
    Console(
        file=buffer,
        width=shape.width,
        force_terminal=shape.is_terminal,
        color_system=shape.color_system,  # type: ignore[arg-type]
        no_color=shape.no_color,
    ).print(table)
    io.out(buffer.getvalue().removesuffix("\n"))


def view_line(status: dict[str, Any], *, local_asked: bool = False) -> str:
    """One sentence saying whose numbers a STATUS answer holds (the leader's, or one
    node's local view and which fields that affects). ``local_asked``: ``--local``
    asked for this node's own view, so the leader was not asked."""
    node = f"node {status.get('node_id')}"
    if status.get("view", "cluster") != "local":
        return f"cluster view, from the leader ({node})"
    leader_id, leader = status.get("leader_id"), status.get("leader_address")
    if leader is None:
        where = "no leader is known right now"
    else:
        named = f"node {leader_id} at {leader}" if leader_id is not None else leader
        where = f"the leader is {named}, which could not be asked"
        if local_asked:
            where = f"--local asked for this node's own view (the leader is {named})"
    fields = ", ".join(f.replace("_", " ") for f in status.get("leader_only", []))
    return (
        f"LOCAL VIEW of {node} ({status.get('role')}): {fields or 'some numbers'} are known only "
        f"to the leader and show this node's own values; {where}"
    )


def _print_node(status: dict[str, Any], io: Report, *, local_asked: bool = False) -> None:
    line = view_line(status, local_asked=local_asked)
    shards = status.get("shards")
    if isinstance(shards, list) and len(shards) > 1:
        # Each shard is its own Raft group with its own leader (docs/sharding.md): the
        # header is shard 0's alone; the shards table gives every group's.
        line += "; shard 0's Raft group (every shard's in the shards table)"
    io.out(line)
    io.out(
        f"node {status.get('node_id')} role={status.get('role')} "
        f"leader={status.get('leader_address') or '(none known)'} "
        f"version={status.get('server_version')} applied_index={status.get('applied_index')} "
        f"uptime={status.get('uptime_s')}s"
    )


def _missing_shards(status: dict[str, Any], io: Report) -> int:
    """Say on stderr which shards of a sharded node did not answer (their topics are
    missing from the answer); EXIT_ERROR if any did, else EXIT_OK."""
    missing = [
        shard
        for shard in status.get("shards") or []
        if isinstance(shard, dict) and shard.get("error")
    ]
    for shard in missing:
        io.err(
            f"warning: {shard['error']} (at {shard.get('address')}); "
            "its topics and numbers are missing from this answer"
        )
    return EXIT_ERROR if missing else EXIT_OK


@reported
async def run_status(client: Client, args: argparse.Namespace, io: Report) -> int:
    status = await client.status(local=args.local)
    if args.json:
        io.out(json.dumps(status, ensure_ascii=False))
        return _missing_shards(status, io)
    _print_node(status, io, local_asked=args.local)
    _shards_table(status, io)
    rows = _groups(status)
    if rows:
        _table("consumer groups", _GROUP_COLUMNS, group_table_rows(rows), io)
    else:
        io.out("no topics yet")
    subscriptions = [
        {"topic": row["topic"], "group": row["group"], **sub}
        for row in rows
        for sub in row.get("subscriptions", [])
    ]
    if subscriptions:
        # Credit 0 with in_flight = prefetch is a consumer that holds its whole window.
        columns = ("topic", "group", "subscription_id", "prefetch", "credit", "in_flight")
        _table("subscriptions (credit and deliveries held)", columns, subscriptions, io)
    unlisted = sum(int(row.get("consumers") or 0) for row in rows) - len(subscriptions)
    if subscriptions and unlisted > 0:
        io.out(f"{unlisted} more subscriptions not listed (one answer lists what fits in a frame)")
    if status.get("truncated"):
        io.out(
            f"{len(rows)} of {status.get('group_count', '?')} groups listed: a status lists "
            "at most limits.max_status_groups groups, and only what fits in half of "
            "limits.max_frame_bytes (the operator may raise either)"
        )
    for deleting in status.get("deleting_groups", []):
        io.out(
            f"group {deleting['group']!r} of topic {deleting['topic']!r} was deleted; "
            f"{deleting['pending']} entries left to purge"
        )
    return _missing_shards(status, io)


def group_created_line(
    topic: str, group: str, created: GroupCreated | None, from_backlog: bool
) -> str:
    """What ``group create`` tells the user the server did (``created``: the answer;
    None from a server of an earlier build, which does not say)."""
    name = f"group {group!r} of topic {topic!r}"
    not_copied = (
        "; --from-backlog copies only into a group it creates: nothing was copied"
        if from_backlog
        else ""
    )
    if created == GroupCreated.UNCHANGED:
        return f"{name} already exists with these settings: unchanged{not_copied}"
    if created == GroupCreated.UPDATED:
        return f"{name} already exists: its settings were updated{not_copied}"
    if created == GroupCreated.ADOPTED:
        return f"{name} created from the topic's implicit default group, with its backlog"
    if created == GroupCreated.CREATED_FROM_BACKLOG:
        return (
            f"{name} created; the topic's pending messages are being copied to it in the"
            " background (status shows background: backfilling until done)"
        )
    if created == GroupCreated.CREATED:
        if from_backlog:
            return f"{name} created; the topic had no other group: no backlog to copy"
        return f"{name} created"
    return f"{name} exists"


@reported
async def run_group(client: Client, args: argparse.Namespace, io: Report) -> int:
    if args.group_command == "create":
        created = await client.create_group(
            args.topic,
            args.group,
            visibility_timeout_ms=args.visibility_timeout,
            max_deliveries=args.max_deliveries,
            from_backlog=args.from_backlog,
            dead_letter_expired=args.dead_letter_expired,
        )
        io.out(group_created_line(args.topic, args.group, created, args.from_backlog))
    elif args.group_command == "delete":
        await client.delete_group(args.topic, args.group)
        io.out(f"group {args.group!r} of topic {args.topic!r} deleted")
    else:
        status = await client.status()
        if status.get("view") == "local":
            io.err(view_line(status))
        rows = _groups(status)
        if args.json:
            io.out(json.dumps(rows, ensure_ascii=False))
        elif rows:
            _table("consumer groups", _GROUP_COLUMNS, group_table_rows(rows), io)
        else:
            io.out("no consumer groups yet")
        return _missing_shards(status, io)
    return EXIT_OK


@reported
async def run_topic(client: Client, args: argparse.Namespace, io: Report) -> int:
    status = await client.status()
    if status.get("view") == "local":
        io.err(view_line(status))
    rows = _topics(status)
    if args.json:
        io.out(json.dumps(rows, ensure_ascii=False))
    elif rows:
        _table("topics", ("topic", "groups", "pending", "due", "in_flight", "consumers"), rows, io)
    else:
        io.out("no topics yet")
    return _missing_shards(status, io)


@reported
async def run_cluster(client: Client, args: argparse.Namespace, io: Report) -> int:
    if args.cluster_command == "add-node":
        await client.add_node(args.node_id, args.raft_address, args.client_address)
        io.out(f"node {args.node_id} added as a learner; it becomes a voter once caught up")
        return EXIT_OK
    if args.cluster_command == "remove-node":
        await client.remove_node(args.node_id)
        io.out(f"node {args.node_id} removed")
        return EXIT_OK
    if args.cluster_command == "transfer-leader":
        await client.transfer_leader(args.node_id)
        # The server answers OK once any other node leads: a named node that did not
        # take over (stopped, partitioned) left another leader, and this printed
        # "leadership transferred" all the same (found by a tester). The node asked
        # learned the new leader before it answered.
        # On a sharded node every shard's group was asked to move: each shard's row
        # says who leads its group (before, only shard 0's was checked, and "node 3
        # leads now" was printed while shard 1's group had elected node 2 because
        # node 3's shard 1 process was stopped).
        try:
            view = await client.cluster_status(local=True)
        except FutureQError:
            view = {}  # the transfer was answered; only the check could not run
        leader = view.get("leader_id")
        rows = view.get("shards") or []
        leaders = [(row.get("shard"), row.get("leader_id")) for row in rows] or [(None, leader)]
        wrong = [
            ("leadership" if shard is None else f"shard {shard}'s leadership", led)
            for shard, led in leaders
            if args.node_id is not None and led is not None and led != args.node_id
        ]
        if wrong:
            moved = ", ".join(f"{whose} moved to node {led}" for whose, led in wrong)
            io.err(
                f"error: {moved}, not to node {args.node_id}: node {args.node_id} did not "
                "take over in time (is it running and caught up? see futureq-cli cluster "
                "status)"
            )
            return EXIT_ERROR
        io.out("leadership transferred" if leader is None else f"node {leader} leads now")
        return EXIT_OK
    view = await client.cluster_status(local=args.local)
    if args.json:
        io.out(json.dumps(view, ensure_ascii=False))
        return _missing_shards(view, io)
    if view.get("mode") == "single":
        io.out(
            f"node {view.get('node_id')}: runs alone (no Raft), applied index "
            f"{view.get('applied_index')}"
        )
        _shards_table(view, io)
        return _missing_shards(view, io)
    leader = (
        f"leader node {view['leader_id']} at {view.get('leader_address') or 'an unknown address'}"
        if view.get("leader_id") is not None
        else "no leader known"
    )
    io.out(
        f"node {view.get('node_id')}: {view.get('role')}, term {view.get('term')}, {leader}, "
        f"commit index {view.get('commit_index')}, applied index {view.get('applied_index')}"
    )
    if view.get("role") != "leader":
        io.out(
            f"LOCAL VIEW of node {view.get('node_id')}: match index and lag are known only to "
            "the leader"
            + (
                " (--local: not asked)"
                if args.local
                else ", which could not be asked"
                if view.get("leader_address")
                else ""
            )
        )
    clock = view.get("clock")
    if isinstance(clock, dict):
        state = "in bound" if clock.get("in_bound") else "OUT OF BOUND: it will not lead"
        io.out(
            f"cluster time: {'synchronized' if clock.get('synchronized') else 'NOT synchronized'}"
            f", {state} (max_clock_offset_ms {clock.get('max_clock_offset_ms')})"
        )
    nodes = [
        {
            "node": node.get("node_id"),
            "role": node.get("role", ""),
            "raft_address": node.get("raft_address", ""),
            "client_address": node.get("client_address", ""),
            "match_index": node.get("match_index", ""),
            "lag": node.get("lag", ""),
            "clock_offset_ms": node.get("clock_offset_ms", ""),
        }
        for node in view.get("nodes", [])
    ]
    if nodes:
        _table(
            "members",
            (
                "node",
                "role",
                "raft_address",
                "client_address",
                "match_index",
                "lag",
                "clock_offset_ms",
            ),
            nodes,
            io,
        )
    waiting = view.get("recovery_waiting_for")
    if view.get("recovering") and waiting:
        io.out(
            f"node {view.get('node_id')} is RECOVERING after its start: it neither votes nor "
            f"counts towards a quorum until node(s) {', '.join(map(str, waiting))} answer it"
        )
    campaign = view.get("last_campaign")
    if campaign and view.get("leader_id") is None:
        # No leader: which voters this node's campaign waits for, which refuse it.
        silent = ", ".join(map(str, campaign.get("silent") or [])) or "none"
        refused = ", ".join(map(str, campaign.get("refused") or [])) or "none"
        io.out(
            f"node {view.get('node_id')} asks for votes "
            f"({'pre-vote' if campaign.get('pre_vote') else 'election'} for term "
            f"{campaign.get('term')}): {len(campaign.get('granted') or [])} of the "
            f"{campaign.get('needed')} it needs; NOT ANSWERING: {silent}; REFUSING: {refused}"
        )
    for node in view.get("nodes", []):
        if node.get("refused"):
            io.out(f"node {node.get('node_id')}: Raft link FAILING: {node['refused']}")
    _shards_table(view, io)
    return _missing_shards(view, io)


def _shards_table(view: dict[str, Any], io: Report) -> None:
    """A sharded node's ``status`` and ``cluster_status`` are shard 0's group with every
    shard's own answer under ``shards``: one row per shard, so each group's leader shows
    (shard 1 is led by another node than shard 0 once leaders are balanced,
    docs/sharding.md), with its topic count when the answer has one (``status``)."""
    shards = view.get("shards")
    if not isinstance(shards, list) or len(shards) < 2:
        return
    rows = []
    for shard in shards:
        if not isinstance(shard, dict):
            continue
        leader_id = shard.get("leader_id")
        leader = shard.get("leader_address") or ""
        if leader_id is not None:
            leader = f"node {leader_id} at {leader or 'an unknown address'}"
        rows.append(
            {
                "shard": shard.get("shard", ""),
                "address": shard.get("address", ""),
                "role": shard.get("role", "") if "error" not in shard else "",
                "term": shard.get("term", ""),
                "leader": leader,
                "commit_index": shard.get("commit_index", ""),
                "applied_index": shard.get("applied_index", ""),
                "topics": shard.get("topics", ""),
                "error": shard.get("error", ""),
            }
        )
    columns = ["shard", "address", "role", "term", "leader", "commit_index", "applied_index"]
    if any("topics" in shard for shard in shards if isinstance(shard, dict)):
        columns.append("topics")
    if any(row["error"] for row in rows):
        columns.append("error")
    _table("shards", tuple(columns), rows, io)
