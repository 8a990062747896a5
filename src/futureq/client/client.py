"""The asynchronous FutureQ client: batching, pipelining, reconnect, leader follow.

It runs unchanged under asyncio (``asyncio.run``) and trio (``trio.run``): it is written
against AnyIO, which runs on either event loop.

Usage::

    async with open_client("127.0.0.1:7450") as client:
        message_id = await client.publish("emails", b'{"to": "a@b.c"}', delay_ms=5_000)
        async with client.subscribe("emails", "senders") as sub:
            async for delivery in sub:
                handle(delivery.payload)
                await delivery.ack()

Delivery is **at-least-once** end to end: a publish whose connection broke after it
was sent is sent again on the next connection (it may then be stored twice), and a
delivery that is not acked (or whose ack was lost with its connection) is delivered
again. Make consumers idempotent. See ``docs/client.md``.

Lifetimes: :func:`open_client` owns one task group holding the connection manager (and
through it the current connection's reader and writer tasks), the publish batcher and
the lease keeper (extends the visibility of deliveries buffered and not yet handed
out, and releases what a pull-mode subscription did not ask for); nothing the client
starts outlives the ``async with`` block.

Cancellation is clean at every await: cancel any call (``anyio.move_on_after``) and
the connection, the other calls and every delivery held stay as they were; a late
answer is dropped (a late SUBSCRIBE_OK is undone with UNSUBSCRIBE).

This module puts :class:`Client` together from its parts and opens it
(:func:`open_client`): the connection and request loop in :mod:`futureq.client._base`,
the calls in :mod:`futureq.client._publishing`, :mod:`futureq.client._consuming` and
:mod:`futureq.client._admin`.
"""

from __future__ import annotations

import functools
import random
import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio

from futureq.client._admin import AdminClient
from futureq.client._base import DEFAULT_MAX_LEASE_S, DEFAULT_SERVER, AckLevelName, parse_servers
from futureq.client._consuming import ConsumingClient
from futureq.client._publishing import PublishingClient


class Client(PublishingClient, ConsumingClient, AdminClient):
    """A connection to a FutureQ cluster. Create it with :func:`open_client`.

    Every method may be called from many tasks at once: requests pipeline on the one
    connection, and concurrent :meth:`publish` calls are coalesced into PUBLISH
    batches.

    It belongs to the process that opened it: in a child forked after that, every
    call raises :class:`ClientClosedError` at once (open a new client in the child).

    Attributes:
        servers: The addresses tried, in order, when (re)connecting.
        request_timeout_s: Deadline of each call, retries included (seconds).
    """


def _single_exception(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one leaf of a group nested only one-deep at each level, else None."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        if len(error.exceptions) != 1:
            return None
        error = error.exceptions[0]
    return error


@asynccontextmanager
async def open_client(
    servers: str | Sequence[str] = DEFAULT_SERVER,
    *,
    ssl_context: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
    token: str | None = None,
    connect_timeout_s: float = 5.0,
    request_timeout_s: float = 30.0,
    max_batch_items: int = 1000,
    linger_ms: float = 1.0,
    ack_level: AckLevelName = "quorum",
    retry_unknown_outcome: bool = True,
    rng: random.Random | None = None,
    max_lease_s: float = DEFAULT_MAX_LEASE_S,
) -> AsyncIterator[Client]:
    """Connect to a FutureQ cluster and yield a :class:`Client`.

    Args:
        servers: ``"host:port"``, ``"h1:p1,h2:p2"`` or a sequence of addresses; tried
            in order, and NOT_LEADER redirects are followed beyond this list.
        ssl_context: Use TLS with this context (e.g. ``ssl.create_default_context(
            cafile="ca.pem")``).
        server_hostname: Name the certificates of the servers given (``servers``, and
            on a sharded node their shards' ports) must carry (default: each one's
            host). A member a server names (HELLO_OK, NOT_LEADER, the slot map) is
            always checked against its own host.
        token: Auth token sent in HELLO.
        connect_timeout_s: Deadline of one connection attempt, and of the first
            connection overall (seconds).
        request_timeout_s: Deadline of every call, retries included (seconds).
        max_batch_items: Most items per PUBLISH / ACK / NACK frame.
        linger_ms: How long the publish batcher waits for more calls before sending
            a batch (ms); 0 sends at once (batches still form under load).
        ack_level: ``"quorum"`` (committed by a majority) or ``"leader"`` (durable on
            the leader) before a publish returns.
        retry_unknown_outcome: Resend a publish whose connection broke after it was
            sent, or that a node refused with an outcome unknown (``TIMEOUT``,
            ``UNAVAILABLE`` "outcome unknown") (default; at-least-once, may store it
            twice). False raises :class:`ConnectionLostError` (or that refusal)
            instead and leaves the choice to you. Either way a publish known to have
            taken no effect is sent again, and raises
            :class:`~futureq.errors.NotSentError` if no server takes it in time
            (``docs/client.md``, "Not sent, or outcome unknown").
        rng: Source of backoff jitter (seed it in tests).
        max_lease_s: How long the client keeps extending the visibility of a
            delivery it received and has not handed to you yet (seconds; default
            1 h); then it releases it (uncounted). See ``docs/client.md``, "Leases".

    Yields:
        The connected client. Leaving the block closes it and cancels its tasks. When
        the server's node runs several shards (HELLO_OK says so), a
        :class:`~futureq.client._routing.ShardedClient` with the same methods, which
        sends each request to the shard owning its topic (``docs/sharding.md``).

    Raises:
        ConnectionLostError: no server could be reached within ``connect_timeout_s``
            (at once when the resolver says no server's host name exists); the
            message names every address tried and why it failed.
        RemoteProtocolError: a server refused HELLO (AUTH_FAILED, UNSUPPORTED_VERSION).
        ValueError: a bad argument, a server address that is not ``HOST:PORT`` (no
            port, port 0, a scheme, a space in the host), or a number option out of its
            range (``docs/client.md``, "Argument ranges": timeouts at most one day,
            ``linger_ms`` at most 10 s); raised before anything connects.
    """

    given = parse_servers(servers)

    def new_client(addresses: list[str], named: Sequence[str] = ()) -> Client:
        # server_hostname names the servers given (and their shards), not the
        # members they name: those are checked against their own host.
        return Client(
            addresses,
            ssl_context=ssl_context,
            server_hostname=server_hostname,
            token=token,
            connect_timeout_s=connect_timeout_s,
            request_timeout_s=request_timeout_s,
            max_batch_items=max_batch_items,
            linger_ms=linger_ms,
            ack_level=ack_level,
            retry_unknown_outcome=retry_unknown_outcome,
            rng=rng if rng is not None else random.Random(),
            max_lease_s=max_lease_s,
            hostname_servers=[*given, *named],
        )

    client = new_client(given)
    opened: list[Client] = [client]
    try:
        async with anyio.create_task_group() as nursery:

            async def run(one: Client, *, wait: bool = True) -> None:
                if not wait:
                    # A shard's client: a shard that does not answer (stopped, hung,
                    # restarting) must not keep the client from opening, nor the other
                    # shards from serving (docs/sharding.md); its own calls fail alone.
                    nursery.start_soon(
                        functools.partial(one._maintain_connection, keep_trying=True)
                    )
                else:
                    try:
                        await nursery.start(one._maintain_connection)
                    except BaseException:
                        one._close()
                        raise
                nursery.start_soon(one._run_batcher)
                nursery.start_soon(one._keep_leases)

            await run(client)
            handed: Client = client
            try:
                conn = client._live_connection()
                if conn is not None and conn.shards > 1:
                    from futureq.client._routing import (
                        ShardedClient,
                        ask_slot_map,
                        member_shards,
                        public_seeds,
                        seed_shards,
                        shard_servers,
                    )

                    slot_map, answering, stride = await ask_slot_map(client)
                    seeds = public_seeds(client.servers, slot_map, stride)
                    learned = list(client._learned)

                    async def open_shard(shard: int, address: str) -> Client:
                        # The map's address, the shard on every seed, then on every
                        # member the answering shard's HELLO_OK named (learned, so
                        # checked against their own host): a shard whose process on
                        # the seed node is down still reaches its group elsewhere.
                        others = [
                            *shard_servers(slot_map, shard, seeds, stride)[1:],
                            *member_shards(learned, answering, shard, stride),
                        ]
                        one = new_client(
                            list(dict.fromkeys([address, *others])),
                            seed_shards(seeds, shard, stride),
                        )
                        one.shard = shard
                        opened.append(one)
                        await run(one, wait=False)
                        return one

                    if answering >= 0:  # it fails over to the same shard elsewhere too
                        client.servers = shard_servers(slot_map, answering, seeds, stride)
                        client._hostname_servers |= frozenset(seed_shards(seeds, answering, stride))
                        client.shard = answering
                    shard_clients = [
                        client if shard == answering else await open_shard(shard, address)
                        for shard, address in enumerate(slot_map.addresses)
                    ]
                    handed = ShardedClient(
                        client, slot_map, shard_clients, open_shard, port_stride=stride
                    )
                yield handed
            finally:
                for one in opened:
                    one._close()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # Callers should see `except RequestError`, not a one-element group.
        single = _single_exception(group)
        if single is None:
            raise
        raise single from None
    finally:
        for one in opened:
            one._publish_receive.close()  # the batcher, its only reader, has ended
