"""What spoke, when the first bytes on a futureq port are no futureq frame.

A TLS handshake, an HTTP request or an SSH client on a port that speaks futureq frames
was refused with the frame decoder's own words (``frame of 369295618 bytes exceeds the
limit``: the number is a TLS record header read as a frame length). Both listeners, the
client port (:mod:`futureq.wire.session`) and the Raft port
(:mod:`futureq.raft.transport`), name the protocol instead, each with what to fix there.
"""

from __future__ import annotations

from typing import Literal

Protocol = Literal["TLS", "HTTP", "SSH"]

START_BYTES = 8
"""How many first bytes :func:`protocol_of` needs."""

_HTTP_METHODS = (b"GET ", b"POST", b"PUT ", b"HEAD", b"DELE", b"OPTI", b"PATC", b"CONN", b"PRI ")


def protocol_of(start: bytes) -> Protocol | None:
    """The protocol whose opening ``start`` (the first bytes a peer sent) is, or None.

    TLS: a handshake record (content type 22, version 3.x; RFC 8446 §5.1). HTTP: a
    request line's method (``PRI `` opens HTTP/2's preface). SSH: the identification
    string (RFC 4253 §4.2).
    """
    if start[:1] == b"\x16" and start[1:2] == b"\x03":
        return "TLS"
    if start[:4] in _HTTP_METHODS:
        return "HTTP"
    if start.startswith(b"SSH-"):
        return "SSH"
    return None
