"""Administration: status, consumer groups, message management (cancel, redrive,
reschedule, purge, browse) and cluster membership, each one request through
:meth:`~futureq.client._base.ClientBase._call` (``docs/protocol.md``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Final

import anyio

from futureq.client import _checks
from futureq.client._attempts import Attempts
from futureq.client._base import ClientBase, _expect
from futureq.client._browse import BrowsePage, DueCounts, counts_from_frame, page_from_frame
from futureq.client._connection import Connection
from futureq.errors import ConnectionLostError, RequestError
from futureq.wire import frames, validation

_EPOCH_MS: Final = "ms since the Unix epoch"


class ItemStatuses(list[frames.ItemStatus]):
    """The statuses :meth:`AdminClient.cancel`, :meth:`~AdminClient.redrive` and
    :meth:`~AdminClient.reschedule` return: a list, one per id, plus what was sent.

    Attributes:
        earlier_attempt: None when the answer is that of the only attempt that may
            have taken effect. Else why an earlier attempt of the same request may
            have taken effect (its connection broke with it in flight, or a refusal
            said "outcome unknown"), as a sentence: the request was sent again, so an
            ``UNKNOWN`` may be an id that earlier attempt cancelled or redrove (it
            is not pending now either way).
    """

    earlier_attempt: str | None = None


class PurgeCount(int):
    """What :meth:`AdminClient.purge` returns: an int, how many entries the groups held
    when the purge started.

    Attributes:
        earlier_attempt: None, or why an earlier attempt of the same PURGE may have
            taken effect (its answer was lost) as a sentence: the request was sent
            again, and the count is the later attempt's, without what the earlier one
            had removed by then (and the later one also removes what was published
            in between).
    """

    earlier_attempt: str | None = None


log = logging.getLogger(__name__)


class AdminClient(ClientBase):
    """The administration calls of :class:`~futureq.client.client.Client`."""

    # -- administration ------------------------------------------------------------------

    async def status(self, *, local: bool = False) -> dict[str, Any]:
        """The cluster's status, asked of the leader (``docs/protocol.md``, "STATUS").

        A follower knows some numbers only as its own local view (due, in flight,
        consumers): when the node answering says ``"view": "local"`` and names a leader,
        the client reconnects there and asks again (once). If the leader cannot be
        reached in time, the follower's answer is returned; it says it is local.

        Args:
            local: Return the connected node's own view without following the leader.

        Returns:
            ``{"node_id", "role", "view", "leader_only", "leader_id", "leader_address",
            "server_version", "applied_index", "uptime_s", "topics": [{"topic",
            "groups": [{"group", "pending", "due", "in_flight", "consumers",
            "visibility_timeout_ms", "max_deliveries"}]}]}``; ``view`` is ``"cluster"``
            from the leader, ``"local"`` from another node (``leader_only`` lists the
            fields that are then only that node's).

        Raises:
            RequestError, ConnectionLostError, ClientClosedError: as :meth:`publish`.
        """
        return await self._ask_leader(
            lambda rid: frames.Status(rid),
            frames.StatusOk,
            lambda status: status.get("view", "cluster") == "local",
            local=local,
        )

    async def _ask_leader(
        self,
        make_frame: Callable[[int], frames.Frame],
        kind: type[frames.StatusOk] | type[frames.ClusterStatusOk],
        is_local: Callable[[dict[str, Any]], bool],
        *,
        local: bool,
    ) -> dict[str, Any]:
        """Ask the connected node; if its answer is a follower's local view and it names
        the leader, ask the leader once more (an answer from a follower is kept if the
        leader cannot be asked before the deadline)."""
        deadline = anyio.current_time() + self.request_timeout_s
        answered: list[Connection] = []

        def note(conn: Connection, frame: frames.Frame) -> None:
            answered.append(conn)

        answer = await self._call(make_frame, retry_unknown=True, deadline=deadline, on_answer=note)
        status = _expect(answer, kind).status
        leader = status.get("leader_address")
        if local or not is_local(status) or leader is None or not answered:
            return status
        if answered[-1].address == leader:
            return status
        self._follow_leader(answered[-1], leader)
        try:
            again = await self._call(make_frame, retry_unknown=True, deadline=deadline)
        except (ConnectionLostError, RequestError):
            return status  # it says it is a local view
        return _expect(again, kind).status

    async def create_group(
        self,
        topic: str,
        group: str,
        *,
        visibility_timeout_ms: int | None = None,
        max_deliveries: int | None = None,
        from_backlog: bool = False,
        dead_letter_expired: bool | None = None,
    ) -> frames.GroupCreated | None:
        """Create a consumer group (idempotent). None takes the server's default.

        Args:
            topic: Topic name.
            group: Group name.
            visibility_timeout_ms: How long a delivery may stay unacked before it is
                delivered again (ms, >= 1).
            max_deliveries: Attempts before a message goes to ``<topic>.dlq`` (>= 1).
            from_backlog: A group this creates also gets every message of the topic
                pending in its other groups when it is created, once each (copied in
                the background, whatever those groups acknowledge meanwhile), not only
                those published after it exists. No effect on an existing group.
            dead_letter_expired: True: a message whose TTL runs out goes to
                ``<topic>.dlq`` (``futureq-reason: expired``) instead of being dropped.
                None keeps the group's setting (a new group: False).

        Returns:
            What the server did (:class:`~futureq.wire.frames.GroupCreated`): created
            (from the backlog or not), adopted the topic's implicit group, updated an
            existing group's settings, or nothing (it existed as asked: then
            ``from_backlog`` copied nothing). None from a server of an earlier build.
            A retry after a lost connection may find the group its first attempt
            created, and say UNCHANGED.

        Raises:
            RequestError, ConnectionLostError, ClientClosedError: as :meth:`publish`;
                INVALID_TOPIC for ``T.dlq.dlq``, which never receives anything (raised
                before sending, with the server's sentence).
            TypeError: an argument of the wrong type (a str ``max_deliveries``, say);
                nothing was sent.
            ValueError: ``visibility_timeout_ms`` or ``max_deliveries`` beyond 64 bits
                (:func:`~futureq.client._checks.check_wire_int`); nothing was sent.
        """
        _checks.check_str("topic", topic)
        _checks.check_str("group", group)
        validation.check_not_dead_letters_of_dead_letters(topic)  # the server's sentence
        _checks.check_wire_int(
            "visibility_timeout_ms", visibility_timeout_ms, unit="ms", optional=True
        )
        _checks.check_wire_int("max_deliveries", max_deliveries, unit="attempts", optional=True)
        _checks.check_bool("from_backlog", from_backlog)
        if dead_letter_expired is not None:
            _checks.check_bool("dead_letter_expired", dead_letter_expired)
        answer = await self._call(
            lambda rid: frames.GroupCreate(
                rid,
                topic,
                group,
                visibility_timeout_ms,
                max_deliveries,
                from_backlog,
                dead_letter_expired,
            ),
            retry_unknown=True,
        )
        result = _expect(answer, frames.Ok).result
        if result is None or result not in frames.GroupCreated._value2member_map_:
            return None
        return frames.GroupCreated(result)

    async def delete_group(self, topic: str, group: str) -> None:
        """Delete a consumer group and every delivery it still holds.

        Raises:
            RequestError: UNKNOWN_GROUP if there is no such group (also possible when
                a retry after a lost connection finds it already deleted).
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
        """
        _checks.check_str("topic", topic)
        _checks.check_str("group", group)
        answer = await self._call(
            lambda rid: frames.GroupDelete(rid, topic, group), retry_unknown=True
        )
        _expect(answer, frames.Ok)

    async def cancel(
        self, topic: str, ids: Sequence[int], *, group: str | None = None
    ) -> ItemStatuses:
        """Cancel scheduled messages by id (``docs/protocol.md``, "CANCEL").

        Args:
            topic: The topic they were published to.
            ids: Message ids as :meth:`publish` returned them; at most the server's
                ``limits.max_batch_items`` (10,000 by default) per call.
            group: Cancel only that group's copy; None (default): every group's.

        Returns:
            One status per id, in order: ``DONE`` (cancelled, never delivered),
            ``DELIVERED`` (cancelled, but delivered at least once already, possibly
            out to a consumer right now) or
            ``UNKNOWN`` (not pending there: acked, expired, cancelled, or never
            published). A retry after a lost connection may report ``UNKNOWN`` for
            what the first attempt cancelled: the list's ``earlier_attempt`` then says
            why that attempt's outcome is unknown (:class:`ItemStatuses`).

        Raises:
            RequestError: UNKNOWN_TOPIC, UNKNOWN_GROUP, EMPTY_BATCH, BATCH_TOO_LARGE,
                INVALID_MESSAGE_ID (``.item_index`` names it), PERMISSION_DENIED.
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
            TypeError: an argument of the wrong type (an id that is not an int, say);
                nothing was sent.
        """
        _checks.check_str("topic", topic)
        _checks.check_str("group", group, optional=True)
        id_list = _checks.message_ids(ids)
        attempts = Attempts()
        answer = await self._call(
            lambda rid: frames.Cancel(rid, topic, group, id_list),
            retry_unknown=True,
            attempts=attempts,
        )
        return _statuses(answer, attempts)

    async def redrive(
        self,
        topic: str,
        ids: Sequence[int],
        *,
        delay_ms: int = 0,
        group: str | None = None,
    ) -> ItemStatuses:
        """Move dead letters of ``topic`` back to the topic and group they died in
        (``docs/protocol.md``, "REDRIVE").

        Args:
            topic: The original topic (its dead letters are in ``topic.dlq``).
            ids: Dead-letter message ids (as :meth:`browse` of ``topic.dlq`` shows
                them); at most ``max_batch_items`` per call.
            delay_ms: Due this long after the leader's stamp (ms, >= 0).
            group: The dead-letter topic's group holding them; None: its only group.

        Returns:
            One status per id: ``DONE`` (a new message of ``topic`` for the group it
            died in, with its provenance headers plus ``futureq-redriven-from``),
            ``UNKNOWN`` (not a pending dead letter there) or ``NO_TARGET`` (its group
            no longer exists; it stays a dead letter). As :meth:`cancel`, an
            ``UNKNOWN`` may be what an earlier attempt redrove when the list's
            ``earlier_attempt`` is set.

        Raises:
            RequestError: RESERVED_TOPIC (``topic`` ends in ``.dlq``), UNKNOWN_TOPIC,
                UNKNOWN_GROUP, GROUP_REQUIRED, INVALID_DELAY, EMPTY_BATCH,
                BATCH_TOO_LARGE, INVALID_MESSAGE_ID, PERMISSION_DENIED.
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
            TypeError: as :meth:`cancel`.
        """
        _checks.check_str("topic", topic)
        _checks.check_str("group", group, optional=True)
        _checks.check_wire_int("delay_ms", delay_ms, unit="ms")
        id_list = _checks.message_ids(ids)
        attempts = Attempts()
        answer = await self._call(
            lambda rid: frames.Redrive(rid, topic, group, id_list, delay_ms),
            retry_unknown=True,
            attempts=attempts,
        )
        return _statuses(answer, attempts)

    async def reschedule(
        self,
        topic: str,
        ids: Sequence[int],
        *,
        due_ms: int | None = None,
        delay_ms: int | None = None,
        group: str | None = None,
    ) -> ItemStatuses:
        """Give pending messages a new due time by id (``docs/protocol.md``, "RESCHEDULE").

        Args:
            topic: Their topic.
            ids: Message ids; at most ``max_batch_items`` per call.
            due_ms: The new due time, ms since the Unix epoch (a past time: at once).
            delay_ms: Or: due this long after the leader's stamp (ms). Give exactly one.
            group: Only this group's copy; None: every group's.

        Returns:
            One status per id: ``DONE`` (moved; attempts kept, a TTL now counts from
            the new due time) or ``UNKNOWN`` (not pending there).

        Raises:
            RequestError: INVALID_DELAY, DELAY_TOO_LARGE, IMPLAUSIBLE_TIME, and as
                :meth:`cancel`.
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
            TypeError: as :meth:`cancel` (``delay_ms=1.5``, say).
        """
        _checks.check_str("topic", topic)
        _checks.check_str("group", group, optional=True)
        _checks.check_wire_int("due_ms", due_ms, unit=_EPOCH_MS, optional=True)
        _checks.check_wire_int("delay_ms", delay_ms, unit="ms", optional=True)
        id_list = _checks.message_ids(ids)
        attempts = Attempts()
        answer = await self._call(
            lambda rid: frames.Reschedule(rid, topic, group, id_list, due_ms, delay_ms),
            retry_unknown=True,
            attempts=attempts,
        )
        return _statuses(answer, attempts)

    async def purge(self, topic: str, *, group: str | None = None) -> PurgeCount:
        """Remove every message pending now in one group of ``topic``, or in all of
        them (``docs/protocol.md``, "PURGE").

        Returns once the purge has started; the server removes the entries in bounded
        chunks in the background (``status()`` pending counts fall). Messages published
        afterwards stay.

        Returns:
            How many entries the groups held when it started (a :class:`PurgeCount`,
            whose ``earlier_attempt`` says when that is a resent request's count).

        Raises:
            RequestError: UNKNOWN_TOPIC, UNKNOWN_GROUP, PERMISSION_DENIED.
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
            TypeError: ``topic`` or ``group`` is not a str; nothing was sent.
        """
        _checks.check_str("topic", topic)
        _checks.check_str("group", group, optional=True)
        attempts = Attempts()
        answer = await self._call(
            lambda rid: frames.Purge(rid, topic, group), retry_unknown=True, attempts=attempts
        )
        count = PurgeCount(_expect(answer, frames.Ok).result or 0)
        if attempts.unknown is not None:
            count.earlier_attempt = str(attempts.unknown)
        return count

    async def browse(
        self,
        topic: str,
        group: str | None = None,
        *,
        from_due_ms: int | None = None,
        to_due_ms: int | None = None,
        cursor: bytes | None = None,
        limit: int = 100,
        preview_bytes: int = 0,
    ) -> BrowsePage:
        """One page of a group's pending messages in due order, claiming none
        (``docs/protocol.md``, "BROWSE").

        Args:
            topic: The topic.
            group: The group; None: the topic's only group (a dead-letter topic has
                one, ``default``).
            from_due_ms: Only messages due at or after this (ms since the epoch).
            to_due_ms: Only messages due before this (ms); None: no bound (parked dead
                letters come last).
            cursor: The previous page's ``next_cursor``; None: the first page.
            limit: Most messages in the page, 1 to 1000 (a page of large headers
                holds fewer, with a ``next_cursor``: follow it until None).
            preview_bytes: Payload bytes to include per message, 0 to 1024.

        Raises:
            RequestError: UNKNOWN_TOPIC, UNKNOWN_GROUP, GROUP_REQUIRED,
                INVALID_ARGUMENT, INVALID_CURSOR, PERMISSION_DENIED.
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
            TypeError: an argument of the wrong type (a str ``cursor``, a float
                ``limit``); nothing was sent.
        """
        _checks.check_str("topic", topic)
        _checks.check_str("group", group, optional=True)
        _checks.check_wire_int("from_due_ms", from_due_ms, unit=_EPOCH_MS, optional=True)
        _checks.check_wire_int("to_due_ms", to_due_ms, unit=_EPOCH_MS, optional=True)
        _checks.check_cursor(cursor)
        _checks.check_wire_int("limit", limit, unit="messages")
        _checks.check_wire_int("preview_bytes", preview_bytes, unit="bytes")
        answer = await self._call(
            lambda rid: frames.Browse(
                rid, topic, group, from_due_ms, to_due_ms, cursor, limit, preview_bytes
            ),
            retry_unknown=True,
        )
        return page_from_frame(_expect(answer, frames.BrowseOk))

    async def browse_counts(
        self,
        topic: str,
        group: str | None = None,
        *,
        bounds_ms: Sequence[int],
        relative: bool = False,
    ) -> DueCounts:
        """How many of a group's pending messages fall due in each bucket, claiming
        none (``docs/protocol.md``, "BROWSE_COUNTS").

        Args:
            topic: The topic.
            group: The group; None: the topic's only group.
            bounds_ms: 1 to 32 strictly increasing bucket bounds: ms since the Unix
                epoch, or with ``relative`` ms from the leader's cluster time (e.g.
                ``[60_000, 3_600_000, 86_400_000]``: next minute / hour / day).
            relative: Whether ``bounds_ms`` count from now.

        Raises:
            RequestError: UNKNOWN_TOPIC, UNKNOWN_GROUP, GROUP_REQUIRED,
                INVALID_ARGUMENT (bounds), PERMISSION_DENIED.
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
            TypeError: as :meth:`browse`.
        """
        _checks.check_str("topic", topic)
        _checks.check_str("group", group, optional=True)
        bounds = _checks.bounds_list(bounds_ms)
        _checks.check_bool("relative", relative)
        answer = await self._call(
            lambda rid: frames.BrowseCounts(rid, topic, group, bounds, relative),
            retry_unknown=True,
        )
        return counts_from_frame(_expect(answer, frames.BrowseCountsOk))

    async def cluster_status(self, *, local: bool = False) -> dict[str, Any]:
        """The cluster's membership and progress, asked of the leader
        (``docs/protocol.md``, "CLUSTER_STATUS_OK").

        Only the leader knows each member's match index and lag: an answer from another
        node that names a leader is asked again of the leader (once), as :meth:`status`.

        Args:
            local: Return the connected node's own view without following the leader.

        Returns:
            ``{"node_id", "role", "term", "leader_id", "leader_address", "commit_index",
            "applied_index", "voters", "learners", "nodes": [...]}``.

        Raises:
            RequestError, ConnectionLostError, ClientClosedError: as :meth:`publish`.
        """
        return await self._ask_leader(
            lambda rid: frames.ClusterStatus(rid),
            frames.ClusterStatusOk,
            lambda view: view.get("role") != "leader",
            local=local,
        )

    async def add_node(self, node_id: int, raft_address: str, client_address: str) -> None:
        """Add a node: a learner first, promoted to voter by the leader once caught up.
        On a voter whose addresses the cluster recorded (it joined), record other
        addresses instead (the node moved).

        Args:
            node_id: The new node's id (>= 1, not in use), or such a voter's.
            raft_address: ``HOST:PORT`` where it listens for Raft traffic.
            client_address: ``HOST:PORT`` of its client listener.

        Raises:
            RequestError: INVALID_ARGUMENT (id in use, single-node server, bad address).
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
            TypeError, ValueError: ``node_id`` is not an int, or one beyond 64 bits
                (:func:`~futureq.client._checks.check_wire_int`); nothing was sent.
        """
        _checks.check_node_id(node_id)
        answer = await self._call(
            lambda rid: frames.ClusterAddNode(rid, node_id, raft_address, client_address),
            retry_unknown=True,
        )
        _expect(answer, frames.Ok)

    async def remove_node(self, node_id: int) -> None:
        """Remove a node from the cluster (the leader hands over first).

        Raises:
            RequestError: INVALID_ARGUMENT (not a member, single-node server).
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
            TypeError, ValueError: as :meth:`add_node`.
        """
        _checks.check_node_id(node_id)
        answer = await self._call(
            lambda rid: frames.ClusterRemoveNode(rid, node_id), retry_unknown=True
        )
        _expect(answer, frames.Ok)

    async def transfer_leader(self, node_id: int | None = None) -> None:
        """Hand leadership to ``node_id`` (None: the most up-to-date voter).

        Returns once it moved: the node's answer, which arrives even when another
        request of this client was answered NOT_LEADER meanwhile (the connection
        drains: :meth:`~futureq.client._base.ClientBase._follow_leader`). When the
        connection breaks before the answer, the cluster is asked where the
        leadership is (logged at INFO): it returns if that is ``node_id`` (None: any
        node but the one asked), within ``request_timeout_s``.

        Raises:
            RequestError: INVALID_ARGUMENT, TIMEOUT.
            ConnectionLostError: the connection broke before the answer and the
                leadership did not move as asked (or no leader was known in time).
            ClientClosedError: as :meth:`publish`.
            TypeError, ValueError: as :meth:`add_node` (None is allowed).
        """
        _checks.check_node_id(node_id, optional=True)
        asked: list[int] = []

        def make_frame(rid: int) -> frames.Frame:
            conn = self._live_connection()
            if conn is not None:
                asked.append(conn.node_id)
            return frames.ClusterTransferLeader(rid, node_id)

        try:
            # A TIMEOUT (the node asked saw no transfer complete in time) is asked
            # again, as before at-most-once calls stopped at such refusals: named, the
            # node then answers where the leadership went (OK once another node leads,
            # which the CLI checks); unnamed, asking again would move it once more.
            answer = await self._call(
                make_frame, retry_unknown=False, retry_refusals=node_id is not None
            )
        except ConnectionLostError as exc:
            # The answer never came: the connection broke, or it drained (another
            # request answered NOT_LEADER) and its grace time passed first. Found by
            # a tester: a client that consumed while it moved the leadership was told
            # the connection broke after every transfer that succeeded.
            log.info(
                "the answer to TRANSFER_LEADER was lost (%s); asking the cluster where "
                "the leadership went",
                exc,
            )
            if not await self._leadership_moved(node_id, asked[-1] if asked else None):
                raise
            return
        _expect(answer, frames.Ok)

    async def _leadership_moved(self, node_id: int | None, left: int | None) -> bool:
        """Whether the leadership went to ``node_id`` (None: away from node ``left``,
        the one asked to hand over), asked of the cluster until a leader is known or
        ``request_timeout_s`` passed (then False)."""
        if node_id is None and left is None:
            return False  # not known where it was asked: nothing to compare
        deadline = anyio.current_time() + self.request_timeout_s
        while True:
            try:
                leader: int | None = (await self.cluster_status()).get("leader_id")
            except (RequestError, ConnectionLostError):
                leader = None
            if leader is not None:
                return leader == node_id if node_id is not None else leader != left
            if anyio.current_time() >= deadline:
                return False
            await anyio.sleep(0.1)

    async def ping(self) -> float:
        """Round trip a PING.

        Returns:
            The round-trip time in seconds (one attempt's, not counting retries).

        Raises:
            RequestError, ConnectionLostError, ClientClosedError: as :meth:`publish`.
        """
        started = anyio.current_time()
        answer = await self._call(lambda rid: frames.Ping(rid), retry_unknown=True)
        _expect(answer, frames.Pong)
        return anyio.current_time() - started


def _statuses(answer: frames.Frame, attempts: Attempts) -> ItemStatuses:
    """The ITEM_RESULTS ``answer`` as :class:`ItemStatuses`, saying whether an earlier
    attempt (``attempts``) may have taken effect.

    Raises:
        RequestError: ``answer`` is not ITEM_RESULTS (as :func:`_expect`).
    """
    statuses = ItemStatuses(
        frames.ItemStatus(code) for code in _expect(answer, frames.ItemResults).results
    )
    if attempts.unknown is not None:
        statuses.earlier_attempt = str(attempts.unknown)
    return statuses
