"""JSON for ``futureq-cli``: exact payload bytes in, strict JSON out.

``publish --file`` reads JSON lines. Each line is one object::

    {"topic": "orders", "payload": {"amount":10.50}, "delay_ms": 5000, "ttl_ms": 60000,
     "headers": {"traceparent": "00-4bf9-01"}, "idempotency_key": "order-17"}

* ``payload`` is sent **as written**: a JSON value other than a string is sent as the
  exact text of the line between its first and last character (``{"amount":10.50}``
  stays ``{"amount":10.50}``, not ``{"amount": 10.5}``); a string is sent as its UTF-8
  text. ``payload_encoding`` may say so explicitly: ``"json"`` (the value's exact text,
  strings included, quotes and all), ``"text"`` (a string, sent as UTF-8) or ``"base64"``
  (a string holding base64, sent as the bytes it decodes to). These are the encodings
  ``consume --json`` prints, so its records can be published again byte for byte.
* ``headers`` (optional) is an object of string values (``null``: none);
  ``idempotency_key`` (optional) a non-empty string (``null``: none). A value of
  another type is refused with the line and the column of that value; the server
  checks the limits on headers (count, bytes, reserved ``futureq-`` names) and keys.
* Values JSON cannot carry are refused with the line and column: ``NaN``, ``Infinity``
  and numbers beyond the range of a 64-bit float (``1E400``), and a key given twice in
  one object (``{"a":1,"a":2}``: which one would a consumer see?).
* What cannot be sent at all is refused with the line and column too, so it never
  fails its neighbours' PUBLISH frame: a string holding a lone UTF-16 surrogate
  (``"\\ud800"``: UTF-8 cannot carry it) where the line's text is sent (``topic``, a
  ``text`` payload, headers, ``idempotency_key``), an integer time beyond 64 bits, and
  a line nested more than :data:`MAX_JSON_DEPTH` arrays or objects deep.
* The fields ``consume --json`` adds (``id``, ``group``, ``due_ms``,
  ``delivered_ms``, ``attempt``) are accepted and ignored, so its output publishes again.
* Errors name the line and the column (1-based, in characters) where the problem is;
  an error at the end of a line says so instead of pointing at the next line.

``consume --json`` prints one strict JSON object per delivery (parsable by any JSON
parser: never ``NaN`` or ``Infinity``), with the payload as:

* ``"json"``: the payload itself, verbatim, when it is strict JSON on one line (no
  line breaks, no surrounding blanks, no duplicate keys, finite numbers, no lone
  surrogate escape such as ``"\\ud800"`` that strict parsers refuse, at most
  :data:`MAX_JSON_DEPTH` levels deep);
* ``"text"``: a JSON string holding the payload's UTF-8 text, otherwise;
* ``"base64"``: base64 of the bytes (RFC 4648, with padding) when they are not UTF-8.

Source: RFC 8259 (§4 names in an object should be unique, §6 numbers beyond IEEE 754
doubles are not interoperable); ``docs/cli.md``, "JSON".
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Iterable
from typing import Any, Final, NamedTuple

import attrs

from futureq.client import PublishItem
from futureq.errors import RequestError
from futureq.wire.validation import INT64_MAX, implausible_epoch_ms

ENCODINGS: Final = ("json", "text", "base64")
FIELDS: Final = (
    "topic",
    "payload",
    "payload_encoding",
    "delay_ms",
    "deliver_at_ms",
    "ttl_ms",
    "headers",
    "idempotency_key",
)
CONSUME_FIELDS: Final = ("id", "group", "due_ms", "delivered_ms", "attempt")
"""Fields ``consume --json`` writes that a publish does not use: accepted and ignored
(a message published again gets a new id, its own due time and its first attempt)."""
_BLANKS: Final = " \t\r\n"
MAX_JSON_DEPTH: Final = 500
"""Most arrays and objects inside each other in a payload. Deeper JSON is refused in a
line (Python's parser, like many, gives up near 1,000) and shown as ``text``."""


class JsonValueError(ValueError):
    """A value JSON cannot carry faithfully (NaN, Infinity, 1E400, a repeated key).

    Attributes:
        token: The text that is refused (to find its column), and how many times it
            occurs before it in the value (a repeated key: once).
    """

    def __init__(self, message: str, token: str, occurrence: int = 0) -> None:
        super().__init__(message)
        self.token = token
        self.occurrence = occurrence


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise JsonValueError(f"the key {key!r} appears twice in one object", json.dumps(key), 1)
        seen[key] = value
    return seen


def _refuse_constant(name: str) -> Any:
    raise JsonValueError(f"{name} is not a JSON number; send a finite number or a string", name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonValueError(
            f"{text} is beyond the range of a 64-bit float; send it as a string", text
        )
    return value


STRICT: Final = json.JSONDecoder(
    object_pairs_hook=_no_repeated_keys,
    parse_constant=_refuse_constant,
    parse_float=_finite_float,
)
"""A decoder that refuses what JSON cannot carry faithfully (see the module docstring)."""


def strict_loads(text: str) -> Any:
    """Parse one JSON document strictly (no NaN, Infinity, 1E400 or repeated keys).

    Raises:
        ValueError: the text is not JSON, or holds one of those values.
    """
    value, end = STRICT.raw_decode(text, _skip(text, 0))
    if _skip(text, end) != len(text):
        raise ValueError("text after the JSON value")
    return value


@attrs.frozen
class LineFailure:
    """A line that was not published, and why: ``line N[, column C]: reason``.

    ``may_be_stored``: its outcome is unknown (its batch was sent and not answered: a
    lost connection, a Ctrl-C), so it may be stored though reported failed."""

    line_number: int
    reason: str
    column: int | None = None
    may_be_stored: bool = False

    def __str__(self) -> str:
        where = f"line {self.line_number}"
        if self.column is not None:
            where += f", column {self.column}"
        return f"{where}: {self.reason}"


@attrs.frozen
class JsonlItem:
    """A message read from a JSONL file, with its line number."""

    line_number: int
    item: PublishItem

    @property
    def wire_bytes(self) -> int:
        """Bytes the message takes in a PUBLISH frame (:attr:`PublishItem.wire_bytes`)."""
        return self.item.wire_bytes


class LineError(ValueError):
    """What is wrong with a line, and at which column (1-based; None: the whole line)."""

    def __init__(self, message: str, column: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.column = column


def _skip(text: str, index: int) -> int:
    while index < len(text) and text[index] in _BLANKS:
        index += 1
    return index


def _where(text: str, index: int) -> tuple[str, int]:
    """A phrase for ``index`` and its column: past the end, say "at the end of the line"."""
    if index >= len(text):
        return " at the end of the line", len(text) + 1
    return "", index + 1


def _decode_at(text: str, index: int, what: str) -> tuple[Any, int]:
    """One JSON value of ``text`` starting at ``index``: ``(value, end)``."""
    try:
        result: tuple[Any, int] = STRICT.raw_decode(text, index)
    except json.JSONDecodeError as exc:
        # The decoder's message ends in its own "at" (e.g. "Invalid control character at").
        message = exc.msg.removesuffix(" at")
        phrase, column = _where(text, exc.pos)
        raise LineError(f"invalid JSON in {what}: {message}{phrase}", column) from None
    except JsonValueError as exc:
        raise LineError(f"{what}: {exc}", _column_of(text, index, exc)) from None
    except RecursionError:  # only past the depth split_object checks first
        raise LineError(f"{what} is nested too deeply", index + 1) from None
    return result


def too_deep_at(text: str, limit: int) -> int | None:
    """Where (0-based) ``text`` first opens more than ``limit`` arrays or objects inside
    each other, brackets in strings not counted; None if it never does."""
    if text.count("[") + text.count("{") <= limit:
        return None  # the common case, at C speed
    depth = 0
    in_string = escaped = False
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return index
        elif char in "]}":
            depth -= 1
    return None


_ESCAPE: Final = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)


def _has_surrogate(value: str) -> bool:
    return any("\ud800" <= char <= "\udfff" for char in value)


def lone_surrogate_at(text: str, start: int, end: int) -> int | None:
    """Where (0-based) the first ``\\uD800``-``\\uDFFF`` escape of ``text[start:end]``
    that is not half of a pair is; None if there is none. ``start`` is at a JSON value
    (escapes are only read inside its strings, so ``\\\\ud800`` is no surrogate)."""
    high: tuple[int, int] | None = None  # (start, end) of a high half waiting for its pair
    for match in _ESCAPE.finditer(text, start, end):
        code = int(match[1], 16) if match[1] else None
        if high is not None:
            if code is not None and 0xDC00 <= code <= 0xDFFF and match.start() == high[1]:
                high = None
                continue
            return high[0]
        if code is None:
            continue
        if 0xD800 <= code <= 0xDBFF:
            high = (match.start(), match.end())
        elif 0xDC00 <= code <= 0xDFFF:
            return match.start()
    return high[0] if high is not None else None


def _utf8_string(
    what: str, value: str, text: str, start: int, end: int, hint: str = "drop it"
) -> None:
    """Refuse a string UTF-8 cannot carry (a lone surrogate), at the escape's column.

    Raises:
        LineError: ``value`` holds a lone surrogate.
    """
    if _has_surrogate(value):
        at = lone_surrogate_at(text, start, end)
        shown = "U+D800-U+DFFF" if at is None else text[at : at + 6]
        raise LineError(
            f"{what} holds a lone UTF-16 surrogate ({shown}), which UTF-8 cannot carry; {hint}",
            None if at is None else at + 1,
        )


def _column_of(text: str, start: int, error: JsonValueError) -> int:
    """Where the refused token is (1-based), searched from the value's start: the
    decoder reports such errors without a position."""
    position = start - 1
    for _ in range(error.occurrence + 1):
        found = text.find(error.token, position + 1)
        if found < 0:
            return start + 1
        position = found
    return position + 1


class Field(NamedTuple):
    """One top-level key of a line: its value, and where the value and key are
    (0-based indexes; ``text[start:end]`` is the value exactly as written)."""

    value: Any
    start: int
    end: int
    key_start: int


def split_object(text: str) -> dict[str, Field]:
    """The top-level keys of a one-line JSON object, as :class:`Field` s.

    Raises:
        LineError: not one strict JSON object (the column says where).
    """
    deep = too_deep_at(text, MAX_JSON_DEPTH + 1)  # + 1: the line's own object
    if deep is not None:
        raise LineError(
            f"the line nests more than {MAX_JSON_DEPTH} arrays or objects inside its "
            "payload; send such a payload as a string",
            deep + 1,
        )
    index = _skip(text, 0)
    if index < len(text) and text[index] == "\ufeff":
        # An editor's byte order mark is invisible: "expected a line starting with {"
        # about a line that shows one (found by a tester) sends the user hunting.
        raise LineError(
            "the line starts with a byte order mark (U+FEFF, the bytes EF BB BF that "
            "some Windows editors put first): JSON lines are UTF-8 without one; save "
            "the file as UTF-8 without BOM",
            index + 1,
        )
    if index >= len(text) or text[index] != "{":
        phrase, column = _where(text, index)
        raise LineError(f"expected a JSON object (a line starting with {{){phrase}", column)
    index = _skip(text, index + 1)
    fields: dict[str, Field] = {}
    if index < len(text) and text[index] == "}":
        index += 1
    else:
        while True:
            if index >= len(text) or text[index] != '"':
                phrase, column = _where(text, index)
                raise LineError(f"expected a key in double quotes{phrase}", column)
            key_start = index
            key, index = _decode_at(text, index, "a key")
            index = _skip(text, index)
            if index >= len(text) or text[index] != ":":
                phrase, column = _where(text, index)
                raise LineError(f"expected ':' after the key {key!r}{phrase}", column)
            start = _skip(text, index + 1)
            value, end = _decode_at(text, start, f'the value of "{key}"')
            if key in fields:
                raise LineError(f"the key {key!r} appears twice", key_start + 1)
            fields[key] = Field(value, start, end, key_start)
            index = _skip(text, end)
            if index < len(text) and text[index] == ",":
                index = _skip(text, index + 1)
                continue
            if index < len(text) and text[index] == "}":
                index += 1
                break
            phrase, column = _where(text, index)
            raise LineError(f"expected ',' or '}}' after the value of {key!r}{phrase}", column)
    index = _skip(text, index)
    if index < len(text):
        raise LineError("unexpected text after the object", index + 1)
    return fields


def _optional_ms(fields: dict[str, Field], key: str) -> int | None:
    if key not in fields:
        return None
    value, start = fields[key].value, fields[key].start
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise LineError(
            f"{key} must be a non-negative integer of milliseconds, got {value!r}", start + 1
        )
    if value > INT64_MAX:
        raise LineError(
            f"{key} is {value}, beyond the largest 64-bit millisecond value ({INT64_MAX})",
            start + 1,
        )
    return value


def _headers(fields: dict[str, Field], text: str) -> dict[str, str] | None:
    """A line's ``headers``: an object of strings, or None (absent or null).

    Raises:
        LineError: not an object, or a value that is not a string (at its column).
    """
    if "headers" not in fields or fields["headers"].value is None:
        return None
    value, start, end, _ = fields["headers"]
    if not isinstance(value, dict):
        raise LineError(
            f'"headers" must be an object of strings ({{"name": "value"}}), got '
            f"{type(value).__name__}",
            start + 1,
        )
    entries = split_object(text[start:end])
    for name, entry in entries.items():
        if not isinstance(entry.value, str):
            raise LineError(
                f"headers[{name!r}] must be a string, got {json.dumps(entry.value)}; "
                "headers carry text (quote a number)",
                start + entry.start + 1,
            )
        _utf8_string(f"the header name {name!r}", name, text, start + entry.key_start, end)
        _utf8_string(f"headers[{name!r}]", entry.value, text, start + entry.start, end)
    return {name: entry.value for name, entry in entries.items()}


def _idempotency_key(fields: dict[str, Field], text: str) -> str | None:
    """A line's ``idempotency_key``: a non-empty string, or None (absent or null)."""
    if "idempotency_key" not in fields or fields["idempotency_key"].value is None:
        return None
    value, start = fields["idempotency_key"].value, fields["idempotency_key"].start
    if not isinstance(value, str) or not value:
        raise LineError(
            f'"idempotency_key" must be a non-empty string, got {json.dumps(value)}', start + 1
        )
    _utf8_string('"idempotency_key"', value, text, start, fields["idempotency_key"].end)
    return value


def payload_bytes(fields: dict[str, Field], text: str) -> bytes:
    """The bytes a line's ``payload`` is sent as (see the module docstring).

    Raises:
        LineError: a missing payload, an unknown ``payload_encoding``, or a value that
            does not fit its encoding.
    """
    if "payload" not in fields:
        raise LineError('"payload" is missing')
    value, start, end, _ = fields["payload"]
    encoding = "text" if isinstance(value, str) else "json"
    if "payload_encoding" in fields:
        given, at = fields["payload_encoding"].value, fields["payload_encoding"].start
        if given not in ENCODINGS:
            raise LineError(
                f"payload_encoding must be one of {', '.join(ENCODINGS)}, got {given!r}", at + 1
            )
        encoding = given
    if encoding == "json":
        return text[start:end].encode("utf-8")
    if not isinstance(value, str):
        raise LineError(
            f'with payload_encoding "{encoding}" the payload must be a string', start + 1
        )
    if encoding == "text":
        _utf8_string(
            'the value of "payload"',
            value,
            text,
            start,
            end,
            'drop it, or send the bytes as base64 (payload_encoding "base64")',
        )
        return value.encode("utf-8")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise LineError(f"the payload is not valid base64: {exc}", start + 1) from None


def parse_jsonl_line(text: str) -> PublishItem | None:
    """Parse one JSONL line into a message; None for a blank line.

    Raises:
        LineError: with a sentence saying what is wrong, and the column.
    """
    text = text.rstrip("\r\n")
    if not text.strip():
        return None
    for index, char in enumerate(text):
        if "\udc80" <= char <= "\udcff":  # a byte that was not UTF-8 (surrogateescape)
            raise LineError("the line is not valid UTF-8 here", index + 1)
    fields = split_object(text)
    if "topic" not in fields or not isinstance(fields["topic"].value, str):
        at = fields["topic"].start + 1 if "topic" in fields else None
        raise LineError('"topic" must be a string', at)
    topic = fields["topic"]
    _utf8_string('"topic"', topic.value, text, topic.start, topic.end)
    unknown = [key for key in fields if key not in FIELDS and key not in CONSUME_FIELDS]
    if unknown:
        raise LineError(
            f"unknown field(s) {', '.join(sorted(unknown))}; known: {', '.join(FIELDS)}",
            fields[unknown[0]].key_start + 1,
        )
    payload = payload_bytes(fields, text)
    delay_ms = _optional_ms(fields, "delay_ms")
    deliver_at_ms = _optional_ms(fields, "deliver_at_ms")
    ttl_ms = _optional_ms(fields, "ttl_ms")
    if delay_ms is not None and deliver_at_ms is not None:
        raise LineError(
            "give delay_ms or deliver_at_ms, not both", fields["deliver_at_ms"].key_start + 1
        )
    if deliver_at_ms is not None:
        mistake = implausible_epoch_ms("deliver_at_ms", deliver_at_ms)
        if mistake is not None:
            raise LineError(mistake, fields["deliver_at_ms"].start + 1)
    headers = _headers(fields, text)
    key = _idempotency_key(fields, text)
    try:
        return PublishItem(
            topic.value,
            payload,
            delay_ms,
            deliver_at_ms,
            ttl_ms,
            headers=headers,
            idempotency_key=key,
        )
    except (TypeError, RequestError) as exc:  # checked above; kept to fail this line only
        raise LineError(str(exc)) from None


def parse_jsonl(lines: Iterable[str]) -> tuple[list[JsonlItem], list[LineFailure]]:
    """Parse a JSONL file: the good lines as messages, the bad ones as failures.

    Args:
        lines: The file's lines (with or without newlines); numbered from 1.

    Returns:
        ``(items, failures)``, both in line order. Blank lines are skipped.
    """
    items: list[JsonlItem] = []
    failures: list[LineFailure] = []
    for number, line in enumerate(lines, start=1):
        try:
            item = parse_jsonl_line(line)
        except LineError as exc:
            failures.append(LineFailure(number, exc.message, exc.column))
            continue
        if item is not None:
            items.append(JsonlItem(number, item))
    return items, failures


def render_payload(payload: bytes) -> tuple[str, str]:
    """How ``consume`` shows a payload: ``(json_text, encoding)``.

    ``json_text`` is a JSON value to put in the output as is: the payload itself for
    ``"json"``, a JSON string of its text for ``"text"``, a JSON string of its base64
    for ``"base64"`` (see the module docstring).
    """
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return json.dumps(base64.b64encode(payload).decode("ascii")), "base64"
    if (
        text
        and text == text.strip(_BLANKS)
        and "\n" not in text
        and "\r" not in text
        and too_deep_at(text, MAX_JSON_DEPTH) is None
        and lone_surrogate_at(text, 0, len(text)) is None  # strict parsers refuse "\ud800"
    ):
        try:
            strict_loads(text)
        except (ValueError, RecursionError):
            pass
        else:
            return text, "json"
    return json.dumps(text, ensure_ascii=False), "text"


def record_line(head: dict[str, Any], payload: bytes, tail: dict[str, Any]) -> str:
    """One ``consume --json`` line: the ``head`` fields, ``payload`` and
    ``payload_encoding``, then the ``tail`` fields (values must be JSON-able).

    Always strict JSON: the payload is inserted verbatim only when it is strict JSON.

    Raises:
        ValueError: a head or tail value is NaN or infinite (never for the payload).
    """
    payload_text, encoding = render_payload(payload)
    parts = [_pair(key, value) for key, value in head.items()]
    parts.append(f'"payload": {payload_text}')
    parts.append(f'"payload_encoding": "{encoding}"')
    parts.extend(_pair(key, value) for key, value in tail.items())
    return "{" + ", ".join(parts) + "}"


def _pair(key: str, value: Any) -> str:
    return f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False, allow_nan=False)}"


__all__ = [
    "CONSUME_FIELDS",
    "ENCODINGS",
    "MAX_JSON_DEPTH",
    "JsonValueError",
    "JsonlItem",
    "LineError",
    "LineFailure",
    "parse_jsonl",
    "parse_jsonl_line",
    "record_line",
    "render_payload",
    "Field",
    "split_object",
    "strict_loads",
    "too_deep_at",
]
