"""Unit plausibility (issue 8, input 5; docs/protocol.md, "Units"): a time or duration
that can only be a unit mistake is refused with IMPLAUSIBLE_TIME and a sentence naming
the value it probably meant, at every entry point that shares these rules."""

from __future__ import annotations

import time
from typing import Any

import pytest

from futureq.client import PublishItem
from futureq.errors import ErrorCode, RequestError
from futureq.wire import validation
from futureq.wire.validation import Limits, validate_publish_items

NOW_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
NOW_S = NOW_MS // 1000


def refuse(item: list[Any]) -> RequestError:
    with pytest.raises(RequestError) as info:
        validate_publish_items([["ok", b"", None, None, None], item], Limits(), NOW_MS)
    assert info.value.item_index == 1
    return info.value


@pytest.mark.parametrize(
    ("deliver_at_ms", "says"),
    [
        (NOW_S + 3600, f"looks like seconds since the Unix epoch; deliver_at_ms is in "
                       f"milliseconds (did you mean {(NOW_S + 3600) * 1000}, 2026-01-01T01:00:00Z?)"),
        (1, "deliver_at_ms must be milliseconds since the Unix epoch"),
        (946_684_799_999, "before 2000"),
        (NOW_MS * 1000, "looks like microseconds"),
        (NOW_MS * 1_000_000, "looks like nanoseconds"),
    ],
)  # fmt: skip
def test_deliver_at_that_can_only_be_a_unit_mistake_is_refused(
    deliver_at_ms: int, says: str
) -> None:
    error = refuse(["t", b"", None, deliver_at_ms, None])
    assert error.code is ErrorCode.IMPLAUSIBLE_TIME
    assert says in error.message


@pytest.mark.parametrize("deliver_at_ms", [0, 946_684_800_000, NOW_MS - 86_400_000, NOW_MS])
def test_plausible_deliver_at_in_the_past_is_due_at_once(deliver_at_ms: int) -> None:
    [(_, _, due_ms, _)] = validate_publish_items(
        [["t", b"", None, deliver_at_ms, None]], Limits(), NOW_MS
    )
    assert due_ms == NOW_MS


def test_a_delay_or_ttl_that_is_an_absolute_time_is_refused() -> None:
    delay = refuse(["t", b"", NOW_MS + 60_000, None, None])
    assert delay.code is ErrorCode.IMPLAUSIBLE_TIME
    assert "looks like an absolute time (2026-01-01T00:01:00Z)" in delay.message
    assert "deliver_at_ms" in delay.message
    ttl = refuse(["t", b"", None, None, NOW_MS + 60_000])
    assert ttl.code is ErrorCode.IMPLAUSIBLE_TIME and "counts from the due time" in ttl.message
    # Over the limit but not an epoch time: the old codes stay.
    assert refuse(["t", b"", Limits().max_delay_ms + 1, None, None]).code is (
        ErrorCode.DELAY_TOO_LARGE
    )


def test_visibility_timeouts_below_100_ms_are_refused_as_seconds() -> None:
    with pytest.raises(RequestError) as info:
        validation.check_visibility_timeout_ms(30)
    assert info.value.code is ErrorCode.IMPLAUSIBLE_TIME
    assert "did you mean 30000, i.e. 30 s?" in info.value.message
    validation.check_visibility_timeout_ms(100)


def test_the_client_library_refuses_epoch_seconds_before_sending() -> None:
    """Input 5: ``deliver_at_ms=int(time.time())``."""
    with pytest.raises(RequestError) as info:
        PublishItem("t", b"x", deliver_at_ms=int(time.time()))
    assert info.value.code is ErrorCode.IMPLAUSIBLE_TIME
    assert "seconds since the Unix epoch" in info.value.message
    assert PublishItem("t", b"x", deliver_at_ms=int(time.time() * 1000)).deliver_at_ms


def test_a_delay_or_ttl_no_epoch_time_would_fix_is_just_too_large() -> None:
    """``--delay 36599d``: read as an epoch time it is 2070, which the server would not
    take either, so the answer is the limit's code, with the limit, not "send it as
    deliver_at_ms"."""
    limits = Limits()
    latest = NOW_MS + limits.max_delay_ms
    assert refuse(["t", b"", latest, None, None]).code is ErrorCode.IMPLAUSIBLE_TIME
    too_far = refuse(["t", b"", latest + 1, None, None])
    assert too_far.code is ErrorCode.DELAY_TOO_LARGE
    assert "limits.max_delay_ms" in too_far.message
    hundred_years = refuse(["t", b"", 36_599 * 86_400_000, None, None])
    assert hundred_years.code is ErrorCode.DELAY_TOO_LARGE
    assert "(36,599 days)" in hundred_years.message
    # A TTL reads as an expiry time: the latest taken is the due time plus max_ttl_ms.
    ttl_latest = NOW_MS + limits.max_ttl_ms
    assert refuse(["t", b"", None, None, ttl_latest]).code is ErrorCode.IMPLAUSIBLE_TIME
    assert refuse(["t", b"", None, None, ttl_latest + 1]).code is ErrorCode.INVALID_TTL


@pytest.mark.parametrize(
    ("item", "code", "says"),
    [
        # --at 2040-01-01T00:00:00Z (or deliver_at_ms in a JSONL line / a client publish).
        (
            ["t", b"", None, 2_208_988_800_000, None],
            ErrorCode.DELAY_TOO_LARGE,
            "deliver_at_ms 2208988800000 (2040-01-01T00:00:00Z) is 441763200000 ms from now "
            "(5,113 days); the limit is 316224000000 ms (3,660 days, limits.max_delay_ms): "
            "give an earlier time, or have the operator raise limits.max_delay_ms",
        ),
        # --ttl 3661d.
        (
            ["t", b"", None, None, 3661 * 86_400_000],
            ErrorCode.INVALID_TTL,
            "ttl_ms is 316310400000 ms (3,661 days); the limit is 316224000000 ms "
            "(3,660 days, limits.max_ttl_ms): give a shorter TTL, or have the operator "
            "raise limits.max_ttl_ms",
        ),
        # --delay 36599d: the sentence b1e0fe4 gave, now from the same helper.
        (
            ["t", b"", 36_599 * 86_400_000, None, None],
            ErrorCode.DELAY_TOO_LARGE,
            "delay_ms is 3162153600000 ms (36,599 days); the limit is 316224000000 ms "
            "(3,660 days, limits.max_delay_ms): deliver sooner, or have the operator raise "
            "limits.max_delay_ms",
        ),
    ],
)
def test_every_over_limit_sentence_gives_days_the_setting_and_what_to_do(
    item: list[Any], code: ErrorCode, says: str
) -> None:
    """Found by a tester: after b1e0fe4 only ``--delay`` said the limit in days and what
    to do; ``--at`` and ``--ttl`` over their limits still gave bare ms."""
    refused = refuse(item)
    assert refused.code is code
    assert refused.message == says


def test_readable_ms_names_the_largest_whole_unit() -> None:
    assert validation.readable_ms(316_224_000_000) == "3,660 days"
    assert validation.readable_ms(316_224_000_001) == "over 3,660 days"
    assert validation.readable_ms(86_400_000) == "1 day"
    assert validation.readable_ms(7_200_000) == "2 hours"
    assert validation.readable_ms(90_000) == "over 1 minute"
    assert validation.readable_ms(1000) == "1 second"
    assert validation.readable_ms(500) == "500 ms"
