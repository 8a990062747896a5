"""A client that half-closes after a whole request gets its answer, then the connection
ends; an EOF with no answer due still ends it at once.

Found by a tester: a GET followed by ``shutdown(SHUT_WR)`` (as ``nc -N`` and simple
probes do) got no answer, or only its head: the EOF ended the connection while the
answer was being written. These tests open real sockets on 127.0.0.1 against
:func:`serve_http` with a small cap, so a slot that did not come back shows.
"""

from __future__ import annotations

import math
import ssl
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme
from test_http_connection_end import (
    CLOSED_WITHIN_S,
    MAX_CONNECTIONS,
    PER_ADDRESS,
    _connect,
    _read_to_close,
    _served_soon,
)
from test_http_endpoints import FakeProvider, Response

from futureq.broker.http import serve_http
from futureq.config import TlsConfig
from futureq.metrics import Metrics


class SlowBrowser:
    """``/api/browse`` answered ``delay`` seconds after it is asked (inf: never)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    async def browse_json(self, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        await trio.sleep(self.delay)
        return 200, {"messages": []}

    async def browse_counts_json(self, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        return await self.browse_json(query)


async def _start(
    nursery: trio.Nursery, *, delay: float, idle_timeout_ms: int, tls: TlsConfig | None = None
) -> str:
    address: str = await nursery.start(
        lambda task_status: serve_http(
            "127.0.0.1:0",
            Metrics(),
            FakeProvider(),
            tls=tls,
            browser=SlowBrowser(delay),
            max_connections=MAX_CONNECTIONS,
            idle_timeout_ms=idle_timeout_ms,
            task_status=task_status,
        )
    )
    return address


async def _half_closed(address: str, request: bytes) -> bytes | None:
    """Send ``request``, shut down the sending side, read until the server closes."""
    stream = await _connect(address)
    async with stream:
        await stream.send_all(request)
        await stream.send_eof()
        return await _read_to_close(stream)


def _get(path: str, method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


def _whole(raw: bytes | None) -> Response:
    """The one answer in ``raw``, checked to be all there."""
    assert raw, "no answer before the server closed the connection"
    response = Response(raw)
    assert len(response.body) == int(response.headers["content-length"]), raw
    return response


REQUESTS = {
    "GET /healthz": (_get("/healthz"), 200),
    "GET /api/status": (_get("/api/status"), 200),
    "GET /metrics": (_get("/metrics"), 200),
    "GET of a page that is not there": (_get("/nope"), 404),
    "GET /api/browse answered after 0.2 s": (_get("/api/browse"), 200),
}


def _tls(tmp_path: Path) -> tuple[TlsConfig, ssl.SSLContext]:
    """HTTPS for 127.0.0.1 with a trustme CA: the server's settings, a client context."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    tls = TlsConfig(
        cert_file=str(tmp_path / "server.pem"), key_file=str(tmp_path / "server.pem"), http=True
    )
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return tls, context


@pytest.mark.parametrize("request_bytes, status", REQUESTS.values(), ids=REQUESTS.keys())
async def test_a_half_closed_client_gets_its_whole_answer_and_its_slot_back(
    request_bytes: bytes, status: int
) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await _start(nursery, delay=0.2, idle_timeout_ms=60_000)
            for _ in range(PER_ADDRESS * 2):
                # Before the fix: nothing, or the head alone.
                response = _whole(await _half_closed(address, request_bytes))
                assert response.status == status
            assert (await _served_soon(address)).status == 200
            nursery.cancel_scope.cancel()


async def test_a_half_closed_client_gets_every_answer_it_asked_for() -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await _start(nursery, delay=0.2, idle_timeout_ms=60_000)
            # A HEAD (no body) and pipelined requests, the last one slow to answer.
            raw = await _half_closed(address, _get("/healthz", "HEAD"))
            assert raw is not None and raw.startswith(b"HTTP/1.1 200 "), raw
            assert Response(raw).body == b""
            raw = await _half_closed(address, _get("/healthz") * 2 + _get("/api/browse"))
            assert raw is not None and raw.count(b"HTTP/1.1 200 ") == 3, raw
            assert raw.endswith(b'{"messages":[]}\n'), raw
            nursery.cancel_scope.cancel()


async def test_a_client_half_closing_its_tcp_side_under_tls_gets_its_answer(
    tmp_path: Path,
) -> None:
    tls, context = _tls(tmp_path)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await _start(nursery, delay=0.2, idle_timeout_ms=60_000, tls=tls)
            for _ in range(PER_ADDRESS * 2):
                tcp = await _connect(address)
                stream = trio.SSLStream(tcp, context, server_hostname="127.0.0.1")
                async with stream:
                    await stream.send_all(_get("/api/browse"))
                    await tcp.send_eof()  # TCP FIN, no close_notify: the answer takes 0.2 s
                    chunks = []
                    with trio.fail_after(CLOSED_WITHIN_S):
                        try:
                            while chunk := await stream.receive_some():
                                chunks.append(chunk)
                        except trio.BrokenResourceError:
                            pass
                # More connections than an address may hold: each one freed its slot.
                assert _whole(b"".join(chunks)).status == 200
            nursery.cancel_scope.cancel()


async def test_an_answer_that_never_comes_ends_a_half_closed_connection_at_the_idle_timeout() -> (
    None
):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await _start(nursery, delay=math.inf, idle_timeout_ms=300)
            for _ in range(PER_ADDRESS + 1):
                started = trio.current_time()
                raw = await _half_closed(address, _get("/api/browse"))
                assert raw is not None, "a half-closed connection outlived its deadline"
                assert b"200" not in raw
                assert trio.current_time() - started < CLOSED_WITHIN_S
            assert (await _served_soon(address)).status == 200
            nursery.cancel_scope.cancel()


async def test_an_eof_with_no_whole_request_ends_the_connection_at_once() -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await _start(nursery, delay=0.0, idle_timeout_ms=60_000)
            for partial in (b"", b"GET /healthz HTTP/1.1\r\nHo"):
                for _ in range(PER_ADDRESS * 2):
                    with trio.fail_after(1):  # far below the idle timeout
                        raw = await _half_closed(address, partial)
                    assert raw is not None and b" 200 " not in raw, raw
            # A keep-alive connection idle after its answer: its EOF ends it at once.
            for _ in range(PER_ADDRESS * 2):
                stream = await _connect(address)
                async with stream:
                    await stream.send_all(_get("/healthz"))
                    raw = b""
                    while b"ok\n" not in raw:
                        chunk = await stream.receive_some()
                        assert chunk, raw
                        raw += chunk
                    await stream.send_eof()
                    with trio.fail_after(1):
                        assert await _read_to_close(stream) == b""
            assert (await _served_soon(address)).status == 200
            nursery.cancel_scope.cancel()


async def test_a_tls_client_that_sends_close_notify_after_its_answer_gives_its_slot_back(
    tmp_path: Path,
) -> None:
    # Found by a tester: curl sends close_notify once it has read its answer; the server
    # took no notice (the TCP stream sees no EOF under TLS), so each such connection held
    # its slot for the idle timeout and the 33rd curl from one host was refused.
    tls, context = _tls(tmp_path)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await _start(nursery, delay=0.0, idle_timeout_ms=60_000, tls=tls)
            for _ in range(PER_ADDRESS * 2):
                tcp = await _connect(address)
                stream = trio.SSLStream(tcp, context, server_hostname="127.0.0.1")
                async with tcp:
                    await stream.send_all(_get("/healthz"))
                    raw = b""
                    while b"ok\n" not in raw:
                        chunk = await stream.receive_some()
                        assert chunk, (
                            f"refused: the slots of the connections before are held: {raw!r}"
                        )
                        raw += chunk
                    # Idle after the answer (at once, the server ended the connection
                    # before the fix too), then close_notify, and wait for the server
                    # to end the connection (before the fix: the idle timeout, 60 s).
                    await trio.sleep(0.3)
                    with trio.fail_after(CLOSED_WITHIN_S):
                        try:
                            await stream.unwrap()
                        except trio.BrokenResourceError:
                            pass
            # More connections than an address may hold were served: each freed its slot.
            nursery.cancel_scope.cancel()
