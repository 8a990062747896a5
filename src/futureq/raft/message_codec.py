"""The wire form of a peer message: a msgpack array whose first element is a small
type tag and whose other elements are the fields in declaration order
(:func:`encode_message`, :func:`decode_message`).

Any byte string either decodes to a message or raises
:class:`~futureq.errors.RemoteProtocolError`; nothing else escapes the decoder.
"""

from __future__ import annotations

import enum

import msgpack

from futureq.raft.basics import LogIndex, NodeId, Term
from futureq.raft.messages import (
    AppendEntries,
    AppendEntriesResponse,
    ClockPing,
    ClockPong,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    Message,
    NotMember,
    ReadIndex,
    ReadIndexResponse,
    RecoveryRequest,
    RecoveryResponse,
    RequestVote,
    RequestVoteResponse,
    Sender,
    TimeoutNow,
)
from futureq.raft.payload_codec import (
    _entry,
    _entry_fields,
    _expect_bool,
    _expect_bytes,
    _expect_int,
    _expect_node,
    _invalid,
    _membership,
    _registry,
    _registry_fields,
    _unpack,
)


class _Tag(enum.IntEnum):
    REQUEST_VOTE = 1
    REQUEST_VOTE_RESPONSE = 2
    APPEND_ENTRIES = 3
    APPEND_ENTRIES_RESPONSE = 4
    HEARTBEAT = 5
    HEARTBEAT_RESPONSE = 6
    INSTALL_SNAPSHOT = 7
    INSTALL_SNAPSHOT_RESPONSE = 8
    TIMEOUT_NOW = 9
    READ_INDEX = 10
    READ_INDEX_RESPONSE = 11
    # 20-24: issue 7 (disk faults and membership trust)
    RECOVERY_REQUEST = 20
    RECOVERY_RESPONSE = 21
    NOT_MEMBER = 22
    # 25-29: issue 8 (cluster time)
    CLOCK_PING = 25
    CLOCK_PONG = 26


def encode_message(message: Message) -> bytes:
    """Encode a peer message as a msgpack array.

    Layout: ``[tag, term, from_id, to_id, incarnation, boot, recovering, ...]`` where
    the middle three are ``message.sender`` and the rest are the other fields in the
    order of the message's class.

    Returns:
        The msgpack bytes.
    """
    sender = message.sender
    head: list[object] = [
        message.term,
        message.from_id,
        message.to_id,
        sender.incarnation,
        sender.boot,
        sender.recovering,
    ]
    body: list[object]
    match message:
        case RequestVote():
            tag = _Tag.REQUEST_VOTE
            body = [
                message.last_log_index,
                message.last_log_term,
                message.pre_vote,
                message.leadership_transfer,
            ]
        case RequestVoteResponse():
            tag = _Tag.REQUEST_VOTE_RESPONSE
            body = [message.granted, message.pre_vote]
        case AppendEntries():
            tag = _Tag.APPEND_ENTRIES
            body = [
                message.prev_log_index,
                message.prev_log_term,
                [_entry_fields(e) for e in message.entries],
                message.leader_commit,
            ]
        case AppendEntriesResponse():
            tag = _Tag.APPEND_ENTRIES_RESPONSE
            body = [message.success, message.index, message.reject_hint, message.log_term]
        case Heartbeat():
            tag = _Tag.HEARTBEAT
            body = [message.commit, message.read_seq]
        case HeartbeatResponse():
            tag = _Tag.HEARTBEAT_RESPONSE
            body = [message.read_seq]
        case InstallSnapshot():
            tag = _Tag.INSTALL_SNAPSHOT
            body = [
                message.snapshot_index,
                message.snapshot_term,
                sorted(message.membership.voters),
                sorted(message.membership.learners),
                message.offset,
                message.data,
                message.done,
                _registry_fields(message.registry),
            ]
        case InstallSnapshotResponse():
            tag = _Tag.INSTALL_SNAPSHOT_RESPONSE
            body = [
                message.snapshot_index,
                message.chunk_offset,
                message.next_offset,
                message.done,
                message.match_index,
            ]
        case TimeoutNow():
            tag = _Tag.TIMEOUT_NOW
            body = []
        case ReadIndex():
            tag = _Tag.READ_INDEX
            body = [message.request_ctx]
        case ReadIndexResponse():
            tag = _Tag.READ_INDEX_RESPONSE
            body = [message.request_ctx, message.index]
        case RecoveryRequest():
            tag = _Tag.RECOVERY_REQUEST
            body = [message.nonce, message.last_log_index, message.last_log_term]
        case RecoveryResponse():
            tag = _Tag.RECOVERY_RESPONSE
            body = [
                message.nonce,
                message.log_index,
                message.log_term,
                message.config_index,
                sorted(message.voters),
                message.commit_index,
                message.known_incarnation,
                message.acked_term,
                message.acked_index,
            ]
        case NotMember():
            tag = _Tag.NOT_MEMBER
            body = [message.removed_at]
        case ClockPing():
            tag = _Tag.CLOCK_PING
            body = [message.mono_us]
        case ClockPong():
            tag = _Tag.CLOCK_PONG
            body = [message.ping_mono_us, message.wall_us, message.in_bound]
    packed: bytes = msgpack.packb([int(tag), *head, *body], use_bin_type=True)
    return packed


_BODY_LENGTHS: dict[_Tag, int] = {
    _Tag.REQUEST_VOTE: 4,
    _Tag.REQUEST_VOTE_RESPONSE: 2,
    _Tag.APPEND_ENTRIES: 4,
    _Tag.APPEND_ENTRIES_RESPONSE: 4,
    _Tag.HEARTBEAT: 2,
    _Tag.HEARTBEAT_RESPONSE: 1,
    _Tag.INSTALL_SNAPSHOT: 8,
    _Tag.INSTALL_SNAPSHOT_RESPONSE: 5,
    _Tag.TIMEOUT_NOW: 0,
    _Tag.READ_INDEX: 1,
    _Tag.READ_INDEX_RESPONSE: 2,
    _Tag.RECOVERY_REQUEST: 3,
    _Tag.RECOVERY_RESPONSE: 9,
    _Tag.NOT_MEMBER: 1,
    _Tag.CLOCK_PING: 1,
    _Tag.CLOCK_PONG: 3,
}
_HEAD_LENGTH = 7
"""tag, term, from_id, to_id, and the sender's incarnation, boot and recovering flag."""
_senders: dict[tuple[int, int, bool], Sender] = {}
"""Decoded sender stamps, shared: a node sees the same few over and over."""


def decode_message(data: bytes) -> Message:
    """Decode bytes written by :func:`encode_message`.

    Raises:
        RemoteProtocolError: ``MALFORMED_FRAME`` if ``data`` is not one msgpack value;
            ``INVALID_FRAME`` if it is not a well-typed message array.
    """
    fields = _unpack(data)
    if not isinstance(fields, list) or not fields:
        raise _invalid("a raft message must be a non-empty msgpack array")
    raw_tag = _expect_int(fields[0], "message tag")
    if raw_tag not in _Tag._value2member_map_:
        raise _invalid(f"raft message tag {raw_tag} is unknown")
    tag = _Tag(raw_tag)
    if len(fields) != _HEAD_LENGTH + _BODY_LENGTHS[tag]:
        raise _invalid(
            f"raft message {tag.name} needs {_HEAD_LENGTH + _BODY_LENGTHS[tag]} fields, "
            f"got {len(fields)}"
        )
    term = Term(_expect_int(fields[1], "term"))
    from_id = _expect_node(fields[2], "from_id")
    to_id = _expect_node(fields[3], "to_id")
    key = (
        _expect_int(fields[4], "sender incarnation"),
        _expect_int(fields[5], "sender boot"),
        _expect_bool(fields[6], "sender recovering"),
    )
    sender = _senders.get(key)
    if sender is None:
        if len(_senders) >= 256:
            _senders.clear()
        sender = _senders[key] = Sender(*key)
    b = fields[_HEAD_LENGTH:]
    return _decode_body(tag, term, from_id, to_id, b, sender)


def _decode_body(  # noqa: PLR0911, PLR0912 - one branch per message type
    tag: _Tag, term: Term, from_id: NodeId, to_id: NodeId, b: list[object], sender: Sender
) -> Message:
    if tag is _Tag.REQUEST_VOTE:
        return RequestVote(
            term,
            from_id,
            to_id,
            LogIndex(_expect_int(b[0], "last_log_index")),
            Term(_expect_int(b[1], "last_log_term")),
            _expect_bool(b[2], "pre_vote"),
            _expect_bool(b[3], "leadership_transfer"),
            sender=sender,
        )
    if tag is _Tag.REQUEST_VOTE_RESPONSE:
        return RequestVoteResponse(
            term,
            from_id,
            to_id,
            _expect_bool(b[0], "granted"),
            _expect_bool(b[1], "pre_vote"),
            sender=sender,
        )
    if tag is _Tag.APPEND_ENTRIES:
        raw_entries = b[2]
        if not isinstance(raw_entries, list):
            raise _invalid("entries must be an array")
        return AppendEntries(
            term,
            from_id,
            to_id,
            LogIndex(_expect_int(b[0], "prev_log_index")),
            Term(_expect_int(b[1], "prev_log_term")),
            tuple(_entry(e) for e in raw_entries),
            LogIndex(_expect_int(b[3], "leader_commit")),
            sender=sender,
        )
    if tag is _Tag.APPEND_ENTRIES_RESPONSE:
        return AppendEntriesResponse(
            term,
            from_id,
            to_id,
            _expect_bool(b[0], "success"),
            LogIndex(_expect_int(b[1], "index")),
            LogIndex(_expect_int(b[2], "reject_hint")),
            Term(_expect_int(b[3], "log_term")),
            sender=sender,
        )
    if tag is _Tag.HEARTBEAT:
        return Heartbeat(
            term,
            from_id,
            to_id,
            LogIndex(_expect_int(b[0], "commit")),
            _expect_int(b[1], "read_seq"),
            sender=sender,
        )
    if tag is _Tag.HEARTBEAT_RESPONSE:
        return HeartbeatResponse(term, from_id, to_id, _expect_int(b[0], "read_seq"), sender=sender)
    if tag is _Tag.INSTALL_SNAPSHOT:
        return InstallSnapshot(
            term,
            from_id,
            to_id,
            LogIndex(_expect_int(b[0], "snapshot_index")),
            Term(_expect_int(b[1], "snapshot_term")),
            _membership(b[2], b[3]),
            _expect_int(b[4], "offset"),
            _expect_bytes(b[5], "data"),
            _expect_bool(b[6], "done"),
            _registry(b[7]),
            sender=sender,
        )
    if tag is _Tag.INSTALL_SNAPSHOT_RESPONSE:
        return InstallSnapshotResponse(
            term,
            from_id,
            to_id,
            LogIndex(_expect_int(b[0], "snapshot_index")),
            _expect_int(b[1], "chunk_offset"),
            _expect_int(b[2], "next_offset"),
            _expect_bool(b[3], "done"),
            LogIndex(_expect_int(b[4], "match_index")),
            sender=sender,
        )
    if tag is _Tag.TIMEOUT_NOW:
        return TimeoutNow(term, from_id, to_id, sender=sender)
    if tag is _Tag.READ_INDEX:
        return ReadIndex(term, from_id, to_id, _expect_bytes(b[0], "request_ctx"), sender=sender)
    if tag is _Tag.READ_INDEX_RESPONSE:
        return ReadIndexResponse(
            term,
            from_id,
            to_id,
            _expect_bytes(b[0], "request_ctx"),
            LogIndex(_expect_int(b[1], "index")),
            sender=sender,
        )
    if tag is _Tag.RECOVERY_REQUEST:
        return RecoveryRequest(
            term,
            from_id,
            to_id,
            _expect_int(b[0], "nonce"),
            LogIndex(_expect_int(b[1], "last_log_index")),
            Term(_expect_int(b[2], "last_log_term")),
            sender=sender,
        )
    if tag is _Tag.RECOVERY_RESPONSE:
        voters = b[4]
        if not isinstance(voters, list):
            raise _invalid("voters must be an array")
        return RecoveryResponse(
            term,
            from_id,
            to_id,
            _expect_int(b[0], "nonce"),
            LogIndex(_expect_int(b[1], "log_index")),
            Term(_expect_int(b[2], "log_term")),
            LogIndex(_expect_int(b[3], "config_index")),
            frozenset(_expect_node(v, "voter id") for v in voters),
            LogIndex(_expect_int(b[5], "commit_index")),
            _expect_int(b[6], "known_incarnation"),
            Term(_expect_int(b[7], "acked_term")),
            LogIndex(_expect_int(b[8], "acked_index")),
            sender=sender,
        )
    if tag is _Tag.CLOCK_PING:
        return ClockPing(term, from_id, to_id, _expect_int(b[0], "mono_us"), sender=sender)
    if tag is _Tag.CLOCK_PONG:
        return ClockPong(
            term,
            from_id,
            to_id,
            _expect_int(b[0], "ping_mono_us"),
            _expect_int(b[1], "wall_us"),
            _expect_bool(b[2], "in_bound"),
            sender=sender,
        )
    assert tag is _Tag.NOT_MEMBER
    return NotMember(term, from_id, to_id, LogIndex(_expect_int(b[0], "removed_at")), sender=sender)
