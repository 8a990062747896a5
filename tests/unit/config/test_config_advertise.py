"""Advertised addresses: ``--advertise-client``/``--advertise-raft``, and a node of a
cluster that would announce a wildcard is refused (issue 12)."""

from __future__ import annotations

import attrs
import pytest

from futureq.cli import server_main
from futureq.config import (
    ClusterSection,
    announced_client_address,
    announced_raft_address,
    is_wildcard,
    same_address,
)
from futureq.config_cross_checks import config_warnings
from futureq.config_loader import load_config
from futureq.errors import ConfigError

# These tests are about addresses: where peer authentication (issue 7) is in, they opt
# out of it, so a node with peers and no credential is not a second problem.
_NO_AUTH = {"insecure_peers": True} if "insecure_peers" in attrs.fields_dict(ClusterSection) else {}
PEERS = {"cluster": {"peers": "1=n1:7451,2=n2:7451,3=n3:7451", **_NO_AUTH}}


def _wildcard_lines(error: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    return [line for line in str(error.value).splitlines() if "wildcard" in line]


@pytest.mark.parametrize(
    ("address", "wildcard"),
    [
        ("0.0.0.0:7450", True),
        ("[::]:7450", True),
        ("*:7450", True),
        ("127.0.0.1:7450", False),
        ("futureq-0.futureq-headless:7450", False),
        ("[::1]:7450", False),
    ],
)
def test_is_wildcard(address: str, wildcard: bool) -> None:
    assert is_wildcard(address) is wildcard


def test_announced_addresses_default_to_the_listeners_and_follow_advertise() -> None:
    config = load_config(env={})
    assert announced_client_address(config) == "127.0.0.1:7450"
    assert announced_raft_address(config) == "127.0.0.1:7451"
    config = load_config(
        env={"FUTUREQ_CLUSTER_ADVERTISE_RAFT": "n1:7451"},
        overrides={"server": {"advertise": "n1:7450"}},
    )
    assert announced_client_address(config) == "n1:7450"
    assert announced_raft_address(config) == "n1:7451"
    assert config.cluster.advertise_raft == "n1:7451"


def test_a_clustered_node_with_wildcard_listeners_and_advertised_names_is_valid() -> None:
    config = load_config(
        env={},
        overrides={
            "server": {"listen": "0.0.0.0:7450", "advertise": "n1:7450"},
            "cluster": {
                **PEERS["cluster"],
                "raft_listen": "0.0.0.0:7451",
                "advertise_raft": "n1:7451",
            },
        },
    )
    assert config_warnings(config) == []


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (
            {"server": {"listen": "0.0.0.0:7450"}, "cluster": {"advertise_raft": "n1:7451"}},
            "server.listen",
        ),
        (
            {"server": {"advertise": "[::]:7450"}, "cluster": {"advertise_raft": "n1:7451"}},
            "server.advertise",
        ),
        ({"cluster": {"raft_listen": "0.0.0.0:7451"}}, "cluster.raft_listen"),
        ({"cluster": {"advertise_raft": "0.0.0.0:7451"}}, "cluster.advertise_raft"),
    ],
)
def test_a_clustered_node_that_would_announce_a_wildcard_is_refused(
    overrides: dict[str, dict[str, object]], key: str
) -> None:
    for extra in (PEERS["cluster"], {"join": "n1:7450", **_NO_AUTH}):
        merged = {**overrides, "cluster": {**overrides.get("cluster", {}), **extra}}
        with pytest.raises(ConfigError) as error:
            load_config(env={}, overrides=merged)
        (line,) = _wildcard_lines(error)
        assert line.startswith(f"  - {key} = "), line
        flag = "--advertise-client" if key.startswith("server") else "--advertise-raft"
        assert flag in line


def test_a_bad_listen_address_is_reported_once_not_as_a_wildcard() -> None:
    with pytest.raises(ConfigError) as error:
        load_config(env={}, overrides={"server": {"listen": "nowhere"}, **PEERS})
    assert "(1 problem)" in str(error.value)
    assert _wildcard_lines(error) == []


def test_advertise_raft_must_name_a_real_port() -> None:
    with pytest.raises(ConfigError, match=r"cluster.advertise_raft = 'n1:0'.*not 0"):
        load_config(env={}, overrides={"cluster": {"advertise_raft": "n1:0"}})


def test_a_single_node_listening_on_a_wildcard_gets_a_warning_not_a_refusal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = load_config(env={}, overrides={"server": {"listen": "0.0.0.0:7450"}})
    (warning,) = config_warnings(config)
    assert "server.advertise" in warning and "--advertise-client" in warning
    assert server_main.main(["check-config", "--listen", "0.0.0.0:7450"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("futureq: warning: server.listen = '0.0.0.0:7450'")
    assert (
        server_main.main(
            ["check-config", "--listen", "0.0.0.0:7450", "--advertise-client", "h:7450"]
        )
        == 0
    )
    assert capsys.readouterr().err == ""


def test_the_advertise_flags_set_their_keys(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["check-config", "--json", "--advertise-raft", "n1:7451"]
    assert server_main.main([*args, "--advertise-client", "n1:7450"]) == 0
    assert '"advertise": "n1:7450"' in capsys.readouterr().out
    assert server_main.main([*args, "--advertise", "n1:7460"]) == 0  # the older spelling
    out = capsys.readouterr().out
    assert '"advertise": "n1:7460"' in out and '"advertise_raft": "n1:7451"' in out


def test_peers_naming_a_wildcard_are_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"cluster.peers = .*wildcard addresses \(2=0.0.0.0:7451\)"
    ):
        load_config(env={}, overrides={"cluster": {"peers": "1=n1:7451,2=0.0.0.0:7451"}})


def test_a_single_node_advertising_a_wildcard_is_warned_about_its_advertise() -> None:
    # The warning once blamed server.listen (127.0.0.1, no wildcard) and said
    # server.advertise was unset when it was the wildcard.
    config = load_config(
        env={},
        overrides={"server": {"listen": "127.0.0.1:7450", "advertise": "0.0.0.0:7450"}},
    )
    (warning,) = config_warnings(config)
    assert warning.startswith("server.advertise = '0.0.0.0:7450' is a wildcard address")
    assert "unset" not in warning and "server.listen" not in warning


@pytest.mark.parametrize(
    ("first", "second", "same"),
    [
        ("localhost:7451", "127.0.0.1:7451", True),
        ("LOCALHOST.:7451", "[::1]:7451", True),
        ("[::ffff:127.0.0.1]:7451", "127.0.0.1:7451", True),
        ("[0:0::1]:7451", "[::1]:7451", True),
        ("N1.example.:7451", "n1.example:7451", True),
        ("127.0.0.1:7451", "127.0.0.2:7451", False),
        ("localhost:7451", "127.0.0.1:7452", False),
        ("n1:7451", "n2:7451", False),
    ],
)
def test_same_address_compares_the_machine_and_port_not_the_text(
    first: str, second: str, same: bool
) -> None:
    """``add-node`` and ``cluster.peers`` compared address text: ``localhost:P`` and
    ``127.0.0.1:P`` passed as two nodes (found by a tester)."""
    assert same_address(first, second) is same
    assert same_address(second, first) is same
