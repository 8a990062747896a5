"""The client's side of flow control, without a server: credit counted as the server
counts it (``docs/protocol.md``, "Flow control"), through pushes, revokes, confirmed
settlements, an ended subscription and pull-mode fetches."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from futureq.client.subscription import DeliveryState, Subscription
from futureq.errors import ErrorCode, RemoteProtocolError, RequestError, SubscriptionEndedError
from futureq.wire import frames


class FakeConnection:
    """Records the control frames the subscription sends."""

    def __init__(self, epoch: int = 1, max_prefetch: int | None = None) -> None:
        self.epoch = epoch
        self.max_prefetch = max_prefetch  # HELLO_OK's (version 5); None: an older server
        self.sent: list[frames.Frame] = []

    def send_control(self, frame: frames.Frame) -> None:
        self.sent.append(frame)

    def credits(self) -> list[int]:
        found = [f.credit for f in self.sent if isinstance(f, frames.Credit)]
        self.sent = []
        return found


class FakeClient:
    """The few client hooks a Subscription calls."""

    def __init__(self, conn: FakeConnection) -> None:
        self.conn = conn
        self.lease_wakes = 0

    def _live_epoch(self) -> int:
        return self.conn.epoch

    def _live_connection(self) -> Any:
        return self.conn

    def _lease_changed(self) -> None:
        self.lease_wakes += 1

    def _check_process(self) -> None:
        """Never a forked child here."""


def _deliver(sub_id: int, tags: list[bytes]) -> frames.Deliver:
    return frames.Deliver(
        0, sub_id, 1000, [[tag, n, b"p", 900, 800, 1] for n, tag in enumerate(tags)]
    )


def _tag(n: int) -> bytes:
    return n.to_bytes(24, "big")


def _bound(
    pull: bool = False, prefetch: int = 5, max_prefetch: int | None = None
) -> tuple[Subscription, FakeConnection]:
    conn = FakeConnection(max_prefetch=max_prefetch)
    sub = Subscription(FakeClient(conn), "t", "g", prefetch, pull=pull)  # type: ignore[arg-type]
    sub._bind(1, 7, prefetch)
    return sub, conn


async def test_credit_comes_back_for_confirmed_settlements_and_revokes() -> None:
    sub, conn = _bound()
    sub._receive(1, _deliver(7, [_tag(i) for i in range(5)]))
    assert sub._credit == 0
    with pytest.raises(RemoteProtocolError):
        sub._receive(1, _deliver(7, [_tag(99)]))  # beyond the credit granted
    sub, conn = _bound()
    sub._receive(1, _deliver(7, [_tag(i) for i in range(5)]))
    handed = [await sub.__anext__() for _ in range(5)]
    # The server took two back (their visibility passed): they are void, and their
    # credit is the server's to give back, not ours.
    sub._revoke(1, [_tag(0), _tag(1)])
    assert [d.state for d in handed[:2]] == [DeliveryState.VOID] * 2
    assert sub._credit == 2 and conn.credits() == []
    # A confirmed ack of three gives three back, in one CREDIT.
    sub._settled(conn, handed[2:], "ack")  # type: ignore[arg-type]
    assert conn.credits() == [3] and sub._credit == 5
    assert all(d.settled for d in handed[2:])
    # A settlement confirmed twice counts once.
    sub._settled(conn, handed[2:], "ack")  # type: ignore[arg-type]
    assert conn.credits() == [] and sub._credit == 5


async def test_a_revoked_delivery_still_buffered_is_never_handed_out() -> None:
    sub, _conn = _bound()
    sub._receive(1, _deliver(7, [_tag(1), _tag(2)]))
    sub._revoke(1, [_tag(1)])
    delivery = await sub.__anext__()
    assert delivery.tag == _tag(2)
    assert sub.buffered == 0


async def test_an_ended_subscription_voids_its_deliveries_and_ends_iteration() -> None:
    sub, conn = _bound()
    sub._receive(1, _deliver(7, [_tag(1), _tag(2)]))
    held = await sub.__anext__()
    end = SubscriptionEndedError(ErrorCode.GROUP_DELETED, "group g was deleted")
    sub._ended(1, end)
    assert held.state is DeliveryState.VOID and sub.end is end
    with pytest.raises(SubscriptionEndedError):
        await sub.__anext__()
    sub._settled(conn, [held], "ack")  # type: ignore[arg-type]
    assert conn.credits() == []


async def test_pull_fetch_asks_for_what_it_still_wants_and_gives_back_the_rest() -> None:
    sub, conn = _bound(pull=True, prefetch=3, max_prefetch=10)
    sub._receive(1, _deliver(7, [_tag(1)]))
    async with trio.open_nursery() as nursery:
        got: list[Any] = []

        async def fetch() -> None:
            got.extend(await sub.fetch(3, timeout_s=0.2))

        nursery.start_soon(fetch)
        await trio.testing.wait_all_tasks_blocked()
        assert conn.credits() == []  # 2 still wanted, 2 credits still out: nothing to ask
        sub._receive(1, _deliver(7, [_tag(2)]))
    assert [d.tag for d in got] == [_tag(1), _tag(2)]
    # The credit left (1) brings a delivery nobody fetches: it is to be released.
    sub._receive(1, _deliver(7, [_tag(3)]))
    assert [d.tag for d in sub.to_release] == [_tag(3)] and sub.buffered == 0
    # Settling in pull mode gives no credit back; the next fetch asks for its own.
    sub._settled(conn, got, "ack")  # type: ignore[arg-type]
    assert conn.credits() == []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sub.fetch, 4, 0.05)
        await trio.testing.wait_all_tasks_blocked()
        assert conn.credits() == [4]


class LeaseHost:
    """What the lease keeper (``ConsumingClient._keep_leases``) uses of its client: the
    subscriptions and their connection, and an EXTEND that records what it is asked and
    waits for the test to let it answer."""

    max_lease_s = 3600.0
    request_timeout_s = 5.0

    def __init__(self, conn: FakeConnection, subs: list[Subscription]) -> None:
        self._conn = conn
        self._lease_event = trio.Event()
        self._subscriptions = {id(sub): sub for sub in subs}
        self.extended: list[list[Any]] = []
        self.on_the_wire: list[bool] = []
        self.answer = [trio.Event(), trio.Event()]

    def _live_connection(self) -> FakeConnection:
        return self._conn

    async def _extend_on(
        self, conn: FakeConnection, deliveries: list[Any], visibility_ms: int, timeout_s: float
    ) -> list[Any]:
        call = len(self.extended)
        self.extended.append(list(deliveries))
        self.on_the_wire.append(all(d._under_way is not None for d in deliveries))
        if call < len(self.answer):
            await self.answer[call].wait()
        return []


async def test_the_lease_keeper_never_extends_a_delivery_the_application_took() -> None:
    """Found by a tester: the lease keeper chose what to extend before it awaited the
    EXTEND of another subscription; the application meanwhile took one of those
    deliveries and acked it, and the EXTEND that followed reached the server while the
    ACK was being committed: refused, it voided the delivery, so the ACK's confirmation
    gave no credit back and the window shrank for good. Now it extends only what is
    still buffered, and marks it on the wire (a settle call waits for it)."""
    from futureq.client._consuming import ConsumingClient

    conn = FakeConnection()
    subs = []
    for prefetch in (1, 2):
        sub = Subscription(FakeClient(conn), "t", "g", prefetch)  # type: ignore[arg-type]
        sub._bind(1, prefetch, prefetch)
        sub._info(1, 1000, 5)
        subs.append(sub)
    first, second = subs
    first._receive(1, _deliver(1, [_tag(1)]))
    second._receive(1, _deliver(2, [_tag(2), _tag(3)]))
    for sub in subs:
        for delivery in sub._buffer:
            delivery._refresh_s = 0.0  # half its visibility has passed: extend it
    host = LeaseHost(conn, subs)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ConsumingClient._keep_leases, host)  # type: ignore[arg-type]
        await trio.testing.wait_all_tasks_blocked()
        assert [[d.tag for d in call] for call in host.extended] == [[_tag(1)]]
        # While the first subscription's EXTEND is out, the application takes a
        # delivery of the second (to ack it).
        taken = await second.__anext__()
        assert taken.tag == _tag(2)
        host.answer[0].set()
        await trio.testing.wait_all_tasks_blocked()
        assert [d.tag for d in host.extended[1]] == [_tag(3)]  # before: [2, 3]
        assert host.on_the_wire[1] and taken._under_way is None
        host.answer[1].set()
        nursery.cancel_scope.cancel()
    assert taken.state is DeliveryState.HELD


async def test_a_settle_call_waits_until_none_of_its_deliveries_is_on_the_wire() -> None:
    """Found by a tester: a settle call waited for the calls under way one delivery at
    a time and never looked back, so a delivery another call put on the wire while it
    waited for a later one was sent twice at once: the server refused one, the refusal
    voided it, and the other's confirmation then gave no credit back."""
    from futureq.client._consuming import _after_calls_under_way, _under_way

    sub, _conn = _bound()
    sub._receive(1, _deliver(7, [_tag(1), _tag(2)]))
    first, second = [await sub.__anext__() for _ in range(2)]
    done = trio.Event()

    async def settle_both() -> None:
        await _after_calls_under_way([first, second])
        done.set()

    async with trio.open_nursery() as nursery:
        call_c = _under_way([second])  # call C sends the second
        call_c.__enter__()
        nursery.start_soon(settle_both)
        await trio.testing.wait_all_tasks_blocked()  # it waits for C
        call_d = _under_way([first])  # call D sends the first meanwhile
        call_d.__enter__()
        call_c.__exit__(None, None, None)  # C ends
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set()  # before: it went on while D had the first on the wire
        call_d.__exit__(None, None, None)
        await trio.testing.wait_all_tasks_blocked()
        assert done.is_set()


async def test_a_late_confirmation_after_a_refused_retry_gives_the_credit_back() -> None:
    """Found by a tester: an ACK that timed out (a slow commit) and was sent again got
    UNKNOWN_DELIVERY_TAG (the first was still being committed), which voided the
    delivery; the first ACK's late OK then gave no credit back, though the server had
    settled the delivery and returned none itself: the window shrank for good."""
    from futureq.client._consuming import _pop_refused_tag

    sub, conn = _bound(prefetch=2)
    sub._receive(1, _deliver(7, [_tag(1), _tag(2)]))
    first, second = [await sub.__anext__() for _ in range(2)]
    refusal = RequestError(ErrorCode.UNKNOWN_DELIVERY_TAG, "already settled", 0)
    assert _pop_refused_tag(refusal, [first]) is first  # the retry's answer
    assert first.state is DeliveryState.VOID
    sub._settled(conn, [first], "ack")  # type: ignore[arg-type]  # the first ACK's late OK
    assert conn.credits() == [1]  # before: none, ever
    assert first.settled and sub._credit == 1 and sub._outstanding == 1
    # A delivery the server took back (REVOKE) got its credit from the server: a
    # confirmation never follows, and it is not counted twice.
    sub._revoke(1, [second.tag])
    assert sub._credit == 2 and conn.credits() == []


async def test_a_pull_fetch_keeps_no_credit_out_past_the_server_s_max_prefetch() -> None:
    """Found by a tester: a fetch of more than the server's ``limits.max_prefetch``
    counted all of its credit as out, though an older server drops what passes its
    limit; once the server's credit was spent, the client believed the rest was still
    owed, and every later fetch asked for nothing and received nothing while messages
    were due. A server of protocol version 5 names its limit (HELLO_OK): credit out
    stays within it, less the deliveries unsettled, and once the subscription holds
    the limit unsettled the fetch returns what it has (nothing more can come)."""
    sub, conn = _bound(pull=True, prefetch=1, max_prefetch=100)
    got: list[Any] = []
    async with trio.open_nursery() as nursery:

        async def fetch() -> None:
            got.extend(await sub.fetch(500, timeout_s=5))

        nursery.start_soon(fetch)
        await trio.testing.wait_all_tasks_blocked()
        assert conn.credits() == [99]  # 1 held from SUBSCRIBE; before: [499]
        sub._receive(1, _deliver(7, [_tag(n) for n in range(100)]))
        await trio.testing.wait_all_tasks_blocked()
        assert len(got) == 100  # at the limit: returned at once, not after 5 s
    later: list[Any] = []
    async with trio.open_nursery() as nursery:

        async def fetch_more() -> None:
            later.extend(await sub.fetch(500, timeout_s=5))

        nursery.start_soon(fetch_more)
        await trio.testing.wait_all_tasks_blocked()
        assert conn.credits() == []  # 100 unsettled: no room, nothing asked
        sub._settled(conn, got[:30], "ack")  # type: ignore[arg-type]
        sub._wake()
        await trio.testing.wait_all_tasks_blocked()
        assert conn.credits() == [30]  # room for 30 again
        sub._receive(1, _deliver(7, [_tag(1_000 + n) for n in range(30)]))
    assert len(later) == 30


async def test_a_pull_fetch_on_an_older_server_keeps_only_its_window_out() -> None:
    """A server older than protocol version 5 does not name its ``limits.max_prefetch``
    and cut credit held past it without a word: only the window it took in SUBSCRIBE is
    sure to be kept, so a fetch keeps no more than that out and receives the rest in
    rounds (before: 10,000 out, and a server whose limit was 100 dropped 9,900 of it,
    the fetches after that receiving nothing)."""
    sub, conn = _bound(pull=True, prefetch=2)
    got: list[Any] = []
    async with trio.open_nursery() as nursery:

        async def fetch() -> None:
            got.extend(await sub.fetch(500, timeout_s=0.2))

        nursery.start_soon(fetch)
        await trio.testing.wait_all_tasks_blocked()
        assert conn.credits() == []  # the window's 2 are out already
        for round_ in range(3):
            sub._receive(1, _deliver(7, [_tag(2 * round_), _tag(2 * round_ + 1)]))
            await trio.testing.wait_all_tasks_blocked()
            assert conn.credits() == [2]  # the next round, never more than the window
    assert len(got) == 6


async def test_handed_over_deliveries_keep_their_room_until_settled_once() -> None:
    # After a HANDOVER the application still holds what it was handed: the next
    # subscription's window leaves room for it, and each one settled gives exactly one
    # credit back, even when it was settled while that SUBSCRIBE was on its way.
    sub, _old = _bound(prefetch=3)
    sub._receive(1, _deliver(7, [_tag(i) for i in range(3)]))
    first, second = await sub.__anext__(), await sub.__anext__()
    sub._handed_over(1)
    assert sub._room(None) == 1 and sub.subscription_id is None
    withheld = len(sub._live_orphans())  # what the next SUBSCRIBE is asked with
    assert withheld == 2
    new = FakeConnection(epoch=2)
    sub._client.conn = new  # type: ignore[attr-defined]
    sub._settled(new, [first], "ack")  # type: ignore[arg-type]
    assert new.credits() == []  # nothing bound yet to give it to
    sub._bind(2, 8, 3 - withheld, withheld, new)  # type: ignore[arg-type]
    assert new.credits() == [1] and sub._credit == 2
    sub._settled(new, [second], "ack")  # type: ignore[arg-type]
    sub._settled(new, [second], "ack")  # type: ignore[arg-type]
    assert new.credits() == [1] and sub._credit == 3 == sub.prefetch
    assert not sub._orphaned


async def test_a_handed_over_delivery_past_its_deadline_is_void_and_gives_its_room_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sub, _old = _bound(prefetch=2)
    sub._info(1, 2_000, 0)
    sub._receive(1, _deliver(7, [_tag(1), _tag(2)]))
    held = [await sub.__anext__(), await sub.__anext__()]
    await trio.sleep(1.0)
    held[1]._deadline_s = trio.current_time() + 5.0  # an EXTEND of 5 s confirmed now
    sub._handed_over(1)
    assert sub._room(None) == 0  # both held: no SUBSCRIBE yet
    with trio.fail_after(10):
        await sub._wait_for_room(None)  # held[0] lapses 2 s after it arrived
    assert trio.current_time() == pytest.approx(2.0)
    assert held[0].state is DeliveryState.VOID and held[1].state is DeliveryState.HELD
    assert sub._room(None) == 1
    new = FakeConnection(epoch=2)
    sub._client.conn = new  # type: ignore[attr-defined]
    sub._bind(2, 8, 1, 1, new)  # type: ignore[arg-type]
    assert new.credits() == []
    await trio.sleep(4.5)  # past held[1]'s extended deadline (6 s)
    sub._orphans_changed()  # the lease keeper's call at that deadline
    assert [d.state for d in held] == [DeliveryState.VOID] * 2
    assert new.credits() == [1] and sub._credit == 2 == sub.prefetch
