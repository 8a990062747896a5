"""Graceful shutdown hands every answer the node already owes to a client that reads it.

On SIGTERM a node stops reading requests, answers those it read, and closes each
connection only once its answers are out, at a frame boundary; a client that does not
read is cut off after ``gateway.SHUTDOWN_DRAIN_S`` (within ``server.shutdown_grace_ms``),
and a connection arriving meanwhile (a WebSocket upgrade: the HTTP port still serves
health checks) is refused with UNAVAILABLE. Before, the node cancelled every connection
50 ms after its proposals were done, so a client whose answers did not fit the socket
buffers got a frame cut in the middle.

Source: STYLE.md §3 (graceful shutdown), ``futureq.broker.server``.
"""

from __future__ import annotations

import signal
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import trio
from broker_process import BrokerProcess
from test_websocket import _closed, _hello, _receive, open_ws
from wire_client import WireClient

from futureq.broker.gateway import SHUTDOWN_DRAIN_S
from futureq.errors import ErrorCode, RemoteProtocolError
from futureq.wire import codec, frames

Factory = Any
PENDING = 1000
"""Messages pending in the browsed group (BROWSE answers at most 1,000 per page)."""
PAYLOAD = b"p" * 1024
BROWSES = 10
"""Pipelined BROWSEs of ~1.1 MB answers each: far more than the socket buffers hold
while the client reads nothing, less than twice the connection's outbox limit
(``limits.max_connection_buffer_bytes``, 8 MiB; past that the client is a slow one and
is closed at once, SLOW_CLIENT)."""
EXIT_S = 20.0


def _fill(client: WireClient) -> None:
    """PENDING messages of PAYLOAD in topic "t", due in an hour."""
    for _ in range(PENDING // 100):
        answer = client.publish([["t", PAYLOAD, 3_600_000, None, None]] * 100)
        assert isinstance(answer, frames.PublishOk), answer


def _browse_frames(ids: list[int]) -> list[bytes]:
    """One BROWSE of a whole page of "t" per request id (~1.1 MB answers)."""
    return [
        codec.encode_frame(frames.Browse(rid, "t", None, None, None, None, 1000, 1024))
        for rid in ids
    ]


def _pipeline_browses(client: WireClient) -> list[int]:
    ids = [client.next_id() for _ in range(BROWSES)]
    client.send_raw(b"".join(_browse_frames(ids)))
    return ids


def _wait_exit(broker: BrokerProcess) -> int:
    assert broker.process is not None
    broker.process.wait(EXIT_S)
    return broker.terminate()  # exited already: closes its pipes, returns its code


def test_a_client_reading_late_gets_every_answer_whole_then_eof(broker_factory: Factory) -> None:
    broker: BrokerProcess = broker_factory()
    client = WireClient(broker.client_address)
    _fill(client)
    ids = _pipeline_browses(client)
    time.sleep(0.5)  # the node answers them all into the outbox
    assert broker.process is not None
    broker.process.send_signal(signal.SIGTERM)
    time.sleep(0.3)  # a client busy elsewhere reads a little later
    answered: list[int] = []
    while True:
        try:
            answer = client.receive(10)
        except RemoteProtocolError as exc:  # before the fix: TRUNCATED_FRAME
            raise AssertionError(
                f"the node cut its answer mid-frame after {len(answered)} whole answers: "
                f"[{exc.code.name}] {exc}"
            ) from None
        if answer is codec.CLOSED:
            break
        assert isinstance(answer, frames.BrowseOk), answer
        assert len(answer.messages) == PENDING
        answered.append(answer.request_id)
    # The requests were all read before the shutdown (one small write): every one
    # is answered (in any order: pipelined requests run concurrently).
    assert sorted(answered) == ids
    assert _wait_exit(broker) == 0, broker.stderr_text()[-3000:]


def test_a_client_that_does_not_read_is_cut_off_after_the_drain(
    broker_factory: Factory,
) -> None:
    broker: BrokerProcess = broker_factory()
    silent = WireClient(broker.client_address)
    _fill(silent)
    _pipeline_browses(silent)
    time.sleep(0.5)
    assert broker.process is not None
    started = time.monotonic()
    broker.process.send_signal(signal.SIGTERM)
    assert _wait_exit(broker) == 0, broker.stderr_text()[-3000:]
    # Held for the drain, not for the whole grace period (10 s by default).
    assert SHUTDOWN_DRAIN_S <= time.monotonic() - started < 10.0
    assert "did not take their last answers" in broker.stderr_text()


async def test_a_websocket_opened_during_the_drain_is_refused_unavailable(
    broker_factory: Factory,
) -> None:
    broker: BrokerProcess = broker_factory()
    silent = WireClient(broker.client_address)
    _fill(silent)
    _pipeline_browses(silent)  # holds the drain open: it reads nothing
    await trio.sleep(0.5)
    assert broker.process is not None
    broker.process.send_signal(signal.SIGTERM)
    await trio.sleep(0.5)  # proposals done at once (none): the drain has begun
    async with open_ws(broker.http_address) as ws:
        refused = await _receive(ws)
        assert isinstance(refused, frames.Error), refused
        assert refused.code == ErrorCode.UNAVAILABLE, refused
        assert "shutting down" in refused.message
        await _closed(ws)
    assert await trio.to_thread.run_sync(_wait_exit, broker) == 0


async def test_a_websocket_that_does_not_read_does_not_hold_the_shutdown(
    broker_factory: Factory,
) -> None:
    """Hypercorn writes WebSocket messages in a shielded cancel scope: a /ws client that
    stopped reading held its connection's writer, and the node never exited (still
    running 30 s after SIGTERM, also with ``shutdown_grace_ms`` 1000)."""
    broker: BrokerProcess = broker_factory()
    _fill(WireClient(broker.client_address))
    assert broker.process is not None
    async with open_ws(broker.http_address) as ws:
        await _hello(ws)
        for data in _browse_frames(list(range(10, 10 + BROWSES))):
            await ws.send_message(data)
        await trio.sleep(0.5)  # the answers fill the socket buffers; nothing is read
        started = trio.current_time()
        broker.process.send_signal(signal.SIGTERM)
        code = await trio.to_thread.run_sync(_wait_exit, broker)
        assert code == 0, broker.stderr_text()[-3000:]
        assert trio.current_time() - started < 10.0  # the drain (2 s), not for ever
    assert "did not take their last answers" in broker.stderr_text()


async def test_a_websocket_that_does_not_read_is_closed_after_the_send_timeout(
    broker_factory: Factory,
) -> None:
    """``limits.send_timeout_ms`` (SLOW_CLIENT) could not end a WebSocket write either:
    the connection and its buffers stayed for as long as the client did."""
    broker: BrokerProcess = broker_factory(env={"FUTUREQ_LIMITS_SEND_TIMEOUT_MS": "500"})
    _fill(WireClient(broker.client_address))
    async with open_ws(broker.http_address) as ws:
        await _hello(ws)
        for data in _browse_frames(list(range(10, 10 + BROWSES))):
            await ws.send_message(data)
        await trio.to_thread.run_sync(
            broker.wait_logged, "SLOW_CLIENT: a write to the client blocked"
        )
    probe = WireClient(broker.client_address)  # the node serves on
    answer = probe.publish([["t", b"after", 0, None, None]])
    assert isinstance(answer, frames.PublishOk), answer


def test_a_tls_handshake_ending_during_the_drain_is_refused_unavailable(
    broker_factory: Factory, tls_files: dict[str, Path], tls_args: list[str]
) -> None:
    """A TLS connection accepted before the shutdown whose handshake ends during it is
    told why (it got EOF without a word)."""
    broker: BrokerProcess = broker_factory(extra_args=tls_args)
    trusted = ssl.create_default_context(cafile=str(tls_files["ca"]))
    silent = WireClient(broker.client_address, ssl_context=trusted)
    _fill(silent)
    _pipeline_browses(silent)  # holds the drain open: reads nothing
    host, port = broker.client_address.rsplit(":", 1)
    late = socket.create_connection((host, int(port)), timeout=10)
    time.sleep(0.5)  # accepted; its handshake waits for the client
    assert broker.process is not None
    broker.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)  # the drain has begun
    tls = trusted.wrap_socket(late, server_hostname=host)
    decoder = codec.FrameDecoder(1 << 20)
    while (answer := decoder.next_frame()) is codec.NEED_DATA:
        data = tls.recv(65536)
        decoder.receive_data(data)
        assert data, "closed without a word"
    assert isinstance(answer, frames.Error), answer
    assert answer.code == ErrorCode.UNAVAILABLE and "shutting down" in answer.message
    tls.close()
    assert _wait_exit(broker) == 0


def test_the_http_port_offers_only_http_1_1_by_alpn(
    broker_factory: Factory, tls_files: dict[str, Path], tls_args: list[str]
) -> None:
    """Over HTTP/2 a browser opens /ws as a stream of the page's connection (RFC 8441),
    where hypercorn buffered what the node sent without bound (a breaker's node grew
    from 83 to 221 MB for one client) and neither the send timeout nor the shutdown
    drain held."""
    broker: BrokerProcess = broker_factory(extra_args=[*tls_args, "--http-tls"])
    context = ssl.create_default_context(cafile=str(tls_files["ca"]))
    context.set_alpn_protocols(["h2", "http/1.1"])
    host, port = broker.http_address.rsplit(":", 1)
    with context.wrap_socket(
        socket.create_connection((host, int(port)), timeout=10), server_hostname=host
    ) as tls:
        assert tls.selected_alpn_protocol() == "http/1.1"


def test_a_websocket_over_http_2_is_refused(broker_factory: Factory) -> None:
    """h2c with prior knowledge (plain HTTP): the port speaks HTTP/1.1 only, so the
    connection is refused with GOAWAY HTTP_1_1_REQUIRED before any stream (an extended
    CONNECT of RFC 8441 for /ws included) is served, and closed."""
    import h2.config
    import h2.connection
    import h2.errors
    import h2.events

    broker: BrokerProcess = broker_factory()
    host, port = broker.http_address.rsplit(":", 1)
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    connection.initiate_connection()
    connection.send_headers(
        1,
        [
            (":method", "CONNECT"),
            (":protocol", "websocket"),
            (":scheme", "http"),
            (":path", "/ws"),
            (":authority", broker.http_address),
            ("sec-websocket-version", "13"),
        ],
    )
    events: list[h2.events.Event] = []
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(connection.data_to_send())
        deadline = time.monotonic() + 10
        while True:
            assert time.monotonic() < deadline, f"not closed; events {events}"
            data = raw.recv(65536)
            if not data:
                break
            events += connection.receive_data(data)
    ended = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
    assert [e.error_code for e in ended] == [h2.errors.ErrorCodes.HTTP_1_1_REQUIRED], events
    assert b"HTTP/1.1 only" in (ended[0].additional_data or b"")
    assert not any(isinstance(e, h2.events.ResponseReceived) for e in events), events


def test_a_second_signal_after_the_window_forces_the_stop_with_exit_code_5(
    broker_factory: Factory,
) -> None:
    """A forced stop said "stopping now" and still exited 0, the code of a graceful one."""
    broker: BrokerProcess = broker_factory()
    silent = WireClient(broker.client_address)
    _fill(silent)
    _pipeline_browses(silent)  # holds the drain (2 s): it reads nothing
    time.sleep(0.5)
    assert broker.process is not None
    broker.process.send_signal(signal.SIGTERM)
    time.sleep(1.3)  # past the 1 s in which a repeat is the same request
    broker.process.send_signal(signal.SIGTERM)
    assert _wait_exit(broker) == 5, broker.stderr_text()[-3000:]
    assert "received SIGTERM again: stopping now" in broker.stderr_text()
