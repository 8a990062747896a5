"""A ``SyncClient`` whose servers accept and never answer says so at every call.

Found by a tester: given many such servers (stopped processes keep their listening
sockets), its first call raised ``TimeoutError``: it waited ``connect_timeout_s`` + 5 s
for a start-up that tries the servers one after another (``CONNECT_STAGGER_S`` apart, or
sooner when one fails) and so takes longer; the background thread, still starting,
then left every later call an ``AssertionError``. Now it waits as long as opening can
take, and each call raises the documented ``ConnectionLostError`` (``docs/client.md``:
"the next call tries again").
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from futureq.client.sync import SyncClient
from futureq.errors import ConnectionLostError


@pytest.fixture
def silent_servers() -> Iterator[list[str]]:
    """Listening sockets that never accept: a connection completes (the backlog) and
    HELLO is never answered, as a stopped server's."""
    sockets = []
    try:
        for _ in range(14):
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen(8)
            sockets.append(listener)
        yield [f"127.0.0.1:{s.getsockname()[1]}" for s in sockets]
    finally:
        for listener in sockets:
            listener.close()


def test_a_sync_client_whose_servers_never_answer_says_so_at_every_call(
    silent_servers: list[str],
) -> None:
    # 14 servers tried 0.5 s apart: opening takes about 7 s, more than the 5.5 s
    # (connect_timeout_s + 5 s) the SyncClient used to wait for it.
    client = SyncClient(silent_servers, connect_timeout_s=0.5, request_timeout_s=1.0)
    try:
        for _ in range(2):  # the next call tries again (docs/client.md)
            started = time.monotonic()
            with pytest.raises(ConnectionLostError, match="no answer within 0.5 s"):
                client.publish("brk.sync", b"x")
            assert time.monotonic() - started < 30
    finally:
        client.close()
