"""``futureq-cli publish --file`` reads its input a chunk at a time, against a real
node: memory is bounded by the chunk, not the file.

Found by a tester: a single 600 MB JSONL line took 1.8 GB of memory and 46 s before
being refused as FRAME_TOO_LARGE; the whole file was read, decoded and split first.
Now a line is refused as soon as it passes the length no frame could carry, its bytes
dropped as they are read, with its line number and a sentence; the lines around it
are published.
"""

from __future__ import annotations

import io
import tracemalloc
from pathlib import Path

import trio
from broker_process import BrokerProcess
from cli_process import pending

from futureq.cli.client_parser import build_parser
from futureq.cli.output import Output
from futureq.cli.publish_commands import CHUNK_BYTES, max_line_bytes, read_chunk, run_publish_file
from futureq.client import open_client

FRAME_BYTES = 65_536  # the smallest a server takes: the line limit is ~450 KB
LINE_BYTES = 30 * 1024 * 1024
HUGE_HEAD = b'{"topic":"mem.t","payload":"'
HUGE_TAIL = b'"}\n'


def write_file(path: Path) -> Path:
    with open(path, "wb") as handle:
        handle.write(b'{"topic":"mem.t","payload":"before"}\n')
        handle.write(HUGE_HEAD)
        piece = b"x" * (1024 * 1024)
        for _ in range(LINE_BYTES // len(piece)):
            handle.write(piece)
        handle.write(HUGE_TAIL)
        handle.write(b'{"topic":"mem.t","payload":"after"}\n')
    return path


def test_a_huge_line_is_refused_as_it_is_read_in_bounded_memory(
    broker_factory: object, tmp_path: Path
) -> None:
    broker: BrokerProcess = broker_factory(  # type: ignore[operator]
        env={
            "FUTUREQ_LIMITS_MAX_FRAME_BYTES": str(FRAME_BYTES),
            "FUTUREQ_LIMITS_MAX_PAYLOAD_BYTES": str(FRAME_BYTES - 8192),
            "FUTUREQ_LIMITS_MAX_BATCH_ITEMS": "1000",
        }
    )
    address = broker.client_address
    source = write_file(tmp_path / "huge.jsonl")
    failed_out = tmp_path / "failed.jsonl"
    args = build_parser().parse_args(
        ["--server", address, "publish", "--file", str(source), "--failed-out", str(failed_out)]
    )
    out, err = io.StringIO(), io.StringIO()

    async def main() -> tuple[int, int]:
        with trio.fail_after(60):
            async with open_client(address) as client:
                assert client.max_frame_bytes == FRAME_BYTES
                tracemalloc.start()
                try:
                    code = await run_publish_file(client, args, Output(out, err))
                    _, peak = tracemalloc.get_traced_memory()
                finally:
                    tracemalloc.stop()
                return code, peak

    code, peak_bytes = trio.run(main)
    assert code == 1, (out.getvalue(), err.getvalue())
    # Before: the whole file held as bytes and again as text (> 60 MB).
    assert peak_bytes < 4 * 1024 * 1024, peak_bytes
    assert out.getvalue().startswith("published 2 message(s)"), out.getvalue()
    lines = err.getvalue().splitlines()
    assert lines[0].startswith(
        f"line 2: [FRAME_TOO_LARGE] the line is {len(HUGE_HEAD) + LINE_BYTES + len(HUGE_TAIL)} bytes, more than "
        f"{max_line_bytes(FRAME_BYTES)}"
    ), lines
    assert "split its payload into smaller messages" in lines[0]
    # --failed-out cannot hold what was not kept: it says so, naming the line.
    assert failed_out.read_bytes() == b""
    assert lines[-1] == (
        f"1 line(s) not stored, too long for any frame, are not in {failed_out} (line(s) 2): "
        "split those into smaller messages"
    ), lines
    assert pending(address, "mem.t") == 2


def test_many_lines_are_read_a_bounded_chunk_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "many.jsonl"
    line = b'{"topic":"t","payload":"' + b"y" * 1000 + b'"}\r\n'
    count = (3 * CHUNK_BYTES) // len(line)
    path.write_bytes(line * count)
    chunks = []
    with open(path, "rb") as handle:
        number = 1
        while (chunk := read_chunk(handle, number, 10**9, CHUNK_BYTES, 10**6)) is not None:
            assert chunk.first_number == number
            assert chunk.size_bytes <= CHUNK_BYTES + len(line)
            assert chunk.lines[0] == line.decode()  # CR kept inside the line
            number += len(chunk.lines)
            chunks.append(len(chunk.lines))
    assert sum(chunks) == count and len(chunks) >= 3
