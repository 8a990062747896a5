"""Configuration tests read no setting from the environment they run in."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset every ``FUTUREQ_*`` variable (CI sets some; a developer may have others)."""
    for name in list(os.environ):
        if name.startswith("FUTUREQ_"):
            monkeypatch.delenv(name)
