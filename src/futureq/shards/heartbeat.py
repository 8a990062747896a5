"""Signs of life from a shard's event loop to its supervisor.

A shard process that is alive but stopped (SIGSTOP) or whose event loop is blocked
answers nothing, yet the supervisor sees it running: before, shard 0 in that state held
the node's HTTP port without answering, so ``/healthz`` and ``/readyz`` probes timed out
instead of reading which shard is wrong. So every shard writes one byte to a pipe the
supervisor gave it (:data:`HEARTBEAT_FD_ENV`) every :data:`HEARTBEAT_S` from a trio
task: a byte proves the loop runs. The supervisor reads the other end; a shard silent
for :data:`SILENT_AFTER_S` (after its first byte: starting up may block the loop for
long, and a shard that is starting is not serving anyway) is *not answering*: logged,
and for shard 0 the supervisor answers on the node's HTTP port until bytes come again
(:mod:`futureq.shards.cover`).

Source: ``docs/sharding.md``, "While shard 0 is down".
"""

from __future__ import annotations

import os

import trio

HEARTBEAT_FD_ENV = "FQ_SHARD_HEARTBEAT_FD"
"""Environment variable naming the write end of the shard's heartbeat pipe."""
HEARTBEAT_S = 0.2
"""How often a shard writes a byte (s)."""
SILENT_AFTER_S = 1.0
"""A shard silent this long is not answering (s): five heartbeats missed; at most the
1 s a shard 0 gives another shard's HTTP fetch, so a probe with the usual 2 s timeout
(k8s/statefulset.yaml) reaches the supervisor's answer in time."""


def heartbeat_fd() -> int | None:
    """The write end of this shard's heartbeat pipe (:data:`HEARTBEAT_FD_ENV`), or None
    (not a shard, or a supervisor of an older build)."""
    value = os.environ.get(HEARTBEAT_FD_ENV)
    return int(value) if value else None


async def send_heartbeats(fd: int) -> None:
    """Write one byte to ``fd`` every :data:`HEARTBEAT_S` until cancelled or the
    supervisor closed its end. Never blocks: a full pipe (a supervisor not reading)
    drops the byte."""
    os.set_blocking(fd, False)
    try:
        while True:
            try:
                os.write(fd, b".")
            except BlockingIOError:
                pass
            except OSError:  # EPIPE: the supervisor is gone; shards.lifeline acts
                return
            await trio.sleep(HEARTBEAT_S)
    finally:
        os.close(fd)


__all__ = ["HEARTBEAT_FD_ENV", "HEARTBEAT_S", "SILENT_AFTER_S", "heartbeat_fd", "send_heartbeats"]
