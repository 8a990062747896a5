"""A sharded node's client when one shard refuses, hangs or answers for another node.

Faults found by trying a node of 2 shards as an operator would: ``publish --file``
stored one shard's lines again after the other shard refused a line; one stopped
(SIGSTOP) shard kept every new client and CLI command from starting; node-wide calls
raised a bare exception group; ``cluster status`` paired the asked node's address with
the leader's answer. Real ``futureq start --shards 2`` and ``futureq-cli`` processes on
127.0.0.1, no mocks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_shards import TOPICS, ShardedNode, cli

from futureq.shards.slots import even_map

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[ShardedNode]:
    made = ShardedNode(tmp_path / "data")
    made.start()
    yield made
    if made.process is not None and made.process.poll() is None:
        made.terminate()
    made.kill()


def _topic_of_shard(node: ShardedNode, shard: int, prefix: str = "") -> str:
    slot_map = even_map(node.shard_addresses)
    return next(f"{prefix}{t}" for t in TOPICS if slot_map.shard_of(f"{prefix}{t}") == shard)


def _pending(node: ShardedNode, topic: str) -> list[str]:
    """The payloads stored for ``topic`` (``futureq-cli browse --json``)."""
    done = cli(node.client_address, "browse", topic, "--preview", "100", "--json")
    assert done.returncode == 0, done.stderr
    return [json.loads(line)["preview"] for line in done.stdout.splitlines() if line.strip()]


def test_publish_file_never_resends_what_another_shard_stored(
    node: ShardedNode, tmp_path: Path
) -> None:
    """docs/cli.md: a refused line is reported and the rest of its batch is sent again
    without it; duplicates come only from a lost connection. Before, the shard-0 line
    was stored once per refused shard-1 line (5 times) and the summary said 1."""
    good0 = _topic_of_shard(node, 0, "good.")
    good1 = _topic_of_shard(node, 1, "good.")
    bad1 = _topic_of_shard(node, 1, "bad.")
    for topic in (good0, good1):
        assert cli(node.client_address, "group", "create", topic, "g").returncode == 0
    refused = '{"topic":"%s","payload":"bad%d","headers":{"futureq-x":"1"}}\n'
    lines = (
        f'{{"topic":"{good0}","payload":"g0"}}\n'
        + "".join(refused % (bad1, i) for i in range(4))
        + f'{{"topic":"{good1}","payload":"g1"}}\n'
    )
    batch = tmp_path / "mixed.jsonl"
    batch.write_text(lines)
    done = cli(node.client_address, "publish", "--file", str(batch))
    assert done.returncode != 0
    assert done.stdout.startswith("published 2 message(s) in"), done.stdout
    assert "4 failed line(s)" in done.stdout
    assert [line.split(":")[0] for line in done.stderr.splitlines()] == [
        "line 2",
        "line 3",
        "line 4",
        "line 5",
    ]
    assert _pending(node, good0) == ["g0"]
    assert _pending(node, good1) == ["g1"]
