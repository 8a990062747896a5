"""``make cluster`` (futureq.cli.local_cluster) starts nodes that authenticate their peers
with a secret kept in the cluster's data directory."""

from __future__ import annotations

import os
import pathlib

import pytest

from futureq.cli import local_cluster, server_main


def test_local_cluster_nodes_share_a_private_secret(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in list(os.environ):
        if name.startswith("FUTUREQ_"):
            monkeypatch.delenv(name)
    data_dir = str(tmp_path / "data-cluster")
    path = local_cluster.ensure_secret(data_dir)
    secret = pathlib.Path(path).read_bytes()
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert local_cluster.ensure_secret(data_dir) == path  # kept across runs
    assert pathlib.Path(path).read_bytes() == secret
    for node_id in (1, 2, 3):
        command = local_cluster.node_command(node_id, 3, data_dir, "127.0.0.1")
        assert command[command.index("--cluster-secret-file") + 1] == path
        # The same flags pass the start-up checks (check-config loads exactly as start).
        start = command.index("start")
        assert server_main.main(["check-config", *command[start + 1 :]]) == 0
    capsys.readouterr()


def test_local_cluster_passes_the_shard_count_to_every_node(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in list(os.environ):
        if name.startswith("FUTUREQ_"):
            monkeypatch.delenv(name)
    data_dir = str(tmp_path / "data-cluster")
    local_cluster.ensure_secret(data_dir)
    for node_id in (1, 2, 3):
        command = local_cluster.node_command(node_id, 3, data_dir, "127.0.0.1", shards="2")
        assert command[command.index("--shards") + 1] == "2"
        start = command.index("start")
        assert server_main.main(["check-config", "--json", *command[start + 1 :]]) == 0
        assert '"shards": 2' in capsys.readouterr().out
    # The default: auto, as futureq start, always given so that every node runs the same.
    command = local_cluster.node_command(1, 3, data_dir, "127.0.0.1")
    assert command[command.index("--shards") + 1] == "auto"
    assert server_main.main(["check-config", "--json", *command[command.index("start") + 1 :]]) == 0
    assert '"shards": "auto"' in capsys.readouterr().out
    for bad in ("0", "two", "-1"):
        with pytest.raises(SystemExit):
            local_cluster.main(["--shards", bad])
    assert "is not a number of shards" in capsys.readouterr().err
