"""The publish path's msgspec encoder writes the very bytes msgpack writes.

QueueState encodes message records, fresh schedule values and the digested changes,
and :func:`futureq.state.commands.encode` every log entry, with msgspec (faster per
call); what is stored, the log's entries and the applied digest must stay
byte-identical to msgpack's ``Packer(use_bin_type=True)``, which every other writer and
every recorded digest (simulation, replay) use. Checked over every type the state
writes, at the bounds of each msgpack integer and length encoding.
"""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from futureq.state import commands, layout

_pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack

_INT_BOUNDS = [
    bound + delta
    for bound in (0, 2**7, 2**8, 2**15, 2**16, 2**31, 2**32, 2**63)
    for delta in (-1, 0, 1)
    if -(2**63) <= bound + delta < 2**64
] + [-(2**5) - 1, -(2**5), -(2**7) - 1, -(2**15) - 1, -(2**31) - 1, -(2**63), 2**64 - 1]

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(_INT_BOUNDS),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.text(max_size=40),
    st.binary(max_size=300),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.tuples(inner, inner),
        st.dictionaries(st.one_of(st.text(max_size=8), st.binary(max_size=8)), inner, max_size=5),
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(_values)
def test_msgspec_encodes_every_state_type_as_msgpack_does(value: Any) -> None:
    assert layout._encode(value) == _pack(value)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["messages", "schedule", "groups", "meta", "index"]),
        st.dictionaries(st.binary(min_size=1, max_size=20), st.one_of(st.none(), st.binary())),
    )
)
def test_the_digested_changes_are_encoded_as_msgpack_does(changes: Any) -> None:
    assert layout._encode(changes) == _pack(changes)


def test_lengths_at_the_bounds_of_each_msgpack_length_encoding() -> None:
    for size in (0, 15, 16, 31, 32, 255, 256, 65535, 65536):
        text, raw = "t" * size, b"b" * size
        assert layout._encode(text) == _pack(text)
        assert layout._encode(raw) == _pack(raw)
        if size <= 65536:
            items = list(range(size % 70_000))
            assert layout._encode(items) == _pack(items)
            mapping = {i.to_bytes(4, "big"): None for i in range(size)}
            assert layout._encode(mapping) == _pack(mapping)


def test_the_applied_digest_and_the_records_are_msgpack_of_what_was_written() -> None:
    """End to end: a PUBLISH (with and without TTL, two topics, a new group) stores
    msgpack records, and its digest is CRC-32 of msgpack of the changes it wrote."""
    import zlib

    from state_helpers import SpyStore

    from futureq.state import commands
    from futureq.state.queue_state import QueueState
    from futureq.state.store import MemoryStore

    store = SpyStore(MemoryStore())
    state = QueueState(store)
    items = [("a", b"p" * 100, 5_000 + i, None if i % 2 else 60_000) for i in range(50)]
    items += [("b", b"", 2**40, None), ("a", b"x" * 300, 2**33, 1)]
    state.apply(1, commands.publish(1_000, items))
    (written,) = store.writes
    digested = {family: dict(values) for family, values in written.items()}
    digest = digested["meta"].pop(b"applied_digest")
    expected = zlib.crc32(_pack(digested), zlib.crc32((1).to_bytes(8, "big"), 0))
    assert digest == expected.to_bytes(4, "big") == state.applied_digest.to_bytes(4, "big")
    first = commands.message_id(1, 0)
    for position, (topic, payload, due_ms, ttl_ms) in enumerate(items):
        record = written["messages"][(first + position).to_bytes(8, "big")]
        assert record is not None
        short = [topic, payload, 1_000, due_ms, 1]
        assert record == (_pack(short) if ttl_ms is None else record)
        if ttl_ms is not None:
            assert msgpack.unpackb(record)[:5] == short


def test_commands_are_encoded_as_msgpack_does() -> None:
    """Log entries keep the bytes msgpack wrote for them (kinds are IntEnums)."""
    key = commands.schedule_key(3, 2**40, (7 << 16) + 1)
    settings = commands.GroupSettings(100, 2, True)
    lists: list[list[Any]] = [
        commands.publish_command(
            2**41,
            [("t", b"p", 2**41, None), ("t", b"", 0, 2**33, {"k": "v"}, "key")],
            settings,
            60_000,
        ),
        [commands.CommandKind.ACK, [key, key]],
        [commands.CommandKind.NACK, 5, 0, [(key, 1), (key, 2, None)], "why", True, [1, 2]],
        [commands.CommandKind.CREATE_GROUP, "t", "g", None, 3, settings.to_wire(), None, True],
        [commands.CommandKind.NODE_ADDRESS, 2**31 - 1, "a:1", None],
        [commands.CommandKind.RESCHEDULE, 1, "t", None, [2**63, 0], -1],
        [commands.CommandKind.NOOP],
    ]
    for command in lists:
        assert commands.encode(command) == _pack(command)
    assert commands.NOOP == _pack([0])


@settings(max_examples=200, deadline=None)
@given(st.lists(_values, max_size=6))
def test_command_encoding_is_msgpack_for_every_state_type(values: Any) -> None:
    command = [commands.CommandKind.PUBLISH, *values]
    assert commands.encode(command) == _pack(command)
