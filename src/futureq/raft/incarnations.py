"""Which incarnation of each peer node id a node talks to: one at a time, sans-IO.

A data directory's incarnation (``docs/raft.md``, "Stamped data directories") names one
copy of a node's disk. Two processes with one node id and different incarnations (a
twin started with a data directory of its own, the same cluster id and secret) would
both be taken as that node: two votes for it in one term can elect two leaders, and
its acknowledgements, counted for the node, can commit an entry that no majority holds.

:class:`IncarnationGuard` lets one incarnation of a node id in at a time: the one that
holds the id (the first one seen, or the one seen most recently) keeps it while any of
its connections is open, and for ``quiet_s`` after the last one closed; a connection
of another incarnation meanwhile is refused (:class:`TwinRefusal`), and its messages
never reach the Raft core. A node whose disk was replaced (new incarnation, old
process gone) is taken once the old one's connections are all closed and ``quiet_s``
passed, so it can rejoin.

Pure: the caller passes the time (seconds of any monotonic clock) and the addresses;
the transport (:mod:`futureq.raft.transport`) calls it from both ends of a handshake.

Source: docs/raft.md, "Same node id twice".
"""

from __future__ import annotations

import attrs

from futureq.raft.basics import NodeId

UNKNOWN_INCARNATION = 0
"""What a peer that announces none (an older build, an unstamped test node) counts as:
never refused, never holds its id."""


@attrs.frozen
class TwinRefusal:
    """A connection of ``node_id`` refused because another incarnation holds the id.

    Attributes:
        node_id: The node id both claim.
        held: The incarnation that holds it (open connections, or heard of lately).
        held_at: Raft addresses of the holder's connections (most recent first).
        claimed: The refused connection's incarnation.
        claimed_at: The refused connection's address.
        quiet_s: How long after its last connection closed the holder keeps the id.
        gone_s: None while the holder has a connection open (two processes run as the
            node); else how long ago (s) its last connection closed: most likely the
            node was restarted on a replaced disk, and is taken once ``quiet_s`` passed.
    """

    node_id: NodeId
    held: int
    held_at: tuple[str, ...]
    claimed: int
    claimed_at: str
    quiet_s: float
    gone_s: float | None = None

    def sentence(self) -> str:
        """What happened and what the operator must fix, in one sentence."""
        if self.gone_s is not None:
            return (
                f"node {self.node_id}'s incarnation {self.held:x} closed its last "
                f"connection {self.gone_s:.1f} s ago; incarnation {self.claimed:x} (at "
                f"{self.claimed_at}, a replaced data directory?) is taken as node "
                f"{self.node_id} once the old one has been gone {self.quiet_s:g} s (if the "
                "old process runs still, stop one of the two)"
            )
        held_at = ", ".join(self.held_at)
        return (
            f"two processes run as node {self.node_id}: incarnation {self.held:x} (at "
            f"{held_at}) and incarnation {self.claimed:x} (at {self.claimed_at}), each "
            f"with its own data directory; only the first is taken as node {self.node_id}, "
            f"the other is refused. Stop the process that should not run as node "
            f"{self.node_id}; if node {self.node_id}'s disk was replaced, stop its old "
            f"process: the new incarnation is taken {self.quiet_s:g} s after the old "
            "one's last connection closed"
        )


@attrs.define
class _Holder:
    incarnation: int
    addresses: dict[int, str] = attrs.field(factory=dict)
    """Open connections of the holder: ticket -> address."""
    released_s: float = 0.0
    """When its last connection closed (meaningful while ``addresses`` is empty)."""


@attrs.frozen
class Ticket:
    """An admitted connection; hand it back to :meth:`IncarnationGuard.close`."""

    node_id: NodeId
    incarnation: int
    number: int


class IncarnationGuard:
    """Admit connections of one incarnation per peer node id at a time.

    Args:
        quiet_s: How long (seconds) an incarnation keeps its node id after its last
            connection closed. The transport uses the Raft election timeout: a peer
            unheard of for that long is, to Raft, a failed node (followers elect
            without it), and every running member pings every other one several times
            per election timeout (clock samples), so a holder that is still running
            reconnects well within it after a connection breaks; meanwhile a twin
            cannot slip in.

    Raises:
        ValueError: ``quiet_s`` < 0.
    """

    def __init__(self, quiet_s: float) -> None:
        if quiet_s < 0:
            raise ValueError(f"quiet_s must be >= 0, got {quiet_s}")
        self.quiet_s = quiet_s
        self._holders: dict[NodeId, _Holder] = {}
        self._tickets = 0

    def holder(self, node_id: int) -> int | None:
        """The incarnation holding ``node_id``, or None if none did yet."""
        held = self._holders.get(NodeId(node_id))
        return None if held is None else held.incarnation

    def admit(self, node_id: int, incarnation: int, address: str, now_s: float) -> Ticket:
        """Let a connection of ``node_id`` announcing ``incarnation`` in, or refuse it.

        Args:
            node_id: The peer's node id (authenticated).
            incarnation: The incarnation it announced (:data:`UNKNOWN_INCARNATION`:
                admitted, holds nothing).
            address: Where it is, for the operator (its Raft address).
            now_s: Monotonic time in seconds.

        Returns:
            A ticket to :meth:`close` when the connection ends.

        Raises:
            TwinRefusalError: another incarnation holds ``node_id``: it has an open
                connection, or its last one closed less than ``quiet_s`` ago.
        """
        node = NodeId(node_id)
        self._tickets += 1
        ticket = Ticket(node, incarnation, self._tickets)
        if incarnation == UNKNOWN_INCARNATION:
            return ticket
        held = self._holders.get(node)
        if held is not None and held.incarnation != incarnation:
            if held.addresses or now_s - held.released_s < self.quiet_s:
                raise TwinRefusalError(
                    TwinRefusal(
                        node,
                        held.incarnation,
                        tuple(dict.fromkeys(reversed(held.addresses.values()))),
                        incarnation,
                        address,
                        self.quiet_s,
                        None if held.addresses else max(0.0, now_s - held.released_s),
                    )
                )
            held = None  # gone for quiet_s: a replaced disk, taken from now on
        if held is None:
            held = self._holders[node] = _Holder(incarnation)
        held.addresses[ticket.number] = address
        return ticket

    def close(self, ticket: Ticket, now_s: float) -> None:
        """The connection of ``ticket`` ended (at ``now_s``, monotonic seconds)."""
        held = self._holders.get(ticket.node_id)
        if held is None or held.incarnation != ticket.incarnation:
            return
        if held.addresses.pop(ticket.number, None) is not None and not held.addresses:
            held.released_s = now_s


class TwinRefusalError(Exception):
    """Raised by :meth:`IncarnationGuard.admit`; ``refusal`` says who holds the id."""

    def __init__(self, refusal: TwinRefusal) -> None:
        super().__init__(refusal.sentence())
        self.refusal = refusal


__all__ = [
    "UNKNOWN_INCARNATION",
    "IncarnationGuard",
    "Ticket",
    "TwinRefusal",
    "TwinRefusalError",
]
