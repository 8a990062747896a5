"""File descriptors against a real ``futureq start`` process: client connections cannot
take the ones RocksDB needs.

Found by trying it as a hostile client would: with the open-file limit many hosts run
with (1024), 1,100 connections that only sent HELLO made the node log an EMFILE
traceback ten times a second per listener, then die with "storage failure: ... While
open a file for appending: .../000008.log: Too many open files" (exit 3) at its next
memtable flush. The node now raises its soft limit to the hard one, gives client
connections only what is left after RocksDB and the rest, and tells a connection beyond
that ``TOO_MANY_CONNECTIONS`` at once instead of holding it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from broker_process import BrokerProcess
from wire_client import WireClient

from futureq.errors import ErrorCode
from futureq.wire import frames

OPEN_FILES = 256
"""The node's open-file limit here: room for 144 client connections (fd_budget: 256 minus
64 for RocksDB, 32 for the rest and 16 for HTTP connections)."""


def test_connections_past_the_open_file_budget_are_refused_and_the_node_keeps_its_disk(
    tmp_path: Path,
) -> None:
    broker = BrokerProcess(
        tmp_path / "data",
        env={"FUTUREQ_STORAGE_WRITE_BUFFER_MB": "1"},  # a flush (a new file) every MiB
        open_files=OPEN_FILES,
    )
    broker.start()
    try:
        producer = WireClient(broker.client_address)
        held: list[WireClient] = []
        refused: list[frames.Error] = []
        for _ in range(OPEN_FILES):
            client = WireClient(broker.client_address, hello=False)
            client.send(frames.Hello(1, (1,), "idle", None))
            answer = client.receive()
            if isinstance(answer, frames.HelloOk):
                held.append(client)
            else:
                assert isinstance(answer, frames.Error), answer
                refused.append(answer)
                client.close()
        assert refused, "every connection was served: the open-file budget is not enforced"
        assert 100 <= len(held) < OPEN_FILES
        assert {error.code for error in refused} == {ErrorCode.TOO_MANY_CONNECTIONS}
        assert "limits.max_connections" in refused[0].message
        assert "retry later" in refused[0].message

        # With every client slot taken, RocksDB still opens its files: 6 MiB of
        # publishes is several memtable flushes.
        for number in range(60):
            answer = producer.publish([["fd.t", os.urandom(100_000), 0, None, None]])
            assert isinstance(answer, frames.PublishOk), (number, answer)
        assert broker.process is not None and broker.process.poll() is None
        assert producer.group_pending("fd.t", "default") == 60

        for client in held:
            client.close()
        deadline = time.monotonic() + 10
        while True:  # the slots come back as the server notices the closes
            client = WireClient(broker.client_address, hello=False)
            client.send(frames.Hello(1, (1,), "late", None))
            answer = client.receive()
            client.close()
            if isinstance(answer, frames.HelloOk):
                break
            assert time.monotonic() < deadline, answer
            time.sleep(0.1)

        log = broker.stderr_text()
        assert "the open-file limit (256) leaves room for 144 client connections" in log
        assert "refused: TOO_MANY_CONNECTIONS" in log
        assert "Traceback" not in log
        assert "Too many open files" not in log
    finally:
        broker.terminate()


def test_one_address_cannot_hold_every_slot_with_connections_that_never_say_hello(
    broker: BrokerProcess,
) -> None:
    """Found by opening connections that never send HELLO: before it is answered a
    client has not authenticated, yet each such connection held a slot of
    limits.max_connections for 10 s, renewable at will, so one host could keep every
    other client out. One address may now hold 64 of them."""
    silent = [
        WireClient(broker.client_address, hello=False, source_host="127.0.0.2") for _ in range(64)
    ]
    extra = WireClient(broker.client_address, hello=False, source_host="127.0.0.2")
    answer = extra.receive(timeout_s=5)  # sent at once, before any HELLO
    assert isinstance(answer, frames.Error), answer
    assert answer.code == ErrorCode.TOO_MANY_CONNECTIONS, answer
    assert "have not sent HELLO" in answer.message, answer.message
    # Another address is served; and once one of them says HELLO, room is made.
    assert isinstance(WireClient(broker.client_address).request(frames.Ping(1)), frames.Pong)
    silent[0].send(frames.Hello(1, (1,), "late", None))
    assert isinstance(silent[0].receive(), frames.HelloOk)
    deadline = time.monotonic() + 10
    while True:
        late = WireClient(broker.client_address, hello=False, source_host="127.0.0.2")
        late.send(frames.Hello(1, (1,), "late", None))
        answer = late.receive()
        late.close()
        if isinstance(answer, frames.HelloOk):
            break
        assert time.monotonic() < deadline, answer
        time.sleep(0.05)
