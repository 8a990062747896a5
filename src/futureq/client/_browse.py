"""What :meth:`futureq.client.Client.browse` returns: a page of pending messages.

Source: ``docs/protocol.md``, "BROWSE_OK", "BROWSE_COUNTS_OK".
"""

from __future__ import annotations

import attrs

from futureq.wire import frames


@attrs.frozen
class PendingMessage:
    """A message waiting in a group, as BROWSE shows it (nothing is claimed).

    Attributes:
        id: The message id.
        due_ms: When it falls due in this group (ms since the Unix epoch, cluster
            time); None for a parked dead letter (never delivered until redriven or
            cancelled).
        attempt: Deliveries recorded so far (0: never delivered).
        payload_bytes: The payload's size (bytes).
        headers: Its headers (str -> str); dead letters carry their provenance here
            (``futureq-original-id``, ``futureq-reason``, ...).
        preview: The first ``preview_bytes`` of the payload, or None if none were asked.
        expire_ms: When it expires (ms), or None.
    """

    id: int
    due_ms: int | None
    attempt: int
    payload_bytes: int
    headers: dict[str, str]
    preview: bytes | None
    expire_ms: int | None


@attrs.frozen
class BrowsePage:
    """One page of a BROWSE.

    Attributes:
        group: The group browsed (the topic's only group when none was named).
        messages: Up to ``limit`` messages, in due order.
        next_cursor: Pass it as ``cursor`` for the next page; None: no more.
    """

    group: str
    messages: list[PendingMessage]
    next_cursor: bytes | None


def page_from_frame(frame: frames.BrowseOk) -> BrowsePage:
    """The page a BROWSE_OK carries."""
    return BrowsePage(
        frame.group,
        [
            PendingMessage(m[0], m[1], m[2], m[3], dict(m[4] or {}), m[5], m[6])
            for m in frame.messages
        ],
        frame.next_cursor,
    )


@attrs.frozen
class DueCounts:
    """How many of a group's pending messages fall due in each bucket (BROWSE_COUNTS).

    Attributes:
        group: The group counted.
        bounds_ms: The bucket bounds, absolute (ms since the Unix epoch, cluster time).
        counts: ``counts[0]``: due before ``bounds_ms[0]`` (overdue included);
            ``counts[i]``: due in ``[bounds_ms[i-1], bounds_ms[i])``. None: not counted
            (``complete`` is false).
        later: Due at or after the last bound (parked dead letters included); None
            when ``complete`` is false.
        complete: False when the server stopped at its read limit (200,000 entries per
            request): the last non-None count is then a lower bound.
    """

    group: str
    bounds_ms: list[int]
    counts: list[int | None]
    later: int | None
    complete: bool


def counts_from_frame(frame: frames.BrowseCountsOk) -> DueCounts:
    """The counts a BROWSE_COUNTS_OK carries."""
    return DueCounts(
        frame.group, list(frame.bounds_ms), list(frame.counts), frame.later, frame.complete
    )
