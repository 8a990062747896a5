"""Shared pytest options and fixtures.

Options: ``--run-slow`` runs tests marked ``slow`` (long fault and soak runs).
"""

from __future__ import annotations

import signal

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow", action="store_true", default=False, help="also run tests marked slow"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip_slow = pytest.mark.skip(reason="slow: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)


def pytest_configure(config: pytest.Config) -> None:
    """Run the suite with SIGINT at its default even when started with it ignored (a
    background job of a non-interactive shell): a node keeps an ignored SIGINT ignored,
    as POSIX asks, and the tests that stop nodes with SIGINT mean the usual one. The
    processes they start get the default (a handler is reset at exec; SIG_IGN is not)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
