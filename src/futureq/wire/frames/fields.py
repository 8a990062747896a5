"""The field checkers of ``from_wire``: each takes a received field and returns it, or
raises :class:`~futureq.errors.RemoteProtocolError` (``INVALID_FRAME``) naming the
frame, the field and what was wrong.

Internal to :mod:`futureq.wire.frames`; source: ``docs/protocol.md``, "Frames".
"""

from __future__ import annotations

from typing import Any

from futureq.errors import ErrorCode, RemoteProtocolError
from futureq.wire.msgpack_names import describe


def _bad(frame: str, message: str) -> RemoteProtocolError:
    return RemoteProtocolError(ErrorCode.INVALID_FRAME, f"{frame} frame: {message}")


def _int(frame: str, name: str, value: Any, *, minimum: int | None = None) -> int:
    # bool is an int subclass in Python; msgpack true/false are never integers here.
    if type(value) is not int:
        raise _bad(frame, f"field {name!r} must be an integer, got {describe(value)}")
    if minimum is not None and value < minimum:
        raise _bad(frame, f"field {name!r} must be >= {minimum}, got {value}")
    return value


def _opt_int(frame: str, name: str, value: Any, *, minimum: int | None = None) -> int | None:
    return None if value is None else _int(frame, name, value, minimum=minimum)


def _str(frame: str, name: str, value: Any) -> str:
    if type(value) is not str:
        raise _bad(frame, f"field {name!r} must be a string, got {describe(value)}")
    return value


def _opt_str(frame: str, name: str, value: Any) -> str | None:
    return None if value is None else _str(frame, name, value)


def _list(frame: str, name: str, value: Any) -> list[Any]:
    if type(value) is not list:
        raise _bad(frame, f"field {name!r} must be an array, got {describe(value)}")
    return value


def _int_list(frame: str, name: str, value: Any) -> list[int]:
    items = _list(frame, name, value)
    for i, item in enumerate(items):
        if type(item) is not int:
            raise _bad(frame, f"{name}[{i}] must be an integer, got {describe(item)}")
    return items


def _bytes_list(frame: str, name: str, value: Any) -> list[bytes]:
    items = _list(frame, name, value)
    for i, item in enumerate(items):
        if type(item) is not bytes:
            raise _bad(frame, f"{name}[{i}] must be binary, got {describe(item)}")
    return items


def _opt_bytes(frame: str, name: str, value: Any) -> bytes | None:
    if value is not None and type(value) is not bytes:
        raise _bad(frame, f"field {name!r} must be binary or nil, got {describe(value)}")
    return value


def _arity(frame: str, fields: list[Any], expected: int) -> None:
    if len(fields) != expected:
        raise _bad(frame, f"expected {expected} fields after the request id, got {len(fields)}")
