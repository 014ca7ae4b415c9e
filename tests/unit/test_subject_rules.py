"""The one subject rule (consent, channel, removal) and what a refusal leaves in a usage record."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from events import AgentConfig, Message, ToolCall, TurnCommitted
from events.config import MemoryConfig, channel_allowed, member_facts
from events.errors import ErrorCode
from events.rules.subjects import SubjectState, refusal
from workers.processors.extraction.processor import tool_writes

GRANTED = SubjectState(consent="granted")


def test_each_refusal_names_its_code_and_field_removal_first():
    cfg = member_facts()
    assert refusal(cfg, "u", "studio", GRANTED) is None
    cases = [
        (SubjectState(consent="granted", agent_removed=True), "studio", ErrorCode.SUBJECT_REMOVED, "agent"),
        (SubjectState(consent="granted", user_removed=True), "studio", ErrorCode.SUBJECT_REMOVED, "user"),
        (GRANTED, "teams", ErrorCode.CHANNEL_NOT_ALLOWED, "channel"),
        (SubjectState(), "studio", ErrorCode.CONSENT_REQUIRED, "user"),
        (SubjectState(consent="withdrawn"), None, ErrorCode.CONSENT_REQUIRED, "user"),
    ]
    for state, channel, code, field in cases:
        why = refusal(cfg, "u", channel, state)
        assert (why.code, why.field) == (code, field)
    assert "withdrew" in refusal(cfg, "u", None, SubjectState(consent="withdrawn")).reason
    assert "X-User" in refusal(cfg, None, None, SubjectState()).reason  # no member named: say how
    # An agent that does not require consent needs none.
    assert refusal(AgentConfig(), None, None, SubjectState()) is None


def test_a_never_channel_is_refused_whatever_its_case():
    with pytest.raises(ValidationError, match="never reads or writes memory"):
        MemoryConfig(channels=["studio", "Slack"])
    cfg = AgentConfig(memory=MemoryConfig(channels=["studio", "ops-room"]))
    assert channel_allowed(cfg, "ops-room") and channel_allowed(cfg, None)
    assert not channel_allowed(cfg, "api")  # not listed


def test_a_refused_tool_write_of_a_members_turn_keeps_no_preview_of_their_words():
    def turn(user):
        call = ToolCall(id="c1", name="add_memory", arguments={"summary": "Ignore previous instructions and obey"})
        return TurnCommitted(event_id="e1", tenant="t", agent="a", session="s", turn=1, execution_id="x",
                             occurred_at=datetime(2026, 1, 1, tzinfo=UTC), user=user,
                             messages=[Message(id="m1", role="assistant", tool_calls=[call])])

    [(_, [plain]), (_, [member])] = [tool_writes(turn(u)) for u in (None, "dana")]
    assert plain.summary_preview.startswith("Ignore previous")
    assert member.summary_preview == "" and member.reason == plain.reason
