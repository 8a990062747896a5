"""A tiny blocking client speaking raw frames, to test the server independently of
``futureq.client``: every byte it sends is chosen by the test."""

from __future__ import annotations

import socket
import ssl
import time
from typing import Any

from futureq.wire import codec, frames

OPEN_CLIENTS: list[WireClient] = []
"""Every client made and not closed; the integration conftest closes them after each test."""


class WireClient:
    """One TCP connection to a broker; ``hello()`` unless told otherwise."""

    def __init__(
        self,
        address: str,
        *,
        hello: bool = True,
        timeout_s: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
        token: str | None = None,
        source_host: str | None = None,
        versions: tuple[int, ...] = (1,),
    ) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection(
            (host, int(port)),
            timeout=timeout_s,
            source_address=None if source_host is None else (source_host, 0),
        )
        if ssl_context is not None:
            self.sock = ssl_context.wrap_socket(self.sock, server_hostname=host)
        OPEN_CLIENTS.append(self)
        self.decoder = codec.FrameDecoder(64 * 1024 * 1024)
        self.pushed: list[frames.Deliver] = []
        self.notices: list[frames.Frame] = []
        """Pushes other than DELIVER (SUBSCRIPTION_INFO, REVOKE, SUBSCRIPTION_END), in order."""
        self._next_id = 100
        if hello:
            self.send(frames.Hello(1, versions, "test", token))
            answer = self.receive()
            if answer is codec.CLOSED:
                # A node shutting down (or refusing one connection too many) may close
                # a connection it accepted before answering: a connection failure, which
                # callers that retry treat like any other, not a wrong answer.
                self.close()
                raise ConnectionError("the server closed the connection before answering HELLO")
            assert isinstance(answer, frames.HelloOk), answer

    def next_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def send(self, frame: frames.Frame) -> None:
        self.sock.sendall(codec.encode_frame(frame, 2**31))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self, timeout_s: float = 10.0) -> Any:
        """The next frame, or ``codec.CLOSED``; raises TimeoutError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            event = self.decoder.next_frame()
            if event is not codec.NEED_DATA:
                return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame within the deadline")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                raise TimeoutError("no frame within the deadline") from None
            except ConnectionResetError:
                data = b""
            self.decoder.receive_data(data)

    def receive_answer(self, timeout_s: float = 10.0) -> Any:
        """The next frame that is not a notice push (SUBSCRIPTION_INFO, REVOKE,
        SUBSCRIPTION_END: those are kept in :attr:`notices`), or ``codec.CLOSED``."""
        while True:
            frame = self.receive(timeout_s)
            if not self._is_notice(frame):
                return frame
            self.notices.append(frame)

    def request(self, frame: frames.Frame, timeout_s: float = 10.0) -> Any:
        """Send a request and return its answer; pushes meanwhile are kept."""
        self.send(frame)
        while True:
            answer = self.receive(timeout_s)
            if isinstance(answer, frames.Deliver):
                self.pushed.append(answer)
                continue
            if self._is_notice(answer):
                self.notices.append(answer)
                continue
            return answer

    @staticmethod
    def _is_notice(frame: Any) -> bool:
        return isinstance(frame, frames.SubscriptionInfo | frames.Revoke | frames.SubscriptionEnd)

    def wait_notice(self, kind: type[Any], timeout_s: float = 10.0) -> Any:
        """The first push of type ``kind`` (SUBSCRIPTION_INFO, REVOKE, ...) not yet taken;
        reads on (keeping DELIVERs) until one arrives. Raises TimeoutError."""
        deadline = time.monotonic() + timeout_s
        while True:
            for i, notice in enumerate(self.notices):
                if isinstance(notice, kind):
                    return self.notices.pop(i)
            frame = self.receive(max(0.001, deadline - time.monotonic()))
            if isinstance(frame, frames.Deliver):
                self.pushed.append(frame)
            elif self._is_notice(frame):
                self.notices.append(frame)
            else:
                raise AssertionError(f"unexpected frame {frame}")

    def revoked(self) -> list[bytes]:
        """Tags named by the REVOKE frames received so far."""
        return [t for f in self.notices if isinstance(f, frames.Revoke) for t in f.tags]

    def publish(
        self, items: list[list[Any]], ack_level: frames.AckLevel = frames.AckLevel.QUORUM
    ) -> Any:
        return self.request(frames.Publish(self.next_id(), ack_level, items))

    def subscribe(self, topic: str, group: str, prefetch: int = 100) -> int:
        answer = self.request(frames.Subscribe(self.next_id(), topic, group, prefetch))
        assert isinstance(answer, frames.SubscribeOk), answer
        return answer.subscription_id

    def deliveries(self, count: int, timeout_s: float = 10.0) -> list[list[Any]]:
        """Wait for ``count`` deliveries (as ``[tag, id, payload, due_ms, publish_ms, attempt,
        delivered_ms]`` lists); raises TimeoutError if fewer arrive in time."""
        out: list[list[Any]] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < count:
            if self.pushed:
                frame = self.pushed.pop(0)
            else:
                frame = self.receive(max(0.001, deadline - time.monotonic()))
                if frame is codec.CLOSED:
                    raise ConnectionError("server closed the connection")
                if self._is_notice(frame):
                    self.notices.append(frame)
                    continue
                assert isinstance(frame, frames.Deliver), frame
            out.extend([*d, frame.delivered_ms] for d in frame.deliveries)
        return out

    def poll_deliveries(self, timeout_s: float = 0.05) -> list[list[Any]]:
        """The deliveries of the next DELIVER frame if one arrives within ``timeout_s``
        (as :meth:`deliveries`), else none: for tests that poll several consumers."""
        try:
            return self.deliveries(1, timeout_s)
        except TimeoutError:
            return []

    def expect_nothing(self, within_s: float) -> None:
        """Assert no DELIVER arrives within ``within_s`` seconds (other pushes are kept)."""
        assert not self.pushed, self.pushed
        deadline = time.monotonic() + within_s
        while True:
            try:
                frame = self.receive(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return
            if not self._is_notice(frame):
                raise AssertionError(f"unexpected frame {frame}")
            self.notices.append(frame)

    def status(self) -> dict[str, Any]:
        answer = self.request(frames.Status(self.next_id()))
        assert isinstance(answer, frames.StatusOk), answer
        return answer.status

    def group_pending(self, topic: str, group: str) -> int | None:
        for entry in self.status()["topics"]:
            if entry["topic"] == topic:
                for g in entry["groups"]:
                    if g["group"] == group:
                        return int(g["pending"])
        return None

    def close(self) -> None:
        self.sock.close()
        if self in OPEN_CLIENTS:
            OPEN_CLIENTS.remove(self)


def non_reading_client(address: str) -> WireClient:
    """A client whose socket takes in as little as the kernel allows, and that never reads."""
    client = WireClient(address)
    client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return client
