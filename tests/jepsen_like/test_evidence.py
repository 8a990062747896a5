"""The evidence reader against a real RocksDB written by the real ``QueueState``.

The runner reads stopped nodes' data directories to tell a lost message (gone from
every node) from one the drain did not reach (still scheduled); this checks that the
reader finds exactly the schedule entries the state machine keeps, wherever a NACK
moved them, and nothing that was acked, and that a directory it cannot open is
reported rather than mistaken for an empty one.
"""

from __future__ import annotations

from pathlib import Path

from tests.jepsen_like.evidence import read_holdings

from futureq.state import commands
from futureq.state.commands import schedule_key
from futureq.state.queue_state import QueueState
from futureq.storage.db import Database


def _write_node(path: Path) -> dict[str, int]:
    db = Database(str(path))
    state = QueueState(db)
    index = 0

    def run(data: bytes) -> object:
        nonlocal index
        index += 1
        return state.apply(index, data)

    workers = run(commands.create_group("jobs", "workers", 2_000, 10))
    audit = run(commands.create_group("jobs", "audit", 2_000, 10))
    assert isinstance(workers, int) and isinstance(audit, int)
    first = run(commands.publish(1_000, [("jobs", b"1", 1_500, None)]))
    second = run(commands.publish(1_001, [("jobs", b"2", 1_600, None)]))
    assert isinstance(first, int) and isinstance(second, int)
    run(commands.ack([schedule_key(workers, 1_500, first), schedule_key(audit, 1_500, first)]))
    run(commands.ack([schedule_key(workers, 1_600, second)]))
    run(commands.nack(5_000, 700, [(schedule_key(audit, 1_600, second), 1)]))
    third = run(commands.publish(1_002, [("jobs", b"3", 1_700, None)]))
    assert isinstance(third, int)
    run(commands.ack([schedule_key(audit, 1_700, third)]))
    # Given back unprocessed: its schedule value grows to [attempt, expire, released, ...].
    run(commands.release([(schedule_key(workers, 1_700, third), 1)]))
    db.close()
    return {
        "workers": workers,
        "audit": audit,
        "first": first,
        "second": second,
        "third": third,
        "applied": index,
    }


def test_holdings_are_the_schedule_entries_still_kept(tmp_path: Path) -> None:
    ids = _write_node(tmp_path / "n1")
    wanted = [
        (ids["first"], "jobs", "workers"),
        (ids["first"], "jobs", "audit"),
        (ids["second"], "jobs", "workers"),
        (ids["second"], "jobs", "audit"),
        (ids["second"], "jobs", "gone"),
        (ids["third"], "jobs", "workers"),
    ]
    found = read_holdings(tmp_path / "n1", wanted)
    assert found == {
        "applied_index": ids["applied"],
        "groups": {"jobs/workers": ids["workers"], "jobs/audit": ids["audit"]},
        # Acked everywhere but for audit, whose NACK moved it to 5000 + 700.
        "held": [
            [ids["third"], "jobs", "workers", 1_700, 1],  # released: same due time
            [ids["second"], "jobs", "audit", 5_700, 1],
        ],
        "messages": [ids["second"], ids["third"]],
    }


def test_an_unreadable_directory_is_an_error_not_an_empty_node(tmp_path: Path) -> None:
    (tmp_path / "n1").write_text("not a database")
    found = read_holdings(tmp_path / "n1", [(1, "jobs", "audit")])
    assert set(found) == {"error"}
