"""``limits.max_deliveries_out`` and ``limits.max_prefetch_per_connection``: defaults,
environment overrides and the values ``check-config`` and ``start`` refuse."""

from __future__ import annotations

import pytest

from futureq.config import Config
from futureq.config_loader import load_config
from futureq.errors import ConfigError


def test_the_defaults_bound_memory_for_deliveries_out() -> None:
    limits = Config().limits
    assert limits.max_deliveries_out == 500_000  # ~250 MB at ~500 bytes each
    assert limits.max_prefetch_per_connection == 100_000
    assert limits.max_prefetch_per_connection >= limits.max_prefetch


def test_both_are_set_from_the_environment() -> None:
    config = load_config(
        env={
            "FUTUREQ_LIMITS_MAX_DELIVERIES_OUT": "30",
            "FUTUREQ_LIMITS_MAX_PREFETCH": "10",
            "FUTUREQ_LIMITS_MAX_PREFETCH_PER_CONNECTION": "15",
        }
    )
    assert config.limits.max_deliveries_out == 30
    assert config.limits.max_prefetch_per_connection == 15


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"FUTUREQ_LIMITS_MAX_DELIVERIES_OUT": "0"}, "limits.max_deliveries_out = 0"),
        ({"FUTUREQ_LIMITS_MAX_DELIVERIES_OUT": "-1"}, "must be at least 1 items"),
        ({"FUTUREQ_LIMITS_MAX_DELIVERIES_OUT": "100000001"}, "must be at most 100000000"),
        ({"FUTUREQ_LIMITS_MAX_DELIVERIES_OUT": "lots"}, "limits.max_deliveries_out"),
        ({"FUTUREQ_LIMITS_MAX_PREFETCH_PER_CONNECTION": "0"}, "must be at least 1 items"),
        (
            {"FUTUREQ_LIMITS_MAX_PREFETCH_PER_CONNECTION": "9999"},
            "must be at least limits.max_prefetch (10000)",
        ),
        (
            {"FUTUREQ_LIMITS_MAX_PREFETCH_PER_CONNECTION": str(10**9)},
            "limits.max_prefetch_per_connection = 1000000000",
        ),
    ],
)
def test_bad_values_are_refused_with_the_key_and_the_rule(env: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(env=env)
    assert words in str(error.value), str(error.value)
