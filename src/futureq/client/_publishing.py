"""Publishing: :meth:`~PublishingClient.publish`, whose concurrent calls the batcher
coalesces into PUBLISH frames, and :meth:`~PublishingClient.publish_batch`.

A shared batch never fails for one caller's bad item: the server stores nothing of a
refused batch, so the item it names is failed and the rest sent again; a batch over a
server's limits is sent in halves. Source: ``docs/protocol.md``, "PUBLISH";
``docs/client.md``, "Publishing".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio

from futureq.client._attempts import Attempts, partly_stored
from futureq.client._base import MAX_BATCHES_IN_FLIGHT, ClientBase, _expect
from futureq.client._batching import (
    PublishItem,
    check_publish_items,
    ids_from_publish_ok,
    refused_item,
    split_by_size,
    without_item,
)
from futureq.client._connection import RequestTooLargeError, UnencodableError
from futureq.client._pending import _Gathering, _PendingPublish
from futureq.errors import (
    ClientClosedError,
    ConnectionLostError,
    ErrorCode,
    FutureQError,
    NotLeaderError,
    NotSentError,
    RequestError,
)
from futureq.wire import frames


class PublishingClient(ClientBase):
    """The publishing calls of :class:`~futureq.client.client.Client`."""

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
        """Publish one message; concurrent calls share PUBLISH frames.

        Args:
            topic: Topic name (1..255 UTF-8 bytes, not ending in ``.dlq``).
            payload: Message body (bytes).
            delay_ms: Deliver this many ms after it is stored (>= 0).
            deliver_at_ms: Deliver at this time (ms since the Unix epoch); not with
                ``delay_ms``. Neither: due at once.
            ttl_ms: How long after falling due it may still be delivered (ms, > 0).
            headers: A small str -> str map kept with the message (see
                :class:`PublishItem`).
            idempotency_key: With it, a retry after a lost answer stores nothing and
                returns the first message's id (see :class:`PublishItem`).

        Returns:
            The message id (with ``idempotency_key``: the earlier message's, if the key
            still names one).

        Raises:
            RequestError: the server refused this message (its code says why), or
                a 3xx error / TIMEOUT persisted until ``request_timeout_s``.
            NotSentError: the message was not stored and may be sent again: no
                server was reachable before the deadline, or every attempt took no
                effect (not sent, above a GOAWAY's last request served, refused
                NOT_LEADER, ...); a :class:`ConnectionLostError`.
            ConnectionLostError: (not a :class:`NotSentError`) the outcome is
                unknown: the connection broke with the message in flight (raised at
                once with ``retry_unknown_outcome=False``), and it may or may not be
                stored.
            ClientClosedError: the client was closed.
            TypeError: payload is not bytes.

        A message that cannot be sent at all (an int beyond 64 bits, text with a lone
        surrogate, more bytes than one frame carries) raises its ``RequestError``
        here, before it joins a PUBLISH shared with other callers.
        """
        self._check_open()
        item = PublishItem(
            topic, payload, delay_ms, deliver_at_ms, ttl_ms, headers, idempotency_key
        )
        self._check_fits_a_frame(item)
        deadline = anyio.current_time() + self.request_timeout_s
        pending = _PendingPublish(item, deadline)
        queued = False
        with anyio.CancelScope(deadline=deadline) as scope:
            try:
                await self._publish_send.send(pending)
            except anyio.ClosedResourceError:
                raise ClientClosedError("the client was closed") from None
            queued = True
            # The batcher resolves every item by its deadline; the extra second only
            # guards against a bug leaving a caller waiting for ever.
            scope.deadline = deadline + 1.0
            await pending.event.wait()
        if not queued:
            # The batcher's queue stayed full (earlier publishes waiting for a server)
            # until the deadline: this one never left the caller.
            raise NotSentError(
                f"publish to {topic!r} waited {self.request_timeout_s:g} s "
                "(request_timeout_s) for room in the client's publish queue, full of "
                "earlier publishes; it was not sent"
            )
        if pending.error is not None:
            raise pending.error
        if pending.message_id is None:
            raise RequestError(
                ErrorCode.TIMEOUT,
                f"publish to {topic!r} got no answer within {self.request_timeout_s:g} s; "
                "its outcome is unknown",
            )
        return pending.message_id

    async def publish_batch(
        self,
        items: Sequence[PublishItem],
        *,
        duplicates: list[int] | None = None,
        stored: dict[int, int] | None = None,
    ) -> list[int]:
        """Publish many messages, in as few PUBLISH frames as the limits allow.

        A frame holds at most ``max_batch_items`` items and at most the server's
        ``max_frame_bytes`` (HELLO_OK) of encoded bytes, so a long list, or one of large
        payloads, is sent as several frames, in order. Each frame is atomic: the server
        stores all of its items or none. If one is refused, the frames before it are
        stored and the ones after it are not sent. An item too large for any frame
        is refused before anything is sent.

        Args:
            items: The messages, in order.
            duplicates: If given, the positions (in ``items``) of items that stored
                nothing because their ``idempotency_key`` named an earlier message
                are appended to it, in order.
            stored: If given, gets ``{position in items: message id}`` for every item
                stored, frame by frame, so that after an error it says which items
                were stored (those of the frames before the refused one) and a caller
                can resend only the others. A sharded client fills it for every shard
                that stored its part (``ShardedClient.publish_batch``).

        Returns:
            Their message ids, in the same order (a duplicate's: the earlier message's).

        Raises:
            RequestError: a frame was refused; ``item_index`` is the index **in
                ``items``** of the first bad item when the server named one.
                PAYLOAD_TOO_LARGE (nothing sent) for an item that alone encodes to
                more than one frame carries.
            NotSentError: nothing of the list was stored (as :meth:`publish`).
            ConnectionLostError: as :meth:`publish`, for the frame that failed; also
                when that frame was not sent but frames before it were stored (the
                message says how many; ``stored`` says which).
            ClientClosedError: as :meth:`publish`.
        """
        check_publish_items(items)
        for position, item in enumerate(items):
            self._check_fits_a_frame(item, position)
        ids: list[int] = []
        offset = 0
        max_items = self._max_batch_items
        attempts = Attempts()  # of the items from ``offset`` on, across re-splits
        while offset < len(items):
            end = split_by_size(items, offset, max_items, self._item_bytes_budget())
            chunk = items[offset:end]
            wire_items = [item.to_wire() for item in chunk]
            level = self._ack_level
            try:
                answer = await self._call(
                    _publish_frame(level, wire_items),
                    retry_unknown=self._retry_unknown_outcome,
                    attempts=attempts,
                )
            except RequestTooLargeError:
                if len(chunk) == 1:
                    self._check_fits_a_frame(chunk[0], offset)  # a smaller server's limit
                    raise
                max_items = max(1, len(chunk) // 2)  # and so for the rest of the list
                continue
            except ConnectionLostError as exc:
                # Not sent (or outcome unknown), but the frames before it were stored:
                # the message says so, not only about this frame.
                raise partly_stored(exc, offset, len(items))  # noqa: B904 - its own cause
            except RequestError as exc:
                if exc.code is ErrorCode.BATCH_TOO_LARGE and len(chunk) > 1:
                    max_items = max(1, len(chunk) // 2)  # the server's limit is lower
                    continue
                index = refused_item(exc, len(chunk))
                if index is None or isinstance(exc, NotLeaderError):
                    raise
                raise RequestError(exc.code, exc.message, offset + index) from None
            ok = _expect(answer, frames.PublishOk)
            got = ids_from_publish_ok(ok.first_id, ok.count, len(chunk), ok.duplicates)
            ids.extend(got)
            if stored is not None:
                stored.update(zip(range(offset, end), got, strict=True))
            if duplicates is not None:
                duplicates.extend(offset + position for position, _ in ok.duplicates or ())
            offset = end
            attempts = Attempts()
        return ids

    async def _run_batcher(self) -> None:
        """Coalesce :meth:`publish` calls into PUBLISH frames until the client closes.

        Takes everything already queued (up to ``max_batch_items`` items and a frame's
        worth of encoded bytes), waits up to ``linger_ms`` for more, and keeps up to
        ``MAX_BATCHES_IN_FLIGHT`` frames outstanding; while they are in flight new calls
        pile up into the next batch, so batches grow with load by themselves. A call
        that would overfill a batch starts the next one (order is kept).
        """
        in_flight = anyio.Semaphore(MAX_BATCHES_IN_FLIGHT)
        carry: list[_PendingPublish] = []  # the call that did not fit the last batch
        async with anyio.create_task_group() as nursery:
            while True:
                if carry:
                    first = carry.pop()
                else:
                    try:
                        first = await self._publish_receive.receive()
                    except anyio.EndOfStream:
                        break
                batch = _Gathering(first, self._item_bytes_budget(), self._max_batch_items)
                while not batch.full:
                    try:
                        batch.add(self._publish_receive.receive_nowait(), carry)
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                if self._linger_s > 0 and not batch.full:
                    with anyio.move_on_after(self._linger_s):
                        while not batch.full:
                            try:
                                batch.add(await self._publish_receive.receive(), carry)
                            except anyio.EndOfStream:
                                break
                await in_flight.acquire()
                nursery.start_soon(self._send_batch, batch.pending, in_flight)

    async def _send_batch(self, batch: list[_PendingPublish], in_flight: anyio.Semaphore) -> None:
        try:
            await self._publish_pending(batch, Attempts())
        finally:
            in_flight.release()

    async def _publish_pending(self, batch: list[_PendingPublish], attempts: Attempts) -> None:
        """Send ``batch``; on a refusal naming an item, fail it and resend the rest.

        Other callers' messages never fail because one item of a shared batch is bad:
        the server stores nothing of a refused batch, so the rest is simply resent.
        A batch the client cannot send whole (over a smaller server's frame limit, or
        a value it cannot encode) is sent in halves, down to the one item at fault.
        ``attempts`` records the batch's attempts so far, so that an item is failed
        with :class:`NotSentError` only when none of them may have stored it.
        """
        while batch:
            now = anyio.current_time()
            for pending in batch:
                if pending.deadline <= now:
                    pending.fail(
                        RequestError(ErrorCode.TIMEOUT, "publish was not answered in time")
                        if attempts.unknown is not None
                        else NotSentError(
                            f"publish to {pending.item.topic!r} was not sent: its "
                            f"request_timeout_s ({self.request_timeout_s:g} s) passed while "
                            "it waited for earlier publishes to be answered"
                        )
                    )
            batch = [pending for pending in batch if not pending.event.is_set()]
            if not batch:
                return
            wire_items = [pending.item.to_wire() for pending in batch]
            level = self._ack_level
            try:
                answer = await self._call(
                    _publish_frame(level, wire_items),
                    retry_unknown=self._retry_unknown_outcome,
                    deadline=min(pending.deadline for pending in batch),
                    attempts=attempts,
                )
                ok = _expect(answer, frames.PublishOk)
                for pending, message_id in zip(
                    batch,
                    ids_from_publish_ok(ok.first_id, ok.count, len(batch), ok.duplicates),
                    strict=True,
                ):
                    pending.resolve(message_id)
                return
            except (RequestTooLargeError, UnencodableError) as exc:
                if len(batch) > 1:
                    await self._publish_halves(batch, attempts)
                    return
                error: FutureQError = (
                    RequestError(ErrorCode.PAYLOAD_TOO_LARGE, exc.message)
                    if isinstance(exc, RequestTooLargeError)
                    else RequestError(exc.code, exc.message)
                )
            except RequestError as exc:
                index = refused_item(exc, len(batch))
                if index is not None and not isinstance(exc, NotLeaderError):
                    batch[index].fail(without_item(exc))
                    batch = batch[:index] + batch[index + 1 :]
                    continue
                if exc.code is ErrorCode.BATCH_TOO_LARGE and len(batch) > 1:
                    await self._publish_halves(batch, attempts)
                    return
                error = exc
            except FutureQError as exc:
                error = exc
            for pending in batch:
                pending.fail(error)
            return

    async def _publish_halves(self, batch: list[_PendingPublish], attempts: Attempts) -> None:
        middle = len(batch) // 2
        await self._publish_pending(batch[:middle], attempts.copy())
        await self._publish_pending(batch[middle:], attempts.copy())


def _publish_frame(level: frames.AckLevel, wire_items: list[Any]) -> Callable[[int], frames.Frame]:
    return lambda rid: frames.Publish(rid, level, wire_items)
