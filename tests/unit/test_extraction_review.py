"""The review's pure rules: window limits, cadence, answer parsing, decisions to commands."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from events import AgentConfig, TurnCommitted
from events.commands import AddMemory, DeleteMemory
from events.config import EveryMessages, ExtractionConfig, MemoryConfig, ScopeConfig
from events.record import MemoryRecord, Scope
from events.rules import extraction_review as r
from events.rules.model_answer import Malformed
from workers.processors.extraction.cadence import decide_due

NOW = datetime(2026, 1, 1, tzinfo=UTC)
TURN = TurnCommitted(event_id="ev1", tenant="t", agent="a", session="s1", turn=3, attempt=2, execution_id="x", occurred_at=NOW)


def msg(i: int, size: int = 10) -> dict[str, str]:
    return {"id": f"m{i}", "role": "user", "content": "x" * size}


def rec(i: int) -> MemoryRecord:
    return MemoryRecord(id=f"rec-{i}", version=1, created=NOW, modified=NOW, tenant="t", agent="a",
                        scope=Scope.SESSION, session="s1", kind="fact", summary=f"fact {i}")


def test_window_keeps_the_newest_12_messages():
    shown = r.window([msg(i) for i in range(20)])
    assert [m["id"] for m in shown] == [f"m{i}" for i in range(8, 20)]


def test_window_stops_at_16000_characters():
    shown = r.window([msg(i, 6000) for i in range(5)])
    assert [m["id"] for m in shown] == ["m3", "m4"]  # a third would pass 16,000


def test_window_cuts_a_single_oversized_newest_message():
    [m] = r.window([msg(0), msg(1, 40_000)])
    assert m["id"] == "m1" and len(m["content"]) == 16_000


def test_cadence():
    every3 = ExtractionConfig(every=EveryMessages(messages=3))
    assert not decide_due(every3, 2) and decide_due(every3, 3)
    assert decide_due(ExtractionConfig(), 1)


def test_parse_answer_names_the_bad_field_and_the_limit():
    with pytest.raises(Malformed, match="candidates.0.decision"):
        r.parse_answer('{"candidates": [{"decision": "maybe"}]}')
    assert len(r.parse_answer('{"candidates": [' + ",".join(['{"decision": "skip"}'] * 11) + "]}").candidates) == 11
    with pytest.raises(Malformed, match="not JSON"):
        r.parse_answer("{oops")


def test_decisions_become_commands_with_deterministic_ids_and_handles_resolved():
    handles = r.Handles.of([rec(1), rec(2), rec(1)])
    assert list(handles.records) == [1, 2]  # duplicates share a handle
    answer = r.ReviewAnswer.model_validate({"candidates": [
        {"decision": "add", "summary": "new fact"},
        {"decision": "replace", "handle": 2, "summary": "corrected"},
        {"decision": "delete", "handle": 1},
        {"decision": "skip", "summary": "meh"},
        {"decision": "delete", "handle": 9},
    ]})
    shown = [msg(0)]
    d = r.to_commands(TURN, AgentConfig(), answer, shown, handles, "m")
    add, rep, dele = d.commands
    assert isinstance(add, AddMemory) and add.replaces is None and add.scope is Scope.SESSION
    assert isinstance(rep, AddMemory) and rep.replaces == "rec-2"
    assert isinstance(dele, DeleteMemory) and dele.record_id == "rec-1"
    assert add.turn_ref == TURN.turn_ref and add.provenance.candidates == ["1=rec-1", "2=rec-2"]
    assert d.skipped == 1 and [(x.index, x.reason) for x in d.refused] == [(4, "handle")]
    again = r.to_commands(TURN, AgentConfig(), answer, shown, handles, "m")
    assert [c.command_id for c in again.commands] == [c.command_id for c in d.commands]
    other_attempt = TURN.model_copy(update={"attempt": 3})
    assert r.to_commands(other_attempt, AgentConfig(), answer, shown, handles, "m").commands[0].command_id != add.command_id


def test_a_candidate_citing_a_message_outside_the_shown_window_is_refused():
    shown = [msg(i) for i in range(3)]
    answer = r.ReviewAnswer.model_validate({"candidates": [
        {"decision": "add", "summary": "cites an unseen message", "source_message_ids": ["m1", "m99"]},
        {"decision": "add", "summary": "cites what it saw", "source_message_ids": ["m1"]}]})
    d = r.to_commands(TURN, AgentConfig(), answer, shown, r.Handles(), "m")
    assert [(x.index, x.reason) for x in d.refused] == [(0, "citation")]
    assert [c.summary for c in d.commands] == ["cites what it saw"]


def test_a_fact_cites_at_most_five_source_messages():
    shown = [msg(i) for i in range(12)]
    answer = r.ReviewAnswer.model_validate({"candidates": [
        {"decision": "add", "summary": "cites six", "source_message_ids": [f"m{i}" for i in range(6)]},
        {"decision": "add", "summary": "cites five", "source_message_ids": [f"m{i}" for i in range(5)]},
        {"decision": "add", "summary": "cites none"},
    ]})
    d = r.to_commands(TURN, AgentConfig(), answer, shown, r.Handles(), "m")
    assert [(x.index, x.reason, x.detail) for x in d.refused] == [(0, "citation", "cites 6 messages; the limit is 5 per fact")]
    five, none = d.commands
    assert five.provenance.source_message_ids == ["m0", "m1", "m2", "m3", "m4"]
    assert none.provenance.source_message_ids == ["m7", "m8", "m9", "m10", "m11"]  # the newest shown
    assert "at most 5" in r.build_messages(AgentConfig(), "s1", shown, r.Handles())[0]["content"]


def test_adds_that_give_one_key_different_texts_are_pending():
    answer = r.ReviewAnswer.model_validate({"candidates": [
        {"decision": "add", "summary": "Office is Lisbon", "key": "office"},
        {"decision": "add", "summary": "office is lisbon.", "key": "office2"},  # a restatement of ...
        {"decision": "add", "summary": "Office is Lisbon", "key": "office2"},  # ... one text: not disputed
        {"decision": "add", "summary": "Office is Porto", "key": "office"},
        {"decision": "add", "summary": "Office is Faro", "key": "office", "kind": "event"},  # another kind
        {"decision": "replace", "handle": 1, "summary": "Office is Braga", "key": "office"},  # a correction
        {"decision": "add", "summary": "x", "key": "k" * 257},
    ]})
    d = r.to_commands(TURN, AgentConfig(), answer, [msg(0)], r.Handles.of([rec(1)]), "m")
    assert [(c.summary, c.key, c.pending) for c in d.commands] == [
        ("Office is Lisbon", "office", True), ("office is lisbon.", "office2", False),
        ("Office is Lisbon", "office2", False), ("Office is Porto", "office", True),
        ("Office is Faro", "office", False), ("Office is Braga", "office", False)]
    assert [(x.index, x.reason) for x in d.refused] == [(6, "invalid")]
    assert r.answer_schema()["properties"]["candidates"]["items"]["properties"]["key"] == {"type": ["string", "null"]}


def test_agent_scope_only_when_write_allows_it():
    answer = r.ReviewAnswer.model_validate({"candidates": [{"decision": "add", "summary": "f", "scope": "agent"}]})
    session_only = AgentConfig()
    d = r.to_commands(TURN, session_only, answer, [], r.Handles(), "m")
    assert d.commands == [] and d.refused[0].reason == "scope"
    both = AgentConfig(memory=MemoryConfig(scope=ScopeConfig(write=["session", "agent"])))
    assert r.to_commands(TURN, both, answer, [], r.Handles(), "m").commands[0].scope is Scope.AGENT


def test_prompt_uses_custom_instructions_and_never_shows_ids():
    cfg = AgentConfig(memory=MemoryConfig(extraction=ExtractionConfig(prompt="ONLY COLOURS")))
    msgs = r.build_messages(cfg, "s1", [msg(0)], r.Handles.of([rec(1)]))
    assert msgs[0]["content"].startswith("ONLY COLOURS") and r.DEFAULT_INSTRUCTIONS not in msgs[0]["content"]
    assert "[1] (fact, session) fact 1" in msgs[1]["content"] and "rec-1" not in msgs[1]["content"]
    assert r.prompt_version(cfg) != r.prompt_version(AgentConfig())


def test_acknowledgements_and_repeats_are_not_searched():
    shown = [{"id": "m1", "role": "user", "content": "My invoice number is INV-2231"},
             {"id": "m2", "role": "assistant", "content": "Noted."},
             {"id": "m3", "role": "user", "content": "My invoice number is INV-2231"},
             {"id": "m4", "role": "assistant", "content": "ok thanks"}]
    assert r.search_queries(shown) == ["My invoice number is INV-2231"]


# ------------------------------------------------------------------ subjects: user scope, end users, cited messages

USER_TURN = TURN.model_copy(update={"user": "u1", "end_user": "e1"})
USER_SCOPE = AgentConfig(memory=MemoryConfig(scope=ScopeConfig(read=["user"], write=["user"])))


def _fallback(cfg: AgentConfig, turn: TurnCommitted) -> Scope:
    """The scope `to_commands` gives a proposal that names none."""
    answer = r.ReviewAnswer.model_validate({"candidates": [{"decision": "add", "summary": "no scope named"}]})
    [cmd] = r.to_commands(turn, cfg, answer, [msg(0)], r.Handles(), "m").commands
    return cmd.scope


def test_user_scope_is_allowed_only_with_a_user_and_the_default_follows_user_session_agent():
    both = AgentConfig(memory=MemoryConfig(scope=ScopeConfig(write=["session", "user", "agent"])))
    assert r.allowed_scopes(both, "s1", "u1") == ["session", "user", "agent"]
    assert r.allowed_scopes(both, None, "u1") == ["user", "agent"]
    assert r.allowed_scopes(USER_SCOPE, "s1", None) == []
    # A named member wins over the session: a member's facts never land in session scope.
    assert _fallback(both, USER_TURN) is Scope.USER
    assert _fallback(both, USER_TURN.model_copy(update={"session": None})) is Scope.USER
    assert _fallback(both, TURN) is Scope.SESSION
    assert _fallback(both, TURN.model_copy(update={"session": None})) is Scope.AGENT
    assert "user" in r.answer_schema()["properties"]["candidates"]["items"]["properties"]["scope"]["enum"]
    # The model is told the scopes it may use.
    system = r.build_messages(USER_SCOPE, "s1", [msg(0)], r.Handles(), "u1")[0]["content"]
    assert '"scope" is one of:\nuser.' in system
    assert '"scope" is one of:\nnone.' in r.build_messages(USER_SCOPE, "s1", [msg(0)], r.Handles())[0]["content"]


def test_proposals_carry_the_turns_user_and_default_to_user_scope():
    answer = r.ReviewAnswer.model_validate({"candidates": [
        {"decision": "add", "summary": "no scope named"},
        {"decision": "add", "summary": "user scope", "scope": "user"},
        {"decision": "add", "summary": "agent scope", "scope": "agent"},
        {"decision": "delete", "handle": 1},
    ]})
    d = r.to_commands(USER_TURN, USER_SCOPE, answer, [msg(0)], r.Handles.of([rec(1)]), "m")
    assert [(c.summary, c.scope) for c in d.commands[:2]] == [("no scope named", Scope.USER), ("user scope", Scope.USER)]
    assert all(c.user == "u1" and c.provenance.user == "u1" for c in d.commands)
    assert [(x.index, x.reason) for x in d.refused] == [(2, "scope")]
    # Without a user, user scope cannot be written: a candidate naming it is refused.
    d = r.to_commands(TURN, USER_SCOPE, answer, [msg(0)], r.Handles.of([rec(1)]), "m")
    assert [x.index for x in d.refused if x.reason == "scope"] == [1, 2]
    assert all(c.user is None for c in d.commands)


def test_the_end_user_never_splits_memory():
    from events import Message, ToolCall
    from workers.processors.extraction.processor import tool_writes

    call = ToolCall(id="c1", name="add_memory", arguments={"summary": "Prefers tea", "scope": "USER"})
    answer = r.ReviewAnswer.model_validate({"candidates": [{"decision": "add", "summary": "Prefers tea"}]})
    subjects = []
    for end_user in ("e1", "e2", None):
        t = USER_TURN.model_copy(update={"end_user": end_user, "messages": [
            Message(id="m0", role="user", content="I prefer tea"),
            Message(id="m1", role="assistant", tool_calls=[call])]})
        [review_cmd] = r.to_commands(t, USER_SCOPE, answer, [msg(0)], r.Handles(), "m").commands
        [tool_cmd], _ = tool_writes(t)
        subjects += [(c.tenant, c.agent, c.user, c.scope, c.provenance.user) for c in (review_cmd, tool_cmd)]
    assert set(subjects) == {("t", "a", "u1", Scope.USER, "u1")}


def test_a_tool_call_cannot_name_another_member():
    from events import Message, ToolCall
    from workers.processors.extraction.processor import tool_writes

    t = USER_TURN.model_copy(update={"messages": [Message(id="m1", role="assistant", tool_calls=[
        ToolCall(id="c1", name="add_memory", arguments={"summary": "Owes money", "user": "u2"})])]})
    assert tool_writes(t) == ([], [])


def test_with_kinds_required_a_tool_call_naming_no_kind_is_refused_with_a_usage_record():
    from events import Message, ToolCall
    from workers.processors.extraction.processor import tool_writes

    t = USER_TURN.model_copy(update={"messages": [Message(id="m1", role="assistant", tool_calls=[
        ToolCall(id="c1", name="add_memory", arguments={"summary": "Prefers tea"}),
        ToolCall(id="c2", name="add_memory", arguments={"summary": "Owns a bike", "kind": "fact"})])]})
    assert [c.kind for c in tool_writes(t)[0]] == ["fact", "fact"]  # without the setting: the default kind
    kept, refused = tool_writes(t, kinds_required=True)
    assert [c.summary for c in kept] == ["Owns a bike"]
    assert [x.reason for x in refused] == [
        "invalid: kind is required on every write (memory.kinds_required) (add_memory tool call, kind)"]


def test_a_facts_key_passes_the_write_filter_on_the_tool_and_review_paths():
    from events import Message, ToolCall
    from workers.processors.extraction.processor import tool_writes

    key = "openai_key sk-proj-0123456789abcdefABCDEF"
    t = USER_TURN.model_copy(update={"messages": [Message(id="m1", role="assistant", tool_calls=[
        ToolCall(id="c1", name="add_memory", arguments={"summary": "Rotate monthly", "key": key})])]})
    kept, refused = tool_writes(t)
    assert kept == [] and [x.reason for x in refused] == ["secret: api key (sk-) (add_memory tool call, key)"]
    answer = r.ReviewAnswer.model_validate({"candidates": [{"decision": "add", "summary": "Rotate monthly", "key": key}]})
    d = r.to_commands(TURN, USER_SCOPE, answer, [msg(0)], r.Handles(), "m")
    assert d.commands == [] and [x.reason for x in d.refused] == ["secret"]


def cited_rec(i: int, session: str | None, ids: list[str]) -> MemoryRecord:
    base = rec(i)
    return base.model_copy(update={"provenance": base.provenance.model_copy(
        update={"session": session, "source_message_ids": ids})})


def test_messages_a_found_fact_cites_are_not_shown_again():
    shown = [msg(i) for i in range(4)]
    found = [cited_rec(1, "s1", ["m0", "m2"]), cited_rec(2, "s2", ["m1"]), cited_rec(3, "s1", ["elsewhere"])]
    # A fact of another session citing "m1" speaks of another session's m1.
    assert [m["id"] for m in r.uncited(shown, found, "s1")] == ["m1", "m3"]
    assert r.uncited(shown, [], "s1") == shown
    assert r.uncited(shown, [cited_rec(1, "s1", [f"m{i}" for i in range(4)])], "s1") == []


def test_a_message_sent_again_is_passed_to_a_review_once():
    from workers.processors.extraction.cadence import SessionFacts

    facts = SessionFacts()

    def observe(offset: int, ids: list[str], review: bool) -> list[str]:
        # What ReviewState.observe computes, on the in-memory facts only.
        last = facts.last_review_below(offset)
        messages = [{"id": i, "role": "user", "content": i} for i in ids]
        pending = facts.messages_between(-1 if last is None else last, offset) + facts.new_messages(offset, messages)
        facts.add_turn(offset, messages)
        if review:
            facts.add_review(offset)
        return [m["id"] for m in pending]

    assert observe(1, ["a", "b"], review=True) == ["a", "b"]
    # The platform sends the whole conversation again: only the new messages are pending.
    assert observe(2, ["a", "b", "c", "c"], review=False) == ["c"]
    assert observe(3, ["a", "b", "c", "d"], review=True) == ["c", "d"]
    # Retried at its own offset, a turn sees what it saw the first time.
    assert observe(3, ["a", "b", "c", "d"], review=True) == ["c", "d"]
    # A cold start (the facts as Redis holds them) filters the same.
    raw = {f"t:{o}": json.dumps(m) for o, m in facts.turns.items()} | {"r:1": "1", "r:3": "1"}
    cold = SessionFacts.parse(raw)
    assert cold.first_seen == facts.first_seen and cold.repeated == facts.repeated == {"a", "b", "c"}
    # Dropping the turn that first held a re-sent id indexes the kept turns afresh.
    facts.drop_below(2)
    assert facts.first_seen == {"a": 2, "b": 2, "c": 2, "d": 3}
    assert observe(4, ["d", "e"], review=True) == ["e"]


@pytest.mark.parametrize("write", [["session"], ["user"], ["agent"], ["session", "user"], ["session", "agent"],
                                   ["user", "agent"], ["session", "user", "agent"]])
@pytest.mark.parametrize("session", ["s1", None])
@pytest.mark.parametrize("user", ["u1", None])
def test_a_proposal_naming_no_scope_gets_the_scope_the_ledger_would_give_it(write, session, user):
    """One rule (`visibility.default_scope`) for both: a review's proposal and the same write
    naming no scope land alike, except that a review never proposes session scope without a
    session (the ledger keeps it and refuses the write for want of one)."""
    from events.rules.ledger import LedgerState, decide

    cfg = AgentConfig(memory=MemoryConfig(scope=ScopeConfig(read=write, write=write)))
    turn = TURN.model_copy(update={"session": session, "user": user})
    proposed = _fallback(cfg, turn)
    written = decide(LedgerState(configs={"t/a": cfg}), AddMemory(command_id="c", tenant="t", agent="a",
                                                                  issued_at=NOW, summary="x", session=session,
                                                                  user=user))[0]
    ledger = written.record.scope if written.type == "RecordAdded" else None
    if ledger is not None:
        assert proposed is ledger
    elif session is None and "session" in write and written.field == "session":
        assert proposed is not Scope.SESSION  # the review picks what its turn can fill instead
    else:
        # Neither can be written (user scope without a user, say): both are refused.
        assert proposed.value.lower() not in r.allowed_scopes(cfg, session, user)


def test_past_ten_candidates_the_first_ten_stand_and_each_of_the_rest_is_refused():
    """An answer with 12 candidates is not thrown away (to the dead letters) whole: the first 10
    become commands, the 11th and 12th are refused, each with its usage record."""
    answer = r.parse_answer('{"candidates": [' + ",".join(
        f'{{"decision": "add", "summary": "fact {i}"}}' for i in range(12)) + "]}")
    d = r.to_commands(TURN, AgentConfig(), answer, [msg(0)], r.Handles(), "m")
    assert [c.summary for c in d.commands] == [f"fact {i}" for i in range(10)]
    assert [(x.index, x.reason, x.summary) for x in d.refused] == [(10, "limit", "fact 10"), (11, "limit", "fact 11")]
    assert "at most 10 candidates" in d.refused[0].detail
