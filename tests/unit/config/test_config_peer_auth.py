"""Peer authentication settings: the cluster secret file, node-id certificates, and the
refusal to run a node with peers that nothing authenticates (docs/security.md)."""

from __future__ import annotations

import os
import pathlib

import pytest
import trustme

from futureq.cli import server_main
from futureq.config_loader import load_config
from futureq.errors import ConfigError
from futureq.peer_credentials import CredentialError, generate_secret_file, read_secret_file
from futureq.raft.peer_auth import MIN_SECRET_BYTES

PEERS = "1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003"


@pytest.fixture
def secret_file(tmp_path: pathlib.Path) -> str:
    path = str(tmp_path / "cluster.secret")
    generate_secret_file(path)
    return path


def write_secret(tmp_path: pathlib.Path, data: bytes, mode: int = 0o600) -> str:
    path = tmp_path / "s"
    path.write_bytes(data)
    path.chmod(mode)
    return str(path)


# --- the secret file ---------------------------------------------------------------------


def test_generated_secret_is_private_long_and_never_overwritten(secret_file: str) -> None:
    assert os.stat(secret_file).st_mode & 0o777 == 0o600
    loaded = read_secret_file(secret_file)
    assert len(loaded.secret) == 64 and loaded.warnings == ()
    int(loaded.secret, 16)
    with pytest.raises(FileExistsError):
        generate_secret_file(secret_file)
    assert read_secret_file(secret_file) == loaded


def test_two_generated_secrets_differ(tmp_path: pathlib.Path) -> None:
    generate_secret_file(str(tmp_path / "a"))
    generate_secret_file(str(tmp_path / "b"))
    assert read_secret_file(str(tmp_path / "a")) != read_secret_file(str(tmp_path / "b"))


@pytest.mark.parametrize(
    ("data", "mode", "message"),
    [
        (b"", 0o600, "is empty"),
        (b"  \n\t\n", 0o600, "is empty"),
        (b"x" * (MIN_SECRET_BYTES - 1) + b"\n", 0o600, f"holds {MIN_SECRET_BYTES - 1} bytes"),
        (b"x" * 64, 0o644, "can be read by every user (mode 0644); restrict it with `chmod 600"),
        (b"x" * 64, 0o620, "can be written by others"),
        (b"x" * 64, 0o604, "can be read by every user"),
        (b"x" * 64, 0o602, "can be written by others"),
    ],
)
def test_unusable_secret_files_are_refused(
    tmp_path: pathlib.Path, data: bytes, mode: int, message: str
) -> None:
    path = write_secret(tmp_path, data, mode)
    with pytest.raises(CredentialError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_secret_file(path)


def test_missing_secret_file_says_how_to_make_one(tmp_path: pathlib.Path) -> None:
    with pytest.raises(CredentialError, match="does not exist; create it with `futureq generate"):
        read_secret_file(str(tmp_path / "nope"))
    with pytest.raises(CredentialError, match="is not a regular file"):
        read_secret_file(str(tmp_path))


def test_group_readable_secret_is_a_warning(tmp_path: pathlib.Path) -> None:
    loaded = read_secret_file(write_secret(tmp_path, b" " + b"k" * 40 + b"\n", 0o440))
    assert loaded.secret == b"k" * 40
    assert "readable by its group (mode 0440)" in loaded.warnings[0]


# --- the start-up rule -------------------------------------------------------------------


def test_a_node_with_peers_and_no_authentication_is_refused() -> None:
    for overrides in ({"peers": PEERS}, {"join": "127.0.0.1:7450"}):
        with pytest.raises(ConfigError) as info:
            load_config(env={}, overrides={"cluster": overrides})
        text = str(info.value)
        assert "must authenticate them" in text
        for flag in ("--cluster-secret-file", "--tls-ca", "--insecure-peers"):
            assert flag in text


def test_insecure_peers_or_a_secret_lets_it_start(secret_file: str) -> None:
    load_config(env={}, overrides={"cluster": {"peers": PEERS, "insecure_peers": True}})
    config = load_config(
        env={"FUTUREQ_CLUSTER_SECRET_FILE": secret_file}, overrides={"cluster": {"peers": PEERS}}
    )
    assert config.cluster.secret_file == secret_file
    load_config(env={"FUTUREQ_CLUSTER_INSECURE_PEERS": "true", "FUTUREQ_CLUSTER_PEERS": PEERS})


def test_single_node_needs_nothing() -> None:
    load_config(env={})


def test_bad_secret_file_is_a_config_problem(tmp_path: pathlib.Path) -> None:
    path = write_secret(tmp_path, b"short")
    with pytest.raises(ConfigError) as info:
        load_config(env={}, overrides={"cluster": {"peers": PEERS, "secret_file": path}})
    assert f"cluster.secret_file = '{path}' (from command line): holds 5 bytes" in str(info.value)
    assert "must authenticate them" not in str(info.value)


def _tls_files(tmp_path: pathlib.Path, ca: trustme.CA, *names: str) -> dict[str, str]:
    cert = ca.issue_cert(*names)
    paths = {"cert": tmp_path / "n.pem", "key": tmp_path / "n.key", "ca": tmp_path / "ca.pem"}
    cert.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    cert.private_key_pem.write_to_path(str(paths["key"]))
    ca.cert_pem.write_to_path(str(paths["ca"]))
    return {key: str(value) for key, value in paths.items()}


def _tls_overrides(files: dict[str, str]) -> dict[str, dict[str, object]]:
    return {
        "tls": {"cert_file": files["cert"], "key_file": files["key"], "ca_file": files["ca"]},
        "cluster": {"peers": PEERS, "cluster_id": "prod"},
        "server": {"node_id": 2},
    }


def test_mutual_tls_with_a_certificate_naming_the_node_is_enough(tmp_path: pathlib.Path) -> None:
    files = _tls_files(tmp_path, trustme.CA(), "127.0.0.1", "node-2.prod.futureq")
    config = load_config(env={}, overrides=_tls_overrides(files))
    assert config.cluster.secret_file is None


def test_mutual_tls_with_a_certificate_of_another_node_is_refused(tmp_path: pathlib.Path) -> None:
    files = _tls_files(tmp_path, trustme.CA(), "127.0.0.1", "node-1.prod.futureq")
    with pytest.raises(ConfigError) as info:
        load_config(env={}, overrides=_tls_overrides(files))
    assert "names nodes [1] of cluster 'prod', so peers would refuse this node 2" in str(info.value)
    assert "'node-2.prod.futureq'" in str(info.value)


def test_mutual_tls_with_a_certificate_from_another_ca_is_refused(tmp_path: pathlib.Path) -> None:
    files = _tls_files(tmp_path, trustme.CA(), "node-2.prod.futureq")
    trustme.CA().cert_pem.write_to_path(files["ca"])
    with pytest.raises(ConfigError, match="is not accepted by a peer trusting tls.ca_file"):
        load_config(env={}, overrides=_tls_overrides(files))


def test_tls_without_a_ca_is_not_peer_authentication(tmp_path: pathlib.Path) -> None:
    files = _tls_files(tmp_path, trustme.CA(), "127.0.0.1")
    overrides = _tls_overrides(files)
    del overrides["tls"]["ca_file"]  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="must authenticate them"):
        load_config(env={}, overrides=overrides)


# --- the command line --------------------------------------------------------------------


def test_generate_secret_command(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "cluster.secret")
    assert server_main.main(["generate-secret", path]) == 0
    assert "give every node a copy" in capsys.readouterr().out
    assert len(read_secret_file(path).secret) == 64
    assert server_main.main(["generate-secret", path]) == 2
    assert "exists; it is never overwritten" in capsys.readouterr().err


def test_start_flags_for_peer_authentication(secret_file: str) -> None:
    parser = server_main.build_parser()
    args = parser.parse_args(
        ["start", "--peers", PEERS, "--cluster-secret-file", secret_file, "--insecure-peers"]
    )
    config = server_main._load(args)
    assert config.cluster.secret_file == secret_file and config.cluster.insecure_peers


def test_check_config_reports_unauthenticated_peers(capsys: pytest.CaptureFixture[str]) -> None:
    assert server_main.main(["check-config", "--peers", PEERS]) == 2
    assert "must authenticate them" in capsys.readouterr().err
