"""Pure pieces of the client: publish items, batch results, request ids (sans-IO).

Nothing here touches trio or sockets, so the bookkeeping the client relies on is
tested without an event loop (``tests/unit/client/test_client_batching.py``).
Source: ``docs/protocol.md``, "PUBLISH" (ids are ``first_id + i``) and "Requests".
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

import attrs

from futureq.client._checks import (
    INT64_MAX,
    check_headers,
    check_int,
    check_str,
    fits_wire_int,
    utf8_bytes,
)
from futureq.errors import ErrorCode, RemoteProtocolError, RequestError
from futureq.wire.validation import implausible_epoch_ms

PUBLISH_FRAME_OVERHEAD_BYTES = 17
"""Bytes of a PUBLISH frame body besides its items, at most: the outer array header,
frame type, request id (up to 9), ack level and the items array header (up to 5)."""


def _str_bytes(length: int) -> int:
    """msgpack size of a str of ``length`` UTF-8 bytes (header included)."""
    return length + (1 if length < 32 else 2 if length < 0x100 else 3 if length < 0x10000 else 5)


def _bin_bytes(length: int) -> int:
    return length + (2 if length < 0x100 else 3 if length < 0x10000 else 5)


def _int_bytes(value: int | None) -> int:
    if value is None or -32 <= value < 128:
        return 1
    if value >= 0:
        return 2 if value < 0x100 else 3 if value < 0x10000 else 5 if value < 2**32 else 9
    return 2 if value >= -(2**7) else 3 if value >= -(2**15) else 5 if value >= -(2**31) else 9


def _container_bytes(count: int) -> int:
    """msgpack size of an array or map header of ``count`` elements."""
    return 1 if count < 16 else 3 if count < 0x10000 else 5


def _check_time_range(name: str, value: int | None, code_low: ErrorCode) -> None:
    """Refuse a time field msgpack cannot carry (beyond 64 bits), with the code the
    server gives for a value that far out (``validate_publish_items``)."""
    if value is None or fits_wire_int(value) and value <= INT64_MAX:
        return
    if value < 0:
        raise RequestError(code_low, f"{name} is {value}; it must be >= 0")
    if name == "ttl_ms":
        # Past 2**63 - 1: no epoch time the server takes (nothing for IMPLAUSIBLE_TIME).
        raise RequestError(
            ErrorCode.INVALID_TTL,
            f"ttl_ms is {value}; it is past {INT64_MAX} ms (a signed 64-bit integer), and "
            "the server's max_ttl_ms is lower still",
        )
    raise RequestError(
        ErrorCode.DUE_TIME_OVERFLOW,
        f"{name} {value} puts the due time past {INT64_MAX} ms (a signed 64-bit integer); "
        "give a delay in ms, or a time in ms since the Unix epoch",
    )


T = TypeVar("T")
W = TypeVar("W")


def _payload_bytes(value: bytes | bytearray | memoryview) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(
            f"payload must be bytes, got {type(value).__name__}; encode text with .encode()"
        )
    return bytes(value)


@attrs.frozen
class PublishItem:
    """One message to publish.

    Attributes:
        topic: Topic name, 1..255 UTF-8 bytes; names ending ``.dlq`` are reserved.
        payload: Message body (bytes; ``bytearray``/``memoryview`` are copied to bytes).
        delay_ms: Deliver this many milliseconds after the leader stores it (>= 0).
        deliver_at_ms: Deliver at this time in **milliseconds** since the Unix epoch
            (``int(time.time() * 1000)``, not ``time.time()``); a time in the past means
            "now", and so does 0. Give ``delay_ms`` or this, not both; neither means
            "due at once".
        ttl_ms: How long after it falls due the message may still be delivered (ms,
            > 0); None keeps it until consumed.
        headers: A small map str -> str stored and shown with the message (at most 32
            headers, 4096 bytes of names and values; names starting ``futureq-`` are
            the broker's), e.g. trace context or content type.
        idempotency_key: Publishing again with the same key on the same topic while
            the first message is pending (or within the server's
            ``queue.idempotency_window_ms`` after it) stores nothing and returns the
            first message's id (1 to 255 UTF-8 bytes).

    Raises:
        TypeError: payload is not bytes-like; topic, a time, headers or
            idempotency_key of the wrong type (``headers={"n": 1}``, ``ttl_ms=1.5``).
        RequestError: INVALID_DELAY when both ``delay_ms`` and ``deliver_at_ms`` are given;
            a value that cannot be sent at all, with the code the server gives for such a
            value of that field: a time beyond 64 bits (INVALID_DELAY below ``-2**63``,
            DUE_TIME_OVERFLOW above ``2**63 - 1``; for ``ttl_ms`` INVALID_TTL), text that
            is not valid Unicode (a lone surrogate such as ``"\\ud800"``: INVALID_TOPIC,
            INVALID_HEADERS, INVALID_IDEMPOTENCY_KEY); IMPLAUSIBLE_TIME when ``deliver_at_ms`` can only be a unit mistake (after 0
            and before 2000-01-01: seconds; past the year 5138: micro- or nanoseconds).
    """

    topic: str
    payload: bytes = attrs.field(converter=_payload_bytes)
    delay_ms: int | None = None
    deliver_at_ms: int | None = None
    ttl_ms: int | None = None
    headers: dict[str, str] | None = None
    idempotency_key: str | None = None
    _wire_bytes: int = attrs.field(init=False, eq=False, repr=False, default=0)

    def __attrs_post_init__(self) -> None:
        # A wrong type would make the whole PUBLISH frame malformed (the server closes
        # the connection for it), and a value msgpack cannot encode (an int beyond 64
        # bits, a lone surrogate) would fail the whole frame in the client: both are
        # refused here, alone, before the item can join a frame shared with others.
        check_str("topic", self.topic)
        for name in ("delay_ms", "deliver_at_ms", "ttl_ms"):
            check_int(name, getattr(self, name), optional=True)
        check_headers(self.headers)
        check_str("idempotency_key", self.idempotency_key, optional=True)
        if self.delay_ms is not None and self.deliver_at_ms is not None:
            raise RequestError(ErrorCode.INVALID_DELAY, "give delay_ms or deliver_at_ms, not both")
        _check_time_range("delay_ms", self.delay_ms, ErrorCode.INVALID_DELAY)
        _check_time_range("deliver_at_ms", self.deliver_at_ms, ErrorCode.INVALID_DELAY)
        _check_time_range("ttl_ms", self.ttl_ms, ErrorCode.INVALID_TTL)
        size = _str_bytes(utf8_bytes("topic", self.topic, ErrorCode.INVALID_TOPIC))
        size += _bin_bytes(len(self.payload))
        size += _int_bytes(self.delay_ms) + _int_bytes(self.deliver_at_ms)
        size += _int_bytes(self.ttl_ms)
        if self.headers is None and self.idempotency_key is None:
            size += _container_bytes(5)
        else:
            size += _container_bytes(7) + 2  # two nils, replaced below by what is set
            if self.headers is not None:
                size += _container_bytes(len(self.headers)) - 1
                for name, value in self.headers.items():
                    size += _str_bytes(utf8_bytes("a header name", name, ErrorCode.INVALID_HEADERS))
                    size += _str_bytes(
                        utf8_bytes(f"header {name!r}", value, ErrorCode.INVALID_HEADERS)
                    )
            if self.idempotency_key is not None:
                key_bytes = utf8_bytes(
                    "idempotency_key", self.idempotency_key, ErrorCode.INVALID_IDEMPOTENCY_KEY
                )
                size += _str_bytes(key_bytes) - 1
        object.__setattr__(self, "_wire_bytes", size)
        if type(self.deliver_at_ms) is int:
            # Seconds (or microseconds) taken for milliseconds: refused before it leaves
            # (docs/protocol.md, "Units"); the server refuses it as well.
            mistake = implausible_epoch_ms("deliver_at_ms", self.deliver_at_ms)
            if mistake is not None:
                raise RequestError(ErrorCode.IMPLAUSIBLE_TIME, mistake)

    @property
    def wire_bytes(self) -> int:
        """Bytes this item takes in a PUBLISH frame body (its msgpack encoding)."""
        return self._wire_bytes

    def to_wire(self) -> list[Any]:
        """The PUBLISH item array ``[topic, payload, delay_ms, deliver_at_ms, ttl_ms]``,
        with ``headers`` and ``idempotency_key`` after them when either is set."""
        if self.headers is None and self.idempotency_key is None:
            return [self.topic, self.payload, self.delay_ms, self.deliver_at_ms, self.ttl_ms]
        return [
            self.topic,
            self.payload,
            self.delay_ms,
            self.deliver_at_ms,
            self.ttl_ms,
            self.headers,
            self.idempotency_key,
        ]


def ids_from_publish_ok(
    first_id: int | None, count: int, sent: int, duplicates: list[list[int]] | None = None
) -> list[int]:
    """Message ids of a PUBLISH batch from its PUBLISH_OK.

    Args:
        first_id: PUBLISH_OK's ``first_id``.
        count: PUBLISH_OK's ``count``.
        sent: How many items the PUBLISH held.
        duplicates: PUBLISH_OK's ``[[position, id], ...]`` of items whose idempotency
            key named an earlier message.

    Returns:
        ``[first_id, first_id + 1, ..., first_id + sent - 1]``, a duplicate's position
        holding the earlier message's id.

    Raises:
        RemoteProtocolError: INVALID_FRAME when the server's answer does not match
            the batch (count differs, or no id at ack level leader/quorum).
    """
    if count != sent:
        raise RemoteProtocolError(
            ErrorCode.INVALID_FRAME,
            f"PUBLISH_OK reports {count} messages for a batch of {sent}",
        )
    if first_id is None:
        raise RemoteProtocolError(
            ErrorCode.INVALID_FRAME, "PUBLISH_OK carries no first_id at ack level leader/quorum"
        )
    ids = list(range(first_id, first_id + sent))
    for position, original in duplicates or ():
        if not 0 <= position < sent:
            raise RemoteProtocolError(
                ErrorCode.INVALID_FRAME,
                f"PUBLISH_OK names duplicate position {position} in a batch of {sent}",
            )
        ids[position] = original
    return ids


def refused_item(error: RequestError, sent: int) -> int | None:
    """Which item of a refused batch is to blame, if the server named a valid one.

    Args:
        error: The batch's error.
        sent: How many items the batch held.

    Returns:
        ``error.item_index`` when it is within ``0..sent-1``, else None (the error
        concerns the whole batch).
    """
    index = error.item_index
    if index is None or not 0 <= index < sent:
        return None
    return index


def without_item(error: RequestError) -> RequestError:
    """The same refusal for a single caller: code and message, no batch position."""
    return RequestError(error.code, error.message)


class Measured(Protocol):
    """Anything that knows its size in a PUBLISH frame (a :class:`PublishItem`, or a
    line of ``publish --file`` holding one)."""

    @property
    def wire_bytes(self) -> int: ...


def split_by_size(items: Sequence[Measured], start: int, max_items: int, max_bytes: int) -> int:
    """Where the PUBLISH frame starting at ``items[start]`` ends.

    Args:
        items: The whole list.
        start: Index of the frame's first item (< ``len(items)``).
        max_items: Most items per frame (>= 1).
        max_bytes: Most encoded item bytes per frame (:attr:`PublishItem.wire_bytes`).

    Returns:
        ``end`` > ``start``: the frame is ``items[start:end]``, as many items in order
        as fit both limits, and always at least one (an item over ``max_bytes`` alone
        is the caller's to refuse).
    """
    end = start + 1
    size = items[start].wire_bytes
    stop = min(len(items), start + max_items)
    while end < stop and size + items[end].wire_bytes <= max_bytes:
        size += items[end].wire_bytes
        end += 1
    return end


def chunked(items: Sequence[T], size: int) -> Iterator[tuple[int, Sequence[T]]]:
    """Split ``items`` into consecutive slices of at most ``size``.

    Yields:
        ``(offset, slice)`` pairs; ``offset`` is the index of the slice's first item.

    Raises:
        ValueError: ``size`` < 1.
    """
    if size < 1:
        raise ValueError(f"chunk size must be >= 1, got {size}")
    for offset in range(0, len(items), size):
        yield offset, items[offset : offset + size]


class RequestTable(Generic[W]):
    """Outstanding requests of one connection, keyed by request id.

    Request ids start at 1 and only grow (0 is reserved for server pushes such as
    DELIVER), so a late answer to a request that timed out is recognised and dropped
    instead of being matched to a newer request.
    """

    def __init__(self) -> None:
        self._next_id = 1
        self._waiters: dict[int, W] = {}

    def __len__(self) -> int:
        return len(self._waiters)

    def add(self, waiter: W) -> int:
        """Register ``waiter`` under a fresh request id and return the id."""
        request_id = self._next_id
        self._next_id += 1
        self._waiters[request_id] = waiter
        return request_id

    def pop(self, request_id: int) -> W | None:
        """Remove and return the waiter of ``request_id``; None if unknown or gone."""
        return self._waiters.pop(request_id, None)

    def take_above(self, request_id: int) -> list[W]:
        """Remove and return the waiters of requests with a larger id than
        ``request_id`` (a GOAWAY's ``last_request_id``: the server served none of them)."""
        above = [rid for rid in self._waiters if rid > request_id]
        return [self._waiters.pop(rid) for rid in above]

    def drain(self) -> list[W]:
        """Remove and return every outstanding waiter (the connection is gone)."""
        waiters = list(self._waiters.values())
        self._waiters.clear()
        return waiters


def check_publish_items(items: Any) -> None:
    """``items`` is a list (or other sequence) of :class:`PublishItem`.

    Raises:
        TypeError: ``items`` is not a sequence (or is a str or bytes), or an item is
            not a PublishItem (a tuple, a dict), naming its position. Before, a
            sharded client raised ``AttributeError: 'tuple' object has no attribute
            'topic'`` (found by a tester).
    """
    if isinstance(items, str | bytes | bytearray) or not isinstance(items, Sequence):
        raise TypeError(
            f"items must be a list of PublishItem(topic, payload, ...), got {type(items).__name__}"
        )
    for position, item in enumerate(items):
        if not isinstance(item, PublishItem):
            raise TypeError(
                f"items[{position}] must be a PublishItem(topic, payload, ...) "
                f"(from futureq.client), got {type(item).__name__}"
            )
