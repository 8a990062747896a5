"""FutureQ client library: the async :class:`Client` (asyncio or trio, through AnyIO)
and a small sync wrapper.

``open_client`` and the classes it hands out are the public API; see
``docs/client.md``. The synchronous wrapper lives in :mod:`futureq.client.sync`.
"""

from __future__ import annotations

from futureq.client._admin import ItemStatuses, PurgeCount
from futureq.client._base import parse_servers
from futureq.client._batching import PublishItem
from futureq.client._browse import BrowsePage, DueCounts, PendingMessage
from futureq.client.client import Client, open_client
from futureq.client.subscription import Delivery, Subscription

__all__ = [
    "BrowsePage",
    "DueCounts",
    "Client",
    "Delivery",
    "ItemStatuses",
    "PendingMessage",
    "PublishItem",
    "PurgeCount",
    "Subscription",
    "open_client",
    "parse_servers",
]
