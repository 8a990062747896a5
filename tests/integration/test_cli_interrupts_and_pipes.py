"""``futureq-cli`` stopped by its user against a real node: Ctrl-C, a reader that goes
away (``| head``), stdin closed or never ending. Found by a tester:

* ``consume | head -1``: the delivery whose line could not be printed went back to the
  group counted as an attempt (with ``max_deliveries`` 1, to the dead-letter topic)
  though ``docs/cli.md`` says what was received and not printed is given back
  uncounted.
* SIGTERM (``timeout``, systemd, Kubernetes) killed ``consume`` outright, so what it
  had buffered went back counted. (Ctrl-C, which could land in the client's reader
  task and kill the connection before the release, is taken the same way now.)
* ``publish TOPIC -`` waiting on a terminal ignored Ctrl-C until the end of the input,
  then published what was typed; with stdin closed it was an ``AttributeError``
  traceback.
* Ctrl-C while ``publish --file`` parsed its file: no summary, and ``--failed-out``
  was left empty though nothing was sent.
* ``consume --idle-timeout 2d`` subscribed, then died with a ``ValueError`` traceback.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from broker_process import BrokerProcess
from cli_process import cli, keyed_jsonl, pending, sigint_as_a_terminal_gives_it

from futureq.cli import publish_commands
from futureq.cli.client_parser import build_parser
from futureq.cli.output import Output
from futureq.client import open_client
from futureq.client.sync import SyncClient


def _command(address: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "futureq.cli.client_main", "--server", address, *args]


def test_consume_into_a_closed_pipe_gives_back_what_it_could_not_print(
    broker: BrokerProcess,
) -> None:
    address = broker.client_address
    assert cli(address, "group", "create", "pipe.t", "g", "--max-deliveries", "1").returncode == 0
    assert cli(address, "publish", "pipe.t", "m1").returncode == 0
    with subprocess.Popen(
        # --no-ack --prefetch 2: the server has no credit left to push m2 again once
        # it is released (a released delivery pushed again to a subscription being
        # left is counted by its UNSUBSCRIBE: a client race, not this test's).
        _command(address, "consume", "pipe.t", "--group", "g", "--no-ack", "--prefetch", "2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as consume:
        try:
            assert consume.stdout is not None and consume.stderr is not None
            assert consume.stdout.readline().endswith(": m1\n")
            consume.stdout.close()  # as `| head -1` does once it has its line
            for n in range(2, 6):
                assert cli(address, "publish", "pipe.t", f"m{n}").returncode == 0
            err = consume.stderr.read()
            consume.wait(timeout=30)
        finally:
            consume.kill()
    assert consume.returncode == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    # m2 was taken but never printed: given back uncounted, not dead-lettered (m1,
    # printed and not acked, went back counted: dead-lettered, as --no-ack says).
    again = cli(
        address,
        "consume",
        "pipe.t",
        "--group",
        "g",
        "--count",
        "4",
        "--json",
        "--idle-timeout",
        "10s",
    )
    assert again.returncode == 0, again.stderr
    assert sorted(json.loads(line)["payload"] for line in again.stdout.splitlines()) == [
        "m2",
        "m3",
        "m4",
        "m5",
    ]
    dead = cli(address, "dlq", "list", "pipe.t", "--json")
    assert [
        json.loads(line)["headers"]["futureq-original-topic"] for line in dead.stdout.splitlines()
    ] == ["pipe.t"]


def test_sigterm_stops_consume_as_ctrl_c_does_giving_back_what_it_buffered(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """``timeout 60 futureq-cli consume ...``, systemd and Kubernetes stop with SIGTERM:
    it killed the process, and the deliveries it had buffered went back counted (here
    to the dead-letter topic). Now it stops as at Ctrl-C, with exit status 143: the
    ones not printed are released."""
    address = broker.client_address
    total = 2000  # more lines than a pipe holds: consume waits on its stdout meanwhile
    created = cli(address, "group", "create", "term.c", "g", "--max-deliveries", "1")
    assert created.returncode == 0, created.stderr
    source = tmp_path / "many.jsonl"
    source.write_text("".join(f'{{"topic":"term.c","payload":"p{i}"}}\n' for i in range(total)))
    assert cli(address, "publish", "--file", str(source)).returncode == 0
    # --no-ack and one window for all: once every one is pushed the server has no
    # credit left, so none is pushed again as it ends (see the pipe test above).
    command = ["consume", "term.c", "--group", "g", "--no-ack", "--prefetch", str(total)]
    with (
        SyncClient(address) as watcher,
        subprocess.Popen(
            _command(address, *command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        ) as consume,
    ):
        try:
            assert consume.stdout is not None and consume.stderr is not None
            deadline = time.monotonic() + 30
            while _group(watcher.status(), "term.c", "g")["due"] > 0:
                assert time.monotonic() < deadline, "not all pushed within 30 s"
                time.sleep(0.01)
            # At least one printed (all pushed is not all received yet, under load).
            first = consume.stdout.readline()
            consume.send_signal(signal.SIGTERM)
            out = first + consume.stdout.read()
            err = consume.stderr.read()
            consume.wait(timeout=30)
        finally:
            consume.kill()
    assert consume.returncode == 143, err
    assert "Traceback" not in err, err
    printed = len(out.splitlines())
    rest = total - printed
    assert 0 < rest < total, printed
    again = cli(
        address,
        "consume",
        "term.c",
        "--group",
        "g",
        "--count",
        str(rest),
        "--idle-timeout",
        "10s",
    )
    assert again.returncode == 0, again.stderr
    assert len(again.stdout.splitlines()) == rest, (out[-300:], again.stdout[-300:])
    # The printed ones, not acked (--no-ack), went back counted: dead letters.
    dead = cli(address, "dlq", "list", "term.c", "--all", "--json")
    assert len(dead.stdout.splitlines()) == printed


def _group(status: dict[str, Any], topic: str, group: str) -> dict[str, Any]:
    for entry in status["topics"]:
        if entry["topic"] == topic:
            for row in entry["groups"]:
                if row["group"] == group:
                    return dict(row)
    raise AssertionError(f"no group {group!r} of {topic!r} in {status}")


def test_ctrl_c_while_publish_waits_for_stdin_stops_it_and_publishes_nothing(
    broker: BrokerProcess,
) -> None:
    address = broker.client_address
    with subprocess.Popen(
        _command(address, "publish", "stdin.t", "-"),
        stdin=subprocess.PIPE,  # a terminal the user types nothing into
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=sigint_as_a_terminal_gives_it,
    ) as publish:
        try:
            time.sleep(2)  # connected by now, reading its stdin
            publish.send_signal(signal.SIGINT)
            try:
                publish.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            stopped = publish.poll() is not None
            if not stopped:  # the old CLI: still reading; end the input as Ctrl-D does
                assert publish.stdin is not None
                publish.stdin.write(b"typed before Ctrl-C")
                publish.stdin.close()
            _, err = publish.communicate(timeout=30)
        finally:
            publish.kill()
    assert stopped, "Ctrl-C did not stop publish while it waited for its input"
    assert publish.returncode == 130, err
    assert b"Traceback" not in err
    assert pending(address, "stdin.t") == 0


def test_publish_from_a_closed_stdin_is_one_error_line(broker: BrokerProcess) -> None:
    done = subprocess.run(
        _command(broker.client_address, "publish", "stdin.c", "-"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=lambda: os.close(0),
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: [OS_ERROR] standard input is closed"), done.stderr


@pytest.mark.parametrize(
    "args",
    [["publish", "stdout.c", "m"], ["status"], ["browse", "stdout.c"]],
    ids=["publish", "status", "browse"],
)
def test_a_command_with_a_closed_stdout_is_one_error_line_and_does_nothing(
    broker: BrokerProcess, args: list[str]
) -> None:
    # `futureq-cli publish t m >&-` published, then died of an AttributeError
    # traceback where it printed the id (status, browse: the same traceback).
    done = subprocess.run(
        _command(broker.client_address, *args),
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=lambda: os.close(1),
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: [OS_ERROR] standard output is closed"), done.stderr
    assert pending(broker.client_address, "stdout.c") == 0


def test_ctrl_c_while_the_file_is_parsed_ends_with_the_summary_and_failed_out(
    broker: BrokerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = broker.client_address
    total = 2000
    source = keyed_jsonl(tmp_path / "keyed.jsonl", "intr.p", total)
    failed_out = tmp_path / "failed.jsonl"
    real_parse = publish_commands.parse_jsonl

    def parse_interrupted(lines: list[str]) -> Any:
        signal.raise_signal(signal.SIGINT)  # Ctrl-C while the file is parsed
        return real_parse(lines)

    monkeypatch.setattr(publish_commands, "parse_jsonl", parse_interrupted)
    args = build_parser().parse_args(
        ["--server", address, "publish", "--file", str(source)] + ["--failed-out", str(failed_out)]
    )
    out, err = io.StringIO(), io.StringIO()

    async def main() -> int:
        with trio.fail_after(60):
            async with open_client(address) as client:
                return await publish_commands.run_publish_file(client, args, Output(out, err))

    try:
        code = trio.run(main)
    except KeyboardInterrupt:  # the old CLI: raised where it landed, in the parsing
        pytest.fail(f"Ctrl-C while parsing escaped: {out.getvalue()!r}, {err.getvalue()!r}")
    finally:
        monkeypatch.undo()
    assert code == 130, (out.getvalue(), err.getvalue())
    summary = re.match(r"published (\d+) message\(s\)", out.getvalue())
    assert summary is not None, (out.getvalue(), err.getvalue())
    assert "interrupted: the " in err.getvalue()
    published = int(summary.group(1))
    assert len(failed_out.read_text().splitlines()) == total - published
    again = cli(address, "publish", "--file", str(failed_out))
    assert again.returncode == 0, again.stderr
    assert pending(address, "intr.p") == total


def test_consume_waits_an_idle_timeout_longer_than_a_day(broker: BrokerProcess) -> None:
    address = broker.client_address
    assert cli(address, "publish", "idle.t", "hello").returncode == 0
    done = cli(address, "consume", "idle.t", "--group", "g", "--count", "1", "--idle-timeout", "2d")
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip("\n").endswith(": hello"), done.stdout


def test_a_no_ack_count_over_the_servers_window_names_the_count(broker: BrokerProcess) -> None:
    """``--no-ack --count 20000`` needs a window of 20000 (every printed message stays
    out): the server's refusal named only a ``--prefetch`` the user never gave. A
    server naming its limit (protocol 5) is asked for no more than it; the CLI then
    refuses itself, naming the limit."""
    done = cli(
        broker.client_address,
        "consume",
        "win.t",
        "--group",
        "g",
        "--no-ack",
        "--count",
        "20000",
        "--idle-timeout",
        "1s",
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(
        "error: [INVALID_ARGUMENT] this server's limits.max_prefetch is 10000"
    ), done.stderr
    assert "--count 20000 needs a window of 20000" in done.stderr, done.stderr


def test_ctrl_c_stops_publish_file_from_a_stdin_that_does_not_end(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    # Found by a tester: `producer | futureq-cli publish --file -` took Ctrl-C (or
    # SIGTERM from `timeout`) as a request and went on waiting for the next chunk of a
    # pipe that did not end; only a second Ctrl-C stopped it, with a traceback and no
    # summary.
    address = broker.client_address
    failed_out = tmp_path / "failed.jsonl"
    lines = b"".join(b'{"topic":"stdin.f","payload":"m%d"}\n' % i for i in range(8))
    with subprocess.Popen(
        # --batch-size 1: a chunk is 8 lines, published before the next is read.
        _command(
            address, "publish", "--file", "-", "--batch-size", "1", "--failed-out", str(failed_out)
        ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=sigint_as_a_terminal_gives_it,
    ) as publish:
        assert publish.stdin is not None
        try:
            publish.stdin.write(lines)
            publish.stdin.flush()
            deadline = time.monotonic() + 30
            while pending(address, "stdin.f") < 8:  # the first chunk is published
                assert time.monotonic() < deadline, "the first 8 lines were not published"
            publish.send_signal(signal.SIGINT)  # the pipe stays open: a producer idle
            try:
                publish.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
            stopped = publish.poll() is not None
            publish.stdin.close()  # the old CLI: still reading; end the input
            assert publish.stdout is not None and publish.stderr is not None
            out, err = publish.stdout.read(), publish.stderr.read()
            publish.wait(timeout=30)
        finally:
            publish.kill()
    assert stopped, "Ctrl-C did not stop publish --file - while its input stayed open"
    assert publish.returncode == 130, err
    assert b"Traceback" not in err
    assert out.startswith(b"published 8 message(s)"), out
    assert b"the input after line 8 was not read" in err, err
    assert failed_out.read_bytes() == b""
    assert pending(address, "stdin.f") == 8


def test_ctrl_c_in_a_long_file_fails_the_rest_without_parsing_it(
    broker: BrokerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by a tester: with the input read a chunk at a time, a Ctrl-C (or SIGTERM)
    # early in a file of millions of lines went on parsing every later chunk (17 us a
    # line: half a minute for 2 million) only to report its lines as not sent; the old
    # CLI, which had parsed the whole file first, stopped at once. The chunk read
    # as Ctrl-C came is failed as not sent, unparsed; the rest of the file is not
    # read line by line at all: it is copied to --failed-out byte for byte (blank
    # lines too), so that `publish --file F` still sends exactly what was not stored.
    address = broker.client_address
    total = 100
    source = keyed_jsonl(tmp_path / "keyed.jsonl", "intr.long", total)
    with open(source, "ab") as handle:
        handle.write(b"\n   \nnot json\n")  # blank lines stay out; a bad one is not sent
    failed_out = tmp_path / "failed.jsonl"
    real_parse = publish_commands.parse_jsonl
    parsed: list[int] = []

    def parse_interrupted(lines: list[str]) -> Any:
        parsed.append(len(lines))
        if len(parsed) == 2:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C while the second chunk is parsed
        return real_parse(lines)

    monkeypatch.setattr(publish_commands, "parse_jsonl", parse_interrupted)
    args = build_parser().parse_args(
        ["--server", address, "publish", "--file", str(source), "--batch-size", "1"]
        + ["--failed-out", str(failed_out)]
    )
    out, err = io.StringIO(), io.StringIO()

    async def main() -> int:
        with trio.fail_after(60):
            async with open_client(address) as client:
                return await publish_commands.run_publish_file(client, args, Output(out, err))

    try:
        code = trio.run(main)
    finally:
        monkeypatch.undo()
    assert code == 130, (out.getvalue(), err.getvalue())
    assert parsed == [8, 8], parsed  # chunks of 8 lines (--batch-size 1); no third
    summary = re.match(r"published (\d+) message\(s\)", out.getvalue())
    assert summary is not None, (out.getvalue(), err.getvalue())
    published = int(summary.group(1))
    # The first chunk; the second, Ctrl-C'd. Its first line's batch may have been sent
    # as the Ctrl-C came (the parse ends in a worker thread): it is then answered within
    # publish_commands.INTERRUPT_GRACE_S and counted, not reported outcome unknown.
    assert published in (8, 9), out.getvalue()
    assert "outcome unknown" not in err.getvalue(), err.getvalue()
    written = failed_out.read_text().splitlines()
    assert len([line for line in written if line.strip()]) == total + 1 - published, written
    assert written[-1] == "not json"
    content = source.read_bytes()
    after_published = content.index(b"\n", content.index(b'"k%d"}' % (published - 1))) + 1
    assert failed_out.read_bytes() == content[after_published:]
    assert "line 16: [INTERRUPTED] not sent" in err.getvalue(), err.getvalue()
    assert (
        out.getvalue()
        .rstrip()
        .endswith(
            f"; {16 - published} failed line(s); 87 line(s) after line 16 not sent, in {failed_out}"
        )
    ), out.getvalue()
    again = cli(address, "publish", "--file", str(failed_out))
    assert again.returncode == 1, again.stderr  # only "not json" fails
    assert pending(address, "intr.long") == total


def _publish_file_interrupted_in_call(
    address: str, source: Path, failed_out: Path, call_number: int
) -> tuple[int, str, str]:
    """``publish --file SOURCE --batch-size 10 --failed-out FAILED_OUT`` in this process,
    with Ctrl-C coming as PUBLISH call ``call_number`` is made (the real call, to the
    real broker, goes on): its exit status, stdout and stderr."""
    args = build_parser().parse_args(
        ["--server", address, "publish", "--file", str(source), "--batch-size", "10"]
        + ["--failed-out", str(failed_out)]
    )
    out, err = io.StringIO(), io.StringIO()

    async def main() -> int:
        with trio.fail_after(60):
            async with open_client(address) as client:
                real_publish_batch = client.publish_batch
                calls: list[int] = []

                async def publish_batch(items: Any, **kwargs: Any) -> Any:
                    calls.append(len(items))
                    if len(calls) == call_number:
                        signal.raise_signal(signal.SIGINT)  # as this batch is sent
                    return await real_publish_batch(items, **kwargs)

                client.publish_batch = publish_batch  # type: ignore[method-assign]
                return await publish_commands.run_publish_file(client, args, Output(out, err))

    code = trio.run(main)
    return code, out.getvalue(), err.getvalue()


def test_ctrl_c_lets_the_batch_being_sent_be_answered_so_a_resend_stores_each_line_once(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    # Found by a tester: Ctrl-C in `publish --file F --failed-out G` cancelled the batch
    # already sent, so its lines were reported `[INTERRUPTED] outcome unknown` and
    # written to G, though the server stored them: `publish --file G`, as the last line
    # advised ("the N line(s) not stored are in G"), stored that batch twice (500
    # duplicates in a 100,000-line file without keys). The batch in flight now gets a
    # short grace for its answer, so its lines are counted stored and not in G.
    address = broker.client_address
    total = 40
    source = tmp_path / "plain.jsonl"
    source.write_text("".join(f'{{"topic":"intr.grace","payload":"p{i}"}}\n' for i in range(total)))
    failed_out = tmp_path / "failed.jsonl"
    code, out, err = _publish_file_interrupted_in_call(address, source, failed_out, 2)
    assert code == 130, (out, err)
    assert "outcome unknown" not in err, err
    assert out.startswith("published 20 message(s)"), (out, err)  # the second batch too
    assert failed_out.read_bytes() == b"".join(source.read_bytes().splitlines(True)[20:])
    again = cli(address, "publish", "--file", str(failed_out))
    assert again.returncode == 0, again.stderr
    assert pending(address, "intr.grace") == total  # each line stored once


def test_ctrl_c_as_a_line_is_refused_fails_the_rest_of_its_batch_as_not_sent(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    # The rest of a batch whose line the server refused is sent again without it; a
    # Ctrl-C before that resend left those lines never sent, yet they were reported
    # `[INTERRUPTED] outcome unknown ... (it may be stored)`.
    address = broker.client_address
    lines = [f'{{"topic":"intr.refused","payload":"p{i}"}}\n' for i in range(30)]
    lines[14] = '{"topic":"intr.refused","payload":"%s"}\n' % ("x" * 1_100_000)
    source = tmp_path / "refused.jsonl"
    source.write_text("".join(lines))
    failed_out = tmp_path / "failed.jsonl"
    code, out, err = _publish_file_interrupted_in_call(address, source, failed_out, 2)
    assert code == 130, (out, err)
    assert "outcome unknown" not in err, err
    assert "line 15: [PAYLOAD_TOO_LARGE]" in err, err
    assert "line 11: [INTERRUPTED] not sent" in err, err
    # Counted with the third batch's: it said "the 10 line(s)", leaving out the 9 of
    # the second batch never sent again.
    assert "interrupted: the 19 line(s) after the last batch stored were not sent" in err, err
    assert out.startswith("published 10 message(s)"), (out, err)
    assert failed_out.read_text() == "".join(lines[10:])
    assert pending(address, "intr.refused") == 10


def test_a_reader_paused_past_the_visibility_timeout_gets_each_line_once(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    # Found by a tester: `consume | slow-script` with the reader paused longer than the
    # group's visibility timeout: the line being written waited on the full pipe, the
    # server took its delivery back meanwhile, so its ack failed ("not settled in time")
    # and the message was printed again (a consume of 5,000 paused 40 s printed one
    # twice). The delivery being printed is now kept (EXTEND) until its line is written.
    address = broker.client_address
    assert (
        cli(address, "group", "create", "pause.t", "g", "--visibility-timeout", "1s").returncode
        == 0
    )
    payload = tmp_path / "big.txt"
    payload.write_text("x" * 100_000)  # one line fills a 64 KiB pipe: its write waits
    for _ in range(2):
        sent = cli(address, "publish", "pause.t", "--payload-file", str(payload))
        assert sent.returncode == 0, sent.stderr
    with subprocess.Popen(
        _command(address, "consume", "pause.t", "--group", "g", "--count", "2", "--json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as consume:
        try:
            assert consume.stdout is not None and consume.stderr is not None
            time.sleep(3.5)  # the reader pauses past the 1 s visibility timeout, 3 times
            out = consume.stdout.read()
            err = consume.stderr.read()
            consume.wait(timeout=30)
        finally:
            consume.kill()
    assert consume.returncode == 0, err
    assert b"not settled in time" not in err, err
    ids = [json.loads(line)["id"] for line in out.splitlines()]
    assert len(ids) == 2 and len(set(ids)) == 2, ids
    assert pending(address, "pause.t") == 0
