"""Command-line words that are not UTF-8: bytes where the wire takes bytes, a usage
error where it takes text.

Python decodes ``argv`` and the environment with the locale's encoding and the
``surrogateescape`` error handler: a byte that does not decode (``$'\\xff'`` in a UTF-8
locale) becomes a lone surrogate (``'\\udcff'``), which no UTF-8 encoder accepts. So
every word that reaches the wire goes through one of these:

* a payload is bytes: :func:`argv_bytes` gives back exactly the bytes the shell passed
  (``os.fsencode``, the inverse of that decoding);
* a token, a header, an idempotency key, a host name is text: :func:`not_text` names
  the first byte that is not UTF-8, and the caller refuses the word as a usage error
  naming its flag, before anything is sent (``docs/cli.md``, "Exit status and errors").

Topic and group names need nothing more: their grammar is ASCII
(``wire.validation.check_name``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable


def argv_bytes(text: str) -> bytes:
    """The bytes the shell passed for the word ``text``: its text in the locale's
    encoding (UTF-8 in a UTF-8 locale), and each byte that did not decode as itself.

    Raises:
        UnicodeEncodeError: ``text`` holds a surrogate that no decoding of bytes makes
            (``'\\ud800'``): only a Python caller of ``main(argv)`` can pass one.
    """
    return os.fsencode(text)


def not_text(text: str) -> str | None:
    """Why ``text`` cannot travel as UTF-8 text, or None when it can.

    Returns:
        ``"is not UTF-8 text: byte 0xff at byte 2 of b'k\\xff'"``: the first byte that
        did not decode, its 1-based position and the word as bytes.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        try:
            raw = argv_bytes(text)
        except UnicodeEncodeError:  # a surrogate no decoding made: only from Python callers
            return (
                f"is not UTF-8 text: it holds the lone surrogate U+{ord(text[exc.start]):04X} "
                f"at character {exc.start + 1}"
            )
        before = argv_bytes(text[: exc.start])
        return (
            f"is not UTF-8 text: byte 0x{raw[len(before)]:02x} at byte {len(before) + 1} of {raw!r}"
        )
    return None


def text_arg(what: str) -> Callable[[str], str]:
    """An argparse ``type=`` for a word sent as text (``--idempotency-key``).

    Raises:
        argparse.ArgumentTypeError: the word is not UTF-8 text.
    """

    def check(text: str) -> str:
        problem = not_text(text)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"the {what} {problem}; it must be text")
        return text

    return check
