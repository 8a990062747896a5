"""A node started with SIGINT ignored (a shell's background job: ``futureq start &`` in a
script) leaves it ignored, as POSIX asks of a program and Python itself does: the Ctrl-C
meant for the script does not stop it. SIGTERM still stops it gracefully; with SIGINT
as usual, SIGINT does too. Real ``futureq start`` processes, one node and two shards.

Before: the node installed its own SIGINT handler whatever it inherited, and stopped.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from broker_process import clean_env


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what a non-interactive shell's `&` does


@pytest.mark.parametrize("shards", ["1", "2"])
def test_a_node_started_with_sigint_ignored_keeps_it_ignored(tmp_path: Path, shards: str) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "futureq.cli.server_main",
            "start",
            "--data-dir",
            str(tmp_path / "data"),
            "--shards",
            shards,
            "--listen",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
        ],  # fmt: skip
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
        preexec_fn=_ignore_sigint,  # noqa: PLW1509 - one C call between fork and exec
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first.startswith("READY "), first
        process.send_signal(signal.SIGINT)
        time.sleep(1.0)
        assert process.poll() is None, "SIGINT, inherited ignored, stopped the node"
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        assert "received SIGINT" not in err, err
        assert "received SIGTERM" in err, err
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
