"""A ``futureq start`` subprocess on 127.0.0.1 with its own RocksDB directory."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 15.0
ANY_PORTS = ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"]
"""The listeners' ports unless ``$FUTUREQ_TEST_PORTS`` confines them (``FIRST-LAST``)."""


def clean_env() -> dict[str, str]:
    """This environment without FUTUREQ_* variables: what a plain ``futureq start`` from
    the README sees (no setting of the test run's own leaks in)."""
    return {name: value for name, value in os.environ.items() if not name.startswith("FUTUREQ_")}


class BrokerProcess:
    """A ``futureq start`` subprocess and its addresses.

    Attributes:
        data_dir: The node's RocksDB directory (kept across restarts).
        client_address: ``127.0.0.1:PORT`` of the client listener.
        http_address: ``127.0.0.1:PORT`` of the HTTP endpoints.
        process: The running ``subprocess.Popen``.
    """

    def __init__(
        self,
        data_dir: Path,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        *,
        open_files: int | None = None,
        shards: str | None = "1",
    ) -> None:
        self.data_dir = data_dir
        self.extra_args = list(extra_args or [])
        self.shards_arg = shards
        """``--shards`` given before ``extra_args`` (which may give another, the last
        wins): "1" by default, since a test of something else than shards runs one
        process (the default, one shard per core, would triple the processes of the
        suite); None: no flag, the node's default (auto)."""
        self.env = env
        self.open_files = open_files
        """The node's open-file limit (soft and hard), as ``ulimit -n``; None: inherited."""
        self.client_address = ""
        self.http_address = ""
        self.process: subprocess.Popen[str] | None = None
        self.stderr_path = data_dir.parent / f"{data_dir.name}.stderr.log"
        self._port_args: list[str] = list(ANY_PORTS)

    def start(self) -> None:
        """Start the node and wait for its READY line.

        Raises:
            RuntimeError: it exited or did not get ready within START_TIMEOUT_S.
        """
        args = [
            sys.executable,
            "-m",
            "futureq.cli.server_main",
            "start",
            "--data-dir",
            str(self.data_dir),
        ]
        if self.shards_arg is not None:
            args += ["--shards", self.shards_arg]
        if self._port_args == ANY_PORTS and os.environ.get("FUTUREQ_TEST_PORTS"):
            # A machine whose ports are shared out: the listeners take ports of the
            # test run's range too, not any port the OS picks (cluster_process.free_runs).
            from cluster_process import free_ports  # noqa: PLC0415 - it imports this module

            client_port, http_port = free_ports(2)
            self._port_args = [
                "--listen",
                f"127.0.0.1:{client_port}",
                "--http",
                f"127.0.0.1:{http_port}",
            ]
        args += self._port_args + self.extra_args
        env = dict(os.environ)
        env.update(self.env or {})
        stderr = open(self.stderr_path, "a")  # noqa: SIM115 - kept open for the process lifetime
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
            preexec_fn=None if self.open_files is None else self._limit_open_files,
        )
        stderr.close()
        line: list[str] = []

        def read_ready() -> None:
            assert self.process is not None and self.process.stdout is not None
            line.append(self.process.stdout.readline())

        reader = threading.Thread(target=read_ready, daemon=True)
        reader.start()
        reader.join(START_TIMEOUT_S)
        if not line or not line[0].startswith("READY "):
            self.kill()
            raise RuntimeError(
                f"broker did not start; stderr:\n{self.stderr_path.read_text()[-4000:]}"
            )
        fields = dict(part.split("=", 1) for part in line[0].split()[1:])
        self.client_address = fields["client"]
        self.http_address = fields["http"]
        # Reuse the same ports on restart so clients can reconnect to the same address.
        self._port_args = ["--listen", self.client_address, "--http", self.http_address]

    def _limit_open_files(self) -> None:
        assert self.open_files is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.open_files, self.open_files))

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL the node (a crash) and reap it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT_S)
        self._close_pipe()

    def _close_pipe(self) -> None:
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()

    def terminate(self) -> int:
        """SIGTERM (graceful shutdown); SIGKILL if it is still running after the deadline.

        Returns:
            The exit code.
        """
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)
        self._close_pipe()
        return self.process.returncode

    def restart(self) -> None:
        """Stop (SIGKILL if running) and start again on the same ports and data."""
        self.kill()
        self.start()

    def stderr_text(self) -> str:
        """Everything the node logged so far."""
        return self.stderr_path.read_text()

    def wait_logged(self, text: str, within_s: float = 10.0) -> None:
        """Block until the node has logged ``text``; fail the test (with the log's end)
        if it has not within ``within_s`` seconds."""
        deadline = time.monotonic() + within_s
        while text not in self.stderr_text():
            assert time.monotonic() < deadline, self.stderr_text()[-3000:]
            time.sleep(0.02)


def connection_buffer_bytes(http_address: str, direction: str) -> float:
    """The node's ``futureq_connection_buffer_bytes`` for ``direction`` ("in" or "out"),
    read from its /metrics."""
    with urllib.request.urlopen(f"http://{http_address}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    found = re.search(rf'futureq_connection_buffer_bytes\{{direction="{direction}"\}} (\S+)', text)
    assert found, f"no {direction}bound buffer gauge"
    return float(found.group(1))
