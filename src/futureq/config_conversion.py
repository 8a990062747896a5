"""From TOML, environment text and flags to typed config values, and cattrs' complaints
to sentences.

The sections of the configuration (:data:`SECTIONS`) and their field types; an
environment variable's text converted to its field's type (``"30s"`` -> 30000 for a
``_ms`` key, ``"yes"`` -> True); the strict :mod:`cattrs` converter (no extra keys, no
silent ``"12"`` -> 12 or ``true`` -> 1 coercions in TOML); and the structural
:class:`Problem` sentences built from its exception tree, each naming the dotted key,
the bad value, where it came from and the type allowed.

Source: STYLE.md §4 (ConfigError names key, value and what is allowed).
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError

from futureq.config import (
    ClusterSection,
    LimitsSection,
    MetricsSection,
    NodeSection,
    QueueSection,
    ServerSection,
    StorageSection,
    TlsConfig,
)

SECTIONS: dict[str, type[Any]] = {
    "server": ServerSection,
    "limits": LimitsSection,
    "queue": QueueSection,
    "storage": StorageSection,
    "tls": TlsConfig,
    "cluster": ClusterSection,
    "metrics": MetricsSection,
    "node": NodeSection,
}

_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION_RE = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$")
_TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
_FALSE_WORDS = frozenset({"false", "0", "no", "off"})


@attrs.frozen
class Problem:
    """One thing wrong with the configuration.

    Attributes:
        keys: The dotted keys the problem concerns (``("limits.max_payload_bytes",)``).
        message: A full sentence naming the key, the value and what is allowed.
    """

    keys: tuple[str, ...]
    message: str


def field_types(section: str) -> dict[str, Any]:
    """Resolved type of every field of a config section, by field name."""
    return typing.get_type_hints(SECTIONS[section])


def parse_duration_ms(text: str) -> int | None:
    """Parse ``"250ms"``, ``"30s"``, ``"5m"``, ``"2h"`` or ``"1d"`` into milliseconds.

    Returns:
        The duration in integer milliseconds, or None when ``text`` is not of that form
        (a plain number without a unit is not a duration string).
    """
    match = _DURATION_RE.match(text)
    if match is None:
        return None
    return int(match.group(1)) * _DURATION_UNITS_MS[match.group(2)]


def convert_text(text: str, field_type: Any, key: str) -> object:
    """Convert an environment variable's text to ``field_type``; on failure return the
    text unchanged so the strict structuring reports it with its origin."""
    optional = _is_optional(field_type)
    base = _base_type(field_type)
    stripped = text.strip()
    if optional and stripped == "":
        return None
    if base is bool:
        word = stripped.lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
        return text
    if base is int:
        if key.endswith("_ms"):
            duration = parse_duration_ms(stripped)
            if duration is not None:
                return duration
        try:
            return int(stripped, 10)
        except ValueError:
            return text
    return text


def _is_optional(field_type: Any) -> bool:
    return isinstance(field_type, types.UnionType) and type(None) in typing.get_args(field_type)


def _base_type(field_type: Any) -> Any:
    if isinstance(field_type, types.UnionType):
        args = [arg for arg in typing.get_args(field_type) if arg is not type(None)]
        return args[0] if len(args) == 1 else field_type
    return field_type


def _describe_type(field_type: Any, key: str) -> str:
    base = _base_type(field_type)
    optional = _is_optional(field_type)
    if base is bool:
        text = "true or false"
    elif base is int:
        text = "an integer"
        if key.endswith("_ms"):
            text = 'an integer number of milliseconds (or a duration such as "30s")'
        elif key.endswith("_bytes"):
            text = "an integer number of bytes"
        elif key.endswith("_mb"):
            text = "an integer number of MiB"
        elif key.endswith("_items"):
            text = "an integer number of items"
        elif key == "shards":
            text = "an integer number of shards, or auto"
    elif base is str:
        text = "a string"
    else:  # pragma: no cover - every field is one of the above
        text = str(base)
    return f"{text} (or unset)" if optional else text


class _StrictTypeError(TypeError):
    """A TOML or flag value of the wrong type (no silent coercion)."""


def _strict(kind: type[Any]) -> Callable[[Any, type[Any]], Any]:
    def structure(value: Any, _: type[Any]) -> Any:
        if type(value) is not kind:  # bool is a subclass of int: compare exactly
            raise _StrictTypeError(f"expected {kind.__name__}, got {type(value).__name__}")
        return value

    return structure


CONVERTER = cattrs.Converter(forbid_extra_keys=True)
for _kind in (int, bool, str):
    CONVERTER.register_structure_hook(_kind, _strict(_kind))


def problems_from_cattrs(
    error: ClassValidationError,
    raw: Mapping[str, Any],
    origins: Mapping[str, str],
    path: tuple[str, ...],
) -> Iterable[Problem]:
    """Turn cattrs' exception tree into one sentence per bad key."""
    with_notes, without_notes = error.group_exceptions()
    for exception, note in with_notes:
        name = note.name
        if isinstance(exception, ClassValidationError):
            yield from problems_from_cattrs(exception, raw, origins, (*path, name))
            continue
        dotted = ".".join((*path, name))
        section = path[0] if path else name
        value = _lookup(raw, (*path, name))
        origin = origins.get(dotted)
        where = f" (from {origin})" if origin else ""
        if section in SECTIONS and path:
            expected = _describe_type(field_types(section)[name], name)
            yield Problem((dotted,), f"{dotted} = {value!r}{where}: must be {expected}")
        else:
            yield Problem((dotted,), f"{dotted} = {value!r}{where}: must be a table of keys")
    for exception in without_notes:
        if isinstance(exception, ForbiddenExtraKeysError):
            for extra in sorted(exception.extra_fields):
                dotted = ".".join((*path, extra))
                origin = origins.get(dotted)
                where = f" (from {origin})" if origin else ""
                if path:
                    allowed = ", ".join(attrs.fields_dict(SECTIONS[path[0]]))
                    yield Problem(
                        (dotted,),
                        f"{dotted}{where} is not a known key; the keys of "
                        f"[{path[0]}] are: {allowed}",
                    )
                else:
                    yield Problem(
                        (dotted,),
                        f"[{extra}]{where} is not a known section; the sections are: "
                        f"{', '.join(SECTIONS)}",
                    )
        else:  # pragma: no cover - cattrs gives notes for every attribute failure
            yield Problem((".".join(path),), f"{'.'.join(path) or 'config'}: {exception}")


def _lookup(raw: Mapping[str, Any], path: tuple[str, ...]) -> object:
    value: Any = raw
    for part in path:
        value = value.get(part) if isinstance(value, Mapping) else None
    return value
