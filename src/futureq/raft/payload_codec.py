"""The msgpack form of Raft's log payloads: a CONFIG_CHANGE entry's change and
membership, a MEMBER_RECORDS entry's (and a snapshot's) registry; and the field
checkers the peer-message decoder shares (:mod:`futureq.raft.message_codec`).

Any byte string either decodes or raises :class:`~futureq.errors.RemoteProtocolError`
(``INVALID_FRAME``); nothing else escapes a decoder.
"""

from __future__ import annotations

import msgpack

from futureq.errors import ErrorCode, RemoteProtocolError
from futureq.raft.basics import LogIndex, NodeId, Term
from futureq.raft.values import (
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryKind,
    MemberRecord,
    Membership,
    Registry,
)
from futureq.wire.codec import msgpack_fault


def encode_config_change(change: ConfChange, membership: Membership) -> bytes:
    """Encode a CONFIG_CHANGE entry's data: the change and the full resulting membership.

    Storing the full membership (not only the delta) lets a node that joins with an
    empty configuration learn it from any config entry or snapshot it receives.
    """
    packed: bytes = msgpack.packb(
        [int(change.op), change.node_id, sorted(membership.voters), sorted(membership.learners)]
    )
    return packed


def decode_config_change(data: bytes) -> tuple[ConfChange, Membership]:
    """Decode what :func:`encode_config_change` wrote.

    Raises:
        RemoteProtocolError: If ``data`` is not a valid config change.
    """
    value = _unpack(data)
    fields = _expect_list(value, 4, "config change")
    op = _expect_int(fields[0], "config change op")
    if op not in ConfChangeOp._value2member_map_:
        raise _invalid(f"config change op {op} is unknown")
    node_id = _expect_node(fields[1], "config change node id")
    membership = _membership(fields[2], fields[3])
    return ConfChange(ConfChangeOp(op), node_id), membership


def _registry_fields(registry: Registry) -> list[object]:
    return [
        [[r.node_id, r.incarnation, r.acked_term, r.acked_index] for r in registry.records],
        [[node_id, index] for node_id, index in registry.removed],
    ]


def _registry(value: object) -> Registry:
    fields = _expect_list(value, 2, "registry")
    records_raw, removed_raw = fields
    if not isinstance(records_raw, list) or not isinstance(removed_raw, list):
        raise _invalid("registry records and removals must be arrays")
    records = []
    for raw in records_raw:
        item = _expect_list(raw, 4, "member record")
        records.append(
            MemberRecord(
                _expect_node(item[0], "member record node id"),
                _expect_int(item[1], "member record incarnation"),
                Term(_expect_int(item[2], "member record term")),
                LogIndex(_expect_int(item[3], "member record index")),
            )
        )
    removed = []
    for raw in removed_raw:
        item = _expect_list(raw, 2, "removal")
        removed.append(
            (_expect_node(item[0], "removed node id"), LogIndex(_expect_int(item[1], "removal")))
        )
    ids = [r.node_id for r in records]
    removed_ids = [n for n, _ in removed]
    if ids != sorted(set(ids)) or removed_ids != sorted(set(removed_ids)):
        raise _invalid("registry entries must be sorted by node id, each id once")
    return Registry(tuple(records), tuple(removed))


def encode_registry(registry: Registry) -> bytes:
    """Encode a MEMBER_RECORDS entry's data (and a snapshot's registry).

    Returns:
        msgpack ``[[[node, incarnation, acked_term, acked_index], ...], [[node, index], ...]]``.
    """
    packed: bytes = msgpack.packb(_registry_fields(registry))
    return packed


def decode_registry(data: bytes) -> Registry:
    """Decode what :func:`encode_registry` wrote.

    Raises:
        RemoteProtocolError: If ``data`` is not a valid registry.
    """
    return _registry(_unpack(data))


def _entry_fields(entry: Entry) -> list[object]:
    return [entry.term, entry.index, int(entry.kind), entry.data]


def _unpack(data: bytes) -> object:
    try:
        value: object = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:  # msgpack raises many types for bad input; all mean "malformed"
        raise RemoteProtocolError(
            ErrorCode.MALFORMED_FRAME, f"raft message is not valid msgpack: {msgpack_fault(exc)}"
        ) from None
    return value


def _invalid(message: str) -> RemoteProtocolError:
    return RemoteProtocolError(ErrorCode.INVALID_FRAME, message)


def _expect_int(value: object, name: str) -> int:
    # bool is an int subclass in Python; msgpack keeps them apart, so must we.
    if type(value) is not int or value < 0:
        raise _invalid(f"{name} must be a non-negative integer, got {value!r:.40}")
    return value


def _expect_node(value: object, name: str) -> NodeId:
    number = _expect_int(value, name)
    if number < 1:
        raise _invalid(f"{name} must be a node id >= 1, got {number}")
    return NodeId(number)


def _expect_bool(value: object, name: str) -> bool:
    if type(value) is not bool:
        raise _invalid(f"{name} must be a boolean, got {value!r:.40}")
    return value


def _expect_bytes(value: object, name: str) -> bytes:
    if type(value) is not bytes:
        raise _invalid(f"{name} must be binary, got {type(value).__name__}")
    return value


def _expect_list(value: object, length: int, name: str) -> list[object]:
    if not isinstance(value, list) or len(value) != length:
        raise _invalid(f"{name} must be an array of {length} elements")
    return value


def _entry(value: object) -> Entry:
    fields = _expect_list(value, 4, "entry")
    kind = _expect_int(fields[2], "entry kind")
    if kind not in EntryKind._value2member_map_:
        raise _invalid(f"entry kind {kind} is unknown")
    return Entry(
        Term(_expect_int(fields[0], "entry term")),
        LogIndex(_expect_int(fields[1], "entry index")),
        EntryKind(kind),
        _expect_bytes(fields[3], "entry data"),
    )


def _membership(voters: object, learners: object) -> Membership:
    if not isinstance(voters, list) or not isinstance(learners, list):
        raise _invalid("membership voters and learners must be arrays")
    voter_ids = frozenset(_expect_node(v, "voter id") for v in voters)
    learner_ids = frozenset(_expect_node(v, "learner id") for v in learners)
    if voter_ids & learner_ids:
        raise _invalid("a node cannot be both voter and learner")
    return Membership(voter_ids, learner_ids)
