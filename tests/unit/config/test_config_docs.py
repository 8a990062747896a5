"""The config reference (docs/operations.md) and futureq.example.toml stay in step with
the config classes."""

from __future__ import annotations

import pathlib
import tomllib

import attrs

from futureq.config import AUTO_SHARDS, Config
from futureq.config_conversion import SECTIONS
from futureq.config_loader import env_var_name, load_config

ROOT = pathlib.Path(__file__).parents[3]
EXAMPLE = ROOT / "futureq.example.toml"
OPERATIONS = ROOT / "docs" / "operations.md"


def every_key() -> list[tuple[str, str]]:
    return [(section, name) for section, cls in SECTIONS.items() for name in attrs.fields_dict(cls)]


def test_example_file_loads_to_the_defaults() -> None:
    assert load_config(str(EXAMPLE), env={}) == Config()


def test_example_file_mentions_every_key_with_a_comment_above() -> None:
    lines = EXAMPLE.read_text().splitlines()
    document = tomllib.loads(EXAMPLE.read_text())
    for section, key in every_key():
        assert f"[{section}]" in lines
        positions = [
            index
            for index, line in enumerate(lines)
            if line.startswith((f"{key} = ", f"# {key} = "))
        ]
        assert positions, f"{section}.{key} missing from the example"
        assert lines[positions[0] - 1].startswith("#"), f"{section}.{key} has no comment"
        if key in document.get(section, {}):
            value = document[section][key]
            if (section, key) == ("node", "shards") and value == "auto":
                value = AUTO_SHARDS  # the default, written as the file takes it
            assert value == getattr(getattr(Config(), section), key)


def test_operations_doc_lists_every_key_and_env_var() -> None:
    text = OPERATIONS.read_text()
    for section, key in every_key():
        assert f"`{section}.{key}`" in text, f"{section}.{key}"
        assert f"`{env_var_name(section, key)}`" in text, env_var_name(section, key)
