"""Requests on a sharded node: which shard owns a request's topics, and the SLOT_MAP answer.

:func:`check_shard` refuses a request naming another shard's topic (``WRONG_SHARD``, with
the owner's address); :func:`slot_map_answer` is the map a SLOT_MAP request is answered
with. Both are pure functions of the request and the node's shard role.

Source: ``docs/protocol.md`` (SLOT_MAP, WRONG_SHARD).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from futureq.errors import (
    WrongShardError,
)
from futureq.shards.slots import even_map, topic_slot
from futureq.wire import frames, validation

from . import manage

if TYPE_CHECKING:
    from futureq.shards.layout import ShardRole

    from .broker import Broker


def slot_map_answer(broker: Broker) -> dict[str, Any]:
    """SLOT_MAP_OK's map: the node's slot map, plus ``"shard"``, the answering shard, and
    (sharded nodes) ``"port_stride"``, ``node.shard_port_stride``.

    A node of one shard answers a map with one shard, itself, at its client address.
    """
    shard = broker.shard
    if shard is None:
        return {**even_map([broker.client_address]).to_wire(), "shard": 0}
    return {**shard.slot_map.to_wire(), "shard": shard.index, "port_stride": shard.port_stride}


def check_shard(shard: ShardRole, frame: frames.Frame) -> None:
    """Refuse ``frame`` with WRONG_SHARD when a topic it names belongs to another shard.

    PUBLISH: every item's topic must be this shard's (the first foreign item is named);
    requests naming one topic (SUBSCRIBE, GROUP_CREATE/DELETE, CANCEL, BROWSE,
    BROWSE_COUNTS, REDRIVE, RESCHEDULE, PURGE) must name one of ours. Delivery tags (ACK, NACK, ...)
    belong to the connection, so they are this shard's by construction.

    Raises:
        WrongShardError: with the owning shard's client address.
    """
    topic: str | None = None
    item_index: int | None = None
    match frame:
        case frames.Publish():
            # A batch mostly repeats one topic: hash each run of one topic once (the
            # per-item check cost ~0.3 us a message on the shard's one core).
            owned: str | None = None
            for index, item in enumerate(frame.items):
                if type(item) in (tuple, list) and item and type(item[0]) is str:
                    if item[0] == owned:
                        continue
                    if not shard.owns(item[0]):
                        topic, item_index = item[0], index
                        break
                    owned = item[0]
        case (
            frames.Subscribe()
            | frames.GroupCreate()
            | frames.GroupDelete()
            | frames.Cancel()
            | frames.Browse()
            | frames.BrowseCounts()
            | frames.Redrive()
            | frames.Reschedule()
            | frames.Purge()
        ):
            if not shard.owns(frame.topic):
                topic = frame.topic
    if topic is None:
        return
    # A name no shard would take is refused here, as its owner would refuse it, so the
    # answer does not depend on the shard asked. Names from before the grammar cannot
    # exist on a sharded node (shards came after it), so the grammar is the whole rule:
    # a PUBLISH takes names of it, the other requests those and their dead-letter topics.
    if item_index is not None:
        validation.check_publish_topic(topic, item_index)
    else:
        if isinstance(frame, frames.Redrive):
            manage.check_redrive_topic(topic)  # the owner's first check of a REDRIVE
        validation.check_names_can_exist(topic, getattr(frame, "group", None))
    owner = shard.slot_map.shard_of(topic)
    address = shard.slot_map.addresses[owner]
    raise WrongShardError(
        address,
        f"topic {topic!r} (slot {topic_slot(topic)}) belongs to shard {owner} of this node, "
        f"at {address}; this is shard {shard.index}. Send it there (ask SLOT_MAP for the map)",
        item_index,
    )
