"""docs/protocol.md stays in step with the code: every error code and frame type is
documented with its number, and the documented defaults match the code's."""

from __future__ import annotations

import re
from pathlib import Path

from futureq.errors import ErrorCode
from futureq.wire import codec, frames, session, validation

DOC = (Path(__file__).resolve().parents[3] / "docs" / "protocol.md").read_text(encoding="utf-8")


def test_document_names_its_protocol_version() -> None:
    assert f"**Protocol version {frames.PROTOCOL_VERSION}**" in DOC


def test_every_error_code_has_a_row_with_its_number() -> None:
    rows = dict(re.findall(r"^\| (\d{3}) \| `([A-Z_]+)` \|", DOC, flags=re.MULTILINE))
    assert {int(number): name for number, name in rows.items()} == {
        code.value: code.name for code in ErrorCode
    }


def test_every_frame_type_has_a_row_and_a_section() -> None:
    rows = dict(re.findall(r"^\| (\d{1,2}) \| \[([A-Z_]+)\]", DOC, flags=re.MULTILINE))
    assert {int(number): name for number, name in rows.items()} == {
        t.value: t.name for t in frames.FrameType
    }
    for frame_type in frames.FrameType:
        assert f"\n### {frame_type.name}\n" in DOC
        assert f"`[{frame_type.value}, " in DOC


def test_ack_levels_are_documented() -> None:
    for level in frames.AckLevel:
        assert f"| {level.value} | `{level.name}` |" in DOC


def test_documented_defaults_match_the_code() -> None:
    limits = validation.Limits()
    assert f"{codec.DEFAULT_MAX_FRAME_BYTES:,}" in DOC
    assert f"{limits.max_payload_bytes:,}" in DOC
    assert f"{limits.max_delay_ms:,}" in DOC
    assert f"{limits.max_batch_items:,}" in DOC
    assert f"at most {session.MAX_ERROR_MESSAGE_CHARS:,} characters" in DOC


def test_every_sentence_on_name_lengths_gives_the_code_s_limit() -> None:
    """Found by a tester: the PUBLISH error table said a topic is refused "over 255
    UTF-8 bytes" while Limits, Names and the code say 249 (so ``<topic>.dlq`` fits)."""
    assert validation.MAX_TOPIC_BYTES == validation.MAX_GROUP_BYTES == 249
    for line in DOC.splitlines():
        if "INVALID_TOPIC" in line or "INVALID_GROUP" in line:
            assert "255" not in line, line
    assert f"| topic names | 1 to {validation.MAX_TOPIC_BYTES} |" in DOC
    assert f"`topic` empty, over {validation.MAX_TOPIC_BYTES} bytes" in DOC


def test_the_limits_table_says_dead_letters_may_pass_max_groups() -> None:
    """Deliberate: a dead letter's ``T.dlq`` default group is created even at
    ``max_groups`` (refusing would lose the message); the limit's row says so."""
    [row] = [line for line in DOC.splitlines() if line.startswith("| `max_groups` |")]
    assert "Dead-lettering is never refused" in row and "may pass `max_groups`" in row
