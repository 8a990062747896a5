"""Broker: what a client request turns into — proposals, subscriptions, acks, status.

The gateway calls these methods for one connection's requests. Publishing stamps the
leader's cluster time (``docs/architecture.md``, "Time"; never below the largest stamp
committed, so it is monotonic across leaders too), validates the batch, and proposes
one PUBLISH command; ack levels decide when it answers.

Source: ``DESIGN.md``, "Data flow" and "Message semantics"; ``docs/protocol.md``.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter as Tally
from collections.abc import Callable, Generator, Iterable
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import trio

from futureq import __version__
from futureq.config import WILDCARD_HOSTS, split_host_port
from futureq.errors import ErrorCode, FutureQError, NotLeaderError, RequestError
from futureq.metrics import OTHER, GroupCounts
from futureq.state import commands
from futureq.state.queue_state import PublishResult
from futureq.wire import frames, validation

from .cluster_time import ClusterTime
from .command_log import SingleNodeLog, no_space_error
from .hub import Consumer, Hub, Outbox
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

log = logging.getLogger(__name__)

BACKGROUND_QUEUE_BYTES = 64 * 1024 * 1024
"""Most bytes of ack-level-NONE publishes waiting to be proposed (and at most 1,024 of
them); past either, such a publish is refused UNAVAILABLE. One command is always taken
when none waits, whatever its size (up to ``limits.max_frame_bytes``)."""

_GroupKey = tuple[str, "str | None"]
"""A group a proposal in flight will create: ``(topic, None)`` for a topic's implicit
group, ``(topic, group)`` for a named one."""
_TOPIC = itemgetter(0)


def _only_topic(validated: list[validation.ValidItem]) -> str | None:
    """The topic every item of a (non-empty) batch names, or None when it names several
    (once per PUBLISH: the group reservation and the published count both ask)."""
    first: str = validated[0][0]
    if len(validated) == 1 or first == validated[-1][0] and len(set(map(_TOPIC, validated))) == 1:
        return first
    return None


MAX_NACK_REASON_BYTES = 256
"""Longest NACK reason text (UTF-8 bytes): it is stored with the entry and in headers."""

STATUS_STEP_TOPICS = 500
"""Topics a status looks at between two yields to the event loop."""
PROMOTE_TIMEOUT_S = 600
RECORD_BEFORE_HANDOVER_S = 5.0
"""Longest a leader handing over (shutdown, transfer, balancing) waits to record the
attempts of its first deliveries out (s): a log that cannot commit (no quorum) fails
its proposals within an election timeout or two (check-quorum), so this bounds only
what should not happen; past it the handover goes on without them."""
PROMOTE_LAG_ENTRIES = 64
"""A learner this close to the commit index is promoted to voter (entries)."""


STATUS_LEADER_ONLY = ("due", "in_flight", "consumers")
"""STATUS group fields only the leader knows (``docs/protocol.md``, "STATUS_OK")."""
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
            tuple[bytes, list[_GroupKey]]
        ](1024)
        self._groups_reserved: Tally[_GroupKey] = Tally()
        """Groups that proposals in flight will create, each counted once per proposal:
        ``(topic, None)`` for a topic's implicit group, ``(topic, group)`` for a named
        one. The leader checks ``limits.max_groups`` before it proposes, so without
        these every request pipelined behind the one that reaches the limit would see
        the same count and pass too (a breaker made 516 groups under a limit of 5)."""
        self._adopting: dict[str, Tally[str]] = {}
        """Topic -> names in flight to adopt its implicit group (one name at a time is
        taken for the adopter; see :meth:`_reserve_group`)."""
        self._background_bytes = 0
        """Bytes of the commands waiting in the background publisher's queue."""
        self.subscribes_in_flight = 0
        """SUBSCRIBEs between their limit check and their consumer's registration (the
        group's creation is awaited in between); counted against
        ``limits.max_subscriptions`` like the subscriptions they become."""
        self._promote_send, self._promote_receive = trio.open_memory_channel[int](16)
        self.leader_epoch = 0
        self.leading = False
        """The role of the last :meth:`leadership_changed` (it bumps ``leader_epoch``)."""
        self._epoch_changed = trio.Event()
        metrics.set_group_counts_provider(self.group_counts)
        # Counted where subscriptions live, so one the server ends (group deleted,
        # leadership lost) never leaves the gauge behind.
        metrics.subscriptions.set_function(lambda: len(hub.consumers))
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
        self.leading = is_leader
        self.leader_epoch += 1
        self._epoch_changed.set()
        self._epoch_changed = trio.Event()

    async def wait_leadership_change(self, epoch: int) -> None:
        """Return once leadership changed after ``epoch`` (a ``leader_epoch`` value)."""
        while self.leader_epoch == epoch:
            await self._epoch_changed.wait()

    # ------------------------------------------------------------ publish

    def _stamp(self) -> int:
        """The publish time: cluster time, never below an earlier stamp (ms), unless that
        stamp is further ahead of cluster time than its bound (``max_clock_offset_ms``).

        Nodes in bound are within the bound of each other, so a new leader's cluster
        time can be behind its predecessor's stamps by that much, and is lifted to them.
        A stamp further ahead was made on a wrong clock (a single node restarted to
        adopt a corrected clock, as its step notice says; a node that stamped on its own
        bad clock): kept as the floor, it delayed every later publish by the old error
        for good. It is then logged once and left behind: nothing is released earlier
        by it (a due time is the stamp plus the delay, released by cluster time).

        Raises:
            RequestError: CLOCK_NOT_SYNCHRONIZED when this node's clock is not in
                agreement with the cluster (TigerBeetle's rule: never stamp with a time
                the replicas do not agree on).
        """
        if self._check_can_stamp is not None:
            self._check_can_stamp()
        now_ms = self.clock.wall_ms()
        floor = max(self._last_stamp_ms, self.state.last_publish_ms)
        if floor > now_ms:
            if floor - now_ms <= self._stamp_slack_ms:
                now_ms = floor
            elif floor != self._floor_warned:
                self._floor_warned = floor
                log.warning(
                    "an earlier publish stamp (%d) is %.3f s ahead of cluster time, more "
                    "than cluster.max_clock_offset_ms=%d: it was made on a wrong clock; "
                    "new publishes are stamped on cluster time (messages stamped then "
                    "stay due as stamped)",
                    floor,
                    (floor - now_ms) / 1000,
                    self._stamp_slack_ms,
                )
        self._last_stamp_ms = now_ms
        return now_ms

    def _require_leader(self) -> None:
        if not self.log.is_leader():
            raise NotLeaderError(self.log.leader_address())

    def stamp(self) -> int:
        """The leader's stamp for a command: cluster time, never below an earlier one
        (ms since the Unix epoch).

        Raises:
            RequestError: CLOCK_NOT_SYNCHRONIZED.
        """
        return self._stamp()

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
        """
        self._require_leader()
        self._require_space()
        started = trio.current_time()
        publish_ms = self._stamp()
        validated: list[validation.ValidItem] = []
        for _ in validation.validate_publish_items_in_steps(
            items, self.limits, publish_ms, validated
        ):
            await trio.lowlevel.checkpoint()  # a 10,000-item batch must not hold the loop
        only = _only_topic(validated)
        reserved = self._reserve_new_groups(validated, only)
        try:
            return await self._publish_validated(
                validated, only, ack_level, publish_ms, started, reserved
            )
        finally:
            if reserved:
                self._release_groups(reserved)

    async def _publish_validated(
        self,
        validated: list[validation.ValidItem],
        only: str | None,
        ack_level: frames.AckLevel,
        publish_ms: int,
        started: float,
        reserved: list[_GroupKey],
    ) -> tuple[int | None, int, dict[int, int] | None]:
        """The rest of :meth:`publish`, once the batch is valid and its new groups are
        reserved (``reserved``; an ack-level-NONE batch takes them into the background
        publisher, which releases them once it has proposed). ``only``: the topic of
        every item, or None (:func:`_only_topic`)."""
        # Only items with headers or a key have more than 4 fields: one C-speed pass
        # decides for the common batch.
        keyed = max(map(len, validated)) > 4 and any(
            len(item) > 5 and item[5] is not None for item in validated
        )
        command_list = commands.publish_command(
            publish_ms,
            validated,
            self.group_settings,
            self.config.queue.idempotency_window_ms if keyed else 0,
        )
        command = commands.encode(command_list)
        # This node applies the list it was given (no decode of what was just encoded);
        # Raft followers decode the bytes.
        single = self.log if isinstance(self.log, SingleNodeLog) else None
        if ack_level == frames.AckLevel.LEADER and not keyed:
            if single is not None:
                index = await single.propose_durable(command, command_list)
            else:
                index = await self.log.propose_durable(command)
            self.metrics.publish_commit_seconds.observe(trio.current_time() - started)
            self._count_published(validated, only)
            return commands.message_id(index, 0), len(validated), None
        if ack_level == frames.AckLevel.NONE:
            queued = self._background_bytes
            try:
                if queued and queued + len(command) > BACKGROUND_QUEUE_BYTES:
                    raise trio.WouldBlock
                self._background_send.send_nowait((command, reserved[:]))
            except trio.WouldBlock:
                raise RequestError(
                    ErrorCode.UNAVAILABLE,
                    "too many unacknowledged publishes are queued; use ack level leader or quorum, or retry",
                ) from None
            self._background_bytes = queued + len(command)
            reserved.clear()  # the background publisher releases them once proposed
            self._count_published(validated, only)
            return None, len(validated), None
        # Idempotency keys need the apply result (which items were duplicates), so a
        # keyed batch at ack level LEADER waits for its commit like QUORUM.
        result = await self.log.propose(command, command_list)
        self.metrics.publish_commit_seconds.observe(trio.current_time() - started)
        self._count_published(validated, only)
        if isinstance(result, PublishResult):
            return result.first_id, len(validated), result.duplicates
        return int(result), len(validated), None

    def _count_published(self, validated: list[validation.ValidItem], only: str | None) -> None:
        # One label lookup per distinct topic; topics past the series budget share one.
        metrics = self.metrics
        if only is not None:
            label = metrics.topic_label(only)
            metrics.published_messages_total.labels(label).inc(len(validated))
            return
        counts: Tally[str] = Tally()
        for topic, count in Tally(item[0] for item in validated).items():
            counts[metrics.topic_label(topic)] += count
        for label, count in counts.items():
            metrics.published_messages_total.labels(label).inc(count)

    def _groups_coming(self, extra: Iterable[_GroupKey] = ()) -> int:
        """Most groups the proposals in flight (and ``extra``, keys about to be reserved)
        can create that the state does not hold yet, each group counted once.

        Counted per topic, as apply creates them (``futureq.state.group_changes.create_group``): a
        topic with no group gets one from its publishes *or* from the first name to
        commit, not both, so its implicit group counts only when no new name of it is in
        flight; a topic whose only group is implicit has it adopted by the first new
        name to commit (:attr:`_adopting` holds one such name; if none is there, one of
        the names reserved before the implicit group existed adopts it).
        """
        state = self.state
        by_topic: dict[str, set[str | None]] = {}
        for topic, group in itertools.chain(self._groups_reserved, extra):
            by_topic.setdefault(topic, set()).add(group)
        coming = 0
        for topic, names in by_topic.items():
            new_names = sum(
                1 for name in names if name is not None and state.find_group(topic, name) is None
            )
            held = state.topic_groups_count(topic)
            if not held:
                coming += max(new_names, 1 if None in names else 0)
            elif (
                held == 1 and state.topic_groups(topic)[0].implicit and topic not in self._adopting
            ):
                coming += max(new_names - 1, 0)
            else:
                coming += new_names
        return coming

    def _too_many_groups(self, what: str, position: int | None = None) -> RequestError:
        held = len(self.state.groups)
        coming = self._groups_coming()
        in_flight = f" and requests in flight are creating {coming} more" if coming else ""
        # On a sharded node the limit applies to each shard (docs/sharding.md).
        holder = "the cluster" if self.shard is None else f"shard {self.shard.index}"
        per = "" if self.shard is None else " per shard"
        return RequestError(
            ErrorCode.TOO_MANY_GROUPS,
            f"{what}: {holder} holds {held} groups{in_flight}, and the limit is "
            f"limits.max_groups = {self.config.limits.max_groups}{per}; delete unused groups "
            "first",
            position,
        )

    def _reserve_new_groups(
        self, validated: list[validation.ValidItem], only: str | None
    ) -> list[_GroupKey]:
        """Reserve the implicit groups a batch's new topics create; refuse the batch if
        they would take the group count past ``max_groups``. ``only``: the topic of
        every item, or None (:func:`_only_topic`).

        Returns:
            The keys reserved (release them with :meth:`_release_groups` once the
            batch is proposed or refused); empty when every topic exists.

        Raises:
            RequestError: TOO_MANY_GROUPS with the index of the first new topic too many.
        """
        state = self.state
        if only is not None and state.topic_groups_count(only):
            return []  # the common batch: one topic, known
        reserved = self._groups_reserved
        limit = self.config.limits.max_groups
        new: dict[str, int] = {}
        for position, item in enumerate(validated):
            topic = item[0]
            if topic not in new and not state.topic_groups_count(topic):
                new[topic] = position
        if not new:
            return []
        fresh = [topic for topic in new if (topic, None) not in reserved]
        # Each reserved key is at most one group: an upper bound, exact in the common case.
        room = limit - len(state.groups) - len(reserved)
        if len(fresh) > room:
            # A new topic that a name in flight already counts for adds no group: that
            # name or this batch makes it, not both (:meth:`_groups_coming`).
            coming_topics = {topic for topic, _ in reserved}
            adding = [topic for topic in fresh if topic not in coming_topics]
            room = limit - len(state.groups) - self._groups_coming()
            if len(adding) > room:
                topic = adding[max(room, 0)]
                raise self._too_many_groups(
                    f"this batch has {len(adding)} new topics, each a new group (the first "
                    f"one too many: {topic!r})",
                    new[topic],
                )
        keys: list[_GroupKey] = [(topic, None) for topic in new]
        reserved.update(keys)
        return keys

    def _reserve_group(self, topic: str, group: str) -> tuple[Tally[Any], _GroupKey] | None:
        """Reserve the group ``group`` of ``topic`` if creating it makes a new group, or
        its adoption of the topic's implicit group.

        Only the first name to commit adopts the implicit group; every other name in
        flight meanwhile makes a group of its own, so only one name per topic at a time
        is counted as adopting (a breaker's pipelined SUBSCRIBEs of 20 names per topic
        made 100 groups under a limit of 5 when each was taken for the adopter).

        Returns:
            ``(tally, key)`` to release with :meth:`_release_group` once proposed, or
            None when the group exists.

        Raises:
            RequestError: TOO_MANY_GROUPS.
        """
        state = self.state
        if state.find_group(topic, group) is not None:
            return None
        key: _GroupKey = (topic, group)
        groups = state.topic_groups(topic)
        if len(groups) == 1 and groups[0].implicit:
            names = self._adopting.setdefault(topic, Tally())
            if not names or group in names and len(names) == 1:
                names[group] += 1  # released names are deleted: none is at 0
                return names, key  # adopts the implicit group: no new group
            # Another name adopts it: this one makes a group of its own.
        if key not in self._groups_reserved:
            limit = self.config.limits.max_groups
            if len(state.groups) + self._groups_coming([key]) > limit:
                raise self._too_many_groups(f"group {group!r} of topic {topic!r} is new")
        self._groups_reserved[key] += 1
        return self._groups_reserved, key

    def _release_group(self, reserved: tuple[Tally[Any], _GroupKey]) -> None:
        tally, key = reserved
        if tally is self._groups_reserved:
            self._release_groups([key])
            return
        topic, group = key
        tally[group] -= 1
        if tally[group] <= 0:
            del tally[group]
            if not tally:
                self._adopting.pop(topic, None)

    def _release_groups(self, keys: list[_GroupKey]) -> None:
        reserved = self._groups_reserved
        for key in keys:
            reserved[key] -= 1
            if reserved[key] <= 0:
                del reserved[key]

    # ------------------------------------------------------------ cluster

    def _cluster(self) -> Any:
        if not hasattr(self.log, "add_learner"):
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT,
                "this node runs alone (no --peers or --join); start nodes as a cluster to change membership",
            )
        return self.log

    def cluster_status(self) -> dict[str, Any]:
        """The CLUSTER_STATUS_OK map: this node's view of membership, term and progress."""
        node = self.log
        if not hasattr(node, "membership"):
            view: dict[str, Any] = dict(node.cluster_status())  # type: ignore[attr-defined]
        else:
            voters, learners = node.membership()
            progress = node.progress()  # type: ignore[attr-defined]  # leader only
            commit_index = int(node.commit_index)  # type: ignore[attr-defined]
            role = node.role.value  # type: ignore[attr-defined]
            if self.node_id in learners:
                role = "learner"
            members = []
            for member in sorted(voters | learners):
                raft_address, client_address = node.member_addresses(member)  # type: ignore[attr-defined]
                entry: dict[str, Any] = {
                    "node_id": member,
                    "role": "learner" if member in learners else "voter",
                }
                if raft_address:
                    entry["raft_address"] = raft_address
                if client_address:
                    entry["client_address"] = client_address
                if member in progress:
                    entry["match_index"] = progress[member]["match"]
                    entry["lag"] = max(0, commit_index - progress[member]["match"])
                    entry["last_heard_ms"] = progress[member].get("last_heard_ms")
                    entry["recovering"] = progress[member]["recovering"]
                members.append(entry)
            view = {
                "role": role,
                "term": int(node.term),  # type: ignore[attr-defined]
                "leader_id": node.leader_id(),  # type: ignore[attr-defined]
                "leader_address": node.leader_address(),
                "commit_index": commit_index,
                "applied_index": node.applied_index,
                "voters": sorted(voters),
                "learners": sorted(learners),
                "nodes": members,
                "recovering": node.recovering(),  # type: ignore[attr-defined]
            }
        view["node_id"] = self.node_id
        view["cluster_id"] = self.config.cluster.cluster_id
        clock = self.clock_status()
        if clock is not None:
            view["clock"] = clock
            offsets = clock["offsets_ms"]
            for member in view.get("nodes", []):
                offset = offsets.get(str(member["node_id"]))
                if offset is not None:
                    member["clock_offset_ms"] = offset
        addresses = self.state.node_addresses
        for node in view.get("nodes", []):
            known = addresses.get(node["node_id"])
            if known is not None:
                node.setdefault("raft_address", known[0])
                node.setdefault("client_address", known[1])
        return view

    async def add_node(self, node_id: int, raft_address: str, client_address: str) -> None:
        """Record the node's addresses, add it as a learner, promote it once caught up.

        Raises:
            RequestError: INVALID_ARGUMENT (single node, bad address, id in use).
            NotLeaderError: this node is not the leader.
        """
        cluster = self._cluster()
        self._require_leader()
        if not 1 <= node_id <= commands.MAX_NODE_ID:
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT,
                f"node_id must be between 1 and {commands.MAX_NODE_ID}, got {node_id}",
            )
        for name, address in (("raft_address", raft_address), ("client_address", client_address)):
            try:
                host, port = split_host_port(address)
            except ValueError as exc:
                raise RequestError(ErrorCode.INVALID_ARGUMENT, f"{name}: {exc}") from None
            if host in WILDCARD_HOSTS:
                raise RequestError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"{name} {address!r} is a wildcard address that peers and clients cannot "
                    "reach; give the node's own HOST:PORT (its --advertise-raft or "
                    "--advertise-client)",
                )
            if port == 0:
                raise RequestError(
                    ErrorCode.INVALID_ARGUMENT, f"{name} {address!r} must name a real port, not 0"
                )
        voters, learners = cluster.membership()
        for member in sorted(voters | learners):
            if member == node_id:
                continue
            known = cluster.member_addresses(member)
            if raft_address in known or client_address in known:
                raise RequestError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"node {member} already uses {raft_address if raft_address in known else client_address}; "
                    "give the new node its own addresses",
                )
        if node_id in voters:
            raise RequestError(ErrorCode.INVALID_ARGUMENT, f"node {node_id} is already a voter")
        await self.log.propose(commands.node_address(node_id, raft_address, client_address))
        if node_id not in learners:
            await cluster.add_learner(node_id)
        try:
            self._promote_send.send_nowait(node_id)
        except trio.WouldBlock:
            raise RequestError(
                ErrorCode.UNAVAILABLE, "too many nodes waiting for promotion; retry"
            ) from None

    async def remove_node(self, node_id: int) -> None:
        """Remove a node (the leader steps down after the change commits).

        Raises:
            RequestError: INVALID_ARGUMENT (single node, unknown node).
            NotLeaderError: this node is not the leader.
        """
        cluster = self._cluster()
        self._require_leader()
        voters, learners = cluster.membership()
        if node_id not in voters and node_id not in learners:
            raise RequestError(ErrorCode.INVALID_ARGUMENT, f"node {node_id} is not a member")
        await cluster.remove_node(node_id)
        try:
            await self.log.propose(commands.node_address(node_id, None, None))
        except NotLeaderError:
            pass  # we removed ourselves; the next leader keeps the stale address harmlessly

    async def transfer_leadership(self, node_id: int | None) -> None:
        """Hand leadership to ``node_id`` (None: the most up-to-date voter).

        Raises:
            RequestError: INVALID_ARGUMENT, TIMEOUT.
            NotLeaderError: this node is not the leader.
        """
        cluster = self._cluster()
        self._require_leader()
        if node_id == self.node_id:
            return  # already the leader
        await self.hold_and_record_deliveries()
        try:
            await cluster.transfer_leadership(node_id)
        finally:
            self.dispatcher.resume()  # a follower now (nothing to resume), or still leader

    async def hold_and_record_deliveries(self) -> None:
        """Before this leader hands over (shutdown, transfer): stop handing out and make
        the attempts of first deliveries out or given back durable, so they count on the
        next leader or after a restart (``docs/protocol.md``, UNSUBSCRIBE). Best effort:
        a log that refuses (leadership already lost) is logged, not raised, and so is one
        that has not committed them within :data:`RECORD_BEFORE_HANDOVER_S`."""
        recorded = 0
        with trio.move_on_after(RECORD_BEFORE_HANDOVER_S) as waited:
            try:
                recorded = await self.dispatcher.hold_and_record()
            except FutureQError as exc:
                log.warning(
                    "could not record the first deliveries out before handing over: %s", exc
                )
                return
        if waited.cancelled_caught:
            log.warning(
                "the first deliveries out were not recorded within %g s (the log did not "
                "commit); handing over without them: their next delivery may repeat an "
                "attempt number",
                RECORD_BEFORE_HANDOVER_S,
            )
            return
        if recorded:
            log.info(
                "recorded the attempts of %d first deliveries out before handing over", recorded
            )

    async def run_promoter(self) -> None:
        """Promote learners to voters once they have caught up (thesis §4.2.1)."""
        async with self._promote_receive:
            async for node_id in self._promote_receive:
                cluster = self.log
                with trio.move_on_after(PROMOTE_TIMEOUT_S) as waited:
                    while True:
                        if not self.log.is_leader():
                            break
                        voters, learners = cluster.membership()  # type: ignore[attr-defined]
                        if node_id not in learners:
                            break
                        progress = cluster.progress().get(node_id)  # type: ignore[attr-defined]
                        commit = cluster.commit_index  # type: ignore[attr-defined]
                        if (
                            progress is not None
                            # Not before it answered: a learner never heard from has
                            # match 0, which a young log's commit index is within
                            # PROMOTE_LAG_ENTRIES of, and may still be recovering; as a
                            # voter it would leave a two-node cluster without a quorum.
                            and progress.get("answered", True)
                            and not progress.get("recovering", False)
                            and progress["match"] + PROMOTE_LAG_ENTRIES >= commit
                        ):
                            try:
                                await cluster.promote(node_id)  # type: ignore[attr-defined]
                                log.info("node %d caught up and is now a voter", node_id)
                            except FutureQError as exc:
                                log.warning("could not promote node %d: %s", node_id, exc)
                                await trio.sleep(0.5)
                                continue
                            break
                        await trio.sleep(0.1)
                if waited.cancelled_caught:
                    log.warning(
                        "node %d did not catch up within %d s; it stays a learner",
                        node_id,
                        PROMOTE_TIMEOUT_S,
                    )

    async def run_background_publisher(self) -> None:
        """Commit ack-level-NONE publishes in the background, in arrival order."""
        async with self._background_receive:
            async for command, reserved in self._background_receive:
                try:
                    await self.log.propose(command)
                except FutureQError as exc:
                    log.warning("an unacknowledged publish (ack level none) was lost: %s", exc)
                finally:
                    self._background_bytes -= len(command)
                    if reserved:
                        self._release_groups(reserved)

    # ------------------------------------------------------------ groups

    def _check_names(self, topic: str, group: str) -> None:
        """Names a client consumes from or manages: the grammar for anything new; names
        stored before the grammar existed stay usable where they exist.

        Raises:
            RequestError: INVALID_TOPIC, INVALID_GROUP.
        """
        state = self.state
        if state.find_group(topic, group) is not None:
            validation.check_legacy_name("topic", topic)
            validation.check_legacy_name("group", group)
            return
        if state.topic_groups_count(topic) or state.topic_groups_count(
            topic.removesuffix(validation.DLQ_SUFFIX)
        ):
            validation.check_legacy_name("topic", topic)  # an existing (or its dlq) topic
        else:
            validation.check_consumable_topic(topic)
        validation.check_name("group", group)

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

        A None setting keeps an existing group's value; a new group gets this node's
        configured default (``[queue]``), resolved here, by the leader, into the
        command (``DESIGN.md``, "Apply reads nothing node-local"). ``from_backlog``: a
        group this creates also gets every message of the topic still pending in its
        other groups, copied by BACKFILL_GROUP chunks in the background (an existing
        group is left as it is). ``dead_letter_expired``: an expired message goes to the
        dead-letter topic (reason ``expired``; on a dead-letter topic it is parked)
        instead of being dropped; None keeps the group's setting (new: off).

        Raises:
            RequestError: INVALID_TOPIC, INVALID_GROUP, INVALID_ARGUMENT (a setting out
                of range; ``dead_letter_expired`` on a dead-letter topic).
        """
        self._require_leader()
        self._check_names(topic, group)
        if visibility_timeout_ms is not None:
            # 1-99 first: IMPLAUSIBLE_TIME says what was probably meant (seconds).
            validation.check_visibility_timeout_ms(visibility_timeout_ms)
            if not (
                validation.MIN_VISIBILITY_TIMEOUT_MS
                <= visibility_timeout_ms
                <= validation.MAX_VISIBILITY_TIMEOUT_MS
            ):
                raise RequestError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"visibility_timeout_ms must be between {validation.MIN_VISIBILITY_TIMEOUT_MS}"
                    f" and {validation.MAX_VISIBILITY_TIMEOUT_MS} ms (12 h), got "
                    f"{visibility_timeout_ms}; send nil to keep the group's (or the default)",
                )
        if max_deliveries is not None and not 1 <= max_deliveries <= 1_000_000:
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT,
                f"max_deliveries must be between 1 and 1000000, got {max_deliveries}",
            )
        if dead_letter_expired and topic.endswith(validation.DLQ_SUFFIX):
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT,
                f"dead_letter_expired does nothing on the dead-letter topic {topic!r}: dead "
                "letters have no TTL, so none expires (one out of attempts is parked); "
                "leave it unset",
            )
        reserved = self._reserve_group(topic, group)
        try:
            return await self._create_or_update_group(
                topic,
                group,
                visibility_timeout_ms,
                max_deliveries,
                from_backlog,
                dead_letter_expired,
            )
        finally:
            if reserved is not None:
                self._release_group(reserved)

    async def _create_or_update_group(
        self,
        topic: str,
        group: str,
        visibility_timeout_ms: int | None,
        max_deliveries: int | None,
        from_backlog: bool,
        dead_letter_expired: bool | None,
    ) -> GroupInfo:
        """The proposal of :meth:`ensure_group`, once its new group (if any) is reserved."""
        info = self.state.find_group(topic, group)
        if (
            info is None
            or info.implicit
            or (
                visibility_timeout_ms is not None
                and visibility_timeout_ms != info.visibility_timeout_ms
            )
            or (max_deliveries is not None and max_deliveries != info.max_deliveries)
            or (dead_letter_expired is not None and dead_letter_expired != info.dead_letter_expired)
        ):
            self._require_space()
            await self.log.propose(
                commands.create_group(
                    topic,
                    group,
                    visibility_timeout_ms,
                    max_deliveries,
                    self.group_settings,
                    dead_letter_expired=dead_letter_expired,
                    from_backlog=from_backlog and info is None,
                )
            )
            info = self.state.find_group(topic, group)
        assert info is not None
        return info

    async def delete_group(self, topic: str, group: str) -> None:
        """Delete a group and its pending entries.

        Raises:
            RequestError: UNKNOWN_GROUP.
        """
        self._require_leader()
        self._check_names(topic, group)
        if self.state.find_group(topic, group) is None:
            raise RequestError(ErrorCode.UNKNOWN_GROUP, f"topic {topic!r} has no group {group!r}")
        await self.log.propose(commands.delete_group(topic, group))

    # ------------------------------------------------------------ consumers

    async def subscribe(
        self,
        connection_id: int,
        outbox: Outbox,
        topic: str,
        group: str,
        prefetch: int,
        headers: bool = False,
    ) -> Consumer:
        """Join ``group`` of ``topic`` (creating the group if new) with ``prefetch`` credit.

        ``headers``: its DELIVER items carry each message's headers.

        Raises:
            RequestError: INVALID_TOPIC, INVALID_GROUP, INVALID_ARGUMENT (prefetch).
        """
        max_prefetch = self.config.limits.max_prefetch
        if not 1 <= prefetch <= max_prefetch:
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT,
                f"prefetch must be between 1 and {max_prefetch}, got {prefetch}",
            )
        info = await self.ensure_group(topic, group)
        self._require_leader()
        if self.state.groups.get(info.group_id) is not info:
            # Deleted while we waited for the group's creation to commit.
            raise RequestError(
                ErrorCode.UNAVAILABLE, f"group {group!r} of topic {topic!r} is changing; retry"
            )
        consumer = Consumer(
            self.hub.new_subscription_id(),
            info.group_id,
            topic,
            group,
            connection_id,
            outbox,
            prefetch,
            prefetch=prefetch,
            headers=headers,
        )
        self.hub.add_consumer(consumer)
        self.dispatcher.kick()
        return consumer

    def announce_settings(self, consumer: Consumer) -> None:
        """Send a new subscription its group's settings (SUBSCRIPTION_INFO), after
        SUBSCRIBE_OK and before any DELIVER."""
        info = self.state.groups.get(consumer.group_id)
        if info is not None:
            self.hub.send_settings(consumer, info)

    def unsubscribe(self, consumer: Consumer) -> None:
        """Leave; unacked deliveries go back to the group (each counts as an attempt)."""
        if consumer.closed and consumer.subscription_id not in self.hub.consumers:
            return
        self.hub.remove_consumer(consumer, self.clock.wall_ms())
        self.dispatcher.kick()

    def wake_all_consumers(self) -> None:
        """Buffers have room again: let the dispatcher look at every group with consumers."""
        for consumer in self.hub.consumers.values():
            self.hub.wake(consumer)
        self.dispatcher.kick()

    def grant_credit(self, connection_id: int, subscription_id: int, credit: int) -> None:
        """Add credit to a subscription and wake the dispatcher.

        Raises:
            RequestError: UNKNOWN_SUBSCRIPTION or INVALID_ARGUMENT.
        """
        self.hub.grant_credit(
            subscription_id, connection_id, credit, self.config.limits.max_prefetch
        )
        self.dispatcher.kick()

    async def release(self, connection_id: int, tags: list[bytes]) -> int:
        """Give deliveries back unprocessed: due again at once, their attempt not counted
        towards ``max_deliveries``. Durable on return.

        Raises:
            RequestError: UNKNOWN_DELIVERY_TAG / FOREIGN_DELIVERY_TAG (first bad index).
        """
        self._require_leader()
        validation.check_tags(tags, self.limits)
        flights = self.hub.claim_tags(tags, connection_id)
        entries = [(flight.key, flight.attempt) for flight in flights]
        try:
            done = await self.log.propose(commands.release(entries))
        except BaseException:
            self.hub.unclaim(flights, self.clock.wall_ms())
            raise
        return int(done)

    def extend(self, connection_id: int, tags: list[bytes], visibility_ms: int) -> int:
        """Keep deliveries: each is visible again ``visibility_ms`` after now (leader-local).

        Raises:
            RequestError: UNKNOWN_DELIVERY_TAG / FOREIGN_DELIVERY_TAG (first bad index),
                INVALID_ARGUMENT (``visibility_ms`` outside 1 .. 12 h).
        """
        self._require_leader()
        validation.check_tags(tags, self.limits)
        return self.hub.extend(tags, connection_id, visibility_ms, self.clock.wall_ms())

    async def ack(self, connection_id: int, tags: list[bytes]) -> int:
        """Acknowledge deliveries; returns how many were removed. Durable on return.

        Raises:
            RequestError: UNKNOWN_DELIVERY_TAG / FOREIGN_DELIVERY_TAG (first bad index).
        """
        self._require_leader()
        validation.check_tags(tags, self.limits)
        flights = self.hub.claim_tags(tags, connection_id)
        try:
            done = await self.log.propose(commands.ack([flight.key for flight in flights]))
        except BaseException:
            self.hub.unclaim(flights, self.clock.wall_ms())
            raise
        return int(done)

    async def nack(
        self,
        connection_id: int,
        tags: list[bytes],
        requeue_delay_ms: int,
        reason: str | None = None,
        dead_letter: bool = False,
    ) -> int:
        """Refuse deliveries; each is due again after ``requeue_delay_ms`` (>= 0), or goes
        to its dead-letter topic now with ``dead_letter`` (reason ``rejected``).
        ``reason`` is kept with each entry (its dead letter's ``futureq-reason-text``).

        Raises:
            RequestError: INVALID_DELAY, UNKNOWN_DELIVERY_TAG, FOREIGN_DELIVERY_TAG,
                INVALID_ARGUMENT (a reason over :data:`MAX_NACK_REASON_BYTES`).
        """
        self._require_leader()
        validation.check_tags(tags, self.limits)
        if not 0 <= requeue_delay_ms <= self.limits.max_delay_ms:
            raise RequestError(
                ErrorCode.INVALID_DELAY,
                f"requeue_delay_ms must be between 0 and {self.limits.max_delay_ms}, got {requeue_delay_ms}",
            )
        if reason is not None and len(reason.encode("utf-8")) > MAX_NACK_REASON_BYTES:
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT,
                f"a NACK reason holds {len(reason.encode('utf-8'))} bytes; the limit is "
                f"{MAX_NACK_REASON_BYTES}: keep it short (it travels in the dead letter's headers)",
            )
        flights = self.hub.claim_tags(tags, connection_id)
        # When each went out: a first delivery's time is known only here (a dead letter's
        # futureq-first-delivery-ms), a redelivery's was recorded already (kept).
        entries = [(flight.key, flight.attempt, flight.pushed_ms or None) for flight in flights]
        try:
            done = await self.log.propose(
                commands.nack(
                    self._stamp(),
                    requeue_delay_ms,
                    entries,
                    reason,
                    dead_letter,
                    self.group_settings,
                )
            )
        except BaseException:
            self.hub.unclaim(flights, self.clock.wall_ms())
            raise
        return int(done)

    # ------------------------------------------------------------ status

    def clock_status(self) -> dict[str, Any] | None:
        """This node's view of cluster time (``docs/operations.md``, "Status"), or None
        when it runs on a plain clock (tests).

        Shape: ``cluster_time_ms``; ``synchronized`` and ``in_bound`` (may lead and
        dispatch); ``max_clock_offset_ms``; ``accuracy_ms`` (width of the agreement, or
        None); ``offsets_ms``: node id (str) -> that node's wall clock minus our cluster
        time (ms, this node included); ``dispatching`` and ``lease_remaining_ms`` on a
        Raft node.
        """
        clock = self.clock
        if not isinstance(clock, ClusterTime):
            return None
        status = clock.cluster_clock.status()
        offsets = {clock.cluster_clock.id: status.own_offset_us, **status.offsets_us}
        view: dict[str, Any] = {
            "cluster_time_ms": clock.wall_ms(),
            "synchronized": status.synchronized,
            "in_bound": status.in_bound,
            "max_clock_offset_ms": status.max_offset_us // 1000,
            "accuracy_ms": None if status.accuracy_us is None else status.accuracy_us / 1000,
            "offsets_ms": {str(node): round(us / 1000, 3) for node, us in sorted(offsets.items())},
        }
        can_dispatch = getattr(self.log, "can_dispatch", None)
        if can_dispatch is not None:
            view["dispatching"] = bool(can_dispatch())
            view["lease_remaining_ms"] = round(self.log.lease_remaining_s() * 1000, 1)  # type: ignore[attr-defined]
        return view

    def group_counts(self) -> list[GroupCounts]:
        """Per-group pending / due / in-flight / consumers, for the state gauges.

        Bounded work: one row per group with labels of its own (at most
        ``metrics.max_group_series``), plus one ``_other`` row for all the rest computed
        from running totals (its ``due`` is left out). Cost does not grow with the
        number of groups once the series budget is full.
        """
        metrics = self.metrics
        budget = metrics.series
        state = self.state
        if budget.has_room():
            for candidate in list(state.groups.values()):
                if not budget.has_room():
                    break
                budget.group(candidate.topic, candidate.name)
        now_ms = self.clock.wall_ms()
        hub = self.hub
        out: list[GroupCounts] = []
        pending = in_flight = consumers = 0
        for topic, name in sorted(budget.tracked_groups()):
            found = state.find_group(topic, name)
            if found is None:
                metrics.forget_group(topic, name)  # deleted: free its series
                continue
            row = self._group_row(found, now_ms)
            pending += row.pending
            in_flight += row.in_flight
            consumers += row.consumers
            out.append(row)
        if len(state.groups) > len(out):
            out.append(
                GroupCounts(
                    OTHER,
                    OTHER,
                    state.total_pending - pending,
                    None,
                    len(hub.in_flight) - in_flight,
                    len(hub.consumers) - consumers,
                )
            )
        return out

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
        return self._group_row(info, now_ms)

    def _group_row(self, info: GroupInfo, now_ms: int) -> GroupCounts:
        runtime = self.hub.groups.get(info.group_id)
        in_flight = runtime.in_flight_count if runtime else 0
        due = self.dispatcher.due_count(info.group_id, now_ms) if self.dispatcher.active else 0
        consumers = len(runtime.consumers) if runtime else 0
        oldest_due_ms = self.dispatcher.oldest_due_ms(info.group_id, now_ms) if due else None
        age_s = None
        if runtime is not None:  # in memory only: a scrape never seeks the disk per group
            next_due_ms = runtime.index.next_due_ms()
            age_s = 0.0 if next_due_ms is None else max(0, now_ms - next_due_ms) / 1000
        return GroupCounts(
            info.topic,
            info.name,
            info.pending,
            due,
            in_flight,
            consumers,
            None if oldest_due_ms is None else (now_ms - oldest_due_ms) / 1000,
            age_s,
        )

    def status(self, visible: Callable[[str], bool] | None = None) -> dict[str, Any]:
        """The STATUS_OK map (``docs/protocol.md``, "STATUS").

        Lists topics in name order with their groups, at most
        ``limits.max_status_groups`` groups (bounded work and size); ``topic_count``
        and ``group_count`` give the totals and ``truncated`` says whether some were
        left out.

        Args:
            visible: Lists only topics for which this returns True (a client without
                the ``monitor`` permission sees the topics its patterns name); the
                totals then count only those listed. None: every topic.
        """
        steps = self.status_steps(visible)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                result: dict[str, Any] = done.value
                return result

    async def status_async(self, visible: Callable[[str], bool] | None = None) -> dict[str, Any]:
        """:meth:`status`, yielding to the event loop every :data:`STATUS_STEP_TOPICS`
        topics looked at (a filtered status may look at every topic)."""
        steps = self.status_steps(visible)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                result: dict[str, Any] = done.value
                return result
            await trio.lowlevel.checkpoint()

    def _due_fields(self, group_id: int, now_ms: int) -> dict[str, Any]:
        """``next_due_ms`` (None: nothing deliverable), ``oldest_due_age_ms`` (how long
        the earliest due message has waited; 0 when nothing is due yet) and
        ``background`` (``"purging"``, ``"backfilling"`` or None) of one group."""
        runtime = self.hub.groups.get(group_id)
        if runtime is not None:
            # The leader's in-memory due order: no disk seek (which would have to skip
            # the tombstones a big cancel or purge leaves at the start of the range).
            # Entries in flight are not in it: this is the oldest one waiting.
            next_due_ms = runtime.index.next_due_ms()
        else:
            next_due_ms = None
        if next_due_ms is None:  # no runtime, or nothing within its horizon
            next_due_ms = self.dispatcher.next_due_ms(group_id)
        age_ms = 0 if next_due_ms is None else max(0, now_ms - next_due_ms)
        background = None
        if group_id in self.state.purging:
            background = "purging"
        elif group_id in self.state.backfilling:
            background = "backfilling"
        return {"next_due_ms": next_due_ms, "oldest_due_age_ms": age_ms, "background": background}

    def status_steps(
        self, visible: Callable[[str], bool] | None = None
    ) -> Generator[None, None, dict[str, Any]]:
        """:meth:`status` as a generator that yields every few hundred topics looked at."""
        limit = self.config.limits.max_status_groups
        listed = 0
        looked = 0
        truncated = False
        topics: list[dict[str, Any]] = []
        after: str | None = None
        while not truncated:
            now_ms = self.clock.wall_ms()
            batch = list(itertools.islice(self.state.iter_topics(after), STATUS_STEP_TOPICS))
            if not batch:
                break
            after = batch[-1]
            for topic in batch:
                looked += 1
                if visible is not None and not visible(topic):
                    continue
                if listed >= limit:
                    truncated = True
                    break
                groups = []
                for info in self.state.topic_groups(topic):
                    c = self._group_row(info, now_ms)
                    listed += 1
                    runtime = self.hub.groups.get(info.group_id)
                    groups.append(
                        {
                            "group": info.name,
                            "pending": c.pending,
                            "due": c.due,
                            "in_flight": c.in_flight,
                            "consumers": c.consumers,
                            "visibility_timeout_ms": info.visibility_timeout_ms,
                            "max_deliveries": info.max_deliveries,
                            "dead_letter_expired": info.dead_letter_expired,
                            # An operator sees a stuck group at a glance: its oldest
                            # due message has waited this long (issue 14).
                            **self._due_fields(info.group_id, now_ms),
                            # Each consumer's flow control: a stall shows as credit 0
                            # with in_flight at the prefetch.
                            "subscriptions": [
                                {
                                    "subscription_id": consumer.subscription_id,
                                    "prefetch": consumer.prefetch,
                                    "credit": consumer.credit,
                                    "in_flight": len(consumer.in_flight),
                                }
                                for consumer in (runtime.consumers if runtime else [])
                            ],
                        }
                    )
                topics.append({"topic": topic, "groups": groups})
            if not truncated:
                yield
        deleting = [
            {"topic": d.topic, "group": d.name, "pending": d.pending}
            for _, d in sorted(self.state.deleting.items())
            if visible is None or visible(d.topic)
        ]
        cluster = self.cluster_status()
        role = cluster["role"]
        return {
            "deleting_groups": deleting,
            "node_id": self.node_id,
            "role": role,
            # On a follower the leader-only numbers are its own, mostly zero: say so.
            "view": "cluster" if role == "leader" else "local",
            "leader_only": [] if role == "leader" else list(STATUS_LEADER_ONLY),
            "leader_id": cluster.get("leader_id"),
            "leader_address": self.log.leader_address(),
            "server_version": __version__,
            "commit_index": cluster.get("commit_index", self.log.applied_index),
            "applied_index": self.log.applied_index,
            "applied_digest": self.state.applied_digest,
            "term": int(getattr(self.log, "term", 0)),
            "uptime_s": round(self.clock.monotonic_s() - self.started_s, 3),
            "topic_count": self.state.topic_count() if visible is None else len(topics),
            "group_count": len(self.state.groups) if visible is None else listed,
            "truncated": truncated,
            "alarms": self.alarms(),
            "topics": topics,
            **({"clock": clock} if (clock := self.clock_status()) is not None else {}),
        }

    def is_ready(self) -> bool:
        """Serving: listeners up, a leader known and applied up to, not shutting down."""
        return self.ready and not self.stopping and self.log.ready_for_clients()

    def is_healthy(self) -> bool:
        """The process is up and serving (false once shutdown begins)."""
        return not self.stopping
