"""Connection frames and the generic answers: HELLO and HELLO_OK (the handshake),
ERROR, OK, PING, PONG and GOAWAY.

Source: ``docs/protocol.md``, "Connection setup" and "Frames".
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from futureq.wire.frames.constants import MAX_MEMBERS, FrameType
from futureq.wire.frames.fields import _arity, _bad, _int, _list, _opt_int, _opt_str, _str


@attrs.frozen
class Hello:
    """First frame from a client: the versions it speaks and an optional auth token."""

    TYPE: ClassVar[FrameType] = FrameType.HELLO
    request_id: int
    versions: tuple[int, ...]
    client_name: str = ""
    token: str | None = None

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, list(self.versions), self.client_name, self.token]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Hello:
        _arity("HELLO", f, 3)
        versions = _list("HELLO", "versions", f[0])
        for v in versions:
            _int("HELLO", "versions[]", v, minimum=0)
        return cls(
            rid,
            tuple(versions),
            _str("HELLO", "client_name", f[1]),
            _opt_str("HELLO", "token", f[2]),
        )


@attrs.frozen
class HelloOk:
    """Server's answer to HELLO: the chosen version, node id and leader's client address.

    ``shards``: how many shards the node runs (an optional trailing field in version 1,
    sent only when above 1); a client then asks SLOT_MAP and routes by topic
    (``docs/sharding.md``). ``members``: version 2 only (None in version 1): the client
    addresses (``host:port``) of the voters of the answering node's Raft group, this
    node's included, as far as it knows them; a client keeps them as servers to try
    when the ones it was given fail (``docs/protocol.md``, "HELLO_OK"). ``max_prefetch``:
    version 5 only (None before): the server's ``limits.max_prefetch`` (deliveries), the
    most one subscription has out at once and the largest SUBSCRIBE window it takes; a
    client keeps its credit within it.
    """

    TYPE: ClassVar[FrameType] = FrameType.HELLO_OK
    request_id: int
    version: int
    node_id: int
    leader_address: str | None
    max_frame_bytes: int
    server_version: str
    shards: int = 1
    members: tuple[str, ...] | None = None
    max_prefetch: int | None = None

    def to_wire(self) -> list[Any]:
        wire: list[Any] = [
            self.TYPE,
            self.request_id,
            self.version,
            self.node_id,
            self.leader_address,
            self.max_frame_bytes,
            self.server_version,
        ]
        if self.max_prefetch is not None:
            wire.append(self.shards)
            wire.append(list(self.members or ()))
            wire.append(self.max_prefetch)
        elif self.members is not None:
            wire.append(self.shards)
            wire.append(list(self.members))
        elif self.shards != 1:
            wire.append(self.shards)
        return wire

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> HelloOk:
        if not 5 <= len(f) <= 8:
            _arity("HELLO_OK", f, 8 if len(f) > 8 else 5)
        members: tuple[str, ...] | None = None
        if len(f) >= 7:
            listed = _list("HELLO_OK", "members", f[6])
            if len(listed) > MAX_MEMBERS:
                raise _bad(
                    "HELLO_OK",
                    f"field 'members' holds {len(listed)} addresses, at most {MAX_MEMBERS}",
                )
            members = tuple(_str("HELLO_OK", "members[]", address) for address in listed)
        return cls(
            rid,
            _int("HELLO_OK", "version", f[0]),
            _int("HELLO_OK", "node_id", f[1]),
            _opt_str("HELLO_OK", "leader_address", f[2]),
            _int("HELLO_OK", "max_frame_bytes", f[3], minimum=1),
            _str("HELLO_OK", "server_version", f[4]),
            _int("HELLO_OK", "shards", f[5], minimum=1) if len(f) >= 6 else 1,
            members,
            _int("HELLO_OK", "max_prefetch", f[7], minimum=1) if len(f) == 8 else None,
        )


@attrs.frozen
class Error:
    """A refused request (2xx, 3xx codes) or a protocol error (1xx, then the server closes)."""

    TYPE: ClassVar[FrameType] = FrameType.ERROR
    request_id: int
    code: int
    message: str
    item_index: int | None = None
    leader_address: str | None = None

    def to_wire(self) -> list[Any]:
        return [
            self.TYPE,
            self.request_id,
            self.code,
            self.message,
            self.item_index,
            self.leader_address,
        ]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Error:
        _arity("ERROR", f, 4)
        return cls(
            rid,
            _int("ERROR", "code", f[0]),
            _str("ERROR", "message", f[1]),
            _opt_int("ERROR", "item_index", f[2], minimum=0),
            _opt_str("ERROR", "leader_address", f[3]),
        )


@attrs.frozen
class Ok:
    """Success answer to ACK, NACK, UNSUBSCRIBE, GROUP_CREATE and GROUP_DELETE.

    ``result`` is request specific: the number of tags acked or nacked; for
    GROUP_CREATE what it did (:class:`~futureq.wire.frames.constants.GroupCreated`);
    else None.
    """

    TYPE: ClassVar[FrameType] = FrameType.OK
    request_id: int
    result: int | None = None

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id, self.result]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Ok:
        _arity("OK", f, 1)
        return cls(rid, _opt_int("OK", "result", f[0]))


@attrs.frozen
class Ping:
    """Liveness probe; answered with PONG."""

    TYPE: ClassVar[FrameType] = FrameType.PING
    request_id: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Ping:
        _arity("PING", f, 0)
        return cls(rid)


@attrs.frozen
class Pong:
    """Answer to PING."""

    TYPE: ClassVar[FrameType] = FrameType.PONG
    request_id: int

    def to_wire(self) -> list[Any]:
        return [self.TYPE, self.request_id]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> Pong:
        _arity("PONG", f, 0)
        return cls(rid)


@attrs.frozen
class GoAway:
    """Server push (request id 0; protocol version 6): the server reads no more of this
    connection's requests and closes it once the answers owed are written.

    It served every request it read with an id up to ``last_request_id`` (the largest
    id it read; 0: none) and serves none it reads from now on: a request with a larger
    id took no effect, whatever it was, and may be sent again elsewhere. ``code``
    says why (NOT_LEADER: the leadership moved, to ``leader_address`` when known;
    UNAVAILABLE: the node is shutting down), ``message`` in a sentence
    (``docs/protocol.md``, GOAWAY; HTTP/2's GOAWAY, RFC 9113 section 6.8, is the model).
    """

    TYPE: ClassVar[FrameType] = FrameType.GOAWAY
    request_id: int
    last_request_id: int
    code: int
    message: str
    leader_address: str | None = None

    def to_wire(self) -> list[Any]:
        return [
            self.TYPE,
            self.request_id,
            self.last_request_id,
            self.code,
            self.message,
            self.leader_address,
        ]

    @classmethod
    def from_wire(cls, rid: int, f: list[Any]) -> GoAway:
        _arity("GOAWAY", f, 4)
        return cls(
            rid,
            _int("GOAWAY", "last_request_id", f[0], minimum=0),
            _int("GOAWAY", "code", f[1]),
            _str("GOAWAY", "message", f[2]),
            _opt_str("GOAWAY", "leader_address", f[3]),
        )
