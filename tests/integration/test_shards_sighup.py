"""SIGHUP (credentials reload) on a node of 2 shards, as real processes.

The supervisor forwards a SIGHUP to its shards, and answers on the node's HTTP port
itself while shard 0 is not serving (``docs/sharding.md``, "While shard 0 is down"),
checking tokens as shard 0 does: both must act on the credentials as reloaded.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from test_limits_access import write_credentials
from test_shards import ShardedNode

HTTP_TIMEOUT_S = 15.0
"""Longest the test waits for one answer of the node's port (it must answer well before)."""


def get(node: ShardedNode, path: str, token: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://{node.http_address}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def wait_until(condition: object, what: str, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"still not {what}"
        time.sleep(0.1)


def test_the_supervisor_checks_tokens_as_reloaded_while_shard_0_is_stopped(
    tmp_path: Path,
) -> None:
    """A new credentials file and a SIGHUP to the node: its shards reload it, and so does
    the supervisor, which checks the tokens on the node's HTTP port while shard 0 does
    not serve. Before, it kept the file it read at start: the new client got 401 from it
    and the removed one still read the node's status and metrics."""
    credentials = tmp_path / "clients.toml"
    old = write_credentials(credentials, {"watcher": {"monitor": True}})
    made = ShardedNode(tmp_path / "data")
    made.env = {**(made.env or {}), "FUTUREQ_SERVER_CREDENTIALS_FILE": str(credentials)}
    made.start()
    stopped: int | None = None
    try:
        wait_until(lambda: get(made, "/readyz")[0] == 200, "ready")
        assert get(made, "/api/status", old["watcher"])[0] == 200
        new = write_credentials(credentials, {"auditor": {"monitor": True}})
        os.kill(made.pid, signal.SIGHUP)
        wait_until(
            lambda: made.stderr_text().count("SIGHUP: reloaded 1 client credentials") >= 2,
            "reloaded by both shards",
        )
        assert get(made, "/api/status", new["auditor"])[0] == 200
        assert get(made, "/api/status", old["watcher"])[0] == 401
        stopped = made.pid_of_shard(0)
        assert stopped is not None
        os.kill(stopped, signal.SIGSTOP)
        wait_until(
            lambda: b"is not answering" in get(made, "/healthz")[1], "answered by the supervisor"
        )
        status, body = get(made, "/api/status", new["auditor"])
        assert status == 503 and b"shard 0: is not answering" in body, (status, body)
        assert get(made, "/api/status", old["watcher"])[0] == 401
        assert get(made, "/metrics", old["watcher"])[0] == 401
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        made.terminate()
        made.kill()


def test_a_sighup_while_the_shards_start_does_not_kill_them(tmp_path: Path) -> None:
    """SIGHUPs sent to the node while its shard processes start (``systemctl reload``
    right after ``start``, a config watcher): a shard process still loading Python has
    no handler yet, and the default action of SIGHUP ends it. Before, the supervisor
    forwarded them at once, a shard died of the signal before it was ready, and the node
    stopped; a shard gets the reload once it is ready (its handler is in place)."""
    made = ShardedNode(tmp_path / "data")
    done = threading.Event()
    sent: list[int] = []

    def reload_again_and_again() -> None:
        # Once the supervisor runs its shards (it is past its own start), until READY.
        while not done.is_set():
            if made.process is not None and made.process.poll() is None:
                try:
                    if made.shard_pids():
                        os.kill(made.pid, signal.SIGHUP)
                        sent.append(1)
                except (FileNotFoundError, ProcessLookupError):
                    pass
            time.sleep(0.01)

    sender = threading.Thread(target=reload_again_and_again, daemon=True)
    sender.start()
    try:
        made.start()  # raises when the node stopped before READY
    finally:
        done.set()
        sender.join(10)
    try:
        assert sent, "no SIGHUP was sent while the shards started"
        log = made.stderr_text()
        assert "exited with code" not in log, log[-4000:]
        # Each shard acted on a reload once ready (no credentials file: nothing to load).
        wait_until(
            lambda: made.stderr_text().count("SIGHUP: no credentials file is configured") >= 2,
            "reloaded by both shards",
        )
    finally:
        code = made.terminate()
        made.kill()
    assert code == 0, made.stderr_text()[-4000:]
