"""Broker: what a client request turns into — proposals, subscriptions, acks, status.

The gateway calls these methods for one connection's requests. Publishing stamps the
leader's cluster time (``docs/architecture.md``, "Time"; never below the largest stamp
committed, so it is monotonic across leaders too), validates the batch, and proposes
one PUBLISH command; ack levels decide when it answers.

This module holds the :class:`Broker`'s state, leadership changes, the overview and
readiness; each request family is a module of plain functions over it:

* :mod:`~futureq.broker.publishing`: the stamp, PUBLISH, the background publisher;
* :mod:`~futureq.broker.group_reservations`: groups in flight against ``max_groups``;
* :mod:`~futureq.broker.group_requests`: creating, updating and deleting groups;
* :mod:`~futureq.broker.consumer_requests`: SUBSCRIBE, ACK, NACK, RELEASE, EXTEND;
* :mod:`~futureq.broker.membership`: cluster status, nodes, leadership transfer;
* :mod:`~futureq.broker.node_status`: STATUS, per-group gauges, the clock's view.

Source: ``DESIGN.md``, "Data flow" and "Message semantics"; ``docs/protocol.md``.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import trio

from futureq import request_order
from futureq.errors import NotLeaderError
from futureq.metrics import GroupCounts
from futureq.wire import frames, validation

from . import (
    consumer_requests,
    group_requests,
    membership,
    node_status,
    publishing,
)
from .command_log import no_space_error
from .group_reservations import GroupKey
from .hub import Consumer, Hub, Outbox, SettleCheck
from .overview import ActivityHistory, DueBuckets, build_overview

if TYPE_CHECKING:
    from futureq.clock import Clock
    from futureq.config import Config
    from futureq.metrics import Metrics
    from futureq.shards.layout import ShardRole
    from futureq.shards.view import NodeView
    from futureq.state.queue_state import GroupInfo, QueueState
    from futureq.storage.space import SpaceAlarm

    from .command_log import CommandLog
    from .dispatcher import Dispatcher
    from .due_counts import DueCounts
    from .handover_handed import HandedAsk

OVERVIEW_CACHE_S = 0.25
"""Watchers and ``/api/overview`` within this long share one overview (s): building it
looks at every group's replicated counter once."""


class Broker:
    """The request-level API of one node.

    Args:
        config: Server configuration (limits, queue defaults).
        state: The replicated state machine (read for status and validation).
        command_log: Where every change is proposed.
        hub: Consumers and in-flight deliveries.
        dispatcher: Wakes on credit and new consumers.
        clock: Cluster time for publish stamps (:class:`~.cluster_time.ClusterTime`).
        metrics: Where counters go.
        check_can_stamp: Raises when this node may not stamp now (its clock is not
            synchronized with the cluster); None: always may.
        space_alarm: The NO_SPACE alarm: while it is raised, writes are refused.
    """

    def __init__(
        self,
        config: Config,
        state: QueueState,
        command_log: CommandLog,
        hub: Hub,
        dispatcher: Dispatcher,
        clock: Clock,
        metrics: Metrics,
        space_alarm: SpaceAlarm | None = None,
        check_can_stamp: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self.space_alarm = space_alarm
        self._check_can_stamp = check_can_stamp
        self.state = state
        self.log = command_log
        self.hub = hub
        self.dispatcher = dispatcher
        self.clock = clock
        self.metrics = metrics
        self.limits = config.limits.request_limits()
        self.group_settings = config.queue.group_settings()
        """Defaults this node resolves into commands that create groups when it leads."""
        self.node_id = config.server.node_id
        self.started_s = clock.monotonic_s()
        self.ready = False
        self.shard: ShardRole | None = None
        self.client_address = config.server.advertise or config.server.listen
        """This node's client address as announced (set to the bound one at start)."""
        """Which shard of a sharded node this broker is (``docs/sharding.md``); None in
        a node of one shard."""
        self.node_view: NodeView | None = None
        """On shard 0 of a sharded node: the other shards, whose overviews WATCH merges."""
        self.stopping = False
        self._last_stamp_ms = state.last_publish_ms
        self._stamp_slack_ms = config.cluster.max_clock_offset_ms
        """How far an earlier stamp may stand ahead of cluster time and still be kept
        as the floor of the next (ms): the bound of cluster time."""
        self._floor_warned = 0
        """The stamp floor last reported as too far ahead (once each)."""
        self._background_send, self._background_receive = trio.open_memory_channel[
            tuple[bytes, list[GroupKey], request_order.Turn]
        ](1024)
        self._groups_reserved: Tally[GroupKey] = Tally()
        """Groups that proposals in flight will create, each counted once per proposal:
        ``(topic, None)`` for a topic's implicit group, ``(topic, group)`` for a named
        one. The leader checks ``limits.max_groups`` before it proposes, so without
        these every request pipelined behind the one that reaches the limit would see
        the same count and pass too (a breaker made 516 groups under a limit of 5)."""
        self._adopting: dict[str, Tally[str]] = {}
        """Topic -> names in flight to adopt its implicit group (one name at a time is
        taken for the adopter; see
        :func:`~futureq.broker.group_reservations.reserve_group`)."""
        self._background_bytes = 0
        """Bytes of the commands waiting in the background publisher's queue."""
        self.subscribes_in_flight = 0
        """SUBSCRIBEs between their limit check and their consumer's registration (the
        group's creation is awaited in between); counted against
        ``limits.max_subscriptions`` like the subscriptions they become."""
        self.handed_ask: HandedAsk | None = None
        """The subscriptions this leader, handing over, asked what was handed (HANDOVER)
        and still waits for; None otherwise (:mod:`~futureq.broker.handover_handed`)."""
        self.reschedules_in_flight = 0
        """RESCHEDULEs proposed and not yet answered. While there are some, an ACK is
        proposed as ACK_FOLLOWING (:func:`futureq.state.commands.ack`): one of them may
        move an entry the ACK names before the ACK commits."""
        self._reschedules_unanswered = 0
        """RESCHEDULEs that ended without an answer (their client left, the proposal
        failed): each may still be in the log and commit later, so settlements follow
        until one proposed after it has applied (:meth:`settlements_follow`)."""
        self._reschedules_passed = 0
        """How many of ``_reschedules_unanswered`` an applied settlement has passed."""
        self.redriving: dict[bytes, trio.Event] = {}
        """Schedule keys (of dead letters) a REDRIVE being committed names -> set once it
        is answered. An ACK of one of them waits for it (:func:`~futureq.broker.
        consumer_requests.ack`)."""
        self.redrives_unanswered: set[bytes] = set()
        """Keys of REDRIVEs that ended unanswered (cancelled with their connection, or
        failed): each may still be in the log and commit later."""
        self._promote_send, self._promote_receive = trio.open_memory_channel[int](16)
        self.leader_epoch = 0
        self.leading = False
        """The role of the last :meth:`leadership_changed` (it bumps ``leader_epoch``)."""
        self._epoch_changed = trio.Event()
        metrics.set_group_counts_provider(self.group_counts)
        # Counted where subscriptions live, so one the server ends (group deleted,
        # leadership lost) never leaves the gauge behind.
        metrics.subscriptions.set_function(lambda: len(hub.consumers))
        metrics.deliveries_out.set_function(lambda: len(hub.in_flight))
        self.activity = ActivityHistory(metrics)
        """Per-second activity for the overview; sampled by ``activity.run``."""
        self.due_buckets = DueBuckets()
        """Pending by due time for the overview; computed by ``due_buckets.run``."""
        self.data_dir_bytes: int | None = None
        """Size of the data directory as last measured (bytes); None before that."""
        self._overview: tuple[float, dict[str, Any]] | None = None

    # ------------------------------------------------------------ leadership

    def leadership_changed(self, is_leader: bool) -> None:
        """Start or stop dispatching; every client connection is closed so that clients
        reconnect and follow the new leader (``DESIGN.md``, "Followers redirect")."""
        if is_leader:
            self.dispatcher.activate()
        else:
            self.dispatcher.deactivate()
        self.metrics.is_leader.set(1 if is_leader else 0)
        # Deliveries of the earlier leadership are void, so no ACK can name these.
        self.redrives_unanswered.clear()
        self.leading = is_leader
        self.leader_epoch += 1
        self._epoch_changed.set()
        self._epoch_changed = trio.Event()

    def reschedule_unanswered(self) -> None:
        """A RESCHEDULE ended without its answer (cancelled with its connection, or its
        proposal failed): it may be in the log all the same, so settlements follow
        until one proposed after it has applied (:meth:`settlements_follow`)."""
        self._reschedules_unanswered += 1

    def settlements_follow(self) -> tuple[bool, int]:
        """Whether a settlement proposed now must be a *_FOLLOWING command, and a mark
        to hand to :meth:`settlement_applied` once it has applied.

        True while a RESCHEDULE is being committed, or one ended unanswered and no
        settlement proposed after it has applied yet: such a RESCHEDULE may commit
        between the settlement's claim and its commit and move the entry it names.
        Found by a tester: a client that sent a RESCHEDULE and closed its connection
        (the request cancelled, its proposal still queued) left the ACKs taken next
        plain; the RESCHEDULE committed first, the ACK removed nothing, was answered
        OK, and the message was delivered again at its new time.
        """
        mark = self._reschedules_unanswered
        return self.reschedules_in_flight > 0 or mark > self._reschedules_passed, mark

    def settlement_applied(self, mark: int) -> None:
        """A settlement proposed with ``mark`` (:meth:`settlements_follow`) has applied:
        every entry proposed before it has applied too (proposals apply in the order
        they were made), so the RESCHEDULEs unanswered by then are settled."""
        self._reschedules_passed = max(self._reschedules_passed, mark)

    async def wait_leadership_change(self, epoch: int) -> None:
        """Return once leadership changed after ``epoch`` (a ``leader_epoch`` value)."""
        while self.leader_epoch == epoch:
            await self._epoch_changed.wait()

    # ------------------------------------------------------------ publish

    def _require_leader(self) -> None:
        if not self.log.is_leader():
            raise NotLeaderError(self.log.leader_address())

    def stamp(self) -> int:
        """The leader's stamp for a command: cluster time, never below an earlier one
        (ms since the Unix epoch).

        Raises:
            RequestError: CLOCK_NOT_SYNCHRONIZED.
        """
        return publishing.stamp(self)

    @property
    def due_counts(self) -> DueCounts:
        """The node's due-time histograms (BROWSE_COUNTS), fed by the dispatcher."""
        return self.dispatcher.due_counts

    async def browse_json(self, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """``/api/browse`` (see :func:`futureq.broker.manage.browse_json`)."""
        from futureq.broker import manage

        return await manage.browse_json(self, query)

    async def browse_counts_json(self, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """``/api/browse/counts`` (see :func:`futureq.broker.manage.browse_counts_json`)."""
        from futureq.broker import manage

        return await manage.browse_counts_json(self, query)

    def require_leader(self) -> None:
        """Refuse a request this node cannot serve unless it leads.

        Raises:
            NotLeaderError: with the leader's address (None while none is known).
        """
        self._require_leader()

    def _require_space(self) -> None:
        """Refuse a write that adds data while the disk is full (NO_SPACE)."""
        if self.space_alarm is not None and self.space_alarm.raised:
            raise no_space_error()

    def alarms(self) -> list[str]:
        """Raised alarms: ``["NO_SPACE"]`` while the disk is full, else empty."""
        if self.space_alarm is not None and self.space_alarm.raised:
            return ["NO_SPACE"]
        return []

    async def publish(
        self, items: list[Any], ack_level: frames.AckLevel
    ) -> tuple[int | None, int, dict[int, int] | None]:
        """Validate and publish a batch.

        Args:
            items: Raw PUBLISH items (see :func:`futureq.wire.validation.validate_publish_items`).
            ack_level: When to answer (NONE: after validation; LEADER/QUORUM: after commit).

        Returns:
            ``(first_id, count, duplicates)``; ``first_id`` is None for ack level NONE;
            ``duplicates`` maps the position of each item whose idempotency key still
            named a message to that message's id (nothing was stored for it), or is
            None.

        Raises:
            RequestError: a bad item (with its index) or UNAVAILABLE; nothing is written.
            NotLeaderError: this node is not the leader.

        See :func:`~futureq.broker.publishing.publish`.
        """
        return await publishing.publish(self, items, ack_level)

    # ------------------------------------------------------------ cluster

    def cluster_status(self) -> dict[str, Any]:
        """The CLUSTER_STATUS_OK map: this node's view of membership, term and progress.

        See :func:`~futureq.broker.membership.cluster_status`.
        """
        return membership.cluster_status(self)

    async def add_node(self, node_id: int, raft_address: str, client_address: str) -> None:
        """Record the node's addresses, add it as a learner, promote it once caught up;
        for a voter whose addresses the cluster recorded, record the new ones only.

        Raises:
            RequestError: INVALID_ARGUMENT (single node, bad address, id in use).
            NotLeaderError: this node is not the leader.

        See :func:`~futureq.broker.membership.add_node`.
        """
        await membership.add_node(self, node_id, raft_address, client_address)

    async def remove_node(self, node_id: int) -> None:
        """Remove a node (the leader steps down after the change commits).

        Raises:
            RequestError: INVALID_ARGUMENT (single node, unknown node).
            NotLeaderError: this node is not the leader.

        See :func:`~futureq.broker.membership.remove_node`.
        """
        await membership.remove_node(self, node_id)

    async def transfer_leadership(self, node_id: int | None) -> None:
        """Hand leadership to ``node_id`` (None: the most up-to-date voter).

        Raises:
            RequestError: INVALID_ARGUMENT, TIMEOUT.
            NotLeaderError: this node is not the leader.

        See :func:`~futureq.broker.membership.transfer_leadership`.
        """
        await membership.transfer_leadership(self, node_id)

    async def hold_and_record_deliveries(self) -> None:
        """Before this leader hands over (shutdown, transfer): stop handing out and make
        the attempts of first deliveries out or given back durable, so they count on the
        next leader or after a restart (``docs/protocol.md``, UNSUBSCRIBE). Best effort:
        a log that refuses (leadership already lost) is logged, not raised, and so is one
        that has not committed them within :data:`RECORD_BEFORE_HANDOVER_S`.

        See :func:`~futureq.broker.membership.hold_and_record_deliveries`.
        """
        await membership.hold_and_record_deliveries(self)

    async def run_promoter(self) -> None:
        """Promote learners to voters once they have caught up (thesis §4.2.1).

        See :func:`~futureq.broker.membership.run_promoter`.
        """
        await membership.run_promoter(self)

    async def run_background_publisher(self) -> None:
        """Commit ack-level-NONE publishes in the background, in arrival order.

        See :func:`~futureq.broker.publishing.run_background_publisher`.
        """
        await publishing.run_background_publisher(self)

    # ------------------------------------------------------------ groups

    async def ensure_group(
        self,
        topic: str,
        group: str,
        visibility_timeout_ms: int | None = None,
        max_deliveries: int | None = None,
        from_backlog: bool = False,
        dead_letter_expired: bool | None = None,
    ) -> GroupInfo:
        """Create (or adopt, or update) a consumer group through the log.

        Raises:
            RequestError: INVALID_TOPIC, INVALID_GROUP, INVALID_ARGUMENT (a setting out
                of range; ``dead_letter_expired`` on a dead-letter topic).

        See :func:`~futureq.broker.group_requests.ensure_group`.
        """
        info, _ = await self.create_group(
            topic, group, visibility_timeout_ms, max_deliveries, from_backlog, dead_letter_expired
        )
        return info

    async def create_group(
        self,
        topic: str,
        group: str,
        visibility_timeout_ms: int | None = None,
        max_deliveries: int | None = None,
        from_backlog: bool = False,
        dead_letter_expired: bool | None = None,
    ) -> tuple[GroupInfo, frames.GroupCreated]:
        """:meth:`ensure_group` for GROUP_CREATE: also what it did (created, adopted,
        updated, unchanged; from the backlog or not), the answer's ``result``.

        Raises: as :meth:`ensure_group`.
        """
        return await group_requests.ensure_group(
            self,
            topic,
            group,
            visibility_timeout_ms,
            max_deliveries,
            from_backlog,
            dead_letter_expired,
        )

    async def delete_group(self, topic: str, group: str) -> None:
        """Delete a group and its pending entries.

        Raises:
            RequestError: UNKNOWN_GROUP.

        See :func:`~futureq.broker.group_requests.delete_group`.
        """
        await group_requests.delete_group(self, topic, group)

    # ------------------------------------------------------------ consumers

    async def subscribe(
        self,
        connection_id: int,
        outbox: Outbox,
        topic: str,
        group: str,
        prefetch: int,
        headers: bool = False,
        *,
        protocol_version: int = frames.PROTOCOL_VERSION,
    ) -> Consumer:
        """Join ``group`` of ``topic`` (creating the group if new) with ``prefetch`` credit.

        At most ``limits.max_prefetch`` of its deliveries are out at once, whatever
        credit it holds. ``protocol_version``: the connection's; below 5 (whose
        HELLO_OK does not name the limit) a window past ``limits.max_prefetch`` is taken
        as credit (:func:`~futureq.broker.consumer_requests.most_window`).

        Raises:
            RequestError: INVALID_TOPIC, INVALID_GROUP, INVALID_ARGUMENT (prefetch).

        See :func:`~futureq.broker.consumer_requests.subscribe`.
        """
        return await consumer_requests.subscribe(
            self, connection_id, outbox, topic, group, prefetch, headers, protocol_version
        )

    def announce_settings(self, consumer: Consumer) -> None:
        """Send a new subscription its group's settings (SUBSCRIPTION_INFO), after
        SUBSCRIBE_OK and before any DELIVER."""
        info = self.state.groups.get(consumer.group_id)
        if info is not None:
            self.hub.send_settings(consumer, info)

    def unsubscribe(self, consumer: Consumer, keep: frozenset[bytes] = frozenset()) -> None:
        """Leave; unacked deliveries go back to the group (each counts as an attempt),
        but those whose tag is in ``keep``, which stay out (still settleable on their
        connection) until settled or timed out (see :meth:`Hub.remove_consumer`)."""
        if consumer.closed and consumer.subscription_id not in self.hub.consumers:
            return
        self.hub.remove_consumer(consumer, self.clock.wall_ms(), keep=keep)
        self.dispatcher.kick()

    def subscription_lost(self, consumer: Consumer) -> None:
        """The connection of ``consumer`` closed: leave as :meth:`unsubscribe` does (its
        deliveries out count), and a leader handing over stops waiting for its answer
        to HANDOVER (it waited the whole ``HANDED_WAIT_S`` for a client that had gone)."""
        self.unsubscribe(consumer)
        if self.handed_ask is not None:
            self.handed_ask.left(consumer)

    async def unsubscribe_handed(self, consumer: Consumer, handed: list[bytes] | None) -> None:
        """Leave as UNSUBSCRIBE with ``handed`` does (protocol version 3): only the
        deliveries named in ``handed`` (tags the application received and has not
        settled) count as an attempt; the subscription's other unsettled deliveries
        are released (due again at once, uncounted; durable on return). Tags it does
        not hold are ignored. None: all count, as :meth:`unsubscribe`.

        Never raises for the release: if it cannot be committed (leadership lost),
        they go back counted and that is logged; the subscription has ended either way.

        See :func:`~futureq.broker.consumer_requests.unsubscribe`.
        """
        await consumer_requests.unsubscribe(self, consumer, handed)

    def wake_all_consumers(self) -> None:
        """Buffers have room again: let the dispatcher look at every group with consumers."""
        for consumer in self.hub.consumers.values():
            self.hub.wake(consumer)
        self.dispatcher.kick()

    def grant_credit(self, connection_id: int, subscription_id: int, credit: int) -> None:
        """Add credit to a subscription and wake the dispatcher.

        The credit is kept whole, past ``limits.max_prefetch`` too, up to
        :data:`~futureq.wire.validation.MAX_CREDIT` held: ``limits.max_prefetch`` bounds
        the deliveries the subscription has out at once (credit past it is used as
        settlements free room), as ``max_prefetch_per_connection`` and
        ``max_deliveries_out`` bound them per connection and per node.

        Raises:
            RequestError: UNKNOWN_SUBSCRIPTION or INVALID_ARGUMENT (credit < 1, or
                past :data:`~futureq.wire.validation.MAX_CREDIT` held).
        """
        self.hub.grant_credit(subscription_id, connection_id, credit, validation.MAX_CREDIT)
        self.dispatcher.kick()

    async def release(
        self, connection_id: int, tags: list[bytes], may_settle: SettleCheck | None = None
    ) -> int:
        """Give deliveries back unprocessed: due again at once, their attempt not counted
        towards ``max_deliveries``. Durable on return. ``may_settle``: asked before a delivery an earlier leader handed over is settled
        (any connection may settle it by its tag; the check refuses one that may not
        consume from its topic: PERMISSION_DENIED); None: no check.

        Raises:
            RequestError: UNKNOWN_DELIVERY_TAG / FOREIGN_DELIVERY_TAG (first bad index).

        See :func:`~futureq.broker.consumer_requests.release`.
        """
        return await consumer_requests.release(self, connection_id, tags, may_settle)

    def extend(
        self,
        connection_id: int,
        tags: list[bytes],
        visibility_ms: int,
        may_settle: SettleCheck | None = None,
    ) -> int:
        """Keep deliveries: each is visible again ``visibility_ms`` after now (leader-local).
        ``may_settle``: asked before a delivery an earlier leader handed over is settled
        (any connection may settle it by its tag; the check refuses one that may not
        consume from its topic: PERMISSION_DENIED); None: no check.

        Raises:
            RequestError: UNKNOWN_DELIVERY_TAG / FOREIGN_DELIVERY_TAG (first bad index),
                INVALID_ARGUMENT (``visibility_ms`` outside 1 .. 12 h), IMPLAUSIBLE_TIME
                (1 .. 99 ms: seconds taken for milliseconds).

        See :func:`~futureq.broker.consumer_requests.extend`.
        """
        return consumer_requests.extend(self, connection_id, tags, visibility_ms, may_settle)

    async def ack(
        self, connection_id: int, tags: list[bytes], may_settle: SettleCheck | None = None
    ) -> int:
        """Acknowledge deliveries; returns how many were removed. Durable on return.
        ``may_settle``: asked before a delivery an earlier leader handed over is settled
        (any connection may settle it by its tag; the check refuses one that may not
        consume from its topic: PERMISSION_DENIED); None: no check.

        Raises:
            RequestError: UNKNOWN_DELIVERY_TAG / FOREIGN_DELIVERY_TAG (first bad index).

        See :func:`~futureq.broker.consumer_requests.ack`.
        """
        return await consumer_requests.ack(self, connection_id, tags, may_settle)

    async def nack(
        self,
        connection_id: int,
        tags: list[bytes],
        requeue_delay_ms: int,
        reason: str | None = None,
        dead_letter: bool = False,
        may_settle: SettleCheck | None = None,
    ) -> int:
        """Refuse deliveries; each is due again after ``requeue_delay_ms`` (>= 0), or goes
        to its dead-letter topic now with ``dead_letter`` (reason ``rejected``).
        ``reason`` is kept with each entry (its dead letter's ``futureq-reason-text``).
        ``may_settle``: asked before a delivery an earlier leader handed over is settled
        (any connection may settle it by its tag; the check refuses one that may not
        consume from its topic: PERMISSION_DENIED); None: no check.

        Raises:
            RequestError: INVALID_DELAY, UNKNOWN_DELIVERY_TAG, FOREIGN_DELIVERY_TAG,
                INVALID_ARGUMENT (a reason over
                :data:`~futureq.broker.consumer_requests.MAX_NACK_REASON_BYTES`).

        See :func:`~futureq.broker.consumer_requests.nack`.
        """
        return await consumer_requests.nack(
            self, connection_id, tags, requeue_delay_ms, reason, dead_letter, may_settle
        )

    # ------------------------------------------------------------ status

    def clock_status(self) -> dict[str, Any] | None:
        """This node's view of cluster time (``docs/operations.md``, "Status"), or None
        when it runs on a plain clock (tests).

        See :func:`~futureq.broker.node_status.clock_status`.
        """
        return node_status.clock_status(self)

    def group_counts(self) -> list[GroupCounts]:
        """Per-group pending / due / in-flight / consumers, for the state gauges.

        See :func:`~futureq.broker.node_status.group_counts`.
        """
        return node_status.group_counts(self)

    def overview(self) -> dict[str, Any]:
        """The WATCH_UPDATE map and the dashboard's data (``docs/protocol.md``,
        "WATCH_UPDATE"); see :func:`~futureq.broker.overview.build_overview`. On shard 0
        of a sharded node, every shard's (``futureq.shards.view``)."""
        local = self.local_overview()
        if self.node_view is not None:
            return self.node_view.merged_overview(local)
        return local

    def local_overview(self) -> dict[str, Any]:
        """This process's own overview (one shard of a sharded node)."""
        now_s = self.clock.monotonic_s()
        cached = self._overview
        if cached is not None and now_s - cached[0] < OVERVIEW_CACHE_S:
            return cached[1]
        overview = build_overview(self, self.activity, data_dir_bytes=self.data_dir_bytes)
        self._overview = (now_s, overview)
        return overview

    def record_data_dir_bytes(self, size: int) -> None:
        """A new measurement of the data directory (bytes), for the overview and metrics."""
        self.data_dir_bytes = size
        self.metrics.data_dir_bytes.set(size)

    def group_row(self, info: GroupInfo, now_ms: int) -> GroupCounts:
        """One group's counts now (due and oldest-due age read from memory, or a
        bounded disk scan: :meth:`Dispatcher.due_count`)."""
        return node_status.group_row(self, info, now_ms)

    def status(self, visible: Callable[[str], bool] | None = None) -> dict[str, Any]:
        """The STATUS_OK map (``docs/protocol.md``, "STATUS").

        Args:
            visible: Lists only topics for which this returns True (a client without
                the ``monitor`` permission sees the topics its patterns name); the
                totals then count only those listed. None: every topic.

        See :func:`~futureq.broker.node_status.status`.
        """
        return node_status.status(self, visible)

    async def status_async(self, visible: Callable[[str], bool] | None = None) -> dict[str, Any]:
        """:meth:`status`, yielding to the event loop every :data:`STATUS_STEP_TOPICS`
        topics looked at (a filtered status may look at every topic).

        See :func:`~futureq.broker.node_status.status_async`.
        """
        return await node_status.status_async(self, visible)

    def status_steps(
        self, visible: Callable[[str], bool] | None = None
    ) -> Generator[None, None, dict[str, Any]]:
        """:meth:`status` as a generator that yields every few hundred topics looked at.

        See :func:`~futureq.broker.node_status.status_steps`.
        """
        return node_status.status_steps(self, visible)

    def is_ready(self) -> bool:
        """Serving: listeners up, a leader known and applied up to, not shutting down."""
        return self.ready and not self.stopping and self.log.ready_for_clients()

    def is_healthy(self) -> bool:
        """The process is up and serving (false once shutdown begins)."""
        return not self.stopping
