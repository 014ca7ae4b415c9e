"""Session memory through the running stack (docs/features/session-memory.md): run-only writes land in
the run and not in the durable store, a write with a scope in both, and a run past its buffer's
size is compressed by the consolidation process's model call into the run's summary."""

from __future__ import annotations

import uuid

import httpx
import pytest

from events.config import AgentConfig
from events.memory import RunSummarized
from events.rules import runs
from events.topics import EVENTS, USAGE
from services.client import MemlaneClient
from tests.conftest import eventually, refused
from tests.e2e.extraction_support import new_agent, read_topic
from tests.fakes.model_server import Reply

CONFIG = AgentConfig.model_validate({"memory": {"scope": {"read": ["session", "agent"], "write": ["session", "agent"]}}})


@pytest.fixture(scope="module")
def run_stack(model_stack, fake):
    return (*model_stack, fake)

async def _run(stack, key, run_id):
    async with httpx.AsyncClient(base_url=stack.api_url, headers={"Authorization": f"Bearer {key}"}) as h:
        r = await h.get(f"/v1/runs/{run_id}")
        assert r.status_code == 200, r.text
        return r.json()


async def test_run_only_writes_stay_in_the_run_and_durable_writes_go_to_both(run_stack):
    stack, settings, _ = run_stack
    tenant, agent, key = await new_agent(stack.api_url, settings.operator_key, CONFIG)
    run_id = f"run-{uuid.uuid4().hex[:8]}.a_b"
    async with MemlaneClient(stack.api_url, key, session="s1") as c:
        only = await c.add_memory("Run note: the build uses pnpm", run_id=run_id)
        assert only["status"] == "applied" and only["memories"] == [] and only["run_entry"]["record_id"] is None
        durable = await c.add_memory("Durable: the deploy target is eu-west-1", run_id=run_id, scope="AGENT")
        rid = durable["id"]
        assert durable["run_entry"]["record_id"] == rid
        # read-your-writes: the answer comes once the run view shows the entry
        # layer Workspace: durable at once in the scope the agent's writes take, and in the run too.
        workspace = await c.add_memory("Durable: releases are cut on Tuesdays", run_id=run_id, layer="Workspace")
        assert workspace["run_entry"]["record_id"] == workspace["id"]
        assert (await c.read_memory(workspace["id"])).summary == "Durable: releases are cut on Tuesdays"
        await refused(c.add_memory("x", run_id=run_id, layer="Session", scope="AGENT"), 422, "VALIDATION_FAILED",
                      "scope")
        await refused(c.add_memory("x", layer="Session"), 422, "VALIDATION_FAILED", "run_id")
        view = await _run(stack, key, run_id)
        assert [e["summary"] for e in view["sessionEntries"]] == [
            "Run note: the build uses pnpm", "Durable: the deploy target is eu-west-1",
            "Durable: releases are cut on Tuesdays"]
        assert [e["record_id"] for e in view["sessionEntries"]] == [None, rid, workspace["id"]]
        assert view["sessionSummary"] is None and view["run_id"] == run_id and view["expires_at"]
        listed = [r["summary"] for r in (await c.list_memory())["records"]]
        assert listed == ["Durable: releases are cut on Tuesdays", "Durable: the deploy target is eu-west-1"]
        found, _ = await c.search_memory("build pnpm deploy target")
        assert [f.record.id for f in found] == [rid]
        assert (await _run(stack, key, "another-run"))["sessionEntries"] == []


async def test_a_run_past_its_size_is_compressed_into_its_summary(run_stack):
    stack, settings, fake = run_stack
    tenant, agent, key = await new_agent(stack.api_url, settings.operator_key, CONFIG)
    run_id = f"big-{uuid.uuid4().hex[:8]}"
    fake.on(run_id, Reply({"summary": "Compressed: steps one and two are done."}))
    written = []
    async with MemlaneClient(stack.api_url, key) as c:
        for i in range(3):  # 3 x 1,406 characters: past COMPRESS_CHARS at the third
            out = await c.add_memory(f"Step {i}", content=f"{i}" * 1400, run_id=run_id)
            written.append(out["run_entry"]["id"])

    async def summarized():
        view = await _run(stack, key, run_id)
        return view if view["sessionSummary"] else None

    view = await eventually(summarized, timeout=20)
    assert view["sessionSummary"] == "Compressed: steps one and two are done."
    assert [e["id"] for e in view["sessionEntries"]] == written[2:]  # only the newest stays raw
    [event] = [e for e, _ in await read_topic(settings, EVENTS.name, EVENTS.name)
               if isinstance(e, RunSummarized) and e.agent == agent]
    assert event.entry_ids == written[:2] and event.run == run_id
    [request] = fake.requests_with(run_id)
    assert runs.MARKER in request["messages"][1]["content"] and "Step 1" in request["messages"][1]["content"]
    usage = [u for u, _ in await read_topic(settings, USAGE.name, USAGE.name)
             if getattr(u, "agent", None) == agent and getattr(u, "purpose", None)]
    assert [u.purpose for u in usage] == ["consolidation"]


async def test_a_run_summary_the_write_filter_refuses_is_not_kept(run_stack):
    stack, settings, fake = run_stack
    tenant, agent, key = await new_agent(stack.api_url, settings.operator_key, CONFIG)
    run_id = f"leak-{uuid.uuid4().hex[:8]}"
    fake.on(run_id, Reply({"summary": "Done; the key is sk-proj-0123456789abcdefABCDEF0123"}))
    async with MemlaneClient(stack.api_url, key) as c:
        for i in range(3):
            await c.add_memory(f"Step {i}", content=f"{i}" * 1400, run_id=run_id)

    async def refused_summary():
        usage = [u for u, _ in await read_topic(settings, USAGE.name, USAGE.name)
                 if getattr(u, "agent", None) == agent and u.type == "CandidateRefused"]
        return usage or None

    [refusal] = await eventually(refused_summary, timeout=20)
    assert refusal.reason.startswith("secret") and refusal.reason.endswith("(run summary)")
    view = await _run(stack, key, run_id)
    assert view["sessionSummary"] is None and len(view["sessionEntries"]) == 3  # the entries stay as they were


async def test_a_bad_run_id_is_refused_naming_the_field(run_stack):
    stack, settings, _ = run_stack
    _, _, key = await new_agent(stack.api_url, settings.operator_key, CONFIG)
    async with httpx.AsyncClient(base_url=stack.api_url, headers={"Authorization": f"Bearer {key}"}) as h:
        for bad in ("a/b", "x" * 129):
            r = await h.post("/v1/memory", json={"summary": "s", "run_id": bad})
            assert r.status_code == 422, r.text
            assert r.json()["error"]["field"] == "run_id", r.text


async def test_recall_shows_the_run_s_summary_and_entries_and_never_another_member_s(run_stack):
    stack, settings, fake = run_stack
    tenant, agent, key = await new_agent(stack.api_url, settings.operator_key, CONFIG)
    run_id = f"rec-{uuid.uuid4().hex[:8]}"
    fake.on(run_id, Reply({"summary": "Earlier in the run: the staging database was restored."}))
    async with MemlaneClient(stack.api_url, key, user="dana") as dana, \
            MemlaneClient(stack.api_url, key, user="erin") as erin:
        for i in range(3):
            await dana.add_memory(f"Dana step {i}", content=f"{i}" * 1400, run_id=run_id)
        await erin.add_memory("Erin's own note in a run of the same id", run_id=run_id)

        async def compressed():
            out = await dana.recall("conv-dana", "what happened in this run?", run_id=run_id)
            return out if out["sessionSummary"] else None

        out = await eventually(compressed, timeout=20)
        assert out["sessionSummary"] == "Earlier in the run: the staging database was restored."
        assert [e["summary"] for e in out["sessionEntries"]] == ["Dana step 2"]
        text = out["rendered"]
        assert text.index("## Session summary") < text.index("## Session entries")
        assert "Erin" not in text
        theirs = await erin.recall("conv-erin", "what happened in this run?", run_id=run_id)
        assert [e["summary"] for e in theirs["sessionEntries"]] == ["Erin's own note in a run of the same id"]
        assert theirs["sessionSummary"] is None and "Dana" not in theirs["rendered"]
        # No run named: no session layers.
        plain = await dana.recall("conv-plain", "what happened in this run?")
        assert plain["sessionEntries"] == [] and plain["sessionSummary"] is None
        # An operator naming the member reads none of their session memory.
        async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent, user="dana") as op:
            assert (await op.recall("conv-op", "what happened in this run?", run_id=run_id))["sessionEntries"] == []
            r = await op.http.get(f"/v1/runs/{run_id}")
            assert r.status_code == 403 and r.json()["error"]["field"] == "x-user", r.text
