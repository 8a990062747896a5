"""The overview's node totals with more groups than it lists, on one shard and two.

``docs/protocol.md``, WATCH_UPDATE: ``pending_total`` and ``in_flight_total`` count every
group, listed or not. Before, the dashboard's PENDING and IN FLIGHT cards summed the
100 groups listed, so a node with 150 groups showed 100 of its 152 pending.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from typing import Protocol

import pytest

from futureq.client import PublishItem
from futureq.client.sync import SyncClient

TOPICS = 150
"""More topics (each with its default group) than the overview lists (100)."""


class BrokerProcess(Protocol):
    """What these tests use of a broker (tests/integration/conftest.py)."""

    client_address: str
    http_address: str


def _overview(http_address: str) -> dict[str, object]:
    with urllib.request.urlopen(f"http://{http_address}/api/overview", timeout=10) as answer:
        overview: dict[str, object] = json.loads(answer.read())
    return overview


@pytest.mark.parametrize("shards", ["1", "2"])
def test_totals_count_every_group_not_only_those_listed(
    broker_factory: Callable[..., BrokerProcess], shards: str
) -> None:
    broker = broker_factory(extra_args=["--shards", shards])
    with SyncClient(broker.client_address, request_timeout_s=10.0) as client:
        later = [PublishItem(f"later.t{i:03d}", b"x", delay_ms=3_600_000) for i in range(TOPICS)]
        client.publish_batch(later)
        client.create_group("now", "workers")
        client.publish_batch([PublishItem("now", b"a"), PublishItem("now", b"b")])
        held = client.consume("now", "workers", count=1, timeout_s=5.0)
        assert len(held) == 1
        overview = _overview(broker.http_address)
        groups = overview["groups"]
        assert isinstance(groups, list) and len(groups) < TOPICS
        assert overview["groups_total"] == TOPICS + 1
        status = client.status()
        assert not status["truncated"]
        listed = sum(g["pending"] for t in status["topics"] for g in t["groups"])
        assert overview["pending_total"] == listed == TOPICS + 2  # the held one included
        assert overview["in_flight_total"] == 1
        _expect_cards(broker.http_address, pending=f"{TOPICS + 2:,}", in_flight="1")


def _expect_cards(http_address: str, *, pending: str, in_flight: str) -> None:
    """The dashboard's PENDING and IN FLIGHT cards, in a real headless browser."""
    from playwright.sync_api import expect, sync_playwright
    from test_dashboard_browser import WAIT_MS, browser_context, open_dashboard

    with sync_playwright() as playwright, browser_context(playwright, None) as browser:
        page, errors = open_dashboard(browser, http_address)
        expect(page.locator("#card-pending")).to_have_text(pending, timeout=WAIT_MS)
        expect(page.locator("#card-in-flight")).to_have_text(in_flight, timeout=WAIT_MS)
        assert errors == []
