"""`futureq-cli cancel`, `dlq redrive` and `purge` say "outcome unknown" for the ids their
first attempt may have handled when that attempt's answer was lost.

Found by a tester: the leader of a 3-node cluster SIGKILLed during `dlq redrive TOPIC
--all` (20,000 dead letters): the CLI printed `redriven 19000 of 20000 ...; 1000
unknown`, exit 0, though all 20,000 were redriven, each once: the request whose answer
was lost had applied, the client sent it again, and the new leader answered UNKNOWN
for each id (no longer a pending dead letter). The same for `cancel`, whose lines said
`unknown (not pending ...)` for messages it had cancelled itself. The client knew an
earlier attempt's outcome was unknown and did not say so. A `purge` whose answer was
lost printed `purging 3750 pending entries` for 5,000 purged: the count of the request
sent again, without what the first attempt had removed by then.

Here a relay between the CLI and a real node forwards the request, lets the node apply
it, and closes the connection before the answer comes back: a lost answer, on demand.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import threading

import msgpack
import trio
from broker_process import BrokerProcess
from cli_process import cli as _cli

from futureq.client import PublishItem, open_client
from futureq.wire import frames


class LosingRelay:
    """Accepts connections on 127.0.0.1 and relays each to ``upstream``; the first
    frame of type ``lose`` a client sends is forwarded, and once the node answered it
    (applied) the connection is closed with nothing more sent back: the answer is lost.
    Later connections are relayed whole."""

    def __init__(
        self, upstream: str, lose: frames.FrameType, resume: threading.Event | None = None
    ) -> None:
        host, port = upstream.rsplit(":", 1)
        self.resume = resume
        """When given: connections made after the loss wait for it before being relayed
        (so a test acts between the lost attempt and the one sent again)."""
        self.upstream = (host, int(port))
        self.lose = int(lose)
        self.lost = threading.Event()
        """Set once the node answered the request whose answer this relay dropped."""
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.resume is not None and self.lost.is_set():
                self.resume.wait(30)
            server = socket.create_connection(self.upstream, timeout=10)
            muted = threading.Event()
            threading.Thread(target=self._down, args=(server, client, muted), daemon=True).start()
            threading.Thread(target=self._up, args=(client, server, muted), daemon=True).start()

    def _down(self, server: socket.socket, client: socket.socket, muted: threading.Event) -> None:
        try:
            while data := server.recv(65536):
                if muted.is_set():
                    self.lost.set()  # its answer (nothing else is owed): dropped
                    return
                client.sendall(data)
        except OSError:
            return

    def _up(self, client: socket.socket, server: socket.socket, muted: threading.Event) -> None:
        buffer = b""
        try:
            while data := client.recv(65536):
                buffer += data
                while len(buffer) >= 4:
                    (size,) = struct.unpack(">I", buffer[:4])
                    if len(buffer) < 4 + size:
                        break
                    frame, buffer = buffer[: 4 + size], buffer[4 + size :]
                    kind = msgpack.unpackb(frame[4:], strict_map_key=False)[0]
                    if kind == self.lose and not self.lost.is_set():
                        muted.set()  # before the node can answer: the answer is lost
                        server.sendall(frame)
                        self.lost.wait(30)  # applied and answered
                        return
                    server.sendall(frame)
        except OSError:
            return
        finally:
            for sock in (client, server):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def close(self) -> None:
        self.listener.close()


async def test_cancel_whose_answer_was_lost_says_outcome_unknown(broker: BrokerProcess) -> None:
    async with open_client(broker.client_address) as client:
        await client.create_group("lost", "g")
        mid = await client.publish("lost", b"x", delay_ms=3_600_000)
        relay = LosingRelay(broker.client_address, frames.FrameType.CANCEL)
        try:
            done = await trio.to_thread.run_sync(_cli, relay.address, "cancel", "lost", str(mid))
        finally:
            relay.close()
        assert relay.lost.is_set()
        assert done.returncode == 0, done
        assert f"{mid}: outcome unknown" in done.stdout, done.stdout
        assert "cancelled 0 of 1 (1 more may have been: outcome unknown)" in done.stdout, (
            done.stdout
        )
        assert "warning: outcome unknown for 1 id(s)" in done.stderr, done.stderr
        assert (await client.browse("lost", "g")).messages == []  # the first attempt did


async def test_redrive_whose_answer_was_lost_says_outcome_unknown(broker: BrokerProcess) -> None:
    async with open_client(broker.client_address) as client:
        await client.create_group("lostd", "g", max_deliveries=1)
        await client.publish("lostd", b"x")
        async with client.subscribe("lostd", "g") as sub:
            delivery = await sub.receive(10)
            assert delivery is not None
            await delivery.nack(dead_letter=True)
        relay = LosingRelay(broker.client_address, frames.FrameType.REDRIVE)
        try:
            done = await trio.to_thread.run_sync(
                _cli, relay.address, "dlq", "redrive", "lostd", "--all", "--delay", "1h"
            )
        finally:
            relay.close()
        assert relay.lost.is_set()
        assert done.returncode == 0, done
        assert "redriven 0 of 1" in done.stdout, done.stdout
        assert "1 unknown (1 of them outcome unknown" in done.stdout, done.stdout
        assert "warning: outcome unknown for 1 id(s)" in done.stderr, done.stderr
        assert len((await client.browse("lostd", "g")).messages) == 1  # redriven, once


async def test_purge_whose_answer_was_lost_says_outcome_unknown(broker: BrokerProcess) -> None:
    async with open_client(broker.client_address) as client:
        await client.create_group("lostp", "g")
        await client.publish_batch([PublishItem("lostp", b"x", 3_600_000) for _ in range(50)])
        relay = LosingRelay(broker.client_address, frames.FrameType.PURGE)
        try:
            done = await trio.to_thread.run_sync(_cli, relay.address, "purge", "lostp", "--yes")
        finally:
            relay.close()
        assert relay.lost.is_set()
        assert done.returncode == 0, done
        assert "a first attempt's answer was lost (outcome unknown)" in done.stdout, done.stdout
        assert "warning: outcome unknown for the first attempt of the purge" in done.stderr, (
            done.stderr
        )
        assert (await client.browse("lostp", "g")).messages == []


async def test_reschedule_whose_answer_was_lost_says_outcome_unknown(
    broker: BrokerProcess,
) -> None:
    """The first attempt made the message due now; it was delivered and acked before
    the attempt sent again arrived, which finds it no longer pending: UNKNOWN, which
    the CLI must not call plain "unknown" (before: `unknown (not pending ...)`)."""
    async with open_client(broker.client_address) as client:
        await client.create_group("lostr", "g")
        mid = await client.publish("lostr", b"x", delay_ms=3_600_000)
        resume = threading.Event()
        relay = LosingRelay(broker.client_address, frames.FrameType.RESCHEDULE, resume)
        try:
            async with trio.open_nursery() as nursery:
                done: list[subprocess.CompletedProcess[str]] = []

                async def run() -> None:
                    done.append(
                        await trio.to_thread.run_sync(
                            _cli, relay.address, "reschedule", "lostr", str(mid), "--delay", "0"
                        )
                    )

                nursery.start_soon(run)
                await trio.to_thread.run_sync(relay.lost.wait, 30)
                async with client.subscribe("lostr", "g") as sub:
                    delivery = await sub.receive(10)
                    assert delivery is not None and delivery.id == mid
                    await delivery.ack()
                resume.set()
        finally:
            resume.set()
            relay.close()
        (answer,) = done
        assert answer.returncode == 0, answer
        assert f"{mid}: outcome unknown" in answer.stdout, answer.stdout
        assert "rescheduled 0 of 1 (1 more may have been: outcome unknown)" in answer.stdout, (
            answer.stdout
        )
        assert "warning: outcome unknown for 1 id(s)" in answer.stderr, answer.stderr
