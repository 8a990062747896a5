"""One name grammar, and derived names that are always usable, against a real
``futureq start`` process (issue 10, inputs 8 and 9)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from broker_process import BrokerProcess
from cli_process import cli
from wire_client import WireClient

from futureq.client.sync import SyncClient
from futureq.errors import ErrorCode, RequestError
from futureq.state import commands
from futureq.state.queue_state import QueueState
from futureq.storage.db import Database
from futureq.wire import frames


def refused(answer: object, code: ErrorCode) -> frames.Error:
    assert isinstance(answer, frames.Error), answer
    assert answer.code == code, (ErrorCode(answer.code).name, answer.message)
    return answer


def dead_letter(client: WireClient, topic: str, group: str) -> None:
    """Subscribe, receive one delivery and nack it; with max_deliveries 1 it is dead-lettered."""
    client.subscribe(topic, group, prefetch=10)
    [delivery] = client.deliveries(1)
    answer = client.request(frames.Nack(client.next_id(), [delivery[0]], 0))
    assert isinstance(answer, frames.Ok), answer


def test_a_group_named_space_is_refused_everywhere_it_enters(broker: BrokerProcess) -> None:
    client = WireClient(broker.client_address)
    for frame in (
        frames.Subscribe(client.next_id(), "names.t", " ", 10),
        frames.GroupCreate(client.next_id(), "names.t", " ", None, None),
    ):
        error = refused(client.request(frame), ErrorCode.INVALID_GROUP)
        assert "' '" in error.message and "letters, digits" in error.message
    bad_topic = client.publish([["names t", b"x", 0, None, None]])
    refused(bad_topic, ErrorCode.INVALID_TOPIC)
    assert client.status()["topics"] == []  # nothing durable was created

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "futureq.cli.client_main", "--server", broker.client_address,
             *args],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    # Publishing creates names: futureq-cli checks them itself (usage error, exit 2).
    published = cli("publish", "names t", "x")
    assert published.returncode == 2 and "letters, digits" in published.stderr, published
    # Consuming may name a group stored by an earlier version: the server decides.
    consumed = cli("consume", "names.t", "--group", " ", "--count", "1")
    assert consumed.returncode == 1 and "INVALID_GROUP" in consumed.stderr, consumed


def test_a_255_byte_topic_is_refused_and_a_249_byte_topics_dead_letters_can_be_read(
    broker: BrokerProcess,
) -> None:
    client = WireClient(broker.client_address)
    error = refused(client.publish([["t" * 255, b"x", 0, None, None]]), ErrorCode.INVALID_TOPIC)
    assert "249" in error.message and ".dlq" in error.message
    longest = "t" * 249
    assert isinstance(
        client.request(frames.GroupCreate(client.next_id(), longest, "g", None, 1)), frames.Ok
    )
    assert isinstance(client.publish([[longest, b"poison", 0, None, None]]), frames.PublishOk)
    dead_letter(client, longest, "g")
    reader = WireClient(broker.client_address)
    reader.subscribe(longest + ".dlq", "ops")  # 253 bytes: a valid name to consume
    [delivery] = reader.deliveries(1)
    assert delivery[2] == b"poison"


def test_names_stored_by_earlier_versions_stay_usable(tmp_path: Path) -> None:
    # A data directory written under the old rule (1..255 UTF-8 bytes, printable).
    old_topic = "legacy topic " + "é" * 120  # 253 bytes, spaces, non-ASCII
    old_group = "old group"
    data = tmp_path / "old"
    db = Database(str(data))
    state = QueueState(db)
    now = int(time.time() * 1000)
    state.apply(1, commands.create_group(old_topic, old_group, None, 1))
    state.apply(2, commands.publish(now, [(old_topic, b"kept", now, None)]))
    db.close()

    broker = BrokerProcess(data)
    broker.start()
    try:
        client = WireClient(broker.client_address)
        dead_letter(client, old_topic, old_group)  # consume with the old names: works
        dlq = old_topic + ".dlq"  # 257 bytes: derived from an old name, still readable
        reader = WireClient(broker.client_address)
        reader.subscribe(dlq, "ops")
        [delivery] = reader.deliveries(1)
        assert delivery[2] == b"kept"
        # New data under an old name is refused; deleting old groups works.
        refused(client.publish([[old_topic, b"new", 0, None, None]]), ErrorCode.INVALID_TOPIC)
        refused(
            client.request(frames.Subscribe(client.next_id(), old_topic, "new group", 1)),
            ErrorCode.INVALID_GROUP,
        )
        answer = client.request(frames.GroupDelete(client.next_id(), old_topic, old_group))
        assert isinstance(answer, frames.Ok), answer
    finally:
        broker.terminate()


def test_the_dead_letter_topic_of_a_dead_letter_topic_is_refused_everywhere(
    broker: BrokerProcess,
) -> None:
    """Found by a tester: SUBSCRIBE and GROUP_CREATE took ``T.dlq.dlq``, a group that can
    never receive anything (a dead letter out of attempts is parked in ``T.dlq``). Refused
    with INVALID_TOPIC and a sentence naming ``T.dlq`` instead: by the server (whether or
    not ``T.dlq`` has a group), over HTTP, by the client library and by the CLI."""
    client = WireClient(broker.client_address)

    def check(message: str) -> None:
        assert "'names.d.dlq.dlq'" in message and "use 'names.d.dlq'" in message, message

    for _ in range(2):  # first with no group of names.d.dlq, then with one
        for frame in (
            frames.Subscribe(client.next_id(), "names.d.dlq.dlq", "g", 10),
            frames.GroupCreate(client.next_id(), "names.d.dlq.dlq", "g", None, None),
        ):
            check(refused(client.request(frame), ErrorCode.INVALID_TOPIC).message)
        client.subscribe("names.d.dlq", "g")
    browsed = client.request(
        frames.Browse(client.next_id(), "names.d.dlq.dlq.dlq", None, None, None, None, 10, 0)
    )
    assert "use 'names.d.dlq'" in refused(browsed, ErrorCode.INVALID_TOPIC).message
    url = f"http://{broker.http_address}/api/browse?topic=names.d.dlq.dlq"
    with pytest.raises(urllib.error.HTTPError) as http_error:
        urllib.request.urlopen(url, timeout=10)
    assert http_error.value.code == 400
    body = json.load(http_error.value)
    assert body["code"] == "INVALID_TOPIC"
    check(body["message"])
    with SyncClient(broker.client_address) as library:
        with pytest.raises(RequestError) as raised:
            library.create_group("names.d.dlq.dlq", "g")
        assert raised.value.code == ErrorCode.INVALID_TOPIC
        check(raised.value.message)
        with pytest.raises(RequestError) as raised:
            library.consume("names.d.dlq.dlq", "g", count=1, timeout_s=1)
        check(raised.value.message)
    for args in (
        ("consume", "names.d.dlq.dlq", "--group", "g"),
        ("group", "create", "names.d.dlq.dlq", "g"),
    ):
        run = cli(broker.client_address, *args)
        assert run.returncode == 2, run
        check(run.stderr)
    groups = [g["group"] for t in client.status()["topics"] for g in t["groups"]]
    assert groups == ["g"]  # of names.d.dlq only
