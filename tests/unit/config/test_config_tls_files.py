"""TLS files that exist but cannot serve (a key of another certificate, certificate and
key swapped, a garbage certificate, key or CA) are configuration problems naming the
setting and the file: ``check-config`` and ``start`` exit 2, not 0 and 4 with a bare
``[SSL] PEM lib`` (docs/operations.md, exit codes)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import trustme

from futureq.config_loader import load_config
from futureq.errors import ConfigError


@pytest.fixture
def files(tmp_path: pathlib.Path) -> dict[str, str]:
    """PEM files by name: two certificates with their keys, a CA, and garbage."""
    ca = trustme.CA()
    paths: dict[str, str] = {}
    for number in (1, 2):
        issued = ca.issue_cert("localhost")
        paths[f"cert{number}"] = str(tmp_path / f"cert{number}.pem")
        paths[f"key{number}"] = str(tmp_path / f"key{number}.pem")
        issued.cert_chain_pems[0].write_to_path(paths[f"cert{number}"])
        issued.private_key_pem.write_to_path(paths[f"key{number}"])
    paths["ca"] = str(tmp_path / "ca.pem")
    ca.cert_pem.write_to_path(paths["ca"])
    paths["garbage"] = str(tmp_path / "garbage.pem")
    pathlib.Path(paths["garbage"]).write_text("garbage\n")
    return paths


CASES = [
    # (cert, key, ca), the key the problem names, words of the sentence
    (("cert1", "key2", None), "tls.key_file", "is not the private key of tls.cert_file"),
    (("key1", "cert1", None), "tls.cert_file", "holds no PEM certificate"),
    (("garbage", "key1", None), "tls.cert_file", "holds no PEM certificate"),
    (("cert1", "garbage", None), "tls.key_file", "holds no usable PEM private key"),
    (("cert1", "key1", "garbage"), "tls.ca_file", "holds no PEM CA certificate"),
]


@pytest.mark.parametrize(("names", "key", "says"), CASES)
def test_unusable_tls_files_are_refused_naming_the_setting_and_file(
    files: dict[str, str], names: tuple[str, str, str | None], key: str, says: str
) -> None:
    cert, tls_key, ca = (files[name] if name else None for name in names)
    with pytest.raises(ConfigError) as caught:
        load_config(overrides={"tls": {"cert_file": cert, "key_file": tls_key, "ca_file": ca}})
    message = str(caught.value)
    bad_file = {"tls.cert_file": cert, "tls.key_file": tls_key, "tls.ca_file": ca}[key]
    assert f"{key} = {bad_file!r}" in message, message
    assert says in message, message
    assert "1 problem" in message, message  # said once, not again by another check
    assert "_ssl.c" not in message, message


def test_good_tls_files_pass(files: dict[str, str]) -> None:
    config = load_config(
        overrides={"tls": {"cert_file": files["cert1"], "key_file": files["key1"],
                           "ca_file": files["ca"]}}
    )  # fmt: skip
    assert config.tls.enabled


def test_start_and_check_config_exit_2_for_a_key_of_another_certificate(
    files: dict[str, str], tmp_path: pathlib.Path
) -> None:
    flags = ["--shards", "1", "--data-dir", str(tmp_path / "data"), "--listen",
             "127.0.0.1:0", "--http", "127.0.0.1:0", "--tls-cert", files["cert1"],
             "--tls-key", files["key2"]]  # fmt: skip
    for command in ("check-config", "start"):
        done = subprocess.run(
            [sys.executable, "-m", "futureq.cli.server_main", command, *flags],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 2, (command, done.stdout + done.stderr)
        assert "tls.key_file" in done.stderr and files["key2"] in done.stderr, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
