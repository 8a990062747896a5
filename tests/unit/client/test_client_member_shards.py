"""Where a sharded client looks for shard K (issue 15): ``member_shards`` (on each node a
shard's HELLO_OK named) and ``public_seeds`` (seeds given as a shard's own port)."""

from __future__ import annotations

from futureq.client._routing import member_shards, public_seeds
from futureq.shards.slots import even_map

MEMBERS = ["10.0.0.1:7550", "10.0.0.2:7550", "[::1]:7550"]
"""Shard 1's client addresses on three nodes (public ports 7450, stride 100)."""


def test_other_shards_of_the_same_nodes() -> None:
    assert member_shards(MEMBERS, 1, 0, 100) == ["10.0.0.1:7450", "10.0.0.2:7450", "[::1]:7450"]
    assert member_shards(MEMBERS, 1, 3, 100) == ["10.0.0.1:7750", "10.0.0.2:7750", "[::1]:7750"]
    assert member_shards(MEMBERS, 1, 1, 100) == MEMBERS


def test_nothing_without_a_stride_or_a_known_answering_shard() -> None:
    assert member_shards(MEMBERS, 1, 0, None) == []
    assert member_shards(MEMBERS, -1, 0, 100) == []


def test_ports_out_of_range_and_bad_addresses_are_skipped() -> None:
    assert member_shards(["h:50", "h:65500", "nonsense"], 1, 0, 100) == ["h:65400"]
    assert member_shards(["h:65500"], 0, 1, 100) == []


def test_a_seed_that_is_a_shards_own_port_counts_as_its_nodes_public_port() -> None:
    slot_map = even_map(["10.0.0.1:7450", "10.0.0.1:7550"])
    seeds = ["10.0.0.1:7450", "10.0.0.1:7550", "10.0.0.2:7450"]
    assert public_seeds(seeds, slot_map, 100) == ["10.0.0.1:7450", "10.0.0.2:7450"]
    assert public_seeds(["10.0.0.1:7550"], slot_map, 100) == ["10.0.0.1:7450"]
    assert public_seeds(seeds, slot_map, None) == seeds
