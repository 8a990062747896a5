"""What :meth:`futureq.client.Client.browse` returns: a page of pending messages.

Source: ``docs/protocol.md``, "BROWSE_OK".
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
