"""Helpers shared by the QueueState tests: reopenable stores, dumps, a recording observer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from futureq.state import commands
from futureq.state.commands import CommandKind
from futureq.state.queue_state import QueueState
from futureq.state.store import Changes, StateStore
from futureq.storage.db import Database

STATE_FAMILIES = ("messages", "schedule", "groups", "meta", "index")
SCHEMA_KEY = b"schema_version"

Dump = dict[str, list[tuple[bytes, bytes]]]


class StoreKit:
    """Makes a store and reopens it: RocksDB is closed and opened again from disk,
    a MemoryStore is handed back as is (a new QueueState still has to rebuild from it).
    """

    def __init__(self, make: Callable[[], StateStore], *, durable: bool) -> None:
        self._make = make
        self.durable = durable
        self.store: StateStore = make()

    def reopen(self) -> StateStore:
        """Close and reopen the store (RocksDB), or keep it (memory)."""
        if self.durable:
            self.close()
            self.store = self._make()
        return self.store

    def close(self) -> None:
        if isinstance(self.store, Database):
            self.store.close()


def dump(store: StateStore, families: tuple[str, ...] = STATE_FAMILIES) -> Dump:
    """Every (key, value) of the state families; the schema version key is left out."""
    out: Dump = {}
    for family in families:
        items = list(store.scan(family, b""))
        if family == "meta":
            items = [(k, v) for k, v in items if k != SCHEMA_KEY]
        out[family] = items
    return out


def group_snapshot(state: QueueState) -> list[tuple[Any, ...]]:
    """Everything QueueState keeps in memory about groups, comparable with ``==``."""
    return [
        (
            g.group_id,
            g.topic,
            g.name,
            g.visibility_timeout_ms,
            g.max_deliveries,
            g.implicit,
            g.pending,
        )
        for g in sorted(state.groups.values(), key=lambda g: g.group_id)
    ]


class Recorder:
    """A ScheduleObserver that records calls and checks they come after the write.

    Args:
        state: The observed QueueState; at each call its store must already hold the
            applied index of the command being applied, and the entry's new state.
    """

    def __init__(self, state: QueueState) -> None:
        self.state = state
        self.calls: list[tuple[Any, ...]] = []
        self.violations: list[str] = []
        state.observer = self

    def _stored_applied(self) -> int:
        raw = self.state.store.get("meta", b"applied_index")
        return 0 if raw is None else int.from_bytes(raw, "big")

    def _check_written(self, what: str) -> None:
        if self._stored_applied() != self.state.applied_index:
            self.violations.append(f"{what} before the write")

    def on_scheduled(
        self,
        group_id: int,
        due_ms: int,
        mid: int,
        expire_ms: int | None,
        attempt: int,
        released: int = 0,
    ) -> None:
        self._check_written("on_scheduled")
        key = commands.schedule_key(group_id, due_ms, mid)
        if self.state.store.get("schedule", key) is None:
            self.violations.append("on_scheduled for an entry not in the store")
        call: tuple[Any, ...] = ("s", group_id, due_ms, mid, expire_ms, attempt)
        self.calls.append(call + (released,) if released else call)

    def on_scheduled_batch(self, entries: Sequence[tuple[Any, ...]]) -> None:
        for entry in entries:
            assert entry[0] == "s" and len(entry) in (6, 7), entry
            assert len(entry) == 6 or entry[6] > 0, "released appended only when above zero"
            self.on_scheduled(*entry[1:])

    def on_unscheduled(
        self,
        group_id: int,
        due_ms: int,
        mid: int,
        reason: CommandKind,
        held: tuple[int, int] | None = None,
    ) -> None:
        self._check_written("on_unscheduled")
        call = ("u", group_id, due_ms, mid, CommandKind(reason))
        self.calls.append(call if held is None else call + (held,))

    def on_group_changed(self, group_id: int) -> None:
        self._check_written("on_group_changed")
        self.calls.append(("g", group_id))

    def on_groups_changed(self) -> None:
        self._check_written("on_groups_changed")
        self.calls.append(("g",))

    def take(self) -> list[tuple[Any, ...]]:
        calls, self.calls = self.calls, []
        return calls


class SpyStore:
    """Wraps a store and records every ``write`` call's changes."""

    def __init__(self, inner: StateStore) -> None:
        self.inner = inner
        self.writes: list[Changes] = []

    def get(self, family: str, key: bytes) -> bytes | None:
        return self.inner.get(family, key)

    def scan(self, family: str, start: bytes, stop: bytes | None = None) -> Any:
        return self.inner.scan(family, start, stop)

    def scan_keys(self, family: str, start: bytes, stop: bytes | None = None) -> Any:
        return self.inner.scan_keys(family, start, stop)

    def write(self, changes: Changes, *, sync: bool = False) -> None:
        self.writes.append({f: dict(items) for f, items in changes.items()})
        self.inner.write(changes, sync=sync)
