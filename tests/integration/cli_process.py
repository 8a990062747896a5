"""Run ``futureq-cli`` for real, as a subprocess of this Python, against a node."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path


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


def keyed_jsonl(path: Path, topic: str, total: int) -> Path:
    """``total`` JSON lines for ``topic`` (payloads ``p0``...), each with its own
    idempotency key (``k0``...), written to ``path``."""
    path.write_text(
        "".join(
            f'{{"topic":"{topic}","payload":"p{i}","idempotency_key":"k{i}"}}\n'
            for i in range(total)
        )
    )
    return path


def sigint_as_a_terminal_gives_it() -> None:
    """A child's ``preexec_fn``: SIGINT's default action, as from a terminal (a CI that
    runs the tests in the background has SIGINT ignored, and children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
