"""``lock_holder`` names the process holding RocksDB's lock on a LOCK file, taking nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from futureq.shards.supervisor import lock_holder
from futureq.storage.db import Database

HOLD = """
import sys
from futureq.storage.db import Database
db = Database(sys.argv[1])
print("open", flush=True)
sys.stdin.read()
db.close()
"""


def test_lock_holder_names_the_process_that_has_the_rocksdb_open(tmp_path: Path) -> None:
    path = tmp_path / "db"
    assert lock_holder(str(path / "LOCK")) is None  # no such file
    Database(str(path)).close()
    assert lock_holder(str(path / "LOCK")) is None  # closed: nobody holds it
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "open\n"
        assert lock_holder(str(path / "LOCK")) == child.pid
        assert lock_holder(str(path / "LOCK")) == child.pid  # asking took nothing
    finally:
        child.communicate("", timeout=30)
    assert lock_holder(str(path / "LOCK")) is None
