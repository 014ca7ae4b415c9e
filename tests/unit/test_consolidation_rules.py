"""What a session that ended becomes: episodes, procedures, anti-patterns (pure)."""

from datetime import UTC, datetime

import pytest

from events import AgentConfig, SessionEnded
from events.record import Scope, Source
from events.rules import consolidation as c
from events.rules.history import KeptEvent
from events.rules.ledger import record_id_for
from events.rules.model_answer import Malformed

NOW = datetime(2026, 3, 1, tzinfo=UTC)
ENDED = SessionEnded(event_id="end-1", tenant="t", agent="a", session="s1", execution_id="x", outcome="successful",
                     occurred_at=NOW)
BOTH = AgentConfig.model_validate({"memory": {"scope": {"read": ["session", "agent"], "write": ["session", "agent"]}}})


def ev(i: int, text: str = "hello", turn: int = 1) -> KeptEvent:
    return KeptEvent(id=f"m{i}", tenant="t", agent="a", session="s1", turn=turn, attempt=1, execution_id="x",
                     sequence=i, role="user", kind="message", text=text, preview=False, occurred_ms=i)


def answer(**kw) -> c.ConsolidationAnswer:
    base = {"goal": "Restore staging", "outcome": "successful", "success_score": 0.9,
            "summary": "Restored staging from the nightly backup", "procedure": None, "anti_pattern": None}
    return c.ConsolidationAnswer.model_validate(base | kw)


PROCEDURE = {"name": "Restore staging", "steps": ["Stop writes", "Restore the backup"], "approved_pattern": True}


def test_an_episode_names_its_run():
    events = [ev(1), ev(2)]
    made = c.to_commands(ENDED, BOTH, answer(), events, "m")
    [episode] = made.commands
    assert (episode.kind, episode.scope, episode.session) == ("episode", Scope.AGENT, "s1")
    assert episode.metadata == {"goal": "Restore staging", "outcome": "successful", "success_score": 0.9,
                                "events": ["m1", "m2"]}
    assert episode.provenance.source is Source.CONSOLIDATION and episode.provenance.prompt_version == c.prompt_version()
    assert "Outcome: successful (success score 0.90)" in episode.content
    again = c.to_commands(ENDED, BOTH, answer(), events, "m")
    assert again.commands[0].command_id == episode.command_id  # consolidating again proposes the same
    assert c.to_commands(ENDED, AgentConfig(), answer(), events, "m").commands[0].scope is Scope.SESSION


@pytest.mark.parametrize(("score", "outcome", "approved", "made"), [
    (0.9, "successful", True, True),
    (0.7, "successful", True, False),  # above 0.7 only
    (0.9, "successful", False, False),  # no approved pattern
    (0.9, "uncertain", True, False),
])
def test_a_procedure_comes_from_a_successful_run_above_0_7_with_an_approved_pattern(score, outcome, approved, made):
    a = answer(success_score=score, outcome=outcome, procedure={**PROCEDURE, "approved_pattern": approved})
    cmds = c.to_commands(ENDED, BOTH, a, [ev(1)], "m").commands
    assert [x.kind for x in cmds] == (["episode", "procedure"] if made else ["episode"])
    if made:
        assert cmds[1].metadata["episode"] == record_id_for(cmds[0].tenant, cmds[0].agent, cmds[0].command_id)
        assert cmds[1].content == "1. Stop writes\n2. Restore the backup"
        assert (cmds[1].metadata["successes"], cmds[1].metadata["anti_pattern"]) == (1, False)


def test_a_failed_run_gives_an_anti_pattern():
    a = answer(outcome="failed", success_score=0.1, anti_pattern="restoring before stopping writes")
    _, avoid = c.to_commands(ENDED, BOTH, a, [ev(1)], "m").commands
    assert avoid.summary == "Avoid: restoring before stopping writes" and avoid.metadata["anti_pattern"] is True


def test_the_write_filter_applies_and_nothing_points_to_a_refused_episode():
    a = answer(summary="Mailed the fix to dana@example.com", procedure=PROCEDURE)
    made = c.to_commands(ENDED, BOTH, a, [ev(1)], "m")
    assert made.commands == [] and [(w, r) for w, r, _ in made.refused] == [("episode", "pii")]


def test_the_model_sees_the_newest_events_within_the_budget():
    events = [ev(i, "x" * 3000) for i in range(40)]
    shown = c.shown_events(events)
    assert [e.id for e in shown] == [f"m{i}" for i in range(28, 40)]  # 12 x 2,000 characters
    assert c.shown_events([ev(1, "y" * 50_000)])[0].id == "m1"  # one long event is still shown


def test_a_malformed_answer_names_the_field():
    with pytest.raises(Malformed, match="success_score"):
        c.parse_answer('{"outcome": "successful", "success_score": 3, "summary": "x"}')
    with pytest.raises(Malformed, match="outcome"):
        c.parse_answer('{"outcome": "great", "success_score": 0.5, "summary": "x"}')


def test_a_procedure_the_contract_refuses_is_refused_not_retried():
    a = answer(procedure={**PROCEDURE, "name": "   "})  # passes the answer's schema, not AddMemory's
    made = c.to_commands(ENDED, BOTH, a, [ev(1)], "m")
    assert [x.kind for x in made.commands] == ["episode"]
    assert [(w, r) for w, r, _ in made.refused] == [("procedure", "invalid")]


def test_the_answer_schema_is_strict_and_its_procedure_nullable():
    schema = c.answer_schema()
    assert set(schema["required"]) == set(schema["properties"]) and schema["additionalProperties"] is False
    procedure, null = schema["properties"]["procedure"]["anyOf"]
    assert null == {"type": "null"} and set(procedure["required"]) == set(procedure["properties"])
    assert c.parse_answer('{"outcome": "failed", "success_score": 0.1, "summary": "x", "procedure": null}').procedure is None


def test_a_members_session_is_consolidated_into_their_own_memory():
    from events.config import member_facts

    mine = ENDED.model_copy(update={"user": "u1"})
    both = AgentConfig.model_validate({"memory": {"scope": {"read": ["user", "agent"], "write": ["user", "agent"]}}})
    for cfg in (member_facts(kinds=["fact"]), both):
        [episode] = c.to_commands(mine, cfg, answer(), [ev(1)], "m").commands
        # Agent scope would retell one member's session to every other member.
        assert (episode.scope, episode.user, episode.provenance.user) == (Scope.USER, "u1", "u1")
    # Without a member, the agent keeps today's choice.
    assert c.to_commands(ENDED, both, answer(), [ev(1)], "m").commands[0].scope is Scope.AGENT
