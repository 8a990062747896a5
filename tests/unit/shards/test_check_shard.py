"""WRONG_SHARD on PUBLISH: the first foreign item is named, whatever runs of one topic
come before it (the gateway hashes each run of one topic once)."""

from __future__ import annotations

from typing import Any

import pytest

from futureq.broker.gateway import check_shard
from futureq.errors import ErrorCode, WrongShardError
from futureq.shards.layout import ShardRole
from futureq.shards.slots import even_map
from futureq.wire import frames

ADDRESSES = ["127.0.0.1:7450", "127.0.0.1:7550"]
SLOT_MAP = even_map(ADDRESSES)
OURS = [t for t in (f"t{i}" for i in range(200)) if SLOT_MAP.shard_of(t) == 0][:2]
FOREIGN = [t for t in (f"t{i}" for i in range(200)) if SLOT_MAP.shard_of(t) == 1][:2]
A, B = OURS
X, Y = FOREIGN
SHARD_0 = ShardRole(0, SLOT_MAP)


def _publish(topics: list[Any]) -> frames.Publish:
    items: list[Any] = [
        [t, b"p", None, None, None] if isinstance(t, str) else t for t in topics
    ]
    return frames.Publish(1, frames.AckLevel.QUORUM, items)


def _refused_at(topics: list[Any]) -> int | None:
    with pytest.raises(WrongShardError) as refused:
        check_shard(SHARD_0, _publish(topics))
    assert refused.value.code == ErrorCode.WRONG_SHARD
    assert refused.value.address == ADDRESSES[1]
    return refused.value.item_index


@pytest.mark.parametrize(
    ("topics", "index"),
    [
        ([X], 0),
        ([A, A, A, X], 3),
        ([A, X, A, X], 1),
        ([A, A, B, B, X, X], 4),
        ([A, B, A, B, A, Y], 5),
        ([A, 5, [], A, X], 4),  # malformed items are the codec's business, not a topic
        ([A] * 100 + [X] + [A] * 10, 100),
    ],
)
def test_the_first_foreign_item_is_named(topics: list[Any], index: int) -> None:
    assert _refused_at(topics) == index


@pytest.mark.parametrize("topics", [[A], [A] * 100, [A, B, A, B], [A, 5, B, [], A]])
def test_a_batch_of_our_topics_passes(topics: list[Any]) -> None:
    check_shard(SHARD_0, _publish(topics))


def test_the_foreign_topic_of_a_repeated_run_is_named_in_the_message() -> None:
    with pytest.raises(WrongShardError) as refused:
        check_shard(SHARD_0, _publish([A, A, Y, Y]))
    assert Y in refused.value.message and "shard 1" in refused.value.message
