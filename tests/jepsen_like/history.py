"""The run's history: every operation and observation as one JSON object per line.

Every event is a dict with ``type`` (str) and ``t`` (float, wall-clock ms since the
Unix epoch on the harness host, taken when the event happened). Types and their fields:

``run``
    ``phase``: ``start`` (with ``topics``: ``{topic: [group, ...]}``, ``seed``,
    ``nodes``, ``allowed_offset_ms``), ``workload_end``, ``healed``, ``drain_end``.
``publish``
    ``phase``: ``invoke`` | ``ok`` | ``fail`` (definitely not stored) | ``info``
    (outcome unknown). ``op`` (int, unique per publish; a batch item is its own op,
    with ``batch`` the batch number), ``key`` (str, unique per publish, carried in the
    payload), on ``invoke`` also ``producer``, ``topic``, ``groups`` (target groups),
    ``delay_ms``, ``deliver_at_ms``, ``ttl_ms`` (int or null); on ``ok`` ``id``
    (message id); on ``fail``/``info`` ``error`` (text).
``deliver``
    A delivery received: ``id``, ``key`` (null if the payload was not ours),
    ``topic``, ``group``, ``consumer``, ``attempt``, ``delivered_ms``, ``due_ms``,
    ``publish_ms`` (server stamps, ms).
``ack`` / ``nack``
    ``phase``: ``invoke`` | ``ok`` | ``fail``; ``id``, ``group``, ``consumer``,
    ``attempt``.
``nemesis``
    ``phase``: ``start`` | ``stop``; ``name``, ``detail`` (free text).
``leader``
    A leader observation: ``node_id`` (int or null), ``term`` (int or null),
    ``observer`` (node asked), ``claimants`` (every node whose ``/api/status`` said
    ``role: leader`` at that moment; two at once is normal for a deposed leader that
    has not heard of the new term yet, a violation only within one term). With no
    leader, ``nodes``: per answering node ``role``, ``term``, and its clock's
    ``in_bound``, ``synchronized`` and ``offsets_ms`` (why nobody campaigns or wins).
``node``
    ``phase``: ``kill`` | ``start`` | ``pause`` | ``resume``; ``node_id``.
``state``
    Written after the nodes stopped, only when a required delivery was missing at the
    end of the drain: what one node's RocksDB held of the missing entries
    (``evidence.py``). ``node_id``, ``applied_index``, ``groups`` (``{"topic/group":
    group_id}``), ``held`` (``[message_id, topic, group, due_ms, attempt]`` per
    schedule entry still there), ``messages`` (ids still stored); or ``error``.
``buffered``
    Written when the drain ends, one per live consumer: ``consumer``, ``group``, and the
    ``ids`` and ``keys`` of the deliveries its client had received and not yet handed
    out (``Subscription`` buffer; prefetch kept alive by the lease keeper).
``harness``
    The harness's own event loop woke up ``stall_ms`` late (250 ms or more): the Raft
    link proxies, which run on it, forwarded nothing meanwhile (``runner._watch_loop``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

Event = dict[str, Any]


def now_ms() -> float:
    """The harness's wall clock in ms since the Unix epoch (float, sub-ms precision)."""
    return time.time() * 1000.0


class History:
    """An append-only event log, kept in memory and written as JSON lines.

    Args:
        path: File to write (truncated); None keeps the events in memory only.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.events: list[Event] = []
        self._file: IO[str] | None = open(path, "w") if path is not None else None  # noqa: SIM115

    def record(self, type_: str, **fields: Any) -> Event:
        """Append one event stamped with :func:`now_ms` (or ``fields["t"]`` if given).

        Returns:
            The event dict as stored.
        """
        event: Event = {"t": fields.pop("t", None) or now_ms(), "type": type_, **fields}
        self.events.append(event)
        if self._file is not None:
            self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        return event

    def flush(self) -> None:
        """Push buffered lines to the file."""
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Flush and close the file; the in-memory events stay."""
        if self._file is not None:
            self._file.close()
            self._file = None


def read_history(path: Path) -> Iterator[Event]:
    """Yield the events of a JSON-lines history file, in file order.

    Raises:
        json.JSONDecodeError: a line is not JSON (a truncated last line is skipped).
    """
    with open(path) as file:
        lines = file.read().split("\n")
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            if number >= len(lines) - 2:  # the last line of a killed run may be cut
                return
            raise
