"""Reading a process's children and command line from ``/proc`` while it may exit.

A process that exits between listing and reading makes ``/proc/PID/...`` raise
FileNotFoundError or, while it is being torn down, ProcessLookupError (ESRCH): both
mean "gone" here, so every read catches OSError.
"""

from __future__ import annotations

from pathlib import Path


def children(pid: int) -> list[int]:
    """PIDs of ``pid``'s children, any order; ``[]`` once ``pid`` is gone."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue  # the thread ended meanwhile
    return found


def argv(pid: int) -> list[bytes]:
    """``pid``'s command line, split at NULs; ``[]`` once it is gone (or a zombie)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def shard_index(pid: int) -> int | None:
    """K when ``pid`` runs ``futureq start --shard-index K`` (exec'd, not only forked)."""
    words = argv(pid)
    if b"--shard-index" not in words:
        return None
    where = words.index(b"--shard-index")
    return int(words[where + 1]) if where + 1 < len(words) else None


def alive(pid: int) -> bool:
    """Running: not gone and not a zombie (a zombie is gone for our purposes)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
