"""Status that means what it says, against a real 3-node cluster: from any node,
``futureq-cli status`` and ``cluster status`` show the leader's numbers (the client asks
the leader) or say plainly that they are one node's local view."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from cluster_process import Cluster
from wire_client import WireClient

from futureq.wire import frames


def cli(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "futureq.cli.client_main", "--server", address, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def group_of(status: dict[str, Any], topic: str, group: str) -> dict[str, Any]:
    for entry in status["topics"]:
        for found in entry["groups"]:
            if (entry["topic"], found["group"]) == (topic, group):
                return dict(found)
    raise AssertionError(f"{topic}/{group} not in {status}")


def test_status_from_a_follower_is_the_leaders_or_says_it_is_local(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "cluster", 3)
    cluster.start()
    try:
        leader = cluster.leader()
        follower, other = [n for n in cluster.nodes.values() if n is not leader]
        consumer = WireClient(leader.client_address)
        consumer.subscribe("views.jobs", "workers", prefetch=4)
        answer = consumer.publish([["views.jobs", b"j", 0, None, None]] * 9)
        assert isinstance(answer, frames.PublishOk)
        consumer.deliveries(4)
        truth = group_of(consumer.status(), "views.jobs", "workers")
        # Grows with time (how long the oldest due message has waited): compared apart.
        truth_age_ms = truth.pop("oldest_due_age_ms")
        assert (truth["pending"], truth["due"], truth["in_flight"], truth["consumers"]) == (
            9,
            5,
            4,
            1,
        )

        # Asked of a follower, the CLI shows the leader's numbers, and says so.
        done = cli(follower.client_address, "status", "--json")
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout)
        assert status["view"] == "cluster" and status["node_id"] == leader.node_id
        seen = group_of(status, "views.jobs", "workers")
        assert seen.pop("oldest_due_age_ms") >= truth_age_ms
        assert seen == truth
        text = cli(follower.client_address, "status")
        assert (
            text.stdout.splitlines()[0] == f"cluster view, from the leader (node {leader.node_id})"
        )

        # --local: the follower's own view, marked as such, naming what it cannot know.
        done = cli(follower.client_address, "status", "--local", "--json")
        local = json.loads(done.stdout)
        assert local["view"] == "local" and local["node_id"] == follower.node_id
        assert local["leader_only"] == ["due", "in_flight", "consumers"]
        assert local["leader_id"] == leader.node_id
        assert group_of(local, "views.jobs", "workers")["pending"] == 9  # replicated
        first = cli(follower.client_address, "status", "--local").stdout.splitlines()[0]
        assert first.startswith(f"LOCAL VIEW of node {follower.node_id} (follower): due, in flight")
        assert f"the leader is node {leader.node_id} at {leader.client_address}" in first
        listed = cli(follower.client_address, "group", "list", "--json")
        assert listed.returncode == 0 and listed.stderr == ""  # the leader's: no warning
        assert [r["in_flight"] for r in json.loads(listed.stdout)] == [4]

        # cluster status from a follower: the leader's member progress.
        done = cli(follower.client_address, "cluster", "status", "--json")
        view = json.loads(done.stdout)
        assert view["role"] == "leader" and view["node_id"] == leader.node_id
        assert all("match_index" in node for node in view["nodes"])
        local_view = json.loads(
            cli(follower.client_address, "cluster", "status", "--local", "--json").stdout
        )
        assert local_view["node_id"] == follower.node_id
        assert not any("match_index" in node for node in local_view["nodes"])
        assert (
            "LOCAL VIEW of node"
            in cli(follower.client_address, "cluster", "status", "--local").stdout
        )

        # No leader at all (two of three gone): the follower's view, which says so.
        consumer.close()
        leader.kill()
        other.kill()
        done = cli(follower.client_address, "--request-timeout", "3s", "status")
        assert done.returncode == 0, done.stderr
        first = done.stdout.splitlines()[0]
        assert first.startswith(f"LOCAL VIEW of node {follower.node_id}"), first
        assert "no leader is known right now" in first or "could not be asked" in first
        # In a cluster every log line names its node.
        logged = follower.stderr_text().splitlines()
        assert logged and all(f" node={follower.node_id} " in line for line in logged[:20])
    finally:
        cluster.stop()


def test_metrics_are_served_as_the_text_format_the_docs_name(broker: Any) -> None:
    """docs/operations.md says text format 0.0.4 (what a sharded node's merged /metrics
    said too); a one-shard node said version=1.0.0, prometheus-client's newest name."""
    with urllib.request.urlopen(f"http://{broker.http_address}/metrics", timeout=5) as answer:
        assert answer.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert b"futureq_published_messages_total" in answer.read()
