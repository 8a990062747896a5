"""Topics to hash slots, hash slots to shards: the pure routing rule of a sharded node.

A topic's slot is the first two bytes of the MD5 digest of the UTF-8 topic name, its
trailing ``.dlq`` suffixes removed, read big-endian, modulo ``SLOT_COUNT``: the same number in
every process, every Python and every client language (MD5 is in every standard
library), unlike Python's salted ``hash()``. MD5 is used as a mixing function, not for
security. CRC32 was tried first and refused: it is linear, so names differing only in
their last character (``t0`` ... ``t9``) all fell in the same half of the slots. Stripping ``.dlq`` puts a topic and its
dead-letter topic (and ``x.dlq.dlq``...) in the same slot, so dead-lettering and redrive
never leave one shard.

A :class:`SlotMap` gives every slot exactly one shard, as contiguous ranges
``[start, end)``; it carries a ``version`` so that slots can later move between shards
and a client can tell a newer map from an older one. Today's maps are made by
:func:`even_map` (shard ``k`` of ``n`` owns slots ``[k*S//n, (k+1)*S//n)``), version 1.

Source: ``docs/sharding.md``, "Slots".
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import Any

import attrs

SLOT_COUNT = 1024
"""Hash slots of a node: fixed forever (changing it moves every topic). 1024 leaves room
for up to 1024 shards and keeps a slot map a few ranges long."""

DLQ_SUFFIX = ".dlq"
MAX_SHARDS = 64
"""Most shards a node may run (``node.shards``): one OS process each."""


@functools.lru_cache(maxsize=65536)
def topic_slot(topic: str) -> int:
    """The hash slot of ``topic``: ``md5(topic without trailing ".dlq"s)[0:2] % 1024``.

    Args:
        topic: A topic name (any string; validity is checked elsewhere).

    Returns:
        An int in ``[0, SLOT_COUNT)``; ``topic_slot("x.dlq") == topic_slot("x")``.
    """
    while topic.endswith(DLQ_SUFFIX):
        topic = topic[: -len(DLQ_SUFFIX)]
    digest = hashlib.md5(topic.encode("utf-8", "surrogatepass"), usedforsecurity=False).digest()
    return int.from_bytes(digest[:2], "big") % SLOT_COUNT


@attrs.frozen
class SlotMap:
    """Which shard owns each hash slot, and where each shard listens.

    Attributes:
        version: Bumped whenever a slot changes owner (1 for today's fixed maps).
        ranges: ``(start, end, shard)`` triples, sorted, contiguous, covering
            ``[0, SLOT_COUNT)`` exactly once; ``end`` is exclusive.
        addresses: Client address (``host:port``) of each shard on the node that
            answered, indexed by shard number.
    """

    version: int
    ranges: tuple[tuple[int, int, int], ...]
    addresses: tuple[str, ...]
    _owners: tuple[int, ...] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        problem = _map_problem(self.version, self.ranges, len(self.addresses))
        if problem is not None:
            raise ValueError(problem)
        owners = [0] * SLOT_COUNT
        for start, end, shard in self.ranges:
            owners[start:end] = [shard] * (end - start)
        object.__setattr__(self, "_owners", tuple(owners))

    @property
    def shard_count(self) -> int:
        """Number of shards (``len(addresses)``)."""
        return len(self.addresses)

    def shard_of_slot(self, slot: int) -> int:
        """The shard owning ``slot`` (0-based)."""
        return self._owners[slot]

    def shard_of(self, topic: str) -> int:
        """The shard owning ``topic`` (and ``topic.dlq``)."""
        return self.shard_of_slot(topic_slot(topic))

    def address_of(self, topic: str) -> str:
        """Client address of the shard owning ``topic``."""
        return self.addresses[self.shard_of(topic)]

    def to_wire(self) -> dict[str, Any]:
        """The map as a msgpack/JSON map (``docs/protocol.md``, "SLOT_MAP")."""
        return {
            "version": self.version,
            "slots": SLOT_COUNT,
            "ranges": [list(r) for r in self.ranges],
            "shards": list(self.addresses),
        }

    @classmethod
    def from_wire(cls, value: Any) -> SlotMap:
        """Parse :meth:`to_wire`'s shape.

        Raises:
            ValueError: the value is not a well-formed slot map (a sentence says why).
        """
        if not isinstance(value, dict):
            raise ValueError("a slot map must be a map")
        if value.get("slots") != SLOT_COUNT:
            raise ValueError(
                f"the slot map counts {value.get('slots')!r} slots; this client knows {SLOT_COUNT}"
            )
        version, ranges, shards = value.get("version"), value.get("ranges"), value.get("shards")
        if type(version) is not int or not isinstance(ranges, list):
            raise ValueError("a slot map needs an integer version and a list of ranges")
        if not isinstance(shards, list) or not all(isinstance(a, str) for a in shards):
            raise ValueError("a slot map's shards must be a list of addresses")
        parsed: list[tuple[int, int, int]] = []
        for entry in ranges:
            if (
                not isinstance(entry, list)
                or len(entry) != 3
                or not all(type(x) is int for x in entry)
            ):
                raise ValueError("each slot range must be [start, end, shard] integers")
            parsed.append((entry[0], entry[1], entry[2]))
        return cls(version, tuple(parsed), tuple(shards))


def _map_problem(version: int, ranges: Sequence[tuple[int, int, int]], shards: int) -> str | None:
    if version < 1:
        return f"slot map version must be >= 1, got {version}"
    if not 1 <= shards <= MAX_SHARDS:
        return f"a slot map names 1 to {MAX_SHARDS} shards, got {shards}"
    expected = 0
    for start, end, shard in ranges:
        if start != expected or end <= start:
            return f"slot ranges must be contiguous from 0: range [{start}, {end}) after {expected}"
        if not 0 <= shard < shards:
            return f"slot range [{start}, {end}) names shard {shard}; there are {shards}"
        expected = end
    if expected != SLOT_COUNT:
        return f"slot ranges end at {expected}, not at {SLOT_COUNT}"
    return None


def even_ranges(shard_count: int) -> tuple[tuple[int, int, int], ...]:
    """Contiguous ranges giving shard ``k`` slots ``[k*S//n, (k+1)*S//n)``.

    Raises:
        ValueError: ``shard_count`` is not in ``[1, MAX_SHARDS]``.
    """
    if not 1 <= shard_count <= MAX_SHARDS:
        raise ValueError(f"shard count must be 1 to {MAX_SHARDS}, got {shard_count}")
    return tuple(
        (k * SLOT_COUNT // shard_count, (k + 1) * SLOT_COUNT // shard_count, k)
        for k in range(shard_count)
    )


def even_map(addresses: Sequence[str]) -> SlotMap:
    """Version-1 map spreading the slots evenly over ``addresses`` (one per shard)."""
    return SlotMap(1, even_ranges(len(addresses)), tuple(addresses))
