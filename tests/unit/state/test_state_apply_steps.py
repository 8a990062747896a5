"""QueueState.apply_steps: the same result as apply, in bounded steps; and a write that
finds the disk full is retried without applying the command twice (issue 10, inputs 1, 6).
"""

from __future__ import annotations

from typing import Any

import pytest
from state_helpers import Recorder, StoreKit, dump, group_snapshot

from futureq.errors import NoSpaceError
from futureq.state import commands, publish
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


def test_the_plain_publish_path_leaves_what_the_item_loop_leaves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Batches of known one-group topics without headers or keys take
    ``publish.publish_plain``: the stored bytes, the digests, the results, the
    observer's calls and the number of steps are those of the item loop, which every
    other batch takes (TTLs all, none or some; several steps; several topics; a
    dead-letter batch; fan-out and new topics fall back to the loop)."""
    settings = commands.GroupSettings(5000, 3)

    def items(count: int, topics: int, ttl: Any) -> list[commands.PublishItem]:
        return [
            (f"t{i % topics}", bytes([i % 256]) * (i % 40), 1000 + (i * 7) % 300, ttl(i))
            for i in range(count)
        ]

    history = [
        commands.publish(900, items(3, 3, lambda i: None), settings),  # creates t0, t1, t2
        commands.publish(1000, items(100, 1, lambda i: None), settings),
        commands.publish(1001, items(130, 2, lambda i: 100 + i), settings),
        commands.publish(1002, items(300, 3, lambda i: None if i % 3 else 50), settings),
        commands.publish(1003, items(127, 1, lambda i: 9), settings),
        commands.publish(1004, items(1000, 2, lambda i: None), settings),
        commands.dead_letter(1005, [(commands.schedule_key(1, 1000, 2 << 16), 3)], settings),
        commands.publish(1006, items(50, 30, lambda i: None), settings),  # new topics
        commands.create_group("t0", "second", None, None),
        commands.publish(1007, items(200, 1, lambda i: None), settings),  # fan-out
        commands.publish(1008, items(20, 2, lambda i: None), settings, 60_000),
    ]
    runs = _plain_then_loop(monkeypatch, history, steps=True)
    assert runs[0] == runs[1]
    assert max(steps for _, steps in runs[0][2]) > 3


def _plain_then_loop(
    monkeypatch: pytest.MonkeyPatch, history: list[bytes], *, steps: bool
) -> list[tuple[Any, ...]]:
    """Apply ``history`` with the plain PUBLISH path, then with the item loop alone: the
    stored bytes, the digest, the results (with each apply's steps if ``steps``) and
    the observer's calls of each run."""
    runs = []
    for plain in (True, False):
        if not plain:
            monkeypatch.setattr(publish, "plain_targets", lambda state, items: None)
        state = QueueState(MemoryStore())
        recorder = Recorder(state)
        results = [run_steps(state, index, data) for index, data in enumerate(history, 1)]
        if not steps:
            results = [result for result, _ in results]
        runs.append((dump(state.store), state.applied_digest, results, recorder.calls))
    return runs


def test_the_plain_publish_path_matches_the_item_loop_on_edge_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Batches tried while trying to break ``publish_plain``: sizes around a step
    (1, 127, 128, 129, 10,000), TTL 0 beside none, non-ASCII and repeated topics, empty
    and 1 MiB payloads, a topic whose only group was deleted, a dead-letter topic, a new
    topic beside known ones. Same bytes, digest, results and observer calls."""
    settings = commands.GroupSettings(5000, 3)
    big = b"\xff" * (1 << 20)
    history = [
        commands.publish(900, [(t, b"", 1000, None) for t in ("a", "é", "日本", "x" * 255)]),
        commands.publish(901, [("a", b"", 1000, None)] * 1),
        commands.publish(902, [("é", b"p", 0, 0)] * 127),
        commands.publish(903, [("日本", big, 5, None), ("日本", b"", 5, 0)] * 64),
        commands.publish(904, [("a", b"", i, None if i % 2 else 0) for i in range(129)]),
        commands.publish(905, [("a", b"", 7, 1), ("é", b"", 7, None)] * 5000),
        commands.delete_group("x" * 255, "default"),
        commands.publish(906, [("x" * 255, b"", 9, None), ("a", b"", 9, None)] * 3),
        commands.publish(907, [("new", b"", 9, None), ("a", b"", 9, None)] * 70),
        commands.dead_letter(908, [(commands.schedule_key(1, 1000, 1 << 16), 3)], settings),
        commands.publish(909, [("a.dlq", b"", 10, None)] * 200),
    ]
    plain_batches: list[int] = []
    original = publish.publish_plain

    def counted(self: QueueState, *args: Any) -> Any:
        plain_batches.append(len(args[3]))
        return original(self, *args)

    monkeypatch.setattr(publish, "publish_plain", counted)
    # Steps may differ here: a topic first seen late in a batch ends the loop's step
    # sooner than the plain path's (they only decide when the event loop gets a turn).
    runs = _plain_then_loop(monkeypatch, history, steps=False)
    assert runs[0] == runs[1]
    assert plain_batches == [1, 127, 128, 129, 10_000, 200]  # the others take the loop
