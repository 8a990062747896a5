"""Every numeric setting has an upper bound: ``queue.visibility_timeout_ms`` no longer
than the protocol's 12 h (``group create --visibility-timeout`` refuses more), and
absurd values elsewhere (horizon_ms = 1e21, write_buffer_mb = 1e8, shutdown_grace_ms =
1e17) are refused by ``check-config`` and ``start`` with exit 2 and a sentence, not
accepted and stored on new groups (docs/operations.md, "Ranges")."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from futureq.config_checks import MAXIMA
from futureq.config_loader import env_var_name, load_config
from futureq.errors import ConfigError
from futureq.wire.validation import MAX_VISIBILITY_TIMEOUT_MS

OPERATIONS = pathlib.Path(__file__).parents[3] / "docs" / "operations.md"


def env_for(dotted: str, value: int) -> dict[str, str]:
    section, _, key = dotted.partition(".")
    return {env_var_name(section, key): str(value)}


@pytest.mark.parametrize(
    ("dotted", "value"),
    [
        ("queue.visibility_timeout_ms", 9223372036854775807),
        ("queue.visibility_timeout_ms", MAX_VISIBILITY_TIMEOUT_MS + 1),
        ("queue.horizon_ms", 10**21),
        ("storage.write_buffer_mb", 10**8),
        ("server.shutdown_grace_ms", 10**17),
    ],
)
def test_the_reported_absurd_values_are_refused(dotted: str, value: int) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(env=env_for(dotted, value))
    most = MAXIMA[dotted][0]
    assert f"{dotted} = {value} (from environment variable" in str(caught.value)
    assert f"must be at most {most}" in str(caught.value)


def test_the_visibility_bound_is_the_protocols() -> None:
    assert MAXIMA["queue.visibility_timeout_ms"][0] == MAX_VISIBILITY_TIMEOUT_MS == 43_200_000
    config = load_config(env=env_for("queue.visibility_timeout_ms", MAX_VISIBILITY_TIMEOUT_MS))
    assert config.queue.visibility_timeout_ms == MAX_VISIBILITY_TIMEOUT_MS


@pytest.mark.parametrize("dotted", sorted(MAXIMA))
def test_every_maximum_refuses_one_more_and_is_documented(dotted: str) -> None:
    most = MAXIMA[dotted][0]
    with pytest.raises(ConfigError, match=re.escape(f"{dotted} = {most + 1}")):
        load_config(env=env_for(dotted, most + 1))
    rows = [
        line for line in OPERATIONS.read_text().splitlines() if line.startswith(f"| `{dotted}` |")
    ]
    assert len(rows) == 1 and f"{most:,}" in rows[0].split("|")[2], rows


def test_check_config_and_start_exit_2_for_a_visibility_timeout_past_12_h(
    tmp_path: pathlib.Path,
) -> None:
    env = {**os.environ, "FUTUREQ_QUEUE_VISIBILITY_TIMEOUT_MS": "9223372036854775807"}
    flags = ["--shards", "1", "--data-dir", str(tmp_path / "data"), "--listen",
             "127.0.0.1:0", "--http", "127.0.0.1:0"]  # fmt: skip
    for command in ("check-config", "start"):
        done = subprocess.run(
            [sys.executable, "-m", "futureq.cli.server_main", command, *flags],
            capture_output=True, text=True, timeout=60, check=False, env=env,
        )  # fmt: skip
        assert done.returncode == 2, (command, done.stdout + done.stderr)
        assert "queue.visibility_timeout_ms" in done.stderr and "43200000" in done.stderr
    assert not (tmp_path / "data").exists(), "nothing was created"


def test_wal_recovery_takes_its_two_modes_only() -> None:
    assert load_config(env={}).storage.wal_recovery == "strict"
    chosen = load_config(env={"FUTUREQ_STORAGE_WAL_RECOVERY": "point-in-time"})
    assert chosen.storage.wal_recovery == "point-in-time"
    with pytest.raises(ConfigError, match="must be one of strict, point-in-time"):
        load_config(env={"FUTUREQ_STORAGE_WAL_RECOVERY": "skip-corrupted"})
