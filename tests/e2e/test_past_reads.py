"""`as_of` and `valid_at` over the API on the shared stack: a record deleted since is listed, read
and versioned as it stood; a member's facts stay theirs in the past too; a fact is listed for the
times it held in the world; a search and a recall rank and show the records live then, and the
recall marks nothing recalled; a bad `as_of` is refused naming it."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx

from events import AgentConfig
from services.client import MemlaneClient

CONFIG = AgentConfig.model_validate({"memory": {
    "scope": {"read": ["agent", "user"], "write": ["agent", "user"]}, "pinned": {"max_tokens": 200},
    "tools": ["add_memory", "read_memory", "delete_memory", "pin_memory", "unpin_memory"]}})


async def test_memory_as_it_stood_before_a_delete(stack, settings, new_agent):
    tenant, agent, key = await new_agent(CONFIG)
    async with MemlaneClient(stack.api_url, key) as c:
        kept = await c.add_memory("The office closes at six", scope="AGENT")
        gone = await c.add_memory("Deploys happen on Tuesdays", scope="AGENT")
        await c.pin(gone["id"])
        # The point: the position of the agent's log the pin's answer was served at (every write
        # above is before it, the delete below after it), as X-Memlane-Position reports it.
        [(partition, offset)] = c.positions.items()
        point = f"{partition}:{offset}"
        await c.delete_memory(gone["id"])
        now = sorted(r["summary"] for r in (await c.list_memory())["records"])
    assert now == ["The office closes at six"]
    auth = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=stack.api_url, headers=auth, timeout=30) as http:
        then = (await http.get("/v1/memory", params={"as_of": point})).json()["records"]
        assert sorted(r["summary"] for r in then) == ["Deploys happen on Tuesdays", "The office closes at six"]
        read = (await http.get(f"/v1/memory/{gone['id']}", params={"as_of": point})).json()
        assert (read["status"], read["pinned"], read["version"]) == ("ACTIVE", True, 2)
        versions = (await http.get(f"/v1/memory/{gone['id']}/history", params={"as_of": point})).json()["versions"]
        assert [v["version"] for v in versions] == [2, 1]
        assert (await http.get(f"/v1/memory/{gone['id']}")).json()["status"] == "DELETED"  # and now
        # Before anything was written: nothing.
        early = (await http.get("/v1/memory", params={"as_of": "2020-01-01T00:00:00Z"})).json()["records"]
        assert early == [] and kept["id"]
        bad = await http.get("/v1/memory", params={"as_of": "last tuesday"})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "as_of"
    # An operator's past has no member's facts in it, as its present has none.
    async with MemlaneClient(stack.api_url, key, user="fay") as fay:
        await fay.add_memory("Fay is allergic to nuts", scope="USER")
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30, headers={
            "Authorization": f"Bearer {settings.operator_key}", "X-Tenant": tenant, "X-Agent": agent}) as op:
        listed = (await op.get("/v1/memory", params={"as_of": datetime.now(UTC).isoformat()})).json()["records"]
        assert "Fay is allergic to nuts" not in [r["summary"] for r in listed]


async def test_facts_are_listed_for_the_times_they_held(stack, new_agent):
    _, _, key = await new_agent(CONFIG)
    async with MemlaneClient(stack.api_url, key) as c:
        await c.add_memory("Dana lives in Lisbon", scope="AGENT", valid_from="2025-01-01T00:00:00Z",
                           valid_to="2026-03-01T00:00:00Z")
        await c.add_memory("Dana lives in Porto", scope="AGENT", valid_from="2026-03-01T00:00:00Z")
    async with httpx.AsyncClient(base_url=stack.api_url, headers={"Authorization": f"Bearer {key}"},
                                 timeout=30) as http:
        async def where(at: str) -> list[str]:
            got = await http.get("/v1/memory", params={"valid_at": at})
            return [r["summary"] for r in got.json()["records"]]

        assert await where("2025-06-01T00:00:00Z") == ["Dana lives in Lisbon"]
        assert await where("2026-03-01T00:00:00Z") == ["Dana lives in Porto"]
        assert await where("2024-01-01T00:00:00Z") == []


async def test_search_and_recall_as_they_stood(stack, settings, new_agent):
    tenant, agent, key = await new_agent(CONFIG)
    async with MemlaneClient(stack.api_url, key) as c:
        gone = await c.add_memory("The staging database lives in Frankfurt", scope="AGENT")
        await c.add_memory("Invoices go out on the first of the month", scope="AGENT")
        [(partition, offset)] = c.positions.items()
        point = f"{partition}:{offset}"
        await c.delete_memory(gone["id"])
        then, _ = await c.search_memory("where is the staging database", as_of=point)
        assert [f.record.id for f in then][:1] == [gone["id"]]
        # Written after the API read and kept the log: a search as of now still finds it.
        later = await c.add_memory("The staging database moved to Dublin", scope="AGENT")
        since, _ = await c.search_memory("where is the staging database", as_of=datetime.now(UTC).isoformat())
        assert later["id"] in [f.record.id for f in since] and gone["id"] not in [f.record.id for f in since]
        then, _ = await c.search_memory("where is the staging database", as_of=point)
        assert [f.record.id for f in then][:1] == [gone["id"]] and later["id"] not in [f.record.id for f in then]
        now, _ = await c.search_memory("where is the staging database")
        assert gone["id"] not in [f.record.id for f in now] and later["id"] in [f.record.id for f in now]
        lexical, _ = await c.search_memory("Frankfurt", as_of=point, mode="lexical")
        assert [f.record.id for f in lexical] == [gone["id"]]
        recalled = await c.recall("c-past", "where is the staging database?", as_of=point)
        assert "Frankfurt" in recalled["rendered"] and "Dublin" not in recalled["rendered"]
    auth = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=stack.api_url, headers=auth, timeout=30) as http:
        # A recall of the past marks nothing recalled: the record was never shown to a model.
        assert (await http.get(f"/v1/memory/{gone['id']}/recalls")).json()["count"] == 0
        bad = await http.post("/v1/memory/search", json={"query": "x", "as_of": "yesterday"})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "as_of"
    # An operator's past search holds no member's facts, as its present one holds none.
    async with MemlaneClient(stack.api_url, key, user="gil") as gil:
        await gil.add_memory("Gil's staging password hint is a bird", scope="USER")
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30, headers={
            "Authorization": f"Bearer {settings.operator_key}", "X-Tenant": tenant, "X-Agent": agent}) as op:
        found = (await op.post("/v1/memory/search", json={"query": "staging password", "as_of":
                                                          datetime.now(UTC).isoformat()})).json()["records"]
        assert found and "Gil's staging password hint is a bird" not in [r["summary"] for r in found]
