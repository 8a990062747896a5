"""A joining node compares its shard layout with the member it asks (``--join``).

Source: docs/sharding.md, "Agreement between nodes". The end-to-end refusal, with real
processes, is ``tests/integration/test_shards.py::test_joining_with_another_shard_count_is_refused``.
"""

from __future__ import annotations

import pytest

from futureq.broker.cluster import check_join_shards, shard_layout
from futureq.config import Config
from futureq.config_loader import load_config
from futureq.errors import ConfigError
from futureq.raft.peer_auth import ShardLayout
from futureq.shards.layout import shard_role


def joining(shards: int, stride: int = 100) -> Config:
    return load_config(
        None,
        env={},
        overrides={
            "server": {"listen": "127.0.0.1:17450", "http": "127.0.0.1:17452"},
            "cluster": {
                "join": "10.0.0.1:7450",
                "raft_listen": "127.0.0.1:17451",
                "insecure_peers": True,
            },
            "node": {"shards": shards, "shard_port_stride": stride},
        },
    )


def test_the_layout_announced_is_the_nodes() -> None:
    assert shard_layout(None) == ShardLayout()
    assert shard_layout(shard_role(joining(3, 7), 2)) == ShardLayout(3, 2, 1, 7)


def test_the_same_layout_joins() -> None:
    check_join_shards(joining(1), ShardLayout(), 1, 1)
    check_join_shards(joining(2), ShardLayout(2, 1), 2, 1, 100)
    check_join_shards(joining(1), ShardLayout(), 1, 1, 5)  # a stride means nothing with 1


@pytest.mark.parametrize(
    ("ours", "theirs", "version", "stride", "sentence"),
    [
        (ShardLayout(3), 2, 1, 100, "runs 2 shard(s) per node and this node 3: .* --shards 2"),
        (ShardLayout(), 2, 1, 100, "runs 2 shard(s) per node and this node 1:"),
        (ShardLayout(2), 1, 1, None, "runs 1 shard(s) per node and this node 2:"),
        (ShardLayout(2), 2, 2, 100, "slot map version 2 and this node version 1"),
        (ShardLayout(2), 2, 1, 50, "shard_port_stride 50 and this node 100"),
    ],
)
def test_another_count_slot_map_or_stride_is_refused(
    ours: ShardLayout, theirs: int, version: int, stride: int | None, sentence: str
) -> None:
    with pytest.raises(ConfigError, match=sentence.replace("(s)", r"\(s\)")):
        check_join_shards(joining(ours.shards), ours, theirs, version, stride)
