"""State machine safety: the same commands in the same order give the same state.

Raft relies on it (``DESIGN.md``, "Every state change goes through the Raft log"):
replicas apply identical logs and must hold identical stores. Two QueueStates, one on
a MemoryStore and one on a real RocksDB, are fed the same random command sequence;
their results, observer calls and every stored family must match, and a QueueState
rebuilt from the reopened RocksDB must match the one that wrote it.
"""

from __future__ import annotations

import tempfile
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from state_helpers import Recorder, dump, group_snapshot

from futureq.state import commands
from futureq.state.queue_state import QueueState
from futureq.state.store import MemoryStore
from futureq.storage.db import Database

TOPICS = ["a", "b", "a.dlq"]
GROUPS = ["default", "g1", "g2"]


def _draw_command(data: st.DataObject, state: QueueState, now_ms: int) -> bytes:
    """One command, drawn so that most of them touch entries that exist."""
    keys = list(state.store.scan("schedule", b""))
    existing = [key for key, _ in keys]
    bogus = commands.schedule_key(999, 1, 1)
    pick_keys = st.lists(
        st.sampled_from(existing + [bogus]) if existing else st.just(bogus), max_size=4
    )
    kind = data.draw(
        st.sampled_from(
            [
                "publish",
                "publish",
                "publish",
                "ack",
                "nack",
                "expire",
                "dead",
                "create",
                "delete",
                "purge",
                "delivered",
                "release",
                "noop",
            ]
        )
    )
    if kind == "publish":
        items = data.draw(
            st.lists(
                st.tuples(
                    st.sampled_from(TOPICS),
                    st.binary(max_size=8),
                    st.integers(0, 5000),
                    st.none() | st.integers(0, 3000),
                ),
                min_size=1,
                max_size=4,
            )
        )
        publish_ms = now_ms - data.draw(st.integers(0, 50))  # stamps may step back a bit
        return commands.publish(
            publish_ms,
            [(topic, payload, publish_ms + delay, ttl) for topic, payload, delay, ttl in items],
        )
    if kind == "ack":
        return commands.ack(data.draw(pick_keys))
    if kind == "expire":
        return commands.expire(data.draw(pick_keys))
    if kind == "nack":
        chosen = data.draw(pick_keys)
        attempts = data.draw(
            st.lists(st.integers(1, 20), min_size=len(chosen), max_size=len(chosen))
        )
        return commands.nack(
            now_ms, data.draw(st.integers(0, 2000)), list(zip(chosen, attempts, strict=True))
        )
    if kind == "dead":
        chosen = data.draw(pick_keys)
        return commands.dead_letter(now_ms, [(key, 17) for key in chosen])
    if kind == "create":
        return commands.create_group(
            data.draw(st.sampled_from(TOPICS)),
            data.draw(st.sampled_from(GROUPS)),
            data.draw(st.none() | st.integers(1, 100_000)),
            data.draw(st.none() | st.integers(1, 50)),
            commands.GroupSettings(data.draw(st.integers(1, 9000)), data.draw(st.integers(1, 9))),
        )
    if kind == "purge":
        gids = sorted(state.deleting) or [999]
        return commands.purge_group(data.draw(st.sampled_from(gids)), data.draw(st.integers(0, 3)))
    if kind in ("delivered", "release"):
        chosen = data.draw(pick_keys)
        attempts = data.draw(
            st.lists(st.integers(0, 4), min_size=len(chosen), max_size=len(chosen))
        )
        make = commands.delivered if kind == "delivered" else commands.release
        return make(list(zip(chosen, attempts, strict=True)))
    if kind == "delete":
        return commands.delete_group(
            data.draw(st.sampled_from(TOPICS)), data.draw(st.sampled_from(GROUPS))
        )
    return commands.NOOP


def _invariants(state: QueueState) -> None:
    """Pending counts and open-entry counts agree with the schedule family."""
    per_group: dict[int, int] = {}
    per_message: dict[int, int] = {}
    for key in state.store.scan_keys("schedule", b""):
        gid, _due, mid = commands.parse_schedule_key(key)
        per_group[gid] = per_group.get(gid, 0) + 1
        per_message[mid] = per_message.get(mid, 0) + 1
        assert gid in state.groups or gid in state.deleting, "schedule entry of no group"
    pending = {gid: g.pending for gid, g in state.groups.items() if g.pending}
    pending.update({gid: d.pending for gid, d in state.deleting.items()})
    assert pending == per_group
    stored = {int.from_bytes(k, "big"): v for k, v in state.store.scan("messages", b"")}
    assert set(stored) == set(per_message), "message without entries, or entry without message"
    for mid in stored:
        message = state.get_message(mid)
        assert message is not None and message[4] == per_message[mid]


@settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data(), steps=st.integers(1, 40))
def test_memory_and_rocksdb_replicas_end_identical(data: st.DataObject, steps: int) -> None:
    with tempfile.TemporaryDirectory() as path:
        db = Database(path)
        try:
            memory = QueueState(MemoryStore())
            rocks = QueueState(db)
            memory_calls, rocks_calls = Recorder(memory), Recorder(rocks)
            now_ms = 10_000
            results: list[tuple[Any, Any]] = []
            for index in range(1, steps + 1):
                now_ms += data.draw(st.integers(0, 500))
                command = _draw_command(data, memory, now_ms)
                results.append((memory.apply(index, command), rocks.apply(index, command)))
                _invariants(memory)
            assert [a for a, _ in results] == [b for _, b in results]
            assert memory_calls.calls == rocks_calls.calls
            assert memory_calls.violations == rocks_calls.violations == []
            assert dump(memory.store) == dump(db)
            assert group_snapshot(memory) == group_snapshot(rocks)
            snapshot = (group_snapshot(rocks), rocks.last_publish_ms, rocks.applied_index)
            db.close()
            db = Database(path)
            rebuilt = QueueState(db)
            assert (rebuilt.last_publish_ms, rebuilt.applied_index) == snapshot[1:]
            assert group_snapshot(rebuilt) == snapshot[0]
            assert dump(db) == dump(memory.store)
            # Both continue identically after the restart (next group id, ids).
            follow = commands.create_group("fresh", "g", None, None)
            assert rebuilt.apply(steps + 1, follow) == memory.apply(steps + 1, follow)
        finally:
            db.close()
