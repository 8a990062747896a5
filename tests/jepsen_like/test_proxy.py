"""The link proxy forwards length-prefixed frames and drops whole frames when cut."""

from __future__ import annotations

import random
from functools import partial

import trio
from tests.jepsen_like.proxy import LinkProxy, LinkTable, _split_frames, is_handshake_frame

from futureq.raft import peer_auth
from futureq.wire.codec import encode_value


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


async def receive_exactly(stream: trio.SocketStream, size: int) -> bytes:
    data = bytearray()
    with trio.fail_after(5):
        while len(data) < size:
            chunk = await stream.receive_some(size - len(data))
            assert chunk, "connection closed"
            data += chunk
    return bytes(data)


async def echo(stream: trio.SocketStream) -> None:
    async with stream:
        while chunk := await stream.receive_some(65536):
            await stream.send_all(chunk)


def test_split_frames_keeps_partial_tail_and_detects_unframed_streams() -> None:
    buffer = bytearray(frame(b"ab") + frame(b"cde") + frame(b"fg")[:3])
    frames, framed = _split_frames(buffer)
    assert framed and frames == [frame(b"ab"), frame(b"cde")]
    assert bytes(buffer) == frame(b"fg")[:3]
    garbage = bytearray(b"GET / HTTP/1.1\r\n")
    frames, framed = _split_frames(garbage)
    assert not framed and frames == [] and bytes(garbage) == b"GET / HTTP/1.1\r\n"


async def test_proxy_forwards_then_drops_cut_frames_then_heals() -> None:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, echo, 0, host="127.0.0.1"))
        target_port = listeners[0].socket.getsockname()[1]
        proxy = LinkProxy(1, 2, target_port, random.Random(0))
        port = await nursery.start(proxy.run)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(frame(b"one"))
            assert await receive_exactly(stream, 7) == frame(b"one")
            table = LinkTable()
            table.links[(1, 2)] = proxy
            table.cut(1, 2)
            await stream.send_all(frame(b"lost"))
            with trio.fail_after(5):
                while proxy.stats.frames_dropped == 0:  # noqa: ASYNC110 - a checkpoint, no sleep
                    await trio.lowlevel.checkpoint()
            table.heal()
            await stream.send_all(frame(b"two"))
            assert await receive_exactly(stream, 7) == frame(b"two")
        assert proxy.stats.frames_dropped == 1
        assert proxy.stats.frames_forwarded == 4  # one and two, each way
        nursery.cancel_scope.cancel()


async def test_handshake_frames_pass_a_cut_link_and_raft_frames_do_not() -> None:
    hello = encode_value(
        peer_auth.Hello("c", 1, 2, "127.0.0.1:1", None, bytes(32)).to_wire()  # type: ignore[arg-type]
    )
    accepted = encode_value(peer_auth.Accepted().to_wire())
    raft = encode_value(b"\x93\x01\x02\x03")
    assert is_handshake_frame(hello) and is_handshake_frame(accepted)
    assert not is_handshake_frame(raft) and not is_handshake_frame(frame(b"futureq-raft"))
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, echo, 0, host="127.0.0.1"))
        proxy = LinkProxy(1, 2, listeners[0].socket.getsockname()[1], random.Random(0))
        port = await nursery.start(proxy.run)
        proxy.faults["forward"].cut = True
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(raft + hello)
            assert await receive_exactly(stream, len(hello)) == hello
        assert proxy.stats.frames_dropped == 1
        nursery.cancel_scope.cancel()


def test_link_table_cut_covers_both_connections_of_a_pair() -> None:
    table = LinkTable()
    for source, target in [(1, 2), (2, 1), (1, 3), (3, 1)]:
        table.links[(source, target)] = LinkProxy(source, target, 0, random.Random(0))
    table.cut(1, 2)
    assert table.links[(1, 2)].faults["forward"].cut
    assert table.links[(2, 1)].faults["backward"].cut
    assert not table.links[(2, 1)].faults["forward"].cut
    table.isolate([1], [2, 3])
    assert all(d.cut for link in table for d in link.faults.values())
    table.heal()
    assert not any(d.cut for link in table for d in link.faults.values())


async def test_proxy_survives_a_target_that_hangs_up() -> None:
    async def hang_up(stream: trio.SocketStream) -> None:
        async with stream:
            await stream.receive_some(10)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, hang_up, 0, host="127.0.0.1"))
        proxy = LinkProxy(1, 2, listeners[0].socket.getsockname()[1], random.Random(0))
        port = await nursery.start(proxy.run)
        for _ in range(2):  # the second connection shows the proxy still serves
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(frame(b"hello"))
                with trio.fail_after(5):
                    while await stream.receive_some(100):
                        pass
        assert proxy.stats.connections == 2
        nursery.cancel_scope.cancel()
