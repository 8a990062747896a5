#!/usr/bin/env python3
"""One request in flight to two single-node brokers at once, a base revision and the
working tree, in alternating windows: a latency A/B finer than ``bench.ab``'s.

Run from the repository root with the project's venv (``make install``)::

    .venv/bin/python -m bench.ab_latency --base main~1 [--rounds 12] [--window-s 1]
        [--request publish|ping] [--ack quorum|leader|none]

``bench.ab`` measures each revision on a fresh server one after the other, so the
machine's drift between two measurements (a few % on a quiet machine, 2x on a busy one)
is as large as the effects of one pass of the event loop more or less. Here both servers
run throughout (fresh data directories, ``--shards 1``, the base revision checked out by
:func:`bench.ab.base_and_new_sources`), and one raw-frame client alternates windows of
``--window-s`` between them, reversing the order every round, so what drifts falls on
both alike. Each request is one PUBLISH of one 100-byte message due in a minute (or a
PING), answered before the next is sent.

Prints p50 / p90 / p99 (ms, pooled over the rounds) per revision and the ratios new/base.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench import _common
from bench.ab import base_and_new_sources
from bench.side_by_side import FqSync
from futureq.wire import frames

ACK_LEVELS = {
    "quorum": frames.AckLevel.QUORUM,
    "leader": frames.AckLevel.LEADER,
    "none": frames.AckLevel.NONE,
}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the revision to compare with (git rev)")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--window-s", type=float, default=1.0, help="seconds per window")
    ap.add_argument("--request", choices=("publish", "ping"), default="publish")
    ap.add_argument("--ack", choices=sorted(ACK_LEVELS), default="quorum")
    return ap


def _window(
    client: FqSync, seconds: float, request: Callable[[int], bytes], out: list[float]
) -> None:
    """Send ``request(request_id)`` one at a time for ``seconds``; append each one's ms."""
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        client.rid += 1
        data = request(client.rid)
        sent = time.perf_counter()
        client.sock.sendall(data)
        answer = client.recv()
        out.append((time.perf_counter() - sent) * 1000)
        if answer[1] != client.rid or answer[0] == frames.FrameType.ERROR:
            raise RuntimeError(f"answered {answer}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    items = _common.publish_items_bytes(1, topic="ab", payload=b"s" * 100, delay_ms=60_000)
    ack = ACK_LEVELS[args.ack]

    def request(request_id: int) -> bytes:
        if args.request == "ping":
            return _common.frame_bytes([frames.FrameType.PING, request_id])
        return _common.publish_frame(request_id, ack, items)

    try:
        with base_and_new_sources(args.base) as sources:
            latencies = _measure(sources, args.rounds, args.window_s, request)
    except RuntimeError as exc:
        print(exc)
        return 1
    figures = {}
    for revision, values in latencies.items():
        values.sort()
        figures[revision] = [_common.percentile(values, q) for q in (50, 90, 99)]
        p50, p90, p99 = figures[revision]
        print(f"{revision:4}  p50 {p50:.3f}  p90 {p90:.3f}  p99 {p99:.3f} ms  n={len(values)}")
    ratios = [new / base for new, base in zip(figures["new"], figures["base"], strict=True)]
    print(
        f"new/base ({args.base}, {args.rounds} rounds of {args.window_s:g} s): "
        f"p50 {ratios[0]:.2f}, p90 {ratios[1]:.2f}, p99 {ratios[2]:.2f}"
    )
    return 0


def _measure(
    sources: dict[str, Path], rounds: int, window_s: float, request: Callable[[int], bytes]
) -> dict[str, list[float]]:
    servers: dict[str, _common.Server] = {}
    try:
        for revision, src in sources.items():
            server = _common.Server(env={"PYTHONPATH": str(src)})
            servers[revision] = server
            server.start()
        clients = {revision: FqSync(s.client_address) for revision, s in servers.items()}
        latencies: dict[str, list[float]] = {revision: [] for revision in clients}
        for client in clients.values():
            _window(client, min(0.5, window_s), request, [])  # warm-up
        order = list(clients)
        for round_ in range(rounds):
            for revision in order if round_ % 2 == 0 else order[::-1]:
                _window(clients[revision], window_s, request, latencies[revision])
        for client in clients.values():
            client.sock.close()
        return latencies
    finally:
        for server in servers.values():
            server.cleanup()


if __name__ == "__main__":
    sys.exit(main())
