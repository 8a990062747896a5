"""Routing by topic to the shards of a sharded node (``docs/sharding.md``, "Clients").

:func:`futureq.client.open_client` connects as always; when the server's HELLO_OK
says its node runs several shards, it asks SLOT_MAP and hands out a
:class:`ShardedClient`: one :class:`~futureq.client.Client` per shard (each with its
own connection, leader following, publish batcher and subscriptions), and every
request sent to the client of the shard that owns its topic. A node of one shard gets
the plain :class:`~futureq.client.Client`, exactly as before.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, NoReturn, TypeVar

import anyio
import anyio.abc

from futureq.client import _checks
from futureq.client._admin import ItemStatuses, PurgeCount
from futureq.client._attempts import partly_stored, took_no_effect
from futureq.client._base import _expect
from futureq.client._batching import PublishItem, check_publish_items
from futureq.client._browse import BrowsePage, DueCounts
from futureq.client.client import Client
from futureq.client.subscription import Subscription
from futureq.errors import (
    ConnectionLostError,
    ErrorCode,
    FutureQError,
    NotSentError,
    RequestError,
)
from futureq.shards.layout import shift_address
from futureq.shards.slots import SlotMap
from futureq.wire import frames

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_REDIRECTS = 3
"""WRONG_SHARD answers followed for one request before its error is raised."""


async def ask_slot_map(client: Client) -> tuple[SlotMap, int, int | None]:
    """Ask the node ``client`` is connected to for its slot map.

    Returns:
        The map, the number of the shard that answered, and the node's port stride
        (shard ``K`` of a node listens on its ports plus ``K * stride``; None if the
        server did not say).

    Raises:
        RequestError: INTERNAL_ERROR when the answer is not a well-formed map.
    """
    answer = await client._call(lambda rid: frames.SlotMap(rid), retry_unknown=True)
    wire = _expect(answer, frames.SlotMapOk).slot_map
    try:
        slot_map = SlotMap.from_wire(wire)
    except ValueError as exc:
        raise RequestError(ErrorCode.INTERNAL_ERROR, f"bad SLOT_MAP answer: {exc}") from None
    shard = wire.get("shard")
    stride = wire.get("port_stride")
    return (
        slot_map,
        shard if type(shard) is int and 0 <= shard < slot_map.shard_count else -1,
        stride if type(stride) is int and stride > 0 else None,
    )


def shard_servers(
    slot_map: SlotMap, shard: int, seeds: Sequence[str], stride: int | None
) -> list[str]:
    """Addresses to reach shard ``shard`` at: the map's first, then the same shard on
    every seed server (a seed is a node's public port, shard 0's; shard ``K`` of that
    node listens ``K * stride`` above it), so a shard's client can fail over to the
    same shard of another node when the node it knew stops."""
    servers = [slot_map.addresses[shard]]
    for shifted in seed_shards(seeds, shard, stride):
        if shifted not in servers:
            servers.append(shifted)
    return servers


def public_seeds(seeds: Sequence[str], slot_map: SlotMap, stride: int | None) -> list[str]:
    """``seeds`` with each one that is another shard's port in ``slot_map`` (shard ``J``
    > 0 of the node that answered) replaced by that node's public port (``J * stride``
    below), in order, without repeats.

    The port rule shifts seeds from public ports; a user who also gave a shard's own
    port (``--server node:7450,node:7550``, so that a stopped shard 0 does not keep the
    client from the node) had it shifted as if it were public: shard 0's client tried
    shard 1's port, and a call for shard 0's topics failed with ``WRONG_SHARD ...
    belongs to shard 0 ... this is shard 1`` instead of naming shard 0's failure.
    Unchanged when the stride is unknown.
    """
    if stride is None:
        return list(seeds)
    found: list[str] = []
    for seed in seeds:
        shard = next((k for k, a in enumerate(slot_map.addresses) if k > 0 and a == seed), 0)
        public = shift_address(seed, -shard * stride) if shard else seed
        if public not in found:
            found.append(public)
    return found


def member_shards(
    members: Sequence[str], answering: int, shard: int, stride: int | None
) -> list[str]:
    """Shard ``shard``'s address on every member the answering shard's HELLO_OK named.

    The members a shard names are its own group's client addresses, shard
    ``answering``'s on each node (``answering * stride`` above the node's public port),
    so shard ``shard`` of the same node listens ``(shard - answering) * stride`` from
    there. A shard's client that knows only the seeds has nowhere else to go when the
    seed node's process for that shard is stopped or down, though its group has a
    leader on another node: before, every call for its topics failed until that process
    came back (``futureq-cli --server NODE3`` with node 3's shard 1 stopped). None when
    the stride or the answering shard is unknown; ports out of range are skipped.

    Args:
        members: ``HOST:PORT`` client addresses (``Client._learned``).
        answering: The shard those addresses belong to (-1: unknown).
        shard: The shard whose addresses are wanted.
        stride: The node's ``shard_port_stride`` (None: unknown).
    """
    if stride is None or answering < 0:
        return []
    found = []
    for member in members:
        try:
            shifted = shift_address(member, (shard - answering) * stride)
        except ValueError:
            continue
        port = int(shifted.rsplit(":", 1)[1])
        if 0 < port < 65536 and shifted not in found:
            found.append(shifted)
    return found


def seed_shards(seeds: Sequence[str], shard: int, stride: int | None) -> list[str]:
    """Shard ``shard``'s address on every seed server (``K * stride`` above the seed's
    port); none when the stride is unknown. The same machines as the seeds, so the
    ``server_hostname`` given for the seeds names them too."""
    if stride is None:
        return []
    found = []
    for seed in seeds:
        try:
            found.append(shift_address(seed, shard * stride))
        except ValueError:
            continue
    return found


def _is_wrong_shard(exc: BaseException) -> bool:
    return isinstance(exc, RequestError) and exc.code is ErrorCode.WRONG_SHARD


class ShardedClient(Client):
    """A :class:`~futureq.client.Client` for a node of several shards (see the module doc).

    Same methods as :class:`~futureq.client.Client`; each goes to the shard owning
    its topic. :meth:`publish_batch` splits a batch by shard, publishes the parts at
    once and returns the ids in the order of ``items``: each part is atomic on its
    shard, the batch as a whole is not (one shard may store its part while another
    refuses). Node-wide requests (:meth:`status`, :meth:`cluster_status`,
    :meth:`transfer_leader`) go to every shard and their answers are merged.

    A WRONG_SHARD answer (the map changed) makes the client ask for the map again
    and resend, up to :data:`MAX_REDIRECTS` times. Message ids are per shard: a
    message is named by its topic and its id together.

    Attributes:
        slot_map: The slot map in use.
        shard_clients: One client per shard, by shard number.
        port_stride: The node's ``shard_port_stride`` from SLOT_MAP_OK (shard ``K`` of
            every node listens on its ports plus ``K * port_stride``), None if the
            server did not say.
    """

    def __init__(
        self,
        template: Client,
        slot_map: SlotMap,
        shard_clients: list[Client],
        open_shard: Callable[[int, str], Awaitable[Client]],
        port_stride: int | None = None,
    ) -> None:
        super().__init__(
            [*slot_map.addresses],
            ssl_context=template._ssl_context,
            server_hostname=template._server_hostname,
            token=template._token,
            connect_timeout_s=template._connect_timeout_s,
            request_timeout_s=template.request_timeout_s,
            max_batch_items=template._max_batch_items,
            linger_ms=template._linger_s * 1000,
            ack_level="quorum" if template._ack_level is frames.AckLevel.QUORUM else "leader",
            retry_unknown_outcome=template._retry_unknown_outcome,
            rng=template._rng,
            max_lease_s=template.max_lease_s,
            hostname_servers=template._hostname_servers,
        )
        self._publish_send.close()  # requests go to the shard clients, never here
        self._publish_receive.close()
        self.slot_map = slot_map
        self.shard_clients = shard_clients
        self._open_shard = open_shard
        self._refreshing: anyio.Lock = anyio.Lock()
        self.port_stride = port_stride

    # -- routing -----------------------------------------------------------------------

    @property
    def connected_address(self) -> str | None:
        """``host:port`` of shard 0's live connection, or None while reconnecting."""
        return self.shard_clients[0].connected_address

    @property
    def max_frame_bytes(self) -> int:
        """Shard 0's :attr:`Client.max_frame_bytes` (every shard of a node has the same)."""
        return self.shard_clients[0].max_frame_bytes

    def client_for(self, topic: str) -> Client:
        """The client of the shard owning ``topic``."""
        # Checked here: the slot of a name that is not a str raised AttributeError
        # ('int' object has no attribute 'endswith') on a sharded node.
        _checks.check_str("topic", topic)
        return self.shard_clients[self.slot_map.shard_of(topic)]

    def _check_open(self) -> None:
        for client in self.shard_clients:
            client._check_open()
        super()._check_open()

    def _close(self) -> None:
        for client in self.shard_clients:
            client._close()
        super()._close()

    async def refresh_slot_map(self) -> None:
        """Ask the shards for the slot map again; open clients for shards that moved.

        Every shard's client is asked at once; the first well-formed answer wins and
        the other questions are cancelled, so a stopped or hung shard process costs
        nothing while another shard answers. Before, the shards were asked one after
        another, and a stopped one held every refresh for its whole request timeout.

        Raises:
            RequestError: UNAVAILABLE when no shard answered within
                ``request_timeout_s`` (the message says why each failed).
        """
        version = self.slot_map.version
        async with self._refreshing:
            if self.slot_map.version != version:
                return  # another task refreshed it meanwhile
            slot_map = await self._ask_any_shard()
            clients = list(self.shard_clients)
            for shard, address in enumerate(slot_map.addresses):
                old = self.slot_map.addresses[shard] if shard < len(clients) else None
                if address != old:
                    log.info("shard %d moved to %s; connecting to it", shard, address)
                    new = await self._open_shard(shard, address)
                    if shard < len(clients):
                        clients[shard] = new
                    else:
                        clients.append(new)
            self.shard_clients = clients[: slot_map.shard_count]
            self.slot_map = slot_map

    async def _ask_any_shard(self) -> SlotMap:
        """The slot map from the first shard to answer SLOT_MAP (see
        :meth:`refresh_slot_map`), within ``request_timeout_s``."""
        answers: list[SlotMap] = []
        errors: dict[int, BaseException] = {}

        async def ask(shard: int, client: Client) -> None:
            try:
                slot_map, _, _ = await ask_slot_map(client)
            except (FutureQError, OSError, anyio.BrokenResourceError) as exc:
                errors[shard] = exc
                return
            answers.append(slot_map)
            group.cancel_scope.cancel()  # the first answer wins

        with anyio.move_on_after(self.request_timeout_s):
            async with anyio.create_task_group() as group:
                for shard, client in enumerate(self.shard_clients):
                    group.start_soon(ask, shard, client)
        if answers:
            return answers[0]
        self._check_open()  # closed meanwhile: ClientClosedError, not UNAVAILABLE
        why = "; ".join(f"shard {shard}: {errors[shard]}" for shard in sorted(errors))
        raise RequestError(
            ErrorCode.UNAVAILABLE,
            f"no shard answered SLOT_MAP within {self.request_timeout_s:g} s"
            + (f": {why}" if why else " (their processes may be stopped or hung)"),
        )

    async def _routed(self, topic: str, call: Callable[[Client], Awaitable[T]]) -> T:
        for attempt in range(MAX_REDIRECTS + 1):
            try:
                return await call(self.client_for(topic))
            except RequestError as exc:
                if not _is_wrong_shard(exc) or attempt == MAX_REDIRECTS:
                    raise
                log.info("WRONG_SHARD for topic %r: asking for the slot map again", topic)
                await self.refresh_slot_map()
        raise AssertionError("unreachable")  # pragma: no cover

    async def _on_every_shard(
        self, call: Callable[[Client], Awaitable[T]], *, straggler_s: float | None = None
    ) -> tuple[list[T | None], dict[int, FutureQError]]:
        """``call`` on every shard's client at once: the answers by shard (None for a
        shard that failed) and the error of each shard that failed. A shard's
        failure never cancels the others' calls, and no exception group escapes.

        Args:
            straggler_s: For a read that is worth answering without a shard: once one
                shard answered, the others have this long more (s), then each still
                out fails with TIMEOUT naming the wait. None: each call has its own
                request deadline (a stopped shard process keeps the whole answer
                waiting that long).
        """
        results: list[T | None] = [None] * len(self.shard_clients)
        errors: dict[int, FutureQError] = {}
        done: set[int] = set()

        async def one(index: int, client: Client) -> None:
            try:
                results[index] = await call(client)
            except FutureQError as exc:
                errors[index] = exc
            else:
                if straggler_s is not None:
                    scope.deadline = min(scope.deadline, anyio.current_time() + straggler_s)
            done.add(index)

        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:
                for index, client in enumerate(self.shard_clients):
                    group.start_soon(one, index, client)
        for index in range(len(self.shard_clients)):
            if index not in done:
                errors[index] = RequestError(
                    ErrorCode.TIMEOUT,
                    f"no answer within {straggler_s:g} s of the other shards' answers "
                    "(its process may be stopped or hung)",
                )
        return results, errors

    async def _everywhere(self, call: Callable[[Client], Awaitable[Any]]) -> None:
        """``call`` on every shard, for its effect; raises one :class:`FutureQError`
        (see :func:`combine_shard_errors`) if any shard failed."""
        _, errors = await self._on_every_shard(call)
        if errors:
            self._raise_combined(errors)

    def _raise_combined(self, errors: dict[int, FutureQError]) -> NoReturn:
        """Raise the shards' failures as one :class:`FutureQError`, caused by the first
        failed shard's."""
        raise combine_shard_errors(errors, self.slot_map) from errors[min(errors)]

    # -- publishing --------------------------------------------------------------------

    async def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
        ttl_ms: int | None = None,
        headers: dict[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> int:
        """As :meth:`Client.publish`, on the shard owning ``topic``."""
        return await self._routed(
            topic,
            lambda client: client.publish(
                topic,
                payload,
                delay_ms=delay_ms,
                deliver_at_ms=deliver_at_ms,
                ttl_ms=ttl_ms,
                headers=headers,
                idempotency_key=idempotency_key,
            ),
        )

    async def publish_batch(
        self,
        items: Sequence[PublishItem],
        *,
        duplicates: list[int] | None = None,
        stored: dict[int, int] | None = None,
    ) -> list[int]:
        """As :meth:`Client.publish_batch`, split by shard (see the class doc);
        ``duplicates`` gets positions in ``items``, in order.

        Args:
            items: The messages, in order.
            duplicates: As :meth:`Client.publish_batch`; also filled for the parts
                stored when another part fails.
            stored: If given, gets ``{position in items: message id}`` for every item
                a shard stored, **also when this raises**: a caller that resends after
                an error sends only the items missing from it, so what one shard
                stored is never sent twice (``docs/cli.md``, ``publish --file``).

        Raises:
            RequestError: a shard refused its part; ``item_index``, when the server
                named an item, is its index **in ``items``**. Parts on other shards
                may have been stored (see ``stored``).
            NotSentError: a part was not sent (its shard could not be reached, ...)
                and no other part was stored.
            ConnectionLostError: a part's outcome is unknown (the connection dropped
                before the answer), or it was not sent and other parts were stored
                (see ``stored``).
        """
        check_publish_items(items)
        ids: list[int] = [0] * len(items)
        done: dict[int, int] = {} if stored is None else stored
        stored_before = len(done)
        found: list[int] = []
        try:
            for attempt in range(MAX_REDIRECTS + 1):
                errors = await self._publish_parts(items, ids, done, found)
                if not errors:
                    return ids
                if attempt == MAX_REDIRECTS or not all(_is_wrong_shard(e) for e in errors):
                    error = next((e for e in errors if not _is_wrong_shard(e)), errors[0])
                    # A part not sent, others stored: not "not sent" for the call.
                    raise partly_stored(error, len(done) - stored_before, len(items))
                # Only the parts refused with WRONG_SHARD are sent again (to the new map's
                # shard); the parts stored already are not.
                await self.refresh_slot_map()
        finally:
            if duplicates is not None:
                duplicates.extend(sorted(found))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _publish_parts(
        self,
        items: Sequence[PublishItem],
        ids: list[int],
        stored: dict[int, int],
        duplicates: list[int],
    ) -> list[FutureQError]:
        """Publish the items not in ``stored`` yet, one part per shard at once; each
        part stored fills ``ids`` and ``stored`` (and ``duplicates``). Returns the
        errors of the parts that failed."""
        positions: dict[int, list[int]] = {}
        shard_of: dict[str, int] = {}  # one hash per topic of the batch, not per item
        for position, item in enumerate(items):
            if position in stored:
                continue
            shard = shard_of.get(item.topic)
            if shard is None:
                shard = shard_of[item.topic] = self.slot_map.shard_of(item.topic)
            positions.setdefault(shard, []).append(position)
        errors: list[FutureQError] = []

        async def part(shard: int, where: list[int]) -> None:
            repeated: list[int] = []
            part_stored: dict[int, int] = {}
            try:
                await self.shard_clients[shard].publish_batch(
                    [items[i] for i in where], duplicates=repeated, stored=part_stored
                )
            except RequestError as exc:
                index = exc.item_index
                errors.append(
                    RequestError(
                        exc.code,
                        exc.message,
                        where[index] if index is not None and index < len(where) else None,
                    )
                )
            except FutureQError as exc:
                # ConnectionLostError: outcome unknown for this part. Raised as itself,
                # never wrapped in an exception group (callers catch FutureQError, as
                # for one shard).
                errors.append(exc)
            finally:
                for index, message_id in part_stored.items():
                    ids[where[index]] = message_id
                    stored[where[index]] = message_id
                duplicates.extend(where[i] for i in repeated)

        if len(positions) == 1:
            # The whole batch is one shard's (one topic, say): no task group, whose set-up
            # cost ~1 us a message at batch 100 on the client's one core.
            [(shard, where)] = positions.items()
            await part(shard, where)
            return errors
        async with anyio.create_task_group() as group:
            for shard, where in positions.items():
                group.start_soon(part, shard, where)
        return errors

    # -- consuming ---------------------------------------------------------------------

    @asynccontextmanager
    async def subscribe(
        self, topic: str, group: str, prefetch: int = 100, *, pull: bool = False
    ) -> AsyncIterator[Subscription]:
        """As :meth:`Client.subscribe`, on the shard owning ``topic``."""
        for attempt in range(MAX_REDIRECTS + 1):
            yielded = False
            try:
                async with self.client_for(topic).subscribe(
                    topic, group, prefetch, pull=pull
                ) as sub:
                    yielded = True
                    yield sub
                return
            except RequestError as exc:
                # Retry only a refused SUBSCRIBE, never an error of the caller's block.
                if yielded or not _is_wrong_shard(exc) or attempt == MAX_REDIRECTS:
                    raise
                await self.refresh_slot_map()

    # -- managing ----------------------------------------------------------------------

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
        """As :meth:`Client.create_group`, on the shard owning ``topic``."""
        return await self._routed(
            topic,
            lambda client: client.create_group(
                topic,
                group,
                visibility_timeout_ms=visibility_timeout_ms,
                max_deliveries=max_deliveries,
                from_backlog=from_backlog,
                dead_letter_expired=dead_letter_expired,
            ),
        )

    async def delete_group(self, topic: str, group: str) -> None:
        """As :meth:`Client.delete_group`, on the shard owning ``topic``."""
        await self._routed(topic, lambda client: client.delete_group(topic, group))

    async def cancel(
        self, topic: str, ids: Sequence[int], *, group: str | None = None
    ) -> ItemStatuses:
        """As :meth:`Client.cancel`, on the shard owning ``topic``."""
        return await self._routed(topic, lambda client: client.cancel(topic, ids, group=group))

    async def redrive(
        self,
        topic: str,
        ids: Sequence[int],
        *,
        delay_ms: int = 0,
        group: str | None = None,
    ) -> ItemStatuses:
        """As :meth:`Client.redrive`, on the shard owning ``topic`` (and ``topic.dlq``)."""
        return await self._routed(
            topic, lambda client: client.redrive(topic, ids, delay_ms=delay_ms, group=group)
        )

    async def reschedule(
        self,
        topic: str,
        ids: Sequence[int],
        *,
        due_ms: int | None = None,
        delay_ms: int | None = None,
        group: str | None = None,
    ) -> ItemStatuses:
        """As :meth:`Client.reschedule`, on the shard owning ``topic``."""
        return await self._routed(
            topic,
            lambda client: client.reschedule(
                topic, ids, due_ms=due_ms, delay_ms=delay_ms, group=group
            ),
        )

    async def purge(self, topic: str, *, group: str | None = None) -> PurgeCount:
        """As :meth:`Client.purge`, on the shard owning ``topic``."""
        return await self._routed(topic, lambda client: client.purge(topic, group=group))

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
        """As :meth:`Client.browse`, on the shard owning ``topic``."""
        return await self._routed(
            topic,
            lambda client: client.browse(
                topic,
                group,
                from_due_ms=from_due_ms,
                to_due_ms=to_due_ms,
                cursor=cursor,
                limit=limit,
                preview_bytes=preview_bytes,
            ),
        )

    async def browse_counts(
        self,
        topic: str,
        group: str | None = None,
        *,
        bounds_ms: Sequence[int],
        relative: bool = False,
    ) -> DueCounts:
        """As :meth:`Client.browse_counts`, on the shard owning ``topic``."""
        return await self._routed(
            topic,
            lambda client: client.browse_counts(
                topic, group, bounds_ms=bounds_ms, relative=relative
            ),
        )

    # -- node-wide ---------------------------------------------------------------------

    async def status(self, *, local: bool = False) -> dict[str, Any]:
        """Every shard's status merged: the first answering shard's fields, every
        answering shard's topics (sorted), and ``"shards"``: ``[{"shard", "address",
        "role", "view", "leader_address", "applied_index", "topics"}]`` (``topics``: a
        count). A shard that did not answer gets ``{"shard", "address", "error"}``
        instead and is listed in ``"missing_shards"``: the other shards' answer is
        still returned (``docs/sharding.md``: the other shards keep serving). A shard
        that has not answered ``connect_timeout_s`` after the first shard's answer is
        such a shard (a stopped or hung shard process kept the answer waiting for the
        whole request timeout).

        Raises:
            FutureQError: no shard answered (one error naming each shard's failure).
        """
        answers, errors = await self._on_every_shard(
            lambda client: client.status(local=local), straggler_s=self._connect_timeout_s
        )
        if len(errors) == len(answers):
            self._raise_combined(errors)
        return merge_status(answers, self.slot_map, errors)

    async def cluster_status(self, *, local: bool = False) -> dict[str, Any]:
        """The first answering shard's cluster status (its group's leader's view unless
        ``local``), with ``"shards"``: one row per shard describing that shard **on the
        node its client is connected to** (the asked node): ``{"shard", "address",
        **that node's local answer}``, or ``{"shard", "address", "error"}`` for a shard
        that did not answer (then also listed in ``"missing_shards"``), as in
        :meth:`status` (``connect_timeout_s`` after the first answer at most).

        Raises:
            FutureQError: no shard answered (one error naming each shard's failure).
        """

        async def both(client: Client) -> tuple[dict[str, Any], dict[str, Any], str | None]:
            # The row must be the asked node's own shard (role, term, ...), not the
            # leader's answer that cluster_status() follows to (fault: shard 0's row
            # read "leader, node 1" with node 3's address).
            own = await client.cluster_status(local=True)
            address = client.connected_address
            view = own if local else await client.cluster_status()
            return view, own, address

        answers, errors = await self._on_every_shard(both, straggler_s=self._connect_timeout_s)
        if len(errors) == len(answers):
            self._raise_combined(errors)
        merged = dict(next(answer[0] for answer in answers if answer is not None))
        rows: list[dict[str, Any]] = []
        for shard, answer in enumerate(answers):
            if answer is None:
                rows.append(_missing_row(shard, self.slot_map, errors[shard]))
                continue
            _, own, address = answer
            rows.append(
                {"shard": shard, "address": address or self.slot_map.addresses[shard], **own}
            )
        merged["shards"] = rows
        if errors:
            merged["missing_shards"] = sorted(errors)
        return merged

    async def transfer_leader(self, node_id: int | None = None) -> None:
        """As :meth:`Client.transfer_leader`, for every shard's Raft group."""
        _checks.check_node_id(node_id, optional=True)
        await self._everywhere(lambda client: client.transfer_leader(node_id))

    async def add_node(self, node_id: int, raft_address: str, client_address: str) -> None:
        """Add a sharded node to every shard's Raft group: shard ``K``'s group gets the
        node's shard ``K``, at ``raft_address`` and ``client_address`` (the new node's
        shard 0, i.e. its public ports) plus ``K * port_stride`` (the port rule of
        ``docs/sharding.md``). The groups change one after another from shard 0; a
        group that already lists ``node_id`` at that Raft address is left as it is, so
        running it again after a partial failure finishes the job.

        Raises:
            RequestError: INVALID_ARGUMENT when the server did not give its port stride,
                an address cannot be shifted, or a group refuses (id in use elsewhere,
                ...; the message names the shard and what was added before it).
            ConnectionLostError, ClientClosedError: as :meth:`publish`.
            TypeError, ValueError: as :meth:`Client.add_node`; nothing was sent.
        """
        _checks.check_node_id(node_id)
        stride = self.port_stride
        if stride is None:
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT,
                "this server did not say its shard port stride, so the addresses of the new "
                "node's shards are unknown; start the new node with --join and the same "
                "--shards instead (docs/sharding.md)",
            )
        added: list[int] = []
        for shard, client in enumerate(self.shard_clients):
            try:
                raft = shift_address(raft_address, shard * stride)
                address = shift_address(client_address, shard * stride)
            except ValueError as exc:
                raise RequestError(ErrorCode.INVALID_ARGUMENT, str(exc)) from None
            view = await client.cluster_status()
            if any(
                member.get("node_id") == node_id and member.get("raft_address") == raft
                for member in view.get("nodes", [])
            ):
                added.append(shard)
                continue
            try:
                await client.add_node(node_id, raft, address)
            except RequestError as exc:
                done = f" (shards {added} list it already)" if added else ""
                raise RequestError(
                    exc.code,
                    f"shard {shard}'s group refused node {node_id} at {raft}: {exc.message}{done}",
                ) from exc
            added.append(shard)

    async def remove_node(self, node_id: int) -> None:
        """As :meth:`Client.remove_node`, from every shard's Raft group."""
        _checks.check_node_id(node_id)
        await self._everywhere(lambda client: client.remove_node(node_id))

    async def ping(self) -> float:
        """As :meth:`Client.ping`, to shard 0."""
        return await self.shard_clients[0].ping()


def _missing_row(shard: int, slot_map: SlotMap, error: FutureQError) -> dict[str, Any]:
    return {
        "shard": shard,
        "address": slot_map.addresses[shard],
        "error": f"shard {shard} did not answer: {_describe(error, shard)}",
    }


def _message(error: FutureQError, shard: int) -> str:
    """The error's sentence without the ``shard K:`` a shard's client starts it with
    (the caller names the shard)."""
    text = error.message if isinstance(error, RequestError) else str(error)
    return text.removeprefix(f"shard {shard}: ")


def _describe(error: FutureQError, shard: int) -> str:
    if isinstance(error, RequestError):
        return f"[{error.code.name}] {_message(error, shard)}"
    return _message(error, shard)


def _shard_names(shards: list[int]) -> str:
    """``shard 0``, ``shard 0 and shard 1``, ``shard 0, shard 1 and shard 2``."""
    names = [f"shard {shard}" for shard in shards]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def combine_shard_errors(errors: dict[int, FutureQError], slot_map: SlotMap) -> FutureQError:
    """One :class:`FutureQError` for the failures of a node-wide call, by shard: its
    message names each failed shard, its address and its error (shards that failed
    with the same sentence together)
    (``docs/client.md``, "Errors": every error is a FutureQError, never a group). The
    class is the first failed shard's: a :class:`RequestError` (with that shard's
    code), a :class:`ConnectionLostError` (a :class:`NotSentError` when every failed
    shard's error says its part took no effect: :func:`took_no_effect`), or that error
    itself for another kind (:class:`ClientClosedError`, a protocol error)."""
    first = errors[min(errors)]
    # Shards that failed alike are named together: a membership command refused by
    # every shard of a node said the same sentence once per shard (found by a tester).
    alike: dict[str, list[int]] = {}
    for shard in sorted(errors):
        alike.setdefault(_message(errors[shard], shard), []).append(shard)
    text = "; ".join(
        f"{_shard_names(shards)} ({', '.join(slot_map.addresses[s] for s in shards)}): {message}"
        for message, shards in alike.items()
    )
    if isinstance(first, RequestError):
        return RequestError(first.code, text)
    if isinstance(first, ConnectionLostError):
        if all(took_no_effect(error) for error in errors.values()):
            return NotSentError(text)
        return ConnectionLostError(text)
    return first


def merge_status(
    answers: Sequence[dict[str, Any] | None],
    slot_map: SlotMap,
    errors: dict[int, FutureQError] | None = None,
) -> dict[str, Any]:
    """One STATUS-shaped map from every shard's answer (see :meth:`ShardedClient.status`);
    an answer of None is a shard that failed with ``errors[shard]``."""
    errors = errors or {}
    by_shard = list(answers)
    answered = [answer for answer in by_shard if answer is not None]
    merged = dict(answered[0])
    topics: list[Any] = []
    for answer in answered:
        topics.extend(answer.get("topics", []))
    merged["topics"] = sorted(topics, key=lambda entry: str(entry.get("topic", "")))
    deleting = [d for answer in answered for d in answer.get("deleting_groups") or []]
    if deleting or "deleting_groups" in merged:
        merged["deleting_groups"] = deleting
    for total in ("topic_count", "group_count"):
        if all(total in answer for answer in answered):
            merged[total] = sum(int(answer[total]) for answer in answered)
    for flag in ("truncated", "deleting_truncated"):
        if any(flag in answer for answer in answered):
            merged[flag] = any(bool(answer.get(flag)) for answer in answered)
    merged["shards"] = [
        {
            "shard": shard,
            "address": slot_map.addresses[shard],
            "role": answer.get("role"),
            "view": answer.get("view"),
            "term": answer.get("term"),
            "leader_id": answer.get("leader_id"),
            "leader_address": answer.get("leader_address"),
            "commit_index": answer.get("commit_index"),
            "applied_index": answer.get("applied_index"),
            "topics": len(answer.get("topics", [])),
        }
        if answer is not None
        else _missing_row(shard, slot_map, errors[shard])
        for shard, answer in enumerate(by_shard)
    ]
    if errors:
        merged["missing_shards"] = sorted(errors)
    return merged
