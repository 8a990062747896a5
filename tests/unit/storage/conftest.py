"""Fixtures for the storage tests: the contract suite runs on MemoryStore and RocksDB."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from futureq.state.store import MemoryStore, StateStore
from futureq.storage.db import Database


@pytest.fixture(params=["memory", "rocksdb"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateStore]:
    """A MemoryStore, or a real Database in ``tmp_path`` (closed afterwards)."""
    if request.param == "memory":
        yield MemoryStore()
        return
    db = Database(str(tmp_path / "db"))
    yield db
    db.close()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    """A real Database in ``tmp_path``, closed afterwards."""
    database = Database(str(tmp_path / "db"))
    yield database
    database.close()
