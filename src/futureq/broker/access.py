"""Who may do what: client tokens, their permissions, and the one check every request passes.

Every transport (TCP, TLS, and the WebSocket endpoint) serves a connection through
:class:`futureq.broker.connection.Connection`, which calls :meth:`AccessControl.authenticate`
with the HELLO token and :meth:`AccessControl.check` before it hands any request to the
broker. There is no other way in, so there is no other place to forget a check.

Tokens (``docs/security.md``, "Client access"):

* ``server.auth_token``: one shared token with every permission (as before).
* ``server.credentials_file``: a TOML file of clients, each with a secret stored hashed
  (scrypt, salted: :func:`hash_secret`) and what it may do. A client presents the token
  ``<name>:<secret>``. The file is read again on SIGHUP (:meth:`AccessControl.reload`);
  connections whose client was removed, got another secret or lost a permission they use
  are closed.

Permissions of a client:

* ``publish``: topic patterns it may PUBLISH to;
* ``consume``: topic patterns it may SUBSCRIBE to (and so ACK, NACK, CREDIT, UNSUBSCRIBE)
  and BROWSE (as may ``monitor``);
* ``manage_groups``: topic patterns whose groups it may GROUP_CREATE and GROUP_DELETE, and
  whose scheduled messages it may CANCEL, RESCHEDULE and PURGE and whose dead letters it
  may REDRIVE;
* ``manage_cluster``: CLUSTER_ADD_NODE, CLUSTER_REMOVE_NODE, CLUSTER_TRANSFER_LEADER,
  and CLUSTER_STATUS;
* ``monitor``: STATUS lists every topic (others see only topics their patterns name),
  CLUSTER_STATUS, and the HTTP API, dashboard and ``/metrics``.

Patterns follow NATS subjects: names are dot-separated tokens; ``*`` matches exactly one
token and ``>`` (last) one or more: ``orders.*`` matches ``orders.eu`` but not
``orders.eu.late``; ``orders.>`` matches both; ``>`` matches every topic.

A refused request gets ``PERMISSION_DENIED`` (235) naming the topic or the command; the
connection stays open.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import secrets
import tomllib
from collections.abc import Callable, Iterable
from typing import Any, Final

import attrs
import trio

from futureq.config_loader import not_utf8
from futureq.errors import ConfigError, ErrorCode, RemoteProtocolError, RequestError
from futureq.wire import frames

log = logging.getLogger(__name__)

SCRYPT_N: Final = 2**14
SCRYPT_R: Final = 8
SCRYPT_P: Final = 1
SCRYPT_BYTES: Final = 32
VERIFY_THREADS: Final = 2
"""Secrets verified at once (scrypt takes ~50 ms of CPU and 16 MiB each)."""
VERIFIED_CACHE_ENTRIES: Final = 10_000
"""Tokens remembered as verified, so reconnecting clients skip scrypt."""
MAX_PENDING_VERIFICATIONS: Final = 32
"""Secrets being verified or waiting for a thread, node-wide; more are refused at once
(UNAVAILABLE, retry later) rather than queued: a token check costs ~50 ms of CPU, and
nobody has authenticated yet when it is asked for."""
MAX_PENDING_VERIFICATIONS_PER_PEER: Final = 1
"""Of those, how many one address (the client's host) may have at once."""
DLQ_SUFFIX: Final = ".dlq"
DLQ_TOKEN: Final = "dlq"
_CLIENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_PATTERN_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")


# --- patterns -------------------------------------------------------------------------


def check_pattern(pattern: str) -> None:
    """Check a topic pattern: dot-separated tokens, ``*`` for one, a final ``>`` for more.

    Raises:
        ValueError: a sentence naming what is wrong.
    """
    if not pattern:
        raise ValueError("a topic pattern must not be empty")
    parts = pattern.split(".")
    for position, part in enumerate(parts):
        if part in ("*",):
            continue
        if part == ">":
            if position != len(parts) - 1:
                raise ValueError(f"pattern {pattern!r}: '>' may only be the last token")
            continue
        if not _PATTERN_TOKEN.match(part):
            raise ValueError(
                f"pattern {pattern!r}: token {part!r} must be '*', '>' or letters, digits, "
                "'_' and '-'"
            )


def pattern_matches(pattern: str, topic: str) -> bool:
    """True when ``topic`` matches ``pattern`` (NATS subject rules, see the module doc).

    A topic that breaks the name grammar (an old name stored before it) is matched
    token by token all the same; ``>`` matches it as a whole.
    """
    if pattern == ">":
        return True
    want = pattern.split(".")
    have = topic.split(".")
    for position, token in enumerate(want):
        if token == ">":
            return len(have) > position
        if position >= len(have):
            return False
        if token != "*" and token != have[position]:
            return False
    return len(have) == len(want)


def _any_match(patterns: Iterable[str], topic: str) -> bool:
    """True when ``patterns`` allow ``topic``; see :func:`allows`."""
    return allows(tuple(patterns), topic)


def allows(patterns: tuple[str, ...], topic: str) -> bool:
    """True when ``patterns`` allow ``topic``.

    A dead-letter topic ``T.dlq`` holds the messages of ``T``, so a wildcard that only
    happens to cover it does not give them away: ``T.dlq`` is allowed when a pattern
    matches it **and** either that pattern names the ``dlq`` token itself
    (``orders.eu.dlq``, ``*.dlq``) or the patterns allow ``T`` too. So ``billing.>``
    allows ``billing.retry.dlq`` (it allows ``billing.retry``), ``>`` allows every
    dead-letter topic, but ``a.*`` does not allow ``a.dlq``, the dead letters of topic
    ``a``, which ``a.*`` does not name.
    """
    matching = [pattern for pattern in patterns if pattern_matches(pattern, topic)]
    if not matching:
        return False
    source = topic.removesuffix(DLQ_SUFFIX)
    if source == topic or not source:
        return True
    if any(pattern.rsplit(".", 1)[-1] == DLQ_TOKEN for pattern in matching):
        return True
    return allows(patterns, source)


# --- secrets --------------------------------------------------------------------------


def hash_secret(secret: str, *, salt: bytes | None = None) -> str:
    """The stored form of a client secret: ``scrypt$N$r$p$<salt>$<hash>`` (base64).

    Args:
        secret: The secret part of the client's token.
        salt: 16 random bytes by default.
    """
    salt = secrets.token_bytes(16) if salt is None else salt
    digest = hashlib.scrypt(
        secret.encode("utf-8"), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=SCRYPT_BYTES
    )
    encode = base64.b64encode
    return (
        f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${encode(salt).decode()}${encode(digest).decode()}"
    )


def _decoy_hash() -> str:
    """A stored-form hash with the default scrypt cost that no secret matches (random
    salt and digest): what an unknown client name is checked against."""
    encode = base64.b64encode
    salt, digest = secrets.token_bytes(16), secrets.token_bytes(SCRYPT_BYTES)
    return (
        f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${encode(salt).decode()}${encode(digest).decode()}"
    )


def _parse_hash(encoded: str) -> tuple[int, int, int, bytes, bytes]:
    parts = encoded.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise ValueError("must be scrypt$N$r$p$SALT$HASH as printed by `futureq hash-token`")
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt = base64.b64decode(parts[4], validate=True)
        digest = base64.b64decode(parts[5], validate=True)
    except ValueError:
        raise ValueError("has a bad number or base64 field") from None
    if n < 2 or n & (n - 1) or n > 2**20 or not 1 <= r <= 32 or not 1 <= p <= 16:
        raise ValueError("has scrypt parameters out of range (N a power of two up to 2**20)")
    if len(salt) < 8 or len(digest) < 16:
        raise ValueError("has a salt shorter than 8 bytes or a hash shorter than 16 bytes")
    return n, r, p, salt, digest


def verify_secret(secret: str, encoded: str) -> bool:
    """True when ``secret`` hashes to ``encoded`` (constant-time compare). Slow: ~50 ms."""
    try:
        n, r, p, salt, digest = _parse_hash(encoded)
    except ValueError:
        return False
    got = hashlib.scrypt(
        secret.encode("utf-8", "surrogatepass"),
        salt=salt,
        n=n,
        r=r,
        p=p,
        dklen=len(digest),
        maxmem=256 * 1024 * 1024,
    )
    return hmac.compare_digest(got, digest)


def new_token(name: str) -> tuple[str, str]:
    """A fresh random token ``<name>:<secret>`` and the hash to store for it.

    Raises:
        ValueError: ``name`` is not a valid client name.
    """
    if not _CLIENT_NAME.match(name):
        raise ValueError(
            f"client name {name!r} must be 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    secret = secrets.token_urlsafe(24)
    return f"{name}:{secret}", hash_secret(secret)


# --- permissions ----------------------------------------------------------------------


@attrs.frozen
class Permissions:
    """What one client may do (see the module docstring)."""

    publish: tuple[str, ...] = ()
    consume: tuple[str, ...] = ()
    manage_groups: tuple[str, ...] = ()
    manage_cluster: bool = False
    monitor: bool = False

    def may_see(self, topic: str) -> bool:
        """True when any of the client's patterns names ``topic`` (STATUS filtering)."""
        if self.monitor:
            return True
        return any(
            _any_match(patterns, topic)
            for patterns in (self.publish, self.consume, self.manage_groups)
        )


EVERYTHING: Final = Permissions((">",), (">",), (">",), True, True)


@attrs.frozen
class Principal:
    """An authenticated client.

    Attributes:
        name: The client's name (``auth_token`` for the shared token, ``anonymous``
            when no authentication is configured).
        permissions: What it may do.
        secret_hash: The stored hash it was verified against ("" for the shared token
            and for anonymous), to notice a changed secret on reload.
    """

    name: str
    permissions: Permissions
    secret_hash: str = ""


ANONYMOUS: Final = Principal("anonymous", EVERYTHING)
SHARED_TOKEN: Final = Principal("auth_token", EVERYTHING)


@attrs.frozen
class ClientEntry:
    """One ``[[client]]`` of the credentials file."""

    name: str
    secret_hash: str
    permissions: Permissions


def load_credentials(path: str) -> dict[str, ClientEntry]:
    """Read a credentials file.

    Raises:
        ConfigError: the file cannot be read or parsed, or an entry is invalid; the
            message names the file, the client and the key.
    """
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"credentials file {path!r} cannot be read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"credentials file {path!r} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:  # tomllib decodes the whole file first
        # Not a ConfigError before: a SIGHUP after such a file was saved stopped the node.
        raise ConfigError(f"credentials file {path!r} is not valid TOML: {not_utf8(exc)}") from None
    extra = set(document) - {"client"}
    if extra:
        raise ConfigError(
            f"credentials file {path!r}: unknown table(s) {sorted(extra)}; only [[client]] "
            "entries are allowed"
        )
    raw = document.get("client", [])
    if not isinstance(raw, list):
        raise ConfigError(f"credentials file {path!r}: 'client' must be an array of tables")
    clients: dict[str, ClientEntry] = {}
    for number, table in enumerate(raw, 1):
        entry = _client_entry(path, number, table)
        if entry.name in clients:
            raise ConfigError(f"credentials file {path!r}: client {entry.name!r} appears twice")
        clients[entry.name] = entry
    return clients


_KEYS = ("name", "secret_hash", "publish", "consume", "manage_groups", "manage_cluster", "monitor")


def _client_entry(path: str, number: int, table: Any) -> ClientEntry:
    where = f"credentials file {path!r}, client #{number}"
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table")
    unknown = set(table) - set(_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; keys are {', '.join(_KEYS)}")
    name = table.get("name")
    if not isinstance(name, str) or not _CLIENT_NAME.match(name):
        raise ConfigError(
            f"{where}: name = {name!r} must be 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    where = f"credentials file {path!r}, client {name!r}"
    secret_hash = table.get("secret_hash")
    if not isinstance(secret_hash, str):
        raise ConfigError(f"{where}: secret_hash must be a string (from `futureq hash-token`)")
    try:
        _parse_hash(secret_hash)
    except ValueError as exc:
        raise ConfigError(f"{where}: secret_hash {exc}") from None
    lists: dict[str, tuple[str, ...]] = {}
    for key in ("publish", "consume", "manage_groups"):
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ConfigError(f"{where}: {key} must be a list of topic patterns")
        for pattern in value:
            try:
                check_pattern(pattern)
            except ValueError as exc:
                raise ConfigError(f"{where}: {key}: {exc}") from None
        lists[key] = tuple(value)
    flags: dict[str, bool] = {}
    for key in ("manage_cluster", "monitor"):
        value = table.get(key, False)
        if type(value) is not bool:
            raise ConfigError(f"{where}: {key} must be true or false")
        flags[key] = value
    return ClientEntry(
        name,
        secret_hash,
        Permissions(
            lists["publish"],
            lists["consume"],
            lists["manage_groups"],
            flags["manage_cluster"],
            flags["monitor"],
        ),
    )


# --- the checks -----------------------------------------------------------------------


def _denied(message: str, item_index: int | None = None) -> RequestError:
    return RequestError(ErrorCode.PERMISSION_DENIED, message, item_index)


def _topic_check(principal: Principal, patterns: tuple[str, ...], topic: str, verb: str) -> None:
    if not _any_match(patterns, topic):
        raise _denied(f"client {principal.name!r} may not {verb} topic {topic!r}")


def _check_publish(principal: Principal, frame: frames.Publish) -> None:
    allowed = principal.permissions.publish
    if allowed == (">",):
        return
    seen: set[str] = set()
    for position, item in enumerate(frame.items):
        topic = item[0] if type(item) in (tuple, list) and item and type(item[0]) is str else None
        if topic is None or topic in seen:
            continue  # the item's shape is checked (and refused) by validation
        if not _any_match(allowed, topic):
            raise _denied(f"client {principal.name!r} may not publish to topic {topic!r}", position)
        seen.add(topic)


def _check_consume_any(principal: Principal, frame: frames.Frame) -> None:
    if not principal.permissions.consume:
        raise _denied(
            f"client {principal.name!r} may not consume, so may not send {frame.TYPE.name}"
        )


def _check_cluster(principal: Principal, frame: frames.Frame) -> None:
    if not principal.permissions.manage_cluster:
        raise _denied(f"client {principal.name!r} may not manage the cluster ({frame.TYPE.name})")


def _check_cluster_status(principal: Principal, frame: frames.Frame) -> None:
    permissions = principal.permissions
    if not (permissions.manage_cluster or permissions.monitor):
        raise _denied(
            f"client {principal.name!r} may not read the cluster status (CLUSTER_STATUS needs "
            "monitor or manage_cluster)"
        )


def _check_monitor(principal: Principal, frame: frames.Frame) -> None:
    if not principal.permissions.monitor:
        raise _denied(
            f"client {principal.name!r} may not watch the node's overview ({frame.TYPE.name} "
            "needs monitor: it shows every topic and the cluster)"
        )


def _check_browse(principal: Principal, frame: Any) -> None:
    """BROWSE reads what a consumer of the topic could receive: ``consume`` on the
    topic, or ``monitor``."""
    if principal.permissions.monitor:
        return
    _topic_check(principal, principal.permissions.consume, frame.topic, "browse")


def _allow(principal: Principal, frame: Any) -> None:
    """No permission needed (PING, PONG, STATUS which is filtered by what may be seen)."""


_RULES: dict[frames.FrameType, Callable[[Principal, Any], None]] = {
    frames.FrameType.PUBLISH: _check_publish,
    frames.FrameType.SUBSCRIBE: lambda p, f: _topic_check(
        p, p.permissions.consume, f.topic, "consume from"
    ),
    frames.FrameType.UNSUBSCRIBE: _check_consume_any,
    frames.FrameType.CREDIT: _check_consume_any,
    frames.FrameType.ACK: _check_consume_any,
    frames.FrameType.NACK: _check_consume_any,
    frames.FrameType.EXTEND: _check_consume_any,
    frames.FrameType.RELEASE: _check_consume_any,
    frames.FrameType.GROUP_CREATE: lambda p, f: _topic_check(
        p, p.permissions.manage_groups, f.topic, "manage the groups of"
    ),
    frames.FrameType.GROUP_DELETE: lambda p, f: _topic_check(
        p, p.permissions.manage_groups, f.topic, "manage the groups of"
    ),
    frames.FrameType.CANCEL: lambda p, f: _topic_check(
        p, p.permissions.manage_groups, f.topic, "manage the messages of"
    ),
    frames.FrameType.BROWSE: _check_browse,
    frames.FrameType.BROWSE_COUNTS: _check_browse,
    frames.FrameType.RESCHEDULE: lambda p, f: _topic_check(
        p, p.permissions.manage_groups, f.topic, "manage the messages of"
    ),
    frames.FrameType.PURGE: lambda p, f: _topic_check(
        p, p.permissions.manage_groups, f.topic, "manage the messages of"
    ),
    frames.FrameType.REDRIVE: lambda p, f: _topic_check(
        p, p.permissions.manage_groups, f.topic, "manage the messages of"
    ),
    frames.FrameType.STATUS: _allow,
    frames.FrameType.PING: _allow,
    frames.FrameType.SLOT_MAP: _allow,  # where topics live is no secret: a client needs it
    frames.FrameType.PONG: _allow,
    frames.FrameType.CLUSTER_STATUS: _check_cluster_status,
    frames.FrameType.CLUSTER_ADD_NODE: _check_cluster,
    frames.FrameType.CLUSTER_REMOVE_NODE: _check_cluster,
    frames.FrameType.CLUSTER_TRANSFER_LEADER: _check_cluster,
    frames.FrameType.WATCH: _check_monitor,
    frames.FrameType.UNWATCH: _allow,
}
"""The rule of every request frame type. A type missing here is refused to everyone but
a client with every permission, so a new frame type is closed until it gets a rule."""


def check_frame(principal: Principal, frame: frames.Frame) -> None:
    """Refuse ``frame`` unless ``principal`` may send it.

    Raises:
        RequestError: PERMISSION_DENIED naming the topic (and item) or the command.
    """
    if principal.permissions is EVERYTHING:
        return
    rule = _RULES.get(frame.TYPE)
    if rule is None:
        raise _denied(f"client {principal.name!r} may not send {frame.TYPE.name}")
    rule(principal, frame)


class AccessControl:
    """Authentication of HELLO tokens and HTTP bearer tokens; the per-frame check.

    Args:
        auth_token: ``server.auth_token`` (every permission), or None.
        credentials_file: ``server.credentials_file``, or None.

    Raises:
        ConfigError: the credentials file is invalid (at start).
    """

    def __init__(self, auth_token: str | None, credentials_file: str | None) -> None:
        self._auth_token = auth_token
        self._path = credentials_file
        self._clients: dict[str, ClientEntry] = (
            load_credentials(credentials_file) if credentials_file else {}
        )
        self._verified: dict[bytes, str] = {}
        self._cache_key = secrets.token_bytes(32)
        self._decoy_hash = _decoy_hash()
        self._verify_limit = trio.CapacityLimiter(VERIFY_THREADS)
        self._verifying = 0
        self._verifying_by_peer: dict[str, int] = {}
        self.generation = 0
        """Bumped by every successful :meth:`reload`."""
        self._changed = trio.Event()

    @property
    def enabled(self) -> bool:
        """True when clients must present a token."""
        return self._auth_token is not None or self._path is not None

    async def authenticate(self, token: str | None, peer: str | None = None) -> Principal:
        """The principal a HELLO (or HTTP bearer) token stands for.

        A token seen before is answered from memory (right or wrong, until the next
        reload); a new one costs a scrypt check (~50 ms of CPU), of which the node runs
        at most :data:`MAX_PENDING_VERIFICATIONS` at once and one address
        :data:`MAX_PENDING_VERIFICATIONS_PER_PEER`: unauthenticated clients cannot keep
        the CPU busy or hold up other clients' first HELLO.

        Args:
            token: The token presented, or None.
            peer: The client's host, to share the token checks fairly between addresses.

        Raises:
            RemoteProtocolError: AUTH_FAILED with a sentence that does not say which
                part of the token was wrong; UNAVAILABLE (retry later) when too many
                new tokens are being checked.
        """
        if not self.enabled:
            return ANONYMOUS
        if token is None:
            raise RemoteProtocolError(
                ErrorCode.AUTH_FAILED, "this server requires a token; the HELLO carries none"
            )
        if self._auth_token is not None and _same(token, self._auth_token):
            return SHARED_TOKEN
        name, sep, secret = token.partition(":")
        entry = self._clients.get(name) if sep else None
        # An unknown name is checked against a decoy hash with the same scrypt cost, so
        # the answer's timing (and the per-address allowance) does not tell an attacker
        # which client names exist; it can never verify.
        secret_hash = entry.secret_hash if entry is not None else self._decoy_hash
        key = hmac.new(self._cache_key, token.encode("utf-8", "surrogatepass"), "sha256")
        digest = key.digest()
        known = self._verified.get(digest)
        if entry is not None and known == entry.secret_hash:
            return Principal(entry.name, entry.permissions, entry.secret_hash)
        if known != _FAILED + secret_hash:  # the same wrong token again: no scrypt
            ok = await self._verify(secret, secret_hash, peer)
            current = self._clients.get(name)
            if len(self._verified) >= VERIFIED_CACHE_ENTRIES:
                self._verified.clear()
            if ok and entry is not None and current is not None:
                if current.secret_hash == entry.secret_hash:
                    self._verified[digest] = entry.secret_hash
                    return Principal(current.name, current.permissions, current.secret_hash)
            if not ok:
                self._verified[digest] = _FAILED + secret_hash
        raise RemoteProtocolError(
            ErrorCode.AUTH_FAILED,
            "HELLO carries a missing or wrong auth token; check the client's token",
        )

    async def _verify(self, secret: str, secret_hash: str, peer: str | None) -> bool:
        """Run scrypt in a worker thread, within the node's and the peer's allowance.

        Raises:
            RemoteProtocolError: UNAVAILABLE when too many checks are under way (for
                the node, or for ``peer``): the client retries later.
        """
        from_peer = self._verifying_by_peer.get(peer, 0) if peer is not None else 0
        if (
            self._verifying >= MAX_PENDING_VERIFICATIONS
            or from_peer >= MAX_PENDING_VERIFICATIONS_PER_PEER
        ):
            raise RemoteProtocolError(
                ErrorCode.UNAVAILABLE,
                "the server is checking too many new tokens at once"
                + (" from this address" if from_peer >= MAX_PENDING_VERIFICATIONS_PER_PEER else "")
                + "; retry in a moment",
            )
        self._verifying += 1
        if peer is not None:
            self._verifying_by_peer[peer] = from_peer + 1
        try:
            return await trio.to_thread.run_sync(
                verify_secret, secret, secret_hash, limiter=self._verify_limit
            )
        finally:
            self._verifying -= 1
            if peer is not None:
                left = self._verifying_by_peer[peer] - 1
                if left:
                    self._verifying_by_peer[peer] = left
                else:
                    del self._verifying_by_peer[peer]

    def current(self, principal: Principal) -> Principal | None:
        """``principal`` as the credentials stand now: None when its client was removed
        or got another secret; with its permissions as now configured otherwise."""
        if principal.name in ("anonymous", "auth_token") and not principal.secret_hash:
            return principal
        entry = self._clients.get(principal.name)
        if entry is None or entry.secret_hash != principal.secret_hash:
            return None
        if entry.permissions == principal.permissions:
            return principal
        return Principal(entry.name, entry.permissions, entry.secret_hash)

    def reload(self) -> bool:
        """Read the credentials file again (SIGHUP). On error the old ones stay.

        Returns:
            True when the new file was loaded.
        """
        if self._path is None:
            log.info("SIGHUP: no credentials file is configured; nothing to reload")
            return False
        try:
            clients = load_credentials(self._path)
        except ConfigError as exc:
            log.error("SIGHUP: credentials not reloaded, the old ones stay: %s", exc)
            return False
        changes = describe_changes(self._clients, clients)
        self._clients = clients
        self._verified.clear()
        self.generation += 1
        self._changed.set()
        self._changed = trio.Event()
        log.info(
            "SIGHUP: reloaded %d client credentials from %s (%s)",
            len(clients),
            self._path,
            changes,
        )
        return True

    async def wait_changed(self, generation: int) -> None:
        """Block until :attr:`generation` differs from ``generation``."""
        while self.generation == generation:
            await self._changed.wait()

    @staticmethod
    def check(principal: Principal, frame: frames.Frame) -> None:
        """See :func:`check_frame`."""
        check_frame(principal, frame)


def describe_changes(old: dict[str, ClientEntry], new: dict[str, ClientEntry]) -> str:
    """What a reload changed, for its log line: a file cut short while being written
    still parses, and its missing clients are then named here."""
    parts = []
    for label, names in (
        ("added", sorted(set(new) - set(old))),
        ("removed", sorted(set(old) - set(new))),
        (
            "new secret",
            sorted(n for n in set(old) & set(new) if old[n].secret_hash != new[n].secret_hash),
        ),
        (
            "permissions changed",
            sorted(n for n in set(old) & set(new) if old[n].permissions != new[n].permissions),
        ),
    ):
        if names:
            parts.append(f"{label}: {', '.join(names)}")
    return "; ".join(parts) or "no change"


_FAILED: Final = "failed:"
"""Prefix of a remembered wrong token's entry in the verified cache."""


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )
