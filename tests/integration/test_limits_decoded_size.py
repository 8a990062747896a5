"""What one frame costs the server once decoded is bounded, not only its bytes, against
a real ``futureq start`` process.

An array or map is one byte of msgpack and some 60 bytes of Python once decoded. A
client's 4 MiB PUBLISH whose items were four million empty arrays took the node from
about 60 MB to 390 MB of memory while it was decoded (refused as BATCH_TOO_LARGE only
afterwards), enough to have a small container's node killed. A client frame may now
hold at most 4 x ``limits.max_batch_items`` + 1,024 arrays and maps, refused as it is
decoded (``docs/protocol.md``, "Framing").
"""

from __future__ import annotations

from pathlib import Path

from broker_process import BrokerProcess
from wire_client import WireClient

from futureq.errors import ErrorCode
from futureq.wire import codec, frames

MIB = 1024 * 1024


def peak_memory_bytes(pid: int) -> int:
    """The process's peak resident memory (``VmHWM``), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_frame_of_millions_of_empty_arrays_is_refused_as_it_decodes(
    broker: BrokerProcess,
) -> None:
    assert broker.process is not None
    other = WireClient(broker.client_address)
    before = peak_memory_bytes(broker.process.pid)
    client = WireClient(broker.client_address)
    count = 4 * MIB - 64
    # [PUBLISH, 5, QUORUM, items] with items an array of `count` empty arrays.
    body = bytes([0x94, 0x03, 0x05, 0x02, 0xDD]) + count.to_bytes(4, "big") + b"\x90" * count
    client.send_raw(len(body).to_bytes(4, "big") + body)

    answer = client.receive()

    assert isinstance(answer, frames.Error), answer
    assert answer.code == ErrorCode.MALFORMED_FRAME
    assert "more than 41024 arrays and maps" in answer.message, answer.message
    assert client.receive() is codec.CLOSED
    assert peak_memory_bytes(broker.process.pid) - before < 100 * MIB
    assert isinstance(other.request(frames.Ping(other.next_id())), frames.Pong)


def test_the_largest_publish_with_headers_is_taken(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address)
    items = [["decoded.size", b"", None, None, None, {"h": "v"}, None]] * 10_000
    answer = client.publish(items)
    assert isinstance(answer, frames.PublishOk), answer
    assert answer.count == 10_000
