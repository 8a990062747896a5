"""Restart time with 1,000,000 pending messages: after SIGKILL (crash) and after SIGTERM.

Steps, on one data directory:

1. start a broker on an empty directory and time spawn -> ``/readyz`` 200 (baseline:
   interpreter start-up and imports);
2. publish ``--messages`` (batches of 1000, ack level quorum, 100-byte payloads, due
   uniformly over the next 24 h) so they are all pending;
3. SIGKILL the server (a crash: RocksDB recovers from its WAL, the log replays what
   was written but not applied), start it again, time spawn -> ``/readyz`` 200;
4. SIGTERM it (timed: graceful shutdown flushes memtables), start it again, time
   spawn -> ``/readyz`` 200 (clean restart);
5. check through STATUS that the group still holds every message.

``/readyz`` is polled every 10 ms; the time to the ``READY`` stdout line is reported too.

The package's bytecode is compiled first (as a wheel install, the Docker image, ships
it): an editable checkout run with ``PYTHONDONTWRITEBYTECODE=1`` would otherwise compile
every module at every start (about a third of the start-up here), which is not the
product's restart.

Usage::

    python -m bench.restart [--quick] [--compare] [--messages 1000000]
"""

from __future__ import annotations

import argparse
import compileall
import time
from pathlib import Path
from typing import Any

import trio

from bench._common import (
    PAYLOAD_BYTES,
    RawConnection,
    Server,
    add_common_args,
    finish,
    now_ms,
    publish_many,
)
from futureq.wire import frames

NAME = "restart"
TARGET_S = 3.0
POLL_S = 0.01
DAY_MS = 24 * 3600 * 1000


def start_timed(server: Server, timeout_s: float = 120.0) -> dict[str, float]:
    """Spawn, poll ``/readyz`` every 10 ms; seconds to it answering 200 and to ``READY``."""
    server.spawn()
    ready_line_s = server.wait_ready_line(timeout_s)
    deadline = server.started_s + timeout_s
    while True:
        try:
            status, _ = server.http_get("/readyz", timeout_s=1.0)
        except OSError:
            status = 0
        if status == 200:
            readyz_s = time.monotonic() - server.started_s
            break
        if time.monotonic() > deadline:
            raise RuntimeError("/readyz did not answer 200 in time")
        time.sleep(POLL_S)
    return {"to_readyz_s": round(readyz_s, 3), "to_ready_line_s": round(ready_line_s, 3)}


async def _publish(address: str, total: int, base_ms: int) -> float:
    return await publish_many(
        address,
        total,
        batch=1000,
        topic="restart",
        due_ms=lambda i: base_ms + (i * 7919 * 104729) % DAY_MS,
        connections=2,
        window=4,
        payload=b"r" * PAYLOAD_BYTES,
    )


async def _pending(address: str, topic: str) -> int:
    conn = await RawConnection.open(address)
    answer = await conn.request([frames.FrameType.STATUS, conn.next_id()])
    await conn.aclose()
    for entry in answer[2]["topics"]:
        if entry["topic"] == topic:
            return int(sum(g["pending"] for g in entry["groups"]))
    return 0


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the figures, save and compare; return the results."""
    parser = argparse.ArgumentParser(prog="python -m bench.restart")
    add_common_args(parser)
    parser.add_argument("--messages", type=int, default=None, help="default 1000000 (quick 200000)")
    args = parser.parse_args(argv)
    total = args.messages if args.messages is not None else (200_000 if args.quick else 1_000_000)
    base_ms = int(now_ms()) + 60_000
    results: dict[str, Any] = {"messages": total}
    compileall.compile_dir(str(Path(frames.__file__).parents[2]), quiet=1)
    with Server() as first:
        # The first Server owns the temporary directory; later ones reuse its data_dir.
        data_dir: Path = first.data_dir
        results["empty"] = start_timed(first)
        print(f"empty directory: /readyz 200 after {results['empty']['to_readyz_s']:.3f} s")
        publish_s = trio.run(_publish, first.client_address, total, base_ms)
        results["publish_s"] = round(publish_s, 2)
        results["publish_msgs_per_s"] = round(total / publish_s, 1)
        print(f"published {total} in {publish_s:.1f} s ({total / publish_s:.0f} msgs/s)")
        results["data_dir_mb"] = round(first.data_bytes() / 1e6, 1)

        first.kill()
        crashed = Server(data_dir)
        try:
            results["after_sigkill"] = start_timed(crashed)
            print(
                f"after SIGKILL: /readyz 200 after {results['after_sigkill']['to_readyz_s']:.3f} s "
                f"(READY line {results['after_sigkill']['to_ready_line_s']:.3f} s)"
            )
            results["pending_after_sigkill"] = trio.run(_pending, crashed.client_address, "restart")
            results["sigterm_stop_s"] = round(crashed.terminate(), 3)
            print(f"SIGTERM: exited after {results['sigterm_stop_s']:.3f} s")
        finally:
            crashed.kill()
        clean = Server(data_dir)
        try:
            results["after_sigterm"] = start_timed(clean)
            print(
                f"after SIGTERM: /readyz 200 after {results['after_sigterm']['to_readyz_s']:.3f} s "
                f"(READY line {results['after_sigterm']['to_ready_line_s']:.3f} s)"
            )
            results["pending_after_sigterm"] = trio.run(_pending, clean.client_address, "restart")
        finally:
            clean.terminate()
    print(
        f"pending after restarts: {results['pending_after_sigkill']} / "
        f"{results['pending_after_sigterm']} (published {total})"
    )
    worst = max(results["after_sigkill"]["to_readyz_s"], results["after_sigterm"]["to_readyz_s"])
    results["target_s"] = TARGET_S
    results["meets_target"] = (
        worst < TARGET_S
        and results["pending_after_sigkill"] == total
        and results["pending_after_sigterm"] == total
    )
    print(
        f"worst restart {worst:.3f} s (target < {TARGET_S} s): "
        f"{'MET' if results['meets_target'] else 'NOT MET'}"
    )
    finish(NAME, results, args, argv)
    return results


if __name__ == "__main__":
    main()
