"""``futureq-cli`` takes a command's options before, between or after its positionals.

Found by a tester: ``futureq-cli publish orders --delay 5s hello`` failed with
"unrecognized arguments: hello" (argparse gave the optional PAYLOAD its empty match
before ``--delay``), while ``publish orders hello --delay 5s`` worked.
"""

from __future__ import annotations

import pytest

from futureq.cli.client_parser import build_parser

ORDERS = [
    ["publish", "orders", "hello", "--delay", "5s", "--header", "a=b"],
    ["publish", "orders", "--delay", "5s", "hello", "--header", "a=b"],
    ["publish", "--delay", "5s", "--header", "a=b", "orders", "hello"],
    ["publish", "orders", "--header", "a=b", "--delay", "5s", "hello"],
]


@pytest.mark.parametrize("argv", ORDERS, ids=[" ".join(argv[1:]) for argv in ORDERS])
def test_publish_options_anywhere(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.topic, args.payload, args.delay) == ("orders", "hello", 5_000)
    assert args.headers == [("a", "b")]


def test_other_commands_take_options_between_positionals() -> None:
    args = build_parser().parse_args(["cancel", "orders", "--group", "g", "7", "8"])
    assert (args.topic, args.group, args.ids) == ("orders", "g", [7, 8])
    args = build_parser().parse_args(["consume", "--count", "3", "orders", "--group", "g"])
    assert (args.topic, args.group, args.count) == ("orders", "g", 3)
    args = build_parser().parse_args(["group", "create", "orders", "--max-deliveries", "3", "g"])
    assert (args.topic, args.group, args.max_deliveries) == ("orders", "g", 3)


def test_a_payload_after_double_dash_and_stdin_dash_stay_positional() -> None:
    args = build_parser().parse_args(["publish", "orders", "--delay", "1s", "--", "-x"])
    assert (args.topic, args.payload) == ("orders", "-x")
    args = build_parser().parse_args(["publish", "orders", "--delay", "1s", "-"])
    assert (args.topic, args.payload) == ("orders", "-")


def test_one_positional_too_many_is_still_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["publish", "orders", "--delay", "1s", "hello", "extra"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: extra" in capsys.readouterr().err
