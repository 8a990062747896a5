"""A hostile process on the Raft network: raw peer connections, a recording and injecting
TCP relay, and the forged AppendEntries of issue 7 (part 1).

Everything here uses plain blocking sockets and threads (no trio), like the other
integration helpers, and only what such a process could know: addresses, node ids and
what the nodes' HTTP ``/api/status`` shows.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

from cluster_process import Cluster, ClusterNode

from futureq.raft import peer_auth
from futureq.raft.message_codec import encode_message
from futureq.raft.messages import AppendEntries, LogIndex, NodeId, Term
from futureq.raft.values import Entry, EntryKind
from futureq.state import commands
from futureq.wire.codec import CLOSED, NEED_DATA, FrameDecoder, encode_value

IO_TIMEOUT_S = 5.0
INJECTED_TOPIC = "injected"


def forged_append_entries(target: ClusterNode, status: dict[str, Any], leader_id: int) -> bytes:
    """The message of the issue: from the current leader's id, term + 100, the previous
    entry being the target's last one, one PUBLISH to ``injected``, committed.

    Args:
        target: The follower attacked.
        status: Its ``/api/status`` (term, applied index) once it is quiet.
        leader_id: The node id the attacker claims.
    """
    term = int(status["term"]) + 100
    last = int(status["applied_index"])
    now_ms = int(time.time() * 1000)
    entry = Entry(
        Term(term),
        LogIndex(last + 1),
        EntryKind.NORMAL,
        commands.publish(now_ms, [(INJECTED_TOPIC, b"forged", now_ms, None)]),
    )
    message = AppendEntries(
        Term(term),
        NodeId(leader_id),
        NodeId(target.node_id),
        LogIndex(last),
        Term(int(status["term"])),
        (entry,),
        LogIndex(last + 1),
    )
    return encode_message(message)


def old_handshake(cluster_id: str, node_id: int, raft_address: str) -> bytes:
    """The version-1 handshake: no authentication at all."""
    return encode_value(["futureq-raft", 1, cluster_id, node_id, raft_address, None])


class RawPeer:
    """One raw connection to a Raft port, optionally over TLS, for a test to drive."""

    def __init__(self, address: str, tls: ssl.SSLContext | None = None) -> None:
        host, port = address.rsplit(":", 1)
        raw = socket.create_connection((host, int(port)), timeout=IO_TIMEOUT_S)
        try:
            self.sock: socket.socket = (
                tls.wrap_socket(raw, server_hostname=host) if tls is not None else raw
            )
        except BaseException:
            raw.close()
            raise
        self.decoder = FrameDecoder(peer_auth.MAX_HANDSHAKE_FRAME_BYTES, parse=False)

    def send(self, data: bytes) -> None:
        with contextlib.suppress(OSError):  # the node may already have closed on us
            self.sock.sendall(data)

    def receive(self) -> object:
        """The next frame's value, or CLOSED."""
        while (value := self.decoder.next_frame()) is NEED_DATA:
            try:
                data = self.sock.recv(65536)
            except (ConnectionResetError, ssl.SSLError):
                data = b""
            self.decoder.receive_data(data)
        return value

    def wait_closed(self) -> bytes:
        """Read until the node closes the connection; return what it sent meanwhile.

        Raises:
            TimeoutError: it kept the connection open for ``IO_TIMEOUT_S``.
        """
        received = bytearray()
        self.sock.settimeout(IO_TIMEOUT_S)
        while True:
            try:
                chunk = self.sock.recv(65536)
            except (ConnectionResetError, ssl.SSLError, BrokenPipeError):
                break
            if not chunk:
                break
            received += chunk
        self.close()
        return bytes(received)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def refusal_in(data: bytes) -> str | None:
    """The sentence of a REFUSED frame among the frames of ``data``, if any."""
    decoder = FrameDecoder(peer_auth.MAX_HANDSHAKE_FRAME_BYTES, parse=False)
    decoder.receive_data(data)
    decoder.receive_data(b"")
    with contextlib.suppress(Exception):
        while (value := decoder.next_frame()) not in (CLOSED, NEED_DATA):
            frame = peer_auth.parse_frame(value)
            if isinstance(frame, peer_auth.Refused):
                return frame.message
    return None


def split_frames(data: bytes) -> list[bytes]:
    """The whole length-prefixed frames at the start of ``data``."""
    frames, offset = [], 0
    while len(data) - offset >= 4:
        end = offset + 4 + int.from_bytes(data[offset : offset + 4], "big")
        if end > len(data):
            break
        frames.append(data[offset:end])
        offset = end
    return frames


def is_handshake(frame: bytes) -> bool:
    return len(frame) > 5 and frame[4] & 0xF0 == 0x90 and frame[5:].startswith(b"\xacfutureq-raft")


class _Relayed:
    """One relayed connection: what each side sent."""

    def __init__(self) -> None:
        self.forward = bytearray()
        self.backward = bytearray()
        self.injected = False
        self.sockets: list[socket.socket] = []


class Relay:
    """A TCP relay ``127.0.0.1:port -> 127.0.0.1:target_port`` that records every byte,
    can send its connections elsewhere, and can inject bytes after the handshake.

    Args:
        target_port: Where connections go (a node's Raft port).
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.inject: bytes | None = None
        """Written once into each new connection's forward stream, right after the
        connector's first frame that follows the handshake (then cleared)."""
        self.connections: list[_Relayed] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._start(self._accept_loop)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _start(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=2)
            except OSError:
                client.close()
                continue
            relayed = _Relayed()
            relayed.sockets = [client, server]
            self.connections.append(relayed)
            self._start(self._pump, client, server, relayed, True)
            self._start(self._pump, server, client, relayed, False)

    def _pump(
        self, source: socket.socket, sink: socket.socket, relayed: _Relayed, forward: bool
    ) -> None:
        record = relayed.forward if forward else relayed.backward
        source.settimeout(0.2)
        try:
            while not self._stopped.is_set():
                try:
                    chunk = source.recv(65536)
                except TimeoutError:
                    continue
                if not chunk:
                    break
                record += chunk
                sink.sendall(chunk)
                if forward and self.inject is not None and not relayed.injected:
                    frames = split_frames(bytes(record))
                    handshake = [f for f in frames if is_handshake(f)]
                    if len(handshake) >= 2 and len(frames) > len(handshake):
                        relayed.injected = True
                        injected, self.inject = self.inject, None
                        sink.sendall(injected)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def reset(self) -> None:
        """Close every relayed connection (both nodes see them drop)."""
        for relayed in self.connections:
            for sock in relayed.sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def wait_for(self, what: str, condition: Any, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"relay: no {what} within {timeout_s} s")
            time.sleep(0.02)

    def close(self) -> None:
        self._stopped.set()
        self._listener.close()
        self.reset()
        for thread in self._threads:
            thread.join(2)
        for relayed in self.connections:
            for sock in relayed.sockets:
                sock.close()


# --- what the cluster must still look like -------------------------------------------------


def refusals(node: ClusterNode) -> dict[str, float]:
    """``futureq_raft_peer_refusals_total`` of ``node`` by reason."""
    import urllib.request

    with urllib.request.urlopen(f"http://{node.http_address}/metrics", timeout=5) as response:
        text = response.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("futureq_raft_peer_refusals_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            found[reason] = float(line.rsplit(" ", 1)[1])
    return found


def wait_refused(node: ClusterNode, reason: str, before: dict[str, float]) -> None:
    """Wait until ``node`` counted one more refusal for ``reason`` (exported each second)."""
    deadline = time.monotonic() + 10
    while refusals(node).get(reason, 0) <= before.get(reason, 0):
        assert time.monotonic() < deadline, f"node {node.node_id} counted no {reason} refusal"
        time.sleep(0.1)


@contextlib.contextmanager
def unchanged(cluster: Cluster) -> Iterator[dict[int, Any]]:
    """Around an attack: afterwards the term did not move, no node has a topic
    ``injected``, and every node applied the same state at the same index.

    Yields the statuses from before the attack (nodes quiet and converged).
    """
    before = converged(cluster)
    yield before
    term = next(iter(before.values()))["term"]
    after = converged(cluster)
    for node_id, status in after.items():
        topics = {t["topic"] for t in status["topics"]}
        assert INJECTED_TOPIC not in topics, f"node {node_id} applied the forged entry"
        assert status["term"] == term, f"node {node_id} term moved {term} -> {status['term']}"


def converged(cluster: Cluster, timeout_s: float = 20.0) -> dict[int, Any]:
    """Statuses of every node once they all applied the same index, which is also every
    node's commit index (nothing committed is still waiting to be applied, so a forged
    entry placed right after it is not below anyone's commit index), checked to carry the
    same applied digest there."""
    deadline = time.monotonic() + timeout_s
    while True:
        statuses = cluster.statuses()
        indexes = {s["applied_index"] for s in statuses.values()}
        indexes |= {s["commit_index"] for s in statuses.values()}
        if len(statuses) == len(cluster.nodes) and len(indexes) == 1:
            digests = {s["applied_digest"] for s in statuses.values()}
            assert len(digests) == 1, f"same applied index, different digests: {statuses}"
            return statuses
        assert time.monotonic() < deadline, f"nodes did not converge: {statuses}"
        time.sleep(0.05)
