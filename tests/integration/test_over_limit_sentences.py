"""Every delay, time or TTL over the server's limit says it in days, names the setting
(``limits.max_delay_ms`` / ``limits.max_ttl_ms``) and what to do
(``validation.over_limit`` builds them all).

Found by a tester: after b1e0fe4 only ``--delay`` did; ``--at 2040-01-01T00:00:00Z``
and ``--ttl 3661d`` still gave bare ms ("the limit is 316224000000 ms"). A real node,
the real CLI and client.
"""

from __future__ import annotations

from broker_process import BrokerProcess
from cli_process import cli

from futureq.client.sync import SyncClient
from futureq.errors import ErrorCode, RequestError

ELEVEN_YEARS_MS = 11 * 366 * 86_400_000


def test_the_cli_says_days_the_setting_and_what_to_do(broker: BrokerProcess) -> None:
    at = cli(broker.client_address, "publish", "l.t", "x", "--at", "2040-01-01T00:00:00Z")
    assert at.returncode == 1, at
    assert "[DELAY_TOO_LARGE] deliver_at_ms 2208988800000 (2040-01-01T00:00:00Z) is " in (at.stderr)
    assert "days); the limit is 316224000000 ms (3,660 days, limits.max_delay_ms): " in (at.stderr)
    assert "give an earlier time, or have the operator raise limits.max_delay_ms" in at.stderr
    ttl = cli(broker.client_address, "publish", "l.t", "x", "--ttl", "3661d")
    assert ttl.returncode == 1, ttl
    assert (
        "[INVALID_TTL] ttl_ms is 316310400000 ms (3,661 days); the limit is 316224000000 ms "
        "(3,660 days, limits.max_ttl_ms): give a shorter TTL, or have the operator raise "
        "limits.max_ttl_ms"
    ) in ttl.stderr


def refused(call: object) -> RequestError:
    try:
        call()  # type: ignore[operator]
    except RequestError as exc:
        return exc
    raise AssertionError("not refused")


def test_reschedule_and_redrive_over_the_limit_say_it_the_same_way(
    broker: BrokerProcess,
) -> None:
    with SyncClient(broker.client_address) as client:
        client.create_group("l.t", "g")
        mid = client.publish("l.t", b"x")
        late = refused(lambda: client.reschedule("l.t", [mid], delay_ms=ELEVEN_YEARS_MS))
        assert late.code is ErrorCode.DELAY_TOO_LARGE
        assert "(4,026 days); the limit is 316224000000 ms (3,660 days, limits.max_delay_ms)" in (
            late.message
        )
        assert "reschedule to an earlier time" in late.message
        redrive = refused(lambda: client.redrive("l.t", [mid], delay_ms=ELEVEN_YEARS_MS))
        assert redrive.code is ErrorCode.INVALID_DELAY
        assert redrive.message == (
            f"REDRIVE delay_ms is {ELEVEN_YEARS_MS} ms (4,026 days); the limit is "
            "316224000000 ms (3,660 days, limits.max_delay_ms): redrive sooner, or have the "
            "operator raise limits.max_delay_ms"
        )
