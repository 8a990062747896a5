"""File descriptors: how many client connections the process's open-file limit leaves room for.

Every client connection, Raft peer link, HTTP connection and RocksDB file takes one file
descriptor out of the process's open-file limit (``RLIMIT_NOFILE``; 1024 by default on
many Linux hosts). If client connections could take them all, RocksDB could not open
its next write-ahead log or table file and the node would stop with a storage failure:
so a client, careless or hostile, holding a thousand idle connections could stop a node.

The budget therefore splits the limit (``docs/operations.md``, "Limits"):

* RocksDB keeps at most :attr:`FdBudget.storage_files` table files open (its
  ``max_open_files``; more are reopened as needed);
* :attr:`FdBudget.other_files` stay for Raft peers, the listening sockets, log and lock
  files and RocksDB's logs and compaction outputs;
* HTTP connections (``/metrics``, the dashboard, ``/ws``) get
  :attr:`FdBudget.http_connections`: ``limits.max_http_connections``, at most a sixteenth
  of the limit; one more is answered ``503`` and closed at once;
* client connections get the rest, at most ``limits.max_connections``; a connection
  beyond it is told ``TOO_MANY_CONNECTIONS`` and closed at once, instead of holding a
  descriptor while it waits.

``futureq start`` first raises the soft limit to the hard one, as Go programs and many
servers do: the hard limit is what the operator allowed.
"""

from __future__ import annotations

import logging
from typing import Final

import attrs

log = logging.getLogger(__name__)

STORAGE_FILES: Final = 1024
"""Most RocksDB table files kept open (RocksDB ``max_open_files``) with a large limit."""
OTHER_FILES: Final = 256
"""Descriptors kept for everything but client connections and RocksDB tables."""
MIN_CLIENT_CONNECTIONS: Final = 16
"""Client connections allowed however small the open-file limit."""
MIN_HTTP_CONNECTIONS: Final = 8
"""HTTP connections allowed however small the open-file limit (if configured so high)."""
UNLIMITED: Final = 1 << 20
"""What an unlimited (``RLIM_INFINITY``) or unknown open-file limit counts as."""


@attrs.frozen
class FdBudget:
    """How the open-file limit is shared.

    Attributes:
        open_files: The process's (soft) open-file limit.
        storage_files: RocksDB ``max_open_files``.
        other_files: Kept for peers, listeners, logs and RocksDB's own files.
        client_connections: Most client connections served at once.
        max_connections: ``limits.max_connections`` as configured.
        http_connections: Most HTTP connections served at once.
    """

    open_files: int
    storage_files: int
    other_files: int
    client_connections: int
    max_connections: int
    http_connections: int = 0

    @property
    def limited_by_open_files(self) -> bool:
        """True when the open-file limit, not ``limits.max_connections``, sets the count."""
        return self.client_connections < self.max_connections

    def warning(self) -> str | None:
        """A sentence for the log when the open-file limit lowers the connection count."""
        if not self.limited_by_open_files:
            return None
        return (
            f"limits.max_connections = {self.max_connections} but the open-file limit "
            f"({self.open_files}) leaves room for {self.client_connections} client "
            f"connections (after {self.storage_files} for RocksDB, {self.other_files} for "
            f"peers, listeners and logs and {self.http_connections} for HTTP connections); "
            "more are refused with TOO_MANY_CONNECTIONS. Raise the "
            "limit (ulimit -n, systemd LimitNOFILE=, the container runtime's nofile) or "
            "lower limits.max_connections"
        )


def budget(max_connections: int, open_files: int, max_http_connections: int = 128) -> FdBudget:
    """Share ``open_files`` descriptors between RocksDB, the rest, HTTP and client
    connections.

    Args:
        max_connections: ``limits.max_connections``.
        open_files: The soft open-file limit (:func:`open_file_limit`).
        max_http_connections: ``limits.max_http_connections``.
    """
    storage = min(STORAGE_FILES, max(64, open_files // 4))
    other = min(OTHER_FILES, max(32, open_files // 8))
    http = max(1, min(max_http_connections, max(MIN_HTTP_CONNECTIONS, open_files // 16)))
    room = max(MIN_CLIENT_CONNECTIONS, open_files - storage - other - http)
    return FdBudget(open_files, storage, other, min(max_connections, room), max_connections, http)


def open_file_limit(*, hard: bool = False) -> int:
    """The process's open-file limit (soft, or ``hard``); :data:`UNLIMITED` if none."""
    try:
        import resource
    except ImportError:  # not a Unix
        return UNLIMITED
    soft_limit, hard_limit = resource.getrlimit(resource.RLIMIT_NOFILE)
    value = hard_limit if hard else soft_limit
    if value == resource.RLIM_INFINITY or value <= 0:
        return UNLIMITED
    return int(min(value, UNLIMITED))


def raise_open_file_limit() -> int:
    """Raise the soft open-file limit to the hard one (or :data:`UNLIMITED`).

    Returns:
        The soft limit now in force.
    """
    try:
        import resource
    except ImportError:
        return UNLIMITED
    soft_limit, hard_limit = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED if hard_limit == resource.RLIM_INFINITY else hard_limit
    if soft_limit != resource.RLIM_INFINITY and soft_limit < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard_limit))
        except (ValueError, OSError) as exc:
            log.debug("could not raise the open-file limit to %d: %s", target, exc)
    return open_file_limit()
