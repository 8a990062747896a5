"""DueIndex against a trivial model: a list of ``(due_ms, mid, expire_ms, attempt)``.

Source: ``DESIGN.md``, "Message semantics" (nothing is delivered before it is due) and
``STYLE.md`` §8 (model-based stateful tests).
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from futureq.state.due_index import DueIndex, pack, unpack

Entry = tuple[int, int, int | None, int]

DUE = st.integers(0, 12)
MID = st.integers(0, 10) | st.just((1 << 64) - 1)
NOW = st.integers(-1, 14)
LIMIT = st.integers(1, 6)


class DueIndexMachine(RuleBasedStateMachine):
    """Every operation must agree with the sorted-list model."""

    def __init__(self) -> None:
        super().__init__()
        self.index = DueIndex()
        self.model: list[Entry] = []

    def _mids(self) -> set[int]:
        return {mid for _, mid, _, _ in self.model}

    def _remove(self, due_ms: int, mid: int) -> None:
        self.model = [e for e in self.model if (e[0], e[1]) != (due_ms, mid)]

    @rule(due=DUE, mid=MID, expire=st.none() | st.integers(0, 16), attempt=st.integers(0, 3))
    def add(self, due: int, mid: int, expire: int | None, attempt: int) -> None:
        if mid in self._mids():  # one entry per message in a group's index
            return
        self.index.add(due, mid, expire, attempt)
        self.model.append((due, mid, expire, attempt))

    @rule(data=st.data())
    def discard(self, data: st.DataObject) -> None:
        choices = [(d, m) for d, m, _, _ in self.model] + [(7, 12345)]
        due, mid = data.draw(st.sampled_from(choices))
        expected = (due, mid) in [(d, m) for d, m, _, _ in self.model]
        assert self.index.discard(due, mid) is expected
        self._remove(due, mid)

    @rule(now=NOW, limit=LIMIT)
    def pop_due(self, now: int, limit: int) -> None:
        got = self.index.pop_due(now, limit)
        expected = sorted(e for e in self.model if e[0] <= now)[:limit]
        assert all(due <= now for due, _, _, _ in got), "popped an entry before it was due"
        assert got == [(d, m, x, a) for d, m, x, a in expected]
        for due, mid, _, _ in got:
            self._remove(due, mid)

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data(), offset=st.sampled_from([-1, 0]), limit=LIMIT)
    def pop_due_at_an_edge(self, data: st.DataObject, offset: int, limit: int) -> None:
        """Pop exactly at (or one ms before) an entry's due time: the boundary case."""
        due = data.draw(st.sampled_from([e[0] for e in self.model]))
        self.pop_due(due + offset, limit)

    @rule(now=NOW, limit=LIMIT)
    def pop_expired(self, now: int, limit: int) -> None:
        got = self.index.pop_expired(now, limit)
        expired = sorted(
            (e[2], e[1], e[0]) for e in self.model if e[2] is not None and e[2] <= now
        )[:limit]
        attempts = {(e[0], e[1]): e[3] for e in self.model}
        assert got == [(due, mid, expire, attempts[(due, mid)]) for expire, mid, due in expired]
        for due, mid, _, _ in got:
            self._remove(due, mid)

    @precondition(lambda self: bool(self.model))
    @rule()
    def pop_last(self) -> None:
        due, mid, _, _ = max(self.model)
        assert self.index.pop_last() == (due, mid)
        self._remove(due, mid)

    @rule(now=NOW)
    def count_due(self, now: int) -> None:
        assert self.index.count_due(now) == sum(1 for e in self.model if e[0] <= now)

    @rule()
    def clear(self) -> None:
        self.index.clear()
        self.model = []

    @invariant()
    def agrees_with_model(self) -> None:
        assert len(self.index) == len(self.model)
        ordered = sorted(self.model)
        assert self.index.next_due_ms() == (ordered[0][0] if ordered else None)
        expiries = [e[2] for e in self.model if e[2] is not None]
        assert self.index.next_expire_ms() == (min(expiries) if expiries else None)
        assert self.index.first() == (pack(*ordered[0][:2]) if ordered else None)
        assert self.index.last() == (pack(*ordered[-1][:2]) if ordered else None)
        for due, mid, _, _ in self.model:
            assert pack(due, mid) in self.index


TestDueIndexModel = DueIndexMachine.TestCase
TestDueIndexModel.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, derandomize=True
)


def test_pack_sorts_by_due_then_id_and_round_trips() -> None:
    assert pack(1, (1 << 64) - 1) < pack(2, 0)
    assert pack(5, 3) < pack(5, 4)
    assert unpack(pack(123, (1 << 64) - 1)) == (123, (1 << 64) - 1)


def test_pop_due_rejects_limit_below_one() -> None:
    index = DueIndex()
    index.add(1, 1)
    with pytest.raises(ValueError, match="limit"):
        index.pop_due(10, 0)
    assert len(index) == 1


def test_pop_due_ties_come_in_id_order() -> None:
    index = DueIndex()
    for mid in (9, 3, 7):
        index.add(100, mid)
    index.add(99, 50)
    assert [m for _, m, _, _ in index.pop_due(100, 10)] == [50, 3, 7, 9]


def test_pop_due_returns_expiry_and_attempt_of_nacked_entries() -> None:
    index = DueIndex()
    index.add(10, 1, expire_ms=20, attempt=0)
    index.add(10, 2, expire_ms=None, attempt=4)
    index.add(10, 3)
    assert index.pop_due(10, 5) == [(10, 1, 20, 0), (10, 2, None, 4), (10, 3, None, 0)]
    assert index.next_expire_ms() is None


def test_pop_last_of_empty_index_raises_index_error() -> None:
    with pytest.raises(IndexError):
        DueIndex().pop_last()
