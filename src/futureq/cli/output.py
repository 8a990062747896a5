"""Where a ``futureq-cli`` command writes, and what it returns: :class:`Output`, the
exit statuses, the one-line error form and the time format every command prints.

Exit status: 0 success, 1 any error, 2 usage error, 130 interrupted; an error is one
line on stderr, ``error: [CODE_NAME] sentence`` (``docs/cli.md``).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from typing import IO, Final

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
    """Where a command writes: ``stdout`` for results, ``stderr`` for errors; ``stdin``
    is where ``publish TOPIC -`` reads its payload."""

    stdout: IO[str]
    stderr: IO[str]
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
        self.stderr.write(text + "\n")
        self.stderr.flush()

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
