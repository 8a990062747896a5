"""``partly_stored``: the error of a publish call that stored part of its items (issue 15)."""

from __future__ import annotations

from futureq.client._attempts import partly_stored
from futureq.errors import ConnectionLostError, ErrorCode, NotSentError, RequestError


def test_not_sent_with_others_stored_is_no_longer_not_sent() -> None:
    error = partly_stored(NotSentError("shard 1: no connection"), 2, 3)
    assert type(error) is ConnectionLostError
    assert "2 of the 3 messages were stored before it" in str(error)
    assert isinstance(error.__cause__, NotSentError)


def test_outcome_unknown_with_others_stored_says_so() -> None:
    lost = ConnectionLostError("the outcome is unknown: shard 1 answered nothing")
    error = partly_stored(lost, 2, 3)
    assert type(error) is ConnectionLostError
    assert str(error).startswith("the outcome is unknown: shard 1 answered nothing; ")
    assert "2 of the 3 messages were stored all the same" in str(error)
    assert "never send those again" in str(error)
    assert error.__cause__ is lost


def test_nothing_stored_or_a_refusal_is_left_as_it_is() -> None:
    lost = ConnectionLostError("gone")
    assert partly_stored(lost, 0, 3) is lost
    refused = RequestError(ErrorCode.PAYLOAD_TOO_LARGE, "too large", 1)
    assert partly_stored(refused, 2, 3) is refused
