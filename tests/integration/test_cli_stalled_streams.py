"""``futureq-cli`` with stdout or stderr that cannot be written as usual, against a real
node, the command a subprocess. Found by a tester (``browse`` and ``dlq list`` were
fixed before; these are the rest of the commands):

* A reader that pauses (``status | less``, a pipe full): ``status``, ``cluster
  status``, ``group list``, ``topic list``, ``cancel``, ``publish`` and the others
  wrote their results on the event loop, so the loop froze on the full pipe, the
  server's keepalive PING went unanswered and the broker closed the connection
  (``dlq redrive``'s progress on a paused stderr, ``2>&1 | less``, the same).
* stderr closed (``2>&-``): a progress line or a failed line's report killed the
  command with an AttributeError nobody saw: ``dlq redrive`` stopped after its first
  chunk, ``publish --file`` never printed its summary; a usage error's usage went
  to stdout.
* A reader gone before the results (``group list | true``): the table's writer
  (rich) exited 1 where every other command ends quietly, exit status 0;
  ``completion bash | true`` ended in a BrokenPipeError traceback.
"""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from broker_process import BrokerProcess
from cli_process import cli, pending

from futureq.cli import client_main

KEEPALIVE_MS = 300
"""The brokers' keepalive interval and timeout here: silent for both, a client is closed."""

F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (Linux; the module names it from Python 3.10)


def _command(address: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "futureq.cli.client_main", "--server", address, *args]


def _keepalive_closes(broker: BrokerProcess) -> float:
    """Connections the broker closed as silent (``futureq_connections_closed_total``
    with reason ``keepalive_timeout``, summed over its label sets)."""
    with urllib.request.urlopen(f"http://{broker.http_address}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(value)
        for value in re.findall(
            r'^futureq_connections_closed_total\{[^}]*reason="keepalive_timeout"[^}]*\} (\S+)$',
            text,
            flags=re.MULTILINE,
        )
    )


def _full_pipe() -> tuple[int, int, int]:
    """A pipe of one page whose buffer is already full: the first write to it waits
    until the reader reads. Returns ``(read_fd, write_fd, filler_bytes)``."""
    read_fd, write_fd = os.pipe()
    fcntl.fcntl(write_fd, F_SETPIPE_SZ, 4096)
    os.set_blocking(write_fd, False)
    filled = 0
    try:
        while True:
            filled += os.write(write_fd, b"#" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(write_fd, True)
    return read_fd, write_fd, filled


def _wait_blocked_writing(process: subprocess.Popen[bytes], within_s: float = 15) -> None:
    """Wait until a thread of ``process`` waits in a write to a pipe (Linux
    ``/proc/PID/task/TID/wchan``), i.e. it has its results and the reader holds it."""
    deadline = time.monotonic() + within_s
    while True:
        assert process.poll() is None, "the command ended before writing"
        for task in os.listdir(f"/proc/{process.pid}/task"):
            try:
                wchan = Path(f"/proc/{process.pid}/task/{task}/wchan").read_text()
            except OSError:
                continue  # that thread ended meanwhile
            if "pipe_write" in wchan:
                return
        assert time.monotonic() < deadline, "the command never waited on its full pipe"
        time.sleep(0.02)


def _drain(read_fd: int) -> bytes:
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    return b"".join(chunks)


def _dead_letters(address: str, topic: str, count: int) -> None:
    """``count`` dead letters of ``topic`` (group ``g`` with max_deliveries 1, each
    message nacked once)."""
    made = cli(address, "group", "create", topic, "g", "--max-deliveries", "1")
    assert made.returncode == 0, made.stderr
    lines = "".join(f'{{"topic":"{topic}","payload":"m{i}"}}\n' for i in range(count))
    sent = subprocess.run(
        _command(address, "publish", "--file", "-"),
        input=lines,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert sent.returncode == 0, sent.stderr
    nacked = cli(address, "consume", topic, "--group", "g", "--count", str(count), "--nack")
    assert nacked.returncode == 0, nacked.stderr


# (the command's words, what its output on the paused stream holds, and which stream
# pauses). Every command class: reads of the cluster, admin, publish, manage; the
# topic p.t has group g and one message.
PAUSED = {
    "status": (["status"], "consumer groups", "stdout"),
    "cluster status": (["cluster", "status"], "applied index", "stdout"),
    "group list": (["group", "list"], "consumer groups", "stdout"),
    "topic list --json": (["topic", "list", "--json"], '"topic": "p.t"', "stdout"),
    "group create": (["group", "create", "p.t", "g2"], "group 'g2' of topic 'p.t'", "stdout"),
    "publish": (["publish", "p.t", "m"], "\n", "stdout"),
    "publish --file": (["publish", "--file", "{lines}"], "0 failed line(s)", "stdout"),
    "cancel": (["cancel", "p.t", "1", "2", "3"], "cancelled 0 of 3 in topic 'p.t'", "stdout"),
    "reschedule": (["reschedule", "p.t", "1", "--delay", "1m"], "rescheduled 0 of 1", "stdout"),
    "browse --counts": (["browse", "p.t", "--counts"], "later (or parked): 0", "stdout"),
    "purge": (["purge", "p.t", "--yes"], "purging 1 pending", "stdout"),
    "dlq redrive (progress on stderr)": (
        ["dlq", "redrive", "d.t", "--all"],
        "redrive: 3/3",
        "stderr",
    ),
}


@pytest.mark.parametrize("name", list(PAUSED))
def test_a_command_whose_reader_pauses_keeps_its_connection(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path, name: str
) -> None:
    broker = broker_factory(
        env={
            "FUTUREQ_LIMITS_KEEPALIVE_INTERVAL_MS": str(KEEPALIVE_MS),
            "FUTUREQ_LIMITS_KEEPALIVE_TIMEOUT_MS": str(KEEPALIVE_MS),
        }
    )
    address = broker.client_address
    words, ending, stream = PAUSED[name]
    assert cli(address, "group", "create", "p.t", "g").returncode == 0
    assert cli(address, "publish", "p.t", "first").returncode == 0
    if name.startswith("dlq"):
        _dead_letters(address, "d.t", 3)
    lines = tmp_path / "lines.jsonl"
    lines.write_text('{"topic":"p.t","payload":"a"}\n{"topic":"p.t","payload":"b"}\n')
    words = [str(lines) if word == "{lines}" else word for word in words]
    read_fd, write_fd, filler = _full_pipe()
    try:
        with subprocess.Popen(
            _command(address, *words),
            stdout=write_fd if stream == "stdout" else subprocess.DEVNULL,
            stderr=write_fd if stream == "stderr" else subprocess.PIPE,
        ) as command:
            os.close(write_fd)
            try:
                _wait_blocked_writing(command)
                # The reader is busy for three keepalive rounds (interval + timeout):
                # a client that cannot answer its PING is closed in one.
                time.sleep(6 * KEEPALIVE_MS / 1000)
                closed = _keepalive_closes(broker)
                written = _drain(read_fd)[filler:].decode()
                err = command.stderr.read().decode() if command.stderr is not None else ""
                command.wait(timeout=30)
            finally:
                command.kill()
    finally:
        for fd in (read_fd, write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
    assert command.returncode == 0, (written, err)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert ending in written, written
    assert closed == 0, f"the broker closed {closed} silent connection(s) of {name!r}"
    if name == "dlq redrive (progress on stderr)":
        assert pending(address, "d.t") == 3  # each redriven


@pytest.mark.parametrize("name", ["dlq redrive", "publish --file with a bad line"])
def test_with_stderr_closed_a_command_does_its_job_and_keeps_its_exit_status(
    broker: BrokerProcess, tmp_path: Path, name: str
) -> None:
    address = broker.client_address
    if name == "dlq redrive":
        _dead_letters(address, "c.t", 1200)  # two chunks: a progress line after each
        words, code, out = ["dlq", "redrive", "c.t", "--all"], 0, "redriven 1200 of 1200"
    else:
        lines = tmp_path / "lines.jsonl"
        lines.write_text('{"topic":"c.t","payload":"a"}\nnot json\n{"topic":"c.t","payload":"b"}\n')
        words, code, out = ["publish", "--file", str(lines)], 1, "published 2 message(s)"
    done = subprocess.run(
        _command(address, *words),
        stdout=subprocess.PIPE,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=lambda: os.close(2),  # `2>&-`
    )
    assert done.returncode == code, done.stdout
    assert done.stdout.startswith(out), done.stdout
    assert pending(address, "c.t") == (1200 if name == "dlq redrive" else 2)


def test_with_stderr_closed_a_usage_error_leaves_stdout_alone(broker: BrokerProcess) -> None:
    # argparse, with no stderr, printed its usage on stdout, among the results.
    done = subprocess.run(
        _command(broker.client_address, "publish", "u.t", "m", "--delay", "5x"),
        stdout=subprocess.PIPE,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=lambda: os.close(2),
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert pending(broker.client_address, "u.t") == 0


@pytest.mark.parametrize(
    "words",
    [
        ["group", "list"],  # a table first: rich ended the process, exit 1
        ["topic", "list"],
        ["completion", "bash"],  # a BrokenPipeError traceback, exit 1
    ],
    ids=" ".join,
)
def test_a_reader_gone_before_the_results_is_a_quiet_end(
    broker: BrokerProcess, words: list[str]
) -> None:
    address = broker.client_address
    assert cli(address, "group", "create", "g.t", "g").returncode == 0
    assert cli(address, "publish", "g.t", "m").returncode == 0
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # `| true`, the reader gone before the first line
    try:
        done = subprocess.run(
            _command(address, *words),
            stdout=write_fd,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_fd)
    assert (done.returncode, done.stderr) == (0, "")


class _LoopWatch(io.StringIO):
    """A stream that notes each write made on a Trio event loop's thread (where a write
    that waits on its reader holds the loop), with the text written."""

    def __init__(self) -> None:
        super().__init__()
        self.on_loop: list[str] = []

    def write(self, text: str) -> int:
        if trio.lowlevel.in_trio_run():
            self.on_loop.append(text)
        return super().write(text)


# Every futureq-cli command that connects, each with output on stdout and (where it
# has any) stderr; the topic w.t has group g, one message and a dead letter.
EVERY_COMMAND = [
    ["status"],
    ["status", "--json"],
    ["cluster", "status"],
    ["group", "list"],
    ["group", "create", "w.t", "g2"],
    ["group", "delete", "w.t", "g2"],
    ["topic", "list"],
    ["publish", "w.t", "m"],
    ["publish", "--file", "{lines}"],
    ["consume", "w.t", "--group", "g", "--count", "1", "--no-ack"],
    ["browse", "w.t", "--group", "g"],
    ["browse", "w.t", "--group", "g", "--counts"],
    ["cancel", "w.t", "1"],
    ["reschedule", "w.t", "1", "--delay", "1m"],
    ["dlq", "list", "w.t"],
    ["dlq", "redrive", "w.t", "--all"],
    ["purge", "w.t", "--yes"],
    ["cluster", "transfer-leader"],  # a single node: an error line
]


def test_no_command_writes_on_its_event_loop(broker: BrokerProcess, tmp_path: Path) -> None:
    address = broker.client_address
    _dead_letters(address, "w.t", 1)
    assert cli(address, "publish", "w.t", "m").returncode == 0
    lines = tmp_path / "lines.jsonl"
    lines.write_text('{"topic":"w.t","payload":"a"}\nnot json\n')
    written_on_loop = {}
    for words in EVERY_COMMAND:
        words = [str(lines) if word == "{lines}" else word for word in words]
        out, err = _LoopWatch(), _LoopWatch()
        client_main.main(["--server", address, *words], stdout=out, stderr=err)
        assert out.getvalue() or err.getvalue(), f"{words}: no output to watch"
        if out.on_loop or err.on_loop:
            written_on_loop[" ".join(words)] = out.on_loop + err.on_loop
    assert written_on_loop == {}


def test_with_stderr_closed_purge_does_not_ask_where_nobody_sees(broker: BrokerProcess) -> None:
    # At a terminal with stderr closed, its question died of an AttributeError; shown
    # nowhere it would wait for an answer to nothing. It refuses, as off a terminal.
    address = broker.client_address
    assert cli(address, "publish", "q.t", "m").returncode == 0
    primary, secondary = pty.openpty()  # stdin a terminal, as at a shell
    try:
        done = subprocess.run(
            _command(address, "purge", "q.t"),
            stdin=secondary,
            stdout=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
            preexec_fn=lambda: os.close(2),
        )
    finally:
        os.close(primary)
        os.close(secondary)
    assert (done.returncode, done.stdout) == (2, "")
    assert pending(address, "q.t") == 1
