"""The leader's time for the CLI: due times are on cluster time, not this machine's clock.

A ``--at`` time is read on this machine's clock, and a due time on the leader's cluster
time (``docs/architecture.md``, "Time"). From a machine an hour slow, ``publish --at``
ten minutes ahead by its clock named a time fifty minutes past by the cluster's, and
the message was delivered at once, with nothing said (breaker run).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from futureq.cli.output import format_ms
from futureq.errors import FutureQError
from futureq.raft.cluster_clock import describe_offset

if TYPE_CHECKING:
    from futureq.client import Client

PASSED_WARN_MS = 1_000
"""How far a ``--at`` time this machine's clock reads as ahead must be behind the
leader's time for a warning (ms): well past the cluster's clock bound (500 ms by
default) and the status request's round trip."""


async def leader_now_ms(client: Client) -> int:
    """The leader's cluster time (ms since the Unix epoch), which due times are on (as
    ``--counts`` buckets count from it); this machine's clock only if the node reports
    none. This machine's clock may be far off theirs: ``--within`` on it listed nothing
    due in the next ten minutes from a client an hour slow."""
    clock = (await client.status()).get("clock")
    if isinstance(clock, dict) and type(clock.get("cluster_time_ms")) is int:
        return int(clock["cluster_time_ms"])
    return int(time.time() * 1000)


async def passed_warning(client: Client, at_ms: int | None, flag: str) -> str | None:
    """The warning for standard error when ``at_ms``, ahead by this machine's clock,
    has passed by the leader's (the message is due at once, not when this machine
    said), or None.

    Args:
        client: Connected to the cluster (one STATUS request is made, only when
            ``at_ms`` is ahead of this machine's clock).
        at_ms: The time given (ms since the Unix epoch), or None (none given).
        flag: The option, for the sentence (``--at``).

    A status that cannot be had says nothing (the publish itself succeeded). The
    caller writes the line (off the event loop: ``futureq.cli.output``).
    """
    local_ms = time.time_ns() // 1_000_000
    if at_ms is None or at_ms <= local_ms:
        return None  # none given, or meant as "at once" / past here too
    try:
        leader_ms = await leader_now_ms(client)
    except FutureQError:
        return None
    behind_ms = leader_ms - at_ms
    if behind_ms <= PASSED_WARN_MS:
        return None
    return (
        f"warning: {flag} {format_ms(at_ms)} is {behind_ms / 1000:.1f} s before the "
        f"cluster's time ({format_ms(leader_ms)}): the message is due at once. This "
        f"machine's clock is {describe_offset((local_ms - leader_ms) * 1000)} the "
        "cluster's; fix it (NTP), or give a relative --delay"
    )


__all__ = ["PASSED_WARN_MS", "leader_now_ms", "passed_warning"]
