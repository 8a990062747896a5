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
