"""Member profiles through the running stack (docs/features/profiles.md): written and read over HTTP by
the member and by the agent speaking for them, version checks that change nothing, recall that
shows the named member's profile only, keys that never reach it, consent, erasure, enrichment
by consolidation (the scripted model), and a rebuild that gives profiles back."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest

from events import AgentConfig, SessionEnded
from projections.redis.profile_view import profiles_key
from services.client import MemlaneClient, TurnPublisher
from tests.conftest import eventually, refused
from tests.e2e.extraction_support import answer, turn
from tests.e2e.extraction_support import new_agent as stack_agent
from tests.e2e.rebuild_support import rebuilt_redis
from tests.fakes.model_server import Reply
from tests.redis_at import redis_at

CFG = AgentConfig.model_validate({"memory": {"consent": "required", "tools": ["add_memory", "profile_write"],
                                             "scope": {"read": ["user"], "write": ["user"]}}})


async def members(stack, settings, tenant, agent, *users) -> dict[str, str]:
    async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
        return {u: await op.issue_key(tenant, agent, "member", user=u) for u in users}


async def test_profiles_are_the_members_own_and_recall_shows_the_named_members_only(stack, new_agent, settings):
    tenant, agent, key = await new_agent(CFG)
    _, _, other_key = await new_agent(CFG)
    keys = await members(stack, settings, tenant, agent, "dana", "erin")
    api = stack.api_url
    async with MemlaneClient(api, key, user="dana") as for_dana, MemlaneClient(api, keys["dana"]) as dana, \
            MemlaneClient(api, keys["erin"]) as erin, MemlaneClient(api, key, user="erin") as for_erin, \
            MemlaneClient(api, settings.operator_key, tenant=tenant, agent=agent) as op:
        # No consent yet: the agent may not write it, the member may not either.
        await refused(for_dana.write_profile("dana", "Vegetarian"), 403, "CONSENT_REQUIRED", "user")
        await refused(dana.write_profile("dana", "Vegetarian"), 403, "CONSENT_REQUIRED", "user")
        await dana.grant_consent()
        await erin.grant_consent()
        out = await dana.write_profile("dana", "Vegetarian\nPrefers metric units", expected_version=0)
        assert (out["status"], out["version"]) == ("applied", 1)
        assert await dana.read_profile("dana") == {"user": "dana", "text": "Vegetarian\nPrefers metric units",
                                                   "version": 1}
        assert (await for_dana.write_profile("dana", "Vegetarian\nPrefers metric units\nLikes jazz",
                                             expected_version=1))["version"] == 2
        # A stale version is refused, and nothing changed.
        await refused(for_dana.write_profile("dana", "Lost update", expected_version=1), 409, "VERSION_CONFLICT",
                      "expected_version")
        await refused(dana.write_profile("dana", "x" * 4001), 422, "VALIDATION_FAILED", "text")
        now = await for_dana.read_profile("dana")
        assert (now["text"], now["version"]) == ("Vegetarian\nPrefers metric units\nLikes jazz", 2)
        await for_erin.write_profile("erin", "Allergic to nuts")

        # Nobody else reaches dana's profile: another member, the agent for another member, an
        # operator, another agent.
        await refused(erin.read_profile("dana"), 403, "FORBIDDEN", "user")
        await refused(for_erin.read_profile("dana"), 403, "FORBIDDEN", "user")
        await refused(op.read_profile("dana"), 403, "FORBIDDEN")
        await refused(op.write_profile("dana", "An operator's words"), 403, "FORBIDDEN")
        async with MemlaneClient(api, key) as nobody:
            await refused(nobody.read_profile("dana"), 422, "VALIDATION_FAILED", "x-user")
        async with MemlaneClient(api, other_key, user="dana") as elsewhere:
            err = await refused(elsewhere.read_profile("dana"), 403, "CONSENT_REQUIRED")  # not granted there
            assert "Vegetarian" not in err.message

        # Recall: the named member's profile and no other's; the member's id stays out of the text.
        recalled = await for_dana.recall("conv-1", "what should I cook tonight?")
        assert recalled["userProfile"] == [{"id": "profile", "title": "Profile", "text": now["text"], "user": "dana",
                                            "version": 2}]
        assert "## User profile" in recalled["rendered"] and "Likes jazz" in recalled["rendered"]
        assert "Allergic to nuts" not in recalled["rendered"]
        recalled = await for_erin.recall("conv-2", "what should I cook tonight?")
        assert [p["text"] for p in recalled["userProfile"]] == ["Allergic to nuts"]
        assert "Vegetarian" not in recalled["rendered"]
        async with MemlaneClient(api, settings.operator_key, tenant=tenant, agent=agent, user="dana") as op_dana:
            op_recall = await op_dana.recall("conv-3", "what should I cook tonight?")
        assert op_recall["userProfile"] == [] and "Vegetarian" not in op_recall["rendered"]

        # Withdrawn consent: no profile in recall, no agent read; the member still reads their own.
        await dana.withdraw_consent()
        recalled = await for_dana.recall("conv-4", "what should I cook tonight?")
        assert recalled["userProfile"] == [] and recalled["skipped"]["code"] == "CONSENT_REQUIRED"
        await refused(for_dana.read_profile("dana"), 403, "CONSENT_REQUIRED")
        assert (await dana.read_profile("dana"))["version"] == 2

        # An operator deletes a member's profile (never seeing it) and erases a member: both gone.
        deleted = await op.delete_profile("erin")
        assert deleted["status"] == "applied" and "text" not in deleted
        await refused(erin.read_profile("erin"), 404, "NOT_FOUND")
        await op.erase_subject("dana")
        assert await stored_profiles(settings, tenant, agent) == set()  # the view holds nothing of it
        await dana.grant_consent()
        await refused(dana.read_profile("dana"), 404, "NOT_FOUND")
        await refused(for_dana.read_profile("dana"), 404, "NOT_FOUND")


async def test_an_agent_without_profile_write_reads_but_never_writes_and_mcp_speaks_for_its_member(
        stack, new_agent, settings):
    from services.mcp_server import build_mcp

    cfg = AgentConfig.model_validate({"memory": {"tools": ["add_memory"], "scope": {"read": ["user"],
                                                                                     "write": ["user"]}}})
    tenant, agent, key = await new_agent(cfg)
    async with MemlaneClient(stack.api_url, key, user="finn") as c:
        await refused(c.write_profile("finn", "Likes trains"), 403, "TOOL_NOT_ALLOWED", "tool")
        mcp = build_mcp(c, cfg)
        assert {t.name for t in await mcp.list_tools()} >= {"profile_read"}
        assert "profile_write" not in {t.name for t in await mcp.list_tools()}
        with_write = cfg.model_copy(update={"memory": cfg.memory.model_copy(update={"tools": ["profile_write"]})})
        async with MemlaneClient(stack.api_url, settings.operator_key, tenant=tenant, agent=agent) as op:
            await op.configure(with_write)
        mcp = build_mcp(c, with_write)
        out = json.loads((await mcp.call_tool("profile_write", {"text": "Likes trains", "expected_version": 0}))
                         .content[0].text)
        assert out == {"version": 1, "status": "applied"}
        read = json.loads((await mcp.call_tool("profile_read", {})).content[0].text)
        assert (read["text"], read["version"], read["user"]) == ("Likes trains", 1, "finn")
    async with MemlaneClient(stack.api_url, key) as no_member:
        assert not {"profile_read", "profile_write"} & {t.name for t in await build_mcp(no_member, cfg).list_tools()}


async def test_a_rebuild_gives_profiles_back(stack, new_agent, settings):
    tenant, agent, key = await new_agent(CFG)
    keys = await members(stack, settings, tenant, agent, "gail", "hal")
    for user in ("gail", "hal"):
        async with MemlaneClient(stack.api_url, keys[user]) as m:
            await m.grant_consent()
            await m.write_profile(user, f"{user} prefers tea")
            await m.write_profile(user, f"{user} prefers green tea")
    async with MemlaneClient(stack.api_url, keys["hal"]) as hal:
        await hal.delete_profile("hal")
    stored = await rebuild_redis(stack, settings, tenant, agent)
    # The new generation holds them, filled from the log alone, the text sealed as in the log ...
    assert set(stored) == {"gail"} and b"green tea" not in stored["gail"] and b'"version":2' in stored["gail"]
    # ... and the API, once it reads the new generation, answers as before.
    async with MemlaneClient(stack.api_url, keys["gail"]) as gail, MemlaneClient(stack.api_url, keys["hal"]) as hal:
        assert await gail.read_profile("gail") == {"user": "gail", "text": "gail prefers green tea", "version": 2}
        await refused(hal.read_profile("hal"), 404, "NOT_FOUND")


async def stored_profiles(settings, tenant: str, agent: str) -> set[str]:
    """The members whose profile the live Redis generation holds for the agent."""
    from projections.redis.record_view import RedisRecords

    store = RedisRecords(redis_at(settings.redis_url)(pooled=True), namespace=settings.topic_prefix)
    try:
        fields = await store.r.hkeys(profiles_key(store._ns(await store.generation()), tenant, agent))
        return {f.decode() if isinstance(f, bytes) else f for f in fields}
    finally:
        await store.aclose()


async def rebuild_redis(stack, settings, tenant: str, agent: str) -> dict[str, bytes]:
    """`memlane rebuild --target redis`: a new Redis generation filled from the log and switched
    to. Returns the agent's profile hash in the new generation, as stored (user -> raw event)."""
    from projections.redis.record_view import RedisRecords

    store = RedisRecords(redis_at(settings.redis_url)(pooled=True), namespace=settings.topic_prefix)
    try:
        stored = await store.r.hgetall(profiles_key(store._ns(await rebuilt_redis(stack, store)), tenant, agent))
        return {(k.decode() if isinstance(k, bytes) else k): (v.encode() if isinstance(v, str) else v)
                for k, v in stored.items()}
    finally:
        await store.aclose()


# --------------------------------------------------------------------------- enrichment


def consolidated(m: str, facts: list[dict]) -> Reply:
    return Reply({"goal": "Plan dinner", "outcome": "successful", "success_score": 0.8, "summary": f"Planned ({m})",
                  "procedure": None, "anti_pattern": None, "facts": facts})


@pytest.mark.parametrize("enrich", [True, False])
async def test_consolidation_enriches_the_members_profile_when_the_setting_allows(model_stack, fake, enrich):
    stack, settings = model_stack
    cfg = AgentConfig.model_validate({"memory": {
        "kinds": ["fact", "preference"], "scope": {"read": ["user"], "write": ["user"]},
        "tools": ["add_memory", "profile_write"], "profiles": {"enrich": enrich}}})
    tenant, agent, key = await stack_agent(stack.api_url, settings.operator_key, cfg)
    if enrich:
        async with MemlaneClient(stack.api_url, key, user="ivy") as c:
            await c.write_profile("ivy", "Lives in Lyon")
    async with TurnPublisher(settings.kafka_bootstrap, settings.topic_prefix) as pub, \
            MemlaneClient(stack.api_url, key, user="ivy") as c:
        for session in ("s1", "s2"):  # the second run restates a preference: appended once
            m = f"mk{uuid.uuid4().hex[:10]}"
            fake.on(m, answer(), consolidated(m, [
                {"summary": "Prefers vegetarian dishes", "content": "", "kind": "preference", "confidence": 0.9},
                {"summary": f"Dinner plan {session} is set", "content": "", "kind": "fact", "confidence": 0.9}]))
            await pub.publish(turn(tenant, agent, session, 1, f"{m}: plan dinner", "Done.", user="ivy"))
            await eventually(lambda m=m: fake.requests_with(m) or None, timeout=20)
            await pub.publish(SessionEnded(event_id=str(uuid.uuid4()), tenant=tenant, agent=agent, session=session,
                                           execution_id=f"exec-{session}", outcome="successful",
                                           occurred_at=datetime.now(UTC), user="ivy"))

            async def episode(m=m):
                found, _ = await c.search_memory(m, mode="lexical")
                return [f for f in found if f.record.kind == "episode"] or None

            await eventually(episode, timeout=30)
        # A write after both runs: once it shows, the ledger and the view are past both enrichments
        # (one partition per agent, applied in order).
        await c.add_memory("Both runs are consolidated", scope="USER")
        facts, _ = await c.search_memory("Prefers vegetarian dishes", mode="lexical")
        assert any(f.record.kind == "preference" for f in facts)  # the fact is kept as a record too
        if not enrich:
            await refused(c.read_profile("ivy"), 404, "NOT_FOUND")
            return

        profile = await c.read_profile("ivy")
        assert profile["text"] == "Lives in Lyon\nPrefers vegetarian dishes" and profile["version"] == 2
        recalled = await c.recall("conv-e", "dinner ideas")
        assert [p["text"] for p in recalled["userProfile"]] == [profile["text"]]
