"""libfaketime for tests: a node whose wall clock is off, or can be stepped while it runs.

The preload library shifts what ``time.time()`` (``CLOCK_REALTIME``) returns; with
``FAKETIME_DONT_FAKE_MONOTONIC=1`` the monotonic clock stays real, as it is when an
operator or NTP sets a machine's clock. ``FAKETIME_FORCE_MONOTONIC_FIX=0`` is needed
too: the "monotonic fix" libfaketime 0.9.10 turns on for this glibc makes every timed
wait of a thread (``trio.to_thread``, RocksDB's writes) take up to half a second, so a
node under it stalls. (``time.sleep`` fails with EINVAL under
``FAKETIME_DONT_FAKE_MONOTONIC``; the server does not call it.) Two ways
(``docs/testing.md``, "Clocks"):

* :func:`offset_env` — a fixed offset for the whole life of the process (``FAKETIME``);
* :class:`SteppableClock` — file-based control (``FAKETIME_TIMESTAMP_FILE`` read on every
  call with ``FAKETIME_NO_CACHE=1``): :meth:`SteppableClock.step` changes the offset of a
  running process at once.

CI installs the library (``.ci/run``: ``apt-get install faketime libfaketime``) and sets
``FUTUREQ_REQUIRE_FAKETIME=1``: then a missing library fails the tests that need it
instead of skipping them.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Where Debian's libfaketime puts its preload library.
FAKETIME_LIBS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)
REQUIRE_ENV = "FUTUREQ_REQUIRE_FAKETIME"
INSTALL_HINT = "install it with: apt-get install faketime libfaketime (.ci/run does)"


class FaketimeMissing(RuntimeError):
    """libfaketime is not installed but this run requires it."""


def faketime_library() -> str | None:
    """Path of libfaketime's preload library, or None when it is not installed.

    Raises:
        FaketimeMissing: it is missing and ``FUTUREQ_REQUIRE_FAKETIME`` is set (CI).
    """
    found = next((path for path in FAKETIME_LIBS if Path(path).exists()), None)
    if found is None and os.environ.get(REQUIRE_ENV):
        raise FaketimeMissing(f"libfaketime is required ({REQUIRE_ENV} is set) but missing; "
                              + INSTALL_HINT)  # fmt: skip
    return found


def _spec(offset_s: float) -> str:
    return f"{offset_s:+.3f}"


def offset_env(library: str, offset_s: float) -> dict[str, str]:
    """Environment for a process whose wall clock is ``offset_s`` seconds off."""
    return {
        "LD_PRELOAD": library,
        "FAKETIME": _spec(offset_s),
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_FORCE_MONOTONIC_FIX": "0",
    }


class SteppableClock:
    """A control file for one process's wall clock (libfaketime's file-based control).

    Args:
        library: :func:`faketime_library`'s path.
        path: The control file (created with offset 0).
    """

    def __init__(self, library: str, path: Path) -> None:
        self.library = library
        self.path = path
        self.offset_s = 0.0
        self._write()

    def env(self) -> dict[str, str]:
        """Environment for the process whose clock this file controls."""
        return {
            "LD_PRELOAD": self.library,
            "FAKETIME_TIMESTAMP_FILE": str(self.path),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_FORCE_MONOTONIC_FIX": "0",
        }

    def step(self, seconds: float) -> None:
        """Step the wall clock by ``seconds`` (negative: back) from its current offset."""
        self.offset_s += seconds
        self._write()

    def set(self, offset_s: float) -> None:
        """Set the wall clock to true time plus ``offset_s``."""
        self.offset_s = offset_s
        self._write()

    def _write(self) -> None:
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(_spec(self.offset_s) + "\n")
        os.replace(temporary, self.path)  # never a half-written file
