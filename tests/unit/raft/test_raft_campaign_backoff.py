"""Elections finish when every message takes longer than the election timeout.

On a starved host (several Raft processes on two loaded cores) a message can take
longer than T to arrive and be answered. Without a back-off every campaign is cut
short by the next one, whose vote requests the late answers no longer count for: the
group stays leaderless for as long as the host is slow (issue 15, seeds 21 and 23).
"""

from __future__ import annotations

import heapq

from raft_helpers import ELECTION_TICKS, Network, make_node

from futureq.raft.election import MAX_CAMPAIGN_BACKOFF
from futureq.raft.messages import Message, NodeId


def _run_with_delay(network: Network, one_way_ticks: int, ticks: int) -> int | None:
    """Tick every node ``ticks`` times; each message arrives ``one_way_ticks`` ticks after
    it was sent. Returns the tick at which a leader was first known, or None."""
    in_flight: list[tuple[int, int, Message]] = []
    seq = 0
    for now in range(ticks):
        for node in network.nodes.values():
            node.core.tick()
        while in_flight and in_flight[0][0] <= now:
            _, _, message = heapq.heappop(in_flight)
            network.nodes[message.to_id].core.step(message)
        for node in network.nodes.values():
            for message in node.handle_ready():
                seq += 1
                heapq.heappush(in_flight, (now + one_way_ticks, seq, message))
        if network.leaders():
            return now
    return None


def test_a_leader_is_elected_when_round_trips_exceed_the_election_timeout() -> None:
    # Timeouts are drawn from [T, 2T) = [10, 20) ticks; a round trip takes 24.
    for seed in range(5):
        network = Network(make_node(i, (1, 2, 3), seed=seed) for i in (1, 2, 3))
        elected = _run_with_delay(network, one_way_ticks=12, ticks=60 * ELECTION_TICKS)
        assert elected is not None, f"seed {seed}: no leader in {60 * ELECTION_TICKS} ticks"


def test_the_back_off_grows_only_on_late_votes_and_ends_with_a_leader() -> None:
    network = Network(make_node(i, (1, 2, 3), seed=3) for i in (1, 2, 3))
    seen: set[int] = set()
    original = network.leaders

    def leaders() -> list[NodeId]:
        seen.update(network.core(i).campaign_backoff for i in (1, 2, 3))
        return original()

    network.leaders = leaders  # type: ignore[method-assign]
    assert _run_with_delay(network, one_way_ticks=12, ticks=60 * ELECTION_TICKS) is not None
    assert seen == {1, 2, 4} and MAX_CAMPAIGN_BACKOFF == 4  # doubled, capped
    network.leaders = original  # type: ignore[method-assign]
    network.tick_all(3)  # the leader's heartbeats arrive at once now
    assert [network.core(i).campaign_backoff for i in (1, 2, 3)] == [1, 1, 1]


def test_a_failover_on_a_fast_network_does_not_back_off() -> None:
    # Votes refused or never answered (an isolated node, peers still hearing the old
    # leader) are not slowness: the wait stays as configured.
    network = Network(make_node(i, (1, 2, 3)) for i in (1, 2, 3))
    network.elect(1)
    network.isolate(1)
    network.tick_all(4 * ELECTION_TICKS)
    assert [network.core(i).campaign_backoff for i in (1, 2, 3)] == [1, 1, 1]
    assert len([leader for leader in network.leaders() if leader != 1]) == 1
