"""Logging setup for the server process: level from ``server.log_level``, concise lines."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from futureq.logging_setup import setup_logging


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    hypercorn_level = logging.getLogger("hypercorn").level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("hypercorn").setLevel(hypercorn_level)


@pytest.mark.usefixtures("restore_logging")
def test_records_at_or_above_the_level_are_written_in_the_concise_format() -> None:
    stream = io.StringIO()
    setup_logging("warning", stream)
    logging.getLogger("futureq.test").info("hidden")
    logging.getLogger("futureq.test").warning("shown %d", 1)
    [line] = stream.getvalue().splitlines()
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} WARNING futureq\.test: shown 1", line
    ), line


@pytest.mark.usefixtures("restore_logging")
def test_calling_twice_does_not_duplicate_lines_and_quiets_hypercorn() -> None:
    stream = io.StringIO()
    setup_logging("info", stream)
    setup_logging("info", stream)
    logging.getLogger("futureq.test").info("once")
    logging.getLogger("hypercorn.error").info("Running on ...")
    assert stream.getvalue().count("once") == 1
    assert "Running on" not in stream.getvalue()


def test_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="'loud'"):
        setup_logging("loud")


@pytest.mark.usefixtures("restore_logging")
def test_a_cluster_node_names_itself_in_every_line() -> None:
    stream = io.StringIO()
    setup_logging("info", stream, node_id=3)
    logging.getLogger("futureq.test").info("hello")
    [line] = stream.getvalue().splitlines()
    assert re.fullmatch(r"\S+ \S+ INFO    node=3 futureq\.test: hello", line), line


@pytest.mark.usefixtures("restore_logging")
def test_json_lines_carry_time_level_logger_node_message_and_traceback() -> None:
    stream = io.StringIO()
    setup_logging("info", stream, node_id=2, log_format="json")
    logger = logging.getLogger("futureq.test")
    logger.info("hello %s", "wörld")
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["level"] == "INFO" and first["logger"] == "futureq.test"
    assert first["node"] == 2 and first["message"] == "hello wörld"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["time"])
    assert "exception" not in first
    assert second["message"] == "failed" and "ValueError: boom" in second["exception"]
    setup_logging("info", stream, log_format="json")
    logger.info("alone")
    assert "node" not in json.loads(stream.getvalue().splitlines()[-1])


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="log format 'xml'"):
        setup_logging("info", io.StringIO(), log_format="xml")
