"""How a node-wide call's failures on several shards read (``combine_shard_errors``)."""

from __future__ import annotations

from futureq.client._routing import combine_shard_errors
from futureq.errors import ConnectionLostError, ErrorCode, RequestError
from futureq.shards.slots import even_map


def test_shards_that_failed_alike_are_named_once() -> None:
    """Found by a tester: ``cluster remove-node`` on a 2-shard single node printed the
    same refusal twice, once per shard."""
    slot_map = even_map(["127.0.0.1:7450", "127.0.0.1:7451", "127.0.0.1:7452"])
    same = "node 5 is not a member"
    error = combine_shard_errors(
        {
            0: RequestError(ErrorCode.INVALID_ARGUMENT, same),
            1: RequestError(ErrorCode.INVALID_ARGUMENT, f"shard 1: {same}"),
            2: RequestError(ErrorCode.INVALID_ARGUMENT, "another reason"),
        },
        slot_map,
    )
    assert isinstance(error, RequestError) and error.code is ErrorCode.INVALID_ARGUMENT
    assert error.message == (
        f"shard 0 and shard 1 (127.0.0.1:7450, 127.0.0.1:7451): {same}; "
        "shard 2 (127.0.0.1:7452): another reason"
    )


def test_one_failed_shard_is_named_with_its_address() -> None:
    slot_map = even_map(["127.0.0.1:7450", "127.0.0.1:7451"])
    error = combine_shard_errors({1: ConnectionLostError("gone")}, slot_map)
    assert isinstance(error, ConnectionLostError)
    assert str(error) == "shard 1 (127.0.0.1:7451): gone"
