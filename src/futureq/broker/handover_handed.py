"""Asking subscriptions what their application was handed, before a graceful handover.

A leader that hands leadership over gracefully (a SIGTERM, TRANSFER_LEADER) records
every first delivery still out as a counted attempt (RETURN_COUNTED,
:func:`~futureq.broker.delivery_records.hold_and_record`): the next leader must not
count from zero what a consumer may be processing. But a client buffers deliveries
(prefetch) before its application takes them, and those were counted too: with
``max_deliveries`` 1, a rolling restart sent every consumer's unread buffer to the
dead-letter topic without the application ever seeing it (found by two testers).

So, first, each subscription whose connection speaks protocol version 4 and holds
deliveries out is sent a HANDOVER frame; the client answers with UNSUBSCRIBE naming
in ``handed`` the tags its application received and has not settled
(:func:`~futureq.broker.consumer_requests.unsubscribe`: the others are released,
uncounted, before the subscription closes; handed first deliveries are then recorded
as counted attempts by ``hold_and_record``, handed redeliveries were recorded when
they went out). The leader waits for the answers at most :data:`HANDED_WAIT_S`;
a subscription not answered by then (an older client, a slow one) keeps the count of
every delivery out, as before. A crash asks nobody: there every delivery out counts.

Source: ``docs/protocol.md``, HANDOVER and "Dead letters".
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

import trio

from futureq.wire import frames

if TYPE_CHECKING:
    from .broker import Broker
    from .hub import Consumer

log = logging.getLogger(__name__)

HANDED_WAIT_S: Final = 0.5
"""Longest a leader handing over waits for its subscriptions' answers to HANDOVER,
their releases committed included (s). Clients answer from memory at once, so this is
reached only when one does not answer (hung, or its answer lost); then its deliveries
out count, as before protocol version 4."""


class HandedAsk:
    """The subscriptions a leader handing over asked (HANDOVER) and still waits for.

    Attributes:
        waiting: Their subscription ids.
        answered: Set once every one of them has left (its UNSUBSCRIBE handled, the
            release of its unread deliveries committed or failed).
    """

    def __init__(self, subscription_ids: set[int]) -> None:
        self.waiting = subscription_ids
        self.answered = trio.Event()
        if not subscription_ids:
            self.answered.set()

    def left(self, consumer: Consumer) -> None:
        """``consumer``'s UNSUBSCRIBE was handled (whether or not it was asked)."""
        self.waiting.discard(consumer.subscription_id)
        if not self.waiting:
            self.answered.set()


async def ask_handed(broker: Broker) -> int:
    """Send HANDOVER to every subscription of a version 4 connection with deliveries
    out, then wait up to :data:`HANDED_WAIT_S` for their UNSUBSCRIBEs (their unread
    deliveries released, uncounted). Stops handing out deliveries first
    (:attr:`Dispatcher.held`, until ``Dispatcher.resume``). Never raises for a client:
    one that does not answer is simply not waited for any longer.

    Returns:
        How many subscriptions were asked (0 when not leading or none qualifies).
    """
    hub = broker.hub
    broker.dispatcher.held = True
    if not broker.log.is_leader():
        return 0
    asked: set[int] = set()
    for consumer in list(hub.consumers.values()):
        if consumer.closed or not consumer.asks_handed:
            continue
        out = any(
            flight is not None and flight.still_out
            for flight in (hub.in_flight.get(key) for key in consumer.in_flight)
        )
        if out and consumer.send(frames.Handover(0, consumer.subscription_id)):
            asked.add(consumer.subscription_id)
    if not asked:
        return 0
    ask = HandedAsk(asked)
    broker.handed_ask = ask
    try:
        with trio.move_on_after(HANDED_WAIT_S) as waited:
            await ask.answered.wait()
    finally:
        broker.handed_ask = None
    if waited.cancelled_caught:
        log.info(
            "handing over: %d of %d subscriptions did not answer HANDOVER within %g s; "
            "their deliveries out count as attempts",
            len(ask.waiting),
            len(asked),
            HANDED_WAIT_S,
        )
    return len(asked)
