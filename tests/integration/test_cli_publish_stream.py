"""``futureq-cli publish --file`` as a streaming tool, against a real node: driven as a
subprocess, its input written by the test a line at a time. Found by a tester:

* ``tail -f app.log | futureq-cli publish --file -`` (a producer writing a line a
  second) published nothing until 8 batches or 16 MiB had arrived: possibly never.
* After a stop (Ctrl-C) the later chunks of a file were still read (and, after a
  batch found no server, parsed) only to be reported not sent.
* The progress bar of a file had no total.
* ``consume | slow-script``: a reader pausing longer than the server's keepalive
  ended the run with [CONNECTION_LOST].
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from broker_process import BrokerProcess
from cli_process import cli, keyed_jsonl, pending, sigint_as_a_terminal_gives_it


def _command(address: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "futureq.cli.client_main", "--server", address, *args]


def _wait_pending(address: str, topic: str, count: int, what: str, within_s: float = 15) -> None:
    deadline = time.monotonic() + within_s
    while (now := pending(address, topic)) < count:
        assert time.monotonic() < deadline, f"{what}: {now} of {count} published"
        time.sleep(0.05)


def _line(topic: str, i: int) -> bytes:
    return b'{"topic":"%s","payload":"m%d","idempotency_key":"k%d"}\n' % (
        topic.encode(),
        i,
        i,
    )


def test_a_slow_producers_lines_are_published_as_they_arrive(broker: BrokerProcess) -> None:
    # The default batch (500 lines) is far from full: each line must still go out
    # within --linger of arriving, while the input stays open.
    address = broker.client_address
    with subprocess.Popen(
        _command(address, "publish", "--file", "-"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as publish:
        assert publish.stdin is not None
        try:
            for i in range(3):
                publish.stdin.write(_line("slow.t", i))
                publish.stdin.flush()
                _wait_pending(address, "slow.t", i + 1, f"line {i + 1} written, input open")
                assert publish.poll() is None
            # Half a line stays unread until its end arrives; then it is published.
            publish.stdin.write(b'{"topic":"slow.t",')
            publish.stdin.flush()
            publish.stdin.write(b'"payload":"m3"}\n')
            publish.stdin.flush()
            _wait_pending(address, "slow.t", 4, "a line written in two parts")
            out, err = publish.communicate(timeout=30)  # closes the input: its end
        finally:
            publish.kill()
    assert publish.returncode == 0, err
    assert out.startswith(b"published 4 message(s)"), out
    assert pending(address, "slow.t") == 4


def _publish_calls(broker: BrokerProcess) -> float:
    """PUBLISH frames the node has committed, over its shards."""
    with urllib.request.urlopen(f"http://{broker.http_address}/metrics", timeout=5) as response:
        text = response.read().decode()
    pattern = r"^futureq_publish_commit_seconds_count(?:\{[^}]*\})? ([0-9.e+]+)$"
    found = re.findall(pattern, text, re.MULTILINE)
    return sum(float(value) for value in found)


def test_lines_already_waiting_in_a_pipe_go_in_full_batches(broker: BrokerProcess) -> None:
    # What a fast producer has written is taken whole chunks at a time, not a
    # linger's worth: 1,000 lines waiting in the pipe (the input still open) go in 10
    # PUBLISH calls of --batch-size 100 (chunks of 8 batches: 800 lines, then 200).
    address = broker.client_address
    data = b"".join(_line("fast.t", i) for i in range(1000))
    assert len(data) < 65536  # all of it fits the pipe before publish starts
    before = _publish_calls(broker)
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, data)
        with subprocess.Popen(
            _command(address, "publish", "--file", "-", "--batch-size", "100"),
            stdin=read_end,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        ) as publish:
            os.close(read_end)
            read_end = -1
            try:
                _wait_pending(address, "fast.t", 1000, "1,000 lines waiting, input open")
                calls = _publish_calls(broker) - before
                os.close(write_end)  # the input's end
                write_end = -1
                out, err = publish.communicate(timeout=30)
            finally:
                publish.kill()
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
    assert publish.returncode == 0, err
    assert out.startswith(b"published 1000 message(s)"), out
    assert calls == 10, calls


def test_ctrl_c_reports_the_lines_read_and_waiting_for_their_linger(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    # A line read and waiting for --linger when Ctrl-C comes is neither published nor
    # lost: it is reported not sent and written to --failed-out.
    address = broker.client_address
    failed_out = tmp_path / "failed.jsonl"
    with subprocess.Popen(
        _command(
            address, "publish", "--file", "-", "--linger", "1m", "--failed-out", str(failed_out)
        ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=sigint_as_a_terminal_gives_it,
    ) as publish:
        assert publish.stdin is not None
        try:
            publish.stdin.write(_line("linger.t", 0) + _line("linger.t", 1))
            publish.stdin.flush()
            deadline = time.monotonic() + 15
            while not _pipe_empty(publish.stdin.fileno()):  # read: waiting for --linger
                assert time.monotonic() < deadline, "the lines were not read"
                time.sleep(0.05)
            publish.send_signal(signal.SIGINT)
            publish.wait(timeout=15)  # the input stays open: a producer gone quiet
            out, err = publish.communicate(timeout=15)
        finally:
            publish.kill()
    assert publish.returncode == 130, err
    assert b"Traceback" not in err, err
    assert out.startswith(b"published 0 message(s)"), out
    assert b"line 1: [INTERRUPTED] not sent" in err, err
    assert b"line 2: [INTERRUPTED] not sent" in err, err
    assert b"the input after line 2 was not read" in err, err
    assert failed_out.read_bytes() == _line("linger.t", 0) + _line("linger.t", 1)
    assert pending(address, "linger.t") == 0


def _buffered(fd: int) -> int:
    """The bytes a pipe holds unread (``fd``: either end: FIONREAD works on the write
    end of a Linux pipe too)."""
    answer = fcntl.ioctl(fd, termios.FIONREAD, struct.pack("i", 0))
    return int(struct.unpack("i", answer)[0])


def _pipe_empty(fd: int) -> bool:
    """Whether the pipe written at ``fd`` holds no unread bytes."""
    return _buffered(fd) == 0


def test_after_ctrl_c_a_file_is_read_no_further_and_the_rest_is_named(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    # The lines after the chunk in flight are not read, and the final line says
    # where the input not read starts; `tail -c +B FILE` sends exactly that part.
    address = broker.client_address
    total = 20_000
    source = keyed_jsonl(tmp_path / "keyed.jsonl", "stop.t", total)
    with subprocess.Popen(
        # --batch-size 1: chunks of 8 lines, 8 calls each: Ctrl-C comes early.
        _command(address, "publish", "--file", str(source), "--batch-size", "1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=sigint_as_a_terminal_gives_it,
    ) as publish:
        try:
            _wait_pending(address, "stop.t", 8, "the first chunk")
            publish.send_signal(signal.SIGINT)
            out_bytes, err_bytes = publish.communicate(timeout=30)
        finally:
            publish.kill()
    out, err = out_bytes.decode(), err_bytes.decode()
    assert publish.returncode == 130, err
    assert "Traceback" not in err, err
    final = out.splitlines()[-1]
    summary = re.fullmatch(
        r"published (\d+) message\(s\) in .*; (\d+) failed line\(s\); "
        r"the input after line (\d+) not read",
        final,
    )
    assert summary is not None, (out, err)
    published, failed, read = (int(group) for group in summary.groups())
    assert read % 8 == 0 and published + failed == read < total, final
    advice = re.search(r"send it with tail -c \+(\d+) (\S+) \| futureq-cli publish --file -", err)
    assert advice is not None, err
    assert advice.group(2) == str(source)
    offset = int(advice.group(1)) - 1
    content = source.read_bytes()
    assert content[:offset].count(b"\n") == read  # the rest starts at line read + 1
    numbers = [int(n) for n in re.findall(r"^line (\d+): \[INTERRUPTED\]", err, re.MULTILINE)]
    assert len(numbers) == failed, err
    # Sending the lines listed and the part not read stores each message once.
    lines = content.splitlines(keepends=True)
    again = tmp_path / "again.jsonl"
    again.write_bytes(b"".join(lines[n - 1] for n in numbers) + content[offset:])
    done = cli(address, "publish", "--file", str(again))
    assert done.returncode == 0, done.stderr
    assert pending(address, "stop.t") == total


def test_after_ctrl_c_the_rest_of_a_file_is_copied_unread_to_failed_out(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    # With --failed-out F the rest of the file goes to F as it is (not parsed), so
    # that `publish --file F` still finishes the job; the final line says so.
    address = broker.client_address
    total = 20_000
    source = keyed_jsonl(tmp_path / "keyed.jsonl", "copy.t", total)
    with open(source, "ab") as handle:
        handle.write(b"not json")  # no line ending: F gets one
    failed_out = tmp_path / "failed.jsonl"
    with subprocess.Popen(
        _command(
            address,
            "publish",
            "--file",
            str(source),
            "--batch-size",
            "1",
            "--failed-out",
            str(failed_out),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=sigint_as_a_terminal_gives_it,
    ) as publish:
        try:
            _wait_pending(address, "copy.t", 8, "the first chunk")
            publish.send_signal(signal.SIGINT)
            out_bytes, err_bytes = publish.communicate(timeout=30)
        finally:
            publish.kill()
    out, err = out_bytes.decode(), err_bytes.decode()
    assert publish.returncode == 130, err
    final = out.splitlines()[-1]
    summary = re.fullmatch(
        r"published (\d+) message\(s\) in .*; (\d+) failed line\(s\); "
        rf"(\d+) line\(s\) after line (\d+) not sent, in {re.escape(str(failed_out))}",
        final,
    )
    assert summary is not None, (out, err)
    published, failed, copied, read = (int(group) for group in summary.groups())
    assert published + failed == read and read + copied == total + 1, final
    written = failed_out.read_bytes()
    content = source.read_bytes()
    cut = 0
    for _ in range(read):
        cut = content.index(b"\n", cut) + 1
    assert written.endswith(content[cut:] + b"\n")  # byte for byte, an ending added
    assert written.count(b"\n") == failed + copied
    again = cli(address, "publish", "--file", str(failed_out))
    assert again.returncode == 1, again.stderr  # only "not json" fails
    assert pending(address, "copy.t") == total


def test_a_files_progress_bar_shows_bytes_of_its_size(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    # On a terminal the bar of a regular file has a total: its size in bytes.
    address = broker.client_address
    source = keyed_jsonl(tmp_path / "bar.jsonl", "bar.t", 3000)
    size = source.stat().st_size
    parent, child = pty.openpty()
    shown = bytearray()
    try:
        with subprocess.Popen(
            _command(address, "publish", "--file", str(source), "--batch-size", "10"),
            stdout=child,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "COLUMNS": "160", "TERM": "xterm"},
        ) as publish:
            os.close(child)
            child = -1
            deadline = time.monotonic() + 60
            while True:
                assert time.monotonic() < deadline, "publish did not end"
                if select.select([parent], [], [], 0.1)[0]:
                    try:
                        data = os.read(parent, 65536)
                    except OSError:  # EIO: the terminal's other end closed
                        break
                    if not data:
                        break
                    shown += data
                elif publish.poll() is not None:
                    break
            assert publish.wait(timeout=30) == 0
    finally:
        os.close(parent)
        if child >= 0:
            os.close(child)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown.decode(errors="replace"))
    total_kb = f"{size / 1000:.1f}"
    assert re.search(rf"/{re.escape(total_kb)} kB", text), text[-2000:]
    assert "line(s)" in text, text[-2000:]
    assert pending(address, "bar.t") == 3000


def test_linger_is_checked_before_connecting() -> None:
    nowhere = "127.0.0.1:1"
    done = cli(nowhere, "publish", "--file", "-", "--linger", "2m")
    assert done.returncode == 2, done.stderr
    assert "--linger is at most 1m" in done.stderr, done.stderr
    done = cli(nowhere, "publish", "t", "p", "--linger", "1s")
    assert done.returncode == 2, done.stderr
    assert "argument --linger: only with --file" in done.stderr, done.stderr


def _keepalive_broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    """A node whose keepalive is cut to 0.5 s + 0.5 s from 30 s + 30 s: a client that
    leaves its PING unanswered for a second loses its connection."""
    return broker_factory(
        env={
            "FUTUREQ_LIMITS_KEEPALIVE_INTERVAL_MS": "500",
            "FUTUREQ_LIMITS_KEEPALIVE_TIMEOUT_MS": "500",
        }
    )


def _publish_numbered(address: str, topic: str, total: int, filler_bytes: int) -> None:
    """Publish ``total`` messages to ``topic``, payloads ``N:xxx...`` (``filler_bytes``
    of x), through ``publish --file -``."""
    filler = b"x" * filler_bytes
    lines = b"".join(
        b'{"topic":"%s","payload":"%d:%s"}\n' % (topic.encode(), i, filler) for i in range(total)
    )
    done = subprocess.run(
        _command(address, "publish", "--file", "-"),
        input=lines,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def _read_after_a_pause(address: str, *args: str) -> tuple[int, bytes, bytes, int]:
    """Run ``futureq-cli ARGS`` into a pipe read only once full (what it holds stopped
    growing for half a second) and 3 s more: its exit status, stdout and stderr, and the
    bytes the full pipe held."""
    with subprocess.Popen(
        _command(address, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as command:
        try:
            assert command.stdout is not None
            deadline = time.monotonic() + 30
            held, steady = 0, 0
            while steady < 10:
                assert time.monotonic() < deadline, f"{args[0]} did not fill the pipe"
                time.sleep(0.05)
                now = _buffered(command.stdout.fileno())
                steady = steady + 1 if now == held and now > 0 else 0
                held = now
            time.sleep(3)  # the reader is busy: six keepalive rounds
            out, err = command.communicate(timeout=30)
        finally:
            command.kill()
    return command.returncode, out, err, held


def test_consume_into_a_pipe_whose_reader_pauses_keeps_its_connection(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    # Found by a tester: `consume | slow-script` blocked its event loop on the full
    # pipe, the server's keepalive PING went unanswered and the broker closed the
    # connection: [CONNECTION_LOST], exit 1.
    broker = _keepalive_broker(broker_factory)
    address = broker.client_address
    _publish_numbered(address, "pause.t", 100, 2000)
    code, out, err, held = _read_after_a_pause(
        address, "consume", "pause.t", "--group", "g", "--count", "100", "--json"
    )
    assert held < len(out), held  # not all printed: consume waited on the pipe
    assert code == 0, err
    got = [json.loads(line)["payload"].split(":")[0] for line in out.splitlines()]
    assert sorted(got, key=int) == [str(i) for i in range(100)], got  # each once
    assert pending(address, "pause.t") == 0


@pytest.mark.parametrize("command", ["browse", "dlq list"])
def test_browse_into_a_pipe_whose_reader_pauses_keeps_its_connection(
    broker_factory: Callable[..., BrokerProcess], command: str
) -> None:
    # As consume's above: `browse --all | less` (or `dlq list`) wrote each line on the
    # event loop, so a reader pausing on a full pipe left the server's keepalive PING
    # unanswered, and the broker closed the connection.
    broker = _keepalive_broker(broker_factory)
    address = broker.client_address
    topic = "pause.b"
    made = cli(address, "group", "create", topic, "g", "--max-deliveries", "1")
    assert made.returncode == 0, made.stderr
    total = 1200  # two pages of BROWSE; a line each of ~1.2 kB: 20 pipes full
    _publish_numbered(address, topic, total, 1000)
    args = [topic, "--group", "g"]
    if command == "dlq list":
        # Every message nacked once, with max_deliveries 1: all dead letters.
        nacked = cli(address, "consume", topic, "--group", "g", "--count", str(total), "--nack")
        assert nacked.returncode == 0, nacked.stderr
        args = ["dlq", "list", topic]
    else:
        args = ["browse", *args]
    code, out, err, held = _read_after_a_pause(
        address, *args, "--all", "--preview", "1024", "--json"
    )
    assert held < len(out), held  # not all printed: it waited on the pipe
    assert code == 0, err
    assert b"Traceback" not in err, err
    got = [json.loads(line)["preview"].split(":")[0] for line in out.splitlines()]
    assert sorted(got, key=int) == [str(i) for i in range(total)], len(got)
    # The pages came on one connection, and the server never had to close it: before,
    # the pause cost it (here after all had been read; with more pages, the run).
    assert _metric(broker, "futureq_connections_closed_total", 'reason="keepalive_timeout"') == 0


def _metric(broker: BrokerProcess, name: str, labels: str) -> float:
    """A sample of the broker's ``/metrics`` (0 when it has none yet)."""
    with urllib.request.urlopen(f"http://{broker.http_address}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = re.search(re.escape(f"{name}{{{labels}}}") + r" ([0-9.e+]+)$", text, flags=re.MULTILINE)
    return float(found.group(1)) if found else 0.0
