"""The open-file budget: client connections get what RocksDB and the rest leave."""

from __future__ import annotations

import logging

from futureq.fd_budget import MIN_CLIENT_CONNECTIONS, budget
from futureq.logging_setup import AcceptErrorFilter


def test_a_large_limit_leaves_max_connections_as_configured() -> None:
    shares = budget(10_000, 1 << 20)
    assert shares.client_connections == 10_000
    assert shares.storage_files == 1024
    assert shares.warning() is None


def test_the_common_1024_limit_keeps_room_for_rocksdb_and_says_so() -> None:
    shares = budget(10_000, 1024)
    taken = shares.storage_files + shares.other_files + shares.http_connections
    assert taken + shares.client_connections <= 1024
    assert shares.http_connections == 64 and shares.client_connections == 576
    warning = shares.warning()
    assert warning is not None
    assert "open-file limit (1024)" in warning and "LimitNOFILE" in warning


def test_a_tiny_limit_still_serves_a_few_clients() -> None:
    assert budget(10_000, 10).client_connections == MIN_CLIENT_CONNECTIONS


def test_http_connections_are_capped_and_taken_from_the_clients_share() -> None:
    assert budget(10_000, 1 << 20).http_connections == 128
    assert budget(10_000, 1 << 20, max_http_connections=5).http_connections == 5
    shares = budget(10_000, 256, max_http_connections=1000)
    assert shares.http_connections == 16
    assert shares.storage_files + shares.other_files + 16 + shares.client_connections <= 256


def test_accept_errors_are_logged_once_per_interval_without_traceback() -> None:
    accept_filter = AcceptErrorFilter(interval_s=60)
    try:
        raise OSError(24, "Too many open files")
    except OSError:
        import sys

        exc_info = sys.exc_info()
    records = [
        logging.LogRecord(
            "trio.serve_listeners", logging.ERROR, "", 0, "accept failed", (), exc_info
        )
        for _ in range(5)
    ]
    passed = [record for record in records if accept_filter.filter(record)]
    assert len(passed) == 1
    assert passed[0].exc_info is None
