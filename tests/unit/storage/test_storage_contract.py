"""The StateStore contract, held by MemoryStore and the RocksDB Database alike.

Simulations and unit tests run QueueState on MemoryStore; production runs it on
RocksDB. This suite keeps the fake honest (``STYLE.md`` §8): same reads, same order,
same bounds, same atomic writes, same view during a scan.
"""

from __future__ import annotations

import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from futureq.state.store import MemoryStore, StateStore
from futureq.storage.db import FAMILIES, Database

KEYS = [b"", b"\x00", b"a", b"a\x00", b"a\xff", b"ab", b"b", b"\xff", b"\xff\xff"]


def _fill(store: StateStore) -> None:
    store.write({"messages": {key: b"v" + key for key in KEYS if key}})


def test_get_of_missing_key_and_family_isolation(any_store: StateStore) -> None:
    assert any_store.get("messages", b"k") is None
    any_store.write({"messages": {b"k": b"1"}, "schedule": {b"k": b"2"}})
    assert any_store.get("messages", b"k") == b"1"
    assert any_store.get("schedule", b"k") == b"2"
    assert any_store.get("groups", b"k") is None


def test_write_puts_and_deletes_across_families_together(any_store: StateStore) -> None:
    any_store.write({"messages": {b"m1": b"x", b"m2": b"y"}, "meta": {b"applied": b"\x01"}})
    any_store.write(
        {
            "messages": {b"m1": None, b"m3": b"z", b"never": None},
            "schedule": {b"s": b"e"},
            "meta": {b"applied": b"\x02"},
        }
    )
    assert list(any_store.scan("messages", b"")) == [(b"m2", b"y"), (b"m3", b"z")]
    assert any_store.get("schedule", b"s") == b"e"
    assert any_store.get("meta", b"applied") == b"\x02"


def test_empty_value_is_stored_not_deleted(any_store: StateStore) -> None:
    any_store.write({"groups": {b"k": b""}})
    assert any_store.get("groups", b"k") == b""
    assert list(any_store.scan_keys("groups", b"")) == [b"k"]


@pytest.mark.parametrize(
    ("start", "stop"),
    [
        (b"", None),
        (b"a", b"b"),
        (b"a\x00", b"ab"),
        (b"a", b"a"),
        (b"b", b"a"),
        (b"\x00", b"\xff"),
        (b"c", None),
        (b"\xff\xff\xff", None),
        (b"", b"\x00"),
    ],
)
def test_scan_and_scan_keys_cover_start_inclusive_stop_exclusive(
    any_store: StateStore, start: bytes, stop: bytes | None
) -> None:
    _fill(any_store)
    expected = sorted(k for k in KEYS if k and k >= start and (stop is None or k < stop))
    assert list(any_store.scan_keys("messages", start, stop)) == expected
    assert list(any_store.scan("messages", start, stop)) == [(k, b"v" + k) for k in expected]


def test_scan_sees_the_store_as_it_was_when_it_started(any_store: StateStore) -> None:
    _fill(any_store)
    scan = any_store.scan("messages", b"a")
    first = next(scan)
    any_store.write({"messages": {b"ab": None, b"b": b"changed", b"a\x01": b"new"}})
    rest = list(scan)
    assert [first, *rest] == [(k, b"v" + k) for k in sorted(KEYS) if k >= b"a"]
    keys = any_store.scan_keys("messages", b"a")
    assert next(keys) == b"a"
    any_store.write({"messages": {b"a\xff": None, b"a\x02": b"new"}})
    assert list(keys) == [b"a\x00", b"a\x01", b"a\xff", b"b", b"\xff", b"\xff\xff"]


_writes = st.lists(
    st.dictionaries(
        st.sampled_from(["messages", "schedule", "meta"]),
        st.dictionaries(st.sampled_from(KEYS), st.none() | st.binary(max_size=3), max_size=4),
        max_size=3,
    ),
    max_size=12,
)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(writes=_writes, start=st.sampled_from(KEYS), stop=st.none() | st.sampled_from(KEYS))
def test_memory_store_and_database_agree_on_random_writes(
    writes: list[dict[str, dict[bytes, bytes | None]]], start: bytes, stop: bytes | None
) -> None:
    memory = MemoryStore()
    with tempfile.TemporaryDirectory() as path:
        database = Database(path)
        try:
            model: dict[str, dict[bytes, bytes]] = {f: {} for f in FAMILIES}
            for changes in writes:
                memory.write(changes)
                database.write(changes)
                for family, items in changes.items():
                    for key, value in items.items():
                        if value is None:
                            model[family].pop(key, None)
                        else:
                            model[family][key] = value
            for family in ("messages", "schedule"):
                expected = sorted(
                    (k, v)
                    for k, v in model[family].items()
                    if k >= start and (stop is None or k < stop)
                )
                for store in (memory, database):
                    assert list(store.scan(family, start, stop)) == expected
                    assert list(store.scan_keys(family, start, stop)) == [k for k, _ in expected]
                    for key in KEYS:
                        assert store.get(family, key) == model[family].get(key)
        finally:
            database.close()
