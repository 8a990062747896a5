"""Sans-IO wire protocol: bytes <-> frames. No sockets, no trio (``docs/protocol.md``)."""
