"""The stored records of the replicated state, and their msgpack forms.

Two records live in families :class:`~futureq.state.queue_state.QueueState` owns:

* a **message** (``messages`` family, key = message id, 8 bytes BE):
  ``[topic, payload, publish_ms, due_ms, open]`` and, when the message has headers, a
  TTL or an idempotency key, ``[..., headers, ttl_ms, idempotency_key]`` (trailing
  fields that are None are left out). ``due_ms`` is the due time it was published
  with; ``open`` counts the group entries still scheduled;
* a **schedule entry** (``schedule`` family, key = group id | due_ms | message id):
  ``[attempt, expire_ms]``, then, only when set, ``released, released_attempt,
  first_delivery_ms, last_delivery_ms, reason, held_attempt, held_stamp,
  held_until_ms``.

Layouts only ever grow at the end, and a reader takes a missing trailing field as its
default, so records written by earlier builds read unchanged. Most records keep the
short form: an unheadered message without TTL or key, an entry never delivered twice.

Source: ``DESIGN.md``, "Storage layout"; issue 14 (headers, dead-letter provenance).
"""

from __future__ import annotations

from typing import Any, Final

import attrs
import msgpack

_pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack

PARKED_DUE_MS: Final = 2**63 - 1
"""Due time of a *parked* entry: a dead letter that ran out of attempts on its dead-letter
topic. No clock reaches it, so it is never delivered; it stays until redriven,
rescheduled, cancelled or purged (``docs/protocol.md``, "Dead letters")."""


def unpack(data: bytes) -> Any:
    """The msgpack value of stored bytes (lists as lists, str as str)."""
    return msgpack.unpackb(data, raw=False, use_list=True)


def pack(value: Any) -> bytes:
    """msgpack bytes of a value (bin type for bytes)."""
    data: bytes = _pack(value)
    return data


@attrs.define
class MessageRecord:
    """A stored message.

    Attributes:
        topic: The topic it was published to.
        payload: Its body.
        publish_ms: The leader's stamp of the command that stored it (ms).
        due_ms: The due time it was published with (ms); a group's entry may have
            moved since (NACK, RESCHEDULE).
        open: Group entries still scheduled; the record goes with the last.
        headers: Its headers (str -> str), or None.
        ttl_ms: Its time-to-live counted from its due time (ms), or None.
        idempotency_key: The key it was published with, or None.
    """

    topic: str
    payload: bytes
    publish_ms: int
    due_ms: int
    open: int
    headers: dict[str, str] | None = None
    ttl_ms: int | None = None
    idempotency_key: str | None = None

    @classmethod
    def decode(cls, data: bytes) -> MessageRecord:
        """The record of stored bytes (any layout a build ever wrote)."""
        value = unpack(data)
        record = cls(value[0], value[1], value[2], value[3], value[4])
        if len(value) > 5:
            record.headers = value[5] or None
            record.ttl_ms = value[6] if len(value) > 6 else None
            record.idempotency_key = value[7] if len(value) > 7 else None
        return record

    def encode(self) -> bytes:
        """The stored bytes (the short layout when nothing optional is set)."""
        value: list[Any] = [self.topic, self.payload, self.publish_ms, self.due_ms, self.open]
        extra = [self.headers, self.ttl_ms, self.idempotency_key]
        while extra and extra[-1] is None:
            extra.pop()
        return pack(value + extra)


def encode_message(
    topic: str,
    payload: bytes,
    publish_ms: int,
    due_ms: int,
    open_entries: int,
    headers: dict[str, str] | None = None,
    ttl_ms: int | None = None,
    idempotency_key: str | None = None,
) -> bytes:
    """:meth:`MessageRecord.encode` without building the record (the publish hot path)."""
    if headers is None and ttl_ms is None and idempotency_key is None:
        return pack([topic, payload, publish_ms, due_ms, open_entries])
    value: list[Any] = [topic, payload, publish_ms, due_ms, open_entries, headers, ttl_ms]
    if idempotency_key is not None:
        value.append(idempotency_key)
    elif ttl_ms is None:
        value.pop()
    return pack(value)


@attrs.define
class EntryValue:
    """A stored schedule entry's value (its key says group, due time and message).

    Attributes:
        attempt: Number of the last delivery recorded (0: never delivered, or only a
            first delivery that was not recorded: ``docs/protocol.md``, "DELIVER").
        expire_ms: When it expires (ms), or None.
        released: Deliveries given back unprocessed (RELEASE), not counted.
        released_attempt: The attempt last released (0: none).
        first_delivery_ms: When it was first delivered, as far as the log knows (ms).
        last_delivery_ms: When it was last delivered, as far as the log knows (ms).
        reason: The reason text of its last NACK, or None.
        held_attempt: The attempt of the delivery a leader handing over left out
            (HANDED_OUT), 0: none. The hold is live only while it is still the
            entry's last attempt (:meth:`held`).
        held_stamp: That delivery's tag stamp (the last four bytes of its tag).
        held_until_ms: That delivery's visibility deadline (ms since the Unix epoch).
    """

    attempt: int = 0
    expire_ms: int | None = None
    released: int = 0
    released_attempt: int = 0
    first_delivery_ms: int | None = None
    last_delivery_ms: int | None = None
    reason: str | None = None
    held_attempt: int = 0
    held_stamp: int = 0
    held_until_ms: int = 0

    @classmethod
    def decode(cls, data: bytes) -> EntryValue:
        """The value of stored bytes (any layout a build ever wrote)."""
        value = unpack(data)
        return cls(*value)

    def encode(self) -> bytes:
        """The stored bytes, trailing defaults left out."""
        value: list[Any] = [
            self.attempt,
            self.expire_ms,
            self.released,
            self.released_attempt,
            self.first_delivery_ms,
            self.last_delivery_ms,
            self.reason,
            self.held_attempt,
            self.held_stamp,
            self.held_until_ms,
        ]
        defaults = (0, None, 0, 0, None, None, None, 0, 0, 0)
        while len(value) > 2 and value[-1] == defaults[len(value) - 1]:
            value.pop()
        return pack(value)

    def held(self) -> tuple[int, int] | None:
        """``(stamp, until_ms)`` of the delivery a leader handing over left out, while
        that delivery is still the entry's last (no later attempt recorded, not released,
        not settled), else None. Leader-side: whether ``until_ms`` has passed is the
        reader's question (apply compares no clock)."""
        if (
            self.held_attempt == 0
            or self.held_attempt != self.attempt
            or self.released_attempt == self.held_attempt
        ):
            return None
        return self.held_stamp, self.held_until_ms

    @classmethod
    def held_in(cls, fields: list[Any]) -> tuple[int, int] | None:
        """:meth:`held` of a stored value already unpacked (``fields``); None at once
        for a value without a hold (fewer than eight fields: none was ever recorded)."""
        return cls(*fields).held() if len(fields) > 7 else None

    def unhold(self) -> None:
        """Forget the hold (its delivery was settled, moved or superseded)."""
        self.held_attempt = self.held_stamp = self.held_until_ms = 0

    def record_delivery(self, first_ms: int | None, last_ms: int | None) -> None:
        """Merge what the leader knows of delivery times: the first is kept once set,
        the last never goes backwards."""
        if self.first_delivery_ms is None:
            self.first_delivery_ms = first_ms if first_ms is not None else last_ms
        if last_ms is not None and (
            self.last_delivery_ms is None or last_ms > self.last_delivery_ms
        ):
            self.last_delivery_ms = last_ms


RESERVED_HEADER_PREFIX: Final = "futureq-"
"""Headers whose names start with this are the broker's (dead-letter provenance); a
client cannot publish them (``docs/protocol.md``, "Headers")."""
HEADER_ORIGINAL_ID: Final = "futureq-original-id"
HEADER_ORIGINAL_TOPIC: Final = "futureq-original-topic"
HEADER_ORIGINAL_GROUP: Final = "futureq-original-group"
HEADER_ATTEMPTS: Final = "futureq-attempts"
HEADER_FIRST_DELIVERY_MS: Final = "futureq-first-delivery-ms"
HEADER_LAST_DELIVERY_MS: Final = "futureq-last-delivery-ms"
HEADER_REASON: Final = "futureq-reason"
HEADER_REASON_TEXT: Final = "futureq-reason-text"
HEADER_DEAD_LETTERED_MS: Final = "futureq-dead-lettered-ms"
HEADER_REDRIVEN_FROM: Final = "futureq-redriven-from"
REASON_MAX_DELIVERIES: Final = "max-deliveries"
REASON_REJECTED: Final = "rejected"
REASON_EXPIRED: Final = "expired"


def provenance_headers(
    headers: dict[str, str] | None,
    mid: int,
    topic: str,
    group: str,
    entry: EntryValue,
    reason: str,
    reason_text: str | None,
    dead_lettered_ms: int,
) -> dict[str, str]:
    """A dead letter's headers: the message's own, then where it came from and why.

    Earlier provenance (a message redriven and dead-lettered again) is replaced by this
    death's; the message's own headers are kept as they were.
    """
    out = {
        name: value
        for name, value in (headers or {}).items()
        if not name.startswith(RESERVED_HEADER_PREFIX) or name == HEADER_REDRIVEN_FROM
    }
    out[HEADER_ORIGINAL_ID] = str(mid)
    out[HEADER_ORIGINAL_TOPIC] = topic
    out[HEADER_ORIGINAL_GROUP] = group
    out[HEADER_ATTEMPTS] = str(entry.attempt)
    if entry.first_delivery_ms is not None:
        out[HEADER_FIRST_DELIVERY_MS] = str(entry.first_delivery_ms)
    if entry.last_delivery_ms is not None:
        out[HEADER_LAST_DELIVERY_MS] = str(entry.last_delivery_ms)
    out[HEADER_REASON] = reason
    text = reason_text if reason_text is not None else entry.reason
    if text:
        out[HEADER_REASON_TEXT] = text
    out[HEADER_DEAD_LETTERED_MS] = str(dead_lettered_ms)
    return out
