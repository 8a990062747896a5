"""Frame codec: a 4-byte big-endian length, then one msgpack value (``docs/protocol.md``).

Sans-IO in the manner of h11: :meth:`FrameDecoder.receive_data` only buffers,
:meth:`FrameDecoder.next_frame` returns a frame, :data:`NEED_DATA` or :data:`CLOSED`.
The decoder never buffers more than one maximal frame plus its header.
"""

from __future__ import annotations

import enum
import re
from typing import Any, Final

import msgpack

from futureq.errors import ErrorCode, FrameFieldsError, LocalProtocolError, RemoteProtocolError
from futureq.wire import frames

HEADER_BYTES: Final = 4
DEFAULT_MAX_FRAME_BYTES: Final = 4 * 1024 * 1024
"""Largest msgpack body accepted by default (bytes); 1 MiB payload plus room for fields."""


class _Sentinel(enum.Enum):
    NEED_DATA = "NEED_DATA"
    CLOSED = "CLOSED"


NEED_DATA: Final = _Sentinel.NEED_DATA
"""More bytes are needed before the next frame is complete."""
CLOSED: Final = _Sentinel.CLOSED
"""The peer closed the stream cleanly at a frame boundary."""


def _packer() -> msgpack.Packer:
    return msgpack.Packer(use_bin_type=True, autoreset=True)


_PACK = _packer().pack


def encode_frame(frame: frames.Frame, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
    """Serialize a frame to bytes ready to write.

    Args:
        frame: Any frame object from :mod:`futureq.wire.frames`.
        max_frame_bytes: Largest body the peer accepts (bytes).

    Returns:
        ``len(body).to_bytes(4, "big") + body``.

    Raises:
        LocalProtocolError: FRAME_TOO_LARGE when the body exceeds ``max_frame_bytes``,
            INVALID_FRAME when a field cannot be packed.
    """
    return encode_value(frame.to_wire(), max_frame_bytes)


def encode_value(value: object, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
    """Serialize one msgpack value as a frame (used for raw and raft frames).

    Raises:
        LocalProtocolError: as :func:`encode_frame`.
    """
    try:
        body: bytes = _PACK(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise LocalProtocolError(ErrorCode.INVALID_FRAME, f"cannot encode frame: {exc}") from exc
    if len(body) > max_frame_bytes:
        raise LocalProtocolError(
            ErrorCode.FRAME_TOO_LARGE,
            f"frame of {len(body)} bytes exceeds the limit of {max_frame_bytes} bytes",
        )
    return len(body).to_bytes(HEADER_BYTES, "big") + body


def request_containers(max_batch_items: int) -> int:
    """The most arrays and maps one client frame may hold (a server's ``max_containers``):
    twice what a PUBLISH of ``max_batch_items`` items with headers needs, plus room for
    the other requests' few.

    An array or map of msgpack is one byte on the wire and some 60 bytes once decoded:
    a 4 MiB frame of empty arrays took the server from 60 MB to 390 MB while it was
    decoded. Bounding their number bounds what one frame costs."""
    return 4 * max_batch_items + 1024


class _TooManyContainers(Exception):
    """A frame holds more arrays and maps than the decoder's ``max_containers``."""


def _unpack_bounded(body: memoryview, max_containers: int) -> object:
    """:func:`msgpack.unpackb` of a frame body that refuses more than
    ``max_containers`` arrays and maps, and any one longer than that, as it decodes.

    Raises:
        _TooManyContainers: past either bound.
        ValueError, TypeError, msgpack.UnpackException: as :func:`msgpack.unpackb`.
    """
    count = 0

    def counted(container: Any) -> Any:
        nonlocal count
        count += 1
        if count > max_containers:
            raise _TooManyContainers
        return container

    longest = min(max_containers, len(body))
    try:
        return msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            use_list=True,
            list_hook=counted,
            object_hook=counted,
            max_array_len=longest,
            max_map_len=longest,
        )
    except ValueError as exc:
        claimed = _CLAIM.match(str(exc))
        if claimed is not None and claimed[2] in ("array", "map") and longest < len(body):
            raise _TooManyContainers from None
        raise


def _frame_head(buffer: bytearray, start: int, end: int) -> tuple[int, int] | None:
    """The (frame type, request id) a frame body begins with, read without decoding
    the rest: None unless the body is an array whose first two items are ints, the
    first a known frame type (``docs/protocol.md``, "Frames")."""
    unpacker = msgpack.Unpacker(max_array_len=0, max_map_len=0, max_str_len=0, max_bin_len=0)
    unpacker.feed(bytes(buffer[start : min(end, start + 32)]))
    try:
        if unpacker.read_array_header() < 2:
            return None
        frame_type = unpacker.unpack()
        request_id = unpacker.unpack()
    except (ValueError, TypeError, msgpack.UnpackException, msgpack.OutOfData):
        return None
    if type(frame_type) is not int or type(request_id) is not int:
        return None
    try:
        frames.FrameType(frame_type)
    except ValueError:
        return None
    return frame_type, request_id


def msgpack_fault(exc: BaseException) -> str:
    """What is wrong with bytes msgpack refused to decode, in words a client can act on
    (msgpack's own messages are empty for a reserved byte or deep nesting, and name
    Python types and options for a bad map key)."""
    if isinstance(exc, msgpack.StackError):
        return "arrays or maps are nested too deeply"
    if isinstance(exc, msgpack.FormatError):
        return "it holds a byte that begins no msgpack value (such as 0xc1, never used)"
    if isinstance(exc, UnicodeDecodeError):
        return f"a string is not valid UTF-8 (byte 0x{exc.object[exc.start]:02x})"
    text = str(exc)
    claimed = _CLAIM.match(text)
    if claimed is not None:
        count, kind, body_bytes = claimed.groups()
        what, unit = _CLAIMED[kind]
        return (
            f"{what} header says it holds {count} {unit}, more than the whole frame body "
            f"({body_bytes} bytes) could; the length in each msgpack header must match what follows it"
        )
    if text == "Unpack failed: incomplete input":
        return (
            "the msgpack value ends early (a string, binary, array or map holds less than "
            "its header says); the frame length must count exactly one whole msgpack value"
        )
    if "strict_map_key" in text:
        kind = text.split(" ", 1)[0]
        shown = {"NoneType": "nil", "int": "an integer", "float": "a float", "bool": "a boolean",
                 "list": "an array", "dict": "a map", "tuple": "an array"}.get(kind, kind)  # fmt: skip
        return f"a map key is {shown}; map keys must be strings (or binary)"
    return "it is not one well-formed msgpack value"


_CLAIM: Final = re.compile(r"^(\d+) exceeds max_(str|bin|array|map|ext)_len\((\d+)\)$")
"""msgpack's refusal of a length header beyond the body (its limit is the body size)."""
_CLAIMED: Final = {
    "str": ("a string", "bytes"),
    "bin": ("a binary", "bytes"),
    "array": ("an array", "items"),
    "map": ("a map", "entries"),
    "ext": ("an extension value", "bytes"),
}


class FrameDecoder:
    """Incremental decoder of a byte stream into frames.

    Args:
        max_frame_bytes: Largest frame body accepted (bytes). A header announcing more
            raises FRAME_TOO_LARGE before the body is buffered.
        parse: If True (default) bodies become frame objects; if False,
            :meth:`next_frame` returns the raw decoded msgpack value (raft links).
        max_containers: Most arrays and maps one frame may hold, and most items one
            of them may hold (a server's, from :func:`request_containers`); more is
            MALFORMED_FRAME, refused as it decodes. None: no bound but the frame's size.
    """

    def __init__(
        self,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        *,
        parse: bool = True,
        max_containers: int | None = None,
    ) -> None:
        if max_frame_bytes < 1:
            raise ValueError("max_frame_bytes must be >= 1")
        self.max_frame_bytes = max_frame_bytes
        self.max_containers = max_containers
        self._parse = parse
        self._buffer = bytearray()
        self._offset = 0
        self._eof = False
        self._failed = False

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet consumed by a returned frame."""
        return len(self._buffer) - self._offset

    def incomplete_frame(self) -> tuple[int, int | None]:
        """The frame being received: bytes of it received so far (its 4-byte length
        included), and its whole size once that length has arrived (else None).
        ``(0, None)`` between frames."""
        available = len(self._buffer) - self._offset
        if available < HEADER_BYTES:
            return available, None
        start = self._offset
        length = int.from_bytes(self._buffer[start : start + HEADER_BYTES], "big")
        return available, HEADER_BYTES + length

    def receive_data(self, data: bytes) -> None:
        """Add bytes from the stream; ``b""`` means the peer closed its side (EOF).

        Raises:
            RuntimeError: data after EOF, or use after an error.
        """
        if self._failed:
            raise RuntimeError("decoder already failed; the connection must be closed")
        if self._eof:
            if data:
                raise RuntimeError("data received after EOF")
            return
        if not data:
            self._eof = True
            return
        self._buffer += data

    def pending(self, limit: int) -> bytes:
        """Up to ``limit`` received bytes not decoded yet (the start of the frame that
        failed, after an error): for naming what the other side speaks."""
        return bytes(self._buffer[self._offset : self._offset + limit])

    def next_frame(self) -> frames.Frame | object:
        """Return the next complete frame, :data:`NEED_DATA` or :data:`CLOSED`.

        Raises:
            RemoteProtocolError: FRAME_TOO_LARGE, MALFORMED_FRAME (not msgpack or
                trailing bytes inside the frame), TRUNCATED_FRAME (EOF mid-frame),
                INVALID_FRAME or UNKNOWN_FRAME_TYPE (see
                :func:`futureq.wire.frames.frame_from_wire`). After it, the decoder
                refuses further use, except after a
                :class:`~futureq.errors.FrameFieldsError` (a whole frame with wrong
                fields), after which decoding goes on with the next frame.
        """
        if self._failed:
            raise RuntimeError("decoder already failed; the connection must be closed")
        try:
            return self._next()
        except FrameFieldsError:
            raise  # the frame was consumed whole: the stream is still in step
        except RemoteProtocolError:
            self._failed = True
            raise

    def _next(self) -> frames.Frame | object:
        available = len(self._buffer) - self._offset
        if available < HEADER_BYTES:
            return self._need_more(available)
        start = self._offset
        length = int.from_bytes(self._buffer[start : start + HEADER_BYTES], "big")
        if length > self.max_frame_bytes:
            raise RemoteProtocolError(
                ErrorCode.FRAME_TOO_LARGE,
                f"frame of {length} bytes exceeds the limit of {self.max_frame_bytes} bytes; "
                "send smaller batches or payloads",
            )
        if length == 0:
            raise RemoteProtocolError(ErrorCode.MALFORMED_FRAME, "empty frame body (length 0)")
        if available < HEADER_BYTES + length:
            return self._need_more(available)
        end = start + HEADER_BYTES + length
        self._offset = end
        try:
            # Decoded in place (no copy of the body); the views are released before the
            # buffer is compacted below, which a live view would forbid.
            with memoryview(self._buffer) as whole, whole[start + HEADER_BYTES : end] as body:
                if self.max_containers is None or length <= self.max_containers:
                    # Every array or map takes at least one byte: a body no longer than
                    # the bound cannot hold more (and the count's callback, once per
                    # array, cost 25-50 % more per decoded PUBLISH of 100 items).
                    value = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
                else:
                    value = _unpack_bounded(body, self.max_containers)
        except _TooManyContainers:
            message = (
                f"frame body holds more than {self.max_containers} arrays and maps, or one "
                f"of more than {self.max_containers} items, more than any request needs "
                "(a PUBLISH item takes 2): split the request"
            )
            head = _frame_head(self._buffer, start + HEADER_BYTES, end)
            if head is not None:
                # The frame was consumed whole and its request id is known: the request
                # fails alone (a CANCEL of 100,000 ids closed the client's connection,
                # its subscriptions and other requests with it; found by a tester).
                frame_type, request_id = head
                raise FrameFieldsError(
                    ErrorCode.BATCH_TOO_LARGE, message, request_id, frame_type
                ) from None
            raise RemoteProtocolError(ErrorCode.MALFORMED_FRAME, message) from None
        except msgpack.ExtraData:
            raise RemoteProtocolError(
                ErrorCode.MALFORMED_FRAME, "frame body holds more than one msgpack value"
            ) from None
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            # ValueError covers msgpack's FormatError/StackError and bad UTF-8.
            raise RemoteProtocolError(
                ErrorCode.MALFORMED_FRAME, f"frame body is not valid msgpack: {msgpack_fault(exc)}"
            ) from None
        if end > 65536 and end * 2 > len(self._buffer):
            del self._buffer[:end]
            self._offset = 0
        if not self._parse:
            raw: object = value
            return raw
        return frames.frame_from_wire(value)

    def _need_more(self, available: int) -> object:
        if self._eof:
            if available == 0:
                return CLOSED
            raise RemoteProtocolError(
                ErrorCode.TRUNCATED_FRAME,
                f"connection closed in the middle of a frame ({available} bytes of it received)",
            )
        return NEED_DATA
