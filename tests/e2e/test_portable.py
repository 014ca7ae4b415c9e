"""`memlane export` and `memlane import` on the shared stack, as an operator runs them: an agent's
memory moves to another agent with every version in the file and each record written once however
often the import runs; a Mem0 export loads the same way, with a line per memory it refuses; a
member's own export follows the agent's `memory.member_export`."""

from __future__ import annotations

import asyncio
import json

import httpx

from events import AgentConfig
from events.config import member_facts
from events.record import MAX_SUMMARY_BYTES
from services.client import MemlaneClient
from tests.e2e.cli_support import AGENT_MEMORY, memlane


async def summaries(stack, key: str) -> list[str]:
    async with MemlaneClient(stack.api_url, key) as c:
        return sorted(r["summary"] for r in (await c.list_memory(first=200))["records"])


async def test_an_export_moves_to_another_agent_once_however_often_it_is_imported(stack, settings, new_agent,
                                                                                  tmp_path):
    tenant, src, key = await new_agent(AGENT_MEMORY)
    async with MemlaneClient(stack.api_url, key) as c:
        await c.add_memory("The office closes at six", scope="AGENT")
        deploys = await c.add_memory("Deploys happen on Thursdays", scope="AGENT", key="deploy.day")
        await c.pin(deploys["id"])  # a second version
        gone = await c.add_memory("A plan that was dropped", scope="AGENT")
        await c.delete_memory(gone["id"])
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=src) as op:
        for line in ("Answer in two sentences.", "Never promise dates."):
            await op.curate_block("style", "add", line=line)
    out = tmp_path / "export.jsonl"
    r = await asyncio.to_thread(memlane, stack, "export", "--tenant", tenant, "--agent", src, "--out", str(out))
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[0]["type"] == "header" and lines[0]["format"] == "memlane.export" and lines[0]["agent"] == src
    assert lines[-1] == {"type": "end", "records": 2, "others": 1}  # a file without it was cut short
    assert [x for x in lines if x["type"] == "block"] == [
        {"type": "block", "scope": "agent", "label": "style", "text": "Answer in two sentences.\nNever promise dates."}]
    records = {x["versions"][-1]["summary"]: x for x in lines if x["type"] == "record"}
    assert set(records) == {"The office closes at six", "Deploys happen on Thursdays"}
    pinned = records["Deploys happen on Thursdays"]["versions"]
    assert [(v["version"], v["pinned"]) for v in pinned] == [(1, False), (2, True)]
    assert pinned[-1]["provenance"]["source"] and pinned[-1]["key"] == "deploy.day"

    # The agent's own key exports what it reads (it has no history, so no notes to show).
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as http:
        own = await http.get("/v1/export", headers={"Authorization": f"Bearer {key}"})
        assert own.status_code == 200, own.text
        assert json.loads(own.text.splitlines()[-1])["records"] == 2

    t2, dst, key2 = await new_agent(AGENT_MEMORY)
    for _ in range(2):  # the second run writes nothing new
        r = await asyncio.to_thread(memlane, stack, "import", str(out), "--tenant", t2, "--agent", dst)
        assert r.returncode == 0, r.stderr
        # The second run's writes are the first's commands, answered as before: none restates.
        assert "imported 2 of 2 memories" in r.stderr and "(0 restating a record it held)" in r.stderr
        assert "2 block lines" in r.stderr and "0 refused" in r.stderr
    assert await summaries(stack, key2) == ["Deploys happen on Thursdays", "The office closes at six"]
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=t2, agent=dst) as op:
        blocks = (await op._call("GET", "/v1/blocks"))["blocks"]
    assert [(b["label"], b["text"]) for b in blocks] == [("style", "Answer in two sentences.\nNever promise dates.")]
    async with MemlaneClient(stack.api_url, key2) as c:
        [moved] = [x for x in (await c.list_memory())["records"] if x["key"] == "deploy.day"]
        assert moved["pinned"] is True and moved["tenant"] == t2 and moved["agent"] == dst
        assert moved["version"] == 1, moved
    # Searched alike: the same records answer the same query in both agents.
    for query in ("when does the office close", "deploys Thursday"):
        async with MemlaneClient(stack.api_url, key) as a, MemlaneClient(stack.api_url, key2) as b:
            found = [[f.record.summary for f in (await c.search_memory(query, mode="lexical"))[0]] for c in (a, b)]
        assert found[0] == found[1] and found[0], (query, found)


async def test_a_mem0_export_loads_and_each_memory_it_cannot_take_is_named(stack, new_agent, tmp_path):
    tenant, agent, key = await new_agent(AGENT_MEMORY)
    doc = {"results": [
        {"id": "m1", "memory": "Prefers the window seat", "agent_id": agent, "metadata": {"source": "mem0"},
         "created_at": "2024-07-20T01:34:02-07:00"},
        {"id": "m2", "memory": "x" * (MAX_SUMMARY_BYTES + 1)},
        {"id": "m3", "memory": "Belongs elsewhere", "agent_id": "someone-else"},
    ]}
    path = tmp_path / "mem0.json"
    path.write_text(json.dumps(doc))
    r = await asyncio.to_thread(memlane, stack, "import", str(path), "--tenant", tenant, "--agent", agent)
    assert r.returncode == 1  # something was refused
    assert "line 2: summary:" in r.stderr and str(MAX_SUMMARY_BYTES) in r.stderr.replace(",", "")
    assert "line 3: agent_id:" in r.stderr and "imported 1 of 2 memories" in r.stderr
    assert await summaries(stack, key) == ["Prefers the window seat"]


async def test_a_members_own_export_follows_the_agents_setting(stack, settings, new_agent):
    tenant, facts_agent, _ = await new_agent(member_facts())
    open_tenant, open_agent, _ = await new_agent(AgentConfig())
    async with MemlaneClient(stack.api_url, settings.operator_key) as op:
        closed = await op.issue_key(tenant, facts_agent, "member", user="fay")
        opened = await op.issue_key(open_tenant, open_agent, "member", user="fay")
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as http:
        got = await http.get("/v1/export", headers={"Authorization": f"Bearer {closed}"})
        assert got.status_code == 403
        assert got.json()["error"]["field"] == "memory.member_export"
        # The operator exports what it may read of the same agent.
        got = await http.get("/v1/export", headers={"Authorization": f"Bearer {settings.operator_key}",
                                                    "X-Tenant": tenant, "X-Agent": facts_agent})
        assert got.status_code == 200 and got.headers["content-type"].startswith("application/x-ndjson")
        assert json.loads(got.text.splitlines()[0])["format"] == "memlane.export"
        # A default agent offers its members their own export.
        got = await http.get("/v1/export", headers={"Authorization": f"Bearer {opened}"})
        assert got.status_code == 200, got.text
        assert json.loads(got.text.splitlines()[0])["user"] == "fay"


async def test_a_members_profile_is_imported_by_a_key_that_speaks_for_them(stack, settings, new_agent, tmp_path):
    from datetime import UTC, datetime

    from events.rules import portable
    from tests.e2e.test_profiles import CFG, members

    tenant, agent, key = await new_agent(CFG)
    dana_key = (await members(stack, settings, tenant, agent, "dana"))["dana"]
    async with MemlaneClient(stack.api_url, dana_key) as dana:
        await dana.grant_consent()
    path = tmp_path / "profiles.jsonl"
    lines = [portable.header(tenant, "elsewhere", None, datetime.now(UTC).isoformat()),
             {"type": "profile", "user": "dana", "text": "Vegetarian\nPrefers metric units"}, portable.trailer(0, 1)]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    # An operator never writes a member's profile: the line is refused, naming it.
    r = await asyncio.to_thread(memlane, stack, "import", str(path), "--tenant", tenant, "--agent", agent)
    assert r.returncode == 1 and "line 2:" in r.stderr, r.stderr
    key_file = tmp_path / "agent.key"
    key_file.write_text(key)
    r = await asyncio.to_thread(memlane, stack, "import", str(path), "--tenant", tenant, "--agent", agent,
                                "--key-file", str(key_file))
    assert r.returncode == 0 and "1 profiles" in r.stderr, r.stderr
    async with MemlaneClient(stack.api_url, dana_key) as dana:
        assert (await dana.read_profile("dana"))["text"] == "Vegetarian\nPrefers metric units"
