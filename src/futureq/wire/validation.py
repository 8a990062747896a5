"""Checks on request contents that fail one request, not the connection.

Source: ``docs/protocol.md``, "PUBLISH" and "Error codes"; the limits come from the
server's config (``max_payload_bytes``, ``max_delay_ms``, ``max_batch_items``).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterator
from typing import Any, Final

import attrs

from futureq.errors import ErrorCode, RequestError
from futureq.wire.msgpack_names import describe

MAX_NAME_BYTES = 255
"""Longest name of any kind, derived names included (bytes)."""
DLQ_SUFFIX = ".dlq"
"""Suffix of the dead-letter topic the broker derives from a topic: ``<topic>.dlq``."""
MAX_TOPIC_BYTES = MAX_NAME_BYTES - len(DLQ_SUFFIX) - 2
"""Longest topic a client may create (249 bytes, as Kafka): its dead-letter topic
``<topic>.dlq`` (253 bytes) is itself a valid name to consume."""
MAX_GROUP_BYTES = 249
"""Longest consumer group name (bytes)."""
NAME_GRAMMAR = "[A-Za-z0-9][A-Za-z0-9_-]*(.[A-Za-z0-9_-]+)*"
"""The name grammar, for messages and docs: ASCII letters, digits, '_' and '-' in tokens
separated by single dots; the first character a letter or digit."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*\Z")
INT64_MAX = 2**63 - 1
DLQ_SUFFIX = ".dlq"
MAX_DELAY_SETTING: Final = "limits.max_delay_ms"
"""The setting of the largest delay (and distance of a due time from now)."""
MAX_TTL_SETTING: Final = "limits.max_ttl_ms"
"""The setting of the largest time-to-live."""

MIN_PLAUSIBLE_EPOCH_MS = 946_684_800_000
"""2000-01-01T00:00:00Z in ms. An absolute time before it can only be a unit mistake
(epoch *seconds* of any date before the year 31,969 are below it); ``docs/protocol.md``,
"Units"."""
MAX_PLAUSIBLE_EPOCH_MS = 100_000_000_000_000
"""About the year 5138 in ms: an absolute time past it can only be micro- or
nanoseconds."""
MIN_VISIBILITY_TIMEOUT_MS = 100
"""A shorter visibility timeout can only be a unit mistake (seconds taken for ms): a
delivery would be handed out again before a consumer could ack it."""


MAX_VISIBILITY_TIMEOUT_MS = 12 * 3600 * 1000
"""The longest visibility timeout the protocol accepts (12 h): a group's own (GROUP_CREATE),
an extension, and ``queue.visibility_timeout_ms``."""

MAX_CREDIT = 1_000_000
"""The most credit one subscription may hold (items): SUBSCRIBE's ``prefetch`` plus
CREDIT granted, less deliveries pushed (``docs/protocol.md``, "Flow control"). A CREDIT
that would pass it is refused (INVALID_ARGUMENT), never cut: credits summed past it
would soon pass what the protocol's integers carry, and no consumer needs as many."""


def _iso(ms: int) -> str:
    """``2026-05-01T12:00:00Z`` (or ``year out of range``) for an epoch time in ms."""
    try:
        moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return "out of any calendar"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def implausible_epoch_ms(name: str, value: int) -> str | None:
    """Why an absolute time in ms since the Unix epoch can only be a unit mistake, or None.

    Refused: after 0 and before 2000-01-01 (seconds taken for milliseconds) and after
    :data:`MAX_PLAUSIBLE_EPOCH_MS` (micro- or nanoseconds). 0 stays "at once". Both ends
    hold whatever the clock says, so clients check them too.

    Args:
        name: The field, for the sentence (``deliver_at_ms``, ``--at``).
        value: The value given.
    """
    if 0 < value < MIN_PLAUSIBLE_EPOCH_MS:
        text = f"{name} {value} is {_iso(value)}, before 2000"
        if MIN_PLAUSIBLE_EPOCH_MS <= value * 1000 <= MAX_PLAUSIBLE_EPOCH_MS:
            return (
                f"{text}: it looks like seconds since the Unix epoch; {name} is in "
                f"milliseconds (did you mean {value * 1000}, {_iso(value * 1000)}?)"
            )
        return f"{text}: {name} must be milliseconds since the Unix epoch"
    if value > MAX_PLAUSIBLE_EPOCH_MS:
        for unit, divisor in (("microseconds", 1000), ("nanoseconds", 1_000_000)):
            # Suggest only a reading this function accepts (253402300800000 as
            # microseconds is 1978: no suggestion, rather than one refused in turn).
            if MIN_PLAUSIBLE_EPOCH_MS <= value // divisor <= MAX_PLAUSIBLE_EPOCH_MS:
                return (
                    f"{name} {value} is {_iso(value)}: it looks like {unit} since the Unix "
                    f"epoch; {name} is in milliseconds (did you mean {value // divisor}, "
                    f"{_iso(value // divisor)}?)"
                )
        return f"{name} {value} is {_iso(value)}: {name} must be milliseconds since the Unix epoch"
    return None


_READABLE_UNITS: Final = (
    ("day", 86_400_000),
    ("hour", 3_600_000),
    ("minute", 60_000),
    ("second", 1000),
)


def readable_ms(ms: int) -> str:
    """A duration in ms in the largest whole unit it holds: ``3,660 days`` (the unit of
    ``--delay 3660d`` and of the default limits, ten years of 366 days), ``over 4,773
    days`` when it is not a whole number of them (rounded down), ``2 hours``, ``500 ms``.
    """
    for unit, size in _READABLE_UNITS:
        if ms >= size:
            count = ms // size
            text = f"{count:,} {unit}" + ("" if count == 1 else "s")
            return text if ms % size == 0 else f"over {text}"
    return f"{ms:,} ms"


def over_limit(
    what: str, value_ms: int, limit_ms: int, setting: str, fix: str, *, from_now: bool = False
) -> str:
    """The sentence for a delay, a time or a TTL over its server limit: every one is
    built here, so they name the value and the limit the same way (ms, then a readable
    unit), the setting to raise, and what to do.

    Args:
        what: The value's name and how it counts, e.g. ``"delay_ms"`` or
            ``"deliver_at_ms (2040-01-01T00:00:00Z)"``; ``is N ms`` follows.
        value_ms: The delay, distance from now or TTL given (ms).
        limit_ms: The limit it is over (ms).
        setting: The setting of that limit: ``limits.max_delay_ms`` or
            ``limits.max_ttl_ms``.
        fix: What the sender can do (``"deliver sooner"``); ``, or have the operator
            raise`` the setting follows.
        from_now: ``value_ms`` is the distance of a time from now (``is N ms from now``).
    """
    distance = " from now" if from_now else ""
    return (
        f"{what} is {value_ms} ms{distance} ({readable_ms(value_ms)}); the limit is {limit_ms} ms "
        f"({readable_ms(limit_ms)}, {setting}): {fix}, or have the operator raise {setting}"
    )


def implausible_duration_ms(name: str, value: int, latest_ms: int) -> str | None:
    """Why a duration in ms over its limit can only be a unit mistake, or None.

    A duration that, read as ms since the epoch, is an absolute time the server would
    take in its place (on or after 2000-01-01, so more than 30 years as a duration,
    and no later than ``latest_ms``) was meant as that absolute time: the answer says
    to send it as one. Any other duration over the limit is just too long, and gets the
    limit's own code: a delay of 100 years (``--delay 36599d``) is no epoch time anyone
    would send (it reads as 2070), and telling its sender to send it as an absolute
    time would only get the limit's code in turn.

    Args:
        name: The field, for the sentence.
        value: The duration given (ms), over its limit.
        latest_ms: The latest absolute time the server takes in its place: now plus
            ``max_delay_ms`` for a delay, the due time plus ``max_ttl_ms`` for a TTL.
    """
    if MIN_PLAUSIBLE_EPOCH_MS <= value <= min(latest_ms, MAX_PLAUSIBLE_EPOCH_MS):
        return (
            f"{name} {value} is {value / 86_400_000 / 365.25:.0f} years: it looks like an "
            f"absolute time ({_iso(value)}) in ms since the Unix epoch; {name} is a duration "
            "in milliseconds"
        )
    return None


def implausible_over_limit(over: str, name: str, value: int) -> str:
    """The IMPLAUSIBLE_TIME sentence of a duration over its limit that also reads as an
    epoch time (:func:`implausible_duration_ms`): the limit first, as for any duration
    over it, then the other reading.

    ``futureq-cli publish --delay 20000d`` was told only that 1728000000000 "looks like
    an absolute time (2024-10-04T00:00:00Z)" and to send it as ``deliver_at_ms``, though
    it was typed in days: the largest delay allowed came last, and a TTL's not at all.

    Args:
        over: The :func:`over_limit` sentence of the value.
        name: The field (``delay_ms``, ``ttl_ms``).
        value: The duration given (ms).
    """
    meant = (
        "if that time was meant, send it as deliver_at_ms"
        if name == "delay_ms"
        else "a TTL counts from the due time: give how long after it the message may "
        "still be delivered"
    )
    return (
        f"{over}. It also looks like an absolute time ({_iso(value)}) in ms since the Unix "
        f"epoch: {meant}"
    )


def check_visibility_timeout_ms(value: int, *, field: str = "visibility_timeout_ms") -> None:
    """Refuse a visibility timeout that can only be a unit mistake (below 100 ms).

    Raises:
        RequestError: IMPLAUSIBLE_TIME with a sentence naming the likely meaning.
    """
    if 1 <= value < MIN_VISIBILITY_TIMEOUT_MS:
        raise RequestError(
            ErrorCode.IMPLAUSIBLE_TIME, f"{field} is {value} ms: {visibility_problem(value)}"
        )


def visibility_problem(value: int) -> str:
    """What is wrong with a visibility timeout below :data:`MIN_VISIBILITY_TIMEOUT_MS`."""
    return (
        "every delivery would be handed out again before a consumer could ack it; it looks "
        f"like seconds taken for milliseconds (did you mean {value * 1000}, i.e. {value} s?); "
        f"the smallest accepted is {MIN_VISIBILITY_TIMEOUT_MS} ms"
    )


@attrs.frozen
class Limits:
    """Request limits, all from the server's config.

    Attributes:
        max_payload_bytes: Largest payload (bytes).
        max_delay_ms: Largest delay, and largest ``deliver_at_ms - now`` (ms).
        max_ttl_ms: Largest time-to-live (ms).
        max_batch_items: Largest number of items in one PUBLISH, ACK or NACK.
    """

    max_payload_bytes: int = 1024 * 1024
    max_delay_ms: int = 10 * 366 * 24 * 3600 * 1000
    max_ttl_ms: int = 10 * 366 * 24 * 3600 * 1000
    max_batch_items: int = 10_000


def check_name(kind: str, value: str, item_index: int | None = None) -> None:
    """Check a new topic or group name against the one name grammar.

    A name is 1 to 249 bytes of ASCII letters, digits, ``_`` and ``-``, in tokens
    separated by single dots, starting with a letter or digit: ``orders``,
    ``billing.retry``, ``eu-west_1.invoices``. No spaces, no control characters, no
    empty token (no leading, trailing or double dot), no ``*`` or ``>`` (they are the
    wildcards of permission patterns), no leading ``_`` (``_other`` is the metrics label
    of groups past the series budget). Why: the same name must be safe in a log line,
    a Prometheus label, a shell argument and a file name, as Kafka's
    ``[A-Za-z0-9._-]`` is; tokens make patterns (NATS subjects) meaningful; and the
    length leaves room for the derived ``<topic>.dlq``. See ``docs/protocol.md``, "Names".

    Raises:
        RequestError: INVALID_TOPIC or INVALID_GROUP naming the rule broken.
    """
    code = ErrorCode.INVALID_TOPIC if kind == "topic" else ErrorCode.INVALID_GROUP
    limit = MAX_TOPIC_BYTES if kind == "topic" else MAX_GROUP_BYTES
    if not value:
        raise RequestError(
            code, f"{kind} name is empty; give a name of 1 to {limit} bytes", item_index
        )
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > limit:
        why = " (so that its dead-letter topic <topic>.dlq fits in 255)" if kind == "topic" else ""
        raise RequestError(
            code, f"{kind} name is {size} bytes; the limit is {limit} bytes{why}", item_index
        )
    if _NAME.match(value) is None:
        raise RequestError(
            code,
            f"{kind} name {_shown(value)} is not allowed: use ASCII letters, digits, '_' and '-' "
            "in tokens separated by single dots, starting with a letter or digit "
            "(e.g. billing.retry)",
            item_index,
        )


def check_legacy_name(kind: str, value: str) -> None:
    """Check a name against the rule of earlier versions (1..255 UTF-8 bytes, printable).

    Names stored before the grammar of :func:`check_name` existed stay usable to consume
    and delete, so the broker accepts them where they already exist.

    Raises:
        RequestError: INVALID_TOPIC or INVALID_GROUP.
    """
    size = len(value.encode("utf-8", "surrogatepass"))
    if not value or size > MAX_NAME_BYTES + len(DLQ_SUFFIX) or not value.isprintable():
        check_name(kind, value)  # raises with the grammar's sentence


def check_not_dead_letters_of_dead_letters(topic: str) -> None:
    """Refuse ``T.dlq.dlq`` (and longer): the dead-letter topic of a dead-letter topic.

    Nothing ever arrives there: a message of ``T.dlq`` that runs out of attempts is
    parked in ``T.dlq``, not moved on (``docs/protocol.md``, "Dead letters"), so a group
    of it would wait for ever. Checked wherever a topic to consume from or count enters
    (SUBSCRIBE, GROUP_CREATE, BROWSE of an unknown topic, the CLI, the client library).

    Raises:
        RequestError: INVALID_TOPIC, naming the dead-letter topic to use instead.
    """
    base = topic.removesuffix(DLQ_SUFFIX)
    if base == topic or not base.endswith(DLQ_SUFFIX):
        return
    root = base
    while root.endswith(DLQ_SUFFIX):
        root = root.removesuffix(DLQ_SUFFIX)
    raise RequestError(
        ErrorCode.INVALID_TOPIC,
        f"topic {_shown(topic)} would be the dead-letter topic of the dead-letter topic "
        f"{_shown(base)}, and nothing ever arrives there (a dead letter that runs out of "
        f"attempts is parked where it is, not moved on): use {_shown(root + DLQ_SUFFIX)}, "
        f"the dead letters of {_shown(root)}",
    )


def check_consumable_topic(topic: str) -> None:
    """Check a topic a client wants to consume from (SUBSCRIBE, GROUP_CREATE) that does
    not exist yet: a valid name, or the dead-letter topic ``<valid name>.dlq`` (not
    ``<name>.dlq.dlq``: :func:`check_not_dead_letters_of_dead_letters`).

    Raises:
        RequestError: INVALID_TOPIC.
    """
    check_not_dead_letters_of_dead_letters(topic)
    base = topic.removesuffix(DLQ_SUFFIX)
    check_name("topic", base if base != topic and base else topic)


def check_publish_topic(topic: str, item_index: int | None = None) -> None:
    """Check the topic of a PUBLISH item: a valid name (:func:`check_name`) that is not a
    dead-letter topic (those take only what the broker moves there).

    Raises:
        RequestError: INVALID_TOPIC or RESERVED_TOPIC, with ``item_index``.
    """
    if topic.endswith(DLQ_SUFFIX):
        raise RequestError(
            ErrorCode.RESERVED_TOPIC,
            f"topic {_shown(topic)} ends in {DLQ_SUFFIX!r}, which is reserved for dead "
            "letters; pick another name",
            item_index,
        )
    check_name("topic", topic, item_index)


def check_names_can_exist(topic: str, group: str | None = None) -> None:
    """Refuse names no topic (a valid name, or its dead-letter topic) or group can have,
    for a request naming ones this node does not hold: unknown is the answer only for
    names that could exist.

    Raises:
        RequestError: INVALID_TOPIC or INVALID_GROUP.
    """
    check_consumable_topic(topic)
    if group is not None:
        check_name("group", group)


def _shown(value: str) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


MAX_HEADERS: Final = 32
"""Most headers one message may carry (``docs/protocol.md``, "Headers")."""
MAX_HEADER_BYTES: Final = 4096
"""Most UTF-8 bytes of one message's header names and values together."""
DELIVERY_ROOM_BYTES: Final = 8192
"""Bytes a frame keeps beside the largest payload: a DELIVER of that one message also
carries its headers (:data:`MAX_HEADER_BYTES` and their msgpack prefixes), its tag, id,
times and attempt, under 4.5 KiB together. ``limits.max_payload_bytes`` is at most
``limits.max_frame_bytes`` less this, so every message can be delivered in a frame."""
PUBLISH_OK_DUPLICATE_BYTES: Final = 16
"""Most msgpack bytes of one ``[position, id]`` pair of PUBLISH_OK's ``duplicates``, so
``limits.max_batch_items`` of them fit in ``limits.max_frame_bytes``."""
MIN_FRAME_BYTES: Final = 65536
"""Smallest ``limits.max_frame_bytes`` (bytes): room for the answers of fixed shape
(HELLO_OK with its members, ERROR sentences) and the largest frame a connection may send
before HELLO (``docs/protocol.md``, "Limits")."""

RESERVED_HEADER_PREFIX: Final = "futureq-"
"""Header names the broker sets (dead-letter provenance); a publish may not, in any
letter case."""
MAX_IDEMPOTENCY_KEY_BYTES: Final = 255
"""Longest idempotency key (UTF-8 bytes)."""

ValidItem = (
    tuple[str, bytes, int, int | None]
    | tuple[str, bytes, int, int | None, dict[str, str] | None, str | None]
)
"""A validated PUBLISH item: ``(topic, payload, due_ms, ttl_ms)``, then ``headers`` and
``idempotency_key`` when either is given."""


def validate_publish_items(items: list[Any], limits: Limits, now_ms: int) -> list[ValidItem]:
    """Validate a PUBLISH batch and resolve each item's delay against ``now_ms``.

    Args:
        items: Raw wire items ``[topic, payload, delay_ms, deliver_at_ms, ttl_ms]`` (tuples
            or lists).
        limits: The server's request limits.
        now_ms: The publish time the leader stamps (ms since the Unix epoch).

    Returns:
        One ``(topic, payload, due_ms, ttl_ms)`` tuple per item (with ``headers`` and
        ``idempotency_key`` after them when either is given), in order. ``due_ms`` is
        ``now_ms + delay_ms``, or ``max(deliver_at_ms, now_ms)`` for an absolute time
        in the past (due at once; never earlier than publish).

    Raises:
        RequestError: for the first bad item, with ``item_index`` set; codes
            EMPTY_BATCH, BATCH_TOO_LARGE, INVALID_FIELD, INVALID_TOPIC, RESERVED_TOPIC,
            PAYLOAD_TOO_LARGE, INVALID_DELAY, DELAY_TOO_LARGE, DUE_TIME_OVERFLOW,
            INVALID_TTL, INVALID_HEADERS, INVALID_IDEMPOTENCY_KEY. Nothing of a refused
            batch is written.
    """
    out: list[ValidItem] = []
    for _ in validate_publish_items_in_steps(items, limits, now_ms, out):
        pass
    return out


_ARRAYS: Final = (tuple, list)
"""What a wire array is once decoded: a tuple (PUBLISH items, ``frames.Publish``) or a list."""

VALIDATE_STEP_ITEMS = 512
"""Items checked per step of :func:`validate_publish_items_in_steps`."""


def check_headers(value: Any, index: int) -> dict[str, str] | None:
    """A PUBLISH item's ``headers``: None or a map str -> str within the limits.

    Raises:
        RequestError: INVALID_HEADERS naming the problem (``item_index`` = ``index``).
    """
    if value is None:
        return None
    if type(value) is not dict:
        raise RequestError(
            ErrorCode.INVALID_HEADERS,
            f"headers (item position 5) must be a map of strings to strings, or nil for none, got {describe(value)}",
            index,
        )
    if len(value) > MAX_HEADERS:
        raise RequestError(
            ErrorCode.INVALID_HEADERS,
            f"{len(value)} headers; the limit is {MAX_HEADERS} per message",
            index,
        )
    size = 0
    for name, text in value.items():
        if type(name) is not str:
            raise RequestError(
                ErrorCode.INVALID_HEADERS,
                f"a header name is {describe(name)}; header names must be msgpack strings "
                "(str, not binary)",
                index,
            )
        if type(text) is not str:
            raise RequestError(
                ErrorCode.INVALID_HEADERS,
                f"header {_shown(name)} has {describe(text)} as its value; header values must "
                "be msgpack strings (str): send text, or leave the header out",
                index,
            )
        if not name:
            raise RequestError(ErrorCode.INVALID_HEADERS, "a header name is empty", index)
        if name[: len(RESERVED_HEADER_PREFIX)].lower() == RESERVED_HEADER_PREFIX:
            # In any case: FutureQ-Original-Id would pass for provenance to a reader.
            raise RequestError(
                ErrorCode.INVALID_HEADERS,
                f"header {_shown(name)} starts with {RESERVED_HEADER_PREFIX!r} (in any "
                "case), which is reserved for the broker (dead-letter provenance); rename it",
                index,
            )
        size += len(name.encode("utf-8")) + len(text.encode("utf-8"))
    if size > MAX_HEADER_BYTES:
        raise RequestError(
            ErrorCode.INVALID_HEADERS,
            f"headers hold {size} bytes; the limit is {MAX_HEADER_BYTES} bytes per message "
            "(names and values, UTF-8)",
            index,
        )
    return value or None


def check_idempotency_key(value: Any, index: int) -> str | None:
    """A PUBLISH item's ``idempotency_key``: None or 1 to 255 UTF-8 bytes.

    Raises:
        RequestError: INVALID_IDEMPOTENCY_KEY (``item_index`` = ``index``).
    """
    if value is None:
        return None
    if type(value) is not str or not 1 <= len(value.encode("utf-8")) <= MAX_IDEMPOTENCY_KEY_BYTES:
        got = describe(value) if type(value) is not str else f"{len(value.encode())} bytes"
        raise RequestError(
            ErrorCode.INVALID_IDEMPOTENCY_KEY,
            f"idempotency_key must be a string of 1 to {MAX_IDEMPOTENCY_KEY_BYTES} UTF-8 "
            f"bytes or nil, got {got}",
            index,
        )
    return value


def validate_publish_items_in_steps(
    items: list[Any],
    limits: Limits,
    now_ms: int,
    out: list[ValidItem],
) -> Iterator[None]:
    """:func:`validate_publish_items` in steps of :data:`VALIDATE_STEP_ITEMS` items.

    A generator: each ``next()`` checks up to that many items and appends them to
    ``out``, so an async caller can yield to its event loop between steps.

    Raises:
        RequestError: as :func:`validate_publish_items`, from the step that meets the
            first bad item.
    """
    if not items:
        raise RequestError(ErrorCode.EMPTY_BATCH, "PUBLISH holds no items; send at least one")
    if len(items) > limits.max_batch_items:
        raise RequestError(
            ErrorCode.BATCH_TOO_LARGE,
            f"PUBLISH holds {len(items)} items; the limit is {limits.max_batch_items} per batch",
        )
    max_payload = limits.max_payload_bytes
    max_delay = limits.max_delay_ms
    max_ttl = limits.max_ttl_ms
    # The fast path takes what every check below would pass (a known topic, a short
    # enough payload, a plain delay, a plain TTL or none, no headers or key); anything
    # else goes through the checks one by one, which name the problem.
    fast_max_delay = min(max_delay, INT64_MAX - now_ms)
    good_topics: set[str] = set()
    append = out.append
    # A step at a time, each a slice: no per-item test of whether to yield.
    for start in range(0, len(items), VALIDATE_STEP_ITEMS):
        if start:
            yield
        for i, item in enumerate(items[start : start + VALIDATE_STEP_ITEMS], start):
            if type(item) in _ARRAYS and len(item) == 5:
                topic, payload, delay_ms, deliver_at_ms, ttl_ms = item
                if (
                    deliver_at_ms is None
                    and type(topic) is str  # before the set lookup: an array or map is unhashable
                    and topic in good_topics
                    and type(payload) is bytes
                    and len(payload) <= max_payload
                ):
                    if delay_ms is None:
                        due_ms = now_ms
                    elif type(delay_ms) is int and 0 <= delay_ms <= fast_max_delay:
                        due_ms = now_ms + delay_ms
                    else:
                        due_ms = -1
                    if due_ms >= 0 and (
                        ttl_ms is None
                        or (
                            type(ttl_ms) is int
                            and 0 < ttl_ms <= max_ttl
                            and ttl_ms <= INT64_MAX - due_ms
                        )
                    ):
                        append((topic, payload, due_ms, ttl_ms))
                        continue
            if type(item) not in _ARRAYS or len(item) not in (5, 7):
                raise RequestError(
                    ErrorCode.INVALID_FIELD,
                    "each item must be an array [topic, payload, delay_ms, deliver_at_ms, ttl_ms] "
                    "or [topic, payload, delay_ms, deliver_at_ms, ttl_ms, headers, idempotency_key]",
                    i,
                )
            topic, payload, delay_ms, deliver_at_ms, ttl_ms = item[:5]
            if type(topic) is not str:
                raise RequestError(
                    ErrorCode.INVALID_FIELD, f"topic must be a string, got {describe(topic)}", i
                )
            if topic not in good_topics:  # one check per distinct topic of the batch
                check_publish_topic(topic, i)
                good_topics.add(topic)
            if type(payload) is not bytes:
                raise RequestError(
                    ErrorCode.INVALID_FIELD,
                    f"payload (item position 1) must be binary, got {describe(payload)}: send the "
                    "message body as msgpack bin (a string is refused too; encode text to bytes)",
                    i,
                )
            if len(payload) > max_payload:
                raise RequestError(
                    ErrorCode.PAYLOAD_TOO_LARGE,
                    f"payload is {len(payload)} bytes; the limit is {max_payload} bytes",
                    i,
                )
            if delay_ms is not None and deliver_at_ms is not None:
                raise RequestError(
                    ErrorCode.INVALID_DELAY, "give delay_ms or deliver_at_ms, not both", i
                )
            if deliver_at_ms is None:
                delay = 0 if delay_ms is None else delay_ms
                if type(delay) is not int:
                    raise RequestError(
                        ErrorCode.INVALID_FIELD,
                        f"delay_ms must be an integer number of milliseconds, got {describe(delay)}",
                        i,
                    )
                if delay < 0:
                    raise RequestError(
                        ErrorCode.INVALID_DELAY, f"delay_ms is {delay}; it must be >= 0", i
                    )
                if delay > INT64_MAX - now_ms:
                    raise RequestError(
                        ErrorCode.DUE_TIME_OVERFLOW,
                        f"delay_ms {delay} puts the due time past the largest 64-bit millisecond time",
                        i,
                    )
                if delay > max_delay:
                    mistake = implausible_duration_ms("delay_ms", delay, now_ms + max_delay)
                    over = over_limit(
                        "delay_ms", delay, max_delay, MAX_DELAY_SETTING, "deliver sooner"
                    )
                    if mistake is not None:
                        raise RequestError(
                            ErrorCode.IMPLAUSIBLE_TIME,
                            implausible_over_limit(over, "delay_ms", delay),
                            i,
                        )
                    raise RequestError(ErrorCode.DELAY_TOO_LARGE, over, i)
                due_ms = now_ms + delay
            else:
                if type(deliver_at_ms) is not int:
                    raise RequestError(
                        ErrorCode.INVALID_FIELD,
                        f"deliver_at_ms must be an integer (ms since the Unix epoch), got {describe(deliver_at_ms)}",
                        i,
                    )
                if deliver_at_ms < 0:
                    raise RequestError(
                        ErrorCode.INVALID_DELAY,
                        f"deliver_at_ms is {deliver_at_ms}; it must be >= 0",
                        i,
                    )
                if deliver_at_ms > INT64_MAX:
                    raise RequestError(
                        ErrorCode.DUE_TIME_OVERFLOW,
                        f"deliver_at_ms {deliver_at_ms} is past the largest time a message can "
                        f"have ({INT64_MAX} ms, a signed 64-bit integer); give ms since the Unix "
                        "epoch",
                        i,
                    )
                mistake = implausible_epoch_ms("deliver_at_ms", deliver_at_ms)
                if mistake is not None:
                    raise RequestError(ErrorCode.IMPLAUSIBLE_TIME, mistake, i)
                if deliver_at_ms - now_ms > max_delay:
                    raise RequestError(
                        ErrorCode.DELAY_TOO_LARGE,
                        over_limit(
                            f"deliver_at_ms {deliver_at_ms} ({_iso(deliver_at_ms)})",
                            deliver_at_ms - now_ms,
                            max_delay,
                            MAX_DELAY_SETTING,
                            "give an earlier time",
                            from_now=True,
                        ),
                        i,
                    )
                due_ms = max(deliver_at_ms, now_ms)
            if ttl_ms is not None:
                if type(ttl_ms) is not int:
                    raise RequestError(
                        ErrorCode.INVALID_FIELD,
                        f"ttl_ms must be an integer, got {describe(ttl_ms)}",
                        i,
                    )
                if ttl_ms <= 0:
                    raise RequestError(
                        ErrorCode.INVALID_TTL, f"ttl_ms is {ttl_ms}; it must be > 0 (or absent)", i
                    )
                if ttl_ms > limits.max_ttl_ms:
                    mistake = implausible_duration_ms("ttl_ms", ttl_ms, due_ms + limits.max_ttl_ms)
                    over = over_limit(
                        "ttl_ms", ttl_ms, limits.max_ttl_ms, MAX_TTL_SETTING, "give a shorter TTL"
                    )
                    if mistake is not None:
                        raise RequestError(
                            ErrorCode.IMPLAUSIBLE_TIME,
                            implausible_over_limit(over, "ttl_ms", ttl_ms),
                            i,
                        )
                    raise RequestError(ErrorCode.INVALID_TTL, over, i)
                if ttl_ms > INT64_MAX - due_ms:
                    raise RequestError(
                        ErrorCode.DUE_TIME_OVERFLOW,
                        f"due time plus ttl_ms is past {INT64_MAX} ms (a signed 64-bit integer)",
                        i,
                    )
            if len(item) == 7 and (item[5] is not None or item[6] is not None):
                out.append(
                    (
                        topic,
                        payload,
                        due_ms,
                        ttl_ms,
                        check_headers(item[5], i),
                        check_idempotency_key(item[6], i),
                    )
                )
            else:
                out.append((topic, payload, due_ms, ttl_ms))


def check_tags(tags: list[bytes], limits: Limits) -> None:
    """Check an ACK/NACK tag batch's size.

    Raises:
        RequestError: EMPTY_BATCH or BATCH_TOO_LARGE.
    """
    if not tags:
        raise RequestError(ErrorCode.EMPTY_BATCH, "no delivery tags given")
    if len(tags) > limits.max_batch_items:
        raise RequestError(
            ErrorCode.BATCH_TOO_LARGE,
            f"{len(tags)} delivery tags; the limit is {limits.max_batch_items} per request",
        )
