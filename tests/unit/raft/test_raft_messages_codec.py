"""The msgpack form of raft messages: round trip, and the fuzz invariant that any
bytes either decode or raise RemoteProtocolError (STYLE.md §8, h11's fuzz rule)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from futureq.errors import ErrorCode, RemoteProtocolError
from futureq.raft.message_codec import decode_message, encode_message
from futureq.raft.messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    LogIndex,
    Message,
    NodeId,
    NotMember,
    ReadIndex,
    ReadIndexResponse,
    RecoveryRequest,
    RecoveryResponse,
    RequestVote,
    RequestVoteResponse,
    Sender,
    Term,
    TimeoutNow,
)
from futureq.raft.payload_codec import (
    decode_config_change,
    decode_registry,
    encode_config_change,
    encode_registry,
)
from futureq.raft.values import (
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryKind,
    MemberRecord,
    Membership,
    Registry,
)

counts = st.integers(min_value=0, max_value=2**63 - 1)
terms = counts.map(Term)
indexes = counts.map(LogIndex)
node_ids = st.integers(min_value=1, max_value=2**32).map(NodeId)
entries = st.builds(Entry, terms, indexes, st.sampled_from(EntryKind), st.binary(max_size=64))


@st.composite
def memberships(draw: st.DrawFn) -> Membership:
    voters = draw(st.frozensets(node_ids, max_size=5))
    learners = draw(st.frozensets(node_ids, max_size=3)) - voters
    return Membership(voters, learners)


@st.composite
def registries(draw: st.DrawFn) -> Registry:
    ids = sorted(draw(st.frozensets(node_ids, max_size=5)))
    records = tuple(MemberRecord(n, draw(counts), draw(terms), draw(indexes)) for n in ids)
    removed_ids = sorted(draw(st.frozensets(node_ids, max_size=3)))
    return Registry(records, tuple((n, draw(indexes)) for n in removed_ids))


senders = st.builds(Sender, counts, counts, st.booleans())

messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(RequestVote, terms, node_ids, node_ids, indexes, terms, st.booleans(), st.booleans(),
              sender=senders),
    st.builds(RequestVoteResponse, terms, node_ids, node_ids, st.booleans(), st.booleans(),
              sender=senders),
    st.builds(
        AppendEntries, terms, node_ids, node_ids, indexes, terms,
        st.lists(entries, max_size=4).map(tuple), indexes, sender=senders,
    ),
    st.builds(
        AppendEntriesResponse, terms, node_ids, node_ids, st.booleans(), indexes, indexes, terms,
        sender=senders,
    ),
    st.builds(Heartbeat, terms, node_ids, node_ids, indexes, counts, sender=senders),
    st.builds(HeartbeatResponse, terms, node_ids, node_ids, counts, sender=senders),
    st.builds(
        InstallSnapshot, terms, node_ids, node_ids, indexes, terms, memberships(), counts,
        st.binary(max_size=64), st.booleans(), registries(), sender=senders,
    ),
    st.builds(
        InstallSnapshotResponse, terms, node_ids, node_ids, indexes, counts, counts,
        st.booleans(), indexes, sender=senders,
    ),
    st.builds(TimeoutNow, terms, node_ids, node_ids, sender=senders),
    st.builds(ReadIndex, terms, node_ids, node_ids, st.binary(max_size=16), sender=senders),
    st.builds(ReadIndexResponse, terms, node_ids, node_ids, st.binary(max_size=16), indexes,
              sender=senders),
    st.builds(RecoveryRequest, terms, node_ids, node_ids, counts, indexes, terms, sender=senders),
    st.builds(
        RecoveryResponse, terms, node_ids, node_ids, counts, indexes, terms, indexes,
        st.frozensets(node_ids, max_size=5), indexes, counts, terms, indexes, sender=senders,
    ),
    st.builds(NotMember, terms, node_ids, node_ids, indexes, sender=senders),
)  # fmt: skip


@given(messages)
def test_every_message_round_trips(message: Message) -> None:
    assert decode_message(encode_message(message)) == message


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_remote_protocol_error(data: bytes) -> None:
    try:
        decode_message(data)
    except RemoteProtocolError as exc:
        assert exc.code in (ErrorCode.MALFORMED_FRAME, ErrorCode.INVALID_FRAME)


@given(messages, st.data())
def test_mutated_fields_decode_or_raise_remote_protocol_error(
    message: Message, data: st.DataObject
) -> None:
    fields = msgpack.unpackb(encode_message(message))
    position = data.draw(st.integers(0, len(fields) - 1))
    fields[position] = data.draw(
        st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=3),
                  st.binary(max_size=3), st.lists(st.integers(0, 3), max_size=4))
    )  # fmt: skip
    try:
        decode_message(msgpack.packb(fields))
    except RemoteProtocolError:
        pass


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (b"\xc1", ErrorCode.MALFORMED_FRAME),  # never-used msgpack byte
        (msgpack.packb([1, 2]) + b"x", ErrorCode.MALFORMED_FRAME),  # trailing bytes
        (msgpack.packb({"a": 1}), ErrorCode.INVALID_FRAME),
        (msgpack.packb([99, 1, 1, 1]), ErrorCode.INVALID_FRAME),  # unknown tag
        (msgpack.packb([9, 1, 1]), ErrorCode.INVALID_FRAME),  # too few fields
        (msgpack.packb([9, 1, 0, 1]), ErrorCode.INVALID_FRAME),  # node id 0
        (msgpack.packb([9, -1, 1, 1]), ErrorCode.INVALID_FRAME),  # negative term
        (
            msgpack.packb([2, 1, 1, 2, 0, 0, False, 1, False]),
            ErrorCode.INVALID_FRAME,
        ),  # int as bool
        (
            msgpack.packb([10, 1, 1, 2, 0, 0, False, "ctx"]),
            ErrorCode.INVALID_FRAME,
        ),  # str, not bytes
        (msgpack.packb([9, 1, 1, 2, 0, 0, 1]), ErrorCode.INVALID_FRAME),  # recovering not a bool
        (msgpack.packb([9, 1, 1, 2, -1, 0, False]), ErrorCode.INVALID_FRAME),  # bad incarnation
    ],
)
def test_bad_input_raises_with_stable_code(value: bytes, code: ErrorCode) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        decode_message(value)
    assert info.value.code is code


def test_encoding_is_a_positional_array_with_type_tag() -> None:
    message = TimeoutNow(Term(3), NodeId(1), NodeId(2), sender=Sender(7, 8, True))
    assert msgpack.unpackb(encode_message(message)) == [9, 3, 1, 2, 7, 8, True]
    assert msgpack.unpackb(encode_message(TimeoutNow(Term(3), NodeId(1), NodeId(2)))) == [
        9, 3, 1, 2, 0, 0, False,
    ]  # fmt: skip


@given(registries())
def test_registry_payload_round_trips(registry: Registry) -> None:
    assert decode_registry(encode_registry(registry)) == registry


def test_registry_payload_refuses_unsorted_or_repeated_ids() -> None:
    unsorted = msgpack.packb([[[2, 1, 1, 1], [1, 1, 1, 1]], []])
    repeated = msgpack.packb([[], [[3, 5], [3, 6]]])
    for data in (unsorted, repeated, msgpack.packb([[], []]) + b"x", msgpack.packb([1])):
        with pytest.raises(RemoteProtocolError):
            decode_registry(data)


@given(st.sampled_from(ConfChangeOp), node_ids, memberships())
def test_config_change_payload_round_trips(
    op: ConfChangeOp, node_id: NodeId, membership: Membership
) -> None:
    change = ConfChange(op, node_id)
    assert decode_config_change(encode_config_change(change, membership)) == (change, membership)
