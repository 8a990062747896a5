"""WRONG_SHARD on PUBLISH: the first foreign item is named, whatever runs of one topic
come before it (the gateway hashes each run of one topic once)."""

from __future__ import annotations

from typing import Any

import pytest

from futureq.broker.shard_requests import check_shard
from futureq.errors import ErrorCode, RequestError, WrongShardError
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
    items: list[Any] = [[t, b"p", None, None, None] if isinstance(t, str) else t for t in topics]
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


def _foreign(names: list[str]) -> list[str]:
    return [name for name in names if SLOT_MAP.shard_of(name) == 1]


BAD_NAMES = [
    n + s for n in ("a b", "_x", "café", "orders.*", "a\nb", "x" * 252) for s in ("", "1", "22")
]
"""Names a breaker sent to the shard that does not own them: answered WRONG_SHARD there
and INVALID_TOPIC by the owner, so the answer depended on the shard asked."""


@pytest.mark.parametrize("topic", _foreign(BAD_NAMES))
def test_a_publish_to_a_name_no_shard_takes_is_refused_as_its_owner_would(topic: str) -> None:
    with pytest.raises(RequestError) as refused:
        check_shard(SHARD_0, _publish([A, topic]))
    assert not isinstance(refused.value, WrongShardError)
    assert (refused.value.code, refused.value.item_index) == (ErrorCode.INVALID_TOPIC, 1)


def test_a_publish_to_a_foreign_dead_letter_topic_is_refused_as_reserved() -> None:
    [dlq] = _foreign([f"{X}{i}.dlq" for i in range(40)])[:1]
    with pytest.raises(RequestError) as refused:
        check_shard(SHARD_0, _publish([dlq]))
    assert refused.value.code == ErrorCode.RESERVED_TOPIC


@pytest.mark.parametrize(
    ("topic", "code"),
    [
        *((name, ErrorCode.INVALID_TOPIC) for name in _foreign(["a\nb", "a\nbc", "", "\x00x"])),
        # Printable names outside the grammar too (a breaker: 'a/b', '__x', 'a.', '-a').
        *((name, ErrorCode.INVALID_TOPIC) for name in _foreign(["a b", "a bc", "café", "cafés"])),
        *((name, ErrorCode.INVALID_TOPIC) for name in _foreign(["a/b", "__x", "a.", "-a", "a/"])),
        *((name, ErrorCode.WRONG_SHARD) for name in _foreign(["good", "good1", "ok.dlq", "o.dlq"])),
    ],
)
def test_a_subscribe_to_a_foreign_name_goes_to_its_owner_only_if_it_may_exist(
    topic: str, code: ErrorCode
) -> None:
    with pytest.raises(RequestError) as refused:
        check_shard(SHARD_0, frames.Subscribe(1, topic, "g", 1))
    assert refused.value.code == code


@pytest.mark.parametrize("group", ["bad group!", "", "g" * 300, "_g", "a..b"])
def test_a_foreign_request_naming_an_impossible_group_is_refused_as_its_owner_would(
    group: str,
) -> None:
    """Found by a breaker: the owner answered INVALID_GROUP, the other shard WRONG_SHARD
    (162 combinations of request and name)."""
    for frame in (
        frames.Subscribe(1, X, group, 1),
        frames.GroupCreate(1, X, group, None, None),
        frames.Browse(1, X, group, None, None, None, 10, 0),
        frames.Cancel(1, X, group, [1]),
    ):
        with pytest.raises(RequestError) as refused:
            check_shard(SHARD_0, frame)
        assert refused.value.code == ErrorCode.INVALID_GROUP, (frame, refused.value)


def test_a_foreign_redrive_of_a_dead_letter_topic_is_refused_as_reserved() -> None:
    [dlq] = _foreign([f"{X}{i}.dlq" for i in range(40)])[:1]
    with pytest.raises(RequestError) as refused:
        check_shard(SHARD_0, frames.Redrive(1, dlq, None, [1], 0))
    assert refused.value.code == ErrorCode.RESERVED_TOPIC
