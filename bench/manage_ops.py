"""Managing scheduled messages on one node (issue 14): cancel and reschedule throughput
in batches of 100, browse page latency with a large backlog, and a purge.

Steps: start one broker; create group ``g`` of topic ``m`` and publish ``--entries``
messages (100-byte payloads, due in an hour, batches of 1000, ack level quorum),
keeping their ids. Then:

* RESCHEDULE the first half by id in requests of 100 ids (``--window`` requests in
  flight on one connection), to a due time a minute later; count ids per second;
* BROWSE pages of 100 (no preview) at the start of the backlog, and at its middle and
  end (``from_due_ms``), 50 requests each, one at a time: latency p50/p99;
* CANCEL the first half by id in requests of 100, pipelined the same way;
* PURGE the group (the other half; with ``--purge-only`` every entry, after nothing
  else): the answer time and the time until the group's pending count is 0, while
  PINGs every 10 ms measure how the loop answers, and another topic (``other``, group
  ``c``) is served meanwhile: a producer publishes one message every 10 ms due 300 ms
  later, for as long as the purge runs, and a consumer (credit 100, acking each
  DELIVER) records each one's lateness (received - due, ms; the issue's target is a
  p99 of at most 50 ms).

With ``--counts`` it does only this instead: publish ``--entries`` messages due one by
one over the next two days (batches of 1000), then time BROWSE_COUNTS with relative
bounds next minute / hour / day: the first request (it builds the group's due-time
histogram, while PINGs every 10 ms measure how the loop answers), then
``COUNTS_REQUESTS`` more, one at a time (p50/p99), and whether the answer is complete.

Usage::

    python -m bench.manage_ops [--quick] [--compare] [--entries 200000] [--window 8]
    python -m bench.manage_ops --entries 1000000 --purge-only   # a purge of 1M
    python -m bench.manage_ops --entries 1000000 --counts       # BROWSE_COUNTS at 1M

Figures: cancel and reschedule ids/s, browse p50/p99 ms at start/middle/end, purge
answer and completion seconds, PING p50/p99/max ms during the purge, and the other
topic's delivery lateness p50/p99/max ms during it.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import trio

from bench._common import (
    PAYLOAD_BYTES,
    RawConnection,
    Server,
    add_common_args,
    finish,
    frame_bytes,
    percentile,
)
from futureq.wire import frames

NAME = "manage_ops"
TOPIC = "m"
GROUP = "g"
BATCH_IDS = 100
PUBLISH_BATCH = 1000
BROWSE_REQUESTS = 50
PING_EVERY_S = 0.01
OTHER_TOPIC = "other"
OTHER_GROUP = "c"
OTHER_EVERY_S = 0.01
OTHER_DELAY_MS = 300


async def _publish(conn: RawConnection, entries: int, due_ms: int) -> list[int]:
    """Publish ``entries`` messages due at ``due_ms`` and return their ids in order."""
    ids: list[int] = []
    payload = b"x" * PAYLOAD_BYTES
    for start in range(0, entries, PUBLISH_BATCH):
        count = min(PUBLISH_BATCH, entries - start)
        items = [[TOPIC, payload, None, due_ms, None] for _ in range(count)]
        answer = await conn.request(
            [frames.FrameType.PUBLISH, conn.next_id(), int(frames.AckLevel.QUORUM), items]
        )
        assert answer[0] == frames.FrameType.PUBLISH_OK, answer
        ids.extend(range(answer[2], answer[2] + count))
    return ids


async def _pipelined(conn: RawConnection, requests: list[list[Any]], window: int) -> float:
    """Send ``requests`` with up to ``window`` in flight; return the seconds taken."""
    started = time.perf_counter()
    sent = received = 0
    while received < len(requests):
        while sent < len(requests) and sent - received < window:
            await conn.send(frame_bytes(requests[sent]))
            sent += 1
        answer = await conn.receive()
        assert answer[0] in (frames.FrameType.ITEM_RESULTS, frames.FrameType.OK), answer
        received += 1
    return time.perf_counter() - started


def _latency(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(percentile(ordered, 50) * 1000, 2),
        "p99_ms": round(percentile(ordered, 99) * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


async def _browse(conn: RawConnection, from_due_ms: int | None) -> dict[str, float]:
    samples = []
    for _ in range(BROWSE_REQUESTS):
        started = time.perf_counter()
        answer = await conn.request(
            [frames.FrameType.BROWSE, conn.next_id(), TOPIC, GROUP, from_due_ms, None, None, 100, 0]
        )
        samples.append(time.perf_counter() - started)
        assert answer[0] == frames.FrameType.BROWSE_OK and len(answer[3]) > 0, answer[:3]
    return _latency(samples)


COUNTS_REQUESTS = 30
COUNTS_BOUNDS_MS = [60_000, 3_600_000, 86_400_000]
COUNTS_SPAN_MS = 2 * 86_400_000


async def _counts(server: Server, entries: int) -> dict[str, Any]:
    """The ``--counts`` measurement (see the module docstring)."""
    conn = await RawConnection.open(server.client_address, "bench-counts")
    answer = await conn.request(
        [frames.FrameType.GROUP_CREATE, conn.next_id(), TOPIC, GROUP, 3_600_000, None]
    )
    assert answer[0] == frames.FrameType.OK, answer
    payload = b"x" * PAYLOAD_BYTES
    first_due = int(time.time() * 1000) + 1000
    started = time.perf_counter()
    for start in range(0, entries, PUBLISH_BATCH):
        count = min(PUBLISH_BATCH, entries - start)
        items = [
            [TOPIC, payload, None, first_due + (start + i) * COUNTS_SPAN_MS // entries, None]
            for i in range(count)
        ]
        answer = await conn.request(
            [frames.FrameType.PUBLISH, conn.next_id(), int(frames.AckLevel.QUORUM), items]
        )
        assert answer[0] == frames.FrameType.PUBLISH_OK, answer
    publish_s = time.perf_counter() - started

    def request() -> list[Any]:
        return [
            frames.FrameType.BROWSE_COUNTS,
            conn.next_id(),
            TOPIC,
            GROUP,
            COUNTS_BOUNDS_MS,
            True,
        ]

    pings: list[float] = []
    first: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        ping_conn = await RawConnection.open(server.client_address, "bench-counts-ping")

        async def ping() -> None:
            while True:
                sent = time.perf_counter()
                reply = await ping_conn.request([frames.FrameType.PING, ping_conn.next_id()])
                assert reply[0] == frames.FrameType.PONG, reply
                pings.append(time.perf_counter() - sent)
                await trio.sleep(PING_EVERY_S)

        nursery.start_soon(ping)
        await trio.sleep(0.1)
        sent = time.perf_counter()
        answer = await conn.request(request())
        first = {"first_request_ms": round((time.perf_counter() - sent) * 1000, 1)}
        nursery.cancel_scope.cancel()
    assert answer[0] == frames.FrameType.BROWSE_COUNTS_OK, answer
    first.update(counts=answer[4], later=answer[5], complete=answer[6])
    samples = []
    for _ in range(COUNTS_REQUESTS):
        sent = time.perf_counter()
        again = await conn.request(request())
        samples.append(time.perf_counter() - sent)
        assert again[0] == frames.FrameType.BROWSE_COUNTS_OK, again
    return {
        "entries": entries,
        "publish_s": round(publish_s, 2),
        "counts_first": first,
        "counts_then": {**_latency(samples), "complete": again[6]},
        "ping_during_first": _latency(pings) if pings else None,
    }


def _now_ms() -> float:
    return time.time() * 1000


async def _serve_other(address: str, purging: trio.Event, late: list[float]) -> None:
    """Publish to ``other`` while ``purging`` is not set, then until every message
    published was received; a consumer records each one's lateness (ms)."""
    producer = await RawConnection.open(address, "bench-other-producer")
    consumer = await RawConnection.open(address, "bench-other-consumer")
    answer = await producer.request(
        [frames.FrameType.GROUP_CREATE, producer.next_id(), OTHER_TOPIC, OTHER_GROUP, 30_000, None]
    )
    assert answer[0] == frames.FrameType.OK, answer
    await consumer.send(
        frame_bytes([frames.FrameType.SUBSCRIBE, consumer.next_id(), OTHER_TOPIC, OTHER_GROUP, 100])
    )
    published = received = 0

    async def produce(cancel_scope: trio.CancelScope) -> None:
        nonlocal published
        while not purging.is_set():
            due_ms = int(_now_ms()) + OTHER_DELAY_MS
            answer = await producer.request(
                [
                    frames.FrameType.PUBLISH,
                    producer.next_id(),
                    int(frames.AckLevel.QUORUM),
                    [[OTHER_TOPIC, b"o", None, due_ms, None]],
                ]
            )
            assert answer[0] == frames.FrameType.PUBLISH_OK, answer
            published += 1
            await trio.sleep(OTHER_EVERY_S)
        while received < published:  # noqa: ASYNC110 - the consumer task counts them
            await trio.sleep(0.01)
        cancel_scope.cancel()

    async def consume() -> None:
        nonlocal received
        sub_id = None
        while True:
            frame = await consumer.receive()
            now = _now_ms()
            if frame[0] == frames.FrameType.SUBSCRIBE_OK:
                sub_id = frame[2]
                continue
            if frame[0] != frames.FrameType.DELIVER:
                continue
            tags = []
            for row in frame[4]:
                late.append(now - row[3])  # [tag, id, payload, due_ms, ...]
                tags.append(row[0])
            received += len(frame[4])
            await consumer.send(
                frame_bytes([frames.FrameType.ACK, consumer.next_id(), tags])
                + frame_bytes([frames.FrameType.CREDIT, consumer.next_id(), sub_id, len(tags)])
            )

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce, nursery.cancel_scope)
            nursery.start_soon(consume)
    await producer.aclose()
    await consumer.aclose()


async def _measure(
    server: Server, entries: int, window: int, purge_only: bool = False
) -> dict[str, Any]:
    address = server.client_address
    conn = await RawConnection.open(address, "bench-manage")
    answer = await conn.request(
        [frames.FrameType.GROUP_CREATE, conn.next_id(), TOPIC, GROUP, 3_600_000, None]
    )
    assert answer[0] == frames.FrameType.OK, answer
    due_ms = int(time.time() * 1000) + 3_600_000
    started = time.perf_counter()
    # Spread the due times so browse from the middle/end seeks into a real range.
    ids: list[int] = []
    for part in range(4):
        ids += await _publish(conn, entries // 4, due_ms + part * 60_000)
    publish_s = time.perf_counter() - started
    if purge_only:
        return {
            "entries": entries,
            "publish_s": round(publish_s, 2),
            **(await _purge(conn, address)),
        }
    half = ids[: len(ids) // 2]

    reschedule = [
        [
            frames.FrameType.RESCHEDULE,
            conn.next_id(),
            TOPIC,
            None,
            half[start : start + BATCH_IDS],
            None,
            3_660_000,
        ]
        for start in range(0, len(half), BATCH_IDS)
    ]
    reschedule_s = await _pipelined(conn, reschedule, window)

    browse = {
        "start": await _browse(conn, None),
        "middle": await _browse(conn, due_ms + 2 * 60_000),
        "end": await _browse(conn, due_ms + 3 * 60_000),
    }

    cancel = [
        [frames.FrameType.CANCEL, conn.next_id(), TOPIC, None, half[start : start + BATCH_IDS]]
        for start in range(0, len(half), BATCH_IDS)
    ]
    cancel_s = await _pipelined(conn, cancel, window)
    purged = await _purge(conn, address)
    return {
        "entries": entries,
        "publish_s": round(publish_s, 2),
        "reschedule_ids_per_s": round(len(half) / reschedule_s),
        "cancel_ids_per_s": round(len(half) / cancel_s),
        "browse_page_100": browse,
        **purged,
    }


async def _purge(conn: RawConnection, address: str) -> dict[str, Any]:
    """PURGE the group; PINGs and another topic's deliveries meanwhile (see the module
    docstring)."""
    pinger = await RawConnection.open(address, "bench-ping")
    pings: list[float] = []
    done = trio.Event()

    async def ping() -> None:
        while not done.is_set():
            began = time.perf_counter()
            answer = await pinger.request([frames.FrameType.PING, pinger.next_id()])
            assert answer[0] == frames.FrameType.PONG, answer
            pings.append(time.perf_counter() - began)
            await trio.sleep(PING_EVERY_S)

    late: list[float] = []
    purging_done = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ping)
        nursery.start_soon(_serve_other, address, purging_done, late)
        await trio.sleep(0.5)  # the other topic is being served before the purge starts
        late.clear()
        began = time.perf_counter()
        answer = await conn.request([frames.FrameType.PURGE, conn.next_id(), TOPIC, GROUP])
        assert answer[0] == frames.FrameType.OK, answer
        purge_answer_s = time.perf_counter() - began
        purged_entries = answer[2]
        while True:
            status = await conn.request([frames.FrameType.STATUS, conn.next_id()])
            groups = [
                g for t in status[2].get("topics", []) if t["topic"] == TOPIC for g in t["groups"]
            ]
            if groups and groups[0]["pending"] == 0:
                break
            await trio.sleep(0.05)
        purge_s = time.perf_counter() - began
        during = len(late)
        done.set()
        purging_done.set()
    await pinger.aclose()
    await conn.aclose()
    ordered = sorted(late[:during])
    return {
        "purge_entries": purged_entries,
        "purge_answer_s": round(purge_answer_s, 3),
        "purge_s": round(purge_s, 2),
        "ping_during_purge": _latency(pings),
        "other_topic_during_purge": {
            "deliveries": len(ordered),
            "late_p50_ms": round(percentile(ordered, 50), 1) if ordered else None,
            "late_p99_ms": round(percentile(ordered, 99), 1) if ordered else None,
            "late_max_ms": round(ordered[-1], 1) if ordered else None,
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; print and save its figures."""
    parser = argparse.ArgumentParser(prog="python -m bench.manage_ops")
    add_common_args(parser)
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument(
        "--purge-only", action="store_true", help="publish --entries, then only purge them all"
    )
    parser.add_argument(
        "--counts", action="store_true", help="publish --entries, then only time BROWSE_COUNTS"
    )
    args = parser.parse_args(argv)
    entries = 20_000 if args.quick else args.entries
    if args.counts:
        with Server() as server:
            server.start()
            results = trio.run(_counts, server, entries)
        first, then = results["counts_first"], results["counts_then"]
        print(
            f"[{NAME}] {entries} pending: BROWSE_COUNTS first {first['first_request_ms']} ms "
            f"(complete {first['complete']}, PING p99/max during it "
            f"{(results['ping_during_first'] or {}).get('p99_ms')}/"
            f"{(results['ping_during_first'] or {}).get('max_ms')} ms), then p50/p99 "
            f"{then['p50_ms']}/{then['p99_ms']} ms (complete {then['complete']})"
        )
        finish(NAME + "_counts", results, args, argv)
        return results
    with Server() as server:
        server.start()
        results = trio.run(_measure, server, entries, args.window, args.purge_only)
    other = results["other_topic_during_purge"]
    purge = (
        f"purge of {results['purge_entries']} answered in {results['purge_answer_s']} s, "
        f"done in {results['purge_s']} s, PING p99 {results['ping_during_purge']['p99_ms']} "
        f"ms, other topic lateness p50/p99/max {other['late_p50_ms']}/{other['late_p99_ms']}/"
        f"{other['late_max_ms']} ms over {other['deliveries']} deliveries"
    )
    if args.purge_only:
        print(f"[{NAME}] {entries} pending: {purge}")
    else:
        browse = results["browse_page_100"]
        print(
            f"[{NAME}] {entries} pending: cancel {results['cancel_ids_per_s']} ids/s, "
            f"reschedule {results['reschedule_ids_per_s']} ids/s (batches of {BATCH_IDS}, "
            f"window {args.window}); browse page of 100 p50/p99 ms start "
            f"{browse['start']['p50_ms']}/{browse['start']['p99_ms']}, middle "
            f"{browse['middle']['p50_ms']}/{browse['middle']['p99_ms']}, end "
            f"{browse['end']['p50_ms']}/{browse['end']['p99_ms']}; {purge}"
        )
    finish(NAME, results, args, argv)
    return results


if __name__ == "__main__":
    main()
