"""The client protocol over ``/ws`` (hypercorn's WebSocket on the HTTP port) against
plain TCP, on one node, measured in the same run:

* round trip of one PING, sequential (p50, p99 in µs);
* publish throughput: batches of 100 × 100-byte messages, 8 PUBLISH in flight on one
  connection, ack level QUORUM (msgs/s);
* the cost of one WATCH_UPDATE (the dashboard's overview) with 1,000 groups: time from
  WATCH to its first update (ms, median of rounds).

Usage::

    python -m bench.websocket_cost [--quick] [--compare] [--no-save]

The WebSocket client is trio-websocket (the test dependency); the TCP client is
``bench._common.RawConnection``. Both send the same frame bytes.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from bench._common import (
    RawConnection,
    Server,
    add_common_args,
    finish,
    frame_bytes,
    median,
    percentile,
    publish_frame,
    publish_items_bytes,
)
from futureq.wire import codec, frames

NAME = "websocket_cost"
WINDOW = 8
BATCH = 100


class WsConnection:
    """The client protocol over one WebSocket: one frame per binary message."""

    def __init__(self, ws: WebSocketConnection) -> None:
        self.ws = ws

    async def send(self, data: bytes) -> None:
        # The frame bytes may hold several frames (pipelining): one message each.
        offset = 0
        while offset < len(data):
            end = offset + codec.HEADER_BYTES + int.from_bytes(data[offset : offset + 4], "big")
            await self.ws.send_message(data[offset:end])
            offset = end

    async def receive(self) -> list[Any]:
        message = await self.ws.get_message()
        assert isinstance(message, bytes)
        decoder = codec.FrameDecoder(64 * 1024 * 1024, parse=False)
        decoder.receive_data(message)
        frame = decoder.next_frame()
        assert isinstance(frame, list)
        return frame


async def _round_trips(conn: Any, count: int) -> list[float]:
    times = []
    for rid in range(count):
        started = time.perf_counter()
        await conn.send(frame_bytes([frames.FrameType.PING, rid + 10]))
        answer = await conn.receive()
        times.append((time.perf_counter() - started) * 1e6)
        assert answer[0] == frames.FrameType.PONG
    return sorted(times)


async def _publish(conn: Any, total: int, topic: str) -> float:
    items = publish_items_bytes(BATCH, topic=topic, payload=b"x" * 100)
    batches = total // BATCH
    started = time.perf_counter()
    sent = received = 0
    while received < batches:
        while sent < batches and sent - received < WINDOW:
            await conn.send(publish_frame(1000 + sent, frames.AckLevel.QUORUM, items))
            sent += 1
        answer = await conn.receive()
        assert answer[0] == frames.FrameType.PUBLISH_OK, answer
        received += 1
    return batches * BATCH / (time.perf_counter() - started)


async def _first_update_ms(conn: Any, rounds: int) -> float:
    times = []
    for index in range(rounds):
        started = time.perf_counter()
        await conn.send(frame_bytes([frames.FrameType.WATCH, 500 + index, 60_000]))
        answer = await conn.receive()
        times.append((time.perf_counter() - started) * 1000)
        assert answer[0] == frames.FrameType.WATCH_UPDATE, answer
        # The cached overview is shared for 0.25 s: wait it out so each round builds one.
        await trio.sleep(0.3)
    return median(times)


async def _measure(server: Server, quick: bool) -> dict[str, Any]:
    pings = 500 if quick else 3000
    total = 20_000 if quick else 100_000
    results: dict[str, Any] = {}
    tcp = await RawConnection.open(server.client_address)
    async with open_websocket_url(f"ws://{server.http_address}/ws") as ws:
        wsc = WsConnection(ws)
        await wsc.send(frame_bytes([frames.FrameType.HELLO, 1, [1], "bench", None]))
        assert (await wsc.receive())[0] == frames.FrameType.HELLO_OK
        for name, conn in (("tcp", tcp), ("websocket", wsc)):
            times = await _round_trips(conn, pings)
            rate = await _publish(conn, total, f"bench.{name}")
            results[name] = {
                "ping_p50_us": round(percentile(times, 50), 1),
                "ping_p99_us": round(percentile(times, 99), 1),
                "publish_msgs_per_s": round(rate),
            }
            print(
                f"{name:<10} PING p50 {results[name]['ping_p50_us']:8.1f} µs, "
                f"p99 {results[name]['ping_p99_us']:8.1f} µs; publish {rate:10.0f} msgs/s"
            )
        groups = 1000
        for start in range(0, groups, 100):
            items = [[f"bench.g{n}", b"x", 60_000, None, None] for n in range(start, start + 100)]
            await tcp.request([frames.FrameType.PUBLISH, 5000 + start, 2, items])
        results["watch_first_update_ms_1000_groups"] = round(
            await _first_update_ms(wsc, 3 if quick else 9), 2
        )
        print(
            f"WATCH -> first WATCH_UPDATE with {groups} groups: "
            f"{results['watch_first_update_ms_1000_groups']:.2f} ms (median)"
        )
    await tcp.aclose()
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure, print, save; return the results."""
    parser = argparse.ArgumentParser(prog="python -m bench.websocket_cost")
    add_common_args(parser)
    args = parser.parse_args(argv)
    server = Server()
    server.start()
    try:
        results = trio.run(_measure, server, bool(args.quick))
    finally:
        server.cleanup()
    results["websocket_vs_tcp_publish"] = round(
        results["websocket"]["publish_msgs_per_s"] / results["tcp"]["publish_msgs_per_s"], 2
    )
    finish(NAME, results, args, argv)
    return results


if __name__ == "__main__":
    main()
