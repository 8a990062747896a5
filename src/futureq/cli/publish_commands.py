"""``futureq-cli publish``: one message (``PAYLOAD``, ``-`` for stdin, ``--payload-file``)
or a JSON-lines file (``--file``) in batches, with a summary.

``publish --file`` sends batches of whole PUBLISH frames; a refused line is reported
and its batch sent again without it, and when no server answers for a whole
``--request-timeout`` (or at Ctrl-C) the lines read are reported as not sent and
nothing more is read. From a pipe or terminal, the lines read are published within
``--linger`` of the first of them arriving (``docs/cli.md``, "publish --file"). The
JSON-lines format is in :mod:`futureq.cli.jsonl`.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import errno
import io as io_module
import os
import select
import shlex
import stat
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Final, TypeVar

import attrs
import trio

from futureq.cli.argv_text import argv_bytes
from futureq.cli.client_arguments import DEFAULT_BATCH_SIZE
from futureq.cli.durations import DEFAULT_LINGER_MS
from futureq.cli.interrupts import Interrupt, ctrl_c_requests
from futureq.cli.jsonl import JsonlItem, LineFailure, parse_jsonl
from futureq.cli.leader_time import passed_warning
from futureq.cli.output import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    Output,
    Report,
    error_line,
    write_errors,
    write_lines,
)
from futureq.client import Client
from futureq.client._batching import PUBLISH_FRAME_OVERHEAD_BYTES, split_by_size
from futureq.errors import (
    ConnectionLostError,
    ErrorCode,
    NotSentError,
    ProtocolError,
    RequestError,
)

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
    await write_lines(io, [str(message_id)])
    warning = await passed_warning(client, args.at, "--at")
    if warning is not None:
        await write_errors(io, [warning])
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
        interrupt: Ctrl-C's: once requested, the batch in flight is given
            :data:`INTERRUPT_GRACE_S` for its answer, then cancelled (its lines'
            outcome unknown, those a sharded call stored counted), and the
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
            if interrupt.requested:
                # Ctrl-C came as the batch before this resend of its rest was answered
                # (a line refused): the rest was never sent again, so it is not stored.
                # Put back for the check at the loop's top, which fails it with the later
                # batches and counts it in summary.not_sent (failed here, it was left out
                # of "interrupted: the N line(s) ... were not sent").
                pending.appendleft(batch)
                break
            duplicates: list[int] = []
            # What was stored even though the call raised: on a sharded node the other
            # shards' parts of a batch one shard refused. Counted here and never resent.
            stored: dict[int, int] = {}
            try:
                with interrupt.batch(grace_s=INTERRUPT_GRACE_S) as call:
                    await client.publish_batch(
                        [entry.item for entry in batch], duplicates=duplicates, stored=stored
                    )
                if call.cancelled_caught:
                    # Ctrl-C: say what was stored and what was not, rather than nothing
                    # (the batches after it: at the top of the loop).
                    batch = _drop_stored(batch, stored, duplicates, summary, on_progress)
                    summary.failures.extend(
                        LineFailure(entry.line_number, INTERRUPTED_IN_FLIGHT, may_be_stored=True)
                        for entry in batch
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
                unanswered = False
            except (ConnectionLostError, ProtocolError) as exc:
                batch = _drop_stored(batch, stored, duplicates, summary, on_progress)
                reason = error_line(exc, servers or ",".join(client.servers)).removeprefix(
                    "error: "
                )
                unavailable = isinstance(exc, ConnectionLostError)
                # Sent, perhaps stored, and no answer came; unless the client knows
                # every attempt took no effect (NotSentError: no server reached, or
                # a GOAWAY said it was not served). Before, those lines too were
                # counted "unknown outcome ... may be stored already".
                # (A NotSentError as the cause: the lines of this batch not stored
                # were not sent, and other shards stored the rest, _drop_stored.)
                unanswered = not isinstance(exc, NotSentError) and not isinstance(
                    exc.__cause__, NotSentError
                )
            else:
                summary.published += len(batch) - len(duplicates)
                summary.duplicates += len(duplicates)
                on_progress(len(batch))
                break
            summary.failures.extend(
                LineFailure(entry.line_number, reason, may_be_stored=unanswered) for entry in batch
            )
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


INTERRUPT_GRACE_S: Final = 2.0
"""How long (s) the batch in flight when Ctrl-C (or SIGTERM) comes is given for its
answer: a healthy server answers in milliseconds, and a batch answered is counted
stored, so sending the lines not stored again stores none twice. A batch not answered
within it is reported ``[INTERRUPTED] outcome unknown``; a second Ctrl-C stops at once."""

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


COPY_BYTES: Final = 1024 * 1024
"""After a stop, the rest of a file goes to ``--failed-out`` this many bytes at a time."""
STREAM_READ_BYTES: Final = 1024 * 1024
"""A pipe or terminal is read at most this many bytes at a time (:class:`StreamLines`)."""
STOP_POLL_S: Final = 0.1
"""How often a wait for input from a pipe looks whether it was told to stop (s)."""


class StreamLines:
    """Lines of a pipe, socket or terminal (``producer | futureq-cli publish --file -``),
    each available as soon as its ``\n`` arrives.

    :func:`read_chunk` over a buffered file waits for a whole chunk (8 batches or
    16 MiB): a producer writing a line a second (``tail -f app.log |``) had nothing
    published for hours, or ever. Here a chunk ends at ``max_lines`` / ``max_bytes``,
    at the input's end, or once ``linger_s`` passed since its first line arrived and no
    whole line is waiting: what arrived is published then. A fast producer still fills
    whole chunks (its lines are waiting). Lines are split, numbered and limited as
    :func:`read_chunk` does.

    It reads the file descriptor itself (unbuffered, by ``select`` and ``os.read``, never
    setting it non-blocking: a terminal is shared with the shell), in a worker thread;
    :meth:`stop` ends a read left waiting (within :data:`STOP_POLL_S`).
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray()
        self._start = 0
        """Where the unread bytes of :attr:`_buffer` start."""
        self._eof = False
        self._stopped = False
        self._stop_asked: Callable[[], bool] = lambda: False

    def stop(self) -> None:
        """End a read waiting for input (it returns what it has), and every later one."""
        self._stopped = True

    @property
    def at_end(self) -> bool:
        """Whether the input's end was reached and every line of it given out."""
        return self._eof and self._start >= len(self._buffer)

    def _fill(self, deadline: float | None) -> bool:
        """Read what the input has (waiting until ``deadline``, a monotonic time, or
        for ever; once it passed, only what is there already); False if nothing came by
        then, or once :meth:`stop` was called or ``self._stop_asked()`` is true.

        Raises:
            OSError: the input cannot be read.
        """
        while not (self._stopped or self._stop_asked()):
            wait_s, last = STOP_POLL_S, False
            if deadline is not None and (left_s := deadline - time.monotonic()) <= wait_s:
                # Past the deadline, what is already waiting is still taken (a fast
                # producer fills whole chunks, --linger 0 too), without waiting.
                wait_s, last = max(0.0, left_s), True
            # select, not poll: macOS's poll refuses terminals (POLLNVAL).
            if not select.select([self._fd], [], [], wait_s)[0]:
                if last:
                    return False
                continue
            try:
                data = os.read(self._fd, STREAM_READ_BYTES)
            except BlockingIOError:  # another process set the pipe non-blocking
                continue
            if self._start:
                del self._buffer[: self._start]
                self._start = 0
            if not data:
                self._eof = True
            self._buffer += data
            return True
        return False

    def read_chunk(
        self,
        first_number: int,
        max_lines: int,
        max_bytes: int,
        line_limit: int,
        linger_s: float,
        stop: Callable[[], bool] = lambda: False,
    ) -> LineChunk | None:
        """The next lines, as :func:`read_chunk` gives them, ended early once
        ``linger_s`` passed since the first of them was read, or once ``stop()`` is
        true (looked at every :data:`STOP_POLL_S` while waiting: Ctrl-C); None at the
        input's end (or when stopped with nothing read).

        Raises:
            OSError: the input cannot be read.
        """
        self._stop_asked = stop
        chunk = LineChunk(first_number, [])
        deadline: float | None = None
        while len(chunk.lines) < max_lines and chunk.size_bytes < max_bytes:
            buffer = self._buffer
            if self._take_whole_lines(chunk, max_lines, line_limit):
                pass
            elif (end := buffer.find(b"\n", self._start, self._start + line_limit + 1)) < 0 and (
                len(buffer) - self._start > line_limit
            ):
                self._skip_long_line(chunk, line_limit)
            elif end >= 0 or (self._eof and len(buffer) > self._start):
                cut = end + 1 if end >= 0 else len(buffer)
                chunk.lines.append(
                    buffer[self._start : cut].decode("utf-8", errors="surrogateescape")
                )
                chunk.size_bytes += cut - self._start
                self._start = cut
            elif self._eof:
                break
            else:
                if not self._fill(deadline):
                    break
                continue
            if deadline is None:
                deadline = time.monotonic() + linger_s
        return chunk if chunk.lines else None

    def _take_whole_lines(self, chunk: LineChunk, max_lines: int, line_limit: int) -> bool:
        """Move every whole line waiting in the buffer (at most what ``chunk`` has room
        for) into ``chunk`` at once, when none of them can be longer than
        ``line_limit``: a line at a time cost a third of the read's speed. False if
        there is no such line (the caller takes lines one by one)."""
        last = self._buffer.rfind(b"\n", self._start)
        if last < 0 or last + 1 - self._start > line_limit:
            return False
        text = self._buffer[self._start : last + 1].decode("utf-8", errors="surrogateescape")
        lines = text.split("\n")
        lines.pop()  # after the last line ending
        room = max_lines - len(chunk.lines)
        taken = len(lines) if len(lines) <= room else room
        if taken < len(lines):
            del lines[taken:]
            size = len("\n".join(lines).encode("utf-8", errors="surrogateescape")) + 1
        else:
            size = last + 1 - self._start
        chunk.lines.extend([line + "\n" for line in lines])
        chunk.size_bytes += size
        self._start += size
        return True

    def _skip_long_line(self, chunk: LineChunk, line_limit: int) -> None:
        """Drop a line already past ``line_limit`` bytes, through its end (waiting for
        it, for the line's number belongs to this chunk), and name it in ``chunk``."""
        number = chunk.first_number + len(chunk.lines)
        size = 0
        while True:
            end = self._buffer.find(b"\n", self._start)
            stop = end + 1 if end >= 0 else len(self._buffer)
            size += stop - self._start
            self._start = stop
            if end >= 0 or self._eof or not self._fill(None):
                break
        chunk.size_bytes += size
        chunk.too_long[number] = size
        chunk.lines.append("")


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
    that cannot be written stops the run before it publishes, not after. A path naming
    this process's standard output or error (``/dev/stdout``, or the file it is
    redirected to) is written through that descriptor, not truncated.

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
    descriptor = _open_descriptor(args.failed_out)
    if descriptor is not None:
        # One of this process's own outputs (`--failed-out /dev/stdout > out.txt`):
        # written through a copy of its descriptor, never opened again with truncation.
        # Opened anew, `>> log` lost what the log held, and `> out.txt` had the summary
        # written over the failed lines (a second file offset, both starting at 0).
        return os.fdopen(os.dup(descriptor), "wb")
    return open(args.failed_out, "wb")  # noqa: SIM115 - closed by the caller


_DESCRIPTOR_PATHS: Final = {"/dev/stdout": 1, "/dev/stderr": 2}
_DESCRIPTOR_FOLDERS: Final = ("/dev/fd/", "/proc/self/fd/")


def _open_descriptor(path: str) -> int | None:
    """The file descriptor of this process that ``path`` names (``/dev/stdout``,
    ``/dev/stderr``, ``/dev/fd/N``, ``/proc/self/fd/N``) or that is the same file as
    (standard output or error redirected to ``path``); None for any other path, or one
    naming a descriptor that is not open."""
    descriptor = _DESCRIPTOR_PATHS.get(path)
    for folder in _DESCRIPTOR_FOLDERS:
        if descriptor is None and path.startswith(folder) and path[len(folder) :].isdigit():
            descriptor = int(path[len(folder) :])
    candidates = (1, 2) if descriptor is None else (descriptor,)
    try:
        here = os.stat(path)
    except OSError:
        return None  # not there yet: a new file
    for candidate in candidates:
        try:
            there = os.fstat(candidate)
        except OSError:
            continue
        if (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino):
            return candidate
    return None


class _LineSource:
    """``--file``'s input, read a chunk at a time in a worker thread.

    A regular file (or standard input redirected from one) is read by
    :func:`read_chunk`, whole chunks; anything else (a pipe, a terminal, a socket,
    ``--file <(producer)``) by :class:`StreamLines`, so that a slow producer's lines
    are published within ``--linger`` of arriving. Such an input may never end, so it
    is read in a thread a Ctrl-C abandons (told to stop, it ends within
    :data:`STOP_POLL_S`). A file is opened before anything is sent, so one that cannot
    be read stops the run first."""

    def __init__(self, path: str, io: Output) -> None:
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
        self.size_bytes: int | None = None
        """The size of a regular file (the progress bar's total); None for a stream."""
        self.bytes_read = 0
        """Bytes of the input read so far (where the unread part starts)."""
        self._stream: StreamLines | None = None
        try:
            status = os.fstat(self.handle.fileno())
        except (AttributeError, OSError, ValueError, io_module.UnsupportedOperation):
            return  # an in-memory stream (a caller's): read as a file
        if stat.S_ISREG(status.st_mode):
            self.size_bytes = max(0, status.st_size - self.handle.tell())
        else:
            self._stream = StreamLines(self.handle.fileno())

    async def next_chunk(
        self,
        first_number: int,
        max_lines: int,
        line_limit: int,
        linger_s: float,
        stop: Callable[[], bool],
    ) -> LineChunk | None:
        """The next lines (:func:`read_chunk`; from a stream, those that arrived
        within ``linger_s`` of the first, or before ``stop()`` turned true); None at
        the end.

        Raises:
            OSError: the input cannot be read.
        """
        if self._stream is None:
            chunk = await trio.to_thread.run_sync(
                read_chunk, self.handle, first_number, max_lines, CHUNK_BYTES, line_limit
            )
        else:
            chunk = await trio.to_thread.run_sync(
                self._stream.read_chunk,
                first_number,
                max_lines,
                CHUNK_BYTES,
                line_limit,
                linger_s,
                stop,
                abandon_on_cancel=True,
            )
        if chunk is not None:
            self.bytes_read += chunk.size_bytes
        return chunk

    @property
    def at_end(self) -> bool:
        """Whether the whole input was read (as far as is known: a stream's end is
        known once it was reached)."""
        if self._stream is not None:
            return self._stream.at_end
        if self.size_bytes is not None:
            return self.bytes_read >= self.size_bytes
        return not self.handle.read(1)  # an in-memory stream (a caller's); stopped anyway

    def copy_rest(self, out: IO[bytes]) -> int:
        """Copy the rest of a regular file to ``out`` byte for byte, unparsed and
        unsplit (a missing last line ending added); return the lines copied (blank
        ones too). :attr:`bytes_read` counts the bytes copied.

        Raises:
            OSError: the input cannot be read, or ``out`` written.
        """
        lines = 0
        ended = True  # the bytes copied so far end a line
        while piece := self.handle.read(COPY_BYTES):
            out.write(piece)
            self.bytes_read += len(piece)
            lines += piece.count(b"\n")
            ended = piece.endswith(b"\n")
        if not ended:
            out.write(b"\n")
            lines += 1
        out.flush()
        return lines

    def close(self) -> None:
        """Stop a read left waiting, and close what this source opened (not the
        caller's stream; not one a thread may still be reading)."""
        if self._stream is not None:
            self._stream.stop()
        elif self._owned is not None:
            self._owned.close()


async def run_publish_file(client: Client, args: argparse.Namespace, io: Output) -> int:
    # "-" is standard input, as for `publish TOPIC -` (it was "No such file or
    # directory: -", found by a tester).
    source = _LineSource(args.file, io)
    try:
        try:
            failed_out = _open_failed_out(args, io)
        except ValueError as exc:
            await write_errors(io, [f"error: {exc}"])
            return EXIT_USAGE
        try:
            return await _publish_lines(client, args, io, source, failed_out)
        finally:
            if failed_out is not None:
                failed_out.close()
    finally:
        source.close()


class _Progress:
    """What the progress bar shows: lines settled (published or failed) and, for a
    regular file, the bytes of the file they take of its size."""

    def __init__(self, update: Callable[[float, int], None] | None) -> None:
        self._update = update
        self.lines = 0
        self._chunk_start_bytes = 0
        self._chunk_bytes = 0
        self._chunk_lines = 0
        self._chunk_settled = 0

    def start_chunk(self, start_bytes: int, chunk: LineChunk) -> None:
        """``chunk``, whose first byte is at ``start_bytes`` of the input, is next."""
        self._chunk_start_bytes = start_bytes
        self._chunk_bytes = chunk.size_bytes
        self._chunk_lines = max(1, len(chunk.lines))
        self._chunk_settled = 0

    def advance(self, lines: int) -> None:
        """``lines`` more lines of the chunk were settled."""
        self.lines += lines
        self._chunk_settled = min(self._chunk_lines, self._chunk_settled + lines)
        if self._update is not None:
            share = self._chunk_bytes * self._chunk_settled / self._chunk_lines
            self._update(self._chunk_start_bytes + share, self.lines)


@contextlib.contextmanager
def _progress(io: Output, total_bytes: int | None) -> Iterator[_Progress]:
    """A progress display on a terminal (elsewhere nothing): of a regular file, the
    bytes settled of its ``total_bytes``, with the lines; of a pipe or terminal, whose
    size is not known, the lines settled. It used to show lines without a total for a
    file too: no way to tell how far a long run was."""
    if not io.is_terminal:
        yield _Progress(None)
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        ProgressColumn,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    lines = TextColumn("{task.fields[lines]} line(s)")
    columns: tuple[ProgressColumn, ...]
    if total_bytes is None:
        columns = (SpinnerColumn(), TextColumn("publishing"), lines, TimeElapsedColumn())
    else:
        columns = (
            TextColumn("publishing"),
            BarColumn(),
            DownloadColumn(),
            lines,
            TimeRemainingColumn(),
        )
    with Progress(*columns, transient=True) as progress:
        task = progress.add_task("publishing", total=total_bytes, lines=0)

        def update(done_bytes: float, settled: int) -> None:
            if total_bytes is None:
                progress.update(task, lines=settled)
            else:
                progress.update(task, completed=done_bytes, lines=settled)

        yield _Progress(update)


async def _publish_chunk(
    client: Client,
    args: argparse.Namespace,
    chunk: LineChunk,
    batch_size: int,
    line_limit: int,
    summary: PublishSummary,
    advance: Callable[[int], None],
    interrupt: Interrupt,
) -> list[LineFailure]:
    """Parse and publish one chunk's lines, ``batch_size`` a PUBLISH; add its counts to ``summary`` and return
    its failures, in line order. (After a stop, Ctrl-C or no server within
    --request-timeout, no later chunk is read: :func:`_publish_lines`.)"""
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
    part = await publish_items(
        client,
        items,
        batch_size,
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
    """The failures of the chunk being read as Ctrl-C came: every line but the blank
    ones is not sent, unparsed (a bad line goes to ``--failed-out`` with the rest)."""
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
    # The defaults of --batch-size and --linger (None: not given; the parser leaves them).
    batch_size = args.batch_size or DEFAULT_BATCH_SIZE
    max_lines = max(1, batch_size) * CHUNK_LINES_PER_BATCH
    linger_s = (DEFAULT_LINGER_MS if args.linger is None else args.linger) / 1000
    summary = PublishSummary()
    unwritten: list[int] = []  # failed lines too long to keep for --failed-out
    read_lines = 0
    async with ctrl_c_requests(interrupt):
        with _progress(io, source.size_bytes) as progress:
            while not (interrupt.requested or summary.stopped_at_line is not None):
                # After a stop (Ctrl-C, SIGTERM, or no server within --request-timeout)
                # nothing more is read: the later chunks of a file of millions of lines
                # were read and parsed only to be reported not sent (found by a
                # tester); the final line says where the input not read starts.
                # A pipe may never end (`producer | futureq-cli publish --file -`): its
                # read gives back what it has as soon as Ctrl-C comes (and those lines
                # are reported not sent), where it used to wait on for the input's end.
                start_bytes = source.bytes_read
                chunk = await source.next_chunk(
                    read_lines + 1, max_lines, line_limit, linger_s, lambda: interrupt.requested
                )
                if chunk is None:
                    break
                read_lines += len(chunk.lines)
                progress.start_chunk(start_bytes, chunk)
                if interrupt.requested:
                    failures = _fail_chunk_interrupted(
                        chunk, line_limit, client.max_frame_bytes, summary, progress.advance
                    )
                else:
                    failures = await _publish_chunk(
                        client,
                        args,
                        chunk,
                        batch_size,
                        line_limit,
                        summary,
                        progress.advance,
                        interrupt,
                    )
                summary.failures.extend(failures)
                if failed_out is not None:
                    unwritten.extend(_write_failed(failed_out, chunk, failures))
                del chunk
        summary.interrupted = summary.interrupted or interrupt.requested
        stopped = summary.stopped_at_line is not None or summary.interrupted
        unread = stopped and not source.at_end
        copied = 0
        if unread and failed_out is not None and source.size_bytes is not None:
            # --failed-out F keeps its promise (every line not stored, so that
            # `publish --file F` finishes the job): the rest of a file is copied to F
            # as it is, not parsed (a second Ctrl-C stops that too, at once).
            copied = await trio.to_thread.run_sync(
                source.copy_rest, failed_out, abandon_on_cancel=True
            )
            unread = False
    elapsed_s = max(time.monotonic() - started, 1e-9)
    # Written from a worker thread (Report): a paused reader must not hold the loop.
    report = Report(io)
    rate = summary.published / elapsed_s
    for failure in summary.failures[:MAX_FAILURES_SHOWN]:
        report.err(str(failure))
    if len(summary.failures) > MAX_FAILURES_SHOWN:
        report.err(f"... and {len(summary.failures) - MAX_FAILURES_SHOWN} more failed line(s)")
    if summary.stopped_at_line is not None:
        # Not "send it again from line N": on a sharded node part of that batch and of
        # the lines before it may be stored (found by a tester: following that advice
        # stored five lines twice). The lines not stored are exactly the failures.
        report.err(
            f"stopped at line {summary.stopped_at_line}: its batch found no available "
            f"server within --request-timeout, so the {summary.not_sent} line(s) after "
            "that batch were not sent"
        )
    if summary.interrupted:
        unknown = sum(f.reason == INTERRUPTED_IN_FLIGHT for f in summary.failures)
        report.err(
            f"interrupted: the {summary.not_sent} line(s) after the batch being sent were "
            f"not sent, and that batch's {unknown} line(s) have an unknown outcome"
            if unknown
            else f"interrupted: the {summary.not_sent} line(s) after the last batch "
            "stored were not sent"
        )
    if unread:
        report.err(_unread_advice(args, source, read_lines))
    if copied:
        report.err(
            f"not sent: the {copied} line(s) after line {read_lines} were copied unread to "
            f"{args.failed_out}, as they are"
        )
    if (summary.failures or copied) and (failed_out is not None or stopped):
        report.err(
            _resend_advice(
                args,
                summary.failures,
                failed_out,
                unwritten,
                copied,
                read_lines if unread else None,
            )
        )
    # The summary last, so that it is the final line a user sees.
    already = (
        f", {summary.duplicates} already published (same idempotency key)"
        if summary.duplicates
        else ""
    )
    not_read = f"; the input after line {read_lines} not read" if unread else ""
    if copied:
        not_read = f"; {copied} line(s) after line {read_lines} not sent, in {args.failed_out}"
    report.out(
        f"published {summary.published} message(s){already} in {elapsed_s:.2f} s "
        f"({rate:.0f} msgs/s); {len(summary.failures)} failed line(s){not_read}"
    )
    await report.write()
    if summary.interrupted:
        return interrupt.exit_status
    return EXIT_ERROR if summary.failures else EXIT_OK


def _unread_advice(args: argparse.Namespace, source: _LineSource, read_lines: int) -> str:
    """Where the input not read after a stop starts, and, for a file, how to send
    exactly that part (by byte: the lines read end at a line's end)."""
    where = (
        f"the input after line {read_lines} was not read (nor sent, nor written to --failed-out)"
    )
    if source.size_bytes is None:
        return f"not read: {where}"
    offset = source.bytes_read
    if args.file == STDIN_PAYLOAD:
        return f"not read: {where}; it starts at byte {offset + 1} of the input"
    return (
        f"not read: {where}; it starts at byte {offset + 1}: send it with "
        f"tail -c +{offset + 1} {shlex.quote(args.file)} | futureq-cli publish --file -"
    )


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
    copied: int = 0,
    unread_after: int | None = None,
) -> str:
    """Say how to send the lines not stored again (they are in ``--failed-out``, if
    given, but for ``unwritten``: lines too long for any frame; ``copied`` more were
    copied there unread after a stop), and nothing else: the other lines are stored (or
    already were). ``unread_after``: the input after that line was not read. Failures
    whose outcome is unknown (:attr:`LineFailure.may_be_stored`) are counted apart: sent
    again, they may be stored twice."""
    count = len(failures)
    unknown = sum(1 for failure in failures if failure.may_be_stored)
    maybe = (
        f"; {unknown} of them have an unknown outcome (their batch was sent and not "
        "answered) and may be stored already: sent again, those without an idempotency_key "
        "are stored twice"
        if unknown
        else ""
    )
    if failed_out is None:
        shown = "" if count <= MAX_FAILURES_SHOWN else f" (the first {MAX_FAILURES_SHOWN} shown)"
        if unread_after is not None:
            return (
                f"{count} line(s) read were not stored, each listed by number{shown}; the "
                f"other lines read are stored and the input after line {unread_after} was "
                "not read, so do not send the whole input again: --failed-out F writes the "
                "lines not stored (of a file, with the rest not read) to F, to send with "
                f"publish --file F{maybe}"
            )
        return (
            f"{count} line(s) were not stored, each listed by number{shown}; the others are "
            "stored, so do not send the whole file again: --failed-out F writes the lines "
            f"not stored to F, to send with publish --file F{maybe}"
        )
    left_out = ""
    if unwritten:
        named = ", ".join(str(number) for number in unwritten[:MAX_FAILURES_SHOWN])
        more = "..." if len(unwritten) > MAX_FAILURES_SHOWN else ""
        left_out = (
            f"{len(unwritten)} line(s) not stored, too long for any frame, are not in "
            f"{args.failed_out} (line(s) {named}{more}): split those into smaller messages"
        )
        if count == len(unwritten) and not copied:
            return left_out
        left_out = "; " + left_out
    return (
        f"the {count - len(unwritten) + copied} line(s) not stored are in {args.failed_out}; send "
        f"them again with publish --file {args.failed_out} (a delay_ms counts from when it "
        f"is sent){maybe}{left_out}"
    )
