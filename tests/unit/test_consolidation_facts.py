"""The facts consolidation distils from a run (pure): parsed, filtered, capped, naming the episode."""

import json
from datetime import UTC, datetime

from events import AgentConfig, ConfigureAgent, SessionEnded
from events.record import Source
from events.rules import consolidation as c
from events.rules.history import KeptEvent
from events.rules.ledger import LedgerState, decide, evolve, record_id_for

NOW = datetime(2026, 3, 1, tzinfo=UTC)
ENDED = SessionEnded(event_id="end-1", tenant="t", agent="a", session="s1", execution_id="x", outcome="successful",
                     occurred_at=NOW)
CFG = AgentConfig.model_validate({"memory": {"kinds": ["fact", "decision"],
                                             "scope": {"read": ["session", "agent"], "write": ["session", "agent"]}}})
EVENTS = [KeptEvent(id="m1", tenant="t", agent="a", session="s1", turn=1, attempt=1, execution_id="x", sequence=1,
                    role="user", kind="message", text="restore staging", preview=False, occurred_ms=1)]
BASE = {"goal": "Restore staging", "outcome": "successful", "success_score": 0.9,
        "summary": "Restored staging from the nightly backup", "procedure": None, "anti_pattern": None}


def fact(summary: str, kind: str = "decision", **kw) -> dict:
    return {"summary": summary, "content": kw.pop("content", ""), "kind": kind, "confidence": kw.pop("confidence", 0.9)}


def _dumps(facts: list[dict]) -> str:
    return json.dumps(BASE | {"facts": facts})


def made(facts: list[dict], cfg: AgentConfig = CFG) -> c.Consolidated:
    return c.to_commands(ENDED, cfg, c.parse_answer(_dumps(facts)), EVENTS, "m")


def test_the_schema_asks_for_facts_of_the_agents_kinds():
    schema = c.answer_schema(c.fact_kinds(CFG))
    assert "facts" in schema["required"]
    item = schema["properties"]["facts"]["items"]
    assert item["required"] == ["summary", "content", "kind", "confidence"] and item["additionalProperties"] is False
    assert item["properties"]["kind"]["enum"] == ["fact", "decision"]
    kinds = c.fact_kinds(AgentConfig.model_validate({"memory": {"kinds": ["fact", "episode", "procedure"]}}))
    assert kinds == ["fact"]  # the reserved kinds are consolidation's own records, never a fact
    assert "Allowed kinds for facts: fact, decision." in c.build_messages(ENDED, EVENTS, ["fact", "decision"])[1]["content"]


def test_facts_are_parsed_and_an_answer_without_them_still_is():
    a = c.parse_answer(_dumps([fact("Deploys go out on Tuesdays", content="Agreed with ops", confidence=0.85)]))
    assert [(f.summary, f.content, f.kind, f.confidence) for f in a.facts] == [
        ("Deploys go out on Tuesdays", "Agreed with ops", "decision", 0.85)]
    assert c.parse_answer(json.dumps(BASE)).facts == []


def test_a_bad_fact_is_refused_alone_and_the_episode_is_kept():
    out = made([fact("x", confidence=85), fact(""), fact("CI runs on arm64", "fact")])
    assert [x.kind for x in out.commands] == ["episode", "fact"]
    assert [(what, reason) for what, reason, _ in out.refused] == [("fact/0", "invalid"), ("fact/1", "invalid")]


def test_each_fact_names_the_episode_and_follows_the_session_end():
    out = made([fact("Deploys go out on Tuesdays", content="Agreed with ops"), fact("Staging is eu-west-1", "fact")])
    episode, *facts = out.commands
    episode_id = record_id_for("t", "a", episode.command_id)
    assert [(f.kind, f.summary, f.content, f.confidence) for f in facts] == [
        ("decision", "Deploys go out on Tuesdays", "Agreed with ops", 0.9), ("fact", "Staging is eu-west-1", "", 0.9)]
    for f in facts:
        assert f.provenance.episode == episode_id and f.provenance.source is Source.CONSOLIDATION
        assert (f.scope, f.session, f.provenance.session, f.provenance.execution_id) == (episode.scope, "s1", "s1", "x")
    assert episode.provenance.episode is None
    again = made([fact("Deploys go out on Tuesdays", content="Agreed with ops"), fact("Staging is eu-west-1", "fact")])
    assert [x.command_id for x in again.commands] == [x.command_id for x in out.commands]  # re-consolidation: the same
    assert len({x.command_id for x in out.commands}) == 3


def test_a_fact_with_a_secret_or_of_an_undeclared_kind_is_refused():
    out = made([fact("The deploy password is hunter2-prod"), fact("Prefers tea", "preference"),
                fact("Ran twice", "episode"), fact("CI runs on arm64", "fact")])
    assert [x.summary for x in out.commands[1:]] == ["CI runs on arm64"]
    assert [(what, reason) for what, reason, _ in out.refused] == [("fact/0", "secret"), ("fact/1", "kind"),
                                                                   ("fact/2", "kind")]


def test_facts_are_capped():
    out = made([fact(f"Service {i} runs on port {8000 + i}", "fact") for i in range(c.MAX_FACTS + 3)])
    assert len(out.commands) == 1 + c.MAX_FACTS
    assert [(what, reason) for what, reason, _ in out.refused] == [(f"fact/{i}", "cap") for i in range(10, 13)]


def test_no_fact_without_its_episode():
    answer = c.parse_answer(_dumps([fact("CI runs on arm64", "fact")]).replace(BASE["summary"], "token = abcd1234efgh"))
    out = c.to_commands(ENDED, CFG, answer, EVENTS, "m")
    assert out.commands == [] and [w for w, _, _ in out.refused] == ["episode"]


def test_the_ledger_keeps_the_facts_with_their_episode():
    state = LedgerState()
    for e in decide(state, ConfigureAgent(command_id="cfg", tenant="t", agent="a", issued_at=NOW, config=CFG)):
        evolve(state, e)
    out = made([fact("Deploys go out on Tuesdays")])
    records = []
    for cmd in out.commands:
        events = decide(state, cmd)
        for e in events:
            evolve(state, e)
        records += [e.record for e in events if e.type == "RecordAdded"]
    episode, decision = records
    assert (decision.kind, decision.provenance.episode, decision.confidence) == ("decision", episode.id, 0.9)
