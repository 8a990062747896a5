"""What the nodes still hold: each stopped node's RocksDB, read-only, for the checker.

A message the consumers never received by the end of the drain is either gone (lost)
or still held by the cluster (undelivered when the drain ended). Only the nodes' state
can tell which, so after a run that ends with missing deliveries the runner reads
every node's data directory — after the node processes are stopped, never while they
write — and records one ``state`` event per node in the history (``history.py``).
The checker then classifies each missing delivery from those events alone, so a saved
history is checked again offline with the same verdicts.

Layout read (``futureq.state.queue_state``): ``groups`` ``topic \\x00 group`` ->
``[group_id, ...]``; ``schedule`` ``group_id | due_ms | message_id`` ->
``[attempt, expire_ms]`` (and ``released, released_attempt`` once released); ``messages`` ``message_id`` -> ``[topic, payload, publish_ms,
due_ms, open]``; ``meta`` ``applied_index``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgpack
from rocksdict import AccessType, Options, Rdict

from futureq.state import commands
from futureq.storage.db import FAMILIES


def _open_read_only(path: Path) -> Rdict:
    families = {name: Options(raw_mode=True) for name in FAMILIES}
    return Rdict(
        str(path),
        Options(raw_mode=True),
        column_families=families,
        access_type=AccessType.read_only(),
    )


def read_holdings(data_dir: Path, wanted: Iterable[tuple[int, str, str]]) -> dict[str, Any]:
    """What one stopped node holds of the given (message id, topic, group) entries.

    Opens the node's RocksDB read-only (a node killed with SIGKILL is read as it would
    restart: RocksDB replays its write-ahead log).

    Args:
        data_dir: The node's ``--data-dir``; its process must not be running.
        wanted: ``(message_id, topic, group)`` of every delivery looked for.

    Returns:
        A ``state`` event's fields: ``applied_index`` (int), ``groups`` (``{"topic/group":
        group_id}`` of the wanted groups that exist), ``held`` (``[message_id, topic,
        group, due_ms, attempt]`` for each wanted entry in the group's ``schedule``),
        ``messages`` (wanted message ids still in ``messages``); or ``error`` (text)
        when the directory cannot be read.
    """
    wanted = list(wanted)
    try:
        db = _open_read_only(data_dir)
    except Exception as exc:  # rocksdict raises plain Exception subclasses
        return {"error": f"cannot open {data_dir} read-only: {exc}"}
    try:
        return _read(db, wanted)
    except Exception as exc:  # a layout this reader does not know: say so, go on
        return {"error": f"cannot read {data_dir}: {exc!r}"}
    finally:
        db.close()


def _read(db: Rdict, wanted: list[tuple[int, str, str]]) -> dict[str, Any]:
    applied = db.get_column_family("meta").get(b"applied_index")
    groups = db.get_column_family("groups")
    group_ids: dict[tuple[str, str], int] = {}
    for topic, group in {(topic, group) for _, topic, group in wanted}:
        record = groups.get(f"{topic}\x00{group}".encode())
        if record is not None:
            group_ids[(topic, group)] = int(msgpack.unpackb(record)[0])
    by_group: dict[int, set[int]] = {}
    for mid, topic, group in wanted:
        gid = group_ids.get((topic, group))
        if gid is not None:
            by_group.setdefault(gid, set()).add(mid)
    names = {gid: name for name, gid in group_ids.items()}
    held: list[list[Any]] = []
    iterator = db.get_column_family("schedule").iter()
    for gid, mids in sorted(by_group.items()):
        prefix = gid.to_bytes(4, "big")
        iterator.seek(prefix)
        while iterator.valid() and iterator.key().startswith(prefix):
            _, due_ms, mid = commands.parse_schedule_key(iterator.key())
            if mid in mids:
                # [attempt, expire_ms] or, once released, [attempt, expire_ms,
                # released, released_attempt] (queue_state._schedule_value).
                attempt = msgpack.unpackb(iterator.value())[0]
                held.append([mid, *names[gid], due_ms, attempt])
            iterator.next()
    messages = db.get_column_family("messages")
    present = {mid for mid, _, _ in wanted if messages.get(mid.to_bytes(8, "big")) is not None}
    return {
        "applied_index": int.from_bytes(applied, "big") if applied else 0,
        "groups": {f"{topic}/{group}": gid for (topic, group), gid in group_ids.items()},
        "held": held,
        "messages": sorted(present),
    }
