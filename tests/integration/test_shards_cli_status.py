"""``futureq-cli status`` on a sharded node shows every shard's Raft group (issue 15).

Issue 15: "status ... aggregate the shards of a node (with a per-shard breakdown)".
Before, the text output printed only shard 0's role and leader in its first line (as if
the node were one group) and no line per shard; ``--json`` had the breakdown. Real
``futureq start --shards 2`` on 127.0.0.1.
"""

from __future__ import annotations

import json

from test_shards import TOPICS, ShardedNode, cli
from test_shards import node as node  # the fixture: one sharded node

from futureq.shards.slots import even_map


def test_status_text_has_a_row_per_shard_with_its_leader_and_topics(node: ShardedNode) -> None:
    slot_map = even_map(node.shard_addresses)
    on_one = [t for t in TOPICS if slot_map.shard_of(t) == 1][:3]
    on_zero = [t for t in TOPICS if slot_map.shard_of(t) == 0][:2]
    for topic in on_one + on_zero:
        assert cli(node.client_address, "group", "create", topic, "g").returncode == 0
    shown = cli(node.client_address, "status")
    assert shown.returncode == 0, shown.stderr
    first = shown.stdout.splitlines()[0]
    assert first.endswith("; shard 0's Raft group (every shard's in the shards table)"), first
    table = shown.stdout[shown.stdout.index("shards") : shown.stdout.index("consumer groups")]
    rows = {
        line.split()[1]: line
        for line in table.splitlines()
        if line.split()[1:2] in (["0"], ["1"])  # "│ 0 │ 127.0.0.1:... │ ..."
    }
    assert set(rows) == {"0", "1"}, table
    for shard, address in enumerate(node.shard_addresses):
        # One node: each shard leads its own group, so its row names itself as leader.
        cells = [cell.strip() for cell in rows[str(shard)].split("│")]
        assert cells[2:4] == [address, "leader"], table
        assert cells[5] == address, table
    assert rows["0"].split("│")[-2].strip() == str(len(on_zero)), table
    assert rows["1"].split("│")[-2].strip() == str(len(on_one)), table
    # The JSON holds the same breakdown.
    answer = json.loads(cli(node.client_address, "status", "--json").stdout)
    assert [row["topics"] for row in answer["shards"]] == [len(on_zero), len(on_one)]
