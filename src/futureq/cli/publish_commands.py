"""``futureq-cli publish``: one message (``PAYLOAD``, ``-`` for stdin, ``--payload-file``)
or a JSON-lines file (``--file``) in batches, with a summary.

``publish --file`` sends batches of whole PUBLISH frames; a refused line is reported
and its batch sent again without it, and when no server answers for a whole
``--request-timeout`` the remaining lines are reported as not sent
(``docs/cli.md``, "publish --file"). The JSON-lines format is in :mod:`futureq.cli.jsonl`.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import errno
import io as io_module
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Final, TypeVar

import attrs
import trio

from futureq.cli.argv_text import argv_bytes
from futureq.cli.client_arguments import DEFAULT_BATCH_SIZE
from futureq.cli.interrupts import Interrupt, ctrl_c_requests
from futureq.cli.jsonl import JsonlItem, LineFailure, parse_jsonl
from futureq.cli.output import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    Output,
    error_line,
)
from futureq.client import Client
from futureq.client._batching import PUBLISH_FRAME_OVERHEAD_BYTES, split_by_size
from futureq.errors import ConnectionLostError, ErrorCode, ProtocolError, RequestError

T = TypeVar("T")

STDIN_PAYLOAD: Final = "-"
"""``publish TOPIC -`` reads the payload bytes from standard input."""
MAX_FAILURES_SHOWN: Final = 50


def read_payload(handle: IO[bytes], limit: int, source: str) -> bytes:
    """Read a payload from ``handle``, at most ``limit`` + 1 bytes (``/dev/zero`` or
    ``yes |`` would otherwise fill the memory).

    Raises:
        RequestError: PAYLOAD_TOO_LARGE when there are more than ``limit`` bytes.
    """
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = handle.read(limit + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:
        raise RequestError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"the payload from {source} is more than {limit} bytes, the largest frame the "
            "server accepts (its payload limit, max_payload_bytes, is 1 MiB by default); "
            "send a smaller payload",
        )
    return b"".join(chunks)


async def _read_stdin(io: Output, read: Callable[[IO[bytes]], T], what: str) -> T:
    """``read`` over standard input (``io.stdin`` in tests), in a worker thread.

    The process's own stdin is read unbuffered from its file descriptor in a thread
    that a Ctrl-C abandons: the read used to hold off Ctrl-C until the end of the
    input (a user who forgot the pipe could not stop it, and after Ctrl-D the payload
    typed so far was published anyway; found by a tester). A raw read holds no lock
    of ``sys.stdin``, so an abandoned thread cannot hang the interpreter's exit.

    Raises:
        OSError: standard input is closed (``<&-``; the sentence says to pipe ``what``
            in) or cannot be read; as ``read`` otherwise.
    """
    if io.stdin is not None:
        return await trio.to_thread.run_sync(read, io.stdin)
    if sys.stdin is None:  # started with stdin closed: it was an AttributeError traceback
        raise OSError(errno.EBADF, f"standard input is closed; pipe {what} in")
    raw = io_module.FileIO(sys.stdin.fileno(), "rb", closefd=False)
    return await trio.to_thread.run_sync(read, raw, abandon_on_cancel=True)


async def _read_stdin_payload(io: Output, limit: int) -> bytes:
    """``publish TOPIC -``: the payload from standard input (:func:`read_payload`).

    Raises:
        RequestError: PAYLOAD_TOO_LARGE (:func:`read_payload`).
        OSError: standard input is closed or cannot be read (:func:`_read_stdin`).
    """
    return await _read_stdin(
        io, lambda stream: read_payload(stream, limit, "standard input"), "the payload"
    )


async def run_publish_one(client: Client, args: argparse.Namespace, io: Output) -> int:
    # No payload can be larger than a frame: read one byte more to know it is too large.
    limit = client.max_frame_bytes
    if args.payload_file is not None:
        with open(args.payload_file, "rb") as handle:  # noqa: ASYNC230 - a bounded read
            payload = read_payload(handle, limit, args.payload_file)
    elif args.payload == STDIN_PAYLOAD:
        payload = await _read_stdin_payload(io, limit)
    else:
        # The bytes the shell passed: a payload is bytes, so $'\xff' is sent as 0xff
        # (argv is decoded with surrogateescape; UTF-8 text stays its UTF-8).
        payload = argv_bytes(args.payload)
    message_id = await client.publish(
        args.topic,
        payload,
        delay_ms=args.delay,
        deliver_at_ms=args.at,
        ttl_ms=args.ttl,
        headers=dict(args.headers) if args.headers else None,
        idempotency_key=args.idempotency_key,
    )
    io.out(str(message_id))
    return EXIT_OK


@attrs.define
class PublishSummary:
    """Outcome of ``publish --file``."""

    published: int = 0
    duplicates: int = 0
    """Lines that stored nothing: their idempotency key named an earlier message."""
    failures: list[LineFailure] = attrs.Factory(list)
    stopped_at_line: int | None = None
    """The first line of the batch that found no server within --request-timeout, after
    which nothing more was sent (None: every batch was tried)."""
    not_sent: int = 0
    """Lines of the batches after that one, reported as failed without being sent."""
    stop_reason: str = ""
    """Why lines were not sent after :attr:`stopped_at_line` (the failure's reason)."""
    interrupted: bool = False
    """Ctrl-C stopped the run: the batch being sent is of unknown outcome and every
    later one was not sent (all reported as failed)."""


def frame_batches(
    items: Sequence[JsonlItem], batch_size: int, max_frame_bytes: int
) -> list[list[JsonlItem]]:
    """Consecutive batches of at most ``batch_size`` items whose PUBLISH frame stays
    within ``max_frame_bytes`` (an item too large for any frame goes alone): the
    client's own split (:func:`~futureq.client._batching.split_by_size`), one frame per
    batch, so a refused item's batch can be sent again without it."""
    budget = max_frame_bytes - PUBLISH_FRAME_OVERHEAD_BYTES
    batches: list[list[JsonlItem]] = []
    start = 0
    while start < len(items):
        end = split_by_size(items, start, batch_size, budget)
        batches.append(list(items[start:end]))
        start = end
    return batches


async def publish_items(
    client: Client,
    items: Sequence[JsonlItem],
    batch_size: int,
    on_progress: Callable[[int], None] = lambda n: None,
    max_frame_bytes: int | None = None,
    servers: str | None = None,
    interrupt: Interrupt | None = None,
) -> PublishSummary:
    """Publish JSONL items in batches; a refused item is reported and the rest resent.

    Batches hold at most ``batch_size`` items and fit one PUBLISH frame of the
    server's ``max_frame_bytes`` (by each item's ``wire_bytes``). The server stores
    nothing of a refused PUBLISH and names its first bad item, so that line becomes a
    failure and the batch is sent again without it (a line the client cannot encode
    never gets here: :class:`PublishItem` refuses it when the line is read). Errors not
    naming an item (connection lost, 3xx after retries) fail every line of the batch;
    those two mean no server answered for a whole ``request_timeout_s``, so the lines
    of the later batches are failed as not sent rather than each batch waiting as long
    again (:attr:`PublishSummary.stopped_at_line`).

    Args:
        client: A connected client.
        items: The good lines, in order.
        batch_size: Messages per PUBLISH (capped at the client's ``max_batch_items``).
        on_progress: Called with the number of lines settled (published or failed).
        max_frame_bytes: The server's frame limit (default: learned from the client).
        servers: The ``--server`` value, named in a failure's hint when those are the
            addresses that failed (default: the client's servers; a sharded node's
            client lists every shard's address there, and a stopped shard is not a
            server to start).
        interrupt: Ctrl-C's: once requested, the batch in flight is cancelled (its
            lines' outcome unknown, those a sharded call stored counted) and the
            later lines are failed as not sent (:attr:`PublishSummary.interrupted`).

    Returns:
        The counts published and already published (a duplicate idempotency key) and
        the failed lines, in line order.
    """
    summary = PublishSummary()
    size = max(1, min(batch_size, client.max_batch_items))
    limit = client.max_frame_bytes if max_frame_bytes is None else max_frame_bytes
    pending = collections.deque(frame_batches(items, size, limit))
    if interrupt is None:
        interrupt = Interrupt()  # nobody requests it
    while pending:
        if interrupt.requested:
            # Ctrl-C before this batch was sent (while the file was parsed, or during
            # or as the batch before was answered): the rest is not sent.
            _fail_not_sent(pending, 0, "", summary, on_progress, interrupted=True)
            break
        batch = pending.popleft()
        too_big = [e for e in batch if e.wire_bytes > limit - PUBLISH_FRAME_OVERHEAD_BYTES]
        if len(batch) == 1 and too_big:
            summary.failures.append(
                LineFailure(
                    batch[0].line_number,
                    f"[{ErrorCode.FRAME_TOO_LARGE.name}] the message takes "
                    f"{batch[0].wire_bytes} bytes; the server takes frames of at most "
                    f"{limit} bytes (and payloads of at most its max_payload_bytes)",
                )
            )
            on_progress(1)
            continue
        while batch:
            duplicates: list[int] = []
            # What was stored even though the call raised: on a sharded node the other
            # shards' parts of a batch one shard refused. Counted here and never resent.
            stored: dict[int, int] = {}
            try:
                with interrupt.batch() as call:
                    await client.publish_batch(
                        [entry.item for entry in batch], duplicates=duplicates, stored=stored
                    )
                if call.cancelled_caught:
                    # Ctrl-C: say what was stored and what was not, rather than nothing
                    # (the batches after it: at the top of the loop).
                    batch = _drop_stored(batch, stored, duplicates, summary, on_progress)
                    summary.failures.extend(
                        LineFailure(entry.line_number, INTERRUPTED_IN_FLIGHT) for entry in batch
                    )
                    break
            except RequestError as exc:
                index = exc.item_index
                named = index is not None and 0 <= index < len(batch) and index not in stored
                bad_entry = batch[index] if named and index is not None else None
                batch = _drop_stored(batch, stored, duplicates, summary, on_progress)
                if bad_entry is not None:
                    batch = [entry for entry in batch if entry is not bad_entry]
                    summary.failures.append(
                        LineFailure(bad_entry.line_number, f"[{exc.code.name}] {exc.message}")
                    )
                    on_progress(1)
                    continue
                reason = f"[{exc.code.name}] {exc.message}"
                # A 3xx error reaches us only once retrying it would pass the deadline.
                unavailable = exc.code.retryable
            except (ConnectionLostError, ProtocolError) as exc:
                batch = _drop_stored(batch, stored, duplicates, summary, on_progress)
                reason = error_line(exc, servers or ",".join(client.servers)).removeprefix(
                    "error: "
                )
                unavailable = isinstance(exc, ConnectionLostError)
            else:
                summary.published += len(batch) - len(duplicates)
                summary.duplicates += len(duplicates)
                on_progress(len(batch))
                break
            summary.failures.extend(LineFailure(entry.line_number, reason) for entry in batch)
            on_progress(len(batch))
            if unavailable and batch:
                # The client retried until --request-timeout ran out: every later batch
                # would wait as long again (300 batches x 8 s is 40 minutes of silence).
                # One deadline per outage, not one per batch: stop, and report the rest.
                _fail_not_sent(pending, batch[0].line_number, reason, summary, on_progress)
            break
    summary.interrupted = summary.interrupted or interrupt.requested  # as the last answer came
    summary.failures.sort(key=lambda failure: failure.line_number)
    return summary


INTERRUPTED_IN_FLIGHT: Final = (
    "[INTERRUPTED] outcome unknown: Ctrl-C came while this line's batch was being sent "
    "(it may be stored)"
)
INTERRUPTED_NOT_SENT: Final = "[INTERRUPTED] not sent: publishing stopped at Ctrl-C"


def _fail_not_sent(
    pending: collections.deque[list[JsonlItem]],
    failed_line: int,
    reason: str,
    summary: PublishSummary,
    on_progress: Callable[[int], None],
    *,
    interrupted: bool = False,
) -> None:
    """Report every line of the batches still ``pending`` as not sent, and empty it:
    the batch starting at ``failed_line`` found the cluster unavailable for a whole
    ``--request-timeout`` (``reason``), so publishing stops there (``docs/cli.md``,
    "publish --file"); or, with ``interrupted``, Ctrl-C stopped it."""
    code = reason.split("]", 1)[0] + "]" if reason.startswith("[") else "[CONNECTION_LOST]"
    why = (
        INTERRUPTED_NOT_SENT
        if interrupted
        else f"{code} not sent: publishing stopped when the batch from line {failed_line} "
        "found no available server within --request-timeout"
    )
    count = 0
    while pending:
        for entry in pending.popleft():
            summary.failures.append(LineFailure(entry.line_number, why))
            count += 1
    if interrupted:
        summary.interrupted = True
    else:
        summary.stopped_at_line = failed_line
        summary.stop_reason = reason
    summary.not_sent = count
    on_progress(count)


def _drop_stored(
    batch: list[JsonlItem],
    stored: dict[int, int],
    duplicates: list[int],
    summary: PublishSummary,
    on_progress: Callable[[int], None],
) -> list[JsonlItem]:
    """Count the lines of ``batch`` a failed call stored anyway (``stored``: positions
    in ``batch``; ``duplicates``: those of them that were already published) and return
    the lines still to send, in order."""
    if not stored:
        return batch
    repeated = set(duplicates)
    summary.duplicates += sum(1 for position in stored if position in repeated)
    summary.published += sum(1 for position in stored if position not in repeated)
    on_progress(len(stored))
    return [entry for position, entry in enumerate(batch) if position not in stored]


LINE_BYTES_PER_FRAME_BYTE: Final = 6
"""The most bytes of a JSONL line one byte of its PUBLISH frame can take: a payload
byte written as ``\\u00XX``. A line longer than this many times the server's
``max_frame_bytes`` (plus :data:`LINE_SLACK_BYTES`) fits no frame however it is spelled."""
LINE_SLACK_BYTES: Final = 65_536
"""Room for a line's blanks, field names and ending beyond its frame share (bytes)."""
CHUNK_BYTES: Final = 16 * 1024 * 1024
"""``publish --file`` reads, parses and publishes the input this many bytes at a time
(at least one line): its memory is bounded by the chunk, not the file."""
CHUNK_LINES_PER_BATCH: Final = 8
"""A chunk holds at most this many batches' worth of lines."""


def max_line_bytes(max_frame_bytes: int) -> int:
    """The longest JSONL line (bytes, ending included) whose message can fit a frame of
    ``max_frame_bytes`` bytes (:data:`LINE_BYTES_PER_FRAME_BYTE`)."""
    return max_frame_bytes * LINE_BYTES_PER_FRAME_BYTE + LINE_SLACK_BYTES


@attrs.define
class LineChunk:
    """Consecutive lines of a JSONL input, as :func:`read_chunk` read them."""

    first_number: int
    """The number of the first line (from 1)."""
    lines: list[str]
    """The lines, with their endings; an over-long line is ``""`` here (its bytes were
    skipped, not kept) and named in :attr:`too_long`."""
    too_long: dict[int, int] = attrs.Factory(dict)
    """Line number -> bytes of each line longer than the limit given to
    :func:`read_chunk`."""
    size_bytes: int = 0
    """Bytes read for these lines."""


def read_chunk(
    handle: IO[bytes], first_number: int, max_lines: int, max_bytes: int, line_limit: int
) -> LineChunk | None:
    """Read the next lines of ``handle``: at most ``max_lines`` lines and about
    ``max_bytes`` bytes (at least one line); None at the end of the input.

    Lines split at ``\\n`` only, each kept with its ending as it is in the input: a
    lone CR is JSON whitespace inside a line, not a line break (Python's universal
    newlines split there, numbering every later line one too high, found by a
    tester). Bytes that are not UTF-8 are kept as surrogates (``surrogateescape``), so
    a line written back to ``--failed-out`` is the same bytes. A line longer
    than ``line_limit`` bytes is refused as soon as it passes that length: the rest of
    it is read and dropped (at most ``line_limit`` bytes held), so a 600 MB line costs
    no more memory than a short one (found by a tester: a single 600 MB line took
    1.8 GB and 46 s before being refused as FRAME_TOO_LARGE).

    Raises:
        OSError: the input cannot be read.
    """
    chunk = LineChunk(first_number, [])
    while len(chunk.lines) < max_lines and chunk.size_bytes < max_bytes:
        data = handle.readline(line_limit + 1)
        if not data:
            break
        number = first_number + len(chunk.lines)
        size = len(data)
        if size > line_limit and not data.endswith(b"\n"):
            del data
            while True:  # drop the rest of the line, a bounded piece at a time
                rest = handle.readline(LINE_SLACK_BYTES)
                size += len(rest)
                if not rest or rest.endswith(b"\n"):
                    break
            chunk.size_bytes += size
            chunk.too_long[number] = size
            chunk.lines.append("")
            continue
        chunk.size_bytes += size
        chunk.lines.append(data.decode("utf-8", errors="surrogateescape"))
    return chunk if chunk.lines else None


def too_long_failure(number: int, size: int, line_limit: int, max_frame_bytes: int) -> LineFailure:
    """The failure of line ``number``, ``size`` bytes long, past ``line_limit``."""
    return LineFailure(
        number,
        f"[{ErrorCode.FRAME_TOO_LARGE.name}] the line is {size} bytes, more than "
        f"{line_limit}: no message spelled in it fits the server's frames of at most "
        f"{max_frame_bytes} bytes (and payloads of at most its max_payload_bytes); "
        "split its payload into smaller messages",
    )


def _is_stdin_file(path: str, io: Output) -> bool:
    """Whether standard input (``io.stdin`` or the process's) is the file ``path``."""
    handle = io.stdin if io.stdin is not None else sys.stdin
    try:
        there = os.fstat(handle.fileno())
        here = os.stat(path)
    except (AttributeError, OSError, ValueError):  # no such file, or no real stdin
        return False
    return (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino)


def _open_failed_out(args: argparse.Namespace, io: Output) -> IO[bytes] | None:
    """``--failed-out``'s file, opened (truncated) before anything is sent, so a path
    that cannot be written stops the run before it publishes, not after.

    Raises:
        ValueError: it is the input file (it would be overwritten with the failures).
        OSError: it cannot be written (a directory, no permission, no such folder).
    """
    if args.failed_out is None:
        return None
    # Standard input too: `publish --file - --failed-out F < F` truncated its own input
    # once it was read a chunk at a time, and the lines past the first chunk were
    # neither sent nor written anywhere (found by a tester).
    if (
        _is_stdin_file(args.failed_out, io)
        if args.file == STDIN_PAYLOAD
        else os.path.exists(args.failed_out) and os.path.samefile(args.failed_out, args.file)
    ):
        raise ValueError(
            f"--failed-out {args.failed_out} is the input file; give another path (it "
            "would be overwritten with the lines not stored)"
        )
    return open(args.failed_out, "wb")  # noqa: SIM115 - closed by the caller


class _LineSource:
    """``--file``'s input, read a chunk at a time in a worker thread (:func:`read_chunk`).

    The process's own standard input is read unbuffered by the OS file and in a thread
    a Ctrl-C abandons, as :func:`_read_stdin` does; a file is opened before anything
    is sent, so one that cannot be read stops the run first."""

    def __init__(self, path: str, io: Output) -> None:
        self._abandon = False
        self.endless = path == STDIN_PAYLOAD
        """Whether the input may never end (standard input: a pipe or a terminal), so
        that a Ctrl-C stops reading it rather than waiting for its end."""
        self._owned: IO[bytes] | None = None
        self.handle: IO[bytes]
        if path != STDIN_PAYLOAD:
            self._owned = self.handle = open(path, "rb")  # noqa: SIM115 - closed in close()
        elif io.stdin is not None:
            self.handle = io.stdin
        elif sys.stdin is None:  # started with stdin closed
            raise OSError(errno.EBADF, "standard input is closed; pipe the JSON lines in")
        else:
            raw = io_module.FileIO(sys.stdin.fileno(), "rb", closefd=False)
            self._owned = self.handle = io_module.BufferedReader(raw)
            self._abandon = True

    async def next_chunk(
        self, first_number: int, max_lines: int, line_limit: int
    ) -> LineChunk | None:
        """The next lines (:func:`read_chunk`); None at the end.

        Raises:
            OSError: the input cannot be read.
        """
        return await trio.to_thread.run_sync(
            read_chunk,
            self.handle,
            first_number,
            max_lines,
            CHUNK_BYTES,
            line_limit,
            abandon_on_cancel=self._abandon,
        )

    def close(self) -> None:
        """Close what this source opened (not the caller's stream)."""
        if self._owned is not None and not self._abandon:
            self._owned.close()


async def run_publish_file(client: Client, args: argparse.Namespace, io: Output) -> int:
    # "-" is standard input, as for `publish TOPIC -` (it was "No such file or
    # directory: -", found by a tester).
    source = _LineSource(args.file, io)
    try:
        try:
            failed_out = _open_failed_out(args, io)
        except ValueError as exc:
            io.err(f"error: {exc}")
            return EXIT_USAGE
        try:
            return await _publish_lines(client, args, io, source, failed_out)
        finally:
            if failed_out is not None:
                failed_out.close()
    finally:
        source.close()


@contextlib.contextmanager
def _progress(io: Output) -> Iterator[Callable[[int], None]]:
    """A progress display of lines settled on a terminal (its total is not known
    before the input's end: it is read a chunk at a time); elsewhere nothing."""
    if not io.is_terminal:
        yield lambda n: None
        return
    from rich.progress import Progress

    with Progress(transient=True) as progress:
        task = progress.add_task("publishing", total=None)
        yield lambda n: progress.advance(task, n)


async def _publish_chunk(
    client: Client,
    args: argparse.Namespace,
    chunk: LineChunk,
    line_limit: int,
    summary: PublishSummary,
    advance: Callable[[int], None],
    interrupt: Interrupt,
) -> list[LineFailure]:
    """Parse and publish one chunk's lines; add its counts to ``summary`` and return
    its failures, in line order. Once a chunk stopped (no server within
    --request-timeout), later chunks are failed as not sent without being sent."""
    if interrupt.requested:
        return _fail_chunk_interrupted(chunk, line_limit, client.max_frame_bytes, summary, advance)
    # Parsed under Ctrl-C's receiver, and in a thread so that a second Ctrl-C is
    # heard at once: a Ctrl-C while a large file was parsed ended the run with no
    # summary and an empty --failed-out (found by a tester). Now every line is
    # reported not sent, and --failed-out gets it.
    items, failures = await trio.to_thread.run_sync(
        parse_jsonl, chunk.lines, abandon_on_cancel=True
    )
    offset = chunk.first_number - 1
    if offset:
        items = [attrs.evolve(item, line_number=item.line_number + offset) for item in items]
        failures = [
            attrs.evolve(failure, line_number=failure.line_number + offset) for failure in failures
        ]
    limit = client.max_frame_bytes
    failures.extend(
        too_long_failure(number, size, line_limit, limit) for number, size in chunk.too_long.items()
    )
    part = PublishSummary()
    if summary.stopped_at_line is not None:
        _fail_not_sent(
            collections.deque([items]),
            summary.stopped_at_line,
            summary.stop_reason,
            part,
            advance,
        )
    else:
        part = await publish_items(
            client,
            items,
            args.batch_size or DEFAULT_BATCH_SIZE,
            advance,
            servers=args.server,
            interrupt=interrupt,
        )
    advance(len(failures))
    summary.published += part.published
    summary.duplicates += part.duplicates
    summary.not_sent += part.not_sent
    summary.interrupted = summary.interrupted or part.interrupted
    if summary.stopped_at_line is None and part.stopped_at_line is not None:
        summary.stopped_at_line = part.stopped_at_line
        summary.stop_reason = part.stop_reason
    return sorted(failures + part.failures, key=lambda failure: failure.line_number)


def _fail_chunk_interrupted(
    chunk: LineChunk,
    line_limit: int,
    max_frame_bytes: int,
    summary: PublishSummary,
    advance: Callable[[int], None],
) -> list[LineFailure]:
    """The failures of a chunk read after Ctrl-C: every line but the blank ones is not
    sent, unparsed (a bad line goes to ``--failed-out`` with the rest). Parsing them
    only to fail them kept a Ctrl-C early in a file of millions of lines waiting half a
    minute (17 us a line; found by a tester)."""
    failures = [
        LineFailure(number, INTERRUPTED_NOT_SENT)
        for number, line in enumerate(chunk.lines, start=chunk.first_number)
        if number not in chunk.too_long and line.rstrip("\r\n").strip()
    ]
    summary.not_sent += len(failures)
    summary.interrupted = True
    failures.extend(
        too_long_failure(number, size, line_limit, max_frame_bytes)
        for number, size in chunk.too_long.items()
    )
    advance(len(failures))
    return sorted(failures, key=lambda failure: failure.line_number)


async def _publish_lines(
    client: Client,
    args: argparse.Namespace,
    io: Output,
    source: _LineSource,
    failed_out: IO[bytes] | None,
) -> int:
    started = time.monotonic()
    interrupt = Interrupt()
    line_limit = max_line_bytes(client.max_frame_bytes)
    max_lines = max(1, args.batch_size or DEFAULT_BATCH_SIZE) * CHUNK_LINES_PER_BATCH
    summary = PublishSummary()
    unwritten: list[int] = []  # failed lines too long to keep for --failed-out
    unread_after: int | None = None  # Ctrl-C stopped reading stdin after this line
    async with ctrl_c_requests(interrupt):
        with _progress(io) as advance:
            number = 1
            while True:
                if interrupt.requested and source.endless:
                    unread_after = number - 1
                    break
                # A pipe may never end (`producer | futureq-cli publish --file -`):
                # Ctrl-C or SIGTERM while waiting for its next chunk stops the read,
                # where it used to wait on for the input's end and take only a second
                # Ctrl-C, with a traceback and no summary (found by a tester). A file's
                # read ends by itself, so its later lines are still reported not sent.
                with interrupt.batch() if source.endless else contextlib.nullcontext():
                    chunk = await source.next_chunk(number, max_lines, line_limit)
                if interrupt.requested and source.endless:
                    unread_after = number - 1
                    break
                if chunk is None:
                    break
                number += len(chunk.lines)
                failures = await _publish_chunk(
                    client, args, chunk, line_limit, summary, advance, interrupt
                )
                summary.failures.extend(failures)
                if failed_out is not None:
                    unwritten.extend(_write_failed(failed_out, chunk, failures))
                del chunk
    summary.interrupted = summary.interrupted or interrupt.requested
    elapsed_s = max(time.monotonic() - started, 1e-9)
    rate = summary.published / elapsed_s
    already = (
        f", {summary.duplicates} already published (same idempotency key)"
        if summary.duplicates
        else ""
    )
    io.out(
        f"published {summary.published} message(s){already} in {elapsed_s:.2f} s "
        f"({rate:.0f} msgs/s); {len(summary.failures)} failed line(s)"
    )
    for failure in summary.failures[:MAX_FAILURES_SHOWN]:
        io.err(str(failure))
    if len(summary.failures) > MAX_FAILURES_SHOWN:
        io.err(f"... and {len(summary.failures) - MAX_FAILURES_SHOWN} more failed line(s)")
    if summary.stopped_at_line is not None:
        # Not "send it again from line N": on a sharded node part of that batch and of
        # the lines before it may be stored (found by a tester: following that advice
        # stored five lines twice). The lines not stored are exactly the failures.
        io.err(
            f"stopped at line {summary.stopped_at_line}: its batch found no available "
            f"server within --request-timeout, so the {summary.not_sent} line(s) after "
            "that batch were not sent"
        )
    if summary.interrupted:
        unknown = sum(f.reason == INTERRUPTED_IN_FLIGHT for f in summary.failures)
        io.err(
            f"interrupted: the {summary.not_sent} line(s) after the batch being sent were "
            f"not sent, and that batch's {unknown} line(s) have an unknown outcome"
            if unknown
            else f"interrupted: the {summary.not_sent} line(s) after the last batch "
            "stored were not sent"
        )
        if unread_after is not None:
            io.err(
                f"interrupted: the input after line {unread_after} was not read (nor sent, "
                "nor written to --failed-out)"
            )
    stopped = summary.stopped_at_line is not None or summary.interrupted
    if summary.failures and (failed_out is not None or stopped):
        io.err(_resend_advice(args, summary.failures, failed_out, unwritten))
    if summary.interrupted:
        return interrupt.exit_status
    return EXIT_ERROR if summary.failures else EXIT_OK


def _write_failed(
    failed_out: IO[bytes], chunk: LineChunk, failures: list[LineFailure]
) -> list[int]:
    """Write the lines of ``chunk`` not stored (``failures``, in line order) to
    ``--failed-out``, byte for byte as they were; return the numbers of those too long
    to have been kept (:attr:`LineChunk.too_long`), which are not written."""
    skipped: list[int] = []
    for failure in failures:
        if failure.line_number in chunk.too_long:
            skipped.append(failure.line_number)
            continue
        text = chunk.lines[failure.line_number - chunk.first_number]
        text = text if text.endswith("\n") else text + "\n"
        failed_out.write(text.encode("utf-8", errors="surrogateescape"))
    failed_out.flush()
    return skipped


def _resend_advice(
    args: argparse.Namespace,
    failures: list[LineFailure],
    failed_out: IO[bytes] | None,
    unwritten: list[int],
) -> str:
    """Say how to send the lines not stored again (they are in ``--failed-out``, if
    given, but for ``unwritten``: lines too long for any frame), and nothing else: the
    other lines are stored (or already were)."""
    count = len(failures)
    if failed_out is None:
        shown = "" if count <= MAX_FAILURES_SHOWN else f" (the first {MAX_FAILURES_SHOWN} shown)"
        return (
            f"{count} line(s) were not stored, each listed by number{shown}; the others are "
            "stored, so do not send the whole file again: --failed-out F writes the lines "
            "not stored to F, to send with publish --file F"
        )
    left_out = ""
    if unwritten:
        named = ", ".join(str(number) for number in unwritten[:MAX_FAILURES_SHOWN])
        more = "..." if len(unwritten) > MAX_FAILURES_SHOWN else ""
        left_out = (
            f"{len(unwritten)} line(s) not stored, too long for any frame, are not in "
            f"{args.failed_out} (line(s) {named}{more}): split those into smaller messages"
        )
        if count == len(unwritten):
            return left_out
        left_out = "; " + left_out
    return (
        f"the {count - len(unwritten)} line(s) not stored are in {args.failed_out}; send "
        f"them again with publish --file {args.failed_out} (a delay_ms counts from when it "
        f"is sent){left_out}"
    )
