"""The ``futureq`` command line: flags, help text, check-config, exit codes."""

from __future__ import annotations

import json
import pathlib
import tomllib

import attrs
import pytest

from futureq import __version__
from futureq.cli import server_main
from futureq.config import AUTO_SHARDS, Config
from futureq.config_loader import load_config

START_FLAGS = (
    "--config",
    "--data-dir",
    "--listen",
    "--http",
    "--node-id",
    "--advertise",
    "--log-level",
    "--tls-cert",
    "--tls-key",
    "--tls-ca",
    "--no-fsync",
)


def test_start_help_lists_every_flag_with_its_key_and_env_var(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert server_main.main(["start", "--help"]) == 0
    # argparse wraps lines; compare with whitespace collapsed.
    help_text = " ".join(capsys.readouterr().out.split())
    for flag in START_FLAGS:
        assert flag in help_text
    for spec in server_main._FLAGS:
        assert f"config {spec.section}.{spec.key}" in help_text
        assert f"FUTUREQ_{spec.section.upper()}_{spec.key.upper()}" in help_text
    assert "default: ./data" in help_text
    assert "default: 127.0.0.1:7450" in help_text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert server_main.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"futureq {__version__}"


def test_no_command_prints_usage_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert server_main.main([]) == 2
    assert "start" in capsys.readouterr().err


def test_check_config_prints_the_effective_config_as_toml(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "futureq.toml"
    path.write_text('[server]\nnode_id = 2\nauth_token = "secret"\n')
    monkeypatch.setenv("FUTUREQ_QUEUE_MAX_DELIVERIES", "5")
    code = server_main.main(
        ["check-config", "--config", str(path), "--no-fsync", "--listen", "127.0.0.1:9000"]
    )
    assert code == 0
    printed = tomllib.loads(capsys.readouterr().out)
    assert printed["server"]["node_id"] == 2
    assert printed["server"]["listen"] == "127.0.0.1:9000"
    assert printed["server"]["auth_token"] == "<redacted>"
    assert printed["queue"]["max_deliveries"] == 5
    assert printed["storage"]["fsync"] is False
    assert "advertise" not in printed["server"]  # unset keys are comments


def test_check_config_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert server_main.main(["check-config", "--json"]) == 0
    expected = attrs.asdict(Config())
    expected["node"]["shards"] = "auto"  # the default, written as the file and flag take it
    assert json.loads(capsys.readouterr().out) == expected


def test_check_config_prints_the_default_shard_count_as_auto_and_reads_it_back(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert server_main.main(["check-config"]) == 0
    printed = capsys.readouterr().out
    assert tomllib.loads(printed)["node"]["shards"] == "auto"
    path = tmp_path / "futureq.toml"
    path.write_text(printed)
    assert load_config(str(path), env={}).node.shards == AUTO_SHARDS


def test_check_config_reads_the_config_env_variable(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "futureq.toml"
    path.write_text("[server]\nnode_id = 4\n")
    monkeypatch.setenv("FUTUREQ_CONFIG", str(path))
    assert server_main.main(["check-config"]) == 0
    assert tomllib.loads(capsys.readouterr().out)["server"]["node_id"] == 4


def test_check_config_on_a_bad_file_exits_2_with_every_problem(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "futureq.toml"
    path.write_text('[server]\nnode_id = 0\n[limits]\nmax_payload_bytes = "huge"\n')
    assert server_main.main(["check-config", "--config", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "server.node_id = 0" in captured.err
    assert "limits.max_payload_bytes = 'huge'" in captured.err
    assert captured.err.startswith("futureq: invalid configuration (2 problems)")


def test_start_with_a_bad_config_exits_2_before_starting_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert server_main.main(["start", "--listen", "nowhere"]) == 2
    assert "server.listen = 'nowhere' (from command line)" in capsys.readouterr().err


def test_bad_flag_type_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert server_main.main(["start", "--node-id", "one"]) == 2
    assert "--node-id" in capsys.readouterr().err


def test_start_runs_the_server_with_the_loaded_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    seen: list[Config] = []

    def fake_run_server(config: Config) -> int:
        seen.append(config)
        return 7

    monkeypatch.setattr(server_main, "run_server", fake_run_server)
    monkeypatch.setattr(server_main, "setup_logging", lambda level, **kwargs: None)
    # --shards 1: the default (auto) would run a supervisor of one shard per core here.
    code = server_main.main(
        ["start", "--data-dir", str(tmp_path), "--node-id", "3", "--shards", "1"]
    )
    assert code == 7
    [config] = seen
    assert config.server.data_dir == str(tmp_path)
    assert config.server.node_id == 3
