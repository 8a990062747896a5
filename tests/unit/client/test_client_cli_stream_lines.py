"""``publish --file``'s two readers agree: :class:`StreamLines` over a real pipe (what
``producer | futureq-cli publish --file -`` is read with) gives the same lines, byte for
byte and numbered the same, as :func:`read_chunk` over a file, whatever the line
endings, bytes and lengths, and however the pipe's writes split them."""

from __future__ import annotations

import io
import os
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from futureq.cli.publish_commands import LineChunk, StreamLines, read_chunk

LINE_LIMIT = 40

line_bytes = st.lists(
    st.sampled_from([b"a", b"{", b"\r", b"\xff", b"\xc3\xa9", b" ", b"x" * 15]), max_size=8
).map(b"".join)


def _lines_of(chunks: list[LineChunk]) -> tuple[list[str], dict[int, int], int]:
    lines: list[str] = []
    too_long: dict[int, int] = {}
    size = 0
    for chunk in chunks:
        assert chunk.first_number == len(lines) + 1
        lines.extend(chunk.lines)
        too_long.update(chunk.too_long)
        size += chunk.size_bytes
    return lines, too_long, size


@settings(max_examples=150, deadline=None)
@given(
    st.lists(line_bytes, max_size=30),
    st.booleans(),
    st.integers(1, 7),
    st.lists(st.integers(1, 50), min_size=1, max_size=10),
)
def test_a_pipe_gives_the_lines_a_file_gives(
    lines: list[bytes], ended: bool, max_lines: int, writes: list[int]
) -> None:
    data = b"\n".join(lines) + (b"\n" if ended and lines else b"")
    expected: list[LineChunk] = []
    handle = io.BytesIO(data)
    while (
        chunk := read_chunk(handle, len(_lines_of(expected)[0]) + 1, max_lines, 1 << 20, LINE_LIMIT)
    ) is not None:
        expected.append(chunk)
    read_end, write_end = os.pipe()

    def write() -> None:  # in pieces of the sizes drawn, then the end
        at, turn = 0, 0
        while at < len(data):
            step = writes[turn % len(writes)]
            os.write(write_end, data[at : at + step])
            at, turn = at + step, turn + 1
        os.close(write_end)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        stream = StreamLines(read_end)
        got: list[LineChunk] = []
        while (
            chunk := stream.read_chunk(
                len(_lines_of(got)[0]) + 1, max_lines, 1 << 20, LINE_LIMIT, 0.0
            )
        ) is not None:
            assert len(chunk.lines) <= max_lines
            got.append(chunk)
        assert stream.at_end
    finally:
        writer.join()
        os.close(read_end)
    assert _lines_of(got) == _lines_of(expected)
    assert _lines_of(got)[2] == len(data)
