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

Source: DESIGN.md, "Processes and ports"; STYLE.md §4 (ConfigError names key, value and
what is allowed).
"""

from __future__ import annotations

import os
import re
import ssl
import tomllib
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError

from futureq.config import (
    AUTO_SHARDS,
    WAL_RECOVERY_MODES,
    WILDCARD_HOSTS,
    ClusterSection,
    Config,
    LimitsSection,
    MetricsSection,
    NodeSection,
    QueueSection,
    ServerSection,
    StorageSection,
    TlsConfig,
    announced_client_address,
    announced_raft_address,
    is_wildcard,
    parse_peers,
    split_host_port,
)
from futureq.errors import ConfigError
from futureq.logging_setup import LOG_FORMATS
from futureq.peer_credentials import (
    CredentialError,
    check_own_certificate,
    mutual_tls_configured,
    read_secret_file,
)
from futureq.state import commands
from futureq.wire.validation import (
    MAX_VISIBILITY_TIMEOUT_MS,
    MIN_VISIBILITY_TIMEOUT_MS,
    visibility_problem,
)

ENV_PREFIX = "FUTUREQ_"
MAX_NODE_ID = commands.MAX_NODE_ID
MIN_CLOCK_OFFSET_MS = 10
"""A smaller cluster.max_clock_offset_ms is a unit mistake: no clocks agree that well."""
MAX_CLOCK_OFFSET_MS = 60_000
LOG_LEVELS = ("debug", "info", "warning", "error")

_HOUR_MS = 3_600_000
_DAY_MS = 24 * _HOUR_MS
_YEAR_MS = 366 * _DAY_MS
_MIB = 1024 * 1024

MAXIMA: dict[str, tuple[int, str]] = {
    # The largest value of each numeric setting that has no other upper bound, and why.
    # Values past these are unit mistakes or typos (a visibility timeout of 292 million
    # years, a 100 TB memtable) that would otherwise be stored on groups, overflow
    # RocksDB's options or make the node wait for ever (docs/operations.md, config table).
    "server.shutdown_grace_ms": (_HOUR_MS, "1 h: a stop that takes longer is a hung one"),
    "limits.max_frame_bytes": (64 * _MIB, "64 MiB: every frame is buffered whole"),
    "limits.max_delay_ms": (100 * _YEAR_MS, "100 years"),
    "limits.max_ttl_ms": (100 * _YEAR_MS, "100 years"),
    "limits.max_batch_items": (1_000_000, "1,000,000 items"),
    "limits.max_connections": (1_000_000, "1,000,000 connections"),
    "limits.max_subscriptions_per_connection": (1_000_000, "1,000,000 subscriptions"),
    "limits.max_subscriptions": (10_000_000, "10,000,000 subscriptions (~6 GB)"),
    "limits.max_connection_buffer_bytes": (1024 * _MIB, "1 GiB per connection"),
    "limits.max_node_buffer_bytes": (64 * 1024 * _MIB, "64 GiB of memory"),
    "limits.frame_deadline_ms": (_HOUR_MS, "1 h"),
    "limits.frame_stall_ms": (_HOUR_MS, "1 h"),
    "limits.keepalive_interval_ms": (_HOUR_MS, "1 h"),
    "limits.keepalive_timeout_ms": (_HOUR_MS, "1 h"),
    "limits.send_timeout_ms": (_HOUR_MS, "1 h"),
    "limits.max_http_connections": (100_000, "100,000 connections"),
    "limits.http_idle_timeout_ms": (_HOUR_MS, "1 h"),
    "limits.max_groups": (100_000_000, "100,000,000 groups"),
    "limits.max_status_groups": (1_000_000, "1,000,000 groups"),
    "queue.visibility_timeout_ms": (
        MAX_VISIBILITY_TIMEOUT_MS,
        "12 h, the protocol's longest visibility timeout, as for `group create "
        "--visibility-timeout`",
    ),
    "queue.max_deliveries": (1_000_000, "1,000,000 attempts, the protocol's largest"),
    "queue.horizon_ms": (7 * _DAY_MS, "7 days"),
    "queue.horizon_max_items": (100_000_000, "100,000,000 items"),
    "queue.dispatch_batch_items": (100_000, "100,000 items"),
    "queue.idempotency_window_ms": (30 * _DAY_MS, "30 days"),
    "storage.group_commit_max_items": (1_000_000, "1,000,000 items"),
    "storage.write_buffer_mb": (4096, "4096 MiB per column family"),
    "storage.block_cache_mb": (1024 * 1024, "1 TiB"),
    "cluster.tick_ms": (10_000, "10 s"),
    "cluster.election_timeout_ticks": (10_000, "10,000 ticks"),
    "cluster.snapshot_chunk_bytes": (8 * _MIB, "8 MiB, half a Raft frame"),
    "cluster.compact_every_entries": (100_000_000, "100,000,000 entries"),
    "cluster.member_record_ms": (_HOUR_MS, "1 h"),
    "metrics.max_topic_series": (1_000_000, "1,000,000 series"),
    "metrics.max_group_series": (1_000_000, "1,000,000 series"),
    "node.shard_port_stride": (65_535, "65535 ports"),
}
"""Upper bound of each numeric setting without one of its own, dotted key -> (largest
allowed, the same in words with the reason)."""

SECTIONS: dict[str, type[Any]] = {
    "server": ServerSection,
    "limits": LimitsSection,
    "queue": QueueSection,
    "storage": StorageSection,
    "tls": TlsConfig,
    "cluster": ClusterSection,
    "metrics": MetricsSection,
    "node": NodeSection,
}

_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION_RE = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$")
_TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
_FALSE_WORDS = frozenset({"false", "0", "no", "off"})


@attrs.frozen
class Problem:
    """One thing wrong with the configuration.

    Attributes:
        keys: The dotted keys the problem concerns (``("limits.max_payload_bytes",)``).
        message: A full sentence naming the key, the value and what is allowed.
    """

    keys: tuple[str, ...]
    message: str


def env_var_name(section: str, key: str) -> str:
    """The environment variable that sets ``section.key``: ``FUTUREQ_SECTION_KEY``."""
    return f"{ENV_PREFIX}{section}_{key}".upper()


def field_types(section: str) -> dict[str, Any]:
    """Resolved type of every field of a config section, by field name."""
    return typing.get_type_hints(SECTIONS[section])


def parse_duration_ms(text: str) -> int | None:
    """Parse ``"250ms"``, ``"30s"``, ``"5m"``, ``"2h"`` or ``"1d"`` into milliseconds.

    Returns:
        The duration in integer milliseconds, or None when ``text`` is not of that form
        (a plain number without a unit is not a duration string).
    """
    match = _DURATION_RE.match(text)
    if match is None:
        return None
    return int(match.group(1)) * _DURATION_UNITS_MS[match.group(2)]


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
                value = _convert_text(text, types_by_key[key], key)
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
                        _Bad(
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
            config = _CONVERTER.structure(raw, Config)
        except ClassValidationError as error:
            structural = list(_problems_from_cattrs(error, raw, self.origins, ()))
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
                section = _CONVERTER.structure(good, section_cls)
            except ClassValidationError:  # pragma: no cover - bad keys were removed
                continue
            for bad in _SEMANTIC_CHECKS[section_name](section):
                if bad_keys.isdisjoint(bad.keys):
                    problems.append(self._sentence(bad))
                    semantic_keys.update(bad.keys)

        if config is not None:
            for bad in _check_whole(config):
                if bad_keys.isdisjoint(bad.keys) and semantic_keys.isdisjoint(bad.keys):
                    problems.append(self._sentence(bad))

        # Checks across sections, on a config that structured and whose keys are sound.
        if config is not None:
            bad_keys.update(key for problem in problems for key in problem.keys)
            for bad in _check_peer_authentication(config):
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

    def _sentence(self, bad: _Bad) -> Problem:
        origin = self.origins.get(bad.keys[0])
        where = f" (from {origin})" if origin else ""
        return Problem(bad.keys, f"{bad.keys[0]} = {bad.value!r}{where}: {bad.rule}")


def _section_rank(dotted: str, order: list[str]) -> int:
    section = dotted.partition(".")[0]
    return order.index(section) if section in order else len(order)


_KNOWN_KEYS = {
    f"{section}.{name}" for section, cls in SECTIONS.items() for name in attrs.fields_dict(cls)
}


# --- type conversion --------------------------------------------------------------


def _convert_text(text: str, field_type: Any, key: str) -> object:
    """Convert an environment variable's text to ``field_type``; on failure return the
    text unchanged so the strict structuring reports it with its origin."""
    optional = _is_optional(field_type)
    base = _base_type(field_type)
    stripped = text.strip()
    if optional and stripped == "":
        return None
    if base is bool:
        word = stripped.lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
        return text
    if base is int:
        if key.endswith("_ms"):
            duration = parse_duration_ms(stripped)
            if duration is not None:
                return duration
        try:
            return int(stripped, 10)
        except ValueError:
            return text
    return text


def _is_optional(field_type: Any) -> bool:
    return isinstance(field_type, types.UnionType) and type(None) in typing.get_args(field_type)


def _base_type(field_type: Any) -> Any:
    if isinstance(field_type, types.UnionType):
        args = [arg for arg in typing.get_args(field_type) if arg is not type(None)]
        return args[0] if len(args) == 1 else field_type
    return field_type


def _describe_type(field_type: Any, key: str) -> str:
    base = _base_type(field_type)
    optional = _is_optional(field_type)
    if base is bool:
        text = "true or false"
    elif base is int:
        text = "an integer"
        if key.endswith("_ms"):
            text = 'an integer number of milliseconds (or a duration such as "30s")'
        elif key.endswith("_bytes"):
            text = "an integer number of bytes"
        elif key.endswith("_mb"):
            text = "an integer number of MiB"
        elif key.endswith("_items"):
            text = "an integer number of items"
        elif key == "shards":
            text = "an integer number of shards, or auto"
    elif base is str:
        text = "a string"
    else:  # pragma: no cover - every field is one of the above
        text = str(base)
    return f"{text} (or unset)" if optional else text


class _StrictTypeError(TypeError):
    """A TOML or flag value of the wrong type (no silent coercion)."""


def _strict(kind: type[Any]) -> Callable[[Any, type[Any]], Any]:
    def structure(value: Any, _: type[Any]) -> Any:
        if type(value) is not kind:  # bool is a subclass of int: compare exactly
            raise _StrictTypeError(f"expected {kind.__name__}, got {type(value).__name__}")
        return value

    return structure


_CONVERTER = cattrs.Converter(forbid_extra_keys=True)
for _kind in (int, bool, str):
    _CONVERTER.register_structure_hook(_kind, _strict(_kind))


def _problems_from_cattrs(
    error: ClassValidationError,
    raw: Mapping[str, Any],
    origins: Mapping[str, str],
    path: tuple[str, ...],
) -> Iterable[Problem]:
    """Turn cattrs' exception tree into one sentence per bad key."""
    with_notes, without_notes = error.group_exceptions()
    for exception, note in with_notes:
        name = note.name
        if isinstance(exception, ClassValidationError):
            yield from _problems_from_cattrs(exception, raw, origins, (*path, name))
            continue
        dotted = ".".join((*path, name))
        section = path[0] if path else name
        value = _lookup(raw, (*path, name))
        origin = origins.get(dotted)
        where = f" (from {origin})" if origin else ""
        if section in SECTIONS and path:
            expected = _describe_type(field_types(section)[name], name)
            yield Problem((dotted,), f"{dotted} = {value!r}{where}: must be {expected}")
        else:
            yield Problem((dotted,), f"{dotted} = {value!r}{where}: must be a table of keys")
    for exception in without_notes:
        if isinstance(exception, ForbiddenExtraKeysError):
            for extra in sorted(exception.extra_fields):
                dotted = ".".join((*path, extra))
                origin = origins.get(dotted)
                where = f" (from {origin})" if origin else ""
                if path:
                    allowed = ", ".join(attrs.fields_dict(SECTIONS[path[0]]))
                    yield Problem(
                        (dotted,),
                        f"{dotted}{where} is not a known key; the keys of "
                        f"[{path[0]}] are: {allowed}",
                    )
                else:
                    yield Problem(
                        (dotted,),
                        f"[{extra}]{where} is not a known section; the sections are: "
                        f"{', '.join(SECTIONS)}",
                    )
        else:  # pragma: no cover - cattrs gives notes for every attribute failure
            yield Problem((".".join(path),), f"{'.'.join(path) or 'config'}: {exception}")


def _lookup(raw: Mapping[str, Any], path: tuple[str, ...]) -> object:
    value: Any = raw
    for part in path:
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


# --- meaning ----------------------------------------------------------------------


@attrs.frozen
class _Bad:
    """A value that structured but makes no sense: ``keys[0]`` holds ``value``."""

    keys: tuple[str, ...]
    value: object
    rule: str


def _minimum(section: str, obj: object, key: str, least: int, unit: str) -> Iterable[_Bad]:
    value = getattr(obj, key)
    if value < least:
        yield _Bad((f"{section}.{key}",), value, f"must be at least {least}{unit}")


def _address(section: str, key: str, value: str | None, *, port_zero: bool) -> Iterable[_Bad]:
    if value is None:
        return
    dotted = f"{section}.{key}"
    try:
        _, port = split_host_port(value)
    except ValueError as error:
        yield _Bad(
            (dotted,),
            value,
            f"must be HOST:PORT ([v6addr]:PORT for IPv6) with a port in 0..65535 ({error})",
        )
        return
    if port == 0 and not port_zero:
        yield _Bad((dotted,), value, "must name a real port in 1..65535, not 0")


def _maxima(section: str, obj: object) -> Iterable[_Bad]:
    """The :data:`MAXIMA` of ``section``'s keys."""
    for dotted, (most, words) in MAXIMA.items():
        name, _, key = dotted.partition(".")
        if name != section:
            continue
        value = getattr(obj, key)
        if value > most:
            yield _Bad((dotted,), value, f"must be at most {most} ({words})")


def _check_server(server: ServerSection) -> Iterable[_Bad]:
    yield from _maxima("server", server)
    yield from _minimum("server", server, "node_id", 1, "")
    if server.node_id > MAX_NODE_ID:
        yield _Bad(("server.node_id",), server.node_id, f"must be at most {MAX_NODE_ID}")
    if not server.data_dir.strip():
        yield _Bad(("server.data_dir",), server.data_dir, "must name a directory")
    yield from _address("server", "listen", server.listen, port_zero=True)
    yield from _address("server", "http", server.http, port_zero=True)
    yield from _address("server", "advertise", server.advertise, port_zero=False)
    try:
        listen_address = split_host_port(server.listen)
        http_address = split_host_port(server.http)
    except ValueError:
        pass
    else:
        if listen_address == http_address and listen_address[1] != 0:
            yield _Bad(
                ("server.http", "server.listen"),
                server.http,
                "must differ from server.listen (the client listener)",
            )
    if server.auth_token is not None and not server.auth_token:
        yield _Bad(("server.auth_token",), "", "must be a non-empty string, or unset for no token")
    if server.credentials_file is not None and not os.path.isfile(server.credentials_file):
        yield _Bad(
            ("server.credentials_file",),
            server.credentials_file,
            "must be an existing TOML file of client credentials (see docs/security.md)",
        )
    for origin in server.websocket_origins.split(","):
        origin = origin.strip()
        if origin and origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
            yield _Bad(
                ("server.websocket_origins",),
                server.websocket_origins,
                f"{origin!r} is not an origin: give scheme://host[:port] entries like "
                "https://app.example.com, separated by commas, or *",
            )
    yield from _minimum("server", server, "shutdown_grace_ms", 0, " ms")
    if server.log_level not in LOG_LEVELS:
        yield _Bad(
            ("server.log_level",), server.log_level, f"must be one of {', '.join(LOG_LEVELS)}"
        )
    if server.log_format not in LOG_FORMATS:
        yield _Bad(
            ("server.log_format",), server.log_format, f"must be one of {', '.join(LOG_FORMATS)}"
        )


def _check_limits(limits: LimitsSection) -> Iterable[_Bad]:
    yield from _maxima("limits", limits)
    yield from _minimum("limits", limits, "max_frame_bytes", 1, " bytes")
    yield from _minimum("limits", limits, "max_payload_bytes", 1, " bytes")
    yield from _minimum("limits", limits, "max_delay_ms", 0, " ms")
    yield from _minimum("limits", limits, "max_ttl_ms", 0, " ms")
    yield from _minimum("limits", limits, "max_batch_items", 1, " items")
    yield from _minimum("limits", limits, "max_prefetch", 1, " items")
    if limits.max_prefetch > 1_000_000:
        yield _Bad(("limits.max_prefetch",), limits.max_prefetch, "must be at most 1000000 items")
    yield from _minimum("limits", limits, "max_connections", 1, " connections")
    yield from _minimum("limits", limits, "max_subscriptions_per_connection", 1, " subscriptions")
    yield from _minimum("limits", limits, "max_subscriptions", 1, " subscriptions")
    yield from _minimum("limits", limits, "max_node_buffer_bytes", 1, " bytes")
    for key in (
        "frame_deadline_ms",
        "frame_stall_ms",
        "keepalive_interval_ms",
        "keepalive_timeout_ms",
    ):
        yield from _minimum("limits", limits, key, 100, " ms")
    yield from _minimum("limits", limits, "send_timeout_ms", 100, " ms")
    yield from _minimum("limits", limits, "max_http_connections", 1, " connections")
    yield from _minimum("limits", limits, "http_idle_timeout_ms", 100, " ms")
    yield from _minimum("limits", limits, "max_groups", 1, " groups")
    yield from _minimum("limits", limits, "max_status_groups", 1, " groups")
    if limits.max_connection_buffer_bytes < limits.max_frame_bytes:
        yield _Bad(
            ("limits.max_connection_buffer_bytes", "limits.max_frame_bytes"),
            limits.max_connection_buffer_bytes,
            f"must be at least limits.max_frame_bytes ({limits.max_frame_bytes}) "
            "so that any one answer fits in a connection's buffer",
        )
    if (
        limits.max_node_buffer_bytes < limits.max_connection_buffer_bytes
        or limits.max_node_buffer_bytes <= limits.max_frame_bytes
    ):
        yield _Bad(
            ("limits.max_node_buffer_bytes", "limits.max_connection_buffer_bytes"),
            limits.max_node_buffer_bytes,
            "must be at least limits.max_connection_buffer_bytes "
            f"({limits.max_connection_buffer_bytes}) and more than limits.max_frame_bytes "
            f"({limits.max_frame_bytes}): the node's buffers hold at least one connection's, "
            "else no large frame could ever be read whole",
        )
    if limits.max_payload_bytes >= limits.max_frame_bytes:
        yield _Bad(
            ("limits.max_payload_bytes", "limits.max_frame_bytes"),
            limits.max_payload_bytes,
            f"must be smaller than limits.max_frame_bytes ({limits.max_frame_bytes}) "
            "so a payload fits in a frame",
        )


def _check_queue(queue: QueueSection) -> Iterable[_Bad]:
    yield from _maxima("queue", queue)
    if queue.visibility_timeout_ms < 1:
        yield _Bad(
            ("queue.visibility_timeout_ms",),
            queue.visibility_timeout_ms,
            f"must be at least {MIN_VISIBILITY_TIMEOUT_MS} ms",
        )
    elif queue.visibility_timeout_ms < MIN_VISIBILITY_TIMEOUT_MS:
        yield _Bad(
            ("queue.visibility_timeout_ms",),
            queue.visibility_timeout_ms,
            visibility_problem(queue.visibility_timeout_ms),
        )
    yield from _minimum("queue", queue, "max_deliveries", 1, " attempts")
    yield from _minimum("queue", queue, "horizon_ms", 1, " ms")
    yield from _minimum("queue", queue, "horizon_max_items", 1, " items")
    yield from _minimum("queue", queue, "dispatch_batch_items", 1, " items")
    yield from _minimum("queue", queue, "idempotency_window_ms", 0, " ms")


def _check_storage(storage: StorageSection) -> Iterable[_Bad]:
    yield from _maxima("storage", storage)
    if storage.wal_recovery not in WAL_RECOVERY_MODES:
        yield _Bad(
            ("storage.wal_recovery",),
            storage.wal_recovery,
            f"must be one of {', '.join(WAL_RECOVERY_MODES)}",
        )
    yield from _minimum("storage", storage, "group_commit_max_items", 1, " items")
    yield from _minimum("storage", storage, "write_buffer_mb", 1, " MiB")
    yield from _minimum("storage", storage, "block_cache_mb", 1, " MiB")


def _check_tls(tls: TlsConfig) -> Iterable[_Bad]:
    if (tls.cert_file is None) != (tls.key_file is None):
        given, missing = (
            ("cert_file", "key_file") if tls.key_file is None else ("key_file", "cert_file")
        )
        yield _Bad(
            (f"tls.{given}", f"tls.{missing}"),
            getattr(tls, given),
            f"tls.{missing} must be set too (set both to turn TLS on, or neither)",
        )
    absent = False
    for key in ("cert_file", "key_file", "ca_file"):
        value = getattr(tls, key)
        if value is not None and not os.path.isfile(value):
            absent = True
            yield _Bad((f"tls.{key}",), value, "must be an existing PEM file")
    if not absent:
        yield from _check_tls_contents(tls)
    if tls.ca_file is not None and not tls.enabled:
        yield _Bad(
            ("tls.ca_file",),
            tls.ca_file,
            "is only used with TLS on; set tls.cert_file and tls.key_file too, or unset it",
        )
    if tls.require_client_cert and tls.ca_file is None:
        yield _Bad(
            ("tls.require_client_cert",),
            True,
            "needs tls.ca_file to verify client certificates",
        )
    if tls.http and not tls.enabled:
        yield _Bad(
            ("tls.http",),
            True,
            "needs tls.cert_file and tls.key_file (the HTTP port uses the same certificate)",
        )


def _check_tls_contents(tls: TlsConfig) -> Iterable[_Bad]:
    """Load the TLS files as the client listener does, so a file that exists but is not
    what its key says (a garbage certificate, certificate and key swapped, a key of
    another certificate, a CA file without certificates) is a configuration problem
    naming the key and file, not a bare OpenSSL error at bind time."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    if tls.cert_file is not None:
        try:  # the certificate alone: any PEM certificate in the file
            context.load_verify_locations(cafile=tls.cert_file)
        except (ssl.SSLError, OSError) as error:
            yield _Bad(
                ("tls.cert_file",),
                tls.cert_file,
                f"holds no PEM certificate ({_ssl_reason(error)}); give this server's "
                "certificate chain (is it the key file?)",
            )
            return
        if tls.key_file is not None:
            try:
                context.load_cert_chain(tls.cert_file, tls.key_file)
            except (ssl.SSLError, OSError) as error:
                if getattr(error, "reason", None) == "KEY_VALUES_MISMATCH":
                    rule = (
                        f"is not the private key of tls.cert_file {tls.cert_file!r} (the key "
                        "values do not match); give the key the certificate was issued for"
                    )
                else:
                    rule = (
                        f"holds no usable PEM private key ({_ssl_reason(error)}); give the "
                        "unencrypted private key of tls.cert_file (is it the certificate?)"
                    )
                # tls.cert_file too: the peer check would report the same pair again.
                yield _Bad(("tls.key_file", "tls.cert_file"), tls.key_file, rule)
    if tls.ca_file is not None:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cafile=tls.ca_file)
        except (ssl.SSLError, OSError) as error:
            yield _Bad(
                ("tls.ca_file",),
                tls.ca_file,
                f"holds no PEM CA certificate ({_ssl_reason(error)}); give the bundle of CA "
                "certificates that sign client and peer certificates",
            )


def _ssl_reason(error: Exception) -> str:
    """OpenSSL's words for ``error`` without the ``(_ssl.c:NNNN)`` source location."""
    if isinstance(error, ssl.SSLError):
        if error.reason:
            return str(error.reason).replace("_", " ").lower()
        return "OpenSSL cannot read it as PEM"
    if isinstance(error, OSError):
        return error.strerror or str(error)
    return str(error)  # pragma: no cover - only the two above are caught


def _check_cluster(cluster: ClusterSection) -> Iterable[_Bad]:
    yield from _maxima("cluster", cluster)
    yield from _address("cluster", "raft_listen", cluster.raft_listen, port_zero=True)
    yield from _address("cluster", "advertise_raft", cluster.advertise_raft, port_zero=False)
    yield from _address("cluster", "join", cluster.join, port_zero=False)
    try:
        peers = parse_peers(cluster.peers)
    except ValueError as error:
        yield _Bad(
            ("cluster.peers",), cluster.peers, f"must be ID=HOST:PORT,ID=HOST:PORT,... ({error})"
        )
    else:
        wildcards = [f"{peer}={address}" for peer, address in peers.items() if is_wildcard(address)]
        if wildcards:
            yield _Bad(
                ("cluster.peers",),
                cluster.peers,
                f"names wildcard addresses ({', '.join(wildcards)}) that no peer can dial; "
                "give each node's reachable HOST:PORT (its --advertise-raft)",
            )
    if cluster.peers.strip() and cluster.join is not None:
        yield _Bad(
            ("cluster.join", "cluster.peers"),
            cluster.join,
            "give peers (a new cluster) or join (an existing one), not both",
        )
    if not cluster.cluster_id:
        yield _Bad(("cluster.cluster_id",), cluster.cluster_id, "must be a non-empty name")
    yield from _minimum("cluster", cluster, "tick_ms", 1, " ms")
    yield from _minimum("cluster", cluster, "election_timeout_ticks", 2, " ticks")
    yield from _minimum("cluster", cluster, "heartbeat_ticks", 1, " ticks")
    if not 0 <= cluster.election_timeout_spread_ticks <= cluster.election_timeout_ticks:
        yield _Bad(
            ("cluster.election_timeout_spread_ticks",),
            cluster.election_timeout_spread_ticks,
            "must be between 0 (half of cluster.election_timeout_ticks) and "
            "cluster.election_timeout_ticks",
        )
    if cluster.heartbeat_ticks >= cluster.election_timeout_ticks:
        yield _Bad(
            ("cluster.heartbeat_ticks",),
            cluster.heartbeat_ticks,
            "must be smaller than cluster.election_timeout_ticks",
        )
    if cluster.clustered and cluster.election_timeout_ticks < 3:
        yield _Bad(
            ("cluster.election_timeout_ticks",),
            cluster.election_timeout_ticks,
            "must be at least 3 ticks in a cluster (the leader lease lasts T - 2 ticks)",
        )
    if not MIN_CLOCK_OFFSET_MS <= cluster.max_clock_offset_ms <= MAX_CLOCK_OFFSET_MS:
        hint = (
            f" ({cluster.max_clock_offset_ms} s would be {cluster.max_clock_offset_ms * 1000} ms:"
            " it looks like seconds taken for milliseconds)"
            if 0 < cluster.max_clock_offset_ms < MIN_CLOCK_OFFSET_MS
            else ""
        )
        yield _Bad(
            ("cluster.max_clock_offset_ms",),
            cluster.max_clock_offset_ms,
            f"must be between {MIN_CLOCK_OFFSET_MS} and {MAX_CLOCK_OFFSET_MS} ms{hint}",
        )
    yield from _minimum("cluster", cluster, "snapshot_chunk_bytes", 1024, " bytes")
    yield from _minimum("cluster", cluster, "compact_every_entries", 1, " entries")
    yield from _minimum("cluster", cluster, "member_record_ms", 1, " ms")
    if cluster.initial_cluster_state not in ("new", "existing"):
        yield _Bad(
            ("cluster.initial_cluster_state",),
            cluster.initial_cluster_state,
            'must be "new" (forming a brand-new cluster) or "existing"',
        )
    if cluster.secret_file is not None:
        try:
            read_secret_file(cluster.secret_file)
        except CredentialError as error:
            yield _Bad(("cluster.secret_file",), cluster.secret_file, str(error))


def _check_peer_authentication(config: Config) -> Iterable[_Bad]:
    """A node with peers authenticates them, or the operator said not to (docs/security.md)."""
    cluster = config.cluster
    if not cluster.clustered:
        return
    key, value = (
        ("cluster.peers", cluster.peers)
        if cluster.peers.strip()
        else (
            "cluster.join",
            cluster.join,
        )
    )
    if mutual_tls_configured(config):
        try:
            check_own_certificate(config)
        except CredentialError as error:
            yield _Bad(
                ("tls.cert_file", "server.node_id", "cluster.cluster_id"),
                config.tls.cert_file,
                str(error),
            )
    elif cluster.secret_file is None and not cluster.insecure_peers:
        yield _Bad(
            (key, "cluster.secret_file", "cluster.insecure_peers"),
            value,
            "a node with peers must authenticate them: give every node the same "
            "--cluster-secret-file (make one with `futureq generate-secret FILE`), or mutual "
            "TLS with --tls-cert, --tls-key and --tls-ca (certificates naming the node id), "
            "or pass --insecure-peers to let anyone who reaches the Raft port act as a node",
        )


def _check_metrics(metrics: MetricsSection) -> Iterable[_Bad]:
    yield from _maxima("metrics", metrics)
    yield from _minimum("metrics", metrics, "max_topic_series", 0, " series")
    yield from _minimum("metrics", metrics, "max_group_series", 0, " series")


def _check_node(node: NodeSection) -> Iterable[_Bad]:
    from futureq.shards.slots import MAX_SHARDS

    yield from _maxima("node", node)
    if not (node.shards == AUTO_SHARDS or 1 <= node.shards <= MAX_SHARDS):
        yield _Bad(
            ("node.shards",),
            node.shards,
            f"must be 1 to {MAX_SHARDS} shard processes, or auto (the number of cores)",
        )
    yield from _minimum("node", node, "shard_port_stride", 1, " ports")


_SEMANTIC_CHECKS: dict[str, Callable[[Any], Iterable[_Bad]]] = {
    "server": _check_server,
    "limits": _check_limits,
    "queue": _check_queue,
    "storage": _check_storage,
    "tls": _check_tls,
    "cluster": _check_cluster,
    "metrics": _check_metrics,
    "node": _check_node,
}


# --- checks across sections -------------------------------------------------------


def _check_whole(config: Config) -> Iterable[_Bad]:
    """Checks that need more than one section (run once every section structured)."""
    yield from _check_announced(config)
    yield from _check_membership(config)
    yield from _check_ports(config)
    yield from _check_shard_ports(config)


def _check_membership(config: Config) -> Iterable[_Bad]:
    """What ``start`` would refuse about ``cluster.peers``, said before it opens anything."""
    try:
        peers = parse_peers(config.cluster.peers)
    except ValueError:
        return  # reported by the section's own check
    node_id = config.server.node_id
    if peers and node_id not in peers:
        yield _Bad(
            ("cluster.peers", "server.node_id"),
            config.cluster.peers,
            f"lists nodes {sorted(peers)} but not this node's id {node_id}; every node "
            "lists all initial voters, itself included (a node joining a cluster uses "
            "cluster.join instead)",
        )
    by_address: dict[tuple[str, int], list[int]] = {}
    for peer, address in peers.items():
        try:
            host, port = split_host_port(address)
        except ValueError:
            continue
        by_address.setdefault((host.lower(), port), []).append(peer)
    for (host, port), ids in by_address.items():
        if len(ids) > 1:
            yield _Bad(
                ("cluster.peers",),
                config.cluster.peers,
                f"gives nodes {sorted(ids)} the same address {host}:{port}; each node needs "
                "its own Raft address",
            )


def _check_ports(config: Config) -> Iterable[_Bad]:
    """A clustered node's Raft listener cannot share the client or HTTP listener's port."""
    if not config.cluster.clustered:
        return
    try:
        raft = split_host_port(config.cluster.raft_listen)
        others = {
            "server.listen": split_host_port(config.server.listen),
            "server.http": split_host_port(config.server.http),
        }
    except ValueError:
        return
    for key, address in others.items():
        if address == raft and raft[1] != 0:
            yield _Bad(
                ("cluster.raft_listen", key),
                config.cluster.raft_listen,
                f"must differ from {key} (one port per listener)",
            )


def shard_port_problems(config: Config) -> list[str]:
    """Sentences saying why ``config``'s ports cannot hold its ``node.shards`` shards
    (a port 0, or no room below 65536); empty when they can. For a count chosen after
    loading (``node.shards = auto``)."""
    return [f"{bad.keys[0]} = {bad.value!r}: {bad.rule}" for bad in _check_shard_ports(config)]


def _check_shard_ports(config: Config) -> Iterable[_Bad]:
    """Shard K listens on the node's ports + K * stride: they must fit below 65536, and
    in a cluster be fixed (peers name them). A node without peers may leave its client
    and HTTP ports to the OS: the supervisor binds every shard's (docs/sharding.md,
    "Port 0")."""
    shards = config.node.shards
    if shards <= 1:
        return
    keys = {"server.listen": config.server.listen, "server.http": config.server.http}
    if config.cluster.clustered:
        keys["cluster.raft_listen"] = config.cluster.raft_listen
    for key, address in keys.items():
        try:
            port = split_host_port(address)[1]
        except ValueError:
            continue
        if port == 0:
            if config.cluster.clustered:
                yield _Bad(
                    (key, "node.shards"),
                    address,
                    f"must name a fixed port in a cluster with node.shards = {shards}: "
                    "shard K listens on it plus K * node.shard_port_stride, and peers and "
                    "clients find each shard of a node by that rule",
                )
        elif port + (shards - 1) * config.node.shard_port_stride > 65535:
            yield _Bad(
                (key, "node.shards", "node.shard_port_stride"),
                address,
                f"leaves no room for {shards} shards {config.node.shard_port_stride} ports "
                "apart below 65536; lower the port or node.shard_port_stride",
            )
    yield from _check_shard_port_overlap(config, keys)


_PORT_NAMES = {"server.listen": "client", "server.http": "HTTP", "cluster.raft_listen": "Raft"}


def _check_shard_port_overlap(config: Config, keys: Mapping[str, str]) -> Iterable[_Bad]:
    """No shard may listen on another shard's port: with a stride no larger than the
    spread of the node's ports (``node.shard_port_stride = 1``, client 7474, HTTP 7475),
    shard 1's client port is shard 0's HTTP port, and ``start`` failed with "Address
    already in use" as if another program held it. Only the first overlap is reported,
    with the smallest stride that avoids them all."""
    shards, stride = config.node.shards, config.node.shard_port_stride
    fixed: dict[str, tuple[str, int]] = {}
    for key, address in keys.items():
        try:
            host, port = split_host_port(address)
        except ValueError:
            continue
        if port != 0:  # the OS picks each shard's own
            fixed[key] = (host.lower(), port)
    if len(fixed) < 2 or stride < 1:
        return
    spread = max(port for _, port in fixed.values()) - min(port for _, port in fixed.values())
    for key, (host, port) in fixed.items():
        for other, (other_host, other_port) in fixed.items():
            if other == key:
                continue
            same_host = host == other_host or host in WILDCARD_HOSTS or other_host in WILDCARD_HOSTS
            gap = other_port - port  # shard K's `key` port meets shard J's `other` port
            if not same_host or gap <= 0 or gap % stride or gap // stride >= shards:
                continue
            shard = gap // stride
            yield _Bad(
                ("node.shard_port_stride", key, other, "node.shards"),
                stride,
                f"puts shard {shard}'s {_PORT_NAMES[key]} port ({key} {port} + "
                f"{shard} * {stride} = {other_port}) on shard 0's {_PORT_NAMES[other]} port "
                f"({other} {other_port}) with node.shards = {shards}; the node's shards "
                f"would collide with each other: use a node.shard_port_stride above "
                f"{spread} (the spread of the node's ports) or spread the ports apart",
            )
            return


def _check_announced(config: Config) -> Iterable[_Bad]:
    """A clustered node never announces a wildcard address (issue 12): peers would dial
    ``0.0.0.0:7451`` and clients would be redirected to ``0.0.0.0:7450``."""
    if not config.cluster.clustered:
        return
    for announced, key, listen_key, flag in (
        (
            announced_client_address(config),
            "server.advertise",
            "server.listen",
            "--advertise-client",
        ),
        (
            announced_raft_address(config),
            "cluster.advertise_raft",
            "cluster.raft_listen",
            "--advertise-raft",
        ),
    ):
        try:
            wildcard = is_wildcard(announced)
        except ValueError:
            continue  # reported by the section's own check
        if not wildcard:
            continue
        explicit = key if _value_of(config, key) is not None else listen_key
        yield _Bad(
            (explicit,),
            announced,
            f"is a wildcard address, and a node of a cluster announces this address to its "
            f"peers and clients; set {key} ({flag}) to a HOST:PORT they can reach, such "
            f"as this node's DNS name",
        )


def _value_of(config: Config, dotted: str) -> object:
    section, key = dotted.split(".")
    return getattr(getattr(config, section), key)


def config_warnings(config: Config) -> list[str]:
    """Things in a valid configuration that are probably mistakes, one sentence each.

    ``futureq check-config`` prints them on stderr and ``futureq start`` logs them; they
    do not stop the node.
    """
    warnings: list[str] = []
    try:
        client_wildcard = is_wildcard(announced_client_address(config))
    except ValueError:
        client_wildcard = False
    if not config.cluster.clustered and client_wildcard:
        warnings.append(
            f"server.listen = {config.server.listen!r} is a wildcard address and "
            "server.advertise is unset: clients are told this node is at "
            f"{announced_client_address(config)!r} (in HELLO answers); set server.advertise "
            "(--advertise-client) to the HOST:PORT clients reach it at"
        )
    return warnings
