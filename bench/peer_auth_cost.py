"""CPU cost of Raft peer authentication (``futureq.raft.peer_auth``), in one process.

* the handshake with the cluster secret, both sides (connector + acceptor), per
  connection: HELLO, CHALLENGE, PROOF, ACCEPTED, each encoded and decoded as on the wire;
* sealing and opening one Raft message (the per-frame MAC), for a heartbeat-sized
  message, one AppendEntries of 100 × 100-byte entries and a 1 MiB snapshot chunk;
* the same messages through ``encode_message``/``decode_message`` alone, for scale.

Usage::

    python -m bench.peer_auth_cost [--quick] [--compare] [--no-save]

The end-to-end cost on a cluster is ``python -m bench.cluster_throughput --peer-auth
secret,insecure`` (docs/benchmarks.md, "Peer authentication").
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

from bench._common import add_common_args, finish
from futureq.raft import peer_auth
from futureq.raft.message_codec import decode_message, encode_message
from futureq.raft.messages import AppendEntries, Heartbeat, InstallSnapshot, LogIndex, NodeId, Term
from futureq.raft.values import Entry, Membership
from futureq.wire.codec import FrameDecoder, encode_value

NAME = "peer_auth_cost"
SECRET = os.urandom(32).hex().encode()


def _per_call_us(function: Callable[[], object], seconds: float) -> float:
    """Median of 5 rounds of CPU microseconds per call (process CPU time, so a busy
    machine slows the run but does not inflate the figure)."""
    rounds = []
    for _ in range(5):
        count, started = 0, time.process_time()
        while (elapsed := time.process_time() - started) < seconds / 5:
            for _ in range(20):
                function()
            count += 20
        rounds.append(elapsed / count * 1e6)
    return sorted(rounds)[2]


def _wire(frame: Any) -> object:
    decoder = FrameDecoder(peer_auth.MAX_HANDSHAKE_FRAME_BYTES, parse=False)
    decoder.receive_data(encode_value(frame.to_wire()))
    return decoder.next_frame()


def handshake() -> None:
    """One full secret handshake, both sides, through the codec."""
    connector = peer_auth.ConnectorHandshake(
        cluster_id="futureq",
        node_id=1,
        peer_id=2,
        raft_address="10.0.0.1:7451",
        client_address="10.0.0.1:7450",
        secret=SECRET,
        nonce=os.urandom(32),
    )
    acceptor = peer_auth.AcceptorHandshake(
        cluster_id="futureq", node_id=2, secret=SECRET, nonce=os.urandom(32)
    )
    challenge = acceptor.receive_hello(_wire(connector.hello))
    proof = connector.receive_challenge(_wire(challenge))
    acceptor.receive_proof(_wire(proof))
    connector.receive_verdict(_wire(peer_auth.Accepted()))


def messages() -> dict[str, bytes]:
    heartbeat = Heartbeat(Term(3), NodeId(1), NodeId(2), LogIndex(1000), 7)
    entries = tuple(Entry(Term(3), LogIndex(1001 + i), data=os.urandom(100)) for i in range(100))
    append = AppendEntries(
        Term(3), NodeId(1), NodeId(2), LogIndex(1000), Term(3), entries, LogIndex(1000)
    )
    chunk = InstallSnapshot(
        Term(3),
        NodeId(1),
        NodeId(2),
        LogIndex(1000),
        Term(3),
        Membership(frozenset({NodeId(1), NodeId(2), NodeId(3)})),
        0,
        os.urandom(1 << 20),
        False,
    )
    return {
        "heartbeat": encode_message(heartbeat),
        "append_100x100B": encode_message(append),
        "snapshot_chunk_1MiB": encode_message(chunk),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure, print, save; return the results."""
    parser = argparse.ArgumentParser(prog="python -m bench.peer_auth_cost")
    add_common_args(parser)
    args = parser.parse_args(argv)
    seconds = 0.5 if args.quick else 2.0
    results: dict[str, Any] = {"handshake_us": round(_per_call_us(handshake, seconds), 1)}
    print(f"secret handshake, both sides: {results['handshake_us']:.1f} µs per connection")
    per_message: dict[str, Any] = {}
    for name, body in messages().items():
        key = os.urandom(32)
        sealer, opener = peer_auth.FrameSealer(key), peer_auth.FrameOpener(key)

        def seal_and_open(
            body: bytes = body,
            sealer: peer_auth.FrameSealer = sealer,
            opener: peer_auth.FrameOpener = opener,
        ) -> None:
            opener.open(sealer.seal(body))

        def codec_only(body: bytes = body) -> None:
            decode_message(body)

        mac_us = _per_call_us(seal_and_open, seconds)
        codec_us = _per_call_us(codec_only, seconds)
        per_message[name] = {
            "bytes": len(body),
            "seal_open_us": round(mac_us, 2),
            "decode_us": round(codec_us, 2),
        }
        print(
            f"{name:<20} {len(body):>8} B: seal+open {mac_us:8.2f} µs, "
            f"decode_message alone {codec_us:8.2f} µs"
        )
    results["per_message"] = per_message
    finish(NAME, results, args, argv)
    return results


if __name__ == "__main__":
    main()
