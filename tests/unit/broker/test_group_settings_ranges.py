"""GROUP_CREATE settings out of range: the sentence gives the documented range.

``docs/protocol.md``, GROUP_CREATE: ``visibility_timeout_ms`` is 100 – 43,200,000 ms
(1 – 99 is refused as a unit mistake, IMPLAUSIBLE_TIME), ``max_deliveries`` 1 –
1,000,000. Found by a tester: 0 was refused with "must be between 1 and 43200000".
"""

from __future__ import annotations

import pytest
from broker_helpers import FakeClock, SyncLog, memory_state

from futureq.broker.broker import Broker
from futureq.broker.dispatcher import Dispatcher
from futureq.broker.hub import Hub
from futureq.config import Config
from futureq.errors import ErrorCode, RequestError
from futureq.metrics import Metrics


def _broker() -> Broker:
    config = Config()
    state = memory_state()
    log = SyncLog(state)
    hub = Hub()
    clock = FakeClock()
    dispatcher = Dispatcher(state, log, hub, clock, config.queue)
    state.observer = dispatcher
    return Broker(config, state, log, hub, dispatcher, clock, Metrics())


@pytest.mark.parametrize(
    ("visibility_timeout_ms", "max_deliveries", "code", "words"),
    [
        (0, None, ErrorCode.INVALID_ARGUMENT, "between 100 and 43200000 ms (12 h), got 0"),
        (-5, None, ErrorCode.INVALID_ARGUMENT, "between 100 and 43200000 ms (12 h), got -5"),
        (43_200_001, None, ErrorCode.INVALID_ARGUMENT, "between 100 and 43200000 ms"),
        (30, None, ErrorCode.IMPLAUSIBLE_TIME, "the smallest accepted is 100 ms"),
        (None, 0, ErrorCode.INVALID_ARGUMENT, "max_deliveries must be between 1 and 1000000"),
    ],
)
async def test_a_setting_out_of_range_is_refused_with_the_documented_range(
    visibility_timeout_ms: int | None, max_deliveries: int | None, code: ErrorCode, words: str
) -> None:
    with pytest.raises(RequestError) as refused:
        await _broker().ensure_group("t", "g", visibility_timeout_ms, max_deliveries)
    assert refused.value.code == code
    assert words in refused.value.message
    assert "between 1 and 43200000" not in refused.value.message


async def test_the_range_ends_are_accepted() -> None:
    broker = _broker()
    assert (await broker.ensure_group("t", "a", 100, 1)).visibility_timeout_ms == 100
    assert (await broker.ensure_group("t", "b", 43_200_000, 1_000_000)).max_deliveries == 1_000_000
