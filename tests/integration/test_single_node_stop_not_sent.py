"""A single node stopped with SIGTERM under at-most-once publishers: every publish ends
acknowledged or NotSentError ("not sent, safe to resend"), never "outcome unknown",
and exactly the acknowledged ones are stored. A real node subprocess on 127.0.0.1.

Before: the node's GOAWAY said which publishes it had not served, and the client
answered those with NotSentError and sent them again; but no node came back, so the
call waited for a connection until ``request_timeout_s`` and then raised a plain
ConnectionLostError: "outcome unknown" for a publish that was never stored. Publishes
that waited in the client's batcher past their deadline ended ``TIMEOUT`` (outcome
unknown) too.
"""

from __future__ import annotations

import anyio
import pytest
from broker_process import BrokerProcess

from backends import on_both_backends
from futureq.client import PublishItem, open_client
from futureq.errors import FutureQError, NotSentError

PUBLISHERS = 16
TOPIC = "stopping"
FAR_MS = 3_600_000
"""Messages are due in an hour: they stay pending, so browsing counts every one stored."""


@on_both_backends
async def test_a_stopped_single_node_leaves_no_publish_outcome_unknown(
    broker: BrokerProcess,
) -> None:
    acked: dict[bytes, int] = {}
    not_sent: list[bytes] = []
    other: list[str] = []

    async with open_client(
        broker.client_address, request_timeout_s=2.0, retry_unknown_outcome=False
    ) as client:
        stop = anyio.Event()
        enough = anyio.Event()

        async def publisher(worker: int) -> None:
            n = 0
            while not stop.is_set():
                payloads = [b"%d:%d" % (worker, n), b"%d:%d" % (worker, n + 1)]
                n += 2
                try:
                    if worker % 2:  # publish_batch: _call directly
                        ids = await client.publish_batch(
                            [PublishItem(TOPIC, p, delay_ms=FAR_MS) for p in payloads]
                        )
                    else:  # publish: through the batcher, one message
                        payloads = payloads[:1]
                        ids = [await client.publish(TOPIC, payloads[0], delay_ms=FAR_MS)]
                except NotSentError:
                    not_sent.extend(payloads)
                except FutureQError as exc:
                    other.append(f"{type(exc).__name__}: {exc}")
                else:
                    acked.update(zip(payloads, ids, strict=True))
                    if len(acked) >= 500:
                        enough.set()

        async with anyio.create_task_group() as group:
            for worker in range(PUBLISHERS):
                group.start_soon(publisher, worker)
            with anyio.fail_after(10):
                await enough.wait()
            assert await anyio.to_thread.run_sync(broker.terminate) == 0  # SIGTERM
            # The publishers go on against the stopped node for a deadline and more.
            await anyio.sleep(2.5)
            stop.set()

    assert not other, other[:5]
    assert not_sent, "no publish was cut off by the stop"

    await anyio.to_thread.run_sync(broker.start)  # the same data and ports
    stored: dict[bytes, int] = {}
    async with open_client(broker.client_address, request_timeout_s=10.0) as client:
        cursor: bytes | None = None
        while True:
            page = await client.browse(TOPIC, cursor=cursor, limit=1000, preview_bytes=32)
            for message in page.messages:
                assert message.preview is not None
                stored[message.preview] = message.id
            cursor = page.next_cursor
            if cursor is None:
                break
    # Every acknowledged publish is stored, under the id it was given; and nothing
    # reported not sent is: the verdict was true.
    assert stored == acked, (
        len(stored),
        len(acked),
        sorted(set(stored) & set(not_sent))[:5],
        sorted(set(acked) - set(stored))[:5],
    )


@pytest.mark.parametrize("stop", ["terminate", "kill"])
@on_both_backends
async def test_settling_a_delivery_of_a_stopped_single_node_is_not_sent(
    broker: BrokerProcess, stop: str
) -> None:
    # SIGTERM: the node hands its deliveries over and stops; their settlement waits
    # for a node to lead until the deadline, and none comes. SIGKILL: the connection
    # they came on is lost, and their tags with it. Either way an ack or nack sends
    # nothing and takes no effect (the message comes again). Before: a plain
    # ConnectionLostError, "outcome unknown".
    async with open_client(broker.client_address, request_timeout_s=2.0) as client:
        await client.publish_batch([PublishItem("settle", b"a"), PublishItem("settle", b"b")])
        async with client.subscribe("settle", "g", prefetch=2) as sub:
            with anyio.fail_after(10):
                held = [await sub.__anext__(), await sub.__anext__()]
            if stop == "terminate":
                assert await anyio.to_thread.run_sync(broker.terminate) == 0
            else:
                await anyio.to_thread.run_sync(broker.kill)
                with anyio.fail_after(10):
                    while client.connected_address is not None:  # noqa: ASYNC110 - no public event, under a deadline
                        await anyio.sleep(0.01)  # the client saw the connection end
            with pytest.raises(NotSentError, match="not sent"):
                await held[0].ack()
            with pytest.raises(NotSentError):
                await held[1].nack()

    await anyio.to_thread.run_sync(broker.start)
    async with open_client(broker.client_address, request_timeout_s=10.0) as client:
        page = await client.browse("settle", "g", preview_bytes=8)
        assert sorted(message.preview for message in page.messages) == [b"a", b"b"]
