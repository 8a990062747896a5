"""Run ``futureq-cli`` for real, as a subprocess of this Python, against a node."""

from __future__ import annotations

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
