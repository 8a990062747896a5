"""Plain asyncio programs using the client against a real ``futureq start`` process.

``test_client_roundtrip.py`` runs the same test bodies under both event loops; these are
written the way an asyncio service is (``asyncio.run``, ``asyncio.gather``,
``asyncio.timeout``, an ``asyncio.start_server`` request handler publishing through one
shared client, as a FastAPI handler would), so they pin what issue 13 found broken:
``asyncio.run(...)`` with the async client.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Protocol

import pytest

from futureq.client import Client, open_client


class BrokerProcess(Protocol):
    client_address: str


def test_asyncio_run_publish_gather_consume_ack_nack(broker: BrokerProcess) -> None:
    async def main() -> tuple[list[int], list[tuple[int, int]]]:
        async with open_client(broker.client_address, request_timeout_s=20.0) as client:
            ids = await asyncio.gather(
                *(client.publish("aio.jobs", f"job {i}".encode()) for i in range(20))
            )
            seen: list[tuple[int, int]] = []
            async with client.subscribe("aio.jobs", "workers", prefetch=8) as sub:
                nacked = False
                async for delivery in sub:
                    seen.append((delivery.id, delivery.attempt))
                    if delivery.id == ids[3] and not nacked:
                        nacked = True
                        await delivery.nack()
                    else:
                        await delivery.ack()
                    if len(seen) == len(ids) + 1:
                        break
            return list(ids), seen

    ids, seen = asyncio.run(main())
    assert len(set(ids)) == 20
    assert sorted(i for i, attempt in seen if attempt == 1) == sorted(ids)
    assert [(i, a) for i, a in seen if a == 2] == [(ids[3], 2)]


def test_asyncio_cancellation_leaves_the_client_working(broker: BrokerProcess) -> None:
    async def main() -> bytes:
        async with open_client(broker.client_address, request_timeout_s=20.0) as client:
            async with client.subscribe("aio.quiet", "g", prefetch=4) as sub:
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.3):
                        await sub.__anext__()  # nothing published yet: cancelled
                waiter = asyncio.create_task(sub.__anext__())
                await asyncio.sleep(0.1)
                waiter.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiter
                await client.publish("aio.quiet", b"after the cancellations")
                async with asyncio.timeout(10):
                    delivery = await sub.__anext__()
                await delivery.ack()
                return delivery.payload

    assert asyncio.run(main()) == b"after the cancellations"


@contextlib.asynccontextmanager
async def lifespan(address: str) -> AsyncIterator[Client]:
    """What a FastAPI ``lifespan`` does: one client for the whole service."""
    async with open_client(address, request_timeout_s=20.0) as client:
        yield client


def test_request_handlers_publish_through_one_shared_client(broker: BrokerProcess) -> None:
    async def main() -> tuple[list[bytes], list[bytes]]:
        async with lifespan(broker.client_address) as client:

            async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                body = await reader.readline()
                message_id = await client.publish("aio.orders", body.strip(), delay_ms=50)
                writer.write(f"{message_id}\n".encode())
                await writer.drain()
                writer.close()
                await writer.wait_closed()

            server = await asyncio.start_server(handle, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]

            async def request(body: bytes) -> bytes:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(body + b"\n")
                await writer.drain()
                answer = await reader.readline()
                writer.close()
                await writer.wait_closed()
                return answer.strip()

            async with server:
                answers = await asyncio.gather(*(request(f"order {i}".encode()) for i in range(10)))
            got: list[bytes] = []
            async with client.subscribe("aio.orders", "billing", prefetch=10) as sub:
                async for delivery in sub:
                    got.append(delivery.payload)
                    await delivery.ack()
                    if len(got) == 10:
                        break
            return list(answers), got

    answers, got = asyncio.run(main())
    assert all(answer.isdigit() for answer in answers) and len(set(answers)) == 10
    assert sorted(got) == sorted(f"order {i}".encode() for i in range(10))
