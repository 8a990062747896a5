"""A shard port layout that collides with itself (shard K's port is another shard's) is a
configuration problem: ``check-config`` and ``start`` exit 2 naming the ports and
settings, not 0 and then 4 "Address already in use ... or free that port"."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from futureq.config_loader import load_config
from futureq.errors import ConfigError


def layout(stride: int | None, shards: int, **cluster: object) -> dict[str, dict[str, object]]:
    """Client 7474, HTTP 7475, Raft 7477; ``stride`` None: not given here."""
    return {
        "server": {"listen": "127.0.0.1:7474", "http": "127.0.0.1:7475"},
        "cluster": {"raft_listen": "127.0.0.1:7477", **cluster},
        "node": {"shards": shards, "shard_port_stride": stride},
    }


def test_a_stride_that_puts_a_shards_client_port_on_another_shards_http_port_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(env={"FUTUREQ_NODE_SHARD_PORT_STRIDE": "1"}, overrides=layout(None, 2))
    message = str(caught.value)
    assert "node.shard_port_stride = 1 (from environment variable" in message, message
    assert "shard 1's client port (server.listen 7474 + 1 * 1 = 7475)" in message, message
    assert "shard 0's HTTP port (server.http 7475)" in message, message


def test_a_raft_port_collision_is_refused_in_a_cluster() -> None:
    overrides = layout(3, 3, peers="1=127.0.0.1:7477", insecure_peers=True)
    with pytest.raises(ConfigError, match=r"shard 0's Raft port \(cluster.raft_listen 7477\)"):
        load_config(env={}, overrides=overrides)


@pytest.mark.parametrize(("stride", "shards"), [(2, 2), (4, 3), (100, 8), (1, 1)])
def test_strides_that_keep_the_shards_apart_pass(stride: int, shards: int) -> None:
    config = load_config(env={}, overrides=layout(stride, shards))
    assert config.node.shard_port_stride == stride


def test_start_and_check_config_exit_2_for_colliding_shard_ports(tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "FUTUREQ_NODE_SHARD_PORT_STRIDE": "1"}
    flags = ["--shards", "2", "--data-dir", str(tmp_path / "data"), "--listen",
             "127.0.0.1:7474", "--http", "127.0.0.1:7475"]  # fmt: skip
    for command in ("check-config", "start"):
        done = subprocess.run(
            [sys.executable, "-m", "futureq.cli.server_main", command, *flags],
            capture_output=True, text=True, timeout=60, check=False, env=env,
        )  # fmt: skip
        assert done.returncode == 2, (command, done.stdout + done.stderr)
        assert "node.shard_port_stride" in done.stderr and "7475" in done.stderr, done.stderr
    assert not (tmp_path / "data").exists(), "nothing was created"
