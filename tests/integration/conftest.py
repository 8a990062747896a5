"""Real ``futureq start`` processes on 127.0.0.1 with a real RocksDB in a temp dir.

The ``broker`` fixture starts one node on free ports (``--listen 127.0.0.1:0``) and
reads the ``READY client=... http=...`` line it prints once serving. It stops the node
(SIGTERM, then SIGKILL after a deadline) when the test ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from broker_process import BrokerProcess
from cluster_process import Cluster
from wire_client import OPEN_CLIENTS


@pytest.fixture(autouse=True)
def _close_wire_clients() -> Iterator[None]:
    yield
    for client in list(OPEN_CLIENTS):
        client.close()


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[type[BrokerProcess] | object]:
    """Make brokers: ``broker_factory(extra_args=[...], env={...})``; all stopped at the end."""
    made: list[BrokerProcess] = []

    def make(
        extra_args: list[str] | None = None, env: dict[str, str] | None = None, name: str = "data"
    ) -> BrokerProcess:
        broker = BrokerProcess(tmp_path / f"{name}{len(made)}", extra_args, env)
        made.append(broker)
        broker.start()
        return broker

    yield make
    for broker in made:
        if broker.process is not None and broker.process.poll() is None:
            broker.terminate()


@pytest.fixture
def broker(broker_factory: object) -> BrokerProcess:
    """One running node with default settings."""
    made: BrokerProcess = broker_factory()  # type: ignore[operator]
    return made


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[Cluster]:
    """A started 3-node cluster in ``tmp_path`` (``cluster_process.Cluster``), stopped at
    the end. A test module may define its own ``cluster3`` to stop it differently."""
    cluster = Cluster(tmp_path, 3)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def tls_files(tmp_path: Path) -> dict[str, Path]:
    """A trustme CA and a certificate for 127.0.0.1 and localhost, as PEM files:
    ``ca`` (the CA certificate), ``cert`` (the certificate chain), ``key``."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    paths = {
        "ca": tmp_path / "ca.pem",
        "cert": tmp_path / "server.pem",
        "key": tmp_path / "server.key",
    }
    ca.cert_pem.write_to_path(str(paths["ca"]))
    cert.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(str(paths["cert"]), append=True)
    cert.private_key_pem.write_to_path(str(paths["key"]))
    return paths


@pytest.fixture
def tls_args(tls_files: dict[str, Path]) -> list[str]:
    """``futureq start`` arguments for TLS on the client port with :func:`tls_files`
    (add ``--http-tls`` for the HTTP port too)."""
    return ["--tls-cert", str(tls_files["cert"]), "--tls-key", str(tls_files["key"])]
