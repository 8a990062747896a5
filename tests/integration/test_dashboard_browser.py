"""The dashboard in a real headless browser (Debian's chromium driven by Playwright)
against real ``futureq start`` processes with traffic: its numbers match
``/api/status``, it updates without a reload (live over ``/ws``, so the WebSocket
endpoint is exercised by a browser's own WebSocket client), and it shows a node going
away. Screenshots are kept in ``$FUTUREQ_TEST_ARTIFACTS`` (default
``test-artifacts/`` at the top of the repository).

``.ci/run`` installs ``chromium``; without it these tests fail (they are never skipped).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from broker_process import BrokerProcess
from cluster_process import Cluster
from playwright.sync_api import BrowserContext, Page, Playwright, expect, sync_playwright
from test_limits_access import write_credentials
from wire_client import WireClient

from futureq.client import PublishItem
from futureq.client.sync import SyncClient
from futureq.wire import frames

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("FUTUREQ_TEST_ARTIFACTS", ROOT / "test-artifacts"))
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 15_000
Factory = Any


def chromium_path() -> str:
    found = os.environ.get("FUTUREQ_CHROMIUM") or shutil.which("chromium")
    assert found, "chromium is not installed: apt-get install chromium (see .ci/run)"
    return found


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as started:  # one per thread: every browser comes from it
        yield started


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[BrowserContext]:
    with browser_context(playwright, None) as context:
        yield context


def open_dashboard(browser: BrowserContext, http_address: str) -> tuple[Page, list[str]]:
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"http://{http_address}/")
    expect(page.locator("#connection")).to_have_attribute("data-state", "live", timeout=WAIT_MS)
    return page, errors


def screenshot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    return path


def api_status(http_address: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{http_address}/api/status", timeout=10) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


def group_cell(page: Page, topic: str, group: str, field: str) -> Any:
    return page.locator(
        f'#groups tr[data-topic="{topic}"][data-group="{group}"] td[data-field="{field}"]'
    )


def expect_groups_match_status(page: Page, http_address: str) -> dict[str, Any]:
    status = api_status(http_address)
    for topic in status["topics"]:
        for group in topic["groups"]:
            for field in ("pending", "due", "in_flight", "consumers"):
                expect(group_cell(page, topic["topic"], group["group"], field)).to_have_attribute(
                    "data-value", str(group[field]), timeout=WAIT_MS
                )
    return status


def test_dashboard_shows_what_the_node_reports_and_updates_live(
    browser: BrowserContext, broker: BrokerProcess
) -> None:
    producer = WireClient(broker.client_address)
    consumer = WireClient(broker.client_address)
    consumer.subscribe("shop.orders", "billing", prefetch=5)
    now = [["shop.orders", b"order", 0, None, None]] * 30
    later = [["shop.orders", b"reminder", 3_600_000, None, None]] * 7
    assert isinstance(producer.publish(now + later), frames.PublishOk)
    assert isinstance(producer.publish([["shop.audit", b"a", 0, None, None]] * 4), frames.PublishOk)
    consumer.deliveries(5)  # 5 in flight, 25 due waiting for credit, 7 due in an hour

    page, errors = open_dashboard(browser, broker.http_address)
    status = expect_groups_match_status(page, broker.http_address)
    by_group = {(t["topic"], g["group"]): g for t in status["topics"] for g in t["groups"]}
    assert by_group[("shop.orders", "billing")]["in_flight"] == 5
    assert by_group[("shop.orders", "billing")]["due"] == 25
    expect(page.locator("#card-role")).to_have_text("leader")
    expect(page.locator("#card-applied")).to_have_text(f"{status['applied_index']:,}")
    expect(page.locator("#view-banner")).to_be_hidden()
    # Pending by due time: 25 due now (the 5 in flight are not waiting), 7 in an hour.
    expect(page.locator('#due-buckets [data-bucket="due now"]')).to_have_text("29")  # + 4 audit
    expect(page.locator('#due-buckets [data-bucket="later"]')).to_have_text("7")
    # Due within the next minute / hour / day, by BROWSE_COUNTS (in flight included).
    for field, value in (("due_1m", "30"), ("due_1h", "37"), ("due_1d", "37")):
        expect(group_cell(page, "shop.orders", "billing", field)).to_have_attribute(
            "data-value", value, timeout=WAIT_MS
        )
    expect(group_cell(page, "shop.audit", "default", "due_1m")).to_have_attribute(
        "data-value", "4", timeout=WAIT_MS
    )
    oldest = group_cell(page, "shop.orders", "billing", "oldest_due_age_ms")
    expect(oldest).not_to_have_attribute("data-value", "")

    # It updates by itself: more traffic shows up without a reload.
    assert isinstance(
        producer.publish([["shop.audit", b"b", 0, None, None]] * 10), frames.PublishOk
    )
    expect(group_cell(page, "shop.audit", "default", "pending")).to_have_attribute(
        "data-value", "14", timeout=WAIT_MS
    )
    expect_groups_match_status(page, broker.http_address)
    expect(page.locator('#legend-rates [data-series="published"]')).to_contain_text("published/s")
    expect(page.locator('#legend-lateness [data-series="deliveries"]')).to_have_text(
        "deliveries: 5", timeout=WAIT_MS
    )
    screenshot(page, "dashboard-single-node.png")

    # The node goes away: the page says so at once and greys out what it shows.
    broker.kill()
    expect(page.locator("#connection")).to_have_attribute("data-state", "lost", timeout=WAIT_MS)
    expect(page.locator("#connection-text")).to_contain_text("connection to the node lost")
    # ...and comes back by itself when the node does.
    broker.start()
    expect(page.locator("#connection")).to_have_attribute("data-state", "live", timeout=WAIT_MS)
    assert errors == []
    page.close()


def test_dashboard_cluster_view_and_members_going_away(
    browser: BrowserContext, tmp_path: Path
) -> None:
    cluster = Cluster(tmp_path / "cluster", 3)
    cluster.start()
    try:
        leader = cluster.leader()
        follower, other = [n for n in cluster.nodes.values() if n is not leader]
        client = WireClient(leader.client_address)
        assert isinstance(
            client.publish([["cluster.jobs", b"j", 0, None, None]] * 12), frames.PublishOk
        )

        page, errors = open_dashboard(browser, leader.http_address)
        members = page.locator("#members tbody tr")
        expect(members).to_have_count(3, timeout=WAIT_MS)
        for node_id in cluster.nodes:
            expect(page.locator(f'#members tr[data-node-id="{node_id}"]')).to_have_attribute(
                "data-reachable", "true", timeout=WAIT_MS
            )
        expect(
            page.locator(f'#members tr[data-node-id="{leader.node_id}"] .pill.leader')
        ).to_be_visible()
        expect_groups_match_status(page, leader.http_address)
        expect(page.locator("#alarms .alarm")).to_have_count(0)

        # A follower's dashboard says plainly that it is that follower's local view.
        follower_page, follower_errors = open_dashboard(browser, follower.http_address)
        banner = follower_page.locator("#view-banner")
        expect(banner).to_be_visible(timeout=WAIT_MS)
        expect(banner).to_contain_text(f"node {follower.node_id}'s local view: it is a follower")
        expect(banner).to_contain_text(f"node {leader.node_id} at {leader.client_address}")
        expect(follower_page.locator("#due-buckets")).to_have_text("known only to the leader")

        # A follower goes away: the leader's page marks it and raises an alarm.
        other.kill()
        gone = page.locator(f'#members tr[data-node-id="{other.node_id}"]')
        expect(gone).to_have_attribute("data-reachable", "false", timeout=WAIT_MS)
        expect(gone.locator('td[data-field="state"]')).to_have_text("unreachable")
        expect(page.locator('#alarms [data-alarm="MEMBER_UNREACHABLE"]')).to_contain_text(
            f"node {other.node_id} does not answer the leader"
        )
        screenshot(page, "dashboard-cluster-member-down.png")

        # The leader goes away too: its page loses the connection; the last follower,
        # alone, can elect no one and says there is no leader.
        leader.kill()
        expect(page.locator("#connection")).to_have_attribute("data-state", "lost", timeout=WAIT_MS)
        expect(follower_page.locator('#alarms [data-alarm="NO_LEADER"]')).to_be_visible(
            timeout=WAIT_MS
        )
        screenshot(follower_page, "dashboard-cluster-no-leader.png")
        assert errors == [] and follower_errors == []
        page.close()
        follower_page.close()
    finally:
        cluster.stop()


def test_dashboard_due_counts_cover_every_shard(browser: BrowserContext, tmp_path: Path) -> None:
    """Found by a tester: on a node of two shards the "due <= 1 min / 1 h / 1 d" columns
    showed "-" for every group of shard 1: the page sent BROWSE_COUNTS over its one
    WebSocket, which reaches shard 0 only, and the WRONG_SHARD refusal read as
    "unknown". Those groups are counted through /api/browse/counts, routed by shard 0."""
    broker = BrokerProcess(tmp_path / "data", shards="2")
    broker.start()
    try:
        topics = [f"sharded.t{i}" for i in range(8)]
        with SyncClient(broker.client_address, request_timeout_s=20.0) as client:
            for number, topic in enumerate(topics, start=1):
                client.publish_batch([PublishItem(topic, b"x")] * number)
                client.publish(topic, b"later", delay_ms=7_200_000)  # within the day only
        shards = {
            group["topic"]: group["shard"] for group in api_overview(broker.http_address)["groups"]
        }
        assert set(shards.values()) == {0, 1}, shards
        page, errors = open_dashboard(browser, broker.http_address)
        for number, topic in enumerate(topics, start=1):
            for field, value in (("due_1m", number), ("due_1h", number), ("due_1d", number + 1)):
                expect(group_cell(page, topic, "default", field)).to_have_attribute(
                    "data-value", str(value), timeout=WAIT_MS
                )
        screenshot(page, "dashboard-sharded-node.png")
        assert errors == []
        page.close()
    finally:
        broker.terminate()


def api_overview(http_address: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{http_address}/api/overview", timeout=10) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


def test_dashboard_behind_tokens(playwright: Playwright, tmp_path: Path) -> None:
    """With client credentials the page needs a monitor token (HTTP Basic, which the
    browser also sends on the /ws upgrade); when the token stops working (credentials
    reloaded on SIGHUP) the page asks for one and goes on with what is typed."""
    credentials = tmp_path / "clients.toml"
    tokens = write_credentials(credentials, {"mon": {"monitor": True}, "pub": {"publish": [">"]}})
    broker = BrokerProcess(
        tmp_path / "data", env={"FUTUREQ_SERVER_CREDENTIALS_FILE": str(credentials)}
    )
    broker.start()
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://{broker.http_address}/", timeout=10)
        refused.value.close()  # its socket, else left to a gc pass of a later test
        assert refused.value.code == 401
        assert refused.value.headers["WWW-Authenticate"].startswith("Basic")
        with browser_context(playwright, tokens["pub"]) as context:
            response = context.new_page().goto(f"http://{broker.http_address}/")
            assert response is not None and response.status == 403  # no monitor
        with browser_context(playwright, tokens["mon"]) as context:
            page, errors = open_dashboard(context, broker.http_address)
            expect(page.locator("#token-form")).to_be_hidden()
            # The token stops working: the page says so and asks for another.
            new = write_credentials(credentials, {"mon": {"monitor": True}})
            assert broker.process is not None
            broker.process.send_signal(signal.SIGHUP)
            expect(page.locator("#token-form")).to_be_visible(timeout=WAIT_MS)
            expect(page.locator("#connection")).to_have_attribute("data-state", "lost")
            page.fill("#token-input", new["mon"])
            page.click("#token-form button")
            expect(page.locator("#connection")).to_have_attribute(
                "data-state", "live", timeout=WAIT_MS
            )
            expect(page.locator("#token-form")).to_be_hidden()
            assert errors == []
    finally:
        broker.terminate()


@contextmanager
def browser_context(playwright: Playwright, token: str | None) -> Iterator[BrowserContext]:
    """A browser of its own, answering HTTP Basic challenges with ``token`` (name:secret)."""
    profile = tempfile.mkdtemp(prefix="futureq-chromium-")
    credentials = None
    if token is not None:
        name, _, secret = token.partition(":")
        credentials = {"username": name, "password": secret}
    context = playwright.chromium.launch_persistent_context(
        profile,
        executable_path=chromium_path(),
        headless=True,
        args=CHROMIUM_FLAGS,
        http_credentials=credentials,  # type: ignore[arg-type]
        viewport={"width": 1400, "height": 1000},
    )
    try:
        yield context
    finally:
        context.close()
        shutil.rmtree(profile, ignore_errors=True)
