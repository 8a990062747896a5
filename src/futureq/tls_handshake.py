"""What a failed TLS handshake's OpenSSL error says, read alike by the client (a TLS
client of a plaintext port) and the server (a plaintext client of a TLS port)."""

from __future__ import annotations

from typing import Final

NOT_TLS_REASONS: Final = frozenset(
    {"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST"}
)
"""OpenSSL's reasons (``ssl.SSLError.reason``; 3.0 and 3.2+ spell them differently) for
a handshake answered by bytes that are not TLS: the other side speaks plaintext (or
HTTP) on that port."""

__all__ = ["NOT_TLS_REASONS"]
