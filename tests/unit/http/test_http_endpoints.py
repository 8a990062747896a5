"""The HTTP listener over a real loopback socket: every endpoint, port 0, shutdown."""

from __future__ import annotations

import json
from typing import Any

import trio

from futureq.broker.http import serve_http
from futureq.metrics import GroupCounts, Metrics

STATUS: dict[str, Any] = {
    "node_id": 1,
    "role": "leader",
    "leader_address": "127.0.0.1:7450",
    "server_version": "0.1.0",
    "applied_index": 42,
    "uptime_s": 12.5,
    "topics": [
        {
            "topic": "orders",
            "groups": [
                {
                    "group": "billing",
                    "pending": 10,
                    "due": 2,
                    "in_flight": 1,
                    "consumers": 3,
                    "visibility_timeout_ms": 30000,
                    "max_deliveries": 16,
                }
            ],
        }
    ],
}


class FakeProvider:
    """Implements the StatusProvider protocol with switchable answers."""

    def __init__(self) -> None:
        self.ready = True
        self.healthy = True
        self.alarm_list: list[str] = []

    def status(self) -> dict[str, Any]:
        return STATUS

    def overview(self) -> dict[str, Any]:
        return {"node": {"node_id": 1}, "groups": []}

    def is_ready(self) -> bool:
        return self.ready

    def is_healthy(self) -> bool:
        return self.healthy

    def alarms(self) -> list[str]:
        return self.alarm_list


class Response:
    def __init__(self, raw: bytes) -> None:
        head, _, self.body = raw.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split()[1])
        self.headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in header_lines)
        }

    def json(self) -> Any:
        return json.loads(self.body)


async def request(address: str, path: str, method: str = "GET") -> Response:
    """One HTTP/1.1 request over a fresh connection, read to EOF."""
    host, _, port = address.rpartition(":")
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(
                f"{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n".encode()
            )
            chunks = []
            while chunk := await stream.receive_some():
                chunks.append(chunk)
    return Response(b"".join(chunks))


async def test_port_zero_reports_the_real_port_and_every_endpoint_answers() -> None:
    metrics = Metrics()
    metrics.published_messages_total.labels(topic="orders").inc(5)
    metrics.set_group_counts_provider(
        lambda: [GroupCounts("orders", "billing", pending=10, due=2, in_flight=1, consumers=3)]
    )
    provider = FakeProvider()
    async with trio.open_nursery() as nursery:
        address = await nursery.start(serve_http, "127.0.0.1:0", metrics, provider)
        host, _, port = address.rpartition(":")
        assert host == "127.0.0.1"
        assert int(port) > 0

        response = await request(address, "/metrics")
        assert response.status == 200
        assert response.headers["content-type"].startswith("text/plain")
        assert b'futureq_published_messages_total{topic="orders"} 5.0' in response.body
        assert b'futureq_pending_messages{group="billing",topic="orders"} 10.0' in response.body

        response = await request(address, "/healthz")
        assert (response.status, response.body) == (200, b"ok\n")

        response = await request(address, "/readyz")
        assert response.status == 200
        assert response.json() == {"ready": True}

        response = await request(address, "/api/status")
        assert response.status == 200
        assert response.headers["content-type"] == "application/json"
        assert response.json() == STATUS

        response = await request(address, "/")
        assert response.status == 200
        assert response.headers["content-type"].startswith("text/html")
        assert b"/api/status" in response.body
        assert b"<script" in response.body
        assert b"http://" not in response.body and b"https://" not in response.body  # no CDN

        response = await request(address, "/api/overview")
        assert response.status == 200 and response.json() == FakeProvider().overview()

        # The dashboard's own files, shipped in the package; nothing from elsewhere.
        for name, kind in (
            ("dashboard.js", "text/javascript"),
            ("msgpack.js", "text/javascript"),
            ("dashboard.css", "text/css"),
        ):
            response = await request(address, f"/static/{name}")
            assert response.status == 200, name
            assert response.headers["content-type"].startswith(kind)
            assert b"http://" not in response.body.replace(b"http://www.w3.org/2000/svg", b"")
            assert b"https://" not in response.body.replace(b"https://msgpack.org", b"")
        for missing in ("/static/", "/static/../http.py", "/static/nope.js"):
            assert (await request(address, missing)).status == 404, missing

        nursery.cancel_scope.cancel()


async def test_readyz_and_healthz_report_503_when_the_provider_says_so() -> None:
    provider = FakeProvider()
    provider.ready = False
    async with trio.open_nursery() as nursery:
        address = await nursery.start(serve_http, "127.0.0.1:0", Metrics(), provider)

        response = await request(address, "/readyz")
        assert response.status == 503
        body = response.json()
        assert body["ready"] is False
        assert isinstance(body["reason"], str) and body["reason"]

        provider.healthy = False
        response = await request(address, "/healthz")
        assert response.status == 503
        response = await request(address, "/readyz")
        assert response.status == 503
        assert "not healthy" in response.json()["reason"]

        provider.ready = provider.healthy = True
        assert (await request(address, "/readyz")).status == 200
        assert (await request(address, "/healthz")).status == 200
        nursery.cancel_scope.cancel()


async def test_unknown_path_method_and_head() -> None:
    async with trio.open_nursery() as nursery:
        address = await nursery.start(serve_http, "127.0.0.1:0", Metrics(), FakeProvider())
        missing = await request(address, "/nope")
        assert missing.status == 404
        # It names every page there is (before: not the /api/ ones).
        for page in (
            "/metrics",
            "/healthz",
            "/readyz",
            "/api/status",
            "/api/overview",
            "/api/browse",
        ):
            assert page in missing.body.decode(), page
        response = await request(address, "/healthz", method="POST")
        assert response.status == 405
        assert response.headers["allow"] == "GET, HEAD"
        response = await request(address, "/api/status", method="HEAD")
        assert response.status == 200
        assert response.body == b""
        nursery.cancel_scope.cancel()


async def test_a_404_quotes_the_path_without_its_control_characters() -> None:
    # The path was echoed raw: an ESC sequence in it reached the terminal of whoever
    # read the answer with curl, and a 60 KiB path came back whole.
    async with trio.open_nursery() as nursery:
        address = await nursery.start(serve_http, "127.0.0.1:0", Metrics(), FakeProvider())
        missing = await request(address, "/%1b%5b2J%00x")
        assert missing.status == 404
        sentence = missing.body.decode()
        assert "no such page: '/\\x1b[2J\\x00x'" in sentence, sentence
        assert all(char.isprintable() for char in sentence.rstrip("\n")), sentence
        long = await request(address, "/" + "a" * 30_000)
        assert long.status == 404 and len(long.body) < 1_000, len(long.body)
        nursery.cancel_scope.cancel()


async def test_a_failing_provider_gives_500_not_a_crash() -> None:
    class Broken(FakeProvider):
        def status(self) -> dict[str, Any]:
            raise RuntimeError("boom")

    async with trio.open_nursery() as nursery:
        address = await nursery.start(serve_http, "127.0.0.1:0", Metrics(), Broken())
        assert (await request(address, "/api/status")).status == 500
        assert (await request(address, "/healthz")).status == 200
        nursery.cancel_scope.cancel()


async def test_two_listeners_on_port_zero_get_different_ports() -> None:
    async with trio.open_nursery() as nursery:
        first = await nursery.start(serve_http, "127.0.0.1:0", Metrics(), FakeProvider())
        second = await nursery.start(serve_http, "127.0.0.1:0", Metrics(), FakeProvider())
        assert first != second
        assert (await request(second, "/healthz")).status == 200
        nursery.cancel_scope.cancel()


async def _serve_until(stop: trio.Event, task_status: trio.TaskStatus[str]) -> None:
    """``serve_http`` on port 0 with ``stop`` as its shutdown trigger."""
    await serve_http(
        "127.0.0.1:0",
        Metrics(),
        FakeProvider(),
        shutdown_trigger=stop.wait,
        task_status=task_status,
    )


async def test_shutdown_trigger_stops_the_listener() -> None:
    stop = trio.Event()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(_serve_until, stop)
            assert (await request(address, "/healthz")).status == 200
            stop.set()
        # serve_http returned by itself: the nursery closed without a cancel.
    host, _, port = address.rpartition(":")
    try:
        stream = await trio.open_tcp_stream(host, int(port))
    except OSError:
        pass
    else:  # pragma: no cover - the port was closed
        await stream.aclose()
        raise AssertionError("the listener still accepts connections after shutdown")


async def test_a_connection_accepted_before_shutdown_gets_its_first_answer() -> None:
    """A connection accepted just before the shutdown trigger, its request not yet read,
    is answered, then closed (a sharded node's supervisor stops covering the
    port the moment shard 0 returns: the probe it had accepted got no answer at all,
    ``RemoteDisconnected``); a keep-alive connection that was answered and is idle is
    still closed at once."""
    stop = trio.Event()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(_serve_until, stop)
            host, _, port = address.rpartition(":")
            answered = await trio.open_tcp_stream(host, int(port))
            fresh = await trio.open_tcp_stream(host, int(port))
            async with answered, fresh:
                await answered.send_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
                first = b""
                while not first.endswith(b"ok\n"):
                    first += await answered.receive_some(65536)
                assert first.startswith(b"HTTP/1.1 200"), first
                await trio.sleep(0.2)  # accepted by the server, nothing sent yet
                stop.set()
                await trio.sleep(0.05)  # the server has begun stopping
                await fresh.send_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
                reply = b""
                while chunk := await fresh.receive_some(65536):
                    reply += chunk
                assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"ok\n"), reply
                assert await answered.receive_some(65536) == b""  # idle: closed at once
