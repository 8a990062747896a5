"""What waits in the publish batcher: one ``publish()`` call, and one batch being gathered.

Kept apart from :mod:`futureq.client._publishing` because the client's constructor
(:mod:`futureq.client._base`) makes the queue these go through.
"""

from __future__ import annotations

import anyio

from futureq.client._batching import PublishItem
from futureq.errors import FutureQError


class _PendingPublish:
    """One ``publish()`` call waiting in the batcher: item, deadline, outcome."""

    __slots__ = ("item", "deadline", "event", "message_id", "error")

    def __init__(self, item: PublishItem, deadline: float) -> None:
        self.item = item
        self.deadline = deadline
        self.event = anyio.Event()
        self.message_id: int | None = None
        self.error: FutureQError | None = None

    def resolve(self, message_id: int) -> None:
        if not self.event.is_set():
            self.message_id = message_id
            self.event.set()

    def fail(self, error: FutureQError) -> None:
        if not self.event.is_set():
            self.error = error
            self.event.set()


class _Gathering:
    """A PUBLISH batch being gathered: at most ``max_items`` calls and ``budget``
    bytes of encoded items (always at least its first call)."""

    __slots__ = ("pending", "size", "budget", "max_items", "full")

    def __init__(self, first: _PendingPublish, budget: int, max_items: int) -> None:
        self.pending = [first]
        self.size = first.item.wire_bytes
        self.budget = budget
        self.max_items = max_items
        self.full = max_items <= 1

    def add(self, pending: _PendingPublish, carry: list[_PendingPublish]) -> None:
        """Add ``pending``, or, when it does not fit, put it in ``carry`` (it starts
        the next batch, so order is kept) and mark this one full."""
        if self.size + pending.item.wire_bytes > self.budget:
            carry.append(pending)
            self.full = True
            return
        self.pending.append(pending)
        self.size += pending.item.wire_bytes
        self.full = len(self.pending) >= self.max_items
