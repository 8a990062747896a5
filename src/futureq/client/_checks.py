"""Argument checks the client makes before a request leaves (sans-IO).

A field of the wrong type would reach the server as a request with wrong fields, which
the server refuses alone with INVALID_FIELD (servers before it closed the whole
connection, so deliveries held on it came again). These checks refuse such a call with
``TypeError`` before anything is sent, as Python does for a wrong argument type
(``docs/client.md``, "Errors"). Values of the right type are the
server's to check (a negative id, a delay too long, too many headers): it refuses
them per request, with a code naming the item, and the connection stays. The one
exception is a value that cannot be *encoded* at all (an int beyond 64 bits, a str
with a lone surrogate): an item of a list (a message id, a PUBLISH item's field) is
refused here with the server's code for that field and its position
(:func:`utf8_bytes`, :func:`fits_wire_int`), so it fails its own call and never a
PUBLISH frame shared with other callers; a single argument (``due_ms``, ``limit``, a
node id) with ``ValueError`` naming it and the range (:func:`check_wire_int`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from futureq.config import split_host_port
from futureq.errors import ErrorCode, RequestError
from futureq.state.commands import MAX_NODE_ID
from futureq.wire.validation import MAX_CREDIT as PROTOCOL_MAX_CREDIT
from futureq.wire.validation import MAX_VISIBILITY_TIMEOUT_MS


def _type_name(value: Any) -> str:
    return type(value).__name__


def check_str(name: str, value: Any, *, optional: bool = False) -> None:
    """``value`` is a ``str`` (or None when ``optional``).

    Raises:
        TypeError: anything else.
    """
    if value is None and optional:
        return
    if type(value) is not str:
        wanted = "a str or None" if optional else "a str"
        raise TypeError(f"{name} must be {wanted}, got {_type_name(value)}")


def check_int(
    name: str, value: Any, *, optional: bool = False, unit: str = "milliseconds or a count"
) -> None:
    """``value`` is an ``int`` (not a bool or float), or None when ``optional``.

    Args:
        unit: What the int counts, for the message.

    Raises:
        TypeError: not an int (``1.5``, ``True``, ``"5"``).
    """
    if value is None and optional:
        return
    if type(value) is not int:
        wanted = "an int or None" if optional else "an int"
        raise TypeError(f"{name} must be {wanted} ({unit}), got {_type_name(value)}")


def check_bool(name: str, value: Any) -> None:
    """``value`` is a ``bool``.

    Raises:
        TypeError: anything else.
    """
    if type(value) is not bool:
        raise TypeError(f"{name} must be True or False, got {_type_name(value)}")


def _as_list(name: str, values: Any, expected: str) -> list[Any]:
    """``values`` as a list, refusing a str/bytes (a sequence of characters, not of
    items) and anything not iterable with ``TypeError: {name} must be {expected}``."""
    if isinstance(values, str | bytes | bytearray):
        raise TypeError(f"{name} must be {expected}, got {_type_name(values)}")
    try:
        return list(values)
    except TypeError:
        raise TypeError(f"{name} must be {expected}, got {_type_name(values)}") from None


def message_ids(ids: Iterable[Any]) -> list[int]:
    """``ids`` as a list of ints (the server checks their range, per item).

    Raises:
        TypeError: ``ids`` is a str/bytes or not iterable, or an id is not an int
            (``"1"``, ``1.0``, ``True``); the message names its position.
        RequestError: INVALID_MESSAGE_ID for an id beyond 64 bits (``item_index`` set).
    """
    out = _as_list("ids", ids, "a sequence of int message ids")
    for position, mid in enumerate(out):
        if type(mid) is not int:
            raise TypeError(
                f"ids[{position}] must be an int message id (as publish returned it), got "
                f"{_type_name(mid)} {mid!r:.40}"
            )
        if not fits_wire_int(mid):
            # Cannot be encoded; the server refuses every id outside [0, 2**64-1] so.
            raise RequestError(
                ErrorCode.INVALID_MESSAGE_ID,
                f"message id {mid} is outside [0, 2**64-1]; send the ids publish returned",
                position,
            )
    return out


def check_cursor(value: Any) -> None:
    """``value`` is None or ``bytes`` (a BROWSE page's ``next_cursor``, unchanged).

    Raises:
        TypeError: anything else (a str, say).
    """
    if value is not None and type(value) is not bytes:
        raise TypeError(
            f"cursor must be the bytes of a page's next_cursor, unchanged, or None; got "
            f"{_type_name(value)}"
        )


def bounds_list(bounds_ms: Iterable[Any]) -> list[int]:
    """BROWSE_COUNTS ``bounds_ms`` as a list of ints.

    Raises:
        TypeError: not a sequence, or a bound that is not an int.
        ValueError: a bound beyond 64 bits (:func:`check_wire_int`).
    """
    out = _as_list("bounds_ms", bounds_ms, "a sequence of ints (ms)")
    for position, bound in enumerate(out):
        check_wire_int(f"bounds_ms[{position}]", bound, unit="ms")
    return out


def check_headers(headers: Any) -> None:
    """``headers`` is None or a dict of str names to str values.

    Raises:
        TypeError: anything else (a non-str name or value, say).
    """
    if headers is None:
        return
    if type(headers) is not dict:
        raise TypeError(f"headers must be a dict of str to str or None, got {_type_name(headers)}")
    for name, value in headers.items():
        if type(name) is not str or type(value) is not str:
            raise TypeError(
                f"header names and values must be str, got {_type_name(name)} {name!r:.40} -> "
                f"{_type_name(value)}"
            )


INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
UINT64_MAX: Final = 2**64 - 1


def fits_wire_int(value: int) -> bool:
    """Whether msgpack can carry ``value``: ``-2**63 <= value <= 2**64 - 1``
    (``docs/protocol.md``, "Encoding rules")."""
    return INT64_MIN <= value <= UINT64_MAX


def check_wire_int(name: str, value: Any, *, unit: str, optional: bool = False) -> None:
    """``value`` is an int the protocol can carry (or None when ``optional``): a
    request argument sent as it is, whose range past that is the server's to check.

    An int beyond 64 bits cannot be encoded at all; sent, it would fail deep in the
    encoder with a message naming no argument. It is refused here, at the call.

    Args:
        name: The argument, for the message (``due_ms``, ``bounds_ms[2]``).
        unit: What the number counts (``"ms since the Unix epoch"``, ``"a node id"``).

    Raises:
        TypeError: not an int (as :func:`check_int`).
        ValueError: outside ``-2**63 .. 2**64-1``; the message names ``name`` and the range.
    """
    check_int(name, value, optional=optional, unit=unit)
    if value is not None and not fits_wire_int(value):
        raise ValueError(
            f"{name} must be an int from -2**63 to 2**64-1 ({unit}; the protocol's integers "
            f"are 64-bit), got {_shown(value)}"
        )


def check_node_id(value: Any, *, optional: bool = False) -> None:
    """``value`` is a node id, an int 1 .. :data:`~futureq.state.commands.MAX_NODE_ID`
    (or None when ``optional``): the argument of ``add_node``, ``remove_node`` and
    ``transfer_leader``. Only its type is checked here (and that it fits the wire, as
    :func:`check_wire_int`); the range is the server's to check, and named here so a
    float or bool (``1.0``, ``True``) is told what to give.

    Raises:
        TypeError: not an int; the message says a node id is an int and its range.
        ValueError: as :func:`check_wire_int`.
    """
    if value is None and optional:
        return
    if type(value) is not int:
        wanted = f"a node id (an int from 1 to {MAX_NODE_ID})"
        raise TypeError(
            f"node_id must be {wanted}{' or None' if optional else ''}, got {_type_name(value)}"
        )
    check_wire_int("node_id", value, unit="a node id")


def utf8_bytes(name: str, value: str, code: ErrorCode, index: int | None = None) -> int:
    """The UTF-8 length of ``value``, refusing text that has none.

    A str holding a lone surrogate (``"\\ud800"``, from ``surrogateescape`` or a bad
    JSON escape) cannot be sent as a msgpack str at all: it is refused here, alone,
    with the code the server gives for a bad value of that field.

    Raises:
        RequestError: ``code``, naming the field and the position of the bad character.
    """
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        bad = value[exc.start : exc.end]
        raise RequestError(
            code,
            f"{name} is not valid Unicode text: it holds the lone surrogate {bad!r} at "
            f"character {exc.start}, which has no UTF-8 form; fix the text (decode bytes "
            "with the right encoding) before publishing",
            index,
        ) from None


# -- the client's own numbers -------------------------------------------------------
#
# Options that never reach the server (deadlines, batch sizes, leases) and counts the
# client sends are checked when they are given, so a bad one fails at the call with
# its name and range, not later as a misleading timeout that blames the server
# (``docs/client.md``, "Argument ranges").


MAX_TIMEOUT_S: Final = 86_400
"""Largest deadline the client takes (``connect_timeout_s``, ``request_timeout_s``,
``timeout_s``): one day. A wait longer than that is a mistake, and an unbounded one
cannot be represented (``10**400`` is no float; ``threading`` and ``time_t`` overflow
well below ``1e300``)."""

MAX_LEASE_S: Final = 86_400
"""Largest ``max_lease_s``: one day (Pub/Sub clients default to one hour)."""

MAX_LINGER_MS: Final = 10_000
"""Largest ``linger_ms``: a batching linger is a few milliseconds; ten seconds is
already far beyond any useful batch, and the linger counts against the deadline."""

MAX_VISIBILITY_MS: Final = MAX_VISIBILITY_TIMEOUT_MS
"""Largest ``visibility_ms`` of EXTEND, fixed by the protocol (12 h)."""

MAX_CREDIT: Final = PROTOCOL_MAX_CREDIT
"""Largest ``prefetch`` (SUBSCRIBE) and ``count`` (``fetch``, ``consume``): the most
credit any server lets one subscription hold (``limits.max_prefetch`` is at most
1,000,000; 10,000 by default). A larger value is no window any server grants, and
credits summed from it would soon pass what the protocol's integers carry."""


def _shown(value: Any) -> str:
    """``repr(value)``, cut short: ``10**400`` would print 401 digits."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def _check_number(name: str, value: Any) -> None:
    """Refuse what is not an int or float (a bool, a str) with ``TypeError``."""
    if type(value) not in (int, float):
        raise TypeError(f"{name} must be a number, got {_type_name(value)}")


def _within(value: float, low: float, high: float, *, low_included: bool) -> bool:
    # Compared as given, never through float(): an int too large for a float
    # (10**400) is then simply above ``high``, not an OverflowError. NaN compares
    # False with everything, infinity is above every bound: both are refused.
    if low_included:
        return low <= value <= high
    return low < value <= high


def check_seconds(
    name: str, value: Any, *, allow_zero: bool = False, max_s: float = MAX_TIMEOUT_S
) -> None:
    """``value`` is a finite number of seconds, > 0 (>= 0 with ``allow_zero``), <= ``max_s``.

    Raises:
        TypeError: not an int or float.
        ValueError: NaN, infinite, or out of the range; the message names both.
    """
    _check_number(name, value)
    if not _within(value, 0, max_s, low_included=allow_zero):
        low = ">= 0" if allow_zero else "> 0"
        raise ValueError(
            f"{name} must be a finite number of seconds {low} and <= {max_s:g}, got {_shown(value)}"
        )


def check_milliseconds(name: str, value: Any, *, max_ms: float) -> None:
    """``value`` is a finite number of milliseconds, 0 .. ``max_ms``.

    Raises:
        TypeError: not an int or float.
        ValueError: NaN, infinite, negative or above ``max_ms``.
    """
    _check_number(name, value)
    if not _within(value, 0, max_ms, low_included=True):
        raise ValueError(
            f"{name} must be a finite number of milliseconds >= 0 and <= {max_ms:g}, "
            f"got {_shown(value)}"
        )


def check_int_ms(name: str, value: Any, low: int, high: int) -> None:
    """``value`` is an int number of milliseconds in ``low .. high`` (settlement
    arguments sent to the server: ``requeue_delay_ms``, ``visibility_ms``).

    Raises:
        TypeError: not an int (``1.5``, ``True``, ``"5"``, NaN).
        ValueError: outside ``low .. high``; the message names the range.
    """
    if type(value) is not int:
        raise TypeError(f"{name} must be an int (milliseconds), got {_type_name(value)}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be an int between {low} and {high} ms, got {_shown(value)}")


def check_count(name: str, value: Any, *, max_count: int | None = None) -> None:
    """``value`` is an int >= 1 (an item count), and <= ``max_count`` when given.

    Raises:
        TypeError: not an int (``1.5``, ``True``).
        ValueError: below 1, or above ``max_count``; the message names the range.
    """
    if type(value) is not int:
        raise TypeError(f"{name} must be an int >= 1, got {_type_name(value)}")
    if max_count is None:
        if value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {_shown(value)}")
    elif not 1 <= value <= max_count:
        raise ValueError(f"{name} must be an int >= 1 and <= {max_count:,}, got {_shown(value)}")


def check_client_options(
    *,
    connect_timeout_s: Any,
    request_timeout_s: Any,
    max_batch_items: Any,
    linger_ms: Any,
    max_lease_s: Any,
) -> None:
    """The numeric options of ``open_client`` (and so of ``SyncClient``).

    Ranges: ``connect_timeout_s`` and ``request_timeout_s`` finite seconds > 0 and
    <= :data:`MAX_TIMEOUT_S`; ``max_batch_items`` an int >= 1; ``linger_ms`` finite
    ms 0 .. :data:`MAX_LINGER_MS` and below ``request_timeout_s`` (the linger counts
    against a publish's deadline); ``max_lease_s`` finite seconds 0 ..
    :data:`MAX_LEASE_S` (0: buffered deliveries are never extended).

    Raises:
        TypeError: an option is not a number (or not an int, for ``max_batch_items``).
        ValueError: an option is out of its range; the message names it and the range.
    """
    check_seconds("connect_timeout_s", connect_timeout_s)
    check_seconds("request_timeout_s", request_timeout_s)
    check_count("max_batch_items", max_batch_items)
    check_milliseconds("linger_ms", linger_ms, max_ms=MAX_LINGER_MS)
    if linger_ms / 1000 >= request_timeout_s:
        raise ValueError(
            f"linger_ms ({linger_ms:g} ms) must be below request_timeout_s "
            f"({request_timeout_s:g} s): a publish waits the linger within its deadline"
        )
    check_seconds("max_lease_s", max_lease_s, allow_zero=True, max_s=MAX_LEASE_S)


# -- server addresses ---------------------------------------------------------------

_NOT_IN_A_HOST: Final = frozenset("/@?#[]\\")
"""Characters no host name or IP address holds: what is left of a URL
(``http://h:1/``), user info (``u@h``) or an unbalanced IPv6 bracket (``[::1``)."""


def check_ipv6_brackets(address: str) -> None:
    """An IPv6 host in ``address`` is bracketed, with the port after: ``[::1]:7450``.

    Without brackets, an address with more than one ``:`` cannot be split at all
    (``::1`` would be host ``:`` and port 1; ``::1:7450`` could be ``[::1]:7450`` or
    ``[::1:7450]`` with no port): refused, as is an unclosed bracket or a bracketed host
    with no port after it.

    Raises:
        ValueError: the message names the address and what to give instead.
    """
    if address.startswith("["):
        bracketed, close, rest = address.partition("]")
        if not close:
            raise ValueError(f"{address!r} has no ']' closing its IPv6 address: give [V6]:PORT")
        if not rest or rest == ":":
            raise ValueError(
                f"{address!r} has no port: give {bracketed}]:PORT, the port the server listens on"
            )
        if not rest.startswith(":"):
            raise ValueError(f"{address!r}: after {bracketed}] comes ':PORT', not {rest!r}")
    elif address.count(":") > 1:
        raise ValueError(
            f"{address!r} holds more than one ':': an IPv6 address must be in brackets, "
            "with the port after them ([V6]:PORT, e.g. [::1]:7450)"
        )


def check_server_address(address: Any) -> None:
    """``address`` is a ``HOST:PORT`` a client can connect to (``[v6]:PORT`` for IPv6).

    Checked when the client is made, so a typo fails at once with its reason instead of
    being retried until ``connect_timeout_s`` as an unreachable server.

    Raises:
        TypeError: not a str (the message names the type given).
        ValueError: no port (also after a bracketed ``[V6]``), a port not in 1..65535,
            an IPv6 address without brackets (``::1``, ``::1:7450``: more than one ``:``
            outside brackets), an empty host, a scheme
            (``http://``), a host holding spaces, control characters or URL punctuation,
            text that is not valid Unicode, or a non-ASCII host with no IDNA form (what
            the resolver sends); the message names the address.
    """
    if type(address) is not str:
        raise TypeError(f"a server address must be a str HOST:PORT, got {_type_name(address)}")
    if "://" in address:
        raise ValueError(f"{address!r} has a scheme; a server address is HOST:PORT, without one")
    check_ipv6_brackets(address)
    try:
        host, port = split_host_port(address)
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    if port == 0:
        raise ValueError(f"{address!r}: port 0 is no server's; give the port it listens on")
    try:
        host.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{address!r} is not valid Unicode text") from None
    if not host or any(c.isspace() or not c.isprintable() or c in _NOT_IN_A_HOST for c in host):
        raise ValueError(f"{address!r}: {host!r} is not a host name")
    if not host.isascii():
        import idna  # what the client's resolver (anyio) encodes a non-ASCII host with

        try:
            idna.encode(host, uts46=True)
        except (idna.IDNAError, UnicodeError) as exc:
            raise ValueError(f"{address!r}: {host!r} is not a host name ({exc})") from None
