"""Fixtures for the state tests: every QueueState test runs on memory and on RocksDB."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from state_helpers import StoreKit

from futureq.state.store import MemoryStore
from futureq.storage.db import Database


@pytest.fixture(params=["memory", "rocksdb"])
def kit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreKit]:
    """A store (MemoryStore or a real Database in ``tmp_path``) that can be reopened."""
    if request.param == "memory":
        made = StoreKit(lambda: MemoryStore(), durable=False)
    else:
        path = str(tmp_path / "db")
        made = StoreKit(lambda: Database(path), durable=True)
    yield made
    made.close()
