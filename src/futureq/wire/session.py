"""Per-connection protocol state, sans-IO (h11 style): HELLO first, version, frame direction.

:class:`ServerSession` is what the gateway drives for one client connection;
:class:`ClientSession` is its twin inside the client library. Neither touches a
socket or a clock: bytes go in through ``receive_data``, frames come out of
``next_event``, and every frame to send comes back as ``bytes`` to write.

Server states::

    AWAIT_HELLO --HELLO ok, accept_hello()--> READY
    any state   --bad bytes or 1xx error--> ERROR      (refuses further use)
    any state   --EOF at a frame boundary--> CLOSED

Client states::

    START --hello()--> AWAIT_HELLO_OK --HELLO_OK--> READY  (then ERROR / CLOSED as above)

Source: ``docs/protocol.md``, "Connection setup" and "Frames".
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Iterable, Sequence
from typing import Final, TypeAlias, cast

import attrs

from futureq.errors import (
    ErrorCode,
    FrameFieldsError,
    LocalProtocolError,
    NotLeaderError,
    RemoteProtocolError,
    RequestError,
    WrongShardError,
)
from futureq.wire import codec, foreign, frames

NEED_DATA: Final = codec.NEED_DATA
"""Returned by ``next_event`` when more bytes are needed (re-exported from the codec)."""
CLOSED: Final = codec.CLOSED
"""Returned by ``next_event`` once the peer closed the stream at a frame boundary."""


@attrs.frozen
class RefusedRequest:
    """A client request whose fields are wrong, refused alone (server side only).

    ``next_event`` returns it instead of closing the connection when a whole frame of a
    client request type, with a valid request id, has a field missing, extra or of the
    wrong type: answer ``error`` on ``request_id`` (:meth:`ServerSession.error_bytes`)
    and read on (``docs/protocol.md``, "Frames").

    Attributes:
        request_id: The refused frame's request id.
        frame_type: Its type.
        error: ``INVALID_FIELD`` (200) with a sentence naming the frame, the field and
            the type expected.
    """

    request_id: int
    frame_type: frames.FrameType
    error: RequestError


# codec keeps its sentinel enum private; the alias only names the two values above.
Event: TypeAlias = "frames.Frame | RefusedRequest | codec._Sentinel"
"""What ``next_event`` returns: a frame, a :class:`RefusedRequest` (server side),
:data:`NEED_DATA` or :data:`CLOSED`."""

SERVER_ONLY_FRAME_TYPES: Final = frozenset(
    {
        frames.FrameType.HELLO_OK,
        frames.FrameType.PUBLISH_OK,
        frames.FrameType.SUBSCRIBE_OK,
        frames.FrameType.DELIVER,
        frames.FrameType.STATUS_OK,
        frames.FrameType.ERROR,
        frames.FrameType.OK,
        frames.FrameType.CLUSTER_STATUS_OK,
        frames.FrameType.REVOKE,
        frames.FrameType.SUBSCRIPTION_END,
        frames.FrameType.SUBSCRIPTION_INFO,
        frames.FrameType.HANDOVER,
        frames.FrameType.GOAWAY,
        frames.FrameType.WATCH_UPDATE,
        frames.FrameType.ITEM_RESULTS,
        frames.FrameType.BROWSE_OK,
        frames.FrameType.BROWSE_COUNTS_OK,
        frames.FrameType.SLOT_MAP_OK,
    }
)
"""Frame types only a server may send."""

BOTH_WAYS_FRAME_TYPES: Final = frozenset({frames.FrameType.PING, frames.FrameType.PONG})
"""Frame types either side may send: PING asks for a PONG with the same request id (the
server's keepalive PING uses request id 0)."""

SERVER_FRAME_TYPES: Final = SERVER_ONLY_FRAME_TYPES | BOTH_WAYS_FRAME_TYPES
"""Frame types a server may send."""

CLIENT_FRAME_TYPES: Final = frozenset(set(frames.FrameType) - SERVER_ONLY_FRAME_TYPES)
"""Frame types a client may send (HELLO, every request, PING and PONG)."""

MAX_HELLO_BYTES: Final = 64 * 1024
"""Largest frame a server reads before it has answered the client's HELLO (bytes). A
HELLO is a few hundred bytes; a client that has not yet said who it is may not make the
server buffer ``max_frame_bytes`` (4 MiB) for it (``docs/protocol.md``, "Limits")."""
MAX_ERROR_MESSAGE_CHARS: Final = 1000
"""ERROR frame sentences are cut to this length so an ERROR always fits in a frame."""


def _versions(offered: Iterable[int]) -> str:
    """The versions a HELLO offered, the first eight at most (a client may send many)."""
    ordered = sorted(offered)
    if len(ordered) <= 8:
        return str(ordered)
    return f"{str(ordered[:8])[:-1]}, ... ({len(ordered)} versions)]"


class SessionState(enum.Enum):
    """Where a connection stands (``docs/protocol.md``, "Connection setup")."""

    START = "START"
    """Client only: HELLO not sent yet."""
    AWAIT_HELLO = "AWAIT_HELLO"
    """Server: no HELLO answered yet."""
    AWAIT_HELLO_OK = "AWAIT_HELLO_OK"
    """Client: HELLO sent, HELLO_OK not received yet."""
    READY = "READY"
    """Handshake done; requests and answers flow."""
    ERROR = "ERROR"
    """A protocol error happened; send the ERROR frame if any, then close."""
    CLOSED = "CLOSED"
    """The peer closed the stream cleanly at a frame boundary."""


def negotiate_version(our_versions: Iterable[int], their_versions: Iterable[int]) -> int | None:
    """Pick the highest protocol version both sides speak.

    Returns:
        The version, or None when the two sets share none.
    """
    return max(set(our_versions) & set(their_versions), default=None)


class _Session:
    """What both ends share: the decoder, the state, the ERROR transition."""

    def __init__(
        self, max_frame_bytes: int, state: SessionState, max_containers: int | None = None
    ) -> None:
        self._decoder = codec.FrameDecoder(max_frame_bytes, max_containers=max_containers)
        self._max_frame_bytes = max_frame_bytes
        self._state = state
        self._version: int | None = None
        # Our sending side outlives the peer's EOF: answers may still be written in CLOSED.
        self._handshake_done = False

    @property
    def state(self) -> SessionState:
        """The current :class:`SessionState`."""
        return self._state

    @property
    def version(self) -> int | None:
        """The negotiated protocol version, or None before the handshake."""
        return self._version

    @property
    def max_frame_bytes(self) -> int:
        """Largest frame body this side accepts once the handshake is done (bytes)."""
        return self._max_frame_bytes

    def receive_data(self, data: bytes) -> None:
        """Buffer bytes read from the stream; ``b""`` means the peer closed its side.

        Raises:
            RuntimeError: in state ERROR, or data after EOF.
        """
        self._check_usable()
        self._decoder.receive_data(data)

    def next_event(self) -> Event:
        """Return the next frame, :data:`NEED_DATA` or :data:`CLOSED`.

        Raises:
            RemoteProtocolError: the peer broke the protocol (codes in
                ``docs/protocol.md``); the session is then in state ERROR.
            RuntimeError: in state ERROR, or before the handshake allows it.
        """
        self._check_usable()
        if self._state is SessionState.CLOSED:
            return CLOSED
        try:
            event = self._decoder.next_frame()
        except FrameFieldsError as exc:
            refused = self._refuse_alone(exc)
            if refused is None:
                self._state = SessionState.ERROR
                if exc.code is ErrorCode.BATCH_TOO_LARGE:
                    # Not a request to refuse alone (before HELLO, say): the frame is
                    # malformed, a protocol error with a protocol error's code.
                    raise RemoteProtocolError(ErrorCode.MALFORMED_FRAME, exc.message) from None
                raise
            return refused
        except RemoteProtocolError:
            self._state = SessionState.ERROR
            raise
        if event is NEED_DATA:
            return NEED_DATA
        if event is CLOSED:
            self._state = SessionState.CLOSED
            return CLOSED
        # The decoder parses (parse=True), so anything else is a frame object.
        return self._check_incoming(cast(frames.Frame, event))

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet returned as frames (an incomplete frame)."""
        return self._decoder.buffered_bytes

    def incomplete_frame(self) -> tuple[int, int | None]:
        """Bytes of the incomplete frame received, and its whole size once known
        (:meth:`futureq.wire.codec.FrameDecoder.incomplete_frame`)."""
        return self._decoder.incomplete_frame()

    def _check_incoming(self, frame: frames.Frame) -> frames.Frame:
        raise NotImplementedError

    def _refuse_alone(self, exc: FrameFieldsError) -> RefusedRequest | None:
        """The request to refuse alone for ``exc``, or None when it must close."""
        return None

    def _fail(self, code: ErrorCode, message: str) -> RemoteProtocolError:
        self._state = SessionState.ERROR
        return RemoteProtocolError(code, message)

    def _check_usable(self) -> None:
        if self._state is SessionState.ERROR:
            raise RuntimeError("session had a protocol error; the connection must be closed")


_FOREIGN_ON_CLIENT_PORT: dict[foreign.Protocol | None, str] = {
    "TLS": (
        "a TLS handshake arrived on this client port, which runs without TLS: connect "
        "without TLS, or give the node tls.cert_file and tls.key_file"
    ),
    "HTTP": (
        "an HTTP request arrived on the client port (server.listen), which speaks "
        "futureq frames: point browsers, probes and WebSocket clients at server.http"
    ),
    "SSH": "an SSH client connected to the client port (server.listen), which speaks futureq frames",
}
"""What to tell a peer whose first bytes on the client port are another protocol
(:func:`futureq.wire.foreign.protocol_of`); before, ``GET /`` was told ``frame of
1195725856 bytes exceeds the limit``, a length read from the letters ``GET``."""


class ServerSession(_Session):
    """Protocol state of one client connection, server side.

    Args:
        max_frame_bytes: Largest frame body accepted from the client, announced in
            HELLO_OK; the server's own frames obey the same limit (bytes).
        supported_versions: Protocol versions this server speaks.
        auth_token: If set, HELLO must carry exactly this token (else AUTH_FAILED).
        max_hello_bytes: Largest frame body accepted before HELLO is answered (bytes;
            :data:`MAX_HELLO_BYTES`): a client that has not said who it is may not make
            the server hold ``max_frame_bytes`` for it.
        max_containers: Most arrays and maps one client frame may hold
            (:func:`~futureq.wire.codec.request_containers`); None: no bound.

    Typical use by the gateway::

        session.receive_data(chunk)
        while (event := session.next_event()) is not NEED_DATA:
            if event is CLOSED: ...
            elif isinstance(event, frames.Hello):
                write(session.accept_hello(node_id, leader_address, server_version))
            else: ...  # handle the request, write(session.send(answer))
        # on RemoteProtocolError as exc: write(session.error_bytes(exc)); close

    Source: ``docs/protocol.md``, "Connection setup".
    """

    def __init__(
        self,
        max_frame_bytes: int,
        supported_versions: Iterable[int],
        auth_token: str | None,
        max_hello_bytes: int | None = None,
        max_containers: int | None = None,
    ) -> None:
        super().__init__(max_frame_bytes, SessionState.AWAIT_HELLO, max_containers)
        hello_limit = MAX_HELLO_BYTES if max_hello_bytes is None else max_hello_bytes
        self._decoder.max_frame_bytes = min(max_frame_bytes, hello_limit)
        self._supported_versions = frozenset(supported_versions)
        if not self._supported_versions:
            raise ValueError("supported_versions must not be empty")
        self._auth_token = auth_token
        self._pending_hello: frames.Hello | None = None
        self._error_request_id = 0

    def next_event(self) -> Event:
        """Return the next frame from the client, :data:`NEED_DATA` or :data:`CLOSED`.

        The first frame returned is always a valid :class:`frames.Hello` (version
        negotiated, token checked); answer it with :meth:`accept_hello` before asking
        for the next event. After the handshake, a whole request frame whose fields are
        wrong comes back as a :class:`RefusedRequest` to answer alone, not as an error.

        Raises:
            RemoteProtocolError: HELLO_REQUIRED (first frame not HELLO),
                UNSUPPORTED_VERSION (no common version), AUTH_FAILED (wrong token),
                INVALID_FRAME (a second HELLO, or a server-only frame type), or any
                codec error (FRAME_TOO_LARGE, MALFORMED_FRAME, TRUNCATED_FRAME,
                UNKNOWN_FRAME_TYPE, INVALID_FRAME). The session is then in ERROR.
            RuntimeError: in state ERROR, or a HELLO is still waiting for
                :meth:`accept_hello`.
        """
        if self._pending_hello is not None:
            raise RuntimeError("answer the HELLO with accept_hello() before reading on")
        # Set again by _check_incoming once a frame is decoded; bytes that never formed
        # a frame are answered on request id 0.
        self._error_request_id = 0
        try:
            return super().next_event()
        except RemoteProtocolError as exc:
            if not self._handshake_done:
                spoken = _FOREIGN_ON_CLIENT_PORT.get(
                    foreign.protocol_of(self._decoder.pending(foreign.START_BYTES))
                )
                if spoken is not None:
                    raise RemoteProtocolError(exc.code, spoken) from None
            if exc.code is ErrorCode.FRAME_TOO_LARGE and not self._handshake_done:
                raise RemoteProtocolError(
                    ErrorCode.FRAME_TOO_LARGE,
                    f"{exc.message.split(';')[0]} before HELLO: the first frame must be a "
                    f"HELLO of at most {self._decoder.max_frame_bytes} bytes",
                ) from None
            raise

    def _check_incoming(self, frame: frames.Frame) -> frames.Frame:
        # Any ERROR we answer with should echo the request id of the frame at fault.
        self._error_request_id = frame.request_id
        if self._state is SessionState.AWAIT_HELLO:
            if not isinstance(frame, frames.Hello):
                raise self._fail(
                    ErrorCode.HELLO_REQUIRED,
                    f"the first frame must be HELLO, got {frame.TYPE.name}",
                )
            version = negotiate_version(self._supported_versions, frame.versions)
            if version is None:
                raise self._fail(
                    ErrorCode.UNSUPPORTED_VERSION,
                    f"no common protocol version: client speaks {_versions(frame.versions)}, "
                    f"server speaks {sorted(self._supported_versions)}",
                )
            if self._auth_token is not None and not _same_token(frame.token, self._auth_token):
                raise self._fail(
                    ErrorCode.AUTH_FAILED,
                    "HELLO carries a missing or wrong auth token; check the client's token",
                )
            self._version = version
            self._pending_hello = frame
            return frame
        if isinstance(frame, frames.Hello):
            raise self._fail(
                ErrorCode.INVALID_FRAME, "HELLO was already received on this connection"
            )
        if frame.TYPE not in CLIENT_FRAME_TYPES:
            raise self._fail(
                ErrorCode.INVALID_FRAME,
                f"{frame.TYPE.name} is a server-only frame type; clients may not send it",
            )
        return frame

    def _refuse_alone(self, exc: FrameFieldsError) -> RefusedRequest | None:
        self._error_request_id = exc.request_id
        frame_type = frames.FrameType(exc.frame_type)
        if self._handshake_done and frame_type in SERVER_ONLY_FRAME_TYPES:
            # What to fix is sending it at all, not its fields: a GOAWAY or DELIVER with
            # the wrong fields was told which field to change.
            raise self._fail(
                ErrorCode.INVALID_FRAME,
                f"{frame_type.name} is a server-only frame type; clients may not send it",
            )
        if (
            not self._handshake_done
            or self._pending_hello is not None
            or frame_type not in CLIENT_FRAME_TYPES
            or frame_type is frames.FrameType.HELLO
            or frame_type is frames.FrameType.PONG
        ):
            return None  # no handshake yet, a second HELLO, or a server-only frame
        message = exc.message.removeprefix(f"{frame_type.name} frame: ")
        if exc.code is ErrorCode.BATCH_TOO_LARGE:
            # More arrays or items than any request needs (the decoder stopped early).
            error = RequestError(exc.code, f"{frame_type.name} request refused: {message}")
        else:
            error = RequestError(
                ErrorCode.INVALID_FIELD,
                f"{frame_type.name} request refused: {message}; fix the request "
                "(docs/protocol.md, Frames)",
            )
        return RefusedRequest(exc.request_id, frame_type, error)

    def accept_hello(
        self,
        node_id: int,
        leader_address: str | None,
        server_version: str,
        shards: int = 1,
        members: Sequence[str] = (),
        max_prefetch: int | None = None,
    ) -> bytes:
        """Answer the HELLO that :meth:`next_event` returned; the session becomes READY.

        Args:
            node_id: This node's id.
            leader_address: ``"host:port"`` of the leader's client listener, or None
                while no leader is known.
            server_version: The server's software version (e.g. ``"0.1.0"``).
            shards: How many shards the node runs (``docs/sharding.md``).
            members: Client addresses of the voters of this node's Raft group, this
                node's included; sent when the negotiated version is 2 or more (at most
                :data:`~futureq.wire.frames.MAX_MEMBERS`, the first ones kept).
            max_prefetch: The server's ``limits.max_prefetch`` (deliveries); sent when
                the negotiated version is 5 or more (None: not sent).

        Returns:
            The HELLO_OK frame to write, echoing the HELLO's request id and carrying
            the negotiated version and ``max_frame_bytes``.

        Raises:
            RuntimeError: no HELLO is waiting for an answer.
        """
        self._check_usable()
        hello = self._pending_hello
        if hello is None or self._version is None:
            raise RuntimeError("accept_hello() needs a HELLO returned by next_event()")
        answer = frames.HelloOk(
            hello.request_id,
            self._version,
            node_id,
            leader_address,
            self.max_frame_bytes,
            server_version,
            shards,
            tuple(members[: frames.MAX_MEMBERS]) if self._version >= 2 else None,
            max_prefetch if self._version >= 5 else None,
        )
        data = codec.encode_frame(answer, self.max_frame_bytes)
        self._pending_hello = None
        self._state = SessionState.READY
        self._handshake_done = True
        self._decoder.max_frame_bytes = self._max_frame_bytes
        return data

    def send(self, frame: frames.Frame) -> bytes:
        """Encode an answer or push for the client.

        Returns:
            The bytes to write.

        Raises:
            LocalProtocolError: INVALID_FRAME for a client-only frame type or
                HELLO_OK (use :meth:`accept_hello`); FRAME_TOO_LARGE when the body
                exceeds ``max_frame_bytes`` (split the batch). The state is unchanged:
                nothing was produced.
            RuntimeError: before :meth:`accept_hello` or after an error. Sending
                after the client's EOF (state CLOSED) is allowed: a client may
                half-close and still wait for its answers.
        """
        self._check_usable()
        if not self._handshake_done:
            raise RuntimeError(f"cannot send {frame.TYPE.name} before accept_hello()")
        if frame.TYPE not in SERVER_FRAME_TYPES or isinstance(frame, frames.HelloOk):
            raise LocalProtocolError(
                ErrorCode.INVALID_FRAME, f"a server may not send {frame.TYPE.name} with send()"
            )
        return codec.encode_frame(frame, self.max_frame_bytes)

    def error_bytes(
        self, exc: RemoteProtocolError | RequestError, request_id: int | None = None
    ) -> bytes:
        """Build the ERROR frame that reports ``exc`` to the client.

        Usable in every state, ERROR included (that is when it is needed). A 1xx code
        puts the session in ERROR: write these bytes, then close the connection.

        Args:
            exc: A protocol error (1xx), a refused request (2xx) or an availability
                error (3xx, e.g. :class:`NotLeaderError` with its leader address).
            request_id: The request being answered. None means: for a protocol error,
                the request id of the frame :meth:`next_event` just returned or refused
                (0 when the error came from bytes that never formed a frame); else 0.

        Returns:
            The ERROR frame to write.
        """
        if request_id is None:
            request_id = self._error_request_id if isinstance(exc, RemoteProtocolError) else 0
        message = exc.message
        if len(message) > MAX_ERROR_MESSAGE_CHARS:
            message = message[: MAX_ERROR_MESSAGE_CHARS - 3] + "..."
        item_index = exc.item_index if isinstance(exc, RequestError) else None
        leader_address = (
            exc.leader_address
            if isinstance(exc, NotLeaderError)
            else exc.address
            if isinstance(exc, WrongShardError)
            else None
        )
        error = frames.Error(request_id, int(exc.code), message, item_index, leader_address)
        if exc.code.closes_connection:
            self._state = SessionState.ERROR
            self._pending_hello = None
        return codec.encode_frame(error, self.max_frame_bytes)


class ClientSession(_Session):
    """Protocol state of one connection, client side.

    Args:
        max_frame_bytes: Largest frame body accepted from the server (bytes).
        versions: Protocol versions this client speaks.
        client_name: Free text naming the client in the server's logs.
        token: Auth token for HELLO, or None.

    Frames the client sends are held to the ``max_frame_bytes`` the server
    announced in HELLO_OK. ERROR frames are returned like any other answer; after one
    with a 1xx code the server closes the connection.

    Source: ``docs/protocol.md``, "Connection setup".
    """

    def __init__(
        self,
        max_frame_bytes: int = codec.DEFAULT_MAX_FRAME_BYTES,
        versions: Iterable[int] = frames.SUPPORTED_VERSIONS,
        client_name: str = "",
        token: str | None = None,
    ) -> None:
        super().__init__(max_frame_bytes, SessionState.START)
        self._versions = tuple(sorted(set(versions), reverse=True))
        if not self._versions:
            raise ValueError("versions must not be empty")
        self._client_name = client_name
        self._token = token
        self._hello_ok: frames.HelloOk | None = None
        self._last_request_id = 0

    @property
    def hello_ok(self) -> frames.HelloOk | None:
        """The server's HELLO_OK (node id, leader address, limits), once received."""
        return self._hello_ok

    def next_request_id(self) -> int:
        """Allocate the next request id: 1, 2, 3, ... (0 is reserved for pushes)."""
        self._last_request_id += 1
        return self._last_request_id

    def hello(self) -> bytes:
        """Build the HELLO frame that opens the connection.

        Returns:
            The bytes to write first.

        Raises:
            RuntimeError: HELLO was already sent.
        """
        self._check_usable()
        if self._state is not SessionState.START:
            raise RuntimeError("HELLO was already sent on this connection")
        hello = frames.Hello(self.next_request_id(), self._versions, self._client_name, self._token)
        data = codec.encode_frame(hello, codec.DEFAULT_MAX_FRAME_BYTES)
        self._state = SessionState.AWAIT_HELLO_OK
        return data

    def next_event(self) -> Event:
        """Return the next frame from the server, :data:`NEED_DATA` or :data:`CLOSED`.

        Raises:
            RemoteProtocolError: INVALID_FRAME (a client-only frame type, a second
                HELLO_OK, or anything but HELLO_OK or ERROR before the handshake),
                UNSUPPORTED_VERSION (HELLO_OK names a version we did not offer), or
                any codec error. The session is then in ERROR.
            RuntimeError: before :meth:`hello`, or in state ERROR.
        """
        if self._state is SessionState.START:
            raise RuntimeError("send hello() before reading")
        return super().next_event()

    def _check_incoming(self, frame: frames.Frame) -> frames.Frame:
        if frame.TYPE not in SERVER_FRAME_TYPES:
            raise self._fail(
                ErrorCode.INVALID_FRAME,
                f"{frame.TYPE.name} is a client-only frame type; a server may not send it",
            )
        if isinstance(frame, frames.HelloOk):
            if self._state is not SessionState.AWAIT_HELLO_OK:
                raise self._fail(ErrorCode.INVALID_FRAME, "HELLO_OK received twice")
            if frame.version not in self._versions:
                raise self._fail(
                    ErrorCode.UNSUPPORTED_VERSION,
                    f"server chose protocol version {frame.version}; "
                    f"this client speaks {list(self._versions)}",
                )
            self._version = frame.version
            self._hello_ok = frame
            self._state = SessionState.READY
            self._handshake_done = True
        elif self._state is SessionState.AWAIT_HELLO_OK and not isinstance(frame, frames.Error):
            raise self._fail(
                ErrorCode.INVALID_FRAME, f"expected HELLO_OK or ERROR, got {frame.TYPE.name}"
            )
        return frame

    def send(self, frame: frames.Frame) -> bytes:
        """Encode a request for the server.

        Returns:
            The bytes to write.

        Raises:
            LocalProtocolError: INVALID_FRAME for a server-only frame type or HELLO
                (use :meth:`hello`); FRAME_TOO_LARGE over the server's
                ``max_frame_bytes``. The state is unchanged.
            RuntimeError: before HELLO_OK arrived or after an error.
        """
        self._check_usable()
        if not self._handshake_done or self._hello_ok is None:
            raise RuntimeError(f"cannot send {frame.TYPE.name} before HELLO_OK arrived")
        if frame.TYPE not in CLIENT_FRAME_TYPES or isinstance(frame, frames.Hello):
            raise LocalProtocolError(
                ErrorCode.INVALID_FRAME, f"a client may not send {frame.TYPE.name} with send()"
            )
        return codec.encode_frame(frame, self._hello_ok.max_frame_bytes)


def _same_token(given: str | None, expected: str) -> bool:
    # Constant-time, so the comparison does not leak how much of the token matched.
    if given is None:
        return False
    return hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )
