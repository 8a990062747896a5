"""``futureq-cli publish --file`` as a subprocess against a real node: a bad line never
costs its neighbours (an integer beyond 64 bits, a lone surrogate, JSON nested 100,000
deep: each fails alone, with its column, and no traceback), a file larger than one
frame is split by bytes, and ``consume --json`` output publishes again as promised."""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import trio
from broker_process import BrokerProcess
from cli_process import cli, keyed_jsonl, pending, sigint_as_a_terminal_gives_it

from futureq.cli.client_parser import build_parser
from futureq.cli.jsonl import strict_loads
from futureq.cli.output import Output
from futureq.cli.publish_commands import run_publish_file
from futureq.client import open_client


def test_a_bad_line_fails_alone_and_the_good_ones_are_published(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    address = broker.client_address
    lines = [
        '{"topic":"bad.n","payload":"good1"}',
        '{"topic":"bad.n","payload":"x","delay_ms":123456789012345678901234567890}',
        '{"topic":"bad.n","payload":"x","headers":{"a":"\\ud800"}}',
        '{"topic":"bad.n","payload":"\\ud800"}',
        '{"topic":"bad.n","payload":' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"topic":"bad.n","payload":"good2"}',
    ]
    batch = tmp_path / "neighbours.jsonl"
    batch.write_text("\n".join(lines) + "\n")
    done = cli(address, "publish", "--file", str(batch))
    assert done.returncode == 1, done.stderr  # cli.md: 1 when a line failed
    assert "Traceback" not in done.stderr
    assert done.stdout.startswith("published 2 message(s)"), done.stdout
    failed = done.stderr.splitlines()
    assert [line.split(":")[0] for line in failed] == [
        "line 2, column 43",
        "line 3, column 48",
        "line 4, column 29",
        "line 5, column 528",
    ], failed
    assert "INVALID_FRAME" not in done.stderr
    assert pending(address, "bad.n") == 2


def test_a_file_larger_than_one_frame_is_split_by_bytes(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    address = broker.client_address
    batch = tmp_path / "big.jsonl"
    # 10 lines of 700 KB: 7 MB, over the 4 MiB frame limit; every line is valid.
    batch.write_text(
        "".join(json.dumps({"topic": "big.f", "payload": "x" * 700_000}) + "\n" for _ in range(10))
    )
    done = cli(address, "publish", "--file", str(batch))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("published 10 message(s)"), done.stdout
    assert pending(address, "big.f") == 10


def test_consume_json_output_publishes_again(broker: BrokerProcess, tmp_path: Path) -> None:
    address = broker.client_address
    payloads = ['"\\ud800"', '{"amount":10.50}', "plain"]
    for payload in payloads:
        assert cli(address, "publish", "rt.a", payload).returncode == 0
    consumed = cli(address, "consume", "rt.a", "--group", "g", "--count", "3", "--json")
    assert consumed.returncode == 0, consumed.stderr
    records = [strict_loads(line) for line in consumed.stdout.splitlines()]
    # '"\ud800"' is JSON, but no strict parser takes its lone surrogate: shown as text.
    assert [r["payload_encoding"] for r in records] == ["text", "json", "text"]
    again = tmp_path / "again.jsonl"
    again.write_text(consumed.stdout.replace('"topic": "rt.a"', '"topic": "rt.b"'))
    done = cli(address, "publish", "--file", str(again))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("published 3 message(s)")
    second = cli(address, "consume", "rt.b", "--group", "g", "--count", "3", "--json")
    assert [strict_loads(line)["payload"] for line in second.stdout.splitlines()] == [
        r["payload"] for r in records
    ]


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (1_500_000_000, 1_500_000_000))


def test_an_endless_payload_source_is_read_only_up_to_the_limit(broker: BrokerProcess) -> None:
    address = broker.client_address
    base = [sys.executable, "-m", "futureq.cli.client_main", "--server", address, "publish"]
    from_file = subprocess.run(
        [*base, "pz.t", "--payload-file", "/dev/zero"],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limit_memory,  # the old code read until MemoryError
        check=False,
    )
    assert from_file.returncode == 1, from_file.stderr
    assert from_file.stderr.startswith(
        "error: [PAYLOAD_TOO_LARGE] the payload from /dev/zero is more than 4194304 bytes"
    ), from_file.stderr
    with subprocess.Popen(["yes"], stdout=subprocess.PIPE) as yes:
        piped = subprocess.run(
            [*base, "pz.t", "-"],
            stdin=yes.stdout,
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=_limit_memory,
            check=False,
        )
        yes.kill()
    assert piped.returncode == 1
    assert "[PAYLOAD_TOO_LARGE] the payload from standard input is more than" in piped.stderr
    assert pending(address, "pz.t") == 0


def _published_total(broker: BrokerProcess, topic: str) -> float:
    with urllib.request.urlopen(f"http://{broker.http_address}/metrics", timeout=5) as response:
        text = response.read().decode()
    pattern = rf'^futureq_published_messages_total\{{topic="{re.escape(topic)}"\}} ([0-9.e+]+)$'
    found = re.search(pattern, text, flags=re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_a_broker_killed_mid_file_ends_the_run_within_the_request_timeout(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """cli.md: a batch that finds no server before --request-timeout fails its lines,
    exit 1. The old CLI went on to the next batch and waited the whole deadline again,
    once per batch: 1,200 batches of a dead broker kept it silent for 20 minutes."""
    total = 60_000
    batch = tmp_path / "long.jsonl"
    batch.write_text("".join(f'{{"topic":"gone.f","payload":"p{i}"}}\n' for i in range(total)))
    command = [sys.executable, "-m", "futureq.cli.client_main", "--server"]
    command += [broker.client_address, "--request-timeout", "1s", "publish", "--file"]
    command += [str(batch), "--batch-size", "50"]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            deadline = time.monotonic() + 30
            while _published_total(broker, "gone.f") == 0:  # mid-file: some are stored
                assert time.monotonic() < deadline, "the CLI published nothing in 30 s"
                time.sleep(0.05)
            broker.kill()
            out, err = process.communicate(timeout=20)  # the old CLI: 1,200 s
        finally:
            process.kill()
    assert process.returncode == 1, err
    assert "Traceback" not in err
    # Nothing is read after the stop (the later chunks were read and parsed only to be
    # reported not sent): the final line says where the input not read starts.
    summary = re.fullmatch(
        r"published (\d+) message\(s\) in .*; (\d+) failed line\(s\); "
        r"the input after line (\d+) not read",
        out.rstrip(),
    )
    assert summary is not None, out
    published, failed_count, read = (int(group) for group in summary.groups())
    assert 0 < published < total, out
    assert published + failed_count == read < total, out
    failed = err.splitlines()
    assert "[CONNECTION_LOST]" in failed[0], failed[0]
    assert failed[-3].startswith("stopped at line "), failed[-3]
    assert "were not sent" in failed[-3]
    assert failed[-2].startswith(f"not read: the input after line {read} was not read"), failed
    assert (
        f"tail -c +{len(''.join(batch.read_text().splitlines(keepends=True)[:read])) + 1} "
        in (failed[-2])
    )
    # Not "send it again from line N" (part of what came before may be missing, and
    # part of that batch stored): the lines not stored, and how to get exactly them.
    assert failed[-1].startswith(f"{failed_count} line(s) read were not stored"), failed[-1]
    assert "do not send the whole input again" in failed[-1]
    # The batch the kill cut off was sent and not answered: it may be stored, and the
    # advice says so rather than calling every failed line "not stored" (found by a
    # tester: sending such lines again stored them twice).
    assert re.search(r"; [1-9]\d* of them have an unknown outcome .* may be stored", failed[-1]), (
        failed[-1]
    )


def test_the_lines_not_stored_go_to_failed_out_and_send_again_exactly_once(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """Found by a tester: after an outage the CLI said "send the file again from line
    N", which stored lines twice (a sharded node had stored part of what followed N)
    and would lose none only by luck. ``--failed-out F`` writes every line not stored,
    as it was; with idempotency keys, sending F after the node is back stores each line
    of the file exactly once, the batch whose outcome the kill left unknown included."""
    total = 20_000
    source = tmp_path / "keyed.jsonl"
    source.write_text(
        "".join(
            f'{{"topic":"again.f","payload":"p{i}","idempotency_key":"k{i}"}}\n'
            for i in range(total)
        )
        + "not json\n"  # a line no server takes: it is "not stored" too
    )
    failed_out = tmp_path / "failed.jsonl"
    command = [sys.executable, "-m", "futureq.cli.client_main", "--server"]
    command += [broker.client_address, "--request-timeout", "1s", "publish", "--file"]
    command += [str(source), "--batch-size", "50", "--failed-out", str(failed_out)]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            deadline = time.monotonic() + 30
            while _published_total(broker, "again.f") == 0:
                assert time.monotonic() < deadline, "the CLI published nothing in 30 s"
                time.sleep(0.05)
            broker.kill()
            _, err = process.communicate(timeout=20)
        finally:
            process.kill()
    assert process.returncode == 1, err
    # A batch the kill cut off on the wire may be stored (outcome unknown): said last.
    # Batches still queued in the client when the connection broke were not sent (the
    # client knows: NotSentError), so a kill that found no batch on the wire leaves
    # none unknown; the lines then split exactly into stored and failed-out.
    said = re.search(
        re.escape(
            f"are in {failed_out}; send them again with publish --file {failed_out} "
            "(a delay_ms counts from when it is sent)"
        )
        + r"(; ([1-9]\d*) of them have an unknown outcome \(their batch was sent and not "
        r"answered\) and may be stored already: sent again, those without an "
        r"idempotency_key are stored twice)?$",
        err.rstrip(),
    )
    assert said, err
    unknown = int(said.group(2) or 0)
    lines = failed_out.read_text().splitlines()
    assert lines[-1] == "not json"
    assert 0 < len(lines) - 1 < total
    broker.start()
    stored = pending(broker.client_address, "again.f")
    # Every line is stored or in failed-out; only those of unknown outcome may be both.
    assert total <= stored + len(lines) - 1 <= total + unknown, (stored, len(lines), err)
    # These lines have keys, so sending them again stores each once.
    again = cli(broker.client_address, "publish", "--file", str(failed_out))
    assert again.returncode == 1  # the line that is not JSON fails again, alone
    assert pending(broker.client_address, "again.f") == total


def test_a_lone_cr_is_no_line_break_and_failed_out_keeps_each_line_byte_for_byte(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """Found by a tester: the file was read with universal newlines, so a CR inside a
    line (JSON whitespace) split it in two, every later line was numbered one too high,
    and --failed-out wrote CRLF and CR as LF (sending it again failed the same way)."""
    source = tmp_path / "cr.jsonl"
    bad = b'{"topic":"cr.t","payload":"\xff' + b'"}\r\n'  # not UTF-8: refused, kept as is
    source.write_bytes(
        b'{"topic":"cr.t",\r"payload":"a"}\r\n' + bad + b'{"topic":"cr.t","payload":"b"}\n'
    )
    failed_out = tmp_path / "failed.jsonl"
    done = cli(
        broker.client_address, "publish", "--file", str(source), "--failed-out", str(failed_out)
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("published 2 message(s)"), done.stdout
    assert done.stderr.splitlines()[0].startswith("line 2, column "), done.stderr
    assert failed_out.read_bytes() == bad
    assert pending(broker.client_address, "cr.t") == 2


def test_failed_out_is_checked_before_anything_is_sent(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """Found by a tester: a --failed-out that could not be written failed only after
    every line was sent (its list of lines not stored lost), and the input file given
    as --failed-out was overwritten with the failures."""
    source = tmp_path / "in.jsonl"
    text = "".join(f'{{"topic":"chk.t","payload":"p{i}"}}\n' for i in range(10))
    source.write_text(text)
    same = cli(broker.client_address, "publish", "--file", str(source), "--failed-out", str(source))
    assert same.returncode == 2, same.stderr
    assert "is the input file" in same.stderr
    assert source.read_text() == text
    folder = cli(
        broker.client_address, "publish", "--file", str(source), "--failed-out", str(tmp_path)
    )
    assert folder.returncode == 1, folder.stderr
    assert "Is a directory" in folder.stderr
    assert _published_total(broker, "chk.t") == 0  # nothing was sent either time


def test_ctrl_c_mid_file_says_what_was_stored_and_failed_out_has_the_rest(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """Found by a tester: Ctrl-C mid-file printed no summary and wrote no --failed-out,
    so which lines were stored was unknown. Now the run says it, exits 130, and F holds
    the lines not stored (the batch in flight too: with idempotency keys, sending F
    stores every line of the file exactly once)."""
    total = 20_000
    source = keyed_jsonl(tmp_path / "keyed.jsonl", "intr.f", total)
    failed_out = tmp_path / "failed.jsonl"
    command = [sys.executable, "-m", "futureq.cli.client_main", "--server"]
    command += [broker.client_address, "publish", "--file", str(source), "--batch-size", "20"]
    command += ["--failed-out", str(failed_out)]
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_a_terminal_gives_it,
    ) as process:
        try:
            deadline = time.monotonic() + 30
            while _published_total(broker, "intr.f") == 0:
                assert time.monotonic() < deadline, "the CLI published nothing in 30 s"
                time.sleep(0.05)
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=20)
        finally:
            process.kill()
    assert process.returncode == 130, err
    assert "Traceback" not in err
    summary = re.match(r"published (\d+) message\(s\)", out)
    assert summary is not None, (out, err)
    published = int(summary.group(1))
    assert 0 < published < total, out
    assert "interrupted: the " in err
    lines = failed_out.read_text().splitlines()
    assert len(lines) == total - published
    again = cli(broker.client_address, "publish", "--file", str(failed_out))
    assert again.returncode == 0, again.stderr
    assert pending(broker.client_address, "intr.f") == total


def test_ctrl_c_landing_in_another_task_still_ends_with_the_summary(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """Trio raises Ctrl-C's KeyboardInterrupt in whichever task runs when the signal
    comes; landing in the client's reader task (a CI run, under load), it ended the
    run with exit 130, no summary and no --failed-out. Here it lands in another task
    than the publishing one, every time: the run still says what was stored."""
    total = 5_000
    source = keyed_jsonl(tmp_path / "keyed.jsonl", "intr.g", total)
    failed_out = tmp_path / "failed.jsonl"
    address = broker.client_address
    args = build_parser().parse_args(
        ["--server", address, "publish", "--file", str(source), "--batch-size", "5"]
        + ["--failed-out", str(failed_out)]
    )
    out, err = io.StringIO(), io.StringIO()

    async def main() -> int:
        with trio.fail_after(60):
            async with open_client(address) as client, trio.open_nursery() as nursery:
                nursery.start_soon(ctrl_c_elsewhere)
                return await run_publish_file(client, args, Output(out, err))

    async def ctrl_c_elsewhere() -> None:
        for _ in range(3000):  # polls the broker's /metrics for at most ~30 s
            if await trio.to_thread.run_sync(_published_total, broker, "intr.g"):
                break
            await trio.sleep(0.01)
        signal.raise_signal(signal.SIGINT)  # handled while this task runs

    code = trio.run(main)
    assert code == 130, (out.getvalue(), err.getvalue())
    summary = re.match(r"published (\d+) message\(s\)", out.getvalue())
    assert summary is not None, (out.getvalue(), err.getvalue())
    published = int(summary.group(1))
    assert 0 < published < total, out.getvalue()
    assert "interrupted: the " in err.getvalue()
    assert len(failed_out.read_text().splitlines()) == total - published
    again = cli(address, "publish", "--file", str(failed_out))
    assert again.returncode == 0, again.stderr
    assert pending(address, "intr.g") == total


def test_a_file_saved_with_a_byte_order_mark_is_told_so(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    # Found by a tester: Notepad's "UTF-8" adds EF BB BF, and line 1 failed with
    # "expected a JSON object (a line starting with {)" though it showed one.
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"topic":"bom.t","payload":1}\n{"topic":"bom.t","payload":2}\n')
    done = cli(broker.client_address, "publish", "--file", str(path))
    assert done.returncode == 1, done
    assert "published 1 message(s)" in done.stdout, done.stdout
    assert done.stderr.startswith("line 1, column 1: the line starts with a byte order mark"), (
        done.stderr
    )


def test_file_dash_reads_the_lines_from_standard_input(broker: BrokerProcess) -> None:
    # Found by a tester: `publish TOPIC -` reads stdin, but `publish --file -` said
    # "[OS_ERROR] No such file or directory: -".
    lines = b'{"topic":"stdin.t","payload":1}\n{"topic":"stdin.t","payload":"two"}\n'
    done = subprocess.run(
        [sys.executable, "-m", "futureq.cli.client_main", "--server", broker.client_address]
        + ["publish", "--file", "-"],
        input=lines,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done
    assert done.stdout.startswith(b"published 2 message(s)"), done.stdout
    assert pending(broker.client_address, "stdin.t") == 2


def test_failed_out_that_is_the_file_on_stdin_is_refused_before_anything_is_sent(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    # Found by a tester: `publish --file - --failed-out retry.jsonl < retry.jsonl`, a
    # retry loop, truncated its own input once the input was streamed: the lines past
    # the first chunk were neither published nor written anywhere, and the run said
    # it published the rest with 0 failed lines. A --failed-out that is the file on
    # standard input is refused, as one that is the --file path is.
    address = broker.client_address
    total = 9000  # past the first chunk (4,000 lines at the default --batch-size 500)
    source = keyed_jsonl(tmp_path / "retry.jsonl", "same.stdin", total)
    with open(source, "rb") as stdin:
        done = subprocess.run(
            [sys.executable, "-m", "futureq.cli.client_main", "--server", address]
            + ["publish", "--file", "-", "--failed-out", str(source)],
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith(f"error: --failed-out {source} is the input file"), done.stderr
    assert len(source.read_text().splitlines()) == total  # not truncated
    assert pending(address, "same.stdin") == 0


@pytest.mark.parametrize("append", [True, False], ids=["appended", "truncated"])
def test_failed_out_into_redirected_stdout_keeps_what_it_holds_and_the_summary(
    broker: BrokerProcess, tmp_path: Path, append: bool
) -> None:
    # `publish --file F --failed-out /dev/stdout >> log` truncated the log (the path was
    # opened again, "wb"); with `> out` the summary, written at standard output's own
    # offset, overwrote the failed lines written through the other one.
    address = broker.client_address
    lines = [
        '{"topic":"stdout.t","payload":"good"}\n',
        "not json\n",
        '{"topic":"stdout.t","payload":"good"}\n',
        "still not json\n",
    ]
    source = tmp_path / "some.jsonl"
    source.write_text("".join(lines))
    out = tmp_path / "out.txt"
    out.write_text("earlier line\n" if append else "")
    with out.open("ab" if append else "wb") as stdout:
        done = subprocess.run(
            [sys.executable, "-m", "futureq.cli.client_main", "--server", address]
            + ["publish", "--file", str(source), "--failed-out", "/dev/stdout"],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1, done.stderr
    text = out.read_text().splitlines(True)
    earlier = ["earlier line\n"] if append else []
    assert text[:-1] == earlier + [lines[1], lines[3]], text
    assert text[-1].startswith("published 2 message(s)"), text
