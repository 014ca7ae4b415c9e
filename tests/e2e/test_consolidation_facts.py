"""Consolidation distils facts, end to end: turns and session ends on Kafka -> extraction and
consolidation workers (fake model over HTTP) -> ledger -> projections -> API. The facts name
their episode, the run's extraction-made facts get linked to it, and a decision stated in
three runs becomes one procedure whose reported outcomes reorder procedures."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from events import AgentConfig, SessionEnded
from events.config import MemoryConfig, ScopeConfig
from events.record import MemoryRecord
from events.rules import procedures
from services.client import MemlaneClient, TurnPublisher
from tests.conftest import eventually
from tests.e2e.extraction_support import answer, new_agent, turn
from tests.fakes.model_server import Reply

DECISION = "Deploys go out on Tuesdays after the freeze review"


@pytest.fixture(scope="module")
def cstack(model_stack):
    return model_stack

def marker() -> str:
    return f"mk{uuid.uuid4().hex[:10]}"


def cand(summary: str, kind: str = "fact", scope: str = "session") -> dict:
    return {"decision": "add", "handle": None, "kind": kind, "labels": {}, "scope": scope, "summary": summary,
            "content": "", "source_message_ids": []}


def consolidation(m: str, facts: list[dict], **kw) -> Reply:
    return Reply({"goal": "Ship the release", "outcome": "successful", "success_score": 0.9,
                  "summary": f"Shipped the release ({m})", "procedure": None, "anti_pattern": None,
                  "facts": facts} | kw)


def fact(summary: str, kind: str = "decision", confidence: float = 0.9) -> dict:
    return {"summary": summary, "content": "", "kind": kind, "confidence": confidence}


async def test_a_run_distils_facts_links_its_own_and_a_decision_of_three_runs_becomes_a_procedure(cstack, fake):
    stack, settings = cstack
    cfg = AgentConfig(memory=MemoryConfig(kinds=["fact", "decision"],
                                          scope=ScopeConfig(read=["session", "agent"], write=["session", "agent"]),
                                          tools=["add_memory", "read_memory", "report_outcome"]))
    tenant, a, key = await new_agent(stack.api_url, settings.operator_key, cfg)
    steps = ["Freeze merges", "Run the release checklist", "Deploy"]
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub, \
            MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=a) as op:

        async def records() -> list[dict]:
            return (await op.list_memory(first=100, sort="ASC"))["records"]

        async def run(session: str, review: Reply, reply, kept: str | None = None) -> list[dict]:
            """One session: a turn the extraction worker reviews (keeping `kept`), then its end, consolidated."""
            m = marker()
            fake.on(m, review, reply(m))  # the turn's review asks first, then the session's consolidation
            await pub.publish(turn(tenant, a, session, 1, f"{m}: ship the release", "Shipped."))
            await eventually(lambda: fake.requests_with(m) or None, timeout=20)
            if kept:  # the run's fact is in the ledger before the run ends

                async def has() -> bool:
                    return any(r["summary"] == kept for r in await records())

                await eventually(has, timeout=20)
            await pub.publish(SessionEnded(event_id=str(uuid.uuid4()), tenant=tenant, agent=a, session=session,
                                           execution_id=f"exec-{session}", outcome="successful",
                                           occurred_at=datetime.now(UTC)))

            async def episode():
                return [r for r in await records() if r["kind"] == "episode" and m in r["summary"]] or None

            await eventually(episode, timeout=30)
            return await records()

        # Run 1: extraction keeps a fact of the session; consolidation gives the episode, a
        # procedure, two facts (one refused: a credential), and links the extraction-made fact.
        rows = await run("s1", answer(cand("The build cache lives in the eu-west bucket")),
                         lambda m: consolidation(m, [fact(DECISION), fact("The deploy password is hunter2-prod"),
                                                     fact("Release notes live in the wiki", "fact")],
                                                 procedure={"name": "Ship a release", "steps": steps,
                                                            "approved_pattern": True}),
                         kept="The build cache lives in the eu-west bucket")

        async def settled():
            rs = await records()
            return rs if any(r["provenance"].get("episode") and r["provenance"]["source"] == "EXTRACTION"
                             for r in rs) else None

        rows = await eventually(settled, timeout=20)
        by_summary = {r["summary"]: r for r in rows}
        [episode] = [r for r in rows if r["kind"] == "episode"]
        assert "The deploy password is hunter2-prod" not in by_summary
        for s in (DECISION, "Release notes live in the wiki"):
            made = by_summary[s]
            assert (made["provenance"]["source"], made["provenance"]["episode"]) == ("CONSOLIDATION", episode["id"])
        extracted = by_summary["The build cache lives in the eu-west bucket"]
        assert (extracted["version"], extracted["provenance"]["episode"]) == (2, episode["id"])
        v1, v2 = sorted(await op.history(extracted["id"]), key=lambda r: r.version)
        assert v1.provenance.episode is None and (v2.summary, v2.provenance.source.value) == (v1.summary, "EXTRACTION")
        shipped = by_summary["Ship a release"]
        assert [r["kind"] for r in rows].count("procedure") == 1

        # Runs 2 and 3 state the same decision: the third statement makes one procedure.
        for session in ("s2", "s3"):
            rows = await run(session, answer(), lambda m: consolidation(m, [fact(DECISION)]))

        async def promoted():
            rs = [r for r in await records() if r["kind"] == "procedure" and r["summary"] == DECISION]
            return rs or None

        [proc] = await eventually(promoted, timeout=20)
        decision = {r["summary"]: r for r in await records() if r["kind"] == "decision"}[DECISION]
        assert decision["confirmations"] == 2 and proc["metadata"]["from_facts"] == [decision["id"]]
        assert proc["provenance"]["source"] == "CONSOLIDATION"
        # A fourth run confirms again and makes no second procedure.
        await run("s4", answer(), lambda m: consolidation(m, [fact(DECISION)]))

        async def confirmed_thrice():
            rs = await records()
            d = next(r for r in rs if r["summary"] == DECISION and r["kind"] == "decision")
            return rs if d["confirmations"] == 3 else None

        rows = await eventually(confirmed_thrice, timeout=20)
        assert [r["summary"] for r in rows if r["kind"] == "procedure"].count(DECISION) == 1

    # Outcomes reported through the API reorder the two procedures (equal relevance).
    async with MemlaneClient(stack.api_url, key, session="s5") as c:
        async def both() -> list[MemoryRecord]:
            return [await c.read_memory(proc["id"]), await c.read_memory(shipped["id"])]

        before = procedures.rank(await both(), {proc["id"]: 0.5, shipped["id"]: 0.5})
        assert [r.id for r in before] == [shipped["id"], proc["id"]]  # the run's own: one success already
        for _ in range(2):
            await c.report_outcome(shipped["id"], False)
        await c.report_outcome(proc["id"], True)
        after = procedures.rank(await both(), {proc["id"]: 0.5, shipped["id"]: 0.5})
        assert [r.id for r in after] == [proc["id"], shipped["id"]]

        # Recall orders procedures by relevance (the search's score) weighted by outcomes: after
        # more of them, a query whose search ranks "Ship a release" first recalls the decision first.
        # Enough of them that the weights stand 2.5 to 1: the relevance gap varies with the episodes'
        # random markers (hashed embeddings), and at 1.9 to 1 one run in a few kept the search's order.
        for _ in range(20):
            await c.report_outcome(shipped["id"], False)
            await c.report_outcome(proc["id"], True)
        query = "how do we ship a release and when do deploys go out"
        found, _ = await c.search_memory(query, limit=20)
        scores = {f.record.id: f.score for f in found}
        assert scores[shipped["id"]] > scores[proc["id"]], found  # relevance alone: the other order
        recalled = await c.recall("conv-outcomes", query)
        assert [p["id"] for p in recalled["procedures"]] == [proc["id"], shipped["id"]], recalled


async def test_an_ended_run_s_entries_are_distilled_events_of_its_episode_and_its_procedure_s_steps(cstack, fake):
    stack, settings = cstack
    cfg = AgentConfig(memory=MemoryConfig(kinds=["fact", "decision"],
                                          scope=ScopeConfig(read=["session", "agent"], write=["session", "agent"])))
    tenant, a, key = await new_agent(stack.api_url, settings.operator_key, cfg)
    m, run_id = marker(), f"run-{uuid.uuid4().hex[:8]}"
    steps = ["Stop the writers", "Restore the nightly backup", "Compare the row counts"]
    async with MemlaneClient(stack.api_url, key, session="s1") as c:
        entries = [(await c.add_memory(f"{s} ({m})", run_id=run_id))["run_entry"]["id"] for s in steps]
    fake.on(m, consolidation(m, [fact("Staging restores take about an hour")], procedure={
        "name": "Restore staging", "steps": ["a step the model wrote"], "approved_pattern": True}))
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub:
        # Only the run's entries: the session said nothing history keeps.
        await pub.publish(SessionEnded(event_id=str(uuid.uuid4()), tenant=tenant, agent=a, session="s1", run=run_id,
                                       outcome="successful", occurred_at=datetime.now(UTC)))
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=a) as op:

        async def made():
            rows = (await op.list_memory(first=100))["records"]
            return rows if {r["kind"] for r in rows} >= {"episode", "procedure", "decision"} else None

        rows = await eventually(made, timeout=30)
    [episode] = [r for r in rows if r["kind"] == "episode"]
    [procedure] = [r for r in rows if r["kind"] == "procedure"]
    [distilled] = [r for r in rows if r["kind"] == "decision"]
    assert (episode["metadata"]["run"], episode["metadata"]["run_entries"]) == (run_id, entries)
    assert procedure["metadata"]["steps"] == [f"{s} ({m})" for s in steps]  # the run's own sequence
    assert distilled["provenance"]["episode"] == episode["id"]
    [request] = fake.requests_with(m)
    assert all(f"{s} ({m})" in request["messages"][1]["content"] for s in steps)
    async with MemlaneClient(stack.api_url, key, session="s2") as c:  # episodes are searched directly too
        found, _ = await c.search_memory("restore staging", kind="episode")
        assert [f.record.id for f in found] == [episode["id"]]
