"""The slot rule: every slot owned once, X and X.dlq together, the same in every process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from futureq.shards.slots import (
    MAX_SHARDS,
    SLOT_COUNT,
    SlotMap,
    even_map,
    even_ranges,
    topic_slot,
)

TOPICS = [f"orders.{i}" for i in range(300)] + ["a", "", "é.ü", "x" * 300, "dlq", ".dlq"]


@pytest.mark.parametrize("shards", [1, 2, 3, 7, 16, MAX_SHARDS])
def test_every_slot_has_exactly_one_shard(shards: int) -> None:
    owners: list[int] = []
    for start, end, shard in even_ranges(shards):
        owners.extend([shard] * (end - start))
    assert len(owners) == SLOT_COUNT
    assert sorted(set(owners)) == list(range(shards))
    slot_map = even_map([f"h:{k}" for k in range(shards)])
    assert [slot_map.shard_of_slot(s) for s in range(SLOT_COUNT)] == owners


@pytest.mark.parametrize("shards", [2, 3, 5])
def test_a_topic_and_its_dead_letter_topic_share_a_shard(shards: int) -> None:
    slot_map = even_map([f"h:{k}" for k in range(shards)])
    for topic in TOPICS:
        assert topic_slot(topic + ".dlq") == topic_slot(topic)
        assert slot_map.shard_of(topic + ".dlq") == slot_map.shard_of(topic)


def test_every_dlq_suffix_is_stripped() -> None:
    """A dead-letter topic's own dead letters stay with it too."""
    assert topic_slot("t.dlq.dlq") == topic_slot("t.dlq") == topic_slot("t")


@pytest.mark.parametrize("pattern", ["t{}", "orders.{}", "topic-{}", "{}"])
def test_names_differing_in_one_character_spread_over_the_shards(pattern: str) -> None:
    """crc32 failed this: t0..t9 all landed on one shard of two."""
    slot_map = even_map(["h:1", "h:2"])
    for count in (10, 40):
        shards = [slot_map.shard_of(pattern.format(i)) for i in range(count)]
        assert 0 < sum(shards) < count, (pattern, count, shards)
    counts = [0, 0]
    for topic in TOPICS:
        counts[slot_map.shard_of(topic)] += 1
    assert min(counts) > len(TOPICS) // 4


def test_slots_are_the_same_in_another_process() -> None:
    """Python's str hash is salted per process; the slot rule must not be."""
    code = (
        f"from futureq.shards.slots import topic_slot\nprint([topic_slot(t) for t in {TOPICS!r}])"
    )
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
        ).stdout
        assert out.strip() == str([topic_slot(t) for t in TOPICS])


def test_known_slot_values_never_change() -> None:
    """Clients in other languages compute the same numbers: md5's first 2 bytes % 1024."""
    assert topic_slot("a") == 0x0CC1 % 1024  # md5("a") = 0cc175b9...
    assert topic_slot("") == 0xD41D % 1024  # md5("") = d41d8cd9...
    assert topic_slot("orders") == topic_slot("orders.dlq")


def test_the_map_survives_the_wire() -> None:
    slot_map = even_map(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"])
    assert SlotMap.from_wire(slot_map.to_wire()) == slot_map


@pytest.mark.parametrize(
    ("ranges", "shards", "words"),
    [
        (((0, 512, 0),), 1, "end at 512"),
        (((0, 512, 0), (500, 1024, 1)), 2, "contiguous"),
        (((0, 1024, 2),), 2, "names shard 2"),
        ((), 1, "end at 0"),
    ],
)
def test_a_bad_map_is_refused_with_a_reason(
    ranges: tuple[tuple[int, int, int], ...], shards: int, words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        SlotMap(1, ranges, tuple(f"h:{k}" for k in range(shards)))


def test_from_wire_refuses_another_slot_count() -> None:
    wire = even_map(["h:1"]).to_wire()
    wire["slots"] = 16384
    with pytest.raises(ValueError, match="16384 slots"):
        SlotMap.from_wire(wire)
