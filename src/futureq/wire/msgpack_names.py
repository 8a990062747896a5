"""How a decoded msgpack value is named to a client: by its msgpack type, never Python's.

Error sentences say ``got nil`` or ``got a string``, the words of ``docs/protocol.md``
("Types"), so a client in any language knows what it sent; ``NoneType`` or ``bytes``
would name this server's implementation instead.
"""

from __future__ import annotations

from typing import Any, Final

_NAMES: Final[dict[type, str]] = {
    type(None): "nil",
    bool: "a boolean",
    int: "an integer",
    float: "a float",
    str: "a string",
    bytes: "binary",
    list: "an array",
    tuple: "an array",
    dict: "a map",
}


def describe(value: Any) -> str:
    """The msgpack type of a decoded value, with its article: ``nil``, ``a boolean``,
    ``an integer``, ``a float``, ``a string``, ``binary``, ``an array``, ``a map``, or
    ``an extension type`` (msgpack ext, which no field takes)."""
    return _NAMES.get(type(value), "an extension type")
