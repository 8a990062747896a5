"""A request being served is counted by what it holds decoded, not its wire bytes alone.

Found by a tester: the requests a connection has in progress were bounded by their wire
bytes (``limits.max_connection_buffer_bytes``, ``limits.max_node_buffer_bytes``), but a
PUBLISH of 10,000 small items takes 11 to 20 times its wire bytes once decoded, so a
connection within its 8 MiB held well over 100 MB. The estimate is checked here against
what the decoder really allocates (``tracemalloc``), for the shapes that cost most per
wire byte and for one that costs least.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import msgpack
import pytest

from futureq.broker.buffers import held_bytes
from futureq.wire import codec, frames

PUBLISH = int(frames.FrameType.PUBLISH)
SHAPES = {
    "small items": [PUBLISH, 1, 2, [["t", b"", None, None, None]] * 10_000],
    "one header each": [PUBLISH, 1, 2, [["t", b"", None, None, None, {"a": "b"}, None]] * 10_000],
    "32 headers each": [
        PUBLISH,
        1,
        2,
        [
            ["t", b"", None, None, None, {f"h{i}": f"v{j}.{i}" for i in range(32)}, None]
            for j in range(1_000)
        ],
    ],
    "long names and times": [
        PUBLISH,
        1,
        2,
        [["t" * 249, b"", 12_345_678_901, None, 99_999_999, None, "k" * 255]] * 10_000,
    ],
    "one large payload": [PUBLISH, 1, 2, [["t", b"x" * 1_000_000, None, None, None]]],
    "tags": [int(frames.FrameType.ACK), 1, [bytes(24)] * 10_000],
    "ids": [int(frames.FrameType.CANCEL), 1, "t", None, list(range(2**40, 2**40 + 10_000))],
}


def _decoded(value: Any) -> tuple[frames.Frame, int, int]:
    """The frame, its wire bytes, and the bytes its decoding left allocated."""
    body = msgpack.packb(value)
    decoder = codec.FrameDecoder(8 << 20, max_containers=codec.request_containers(10_000))
    decoder.receive_data(len(body).to_bytes(4, "big") + body)
    tracemalloc.start()
    try:
        frame = decoder.next_frame()
        allocated, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(frame, frames.Publish | frames.Ack | frames.Cancel), frame
    return frame, len(body) + codec.HEADER_BYTES, allocated


@pytest.mark.parametrize("value", SHAPES.values(), ids=list(SHAPES))
def test_the_held_bytes_of_a_request_are_within_a_factor_of_two_of_its_decoded_size(
    value: Any,
) -> None:
    frame, wire_bytes, allocated = _decoded(value)
    estimate = held_bytes(frame, wire_bytes)
    assert allocated / 2 <= estimate <= allocated * 2, (wire_bytes, allocated, estimate)


def test_small_items_count_far_more_than_their_wire_bytes() -> None:
    frame, wire_bytes, _ = _decoded(SHAPES["small items"])
    assert held_bytes(frame, wire_bytes) > 10 * wire_bytes


def test_items_of_any_shape_are_counted_without_failing() -> None:
    # PUBLISH items are raw wire values until validated: an int, a str or a short list
    # in their place reached the estimate first and failed the connection.
    items = [5, "x", None, [], ["t"], ("t", b"", None, None, None, "not a map", None)]
    frame = frames.Publish(1, frames.AckLevel.QUORUM, items)
    assert held_bytes(frame, 100) >= 100 + len(items)
