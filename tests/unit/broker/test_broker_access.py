"""Access control: patterns, secrets, the credentials file, and a rule for every request
frame type (``futureq.broker.access``; ``docs/security.md``, "Client access")."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from futureq.broker import access
from futureq.broker.access import (
    EVERYTHING,
    AccessControl,
    Permissions,
    Principal,
    check_frame,
    check_pattern,
    hash_secret,
    load_credentials,
    new_token,
    pattern_matches,
    verify_secret,
)
from futureq.errors import ConfigError, ErrorCode, RemoteProtocolError, RequestError
from futureq.wire import frames, session


@pytest.mark.parametrize(
    ("pattern", "topic", "matches"),
    [
        ("orders", "orders", True),
        ("orders", "orders.eu", False),
        ("orders.*", "orders.eu", True),
        ("orders.*", "orders", False),
        ("orders.*", "orders.eu.late", False),
        ("orders.>", "orders.eu", True),
        ("orders.>", "orders.eu.late", True),
        ("orders.>", "orders", False),
        ("*.eu", "orders.eu", True),
        ("*.eu", "billing.us", False),
        (">", "anything.at.all", True),
        ("orders.*.late", "orders.eu.late", True),
        ("orders.>", "orders.eu.dlq", True),
    ],
)
def test_patterns_follow_nats_subjects(pattern: str, topic: str, matches: bool) -> None:
    check_pattern(pattern)
    assert pattern_matches(pattern, topic) is matches


@pytest.mark.parametrize(
    ("patterns", "topic", "allowed"),
    [
        (("a.*",), "a.dlq", False),  # the dead letters of topic a, which a.* does not name
        (("a.>",), "a.dlq", False),
        (("a.*", "a"), "a.dlq", True),
        (("billing.>",), "billing.retry.dlq", True),
        ((">",), "x.dlq", True),
        (("*.dlq",), "x.dlq", True),
        (("orders.eu.dlq",), "orders.eu.dlq", True),
        (("a.*",), "a.b", True),
    ],
)
def test_a_dead_letter_topic_is_allowed_only_with_its_topic(
    patterns: tuple[str, ...], topic: str, allowed: bool
) -> None:
    assert access.allows(patterns, topic) is allowed


@pytest.mark.parametrize("pattern", ["", "orders.>.eu", "a..b", "ord ers", "or*ders", ".a"])
def test_bad_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(ValueError):
        check_pattern(pattern)


def test_secrets_are_salted_scrypt_hashes() -> None:
    first, second = hash_secret("s3cret"), hash_secret("s3cret")
    assert first != second  # a fresh salt each time
    assert first.startswith("scrypt$16384$8$1$")
    assert verify_secret("s3cret", first) and verify_secret("s3cret", second)
    assert not verify_secret("s3creT", first)
    assert not verify_secret("s3cret", "scrypt$broken")
    token, stored = new_token("billing")
    name, _, secret = token.partition(":")
    assert name == "billing" and len(secret) >= 32 and verify_secret(secret, stored)
    with pytest.raises(ValueError):
        new_token("bad name")


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_the_credentials_file_is_read_with_every_permission(tmp_path: Path) -> None:
    stored = hash_secret("x")
    path = write(
        tmp_path / "c.toml",
        f"""
[[client]]
name = "billing"
secret_hash = "{stored}"
publish = ["billing.>"]
consume = ["billing.*", "orders.eu"]
manage_groups = ["billing.>"]
manage_cluster = true
monitor = true

[[client]]
name = "reader"
secret_hash = "{stored}"
""",
    )
    clients = load_credentials(path)
    assert clients["billing"].permissions == Permissions(
        ("billing.>",), ("billing.*", "orders.eu"), ("billing.>",), True, True
    )
    assert clients["reader"].permissions == Permissions()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("[[client]]\nname = 'a b'\nsecret_hash = 'x'\n", ["name"]),
        ("[[client]]\nname = 'a'\n", ["secret_hash"]),
        ("[[client]]\nname = 'a'\nsecret_hash = 'plain'\n", ["secret_hash"]),
        ("[[client]]\nname = 'a'\nsecret_hash = '{h}'\npublish = 'x.>'\n", ["publish"]),
        ("[[client]]\nname = 'a'\nsecret_hash = '{h}'\nconsume = ['a..b']\n", ["consume"]),
        ("[[client]]\nname = 'a'\nsecret_hash = '{h}'\nmonitor = 1\n", ["monitor"]),
        ("[[client]]\nname = 'a'\nsecret_hash = '{h}'\nadmin = true\n", ["unknown key"]),
        (
            "[[client]]\nname = 'a'\nsecret_hash = '{h}'\n[[client]]\nname = 'a'\nsecret_hash = '{h}'\n",
            ["twice"],
        ),
        ("[users]\n", ["unknown table"]),
        ("not toml =", ["not valid TOML"]),
    ],
)
def test_a_bad_credentials_file_is_refused_with_a_sentence(
    tmp_path: Path, body: str, words: list[str]
) -> None:
    path = write(tmp_path / "c.toml", body.replace("{h}", hash_secret("x")))
    with pytest.raises(ConfigError) as info:
        load_credentials(path)
    for word in words:
        assert word in str(info.value)
    assert path in str(info.value)


# A request of every client frame type, for the rule table.
REQUESTS: dict[frames.FrameType, frames.Frame] = {
    frames.FrameType.PUBLISH: frames.Publish(
        1, frames.AckLevel.QUORUM, [["t", b"", 0, None, None]]
    ),
    frames.FrameType.SUBSCRIBE: frames.Subscribe(1, "t", "g", 1),
    frames.FrameType.ACK: frames.Ack(1, [b"x"]),
    frames.FrameType.NACK: frames.Nack(1, [b"x"], 0),
    frames.FrameType.EXTEND: frames.Extend(1, [b"x"], 1000),
    frames.FrameType.RELEASE: frames.Release(1, [b"x"]),
    frames.FrameType.CREDIT: frames.Credit(1, 1, 1),
    frames.FrameType.STATUS: frames.Status(1),
    frames.FrameType.UNSUBSCRIBE: frames.Unsubscribe(1, 1),
    frames.FrameType.PING: frames.Ping(1),
    frames.FrameType.PONG: frames.Pong(1),
    frames.FrameType.GROUP_CREATE: frames.GroupCreate(1, "t", "g"),
    frames.FrameType.GROUP_DELETE: frames.GroupDelete(1, "t", "g"),
    frames.FrameType.CLUSTER_STATUS: frames.ClusterStatus(1),
    frames.FrameType.CLUSTER_ADD_NODE: frames.ClusterAddNode(1, 2, "h:1", "h:2"),
    frames.FrameType.CLUSTER_REMOVE_NODE: frames.ClusterRemoveNode(1, 2),
    frames.FrameType.CLUSTER_TRANSFER_LEADER: frames.ClusterTransferLeader(1, 2),
    frames.FrameType.WATCH: frames.Watch(1, 1000),
    frames.FrameType.UNWATCH: frames.Unwatch(1),
    frames.FrameType.CANCEL: frames.Cancel(1, "t", None, [1]),
    frames.FrameType.BROWSE: frames.Browse(1, "t", None, None, None, None, 10, 0),
    frames.FrameType.REDRIVE: frames.Redrive(1, "t", None, [1], 0),
    frames.FrameType.RESCHEDULE: frames.Reschedule(1, "t", None, [1], None, 0),
    frames.FrameType.PURGE: frames.Purge(1, "t", None),
    frames.FrameType.BROWSE_COUNTS: frames.BrowseCounts(1, "t", None, [60_000], True),
    frames.FrameType.SLOT_MAP: frames.SlotMap(1),
}


def test_every_request_frame_type_has_a_rule() -> None:
    # HELLO is checked by authentication; every other type a client may send has a rule.
    requests = set(session.CLIENT_FRAME_TYPES) - {frames.FrameType.HELLO}
    assert set(access._RULES) == requests, "a new request frame type needs an access rule"
    assert set(REQUESTS) == requests


def test_a_frame_type_without_a_rule_is_refused_to_all_but_everything() -> None:
    limited = Principal("c", Permissions((">",), (">",), (">",), True, True))
    hello = frames.Hello(1, (1,))
    with pytest.raises(RequestError) as info:
        check_frame(limited, hello)
    assert info.value.code is ErrorCode.PERMISSION_DENIED and "HELLO" in info.value.message
    check_frame(Principal("admin", EVERYTHING), hello)


def test_watch_needs_monitor() -> None:
    watcher = Principal("ops", Permissions(monitor=True))
    check_frame(watcher, frames.Watch(1, 1000))
    with pytest.raises(RequestError, match="needs monitor"):
        check_frame(
            Principal("billing", Permissions((">",), (">",), (">",))), frames.Watch(1, 1000)
        )


@pytest.mark.parametrize("frame_type", sorted(REQUESTS), ids=lambda t: t.name)
def test_a_client_with_no_permission_may_send_only_ping_pong_status_unwatch_slot_map(
    frame_type: frames.FrameType,
) -> None:
    nobody = Principal("nobody", Permissions())
    frame = REQUESTS[frame_type]
    free = (
        frames.FrameType.PING,
        frames.FrameType.PONG,
        frames.FrameType.STATUS,
        frames.FrameType.UNWATCH,
        frames.FrameType.SLOT_MAP,
    )
    if frame_type in free:
        check_frame(nobody, frame)
        return
    with pytest.raises(RequestError) as info:
        check_frame(nobody, frame)
    assert info.value.code is ErrorCode.PERMISSION_DENIED
    assert "nobody" in info.value.message


async def test_tokens_authenticate_and_reload(tmp_path: Path) -> None:
    token, stored = new_token("app")
    path = tmp_path / "c.toml"
    path.write_text(f'[[client]]\nname = "app"\nsecret_hash = "{stored}"\nconsume = ["a.*"]\n')
    control = AccessControl("shared", str(path))
    assert (await control.authenticate("shared")).permissions is EVERYTHING
    principal = await control.authenticate(token)
    assert principal.name == "app" and principal.permissions.consume == ("a.*",)
    assert await control.authenticate(token) == principal  # cached, same answer
    for wrong in (None, "app:nope", "other:x", "app"):
        with pytest.raises(RemoteProtocolError) as info:
            await control.authenticate(wrong)
        assert info.value.code is ErrorCode.AUTH_FAILED
    # Reload: new permissions apply to the same principal; a removed client is gone.
    path.write_text(f'[[client]]\nname = "app"\nsecret_hash = "{stored}"\nconsume = ["b.*"]\n')
    generation = control.generation
    with trio.fail_after(1):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(control.wait_changed, generation)
            assert control.reload()
    updated = control.current(principal)
    assert updated is not None and updated.permissions.consume == ("b.*",)
    path.write_text("")
    assert control.reload()
    assert control.current(principal) is None
    path.write_text("[[client]]\n")  # broken: the last good credentials stay
    assert not control.reload()


async def test_without_tokens_everyone_may_do_everything() -> None:
    control = AccessControl(None, None)
    assert not control.enabled
    assert (await control.authenticate(None)).permissions is EVERYTHING


async def test_a_wrong_token_is_checked_once_and_one_address_checks_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(
        tmp_path / "c.toml", f'[[client]]\nname = "a"\nsecret_hash = "{hash_secret("s")}"\n'
    )
    control = AccessControl(None, path)
    checks: list[str] = []
    real_verify = access.verify_secret

    def counting_verify(secret: str, encoded: str) -> bool:
        checks.append(secret)
        return real_verify(secret, encoded)

    monkeypatch.setattr(access, "verify_secret", counting_verify)
    for _ in range(3):
        with pytest.raises(RemoteProtocolError) as failed:
            await control.authenticate("a:wrong", "10.0.0.1")
        assert failed.value.code == ErrorCode.AUTH_FAILED
    assert checks == ["wrong"]  # remembered as wrong until the next reload
    answers: list[ErrorCode] = []

    async def try_token(token: str) -> None:
        try:
            await control.authenticate(token, "10.0.0.2")
        except RemoteProtocolError as exc:
            answers.append(exc.code)

    async with trio.open_nursery() as nursery:
        for number in range(4):
            nursery.start_soon(try_token, f"a:wrong-{number}")
    assert sorted(answers) == [ErrorCode.AUTH_FAILED] + [ErrorCode.UNAVAILABLE] * 3
    assert (await control.authenticate("a:s", "10.0.0.2")).name == "a"


async def test_an_unknown_client_name_costs_the_same_check_as_a_wrong_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name that is not in the credentials file must not be refused faster than a
    known name with a wrong secret: the timing would tell which client names exist."""
    path = write(
        tmp_path / "c.toml", f'[[client]]\nname = "a"\nsecret_hash = "{hash_secret("s")}"\n'
    )
    control = AccessControl(None, path)
    checks: list[tuple[str, str]] = []
    real_verify = access.verify_secret

    def counting_verify(secret: str, encoded: str) -> bool:
        checks.append((secret, encoded.split("$")[1]))
        return real_verify(secret, encoded)

    monkeypatch.setattr(access, "verify_secret", counting_verify)
    for token in ("a:wrong", "nobody:wrong", "nobody:wrong", "no-colon-at-all"):
        with pytest.raises(RemoteProtocolError) as failed:
            await control.authenticate(token, "10.0.0.1")
        assert failed.value.code == ErrorCode.AUTH_FAILED
        assert "missing or wrong auth token" in failed.value.message
    # One scrypt check each, at the same cost; the repeated wrong token is remembered.
    assert checks == [("wrong", str(access.SCRYPT_N))] * 2 + [("", str(access.SCRYPT_N))]
    # The per-address allowance applies to unknown names too.
    answers: list[ErrorCode] = []

    async def try_token(token: str) -> None:
        try:
            await control.authenticate(token, "10.0.0.2")
        except RemoteProtocolError as exc:
            answers.append(exc.code)

    async with trio.open_nursery() as nursery:
        for number in range(4):
            nursery.start_soon(try_token, f"nobody-{number}:x")
    assert sorted(answers) == [ErrorCode.AUTH_FAILED] + [ErrorCode.UNAVAILABLE] * 3
