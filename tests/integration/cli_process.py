"""Run ``futureq-cli`` for real, as a subprocess of this Python, against a node."""

from __future__ import annotations

import json
import subprocess
import sys


def cli(address: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``futureq-cli --server ADDRESS ARGS...``: its exit code, stdout and stderr (text)."""
    return subprocess.run(
        [sys.executable, "-m", "futureq.cli.client_main", "--server", address, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def pending(address: str, topic: str) -> int:
    """Messages pending in every group of ``topic``, from ``futureq-cli status --json``."""
    status = json.loads(cli(address, "status", "--json").stdout)
    return sum(
        group["pending"]
        for entry in status["topics"]
        if entry["topic"] == topic
        for group in entry["groups"]
    )
