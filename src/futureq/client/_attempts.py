"""Whether a request may have taken effect: the verdict over all its attempts.

A call (:meth:`~futureq.client._base.ClientBase._call`) may send one request several
times: after a NOT_LEADER redirect, a GOAWAY, a lost connection (when it may be resent)
or a 3xx refusal. When it finally fails, the error it raises says which of two things
the user is told (``docs/client.md``, "Errors"):

* :class:`~futureq.errors.NotSentError` ("not sent, safe to send again"): **every**
  attempt is known to have taken no effect (:func:`took_no_effect`);
* a plain :class:`~futureq.errors.ConnectionLostError` ("outcome unknown"): at least
  one attempt was sent on a connection that broke before its answer came, or was
  answered with a refusal that does not say nothing was applied.

Before, a call whose attempts all took no effect still ended with a plain
``ConnectionLostError`` once no server answered until its deadline (a single node
stopped with SIGTERM: its GOAWAY said the publish was not served, and no node came
back), so an at-most-once publisher was told "outcome unknown" for a message that was
never stored.
"""

from __future__ import annotations

from typing import Final

from futureq.errors import (
    ConnectionLostError,
    ErrorCode,
    FutureQError,
    NotSentError,
    RequestError,
)

NO_EFFECT_CODES: Final = frozenset(
    {
        ErrorCode.NOT_LEADER,
        ErrorCode.CLOCK_NOT_SYNCHRONIZED,
        ErrorCode.NO_SPACE,
        ErrorCode.TOO_MANY_CONNECTIONS,
    }
)
"""The 3xx refusals that say the request was not applied (``docs/protocol.md``, "Error
codes"): a node that does not lead, will not stamp a publish, or has no disk space
refuses before anything is proposed. ``UNAVAILABLE`` too, but for the refusals that
say "outcome unknown" (:func:`says_outcome_unknown`). Not ``TIMEOUT`` (it means
"outcome unknown"), ``STORAGE_FAILURE`` or ``INTERNAL_ERROR``."""


def says_outcome_unknown(error: RequestError) -> bool:
    """True for an ``UNAVAILABLE`` refusal of a request the node had proposed: it lost
    the leadership, a snapshot replaced the entry, or it stopped, before the entry was
    known to be committed (``docs/raft.md``, "The trio driver and transport"). The
    code is the one of "shutting down", "no quorum", "too many proposals queued",
    which refuse before anything is proposed; only the server's sentence tells them
    apart: it says "outcome unknown" (or "the outcome of this request is unknown")."""
    text = error.message.lower()
    return "outcome" in text and "unknown" in text


def took_no_effect(error: FutureQError) -> bool:
    """True when the failed attempt ``error`` is known to have changed nothing: it
    was not sent (:class:`NotSentError`: no connection, lost before it was written, or
    above a GOAWAY's ``last_request_id``), or the server refused it, with a 2xx code
    (it stores nothing of a refused request), one of :data:`NO_EFFECT_CODES`, or
    ``UNAVAILABLE`` not saying "outcome unknown".

    False for a connection lost with the request sent (its answer never came), a
    protocol error, ``UNAVAILABLE`` "outcome unknown", and the other 3xx codes
    (``TIMEOUT`` says "outcome unknown")."""
    if isinstance(error, NotSentError):
        return True
    if isinstance(error, RequestError):
        if error.code is ErrorCode.UNAVAILABLE:
            return not says_outcome_unknown(error)
        return not error.code.retryable or error.code in NO_EFFECT_CODES
    return False


class Attempts:
    """The attempts at one request so far: whether any may have taken effect.

    One per request (per set of items, for a publish batch): a call that sends the
    same items again in a new request (the rest of a batch after a refused item, its
    halves) passes it on, so an earlier attempt that may have stored them is not
    forgotten.
    """

    __slots__ = ("unknown",)

    def __init__(self) -> None:
        self.unknown: FutureQError | None = None
        """The first attempt that may have taken effect (its error), or None."""

    def note(self, error: FutureQError) -> None:
        """Count one failed attempt (its error)."""
        if self.unknown is None and not took_no_effect(error):
            self.unknown = error

    def copy(self) -> Attempts:
        """The same record, for a part of the items (a half of a batch)."""
        other = Attempts()
        other.unknown = self.unknown
        return other

    def final(self, error: FutureQError) -> FutureQError:
        """The error to raise when the request fails with ``error``, its last attempt.

        A :class:`NotSentError` stays one only while no attempt may have taken effect;
        otherwise it becomes a plain :class:`ConnectionLostError` saying which attempt
        made the outcome unknown. Any other error is returned as it is.
        """
        if self.unknown is None or not isinstance(error, NotSentError):
            return error
        return ConnectionLostError(
            f"the outcome is unknown: an earlier attempt may have taken effect "
            f"({self.unknown}); the last one was not sent ({error})"
        )


def partly_stored(error: FutureQError, stored_count: int, total: int) -> FutureQError:
    """The error of a publish call of ``total`` items that stored ``stored_count`` of
    them (earlier frames of a ``publish_batch``, other shards' parts) before failing
    with ``error``: a :class:`NotSentError` says the whole call took no effect, so it
    becomes a plain :class:`ConnectionLostError` naming what was stored (sent again
    whole, those would be stored twice), with ``error`` as its ``__cause__`` (the
    messages not stored were not sent). A plain :class:`ConnectionLostError` (the
    outcome of the failed part is unknown) gets the same count, so that "outcome
    unknown" is not read as being about the whole call: before, a batch over two shards
    whose shard 1 stopped answering said only that shard 1's outcome was unknown,
    though shard 0 had stored its part, and resending the batch stored that part
    twice. Any other error, or none stored: as it is."""
    if stored_count == 0:
        return error
    if isinstance(error, NotSentError):
        partly = ConnectionLostError(
            f"{error}; but {stored_count} of the {total} messages were stored before it "
            "(their positions and ids are in publish_batch's stored=): send only the others "
            "again"
        )
    elif type(error) is ConnectionLostError:
        partly = ConnectionLostError(
            f"{error}; {stored_count} of the {total} messages were stored all the same "
            "(their positions and ids are in publish_batch's stored=): never send those "
            "again"
        )
    else:
        return error
    partly.__cause__ = error
    return partly
