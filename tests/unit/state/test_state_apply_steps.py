"""QueueState.apply_steps: the same result as apply, in bounded steps; and a write that
finds the disk full is retried without applying the command twice (issue 10, inputs 1, 6).
"""

from __future__ import annotations

from typing import Any

import pytest
from state_helpers import Recorder, StoreKit, dump, group_snapshot

from futureq.errors import NoSpaceError
from futureq.state import commands
from futureq.state.queue_state import APPLY_STEP_ITEMS, QueueState
from futureq.state.store import Changes, MemoryStore


def commands_for_a_busy_day() -> list[bytes]:
    items = [(f"t{i % 700}", f"m{i}".encode(), 1000 + i, None) for i in range(3000)]
    return [
        commands.create_group("t1", "g", None, None),
        commands.publish(1000, items),
        commands.ack([commands.schedule_key(1, 1001, (2 << 16) + 1)]),
        commands.publish(2000, [("t1", b"late", 5000, 10)] * 300),
        commands.delete_group("t3", "default"),
    ]


def run_steps(state: QueueState, index: int, data: bytes) -> tuple[Any, int]:
    steps = state.apply_steps(index, data)
    count = 0
    while True:
        try:
            next(steps)
            count += 1
        except StopIteration as done:
            return done.value, count


def test_apply_steps_leaves_the_same_state_as_apply(kit: StoreKit) -> None:
    whole = QueueState(MemoryStore())
    stepped = QueueState(kit.store)
    whole_calls, stepped_calls = Recorder(whole), Recorder(stepped)
    for index, data in enumerate(commands_for_a_busy_day(), 1):
        expected = whole.apply(index, data)
        result, _ = run_steps(stepped, index, data)
        assert result == expected
    assert stepped.applied_digest == whole.applied_digest
    assert group_snapshot(stepped) == group_snapshot(whole)
    assert dump(stepped.store) == dump(whole.store)
    assert stepped_calls.calls == whole_calls.calls
    assert stepped_calls.violations == [] and stepped.total_pending == sum(
        g.pending for g in stepped.groups.values()
    )


def test_a_big_batch_of_new_topics_is_applied_in_many_short_steps() -> None:
    state = QueueState(MemoryStore())
    Recorder(state)
    items = [(f"new.{i}", b"x", 1000, None) for i in range(4000)]
    _, steps = run_steps(state, 1, commands.publish(1000, items))
    # New topics weigh more than repeat ones; notifications are stepped too.
    assert steps >= 4000 // APPLY_STEP_ITEMS * 2
    assert len(state.groups) == 4000


class FullOnce(MemoryStore):
    """A MemoryStore whose next ``fail`` writes raise NoSpaceError (nothing written)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = 0

    def write(self, changes: Changes, *, sync: bool = False) -> None:
        if self.fail:
            self.fail -= 1
            raise NoSpaceError("No space left on device")
        super().write(changes, sync=sync)


def test_a_write_that_finds_the_disk_full_is_retried_without_applying_twice() -> None:
    reference = QueueState(MemoryStore())
    store = FullOnce()
    state = QueueState(store)
    recorder = Recorder(state)
    for index, data in enumerate(commands_for_a_busy_day(), 1):
        expected = reference.apply(index, data)
        store.fail = 2
        for _ in range(2):
            with pytest.raises(NoSpaceError):
                state.apply(index, data)
            assert state.applied_index == index - 1  # not applied yet
        assert state.apply(index, data) == expected
    assert state.applied_digest == reference.applied_digest
    assert group_snapshot(state) == group_snapshot(reference)
    assert dump(store) == dump(reference.store)
    assert recorder.violations == []


def test_a_retry_must_be_of_the_same_entry() -> None:
    store = FullOnce()
    state = QueueState(store)
    store.fail = 1
    with pytest.raises(NoSpaceError):
        state.apply(1, commands.create_group("a", "g", None, None))
    with pytest.raises(AssertionError):
        state.apply(1, commands.create_group("b", "g", None, None))


def test_a_publish_applied_from_its_list_leaves_what_its_bytes_leave() -> None:
    """The leader of one node hands apply the command list it encoded (no second decode):
    the stored bytes, the digest, the result and the observer's calls are those of
    applying the bytes, for every item form (TTL, headers, idempotency key, new topic,
    duplicate key)."""
    items: list[commands.PublishItem] = [
        ("a", b"plain", 1500, None),
        ("a", b"ttl", 1600, 250),
        ("b", b"headers", 1700, None, {"k": "v"}, None),
        ("b", b"keyed", 1800, 60_000, None, "key-1"),
        ("c", b"both", 1900, None, {"x": "y"}, "key-2"),
        ("b", b"dup", 2000, None, None, "key-1"),
    ]
    runs = [
        (commands.publish_command(1000, items, commands.GroupSettings(5000, 3), 3_600_000), 2),
        (commands.publish_command(1100, items[:2], commands.GroupSettings(5000, 3)), 3),
    ]
    states = []
    for decoded in (False, True):
        state = QueueState(MemoryStore())
        recorder = Recorder(state)
        results = [state.apply(1, commands.create_group("a", "second", None, None))]
        for command_list, index in runs:
            data = commands.encode(command_list)
            steps = state.apply_steps(index, data, command_list if decoded else None)
            while True:
                try:
                    next(steps)
                except StopIteration as done:
                    results.append(done.value)
                    break
        states.append((dump(state.store), state.applied_digest, results, recorder.calls))
    assert states[1] == states[0]
    assert states[0][3], "the observer heard of the entries"
    assert states[0][2][1].duplicates == {5: (2 << 16) + 3}
