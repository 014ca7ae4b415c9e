"""Logs never hold input values: the structlog processor and the standard-library formatter
cut them out, and the extraction worker never logs a bad tool call's arguments."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

import structlog
from pydantic import ValidationError

from events import Message, ToolCall, TurnCommitted
from events.commands import AddMemory
from settings.logging import RedactingFormatter, redact, scrub

CANARY = "canary-7f3e9b2d-secret-text"


def _validation_error() -> ValidationError:
    try:
        AddMemory(command_id="c", tenant="t", agent="a", issued_at=datetime.now(UTC), summary=CANARY,
                  confidence=f"{CANARY}, input_type=x] {CANARY}", labels={"k": [CANARY]})
    except ValidationError as e:
        return e
    raise AssertionError("the command should not validate")


def test_scrub_cuts_pydantic_input_values_and_keeps_where_and_why():
    text = str(_validation_error())
    assert CANARY in text  # pydantic does put it there
    out = scrub(text)
    assert CANARY not in out
    assert "confidence" in out and "input_value=[redacted]" in out and "type=" in out


def test_the_processor_redacts_text_keys_nested_strings_and_rendered_tracebacks():
    try:
        raise RuntimeError("wrapped") from _validation_error()
    except RuntimeError:
        event = structlog.processors.format_exc_info(None, "error", {"event": "x", "exc_info": True})
    assert CANARY in event["exception"]
    event.update(summary=CANARY, query=CANARY, error=str(_validation_error()), extra={"text": CANARY, "n": [CANARY]},
                 count=3)
    out = redact(None, "error", event)
    # Every field that must be redacted is, each on its own: a count over the whole event
    # would pass with the canary in one redacted field and missing from extra.n.
    for name in ("exception", "summary", "query", "error"):
        assert CANARY not in json.dumps(out[name]), name
    assert out["extra"]["text"] == "[redacted]"
    assert out["extra"]["n"] == [CANARY]  # a list of a plain value no rule can tell from an id
    assert out["count"] == 3 and out["event"] == "x"


def test_standard_library_lines_and_their_tracebacks_are_scrubbed():
    try:
        raise _validation_error()
    except ValidationError:
        record = logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, "Exception in ASGI application",
                                   None, sys.exc_info())
    line = RedactingFormatter("%(message)s").format(record)
    assert "ValidationError" in line and CANARY not in line


def test_a_bad_tool_call_is_logged_by_field_never_by_value():
    from workers.processors.extraction.processor import tool_writes

    turn = TurnCommitted(event_id="ev", tenant="t", agent="a", session="s1", turn=1, attempt=1, execution_id="e",
                         occurred_at=datetime.now(UTC), messages=[Message(id="m1", role="assistant", tool_calls=[
                             ToolCall(id="c1", name="add_memory", arguments={"summary": CANARY, "pinned": CANARY})])])
    with structlog.testing.capture_logs() as logs:
        assert tool_writes(turn) == ([], [])
    assert [e["event"] for e in logs] == ["tool_call_invalid"] and "pinned" in json.dumps(logs)
    assert CANARY not in json.dumps(logs)
