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

from futureq.client.sync import SyncClient
from futureq.errors import ErrorCode, RequestError
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
    # Refused alone, on its request id: the frame was consumed whole.
    assert (answer.code, answer.request_id) == (ErrorCode.BATCH_TOO_LARGE, 5), answer
    assert "more than 41024 arrays and maps" in answer.message, answer.message
    assert isinstance(client.request(frames.Ping(client.next_id())), frames.Pong)
    assert peak_memory_bytes(broker.process.pid) - before < 100 * MIB
    assert isinstance(other.request(frames.Ping(other.next_id())), frames.Pong)
    # Without a frame type and request id first, there is no request to refuse alone.
    headless = bytes([0x91, 0xDD]) + count.to_bytes(4, "big") + b"\x90" * count
    client.send_raw(len(headless).to_bytes(4, "big") + headless)
    answer = client.receive()
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.MALFORMED_FRAME, answer
    assert client.receive() is codec.CLOSED
    assert isinstance(other.request(frames.Ping(other.next_id())), frames.Pong)


def test_a_cancel_of_too_many_ids_fails_alone(broker: BrokerProcess) -> None:
    """``client.cancel(topic, list(range(100_000)))`` (documented: BATCH_TOO_LARGE past
    ``limits.max_batch_items``) closed the client's connection with MALFORMED_FRAME, its
    subscriptions and other requests with it. It now fails alone."""
    with SyncClient(broker.client_address) as client:
        message_id = client.publish("decoded.cancel", b"x", delay_ms=3_600_000)
        for ids in (list(range(100_000)), list(range(20_000))):
            try:
                client.cancel("decoded.cancel", ids)
            except RequestError as exc:
                assert exc.code is ErrorCode.BATCH_TOO_LARGE, exc
                assert "split" in exc.message, exc.message
            else:
                raise AssertionError(f"a CANCEL of {len(ids)} ids was taken")
        assert client.cancel("decoded.cancel", [message_id]) == [frames.ItemStatus.DONE]
    # The very connection stays: its next request is answered.
    wire = WireClient(broker.client_address)
    answer = wire.request(frames.Cancel(wire.next_id(), "decoded.cancel", None, list(range(10**5))))
    assert isinstance(answer, frames.Error) and answer.code == ErrorCode.BATCH_TOO_LARGE, answer
    assert isinstance(wire.request(frames.Ping(wire.next_id())), frames.Pong)


def test_the_largest_publish_with_headers_is_taken(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address)
    items = [["decoded.size", b"", None, None, None, {"h": "v"}, None]] * 10_000
    answer = client.publish(items)
    assert isinstance(answer, frames.PublishOk), answer
    assert answer.count == 10_000
