"""``node.shards = auto``: the count recorded in the data directory, else the cores."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from futureq.config import AUTO_SHARDS, Config
from futureq.config_cross_checks import shard_port_problems
from futureq.config_loader import load_config
from futureq.errors import ConfigError
from futureq.shards.layout import (
    check_shard_count,
    read_stamp,
    resolve_shard_count,
    usable_cores,
)
from futureq.shards.slots import MAX_SHARDS


def auto(data_dir: Path, **server: str) -> Config:
    return load_config(
        None,
        env={},
        overrides={
            "server": {"data_dir": str(data_dir), "listen": "127.0.0.1:17450", **server},
            "node": {"shards": AUTO_SHARDS},
        },
    )


def test_auto_is_read_from_toml_env_and_flags(tmp_path: Path) -> None:
    toml = tmp_path / "futureq.toml"
    toml.write_text('[node]\nshards = "auto"\n')
    assert load_config(str(toml), env={}).node.shards == AUTO_SHARDS
    assert load_config(None, env={"FUTUREQ_SHARDS": "auto"}).node.shards == AUTO_SHARDS
    for bad in ("many", "-1"):
        with pytest.raises(ConfigError, match="or auto"):
            load_config(None, env={"FUTUREQ_SHARDS": bad})


def test_zero_shards_written_anywhere_is_refused_not_taken_for_auto(tmp_path: Path) -> None:
    """0 is how ``auto`` is held inside; a 0 a user writes is a mistake with a sentence
    (before, ``shards = 0``, ``FUTUREQ_SHARDS=0`` and ``--shards 0`` all silently ran
    one shard per core)."""
    toml = tmp_path / "futureq.toml"
    toml.write_text("[node]\nshards = 0\n")
    with pytest.raises(ConfigError, match=r"node.shards = 0 \(from .*futureq.toml\).*not a count"):
        load_config(str(toml), env={})
    for text in ("0", "00", " 0"):
        with pytest.raises(ConfigError, match="FUTUREQ_SHARDS.*0 is not a count"):
            load_config(None, env={"FUTUREQ_SHARDS": text})
    with pytest.raises(ConfigError, match="FUTUREQ_NODE_SHARDS.*0 is not a count"):
        load_config(None, env={"FUTUREQ_NODE_SHARDS": "0"})
    # A later source with a real count wins over the file's 0.
    assert load_config(str(toml), env={"FUTUREQ_SHARDS": "2"}).node.shards == 2


def test_the_two_shard_variables_must_agree() -> None:
    """FUTUREQ_SHARDS and FUTUREQ_NODE_SHARDS both set node.shards; before, when they
    differed, FUTUREQ_SHARDS silently won (its name sorts last)."""
    for short, long in (("2", "3"), ("3", "2"), ("auto", "2")):
        with pytest.raises(ConfigError, match="FUTUREQ_SHARDS=.*FUTUREQ_NODE_SHARDS=.*disagree"):
            load_config(None, env={"FUTUREQ_SHARDS": short, "FUTUREQ_NODE_SHARDS": long})
    same = load_config(None, env={"FUTUREQ_SHARDS": "2", "FUTUREQ_NODE_SHARDS": " 2"})
    assert same.node.shards == 2


def test_zero_shards_on_the_command_line_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from futureq.cli import server_main

    assert server_main.main(["check-config", "--shards", "0"]) == 2
    assert "0 is not a number of shards; give 1 to 64, or auto" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["two", "0", "-2", "65", "99", ""])
def test_a_damaged_stamp_is_refused_with_a_sentence(tmp_path: Path, text: str) -> None:
    """Before, 0 or -2 ran one process writing its data beside the stamp and 99 started
    99 shard processes, then failed with a traceback (the slot map holds 64 at most)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "SHARDS").write_text(f"{text}\n")
    sentence = rf"SHARDS should hold the node's shard count \(1 to {MAX_SHARDS}.*not {text!r}"
    with pytest.raises(ConfigError, match=sentence):
        read_stamp(str(data))
    with pytest.raises(ConfigError, match=sentence):
        resolve_shard_count(auto(data))
    assert sorted(p.name for p in data.iterdir()) == ["SHARDS"], "nothing written"


def test_a_new_directory_gets_the_cores_and_keeps_them_once_stamped(tmp_path: Path) -> None:
    data = tmp_path / "data"
    resolved = resolve_shard_count(auto(data))
    cores = min(usable_cores(), MAX_SHARDS)
    assert resolved.node.shards == cores >= 1
    check_shard_count(resolved)
    assert read_stamp(str(data)) == (cores if cores > 1 else None)
    # Another machine later: a stamp wins over the cores.
    (data / "SHARDS").write_text("3\n")
    assert resolve_shard_count(auto(data)).node.shards == 3
    # An explicit count is never replaced.
    explicit = attrs.evolve(resolved, node=attrs.evolve(resolved.node, shards=5))
    assert resolve_shard_count(explicit).node.shards == 5


def test_a_single_nodes_existing_data_stays_one_shard(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "CURRENT").write_text("MANIFEST-000001\n")  # RocksDB's: data, no stamp
    assert resolve_shard_count(auto(data)).node.shards == 1


def test_auto_with_os_chosen_ports_runs_shards_alone_and_says_what_to_fix_in_a_cluster(
    tmp_path: Path,
) -> None:
    cores = min(usable_cores(), MAX_SHARDS)
    # A node without peers: the supervisor binds every shard's ports (port 0 is fine).
    alone = resolve_shard_count(auto(tmp_path / "data", http="127.0.0.1:0"))
    assert alone.node.shards == cores
    if cores == 1:
        pytest.skip("one core: auto chooses 1 shard, which any port suits")
    # In a cluster peers and clients find shard K by its port: fixed ports needed.
    clustered = load_config(
        None,
        env={},
        overrides={
            "server": {"data_dir": str(tmp_path / "c"), "listen": "127.0.0.1:0"},
            "cluster": {"peers": "1=127.0.0.1:17451", "raft_listen": "127.0.0.1:17451",
                        "insecure_peers": True},
            "node": {"shards": AUTO_SHARDS},
        },
    )  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"chose \d+ shards .*fixed port in a cluster.* --shards 1"
    ):
        resolve_shard_count(clustered)
    # Ports too high for every shard: the sentence says what to lower, and nothing of
    # the OS choosing ports (before, its remedy was port 0's whatever the problem).
    with pytest.raises(ConfigError) as high:
        resolve_shard_count(auto(tmp_path / "high", listen="127.0.0.1:65480"))
    assert "server.listen = '127.0.0.1:65480': leaves no room for" in str(high.value)
    assert str(high.value).endswith(
        "lower the port or node.shard_port_stride; or run the node as one process with "
        "--shards 1 (node.shards = 1)"
    ), str(high.value)
    assert not (tmp_path / "high").exists()
    explicit = attrs.evolve(clustered, node=attrs.evolve(clustered.node, shards=2))
    problems = shard_port_problems(explicit)
    assert problems and "server.listen = '127.0.0.1:0'" in problems[0]
    assert not shard_port_problems(attrs.evolve(alone, node=attrs.evolve(alone.node, shards=2)))
