"""A single node starts without loading the Raft machinery it does not run.

Only a cluster uses the consensus core, its message classes, the node adapter and the
peer transport; importing them costs a noticeable share of a single node's start-up
(``docs/architecture.md``, "Start-up"). The node is a real ``futureq start``
subprocess run with ``PYTHONPROFILEIMPORTTIME=1``: CPython then reports every module
the process imports on stderr, from start through a served ``/readyz`` to its graceful
shutdown.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from broker_process import BrokerProcess

CLUSTER_ONLY = (
    "futureq.raft.core",
    "futureq.raft.election",
    "futureq.raft.follower",
    "futureq.raft.leader",
    "futureq.raft.read_index",
    "futureq.raft.recovery_steps",
    "futureq.raft.replication",
    "futureq.raft.terms",
    "futureq.raft.values",
    "futureq.raft.messages",
    "futureq.raft.payload_codec",
    "futureq.raft.message_codec",
    "futureq.raft.node",
    "futureq.raft.node_config",
    "futureq.raft.node_driver",
    "futureq.raft.node_ops",
    "futureq.raft.node_ready",
    "futureq.raft.transport",
    "futureq.raft.rocks_storage",
    "futureq.raft.peer_auth",
    "futureq.broker.cluster",
)
_IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)\s*$", re.MULTILINE)


def test_single_node_start_does_not_import_the_raft_core(tmp_path: Path) -> None:
    node = BrokerProcess(tmp_path / "data", env={"PYTHONPROFILEIMPORTTIME": "1"})
    node.start()
    try:
        url = f"http://{node.http_address}/readyz"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
    finally:
        assert node.terminate() == 0
    imported = set(_IMPORT_LINE.findall(node.stderr_text()))
    # The report covers the node's own modules, Raft ones included (the cluster clock
    # ticks a single node's cluster time too): a missing name below means "not imported".
    assert {"futureq.broker.http", "futureq.raft.cluster_clock"} <= imported
    assert sorted(imported & set(CLUSTER_ONLY)) == []
