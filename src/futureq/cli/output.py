"""Where a ``futureq-cli`` command writes, and what it returns: :class:`Output`, the
exit statuses, the one-line error form and the time format every command prints.

Exit status: 0 success, 1 any error, 2 usage error, 130 interrupted; an error is one
line on stderr, ``error: [CODE_NAME] sentence`` (``docs/cli.md``).

On the event loop nothing writes to a stream directly: a reader that pauses would hold
the loop, and with it the connection's keepalive. Commands write with
:func:`write_lines` / :func:`write_errors` (a page, a line as it comes) or collect a
:class:`Report` (:func:`reported`), each written from a worker thread.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import IO, Final, TypeVar

import attrs
import trio

from futureq.client._base import parse_servers
from futureq.client._connection import HopelessConnectError, UnknownHostError
from futureq.errors import ClientClosedError, ConnectionLostError, ProtocolError, RequestError

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130


def format_ms(ms: int) -> str:
    """``2026-01-02T03:04:05.678Z`` for a wall-clock time in ms since the Unix epoch."""
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def error_line(exc: BaseException, servers: str) -> str:
    """The one line printed on stderr for an error: ``error: [CODE_NAME] sentence``."""
    if isinstance(exc, RequestError | ProtocolError):
        return f"error: [{exc.code.name}] {exc.message}"
    if isinstance(exc, ConnectionLostError):
        hint = ""
        text = str(exc)
        # Ask about the --server addresses only when they are what failed: a sharded
        # node's shard K listens elsewhere, and its failure names its own address.
        asked = any(
            re.search(rf"{re.escape(address)}(?!\d)", text) for address in parse_servers(servers)
        )
        # A TLS mismatch or a port that is not a client port already says what to fix;
        # asking whether a server runs there would mislead (one does).
        hopeless = isinstance(exc, HopelessConnectError) and not isinstance(exc, UnknownHostError)
        if (
            asked
            and not hopeless
            and ("could not connect" in text or "no connection to any" in text)
        ):
            hint = (
                f"; is a FutureQ server running at {servers}? "
                "(start one with `make run`, or pass --server / set FUTUREQ_SERVER)"
            )
        return f"error: [CONNECTION_LOST] {exc}{hint}"
    if isinstance(exc, ClientClosedError):
        return f"error: [CLIENT_CLOSED] {exc}"
    if isinstance(exc, OSError):
        return f"error: [OS_ERROR] {exc.strerror or exc}" + (
            f": {exc.filename}" if exc.filename else ""
        )
    return f"error: [{type(exc).__name__}] {exc}"


@attrs.define
class Output:
    """Where a command writes: ``stdout`` for results, ``stderr`` for errors (None:
    started with stderr closed, ``2>&-``); ``stdin`` is where ``publish TOPIC -`` reads
    its payload.

    Both writes block until the reader takes the text: on the event loop a command
    goes through :func:`write_lines`, :func:`write_errors` or a :class:`Report`
    instead, which write from a worker thread."""

    stdout: IO[str]
    stderr: IO[str] | None
    stdin: IO[bytes] | None = None

    def out(self, text: str) -> None:
        """Write one line of results; an error writing it (a full disk, ``> /dev/full``)
        names standard output, as it said only ``No space left on device`` (found by a
        tester). A closed pipe stays :exc:`BrokenPipeError` (``| head``: a quiet end)."""
        try:
            self.stdout.write(text + "\n")
            self.stdout.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            if exc.filename is not None or exc.errno is None:
                raise
            raise OSError(exc.errno, exc.strerror, "writing to standard output") from exc

    def err(self, text: str) -> None:
        """Write one line of errors or progress. One that cannot be written (stderr
        closed, ``2>&-``; its reader gone; a full disk) is dropped: the command goes on
        and its exit status still says what happened. (With stderr closed an error
        ended in an AttributeError nobody saw, and a progress line, a warning or
        ``dlq redrive``'s count killed a command that was working.)"""
        if self.stderr is None:
            return
        try:
            self.stderr.write(text + "\n")
            self.stderr.flush()
        except (OSError, ValueError):  # ValueError: the stream was closed in this process
            pass

    @property
    def is_terminal(self) -> bool:
        return self.stdout.isatty()


async def write_lines(io: Output, lines: Sequence[str]) -> None:
    """Write ``lines`` of results (:meth:`Output.out`, each a line, no endings) in one
    worker thread, so that a reader that stops reading for a while (``| less``,
    ``| slow-script``) blocks the write, not the event loop: a blocked loop leaves the
    server's keepalive PING unanswered, and the broker closes the connection
    (KEEPALIVE_TIMEOUT after 60 s by default; found by a tester). A cancel (a second
    Ctrl-C) abandons a write that never ends.

    Raises:
        OSError: as :meth:`Output.out` (BrokenPipeError when the reader went away).
    """
    if lines:
        await trio.to_thread.run_sync(io.out, "\n".join(lines), abandon_on_cancel=True)


async def write_errors(io: Output, lines: Sequence[str]) -> None:
    """Write ``lines`` to stderr (:meth:`Output.err`) in a worker thread, for the same
    reason as :func:`write_lines`: ``2>&1 | less`` pauses stderr's reader too. Never
    raises but a cancel."""
    if lines:
        await trio.to_thread.run_sync(io.err, "\n".join(lines), abandon_on_cancel=True)


@attrs.define
class Report:
    """A command's output collected on the event loop and written, in the order it
    was given, by :meth:`write` from a worker thread (:func:`write_lines`): a command
    that printed on the event loop froze there while its reader paused (``status |
    less``, a full pipe), its connection's keepalive PING went unanswered and the
    broker closed it (found by a tester). Has :class:`Output`'s ``out`` / ``err`` /
    ``is_terminal`` / ``stdout``, so that the code building the lines reads the same."""

    io: Output
    entries: list[tuple[bool, str]] = attrs.field(factory=list)
    """``(to_stderr, line)`` in the order given."""

    @property
    def stdout(self) -> IO[str]:
        return self.io.stdout

    @property
    def is_terminal(self) -> bool:
        return self.io.is_terminal

    def out(self, text: str) -> None:
        self.entries.append((False, text))

    def err(self, text: str) -> None:
        self.entries.append((True, text))

    async def write(self) -> None:
        """Write what was collected and forget it.

        Raises:
            OSError: as :meth:`Output.out` (BrokenPipeError when the reader went away).
        """
        entries, self.entries = self.entries, []
        if entries:
            await trio.to_thread.run_sync(_write_entries, self.io, entries, abandon_on_cancel=True)


def _write_entries(io: Output, entries: Sequence[tuple[bool, str]]) -> None:
    """Each run of lines to one stream in one write, the runs in order."""
    start = 0
    while start < len(entries):
        to_stderr = entries[start][0]
        end = start
        while end < len(entries) and entries[end][0] == to_stderr:
            end += 1
        text = "\n".join(line for _, line in entries[start:end])
        (io.err if to_stderr else io.out)(text)
        start = end


_Client = TypeVar("_Client")


def reported(
    command: Callable[[_Client, argparse.Namespace, Report], Awaitable[int]],
) -> Callable[[_Client, argparse.Namespace, Output], Awaitable[int]]:
    """``command(client, args, report)`` as a ``(client, args, io)`` command whose
    :class:`Report` is written when it returns or raises an error (the lines before
    the error first, then the error :func:`~futureq.cli.client_main.main` prints); not
    when it is cancelled or interrupted (a Ctrl-C stops at once)."""

    @functools.wraps(command)
    async def run(client: _Client, args: argparse.Namespace, io: Output) -> int:
        report = Report(io)
        try:
            status = await command(client, args, report)
        except Exception:
            await report.write()
            raise
        await report.write()
        return status

    return run
