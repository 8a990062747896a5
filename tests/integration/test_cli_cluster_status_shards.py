"""``futureq-cli cluster status`` on a sharded node names every shard.

Before, the text output was shard 0's group alone (``--json`` had the shards): on a
cluster of sharded nodes, where shard 1 is led by another node once leaders are
balanced, a user could not see who leads which shard. Real ``futureq start --shards 2``
and ``futureq-cli`` processes on 127.0.0.1.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from broker_process import BrokerProcess

STRIDE = 100


def test_cluster_status_lists_every_shard(tmp_path: Path) -> None:
    node = BrokerProcess(tmp_path / "data", shards="2")
    node.start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FUTUREQ_")}
        done = subprocess.run(
            [sys.executable, "-m", "futureq.cli.client_main", "--server", node.client_address,
             "cluster", "status"],
            capture_output=True, text=True, timeout=60, check=False, env={**env, "COLUMNS": "200"},
        )  # fmt: skip
    finally:
        node.terminate()
    assert done.returncode == 0, done.stderr
    host, port = node.client_address.rsplit(":", 1)
    assert "shards" in done.stdout, done.stdout
    for shard in (0, 1):
        address = f"{host}:{int(port) + shard * STRIDE}"
        assert re.search(rf"│\s+{shard} │ {re.escape(address)} │\s+leader │", done.stdout), (
            done.stdout
        )
