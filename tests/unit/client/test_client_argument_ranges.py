"""Every number the client takes is checked at the call (docs/client.md, "Argument ranges").

A zero or negative deadline used to be accepted and then fail every call with "no answer
within -1 s; its outcome is unknown" (or "could not connect ...", blaming the server).
None of these tests connects: the checks come before anything leaves.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from tests.backends import on_both_backends

from futureq.client import open_client
from futureq.client.subscription import Subscription
from futureq.client.sync import SyncClient

UNREACHABLE = "127.0.0.1:1"  # never reached: every call below fails before connecting

BAD_OPTIONS = [
    ("connect_timeout_s", 0, "> 0"),
    ("connect_timeout_s", -1, "> 0"),
    ("connect_timeout_s", math.nan, "> 0"),
    ("connect_timeout_s", math.inf, "finite"),
    ("request_timeout_s", 0, "> 0"),
    ("request_timeout_s", -1.5, "> 0"),
    ("request_timeout_s", math.nan, "> 0"),
    ("request_timeout_s", math.inf, "finite"),
    ("max_batch_items", 0, ">= 1"),
    ("linger_ms", -5, ">= 0"),
    ("linger_ms", math.nan, ">= 0"),
    ("max_lease_s", -1, ">= 0"),
    ("max_lease_s", math.nan, ">= 0"),
    # Upper bounds: a value the platform cannot represent (10**400 is no float; 1e300
    # overflows time_t and threading waits) or that makes no sense, refused when given.
    ("connect_timeout_s", 1e300, "<= 86400"),
    ("connect_timeout_s", 10**400, "<= 86400"),
    ("connect_timeout_s", 86_401, "<= 86400"),
    ("request_timeout_s", 1e300, "<= 86400"),
    ("request_timeout_s", 10**400, "<= 86400"),
    ("linger_ms", 1e300, "<= 10000"),
    ("linger_ms", 10**400, "<= 10000"),
    ("linger_ms", 10_001, "<= 10000"),
    ("max_lease_s", 1e300, "<= 86400"),
    ("max_lease_s", 10**400, "<= 86400"),
]


@pytest.mark.parametrize(("name", "value", "range_text"), BAD_OPTIONS)
def test_sync_client_refuses_an_out_of_range_option_when_made(
    name: str, value: Any, range_text: str
) -> None:
    with pytest.raises(ValueError, match=name) as caught:
        SyncClient(UNREACHABLE, **{name: value})
    assert range_text in str(caught.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [("request_timeout_s", "5"), ("connect_timeout_s", True), ("max_batch_items", 1.5)],
)
def test_a_number_option_of_another_type_is_a_type_error(name: str, value: Any) -> None:
    with pytest.raises(TypeError, match=name):
        SyncClient(UNREACHABLE, **{name: value})


def test_sync_client_refuses_an_option_open_client_does_not_take() -> None:
    with pytest.raises(TypeError, match="request_timeout_ms"):
        SyncClient(UNREACHABLE, request_timeout_ms=5000)


def test_zero_options_that_mean_something_are_accepted() -> None:
    client = SyncClient(UNREACHABLE, linger_ms=0, max_lease_s=0)  # made, not connected
    client.close()


def test_the_largest_options_are_accepted() -> None:
    client = SyncClient(
        UNREACHABLE,
        connect_timeout_s=86_400,
        request_timeout_s=86_400.0,
        linger_ms=10_000,
        max_lease_s=86_400,
    )
    client.close()


def test_a_linger_as_long_as_the_request_timeout_is_refused() -> None:
    # A publish waits the linger within its deadline: it would always time out, and
    # say its outcome is unknown though nothing was sent.
    with pytest.raises(ValueError, match="linger_ms .* must be below request_timeout_s"):
        SyncClient(UNREACHABLE, linger_ms=2_000, request_timeout_s=2.0)


@pytest.mark.parametrize(("name", "value", "range_text"), BAD_OPTIONS)
@on_both_backends
async def test_open_client_refuses_an_out_of_range_option_before_connecting(
    name: str, value: Any, range_text: str
) -> None:
    with pytest.raises(ValueError, match=name) as caught:
        async with open_client(UNREACHABLE, **{name: value}):
            pass  # pragma: no cover
    assert range_text in str(caught.value)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"count": 0}, "count"),
        ({"count": -1}, "count"),
        ({"timeout_s": -1}, "timeout_s"),
        ({"timeout_s": math.nan}, "timeout_s"),
        ({"timeout_s": math.inf}, "timeout_s"),
        ({"timeout_s": 1e300}, "timeout_s"),
        ({"timeout_s": 10**400}, "timeout_s"),
        ({"prefetch": 0}, "prefetch"),
        # More than any server grants, and than the protocol's integers carry.
        ({"count": 1_000_001}, "count"),
        ({"count": 2**70}, "count"),
        ({"prefetch": 2**70}, "prefetch"),
    ],
)
def test_consume_refuses_an_out_of_range_argument_before_connecting(
    kwargs: dict[str, Any], name: str
) -> None:
    client = SyncClient(UNREACHABLE, connect_timeout_s=0.5)
    try:
        with pytest.raises(ValueError, match=name):
            client.consume("t", "g", **kwargs)
    finally:
        client.close()


class _NoClient:
    """Subscription's checks come before it touches its client."""


@pytest.mark.parametrize("prefetch", [0, -3])
def test_subscribe_refuses_prefetch_below_one(prefetch: int) -> None:
    with pytest.raises(ValueError, match="prefetch must be an int >= 1"):
        Subscription(_NoClient(), "t", "g", prefetch)  # type: ignore[arg-type]


@pytest.mark.parametrize("prefetch", [1_000_001, 2**70])
def test_subscribe_refuses_prefetch_above_what_any_server_grants(prefetch: int) -> None:
    with pytest.raises(ValueError, match="prefetch must be an int >= 1 and <= 1,000,000"):
        Subscription(_NoClient(), "t", "g", prefetch)  # type: ignore[arg-type]


def test_subscribe_refuses_a_float_prefetch() -> None:
    with pytest.raises(TypeError, match="prefetch"):
        Subscription(_NoClient(), "t", "g", 2.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout_s", [-1, math.nan, math.inf, 1e300, 10**400, 86_401])
async def test_receive_and_fetch_refuse_a_bad_timeout(timeout_s: float) -> None:
    sub = Subscription(_NoClient(), "t", "g", 5, pull=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_s"):
        await sub.receive(timeout_s)
    with pytest.raises(ValueError, match="timeout_s"):
        await sub.fetch(1, timeout_s)
    with pytest.raises(ValueError, match="count"):
        await sub.fetch(0, 1.0)


BAD_SETTLEMENTS = [
    # (method, argument, exception, text): a wrong type went out to the server and came
    # back as a misleading RequestError; a str failed with "'<' not supported".
    ("nack", True, TypeError, "requeue_delay_ms must be an int"),
    ("nack", 1.5, TypeError, "requeue_delay_ms must be an int"),
    ("nack", "5", TypeError, "requeue_delay_ms must be an int"),
    ("nack", math.nan, TypeError, "requeue_delay_ms must be an int"),
    ("nack", -1, ValueError, "requeue_delay_ms must be an int between 0 and"),
    ("nack", 10**30, ValueError, "requeue_delay_ms must be an int between 0 and"),
    ("extend", True, TypeError, "visibility_ms must be an int"),
    ("extend", 1.5, TypeError, "visibility_ms must be an int"),
    ("extend", "5", TypeError, "visibility_ms must be an int"),
    ("extend", math.nan, TypeError, "visibility_ms must be an int"),
    ("extend", 0, ValueError, "visibility_ms must be an int between 1 and 43200000"),
    ("extend", 43_200_001, ValueError, "visibility_ms must be an int between 1 and"),
    ("extend", 10**20, ValueError, "visibility_ms must be an int between 1 and"),
]


@pytest.mark.parametrize(("method", "value", "error", "text"), BAD_SETTLEMENTS)
async def test_nack_and_extend_refuse_a_bad_argument_before_sending(
    method: str, value: Any, error: type[Exception], text: str
) -> None:
    sub = Subscription(_NoClient(), "t", "g", 5)  # type: ignore[arg-type]
    with pytest.raises(error, match=text):
        await getattr(sub, method)([], value)


@pytest.mark.parametrize(("name", "value"), [("reason", 5), ("dead_letter", 1)])
async def test_nack_refuses_a_reason_or_dead_letter_of_another_type(name: str, value: Any) -> None:
    sub = Subscription(_NoClient(), "t", "g", 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=name):
        await sub.nack([], 0, **{name: value})
