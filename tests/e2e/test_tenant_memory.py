"""Tenant and platform memory through the running stack (docs/features/tenant-platform-memory.md): a fact
established in two agents of a tenant becomes a convention candidate, an administrator approves
or rejects it, approved conventions and floors reach every agent of the tenant and no other
tenant, the platform's Policy and Default entries reach every tenant in the recall block's layer order, only the
platform operator writes them, and a rebuild gives everything back.

On the session stack: platform entries are deployment-wide (the fuzz leaves some behind), so each
test names its own with ids of its own, checks only those, and removes them when it ends: other
tests' recalls never see them."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
import redis

from events.config import AgentConfig
from events.rules.conventions import fact_key
from projections.redis.connection import tagged
from services.client import MemlaneClient, MemlaneError
from tests.conftest import eventually, refused

CONFIG = AgentConfig.model_validate({"memory": {"scope": {"read": ["session", "agent", "user"],
                                                          "write": ["session", "agent", "user"]}}})


@pytest.fixture(scope="module")
def tstack(stack, settings):
    return stack, settings


@pytest.fixture
async def platform_ids(tstack):
    """Fresh platform entry ids for one test, removed when it ends (set or not, passed or failed)."""
    stack, settings = tstack
    made: list[str] = []

    def new(name: str) -> str:
        made.append(f"{name}-{uuid.uuid4().hex[:6]}")
        return made[-1]

    yield new
    async with _op(stack, settings) as platform:
        for entry in await platform.platform_entries():
            if entry["id"] in made:
                await platform.remove_platform_entry(entry["id"])


def _op(stack, settings, tenant: str | None = None):
    return MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant)


async def _tenant(stack, settings, n: int) -> tuple[str, list[tuple[str, str]], str]:
    """A new tenant with `n` agents: (tenant, [(agent, key)], the tenant's operator key)."""
    tenant = f"ten{uuid.uuid4().hex[:6]}"
    agents = []
    for i in range(n):
        agent = f"agent{i}{uuid.uuid4().hex[:4]}"
        async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
            key = await op.issue_key(tenant, agent)
            await op.configure(CONFIG)
        agents.append((agent, key))
    async with _op(stack, settings) as op:
        admin = await op.issue_key(tenant, None, "operator")
    return tenant, agents, admin


async def _recall(stack, key: str, text: str = "how do we deploy?") -> dict:
    async with MemlaneClient(stack.api_url, key) as c:
        return await c.recall(f"conv-{uuid.uuid4().hex[:6]}", text)


def poll(fn, *args, **kw):
    """`fn(*args, **kw)` as an async check for `eventually` (a lambda would return an unawaited,
    always truthy coroutine)."""

    async def check():
        return await fn(*args, **kw)

    return check


def _texts(out: dict, layer: str) -> list[str]:
    return [e["text"] for e in out[layer]]


async def _convention(admin_client, text: str, status: str | None = None):
    """The convention of the fact `text` states, whatever its wording (its id is the fact's key)."""
    return next((c for c in await admin_client.conventions(status) if c["id"] == fact_key(text)), None)


async def _proposed(stack, keys: tuple[str, str], admin: str, fact: str) -> dict:
    """Two agents (their `keys`) keep `fact` for the agent: the candidate the conventions worker proposes."""
    async with MemlaneClient(stack.api_url, keys[0]) as c1, MemlaneClient(stack.api_url, keys[1]) as c2:
        await c1.add_memory(fact, scope="AGENT")
        await c2.add_memory(fact, scope="AGENT")
    async with MemlaneClient(stack.api_url, admin) as adm:
        return await eventually(poll(_convention, adm, fact, "candidate"), timeout=60)


async def test_a_fact_in_two_agents_becomes_a_candidate_and_approved_reaches_every_agent_of_the_tenant(tstack):
    stack, settings = tstack
    tenant, [(a1, k1), (a2, k2), (a3, k3)], admin = await _tenant(stack, settings, 3)
    other, [(_, ok)], other_admin = await _tenant(stack, settings, 1)
    fact, once, member_fact = ("Deploys go out on Tuesdays after review", "The staging cluster is called atlas",
                               "The user prefers dark mode in the editor")
    async with MemlaneClient(stack.api_url, k1, session="s1") as c1, \
            MemlaneClient(stack.api_url, k1, session="s1", user="u1") as m1, \
            MemlaneClient(stack.api_url, k1, preview=True) as p1, \
            MemlaneClient(stack.api_url, k2, session="s2") as c2, \
            MemlaneClient(stack.api_url, k2, session="s2", user="u2") as m2, \
            MemlaneClient(stack.api_url, k2, preview=True) as p2:
        # One agent repeating a fact, in other words too, and the same fact as members' and
        # sessions' and previews' in two agents: none of it is a convention.
        await c1.add_memory(once, scope="AGENT")
        await c1.add_memory(once, scope="AGENT")
        await c1.add_memory("the staging cluster is called ATLAS!", scope="AGENT")
        await m1.add_memory(member_fact, scope="USER")
        await m2.add_memory(member_fact, scope="USER")
        await c1.add_memory("Builds are cached in the session", scope="SESSION")
        await c2.add_memory("Builds are cached in the session", scope="SESSION")
        await p1.add_memory("Previews never become conventions", scope="AGENT")
        await p2.add_memory("Previews never become conventions", scope="AGENT")
        # The same fact established in two agents, in other words: a candidate.
        await c1.add_memory(fact, scope="AGENT")
        await c2.add_memory("deploys go out on tuesday after reviews.", scope="AGENT")
    async with MemlaneClient(stack.api_url, admin) as adm:
        cand = await eventually(poll(_convention, adm, fact, "candidate"), timeout=60)
        assert sorted(cand["agents"]) == sorted([a1, a2])
        # Written before the candidate's fact in each agent: seen by now, and none is a convention.
        assert [c["id"] for c in await adm.conventions()] == [cand["id"]]
        assert cand["text"] in (fact, "deploys go out on tuesday after reviews.")  # as one agent stated it
        # An agent key reads none of the administrators' listings.
        async with MemlaneClient(stack.api_url, k1) as agent_client:
            for call in (agent_client.conventions(), agent_client.floors(), agent_client.platform_entries()):
                await refused(call, 403, "FORBIDDEN", "authorization")
            await refused(agent_client.decide_convention(cand["id"], True), 403, "FORBIDDEN", "authorization")
        # Another tenant's administrator does not see it, and cannot approve it.
        async with MemlaneClient(stack.api_url, other_admin) as oadm:
            assert await oadm.conventions() == []
            await refused(oadm.decide_convention(cand["id"], True), 404, "NOT_FOUND", "convention")
        assert _texts(await _recall(stack, k1), "tenantEntries") == []  # a candidate is not in recall
        out = await adm.decide_convention(cand["id"], True)
        assert out["status"] == "applied" and out["convention"] == "approved"
        assert (await _convention(adm, fact))["status"] == "approved"
    for key in (k1, k2, k3):  # both agents, and a third of the tenant that never stated it
        await eventually(poll(_has, stack, key, "tenantEntries", cand["text"]), timeout=10)
    assert _texts(await _recall(stack, ok), "tenantEntries") == []  # never another tenant's


async def _has(stack, key: str, layer: str, text: str, present: bool = True) -> bool:
    return (text in _texts(await _recall(stack, key), layer)) is present


async def test_a_removed_agent_no_longer_counts_toward_a_candidate(tstack):
    stack, settings = tstack
    tenant, [(a1, k1), (a2, k2), (a3, k3)], admin = await _tenant(stack, settings, 3)
    fact, later = "Hotfixes skip the release train", "Release notes are written by the author"
    r = redis.Redis.from_url(settings.redis_url)
    seen = f"{settings.redis_root}conv:{tagged(tenant)}:{fact_key(fact)}"  # the detector's agents of the fact
    try:
        async with MemlaneClient(stack.api_url, k1) as c1:
            await c1.add_memory(fact, scope="AGENT")
        await eventually(lambda: r.sismember(seen, a1), timeout=60)
        async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=a1) as op:
            await op.remove_agent()
        await eventually(lambda: not r.sismember(seen, a1), timeout=60)
    finally:
        r.close()
    async with MemlaneClient(stack.api_url, k2) as c2, MemlaneClient(stack.api_url, k3) as c3:
        await c2.add_memory(fact, scope="AGENT")
        await c2.add_memory(later, scope="AGENT")
        await c3.add_memory(later, scope="AGENT")
    async with MemlaneClient(stack.api_url, admin) as adm:
        # a2's later fact follows its first in its partition: once the later one is a candidate,
        # the first was seen, with a2 alone now that a1 is gone.
        await eventually(poll(_convention, adm, later, "candidate"), timeout=60)
        assert await _convention(adm, fact) is None


async def test_a_rejected_convention_is_nowhere_and_the_same_agents_never_bring_it_back(tstack):
    stack, settings = tstack
    tenant, [(a1, k1), (a2, k2)], admin = await _tenant(stack, settings, 2)
    fact, later = "Standups happen at nine sharp", "Incidents are reviewed on Mondays"
    async with MemlaneClient(stack.api_url, k1) as c1, MemlaneClient(stack.api_url, k2) as c2:
        first = [(await c.add_memory(fact, scope="AGENT"))["id"] for c in (c1, c2)]
        async with MemlaneClient(stack.api_url, admin) as adm:
            cand = await eventually(poll(_convention, adm, fact, "candidate"), timeout=60)
            await adm.decide_convention(cand["id"], False)
            assert (await _convention(adm, fact))["status"] == "rejected"
            # The same agents establish it again (deleted, then written anew: new records, which
            # the detector proposes again), then a later fact: the later one's candidate comes
            # after those proposals, and the rejected one stays rejected.
            for c, rid in zip((c1, c2), first, strict=True):
                await c.delete_memory(rid)
            await c1.add_memory("standups happen at NINE sharp.", scope="AGENT")
            await c2.add_memory("Standups happen at nine sharp!", scope="AGENT")
            await c1.add_memory(later, scope="AGENT")
            await c2.add_memory(later, scope="AGENT")
            await eventually(poll(_convention, adm, later, "candidate"), timeout=60)
            assert (await _convention(adm, fact))["status"] == "rejected"
            assert await adm.conventions("approved") == []
    out = await _recall(stack, k1, "when are standups?")
    # The agent's own fact stays its own record; no convention of it reaches recall.
    assert out["tenantEntries"] == [] and "## Tenant conventions" not in out["rendered"]


async def test_floors_are_in_every_recall_of_the_tenant_and_only_its(tstack):
    stack, settings = tstack
    tenant, [(a1, k1), (a2, k2)], admin = await _tenant(stack, settings, 2)
    other, [(_, ok)], _ = await _tenant(stack, settings, 1)
    floor = "Never share customer data outside the EU"
    async with MemlaneClient(stack.api_url, admin) as adm:
        await refused(adm.set_floor("bad!id", "x"), 422, "VALIDATION_FAILED")
        await refused(adm.set_floor("eu", "x" * 501), 422, "VALIDATION_FAILED", "text")
        assert (await adm.set_floor("eu-data", floor))["status"] == "applied"
        assert [f["text"] for f in await adm.floors()] == [floor]
        for key in (k1, k2):
            out = await eventually(poll(_has, stack, key, "tenantFloors", floor), timeout=10)
            assert out
        assert floor not in (await _recall(stack, ok))["rendered"]
        await adm.remove_floor("eu-data")
        await eventually(poll(_has, stack, k1, "tenantFloors", floor, present=False), timeout=10)
        await refused(adm.remove_floor("eu-data"), 404, "NOT_FOUND", "floor")
        await adm.set_floor("eu-data", floor)  # back, for the rebuild below


async def test_platform_entries_reach_every_tenant_in_order_and_only_the_platform_operator_writes_them(
        tstack, platform_ids):
    stack, settings = tstack
    tenant, [(agent, key)], admin = await _tenant(stack, settings, 1)
    other, [(_, ok)], _ = await _tenant(stack, settings, 1)
    policy, default, floor = "Refuse to give medical diagnoses", "Answer in the user's language", "Cite the runbook"
    medical, language = platform_ids("medical"), platform_ids("language")
    mine = {medical, language}  # the deployment's other platform entries (the fuzz's) are not this test's
    async with MemlaneClient(stack.api_url, admin) as adm:
        await refused(adm.set_platform_entry(medical, "policy", policy), 403, "FORBIDDEN", "authorization")
        # A tenant administrator reads them, none of this test's yet.
        assert [e for e in await adm.platform_entries() if e["id"] in mine] == []
        await adm.set_floor("runbook", floor)
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
        await op.curate_block("style", "add", line="Keep answers short")
    async with _op(stack, settings) as platform:
        await refused(platform.set_platform_entry(medical, "rule", policy), 422, "VALIDATION_FAILED", "kind")
        await platform.set_platform_entry(medical, "policy", policy)
        await platform.set_platform_entry(language, "default", default)
        kinds = {e["id"]: e["kind"] for e in await platform.platform_entries() if e["id"] in mine}
        assert kinds == {medical: "policy", language: "default"}
    ours = (policy, default, floor)
    for k in (key, ok):
        await eventually(poll(_has, stack, k, "platformPolicies", policy), timeout=10)
        out = await _recall(stack, k)
        assert [t for t in _texts(out, "platformDefaults") if t in ours] == [default]
    out = await _recall(stack, key)
    text = out["rendered"]
    # The recall block's layer order: blocks, then the platform's policy, the tenant's floors, ... defaults last.
    assert text.index("Keep answers short") < text.index(policy) < text.index(floor) < text.index(default)
    # Defaults last of all: the block's last section is theirs, this test's default among them.
    last = text.removesuffix("</memory>").rstrip().rpartition("\n## ")[2]
    assert last.startswith("Defaults\n") and f"(id: {language})" in last, last


async def test_a_rebuild_gives_conventions_floors_and_platform_entries_back(tstack, platform_ids):
    stack, settings = tstack
    tenant, [(a1, k1), (a2, k2)], admin = await _tenant(stack, settings, 2)
    fact = "Releases are tagged with the date"
    cand = await _proposed(stack, (k1, k2), admin, fact)
    async with MemlaneClient(stack.api_url, admin) as adm, _op(stack, settings) as platform:
        await adm.decide_convention(cand["id"], True)
        await adm.set_floor("tags", "Every release has a changelog")
        await platform.set_platform_entry(platform_ids("tone"), "default", "Be concise")
        before = (await adm.conventions(), await adm.floors(), await platform.platform_entries())
    view = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    old_gen = int(view.get(f"{settings.redis_root}generation") or 1)
    proc = subprocess.run([sys.executable, "-m", "services.cli", "rebuild", "--target", "redis"], env=stack.env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(view.get(f"{settings.redis_root}generation")) > old_gen  # a new generation, from the log alone
    # What the old generation held goes: only the new one can answer now.
    old = f"{settings.redis_root}g{old_gen}"
    view.delete(f"{old}:pmem", f"{old}:tmem:{{{tenant}/@workspace}}")
    # New clients: a connection idle through the rebuild may have been closed by the server.
    async with MemlaneClient(stack.api_url, admin) as adm, _op(stack, settings) as platform:

        async def same():
            return (await adm.conventions(), await adm.floors(), await platform.platform_entries()) == before

        await eventually(same, timeout=10)
    await eventually(poll(_has, stack, k1, "tenantEntries", cand["text"]), timeout=10)
    assert "Every release has a changelog" in _texts(await _recall(stack, k2), "tenantFloors")


async def test_a_tenant_name_of_memlane_s_own_is_refused(tstack):
    stack, settings = tstack
    async with _op(stack, settings) as op:
        with pytest.raises(MemlaneError) as e:
            await op.issue_key("@platform", "a1")
        assert e.value.status == 422 and e.value.field == "tenant"
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant="@platform") as op:
        await refused(op.set_floor("f", "x"), 422, "VALIDATION_FAILED", "x-tenant")


async def test_a_tenant_administrator_reviews_candidates_over_mcp_and_an_agent_key_cannot(tstack):
    import json

    from mcp.server.mcpserver.exceptions import ToolError

    from services.mcp_server import build_admin_mcp

    stack, settings = tstack
    tenant, [(a1, k1), (a2, k2)], admin = await _tenant(stack, settings, 2)
    fact = "Invoices are sent on the first of the month"
    await _proposed(stack, (k1, k2), admin, fact)
    async with MemlaneClient(stack.api_url, admin) as adm:
        mcp = build_admin_mcp(adm)
        assert {t.name for t in await mcp.list_tools()} == {"list_conventions", "review_convention"}
        listed = json.loads((await mcp.call_tool("list_conventions", {})).content[0].text)["conventions"]
        assert [c["id"] for c in listed] == [fact_key(fact)]
        out = json.loads((await mcp.call_tool("review_convention", {"id": fact_key(fact), "decision": "approve"}))
                         .content[0].text)
        assert out == {"id": fact_key(fact), "convention": "approved", "status": "applied"}
    await eventually(poll(_has, stack, k2, "tenantEntries", fact), timeout=10)
    async with MemlaneClient(stack.api_url, k1) as agent_client:
        try:
            res = await build_admin_mcp(agent_client).call_tool("review_convention",
                                                                 {"id": fact_key(fact), "decision": "reject"})
            text = res.content[0].text if getattr(res, "isError", True) else "not refused"
        except ToolError as e:
            text = str(e)
        assert "FORBIDDEN" in text


async def test_memlane_mcp_with_a_tenant_operator_key_serves_the_review_tools(tstack):
    from pathlib import Path

    from tests.e2e.test_mcp_stdio import Stdio

    stack, settings = tstack
    tenant, [(a1, k1), (a2, k2)], admin = await _tenant(stack, settings, 2)
    fact = "Support replies within four hours"
    await _proposed(stack, (k1, k2), admin, fact)
    env = {**stack.env, "MEMLANE_API_URL": stack.api_url, "MEMLANE_API_KEY": admin}
    proc = subprocess.Popen([str(Path(sys.executable).with_name("memlane")), "mcp"], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        rpc = Stdio(proc)
        init = rpc.send("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                       "clientInfo": {"name": "test", "version": "1"}})
        assert init["serverInfo"]["name"] == "memlane-admin"
        rpc.send("notifications/initialized", reply=False)
        assert {t["name"] for t in rpc.send("tools/list")["tools"]} == {"list_conventions", "review_convention"}
        assert [c["id"] for c in rpc.tool("list_conventions")["conventions"]] == [fact_key(fact)]
        assert rpc.tool("review_convention", id=fact_key(fact), decision="reject")["convention"] == "rejected"
    finally:
        proc.kill()
        proc.wait()
