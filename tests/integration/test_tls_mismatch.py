"""TLS on one side only, an untrusted certificate, an HTTP port given as the client port,
an unreadable ``--tls-ca``: each is told in a sentence saying what to fix, at once.

Found by a tester: ``futureq-cli --tls`` against a plaintext node printed
``[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1006); is a FutureQ server
running at ...?`` after retrying for 5 s; an untrusted certificate asked the same
question (a server was running); a plaintext client of a TLS node got ``closed the
connection during HELLO``, and the node logged ``TLS handshake with ... failed:`` with
nothing after the colon; the HTTP port answered ``frame of 1213486160 bytes exceeds the
limit ...; send smaller batches or payloads``; ``--tls-ca`` naming a missing file
printed ``error: [OS_ERROR] No such file or directory`` naming neither flag nor file.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
import trustme
from tests.backends import on_both_backends
from tests.integration.broker_process import BrokerProcess
from tests.integration.cli_process import cli

from futureq.client import open_client
from futureq.errors import ConnectionLostError

NOT_RUNNING_HINT = "is a FutureQ server running"


@pytest.fixture
def tls_broker(broker_factory: Callable[..., BrokerProcess], tls_args: list[str]) -> BrokerProcess:
    return broker_factory(extra_args=tls_args)


@on_both_backends
async def test_library_says_what_is_wrong_with_tls_at_once(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    # TLS against the plaintext client port, and against the HTTP port.
    context = ssl.create_default_context()
    trustme.CA().configure_trust(context)
    for address in (broker.client_address, broker.http_address):
        started = time.monotonic()
        with pytest.raises(ConnectionLostError, match="does not speak TLS on that port"):
            async with open_client(address, ssl_context=context, connect_timeout_s=10):
                pass
        assert time.monotonic() - started < 5, "a TLS mismatch is not retried"
    # Plaintext against the HTTP port.
    started = time.monotonic()
    with pytest.raises(ConnectionLostError, match="answered in HTTP, so it is an HTTP port"):
        async with open_client(broker.http_address, connect_timeout_s=10):
            pass
    assert time.monotonic() - started < 5


@on_both_backends
async def test_library_names_an_untrusted_certificate_and_a_plaintext_client(
    tls_broker: BrokerProcess, tls_files: dict[str, Path]
) -> None:
    untrusting = ssl.create_default_context()
    trustme.CA().configure_trust(untrusting)
    started = time.monotonic()
    with pytest.raises(ConnectionLostError, match="its TLS certificate was refused: unable"):
        async with open_client(
            tls_broker.client_address, ssl_context=untrusting, connect_timeout_s=10
        ):
            pass
    assert time.monotonic() - started < 5
    trusting = ssl.create_default_context(cafile=str(tls_files["ca"]))
    with pytest.raises(ConnectionLostError, match="certificate was refused: .*mismatch"):
        async with open_client(
            tls_broker.client_address,
            ssl_context=trusting,
            server_hostname="elsewhere.example",
            connect_timeout_s=10,
        ):
            pass
    with pytest.raises(ConnectionLostError, match="a server that wants TLS on this port"):
        async with open_client(tls_broker.client_address, connect_timeout_s=1):
            pass
    log = await anyio.Path(tls_broker.stderr_path).read_text()
    failures = [line for line in log.splitlines() if "TLS handshake with" in line]
    assert failures, log[-2000:]
    assert all(not line.rstrip().endswith("failed:") for line in failures), failures
    assert any("a plaintext client?" in line for line in failures), failures


def test_cli_tls_mismatch_sentences(
    broker_factory: Callable[..., BrokerProcess], tls_args: list[str], tls_files: dict[str, Path]
) -> None:
    plain = broker_factory()
    done = cli(plain.client_address, "--tls", "status")
    assert done.returncode == 1, done
    assert "does not speak TLS on that port" in done.stderr, done.stderr
    assert NOT_RUNNING_HINT not in done.stderr and "_ssl.c" not in done.stderr
    done = cli(plain.http_address, "status")
    assert done.returncode == 1, done
    assert "it is an HTTP port" in done.stderr and "smaller batches" not in done.stderr
    plain.terminate()
    secured = broker_factory(extra_args=tls_args)
    done = cli(secured.client_address, "--tls", "status")
    assert done.returncode == 1, done
    assert "its TLS certificate was refused" in done.stderr, done.stderr
    assert NOT_RUNNING_HINT not in done.stderr and "_ssl.c" not in done.stderr
    done = cli(secured.client_address, "--tls-ca", str(tls_files["ca"]), "status")
    assert done.returncode == 0, done


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda tmp: tmp / "missing.pem", "cannot be read: no such file or directory"),
        (lambda tmp: tmp, "cannot be read: is a directory"),
        (lambda tmp: _written(tmp / "notes.txt", "not a certificate\n"), "holds no CA"),
    ],
)
def test_cli_unusable_tls_ca_is_a_usage_error(
    tmp_path: Path, make: Callable[[Path], Path], expected: str
) -> None:
    path = make(tmp_path)
    done = cli("127.0.0.1:1", "--tls-ca", str(path), "status")
    assert done.returncode == 2, done
    assert f"--tls-ca {str(path)!r}: {expected}" in done.stderr, done.stderr
    assert "OS_ERROR" not in done.stderr


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_cli_presents_a_client_certificate(
    broker_factory: Callable[..., BrokerProcess], tls_args: list[str], tls_files: dict[str, Path]
) -> None:
    """Found by a tester: futureq-cli had no way to give a client certificate, so a
    node with tls.require_client_cert could not be reached from it at all, and the
    refusal read only "closed the connection during HELLO"."""
    secured = broker_factory(
        extra_args=[*tls_args, "--tls-ca", str(tls_files["ca"])],
        env={"FUTUREQ_TLS_REQUIRE_CLIENT_CERT": "true"},
    )
    ca = str(tls_files["ca"])
    done = cli(secured.client_address, "--tls-ca", ca, "status")
    assert done.returncode == 1, done
    assert "requires client certificates (tls.require_client_cert)" in done.stderr, done.stderr
    done = cli(
        secured.client_address,
        *["--tls-ca", ca, "--tls-cert", str(tls_files["cert"]), "--tls-key"],
        *[str(tls_files["key"]), "status"],
    )
    assert done.returncode == 0, done
    done = cli(secured.client_address, "--tls-cert", str(tls_files["cert"]), "status")
    assert done.returncode == 2 and "add --tls-ca FILE (or --tls)" in done.stderr, done
    done = cli(secured.client_address, "--tls-ca", ca, "--tls-cert", ca, "status")
    assert done.returncode == 2, done
    assert "not a PEM certificate and its matching private key" in done.stderr, done.stderr
