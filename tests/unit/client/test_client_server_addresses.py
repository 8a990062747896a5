"""A server address that cannot work fails at once (``docs/client.md``, "Connecting").

Found by a tester: ``SyncClient("nonsense")`` took 5 s (``connect_timeout_s``) to say
"bad server address", retrying an address no retry could fix, and so did
``open_client``; a host name the resolver says does not exist was retried as long.
Now a malformed address is a ``ValueError`` when the client is made, and a name that
does not resolve a ``ConnectionLostError`` after one round of attempts. A refused
connection is still retried until the deadline (the server may be starting).
"""

from __future__ import annotations

import socket
import time

import pytest
from tests.backends import on_both_backends

from futureq.client import open_client, parse_servers
from futureq.client.sync import SyncClient
from futureq.errors import ConnectionLostError

BAD = [
    ("nonsense", "is not HOST:PORT"),
    ("host:", "port '' is not a number"),
    (":7450", "is not HOST:PORT"),
    ("127.0.0.1:99999", "outside 0..65535"),
    ("127.0.0.1:0", "port 0"),
    ("http://127.0.0.1:7450", "has a scheme"),
    ("[::1", r"has no '\]' closing its IPv6 address"),
    # Found by a tester: "::1" was read as host ':' port 1, "::1:27450" as [::1]:27450,
    # and "[::1]" said "port '1]' is not a number".
    ("::1", r"more than one ':': an IPv6 address must be in brackets"),
    ("::1:27450", r"more than one ':': an IPv6 address must be in brackets"),
    ("fe80::1%eth0:7450", r"more than one ':': an IPv6 address must be in brackets"),
    ("[::1]", r"'\[::1\]' has no port: give \[::1\]:PORT"),
    ("[::1]:", r"has no port"),
    ("[::1]7450", r"after \[::1\] comes ':PORT'"),
    ("a b:7450", "is not a host name"),
    ("h\x00:7450", "is not a host name"),
    ("\ud800:7450", "not valid Unicode"),
]

UNKNOWN_HOST = "no-such-host.invalid:7450"
"""RFC 6761: ``.invalid`` never resolves."""


def _resolver_says_no_such_name() -> bool:
    try:
        socket.getaddrinfo("no-such-host.invalid", 7450)
    except socket.gaierror as exc:
        return exc.errno == socket.EAI_NONAME
    return False


@pytest.mark.parametrize(("address", "words"), BAD)
def test_sync_client_refuses_a_bad_address_when_made(address: str, words: str) -> None:
    started = time.monotonic()
    with pytest.raises(ValueError, match=words):
        SyncClient(address, connect_timeout_s=30)
    with pytest.raises(ValueError, match=words):
        SyncClient(["127.0.0.1:7450", address])
    assert time.monotonic() - started < 1


@pytest.mark.parametrize(("address", "words"), BAD)
@on_both_backends
async def test_open_client_refuses_a_bad_address_before_connecting(
    address: str, words: str
) -> None:
    started = time.monotonic()
    with pytest.raises(ValueError, match=words):
        async with open_client(address, connect_timeout_s=30):
            pass
    assert time.monotonic() - started < 1


def test_good_addresses_are_kept() -> None:
    good = [
        "127.0.0.1:7450",
        "[::1]:7450",
        "[fe80::1%eth0]:7450",
        "broker_1:7450",
        "b\u00fccher.example:1",
    ]
    assert parse_servers(",".join(good)) == good
    with pytest.raises(TypeError, match="must be a str"):
        parse_servers([7450])  # type: ignore[list-item]


def test_an_address_given_as_bytes_is_told_bytes() -> None:
    """Found by a tester: ``SyncClient(b"127.0.0.1:27450")`` said "got int" (the bytes
    were taken for a list of addresses, and its first item is an int)."""
    for given in (b"127.0.0.1:27450", bytearray(b"127.0.0.1:27450")):
        with pytest.raises(
            TypeError, match=rf"must be a str HOST:PORT, got {type(given).__name__}$"
        ):
            SyncClient(given)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=rf"got {type(given).__name__}$"):
            parse_servers(given)  # type: ignore[arg-type]


@pytest.mark.skipif(not _resolver_says_no_such_name(), reason="this resolver does not answer")
@on_both_backends
async def test_a_host_name_that_does_not_resolve_fails_after_one_round() -> None:
    started = time.monotonic()
    with pytest.raises(ConnectionLostError, match="could not connect to no-such-host.invalid"):
        async with open_client(UNKNOWN_HOST, connect_timeout_s=30):
            pass
    assert time.monotonic() - started < 3


@pytest.mark.skipif(not _resolver_says_no_such_name(), reason="this resolver does not answer")
def test_sync_client_to_a_host_name_that_does_not_resolve_fails_quickly() -> None:
    client = SyncClient(UNKNOWN_HOST, connect_timeout_s=30)
    started = time.monotonic()
    try:
        with pytest.raises(ConnectionLostError, match="name or service not known"):
            client.open()
    finally:
        client.close()
    assert time.monotonic() - started < 3
