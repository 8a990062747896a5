"""The operations callers queue for a :class:`~futureq.raft.node.RaftNode`'s driver, and
their waiters.

A proposal, a durable append, a membership change, a ReadIndex read, a follower's
commit-index probe or a leadership transfer is queued as an :class:`Op`; the driver
starts it on the core at the top of its next round and resolves or fails its
:class:`Waiter` once the outcome is known.
"""

from __future__ import annotations

from typing import Any

import attrs

from futureq import request_order
from futureq.errors import ErrorCode, RequestError
from futureq.raft.values import ConfChange


class Waiter:
    __slots__ = ("decoded", "done", "error", "index", "result", "term")

    def __init__(self, decoded: Any = None) -> None:
        self.done = request_order.Done()
        self.result: Any = None
        self.error: BaseException | None = None
        self.index = 0
        self.term = 0
        self.decoded = decoded
        """The proposer's own reading of its entry's bytes, or None (see ``propose``)."""

    def resolve(self, result: Any) -> None:
        if not self.done.is_set():
            self.result = result
            self.done.set()

    def fail(self, error: BaseException) -> None:
        if not self.done.is_set():
            self.error = error
            self.done.set()

    async def wait(self) -> Any:
        await self.done.wait()
        return self.outcome()

    def outcome(self) -> Any:
        """The result once done (raises its error)."""
        if self.error is not None:
            raise self.error
        return self.result


@attrs.frozen
class Op:
    kind: str  # "propose", "durable", "conf", "read", "probe", "transfer"
    waiter: Waiter
    data: bytes = b""
    change: ConfChange | None = None
    target: int = 0


PROBE_PREFIX = b"probe:"
"""Request context of the follower's commit-index probes (never a read waiter's)."""


def outcome_unknown(index: int, why: str) -> RequestError:
    return RequestError(
        ErrorCode.UNAVAILABLE,
        f"outcome unknown: {why} before log entry {index} was known to be committed; "
        "it may or may not have been applied",
    )
