"""Config loading: precedence of the layers, type conversion, and error reporting."""

from __future__ import annotations

import pathlib

import attrs
import pytest
import trustme

from futureq.config import Config
from futureq.config_conversion import SECTIONS, parse_duration_ms
from futureq.config_loader import env_var_name, load_config
from futureq.errors import ConfigError


def write(tmp_path: pathlib.Path, text: str) -> str:
    path = tmp_path / "futureq.toml"
    path.write_text(text)
    return str(path)


def problems_of(error: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    return [
        line.removeprefix("  - ")
        for line in str(error.value).splitlines()
        if line.startswith("  - ")
    ]


# --- precedence ---------------------------------------------------------------------


def test_no_file_no_env_gives_the_defaults() -> None:
    assert load_config(env={}) == Config()


def test_file_overrides_defaults(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, '[server]\nnode_id = 2\ndata_dir = "/from/file"\n')
    config = load_config(path, env={})
    assert config.server.node_id == 2
    assert config.server.data_dir == "/from/file"
    assert config.server.listen == Config().server.listen


def test_env_overrides_file(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, '[server]\nnode_id = 2\ndata_dir = "/from/file"\n')
    config = load_config(path, env={"FUTUREQ_SERVER_DATA_DIR": "/from/env"})
    assert config.server.data_dir == "/from/env"
    assert config.server.node_id == 2


def test_flags_override_env_and_file(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, '[server]\nnode_id = 2\ndata_dir = "/from/file"\n')
    config = load_config(
        path,
        env={"FUTUREQ_SERVER_DATA_DIR": "/from/env", "FUTUREQ_SERVER_NODE_ID": "3"},
        overrides={"server": {"data_dir": "/from/flag", "node_id": None}},
    )
    assert config.server.data_dir == "/from/flag"
    assert config.server.node_id == 3  # a None override means "flag not given"


def test_env_text_is_converted_to_the_field_type() -> None:
    config = load_config(
        env={
            "FUTUREQ_LIMITS_MAX_PAYLOAD_BYTES": "1000",
            "FUTUREQ_STORAGE_FSYNC": "false",
            "FUTUREQ_TLS_REQUIRE_CLIENT_CERT": "no",
            "FUTUREQ_QUEUE_VISIBILITY_TIMEOUT_MS": "45s",
            "FUTUREQ_SERVER_ADVERTISE": "",
        }
    )
    assert config.limits.max_payload_bytes == 1000
    assert config.storage.fsync is False
    assert config.tls.require_client_cert is False
    assert config.queue.visibility_timeout_ms == 45_000
    assert config.server.advertise is None


def test_unrelated_futureq_variables_are_ignored() -> None:
    assert load_config(env={"FUTUREQ_CONFIG": "x.toml", "FUTUREQ_SEED": "7", "PATH": "/bin"}) == (
        Config()
    )


def test_duration_strings_are_accepted_in_toml(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, '[queue]\nhorizon_ms = "5m"\nvisibility_timeout_ms = 250\n')
    config = load_config(path, env={})
    assert config.queue.horizon_ms == 300_000
    assert config.queue.visibility_timeout_ms == 250


@pytest.mark.parametrize(
    ("text", "expected"),
    [("250ms", 250), ("30s", 30_000), ("5m", 300_000), ("2h", 7_200_000), ("1d", 86_400_000)],
)
def test_parse_duration_ms(text: str, expected: int) -> None:
    assert parse_duration_ms(text) == expected


@pytest.mark.parametrize("text", ["30", "s", "1.5s", "-1s", "10 years"])
def test_parse_duration_ms_refuses_other_text(text: str) -> None:
    assert parse_duration_ms(text) is None


def test_every_field_has_an_env_variable() -> None:
    env = {}
    for section, cls in SECTIONS.items():
        for name, field in attrs.fields_dict(cls).items():
            default = field.default
            if (section, name) == ("node", "shards"):
                env[env_var_name(section, name)] = "auto"  # the default, as the env takes it
            elif isinstance(default, bool):
                env[env_var_name(section, name)] = "true" if default else "false"
            elif isinstance(default, int | str):
                env[env_var_name(section, name)] = str(default)
    assert load_config(env=env) == Config()


# --- errors ---------------------------------------------------------------------------


def test_unknown_key_in_file_names_the_dotted_key_and_lists_the_known_ones(
    tmp_path: pathlib.Path,
) -> None:
    path = write(tmp_path, "[limits]\nmax_payload = 10\n")
    with pytest.raises(ConfigError) as error:
        load_config(path, env={})
    [problem] = problems_of(error)
    assert "limits.max_payload" in problem
    assert path in problem
    assert "max_payload_bytes" in problem  # what is allowed


def test_unknown_section_is_an_error(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, "[raft_stuff]\nx = 1\n")
    with pytest.raises(ConfigError, match=r"\[raft_stuff\].*not a known section"):
        load_config(path, env={})


def test_section_that_is_not_a_table_is_an_error(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, "server = 5\n")
    with pytest.raises(ConfigError, match=r"server = 5 .*must be a table"):
        load_config(path, env={})


def test_unknown_key_in_env_names_the_variable() -> None:
    with pytest.raises(ConfigError) as error:
        load_config(env={"FUTUREQ_STORAGE_FSYNC_ALWAYS": "1"})
    [problem] = problems_of(error)
    assert "storage.fsync_always" in problem
    assert "FUTUREQ_STORAGE_FSYNC_ALWAYS" in problem


@pytest.mark.parametrize(
    ("toml", "key", "value_text", "allowed"),
    [
        ('[limits]\nmax_payload_bytes = "big"', "limits.max_payload_bytes", "'big'", "integer"),
        ("[limits]\nmax_payload_bytes = 1.5", "limits.max_payload_bytes", "1.5", "integer"),
        ("[queue]\nmax_deliveries = true", "queue.max_deliveries", "True", "integer"),
        ("[storage]\nfsync = 1", "storage.fsync", "1", "true or false"),
        ("[server]\ndata_dir = 7", "server.data_dir", "7", "string"),
        ("[server]\nnode_id = 0", "server.node_id", "0", "at least 1"),
        ('[server]\nlisten = "nohost"', "server.listen", "'nohost'", "HOST:PORT"),
        ('[server]\nhttp = "h:70000"', "server.http", "'h:70000'", "0..65535"),
        ('[server]\nadvertise = "h:0"', "server.advertise", "'h:0'", "1..65535"),
        ('[server]\nlog_level = "loud"', "server.log_level", "'loud'", "debug, info"),
        ('[server]\nauth_token = ""', "server.auth_token", "''", "non-empty"),
        ("[server]\nshutdown_grace_ms = -1", "server.shutdown_grace_ms", "-1", "at least 0"),
        ("[limits]\nmax_frame_bytes = 0", "limits.max_frame_bytes", "0", "at least 65536"),
        ("[limits]\nmax_frame_bytes = 4096", "limits.max_frame_bytes", "4096", "at least 65536"),
        ("[limits]\nmax_payload_bytes = 4194304", "limits.max_payload_bytes", "4194304", "smaller"),
        (
            "[limits]\nmax_frame_bytes = 65536\nmax_payload_bytes = 1000\nmax_batch_items = 5000",
            "limits.max_batch_items",
            "5000",
            "must be at most 4092 with limits.max_frame_bytes 65536: a PUBLISH_OK names",
        ),
        (
            "[limits]\nmax_payload_bytes = 4194303",
            "limits.max_payload_bytes",
            "4194303",
            "at least 8192 bytes smaller than limits.max_frame_bytes (4194304), so at most 4186112",
        ),
        (
            "[queue]\nvisibility_timeout_ms = 0",
            "queue.visibility_timeout_ms",
            "0",
            "at least 100 ms",
        ),
        ('[queue]\nhorizon_ms = "soon"', "queue.horizon_ms", "'soon'", "milliseconds"),
        ("[storage]\nwrite_buffer_mb = 0", "storage.write_buffer_mb", "0", "at least 1"),
        ('[tls]\ncert_file = "/no/such.pem"', "tls.cert_file", "'/no/such.pem'", "key_file"),
        ('[tls]\nca_file = "/no/ca.pem"', "tls.ca_file", "'/no/ca.pem'", "existing PEM file"),
        ("[tls]\nrequire_client_cert = true", "tls.require_client_cert", "True", "ca_file"),
        ("[tls]\nhttp = true", "tls.http", "True", "cert_file"),
        (
            '[server]\nwebsocket_origins = "app.example.com"',
            "server.websocket_origins",
            "'app.example.com'",
            "scheme://host",
        ),
        (
            '[server]\nwebsocket_origins = "https://ok.example, http://a.b:99999"',
            "server.websocket_origins",
            "'https://ok.example, http://a.b:99999'",
            "'http://a.b:99999' has port 99999; a port is 1 to 65535",
        ),
    ],
)
def test_bad_value_names_key_value_and_what_is_allowed(
    tmp_path: pathlib.Path, toml: str, key: str, value_text: str, allowed: str
) -> None:
    path = write(tmp_path, toml + "\n")
    with pytest.raises(ConfigError) as error:
        load_config(path, env={})
    matching = [problem for problem in problems_of(error) if problem.startswith(key + " ")]
    assert matching, str(error.value)
    assert any(f"= {value_text} " in problem and allowed in problem for problem in matching), (
        matching
    )


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(ConfigError) as error:
        load_config(env={"FUTUREQ_LIMITS_MAX_PAYLOAD_BYTES": "lots"})
    [problem] = problems_of(error)
    assert problem.startswith("limits.max_payload_bytes = 'lots'")
    assert "FUTUREQ_LIMITS_MAX_PAYLOAD_BYTES" in problem


def test_bad_flag_value_says_command_line() -> None:
    with pytest.raises(ConfigError, match=r"server.node_id = -4 \(from command line\)"):
        load_config(env={}, overrides={"server": {"node_id": -4}})


def test_every_problem_is_reported_at_once(tmp_path: pathlib.Path) -> None:
    path = write(
        tmp_path,
        "[server]\nnode_id = 0\nbogus = 1\n"
        '[limits]\nmax_frame_bytes = "x"\nmax_batch_items = 0\n'
        '[tls]\nkey_file = "/no/key.pem"\n'
        "[extra]\n",
    )
    with pytest.raises(ConfigError) as error:
        load_config(path, env={"FUTUREQ_STORAGE_FSYNC": "perhaps"})
    problems = problems_of(error)
    message = str(error.value)
    assert message.startswith(f"invalid configuration ({len(problems)} problems):")
    for needle in (
        "server.node_id = 0",
        "server.bogus",
        "limits.max_frame_bytes = 'x'",
        "limits.max_batch_items = 0",
        "tls.key_file = '/no/key.pem'",
        "[extra]",
        "storage.fsync = 'perhaps'",
    ):
        assert any(needle in problem for problem in problems), (needle, problems)


def test_a_check_on_a_key_of_the_wrong_type_is_not_reported_twice(
    tmp_path: pathlib.Path,
) -> None:
    # max_frame_bytes fails to structure, so "payload < frame" is not checked against a
    # default the user never wrote.
    path = write(tmp_path, '[limits]\nmax_frame_bytes = "x"\nmax_payload_bytes = 99999999\n')
    with pytest.raises(ConfigError) as error:
        load_config(path, env={})
    [problem] = problems_of(error)
    assert problem.startswith("limits.max_frame_bytes")


def test_tls_with_existing_files_is_accepted(tmp_path: pathlib.Path) -> None:
    cert, key, ca = (tmp_path / name for name in ("cert.pem", "key.pem", "ca.pem"))
    authority = trustme.CA()
    issued = authority.issue_cert("localhost")
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    authority.cert_pem.write_to_path(str(ca))
    config = load_config(
        env={},
        overrides={
            "tls": {
                "cert_file": str(cert),
                "key_file": str(key),
                "ca_file": str(ca),
                "require_client_cert": True,
            }
        },
    )
    assert config.tls.enabled


def test_missing_file_is_a_config_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "nope.toml"), env={})


def test_invalid_toml_is_a_config_error(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, "[server\nnode_id = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path, env={})


def test_listen_and_http_on_the_same_port_is_an_error() -> None:
    with pytest.raises(ConfigError, match="must differ from server.listen"):
        load_config(env={"FUTUREQ_SERVER_HTTP": "127.0.0.1:7450"})


def test_port_zero_is_allowed_for_listeners() -> None:
    config = load_config(
        env={"FUTUREQ_SERVER_LISTEN": "127.0.0.1:0", "FUTUREQ_SERVER_HTTP": "[::1]:0"}
    )
    assert config.server.http == "[::1]:0"


def test_the_cli_server_variable_is_not_server_config() -> None:
    # FUTUREQ_SERVER is futureq-cli's server list; exporting it must not stop `futureq start`.
    config = load_config(env={"FUTUREQ_SERVER": "127.0.0.1:7450", "FUTUREQ_TOKEN": "x"})
    assert config == Config()


def test_node_id_and_prefetch_have_upper_bounds() -> None:
    with pytest.raises(ConfigError) as error:
        load_config(
            env={"FUTUREQ_SERVER_NODE_ID": str(2**40), "FUTUREQ_LIMITS_MAX_PREFETCH": str(10**9)}
        )
    text = str(error.value)
    assert "server.node_id" in text and "limits.max_prefetch" in text


# --- combinations `start` would refuse later (found by trying them on check-config) --------


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (
            {"server": {"node_id": 3}, "cluster": {"peers": "1=h1:7451,2=h2:7451"}},
            ["lists nodes [1, 2] but not this node's id 3"],
        ),
        (
            {"cluster": {"peers": "1=h1:7451,2=H1:7451"}},
            ["gives nodes [1, 2] the same address h1:7451"],
        ),
        (
            {"cluster": {"peers": "1=localhost:7451,2=h2:7451,3=[::ffff:127.0.0.1]:7451"}},
            ["gives nodes [1, 3] the same address localhost:7451 (1=localhost:7451, 3="],
        ),
        (
            {
                "server": {"listen": "127.0.0.1:7450"},
                "cluster": {"peers": "1=h1:7451,2=h2:7451", "raft_listen": "127.0.0.1:7450"},
            },
            ["cluster.raft_listen", "must differ from server.listen"],
        ),
        (
            {"limits": {"max_node_buffer_bytes": 100}},
            ["limits.max_node_buffer_bytes = 100", "no large frame could ever be read whole"],
        ),
    ],
)
def test_combinations_start_cannot_run_are_refused_by_the_loader(
    overrides: dict[str, dict[str, object]], words: list[str]
) -> None:
    cluster = overrides.setdefault("cluster", {})
    cluster.setdefault("insecure_peers", True)
    with pytest.raises(ConfigError) as error:
        load_config(env={}, overrides=overrides)
    message = str(error.value)
    for word in words:
        assert word in message, message


# --- unit mistakes (issue 8, input 5) ------------------------------------------------


def test_a_visibility_timeout_that_can_only_be_seconds_is_refused_with_a_sentence() -> None:
    env = {"FUTUREQ_QUEUE_VISIBILITY_TIMEOUT_MS": "30"}
    with pytest.raises(ConfigError) as error:
        load_config(env=env)
    [problem] = problems_of(error)
    assert problem.startswith("queue.visibility_timeout_ms = 30")
    assert "FUTUREQ_QUEUE_VISIBILITY_TIMEOUT_MS" in problem
    assert "looks like seconds taken for milliseconds (did you mean 30000" in problem
    assert load_config(env={"FUTUREQ_QUEUE_VISIBILITY_TIMEOUT_MS": "100"})


def test_max_clock_offset_is_checked_for_units() -> None:
    with pytest.raises(ConfigError) as error:
        load_config(env={"FUTUREQ_CLUSTER_MAX_CLOCK_OFFSET_MS": "1"})
    [problem] = problems_of(error)
    assert "between 10 and 60000 ms" in problem and "seconds taken for milliseconds" in problem


def test_an_election_timeout_spread_wider_than_the_timeout_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"cluster.election_timeout_spread_ticks = 11"):
        load_config(env={"FUTUREQ_CLUSTER_ELECTION_TIMEOUT_SPREAD_TICKS": "11"})
    spread = load_config(env={"FUTUREQ_CLUSTER_ELECTION_TIMEOUT_SPREAD_TICKS": "10"})
    assert spread.cluster.election_timeout_spread_ticks == 10


def test_a_config_file_that_is_not_utf8_is_named_not_a_traceback(tmp_path: pathlib.Path) -> None:
    # Found by giving a binary file: tomllib's UnicodeDecodeError ended the start.
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[server]\ndata_dir = "caf\xe9"\n')
    with pytest.raises(ConfigError) as error:
        load_config(str(path), env={})
    assert "is not valid TOML: byte 0xe9 on line 2 is not UTF-8" in str(error.value)


@pytest.mark.parametrize("cluster_id", ["c" * 256, "a b", "tab\there", "é" * 128])
def test_a_cluster_id_that_no_handshake_carries_is_refused(cluster_id: str) -> None:
    # A 9,000-character id was taken and the cluster never formed: every peer refused
    # the handshake carrying it as a frame over 8 KiB.
    with pytest.raises(ConfigError) as error:
        load_config(env={}, overrides={"cluster": {"cluster_id": cluster_id}})
    [problem] = problems_of(error)
    assert problem.startswith("cluster.cluster_id = ")
    assert "must be a name of 1 to 255 bytes without spaces or control characters" in problem


def test_a_cluster_id_of_255_bytes_is_taken() -> None:
    config = load_config(env={}, overrides={"cluster": {"cluster_id": "prod.eu-1." + "c" * 245}})
    assert len(config.cluster.cluster_id) == 255


def test_websocket_origins_with_ports_and_ipv6_hosts_are_taken(tmp_path: pathlib.Path) -> None:
    origins = "http://localhost:8080, https://[::1]:443, https://app.example.com, *"
    path = write(tmp_path, f'[server]\nwebsocket_origins = "{origins}"\n')
    assert load_config(path, env={}).server.websocket_origins == origins
