"""Load and check the server configuration: defaults < TOML file < environment < flags.

The shape lives in :mod:`futureq.config`; this module fills it in from four layers, each
overriding the one before:

1. the attrs defaults (a single node on 127.0.0.1, data in ``./data``);
2. a TOML file with the tables ``[server]``, ``[limits]``, ``[queue]``, ``[storage]``,
   ``[tls]``, ``[cluster]``, ``[metrics]``;
3. environment variables ``FUTUREQ_<SECTION>_<KEY>`` (``FUTUREQ_SERVER_DATA_DIR``,
   ``FUTUREQ_STORAGE_FSYNC=false``), whose text is converted to the field's type;
4. command-line overrides, already typed, as ``{section: {key: value}}``.

The merged tables are structured with a strict :mod:`cattrs` converter (no extra keys,
no silent ``"12"`` -> 12 or ``true`` -> 1 coercions in TOML), then checked for meaning
(ports parse, sizes are positive, the payload fits in a frame, TLS files exist). Every
problem found is reported at once in one :class:`~futureq.errors.ConfigError`, one line
per problem naming the dotted key, the bad value, where it came from and what is allowed.

Durations are integer milliseconds (keys ending ``_ms``); for convenience a string with
a unit (``"250ms"``, ``"30s"``, ``"5m"``, ``"2h"``, ``"1d"``) is accepted too.

This module merges the layers and reports; the rest lives beside it:
:mod:`~futureq.config_conversion` (types, the cattrs converter, structural problems),
:mod:`~futureq.config_checks` (each section's rules and :data:`~futureq.config_checks.MAXIMA`),
:mod:`~futureq.config_security_checks` (TLS files, peer authentication) and
:mod:`~futureq.config_cross_checks` (checks across sections, warnings).

Source: DESIGN.md, "Processes and ports"; STYLE.md §4 (ConfigError names key, value and
what is allowed).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
from cattrs.errors import ClassValidationError

from futureq.config import (
    AUTO_SHARDS,
    Config,
)
from futureq.config_checks import (
    Bad,
    check_cluster,
    check_limits,
    check_metrics,
    check_node,
    check_queue,
    check_server,
    check_storage,
)
from futureq.config_conversion import (
    CONVERTER,
    SECTIONS,
    Problem,
    convert_text,
    field_types,
    parse_duration_ms,
    problems_from_cattrs,
)
from futureq.config_cross_checks import check_whole
from futureq.config_security_checks import check_peer_authentication, check_tls
from futureq.errors import ConfigError

ENV_PREFIX = "FUTUREQ_"


def not_utf8(error: UnicodeDecodeError) -> str:
    """Why a TOML file's bytes are refused, in words: TOML is UTF-8 text (a file saved
    in another encoding, or not a text file, once ended the start with a traceback)."""
    line = error.object[: error.start].count(b"\n") + 1
    return (
        f"byte 0x{error.object[error.start]:02x} on line {line} is not UTF-8; TOML files "
        "are UTF-8 text (save it as UTF-8)"
    )


def env_var_name(section: str, key: str) -> str:
    """The environment variable that sets ``section.key``: ``FUTUREQ_SECTION_KEY``."""
    return f"{ENV_PREFIX}{section}_{key}".upper()


def load_config(
    path: str | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, object]] | None = None,
) -> Config:
    """Build the server configuration from defaults, a TOML file, environment and flags.

    Args:
        path: TOML file to read, or None for none.
        env: Environment to read ``FUTUREQ_<SECTION>_<KEY>`` variables from; None means
            ``os.environ``. Variables whose ``<SECTION>`` is not a config section
            (``FUTUREQ_CONFIG``, variables of other tools) are ignored; an unknown key in
            a known section is an error.
        overrides: Typed values from the command line, ``{"server": {"node_id": 2}}``;
            a None value means "not given" and is skipped.

    Returns:
        The frozen, checked :class:`~futureq.config.Config`.

    Raises:
        ConfigError: the file cannot be read or parsed, or any key is unknown, of the
            wrong type or out of range. The message lists every problem, one per line.
    """
    loader = _Loader()
    if path is not None:
        loader.add_file(path)
    loader.add_env(os.environ if env is None else env)
    if overrides is not None:
        loader.add_overrides(overrides)
    return loader.finish()


class _Loader:
    """Merges the layers into one raw table, remembering where each value came from."""

    def __init__(self) -> None:
        self.raw: dict[str, Any] = {}
        self.origins: dict[str, str] = {}
        self.problems: list[Problem] = []

    def _set(self, section: str, key: str, value: object, origin: str) -> None:
        table = self.raw.setdefault(section, {})
        if not isinstance(table, dict):
            return  # reported as "must be a table" by add_file
        table[key] = value
        self.origins[f"{section}.{key}"] = origin

    def add_file(self, path: str) -> None:
        try:
            with open(path, "rb") as file:
                document = tomllib.load(file)
        except FileNotFoundError:
            raise ConfigError(f"config file {path!r} does not exist") from None
        except OSError as error:
            raise ConfigError(f"config file {path!r} cannot be read: {error.strerror}") from None
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"config file {path!r} is not valid TOML: {error}") from None
        except UnicodeDecodeError as error:  # tomllib decodes the whole file first
            raise ConfigError(
                f"config file {path!r} is not valid TOML: {not_utf8(error)}"
            ) from None
        for section, table in document.items():
            if not isinstance(table, dict):
                self.problems.append(
                    Problem(
                        (section,),
                        f"{section} = {table!r} (from {path}): must be a table "
                        f"[{section}] with keys, not a single value",
                    )
                )
                continue
            if section not in SECTIONS:
                # cattrs reports the unknown section; keep it so it does.
                self.raw[section] = table
                self.origins[section] = path
                continue
            for key, value in table.items():
                self._set(section, key, value, path)

    def add_env(self, env: Mapping[str, str]) -> None:
        short, long = env.get("FUTUREQ_SHARDS"), env.get("FUTUREQ_NODE_SHARDS")
        if short is not None and long is not None and short.strip() != long.strip():
            # Both name node.shards; which one won was only the order of their names.
            self.problems.append(
                Problem(
                    ("node.shards",),
                    f"node.shards: the environment variables FUTUREQ_SHARDS={short!r} and "
                    f"FUTUREQ_NODE_SHARDS={long!r} disagree; both set node.shards: set one",
                )
            )
        for name, text in sorted(env.items()):
            if not name.startswith(ENV_PREFIX):
                continue
            section, _, key = name[len(ENV_PREFIX) :].lower().partition("_")
            if section == "shards" and not key:  # FUTUREQ_SHARDS: short for node.shards
                section, key = "node", "shards"
            if section not in SECTIONS or not key:
                # FUTUREQ_SERVER (no key) is futureq-cli's server list, not server config.
                continue
            types_by_key = field_types(section)
            value: object = text
            if key in types_by_key:
                value = convert_text(text, types_by_key[key], key)
            self._set(section, key, value, f"environment variable {name}")

    def add_overrides(self, overrides: Mapping[str, Mapping[str, object]]) -> None:
        for section, table in overrides.items():
            for key, value in table.items():
                if value is not None:
                    self._set(section, key, value, "command line")

    def finish(self) -> Config:
        raw = self.raw
        for section_name, table in raw.items():
            if section_name not in SECTIONS or not isinstance(table, dict):
                continue
            for key, value in table.items():
                if key.endswith("_ms") and isinstance(value, str):
                    duration = parse_duration_ms(value)
                    if duration is not None:
                        table[key] = duration
        node_table = raw.get("node")
        problems = list(self.problems)
        if isinstance(node_table, dict):
            shards = node_table.get("shards")
            origin = self.origins.get("node.shards", "")
            if type(shards) is int and shards == AUTO_SHARDS and origin != "command line":
                # 0 written in a file or the environment is a mistake, not ``auto`` (the
                # value auto stands for inside; typed overrides may pass it).
                from futureq.shards.slots import MAX_SHARDS

                problems.append(
                    self._sentence(
                        Bad(
                            ("node.shards",),
                            shards,
                            f"must be 1 to {MAX_SHARDS} shard processes, or auto (one per "
                            "core); 0 is not a count",
                        )
                    )
                )
                node_table.pop("shards")
            elif str(shards).strip() == "auto":
                node_table["shards"] = AUTO_SHARDS

        bad_keys: set[str] = {key for problem in problems for key in problem.keys}
        config: Config | None = None
        try:
            config = CONVERTER.structure(raw, Config)
        except ClassValidationError as error:
            structural = list(problems_from_cattrs(error, raw, self.origins, ()))
            problems.extend(structural)
            bad_keys.update(key for problem in structural for key in problem.keys)

        semantic_keys: set[str] = set()
        # Check meaning section by section, on what structured, so one run reports
        # every problem; a check touching a key that failed to structure is skipped.
        for section_name, section_cls in SECTIONS.items():
            table = raw.get(section_name, {})
            if not isinstance(table, dict):
                continue
            good = {
                key: value
                for key, value in table.items()
                if f"{section_name}.{key}" not in bad_keys
                and f"{section_name}.{key}" in _KNOWN_KEYS
            }
            try:
                section = CONVERTER.structure(good, section_cls)
            except ClassValidationError:  # pragma: no cover - bad keys were removed
                continue
            for bad in SEMANTIC_CHECKS[section_name](section):
                if bad_keys.isdisjoint(bad.keys):
                    problems.append(self._sentence(bad))
                    semantic_keys.update(bad.keys)

        if config is not None:
            for bad in check_whole(config):
                if bad_keys.isdisjoint(bad.keys) and semantic_keys.isdisjoint(bad.keys):
                    problems.append(self._sentence(bad))

        # Checks across sections, on a config that structured and whose keys are sound.
        if config is not None:
            bad_keys.update(key for problem in problems for key in problem.keys)
            for bad in check_peer_authentication(config):
                if bad_keys.isdisjoint(bad.keys):
                    problems.append(self._sentence(bad))

        if problems:
            order = list(SECTIONS)
            problems.sort(key=lambda problem: _section_rank(problem.keys[0], order))
            count = len(problems)
            lines = "\n".join(f"  - {problem.message}" for problem in problems)
            noun = "problem" if count == 1 else "problems"
            raise ConfigError(f"invalid configuration ({count} {noun}):\n{lines}")
        assert config is not None
        return config

    def _sentence(self, bad: Bad) -> Problem:
        origin = self.origins.get(bad.keys[0])
        where = f" (from {origin})" if origin else ""
        return Problem(bad.keys, f"{bad.keys[0]} = {bad.value!r}{where}: {bad.rule}")


def _section_rank(dotted: str, order: list[str]) -> int:
    section = dotted.partition(".")[0]
    return order.index(section) if section in order else len(order)


_KNOWN_KEYS = {
    f"{section}.{name}" for section, cls in SECTIONS.items() for name in attrs.fields_dict(cls)
}


SEMANTIC_CHECKS: dict[str, Callable[[Any], Iterable[Bad]]] = {
    "server": check_server,
    "limits": check_limits,
    "queue": check_queue,
    "storage": check_storage,
    "tls": check_tls,
    "cluster": check_cluster,
    "metrics": check_metrics,
    "node": check_node,
}
